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
from .ch5_implicit_bias import GRU_BLOCKS, kl_gap, mlm_fisher_trace, train_phase

__all__ = [
    "SIZE_SWEEP_RESULTS",
    "SIZE_SWEEP_SCRIPT",
    "SizeSweepConfig",
    "SIZE_SWEEP_SLICE",
    "GRU_TENSOR_EXPONENTS",
    "embed_hidden",
    "size_sweep_compared",
    "size_sweep_config",
    "size_sweep_job_check",
    "size_sweep_results",
    "size_sweep_run",
    "size_sweep_slice",
    "size_sweep_sources",
    "size_trace_at_matched_gap",
    "TRACE_FIELDS",
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
    n_trace: int = 1000  # sentences of the Fisher traces (native and embedded)
    trace_labels: int = 1  # label draws per sentence
    tolerance: float = 0.002  # nats: sizes whose mean gaps differ by less are "equal"

    def __post_init__(self):
        if not isinstance(self.language, HMMLanguageConfig):
            raise TypeError("language must be an HMMLanguageConfig")
        for h in self.sizes:
            check_int("sizes", h, minimum=1)
        check_int("n_models", self.n_models, minimum=1)
        check_int("projection", self.projection, minimum=1)
        check_int("n_trace", self.n_trace, minimum=2)
        check_int("trace_labels", self.trace_labels, minimum=1)
        check_float("tolerance", self.tolerance, minimum=0.0, strict_min=True)


#: How the embedding of :func:`embed_hidden` at ``m`` times the hidden size scales each
#: parameter tensor's share of the Fisher trace: by :math:`m^k`, ``k`` = (the tensor
#: reads replicated units) − (it writes replicated units). See :func:`embed_hidden`.
GRU_TENSOR_EXPONENTS = {
    "emb": -1,
    "rec": 0,
    "rec_bias": -1,
    "h0": -1,
    "w1": 0,
    "b1": -1,
    "w2": 1,
    "b2": 0,
}


def embed_hidden(model: BiGRUMaskedLM, hidden: int) -> BiGRUMaskedLM:
    """The same function at a larger hidden size, by replicating every unit (Liu et
    al., 2023, Appendix B.4; :func:`fmlab.models.bert.embed_width` for transformers).

    ``hidden`` must be a multiple :math:`m\\,h` of the model's hidden size :math:`h`;
    the head's width becomes :math:`m\\,d_{ff}`. Unit :math:`i` of the wide model is
    unit :math:`\\lfloor i/m \\rfloor` of the narrow one, in each gate block
    :math:`r, z, n` of the GRU, in each direction and in the head. Weights that read
    replicated units (the recurrent matrix, both head matrices) are divided by
    :math:`m`, so each pre-activation is the same sum; embeddings, biases and the
    initial state are copied. By induction over the steps every state is the narrow
    state replicated, so the logits are the same; the features
    :math:`[\\overrightarrow{h}_t; \\overleftarrow{h}_t]` are replicated.

    The trace is *not* the narrow model's: a copy of a weight that writes a replicated
    unit gets :math:`1/m` of the narrow gradient (its unit is read through weights
    divided by :math:`m`), and a tensor has :math:`m` copies of each entry per
    replicated axis, so each tensor's share of the Fisher trace is the narrow one
    times :math:`m^{\\text{reads}-\\text{writes}}` (:data:`GRU_TENSOR_EXPONENTS`):
    the recurrent and first head matrices keep theirs, embeddings, biases of
    replicated units and the initial state lose a factor :math:`m`, and the output
    matrix gains one. Returns a new ensemble with the same members."""
    if not isinstance(model, BiGRUMaskedLM):
        raise TypeError(f"model must be a BiGRUMaskedLM, got {type(model).__name__}")
    h = model.hidden
    hidden = check_int("hidden", hidden, minimum=h)
    if hidden % h:
        raise ValueError(
            f"hidden ({hidden}) must be a multiple of the model's hidden size ({h})"
        )
    m = hidden // h
    # every weight is overwritten below; its own generator leaves the global RNG alone
    out = BiGRUMaskedLM(
        model.vocab_size,
        hidden=hidden,
        d_ff=m * model.d_ff,
        n_models=model.n_models,
        generator=torch.Generator(),
    )

    def rep(w, *dims):  # a copy with every unit of the given axes repeated m times
        for ax in dims:
            w = w.repeat_interleave(m, dim=ax)
        return w

    with torch.no_grad():
        new = {
            "emb": rep(model.emb, 3),  # (E, 2, V, 3h): [r | z | n], each h wide
            "rec": rep(model.rec, 2, 3) / m,  # (E, 2, h, 3h)
            "rec_bias": rep(model.rec_bias, 3),
            "h0": rep(model.h0, 3),  # (E, 2, 1, h)
            "w1": rep(model.w1, 1, 2) / m,  # (E, 2h, d_ff): [forward; backward]
            "b1": rep(model.b1, 2),
            "w2": rep(model.w2, 1) / m,  # (E, d_ff, V)
            "b2": model.b2.clone(),
        }
        for name, value in new.items():
            getattr(out, name).copy_(value)
    return out


def size_sweep_run(config: SizeSweepConfig, size: int, device="cpu") -> dict:
    """Pretrain ``config.n_models`` GRUs of hidden size ``size`` as one ensemble
    (weights from ``make_generator(100 + size)``, data from ``make_generator(7)`` for
    every size) and measure per member the KL gap to the optimal loss (nats) and the
    probe's expected block accuracy at every probe size on the projected features.
    Plain lists, for JSON.

    Also per member the sampled-label Fisher trace of the masked-LM loss per block of
    :data:`fmlab.chapters.ch5_implicit_bias.GRU_BLOCKS` (``trace_encoder``,
    ``trace_head``), the same traces of the member embedded at the largest size of
    the sweep by :func:`embed_hidden` (``trace_embedded_encoder``,
    ``trace_embedded_head``: the paper's comparison, every size in one architecture)
    and the largest change of a logit that embedding made (``embedding_error``); the
    same sentences and label draws for both.

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
        traces = _traces(model, lang, c)
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
    return (
        {
            "size": size,
            "n_params": sum(p[0].numel() for p in model.parameters()),
            "bayes_accuracy": float(te_post.max(-1).values.mean()),
            "gap": gap.tolist(),
            "accuracy": acc,
        }
        | {k: v.tolist() for k, v in traces.items()}
        | {
            "seconds": time.time() - t0,
        }
    )


#: the per-member traces :func:`size_sweep_run` records
TRACE_FIELDS = (
    "trace_encoder",
    "trace_head",
    "trace_embedded_encoder",
    "trace_embedded_head",
    "embedding_error",
)


def _traces(model: BiGRUMaskedLM, lang: HMMLanguage, c: SizeSweepConfig) -> dict:
    """The Fisher traces per block of every member, at its own hidden size and
    embedded at the largest of ``c.sizes`` (:func:`embed_hidden`), with the same
    sentences and label seed, and the embedding's largest logit change, per member."""
    tok, _ = lang.sample(c.n_trace, make_generator(10_005))

    def blocks(m):
        est = mlm_fisher_trace(
            m,
            tok,
            n_labels=c.trace_labels,
            generator=make_generator(10_006),
            blocks=GRU_BLOCKS,
        )
        return {b: e.per_group.double() for b, e in est.per_block.items()}

    native = blocks(model)
    out = {f"trace_{b}": v for b, v in native.items()}
    if model.hidden == max(c.sizes):  # the embedding is the identity
        out |= {f"trace_embedded_{b}": v for b, v in native.items()}
        out["embedding_error"] = torch.zeros(model.n_models, dtype=torch.float64)
        return out
    big = embed_hidden(model, max(c.sizes))
    with torch.no_grad():
        error = (big(tok) - model(tok)).abs().amax((1, 2, 3)).double()
    out |= {f"trace_embedded_{b}": v for b, v in blocks(big).items()}
    out["embedding_error"] = error
    return out


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
    from ..repro import _splitmix64, effective_seed
    from ..theory import flatness
    from ..train import lr_factor, train_scheduled

    return [
        SizeSweepConfig,
        size_sweep_run,
        _traces,
        embed_hidden,
        mlm_fisher_trace,
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
        _splitmix64,  # effective_seed's mixer
        masked_lm,
        hmm_language,
        flatness,
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


def size_trace_at_matched_gap(results: dict, sizes, block: str = "encoder") -> dict:
    """The Fisher trace of ``block`` (``"encoder"`` or ``"head"``) of every replicate of
    ``sizes``, embedded at the largest size of the sweep, with the gap partialled out:
    each trace is moved along the slope of trace on gap *within* sizes (the slope
    fitted to the replicates' deviations from their size's means, so that the
    differences between sizes do not enter it) to the mean gap of all of them,
    :math:`t_{h,r} - \\beta\\,(g_{h,r} - \\bar g)` for the trace :math:`t` and gap
    :math:`g` of size :math:`h`, replicate :math:`r`.
    Returns ``"trace"`` and ``"adjusted"`` ``(sizes, replicates)``, ``"native"``
    (the traces at each size's own width), ``"gap"``, the ``"slope"`` :math:`\\beta`
    and the common gap ``"at_gap"``."""
    if block not in ("encoder", "head"):
        raise ValueError(f"block must be 'encoder' or 'head', got {block!r}")
    sizes = list(sizes)
    if len(sizes) < 2:
        raise ValueError("sizes must hold at least two sizes")
    tr = torch.stack([results[h][f"trace_embedded_{block}"] for h in sizes])
    gap = torch.stack([results[h]["gap"] for h in sizes])
    tc = tr - tr.mean(1, keepdim=True)
    gc = gap - gap.mean(1, keepdim=True)
    slope = float((tc * gc).sum() / (gc * gc).sum())
    at = float(gap.mean())
    return {
        "trace": tr,
        "adjusted": tr - slope * (gap - at),
        "native": torch.stack([results[h][f"trace_{block}"] for h in sizes]),
        "gap": gap,
        "slope": slope,
        "at_gap": at,
    }


#: The slice of the stored sweep that the tests rerun (under another rounding path
#: than the record's, :func:`fmlab.stored.other_rounding`): the smallest size, three
#: replicates, 100 steps (a 50-step warm-up), the probe at two sizes, the traces on
#: 100 sentences with the embedding at hidden size 32 (the slice trains only its first
#: size); seconds on one core.
SIZE_SWEEP_SLICE = dict(
    sizes=(16, 32),
    n_models=3,
    steps=50,
    warmup=25,
    probe_sizes=(100, 500),
    n_probe_test=1000,
    n_gap=500,
    n_trace=100,
)


def size_sweep_slice(record: dict | None = None, device="cpu") -> dict:
    """Run the slice (the config ``record``, by default :data:`SIZE_SWEEP_SLICE` over
    the defaults) at its first size: the members' gaps, probe accuracies and traces
    (native and embedded), the per-replicate quantities that
    :func:`fmlab.stored.compare_runs` compares."""
    if record is None:
        config = SizeSweepConfig(**SIZE_SWEEP_SLICE)
    else:
        config = size_sweep_config(record)
    out = size_sweep_run(config, config.sizes[0], device=device)
    return {k: out[k] for k in ("gap", "accuracy") + TRACE_FIELDS[:4]}


def size_sweep_job_check(path: Path | str | None = None, size: int = 16) -> dict:
    """A script's ``--restamp`` check: rerun ``size`` of the stored sweep at ``path``
    with its recorded configuration (six replicates, 1500 steps: about 2 min on one
    core) and compare it with its record (:func:`fmlab.stored.compare_runs`). Reads
    the file without checking its fingerprint."""
    data = stored.read(SIZE_SWEEP_RESULTS if path is None else path)
    config = size_sweep_config(data["meta"]["config"])
    (run,) = [r for r in data["runs"] if r["size"] == size]
    out = size_sweep_run(config, size)
    names = ("gap", "accuracy") + TRACE_FIELDS[:4]
    return stored.compare_runs({k: run[k] for k in names}, {k: out[k] for k in names})
