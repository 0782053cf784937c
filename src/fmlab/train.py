"""One training loop, a learning-rate schedule, a progress bar, and an on-disk cache of
trained models.

The cache is keyed by a hash of the config (:func:`fmlab.repro.config_hash`), the seed
offset and the code that computes the entry (:func:`fmlab.repro.code_fingerprint`),
lives in
``$FMLAB_CACHE_DIR`` (default: ``.fmlab_cache/`` at the root of the checkout, ignored by
git), is read with ``torch.load(weights_only=True)`` and written atomically (a temporary
file renamed into place), so an interrupted run never leaves a corrupt entry. A clean
build with an empty cache trains everything from scratch and gives the same numbers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import nn

from ._validate import check_choice, check_float, check_int
from .repro import code_fingerprint, config_hash, seed_offset

__all__ = [
    "progress",
    "train",
    "train_scheduled",
    "lr_factor",
    "LR_SHAPES",
    "TrainResult",
    "cache_dir",
    "cached",
    "fresh_model_cache",
]


def _progress_enabled() -> bool:
    flag = os.environ.get("FMLAB_PROGRESS")
    if flag is not None:
        return flag.strip().lower() not in ("0", "false", "no", "off", "")
    if "ipykernel" in sys.modules:  # a live notebook: show a widget bar
        return True
    return sys.stderr.isatty()


def progress(
    iterable: Iterable, *, total: int | None = None, desc: str = ""
) -> Iterable:
    """Wrap ``iterable`` in a tqdm bar when a person is watching.

    Bars show in a terminal and in a live Jupyter kernel; the book build and the tests
    set ``FMLAB_PROGRESS=0`` so that no bar is stored in a rendered page.
    """
    if not _progress_enabled():
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, leave=False)


@dataclass
class TrainResult:
    """What :func:`train` returns: the loss at every step and the saved checkpoints."""

    losses: torch.Tensor
    checkpoints: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)


def train(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, object], torch.Tensor],
    sample_batch: Callable[[int], object],
    *,
    steps: int,
    lr: float,
    optimizer: str = "adam",
    weight_decay: float = 0.0,
    checkpoints: Iterable[int] = (),
    desc: str = "training",
) -> TrainResult:
    """Minimise ``loss_fn(model, sample_batch(step))`` for ``steps`` optimiser steps.

    Parameters
    ----------
    model : nn.Module
        Trained in place.
    loss_fn : callable
        ``loss_fn(model, batch)`` returns a scalar tensor.
    sample_batch : callable
        ``sample_batch(step)`` returns the batch for that step (its randomness should
        come from a seeded generator, so runs are reproducible).
    steps : int
        Number of optimiser steps, at least 1.
    lr : float
        Learning rate, > 0.
    optimizer : {"adam", "adamw", "sgd"}
    weight_decay : float
        >= 0; decoupled for AdamW, an L2 term for the others.
    checkpoints : iterable of int
        Steps (0 = before any update, ``steps`` = the end) at which a copy of the
        state dict is kept.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable")
    if not callable(sample_batch):
        raise TypeError("sample_batch must be callable")
    steps = check_int("steps", steps, minimum=1)
    lr = check_float("lr", lr, minimum=0.0, strict_min=True)
    weight_decay = check_float("weight_decay", weight_decay, minimum=0.0)
    check_choice("optimizer", optimizer, ("adam", "adamw", "sgd"))
    keep = sorted(
        {check_int("checkpoints", c, minimum=0, maximum=steps) for c in checkpoints}
    )
    opt_cls = {
        "adam": torch.optim.Adam,
        "adamw": torch.optim.AdamW,
        "sgd": torch.optim.SGD,
    }[optimizer]
    opt = opt_cls(model.parameters(), lr=lr, weight_decay=weight_decay)

    def snapshot():
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    saved: dict[int, dict[str, torch.Tensor]] = {}
    if 0 in keep:
        saved[0] = snapshot()
    losses = torch.empty(steps)
    model.train()
    for step in progress(range(steps), total=steps, desc=desc):
        loss = loss_fn(model, sample_batch(step))
        if loss.ndim != 0:
            raise ValueError(
                f"loss_fn must return a scalar, got shape {tuple(loss.shape)}"
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses[step] = loss.detach()
        if step + 1 in keep:
            saved[step + 1] = snapshot()
    model.eval()
    return TrainResult(losses=losses, checkpoints=saved)


def train_scheduled(
    model: nn.Module,
    step_loss: Callable[[int], torch.Tensor],
    *,
    steps: int,
    lr: float,
    optimizer: str,
    lr_factor: Callable[[int], float],
    every: int = 0,
    callback: Callable[[int], None] | None = None,
    desc: str = "training",
) -> None:
    """Minimise ``step_loss(step)`` in place, with the learning rate
    ``lr * lr_factor(step)`` (Chapter 5's two training loops).

    ``step_loss(step)`` draws its own batch and returns a scalar; ``optimizer`` is
    ``"adam"`` or ``"sgd"``; ``callback(step)`` runs after every ``every`` steps
    (``step`` counts the updates made so far). Unlike :func:`train` it keeps no loss
    history and no checkpoints: the callers evaluate what they need in the callback.
    """
    steps = check_int("steps", steps, minimum=0)
    lr = check_float("lr", lr, minimum=0.0, strict_min=True)
    check_choice("optimizer", optimizer, ("adam", "sgd"))
    opt = (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)(
        model.parameters(), lr=lr
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    for s in progress(range(steps), total=steps, desc=desc):
        loss = step_loss(s)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if every and callback is not None and (s + 1) % every == 0:
            callback(s + 1)


#: The shapes of :func:`lr_factor`.
LR_SHAPES = ("cosine", "constant", "warmup-then-cosine", "linear")


def lr_factor(
    step: int,
    *,
    steps: int,
    warmup: int = 0,
    shape: str = "cosine",
    floor: float = 0.0,
    decay_start: int | None = None,
) -> float:
    r"""The learning-rate multiplier after ``step`` updates of a run of ``steps``
    (``0 <= step <= steps``; :class:`torch.optim.lr_scheduler.LambdaLR` asks for
    ``step = 0`` before the first update and ``step = steps`` after the last).

    With the warm-up ramp :math:`r(s) = \min(1, (s+1)/w)` over ``warmup`` :math:`= w`
    steps (:math:`r = 1` when :math:`w = 0`), :math:`S` = ``steps`` and :math:`f` =
    ``floor``:

    * ``"cosine"``: :math:`r(s)\,\big(f + (1-f)\,\tfrac12(1 + \cos(\pi s/S))\big)`,
      the ramp times one half-period of a cosine over the whole run, from 1 at step 0
      down to :math:`f` at step :math:`S`, after the last update (Chapter 5's
      pretraining: :func:`fmlab.chapters.ch5_implicit_bias.train_phase` and
      :func:`fmlab.chapters.ch5_sgd_noise.train_bert`, with :math:`f = 0`);
    * ``"constant"``: :math:`r(s)` (Chapter 5's continued SGD);
    * ``"warmup-then-cosine"``: :math:`r(s)` while :math:`s < w`, then
      :math:`f + (1-f)\,\tfrac12(1 + \cos(\pi t))` with :math:`t = \min(1, (s -
      w)/(S - 1 - w))`, a cosine from 1 at the end of the warm-up down to :math:`f` at
      the last update, :math:`s = S - 1` (Chapter 6's pretraining, :math:`f = 0.1`);
    * ``"linear"``: :math:`r(s)` while :math:`s < s_0` (``decay_start``, by default
      :math:`w`; at least :math:`w`), then :math:`(S - s)/(S - s_0)`, a straight line
      down to 0 at step :math:`S` (Chapter 5's "constant-then-decay", :math:`w = 0`;
      Chapter 6's linear schedule, :math:`s_0 = w`).

    Every denominator is at least 1, so a run too short for its warm-up or decay still
    has a finite schedule. ``floor`` (in [0, 1]) belongs to the cosine shapes and
    ``decay_start`` to ``"linear"``; giving either to another shape raises. Each shape
    keeps the floating-point operations, in their order, of the chapter code it
    replaced (the cosine's angle is :math:`(\pi s)/S` in one and :math:`\pi\,t` in
    the other), so every schedule is the same to the last bit.
    """
    steps = check_int("steps", steps, minimum=0)
    step = check_int("step", step, minimum=0, maximum=steps)
    warmup = check_int("warmup", warmup, minimum=0)
    check_choice("shape", shape, LR_SHAPES)
    floor = check_float("floor", floor, minimum=0.0, maximum=1.0)
    if floor and shape not in ("cosine", "warmup-then-cosine"):
        raise ValueError(f"floor applies to the cosine shapes only, not {shape!r}")
    if decay_start is not None and shape != "linear":
        raise ValueError(f"decay_start applies to the linear shape only, not {shape!r}")
    ramp = min(1.0, (step + 1) / warmup) if warmup else 1.0
    if shape == "constant":
        return ramp
    if shape == "cosine":
        cosine = 0.5 * (1.0 + math.cos(math.pi * step / max(1, steps)))
        return ramp * (floor + (1.0 - floor) * cosine)
    if shape == "linear":
        if decay_start is None:
            start = check_int("warmup", warmup, maximum=steps)
        else:
            start = check_int("decay_start", decay_start, minimum=warmup, maximum=steps)
        if step < start:
            return ramp
        return max(0.0, (steps - step) / max(1, steps - start))
    check_int("warmup", warmup, maximum=steps)
    if step < warmup:
        return ramp
    t = min(1.0, (step - warmup) / max(1, steps - 1 - warmup))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * t))


