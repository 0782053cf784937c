"""Chapter 5's same-loss experiment at the configuration of its page
(``notebooks/05b-same-loss.ipynb``): six bidirectional-GRU masked language models
pretrained to saturation, the adversary and its control, and plain SGD from the
adversarial models; writes ``src/fmlab/chapters/results/ch5_same_loss.json`` (with the
fingerprint of the code that produced it, :mod:`fmlab.stored`), which the page reads at
seed offset 0.

    python scripts/ch5_same_loss.py            # about four minutes on one core
    python scripts/ch5_same_loss.py --restamp  # after a change that cannot move it

The configuration is :data:`PAGE_CONFIG` below, the page's (a test holds the two
together); runs at other seed offsets are never stored: the page computes them. The
file also keeps a slice (``fmlab.chapters.ch5_implicit_bias.SAME_LOSS_SLICE``: the
pretraining phase, shortened), which the tests rerun under another rounding path. The
run takes no ``--device``: its models have 30k parameters and its phases alternate
short training with evaluation, so the CPU is where it is fastest.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "fmlab" / "chapters" / "results" / "ch5_same_loss.json"

#: the page's configuration (its cell that defines ``cfg``)
PAGE_CONFIG = dict(
    n_models=6,
    pretrain_steps=1500,
    adversarial_weight=0.05,
    reconverge_steps=500,
    continue_steps=0,
    recovery_lrs=(0.25, 0.5),
    recovery_batches=(64, 128),
    sgd_models=3,
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--restamp",
        action="store_true",
        help="rerun the pretraining of --out and, if it reproduces its record, record "
        "the fingerprint of today's code on the file (for changes that cannot move it)",
    )
    a = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from fmlab import stored
    from fmlab.chapters import ch5_implicit_bias as ch5
    from fmlab.repro import seed_offset

    if seed_offset():
        ap.error("only seed offset 0 is stored: unset FMLAB_SEED_OFFSET")
    torch.set_num_threads(1)
    sources = stored.fingerprint(ch5.same_loss_sources())  # the code as it starts
    config = ch5.SameLossConfig(**PAGE_CONFIG)
    slice_config = replace(config, **ch5.SAME_LOSS_SLICE)
    if a.restamp:
        return stored.restamp_checked(
            a.out,
            sources=sources,
            check=ch5.same_loss_job_check,
            job="the pretraining phase",
            slice=lambda: {
                "config": slice_config,
                "result": ch5.same_loss_slice(asdict(slice_config)),
            },
        )
    t0 = time.time()
    result = ch5.same_loss_experiment(config)
    meta = {"config": asdict(config), "wall_seconds": time.time() - t0}
    stored.write(
        a.out,
        {"meta": meta, "result": stored.encode_tensors(result)},
        script=ch5.SAME_LOSS_SCRIPT,
        sources=sources,
        config=config,
        slice={
            "config": slice_config,
            "result": ch5.same_loss_slice(asdict(slice_config)),
        },
    )
    print(f"wrote {a.out} ({meta['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
