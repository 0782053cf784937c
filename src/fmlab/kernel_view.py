"""Chapter 4 end to end: pretrain a masked LM, fine-tune it few-shot, compare with kernels.

Pretraining minimises the masked-language-modelling loss on documents of
:class:`~fmlab.data.sentiment_language.SentimentLanguage` with a
:class:`~fmlab.models.transformer.TinyTransformer`. A downstream sentiment task is then
solved in two *settings* (Section 3.1 of Malladi et al., 2023):

- **prompt-based**: the input is ``[CLS] <sentence> it was [MASK] .`` and the model output
  is the difference of the label-word logits at ``[MASK]``,
  :math:`f(x) = \\text{logit}_{great} - \\text{logit}_{terrible}` (:class:`PromptClassifier`);
- **standard**: the input is ``[CLS] <sentence>`` and a new, randomly initialised linear
  head reads the ``[CLS]`` position, :math:`f(x) = \\Gamma^\\top h_{[CLS]}(x)` (:class:`CLSClassifier`).

With labels :math:`y \\in \\{\\pm 1\\}` and the logistic loss :math:`\\log(1 + e^{-y f})`, binary
cross-entropy over the two label words depends on :math:`f` only, so one scalar output
(and one kernel) describes each setting. Fine-tuning is full-batch SGD, Adam or SignGD
(:func:`fine_tune`); the kernel analogs are fitted by kernel logistic regression
(:func:`fmlab.theory.kernels.fit_kernel_logistic`).

Used in Chapter 4 (``notebooks/04-kernel-view.ipynb``).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from ._validate import check_choice, check_float, check_int, check_tensor
from .data.sentiment_language import SentimentLanguage, SentimentLanguageConfig
from .models.transformer import TinyTransformer, TransformerConfig
from .repro import make_generator, seed_everything
from .train import cached, progress

__all__ = [
    "PretrainConfig",
    "pretrain_masked_lm",
    "PromptClassifier",
    "CLSClassifier",
    "FewShotTask",
    "few_shot_task",
    "test_set",
    "FineTuneConfig",
    "fine_tune",
    "accuracy",
    "outputs",
    "logistic_loss",
    "output_derivative",
    "mask_tokens",
    "KernelExperimentConfig",
    "KernelExperiment",
    "run_kernel_experiment",
    "kernel_behaviour",
    "SignGDStepCheck",
    "signgd_step_check",
    "LoRAKernelErrors",
    "lora_kernel_errors",
    "learning_rate_sweep",
    "output_derivative_by_width",
    "entk_accuracy",
]


# -- pretraining -------------------------------------------------------------------------
@dataclass(frozen=True)
class PretrainConfig:
    """Everything that determines a pretrained masked language model."""

    language: SentimentLanguageConfig = field(default_factory=SentimentLanguageConfig)
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    steps: int = 600
    batch_size: int = 64
    lr: float = 3e-3
    mask_rate: float = 0.15
    statement_mask_rate: float = 0.5
    seed: int = 0

    def __post_init__(self):
        check_int("d_model", self.d_model, minimum=1)
        check_int("steps", self.steps, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        check_float("lr", self.lr, minimum=0.0, strict_min=True)
        check_float(
            "mask_rate", self.mask_rate, minimum=0.0, maximum=1.0, strict_min=True
        )
        check_float(
            "statement_mask_rate", self.statement_mask_rate, minimum=0.0, maximum=1.0
        )
        check_int("seed", self.seed, minimum=0)


def mask_tokens(
    lang: SentimentLanguage,
    x: torch.Tensor,
    config: PretrainConfig,
    generator: torch.Generator,
):
    """BERT-style masking: every word (not ``[CLS]``/``[PAD]``) is replaced by ``[MASK]`` with
    probability ``mask_rate``, the adjective of a statement with ``statement_mask_rate``
    (a shortcut that keeps pretraining short). Returns the masked input and the mask."""
    u = torch.rand(x.shape, generator=generator)
    candidate = (x != lang.pad_id) & (x != lang.cls_id)
    adjective = (x == lang.great_id) | (x == lang.terrible_id)
    masked = candidate & (
        (u < config.mask_rate)
        | (adjective & (u < max(config.mask_rate, config.statement_mask_rate)))
    )
    return x.masked_fill(masked, lang.mask_id), masked


def _model_config(lang: SentimentLanguage, config: PretrainConfig) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=lang.vocab_size,
        max_len=lang.seq_len,
        d_model=config.d_model,
        n_layers=config.n_layers,
        n_heads=config.n_heads,
        pad_id=lang.pad_id,
    )


def pretrain_masked_lm(
    config: PretrainConfig = PretrainConfig(),
) -> tuple[TinyTransformer, torch.Tensor]:
    """The pretrained masked LM for ``config`` (trained once, then read from the cache).

    AdamW with a one-cycle learning-rate schedule on fresh batches of pretraining text.
    Returns the model (in eval mode) and the training loss at every step.
    """
    if not isinstance(config, PretrainConfig):
        raise TypeError(f"config must be a PretrainConfig, got {type(config).__name__}")
    lang = SentimentLanguage(config.language)

    def build():
        seed_everything(config.seed)
        model = TinyTransformer(_model_config(lang, config), seed=config.seed)
        g = make_generator(config.seed + 1)
        opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
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

    entry = cached(config, build, name="ch4_mlm")
    model = TinyTransformer(_model_config(lang, config), seed=config.seed)
    model.load_state_dict(entry["state"])
    model.eval()
    return model, entry["losses"]


# -- the two fine-tuning settings ----------------------------------------------------------
class PromptClassifier(nn.Module):
    """Prompt-based output: :math:`f(x) = \\text{logit}_{great} - \\text{logit}_{terrible}` at ``[MASK]``.

    ``label_words`` names the words for :math:`y=+1` and :math:`y=-1` (other choices make
    a less natural prompt)."""

    def __init__(
        self,
        mlm: TinyTransformer,
        lang: SentimentLanguage,
        label_words: tuple[str, str] = ("great", "terrible"),
    ):
        super().__init__()
        if not isinstance(mlm, TinyTransformer):
            raise TypeError(f"mlm must be a TinyTransformer, got {type(mlm).__name__}")
        if len(label_words) != 2 or any(w not in lang.index for w in label_words):
            raise ValueError(
                f"label_words must be two words of the vocabulary, got {label_words!r}"
            )
        self.mlm = copy.deepcopy(mlm)
        self.mask_id = lang.mask_id
        self.pos_id, self.neg_id = (lang.index[w] for w in label_words)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.mlm.hidden(tokens)  # (n, T, d)
        at_mask = (tokens == self.mask_id).to(h.dtype)  # exactly one [MASK] per row
        h_mask = (at_mask[..., None] * h).sum(1)  # (n, d)
        w, b = self.mlm.decoder.weight, self.mlm.decoder.bias
        return h_mask @ (w[self.pos_id] - w[self.neg_id]) + (
            b[self.pos_id] - b[self.neg_id]
        )


class CLSClassifier(nn.Module):
    """Standard output: a new linear head on the ``[CLS]`` position, :math:`f(x) = \\Gamma^\\top h_0(x) + c`.

    The head is drawn :math:`\\Gamma \\sim \\mathcal N(0, I/d)` from ``seed``, :math:`c = 0`.
    """

    def __init__(self, mlm: TinyTransformer, *, seed: int):
        super().__init__()
        if not isinstance(mlm, TinyTransformer):
            raise TypeError(f"mlm must be a TinyTransformer, got {type(mlm).__name__}")
        self.mlm = copy.deepcopy(mlm)
        d = mlm.config.d_model
        self.head = nn.Linear(d, 1)
        g = make_generator(check_int("seed", seed, minimum=0))
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(1, d, generator=g) / d**0.5)
            self.head.bias.zero_()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlm.hidden(tokens)[:, 0]).squeeze(-1)


# -- downstream data -----------------------------------------------------------------------
@dataclass(frozen=True)
class FewShotTask:
    """A downstream sample: labels and the same sentences with and without the prompt."""

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


def few_shot_task(lang: SentimentLanguage, k: int, seed: int) -> FewShotTask:
    """A balanced ``k``-shot training set (``k`` examples per class) drawn with ``seed``."""
    if not isinstance(lang, SentimentLanguage):
        raise TypeError(f"lang must be a SentimentLanguage, got {type(lang).__name__}")
    k = check_int("k", k, minimum=1)
    return _balanced(
        lang, k, make_generator(10_000 + check_int("seed", seed, minimum=0))
    )


def test_set(lang: SentimentLanguage, n: int, seed: int = 123_456) -> FewShotTask:
    """A balanced test set of ``n`` sentences (``n`` even), shared by every run."""
    if not isinstance(lang, SentimentLanguage):
        raise TypeError(f"lang must be a SentimentLanguage, got {type(lang).__name__}")
    n = check_int("n", n, minimum=2)
    if n % 2:
        raise ValueError(f"n must be even, got {n}")
    return _balanced(lang, n // 2, make_generator(check_int("seed", seed, minimum=0)))


# -- fine-tuning -----------------------------------------------------------------------------
@dataclass(frozen=True)
class FineTuneConfig:
    """Fine-tuning with the logistic loss: ``steps`` steps on mini-batches of ``batch_size``
    examples (``None``: the full training set)."""

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


def fine_tune(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: FineTuneConfig,
    *,
    seed: int = 0,
) -> nn.Module:
    """A fine-tuned copy of ``model``: ``config.steps`` steps on the logistic loss.

    Mini-batches are drawn without replacement within each pass over the data, from a
    generator seeded with ``seed``. Only parameters with ``requires_grad=True`` move (all
    of them, or the LoRA factors). SignGD updates
    :math:`\\theta \\leftarrow \\theta - \\eta\\,\\operatorname{sign}(\\nabla L)`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(config, FineTuneConfig):
        raise TypeError(f"config must be a FineTuneConfig, got {type(config).__name__}")
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
    tuned.train()
    for _ in range(config.steps):
        if batch == n:
            idx = slice(None)
        else:
            if cursor + batch > n:
                order, cursor = torch.randperm(n, generator=g), 0
            idx = order[cursor : cursor + batch]
            cursor += batch
        loss = logistic_loss(tuned(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if config.optimizer == "signgd":
            for p in params:
                p.grad = p.grad.sign()
        opt.step()
    tuned.eval()
    return tuned


@torch.no_grad()
def outputs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``model(x)`` without gradients."""
    return model(x)


def accuracy(f: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of examples with :math:`\\operatorname{sign} f(x) = y`."""
    f = check_tensor("f", f, ndim=1, floating=True)
    y = check_tensor("y", y, shape=(f.shape[0],), floating=True)
    return float(((f > 0).to(y.dtype) * 2 - 1 == y).double().mean())


def output_derivative(f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """:math:`\\chi = \\partial \\ell / \\partial f = -y\\,\\sigma(-y f)` for the logistic loss
    (Definition 3.1 of Malladi et al., 2023), per example."""
    f = check_tensor("f", f, ndim=1, floating=True)
    y = check_tensor("y", y, shape=(f.shape[0],), floating=True)
    return -y * torch.sigmoid(-y * f)


# -- the experiment of the chapter ------------------------------------------------------------
@dataclass(frozen=True)
class KernelExperimentConfig:
    """Few-shot fine-tuning vs its kernel analogs, over shots and seeds.

    Fine-tuning runs ``steps`` steps on mini-batches of ``batch_size``. The SGD learning rate of each setting is
    set by its kernel, :math:`\\eta = c / \\bar K` with :math:`c` = ``sgd_lr_scale`` and
    :math:`\\bar K` the mean of :math:`K(x_i, x_i)` on the training set (so that one step
    moves the outputs by a comparable amount in every setting; LoRA uses its own kernel);
    Adam uses ``adam_lr``. ``kernel_reg`` is :math:`\\lambda` of
    :func:`~fmlab.theory.kernels.fit_kernel_logistic` relative to :math:`\\bar K` (the same
    parameter-space ridge for every kernel of a setting).
    """

    shots: tuple[int, ...] = (16, 64)
    seeds: tuple[int, ...] = (0, 1, 2)
    n_test: int = 400
    steps: int = 50
    batch_size: int = 32
    sgd_lr_scale: float = 4.0
    adam_lr: float = 1e-3
    lora_rank: int = 8
    kernel_reg: float = 1e-3

    def __post_init__(self):
        if not self.shots or not self.seeds:
            raise ValueError("shots and seeds must be non-empty")
        for k in self.shots:
            check_int("shots", k, minimum=1)
        for s in self.seeds:
            check_int("seeds", s, minimum=0)
        check_int("n_test", self.n_test, minimum=2)
        check_int("steps", self.steps, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        check_float("sgd_lr_scale", self.sgd_lr_scale, minimum=0.0, strict_min=True)
        check_float("adam_lr", self.adam_lr, minimum=0.0, strict_min=True)
        check_int("lora_rank", self.lora_rank, minimum=1)
        check_float("kernel_reg", self.kernel_reg, minimum=0.0, strict_min=True)


@dataclass
class KernelExperiment:
    """Results of :func:`run_kernel_experiment`.

    ``accuracy[(setting, method, k)]`` is a list over seeds; settings are ``"prompt"`` and
    ``"standard"``; methods ``"zero-shot"``, ``"SGD-FT"``, ``"Adam-FT"``, ``"LoRA-SGD-FT"``,
    ``"K-SGD"``, ``"K-A-SignGD"``, ``"K-SignGD"``. ``dynamics[(setting, optimizer, k)]`` is a
    list over seeds of dicts with ``acc0``, ``acc_ft``, ``acc_lin``, ``gain_recovered``
    (:math:`(acc_{lin} - acc_0)/(acc_{FT} - acc_0)`), ``lin_error``
    (:math:`\\|f_{FT} - f_{lin}\\| / \\|f_{FT} - f_0\\|` on the test set) and ``kernel_change``
    (:func:`~fmlab.theory.kernels.kernel_distance` of the training-set eNTK).
    """

    config: KernelExperimentConfig
    accuracy: dict = field(default_factory=dict)
    dynamics: dict = field(default_factory=dict)


def _kernel_accuracies(j_tr, j_te, f0_tr, f0_te, y_tr, y_te, reg_rel, names):
    from .theory.kernels import (
        fit_kernel_logistic,
        kernel_predict,
        kernels_from_jacobians,
    )

    k_tr = kernels_from_jacobians(
        j_tr, j_tr, kernels=("sgd", "asymmetric_signgd", "signgd")
    )
    k_te = kernels_from_jacobians(j_te, j_tr, kernels=names)
    reg = reg_rel * float(k_tr["sgd"].diagonal().mean())
    out = {}
    for name in names:
        if name == "sgd":
            alpha = fit_kernel_logistic(k_tr["sgd"], y_tr, reg=reg, f0=f0_tr)
        elif name == "asymmetric_signgd":
            alpha = fit_kernel_logistic(
                k_tr["asymmetric_signgd"],
                y_tr,
                reg=reg,
                f0=f0_tr,
                penalty=k_tr["signgd"],
            )
        else:  # the symmetric SignGD kernel: its own features sign g, its own scale
            alpha = fit_kernel_logistic(
                k_tr["signgd"],
                y_tr,
                reg=reg_rel * float(k_tr["signgd"].diagonal().mean()),
                f0=f0_tr,
            )
        out[name] = accuracy(kernel_predict(k_te[name], alpha, f0_te).float(), y_te)
    return out


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
    """How close fine-tuning from ``model0`` to ``tuned`` was to kernel behaviour (Definition 3.2).

    *Linearization*: the first-order Taylor model :math:`f_{lin} = f_0 + J_{test}(\\theta_{FT} - \\theta_0)`
    on the test set against the fine-tuned outputs: ``lin_error`` =
    :math:`\\|f_{FT} - f_{lin}\\| / \\|f_{FT} - f_0\\|`, the accuracies ``acc0``, ``acc_ft``,
    ``acc_lin`` and ``gain_recovered`` = :math:`(acc_{lin} - acc_0)/(acc_{FT} - acc_0)`.
    *Fixed Features*: ``kernel_change``, the relative Frobenius distance between the eNTKs
    on the training set at :math:`\\theta_0` and :math:`\\theta_{FT}`. The test Jacobian
    ``j_te``, the training Jacobian ``j_tr0`` and ``f0_te`` at :math:`\\theta_0` may be passed
    in when already computed. Also returns the output vectors ``f0``, ``f_ft``, ``f_lin``.
    """
    from .theory.kernels import (
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
        accuracy(f0_te, y_test),
        accuracy(f_ft, y_test),
        accuracy(f_lin, y_test),
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


def run_kernel_experiment(
    mlm: TinyTransformer,
    lang: SentimentLanguage,
    config: KernelExperimentConfig = KernelExperimentConfig(),
) -> KernelExperiment:
    """Fine-tune the pretrained ``mlm`` few-shot and fit the kernel analogs, for every
    ``k`` in ``config.shots`` and seed in ``config.seeds``; see :class:`KernelExperiment`."""
    from .lora import apply_lora
    from .theory.kernels import jacobian

    if not isinstance(mlm, TinyTransformer):
        raise TypeError(f"mlm must be a TinyTransformer, got {type(mlm).__name__}")
    if not isinstance(lang, SentimentLanguage):
        raise TypeError(f"lang must be a SentimentLanguage, got {type(lang).__name__}")
    if not isinstance(config, KernelExperimentConfig):
        raise TypeError(
            f"config must be a KernelExperimentConfig, got {type(config).__name__}"
        )
    result = KernelExperiment(config)
    test = test_set(lang, config.n_test)
    prompt0 = PromptClassifier(mlm, lang)
    j_te_prompt = jacobian(prompt0, test.x_prompt)
    f0_te_prompt = outputs(prompt0, test.x_prompt)

    def record(setting, method, k, value):
        result.accuracy.setdefault((setting, method, k), []).append(value)

    def measure_dynamics(
        setting, opt_name, k, model0, tuned, x_tr, x_te, j_te, j_tr0, f0_te
    ):
        stats = kernel_behaviour(
            model0, tuned, x_tr, x_te, test.y, j_te=j_te, j_tr0=j_tr0, f0_te=f0_te
        )
        result.dynamics.setdefault((setting, opt_name, k), []).append(
            {
                key: value
                for key, value in stats.items()
                if key not in ("f0", "f_ft", "f_lin")
            }
        )
        return stats["acc_ft"]

    standard_test = {}
    runs = [(k, seed) for seed in config.seeds for k in config.shots]
    for k, seed in progress(runs, total=len(runs), desc="few-shot runs"):
        train = few_shot_task(lang, k, seed)
        seed_everything(seed)
        # prompt-based
        j_tr = jacobian(prompt0, train.x_prompt)
        f0_tr = outputs(prompt0, train.x_prompt)
        record("prompt", "zero-shot", k, accuracy(f0_te_prompt, test.y))
        accs = _kernel_accuracies(
            j_tr,
            j_te_prompt,
            f0_tr,
            f0_te_prompt,
            train.y,
            test.y,
            config.kernel_reg,
            ("sgd", "asymmetric_signgd", "signgd"),
        )
        record("prompt", "K-SGD", k, accs["sgd"])
        record("prompt", "K-A-SignGD", k, accs["asymmetric_signgd"])
        record("prompt", "K-SignGD", k, accs["signgd"])
        sgd = FineTuneConfig(
            "sgd",
            config.sgd_lr_scale / float(j_tr.pow(2).sum(1).mean()),
            config.steps,
            config.batch_size,
        )
        adam = FineTuneConfig("adam", config.adam_lr, config.steps, config.batch_size)
        for opt_name, ft_config in (("SGD", sgd), ("Adam", adam)):
            tuned = fine_tune(prompt0, train.x_prompt, train.y, ft_config, seed=seed)
            acc = measure_dynamics(
                "prompt",
                opt_name,
                k,
                prompt0,
                tuned,
                train.x_prompt,
                test.x_prompt,
                j_te_prompt,
                j_tr,
                f0_te_prompt,
            )
            record("prompt", f"{opt_name}-FT", k, acc)
        lora = apply_lora(prompt0, config.lora_rank, seed=seed)
        lora_scale = float(jacobian(lora, train.x_prompt).pow(2).sum(1).mean())
        lora_sgd = FineTuneConfig(
            "sgd", config.sgd_lr_scale / lora_scale, config.steps, config.batch_size
        )
        tuned = fine_tune(lora, train.x_prompt, train.y, lora_sgd, seed=seed)
        record(
            "prompt", "LoRA-SGD-FT", k, accuracy(outputs(tuned, test.x_prompt), test.y)
        )
        # standard: a new random head on [CLS]
        std0 = CLSClassifier(mlm, seed=seed)
        if (
            seed not in standard_test
        ):  # the head (hence the Jacobian) depends on the seed only
            standard_test[seed] = (
                jacobian(std0, test.x_plain),
                outputs(std0, test.x_plain),
            )
        j_te, f0_te = standard_test[seed]
        j_tr = jacobian(std0, train.x_plain)
        f0_tr = outputs(std0, train.x_plain)
        record("standard", "zero-shot", k, accuracy(f0_te, test.y))
        accs = _kernel_accuracies(
            j_tr, j_te, f0_tr, f0_te, train.y, test.y, config.kernel_reg, ("sgd",)
        )
        record("standard", "K-SGD", k, accs["sgd"])
        sgd = FineTuneConfig(
            "sgd",
            config.sgd_lr_scale / float(j_tr.pow(2).sum(1).mean()),
            config.steps,
            config.batch_size,
        )
        tuned = fine_tune(std0, train.x_plain, train.y, sgd, seed=seed)
        acc = measure_dynamics(
            "standard",
            "SGD",
            k,
            std0,
            tuned,
            train.x_plain,
            test.x_plain,
            j_te,
            j_tr,
            f0_te,
        )
        record("standard", "SGD-FT", k, acc)
    return result


# -- Theorem 4.3: one SignGD step, as the asymmetric kernel predicts -------------------------------
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
    """Add ``vector`` (laid out as :func:`~fmlab.theory.kernels.flat_params`) to the trainable parameters."""
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
    """Take one SignGD step on the single example ``(x_step, y_step)`` and compare the change
    of :math:`f` on ``x_eval`` with Theorem 4.3,
    :math:`f_{t+1}(x) - f_t(x) \\approx -\\eta\\,\\operatorname{sign}(\\chi_t)\\,K^{(A\\text{-}SignGD)}(x, x_t)`.

    The step is :math:`\\theta \\leftarrow \\theta - \\eta\\,\\operatorname{sign}(\\chi_t\\, g(x_t))`; the
    check runs in float64 on a copy of ``model``, once per learning rate in ``lrs``.
    """
    from .theory.kernels import jacobian

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


# -- LoRA: the kernel through a random projection ---------------------------------------------
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
    :func:`fmlab.lora.lora_targets`), :math:`K_{LoRA}` its random projection with
    :math:`A \\sim \\mathcal N(0, 1/k)` (:func:`fmlab.theory.kernels.lora_projected_kernel`).
    """
    from .lora import lora_targets, weight_gradients
    from .theory.kernels import lora_projected_kernel

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


# -- learning rate and kernel behaviour ----------------------------------------------------------
def learning_rate_sweep(
    mlm: TinyTransformer,
    lang: SentimentLanguage,
    *,
    k: int,
    seed: int,
    lr_scales: tuple[float, ...],
    steps: int = 50,
    batch_size: int = 32,
    n_test: int = 400,
) -> dict:
    """Kernel behaviour (:func:`kernel_behaviour`) of SGD fine-tuning for several learning rates
    :math:`\\eta = c/\\bar K`, in both settings. Returns ``{setting: {c: stats}}``."""
    from .theory.kernels import jacobian

    k = check_int("k", k, minimum=1)
    lr_scales = [
        check_float("lr_scales", c, minimum=0.0, strict_min=True) for c in lr_scales
    ]
    train, test = few_shot_task(lang, k, seed), test_set(lang, n_test)
    out = {}
    for setting in ("prompt", "standard"):
        if setting == "prompt":
            model0, x_tr, x_te = (
                PromptClassifier(mlm, lang),
                train.x_prompt,
                test.x_prompt,
            )
        else:
            model0, x_tr, x_te = (
                CLSClassifier(mlm, seed=seed),
                train.x_plain,
                test.x_plain,
            )
        j_tr0, j_te, f0_te = (
            jacobian(model0, x_tr),
            jacobian(model0, x_te),
            outputs(model0, x_te),
        )
        mean_diag = float(j_tr0.pow(2).sum(1).mean())
        out[setting] = {}
        for c in lr_scales:
            tuned = fine_tune(
                model0,
                x_tr,
                train.y,
                FineTuneConfig("sgd", c / mean_diag, steps, batch_size),
                seed=seed,
            )
            out[setting][c] = kernel_behaviour(
                model0, tuned, x_tr, x_te, test.y, j_te=j_te, j_tr0=j_tr0, f0_te=f0_te
            )
    return out


# -- Definition 5.3: does the output derivative shrink with width? -----------------------------------
def output_derivative_by_width(
    base: PretrainConfig,
    widths: tuple[int, ...],
    seeds: tuple[int, ...],
    *,
    n_test: int = 400,
) -> dict:
    """Mean :math:`|\\chi|` at the start of fine-tuning, on a test set of the downstream task,
    for models pretrained with ``base`` at each width ``d_model`` and seed (the cheap test of
    Section 5 of Malladi et al., 2023). Returns ``{(setting, width): [mean |chi| per seed]}``
    with settings ``"prompt"`` and ``"standard"`` (random head), plus zero-shot accuracies
    under ``("accuracy", width)``."""
    import dataclasses

    if not isinstance(base, PretrainConfig):
        raise TypeError(f"base must be a PretrainConfig, got {type(base).__name__}")
    lang = SentimentLanguage(base.language)
    test = test_set(lang, n_test)
    out = {}
    for width in widths:
        for seed in seeds:
            config = dataclasses.replace(
                base,
                d_model=check_int("widths", width, minimum=1),
                seed=check_int("seeds", seed, minimum=0),
            )
            mlm, _ = pretrain_masked_lm(config)
            f = outputs(PromptClassifier(mlm, lang), test.x_prompt)
            out.setdefault(("prompt", width), []).append(
                float(output_derivative(f, test.y).abs().mean())
            )
            out.setdefault(("accuracy", width), []).append(accuracy(f, test.y))
            f = outputs(CLSClassifier(mlm, seed=seed), test.x_plain)
            out.setdefault(("standard", width), []).append(
                float(output_derivative(f, test.y).abs().mean())
            )
    return out


def entk_accuracy(
    model: nn.Module,
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    *,
    reg_rel: float = 1e-3,
) -> float:
    """Test accuracy of eNTK regression (:math:`K^{(SGD)}`, pretrained outputs added, ridge
    :math:`\\lambda = ` ``reg_rel`` times the mean diagonal), as in :func:`run_kernel_experiment`."""
    from .theory.kernels import jacobian

    x_train = check_tensor("x_train", x_train, ndim=2, integer=True)
    x_test = check_tensor("x_test", x_test, ndim=2, integer=True)
    y_train = check_tensor("y_train", y_train, shape=(x_train.shape[0],), floating=True)
    y_test = check_tensor("y_test", y_test, shape=(x_test.shape[0],), floating=True)
    reg_rel = check_float("reg_rel", reg_rel, minimum=0.0, strict_min=True)
    j_tr, j_te = jacobian(model, x_train), jacobian(model, x_test)
    return _kernel_accuracies(
        j_tr,
        j_te,
        outputs(model, x_train),
        outputs(model, x_test),
        y_train,
        y_test,
        reg_rel,
        ("sgd",),
    )["sgd"]
