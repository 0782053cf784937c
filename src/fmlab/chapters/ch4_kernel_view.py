"""Chapter 4 end to end: pretrain a masked LM, fine-tune it few-shot, compare with
kernels.

Pretraining minimises the masked-language-modelling loss on documents of
:class:`~fmlab.data.sentiment_language.SentimentLanguage` with a
:class:`~fmlab.models.transformer.TinyTransformer`. A downstream sentiment task is then
solved in two *settings* (Section 3.1 of Malladi et al., 2023):

- **prompt-based**: the input is ``[CLS] <sentence> it was [MASK] .`` and the model
  output is the difference of the label-word logits at ``[MASK]``, :math:`f(x) =
  \\text{logit}_{great} - \\text{logit}_{terrible}` (:class:`PromptClassifier`);
- **standard**: the input is ``[CLS] <sentence>`` and a new linear head reads the
  ``[CLS]`` position, :math:`f(x) = \\Gamma^\\top h_{[CLS]}(x) + c`
  (:class:`CLSClassifier`). As in the paper, the head starts at the *linear-probing*
  solution (:func:`logistic_probe_head`), not at random.

With labels :math:`y \\in \\{\\pm 1\\}` and the logistic loss :math:`\\log(1 + e^{-y
f})`, binary cross-entropy over the two label words depends on :math:`f` only, so one
scalar output (and one kernel) describes each setting. Fine-tuning is full-batch SGD,
Adam or SignGD (:func:`fine_tune_logistic`); the kernel analogs are fitted by kernel
logistic
regression (:func:`fmlab.theory.kernels.fit_kernel_logistic`). Every learning rate and
every ridge is chosen on a validation set of the same size as the training set (``k``
examples per class), never on the test set (:func:`run_kernel_experiment`).

The runners at the end (:func:`setting`, :func:`signgd_steps`, :func:`few_shot_runs`,
:func:`width_test`, :func:`lora_kernel`, :func:`entk_timing`,
:func:`label_word_swap`) return what one section of a chapter page shows.

Used in Chapter 4: ``notebooks/04-kernel-view.ipynb`` (the kernel view tested on
few-shot runs) and ``notebooks/04b-natural-tasks-and-lora.ipynb`` (natural tasks,
LoRA's kernel and the cost of an eNTK).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .._validate import check_choice, check_float, check_int, check_tensor
from ..data.sentiment_language import SentimentLanguage, SentimentLanguageConfig
from ..models.transformer import (
    CLSClassifier,
    PromptClassifier,
    TinyTransformer,
    TransformerConfig,
)
from ..repro import make_generator, seed_everything
from ..theory.kernels import newton_minimize
from ..train import cached, progress

__all__ = [
    "MLMPretrainConfig",
    "pretrain_masked_lm",
    "pretrain_masked_lms_stacked",
    "FewShotTask",
    "few_shot_task",
    "test_set",
    "LogisticFineTuneConfig",
    "FineTuneDiverged",
    "fine_tune_logistic",
    "sign_accuracy",
    "outputs",
    "logistic_loss",
    "output_derivative",
    "mask_tokens",
    "fit_logistic_regression",
    "logistic_probe_head",
    "KernelExperimentConfig",
    "KernelExperiment",
    "run_kernel_experiment",
    "kernel_behaviour",
    "SignGDStepCheck",
    "signgd_step_check",
    "LoRAKernelErrors",
    "lora_kernel_errors",
    "output_derivative_by_width",
    "entk_accuracy",
    "ChapterConfig",
    "Setting",
    "setting",
    "bag_of_words_accuracy",
    "best_multiple_residual",
    "SignGDSteps",
    "signgd_steps",
    "lazy_grid",
    "wide_grid",
    "FewShotRuns",
    "few_shot_runs",
    "bayes_output_derivative",
    "LoRAKernelConfig",
    "LoRAKernel",
    "lora_kernel",
    "entk_timing",
    "LabelWords",
    "label_word_swap",
    "width_test",
]


# -- pretraining
# -------------------------------------------------------------------------
@dataclass(frozen=True)
class MLMPretrainConfig:
    """Everything that determines a pretrained masked language model."""

    language: SentimentLanguageConfig = field(default_factory=SentimentLanguageConfig)
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    steps: int = 2000
    batch_size: int = 64
    lr: float = 3e-3
    mask_rate: float = 0.15
    statement_mask_rate: float = 0.9
    relative_bias: bool = True
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.language, SentimentLanguageConfig):
            raise TypeError(
                "language must be a SentimentLanguageConfig, got "
                f"{type(self.language).__name__}"
            )
        check_int("d_model", self.d_model, minimum=1)
        check_int("n_layers", self.n_layers, minimum=1)
        check_int("n_heads", self.n_heads, minimum=1)
        check_int("steps", self.steps, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        check_float("lr", self.lr, minimum=0.0, strict_min=True)
        check_float(
            "mask_rate", self.mask_rate, minimum=0.0, maximum=1.0, strict_min=True
        )
        check_float(
            "statement_mask_rate", self.statement_mask_rate, minimum=0.0, maximum=1.0
        )
        if not isinstance(self.relative_bias, bool):
            raise TypeError("relative_bias must be a bool")
        check_int("seed", self.seed, minimum=0)


def mask_tokens(
    lang: SentimentLanguage,
    x: torch.Tensor,
    config: MLMPretrainConfig,
    generator: torch.Generator,
):
    """BERT-style masking: every word (not ``[CLS]``/``[PAD]``) is replaced by
    ``[MASK]`` with probability ``mask_rate``, the adjective of a statement with
    ``statement_mask_rate`` (a shortcut that keeps pretraining short). Returns the
    masked input and the mask."""
    u = torch.rand(x.shape, generator=generator)
    candidate = (x != lang.pad_id) & (x != lang.cls_id)
    adjective = (x == lang.great_id) | (x == lang.terrible_id)
    masked = candidate & (
        (u < config.mask_rate)
        | (adjective & (u < max(config.mask_rate, config.statement_mask_rate)))
    )
    return x.masked_fill(masked, lang.mask_id), masked


def _model_config(
    lang: SentimentLanguage, config: MLMPretrainConfig
) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=lang.vocab_size,
        max_len=lang.seq_len,
        d_model=config.d_model,
        n_layers=config.n_layers,
        n_heads=config.n_heads,
        pad_id=lang.pad_id,
        relative_bias=config.relative_bias,
    )


def pretrain_masked_lm(
    config: MLMPretrainConfig = MLMPretrainConfig(),
) -> tuple[TinyTransformer, torch.Tensor]:
    """The pretrained masked LM for ``config`` (trained once, then read from the cache).

    AdamW with a one-cycle learning-rate schedule on fresh batches of pretraining text.
    Returns the model (in eval mode) and the training loss at every step.
    """
    if not isinstance(config, MLMPretrainConfig):
        raise TypeError(
            f"config must be a MLMPretrainConfig, got {type(config).__name__}"
        )
    lang = SentimentLanguage(config.language)

    def build():
        seed_everything(config.seed)
        model = TinyTransformer(_model_config(lang, config), seed=config.seed)
        g = make_generator(config.seed + 1)
        # fused: one kernel for all parameters (about 10% of a step at this size)
        opt = torch.optim.AdamW(
            model.parameters(), lr=config.lr, weight_decay=0.01, fused=True
        )
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=config.lr, total_steps=config.steps, pct_start=0.1
        )
        losses = torch.empty(config.steps)
        model.train()
        for step in progress(
            range(config.steps), total=config.steps, desc="pretraining"
        ):
            x = lang.sample_pretraining(config.batch_size, g)
            inp, masked = mask_tokens(lang, x, config, g)
            loss = F.cross_entropy(model(inp)[masked], x[masked])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses[step] = loss.detach()
        return {
            "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "losses": losses,
        }

    entry = cached({"pretrain": config}, build, name="ch4_mlm")
    model = TinyTransformer(_model_config(lang, config), seed=config.seed)
    model.load_state_dict(entry["state"])
    model.eval()
    return model, entry["losses"]


def pretrain_masked_lms_stacked(
    configs: tuple[MLMPretrainConfig, ...],
) -> list[tuple[TinyTransformer, torch.Tensor]]:
    """Pretrain masked LMs that differ only in their seed at once, as stacked weights.

    The models' parameters are stacked along a leading axis of size ``K``
    (:func:`torch.func.stack_module_state`), one forward pass computes all of them
    (``vmap`` of :func:`torch.func.functional_call`: batched matmuls), the loss is the
    sum of the models' own masked-LM losses on their own batches (each seed keeps its
    data stream, as in :func:`pretrain_masked_lm`), and one fused AdamW step updates
    every model (AdamW acts element by element, so each model sees its own update).
    Returns ``(model, losses)`` per config, as :func:`pretrain_masked_lm` does, without
    the cache.

    Not bit-for-bit equal to separate runs: the forward pass is, but under ``vmap`` the
    gradients of the layer norms' weights and biases are summed in another order
    (differences of about 1e-7 after one step), which Adam carries on. Nor is it much
    faster on one CPU thread at the chapter's sizes, where a step is arithmetic rather
    than per-call overhead (``scripts/bench_stacked_pretraining.py``: about 1.0-1.1x).
    So the chapter's models are still trained one at a time; ``tests/chapters`` checks
    the two against each other to float tolerance.
    """
    import dataclasses

    from torch.func import functional_call, stack_module_state, vmap

    configs = tuple(configs)
    if not configs or not all(isinstance(c, MLMPretrainConfig) for c in configs):
        raise TypeError("configs must be a non-empty tuple of MLMPretrainConfig")
    first = dataclasses.replace(configs[0], seed=0)
    if any(dataclasses.replace(c, seed=0) != first for c in configs):
        raise ValueError("the configs must differ only in their seed")
    cfg, lang = configs[0], SentimentLanguage(configs[0].language)
    models = []
    for c in configs:
        seed_everything(c.seed)
        models.append(TinyTransformer(_model_config(lang, c), seed=c.seed))
    stacked, buffers = stack_module_state(models)
    params = {k: v.detach().clone().requires_grad_(True) for k, v in stacked.items()}
    skeleton = copy.deepcopy(models[0]).to("meta")
    skeleton.train()

    def forward(p, b, x):
        return functional_call(skeleton, (p, b), (x,))

    gens = [make_generator(c.seed + 1) for c in configs]
    opt = torch.optim.AdamW(
        list(params.values()), lr=cfg.lr, weight_decay=0.01, fused=True
    )
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=cfg.lr, total_steps=cfg.steps, pct_start=0.1
    )
    losses = torch.empty(len(configs), cfg.steps)
    for step in progress(range(cfg.steps), total=cfg.steps, desc="pretraining"):
        batches = []
        for c, g in zip(configs, gens):
            x = lang.sample_pretraining(c.batch_size, g)
            batches.append((x, *mask_tokens(lang, x, c, g)))
        logits = vmap(forward)(params, buffers, torch.stack([b[1] for b in batches]))
        loss = torch.stack(
            [F.cross_entropy(z[m], x[m]) for z, (x, _, m) in zip(logits, batches)]
        )
        opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        opt.step()
        sched.step()
        losses[:, step] = loss.detach()
    out = []
    for k, (c, model) in enumerate(zip(configs, models)):
        model.load_state_dict({n: v[k].detach().clone() for n, v in params.items()})
        model.eval()
        out.append((model, losses[k]))
    return out


# -- the two fine-tuning settings
# ----------------------------------------------------------
# -- downstream data
# -----------------------------------------------------------------------
@dataclass(frozen=True)
class FewShotTask:
    """A downstream sample: labels and the same sentences with and without the
    prompt."""

    y: torch.Tensor  # (n,) float in {-1, +1}
    x_prompt: torch.Tensor  # (n, T) [CLS] sentence it was [MASK] .
    x_plain: torch.Tensor  # (n, T) [CLS] sentence
    words: torch.Tensor  # (n, max_len) the sentences


def _balanced(
    lang: SentimentLanguage, per_class: int, generator: torch.Generator
) -> FewShotTask:
    s, words, lengths = lang.sample_sentences(
        4 * per_class + 64, generator, domain="task"
    )
    while (
        int((s > 0).sum()) < per_class or int((s < 0).sum()) < per_class
    ):  # pragma: no cover (rare)
        s2, w2, l2 = lang.sample_sentences(4 * per_class + 64, generator, domain="task")
        s, words, lengths = (
            torch.cat([s, s2]),
            torch.cat([words, w2]),
            torch.cat([lengths, l2]),
        )
    pos = torch.nonzero(s > 0)[:per_class, 0]
    neg = torch.nonzero(s < 0)[:per_class, 0]
    idx = torch.stack([pos, neg], dim=1).reshape(-1)  # alternate the classes
    return FewShotTask(
        y=s[idx].float(),
        x_prompt=lang.task_inputs(words[idx], lengths[idx], prompt="it was"),
        x_plain=lang.task_inputs(words[idx], lengths[idx], prompt="none"),
        words=words[idx],
    )


def few_shot_task(
    lang: SentimentLanguage, k: int, seed: int, *, split: str = "train"
) -> FewShotTask:
    """A balanced ``k``-shot set (``k`` examples per class) drawn with ``seed``.

    ``split="validation"`` draws the run's separate validation set of the same size (the
    protocol of Gao et al., 2021, followed by Malladi et al., 2023), from another
    stream.
    """
    if not isinstance(lang, SentimentLanguage):
        raise TypeError(f"lang must be a SentimentLanguage, got {type(lang).__name__}")
    k = check_int("k", k, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    check_choice("split", split, ("train", "validation"))
    base = 10_000 if split == "train" else 20_000
    return _balanced(lang, k, make_generator(base + seed))


def test_set(lang: SentimentLanguage, n: int, seed: int = 123_456) -> FewShotTask:
    """A balanced test set of ``n`` sentences (``n`` even), shared by every run."""
    if not isinstance(lang, SentimentLanguage):
        raise TypeError(f"lang must be a SentimentLanguage, got {type(lang).__name__}")
    n = check_int("n", n, minimum=2)
    if n % 2:
        raise ValueError(f"n must be even, got {n}")
    return _balanced(lang, n // 2, make_generator(check_int("seed", seed, minimum=0)))


# -- fine-tuning
# -----------------------------------------------------------------------------
@dataclass(frozen=True)
class LogisticFineTuneConfig:
    """Fine-tuning with the logistic loss: ``steps`` steps on mini-batches of
    ``batch_size`` examples (``None``: the full training set)."""

    optimizer: str = "sgd"  # "sgd", "adam" or "signgd"
    lr: float = 0.1
    steps: int = 100
    batch_size: int | None = None

    def __post_init__(self):
        check_choice("optimizer", self.optimizer, ("sgd", "adam", "signgd"))
        check_float("lr", self.lr, minimum=0.0, strict_min=True)
        check_int("steps", self.steps, minimum=0)
        if self.batch_size is not None:
            check_int("batch_size", self.batch_size, minimum=1)


def logistic_loss(f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean of :math:`\\log(1 + e^{-y f})`."""
    return F.softplus(-y * f).mean()


