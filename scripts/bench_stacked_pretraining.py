"""Benchmark: pretraining Chapter 4's masked LMs one at a time or stacked (steps/s).

For each width, the chapter's seeds are pretrained for ``--steps`` steps twice: one
model at a time (the loop of ``fmlab.chapters.ch4_world.pretrain_masked_lm``, run
without its cache) and all seeds at once as stacked weights
(``pretrain_masked_lms_stacked``). It prints model-steps per second (one step of one
model) for both, best of ``--repeats``, wall clock, and the largest difference of the
final losses.

    python scripts/bench_stacked_pretraining.py [--steps 200] [--threads 1]

A script, not a timed test: timings depend on the machine and on its load.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["FMLAB_PROGRESS"] = "0"
    from fmlab.chapters import ch4_kernel_view as ch4
    from fmlab.chapters import ch4_world as ch4w

    chapter = ch4.ChapterConfig()
    for width in chapter.widths:
        configs = tuple(
            dataclasses.replace(
                chapter.pretrain, d_model=width, steps=args.steps, seed=seed
            )
            for seed in chapter.pretrain_seeds
        )
        n = len(configs) * args.steps
        best_alone = best_stacked = float("inf")
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as cache:  # a cold cache every time
                os.environ["FMLAB_CACHE_DIR"] = cache
                t = time.perf_counter()
                alone = [ch4w.pretrain_masked_lm(c)[1] for c in configs]
                best_alone = min(best_alone, time.perf_counter() - t)
            t = time.perf_counter()
            stacked = [
                losses for _, losses in ch4w.pretrain_masked_lms_stacked(configs)
            ]
            best_stacked = min(best_stacked, time.perf_counter() - t)
        diff = max(float((a - s).abs().max()) for a, s in zip(alone, stacked))
        print(
            f"width {width}, {len(configs)} seeds x {args.steps} steps: one at a time "
            f"{n / best_alone:.1f} model-steps/s, stacked {n / best_stacked:.1f} "
            f"({best_alone / best_stacked:.2f}x); largest loss difference {diff:.1e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
