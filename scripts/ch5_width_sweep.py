"""Chapter 5's width sweep: the masked-LM transformer at several widths, pretrained to
saturation on the untied language, each width's seeds as ensembles run in parallel
processes; writes ``src/fmlab/chapters/results/ch5_width_sweep.json``, which the
transformer page of Chapter 5 (``notebooks/05c-same-loss-transformer.ipynb``) reads
(the sweep is too slow for the page's time budget). The file records the fingerprint
of the code that produced it (:mod:`fmlab.stored`): when that code changes, the page
refuses the file and names this script. It also keeps a slice
(``fmlab.chapters.ch5_sgd_noise.WIDTH_SWEEP_SLICE``: a short run of the same code),
which the tests rerun under another rounding path.

    python scripts/ch5_width_sweep.py --jobs 12            # the stored sweep
    python scripts/ch5_width_sweep.py --widths 16 --seeds 2 --steps 50 --out /tmp/w.json
    python scripts/ch5_width_sweep.py --device cuda --jobs 1  # models train on a GPU
    python scripts/ch5_width_sweep.py --restamp  # after a change that cannot move it

Each job is one (width, chunk of seeds); a chunk of ``--per-job`` models trains as one
ensemble from ``make_generator(1000 * (chunk + 1) + width)``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "fmlab" / "chapters" / "results" / "ch5_width_sweep.json"


def _job(args):
    width, chunk, n_models, steps, lr, device, n_trace = args
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from fmlab.chapters.ch5_sgd_noise import WidthSweepConfig, width_sweep_run

    torch.set_num_threads(1)
    config = WidthSweepConfig()
    if steps:
        config = replace(config, pretrain_steps=steps)
    if lr:
        config = replace(config, pretrain_lr=lr)
    if n_trace:
        config = replace(config, n_trace=n_trace)
    t0 = time.time()
    out = width_sweep_run(
        config, width, 1000 * (chunk + 1) + width, n_models, device=device
    )
    out["chunk"], out["seconds"] = chunk, time.time() - t0
    out["lr"] = config.pretrain_lr
    print(json.dumps({k: out[k] for k in ("width", "chunk", "gap", "seconds")}))
    return out


def _slice() -> dict:
    from dataclasses import asdict

    from fmlab.chapters.ch5_sgd_noise import (
        WIDTH_SWEEP_SLICE,
        WidthSweepConfig,
        width_sweep_slice,
    )

    return {
        "config": asdict(WidthSweepConfig(**WIDTH_SWEEP_SLICE)),
        "result": width_sweep_slice(),
    }


def _restamp(path: Path) -> int:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from fmlab import stored
    from fmlab.chapters.ch5_sgd_noise import width_sweep_job_check, width_sweep_sources

    torch.set_num_threads(1)
    sources = stored.fingerprint(width_sweep_sources())  # the code as it starts
    return stored.restamp_checked(
        path,
        sources=sources,
        check=width_sweep_job_check,
        job="width 32 at learning rate 0.01, chunk 0",
        slice=_slice,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--seeds", type=int, default=6, help="models per width")
    ap.add_argument(
        "--per-job",
        type=int,
        nargs="+",
        default=[6, 3, 2, 1],
        help="models per job, one number per width (or one for all)",
    )
    ap.add_argument("--steps", type=int, default=0, help="override pretrain_steps")
    ap.add_argument("--lr", type=float, default=0.0, help="override pretrain_lr")
    ap.add_argument(
        "--trace-examples", type=int, default=0, help="override n_trace (tests)"
    )
    ap.add_argument(
        "--append", action="store_true", help="add these runs to those in --out"
    )
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--device", default="cpu", help="where the models train (data: CPU generators)"
    )
    ap.add_argument(
        "--restamp",
        action="store_true",
        help="rerun one job of --out and, if it reproduces its record, record the "
        "fingerprint of today's code on the file (for changes that cannot move it)",
    )
    a = ap.parse_args(argv)
    if a.restamp:
        return _restamp(a.out)
    from fmlab import stored
    from fmlab.chapters.ch5_sgd_noise import WIDTH_SWEEP_SCRIPT, width_sweep_sources

    sources = stored.fingerprint(width_sweep_sources())  # the code as it starts
    per = (
        a.per_job if len(a.per_job) == len(a.widths) else a.per_job[:1] * len(a.widths)
    )
    jobs = []
    for w, p in zip(a.widths, per):
        if a.seeds % p:
            ap.error(f"--per-job: {p} does not divide --seeds {a.seeds}")
        jobs += [
            (w, chunk, p, a.steps, a.lr, a.device, a.trace_examples)
            for chunk in range(a.seeds // p)
        ]
    jobs.sort(key=lambda j: -(j[0] ** 2) * j[2])  # the slowest first
    t0 = time.time()
    if a.jobs == 1:  # in this process (also what the tests run)
        runs = [_job(j) for j in jobs]
    else:
        with ProcessPoolExecutor(a.jobs) as pool:
            runs = list(pool.map(_job, jobs))
    from fmlab.chapters.ch5_sgd_noise import WidthSweepConfig

    config = WidthSweepConfig()
    if a.steps:
        config = replace(config, pretrain_steps=a.steps)
    if a.trace_examples:
        config = replace(config, n_trace=a.trace_examples)
    meta = {"config": asdict(config), "wall_seconds": time.time() - t0}
    if a.append:  # only onto runs of the same code (else StaleResults: rerun all)
        before = stored.load(a.out, script=WIDTH_SWEEP_SCRIPT, sources=sources)
        runs = before["runs"] + runs
        meta = {"earlier": before["meta"], **meta}
    runs.sort(key=lambda r: (r["width"], r.get("lr", config.pretrain_lr), r["chunk"]))
    # the file records the fingerprint of the code that produced it; the page's loader
    # refuses it, naming this script, once that code changes
    stored.write(
        a.out,
        {"meta": meta, "runs": runs},
        script=WIDTH_SWEEP_SCRIPT,
        sources=sources,
        config=config,
        device=a.device,
        slice=_slice(),
    )
    print(f"wrote {a.out} ({meta['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