class FineTuneDiverged(FloatingPointError):
    """A fine-tuning run whose loss or parameters became non-finite."""

    def __init__(self, optimizer: str, lr: float, step: int, what: str):
        self.optimizer, self.lr, self.step = optimizer, lr, step
        super().__init__(
            f"fine-tuning diverged: {what} became non-finite at step {step} "
            f"({optimizer}, lr = {lr:.3g}); use a smaller lr"
        )


def fine_tune_logistic(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: LogisticFineTuneConfig,
    *,
    seed: int = 0,
    checkpoints: tuple[int, ...] = (),
    on_checkpoint=None,
) -> nn.Module:
    """A fine-tuned copy of ``model``: ``config.steps`` steps on the logistic loss.

    Mini-batches are drawn without replacement within each pass over the data, from a
    generator seeded with ``seed``. Only parameters with ``requires_grad=True`` move
    (all of them, or the LoRA factors). SignGD updates :math:`\\theta \\leftarrow
    \\theta - \\eta\\,\\operatorname{sign}(\\nabla L)`. Raises
    :class:`FineTuneDiverged` at the first step whose loss is not finite, or at the end
    if a parameter is not. ``on_checkpoint(t, model)`` is called (model in eval mode,
    not to be modified) after each step count ``t`` in ``checkpoints`` whose weights and
    loss on the whole training set are finite (a checkpoint that is not raises), so that
    a run that diverges later keeps its earlier checkpoints.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(config, LogisticFineTuneConfig):
        raise TypeError(
            f"config must be a LogisticFineTuneConfig, got {type(config).__name__}"
        )
    x = check_tensor("x", x, ndim=2, integer=True)
    y = check_tensor("y", y, shape=(x.shape[0],), floating=True)
    tuned = copy.deepcopy(model)
    params = [p for p in tuned.parameters() if p.requires_grad]
    if config.optimizer == "adam":
        opt = torch.optim.Adam(params, lr=config.lr)
    else:
        opt = torch.optim.SGD(params, lr=config.lr)
    n = x.shape[0]
    batch = n if config.batch_size is None else min(config.batch_size, n)
    g = make_generator(check_int("seed", seed, minimum=0))
    order = torch.randperm(n, generator=g)
    cursor = 0
    checkpoints = tuple(check_int("checkpoints", t, minimum=1) for t in checkpoints)
    if checkpoints and (on_checkpoint is None or max(checkpoints) > config.steps):
        raise ValueError(
            "checkpoints need on_checkpoint and must not exceed the steps "
            f"({config.steps}), got {checkpoints}"
        )

    def finite():
        return all(bool(torch.isfinite(p).all()) for p in params)

    tuned.train()
    for step in range(config.steps):
        if batch == n:
            idx = slice(None)
        else:
            if cursor + batch > n:
                order, cursor = torch.randperm(n, generator=g), 0
            idx = order[cursor : cursor + batch]
            cursor += batch
        loss = logistic_loss(tuned(x[idx]), y[idx])
        if not bool(torch.isfinite(loss)):
            raise FineTuneDiverged(config.optimizer, config.lr, step, "the loss")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if config.optimizer == "signgd":
            for p in params:
                p.grad = p.grad.sign()
        opt.step()
        if step + 1 in checkpoints:
            tuned.eval()
            with torch.no_grad():  # a checkpoint must be finite, and so its loss
                ok = finite() and bool(torch.isfinite(logistic_loss(tuned(x), y)))
            if not ok:
                raise FineTuneDiverged(
                    config.optimizer, config.lr, step, "a checkpoint"
                )
            on_checkpoint(step + 1, tuned)
            tuned.train()
    if not finite():
        raise FineTuneDiverged(config.optimizer, config.lr, config.steps, "a parameter")
    tuned.eval()
    return tuned


@torch.no_grad()
def outputs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``model(x)`` without gradients."""
    return model(x)


