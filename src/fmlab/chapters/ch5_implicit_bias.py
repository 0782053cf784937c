"""Same pretraining loss, different downstream: the experiment of Chapter 5.

Used in Chapter 5 (``notebooks/05-implicit-bias.ipynb``). The pieces:

* the language: :class:`fmlab.data.hmm_language.HMMLanguage`, whose masked-token
  conditionals :math:`p^\\star(\\cdot \\mid x_{-t})` are exact, so the pretraining loss
  of a model splits into the entropy (the optimum) plus a KL *gap* (:func:`kl_gap`);
* the model: an ensemble of bidirectional-GRU masked LMs
  (:class:`fmlab.models.masked_lm.BiGRUMaskedLM`), one member per seed;
* flatness: the trace of the Hessian of the masked-LM loss by the sampled-label (Fisher)
  estimator (:func:`mlm_fisher_trace`), by Hutchinson's estimator on the true-label loss
  (:func:`mlm_hutchinson_trace`), and the trace of the covariance of the single-mask
  stochastic gradient (:func:`mlm_gradient_covariance_trace`) for the Bartlett identity;
* transfer: a ridge linear probe on the concatenated contextual representations that
  predicts the *block* of the hidden state at one position
  (:func:`fmlab.adapt.probes.ridge_probe_accuracy`), and the same probe on the exact
  conditional probabilities (the "look-up table");
* three ways to reach (nearly) the same pretraining loss: Adam pretraining, continued
  SGD after convergence, and an adversarial meta-learning objective
  (:func:`adversarial_probe_loss`) that keeps the loss and spoils linear transfer.

:func:`same_loss_experiment` runs all of it for one config and returns plain tensors
(cached on disk by the notebook through :func:`fmlab.cached`).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from .. import stored
from .._validate import check_float, check_int, check_tensor
from ..adapt.probes import ridge_probe_accuracy, ridge_probe_curve
from ..data.hmm_language import HMMLanguage, HMMLanguageConfig
from ..models.masked_lm import BiGRUMaskedLM, masked_lm_loss
from ..repro import make_generator, seed_offset, single_threaded
from ..theory import flatness
from ..theory.decomposition import spearman
from ..theory.flatness import TraceEstimate, fisher_trace, hutchinson_trace
from ..train import cached, lr_factor, train_scheduled

__all__ = [
    "GRU_BLOCKS",
    "SameLossConfig",
    "kl_gap",
    "mlm_fisher_trace",
    "mlm_hutchinson_trace",
    "mlm_gradient_covariance_trace",
    "adversarial_probe_loss",
    "lookup_table_transfer",
    "block_trace_comparison",
    "train_phase",
    "same_loss_experiment",
    "same_loss_run",
    "same_loss_results",
    "same_loss_slice",
    "same_loss_job_check",
    "same_loss_config",
    "same_loss_sources",
    "SAME_LOSS_RESULTS",
    "SAME_LOSS_SCRIPT",
    "SAME_LOSS_SLICE",
    "equal_loss_models",
    "equal_loss_rank_correlation",
    "LookupConfig",
    "lookup_tables",
    "state_task_accuracy",
    "single_threaded",
]


# ---------------------------------------------------------------------------------
# the loss gap
# ---------------------------------------------------------------------------------
def kl_gap(
    model: BiGRUMaskedLM, tokens: torch.Tensor, true_conditionals: torch.Tensor
) -> torch.Tensor:
    """:math:`\\mathbb{E}_{x,t}\\,\\mathrm{KL}(p^\\star(\\cdot\\mid
    x_{-t})\\,\\|\\,p_\\theta(\\cdot\\mid x_{-t}))` for each member: ``(E,)``.

    The masked-LM loss of a member is the entropy of the language plus this gap, so it
    is the excess pretraining loss, measured without the sampling noise of the tokens.
    ``true_conditionals`` are ``language.masked_conditionals(tokens)``, ``(n, T, V)``.
    """
    tokens = model.check_tokens(tokens)
    p = check_tensor(
        "true_conditionals", true_conditionals, ndim=3, floating=True
    ).double()
    if (
        tokens.ndim != 3
        or p.shape[:2] != tokens.shape[1:]
        or p.shape[2] != model.vocab_size
    ):
        raise ValueError(
            "true_conditionals must have shape (n, T, V) matching tokens (n, T)"
        )
    with torch.no_grad():
        logq = F.log_softmax(model(tokens).double(), dim=-1)
    return (p * (p.clamp_min(1e-300).log() - logq)).sum(-1).mean((1, 2))


# ---------------------------------------------------------------------------------
# flatness of the masked-LM loss
# ---------------------------------------------------------------------------------
#: the parameter blocks of a :class:`BiGRUMaskedLM`: the recurrent encoder, whose states
#: the downstream probe reads, and the output MLP ("head"), which the probe never reads
GRU_BLOCKS = {
    "encoder": ("emb", "rec", "rec_bias", "h0"),
    "head": ("w1", "b1", "w2", "b2"),
}


def _per_position(est: TraceEstimate, T: int) -> TraceEstimate:
    """Divide an estimate (and its blocks) by the number of masked positions ``T``."""
    blocks = (
        None
        if est.per_block is None
        else {b: _per_position(e, T) for b, e in est.per_block.items()}
    )
    return TraceEstimate(
        est.value / T,
        est.stderr / T,
        est.n,
        None if est.per_group is None else est.per_group / T,
        None if est.per_group_stderr is None else est.per_group_stderr / T,
        blocks,
    )


def _params(model):
    return {k: v.detach() for k, v in model.named_parameters()}


def mlm_fisher_trace(
    model: BiGRUMaskedLM,
    tokens: torch.Tensor,
    *,
    n_labels: int = 1,
    generator: torch.Generator | None = None,
    blocks=None,
) -> TraceEstimate:
    """Sampled-label estimate of :math:`\\operatorname{tr}\\nabla^2 L_{\\text{pre}}` for
    each member.

    :math:`L_{\\text{pre}} = \\mathbb{E}_x \\frac1T\\sum_t -\\log p_\\theta(x_t\\mid
    x_{-t})`. Labels for all :math:`T` positions are drawn independently from the model,
    and :math:`\\frac1T\\lVert\\nabla_\\theta \\sum_t \\log p_\\theta(y_t\\mid
    x_{-t})\\rVert^2` is averaged over sentences (see
    :func:`fmlab.theory.flatness.fisher_trace`). Returns the estimate of the sum over
    members in ``value`` and each member's in ``per_group``; with ``blocks`` (e.g.
    :data:`GRU_BLOCKS`) also each parameter block's in ``per_block``."""
    if not isinstance(model, BiGRUMaskedLM):
        raise TypeError(f"model must be a BiGRUMaskedLM, got {type(model).__name__}")
    tokens = check_tensor("tokens", tokens, ndim=2, integer=True)
    T = tokens.shape[1]

    def logits_fn(p, x):
        return functional_call(model, p, (x,))

    def log_prob(p, x, y):  # one sentence x (T,), labels y (E, T)
        lg = functional_call(model, p, (x[None],))[:, 0]
        return F.log_softmax(lg, dim=-1).gather(-1, y[..., None]).sum()

    est = fisher_trace(
        log_prob,
        logits_fn,
        _params(model),
        tokens,
        n_labels=n_labels,
        generator=generator,
        groups=model.n_models,
        blocks=blocks,
    )
    return _per_position(est, T)


