"""Chapter 4, the second world: a pretraining in which ``[CLS]`` has a job.

In the chapter's world ``[CLS]`` is never a target in pretraining (as RoBERTa's ``<s>``
is not), and standard fine-tuning from a fresh head stays close to its eNTK. Here
pretraining also trains ``[CLS]`` on a sentence-level task (as BERT's ``[CLS]`` learns
next-sentence prediction): a logistic head on :math:`h_{[CLS]}` predicts whether the
sentence has more than :math:`(U_{min}+U_{max})/2` units, with weight :math:`w` beside
the masked-LM loss (:class:`~.ch4_world.MLMPretrainConfig`, ``cls_task``), and the head
is then dropped. Standard fine-tuning must move the body to make :math:`h_{[CLS]}` carry
the sentiment instead; the prompt reads the ``[MASK]`` position and need not.

Per pretraining, :func:`second_world_pretraining` runs ``runs`` draws of ``k`` examples
per class (:func:`~.ch4_fewshot.run_kernel_experiment`, SGD-FT and the eNTK in both
settings, each chosen on the run's validation data over the wide search) and returns,
per run, the contrast (FT − eNTK) without the prompt minus (FT − eNTK) with it, and
what is reported beside it. The whole set of pretraining seeds is a stored run
(:mod:`fmlab.stored`), computed by ``scripts/ch4_second_world.py`` into
:data:`SECOND_WORLD_RESULTS` and read by :func:`second_world_results`; the slice
:data:`SECOND_WORLD_SLICE` is a short run of the same code that the tests rerun.

Used in Chapter 4: ``notebooks/04-kernel-view.ipynb``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .. import stored
from .._validate import check_choice, check_float, check_int
from ..data.sentiment_language import SentimentLanguageConfig
from ..train import fresh_model_cache
from .ch4_fewshot import KernelExperimentConfig, run_kernel_experiment, wide_grid
from .ch4_world import MLMPretrainConfig

__all__ = [
    "SecondWorldConfig",
    "second_world_pretraining",
    "second_world_sources",
    "second_world_results",
    "second_world_slice",
    "second_world_job_check",
    "per_pretraining",
    "SECOND_WORLD_RESULTS",
    "SECOND_WORLD_SCRIPT",
    "SECOND_WORLD_SLICE",
]

SECOND_WORLD_RESULTS = Path(__file__).parent / "results" / "ch4_second_world.json"
SECOND_WORLD_SCRIPT = "scripts/ch4_second_world.py"


@dataclass(frozen=True)
class SecondWorldConfig:
    """One set of pretrainings of a world and its few-shot runs.

    ``cls_task``/``cls_weight``/``topic_tilt``: the world (:class:`MLMPretrainConfig`;
    ``"none"``, 0, 0 is the chapter's own world). ``pretrain_seeds``: one pretraining
    each, drawn at seed offset ``seed_offset``. Per pretraining, ``runs`` draws of
    ``shots`` examples per class; SGD-FT over the lazy grid of ``steps`` steps and the
    wide search at ``scales``, read at ``checkpoints`` steps; the eNTK over the matching
    ridges :math:`1/(ct)` (:func:`~.ch4_fewshot.wide_grid`). ``standard_head``: where
    standard fine-tuning starts (``KernelExperimentConfig.standard_head``): a fresh
    head (``"random"``, the registered world) or the paper's cross-validated probe
    (``"cv_probe"``, its footnote 2).
    """

    cls_task: str = "length"
    cls_weight: float = 1.0
    topic_tilt: float = 0.0
    pretrain_seeds: tuple[int, ...] = (100, 101, 102, 103, 104, 105)
    seed_offset: int = 0
    runs: int = 5
    shots: int = 64
    steps: int = 30
    scales: tuple[float, ...] = (4.0, 16.0, 64.0)
    checkpoints: tuple[int, ...] = (30, 100, 300)
    prior_positive: float = 0.8
    d_model: int = 32
    pretrain_steps: int = 2000
    n_test: int = 1000
    standard_head: str = "random"

    def __post_init__(self):
        check_choice("cls_task", self.cls_task, ("none", "length", "topic"))
        check_choice("standard_head", self.standard_head, ("random", "cv_probe"))
        check_float("cls_weight", self.cls_weight, minimum=0.0)
        check_float("topic_tilt", self.topic_tilt, minimum=0.0, maximum=1.0)
        if not isinstance(self.pretrain_seeds, tuple) or not self.pretrain_seeds:
            raise ValueError("pretrain_seeds must be a non-empty tuple")
        check_int("seed_offset", self.seed_offset, minimum=0)
        for name in ("runs", "shots", "steps", "d_model", "pretrain_steps", "n_test"):
            check_int(name, getattr(self, name), minimum=1)

    def pretrain(self, seed: int) -> MLMPretrainConfig:
        """The pretraining of seed ``seed`` in this world."""
        return MLMPretrainConfig(
            language=SentimentLanguageConfig(prior_positive=self.prior_positive),
            d_model=self.d_model,
            steps=self.pretrain_steps,
            seed=seed,
            cls_task=self.cls_task,
            cls_weight=self.cls_weight,
            topic_tilt=self.topic_tilt,
        )

    def experiment(self) -> KernelExperimentConfig:
        """The few-shot runs of one pretraining (SGD and the eNTK only)."""
        return KernelExperimentConfig(
            shots=(self.shots,),
            seeds=tuple(range(self.runs)),
            n_test=self.n_test,
            methods="sgd",
            standard_head=self.standard_head,
            **wide_grid(self.steps, self.scales, self.checkpoints),
        )


@contextlib.contextmanager
def _at_offset(offset: int):
    """Run the block at seed offset ``offset`` (``FMLAB_SEED_OFFSET``), then restore."""
    before = os.environ.get("FMLAB_SEED_OFFSET")
    os.environ["FMLAB_SEED_OFFSET"] = str(offset)
    try:
        yield
    finally:
        if before is None:
            del os.environ["FMLAB_SEED_OFFSET"]
        else:
            os.environ["FMLAB_SEED_OFFSET"] = before


def second_world_pretraining(config: SecondWorldConfig, seed: int) -> dict:
    """Pretrain seed ``seed`` of ``config``'s world and run its few-shot draws; per run
    (lists, points unless said): ``contrast`` = (FT − eNTK) standard − (FT − eNTK)
    prompt, ``zero_shot`` (%), ``std_ft_minus_lp``, ``prompt_abs_ft_minus_entk``,
    ``kc_ratio`` (kernel change of the validated standard run over the validated
    prompt run), and the accuracies (%) of both settings' validated FT and eNTK; from
    the cross-validated probe head (``config.standard_head``), also ``cv_probe``, its
    test accuracy (%), and ``cv_c``, the :math:`C` its cross validation chose."""
    if not isinstance(config, SecondWorldConfig):
        raise TypeError(f"config must be a SecondWorldConfig, got {type(config)}")
    t0 = time.time()
    with _at_offset(config.seed_offset):
        r = run_kernel_experiment(config.pretrain(seed), config.experiment())
    k, wide = config.shots, "SGD-FT, wide grid"

    def acc(setting, method):
        return 100 * np.asarray(r.accuracy[(setting, method, k)], dtype=float)

    gap = {s: acc(s, wide) - acc(s, "K-SGD") for s in ("standard", "prompt")}
    kc = {
        s: np.asarray(r.dynamics[(s, "SGD, wide grid", k)]["kernel_change"])
        for s in ("standard", "prompt")
    }
    out = {
        "seed": seed,
        "contrast": gap["standard"] - gap["prompt"],
        "zero_shot": acc("prompt", "zero-shot"),
        "std_ft_minus_lp": acc("standard", wide) - acc("standard", "LP"),
        "prompt_abs_ft_minus_entk": np.abs(gap["prompt"]),
        "kc_ratio": kc["standard"] / kc["prompt"],
        "std_ft": acc("standard", wide),
        "std_entk": acc("standard", "K-SGD"),
        "prompt_ft": acc("prompt", wide),
        "prompt_entk": acc("prompt", "K-SGD"),
    }
    if config.standard_head == "cv_probe":
        out["cv_probe"] = acc("standard", "CV probe")
        out["cv_c"] = list(r.chosen[("standard", "CV probe", k)])
    out = {n: v.tolist() if isinstance(v, np.ndarray) else v for n, v in out.items()}
    out["seconds"] = time.time() - t0
    return out


def second_world_sources() -> list:
    """The package code that produces the stored second world, for its fingerprint
    (:mod:`fmlab.stored`); the script's settings are in the file as its config."""
    from ..data import sentiment_language
    from ..models import transformer
    from ..repro import _splitmix64, effective_seed, make_generator, seed_everything
    from ..theory import kernels
    from . import ch4_fewshot, ch4_kernel_behaviour, ch4_world

    return [
        SecondWorldConfig,
        second_world_pretraining,
        second_world_slice,
        _at_offset,
        ch4_world,
        ch4_fewshot,
        ch4_kernel_behaviour,
        kernels,
        transformer,
        sentiment_language,
        make_generator,
        effective_seed,
        _splitmix64,  # effective_seed's mixer
        seed_everything,
    ]


def _config(record: dict) -> SecondWorldConfig:
    cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
    return SecondWorldConfig(**cfg)


def second_world_results(path: Path | str | None = None) -> dict:
    """The stored second world: ``{part: {"config": SecondWorldConfig, "pretrainings":
    [dict of :func:`second_world_pretraining`, ...]}}`` for each part the script ran
    (``"main"``: the registered world; ``"screen"``, ``"book"``, ``"offset"`` when
    run), and ``"stored"`` (the record: code fingerprint, machine). Raises
    :class:`fmlab.stored.StaleResults`, naming the script, when that code has changed
    since."""
    path = Path(SECOND_WORLD_RESULTS if path is None else path)
    data = stored.load(path, script=SECOND_WORLD_SCRIPT, sources=second_world_sources())
    out = {"stored": data["stored"]}
    for name, part in data["parts"].items():
        out[name] = {
            "config": _config(part["config"]),
            "pretrainings": part["pretrainings"],
        }
    return out


#: The slice of the stored run that the tests rerun (another rounding path than the
#: record's, :func:`fmlab.stored.other_rounding`): one short pretraining of the second
#: world at width 16 (30 steps), three draws of 4 examples per class, read at 10 and 20
#: steps; about 5 s on one core.
SECOND_WORLD_SLICE = dict(
    pretrain_seeds=(100,),
    runs=3,
    shots=4,
    scales=(16.0,),
    checkpoints=(10, 20),
    d_model=16,
    pretrain_steps=30,
    n_test=100,
)


def second_world_slice(record: dict | None = None) -> dict:
    """Run the slice (the config ``record``, by default :data:`SECOND_WORLD_SLICE` over
    the defaults) afresh, never from the model cache: the per-run accuracies that
    :func:`fmlab.stored.compare_runs` compares."""
    config = (
        SecondWorldConfig(**SECOND_WORLD_SLICE) if record is None else _config(record)
    )
    before = os.environ.get("FMLAB_CACHE_DIR")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FMLAB_CACHE_DIR"] = tmp
        try:
            out = second_world_pretraining(config, config.pretrain_seeds[0])
        finally:
            if before is None:
                del os.environ["FMLAB_CACHE_DIR"]
            else:
                os.environ["FMLAB_CACHE_DIR"] = before
    # the accuracies move in steps of 1/n_test; the kernel-change ratio is continuous,
    # so a rerun on another rounding path shows in its last digits
    names = ("std_ft", "std_entk", "prompt_ft", "prompt_entk", "kc_ratio")
    return {n: out[n] for n in names}


#: The per-run quantities of a stored pretraining that a rerun must reproduce.
_JOB_FIELDS = (
    "contrast",
    "zero_shot",
    "std_ft_minus_lp",
    "prompt_abs_ft_minus_entk",
    "kc_ratio",
    "std_ft",
    "std_entk",
    "prompt_ft",
    "prompt_entk",
)


def second_world_job_check(
    path: Path | str | None = None, part: str = "main", seed: int = 105
) -> dict:
    """A script's ``--restamp`` check: rerun one pretraining of the stored run at
    ``path`` (by default pretraining 105 of the main part: its pretraining and five
    k = 64 runs, about five minutes on one core) with today's code, afresh (never
    from the model cache), and compare its per-run numbers with the record
    (:func:`fmlab.stored.compare_runs`). Reads the file without checking its
    fingerprint. Every pretraining of the main part was stored by today's few-shot
    code (100-102 rerun with ``--redo-seeds`` after ffa70fc had moved a few of their
    runs by up to 1.3 points), so a change that moves nothing reproduces any of them
    bit for bit."""
    data = stored.read(SECOND_WORLD_RESULTS if path is None else path)
    if part not in data["parts"]:
        raise ValueError(f"part must be one of {sorted(data['parts'])}, got {part!r}")
    record = data["parts"][part]
    found = [p for p in record["pretrainings"] if p["seed"] == seed]
    if not found:
        seeds = [p["seed"] for p in record["pretrainings"]]
        raise ValueError(f"seed must be one of the part's {seeds}, got {seed!r}")
    config = _config(record["config"])
    with fresh_model_cache(seed_offset_zero=False):  # the offset is the config's
        out = second_world_pretraining(config, seed)
    names = [n for n in _JOB_FIELDS if n in found[0]]
    return stored.compare_runs(
        {n: found[0][n] for n in names}, {n: out[n] for n in names}
    )


def slice_config() -> dict:
    """The slice's full configuration, as the results file records it."""
    return asdict(SecondWorldConfig(**SECOND_WORLD_SLICE))


def per_pretraining(part: dict, names=("contrast",)) -> dict[str, list[float]]:
    """Per pretraining of a part of :func:`second_world_results`, the mean over its
    runs of each quantity in ``names`` (``{name: [one value per pretraining]}``)."""
    return {n: [float(np.mean(p[n])) for p in part["pretrainings"]] for n in names}