def sign_accuracy(f: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of examples with :math:`\\operatorname{sign} f(x) = y`."""
    f = check_tensor("f", f, ndim=1, floating=True)
    y = check_tensor("y", y, shape=(f.shape[0],), floating=True)
    return float(((f > 0).to(y.dtype) * 2 - 1 == y).double().mean())


def output_derivative(f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """:math:`\\chi = \\partial \\ell / \\partial f = -y\\,\\sigma(-y f)` for the
    logistic loss (Definition 3.1 of Malladi et al., 2023), per example."""
    f = check_tensor("f", f, ndim=1, floating=True)
    y = check_tensor("y", y, shape=(f.shape[0],), floating=True)
    return -y * torch.sigmoid(-y * f)


# -- linear models: the probe of the standard setting and the bag-of-words baseline
# -------
def fit_logistic_regression(
    features: torch.Tensor,
    y: torch.Tensor,
    *,
    reg: float,
    max_iter: int = 100,
    tol: float = 1e-10,
) -> tuple[torch.Tensor, float]:
    """L2-regularised logistic regression with an unpenalised intercept.

    Minimises (Newton's method with backtracking, float64)

    .. math:: \\frac1n\\sum_i \\log\\bigl(1+e^{-y_i(w^\\top z_i + b)}\\bigr)
        + \\frac{\\lambda}{2}\\lVert w\\rVert^2

    and returns ``(w, b)``. Used for linear probing on ``[CLS]`` features (the head that
    standard fine-tuning starts from) and for the bag-of-words baseline.
    """
    z = check_tensor("features", features, ndim=2, floating=True).double()
    n, d = z.shape
    y = check_tensor("y", y, shape=(n,)).double()
    if not bool(((y == 1) | (y == -1)).all()):
        raise ValueError("y must hold labels in {-1, +1}")
    reg = check_float("reg", reg, minimum=0.0, strict_min=True)
    max_iter = check_int("max_iter", max_iter, minimum=1)
    za = torch.cat([z, torch.ones(n, 1, dtype=torch.float64)], dim=1)
    pen = torch.full((d + 1,), reg, dtype=torch.float64)
    pen[-1] = 0.0
    theta = torch.zeros(d + 1, dtype=torch.float64)

    def objective(t):
        return float(F.softplus(-y * (za @ t)).mean() + 0.5 * (pen * t * t).sum())

    def newton_step(t):
        p = torch.sigmoid(-y * (za @ t))
        grad = za.T @ (-y * p) / n + pen * t
        hess = za.T @ ((p * (1 - p))[:, None] * za) / n + torch.diag(pen)
        hess = hess + 1e-10 * torch.eye(d + 1, dtype=torch.float64)
        return grad, torch.linalg.solve(hess, grad)

    theta = newton_minimize(objective, newton_step, theta, max_iter=max_iter, tol=tol)
    return theta[:d], float(theta[d])


def _select(candidates: list[dict]) -> dict:
    """The candidate with the best validation accuracy; ties go to the lower validation
    loss, then to the earlier candidate. Raises :class:`FineTuneDiverged` when every
    candidate diverged."""
    if not candidates or all(c["val_acc"] < 0 for c in candidates):
        raise FineTuneDiverged("every optimizer", float("nan"), -1, "every candidate")
    return min(
        enumerate(candidates),
        key=lambda ic: (-ic[1]["val_acc"], ic[1]["val_loss"], ic[0]),
    )[1]


def _scored(f_val, y_val, **extra) -> dict:
    """Validation accuracy and loss of a candidate (a diverged one scores worst)."""
    if not bool(torch.isfinite(f_val).all()):
        return {"val_acc": -1.0, "val_loss": math.inf, **extra}
    return {
        "val_acc": sign_accuracy(f_val.float(), y_val),
        "val_loss": float(logistic_loss(f_val.double(), y_val.double())),
        **extra,
    }


def logistic_probe_head(
    z_train: torch.Tensor,
    y_train: torch.Tensor,
    z_val: torch.Tensor,
    y_val: torch.Tensor,
    regs: tuple[float, ...],
) -> dict:
    """Logistic regression on features ``z`` with the ridge chosen on validation data.

    Returns ``{"w", "b", "reg", "val_acc", "val_loss"}`` of the chosen ridge (``regs``
    are tried in order; ties as in the rest of the chapter: accuracy, then loss).
    """
    z_train = check_tensor("z_train", z_train, ndim=2, floating=True)
    z_val = check_tensor("z_val", z_val, ndim=2, floating=True)
    if not regs:
        raise ValueError("regs must hold at least one ridge")
    out = []
    for reg in regs:
        w, b = fit_logistic_regression(z_train, y_train, reg=reg)
        out.append(_scored(z_val.double() @ w + b, y_val, w=w, b=b, reg=reg))
    return _select(out)


# -- the experiment of the chapter
# ------------------------------------------------------------
@dataclass(frozen=True)
class KernelExperimentConfig:
    """Few-shot fine-tuning vs its kernel analogs, over shots and seeds.

    Each run (a number of shots ``k`` and a seed) draws ``k`` training and ``k``
    validation examples per class. Fine-tuning takes ``steps`` full-batch steps. The SGD
    learning rate is :math:`\\eta = c / \\bar K`, with :math:`\\bar K` the mean of
    :math:`K(x_i, x_i)` over the training set in that setting (LoRA uses its own kernel)
    and :math:`c` chosen among ``sgd_lr_scales`` on the validation set; Adam's among
    ``adam_lrs``; the kernel ridge :math:`\\lambda` (relative to :math:`\\bar K`) among
    ``kernel_regs``; the ridge of the linear probe that the standard head starts from,
    and of the bag-of-words baseline, among ``probe_regs``. Ties in validation accuracy
    go to the lower validation loss. ``methods="sgd"`` runs only SGD fine-tuning and the
    eNTK in both settings, the linear probe and the bag of words (no Adam, LoRA or
    SignGD kernels), for the larger ``k`` where those are the comparisons that matter.

    ``analog_lr_scale`` (with ``analog_adam_lr`` and ``analog_signgd_reg``), when set,
    also records each run's fine-tuning at that fixed hyperparameter beside its own
    kernel analogs, with no validation choice: SGD at :math:`c` against the eNTK trained
    by the same ``T = steps`` gradient steps in function space (its step-matched analog,
    in both settings) and against the eNTK at ridge :math:`1/(cT)` (a ridge standing in
    for the stopping time), and Adam at ``analog_adam_lr`` against the asymmetric SignGD
    kernel at ridge ``analog_signgd_reg``. They must be in the grids, since the recorded
    numbers are those grid candidates.

    ``wide_scales`` with ``wide_checkpoints`` add the paper's wide search to SGD-FT in
    both settings: runs at each scale :math:`c`, read at each checkpoint (a step
    count), join the grid's runs, and the validated choice among all of them is
    recorded as ``"SGD-FT, wide grid"`` (its scale and step count in ``chosen``).
    """

    shots: tuple[int, ...] = (4, 16)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    n_test: int = 400
    steps: int = 30
    sgd_lr_scales: tuple[float, ...] = (2.0, 8.0, 32.0)
    adam_lrs: tuple[float, ...] = (1e-4, 3e-4, 1e-3)
    lora_rank: int = 8
    kernel_regs: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0)
    probe_regs: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0)
    methods: str = "all"
    analog_lr_scale: float | None = None
    analog_adam_lr: float = 5e-5
    analog_signgd_reg: float = 1 / 240
    wide_scales: tuple[float, ...] = ()
    wide_checkpoints: tuple[int, ...] = ()

    def __post_init__(self):
        for name in (
            "shots",
            "seeds",
            "sgd_lr_scales",
            "adam_lrs",
            "kernel_regs",
            "probe_regs",
        ):
            if not isinstance(getattr(self, name), tuple) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty tuple")
        for k in self.shots:
            check_int("shots", k, minimum=1)
        for s in self.seeds:
            check_int("seeds", s, minimum=0)
        check_int("n_test", self.n_test, minimum=2)
        check_int("steps", self.steps, minimum=1)
        for name in ("sgd_lr_scales", "adam_lrs", "kernel_regs", "probe_regs"):
            for v in getattr(self, name):
                check_float(name, v, minimum=0.0, strict_min=True)
        check_int("lora_rank", self.lora_rank, minimum=1)
        check_choice("methods", self.methods, ("all", "sgd"))
        if not isinstance(self.wide_scales, tuple) or not isinstance(
            self.wide_checkpoints, tuple
        ):
            raise ValueError("wide_scales and wide_checkpoints must be tuples")
        if bool(self.wide_scales) != bool(self.wide_checkpoints):
            raise ValueError(
                "wide_scales and wide_checkpoints must be given together, got "
                f"{self.wide_scales} and {self.wide_checkpoints}"
            )
        for v in self.wide_scales:
            check_float("wide_scales", v, minimum=0.0, strict_min=True)
        for t in self.wide_checkpoints:
            check_int("wide_checkpoints", t, minimum=1)
        if self.analog_lr_scale is not None:
            if self.analog_lr_scale not in self.sgd_lr_scales:
                raise ValueError(
                    f"analog_lr_scale {self.analog_lr_scale} must be one of "
                    f"sgd_lr_scales {self.sgd_lr_scales}"
                )
            self.analog_reg("sgd")  # raises when the analog ridge is not in the grid
            if self.methods == "all":
                if self.analog_adam_lr not in self.adam_lrs:
                    raise ValueError(
                        f"analog_adam_lr {self.analog_adam_lr} must be one of "
                        f"adam_lrs {self.adam_lrs}"
                    )
                self.analog_reg("asymmetric_signgd")

    def analog_reg(self, kernel: str) -> float:
        """The entry of ``kernel_regs`` that is the kernel analog of the fixed
        fine-tuning run: :math:`1/(cT)` for the eNTK, ``analog_signgd_reg`` for the
        asymmetric SignGD kernel."""
        target = (
            1.0 / (self.analog_lr_scale * self.steps)
            if kernel == "sgd"
            else self.analog_signgd_reg
        )
        for reg in self.kernel_regs:
            if math.isclose(reg, target, rel_tol=1e-9):
                return reg
        raise ValueError(
            f"kernel_regs {self.kernel_regs} must contain the {kernel} analog ridge "
            f"{target:.6g}"
        )


#: The methods of :func:`run_kernel_experiment`, by setting.
METHODS = {
    "prompt": (
        "zero-shot",
        "SGD-FT",
        "K-SGD",
        "Adam-FT",
        "K-A-SignGD",
        "K-SignGD",
        "LoRA-SGD-FT",
    ),
    "standard": ("LP", "SGD-FT", "K-SGD"),
    "bag of words": ("LR",),
}


@dataclass
class KernelExperiment:
    """Results of :func:`run_kernel_experiment`.

    ``accuracy[(setting, method, k)]`` is a list over seeds of test accuracies (settings
    and methods as in :data:`METHODS`); ``chosen[(setting, method, k)]`` the
    hyperparameter picked on validation data, per seed. ``dynamics[(setting, optimizer,
    k)]`` (optimizers ``"SGD"``, ``"Adam"``) is a dict of lists over seeds with
    ``acc0``, ``acc_ft``, ``acc_lin``, ``gain_recovered``, ``lin_error`` and
    ``kernel_change`` (see :func:`kernel_behaviour`) of the chosen run;
    ``by_lr[(setting, k)]`` holds ``lin_error`` and ``kernel_change`` for every SGD
    learning-rate scale (a list over seeds of lists over ``sgd_lr_scales``).
    ``example[setting]`` holds the test outputs ``f0``, ``f_lin`` and ``f_ft`` (one per
    learning-rate scale) of the first seed at the largest ``k``, for the figures.
    """

    config: KernelExperimentConfig
    accuracy: dict = field(default_factory=dict)
    chosen: dict = field(default_factory=dict)
    dynamics: dict = field(default_factory=dict)
    by_lr: dict = field(default_factory=dict)
    example: dict = field(default_factory=dict)
    diverged: dict = field(default_factory=dict)


def _kernel_fits(j, f0, y, regs, names) -> dict:
    """Kernel logistic regression for each kernel in ``names``, ridge chosen on the
    validation split. ``j``, ``f0``, ``y``: dicts with keys train/val/test. Returns
    ``{name: (test accuracy, chosen ridge)}`` and ``{name: {ridge: test accuracy}}``."""
    from ..theory.kernels import (
        fit_kernel_logistic,
        kernel_predict,
        kernels_from_jacobians,
    )

    k_tr = kernels_from_jacobians(
        j["train"], j["train"], kernels=("sgd", "asymmetric_signgd", "signgd")
    )
    k_ev = {
        split: kernels_from_jacobians(j[split], j["train"], kernels=names)
        for split in ("val", "test")
    }
    out, every = {}, {}
    for name in names:
        if name == "sgd":
            k, pen, scale = k_tr["sgd"], None, k_tr["sgd"]
        elif name == "asymmetric_signgd":
            k, pen, scale = k_tr["asymmetric_signgd"], k_tr["signgd"], k_tr["sgd"]
        else:  # the symmetric SignGD kernel: its own features sign g, its own scale
            k, pen, scale = k_tr["signgd"], None, k_tr["signgd"]
        mean_diag = float(scale.diagonal().mean())
        cands = []
        for reg in regs:
            alpha = fit_kernel_logistic(
                k, y["train"], reg=reg * mean_diag, f0=f0["train"], penalty=pen
            )
            f_val = kernel_predict(k_ev["val"][name], alpha, f0["val"])
            f_te = kernel_predict(k_ev["test"][name], alpha, f0["test"])
            cands.append(_scored(f_val, y["val"], test=f_te, reg=reg))
        best = _select(cands)
        out[name] = (sign_accuracy(best["test"].float(), y["test"]), best["reg"])
        every[name] = {
            c["reg"]: sign_accuracy(c["test"].float(), y["test"]) for c in cands
        }
    return out, every


def kernel_behaviour(
    model0: nn.Module,
    tuned: nn.Module,
    x_train: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    *,
    j_te: torch.Tensor | None = None,
    j_tr0: torch.Tensor | None = None,
    f0_te: torch.Tensor | None = None,
) -> dict:
    """How close fine-tuning from ``model0`` to ``tuned`` was to kernel behaviour
    (Definition 3.2).

    *Linearization*: the first-order Taylor model :math:`f_{lin} = f_0 +
    J_{test}(\\theta_{FT} - \\theta_0)` on the test set against the fine-tuned outputs:
    ``lin_error`` = :math:`\\|f_{FT} - f_{lin}\\| / \\|f_{FT} - f_0\\|`, the accuracies
    ``acc0``, ``acc_ft``, ``acc_lin`` and ``gain_recovered`` = :math:`(acc_{lin} -
    acc_0)/(acc_{FT} - acc_0)`. *Fixed Features*: ``kernel_change``, the relative
    Frobenius distance between the eNTKs on the training set at :math:`\\theta_0` and
    :math:`\\theta_{FT}`. The test Jacobian ``j_te``, the training Jacobian ``j_tr0``
    and ``f0_te`` at :math:`\\theta_0` may be passed in when already computed. Also
    returns the output vectors ``f0``, ``f_ft``, ``f_lin``.
    """
    from ..theory.kernels import (
        flat_params,
        jacobian,
        kernel_distance,
        kernels_from_jacobians,
    )

    j_te = jacobian(model0, x_test) if j_te is None else j_te
    j_tr0 = jacobian(model0, x_train) if j_tr0 is None else j_tr0
    f0_te = outputs(model0, x_test) if f0_te is None else f0_te
    delta = flat_params(tuned) - flat_params(model0)
    f_ft = outputs(tuned, x_test)
    f_lin = f0_te + j_te @ delta
    j_tr1 = jacobian(tuned, x_train)
    k0 = kernels_from_jacobians(j_tr0, j_tr0)["sgd"]
    k1 = kernels_from_jacobians(j_tr1, j_tr1)["sgd"]
    acc0, acc_ft, acc_lin = (
        sign_accuracy(f0_te, y_test),
        sign_accuracy(f_ft, y_test),
        sign_accuracy(f_lin, y_test),
    )
    return {
        "acc0": acc0,
        "acc_ft": acc_ft,
        "acc_lin": acc_lin,
        "gain_recovered": (acc_lin - acc0) / (acc_ft - acc0)
        if acc_ft != acc0
        else float("nan"),
        "lin_error": float((f_ft - f_lin).norm() / (f_ft - f0_te).norm()),
        "kernel_change": kernel_distance(k0, k1),
        "f0": f0_te,
        "f_ft": f_ft,
        "f_lin": f_lin,
    }


_DYNAMICS = (
    "acc0",
    "acc_ft",
    "acc_lin",
    "gain_recovered",
    "lin_error",
    "kernel_change",
)


def _fine_tune_grid(model0, data, x_key, configs, seed, *, dynamics=None):
    """Fine-tune ``model0`` with every config; return the candidates scored on the
    validation set (with test outputs), and the kernel behaviour of each when
    ``dynamics`` (a dict of Jacobians and outputs at theta_0) is given."""
    cands = []
    for value, ft_config in configs:
        try:
            tuned = fine_tune_logistic(
                model0,
                getattr(data["train"], x_key),
                data["train"].y,
                ft_config,
                seed=seed,
            )
        except FineTuneDiverged:
            tuned = None
        diverged = tuned is None
        if diverged:  # a learning rate too large for this run: dropped and counted
            cand = {"val_acc": -1.0, "val_loss": math.inf, "value": value}
            cand["diverged"] = True
            f_te = torch.zeros(data["test"].y.shape[0])
            cand["test"] = f_te
            if dynamics is not None:
                nan = float("nan")
                cand["stats"] = {
                    **{m: nan for m in _DYNAMICS},
                    "f0": dynamics["f0_te"],
                    "f_ft": f_te,
                    "f_lin": f_te,
                }
            cands.append(cand)
            continue
        f_val = outputs(tuned, getattr(data["val"], x_key))
        cand = _scored(f_val, data["val"].y, value=value, model=tuned)
        if dynamics is None:
            cand["test"] = outputs(tuned, getattr(data["test"], x_key))
        else:
            stats = kernel_behaviour(
                model0,
                tuned,
                getattr(data["train"], x_key),
                getattr(data["test"], x_key),
                data["test"].y,
                **dynamics,
            )
            cand["test"] = stats["f_ft"]
            cand["stats"] = stats
        cands.append(cand)
    return cands


def _mean_diag(j_train: torch.Tensor) -> float:
    """:math:`\\bar K`, the mean of :math:`K(x_i, x_i) = \\lVert g(x_i)\\rVert^2` over
    the rows of the training Jacobian: SGD's learning rate is :math:`c/\\bar K`."""
    return float(j_train.pow(2).sum(1).mean())


def _wide_grid(model0, data, x_key, lazy, j_train, config, seed) -> tuple[dict, int]:
    """The validated choice among the grid's SGD runs ``lazy`` (candidates of
    :func:`_fine_tune_grid`) and runs at each of ``config.wide_scales`` (learning rate
    :math:`c/\\bar K`, ``j_train`` the training Jacobian), read at each of
    ``config.wide_checkpoints``; also the number of those runs that diverged."""
    j_scale = _mean_diag(j_train)
    cands = [
        {**c, "scale": c["value"], "steps": config.steps}
        for c in lazy
        if not c.get("diverged")
    ]
    diverged = 0
    x_val, x_test = getattr(data["val"], x_key), getattr(data["test"], x_key)

    def record(scale):
        def on_checkpoint(t, model):  # the test set is read for the chosen one only
            cand = _scored(outputs(model, x_val), data["val"].y, scale=scale, steps=t)
            cand["state"] = copy.deepcopy(model.state_dict())
            cands.append(cand)

        return on_checkpoint

    for scale in config.wide_scales:
        ft = LogisticFineTuneConfig(
            "sgd", scale / j_scale, max(config.wide_checkpoints)
        )
        try:
            fine_tune_logistic(
                model0,
                getattr(data["train"], x_key),
                data["train"].y,
                ft,
                seed=seed,
                checkpoints=config.wide_checkpoints,
                on_checkpoint=record(scale),
            )
        except FineTuneDiverged:  # its finite checkpoints stay candidates
            diverged += 1
    best = _select(cands)
    if "test" not in best:
        model = copy.deepcopy(model0)
        model.load_state_dict(best["state"])
        best["test"] = outputs(model.eval(), x_test)
    return best, diverged


def same_steps_outputs(j, f0, y, scale: float, steps: int) -> torch.Tensor:
    """Test outputs (float64) of the eNTK's step-matched analog of the SGD-FT run at
    scale ``scale``: ``steps`` gradient steps of rate :math:`c/\\bar K` in function
    space (:func:`~fmlab.theory.kernels.kernel_gradient_descent`). ``j``, ``f0``,
    ``y``: dicts with keys train/test."""
    from ..theory.kernels import kernel_gradient_descent, kernels_from_jacobians

    k_tr = kernels_from_jacobians(j["train"], j["train"])["sgd"]
    k_te = kernels_from_jacobians(j["test"], j["train"])["sgd"]
    f_te = kernel_gradient_descent(
        k_tr,
        k_te,
        y["train"],
        lr=scale / _mean_diag(j["train"]),  # the run's rate
        steps=steps,
        f0_train=f0["train"],
        f0_eval=f0["test"],
    )
    return f_te


def _one_run(mlm, lang, k, seed, config, test, prompt_test, z_test, bow_test):
    """Every method of the chapter on one k-shot training set; see
    :class:`KernelExperiment`."""
    from ..adapt.lora import apply_lora
    from ..theory.kernels import jacobian

    data = {
        "train": few_shot_task(lang, k, seed),
        "val": few_shot_task(lang, k, seed, split="validation"),
        "test": test,
    }
    y = {split: d.y for split, d in data.items()}
    acc, chosen, dyn, by_lr, example, diverged = {}, {}, {}, {}, {}, {}
    seed_everything(seed)

    def count_diverged(setting, method, cands):
        diverged[(setting, method)] = sum(bool(c.get("diverged")) for c in cands)

    def analog(cands, value):
        """Test accuracy of the grid candidate at ``value`` (it must not diverge)."""
        (cand,) = [c for c in cands if c["value"] == value]
        if cand.get("diverged"):
            raise FineTuneDiverged("the analog run", float(value), -1, "its output")
        return sign_accuracy(cand["test"], test.y)

    def sgd_configs(j_train):
        mean_diag = _mean_diag(j_train)
        return [
            (c, LogisticFineTuneConfig("sgd", c / mean_diag, config.steps))
            for c in config.sgd_lr_scales
        ]

    def record_sgd(setting, cands):
        count_diverged(setting, "SGD-FT", cands)
        best = _select(cands)
        acc[(setting, "SGD-FT")] = sign_accuracy(best["test"], test.y)
        chosen[(setting, "SGD-FT")] = best["value"]
        dyn[(setting, "SGD")] = {m: best["stats"][m] for m in _DYNAMICS}
        by_lr[setting] = {
            m: [c["stats"][m] for c in cands] for m in ("lin_error", "kernel_change")
        }
        example[setting] = {
            "f0": cands[0]["stats"]["f0"],
            "f_ft": torch.stack([c["stats"]["f_ft"] for c in cands]),
            "f_lin": torch.stack([c["stats"]["f_lin"] for c in cands]),
        }

    def record_wide(setting, model0, x_key, lazy, j_train):
        if not config.wide_scales:
            return
        best, n = _wide_grid(model0, data, x_key, lazy, j_train, config, seed)
        diverged[(setting, "SGD-FT, wide grid")] = n
        acc[(setting, "SGD-FT, wide grid")] = sign_accuracy(best["test"], test.y)
        chosen[(setting, "SGD-FT, wide grid")] = best["scale"]
        chosen[(setting, "SGD-FT, wide grid, steps")] = best["steps"]

    # -- prompt-based
    # -------------------------------------------------------------------
    prompt0, j_te, f0_te = prompt_test
    j = {"test": j_te}
    f0 = {"test": f0_te}
    for split in ("train", "val"):
        j[split] = jacobian(prompt0, data[split].x_prompt)
        f0[split] = outputs(prompt0, data[split].x_prompt)
    acc[("prompt", "zero-shot")] = sign_accuracy(f0_te, test.y)
    everything = config.methods == "all"
    names = ("sgd", "asymmetric_signgd", "signgd") if everything else ("sgd",)
    fits, every_fit = _kernel_fits(j, f0, y, config.kernel_regs, names)
    for name, method in (
        ("sgd", "K-SGD"),
        ("asymmetric_signgd", "K-A-SignGD"),
        ("signgd", "K-SignGD"),
    ):
        if name in fits:
            acc[("prompt", method)], chosen[("prompt", method)] = fits[name]
    dynamics = {"j_te": j_te, "j_tr0": j["train"], "f0_te": f0_te}
    cands = _fine_tune_grid(
        prompt0, data, "x_prompt", sgd_configs(j["train"]), seed, dynamics=dynamics
    )
    record_sgd("prompt", cands)
    record_wide("prompt", prompt0, "x_prompt", cands, j["train"])
    fixed = config.analog_lr_scale
    if fixed is not None:  # the run at c and its own kernel analogs, no validation
        acc[("prompt", "SGD-FT, fixed c")] = analog(cands, fixed)
        acc[("prompt", "K-SGD, analog ridge")] = every_fit["sgd"][
            config.analog_reg("sgd")
        ]
        acc[("prompt", "K-SGD, same steps")] = sign_accuracy(
            same_steps_outputs(j, f0, y, fixed, config.steps).float(), y["test"]
        )
    if everything:
        adam = [
            (lr, LogisticFineTuneConfig("adam", lr, config.steps))
            for lr in config.adam_lrs
        ]
        cands = _fine_tune_grid(prompt0, data, "x_prompt", adam, seed)
        count_diverged("prompt", "Adam-FT", cands)
        if fixed is not None:
            acc[("prompt", "Adam-FT, fixed lr")] = analog(cands, config.analog_adam_lr)
            acc[("prompt", "K-A-SignGD, analog ridge")] = every_fit[
                "asymmetric_signgd"
            ][config.analog_reg("asymmetric_signgd")]
        best = _select(cands)
        acc[("prompt", "Adam-FT")] = sign_accuracy(best["test"], test.y)
        chosen[("prompt", "Adam-FT")] = best["value"]
        stats = kernel_behaviour(  # the kernel behaviour of the chosen Adam run
            prompt0,
            best["model"],
            data["train"].x_prompt,
            test.x_prompt,
            test.y,
            **dynamics,
        )
        dyn[("prompt", "Adam")] = {m: stats[m] for m in _DYNAMICS}
        lora = apply_lora(prompt0, config.lora_rank, seed=seed)
        cands = _fine_tune_grid(
            lora,
            data,
            "x_prompt",
            sgd_configs(jacobian(lora, data["train"].x_prompt)),
            seed,
        )
        count_diverged("prompt", "LoRA-SGD-FT", cands)
        best = _select(cands)
        acc[("prompt", "LoRA-SGD-FT")] = sign_accuracy(best["test"], test.y)
        chosen[("prompt", "LoRA-SGD-FT")] = best["value"]

    # -- standard: linear probe on [CLS], then fine-tune from it ----------------------
    z = {"test": z_test}
    for split in ("train", "val"):
        z[split] = outputs(mlm.hidden, data[split].x_plain)[:, 0]
    probe = logistic_probe_head(
        z["train"], y["train"], z["val"], y["val"], config.probe_regs
    )
    acc[("standard", "LP")] = sign_accuracy(
        (z_test.double() @ probe["w"] + probe["b"]).float(), test.y
    )
    chosen[("standard", "LP")] = probe["reg"]
    std0 = CLSClassifier(mlm, head=(probe["w"], probe["b"]))
    j, f0 = {}, {}
    for split in ("train", "val", "test"):
        j[split] = jacobian(std0, data[split].x_plain)
        f0[split] = outputs(std0, data[split].x_plain)
    fits, _ = _kernel_fits(j, f0, y, config.kernel_regs, ("sgd",))
    acc[("standard", "K-SGD")], chosen[("standard", "K-SGD")] = fits["sgd"]
    dynamics = {"j_te": j["test"], "j_tr0": j["train"], "f0_te": f0["test"]}
    cands = _fine_tune_grid(
        std0, data, "x_plain", sgd_configs(j["train"]), seed, dynamics=dynamics
    )
    record_sgd("standard", cands)
    record_wide("standard", std0, "x_plain", cands, j["train"])
    if fixed is not None:
        acc[("standard", "SGD-FT, fixed c")] = analog(cands, fixed)
        acc[("standard", "K-SGD, same steps")] = sign_accuracy(
            same_steps_outputs(j, f0, y, fixed, config.steps).float(), y["test"]
        )
    del j

    # -- a bag of words
    # -----------------------------------------------------------------
    bow = {split: lang.bag_of_words(data[split].words) for split in ("train", "val")}
    fit = logistic_probe_head(
        bow["train"], y["train"], bow["val"], y["val"], config.probe_regs
    )
    acc[("bag of words", "LR")] = sign_accuracy(
        (bow_test.double() @ fit["w"] + fit["b"]).float(), test.y
    )
    chosen[("bag of words", "LR")] = fit["reg"]
    return acc, chosen, dyn, by_lr, example, diverged


def _key(*parts) -> str:
    return "|".join(str(p) for p in parts)


def run_kernel_experiment(
    pretrain: MLMPretrainConfig = MLMPretrainConfig(),
    config: KernelExperimentConfig = KernelExperimentConfig(),
) -> KernelExperiment:
    """Fine-tune the masked LM pretrained with ``pretrain`` few-shot and fit the kernel
    analogs, for every ``k`` in ``config.shots`` and seed in ``config.seeds``; see
    :class:`KernelExperiment`. The results are computed once per (``pretrain``,
    ``config``, seed offset) and then read from the on-disk cache."""
    from ..theory.kernels import jacobian

    if not isinstance(pretrain, MLMPretrainConfig):
        raise TypeError(
            f"pretrain must be a MLMPretrainConfig, got {type(pretrain).__name__}"
        )
    if not isinstance(config, KernelExperimentConfig):
        raise TypeError(
            f"config must be a KernelExperimentConfig, got {type(config).__name__}"
        )

    def build():
        mlm, _ = pretrain_masked_lm(pretrain)
        lang = SentimentLanguage(pretrain.language)
        test = test_set(lang, config.n_test)
        prompt0 = PromptClassifier(mlm, lang)
        prompt_test = (
            prompt0,
            jacobian(prompt0, test.x_prompt),
            outputs(prompt0, test.x_prompt),
        )
        z_test = outputs(mlm.hidden, test.x_plain)[:, 0]
        bow_test = lang.bag_of_words(test.words)
        entry = {
            "accuracy": {},
            "chosen": {},
            "dynamics": {},
            "by_lr": {},
            "diverged": {},
        }
        runs = [(k, seed) for k in config.shots for seed in config.seeds]
        for k, seed in progress(runs, total=len(runs), desc="few-shot runs"):
            acc, chosen, dyn, by_lr, example, diverged = _one_run(
                mlm, lang, k, seed, config, test, prompt_test, z_test, bow_test
            )
            for (setting, method), n in diverged.items():
                key = _key(setting, method, k)
                entry["diverged"][key] = entry["diverged"].get(key, 0) + n
            for (setting, method), v in acc.items():
                entry["accuracy"].setdefault(_key(setting, method, k), []).append(v)
            for (setting, method), v in chosen.items():
                entry["chosen"].setdefault(_key(setting, method, k), []).append(
                    float(v)
                )
            for (setting, opt), stats in dyn.items():
                d = entry["dynamics"].setdefault(_key(setting, opt, k), {})
                for m, v in stats.items():
                    d.setdefault(m, []).append(float(v))
            for setting, stats in by_lr.items():
                d = entry["by_lr"].setdefault(_key(setting, k), {})
                for m, v in stats.items():
                    d.setdefault(m, []).append([float(u) for u in v])
            if seed == config.seeds[0] and k == max(config.shots):
                entry["example"] = example
        return entry

    entry = cached(
        {"pretrain": pretrain, "experiment": config},
        build,
        name="ch4_fewshot",
    )

    def split(key):
        parts = key.split("|")
        return (*parts[:-1], int(parts[-1]))

    return KernelExperiment(
        config=config,
        accuracy={split(k): v for k, v in entry["accuracy"].items()},
        chosen={split(k): v for k, v in entry["chosen"].items()},
        dynamics={split(k): v for k, v in entry["dynamics"].items()},
        by_lr={split(k): v for k, v in entry["by_lr"].items()},
        example=entry["example"],
        diverged={split(k): v for k, v in entry["diverged"].items()},
    )


# -- Theorem 4.3: one SignGD step, as the asymmetric kernel predicts
# -------------------------------
@dataclass
class SignGDStepCheck:
    """Output of :func:`signgd_step_check` (float64 throughout)."""

    lrs: list
    actual: list  # the change of f on the evaluation inputs, per learning rate
    predicted: list  # -lr * sign(chi) * K_A(x, x_t), per learning rate
    rel_error: list  # ||actual - predicted|| / ||predicted||, per learning rate
    k_asym: torch.Tensor  # K_A(x, x_t)
    k_sgd: torch.Tensor  # K(x, x_t), the eNTK column, for comparison
    chi: float


def _shift_params(model: nn.Module, vector: torch.Tensor) -> None:
    """Add ``vector`` (laid out as :func:`~fmlab.theory.kernels.flat_params`) to the
    trainable parameters."""
    start = 0
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(vector[start : start + p.numel()].view_as(p))
                start += p.numel()


def signgd_step_check(
    model: nn.Module,
    x_step: torch.Tensor,
    y_step: float,
    x_eval: torch.Tensor,
    lrs: tuple[float, ...],
) -> SignGDStepCheck:
    """Take one SignGD step on the single example ``(x_step, y_step)`` and compare the
    change of :math:`f` on ``x_eval`` with Theorem 4.3, :math:`f_{t+1}(x) - f_t(x)
    \\approx -\\eta\\,\\operatorname{sign}(\\chi_t)\\,K^{(A\\text{-}SignGD)}(x, x_t)`.

    The step is :math:`\\theta \\leftarrow \\theta -
    \\eta\\,\\operatorname{sign}(\\chi_t\\, g(x_t))`; the check runs in float64 on a
    copy of ``model``, once per learning rate in ``lrs``.
    """
    from ..theory.kernels import jacobian

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    x_step = check_tensor("x_step", x_step, ndim=1, integer=True)
    x_eval = check_tensor("x_eval", x_eval, ndim=2, integer=True)
    y_step = check_float("y_step", y_step)
    if y_step not in (-1.0, 1.0):
        raise ValueError(f"y_step must be -1 or +1, got {y_step}")
    lrs = [check_float("lrs", lr, minimum=0.0, strict_min=True) for lr in lrs]
    if not lrs:
        raise ValueError("lrs must hold at least one learning rate")
    base = copy.deepcopy(model).double()
    g = jacobian(base, x_step[None])[0]
    f_t = outputs(base, x_step[None])
    chi = float(output_derivative(f_t, torch.tensor([y_step], dtype=torch.float64))[0])
    j_eval = jacobian(base, x_eval)
    k_asym, k_sgd = j_eval @ g.sign(), j_eval @ g
    direction = math.copysign(1.0, chi) * g.sign()
    f0 = outputs(base, x_eval)
    actual, predicted, errors = [], [], []
    for lr in lrs:
        stepped = copy.deepcopy(base)
        _shift_params(stepped, -lr * direction)
        change = outputs(stepped, x_eval) - f0
        pred = -lr * math.copysign(1.0, chi) * k_asym
        actual.append(change)
        predicted.append(pred)
        errors.append(float((change - pred).norm() / pred.norm()))
    return SignGDStepCheck(lrs, actual, predicted, errors, k_asym, k_sgd, chi)


# -- LoRA: the kernel through a random projection
# ---------------------------------------------
@dataclass
class LoRAKernelErrors:
    """Output of :func:`lora_kernel_errors`."""

    k_full: torch.Tensor  # the SGD kernel of the adapted weight matrices
    errors: dict  # rank -> list over seeds of ||K_LoRA - K|| / ||K||
    examples: dict  # rank -> K_LoRA for the first seed


def lora_kernel_errors(
    model: nn.Module, x: torch.Tensor, ranks: tuple[int, ...], seeds: tuple[int, ...]
) -> LoRAKernelErrors:
    """Relative Frobenius error of the LoRA kernel (Theorem 7.2) for each rank and seed.

    :math:`K` is the SGD kernel of the weight matrices LoRA adapts (those of
    :func:`fmlab.adapt.lora.lora_targets`), :math:`K_{LoRA}` its random projection with
    :math:`A \\sim \\mathcal N(0, 1/k)`
    (:func:`fmlab.theory.kernels.lora_projected_kernel`).
    """
    from ..adapt.lora import lora_targets, weight_gradients
    from ..theory.kernels import lora_projected_kernel

    ranks = [check_int("ranks", r, minimum=1) for r in ranks]
    seeds = [check_int("seeds", s_, minimum=0) for s_ in seeds]
    if not ranks or not seeds:
        raise ValueError("ranks and seeds must be non-empty")
    targets = lora_targets(model)
    grads = weight_gradients(model, x, targets)
    k_full = sum(
        g.reshape(g.shape[0], -1) @ g.reshape(g.shape[0], -1).T for g in grads.values()
    )
    errors, examples = {}, {}
    for r in ranks:
        for seed in seeds:
            gen = make_generator(1000 * seed + r)
            proj = {
                name: torch.randn(r, g.shape[2], generator=gen) / r**0.5
                for name, g in grads.items()
            }
            k_lora = lora_projected_kernel(grads, grads, proj)
            errors.setdefault(r, []).append(
                float((k_lora - k_full).norm() / k_full.norm())
            )
            examples.setdefault(r, k_lora)
    return LoRAKernelErrors(k_full, errors, examples)


# -- Definition 5.3: does the output derivative shrink with width?
# ------------------------
def output_derivative_by_width(
    base: MLMPretrainConfig,
    widths: tuple[int, ...],
    seeds: tuple[int, ...],
    *,
    steps: tuple[int, ...] | None = None,
    n_test: int = 400,
) -> dict:
    """Mean :math:`|\\chi|` at the start of prompt-based fine-tuning, on a test set of
    the downstream task, for models pretrained with ``base`` at each width ``d_model``
    (for ``steps[i]`` steps at ``widths[i]``; default ``base.steps``) and seed: the
    cheap test of Section 5 of Malladi et al. (2023). Returns ``{("chi", width): [...],
    ("accuracy", width): [...]}``, lists over seeds of the mean :math:`|\\chi|` and the
    zero-shot accuracy of the prompt."""
    import dataclasses

    if not isinstance(base, MLMPretrainConfig):
        raise TypeError(f"base must be a MLMPretrainConfig, got {type(base).__name__}")
    widths = tuple(check_int("widths", w, minimum=1) for w in widths)
    seeds = tuple(check_int("seeds", s, minimum=0) for s in seeds)
    if not widths or not seeds:
        raise ValueError("widths and seeds must be non-empty")
    steps = (base.steps,) * len(widths) if steps is None else tuple(steps)
    if len(steps) != len(widths):
        raise ValueError(
            f"steps must give one number per width ({len(widths)}), got {len(steps)}"
        )
    lang = SentimentLanguage(base.language)
    test = test_set(lang, n_test)
    out = {}
    for width, n_steps in zip(widths, steps):
        for seed in seeds:
            config = dataclasses.replace(
                base,
                d_model=width,
                steps=check_int("steps", n_steps, minimum=1),
                seed=seed,
            )
            mlm, _ = pretrain_masked_lm(config)
            f = outputs(PromptClassifier(mlm, lang), test.x_prompt)
            out.setdefault(("chi", width), []).append(
                float(output_derivative(f, test.y).abs().mean())
            )
            out.setdefault(("accuracy", width), []).append(sign_accuracy(f, test.y))
    return out


def entk_accuracy(
    model: nn.Module,
    trains: list[FewShotTask],
    test: FewShotTask,
    *,
    reg_rel: float = 1e-3,
) -> list[float]:
    """Test accuracy of prompt-based eNTK regression (:math:`K^{(SGD)}`, pretrained
    outputs added, ridge :math:`\\lambda = ` ``reg_rel`` times the mean diagonal, no
    validation) for each training set in ``trains``; the test Jacobian is computed once.
    The inputs are the prompted ones (``x_prompt``)."""
    from ..theory.kernels import jacobian

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(test, FewShotTask) or not all(
        isinstance(t, FewShotTask) for t in trains
    ):
        raise TypeError("trains and test must be FewShotTask objects")
    if not trains:
        raise ValueError("trains must hold at least one training set")
    reg_rel = check_float("reg_rel", reg_rel, minimum=0.0, strict_min=True)
    j_te, f0_te = jacobian(model, test.x_prompt), outputs(model, test.x_prompt)
    out = []
    for train in trains:
        j = {"train": jacobian(model, train.x_prompt), "test": j_te}
        f0 = {"train": outputs(model, train.x_prompt), "test": f0_te}
        j["val"], f0["val"] = j["train"][:1], f0["train"][:1]
        y = {"train": train.y, "val": train.y[:1], "test": test.y}
        out.append(_kernel_fits(j, f0, y, (reg_rel,), ("sgd",))[0]["sgd"][0])
    return out


# -- the chapter's pages: the setting, and runners that return what a section shows
# ---------
@dataclass(frozen=True)
class ChapterConfig:
    """The pretrained models and the shared test set of Chapter 4 (both pages).

    The model of the experiments is :attr:`pretrain` (seed 0); the width test of
    naturalness pretrains every seed of ``pretrain_seeds`` at width ``d_model`` and at
    the narrow width ``narrow`` (for ``narrow_steps`` steps).
    """

    prior_positive: float = 0.8  # share of positive pretraining documents
    d_model: int = 32
    pretrain_steps: int = 2000
    pretrain_seeds: tuple[int, ...] = (0, 1, 2)
    narrow: int = 16
    narrow_steps: int = 3000
    n_test: int = 1000

    def __post_init__(self):
        check_float("prior_positive", self.prior_positive, minimum=0.0, maximum=1.0)
        for name in ("d_model", "pretrain_steps", "narrow", "narrow_steps"):
            check_int(name, getattr(self, name), minimum=1)
        if not isinstance(self.pretrain_seeds, tuple) or not self.pretrain_seeds:
            raise ValueError("pretrain_seeds must be a non-empty tuple")
        check_int("n_test", self.n_test, minimum=2)

    @property
    def pretrain(self) -> MLMPretrainConfig:
        """The pretraining of the model of the experiments (seed 0)."""
        return MLMPretrainConfig(
            language=SentimentLanguageConfig(prior_positive=self.prior_positive),
            d_model=self.d_model,
            steps=self.pretrain_steps,
        )

    @property
    def widths(self) -> tuple[int, int]:
        """The two widths of the naturalness test, narrow first."""
        return (self.narrow, self.d_model)


@dataclass
class Setting:
    """The language, the pretrained model of the experiments and the shared test set
    (:func:`setting`)."""

    config: ChapterConfig
    lang: SentimentLanguage
    mlm: TinyTransformer
    pretrain_losses: torch.Tensor  # the masked-LM loss at every pretraining step
    test: FewShotTask
    prompt_model: PromptClassifier  # f_prompt with the label words great / terrible
    zero_shot: float  # test accuracy of the prompt, no example seen
    bayes_accuracy: float  # Bayes-optimal accuracy on the task
    n_params: int  # parameters of the prompt-based model


def setting(config: ChapterConfig = ChapterConfig()) -> Setting:
    """Pretrain (or load from the cache) the model of the experiments, draw the test
    set, and score the zero-shot prompt; see :class:`Setting`."""
    if not isinstance(config, ChapterConfig):
        raise TypeError(f"config must be a ChapterConfig, got {type(config).__name__}")
    lang = SentimentLanguage(config.pretrain.language)
    mlm, losses = pretrain_masked_lm(config.pretrain)
    test = test_set(lang, config.n_test)
    prompt_model = PromptClassifier(mlm, lang)
    zero_shot = sign_accuracy(outputs(prompt_model, test.x_prompt), test.y)
    return Setting(
        config=config,
        lang=lang,
        mlm=mlm,
        pretrain_losses=losses,
        test=test,
        prompt_model=prompt_model,
        zero_shot=zero_shot,
        bayes_accuracy=lang.bayes_accuracy(),
        n_params=sum(p.numel() for p in prompt_model.parameters()),
    )


def bag_of_words_accuracy(
    lang: SentimentLanguage, n: int = 20_000, *, reg: float = 1e-3, seed: int = 99
) -> float:
    """Test accuracy of a linear bag of words (logistic regression on word counts,
    ridge ``reg``) trained on ``n`` task reviews and tested on ``n`` others."""
    if not isinstance(lang, SentimentLanguage):
        raise TypeError(f"lang must be a SentimentLanguage, got {type(lang).__name__}")
    n = check_int("n", n, minimum=1)
    s, w, _ = lang.sample_sentences(2 * n, make_generator(seed), domain="task")
    bow_w, bow_b = fit_logistic_regression(
        lang.bag_of_words(w[:n]), s[:n].double(), reg=reg
    )
    return sign_accuracy(
        (lang.bag_of_words(w[n:]).double() @ bow_w + bow_b).float(), s[n:].float()
    )


def best_multiple_residual(change: torch.Tensor, column: torch.Tensor) -> float:
    """:math:`\\lVert a - c\\,k\\rVert / \\lVert a\\rVert` for the best scalar
    :math:`c`: how well a multiple of the kernel column ``k`` describes the change
    ``a``."""
    c = (change @ column) / (column @ column)
    return float((change - c * column).norm() / change.norm())


@dataclass
class SignGDSteps:
    """Output of :func:`signgd_steps`: Theorem 4.3 checked on single steps."""

    lrs: tuple
    checks: list  # one SignGDStepCheck per training example
    errors: np.ndarray  # (example, lr): relative error of the A-SignGD prediction
    entk_residual: np.ndarray  # (example, lr): best multiple of the eNTK column


def signgd_steps(
    s: Setting,
    lrs: tuple[float, ...],
    *,
    n_examples: int = 3,
    n_eval: int = 100,
    shots: int = 16,
) -> SignGDSteps:
    """One SignGD step on each of the first ``n_examples`` examples of the first
    ``shots``-shot training set, evaluated on ``n_eval`` test sentences, for each
    learning rate (:func:`signgd_step_check`); with the eNTK column's best multiple
    for contrast."""
    train = few_shot_task(s.lang, shots, seed=0)
    checks = [
        signgd_step_check(
            s.prompt_model,
            train.x_prompt[i],
            float(train.y[i]),
            s.test.x_prompt[:n_eval],
            lrs,
        )
        for i in range(check_int("n_examples", n_examples, minimum=1))
    ]
    return SignGDSteps(
        lrs=tuple(lrs),
        checks=checks,
        errors=np.array([c.rel_error for c in checks]),
        entk_residual=np.array(
            [[best_multiple_residual(a, c.k_sgd) for a in c.actual] for c in checks]
        ),
    )


def lazy_grid(steps: int) -> dict:
    """The grids of lazy fine-tuning for ``steps`` full-batch steps: SGD scales
    :math:`c \\in \\{1/2, 1, 2\\}` and the ridges :math:`1/(cT)` that match
    :math:`c \\in \\{1/2, 1, 2, 4, 8\\}` (keyword arguments of
    :class:`KernelExperimentConfig`)."""
    steps = check_int("steps", steps, minimum=1)
    regs = tuple(1 / (c * steps) for c in (0.5, 1, 2, 4, 8))
    return dict(steps=steps, sgd_lr_scales=(0.5, 1.0, 2.0), kernel_regs=regs)


def wide_grid(
    steps: int,
    scales: tuple[float, ...] = (4.0, 16.0, 64.0),
    checkpoints: tuple[int, ...] = (30, 100),
) -> dict:
    """:func:`lazy_grid` widened for the validated comparison of the paper: SGD-FT
    also runs at the larger ``scales``, read at each of ``checkpoints`` (step counts),
    and the kernel's ridges are :math:`1/(ct)` for every fine-tuning candidate's scale
    and step count, so that both sides search matching ranges (keyword arguments of
    :class:`KernelExperimentConfig`)."""
    grid = lazy_grid(steps)
    for t in checkpoints:
        check_int("checkpoints", t, minimum=1)
    for c in scales:
        check_float("scales", c, minimum=0.0, strict_min=True)
    wide = {1 / (c * t) for c in scales for t in checkpoints}
    regs = sorted(set(grid["kernel_regs"]) | wide, reverse=True)
    return dict(
        grid,
        kernel_regs=tuple(regs),
        wide_scales=tuple(float(c) for c in scales),
        wide_checkpoints=tuple(int(t) for t in checkpoints),
    )


@dataclass
class FewShotRuns:
    """The experiments of :func:`few_shot_runs`, one per number of shots, merged.

    ``accuracy[(setting, method, k)]``: test accuracies per run (an array);
    ``dynamics[(setting, optimizer, k)][measure]``: the kernel-behaviour measures of
    the chosen runs (arrays); ``by_lr[(setting, k)]``, ``chosen`` and ``examples[k]``
    as in :class:`KernelExperiment`; ``diverged``: the fine-tuning candidates that
    diverged (dropped), all runs together.
    """

    configs: tuple
    accuracy: dict
    dynamics: dict
    by_lr: dict
    chosen: dict
    examples: dict
    lr_scales: dict  # k -> the SGD learning-rate scales of its grid
    diverged: int

    @property
    def shots(self) -> tuple[int, ...]:
        return tuple(k for c in self.configs for k in c.shots)

    def points(self, a: tuple[str, str], b: tuple[str, str], k: int) -> np.ndarray:
        """Per-run difference of two (setting, method) test accuracies at ``k``, in
        points (paired by run)."""
        return 100 * (self.accuracy[(*a, k)] - self.accuracy[(*b, k)])

    def log_ratio(self, measure: str, k: int) -> np.ndarray:
        """log(standard / prompt) of a laziness measure in the SGD runs validation
        chose, per run."""
        return np.log(
            self.dynamics[("standard", "SGD", k)][measure]
            / self.dynamics[("prompt", "SGD", k)][measure]
        )

    def kernel_change_growth(self) -> np.ndarray:
        """log(kernel change at the largest c / at the smallest), prompt-based SGD,
        one value per run, every k in turn."""
        return np.concatenate(
            [
                np.log(
                    np.asarray(self.by_lr[("prompt", k)]["kernel_change"], dtype=float)
                )[:, -1]
                - np.log(
                    np.asarray(self.by_lr[("prompt", k)]["kernel_change"], dtype=float)
                )[:, 0]
                for k in self.shots
            ]
        )


def few_shot_runs(
    pretrain: MLMPretrainConfig, configs: tuple[KernelExperimentConfig, ...]
) -> FewShotRuns:
    """:func:`run_kernel_experiment` for each config (cached), merged; see
    :class:`FewShotRuns`."""
    if not configs:
        raise ValueError("configs must hold at least one KernelExperimentConfig")
    res = {c.shots: run_kernel_experiment(pretrain, c) for c in configs}
    return FewShotRuns(
        configs=tuple(configs),
        accuracy={
            key: np.array(v) for r in res.values() for key, v in r.accuracy.items()
        },
        dynamics={
            key: {m: np.array(v) for m, v in d.items()}
            for r in res.values()
            for key, d in r.dynamics.items()
        },
        by_lr={key: v for r in res.values() for key, v in r.by_lr.items()},
        chosen={key: v for r in res.values() for key, v in r.chosen.items()},
        examples={k: r.example for r in res.values() for k in r.config.shots},
        lr_scales={
            k: r.config.sgd_lr_scales for r in res.values() for k in r.config.shots
        },
        diverged=sum(n for r in res.values() for n in r.diverged.values()),
    )


def bayes_output_derivative(
    lang: SentimentLanguage, n: int = 200_000, *, seed: int = 321
) -> float:
    """Mean :math:`|\\chi|` of the Bayes posterior's log-odds on ``n`` task reviews:
    the floor of the output derivative that no model can go below."""
    s, w, _ = lang.sample_sentences(n, make_generator(seed), domain="task")
    return float(
        output_derivative(lang.log_odds(w, domain="task"), s.double()).abs().mean()
    )


@dataclass(frozen=True)
class LoRAKernelConfig:
    """The LoRA kernel study: the lemma at ``rank`` (projection seed 0), and the error
    of the projected kernel for every rank in ``ranks`` over ``projections`` random
    projections, on the training sentences of the first ``shots``-shot run."""

    rank: int = 8
    ranks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    projections: int = 20
    shots: int = 16


@dataclass
class LoRAKernel:
    """Output of :func:`lora_kernel`."""

    lemma_difference: float  # max |K(LoRA model) - projection formula| / max |formula|
    errors: LoRAKernelErrors
    max_input_dim: int  # the largest input dimension of an adapted matrix


def lora_kernel(
    s: Setting, config: LoRAKernelConfig = LoRAKernelConfig()
) -> LoRAKernel:
    """The LoRA lemma (the eNTK of the LoRA model, by ``torch.func`` on the factors,
    against :func:`~fmlab.theory.kernels.lora_projected_kernel` of the weight
    gradients) and the theorem's errors (:func:`lora_kernel_errors`)."""
    from ..adapt.lora import apply_lora, weight_gradients
    from ..theory.kernels import empirical_ntk, lora_projected_kernel

    x = few_shot_task(s.lang, config.shots, seed=0).x_prompt
    lora = apply_lora(s.prompt_model, config.rank, seed=0)
    grads = weight_gradients(s.prompt_model, x)
    k_model = empirical_ntk(lora, x)
    k_formula = lora_projected_kernel(
        grads, grads, {name: lora.get_submodule(name).lora_A.detach() for name in grads}
    )
    return LoRAKernel(
        lemma_difference=float(
            (k_model - k_formula).abs().max() / k_formula.abs().max()
        ),
        errors=lora_kernel_errors(
            s.prompt_model, x, config.ranks, seeds=tuple(range(config.projections))
        ),
        max_input_dim=max(g.shape[2] for g in grads.values()),
    )


def entk_timing(s: Setting, n: int = 64, *, repeats: int = 3) -> dict:
    """:func:`fmlab.theory.kernels.time_entk` on the kernel of the weight matrices of
    the transformer blocks (LoRA's targets), for ``n`` test sentences."""
    from ..adapt.lora import only_targets_trainable
    from ..theory.kernels import time_entk

    return time_entk(
        only_targets_trainable(s.prompt_model), s.test.x_prompt[:n], repeats=repeats
    )


@dataclass
class LabelWords:
    """Output of :func:`label_word_swap`."""

    zero_shot: float  # test accuracy of the prompt with the new label words
    chi: float  # mean |chi| at theta_0 on the test set, new label words
    entk: np.ndarray  # eNTK accuracy per run, new label words
    entk_natural: np.ndarray  # the same runs with great / terrible


def label_word_swap(
    s: Setting,
    label_words: tuple[str, str] = ("movie", "film"),
    *,
    shots: int = 16,
    seeds: tuple[int, ...] = (0, 1, 2),
) -> LabelWords:
    """The prompt with other label words: its zero-shot accuracy and :math:`|\\chi|`,
    and eNTK regression (:func:`entk_accuracy`) with them and with the natural ones."""
    unnatural = PromptClassifier(s.mlm, s.lang, label_words=label_words)
    f = outputs(unnatural, s.test.x_prompt)
    runs = [few_shot_task(s.lang, shots, seed) for seed in seeds]
    return LabelWords(
        zero_shot=sign_accuracy(f, s.test.y),
        chi=output_derivative(f, s.test.y).abs().mean().item(),
        entk=np.array(entk_accuracy(unnatural, runs, s.test)),
        entk_natural=np.array(entk_accuracy(s.prompt_model, runs, s.test)),
    )


def width_test(config: ChapterConfig = ChapterConfig()) -> dict:
    """:func:`output_derivative_by_width` for the chapter's models: every seed of
    ``config.pretrain_seeds`` at the narrow width (``narrow_steps`` steps) and at
    ``d_model`` (``pretrain_steps``), on the chapter's test set."""
    if not isinstance(config, ChapterConfig):
        raise TypeError(f"config must be a ChapterConfig, got {type(config).__name__}")
    return output_derivative_by_width(
        config.pretrain,
        widths=config.widths,
        seeds=config.pretrain_seeds,
        steps=(config.narrow_steps, config.pretrain_steps),
        n_test=config.n_test,
    )
