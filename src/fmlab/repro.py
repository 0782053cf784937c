"""Seeding, determinism, threads, config hashing and device choice.

Every chapter calls :func:`seed_everything` once per experiment; there is no other
source of randomness in fmlab except explicit ``torch.Generator`` objects made by
:func:`make_generator`. The same seed gives the same numbers on the same machine.

**One seed knob.** Both functions pass their seed through :func:`effective_seed`, which
reads the environment variable ``FMLAB_SEED_OFFSET`` (an integer K >= 0, default 0).
At K = 0 every seed is used as written; at K > 0 every seed of every chapter is mapped
to
a new, independent one (pretraining seeds, task and evaluation draws, random worlds,
bootstrap draws alike), so a whole chapter is rerun on fresh randomness without editing
it. ``scripts/check_seeds.py`` uses this to check that every claim holds at several
offsets. :func:`fmlab.train.cached` adds the offset to its cache key, so runs at
different offsets never share a trained model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
from pathlib import Path

import numpy as np
import torch

from ._validate import check_int

__all__ = [
    "code_fingerprint",
    "seed_everything",
    "make_generator",
    "seed_offset",
    "effective_seed",
    "single_threaded",
    "config_hash",
    "get_device",
]

_MASK63 = (1 << 63) - 1


def seed_offset() -> int:
    """The seed offset K of this run: ``$FMLAB_SEED_OFFSET`` (an integer >= 0; 0 unset).

    No chapter reads the variable itself; every seed goes through
    :func:`effective_seed`.
    """
    raw = os.environ.get("FMLAB_SEED_OFFSET", "").strip()
    if not raw:
        return 0
    try:
        k = int(raw)
    except ValueError:
        raise ValueError(
            f"FMLAB_SEED_OFFSET must be an integer >= 0, got {raw!r}"
        ) from None
    if k < 0:
        raise ValueError(f"FMLAB_SEED_OFFSET must be an integer >= 0, got {k}")
    return k


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def effective_seed(seed: int, offset: int | None = None) -> int:
    """The seed actually used for the written ``seed`` at seed offset ``offset``.

    ``offset`` defaults to :func:`seed_offset`. Offset 0 returns ``seed`` unchanged (the
    published book). Any other offset returns a 63-bit mix of (seed, offset) by
    SplitMix64, so that seeds 0, 1, 2 of one offset share no stream with seeds 0, 1, 2
    of
    another: each random quantity becomes a new independent draw.
    """
    seed = check_int("seed", seed, minimum=0, maximum=_MASK63)
    offset = seed_offset() if offset is None else check_int("offset", offset, minimum=0)
    if offset == 0:
        return seed
    return _splitmix64(_splitmix64(seed) ^ _splitmix64(offset + 0x5EED)) & _MASK63


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch, make torch deterministic, and return a generator.

    Parameters
    ----------
    seed : int
        A non-negative integer; shifted by the seed offset (:func:`effective_seed`).

    Returns
    -------
    torch.Generator
        A CPU generator seeded with the same effective seed, for code that wants its own
        stream.
    """
    seed = effective_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def make_generator(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``effective_seed(seed)``.

    Independent of the global stream; at seed offset 0 it is seeded with ``seed``
    itself.
    """
    seed = effective_seed(seed)
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
        return {
            "__class__": type(obj).__qualname__,
            **{k: _jsonable(v) for k, v in dataclasses.asdict(obj).items()},
        }
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in sorted(obj.items())}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return repr(obj)
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    raise TypeError(
        "config must hold only dataclasses, dicts, lists, numbers and strings; "
        f"got {type(obj).__name__}"
    )


def config_hash(config, *, length: int = 16) -> str:
    """A stable hex digest of a config (a dataclass, dict, or nested combination).

    The digest depends on the class name and every field value, so two configs that
    would train different models never share a cache entry.
    """
    length = check_int("length", length, minimum=4, maximum=64)
    blob = json.dumps(_jsonable(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def get_device() -> torch.device:
    """The device to run on: CPU unless ``FMLAB_DEVICE`` names another that exists.

    The book is built and tested on the CPU. Set ``FMLAB_DEVICE=cuda`` to run a chapter
    at larger scale on a GPU when one is present.
    """
    want = os.environ.get("FMLAB_DEVICE", "cpu").strip().lower()
    if want.startswith("cuda") and torch.cuda.is_available():
        return torch.device(want)
    return torch.device("cpu")


_PACKAGE_ROOT = Path(__file__).resolve().parent


# Modules that judge or draw results but never compute them: a cached result does not
# depend on them (the outputs of a chapter page do).
_PRESENTATION = ("claims.py", "viz.py")


def code_fingerprint(
    chapter: str | None = None, *, outputs: bool = False, root: Path | None = None
) -> str:
    """A hash of the fmlab source that a chapter's results depend on.

    With ``chapter`` (e.g. ``"ch4"``): every module outside ``fmlab/chapters`` plus that
    chapter's modules, so an edit to another chapter leaves the fingerprint unchanged.
    With ``chapter=None``: the whole package. By default (the key of
    :func:`fmlab.cached`) the modules that only judge or draw results are left out
    (``claims.py``, ``viz.py`` and the chapters' ``chN_figures.py``); with
    ``outputs=True`` (the key of a chapter page's executed outputs) they count too. The
    bytes of each file are hashed with its path, so a comment edit changes the
    fingerprint too (a safe, simple rule).
    """
    root = _PACKAGE_ROOT if root is None else Path(root)
    if chapter is not None and (
        not isinstance(chapter, str) or not re.fullmatch(r"ch\d+", chapter)
    ):
        raise ValueError(f"chapter must look like 'ch4' or be None, got {chapter!r}")
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        drawing = rel in _PRESENTATION or rel.endswith("_figures.py")
        if drawing and not outputs:
            continue
        if chapter is not None and rel.startswith("chapters/ch"):
            name = rel.split("/", 1)[1]
            if name.split("_", 1)[0] != chapter:
                continue
        h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]
