"""Chapter 4's second world: pretrainings in which ``[CLS]`` has a job, and their
few-shot runs at k = 64; writes ``src/fmlab/chapters/results/ch4_second_world.json``
(with the fingerprint of the code that produced it, :mod:`fmlab.stored`), which page 04
(``notebooks/04-kernel-view.ipynb``) reads.

    python scripts/ch4_second_world.py                    # screen, then the main set
    python scripts/ch4_second_world.py --parts main       # the registered set only
    python scripts/ch4_second_world.py --parts screen main book offset
    python scripts/ch4_second_world.py --device cuda  # recorded; the runs use the CPU

Parts, in the order given (the file is rewritten after each pretraining, so a stopped
run keeps what it finished; a part already in the file is skipped unless --redo):

* ``screen``: the RoBERTa-faithful variant, a topic in the text that tilts the neutral
  words (``topic_tilt`` 0.5) and no ``[CLS]`` loss (w = 0), three pretrainings
  (seeds 200-202) x four runs;
* ``main``: the registered world (``ch4.second_world_contrast``): the length task on
  ``[CLS]`` at w = 1, pretraining seeds 100-102 (never used in the screen) x five runs;
* ``book``: the chapter's own world (no job for ``[CLS]``) on the same seeds, for the
  figure of both worlds;
* ``offset``: the main world's seeds at seed offset 903 (never used in design).

One pretraining after another in this process, on one core. The file also keeps a
slice (``fmlab.chapters.ch4_second_world.SECOND_WORLD_SLICE``), which the tests rerun
under another rounding path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "fmlab" / "chapters" / "results" / "ch4_second_world.json"
PARTS = ("screen", "main", "book", "offset")


def part_config(name: str):
    """The :class:`SecondWorldConfig` of a part of the stored run."""
    from fmlab.chapters.ch4_second_world import SecondWorldConfig

    main = SecondWorldConfig()
    return {
        "screen": replace(
            main,
            cls_task="none",
            cls_weight=0.0,
            topic_tilt=0.5,
            pretrain_seeds=(200, 201, 202),
            runs=4,
        ),
        "main": replace(main, pretrain_seeds=(100, 101, 102)),
        "book": replace(
            main, cls_task="none", cls_weight=0.0, pretrain_seeds=(100, 101, 102)
        ),
        "offset": replace(main, seed_offset=903, pretrain_seeds=(100, 101, 102)),
    }[name]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=["screen", "main"])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--redo", action="store_true", help="rerun parts already stored")
    ap.add_argument(
        "--device",
        default="cpu",
        help="recorded device; the models are tiny and train on the CPU",
    )
    a = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from fmlab import stored
    from fmlab.chapters.ch4_second_world import (
        SECOND_WORLD_SCRIPT,
        second_world_pretraining,
        second_world_slice,
        second_world_sources,
        slice_config,
    )

    torch.set_num_threads(1)
    sources = stored.fingerprint(second_world_sources())  # the code as it starts
    parts = {}
    if a.out.exists() and not a.redo:
        old = stored.read(a.out)
        if old["stored"]["fingerprint"] == sources:
            parts = old["parts"]
    sliced = None
    t0 = time.time()
    for name in a.parts:
        config = part_config(name)
        seeds = config.pretrain_seeds
        done = [
            p for p in parts.get(name, {}).get("pretrainings", []) if p["seed"] in seeds
        ]
        done = [] if a.redo else done
        todo = seeds[len(done) :]
        recorded = parts.get(name, {}).get("config")
        if not todo and recorded == json.loads(json.dumps(asdict(config))):
            print(f"{name}: stored already")
            continue
        if not todo:  # the part's settings changed to a subset already run: record them
            todo = [None]
        for seed in todo:
            if seed is not None:
                r = second_world_pretraining(config, seed)
                done.append(r)
                c = [round(v, 1) for v in r["contrast"]]
                print(
                    f"{name}, pretraining {seed}: contrast {c}, zero-shot "
                    f"{r['zero_shot'][0]:.1f}%, {r['seconds']:.0f} s",
                    flush=True,
                )
            parts[name] = {"config": asdict(config), "pretrainings": done}
            if sliced is None:
                sliced = {"config": slice_config(), "result": second_world_slice()}
            stored.write(
                a.out,
                {"parts": parts, "meta": {"wall_seconds": time.time() - t0}},
                script=SECOND_WORLD_SCRIPT,
                sources=sources,
                config={n: p["config"] for n, p in parts.items()},
                device=a.device,
                slice=sliced,
            )
    print(f"wrote {a.out} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