def cache_dir() -> Path:
    """The model cache: ``$FMLAB_CACHE_DIR``, or ``.fmlab_cache`` in the checkout."""
    env = os.environ.get("FMLAB_CACHE_DIR")
    if env:
        path = Path(env).expanduser()
    else:
        root = Path(__file__).resolve().parents[2]
        if (
            root / "pyproject.toml"
        ).exists():  # an editable install inside the checkout
            path = root / ".fmlab_cache"
        else:
            path = Path.home() / ".cache" / "fmlab"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def fresh_model_cache(*, seed_offset_zero: bool = True):
    """Run the block with an empty model cache of its own (``$FMLAB_CACHE_DIR`` set to
    a temporary directory, removed afterwards), so that nothing is read from an
    earlier run's entries and nothing the block computes is left in the cache outside
    it; and, with ``seed_offset_zero`` (the default), at seed offset 0 (the published
    book's seeds: ``$FMLAB_SEED_OFFSET`` unset). Afterwards, also when the block
    raises, both variables are as they were before (unset if they were unset)."""
    names = ["FMLAB_CACHE_DIR"] + (["FMLAB_SEED_OFFSET"] if seed_offset_zero else [])
    before = {name: os.environ.get(name) for name in names}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if seed_offset_zero:
                os.environ.pop("FMLAB_SEED_OFFSET", None)
            os.environ["FMLAB_CACHE_DIR"] = tmp
            yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _chapter_of(build: Callable) -> str | None:
    """``"ch4"`` when ``build`` was defined in ``fmlab.chapters.ch4_*``, else None."""
    module = getattr(build, "__module__", None) or ""
    parts = module.split(".")
    if len(parts) == 3 and parts[:2] == ["fmlab", "chapters"]:
        return parts[2].split("_", 1)[0]
    return None