def mlm_hutchinson_trace(
    model: BiGRUMaskedLM,
    tokens: torch.Tensor,
    *,
    n_probes: int = 32,
    generator: torch.Generator | None = None,
    blocks=None,
) -> TraceEstimate:
    """Hutchinson's estimate of the trace of the Hessian of the true-label loss on
    ``tokens``.

    With ``blocks`` (e.g. :data:`GRU_BLOCKS`) also each block's trace, from the same
    probes (:func:`fmlab.theory.flatness.hutchinson_trace`).
    """
    if not isinstance(model, BiGRUMaskedLM):
        raise TypeError(f"model must be a BiGRUMaskedLM, got {type(model).__name__}")
    tokens = model.check_tokens(tokens)[0]

    def loss(p):
        lg = functional_call(model, p, (tokens,))
        E, n, T, V = lg.shape
        nll = F.cross_entropy(
            lg.reshape(-1, V), tokens.expand(E, n, T).reshape(-1), reduction="none"
        )
        return nll.reshape(E, -1).mean(1).sum()

    return hutchinson_trace(
        loss,
        _params(model),
        n_probes=n_probes,
        generator=generator,
        chunk=8,
        groups=model.n_models,
        blocks=blocks,
    )


def mlm_gradient_covariance_trace(
    model: BiGRUMaskedLM, tokens: torch.Tensor
) -> torch.Tensor:
    """:math:`\\operatorname{tr}\\Sigma` of the single-mask stochastic gradient, for
    each member: ``(E,)``.

    One stochastic gradient is :math:`g = \\nabla_\\theta[-\\log p_\\theta(x_t\\mid
    x_{-t})]` for a sentence :math:`x` and a uniform position :math:`t` (the true token
    as label); :math:`\\operatorname{tr}\\Sigma = \\mathbb{E}\\lVert g\\rVert^2 -
    \\lVert\\mathbb{E} g\\rVert^2`, over all (sentence, position) pairs of ``tokens``.
    The Bartlett identity says it equals :math:`\\operatorname{tr}\\nabla^2
    L_{\\text{pre}}` at a minimiser of a well-specified model."""
    if not isinstance(model, BiGRUMaskedLM):
        raise TypeError(f"model must be a BiGRUMaskedLM, got {type(model).__name__}")
    tokens = model.check_tokens(tokens)[0]
    n, T = tokens.shape
    params = _params(model)

    def nll(p, x, t):  # t is a one-hot (T,) vector marking the masked position
        lg = functional_call(model, p, (x[None],))[:, 0]  # (E, T, V)
        logp = F.log_softmax(lg, dim=-1).gather(
            -1, x.expand(lg.shape[0], -1)[..., None]
        )[..., 0]
        return -(logp * t).sum()

    xs = tokens.repeat_interleave(T, dim=0)
    ts = F.one_hot(torch.arange(T).repeat(n), T).to(torch.get_default_dtype())
    E = model.n_models
    sq = torch.zeros(E, dtype=torch.float64)
    mean = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in params.items()}
    per = vmap(grad(nll), in_dims=(None, 0, 0), chunk_size=flatness.CHUNK)
    for start in range(0, n * T, 512):
        gs = per(params, xs[start : start + 512], ts[start : start + 512])
        for k, g in gs.items():
            g = g.double()
            sq += g.reshape(g.shape[0], E, -1).pow(2).sum(2).sum(0)
            mean[k] += g.sum(0)
    N = n * T
    mean_sq = sum((m / N).reshape(E, -1).pow(2).sum(1) for m in mean.values())
    return sq / N - mean_sq


