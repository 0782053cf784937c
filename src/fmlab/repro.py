"""Seeding, determinism, threads, config and code hashing, and device choice.

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

import ast
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import random
import re
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ._validate import check_int

__all__ = [
    "code_fingerprint",
    "import_closure",
    "module_parts",
    "package_imports",
    "seed_everything",
    "make_generator",
    "seed_offset",
    "effective_seed",
    "single_threaded",
    "config_hash",
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
    # deterministic kernels (a warning where an op has none): the flag that
    # torch.use_deterministic_algorithms(True, warn_only=True) sets, without the import
    # of torch._inductor that function does to configure torch.compile, which fmlab
    # never uses (3-4 s in every process that seeds)
    torch._C._set_deterministic_algorithms(True, warn_only=True)
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


_PACKAGE_ROOT = Path(__file__).resolve().parent


# Modules that judge, draw or load results but never compute them: a cached model does
# not depend on them (the outputs of a chapter page do). ``stored.py`` loads the
# results files that scripts outside the build wrote.
_PRESENTATION = ("claims.py", "viz.py", "stored.py")


def _presentation(rel: str) -> bool:
    return rel in _PRESENTATION or rel.endswith("_figures.py")


def module_parts(path: Path, root: Path) -> tuple[str, ...]:
    """The dotted parts below the package of the module at ``path``.

    ``root`` is the package's directory: ``root/chapters/ch4_world.py`` is
    ``("chapters", "ch4_world")`` and ``root/adapt/__init__.py`` is ``("adapt",)``.
    """
    parts = Path(path).relative_to(root).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def _package_modules(root: Path) -> dict[tuple[str, ...], Path]:
    """Each module of the package under ``root`` by its parts; a package's parts map
    to its ``__init__.py``, which Python prefers to a module file of the same name."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = module_parts(path, root)
        if path.name == "__init__.py" or parts not in modules:
            modules[parts] = path
    return modules


@functools.lru_cache(maxsize=512)
def _import_statements(source: bytes) -> tuple:
    """(line, level, module, names) of every import statement in ``source``, names
    None for ``import module``; kept per source text, since :func:`fmlab.cached`
    fingerprints the code at every call and parsing is the slow part."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            names = tuple(a.name for a in node.names)
            out.append((node.lineno, node.level, node.module, names))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, 0, a.name, None) for a in node.names]
    return tuple(out)


def _imports(path: Path, root: Path, modules: dict) -> list[tuple[int, tuple]]:
    here = module_parts(path, root)
    package = here if path.name == "__init__.py" else here[:-1]
    out = []
    for line, level, module, names in _import_statements(path.read_bytes()):
        dotted = tuple(module.split(".")) if module else ()
        if level:
            if level - 1 > len(package):
                continue  # beyond the top-level package: not an import of it
            mod = package[: len(package) - (level - 1)] + dotted
        elif dotted[0] == root.name:
            mod = dotted[1:]
        else:
            continue  # another package
        out.append((line, mod))
        out += [(line, mod + (n,)) for n in names or () if mod + (n,) in modules]
    return out


def package_imports(path: Path, root: Path) -> list[tuple[int, tuple[str, ...]]]:
    """(line, module's parts below the package) for every import of the package.

    Every ``import`` statement of the file at ``path`` is read with :mod:`ast`,
    function-level ones included; ``root`` is the package's directory, whose name is
    the package's (absolute imports of ``fmlab.x`` count when it is ``fmlab``).
    Relative imports are resolved against the module's package. ``from P import x``
    names ``P`` and also ``P.x`` when that is a module of the package (``from . import
    x``, ``from ..adapt import probes``). Imports of other packages are left out.
    """
    path, root = Path(path), Path(root)
    return _imports(path, root, _package_modules(root))


def import_closure(
    paths, root: Path, *, skip: Callable[[str], bool] | None = None
) -> list[Path]:
    """The package's modules that importing the modules at ``paths`` runs, sorted.

    The modules at ``paths`` (files inside ``root``, the package's directory), every
    module of the package that they import (:func:`package_imports`), transitively,
    and the ``__init__.py`` of every package that holds one of them, since Python runs
    it first. A module whose path relative to ``root`` (e.g. ``"claims.py"``) makes
    ``skip`` true is left out, and so is what only it imports.
    """
    root = Path(root).resolve()
    modules = _package_modules(root)
    todo = [Path(p).resolve() for p in paths]
    outside = [str(p) for p in todo if p not in modules.values()]
    if outside:
        raise ValueError(f"paths must be modules of the package at {root}: {outside}")
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen or (skip is not None and skip(_rel(path, root))):
            continue
        seen.add(path)
        targets = [module_parts(path, root)]
        targets += [t for _, t in _imports(path, root, modules)]
        for target in targets:
            # importing a module runs the __init__.py of each package above it first
            todo += [
                modules[t]
                for i in range(len(target) + 1)
                if (t := target[:i]) in modules
            ]
    return sorted(seen)


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def code_fingerprint(
    chapter: str | None = None, *, outputs: bool = False, root: Path | None = None
) -> str:
    """A hash of the fmlab source that a chapter's results depend on.

    With ``chapter`` (e.g. ``"ch4"``): the chapter's modules
    (``fmlab/chapters/ch4_*.py``) and every fmlab module that they import, directly or
    through other modules, function-level imports included, with the ``__init__.py``
    of each package on the way (their import closure, :func:`import_closure`, read
    from the source with :mod:`ast`). An edit to a module that the chapter does not
    import, another chapter's included, leaves the fingerprint unchanged. With
    ``chapter=None``: the whole package. By default (the key of :func:`fmlab.cached`)
    the modules that only judge, draw or load results are left out, and so is what
    only they import: ``claims.py``, ``viz.py``, ``stored.py`` and the chapters'
    ``chN_figures.py``. With ``outputs=True`` (the key of a chapter page's executed
    outputs) they count too, the chapter's ``chN_figures.py`` and its imports
    included. ``root`` is the package's directory (default: this fmlab). The bytes of
    each file are hashed with its path, so a comment edit changes the fingerprint too
    (a safe, simple rule).
    """
    root = (_PACKAGE_ROOT if root is None else Path(root)).resolve()
    if chapter is not None and (
        not isinstance(chapter, str) or not re.fullmatch(r"ch\d+", chapter)
    ):
        raise ValueError(f"chapter must look like 'ch4' or be None, got {chapter!r}")
    skip = None if outputs else _presentation
    if chapter is None:
        paths = [
            p for p in root.rglob("*.py") if skip is None or not skip(_rel(p, root))
        ]
    else:
        own = sorted((root / "chapters").glob(f"{chapter}_*.py"))
        if not own:
            raise ValueError(
                f"chapter {chapter!r} has no module {root / 'chapters'}/{chapter}_*.py"
            )
        paths = import_closure(own, root, skip=skip)
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(_rel(path, root).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]
