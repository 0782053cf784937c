"""Chapter 4, the pretrained world: a masked LM pretrained on the sentiment
language, the few-shot downstream tasks drawn from it, logistic fine-tuning (SGD, Adam,
SignGD) and the linear models (the probe of the standard setting, the bag of words).

:mod:`fmlab.chapters.ch4_kernel_view` describes the chapter and holds its pages'
runners.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from fractions import Fraction

import torch
from torch import nn
from torch.nn import functional as F

from .._validate import check_choice, check_float, check_int, check_tensor
from ..data.sentiment_language import SentimentLanguage, SentimentLanguageConfig
from ..models.transformer import (
    TinyTransformer,
    TransformerConfig,
)
from ..repro import make_generator, seed_everything
from ..theory.kernels import newton_minimize
from ..train import cached, progress

__all__ = [
    "MLMPretrainConfig",
    "mask_tokens",
    "tilt_topic",
    "sentence_units",
    "cls_labels",
    "pretrain_masked_lm",
    "pretrain_masked_lms_stacked",
    "FewShotTask",
    "few_shot_task",
    "test_set",
    "LogisticFineTuneConfig",
    "logistic_loss",
    "FineTuneDiverged",
    "fine_tune_logistic",
    "outputs",
    "sign_accuracy",
    "output_derivative",
    "fit_logistic_regression",
    "logistic_probe_head",
    "CV_PROBE_CS",
    "stratified_folds",
    "cross_validated_probe_head",
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
    # a job for [CLS] in pretraining (the second world of Chapter 4): a logistic head on
    # h_[CLS] predicts a property of the document, with weight cls_weight beside the
    # masked-LM loss, and is dropped after pretraining; "length": the sentence has more
    # than (min_units + max_units) / 2 units, "topic": the document's topic
    cls_task: str = "none"
    cls_weight: float = 0.0
    # a topic in the pretraining text: each document draws a topic t = ±1 (probability
    # 1/2, independent of its sentiment), and each neutral word is, with probability
    # topic_tilt, redrawn from the topic's half of the neutral words
    topic_tilt: float = 0.0

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
        check_choice("cls_task", self.cls_task, ("none", "length", "topic"))
        check_float("cls_weight", self.cls_weight, minimum=0.0)
        check_float("topic_tilt", self.topic_tilt, minimum=0.0, maximum=1.0)
        if (self.cls_task == "none") != (self.cls_weight == 0.0):
            raise ValueError(
                "cls_task and cls_weight go together: a task needs a positive weight, "
                f"got {self.cls_task!r} with weight {self.cls_weight}"
            )
        if self.cls_task == "topic" and self.topic_tilt == 0.0:
            raise ValueError("the topic task needs topics in the text (topic_tilt > 0)")


def tilt_topic(
    lang: SentimentLanguage, x: torch.Tensor, tilt: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Give each document of ``x`` a topic ``t = ±1`` (probability 1/2) and redraw each
    of its neutral words, with probability ``tilt``, uniformly from the first half of
    the neutral words (``t = +1``) or the second half (``t = -1``). Returns the new
    documents and the topics ``(n,)`` in {+1, -1}."""
    n = x.shape[0]
    topic = torch.where(torch.rand(n, generator=generator) < 0.5, 1, -1)
    neutral = lang.neutral_ids
    half = len(neutral) // 2
    pick = torch.randint(half, x.shape, generator=generator)
    pick = pick + torch.where(topic > 0, 0, half)[:, None]
    redraw = torch.rand(x.shape, generator=generator) < tilt
    redraw &= torch.isin(x, neutral)
    return torch.where(redraw, neutral[pick], x), topic


def sentence_units(lang: SentimentLanguage, x: torch.Tensor) -> torch.Tensor:
    """Units per document of ``x``: its opinion and neutral words (a unit is a word,
    with or without *not* before it), ``(n,)``."""
    words = torch.cat([lang.positive_ids, lang.negative_ids, lang.neutral_ids])
    return torch.isin(x, words).sum(1)


def cls_labels(
    lang: SentimentLanguage, x: torch.Tensor, config: "MLMPretrainConfig", topic
) -> torch.Tensor:
    """The target in {0, 1} of the ``[CLS]`` task of ``config`` for the documents
    ``x`` (``topic``: their topics, for the topic task)."""
    if config.cls_task == "length":
        c = lang.config
        return (2 * sentence_units(lang, x) > c.min_units + c.max_units).float()
    return (topic > 0).float()


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
        params, head = list(model.parameters()), None
        if config.cls_weight > 0:  # the [CLS] task's head, dropped after pretraining
            head = nn.Linear(config.d_model, 1)
            params += list(head.parameters())
        opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.01, fused=True)
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=config.lr, total_steps=config.steps, pct_start=0.1
        )
        losses = torch.empty(config.steps)
        model.train()
        for step in progress(
            range(config.steps), total=config.steps, desc="pretraining"
        ):
            x = lang.sample_pretraining(config.batch_size, g)
            topic = None
            if config.topic_tilt > 0:
                x, topic = tilt_topic(lang, x, config.topic_tilt, g)
            inp, masked = mask_tokens(lang, x, config, g)
            if head is None:
                loss = F.cross_entropy(model(inp)[masked], x[masked])
            else:
                h = model.hidden(inp)
                loss = F.cross_entropy(model.decoder(h)[masked], x[masked])
                loss = loss + config.cls_weight * F.binary_cross_entropy_with_logits(
                    head(h[:, 0]).squeeze(1), cls_labels(lang, x, config, topic)
                )
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
    if any(c.cls_weight > 0 or c.topic_tilt > 0 for c in configs):
        raise ValueError("stacked pretraining has no [CLS] task and no topics")
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


