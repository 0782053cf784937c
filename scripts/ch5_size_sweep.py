"""Chapter 5's size sweep in the paper's design: bidirectional-GRU masked language
models of several hidden sizes on the tied language, one recipe, each replicate's data
shared by every size, probed through a fixed projection to one dimension, with the
Fisher traces of every model at its own size and embedded at the largest; writes
``src/fmlab/chapters/results/ch5_size_sweep.json`` (with the fingerprint of the code
that produced it, :mod:`fmlab.stored`), which the transformer page of Chapter 5
(``notebooks/05c-same-loss-transformer.ipynb``) reads.

    python scripts/ch5_size_sweep.py                      # the stored sweep, one core
    python scripts/ch5_size_sweep.py --sizes 16 --models 2 --steps 20 --out /tmp/s.json
    python scripts/ch5_size_sweep.py --device cuda        # the models train on a GPU
    python scripts/ch5_size_sweep.py --restamp  # after a change that cannot move it

One size after another in this process (each size's replicates train as one ensemble).
The file also keeps a slice (``fmlab.chapters.ch5_size.SIZE_SWEEP_SLICE``: a short
run of the same code), which the tests rerun under another rounding path.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "fmlab" / "chapters" / "results" / "ch5_size_sweep.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=None)
    ap.add_argument("--models", type=int, default=0, help="override n_models")
    ap.add_argument("--steps", type=int, default=0, help="override steps")
    ap.add_argument("--trace", type=int, default=0, help="override n_trace")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--device", default="cpu", help="where the models train (data: CPU generators)"
    )
    ap.add_argument(
        "--restamp",
        action="store_true",
        help="rerun one size of --out and, if it reproduces its record, record the "
        "fingerprint of today's code on the file (for changes that cannot move it)",
    )
    a = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from fmlab import stored
    from fmlab.chapters.ch5_size import (
        SIZE_SWEEP_SCRIPT,
        SIZE_SWEEP_SLICE,
        SizeSweepConfig,
        size_sweep_job_check,
        size_sweep_run,
        size_sweep_slice,
        size_sweep_sources,
    )

    torch.set_num_threads(1)
    SLICE = asdict(SizeSweepConfig(**SIZE_SWEEP_SLICE))
    sources = stored.fingerprint(size_sweep_sources())  # the code as it starts
    if a.restamp:
        return stored.restamp_checked(
            a.out,
            sources=sources,
            check=size_sweep_job_check,
            job="hidden size 16",
            slice=lambda: {"config": SLICE, "result": size_sweep_slice()},
        )
    config = SizeSweepConfig()
    if a.sizes:
        config = replace(config, sizes=tuple(a.sizes))
    if a.models:
        config = replace(config, n_models=a.models)
    if a.steps:
        config = replace(config, steps=a.steps)
    if a.trace:
        config = replace(config, n_trace=a.trace)
    t0, runs = time.time(), []
    for size in config.sizes:
        runs.append(size_sweep_run(config, size, device=a.device))
        r = runs[-1]
        print(
            f"hidden {size}: gaps {[round(g, 4) for g in r['gap']]}, "
            f"{r['seconds']:.0f} s"
        )
    meta = {"config": asdict(config), "wall_seconds": time.time() - t0}
    stored.write(
        a.out,
        {"meta": meta, "runs": runs},
        script=SIZE_SWEEP_SCRIPT,
        sources=sources,
        config=config,
        device=a.device,
        slice={"config": SLICE, "result": size_sweep_slice()},
    )
    print(f"wrote {a.out} ({meta['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