# ---------------------------------------------------------------------------------
# the adversary's probe (the evaluation probe is fmlab.adapt.probes.ridge_probe_curve)
# ---------------------------------------------------------------------------------
def adversarial_probe_loss(
    model: BiGRUMaskedLM,
    tokens: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
    ridge: float = 1e-2,
) -> torch.Tensor:
    """The meta-learning objective of the adversary (Liu et al., 2023, appendix A.4),
    per member.

    The sentences are split in halves :math:`S_1, S_2`. A ridge head is fitted in closed
    form on :math:`S_1` (features standardised on the batch, as the evaluation probe
    does) and its squared error on :math:`S_2` is returned, differentiable in the
    model's weights: ``(E,)``. The adversary *maximises* it while keeping the masked-LM
    loss low."""
    f = model.features(tokens).flatten(2)  # (E, n, D)
    mu, sd = f.mean(1, keepdim=True), f.std(1, keepdim=True) + 1e-6
    f = torch.cat([(f - mu) / sd, torch.ones(*f.shape[:2], 1)], dim=-1)
    m = f.shape[1] // 2
    Y = F.one_hot(labels, n_classes).to(f.dtype)
    A = f[:, :m]
    K = A @ A.transpose(1, 2) / m
    coef = (
        torch.linalg.solve(K + ridge * torch.eye(m), Y[:m].expand(f.shape[0], -1, -1))
        / m
    )
    pred = (f[:, m:] @ A.transpose(1, 2)) @ coef
    return (pred - Y[m:]).pow(2).sum(-1).mean(1)


