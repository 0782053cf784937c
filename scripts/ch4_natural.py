"""Chapter 4's pretrainings of page 04b, stored.

Page 04b (``notebooks/04b-natural-tasks-and-lora.ipynb``) pretrains the width test of
naturalness (three seeds at widths 16 and 32) and the model of the experiments (seed
0, width 32). This script computes them at seed offset 0 with an empty model cache and
writes ``src/fmlab/chapters/results/ch4_natural.json`` (with the fingerprint of the
code that produced it, :mod:`fmlab.stored`), which the page reads at seed offset 0.

    python scripts/ch4_natural.py            # about 5 minutes of one idle core
    python scripts/ch4_natural.py --restamp  # after a change that cannot move it

The configuration is :data:`PAGE_CONFIG` below, the page's (a test holds the two
together); runs at other seed offsets are never stored: the page computes them. The
file also keeps a slice (``fmlab.chapters.ch4_natural_stored.NATURAL_SLICE``: the width
test at widths 8 and 16, a few steps), which the tests rerun under another rounding
path.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "fmlab" / "chapters" / "results" / "ch4_natural.json"

#: the page's configuration (its cell that defines ``cfg``)
PAGE_CONFIG = dict(pretrain_seeds=(0, 1, 2), narrow=16, narrow_steps=3000)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--restamp",
        action="store_true",
        help="rerun the whole run and, if it reproduces its record (the model's "
        "weights bit for bit), record the fingerprint of today's code on the file "
        "(for changes that cannot move it)",
    )
    a = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("FMLAB_PROGRESS", "0")
    import torch

    from fmlab import stored
    from fmlab.chapters import ch4_kernel_view as ch4
    from fmlab.chapters import ch4_natural_stored as m
    from fmlab.repro import seed_offset

    if seed_offset():
        ap.error("only seed offset 0 is stored: unset FMLAB_SEED_OFFSET")
    torch.set_num_threads(1)
    sources = stored.fingerprint(m.natural_sources())  # the code as it starts
    config = ch4.ChapterConfig(**PAGE_CONFIG)
    slice_config = m.natural_slice_config()
    if a.restamp:
        return stored.restamp_checked(
            a.out,
            sources=sources,
            check=lambda path: _check(path, m, stored),
            job="the whole run",
            slice=lambda: {
                "config": slice_config,
                "result": m.natural_slice(slice_config),
            },
        )
    t0 = time.time()
    result = m.natural_run(config)
    meta = {"wall_seconds": time.time() - t0}
    t1 = time.time()
    sliced = {"config": slice_config, "result": m.natural_slice(slice_config)}
    meta["slice_seconds"] = time.time() - t1
    stored.write(
        a.out,
        {"meta": meta, **result},
        script=m.NATURAL_SCRIPT,
        sources=sources,
        config=config,
        slice=sliced,
    )
    print(
        f"wrote {a.out} ({meta['wall_seconds']:.0f} s, slice "
        f"{meta['slice_seconds']:.1f} s)"
    )
    return 0


def _check(path, m, stored) -> dict:
    """Rerun the whole run with today's code and compare it with the record: the
    width test's numbers per seed (:func:`fmlab.stored.compare_runs`) and the stored
    model's weights, which must be the same bit for bit."""
    import torch

    from fmlab.chapters import ch4_kernel_view as ch4

    def flat(width_test: dict) -> dict:
        return {
            f"{name}_{w}": values
            for name, by_width in width_test["result"].items()
            for w, values in by_width.items()
        }

    data = stored.read(path)
    now = m.natural_run(ch4.ChapterConfig(**PAGE_CONFIG))
    res = stored.compare_runs(flat(data["width_test"]), flat(now["width_test"]))
    old = stored.decode_tensors(data["pretraining"]["state_dict"])
    new = stored.decode_tensors(now["pretraining"]["state_dict"])
    same = set(old) == set(new) and all(torch.equal(old[k], new[k]) for k in old)
    res["ok"] = bool(res["ok"] and same)
    return res


if __name__ == "__main__":
    sys.exit(main())
