"""Page 04's costliest runs, stored (Chapter 4).

Page 04 (``notebooks/04-kernel-view.ipynb``) runs its few-shot experiment at k = 4, 16
and 64 (:func:`fmlab.chapters.ch4_fewshot.few_shot_runs`). The k = 16 runs (20 draws,
each with the wide search of SGD-FT in both settings, Adam, LoRA and a batch-1 SignGD
run beside their kernels) take about two thirds of the page's time, more than its
budget leaves. ``scripts/ch4_fewshot.py`` computes them once, exactly as the page
would at seed offset 0 (:data:`FEWSHOT_PRETRAIN` and :data:`FEWSHOT_EXPERIMENT`, the
page's own configs), into ``results/ch4_fewshot.json``: the entry that
:func:`~fmlab.chapters.ch4_fewshot.run_kernel_experiment` would otherwise compute and
cache, with the fingerprint of the code that computes it (:mod:`fmlab.stored`).

:func:`stored_entry` is the switch: at seed offset 0, a run whose pretraining and
experiment configs are exactly the stored ones is read from the file; at any other
seed offset or config it is computed as before (and cached). A stored file whose code
has changed raises :class:`fmlab.stored.StaleResults`, naming the script. The file
also keeps a slice (:data:`FEWSHOT_SLICE`: a short pretraining at width 16 and three
draws of 4 examples per class through every method of the k = 16 runs), which the
tests rerun under another rounding path.

Used in Chapter 4: ``notebooks/04-kernel-view.ipynb``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from .. import stored
from ..data.sentiment_language import SentimentLanguageConfig
from ..repro import seed_offset
from .ch4_fewshot import KernelExperimentConfig, lazy_grid, wide_grid
from .ch4_world import MLMPretrainConfig

__all__ = [
    "FEWSHOT_EXPERIMENT",
    "FEWSHOT_PRETRAIN",
    "FEWSHOT_RESULTS",
    "FEWSHOT_SCRIPT",
    "FEWSHOT_SLICE",
    "fewshot_results",
    "fewshot_job_check",
    "fewshot_run",
    "fewshot_slice",
    "fewshot_sources",
    "stored_entry",
]

FEWSHOT_RESULTS = Path(__file__).parent / "results" / "ch4_fewshot.json"
FEWSHOT_SCRIPT = "scripts/ch4_fewshot.py"

#: Page 04's pretraining (``ChapterConfig().pretrain``: seed 0, width 32, 2000 steps,
#: pretraining text 80% positive).
FEWSHOT_PRETRAIN = MLMPretrainConfig(
    language=SentimentLanguageConfig(prior_positive=0.8), d_model=32, steps=2000
)
#: Page 04's k = 16 runs: 20 draws, the lazy grid of 30 steps widened by the wide
#: search, each run beside its own analogs, a batch-1 SignGD run.
FEWSHOT_EXPERIMENT = KernelExperimentConfig(
    shots=(16,),
    seeds=tuple(range(20)),
    n_test=1000,
    adam_lrs=(5e-5, 1e-4, 2e-4),
    analog_lr_scale=1.0,
    **{**lazy_grid(30), **wide_grid(30)},
    signgd_batch1_scale=0.2,
)

#: The slice the tests rerun (another rounding path than the record's): a width-16
#: pretraining of 20 steps, three draws of 2 examples per class through every method of
#: the page's k = 16 runs (5 steps), the wide search at one scale read at 5 and 10
#: steps.
FEWSHOT_SLICE = dict(
    pretrain_width=16,
    pretrain_steps=20,
    shots=(2,),
    seeds=(0, 1, 2),
    n_test=40,
    steps=5,
    sgd_lr_scales=(0.5, 1.0, 2.0),
    kernel_regs=(0.2, 1 / 240),
    wide_scales=(4.0,),
    wide_checkpoints=(5, 10),
    signgd_batch1_passes=1,
)


@contextlib.contextmanager
def _fresh_offset_zero():
    """Run the block at seed offset 0 with an empty model cache (nothing is read from
    an earlier run), then restore both."""
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


def _jsonable(value):
    """The entry of :func:`~.ch4_fewshot._experiment_entry` as JSON data: its example
    tensors encoded exactly (:func:`fmlab.stored.encode_tensors`)."""
    return {
        **{k: v for k, v in value.items() if k != "example"},
        "example": {s: stored.encode_tensors(t) for s, t in value["example"].items()},
    }


def fewshot_run(
    pretrain: MLMPretrainConfig = FEWSHOT_PRETRAIN,
    config: KernelExperimentConfig = FEWSHOT_EXPERIMENT,
) -> dict:
    """The entry of :func:`~fmlab.chapters.ch4_fewshot.run_kernel_experiment` for
    ``pretrain`` and ``config``, computed afresh at seed offset 0 (its pretraining too),
    as JSON data."""
    from .ch4_fewshot import _experiment_entry

    with _fresh_offset_zero():
        return _jsonable(_experiment_entry(pretrain, config))


def fewshot_job_check(path: Path | str | None = None, seeds=(0, 1)) -> dict:
    """A script's ``--restamp`` check: rerun draws ``seeds`` of the stored run at
    ``path`` (its pretraining afresh, then those draws through every method: for the
    page's run about two minutes on one core) with today's code, and compare every
    per-draw number of the entry (accuracies, chosen hyperparameters, kernel
    behaviour, by learning rate) with the record (:func:`fmlab.stored.compare_runs`);
    the example outputs of the first draw, and any measure undefined (nan) in a
    draw, must be the same bit for bit. Reads the file without checking its
    fingerprint."""
    data = stored.read(FEWSHOT_RESULTS if path is None else path)
    (run,) = data["runs"]
    stored_seeds = run["experiment"]["seeds"]
    if len(seeds) < 2 or any(s not in stored_seeds for s in seeds):
        raise ValueError(f"seeds must be two or more of {stored_seeds}, got {seeds}")
    pretrain = MLMPretrainConfig(
        **{
            **run["pretrain"],
            "language": SentimentLanguageConfig(**run["pretrain"]["language"]),
        }
    )
    values = {
        k: tuple(v) if isinstance(v, list) else v for k, v in run["experiment"].items()
    }
    experiment = KernelExperimentConfig(**{**values, "seeds": tuple(seeds)})
    again = {**_as_data(experiment), "seeds": stored_seeds}
    if _as_data(pretrain) != run["pretrain"] or again != run["experiment"]:
        raise ValueError("the stored configs do not read back as they were written")
    now = fewshot_run(pretrain, experiment)
    rows = [stored_seeds.index(s) for s in seeds]

    def flat(entry, pick):
        out = {}
        for part in ("accuracy", "chosen"):
            out |= {f"{part}|{k}": pick(v) for k, v in entry[part].items()}
        for part in ("dynamics", "by_lr"):
            for key, d in entry[part].items():
                out |= {f"{part}|{key}|{m}": pick(v) for m, v in d.items()}
        return out

    old = flat(run["entry"], lambda v: [v[i] for i in rows])
    new = flat(now, list)
    # a measure undefined in a run (e.g. the gain recovered of a run that gained
    # nothing: nan) must come out the same, nan where nan; the rest by the rule
    undefined = [
        k for k in old if not (np.isfinite(old[k]).all() and np.isfinite(new[k]).all())
    ]
    same = set(old) == set(new) and all(
        np.array_equal(old[k], new[k], equal_nan=True) for k in undefined
    )
    res = stored.compare_runs(
        {k: v for k, v in old.items() if k not in undefined},
        {k: v for k, v in new.items() if k not in undefined},
    )
    first = seeds[0] == stored_seeds[0]  # the example is the first draw's
    same = same and (not first or now["example"] == run["entry"]["example"])
    res["ok"] = bool(res["ok"] and same)
    res["bitwise"] = bool(res["bitwise"] and same)
    return res


def _slice_configs(record: dict | None):
    """The pretraining and experiment of the slice ``record`` (flat, as
    :data:`FEWSHOT_SLICE` or :func:`fewshot_slice_config`), over the page's configs."""
    record = dict(FEWSHOT_SLICE if record is None else record)
    pretrain = dataclasses.replace(
        FEWSHOT_PRETRAIN,
        d_model=record.pop("pretrain_width"),
        steps=record.pop("pretrain_steps"),
    )
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
    return pretrain, dataclasses.replace(FEWSHOT_EXPERIMENT, **values)


def fewshot_slice(record: dict | None = None) -> dict:
    """Run the slice (``record``, by default :data:`FEWSHOT_SLICE`) afresh: per draw,
    the test accuracies (%) of the methods that the page's keys read at k = 16 and the
    kernel change of the validated SGD-FT runs (continuous, so that another rounding
    path shows in its last digits): the quantities :func:`fmlab.stored.compare_runs`
    compares (replicates first)."""
    entry = fewshot_run(*_slice_configs(record))
    k = entry["accuracy"]
    shots = max(int(key.rsplit("|", 1)[1]) for key in k)
    names = (
        ("prompt", "zero-shot"),
        ("prompt", "SGD-FT"),
        ("prompt", "K-SGD"),
        ("prompt", "Adam-FT"),
        ("prompt", "K-A-SignGD"),
        ("prompt", "K-SGD, same steps"),
        ("prompt", "SignGD-FT, batch 1"),
        ("prompt", "K-A-SignGD, same steps"),
        ("standard", "SGD-FT, wide grid"),
        ("standard", "K-SGD"),
    )
    out = {f"{s}|{m}": [100 * a for a in k[f"{s}|{m}|{shots}"]] for s, m in names}
    for s in ("prompt", "standard"):
        out[f"{s}|kernel_change"] = entry["dynamics"][f"{s}|SGD|{shots}"][
            "kernel_change"
        ]
    return out


def fewshot_slice_config() -> dict:
    """The slice's full configuration, as the results file records it (flat: the
    experiment's fields and the pretraining's width and steps)."""
    pretrain, config = _slice_configs(None)
    return json.loads(
        json.dumps(
            {
                **dataclasses.asdict(config),
                "pretrain_width": pretrain.d_model,
                "pretrain_steps": pretrain.steps,
            }
        )
    )


def fewshot_sources() -> list:
    """The package code that computes the stored runs, for their fingerprint
    (:mod:`fmlab.stored`); the script's settings are in the file as its config."""
    from ..adapt import lora
    from ..data import sentiment_language
    from ..models import transformer
    from ..repro import _splitmix64, effective_seed, make_generator, seed_everything
    from ..theory import kernels
    from . import ch4_fewshot, ch4_kernel_behaviour, ch4_world

    return [
        fewshot_run,
        fewshot_slice,
        _fresh_offset_zero,
        _jsonable,
        _slice_configs,
        ch4_world,
        ch4_fewshot,
        ch4_kernel_behaviour,
        kernels,
        lora,
        transformer,
        sentiment_language,
        make_generator,
        effective_seed,
        _splitmix64,  # effective_seed's mixer
        seed_everything,
    ]


def fewshot_results(path: Path | str | None = None) -> dict | None:
    """The stored runs (``{"runs": [{"pretrain", "experiment", "entry"}], "meta",
    "stored"}``, as written), or None when the file is absent. Raises
    :class:`fmlab.stored.StaleResults`, naming the script, when the code that computes
    them has changed since."""
    path = Path(FEWSHOT_RESULTS if path is None else path)
    if not path.exists():
        return None
    return stored.load_cached(path, script=FEWSHOT_SCRIPT, sources=fewshot_sources())


def _as_data(config) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(config)))


def stored_entry(
    pretrain: MLMPretrainConfig, config: KernelExperimentConfig, path=None
) -> dict | None:
    """The stored entry of ``pretrain`` and ``config`` (as the model cache keeps it,
    its example tensors decoded) when the seed offset is 0 and both configs are
    exactly those of a stored run; else None (the runs are to be computed)."""
    path = Path(FEWSHOT_RESULTS if path is None else path)
    if seed_offset() != 0 or not path.exists():
        return None
    want = {"pretrain": _as_data(pretrain), "experiment": _as_data(config)}
    configs = stored.read(path)["stored"]["config"]["runs"]
    if want not in configs:
        return None
    # a copy: the file's dict is cached, and the caller may keep what it is given
    entry = copy.deepcopy(fewshot_results(path)["runs"][configs.index(want)]["entry"])
    return {
        **entry,
        "example": {s: stored.decode_tensors(t) for s, t in entry["example"].items()},
    }
