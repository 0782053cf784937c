"""Chapter 6's two pretrained transformers of page 06b: trains the page's two
pretrainings (``fmlab.chapters.ch6_icl.Chapter6Config``'s defaults, seeds 0 and 1,
together as stacked weights) at seed offset 0 and writes
``src/fmlab/chapters/results/ch6_pretrained.json`` (their weights, training losses and
validation losses, with the fingerprint of the code that trains them,
:mod:`fmlab.stored`), which page 06b reads at seed offset 0 instead of training them.

    python scripts/ch6_pretrained.py                    # the stored runs, one core
    python scripts/ch6_pretrained.py --steps 20 --out /tmp/p.json   # a quick try

About 400 s of one core. The page reads a run only when its config is exactly a stored
one (so a try with ``--steps`` is never read by the page). The file also keeps a slice
(``fmlab.chapters.ch6_pretrained.PRETRAINED_SLICE``: 6 steps of three runs of the
same pretraining), which the tests rerun under another rounding path.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "fmlab" / "chapters" / "results" / "ch6_pretrained.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=0, help="override the steps (a try)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--device", default="cpu", help="where the models train (data: CPU generators)"
    )
    a = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("FMLAB_PROGRESS", "0")
    import torch

    from fmlab import stored
    from fmlab.chapters.ch6_pretrained import (
        PRETRAINED_SCRIPT,
        PRETRAINED_SLICE,
        pretrained_config,
        pretrained_run,
        pretrained_slice,
        pretrained_sources,
    )

    torch.set_num_threads(1)
    sources = stored.fingerprint(pretrained_sources())  # the code as it starts
    config = pretrained_config()
    if a.steps:
        config = replace(config, steps=a.steps, warmup=min(config.warmup, a.steps))
    t0 = time.time()
    runs = pretrained_run(config, device=a.device)
    seconds = time.time() - t0
    for r in runs:
        seed, losses = r["config"]["seed"], r["losses"]
        print(
            f"seed {seed}: training loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
            f"validation {r['val_loss']:.4f}",
            flush=True,
        )
    t1 = time.time()
    slice_config = asdict(replace(pretrained_config(), **PRETRAINED_SLICE))
    sliced = {"config": slice_config, "result": pretrained_slice(slice_config)}
    meta = {"wall_seconds": seconds, "slice_seconds": time.time() - t1}
    stored.write(
        a.out,
        {"meta": meta, "runs": runs},
        script=PRETRAINED_SCRIPT,
        sources=sources,
        config=config,
        device=a.device,
        slice=sliced,
    )
    size, sliced_s = a.out.stat().st_size / 1e6, meta["slice_seconds"]
    print(f"wrote {a.out} ({size:.1f} MB; {seconds:.0f} s, slice {sliced_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
