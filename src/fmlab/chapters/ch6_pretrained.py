"""Page 06b's two pretrained transformers, stored (Chapter 6).

Page 06b pretrains two transformers (:class:`fmlab.chapters.ch6_icl.Chapter6Config`'s
defaults: seeds 0 and 1, 1500 steps, trained together as stacked weights by
:func:`fmlab.chapters.ch6_icl._train_stacked`), which takes about 400 s of one core,
more than the page's budget. ``scripts/ch6_pretrained.py`` trains them once, exactly as
the page would at seed offset 0, into ``results/ch6_pretrained.json``: each run's
config, weights, training losses, validation loss and training time, with the
fingerprint of the code that trains them (:mod:`fmlab.stored`).

:func:`stored_run` is the switch: at seed offset 0, a run whose
:class:`~fmlab.chapters.ch6_icl.GINCPretrainConfig` is exactly one of the stored runs'
is read from the file by :func:`fmlab.chapters.ch6_icl.pretrain_ginc_lm` and
:func:`~fmlab.chapters.ch6_icl.pretrain_ginc_lms` instead of being trained; at any
other seed offset or config the runs train as before. A stored file whose code has
changed raises :class:`fmlab.stored.StaleResults`, naming the script. The file also
keeps a slice (:data:`PRETRAINED_SLICE`: 6 steps of three runs of the same
pretraining), which the tests rerun under another rounding path.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from dataclasses import asdict, replace
from pathlib import Path

import torch

from .. import stored
from ..data.ginc import GINCConfig
from ..repro import seed_offset, single_threaded
from . import ch6_icl

__all__ = [
    "PRETRAINED_RESULTS",
    "PRETRAINED_SCRIPT",
    "PRETRAINED_SLICE",
    "pretrained_config",
    "pretrained_run",
    "pretrained_slice",
    "pretrained_results",
    "pretrained_sources",
    "stored_run",
]

PRETRAINED_RESULTS = Path(__file__).parent / "results" / "ch6_pretrained.json"
PRETRAINED_SCRIPT = "scripts/ch6_pretrained.py"

#: The slice the tests rerun (under another rounding path than the record's): the
#: page's pretraining, three runs, 4 steps (a 2-step warm-up); seconds.
PRETRAINED_SLICE = dict(steps=4, warmup=2, model_seeds=(0, 1, 2))


def pretrained_config(record: dict | None = None) -> ch6_icl.Chapter6Config:
    """The page's :class:`~fmlab.chapters.ch6_icl.Chapter6Config` (its defaults), or
    the one recorded as data in a results file (``record``)."""
    if record is None:
        return ch6_icl.Chapter6Config()
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
    values["world"] = GINCConfig(**record["world"])
    return ch6_icl.Chapter6Config(**values)


@contextlib.contextmanager
def _offset_zero():
    """Run the block at seed offset 0 (the published book's seeds)."""
    old = os.environ.pop("FMLAB_SEED_OFFSET", None)
    try:
        yield
    finally:
        if old is not None:
            os.environ["FMLAB_SEED_OFFSET"] = old


def pretrained_run(config: ch6_icl.Chapter6Config, device="cpu") -> list:
    """Train the runs of ``config`` (one per model seed, together as stacked weights,
    on ``device``, at seed offset 0, on one thread) as the page does, and return them
    as plain data for JSON: per run its ``config`` (the
    :class:`~fmlab.chapters.ch6_icl.GINCPretrainConfig`), ``state_dict``
    (:func:`fmlab.stored.encode_tensors`), training ``losses`` per step,
    ``val_loss`` and ``cpu_seconds``."""
    if not isinstance(config, ch6_icl.Chapter6Config):
        raise TypeError(f"config must be a Chapter6Config, got {type(config)}")
    cfgs = [config.pretrain_config(s) for s in config.model_seeds]
    with _offset_zero(), single_threaded():
        runs = ch6_icl._train_stacked(cfgs, device=device)
    return [
        {
            "config": json.loads(json.dumps(asdict(c))),
            "state_dict": stored.encode_tensors(r["state_dict"]),
            "losses": r["losses"].tolist(),
            "val_loss": float(r["val_loss"]),
            "cpu_seconds": float(r["cpu_seconds"]),
        }
        for c, r in zip(cfgs, runs)
    ]


def pretrained_slice(record: dict | None = None, device="cpu") -> dict:
    """Run the slice (the config ``record``, by default the page's config with
    :data:`PRETRAINED_SLICE`): each run's training losses per step and validation loss
    (the replicates, first axis), the quantities that
    :func:`fmlab.stored.compare_runs` compares."""
    if record is None:
        config = replace(pretrained_config(), **PRETRAINED_SLICE)
    else:
        config = pretrained_config(record)
    runs = pretrained_run(config, device=device)
    return {
        "losses": [r["losses"] for r in runs],
        "val_loss": [r["val_loss"] for r in runs],
    }


def pretrained_sources() -> list:
    """The package code that trains the stored runs, for their fingerprint
    (:mod:`fmlab.stored`); the script's settings are in the file as its config."""
    from ..data import ginc
    from ..models import gpt
    from ..repro import _splitmix64, effective_seed, make_generator, seed_everything
    from ..theory import bayes_icl
    from ..train import lr_factor

    return [
        pretrained_config,
        pretrained_run,
        pretrained_slice,
        _offset_zero,
        ch6_icl.Chapter6Config,
        ch6_icl.GINCPretrainConfig,
        ch6_icl._train_stacked,
        ch6_icl._stacked_logits,
        ch6_icl._stacked_linear,
        ch6_icl._stacked_layer_norm,
        ch6_icl._validation_loss,
        ch6_icl._corpus,
        ch6_icl._draw_windows,
        ch6_icl.build_model,
        lr_factor,
        make_generator,
        effective_seed,
        _splitmix64,  # effective_seed's mixer
        seed_everything,
        ginc,
        gpt,
        bayes_icl,
    ]


def pretrained_results(path: Path | str | None = None) -> dict | None:
    """The stored runs (``{"meta", "runs": [per run: config, state_dict, losses,
    val_loss, cpu_seconds], "stored"}``, as written), or None when the file is
    absent. Raises :class:`fmlab.stored.StaleResults`, naming the script, when the
    code that trains them has changed since."""
    path = Path(PRETRAINED_RESULTS if path is None else path)
    if not path.exists():
        return None
    return stored.load_cached(
        path, script=PRETRAINED_SCRIPT, sources=pretrained_sources()
    )


@functools.lru_cache(maxsize=4)
def _stored_configs(path: str, mtime_ns: int) -> list:
    return [run["config"] for run in stored.read(path)["runs"]]


def stored_run(cfg: ch6_icl.GINCPretrainConfig, path=None) -> dict | None:
    """The stored run of ``cfg`` (as :func:`fmlab.chapters.ch6_icl.pretrain_ginc_lm`
    returns a run: ``state_dict``, ``losses``, ``val_loss``, ``cpu_seconds``) when
    the seed offset is 0 and ``cfg`` is exactly the config of a stored run; else None
    (the run is to be trained). Raises :class:`fmlab.stored.StaleResults` when ``cfg``
    is stored but the code that trains it has changed since."""
    path = Path(PRETRAINED_RESULTS if path is None else path)
    if seed_offset() != 0 or not path.exists():
        return None
    configs = _stored_configs(str(path), path.stat().st_mtime_ns)
    want = json.loads(json.dumps(asdict(cfg)))
    if want not in configs:
        return None
    run = pretrained_results(path)["runs"][configs.index(want)]
    return {
        "state_dict": stored.decode_tensors(run["state_dict"]),
        "losses": torch.tensor(run["losses"], dtype=torch.float32),
        "val_loss": run["val_loss"],
        "cpu_seconds": run["cpu_seconds"],
    }
