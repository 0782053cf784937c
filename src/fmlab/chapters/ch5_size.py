"""Model size at equal loss in the paper's own design (Chapter 5, page 05c).

Liu et al. (2023) compare models of several sizes trained by one recipe into the
saturation regime, and probe them with a linear head of controlled capacity (their
appendix projects the concatenated features to one dimension). Here: bidirectional-GRU
masked language models (:class:`fmlab.models.masked_lm.BiGRUMaskedLM`) of several hidden
sizes on the language with **tied** emissions, where single tokens and the exact
conditionals say little about the block but a model's context can; one Adam recipe for
every size; each replicate's data stream shared by every size (member ``e`` of every
size sees the same sentences); and a ridge probe on a fixed random Gaussian projection
of the concatenated features to ``projection`` dimensions, scored against the exact
posterior of the block (the expected accuracy, without the test labels' noise).

Training every size with six replicates takes longer than a page may, so
``scripts/ch5_size_sweep.py`` runs it into ``results/ch5_size_sweep.json`` with the
fingerprint of the code below (:mod:`fmlab.stored`); the page reads it with
:func:`size_sweep_results`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import stored
from .._validate import check_float, check_int
from ..adapt.probes import ridge_probe_curve
from ..data.hmm_language import HMMLanguage, HMMLanguageConfig
from ..models.masked_lm import BiGRUMaskedLM
from ..repro import make_generator, single_threaded
from .ch5_implicit_bias import kl_gap, train_phase

__all__ = [
    "SIZE_SWEEP_RESULTS",
    "SIZE_SWEEP_SCRIPT",
    "SizeSweepConfig",
    "SIZE_SWEEP_SLICE",
    "size_sweep_compared",
    "size_sweep_config",
    "size_sweep_job_check",
    "size_sweep_results",
    "size_sweep_run",
    "size_sweep_slice",
    "size_sweep_sources",
]

SIZE_SWEEP_RESULTS = Path(__file__).parent / "results" / "ch5_size_sweep.json"
SIZE_SWEEP_SCRIPT = "scripts/ch5_size_sweep.py"


@dataclass(frozen=True)
class SizeSweepConfig:
    """Everything that determines one size of :func:`size_sweep_run`."""

    language: HMMLanguageConfig = field(default_factory=HMMLanguageConfig)  # tied
    sizes: tuple = (16, 32, 64, 128)  # hidden size of each direction; d_ff = 2 h
    n_models: int = 6  # replicates, trained side by side as one ensemble per size
    steps: int = 1500
    batch: int = 128
    lr: float = 1e-2
    warmup: int = 100
    position: int = 5  # the task: the block of the hidden state at this position
    projection: int = 256  # the probe reads a fixed random projection to this size
    probe_sizes: tuple = (200, 1000, 3000)
    probe_ridge: float = 1e-2
    n_probe_test: int = 5000
    n_gap: int = 2000
    tolerance: float = 0.002  # nats: sizes whose mean gaps differ by less are "equal"

    def __post_init__(self):
        if not isinstance(self.language, HMMLanguageConfig):
            raise TypeError("language must be an HMMLanguageConfig")
        for h in self.sizes:
            check_int("sizes", h, minimum=1)
        check_int("n_models", self.n_models, minimum=1)
        check_int("projection", self.projection, minimum=1)
        check_float("tolerance", self.tolerance, minimum=0.0, strict_min=True)


def size_sweep_run(config: SizeSweepConfig, size: int, device="cpu") -> dict:
    """Pretrain ``config.n_models`` GRUs of hidden size ``size`` as one ensemble
    (weights from ``make_generator(100 + size)``, data from ``make_generator(7)`` for
    every size) and measure per member the KL gap to the optimal loss (nats) and the
    probe's expected block accuracy at every probe size on the projected features.
    Plain lists, for JSON.

    ``device`` (e.g. ``"cuda"``) is where the model trains; every sentence is still
    drawn by the CPU generators, so a seed gives the same data on every device, and
    the trained model is evaluated on the CPU."""
    if not isinstance(config, SizeSweepConfig):
        raise TypeError(f"config must be a SizeSweepConfig, got {type(config)}")
    if size not in config.sizes:
        raise ValueError(f"size: {size} is not one of config.sizes {config.sizes}")
    c, t0 = config, time.time()
    with single_threaded():
        lang = HMMLanguage(c.language)
        K, S = c.language.n_blocks, c.language.states_per_block
        gap_tok, _ = lang.sample(c.n_gap, make_generator(10_001))
        gap_cond = lang.masked_conditionals(gap_tok)
        tr_tok, tr_h = lang.sample(max(c.probe_sizes), make_generator(10_003))
        te_tok, te_h = lang.sample(c.n_probe_test, make_generator(10_004))
        ytr, yte = tr_h[:, c.position] // S, te_h[:, c.position] // S
        te_post = lang.block_posterior(te_tok)[:, c.position]
        model = BiGRUMaskedLM(
            lang.config.vocab_size,
            hidden=size,
            d_ff=2 * size,
            n_models=c.n_models,
            generator=make_generator(100 + size),
        ).to(device)
        train_phase(
            model,
            lang,
            steps=c.steps,
            batch=c.batch,
            lr=c.lr,
            warmup=c.warmup,
            generator=make_generator(7),
            desc=f"hidden {size}",
        )
        model.to("cpu")
        gap = kl_gap(model, gap_tok, gap_cond)
        with torch.no_grad():
            ftr = model.features(tr_tok).flatten(2).double()
            fte = model.features(te_tok).flatten(2).double()
        F = ftr.shape[-1]
        P = (
            torch.randn(
                F, c.projection, generator=make_generator(555), dtype=torch.float64
            )
            / F**0.5
        )
        acc = [
            ridge_probe_curve(
                ftr[e] @ P,
                ytr,
                fte[e] @ P,
                yte,
                K,
                c.probe_sizes,
                c.probe_ridge,
                te_post,
            ).tolist()
            for e in range(c.n_models)
        ]
    return {
        "size": size,
        "n_params": sum(p[0].numel() for p in model.parameters()),
        "bayes_accuracy": float(te_post.max(-1).values.mean()),
        "gap": gap.tolist(),
        "accuracy": acc,
        "seconds": time.time() - t0,
    }


def size_sweep_sources() -> list:
    """The package code that produces the stored size sweep, for its fingerprint
    (:mod:`fmlab.stored`); the script's settings are in the file as its config."""
    from ..adapt.probes import (
        _ridge_head,
        _ridge_probe_accuracy,
        _ridge_probe_inputs,
        ridge_probe_accuracy,
    )
    from ..data import hmm_language
    from ..models import masked_lm
    from ..repro import effective_seed
    from ..train import lr_factor, train_scheduled

    return [
        SizeSweepConfig,
        size_sweep_run,
        size_sweep_config,
        size_sweep_slice,
        train_phase,
        train_scheduled,
        lr_factor,
        kl_gap,
        ridge_probe_curve,
        ridge_probe_accuracy,
        _ridge_probe_inputs,
        _ridge_probe_accuracy,
        _ridge_head,
        make_generator,
        effective_seed,
        masked_lm,
        hmm_language,
    ]


