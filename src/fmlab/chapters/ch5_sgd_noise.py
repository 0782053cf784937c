"""Continued SGD at different noise levels on a BERT-style masked LM (Chapter 5).

Used in Chapter 5 (``notebooks/05c-same-loss-transformer.ipynb``) to go after the
central effect of Liu et al. (2023) with the design they used: a bidirectional
transformer whose normalised representation feeds a **linear** decoder
(:class:`fmlab.models.bert.EnsembleBert`), pretrained with Adam until its masked-LM loss
is at the optimum of a generated language (:class:`fmlab.data.hmm_language.HMMLanguage`,
whose downstream label, the block of a hidden state, is not readable from single
tokens), then continued from that point with plain SGD at several noise levels
:math:`\\eta^2/B` for the same number of steps. Each continued model is compared with
the others at (nearly) the same loss: its trace of the Hessian per parameter block
(encoder, decoder) and its linear-probe transfer.

Why the decoder cannot hide flatness here: with logits :math:`z = D\\phi + c` and
:math:`\\phi` normalised, :math:`\\partial z_v/\\partial D_{v\\cdot} = \\phi` and
:math:`\\partial z_v/\\partial c_v = 1`, so the Fisher trace of the decoder block is

.. math::
    \\operatorname{tr} F_{\\text{dec}} = \\mathbb{E}_{x,t}\\Big[
        (\\lVert\\phi_t\\rVert^2 + 1)
        \\sum_v p_\\theta(v\\mid x_{-t})\\big(1 - p_\\theta(v\\mid x_{-t})\\big)\\Big]
    \\;\\approx\\; (d+1)\\,\\mathbb{E}_{x,t}
        \\big[1 - \\lVert p_\\theta(\\cdot\\mid x_{-t})\\rVert^2\\big]

(:func:`head_trace_closed_form`): a function of the predictions alone. Two saturated
models predict the same :math:`p^\\star`, so their decoders have the same trace; any
difference in flatness is in the encoder.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from .. import stored
from .._validate import check_float, check_int
from ..adapt.probes import ridge_probe_curve
from ..data.hmm_language import HMMLanguage, HMMLanguageConfig
from ..models.bert import (
    HEAD_PARAMETERS,
    BertConfig,
    EnsembleBert,
    embed_width,
    masked_lm_nll,
)
from ..repro import make_generator, seed_offset, single_threaded
from ..theory.decomposition import spearman
from ..theory.flatness import TraceEstimate, fisher_trace
from ..train import cached, lr_factor, train_scheduled

__all__ = [
    "NOISE_TRANSFER_RESULTS",
    "NOISE_TRANSFER_SCRIPT",
    "NOISE_TRANSFER_SLICE",
    "NoiseTransferConfig",
    "bert_blocks",
    "bert_kl_gap",
    "bert_fisher_trace",
    "head_trace_closed_form",
    "train_bert",
    "bert_log_fisher_trace",
    "noise_family_flatness",
    "noise_transfer_config",
    "noise_transfer_experiment",
    "noise_transfer_job_check",
    "noise_transfer_results",
    "noise_transfer_slice",
    "noise_transfer_sources",
    "partial_rank_correlation",
    "width_family_flatness",
    "noise_transfer",
    "trace_transfer_rank_correlation",
    "width_lr_pairs",
    "width_sweep_equal_loss",
    "width_trace_transfer_rank",
]


def bert_blocks(name: str) -> str:
    """The block of an :class:`EnsembleBert` parameter: ``"head"`` or ``"encoder"``."""
    return "head" if name.split(".")[-1] in HEAD_PARAMETERS else "encoder"


def _check_model(model):
    if not isinstance(model, EnsembleBert):
        raise TypeError(f"model must be an EnsembleBert, got {type(model).__name__}")


def bert_kl_gap(
    model: EnsembleBert, tokens: torch.Tensor, true_conditionals: torch.Tensor
) -> torch.Tensor:
    """:math:`\\mathbb{E}_{x,t}\\mathrm{KL}(p^\\star\\,\\|\\,p_\\theta)` for each
    member: ``(E,)``.

    ``true_conditionals`` are ``language.masked_conditionals(tokens)``, ``(n, T, V)``.
    """
    _check_model(model)
    tokens = model.check_tokens(tokens)
    p = true_conditionals.double()
    if p.shape != (*tokens.shape[1:], model.vocab_size):
        raise ValueError(
            "true_conditionals must have shape (n, T, V) matching tokens (n, T)"
        )
    with torch.no_grad():
        logq = F.log_softmax(model.all_masked_logits(tokens).double(), dim=-1)
    return (p * (p.clamp_min(1e-300).log() - logq)).sum(-1).mean((1, 2))


class _Masked(nn.Module):
    """``(tokens, position) -> logits`` as one module, for ``torch.func``."""

    def __init__(self, model: EnsembleBert):
        super().__init__()
        self.m = model

    def forward(self, tokens, positions):
        return self.m.masked_logits(tokens, positions)


def _masked_inputs(model, tokens, positions):
    """The checked (sentence, masked position) pairs of the Fisher traces: the wrapped
    model that reads them, the pairs as one ``(n, T + 1)`` tensor, and ``T``."""
    _check_model(model)
    tokens = model.check_tokens(tokens)[0]
    if positions.shape != tokens.shape[:1]:
        raise ValueError("positions must have shape (n,) matching tokens (n, T)")
    inputs = torch.cat([tokens, positions[:, None]], dim=1)
    return _Masked(model), inputs, model.config.length


def bert_fisher_trace(
    model: EnsembleBert,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    *,
    generator: torch.Generator,
    blocks=bert_blocks,
) -> TraceEstimate:
    """Sampled-label estimate of :math:`\\operatorname{tr}\\nabla^2 L_{\\text{pre}}`,
    per block.

    One masked position per sentence (``positions``, ``(n,)``), one label drawn from the
    model for it; :func:`fmlab.theory.flatness.fisher_trace` per member
    (``per_group``), with the blocks ``encoder`` and ``head`` (:func:`bert_blocks`) or
    any other partition of the parameter names (``blocks``).
    """
    wrap, inputs, T = _masked_inputs(model, tokens, positions)
    params = {k: v.detach() for k, v in wrap.named_parameters()}

    def logits_fn(p, xp):
        return functional_call(wrap, p, (xp[:, :T], xp[:, T]))

    def log_prob(p, xp, y):  # one sentence and its position; labels y (E,)
        lg = functional_call(wrap, p, (xp[None, :T], xp[None, T]))[:, 0]
        return F.log_softmax(lg, dim=-1).gather(-1, y[:, None]).sum()

    return fisher_trace(
        log_prob,
        logits_fn,
        params,
        inputs,
        generator=generator,
        groups=model.n_models,
        blocks=blocks,
    )


def bert_log_fisher_trace(
    model: EnsembleBert,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    *,
    generator: torch.Generator,
) -> TraceEstimate:
    r"""The estimate of :func:`bert_fisher_trace` in logarithmic coordinates,
    :math:`\sum_i w_i^2\,\mathbb{E}[(\partial_{w_i}\log p_\theta)^2]`, per block and
    member: the trace of the Fisher after the change of variables
    :math:`w_i = w_i^{(0)} e^{u_i}`, at :math:`u = 0`. Unlike the plain trace it does
    not move under a rescaling of the weights that keeps the function (every
    :math:`w_i\to c_i w_i` with :math:`f_{c\odot w} = f_w`: the queries times
    :math:`c` and the keys divided by it, or the token and position embeddings times
    :math:`c` before a normalisation without gain), since
    :math:`c_i w_i\,\partial_{c_i w_i} = w_i\,\partial_{w_i}` there."""
    wrap, inputs, T = _masked_inputs(model, tokens, positions)
    base = {k: v.detach() for k, v in wrap.named_parameters()}
    zeros = {k: torch.zeros_like(v) for k, v in base.items()}

    def weights(u):
        return {k: base[k] * u[k].exp() for k in base}

    def logits_fn(u, xp):
        return functional_call(wrap, weights(u), (xp[:, :T], xp[:, T]))

    def log_prob(u, xp, y):
        lg = functional_call(wrap, weights(u), (xp[None, :T], xp[None, T]))[:, 0]
        return F.log_softmax(lg, dim=-1).gather(-1, y[:, None]).sum()

    return fisher_trace(
        log_prob,
        logits_fn,
        zeros,
        inputs,
        generator=generator,
        groups=model.n_models,
        blocks=bert_blocks,
    )


def head_trace_closed_form(
    model: EnsembleBert, tokens: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """The decoder's exact Fisher trace,
    :math:`\\mathbb{E}[(\\lVert\\phi\\rVert^2+1)\\sum_v p_v(1-p_v)]`.

    Over the given (sentence, masked position) pairs, per member: ``(E,)``. Exact (every
    label summed), from the predictions and the representation norms alone.
    """
    _check_model(model)
    tokens = model.check_tokens(tokens)
    E, n, T = tokens.shape
    with torch.no_grad():
        masked = tokens.scatter(
            2, positions.expand(E, n)[..., None], model.config.mask_id
        )
        phi = model.encode(masked)
        idx = positions.expand(E, n)[..., None, None].expand(-1, -1, 1, phi.shape[-1])
        at = torch.gather(phi, 2, idx)[:, :, 0]
        p = torch.softmax(model.decode(at).double(), dim=-1)
        at = at.double()
    return ((at.pow(2).sum(-1) + 1) * (p * (1 - p)).sum(-1)).mean(1)


def train_bert(
    model: EnsembleBert,
    language: HMMLanguage,
    *,
    steps: int,
    batch: int,
    lr: float,
    optimizer: str,
    generator: torch.Generator,
    warmup: int = 0,
    schedule: str = "cosine",
    decay_fraction: float = 0.25,
    every: int = 0,
    callback=None,
    desc: str = "training",
) -> None:
    """Train every member in place on fresh sentences, one masked position per sentence.

    ``schedule="cosine"``: a linear warm-up ramp over ``warmup`` steps times a cosine
    decay to 0 over the run (pretraining). ``schedule="constant-then-decay"``: the
    learning rate ``lr`` for the first ``1 - decay_fraction`` of the steps, then
    linearly down to 0 (continued SGD, so that every run ends on the manifold of
    minimisers rather than in its stationary oscillation around it; ``warmup`` is not
    used). Both are :func:`fmlab.train.lr_factor`, shapes ``"cosine"`` and
    ``"linear"``. ``batch`` sentences per member and step."""
    steps = check_int("steps", steps, minimum=0)
    batch = check_int("batch", batch, minimum=1)
    lr = check_float("lr", lr, minimum=0.0, strict_min=True)
    decay_fraction = check_float(
        "decay_fraction", decay_fraction, minimum=0.0, maximum=1.0
    )
    if schedule not in ("cosine", "constant-then-decay"):
        raise ValueError(
            f"schedule must be 'cosine' or 'constant-then-decay', got {schedule!r}"
        )
    flat = int(round(steps * (1 - decay_fraction)))

    def factor(s):
        if schedule == "cosine":
            return lr_factor(s, steps=steps, warmup=warmup, shape="cosine")
        return lr_factor(s, steps=steps, shape="linear", decay_start=flat)

    E, T = model.n_models, model.config.length
    device = next(model.parameters()).device  # batches drawn on the CPU, sent there

    def step_loss(s):
        tok, _ = language.sample(batch * E, generator)
        pos = torch.randint(0, T, (E, batch), generator=generator)
        tok, pos = tok.reshape(E, batch, T).to(device), pos.to(device)
        return masked_lm_nll(model, tok, pos).sum()

    train_scheduled(
        model,
        step_loss,
        steps=steps,
        lr=lr,
        optimizer=optimizer,
        lr_factor=factor,
        every=every,
        callback=callback,
        desc=desc,
    )


@dataclass(frozen=True)
class NoiseTransferConfig:
    """Everything that determines :func:`noise_transfer_experiment` (Chapter 5)."""

    language: HMMLanguageConfig = field(default_factory=HMMLanguageConfig)
    n_models: int = 3  # seeds, trained together as an ensemble
    seed: int = 0
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 2
    d_ff: int = 64
    # 1. pretraining to saturation (Adam, warmup + cosine)
    pretrain_steps: int = 2000
    pretrain_batch: int = 256
    pretrain_lr: float = 1e-2
    warmup: int = 100
    # 2. continued SGD from the saturated model, one run per learning rate, equal steps
    continue_steps: int = 1000
    continue_batch: int = 64
    continue_lrs: tuple = (0.03, 0.1, 0.3)
    decay_fraction: float = 0.25
    # evaluation
    position: int = 5  # the downstream task: block of the hidden state at this position
    probe_sizes: tuple = (50, 200, 1000, 3000)
    probe_ridge: float = 1e-2
    n_probe_test: int = 3000
    n_gap: int = 500
    n_trace: int = 1500
    version: int = 1

    def __post_init__(self):
        if not isinstance(self.language, HMMLanguageConfig):
            raise TypeError("language must be an HMMLanguageConfig")
        check_int("n_models", self.n_models, minimum=1)
        check_int(
            "position", self.position, minimum=0, maximum=self.language.length - 1
        )
        if not self.continue_lrs:
            raise ValueError("continue_lrs must name at least one learning rate")
        for lr in self.continue_lrs:
            check_float("continue_lrs", lr, minimum=0.0, strict_min=True)

    @property
    def noise_levels(self) -> tuple[float, ...]:
        """:math:`\\eta^2/B` of each continued run."""
        return tuple(lr**2 / self.continue_batch for lr in self.continue_lrs)


def noise_transfer_experiment(config: NoiseTransferConfig) -> dict:
    """Run the continued-SGD experiment of Chapter 5; returns a dict of tensors.

    Models, in order: the pretrained one, then one per entry of ``continue_lrs``. Keys:
    ``entropy``; ``bayes_accuracy``; ``pretrain_steps``/``pretrain_gap`` (the gap along
    pretraining, ``(k, E)``); for the models ``gap`` ``(M, E)``, ``trace`` (total),
    ``trace_encoder``, ``trace_head`` and their ``*_se`` ``(M, E)``,
    ``head_closed_form`` ``(M, E)``, the encoder's and decoder's traces in
    logarithmic coordinates ``trace_log_encoder``, ``trace_log_head``
    (:func:`bert_log_fisher_trace`, on the first third of the trace sentences) and
    ``accuracy`` ``(M, E, sizes)``; ``noise`` (the
    :math:`\\eta^2/B` of each continued run); ``n_params``; and
    ``head_language_constant``, :math:`(d+1)\\,\\mathbb{E}[1-\\lVert p^\\star\\rVert^2]`
    over the same (sentence, position) pairs: the decoder's trace of any saturated
    model."""
    if not isinstance(config, NoiseTransferConfig):
        raise TypeError(
            f"config must be a NoiseTransferConfig, got {type(config).__name__}"
        )
    with single_threaded():
        return _noise_transfer_experiment(config)


def _evaluation_sets(c) -> dict:
    """The fixed sentences every model of a run is measured on (the same seeds in every
    run, so models are compared on the same data); ``c`` is a
    :class:`NoiseTransferConfig` or a :class:`WidthSweepConfig`."""
    lang = HMMLanguage(c.language)
    S, T = c.language.states_per_block, c.language.length
    gap_tok, _ = lang.sample(c.n_gap, make_generator(11_001))
    trace_tok, _ = lang.sample(c.n_trace, make_generator(11_002))
    trace_pos = torch.randint(0, T, (c.n_trace,), generator=make_generator(11_005))
    tr_tok, tr_h = lang.sample(max(c.probe_sizes), make_generator(11_003))
    te_tok, te_h = lang.sample(c.n_probe_test, make_generator(11_004))
    return {
        "language": lang,
        "gap": (gap_tok, lang.masked_conditionals(gap_tok)),
        "trace": (trace_tok, trace_pos),
        "train": (tr_tok, tr_h[:, c.position] // S),
        "test": (te_tok, te_h[:, c.position] // S),
    }


def _evaluate(model: EnsembleBert, sets: dict, c, label_seed: int) -> dict:
    """Every member's KL gap, Fisher trace (total and per block, with standard errors),
    the decoder's closed form, and the probe's block accuracy at every probe size."""
    (tr_tok, ytr), (te_tok, yte) = sets["train"], sets["test"]
    trace_tok, trace_pos = sets["trace"]
    with torch.no_grad():
        ftr = model.features(tr_tok).flatten(2).double()
        fte = model.features(te_tok).flatten(2).double()
    tr = bert_fisher_trace(
        model, trace_tok, trace_pos, generator=make_generator(label_seed)
    )
    K = c.language.n_blocks
    out = {
        "gap": bert_kl_gap(model, *sets["gap"]),
        "trace": tr.per_group.double(),
        "trace_se": tr.per_group_stderr.double(),
        "head_closed_form": head_trace_closed_form(model, trace_tok, trace_pos),
        "accuracy": torch.stack(
            [
                ridge_probe_curve(
                    ftr[e], ytr, fte[e], yte, K, c.probe_sizes, c.probe_ridge
                )
                for e in range(model.n_models)
            ]
        ),
    }
    for block, est in tr.per_block.items():
        out[f"trace_{block}"] = est.per_group.double()
        out[f"trace_{block}_se"] = est.per_group_stderr.double()
    return out


def _noise_transfer_experiment(config: NoiseTransferConfig) -> dict:
    c = config
    sets = _evaluation_sets(c)
    lang, T = sets["language"], c.language.length
    gap_tok, gap_cond = sets["gap"]
    trace_tok, trace_pos = sets["trace"]
    te_tok = sets["test"][0]

    def evaluate(model, label_seed):
        out = _evaluate(model, sets, c, label_seed)
        logtr = bert_log_fisher_trace(  # on the first third of the trace sentences
            model,
            trace_tok[: c.n_trace // 3],
            trace_pos[: c.n_trace // 3],
            generator=make_generator(label_seed),
        )
        for block, est in logtr.per_block.items():
            out[f"trace_log_{block}"] = est.per_group.double()
        return out

    out: dict = {}
    ent, ent_se = lang.optimal_mlm_loss()
    out["entropy"] = torch.tensor([ent, ent_se])
    out["bayes_accuracy"] = torch.tensor(
        float(lang.block_posterior(te_tok)[:, c.position].max(-1).values.mean())
    )
    bcfg = BertConfig(
        c.language.vocab_size,
        T,
        d_model=c.d_model,
        n_layers=c.n_layers,
        n_heads=c.n_heads,
        d_ff=c.d_ff,
    )
    model = EnsembleBert(bcfg, n_models=c.n_models, generator=make_generator(c.seed))
    out["n_params"] = torch.tensor(model.n_params())
    steps, gaps = [], []

    def log_gap(step):
        steps.append(step)
        gaps.append(bert_kl_gap(model, gap_tok[:200], gap_cond[:200]))

    train_bert(
        model,
        lang,
        steps=c.pretrain_steps,
        batch=c.pretrain_batch,
        lr=c.pretrain_lr,
        optimizer="adam",
        warmup=c.warmup,
        generator=make_generator(c.seed + 1),
        every=max(1, c.pretrain_steps // 12),
        callback=log_gap,
        desc="pretraining (transformer)",
    )
    out["pretrain_steps"] = torch.tensor(steps)
    out["pretrain_gap"] = torch.stack(gaps)
    records = [evaluate(model, 21_000)]
    for i, lr in enumerate(c.continue_lrs):
        m = copy.deepcopy(model)
        train_bert(
            m,
            lang,
            steps=c.continue_steps,
            batch=c.continue_batch,
            lr=lr,
            optimizer="sgd",
            schedule="constant-then-decay",
            decay_fraction=c.decay_fraction,
            generator=make_generator(c.seed + 2),
            desc=f"continued SGD, lr {lr}",
        )
        records.append(evaluate(m, 21_001 + i))
    for key in records[0]:
        out[key] = torch.stack([r[key] for r in records])
    out["noise"] = torch.tensor(c.noise_levels, dtype=torch.float64)
    p_star = lang.masked_conditionals(trace_tok)[torch.arange(c.n_trace), trace_pos]
    out["head_language_constant"] = (c.d_model + 1) * (1 - p_star.pow(2).sum(-1)).mean()
    return out


def noise_transfer(config: NoiseTransferConfig) -> dict:
    """:func:`noise_transfer_experiment`: the stored run
    (:func:`noise_transfer_results`) when ``config`` is the stored one and the seed
    offset is 0, else computed and cached on disk (:func:`fmlab.cached`)."""
    if not isinstance(config, NoiseTransferConfig):
        raise TypeError(
            f"config must be a NoiseTransferConfig, got {type(config).__name__}"
        )
    if seed_offset() == 0 and NOISE_TRANSFER_RESULTS.is_file():
        record = stored.read(NOISE_TRANSFER_RESULTS)["meta"]["config"]
        if noise_transfer_config(record) == config:
            return noise_transfer_results()[1]
    return cached(config, lambda: noise_transfer_experiment(config), name="ch05_noise")


# -- the page's run, stored (fmlab.stored) -------------------------------------------

NOISE_TRANSFER_RESULTS = Path(__file__).parent / "results" / "ch5_noise_transfer.json"
NOISE_TRANSFER_SCRIPT = "scripts/ch5_noise_transfer.py"

#: The slice of the stored run that the tests rerun (under another rounding path than
#: the record's, :func:`fmlab.stored.other_rounding`): the whole experiment, three
#: seeds, with 24 pretraining and 12 continued steps a rate and small evaluation sets;
#: about two seconds on one core.
NOISE_TRANSFER_SLICE = dict(
    pretrain_steps=24,
    pretrain_batch=32,
    warmup=4,
    continue_steps=12,
    continue_batch=16,
    n_gap=30,
    n_trace=30,
    probe_sizes=(20, 60),
    n_probe_test=100,
)
# the per-seed quantities a rerun is compared on (seeds first: (E, models, ...))
_NOISE_CHECKED_FIELDS = (
    "gap",
    "accuracy",
    "trace_encoder",
    "trace_head",
    "trace_log_encoder",
)


def noise_transfer_config(record: dict) -> NoiseTransferConfig:
    """The :class:`NoiseTransferConfig` recorded as data in a results file."""
    cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
    cfg["language"] = HMMLanguageConfig(**cfg["language"])
    return NoiseTransferConfig(**cfg)


def noise_transfer_sources() -> list:
    """The package code that produces the stored run, for its fingerprint
    (:mod:`fmlab.stored`): the experiment and its measurements, the training loop, the
    model, the language, the traces and the probe (the script's settings are in the
    file as its config). The analysis functions that read the run are not among
    them."""
    from ..adapt.probes import (
        _ridge_head,
        _ridge_probe_accuracy,
        _ridge_probe_inputs,
        ridge_probe_accuracy,
    )
    from ..data import hmm_language
    from ..models import bert
    from ..repro import _splitmix64, effective_seed
    from ..theory import flatness

    return [
        NoiseTransferConfig,
        noise_transfer_experiment,
        _noise_transfer_experiment,
        noise_transfer_config,
        noise_transfer_slice,
        _evaluation_sets,
        _evaluate,
        train_bert,
        train_scheduled,
        lr_factor,
        bert_kl_gap,
        bert_fisher_trace,
        bert_blocks,  # which weights are the head, which the encoder
        bert_log_fisher_trace,
        _masked_inputs,
        _Masked,
        head_trace_closed_form,
        ridge_probe_curve,
        ridge_probe_accuracy,
        _ridge_probe_inputs,
        _ridge_probe_accuracy,
        _ridge_head,
        make_generator,
        effective_seed,
        _splitmix64,  # effective_seed's mixer
        single_threaded,
        bert,
        hmm_language,
        flatness,
    ]


def noise_transfer_results(
    path: Path | str | None = None,
) -> tuple[NoiseTransferConfig, dict]:
    """The stored run (``scripts/ch5_noise_transfer.py``): its configuration and the
    result of :func:`noise_transfer_experiment`, with the file's ``"stored"`` record
    (and the run's ``"wall_seconds"``) under ``"stored"``. Raises
    :class:`fmlab.stored.StaleResults`, naming the script, when the code that produced
    it has changed since (:func:`noise_transfer_sources`)."""
    data = stored.load(
        NOISE_TRANSFER_RESULTS if path is None else path,
        script=NOISE_TRANSFER_SCRIPT,
        sources=noise_transfer_sources(),
        hint=(
            " (about 4 core-minutes); or, for a change that cannot move its numbers, "
            f"python {NOISE_TRANSFER_SCRIPT} --restamp, which reruns it and records "
            "the new fingerprint only if the rerun reproduces the record"
        ),
    )
    result = stored.decode_tensors(data["result"])
    result["stored"] = {**data["stored"], "wall_seconds": data["meta"]["wall_seconds"]}
    return noise_transfer_config(data["meta"]["config"]), result


def _noise_checked(result: dict) -> dict:
    """The quantities a rerun is compared on, seeds first, as plain lists."""
    return {k: result[k].transpose(0, 1).tolist() for k in _NOISE_CHECKED_FIELDS}


def noise_transfer_slice(record: dict | None = None) -> dict:
    """Run the slice (the config ``record``, by default the page's configuration, the
    defaults, with :data:`NOISE_TRANSFER_SLICE`): per seed, every model's gap, probe
    accuracies and traces, the quantities that :func:`fmlab.stored.compare_runs`
    compares."""
    if record is None:
        config = replace(NoiseTransferConfig(), **NOISE_TRANSFER_SLICE)
    else:
        config = noise_transfer_config(record)
    return _noise_checked(noise_transfer_experiment(config))


def noise_transfer_job_check(path: Path | str | None = None) -> dict:
    """A script's ``--restamp`` check: rerun the stored run at ``path`` whole (about 4
    minutes on one core) with today's code and compare it with the record
    (:func:`fmlab.stored.compare_runs`, per seed). Reads the file without checking its
    fingerprint."""
    data = stored.read(NOISE_TRANSFER_RESULTS if path is None else path)
    record = stored.decode_tensors(data["result"])
    rerun = noise_transfer_experiment(noise_transfer_config(data["meta"]["config"]))
    return stored.compare_runs(_noise_checked(record), _noise_checked(rerun))


def trace_transfer_rank_correlation(result: dict) -> torch.Tensor:
    """Per seed, the Spearman rank correlation across the models of
    :func:`noise_transfer_experiment` (pretrained and continued) between the total
    trace and the probe accuracy at the largest probe size: ``(E,)``."""
    tr, acc = result["trace"], result["accuracy"]
    return torch.tensor(
        [spearman(tr[:, e], acc[:, e, -1].double()) for e in range(tr.shape[1])]
    )


# -- model size at equal loss --------------------------------------------------------


@dataclass(frozen=True)
class WidthSweepConfig:
    """Everything that determines one run of :func:`width_sweep_run` (Chapter 5).

    The transformer of :class:`NoiseTransferConfig` at several widths ``d_model`` (two
    layers, two heads, ``d_ff = 2 d``), pretrained with the same Adam schedule on the
    language with **untied** emissions, where the exact conditionals carry the block
    (the look-up table's probe reads it nearly as well as the Bayes predictor), so that
    a wider model has something to gain that the loss does not already show.
    """

    language: HMMLanguageConfig = field(
        default_factory=lambda: HMMLanguageConfig(tied=False)
    )
    widths: tuple = (16, 32, 64, 128)
    n_layers: int = 2
    n_heads: int = 2
    ff_multiple: int = 2
    pretrain_steps: int = 2000
    pretrain_batch: int = 256
    pretrain_lr: float = 1e-2
    warmup: int = 100
    position: int = 5
    probe_sizes: tuple = (50, 200, 1000, 3000)
    probe_ridge: float = 1e-2
    n_probe_test: int = 3000
    n_gap: int = 500
    n_trace: int = 1500
    tolerance: float = 0.01  # nats: models whose mean gaps differ by less are "equal"

    def __post_init__(self):
        if not isinstance(self.language, HMMLanguageConfig):
            raise TypeError("language must be an HMMLanguageConfig")
        if not self.widths:
            raise ValueError("widths must name at least one width")
        for w in self.widths:
            check_int("widths", w, minimum=self.n_heads)
            if w % self.n_heads:
                raise ValueError(f"widths: {w} is not a multiple of n_heads")
        check_int(
            "position", self.position, minimum=0, maximum=self.language.length - 1
        )
        check_float("tolerance", self.tolerance, minimum=0.0, strict_min=True)


def width_sweep_run(
    config: WidthSweepConfig, width: int, seed: int, n_models: int, device="cpu"
) -> dict:
    """Pretrain ``n_models`` transformers of width ``width`` as one ensemble (initial
    weights from ``make_generator(seed)``, data from ``seed + 1``) and measure, per
    member: the KL gap to the optimal loss (nats), the probe's block accuracy at every
    probe size, the Fisher trace per parameter block, and the same traces after
    embedding the member at the largest width (:func:`fmlab.models.bert.embed_width`),
    with the largest logit change that embedding made. Plain lists, for JSON.

    ``device`` (e.g. ``"cuda"``) is where the ensemble trains; its batches are still
    drawn by the CPU generators, so a seed gives the same data on every device, and
    the trained ensemble is measured on the CPU."""
    if not isinstance(config, WidthSweepConfig):
        raise TypeError(
            f"config must be a WidthSweepConfig, got {type(config).__name__}"
        )
    if width not in config.widths:
        raise ValueError(f"width: {width} is not one of config.widths {config.widths}")
    check_int("n_models", n_models, minimum=1)
    c = config
    with single_threaded():
        sets = _evaluation_sets(c)
        lang, T = sets["language"], c.language.length
        bcfg = BertConfig(
            c.language.vocab_size,
            T,
            d_model=width,
            n_layers=c.n_layers,
            n_heads=c.n_heads,
            d_ff=c.ff_multiple * width,
        )
        model = EnsembleBert(bcfg, n_models=n_models, generator=make_generator(seed))
        model.to(device)
        train_bert(
            model,
            lang,
            steps=c.pretrain_steps,
            batch=c.pretrain_batch,
            lr=c.pretrain_lr,
            optimizer="adam",
            warmup=c.warmup,
            generator=make_generator(seed + 1),
            desc=f"width {width}",
        )
        model.to("cpu")
        ev = _evaluate(model, sets, c, 21_000)
        if width < max(c.widths):
            ev |= _embedded_traces(model, max(c.widths), sets, 21_000)
        else:  # already at the largest width: the embedding is the identity
            ev |= {f"trace_embedded_{b}": ev[f"trace_{b}"] for b in ("encoder", "head")}
            ev["embedding_error"] = torch.zeros(n_models, dtype=torch.float64)
    te_tok = sets["test"][0]
    return {
        "width": width,
        "seed": seed,
        "n_params": model.n_params(),
        "bayes_accuracy": float(
            lang.block_posterior(te_tok)[:, c.position].max(-1).values.mean()
        ),
    } | {name: ev[name].tolist() for name in _SWEEP_FIELDS}


_SWEEP_FIELDS = (
    "gap",
    "accuracy",
    "trace",
    "trace_encoder",
    "trace_head",
    "trace_embedded_encoder",
    "trace_embedded_head",
    "embedding_error",
)


def _embedded_traces(model: EnsembleBert, width: int, sets: dict, label_seed: int):
    """Fisher traces per block of every member embedded at ``width`` by
    :func:`fmlab.models.bert.embed_width` (the same sentences, positions and label seed
    as :func:`_evaluate`), and the largest change of a logit the embedding made on those
    sentences, per member."""
    trace_tok, trace_pos = sets["trace"]
    big = embed_width(model, width)
    with torch.no_grad():
        before = model.masked_logits(trace_tok, trace_pos)
        error = (big.masked_logits(trace_tok, trace_pos) - before).abs().amax((1, 2))
    tr = bert_fisher_trace(
        big, trace_tok, trace_pos, generator=make_generator(label_seed)
    )
    return {
        f"trace_embedded_{block}": est.per_group.double()
        for block, est in tr.per_block.items()
    } | {"embedding_error": error.double()}


WIDTH_SWEEP_RESULTS = Path(__file__).parent / "results" / "ch5_width_sweep.json"
WIDTH_SWEEP_SCRIPT = "scripts/ch5_width_sweep.py"


def width_sweep_sources() -> list:
    """The package code that produces the stored width sweep, for its fingerprint
    (:mod:`fmlab.stored`): the run and its measurements, the training loop, the model,
    the language, the traces and the probe (the script's settings are in the file as
    its config). The analysis functions that read the sweep are not among them."""
    from ..adapt.probes import (
        _ridge_head,
        _ridge_probe_accuracy,
        _ridge_probe_inputs,
        ridge_probe_accuracy,
    )
    from ..data import hmm_language
    from ..models import bert
    from ..repro import _splitmix64, effective_seed
    from ..theory import flatness
    from ..train import train_scheduled

    return [
        WidthSweepConfig,
        width_sweep_run,
        width_sweep_slice,
        _evaluation_sets,
        _evaluate,
        _embedded_traces,
        train_bert,
        train_scheduled,
        lr_factor,
        bert_kl_gap,
        bert_fisher_trace,
        bert_blocks,  # which weights are the head, which the encoder
        _masked_inputs,
        _Masked,
        head_trace_closed_form,
        ridge_probe_curve,
        ridge_probe_accuracy,
        _ridge_probe_inputs,
        _ridge_probe_accuracy,
        _ridge_head,
        make_generator,
        effective_seed,
        _splitmix64,  # effective_seed's mixer
        bert,
        hmm_language,
        flatness,
    ]


def width_sweep_results(path: Path | str | None = None) -> dict:
    """The stored width sweep (``scripts/ch5_width_sweep.py``), grouped by
    ``(width, learning rate)``: per group the members' ``gap`` ``(seeds,)``,
    ``accuracy`` ``(seeds, probe sizes)``, ``trace_encoder``, ``trace_head``, the same
    traces of the members embedded at the largest width (``trace_embedded_encoder``,
    ``trace_embedded_head``) with the ``embedding_error`` (largest logit change), the
    jobs' ``seconds`` and ``n_params``; ``"meta"`` holds the sweep's configuration and
    the machine it ran on, and under ``"stored"`` the code's fingerprint. Raises
    :class:`fmlab.stored.StaleResults`, naming the script to rerun, when
    the code that produced the file has changed since (:func:`width_sweep_sources`)."""
    path = Path(WIDTH_SWEEP_RESULTS if path is None else path)
    data = stored.load(
        path,
        script=WIDTH_SWEEP_SCRIPT,
        sources=width_sweep_sources(),
        hint=(
            " (about 112 core-minutes); or, for a change that cannot move its numbers, "
            f"python {WIDTH_SWEEP_SCRIPT} --restamp, which reruns one job and records "
            "the new fingerprint only if that job reproduces"
        ),
    )
    groups: dict = {}
    for run in data["runs"]:
        g = groups.setdefault(
            (run["width"], run["lr"]),
            {"n_params": run["n_params"], "bayes_accuracy": run["bayes_accuracy"]},
        )
        for name in _SWEEP_FIELDS:
            g.setdefault(name, []).extend(run[name])
        g.setdefault("seconds", []).append(run["seconds"])
    out: dict = {"meta": data["meta"] | {"stored": data["stored"]}}
    for key, g in sorted(groups.items()):
        out[key] = {
            k: torch.tensor(v, dtype=torch.float64) if isinstance(v, list) else v
            for k, v in g.items()
        }
    return out


#: The slice of the stored sweep that the tests rerun (under another rounding path
#: than the record's, :func:`fmlab.stored.other_rounding`): three models of the
#: smallest width for 100 steps (a 50-step warm-up), embedded at width 32, with
#: smaller evaluation sets; seconds on one core.
WIDTH_SWEEP_SLICE = dict(
    widths=(16, 32),
    pretrain_steps=50,
    warmup=25,
    pretrain_batch=128,
    probe_sizes=(100, 500),
    n_probe_test=500,
    n_gap=300,
    n_trace=100,
)
# the per-replicate quantities a rerun is compared on
_CHECKED_FIELDS = (
    "gap",
    "accuracy",
    "trace_encoder",
    "trace_head",
    "trace_embedded_encoder",
    "trace_embedded_head",
)


def width_sweep_config(record: dict) -> WidthSweepConfig:
    """The :class:`WidthSweepConfig` recorded as data in a results file."""
    cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
    cfg["language"] = HMMLanguageConfig(**cfg["language"])
    return WidthSweepConfig(**cfg)


def width_sweep_slice(record: dict | None = None, device="cpu") -> dict:
    """Run the slice (the config ``record``, by default :data:`WIDTH_SWEEP_SLICE` over
    the defaults) at its smallest width, three models from the script's seed for
    chunk 0: the per-replicate quantities that :func:`fmlab.stored.compare_runs`
    compares."""
    if record is None:
        config = WidthSweepConfig(**WIDTH_SWEEP_SLICE)
    else:
        config = width_sweep_config(record)
    w = min(config.widths)
    out = width_sweep_run(config, w, 1000 + w, 3, device=device)
    return {k: out[k] for k in _CHECKED_FIELDS}


def width_sweep_job_check(
    path: Path | str | None = None, width: int = 32, lr: float = 0.01, chunk: int = 0
) -> dict:
    """A script's ``--restamp`` check: rerun one job of the stored sweep (by default
    width 32 at learning rate 0.01, chunk 0: three models, 2000 Adam steps, about
    2 min on one core; the script's seed ``1000 * (chunk + 1) + width``) and compare it
    with its record (:func:`fmlab.stored.compare_runs`). Reads the file without
    checking its fingerprint."""
    data = stored.read(WIDTH_SWEEP_RESULTS if path is None else path)
    (run,) = [
        r
        for r in data["runs"]
        if r["width"] == width and r["lr"] == lr and r["chunk"] == chunk
    ]
    config = replace(width_sweep_config(data["meta"]["config"]), pretrain_lr=lr)
    out = width_sweep_run(config, width, 1000 * (chunk + 1) + width, len(run["gap"]))
    return stored.compare_runs(
        {k: run[k] for k in _CHECKED_FIELDS}, {k: out[k] for k in _CHECKED_FIELDS}
    )


def width_sweep_compared(results: dict, tolerance: float) -> list[tuple[int, float]]:
    """The ``(width, lr)`` groups the chapter compares, by width: for every width the
    learning rate whose models end closest to the optimal loss (smallest mean gap),
    kept if that mean gap is within ``tolerance`` nats of the smallest one (so the kept
    widths are at equal loss, and a width that does not reach it is left out)."""
    check_float("tolerance", tolerance, minimum=0.0, strict_min=True)
    best: dict = {}
    for key, g in results.items():
        if key == "meta":
            continue
        width, _ = key
        if width not in best or g["gap"].mean() < results[best[width]]["gap"].mean():
            best[width] = key
    lowest = min(float(results[k]["gap"].mean()) for k in best.values())
    return [
        best[w]
        for w in sorted(best)
        if float(results[best[w]]["gap"].mean()) - lowest < tolerance
    ]


def width_sweep_equal_loss(results: dict, tolerance: float) -> list[tuple[int, float]]:
    """Every ``(width, lr)`` group of the sweep whose mean gap is within ``tolerance``
    nats of the smallest mean gap of any group: the models at equal loss, whatever
    their learning rate (the compared groups of :func:`width_sweep_compared` are
    among them)."""
    check_float("tolerance", tolerance, minimum=0.0, strict_min=True)
    keys = [k for k in results if k != "meta"]
    lowest = min(float(results[k]["gap"].mean()) for k in keys)
    return sorted(
        k for k in keys if float(results[k]["gap"].mean()) - lowest < tolerance
    )


def width_lr_pairs(groups) -> list[tuple[tuple[int, float], tuple[int, float]]]:
    """For every width with at least two learning rates among ``groups`` (``(width,
    lr)`` keys), the pair ``(largest-rate key, smallest-rate key)``, by width. The
    sweep's members with the same index share their initialisation and data across
    rates (their seed depends on the width and the job only), so the pair compares the
    learning rate alone."""
    rates: dict = {}
    for width, lr in groups:
        rates.setdefault(width, []).append(lr)
    return [
        ((w, max(lrs)), (w, min(lrs)))
        for w, lrs in sorted(rates.items())
        if len(lrs) > 1
    ]


def width_trace_transfer_rank(
    results: dict, groups, block: str = "encoder"
) -> dict[str, object]:
    """Spearman rank correlation between the trace of the models embedded at the
    largest width and the probe's accuracy at the largest probe size, over the
    ``(width, lr)`` groups ``groups``: ``"per_replicate"`` ``(seeds,)``, replicate ``i``
    being the ``i``-th model of every group, and ``"pooled"`` over every model of the
    groups. ``block`` is ``"encoder"``, ``"head"`` or ``"total"`` (their sum)."""
    if block not in ("encoder", "head", "total"):
        raise ValueError(f"block must be 'encoder', 'head' or 'total', got {block!r}")
    if len(groups) < 2:
        raise ValueError(f"groups must name at least two groups, got {groups!r}")

    def trace(g):
        if block == "total":
            return g["trace_embedded_encoder"] + g["trace_embedded_head"]
        return g[f"trace_embedded_{block}"]

    tr = torch.stack([trace(results[k]) for k in groups])  # (groups, seeds)
    acc = torch.stack([results[k]["accuracy"][:, -1] for k in groups]).double()
    per = torch.tensor([spearman(tr[:, i], acc[:, i]) for i in range(tr.shape[1])])
    return {"per_replicate": per, "pooled": spearman(tr.flatten(), acc.flatten())}


# -- flatness against transfer within one family, with the gap held fixed -----------


def partial_rank_correlation(x, y, z) -> float:
    """Spearman's partial correlation of ``x`` and ``y`` given ``z`` (1-d, the same
    length, at least 4): the correlation of the ranks of ``x`` and ``y`` after a
    least-squares line in the ranks of ``z`` is taken out of each. Near zero when ``x``
    and ``y`` move together only because both move with ``z``. Tied values share their
    average rank, so the result does not depend on how a sort orders ties."""
    x, y, z = (torch.as_tensor(v, dtype=torch.float64).flatten() for v in (x, y, z))
    if not (x.shape == y.shape == z.shape) or x.numel() < 4:
        raise ValueError("x, y and z must have the same length, at least 4")

    def ranks(v):  # average ranks for ties, as Spearman's correlation defines them
        from scipy.stats import rankdata

        return torch.from_numpy(rankdata(v.numpy())).double()

    Z = torch.stack([torch.ones_like(z), ranks(z)], 1)

    def residual(v):
        r = ranks(v)
        return r - Z @ torch.linalg.lstsq(Z, r[:, None]).solution[:, 0]

    rx, ry = residual(x), residual(y)
    # a residual at rounding level means z's ranks explain that variable's exactly:
    # the correlation is undefined, not the correlation of two rounding errors (which
    # would change from one execution to the next)
    tiny = 1e-9 * x.numel()
    if rx.norm() <= tiny or ry.norm() <= tiny:
        return 0.0
    return float(rx @ ry / (rx.norm() * ry.norm()))


def width_family_flatness(
    results: dict,
    tolerance: float,
    trace: str = "trace_embedded_encoder",
    n_boot: int = 400,
) -> dict:
    """Flatness against transfer within one family of the stored width sweep: for every
    learning rate with at least two widths among the groups at equal loss
    (:func:`width_sweep_equal_loss`), over those models (every width, every seed), the
    Spearman correlation of ``trace`` with the probe's accuracy at the largest probe
    size, and the partial one given the gap (:func:`partial_rank_correlation`), each
    with a standard error from ``n_boot`` resamplings of the replicates (the ``i``-th
    model of every width moves as one). ``{lr: {"groups", "n", "rank", "rank_se",
    "partial", "partial_se", "gap_rank"}}``, ``gap_rank`` being the gap's own
    correlation with the accuracy. Never pools two learning rates."""
    check_int("n_boot", n_boot, minimum=2)
    equal = width_sweep_equal_loss(results, tolerance)
    out: dict = {}
    for lr in sorted({k[1] for k in equal}):
        keys = [k for k in equal if k[1] == lr]
        if len(keys) < 2:
            continue
        tr = torch.stack([results[k][trace] for k in keys])  # (widths, seeds)
        acc = torch.stack([results[k]["accuracy"][:, -1] for k in keys]).double()
        gap = torch.stack([results[k]["gap"] for k in keys])

        def stats(idx):
            t, a, g = tr[:, idx].flatten(), acc[:, idx].flatten(), gap[:, idx].flatten()
            return spearman(t, a), partial_rank_correlation(t, a, g)

        n_rep = tr.shape[1]
        rank, partial = stats(torch.arange(n_rep))
        gen = torch.Generator().manual_seed(5)
        boot = torch.tensor(
            [
                stats(torch.randint(0, n_rep, (n_rep,), generator=gen))
                for _ in range(n_boot)
            ]
        )
        out[lr] = {
            "groups": keys,
            "n": tr.numel(),
            "rank": rank,
            "rank_se": float(boot[:, 0].std()),
            "partial": partial,
            "partial_se": float(boot[:, 1].std()),
            "gap_rank": spearman(gap.flatten(), acc.flatten()),
        }
    return out


def noise_family_flatness(result: dict, trace: str) -> dict[str, torch.Tensor]:
    """Within each seed of :func:`noise_transfer_experiment` (one family: a pretrained
    model and its continuations), across its models: the Spearman correlation of
    ``trace`` (e.g. ``"trace_encoder"`` or ``"trace_log_encoder"``) with the probe's
    accuracy at the largest probe size, and the partial one given the gap. ``{"rank",
    "partial"}``, each ``(E,)``."""
    tr, acc, gap = result[trace], result["accuracy"][..., -1].double(), result["gap"]
    E = tr.shape[1]
    return {
        "rank": torch.tensor([spearman(tr[:, e], acc[:, e]) for e in range(E)]),
        "partial": torch.tensor(
            [partial_rank_correlation(tr[:, e], acc[:, e], gap[:, e]) for e in range(E)]
        ),
    }
