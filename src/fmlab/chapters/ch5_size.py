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
fingerprint of the code below (:mod:`fmlab.chapters.ch5_stored`); the page reads it with
:func:`size_sweep_results`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .._validate import check_float, check_int
from ..data.hmm_language import HMMLanguage, HMMLanguageConfig
from ..models.masked_lm import BiGRUMaskedLM
from ..repro import make_generator, single_threaded
from . import ch5_stored as stored
from .ch5_implicit_bias import kl_gap, probe_curve, train_phase

__all__ = [
    "SIZE_SWEEP_RESULTS",
    "SIZE_SWEEP_SCRIPT",
    "SizeSweepConfig",
    "size_sweep_compared",
    "size_sweep_results",
    "size_sweep_run",
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


def size_sweep_run(config: SizeSweepConfig, size: int) -> dict:
    """Pretrain ``config.n_models`` GRUs of hidden size ``size`` as one ensemble
    (weights from ``make_generator(100 + size)``, data from ``make_generator(7)`` for
    every size) and measure per member the KL gap to the optimal loss (nats) and the
    probe's expected block accuracy at every probe size on the projected features.
    Plain lists, for JSON."""
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
        )
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
            probe_curve(
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
    """The code that produces the stored size sweep, for its fingerprint."""
    from ..data import hmm_language
    from ..models import masked_lm
    from ..repro import effective_seed
    from ..train import train_scheduled
    from .ch5_implicit_bias import _probe_accuracy, _probe_inputs, ridge_probe_accuracy

    root = Path(__file__).resolve().parents[3]
    return [
        root / SIZE_SWEEP_SCRIPT,
        SizeSweepConfig,
        size_sweep_run,
        train_phase,
        train_scheduled,
        kl_gap,
        probe_curve,
        ridge_probe_accuracy,
        _probe_inputs,
        _probe_accuracy,
        make_generator,
        effective_seed,
        masked_lm,
        hmm_language,
    ]


def size_sweep_results(path: Path | str | None = None) -> dict:
    """The stored size sweep: ``{size: {"gap" (R,), "accuracy" (R, probe sizes),
    "n_params", "bayes_accuracy", "seconds"}}`` and ``"meta"`` (the configuration, the
    machine and, under ``"stored"``, the code's fingerprint). Raises
    :class:`fmlab.chapters.ch5_stored.StaleResults`, naming the script, when that code
    has changed since."""
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


# The cheapest size of the stored sweep, rerun by the tests (its six replicates, 1500
# steps: about 2 min on one core), and how far a rerun may drift from its record on
# another machine or torch build (the order of floating-point sums).
SIZE_SWEEP_SLICE = 16
SIZE_SWEEP_SLICE_TOL = {"gap": 2e-3, "accuracy": 0.01}


def size_sweep_slice_check(path: Path | str | None = None) -> dict:
    """Rerun the size :data:`SIZE_SWEEP_SLICE` of the stored sweep at ``path`` with its
    recorded configuration and compare: the largest absolute differences of the gaps
    and accuracies, and ``"ok"``: whether both are within
    :data:`SIZE_SWEEP_SLICE_TOL`. Reads the file without checking its fingerprint."""
    import json

    path = Path(SIZE_SWEEP_RESULTS if path is None else path)
    data = json.loads(path.read_text())
    cfg = dict(data["meta"]["config"])
    cfg["language"] = HMMLanguageConfig(**cfg["language"])
    config = SizeSweepConfig(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()}
    )
    (run,) = [r for r in data["runs"] if r["size"] == SIZE_SWEEP_SLICE]
    out = size_sweep_run(config, SIZE_SWEEP_SLICE)
    res = {
        name: float((torch.tensor(out[name]) - torch.tensor(run[name])).abs().max())
        for name in ("gap", "accuracy")
    }
    res["ok"] = all(res[k] <= v for k, v in SIZE_SWEEP_SLICE_TOL.items())
    return res