# ---------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------
def train_phase(
    model: BiGRUMaskedLM,
    language: HMMLanguage,
    *,
    steps: int,
    batch: int,
    lr: float,
    optimizer: str = "adam",
    warmup: int = 0,
    cosine: bool = True,
    generator: torch.Generator,
    adversarial_weight: float = 0.0,
    adversarial_batch: int = 128,
    position: int = 0,
    ridge: float = 1e-2,
    every: int = 0,
    callback=None,
    desc: str = "training",
) -> None:
    """Train every member of ``model`` in place on fresh sentences of ``language``.

    Each step draws ``batch`` new sentences per member (the population loss, no data set
    to overfit) and takes a step on the sum of the members' masked-LM losses, minus
    ``adversarial_weight`` times :func:`adversarial_probe_loss` on ``adversarial_batch``
    fresh labelled sentences when that weight is positive. Learning rate: a linear
    warm-up ramp over ``warmup`` steps times a cosine decay to 0 over the run (or the
    ramp alone when ``cosine=False``): :func:`fmlab.train.lr_factor`, shape
    ``"cosine"`` or ``"constant"``. ``callback(step)`` runs every ``every`` steps.
    """
    steps = check_int("steps", steps, minimum=0)
    batch = check_int("batch", batch, minimum=1)
    lr = check_float("lr", lr, minimum=0.0, strict_min=True)
    adversarial_weight = check_float(
        "adversarial_weight", adversarial_weight, minimum=0.0
    )

    shape = "cosine" if cosine else "constant"

    def factor(s):
        return lr_factor(s, steps=steps, warmup=warmup, shape=shape)

    E, S = model.n_models, language.config.states_per_block

    device = next(model.parameters()).device  # sentences drawn on the CPU, sent there

    def step_loss(s):
        tok, _ = language.sample(batch * E, generator)
        loss = masked_lm_loss(model, tok.reshape(E, batch, -1).to(device))
        if adversarial_weight > 0:
            dt, dh = language.sample(adversarial_batch, generator)
            dt, blocks = dt.to(device), (dh[:, position] // S).to(device)
            loss = (
                loss
                - adversarial_weight
                * adversarial_probe_loss(
                    model, dt, blocks, language.config.n_blocks, ridge
                ).sum()
            )
        return loss

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


# ---------------------------------------------------------------------------------
# the whole experiment
# ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SameLossConfig:
    """Everything that determines :func:`same_loss_experiment` (Chapter 5)."""

    language: HMMLanguageConfig = field(default_factory=HMMLanguageConfig)
    n_models: int = 3  # seeds, trained together as an ensemble
    seed: int = 0
    hidden: int = 32
    d_ff: int = 64
    # 1. pretraining to convergence (Adam, warmup + cosine)
    pretrain_steps: int = 1500
    pretrain_batch: int = 128
    pretrain_lr: float = 1e-2
    # 2. continued training after convergence (plain SGD, constant learning rate)
    continue_steps: int = 2400
    continue_batch: int = 64
    continue_lr: float = 1.0
    n_checkpoints: int = 4
    # 3. the adversary (from the converged model), then plain re-convergence
    adversarial_steps: int = 800
    adversarial_weight: float = 0.05
    adversarial_lr: float = 2e-3
    adversarial_batch: int = 128
    reconverge_steps: int = 300
    reconverge_lr: float = 1e-3
    # 4. recovery: plain SGD from the adversarial models, one run per (learning rate,
    # batch): equal lr / batch keeps the stationary loss, lr² / batch sets the noise
    recovery_lrs: tuple = (0.25, 0.5)
    recovery_batches: tuple = (64, 128)
    recovery_steps: int = 600
    recovery_checkpoints: int = 2
    recovery_sizes: tuple = (200, 3000)  # probe sizes along the recovery
    recovery_test: int = 2000  # test sentences along the recovery (the first ones)
    # the continued SGD of 2. and the Bartlett identity use the first ``sgd_models``
    # members only (0: all), to keep the run short
    sgd_models: int = 0
    # evaluation
    position: int = 5  # the downstream task: block of the hidden state at this position
    probe_sizes: tuple = (50, 200, 1000, 3000)
    probe_ridge: float = 1e-2
    n_probe_test: int = 5000
    n_gap: int = 3000
    n_trace: int = 1000
    trace_labels: int = 1
    version: int = 3  # 3: posterior-scored probes, the recovery runs
    n_bartlett: int = 200
    bartlett_probes: int = 24

    def __post_init__(self):
        if not isinstance(self.language, HMMLanguageConfig):
            raise TypeError("language must be an HMMLanguageConfig")
        check_int("n_models", self.n_models, minimum=1)
        check_int(
            "position", self.position, minimum=0, maximum=self.language.length - 1
        )
        check_int("n_checkpoints", self.n_checkpoints, minimum=1)
        if self.continue_steps % self.n_checkpoints:  # 0: no continued SGD
            raise ValueError("continue_steps must be a multiple of n_checkpoints")
        check_int("sgd_models", self.sgd_models, minimum=0, maximum=self.n_models)
        check_int("recovery_checkpoints", self.recovery_checkpoints, minimum=1)
        if len(self.recovery_lrs) != len(self.recovery_batches):
            raise ValueError(
                "recovery_lrs and recovery_batches must have one entry each"
            )
        if self.recovery_steps % self.recovery_checkpoints:
            raise ValueError(
                "recovery_steps must be a multiple of recovery_checkpoints"
            )


def same_loss_experiment(config: SameLossConfig) -> dict:
    """Run Chapter 5's experiment; returns a dict of tensors (see the chapter for each
    entry).

    Keys: ``entropy``; ``bayes_accuracy``; ``lookup_accuracy`` and
    ``posterior_accuracy`` (probes on the exact conditionals and on the exact
    hidden-state posterior); ``pretrain_steps``/``pretrain_gap`` (the gap along
    pretraining, ``(k, E)``); ``continue_steps`` and, along continued training,
    ``continue_gap`` ``(k, E)``, ``continue_trace`` and ``continue_trace_se`` ``(k,
    E)``, ``continue_accuracy`` ``(k, E, sizes)``; ``adversarial_gap``,
    ``adversarial_trace``, ``adversarial_trace_se``, ``adversarial_accuracy`` for the
    adversarial models and ``control_*`` for their control (the same optimiser and
    schedule without the adversary); ``recovery_steps`` and, for each learning rate of
    ``recovery_lrs`` (index ``i``), ``recovery{i}_gap`` ``(k, E)`` and
    ``recovery{i}_accuracy`` ``(k, E, recovery_sizes)`` (on the first ``recovery_test``
    test sentences) along plain SGD from the adversarial models (row 0 is the
    adversarial model), and ``recovery{i}_trace*`` at its end;
    ``bartlett_*`` at the pretrained models: the trace of the gradient covariance, the
    Fisher and Hutchinson traces. Every accuracy is the expected accuracy under the
    exact posterior of the test inputs' blocks
    (:func:`fmlab.adapt.probes.ridge_probe_accuracy`). The continued SGD and the
    Bartlett traces use the first ``sgd_models`` members."""
    if not isinstance(config, SameLossConfig):
        raise TypeError(f"config must be a SameLossConfig, got {type(config).__name__}")
    with single_threaded():
        return _same_loss_experiment(config)


def _first_members(model: BiGRUMaskedLM, k: int) -> BiGRUMaskedLM:
    """A copy of the first ``k`` members of an ensemble."""
    if k == model.n_models:
        return copy.deepcopy(model)
    sub = BiGRUMaskedLM(
        model.vocab_size, hidden=model.hidden, d_ff=model.d_ff, n_models=k
    )
    with torch.no_grad():
        for p, q in zip(model.parameters(), sub.parameters()):
            q.copy_(p[:k])
    return sub


def _same_loss_experiment(config: SameLossConfig, pretraining_only=False) -> dict:
    c = config
    lang = HMMLanguage(c.language)
    K, S = c.language.n_blocks, c.language.states_per_block
    # fixed evaluation data (seeds far from the training streams)
    gap_tok, _ = lang.sample(c.n_gap, make_generator(10_001))
    gap_cond = lang.masked_conditionals(gap_tok)
    trace_tok, _ = lang.sample(c.n_trace, make_generator(10_002))
    n_train = max(c.probe_sizes)
    tr_tok, tr_h = lang.sample(n_train, make_generator(10_003))
    te_tok, te_h = lang.sample(c.n_probe_test, make_generator(10_004))
    ytr, yte = tr_h[:, c.position] // S, te_h[:, c.position] // S
    te_post = lang.block_posterior(te_tok)[:, c.position]  # exact P(block | sentence)

    def curve(ftr, fte):
        return ridge_probe_curve(
            ftr, ytr, fte, yte, K, c.probe_sizes, c.probe_ridge, te_post
        )

    def transfer(model, short=False):
        m = c.recovery_test if short else len(te_tok)
        with torch.no_grad():
            ftr = model.features(tr_tok).flatten(2).double()
            fte = model.features(te_tok[:m]).flatten(2).double()
        sizes = c.recovery_sizes if short else c.probe_sizes
        acc = [
            ridge_probe_curve(
                ftr[e], ytr, fte[e], yte[:m], K, sizes, c.probe_ridge, te_post[:m]
            )
            for e in range(model.n_models)
        ]
        return {"gap": kl_gap(model, gap_tok, gap_cond), "accuracy": torch.stack(acc)}

    def evaluate(model, label_seed, with_transfer=True):
        tr = mlm_fisher_trace(
            model,
            trace_tok,
            n_labels=c.trace_labels,
            generator=make_generator(label_seed),
            blocks=GRU_BLOCKS,
        )
        out = transfer(model) if with_transfer else {}
        out["trace"] = tr.per_group.double()
        out["trace_se"] = tr.per_group_stderr.double()
        for block, est in tr.per_block.items():
            out[f"trace_{block}"] = est.per_group.double()
            out[f"trace_{block}_se"] = est.per_group_stderr.double()
        for name in ("w1", "w2"):  # the head's two weight matrices, per member
            w = getattr(model, name).detach().double()
            out[f"norm_{name}"] = w.flatten(1).norm(dim=1)
        return out

    out: dict = {}
    ent, ent_se = lang.optimal_mlm_loss()
    out["entropy"] = torch.tensor([ent, ent_se])
    out["bayes_accuracy"] = torch.tensor(float(te_post.max(-1).values.mean()))
    out["lookup_accuracy"] = curve(
        lang.masked_conditionals(tr_tok).flatten(1),
        lang.masked_conditionals(te_tok).flatten(1),
    )
    out["posterior_accuracy"] = curve(
        lang.state_posterior(tr_tok).flatten(1), lang.state_posterior(te_tok).flatten(1)
    )

    # 1. pretraining
    model = BiGRUMaskedLM(
        lang.config.vocab_size,
        hidden=c.hidden,
        d_ff=c.d_ff,
        n_models=c.n_models,
        generator=make_generator(c.seed),
    )
    gen = make_generator(c.seed + 1)
    curve_steps, curve_gap = [], []

    def log_gap(step):
        curve_steps.append(step)
        curve_gap.append(kl_gap(model, gap_tok[:1000], gap_cond[:1000]))

    train_phase(
        model,
        lang,
        steps=c.pretrain_steps,
        batch=c.pretrain_batch,
        lr=c.pretrain_lr,
        warmup=100,
        generator=gen,
        every=max(1, c.pretrain_steps // 15),
        callback=log_gap,
        desc="pretraining",
    )
    out["pretrain_steps"] = torch.tensor(curve_steps)
    out["pretrain_gap"] = torch.stack(curve_gap)
    pretrained = copy.deepcopy(model)

    for key, val in evaluate(pretrained, 20_000).items():
        out[f"pretrained_{key}"] = val
    if pretraining_only:  # the slice that checks a stored run (same_loss_slice)
        return out

    # 2. continued training with SGD, evaluated at checkpoints (first members only)
    if c.continue_steps:
        model = _first_members(pretrained, c.sgd_models or c.n_models)
        records = [evaluate(model, 20_000)]
        every = c.continue_steps // c.n_checkpoints
        train_phase(
            model,
            lang,
            steps=c.continue_steps,
            batch=c.continue_batch,
            lr=c.continue_lr,
            optimizer="sgd",
            cosine=False,
            generator=make_generator(c.seed + 2),
            every=every,
            callback=lambda step: records.append(evaluate(model, 20_000 + step)),
            desc="continued training",
        )
        out["continue_steps"] = torch.arange(0, c.continue_steps + 1, every)
        for key in records[0]:
            out[f"continue_{key}"] = torch.stack([r[key] for r in records])

    # 3. the adversary, then plain re-convergence; and its control without the adversary
    for name, weight in (("adversarial", c.adversarial_weight), ("control", 0.0)):
        m = copy.deepcopy(pretrained)
        gen_adv = make_generator(c.seed + 3)
        train_phase(
            m,
            lang,
            steps=c.adversarial_steps,
            batch=c.pretrain_batch,
            lr=c.adversarial_lr,
            generator=gen_adv,
            adversarial_weight=weight,
            adversarial_batch=c.adversarial_batch,
            position=c.position,
            ridge=c.probe_ridge,
            desc=f"{name} training",
        )
        train_phase(
            m,
            lang,
            steps=c.reconverge_steps,
            batch=c.pretrain_batch,
            lr=c.reconverge_lr,
            generator=gen_adv,
            desc="re-convergence",
        )
        for key, val in evaluate(m, 30_000).items():
            out[f"{name}_{key}"] = val
        if name == "adversarial":
            adversarial = m

    # 4. recovery: plain SGD from the adversarial models, at each learning rate
    every = c.recovery_steps // c.recovery_checkpoints
    out["recovery_steps"] = torch.arange(0, c.recovery_steps + 1, every)
    start = transfer(adversarial, short=True)
    for i, (lr, b) in enumerate(zip(c.recovery_lrs, c.recovery_batches)):
        m = copy.deepcopy(adversarial)
        rec = [start]
        train_phase(
            m,
            lang,
            steps=c.recovery_steps,
            batch=b,
            lr=lr,
            optimizer="sgd",
            cosine=False,
            generator=make_generator(c.seed + 4),
            every=every,
            callback=lambda step, m=m, rec=rec: rec.append(transfer(m, True)),
            desc=f"recovery (lr {lr})",
        )
        for key in rec[0]:
            out[f"recovery{i}_{key}"] = torch.stack([r[key] for r in rec])
        for key, val in evaluate(m, 50_000, with_transfer=False).items():
            out[f"recovery{i}_{key}"] = val

    # 5. the Bartlett identity at the pretrained models: three traces
    pretrained = _first_members(pretrained, c.sgd_models or c.n_models)
    btok = trace_tok[: c.n_bartlett]
    out["bartlett_covariance"] = mlm_gradient_covariance_trace(pretrained, btok)
    hut = mlm_hutchinson_trace(
        pretrained, btok, n_probes=c.bartlett_probes, generator=make_generator(40_000)
    )
    out["bartlett_hutchinson"] = hut.per_group.double()
    out["bartlett_hutchinson_se"] = torch.tensor(hut.stderr)
    out["bartlett_fisher"] = mlm_fisher_trace(
        pretrained, btok, n_labels=4, generator=make_generator(40_001)
    ).per_group.double()
    out["n_params"] = torch.tensor(sum(p[0].numel() for p in pretrained.parameters()))
    return out


# ---------------------------------------------------------------------------------
# the page's run, stored (fmlab.stored)
# ---------------------------------------------------------------------------------
SAME_LOSS_RESULTS = Path(__file__).parent / "results" / "ch5_same_loss.json"
SAME_LOSS_SCRIPT = "scripts/ch5_same_loss.py"
#: The slice of the stored run that the tests rerun (under another rounding path than
#: the record's, :func:`fmlab.stored.other_rounding`): the pretraining phase of three
#: models for 120 steps (100 of them the warm-up), with smaller evaluation sets;
#: seconds on one core.
SAME_LOSS_SLICE = dict(
    n_models=3,
    pretrain_steps=60,
    n_gap=500,
    n_trace=100,
    probe_sizes=(100, 500),
    n_probe_test=1000,
)
# the per-replicate quantities of the pretraining phase that a rerun is compared on
_SLICE_FIELDS = ("gap", "accuracy", "trace", "trace_encoder", "trace_head")


def same_loss_sources() -> list:
    """The package code that produces the stored run, for its fingerprint
    (:mod:`fmlab.stored`): this whole module (the experiment, its training phases,
    the adversary's probe and the traces), the ridge probe, the model, the language,
    the trace estimators, the training loop and its schedule. The script's settings
    are in the file as its config."""
    from ..adapt.probes import _ridge_head, _ridge_probe_accuracy, _ridge_probe_inputs
    from ..data import hmm_language
    from ..models import masked_lm
    from ..repro import _splitmix64, effective_seed

    return [
        sys.modules[__name__],
        ridge_probe_curve,
        ridge_probe_accuracy,
        _ridge_probe_inputs,
        _ridge_probe_accuracy,
        _ridge_head,
        masked_lm,
        hmm_language,
        flatness,
        train_scheduled,
        lr_factor,
        make_generator,
        effective_seed,
        _splitmix64,  # effective_seed's mixer
        single_threaded,
    ]


def same_loss_config(record: dict) -> SameLossConfig:
    """The :class:`SameLossConfig` recorded as data in a results file."""
    cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
    cfg["language"] = HMMLanguageConfig(**cfg["language"])
    return SameLossConfig(**cfg)


def same_loss_results(path: Path | str | None = None) -> tuple[SameLossConfig, dict]:
    """The stored run (``scripts/ch5_same_loss.py``): its configuration and the
    result of :func:`same_loss_experiment`, with the file's ``"stored"`` record (and
    the run's ``"wall_seconds"``) under ``"stored"``. Raises
    :class:`fmlab.stored.StaleResults`, naming the script, when the code that produced
    it has changed since (:func:`same_loss_sources`)."""
    data = stored.load(
        SAME_LOSS_RESULTS if path is None else path,
        script=SAME_LOSS_SCRIPT,
        sources=same_loss_sources(),
    )
    result = stored.decode_tensors(data["result"])
    result["stored"] = {**data["stored"], "wall_seconds": data["meta"]["wall_seconds"]}
    return same_loss_config(data["meta"]["config"]), result


def same_loss_run(config: SameLossConfig) -> dict:
    """:func:`same_loss_experiment`: the stored run when ``config`` is the stored
    one (at seed offset 0), else computed and cached on disk (:func:`fmlab.cached`)."""
    if not isinstance(config, SameLossConfig):
        raise TypeError(f"config must be a SameLossConfig, got {type(config).__name__}")
    if seed_offset() == 0 and SAME_LOSS_RESULTS.is_file():
        record = stored.read(SAME_LOSS_RESULTS)["meta"]["config"]
        if same_loss_config(record) == config:
            return same_loss_results()[1]
    return cached(config, lambda: same_loss_experiment(config), name="ch05_same_loss")


def _pretraining(config: SameLossConfig) -> dict:
    with single_threaded():
        part = _same_loss_experiment(config, pretraining_only=True)
    return {k: part[f"pretrained_{k}"].tolist() for k in _SLICE_FIELDS}


def same_loss_slice(record: dict | None = None) -> dict:
    """Run the slice (the config ``record``, by default the page's configuration with
    :data:`SAME_LOSS_SLICE`): the pretrained members' gaps, probe accuracies and
    traces, the per-replicate quantities that :func:`fmlab.stored.compare_runs`
    compares."""
    if record is None:
        import dataclasses

        page = stored.read(SAME_LOSS_RESULTS)["meta"]["config"]
        config = dataclasses.replace(same_loss_config(page), **SAME_LOSS_SLICE)
    else:
        config = same_loss_config(record)
    return _pretraining(config)


def same_loss_job_check(path: Path | str | None = None) -> dict:
    """A script's ``--restamp`` check: rerun the pretraining phase of the stored run at
    ``path`` (its language, probes on the exact posteriors, pretraining and the
    pretrained models' evaluation: about a minute on one core) with today's code and
    compare it with the record (:func:`fmlab.stored.compare_runs`). Reads the file
    without checking its fingerprint."""
    data = stored.read(SAME_LOSS_RESULTS if path is None else path)
    record = stored.decode_tensors(data["result"])
    rerun = _pretraining(same_loss_config(data["meta"]["config"]))
    return stored.compare_runs(
        {k: record[f"pretrained_{k}"] for k in _SLICE_FIELDS}, rerun
    )


def equal_loss_models(result: dict, size_index: int) -> dict:
    """The four models compared at (nearly) equal loss in the chapter, each as
    ``name -> (total trace, encoder trace, head trace, accuracy)`` per seed, with the
    probe accuracy at ``probe_sizes[size_index]``: the pretrained models, the
    SGD-continued ones (the last checkpoint), the Adam-continued controls and the
    adversarial models (their first members, those that were also SGD-continued)."""
    r, j = result, size_index
    k = r["continue_gap"].shape[1]

    def blocks(prefix):
        return tuple(
            r[f"{prefix}_{b}"][:k] for b in ("trace", "trace_encoder", "trace_head")
        )

    cont = blocks("continue")
    return {
        "pretrained": tuple(t[0] for t in cont) + (r["continue_accuracy"][0, :, j],),
        "SGD-continued": tuple(t[-1] for t in cont)
        + (r["continue_accuracy"][-1, :, j],),
        "control (Adam)": blocks("control") + (r["control_accuracy"][:k, j],),
        "adversarial": blocks("adversarial") + (r["adversarial_accuracy"][:k, j],),
    }


def equal_loss_rank_correlation(models: dict) -> dict[str, torch.Tensor]:
    """Per seed, the Spearman rank correlation across the equal-loss models of
    :func:`equal_loss_models` between a block's trace and the probe accuracy:
    ``{"total", "encoder", "head"} -> (E,)``. Negative is the paper's direction
    (flatter, better transfer)."""
    if not isinstance(models, dict) or len(models) < 2:
        raise ValueError("models must be a dict of at least two equal-loss models")
    rows = list(models.values())
    acc = torch.stack([r[3] for r in rows]).double()  # (models, seeds)
    out = {}
    for b, block in enumerate(("total", "encoder", "head")):
        tr = torch.stack([r[b] for r in rows]).double()
        out[block] = torch.tensor(
            [spearman(tr[:, e], acc[:, e]) for e in range(acc.shape[1])]
        )
    return out


# ---------------------------------------------------------------------------------
# the look-up table, with tied and untied emissions
# ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LookupConfig:
    """The look-up table on random languages with tied and with untied emissions."""

    worlds: tuple = (0, 1, 2)  # seeds of the language (its cycles)
    n_train: int = 3000
    n_test: int = 5000


def lookup_tables(
    config: LookupConfig, language: HMMLanguageConfig, position: int
) -> dict:
    """:func:`lookup_table_transfer` on each world of ``config``, with tied and untied
    emissions: ``{True: [tied runs], False: [untied runs]}`` (``language`` gives
    everything else; world ``w`` samples its sentences with seed ``500 + 10 w``)."""
    if not isinstance(config, LookupConfig):
        raise TypeError(f"config must be a LookupConfig, got {type(config).__name__}")
    return {
        tied: [
            lookup_table_transfer(
                replace(language, seed=w, tied=tied),
                position=position,
                n_train=config.n_train,
                n_test=config.n_test,
                seed=500 + 10 * w,
            )
            for w in config.worlds
        ]
        for tied in (True, False)
    }


def state_task_accuracy(
    language: HMMLanguage, position: int, draws: int = 3
) -> list[dict]:
    """The look-up table's probe on the *state* (of all ``n_states``) and on the
    block at ``position``, for ``draws`` draws of 3000 training and 5000 test
    sentences (seeds ``1 + 2d`` and ``2 + 2d``): ``[{"state", "block"}]``."""
    S, out = language.config.states_per_block, []
    for d in range(draws):
        tok_tr, h_tr = language.sample(3000, make_generator(1 + 2 * d))
        tok_te, h_te = language.sample(5000, make_generator(2 + 2 * d))
        f_tr = language.masked_conditionals(tok_tr).flatten(1)
        f_te = language.masked_conditionals(tok_te).flatten(1)
        out.append(
            {
                "state": ridge_probe_accuracy(
                    f_tr,
                    h_tr[:, position],
                    f_te,
                    h_te[:, position],
                    language.config.n_states,
                ),
                "block": ridge_probe_accuracy(
                    f_tr,
                    h_tr[:, position] // S,
                    f_te,
                    h_te[:, position] // S,
                    language.config.n_blocks,
                ),
            }
        )
    return out


# ---------------------------------------------------------------------------------
# the look-up table, one language
# ---------------------------------------------------------------------------------
def lookup_table_transfer(
    language: HMMLanguageConfig,
    *,
    position: int,
    n_train: int = 3000,
    n_test: int = 5000,
    ridge: float = 1e-2,
    seed: int = 0,
) -> dict:
    """Block accuracy of the ridge probe on the exact conditionals (the "look-up
    table").

    The look-up table of Liu et al. (2023) is a model that outputs
    :math:`p^\\star(\\cdot\\mid x_{-t})` at every position; its representation is the
    concatenation of those conditionals. Returns its probe accuracy on the block of the
    hidden state at ``position`` (``"lookup"``), the same probe on the exact posterior
    of the hidden states (``"posterior"``) and the Bayes accuracy (``"bayes"``), for
    ``n_train`` training and ``n_test`` test sentences drawn with seeds ``seed`` and
    ``seed + 1``.

    With tied emissions (:class:`fmlab.data.hmm_language.HMMLanguageConfig`), state
    :math:`(k, s)` emits like :math:`(k', s)`, so :math:`p^\\star(\\cdot\\mid x_{-t}) =
    \\sum_s \\big(\\sum_k q_t(k, s)\\big)\\,E_s` depends on the posterior only through
    its marginal over the blocks: every coordinate the probe sees has the block summed
    out."""
    if not isinstance(language, HMMLanguageConfig):
        raise TypeError(
            f"language must be an HMMLanguageConfig, got {type(language).__name__}"
        )
    position = check_int("position", position, minimum=0, maximum=language.length - 1)
    n_train = check_int("n_train", n_train, minimum=2)
    n_test = check_int("n_test", n_test, minimum=1)
    lang = HMMLanguage(language)
    S, K = language.states_per_block, language.n_blocks
    tr_tok, tr_h = lang.sample(n_train, make_generator(seed))
    te_tok, te_h = lang.sample(n_test, make_generator(seed + 1))
    ytr, yte = tr_h[:, position] // S, te_h[:, position] // S

    def acc(f):
        return ridge_probe_accuracy(
            f(tr_tok).flatten(1), ytr, f(te_tok).flatten(1), yte, K, ridge
        )

    return {
        "lookup": acc(lang.masked_conditionals),
        "posterior": acc(lang.state_posterior),
        "bayes": float(lang.block_posterior(te_tok)[:, position].max(-1).values.mean()),
    }


# ---------------------------------------------------------------------------------
# exact block traces against Hutchinson's estimate (Chapter 5, the benchmark script)
# ---------------------------------------------------------------------------------
def block_trace_comparison(
    *,
    hidden: int = 6,
    sentences: int = 48,
    train_steps: int = 150,
    probes: int = 300,
    language: HMMLanguageConfig | None = None,
    seed: int = 0,
) -> dict:
    """Exact per-block traces of a small masked LM's Hessian against Hutchinson's.

    A one-member :class:`BiGRUMaskedLM` (state size ``hidden``, head width
    ``2 * hidden``) is trained for ``train_steps`` Adam steps on ``language`` (default:
    the chapter's), so that its Hessian is that of a model near a minimum. The loss is
    the masked-LM loss on ``sentences`` fixed sentences. Returns the exact trace of
    each block of :data:`GRU_BLOCKS` (one HVP per parameter,
    :func:`fmlab.theory.flatness.hessian_block_traces_exact`) in ``"exact"``,
    Hutchinson's estimates with ``probes`` probes and their standard errors in
    ``"hutchinson"`` and ``"hutchinson_se"``, ``"n_params"`` and the process (CPU)
    seconds each took, ``"seconds_exact"`` and ``"seconds_hutchinson"``.
    """
    import time

    from ..theory.flatness import hessian_block_traces_exact

    hidden = check_int("hidden", hidden, minimum=1)
    sentences = check_int("sentences", sentences, minimum=1)
    train_steps = check_int("train_steps", train_steps, minimum=0)
    probes = check_int("probes", probes, minimum=2)
    lang = HMMLanguage(language if language is not None else HMMLanguageConfig())
    model = BiGRUMaskedLM(
        lang.config.vocab_size,
        hidden=hidden,
        d_ff=2 * hidden,
        generator=make_generator(seed),
    )
    with single_threaded():
        train_phase(
            model,
            lang,
            steps=train_steps,
            batch=128,
            lr=1e-2,
            warmup=max(1, train_steps // 6),
            generator=make_generator(seed + 1),
            desc="training",
        )
        tokens, _ = lang.sample(sentences, make_generator(seed + 2))
        params = _params(model)

        def loss(p):
            lg = functional_call(model, p, (tokens,))
            E, n, T, V = lg.shape
            return F.cross_entropy(
                lg.reshape(-1, V), tokens.expand(E, n, T).reshape(-1)
            )

        t0 = time.process_time()
        exact = hessian_block_traces_exact(loss, params, GRU_BLOCKS, chunk=128)
        t1 = time.process_time()
        est = hutchinson_trace(
            loss,
            params,
            n_probes=probes,
            generator=make_generator(seed + 3),
            chunk=min(probes, 128),
            blocks=GRU_BLOCKS,
        )
        t2 = time.process_time()
    return {
        "n_params": sum(p.numel() for p in params.values()),
        "exact": exact,
        "hutchinson": {b: e.value for b, e in est.per_block.items()},
        "hutchinson_se": {b: e.stderr for b, e in est.per_block.items()},
        "seconds_exact": t1 - t0,
        "seconds_hutchinson": t2 - t1,
    }