#: The inverse penalties :math:`C` that the paper's probe searches: scikit-learn's
#: ``LogisticRegressionCV`` default ``Cs=10``, ten values evenly spaced in log scale
#: from :math:`10^{-4}` to :math:`10^{4}`, weakest penalty last.
CV_PROBE_CS = tuple(10.0 ** (-4.0 + 8.0 * i / 9) for i in range(10))


def stratified_folds(y: torch.Tensor, folds: int = 5) -> torch.Tensor:
    """The fold (``0 .. folds-1``) of each example in stratified ``folds``-fold cross
    validation without shuffling, as scikit-learn's ``StratifiedKFold`` assigns them:
    fold ``f`` holds, of each class, as many examples as the ``f``-th of every
    ``folds`` entries of the labels sorted by class; each class fills the folds in
    order, in blocks, in the order its examples come."""
    y = check_tensor("y", y, ndim=1)
    folds = check_int("folds", folds, minimum=2)
    classes, code = torch.unique(y, return_inverse=True)  # sorted classes
    counts = torch.bincount(code, minlength=len(classes))
    if len(classes) < 2:
        raise ValueError(f"y must hold at least two classes, got {classes.tolist()}")
    if int(counts.min()) < folds:
        raise ValueError(
            f"y: every class needs at least folds = {folds} examples, got "
            f"{dict(zip(classes.tolist(), counts.tolist()))}"
        )
    ordered = torch.sort(code).values
    out = torch.empty(len(y), dtype=torch.long)
    for c in range(len(classes)):
        sizes = [int((ordered[f::folds] == c).sum()) for f in range(folds)]
        out[code == c] = torch.arange(folds).repeat_interleave(torch.tensor(sizes))
    return out


def cross_validated_probe_head(
    z: torch.Tensor,
    y: torch.Tensor,
    *,
    cs: tuple[float, ...] = CV_PROBE_CS,
    folds: int = 5,
    head_scale: float = 0.5,
) -> dict:
    """The head that the paper's standard fine-tuning starts from (Malladi et al.,
    2023, footnote 2): a logistic regression on the features ``z`` of the training
    examples, its penalty chosen by cross validation on those examples only.

    As scikit-learn's ``LogisticRegressionCV`` with the settings of the authors' code
    (multinomial, every other argument at its default): for each :math:`C` in ``cs``,
    fit on all folds but one of :func:`stratified_folds` and score the accuracy on the
    one left out; take the :math:`C` with the largest sum of the folds' accuracies,
    ties to the first in ``cs`` (increasing: the strongest penalty; the sums are
    exact fractions); refit on all the examples at that :math:`C`. A two-class
    multinomial fit with penalty :math:`\\frac12\\lVert W\\rVert^2` and weight
    :math:`C` on the summed loss is the binary logistic regression of
    :func:`fit_logistic_regression` with ridge :math:`\\lambda = 1/(2Cn)` on the mean
    loss over its :math:`n` examples (the intercept unpenalised in both). The head
    is ``head_scale`` times that regression's logit: the authors' code writes
    ``coef_`` into the two rows of the classifier as :math:`\\mp` ``coef_ / 2``, whose
    logit difference is half the fitted one (``head_scale=0.5``; ``1.0`` keeps the
    fit unscaled).

    Returns ``{"w", "b"}`` (the head), ``"C"`` (the chosen value), ``"reg"`` (its
    :math:`\\lambda` in the refit) and ``"cv_accuracy"`` (the mean held-out accuracy
    of each :math:`C`, a float64 tensor over ``cs``).
    """
    z = check_tensor("z", z, ndim=2, floating=True)
    n = z.shape[0]
    y = check_tensor("y", y, shape=(n,))
    if not bool(((y == 1) | (y == -1)).all()):
        raise ValueError("y must hold labels in {-1, +1}")
    if not isinstance(cs, tuple) or not cs:
        raise ValueError(f"cs must be a non-empty tuple, got {cs!r}")
    for c in cs:
        check_float("cs", c, minimum=0.0, strict_min=True)
    if any(a >= b for a, b in zip(cs, cs[1:])):  # the first is the strongest penalty
        raise ValueError(f"cs must be increasing, got {cs}")
    head_scale = check_float("head_scale", head_scale, minimum=0.0, strict_min=True)
    fold = stratified_folds(y, folds)
    scores = []  # the sum over folds of each C's held-out accuracy, exactly
    for c in cs:
        total = Fraction(0)
        for f in range(folds):
            train, held = fold != f, fold == f
            w, b = fit_logistic_regression(
                z[train], y[train], reg=1.0 / (2.0 * c * int(train.sum()))
            )
            right = int(
                ((z[held].double() @ w + b > 0).double() * 2 - 1 == y[held]).sum()
            )
            total += Fraction(right, int(held.sum()))
        scores.append(total)
    best = max(range(len(cs)), key=lambda i: (scores[i], -i))  # ties: the first
    reg = 1.0 / (2.0 * cs[best] * n)
    w, b = fit_logistic_regression(z, y, reg=reg)
    return {
        "w": head_scale * w,
        "b": head_scale * b,
        "C": float(cs[best]),
        "reg": reg,
        "cv_accuracy": torch.tensor(
            [float(s / folds) for s in scores], dtype=torch.float64
        ),
    }
