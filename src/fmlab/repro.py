"""Seeding, determinism, threads, config hashing and device choice.

Every chapter calls :func:`seed_everything` once per experiment; there is no other
source of randomness in fmlab except explicit ``torch.Generator`` objects made by
:func:`make_generator`. The same seed gives the same numbers on the same machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random

import numpy as np
import torch

from ._validate import check_int

__all__ = ["seed_everything", "make_generator", "single_threaded", "config_hash", "get_device"]


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch, make torch deterministic, and return a generator.

    Parameters
    ----------
    seed : int
        A non-negative integer.

    Returns
    -------
    torch.Generator
        A CPU generator seeded with ``seed``, for code that wants its own stream.
    """
    seed = check_int("seed", seed, minimum=0, maximum=2**63 - 1)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    return make_generator(seed)


def make_generator(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed`` (independent of the global stream)."""
    seed = check_int("seed", seed, minimum=0, maximum=2**63 - 1)
    g = torch.Generator()
    g.manual_seed(seed)
    return g


@contextlib.contextmanager
def single_threaded():
    """Run torch on one CPU thread inside the block, then restore the previous setting.

    The book's models are so small that every operation is dominated by overhead; a
    second intra-op thread only adds synchronisation, and on a shared machine it made
    some chapters several times slower. (The Makefile sets ``OMP_NUM_THREADS=1`` for the
    whole build; this is for code run from Jupyter, e.g. Chapter 5's experiment.)
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _jsonable(obj):
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"__class__": type(obj).__qualname__, **{k: _jsonable(v) for k, v in dataclasses.asdict(obj).items()}}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in sorted(obj.items())}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return repr(obj)
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    raise TypeError(f"config must hold only dataclasses, dicts, lists, numbers and strings; got {type(obj).__name__}")


def config_hash(config, *, length: int = 16) -> str:
    """A stable hex digest of a config (a dataclass, dict, or nested combination).

    The digest depends on the class name and every field value, so two configs that
    would train different models never share a cache entry.
    """
    length = check_int("length", length, minimum=4, maximum=64)
    blob = json.dumps(_jsonable(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def get_device() -> torch.device:
    """The device experiments run on: CPU unless ``FMLAB_DEVICE`` names another and it exists.

    The book is built and tested on the CPU. Set ``FMLAB_DEVICE=cuda`` to run a chapter
    at larger scale on a GPU when one is present.
    """
    want = os.environ.get("FMLAB_DEVICE", "cpu").strip().lower()
    if want.startswith("cuda") and torch.cuda.is_available():
        return torch.device(want)
    return torch.device("cpu")