def size_sweep_config(record: dict) -> SizeSweepConfig:
    """The :class:`SizeSweepConfig` recorded as data in a results file."""
    cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
    cfg["language"] = HMMLanguageConfig(**cfg["language"])
    return SizeSweepConfig(**cfg)


def size_sweep_results(path: Path | str | None = None) -> dict:
    """The stored size sweep: ``{size: {"gap" (R,), "accuracy" (R, probe sizes),
    "n_params", "bayes_accuracy", "seconds"}}`` and ``"meta"`` (the configuration, the
    machine and, under ``"stored"``, the code's fingerprint). Raises
    :class:`fmlab.stored.StaleResults`, naming the script, when that code has changed
    since."""
    path = Path(SIZE_SWEEP_RESULTS if path is None else path)
    data = stored.load(path, script=SIZE_SWEEP_SCRIPT, sources=size_sweep_sources())
    out: dict = {"meta": data["meta"] | {"stored": data["stored"]}}
    for run in data["runs"]:
        out[run["size"]] = {
            k: torch.tensor(v, dtype=torch.float64) if isinstance(v, list) else v
            for k, v in run.items()
        }
    return out


def size_sweep_compared(results: dict, tolerance: float) -> list[int]:
    """The sizes at equal loss: those whose mean gap is within ``tolerance`` nats of
    the smallest mean gap, in increasing order."""
    check_float("tolerance", tolerance, minimum=0.0, strict_min=True)
    sizes = sorted(k for k in results if k != "meta")
    lowest = min(float(results[h]["gap"].mean()) for h in sizes)
    return [h for h in sizes if float(results[h]["gap"].mean()) - lowest < tolerance]


#: The slice of the stored sweep that the tests rerun (under another rounding path
#: than the record's, :func:`fmlab.stored.other_rounding`): the smallest size, three
#: replicates, 100 steps (a 50-step warm-up), the probe at two sizes; seconds on one
#: core.
SIZE_SWEEP_SLICE = dict(
    sizes=(16,),
    n_models=3,
    steps=100,
    warmup=50,
    probe_sizes=(100, 500),
    n_probe_test=1000,
    n_gap=500,
)


def size_sweep_slice(record: dict | None = None, device="cpu") -> dict:
    """Run the slice (the config ``record``, by default :data:`SIZE_SWEEP_SLICE` over
    the defaults) at its first size: the members' gaps and probe accuracies, the
    per-replicate quantities that :func:`fmlab.stored.compare_runs` compares."""
    if record is None:
        config = SizeSweepConfig(**SIZE_SWEEP_SLICE)
    else:
        config = size_sweep_config(record)
    out = size_sweep_run(config, config.sizes[0], device=device)
    return {"gap": out["gap"], "accuracy": out["accuracy"]}


def size_sweep_job_check(path: Path | str | None = None, size: int = 16) -> dict:
    """A script's ``--restamp`` check: rerun ``size`` of the stored sweep at ``path``
    with its recorded configuration (six replicates, 1500 steps: about 2 min on one
    core) and compare it with its record (:func:`fmlab.stored.compare_runs`). Reads
    the file without checking its fingerprint."""
    data = stored.read(SIZE_SWEEP_RESULTS if path is None else path)
    config = size_sweep_config(data["meta"]["config"])
    (run,) = [r for r in data["runs"] if r["size"] == size]
    out = size_sweep_run(config, size)
    names = ("gap", "accuracy")
    return stored.compare_runs({k: run[k] for k in names}, {k: out[k] for k in names})