_DATACLASS_TAG = "__dataclass__"


def _encode(value):
    """Dataclass instances become tagged dicts (``torch.load(weights_only=True)`` reads
    only plain containers, tensors and numbers)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        fields = {
            f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(cls)
        }
        return {_DATACLASS_TAG: f"{cls.__module__}:{cls.__qualname__}", **fields}
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out = [_encode(v) for v in value]
        return out if isinstance(value, list) else tuple(out)
    return value


def _decode(value):
    if isinstance(value, dict):
        if _DATACLASS_TAG in value:
            module, qualname = value[_DATACLASS_TAG].split(":")
            cls = importlib.import_module(module)
            for part in qualname.split("."):
                cls = getattr(cls, part)
            fields = {k: _decode(v) for k, v in value.items() if k != _DATACLASS_TAG}
            return cls(**fields)
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_decode(v) for v in value)
    return value


def cached(config, build: Callable[[], object], *, name: str):
    """Return ``build()``, computed once per config and code and kept on disk.

    Parameters
    ----------
    config
        A frozen dataclass (or dict) that fully determines what ``build`` returns.
    build : callable
        Computes the entry: a result dataclass or a dict of tensors, numbers, strings
        and nested lists, tuples, dicts and dataclasses of them.
    name : str
        A readable prefix for the file name, e.g. the chapter's model name.

    The key hashes ``config``, the seed offset (:func:`fmlab.repro.seed_offset`), so
    that runs at different offsets never share an entry, and the code that computes
    the entry (:func:`fmlab.repro.code_fingerprint`: the modules of the chapter that
    defines ``build`` and every fmlab module that they import, directly or through
    others, leaving out the modules that only judge, draw or load results, i.e.
    ``claims.py``, ``viz.py``, ``stored.py`` and the chapters' ``chN_figures.py``; the
    whole package, less those, when ``build`` is defined elsewhere). Editing the
    library therefore never serves a stale entry, editing a module that the chapter
    does not import keeps its entries, and no cache name needs a hand-written version.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be an identifier-like string, got {name!r}")
    if not callable(build):
        raise TypeError("build must be callable")
    key = config_hash(
        {
            "config": config,
            "seed_offset": seed_offset(),
            "code": code_fingerprint(_chapter_of(build)),
        }
    )
    path = cache_dir() / f"{name}-{key}.pt"
    if path.exists():
        try:
            value = _decode(torch.load(path, weights_only=True))
        except Exception:  # unreadable entry (e.g. written by another torch): rebuild
            path.unlink(missing_ok=True)
        else:
            _log_cache("loaded", name)
            return value
    value = build()
    if not isinstance(value, dict) and not (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    ):
        raise TypeError(
            f"build must return a dict or a dataclass, got {type(value).__name__}"
        )
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(_encode(value), fh)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _log_cache("computed", name)
    return value


def _log_cache(what: str, name: str) -> None:
    """Append ``"<what> <name>"`` to the file named by ``FMLAB_CACHE_LOG``, if set: the
    book's executor reads it to tell a page's first run (something computed) from a run
    that found everything in the cache."""
    log = os.environ.get("FMLAB_CACHE_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(f"{what} {name}\n")
