"""Chapter 4's costliest runs of page 04: the k = 16 few-shot runs (20 draws, the wide
search of SGD-FT in both settings, Adam, LoRA and a batch-1 SignGD run beside their
kernels) at seed offset 0, computed afresh (the pretraining too) and written to
``src/fmlab/chapters/results/ch4_fewshot.json`` with the fingerprint of the code that
computes them (:mod:`fmlab.stored`), which page 04 reads at seed offset 0 instead of
computing them.

    python scripts/ch4_fewshot.py                          # the stored runs, one core
    python scripts/ch4_fewshot.py --seeds 2 --out /tmp/f.json   # a quick try
    python scripts/ch4_fewshot.py --restamp  # after a change that cannot move it

About four minutes of one core. The page reads the runs only when its configs are
exactly the stored ones (so a try with ``--seeds`` is never read by the page). The file
also keeps a slice (``fmlab.chapters.ch4_stored.FEWSHOT_SLICE``), which the tests rerun
under another rounding path.

``--restamp``: when the code behind the file has changed, rerun draws 0 and 1 of the
stored run (its pretraining afresh) with today's code and, only if they reproduce their
record, record today's fingerprint on the file (``fmlab.stored.restamp_checked``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "fmlab" / "chapters" / "results" / "ch4_fewshot.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=0, help="fewer draws (a try)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--restamp",
        action="store_true",
        help="rerun draws 0 and 1 of --out and, if they reproduce their record, record "
        "the fingerprint of today's code on the file (for changes that cannot move it)",
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
    from fmlab.chapters.ch4_stored import (
        FEWSHOT_EXPERIMENT,
        FEWSHOT_PRETRAIN,
        FEWSHOT_SCRIPT,
        fewshot_job_check,
        fewshot_run,
        fewshot_slice,
        fewshot_slice_config,
        fewshot_sources,
    )

    torch.set_num_threads(1)
    sources = stored.fingerprint(fewshot_sources())  # the code as it starts
    if a.restamp:
        return stored.restamp_checked(
            a.out,
            sources=sources,
            check=fewshot_job_check,
            job="draws 0 and 1 (the pretraining afresh, every method)",
        )
    pretrain, experiment = FEWSHOT_PRETRAIN, FEWSHOT_EXPERIMENT
    if a.seeds:
        experiment = replace(experiment, seeds=tuple(range(a.seeds)))
    t0 = time.time()
    entry = fewshot_run(pretrain, experiment)
    seconds = time.time() - t0
    for key, v in sorted(entry["accuracy"].items()):
        print(f"{key}: mean test accuracy {100 * sum(v) / len(v):.1f}%", flush=True)
    t1 = time.time()
    sliced = {
        "config": fewshot_slice_config(),
        "result": fewshot_slice(fewshot_slice_config()),
    }
    meta = {"wall_seconds": seconds, "slice_seconds": time.time() - t1}
    config = {"pretrain": asdict(pretrain), "experiment": asdict(experiment)}
    stored.write(
        a.out,
        {"meta": meta, "runs": [{**config, "entry": entry}]},
        script=FEWSHOT_SCRIPT,
        sources=sources,
        config={"runs": [config]},
        slice=sliced,
    )
    size, sliced_s = a.out.stat().st_size / 1e6, meta["slice_seconds"]
    print(f"wrote {a.out} ({size:.2f} MB; {seconds:.0f} s, slice {sliced_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
