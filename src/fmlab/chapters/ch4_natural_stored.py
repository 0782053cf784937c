"""Page 04b's pretrainings, stored (Chapter 4).

Page 04b (``notebooks/04b-natural-tasks-and-lora.ipynb``) pretrains the model of the
experiments (:func:`~.ch4_kernel_view.setting`: seed 0, width 32, 2000 steps) and,
for the cheap test of naturalness (:func:`~.ch4_kernel_view.width_test`), three seeds
at width 16 (3000 steps) and at width 32: about 15,000 pretraining steps, nearly all of
the page's time and more than its budget. ``scripts/ch4_natural.py`` runs them once,
exactly as the page would at seed offset 0, into ``results/ch4_natural.json``: the
output of :func:`~.ch4_kernel_behaviour.output_derivative_by_width` for the page's
widths and seeds, and the weights and training losses of the model of the experiments
(:func:`~.ch4_world.pretrain_masked_lm`), with the fingerprint of the code that
computes them (:mod:`fmlab.stored`).

:func:`stored_pretraining` and :func:`stored_width_test` are the switch: at seed offset
0, a call whose arguments are exactly the stored ones (as data) is read from the file;
at any other seed offset or configuration the page trains as before (and caches). A
stored file whose code has changed raises :class:`fmlab.stored.StaleResults`, naming
the script. The file also keeps a slice (:data:`NATURAL_SLICE`: the width test at
widths 8 and 16, three seeds, 30 and 20 steps), which the tests rerun under another
rounding path.

Used in Chapter 4: ``notebooks/04b-natural-tasks-and-lora.ipynb`` (and page 04 reads
the same model of the experiments through :func:`~.ch4_kernel_view.setting`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import tempfile
from pathlib import Path

from .. import stored
from ..repro import seed_offset
from .ch4_kernel_behaviour import output_derivative_by_width
from .ch4_kernel_view import ChapterConfig
from .ch4_world import MLMPretrainConfig, _model_config, pretrain_masked_lm

__all__ = [
    "NATURAL_RESULTS",
    "NATURAL_SCRIPT",
    "NATURAL_SLICE",
    "natural_results",
    "natural_run",
    "natural_slice",
    "natural_slice_config",
    "natural_sources",
    "stored_pretraining",
    "stored_width_test",
    "width_arguments",
]

NATURAL_RESULTS = Path(__file__).parent / "results" / "ch4_natural.json"
NATURAL_SCRIPT = "scripts/ch4_natural.py"

#: The slice the tests rerun (another rounding path than the record's): the width test
#: of :func:`natural_run` with widths 8 and 16 (30 and 20 steps), pretraining batches of
#: 16, a test set of 60; about 2 s of one core.
NATURAL_SLICE = dict(
    d_model=16, pretrain_steps=20, narrow=8, narrow_steps=30, n_test=60, batch_size=16
)


@contextlib.contextmanager
def _fresh_offset_zero():
    """Run the block at seed offset 0 with an empty model cache (nothing is read from
    an earlier run, so the block computes everything), then restore both."""
    before = {
        n: os.environ.pop(n, None) for n in ("FMLAB_SEED_OFFSET", "FMLAB_CACHE_DIR")
    }
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FMLAB_CACHE_DIR"] = tmp
        try:
            yield
        finally:
            for name, value in before.items():
                os.environ.pop(name, None)
                if value is not None:
                    os.environ[name] = value


def _json(value):
    """A config (a dataclass, or a dict of them and tuples) as plain JSON data."""
    return json.loads(json.dumps(value, default=dataclasses.asdict))


def width_arguments(
    base: MLMPretrainConfig,
    widths: tuple[int, ...],
    seeds: tuple[int, ...],
    steps: tuple[int, ...],
    n_test: int,
) -> dict:
    """The arguments of :func:`~.ch4_kernel_behaviour.output_derivative_by_width` as
    JSON data (the key of the stored width test)."""
    return _json(
        dict(base=base, widths=widths, seeds=seeds, steps=steps, n_test=n_test)
    )


def _width_call(config: ChapterConfig, batch_size: int | None = None) -> dict:
    """The width test of ``config`` as :func:`~.ch4_kernel_view.width_test` calls it
    (pretraining batches of ``batch_size``, by default the page's)."""
    base = config.pretrain
    if batch_size is not None:
        base = dataclasses.replace(base, batch_size=batch_size)
    return dict(
        base=base,
        widths=config.widths,
        seeds=config.pretrain_seeds,
        steps=(config.narrow_steps, config.pretrain_steps),
        n_test=config.n_test,
    )


def _encode_width(out: dict) -> dict:
    """``{("chi", w): [...], ("accuracy", w): [...]}`` as ``{"chi": {"w": [...]}}``."""
    enc: dict = {}
    for (name, width), values in out.items():
        enc.setdefault(name, {})[str(width)] = [float(v) for v in values]
    return enc


def _decode_width(enc: dict) -> dict:
    return {
        (name, int(w)): list(values)
        for name, by_width in enc.items()
        for w, values in by_width.items()
    }


def natural_run(config: ChapterConfig) -> dict:
    """Compute the page's pretrainings for ``config`` afresh (seed offset 0, an empty
    model cache, one thread), as plain data for JSON: ``"width_test"`` (its
    ``"arguments"``, :func:`width_arguments`, and its ``"result"``) and
    ``"pretraining"`` (the model of the experiments: its ``"config"``, its
    ``"state_dict"`` and training ``"losses"``, :func:`fmlab.stored.encode_tensors`)."""
    if not isinstance(config, ChapterConfig):
        raise TypeError(f"config must be a ChapterConfig, got {type(config).__name__}")
    call = _width_call(config)
    with _fresh_offset_zero():
        width = output_derivative_by_width(**call)
        mlm, losses = pretrain_masked_lm(config.pretrain)  # trained above: the cache
    return {
        "width_test": {
            "arguments": width_arguments(**call),
            "result": _encode_width(width),
        },
        "pretraining": {
            "config": _json(config.pretrain),
            "state_dict": stored.encode_tensors(mlm.state_dict()),
            "losses": stored.encode_tensors(losses),
        },
    }


def natural_slice_config() -> dict:
    """The slice's full configuration, as the results file records it: the fields of
    a :class:`~.ch4_kernel_view.ChapterConfig` and ``batch_size``."""
    chapter = {k: v for k, v in NATURAL_SLICE.items() if k != "batch_size"}
    return _json(
        {
            **dataclasses.asdict(ChapterConfig(**chapter)),
            "batch_size": NATURAL_SLICE["batch_size"],
        }
    )


def natural_slice(record: dict | None = None) -> dict:
    """Run the slice (the config ``record``, by default :func:`natural_slice_config`)
    afresh, never from the model cache: the mean :math:`\\lvert\\chi\\rvert` of each
    seed's model at each width (``"chi_<width>"``), which
    :func:`fmlab.stored.compare_runs` compares (the zero-shot accuracies of models so
    briefly pretrained are mostly one half, without spread to compare by)."""
    record = natural_slice_config() if record is None else record
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
    batch_size = values.pop("batch_size")
    config = ChapterConfig(**values)
    with _fresh_offset_zero():
        out = output_derivative_by_width(**_width_call(config, batch_size))
    return {f"chi_{w}": out[("chi", w)] for w in config.widths}


def natural_sources() -> list:
    """The package code that computes the stored results, for their fingerprint
    (:mod:`fmlab.stored`); the script's settings are in the file as its config."""
    from ..data import sentiment_language
    from ..models import transformer
    from ..repro import _splitmix64, effective_seed, make_generator, seed_everything
    from . import ch4_world

    return [
        natural_run,
        natural_slice,
        natural_slice_config,
        width_arguments,
        _width_call,
        _encode_width,
        _fresh_offset_zero,
        _json,
        output_derivative_by_width,
        ch4_world,
        sentiment_language,
        transformer,
        seed_everything,
        make_generator,
        effective_seed,
        _splitmix64,  # effective_seed's mixer
    ]


def natural_results(path: Path | str | None = None) -> dict:
    """The stored results (``{"meta", "width_test", "pretraining", "stored"}``, as
    written). Raises :class:`FileNotFoundError` when the file is absent and
    :class:`fmlab.stored.StaleResults`, naming the script, when the code that computes
    them has changed since."""
    path = Path(NATURAL_RESULTS if path is None else path)
    if not path.exists():
        raise FileNotFoundError(f"no stored results at {path}; run {NATURAL_SCRIPT}")
    return stored.load_cached(path, script=NATURAL_SCRIPT, sources=natural_sources())


@functools.lru_cache(maxsize=4)
def _stored_keys(path: str, mtime_ns: int) -> tuple[dict, dict]:
    data = stored.read(path)
    return data["width_test"]["arguments"], data["pretraining"]["config"]


def _record(data: dict) -> dict:
    """The file's ``"stored"`` record, with the run's ``"wall_seconds"``."""
    return {**data["stored"], "wall_seconds": data["meta"]["wall_seconds"]}


def stored_width_test(
    base: MLMPretrainConfig,
    widths: tuple[int, ...],
    seeds: tuple[int, ...],
    steps: tuple[int, ...],
    n_test: int,
    *,
    path=None,
) -> dict | None:
    """The stored output of :func:`~.ch4_kernel_behaviour.output_derivative_by_width`
    for these arguments, with its ``"stored"`` record (and the run's
    ``"wall_seconds"``) added, when the seed offset is 0 and the arguments are exactly
    the stored ones; else None (the width test is to be computed). Raises
    :class:`fmlab.stored.StaleResults` when they are stored but the code that computes
    them has changed since."""
    path = Path(NATURAL_RESULTS if path is None else path)
    if seed_offset() != 0 or not path.exists():
        return None
    want = width_arguments(base, widths, seeds, steps, n_test)
    if want != _stored_keys(str(path), path.stat().st_mtime_ns)[0]:
        return None
    data = natural_results(path)
    return {
        **_decode_width(data["width_test"]["result"]),
        "stored": _record(data),
    }


def stored_pretraining(config: MLMPretrainConfig, *, path=None):
    """The stored ``(model, losses)`` of :func:`~.ch4_world.pretrain_masked_lm` for
    ``config`` (the model in eval mode), when the seed offset is 0 and ``config`` is
    exactly the stored one; else None (the model is to be trained). Raises
    :class:`fmlab.stored.StaleResults` when it is stored but the code that trains it
    has changed since."""
    from ..data.sentiment_language import SentimentLanguage
    from ..models.transformer import TinyTransformer

    path = Path(NATURAL_RESULTS if path is None else path)
    if seed_offset() != 0 or not path.exists():
        return None
    if _json(config) != _stored_keys(str(path), path.stat().st_mtime_ns)[1]:
        return None
    run = natural_results(path)["pretraining"]
    lang = SentimentLanguage(config.language)
    model = TinyTransformer(_model_config(lang, config), seed=config.seed)
    model.load_state_dict(stored.decode_tensors(run["state_dict"]))
    model.eval()
    return model, stored.decode_tensors(run["losses"])
