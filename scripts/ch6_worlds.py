"""Chapter 6's in-context learning on the paper's own data (no state jumps) across
worlds: the page's transformer pretrained on the paper's documents at several seed
offsets, its gains from examples beside the Bayes predictors' and what separates the
worlds; writes ``src/fmlab/chapters/results/ch6_worlds.json`` (with the fingerprint of
the code that produced it, :mod:`fmlab.stored`), which page 06b reads. At the paper's
scale (4 layers of width 768 on the paper's corpus; a GPU) it writes
``results/ch6_paper_size.json`` instead.

    python scripts/ch6_worlds.py                        # the stored run, one core
    python scripts/ch6_worlds.py --offsets 0 --steps 20 --out /tmp/w.json
    python scripts/ch6_worlds.py --scale paper --device cuda   # the paper's size

One world after another in this process (each world's training runs train together
as stacked weights). The file also keeps a slice (``fmlab.chapters.ch6_worlds.
WORLDS_SLICE``: a tiny run of the same code), which the tests rerun under another
rounding path.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "src" / "fmlab" / "chapters" / "results"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=("book", "paper"), default="book")
    ap.add_argument("--offsets", type=int, nargs="+", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="model seeds")
    ap.add_argument("--steps", type=int, default=0, help="override the steps")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--device", default="cpu", help="where the models train (data: CPU generators)"
    )
    a = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("FMLAB_PROGRESS", "0")
    import torch

    from fmlab import stored
    from fmlab.chapters.ch6_worlds import (
        WORLDS_SCRIPT,
        WORLDS_SLICE,
        WorldsConfig,
        worlds_run,
        worlds_slice,
        worlds_sources,
    )

    torch.set_num_threads(1)
    SLICE = asdict(WorldsConfig(**WORLDS_SLICE))
    sources = stored.fingerprint(worlds_sources())  # the code as it starts
    config = WorldsConfig(scale=a.scale)
    if a.scale == "paper":  # three worlds, two training runs each
        config = replace(config, offsets=(0, 1, 2), model_seeds=(0, 1))
    if a.offsets:
        config = replace(config, offsets=tuple(a.offsets))
    if a.seeds:
        config = replace(config, model_seeds=tuple(a.seeds))
    if a.steps:
        config = replace(config, steps=a.steps)
    name = "ch6_paper_size.json" if a.scale == "paper" else "ch6_worlds.json"
    out = a.out or RESULTS / name
    t0, worlds = time.time(), []
    for offset in config.offsets:
        worlds.append(worlds_run(config, offset, device=a.device))
        w = worlds[-1]
        gains = {
            k: round(sum(map(sum, v)) / sum(map(len, v)), 3)
            for k, v in w["gain"].items()
        }
        print(f"offset {offset}: gains {gains}, {w['seconds']:.0f} s", flush=True)
    meta = {"config": asdict(config), "wall_seconds": time.time() - t0}
    stored.write(
        out,
        {"meta": meta, "worlds": worlds},
        script=WORLDS_SCRIPT
        + (" --scale paper --device cuda" if a.scale == "paper" else ""),
        sources=sources,
        config=config,
        device=a.device,
        slice={"config": SLICE, "result": worlds_slice()},
    )
    print(f"wrote {out} ({meta['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
