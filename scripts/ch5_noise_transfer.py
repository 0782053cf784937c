"""Chapter 5's continued-SGD experiment at the configuration of its transformer page
(``notebooks/05c-same-loss-transformer.ipynb``): three BERT-style transformers
pretrained to saturation as one ensemble, then continued with plain SGD at three noise
levels, every model measured (gap, Fisher traces per block, probe transfer); writes
``src/fmlab/chapters/results/ch5_noise_transfer.json`` (with the fingerprint of the
code that produced it, :mod:`fmlab.stored`), which the page reads at seed offset 0.

    python scripts/ch5_noise_transfer.py            # about 4 minutes on one core
    python scripts/ch5_noise_transfer.py --restamp  # after a change that cannot move it

The configuration is :data:`PAGE_CONFIG` below, the page's (a test holds the two
together); runs at other seed offsets are never stored: the page computes them. The
file also keeps a slice (``fmlab.chapters.ch5_sgd_noise.NOISE_TRANSFER_SLICE``: the
same experiment, shortened), which the tests rerun under another rounding path.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "fmlab" / "chapters" / "results" / "ch5_noise_transfer.json"

#: the page's configuration (its cell that defines ``tcfg``)
PAGE_CONFIG = dict(
    d_model=32,
    pretrain_steps=2000,
    continue_steps=1000,
    continue_lrs=(0.03, 0.1, 0.3),
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--restamp",
        action="store_true",
        help="rerun the run of --out and, if it reproduces its record, record the "
        "fingerprint of today's code on the file (for changes that cannot move it)",
    )
    a = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from fmlab import stored
    from fmlab.chapters import ch5_sgd_noise as ch5t
    from fmlab.repro import seed_offset

    if seed_offset():
        ap.error("only seed offset 0 is stored: unset FMLAB_SEED_OFFSET")
    torch.set_num_threads(1)
    sources = stored.fingerprint(ch5t.noise_transfer_sources())  # the code as it starts
    config = ch5t.NoiseTransferConfig(**PAGE_CONFIG)
    slice_config = replace(config, **ch5t.NOISE_TRANSFER_SLICE)
    if a.restamp:
        return stored.restamp_checked(
            a.out,
            sources=sources,
            check=ch5t.noise_transfer_job_check,
            job="the whole run",
            slice=lambda: {
                "config": slice_config,
                "result": ch5t.noise_transfer_slice(asdict(slice_config)),
            },
        )
    t0 = time.time()
    result = ch5t.noise_transfer_experiment(config)
    meta = {"config": asdict(config), "wall_seconds": time.time() - t0}
    stored.write(
        a.out,
        {"meta": meta, "result": stored.encode_tensors(result)},
        script=ch5t.NOISE_TRANSFER_SCRIPT,
        sources=sources,
        config=config,
        slice={
            "config": slice_config,
            "result": ch5t.noise_transfer_slice(asdict(slice_config)),
        },
    )
    print(f"wrote {a.out} ({meta['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
