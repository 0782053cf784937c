"""Chapter 3's nonlinear experiment of page 03: runs the page's five experiments
(``fmlab.chapters.ch3_lpft.run_lpft_experiment`` at overlap angles 75° and 45° on ten
worlds, and the overlap sweep's 60°, 70° and 90° on three) at seed offset 0 and writes
``src/fmlab/chapters/results/ch3_lpft.json`` (each experiment's config and whole
result, with the fingerprint of the code that computes them, :mod:`fmlab.stored`),
which page 03 reads at seed offset 0 instead of computing them.

    python scripts/ch3_lpft.py                        # the stored runs, one core
    python scripts/ch3_lpft.py --seeds 2 --out /tmp/c.json   # a quick try
    python scripts/ch3_lpft.py --restamp  # after a change that cannot move it

About 140 s of one core on an idle machine. The page reads an experiment only when its
config is exactly a stored one (so a try with ``--seeds`` is never read by the page).
The file also keeps a slice (``fmlab.chapters.ch3_stored.LPFT_SLICE``), which the
tests rerun under another rounding path.

The page's config is written out below, as the page's config cell writes it; if the
page changes it, the page no longer finds its experiments in the file (it computes
them, and ``tests/chapters/test_ch3_stored.py`` fails until this script is rerun with
the new config).

``--restamp``: when the code behind the file has changed, rerun its experiment at 60°
(three worlds, about 5 s of one core) with today's code and, only if it reproduces its
record, record today's fingerprint on the file (``fmlab.stored.restamp_checked``; the
check is ``fmlab.chapters.ch3_stored.lpft_job_check``). Run it on the rounding path
of the record (written on an AVX2 machine: ``ATEN_CPU_CAPABILITY=avx2`` on a newer
one), where a change that moves nothing reproduces it bit for bit; on another path the
numbers at rounding level (span residuals, the feature change at step 0) can fail the
check.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "fmlab" / "chapters" / "results" / "ch3_lpft.json"


def page_configs(n_seeds: int = 0) -> list:
    """The configs of page 03's five calls of ``run_lpft_experiment`` (its config
    cell, ``ANGLES`` and the overlap sweep), in the page's order."""
    from fmlab.chapters import ch3_lpft as ch3

    cfg = ch3.LPFTConfig(
        world=ch3.StyleShiftConfig(
            dim_input=80, dim_content=16, n_styles=4, n_types=128
        ),
        feature_norm=0.5,
        lrs=(3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1),
        ft_min_lr=1e-4,
        l2s=(1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1),
        scratch_lrs=(1e-3, 3e-3, 1e-2, 3e-2, 1e-1),
        n_val=10_000,
        select_se=1.0,
        ft_heads=2,
        seeds=tuple(range(10)),
    )
    if n_seeds:
        cfg = ch3.at_angle(cfg, None, seeds=cfg.seeds[:n_seeds])
    angles = {"distortion": 75.0, "LP-FT": 45.0}
    out = [ch3.at_angle(cfg, a) for a in angles.values()]
    out += [ch3.at_angle(cfg, a, seeds=cfg.seeds[:3]) for a in (60.0, 70.0, 90.0)]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=0, help="fewer worlds (a try)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--restamp",
        action="store_true",
        help="rerun the experiment at 60 degrees (three worlds) of --out and, if it "
        "reproduces its record, record the fingerprint of today's code on the file "
        "(for changes that cannot move it)",
    )
    a = ap.parse_args(argv)
    if a.restamp and a.seeds:
        ap.error("--restamp reruns part of the stored run: give no --seeds")
    if a.seeds and a.out == OUT:
        ap.error("--seeds makes a try, not the book's run: give --out elsewhere")
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("FMLAB_PROGRESS", "0")
    import torch

    from fmlab import stored
    from fmlab.chapters.ch3_stored import (
        LPFT_SCRIPT,
        config_record,
        lpft_job_check,
        lpft_run,
        lpft_slice,
        lpft_slice_config,
        lpft_sources,
    )

    torch.set_num_threads(1)
    sources = stored.fingerprint(lpft_sources())  # the code as it starts
    if a.restamp:
        return stored.restamp_checked(
            a.out,
            sources=sources,
            check=lpft_job_check,
            job="the experiment at 60° (three worlds, every method)",
        )
    configs = page_configs(a.seeds)
    runs, seconds = [], []
    for cfg in configs:
        t0 = time.time()
        runs.append(lpft_run(cfg))
        seconds.append(time.time() - t0)
        angle, n = cfg.world.overlap_deg, len(cfg.seeds)
        print(f"a = {angle:g}°, {n} worlds: {seconds[-1]:.0f} s", flush=True)
    t1 = time.time()
    slice_record = {
        "config": config_record(lpft_slice_config()),
        "result": lpft_slice(),
    }
    meta = {
        "wall_seconds": seconds,
        "slice_seconds": time.time() - t1,
        "configs": [config_record(c)["world"]["overlap_deg"] for c in configs],
    }
    stored.write(
        a.out,
        {"meta": meta, "runs": runs},
        script=LPFT_SCRIPT,
        sources=sources,
        config={"experiments": [r["config"] for r in runs]},
        slice=slice_record,
    )
    size = a.out.stat().st_size / 1e6
    print(
        f"wrote {a.out} ({size:.1f} MB; {sum(seconds):.0f} s, slice "
        f"{meta['slice_seconds']:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
