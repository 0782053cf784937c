"""Chapter 4, kernel behaviour: kernel regression with the eNTK and the SignGD kernels
from the pretrained outputs, the Linearization and Fixed Features measures of a
fine-tuning run (Definition 3.2 of Malladi et al., 2023), its step-matched kernel
analog, the one-step check of Theorem 4.3, LoRA's kernel error and the output
derivative against width (Definition 5.3).

:mod:`fmlab.chapters.ch4_kernel_view` describes the chapter and holds its pages'
runners.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from .._validate import check_float, check_int, check_tensor
from ..data.sentiment_language import SentimentLanguage
from ..models.transformer import (
    PromptClassifier,
)
from ..repro import make_generator
from .ch4_world import (
    FewShotTask,
    MLMPretrainConfig,
    _scored,
    _select,
    output_derivative,
    outputs,
    pretrain_masked_lm,
    sign_accuracy,
    test_set,
)

__all__ = [
    "kernel_behaviour",
    "start_measures",
    "same_steps_outputs",
    "batch1_order",
    "signgd_same_steps_outputs",
    "SignGDStepCheck",
    "signgd_step_check",
    "LoRAKernelErrors",
    "lora_kernel_errors",
    "output_derivative_by_width",
    "entk_accuracy",
]


def _mean_diag(j_train: torch.Tensor) -> float:
    """:math:`\\bar K`, the mean of :math:`K(x_i, x_i) = \\lVert g(x_i)\\rVert^2` over
    the rows of the training Jacobian: SGD's learning rate is :math:`c/\\bar K`."""
    return float(j_train.pow(2).sum(1).mean())


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


def start_measures(
    model0: nn.Module, j_train: torch.Tensor, f0_train: torch.Tensor, y: dict
) -> dict:
    """What the theory reads at the start of fine-tuning, on the training set: the
    mean output derivative ``chi_train`` :math:`= \\overline{|\\chi(x_i, y_i;
    \theta_0)|}` (Definition 5.3 asks it to be small) and ``head_share``, the share of
    the eNTK's trace :math:`\\operatorname{tr} K` that the parameters named ``head.*``
    contribute (0 for the prompt, which adds no head)."""
    from ..theory.kernels import trainable_params

    params = trainable_params(model0)
    head = torch.cat(
        [
            torch.full((p.numel(),), name.startswith("head."), dtype=torch.bool)
            for name, p in params.items()
        ]
    )
    sq = j_train.pow(2)
    return {
        "chi_train": float(output_derivative(f0_train, y["train"]).abs().mean()),
        "head_share": float(sq[:, head].sum() / sq.sum()),
    }


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


def batch1_order(n: int, steps: int, seed: int) -> list[int]:
    """The example of each step of a batch-1 run of :func:`fine_tune_logistic` with
    ``seed``: a random order of the ``n`` examples, drawn afresh at each pass."""
    g = make_generator(check_int("seed", seed, minimum=0))
    order, cursor, out = torch.randperm(n, generator=g), 0, []
    for _ in range(check_int("steps", steps, minimum=0)):
        if cursor + 1 > n:
            order, cursor = torch.randperm(n, generator=g), 0
        out.append(int(order[cursor]))
        cursor += 1
    return out


def signgd_same_steps_outputs(j, f0, y, lr: float, steps: int, seed: int):
    """Test outputs of the kernel analog of a batch-1 SignGD run (Theorem 4.3), step
    by step: on the example :math:`x_t` of step :math:`t` (the run's own order, see
    :func:`batch1_order`), every output moves by :math:`-\\eta\\,
    \\operatorname{sign}(\\chi_t)\\, K^{(A\\text{-}SignGD)}(x, x_t) = -\\eta\\,
    \\operatorname{sign}(\\chi_t) \\langle g(x), \\operatorname{sign} g(x_t)\\rangle`,
    with :math:`\\chi_t` read from the analog's own training outputs and the gradients
    frozen at :math:`\\theta_0`. ``j``, ``f0``, ``y``: dicts with keys train/test."""
    s_tr = j["train"].double().sign()
    cols = {split: j[split].double() @ s_tr.T for split in ("train", "test")}
    f = {split: f0[split].double().clone() for split in ("train", "test")}
    y_tr = y["train"].double()
    for i in batch1_order(len(y_tr), steps, seed):
        chi = -y_tr[i] * torch.sigmoid(-y_tr[i] * f["train"][i])
        for split in ("train", "test"):
            f[split] -= lr * torch.sign(chi) * cols[split][:, i]
    return f["test"]


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
