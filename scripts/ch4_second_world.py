"""Chapter 4's second world: pretrainings in which ``[CLS]`` has a job, and their
few-shot runs at k = 64; writes ``src/fmlab/chapters/results/ch4_second_world.json``
(with the fingerprint of the code that produced it, :mod:`fmlab.stored`), which page 04
(``notebooks/04-kernel-view.ipynb``) reads.

    python scripts/ch4_second_world.py                    # screen, then the main set
    python scripts/ch4_second_world.py --parts main       # the registered set only
    python scripts/ch4_second_world.py --parts screen main book offset
    python scripts/ch4_second_world.py --parts cv         # the paper's probe head
    python scripts/ch4_second_world.py --device cuda  # recorded; the runs use the CPU
    python scripts/ch4_second_world.py --restamp  # after a change that cannot move it

Parts, in the order given (the file is rewritten after each pretraining, so a stopped
run keeps what it finished; a part already in the file is skipped unless --redo). A
part's pretrainings already in the file, written by the same code (its fingerprint
unchanged), are kept and only the part's other seeds are run: the set of a part can
grow without recomputing what is stored; the stored slice and the file's history are
kept too, and the new record's note says which pretrainings were added when:

* ``screen``: the RoBERTa-faithful variant, a topic in the text that tilts the neutral
  words (``topic_tilt`` 0.5) and no ``[CLS]`` loss (w = 0), three pretrainings
  (seeds 200-202) x four runs;
* ``main``: the registered world (``ch4.second_world_contrast_six``): the length task
  on ``[CLS]`` at w = 1, pretraining seeds 100-105 (never used in the screen) x five
  runs (100-102 were run first, for the retired ``ch4.second_world_contrast``);
* ``book``: the chapter's own world (no job for ``[CLS]``) on the same seeds, for the
  figure of both worlds;
* ``offset``: the main world's seeds 100-105 at seed offset 903 (never used in
  design);
* ``cv``: the main part's pretrainings and runs with standard fine-tuning started
  from the paper's cross-validated probe (its footnote 2) instead of a fresh head,
  reported beside the key, not claimed; its prompt side is the main part's, computed
  again (the kernel change of the prompt runs, which the KC ratio divides by, is not
  stored); page 04 counts the pretrainings whose prompt side equals the main part's
  from the two parts (``fmlab.chapters.ch4_figures.cv_head_text``).

``--restamp``: when the code behind the file has changed, rerun one pretraining of the
main part (105) with today's code and, only if it
reproduces its record, record today's fingerprint on the file
(``fmlab.stored.restamp_checked``); then
``scripts/reslice.py ch4_second_world`` records the slice on the portable path if its
settings changed.

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
PARTS = ("screen", "main", "book", "offset", "cv")


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
        "main": main,  # pretraining seeds 100-105
        "book": replace(
            main, cls_task="none", cls_weight=0.0, pretrain_seeds=(100, 101, 102)
        ),
        "offset": replace(main, seed_offset=903),
        "cv": replace(main, standard_head="cv_probe"),
    }[name]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=["screen", "main"])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--redo", action="store_true", help="rerun parts already stored")
    ap.add_argument(
        "--redo-seeds",
        type=int,
        nargs="+",
        default=(),
        help="rerun these pretrainings of the parts named; the rest of the file stays",
    )
    ap.add_argument(
        "--restamp",
        action="store_true",
        help="rerun one pretraining of the main part and, if it reproduces its record, "
        "record the fingerprint of today's code on the file (for changes that cannot "
        "move it)",
    )
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
        second_world_job_check,
        second_world_pretraining,
        second_world_slice,
        second_world_sources,
        slice_config,
    )

    torch.set_num_threads(1)
    sources = stored.fingerprint(second_world_sources())  # the code as it starts
    if a.restamp:
        return stored.restamp_checked(
            a.out,
            sources=sources,
            check=second_world_job_check,
            job="pretraining 105 of the main part (its five k = 64 runs)",
        )
    parts, before, walls = {}, None, []
    if a.out.exists() and not a.redo:
        old = stored.read(a.out)
        if old["stored"]["fingerprint"] == sources:
            parts, before = old["parts"], old["stored"]
            walls = old["meta"].get("session_seconds", [old["meta"]["wall_seconds"]])
    sliced = None
    if before is not None and before.get("slice", {}).get("config") == json.loads(
        json.dumps(slice_config())
    ):  # the same code and slice config: the stored slice stands
        sliced = {k: before["slice"][k] for k in ("config", "result")}
    added = {}
    t0 = time.time()
    for name in a.parts:
        config = part_config(name)
        seeds = config.pretrain_seeds
        kept = {p["seed"]: p for p in parts.get(name, {}).get("pretrainings", [])}
        kept = {} if a.redo else kept
        kept = {s: p for s, p in kept.items() if s not in a.redo_seeds}
        done = [kept[s] for s in seeds if s in kept]  # in the config's order
        todo = [s for s in seeds if s not in kept]
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
                done.sort(key=lambda p: seeds.index(p["seed"]))
                added.setdefault(name, []).append(seed)
                c = [round(v, 1) for v in r["contrast"]]
                print(
                    f"{name}, pretraining {seed}: contrast {c}, zero-shot "
                    f"{r['zero_shot'][0]:.1f}%, {r['seconds']:.0f} s",
                    flush=True,
                )
            parts[name] = {"config": asdict(config), "pretrainings": done}
            if sliced is None:
                sliced = {"config": slice_config(), "result": second_world_slice()}
            seconds = [*walls, time.time() - t0]
            _write(a, parts, before, added, sliced, sources, seconds)
    print(f"wrote {a.out} ({time.time() - t0:.0f} s)")
    return 0


def _write(a, parts, before, added, sliced, sources, seconds) -> None:
    """Write the file (``seconds``: the wall time of each session that ran it). When
    pretrainings were added to a stored file of the same code, the file's record
    before them (with its own history) is kept under ``"earlier"`` and the note says
    what was added."""
    from fmlab import stored
    from fmlab.chapters.ch4_second_world import SECOND_WORLD_SCRIPT

    note = ""
    if before is not None and added:
        runs = "; ".join(f"{n} {', '.join(map(str, s))}" for n, s in added.items())
        note = f"Pretrainings added to the stored ones (same code, those kept): {runs}"
    meta = {"wall_seconds": sum(seconds), "session_seconds": seconds}
    stored.write(
        a.out,
        {"parts": parts, "meta": meta},
        script=SECOND_WORLD_SCRIPT,
        sources=sources,
        config={n: p["config"] for n, p in parts.items()},
        device=a.device,
        slice=sliced,
        note=note,
    )
    if before is not None:
        data = stored.read(a.out)
        earlier = {k: v for k, v in before.items() if k not in ("fingerprint", "slice")}
        data["stored"]["earlier"] = earlier
        a.out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
