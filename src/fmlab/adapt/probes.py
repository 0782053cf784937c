r"""Adaptation: linear probing under a norm constraint, ridge-classifier probes, and
fine-tuning.

Chapter 1 frames adaptation as the constrained problem

.. math::
    \gamma_{\text{task}} = \arg\min_{\|\gamma\|_2 \le c_0} \widehat
    L_{\text{adapt}}(\gamma),

For squared loss and a linear head on fixed features :math:`\phi(x)` every such loss is
a quadratic :math:`L(\gamma) = \gamma^\top \Sigma \gamma - 2 b^\top \gamma + c` built
from the second moments :math:`\Sigma = \mathbb{E}[\phi\phi^\top]`, :math:`b =
\mathbb{E}[\phi y]`, :math:`c = \mathbb{E}[y^2]` of either the empirical or the
population distribution, and the constrained minimiser is found exactly
(:func:`ball_constrained_least_squares`; Chapter 1 uses :func:`linear_probe` and
:func:`fine_tune_linear_head_adam`).

Chapter 5 measures transfer with a ridge-regression classifier on standardised
features (one-hot targets, closed form): :func:`ridge_probe_head` fits it,
:func:`ridge_probe_accuracy` scores it against test labels or the exact posterior of
the test inputs, and :func:`ridge_probe_curve` scores it at several training sizes
(pages 05b and 05c).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .._validate import check_float, check_int, check_same_length, check_tensor
from ..repro import make_generator
from ..theory.least_squares import ball_constrained_least_squares, second_moments

__all__ = [
    "linear_probe",
    "ridge_probe_head",
    "ridge_probe_accuracy",
    "ridge_probe_curve",
    "fine_tune_linear_head_adam",
]


def linear_probe(
    features: torch.Tensor, y: torch.Tensor, c0: float = float("inf")
) -> torch.Tensor:
    r"""Linear probing as problem (3): the constrained empirical-risk minimiser.

    The constraint is :math:`\|\gamma\| \le c_0`.

    Returns the head ``gamma`` of shape ``(k,)`` (float64). Add a constant column to
    ``features`` for a bias.
    """
    return ball_constrained_least_squares(second_moments(features, y), c0)


def ridge_probe_head(
    features: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
    ridge: float = 1e-2,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The ridge-regression classifier on standardised features, as a linear head on
    the raw features.

    The head solves :math:`\min_W \frac1n\lVert \tilde\Phi W - Y\rVert^2 +
    \lambda\lVert W\rVert^2` in closed form, with :math:`Y` the one-hot labels
    (``n_classes`` columns), :math:`\lambda` = ``ridge`` and :math:`\tilde\Phi` the
    features standardised with their own mean and (unbiased) standard deviation plus
    :math:`10^{-6}`, and a constant column, penalised like the rest. Returns ``(W,
    b)``, float64, of shapes ``(d, n_classes)`` and ``(n_classes,)``: the scores of
    an input :math:`x` are :math:`x^\top W + b`, its prediction their arg-max.
    """
    n_classes = check_int("n_classes", n_classes, minimum=2)
    ridge = check_float("ridge", ridge, minimum=0.0, strict_min=True)
    f = check_tensor("features", features, ndim=2, floating=True).double()
    y = check_tensor("labels", labels, shape=(f.shape[0],), integer=True)
    return _ridge_head(f, y, n_classes, ridge)


def ridge_probe_accuracy(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    n_classes: int,
    ridge: float = 1e-2,
    test_posterior: torch.Tensor | None = None,
) -> float:
    r"""Test accuracy of the ridge-regression classifier (:func:`ridge_probe_head`)
    fitted on the training features and labels.

    With ``test_posterior`` (``(n_test, n_classes)``, the exact :math:`P(y\mid x)` of
    each test input) the score is the *expected* accuracy
    :math:`\frac1m\sum_i P(y = \hat y(x_i)\mid x_i)`: the same population
    accuracy as the plain one, estimated without the noise of the test labels
    (``test_labels`` are then only checked for shape)."""
    args = _ridge_probe_inputs(
        train_features,
        train_labels,
        test_features,
        test_labels,
        n_classes,
        ridge,
        test_posterior,
    )
    return _ridge_probe_accuracy(*args)


def ridge_probe_curve(
    train_features,
    train_labels,
    test_features,
    test_labels,
    n_classes: int,
    sizes,
    ridge: float = 1e-2,
    test_posterior: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`ridge_probe_accuracy` for each training size in ``sizes``:
    ``(len(sizes),)``, in torch's default dtype.

    A size :math:`m` uses disjoint blocks of :math:`m` training rows (up to three, the
    first ones) and averages their accuracies, so small sizes are not hostage to one
    draw. With ``test_posterior`` each accuracy is the expected one under the exact
    posterior."""
    ftr, ytr, fte, yte, n_classes, ridge, post = _ridge_probe_inputs(
        train_features,
        train_labels,
        test_features,
        test_labels,
        n_classes,
        ridge,
        test_posterior,
    )
    out = []
    N = ftr.shape[0]
    for m in sizes:
        m = check_int("sizes", m, minimum=2, maximum=N)
        reps = max(1, min(3, N // m))
        accs = [
            _ridge_probe_accuracy(
                ftr[r * m : (r + 1) * m],
                ytr[r * m : (r + 1) * m],
                fte,
                yte,
                n_classes,
                ridge,
                post,
            )
            for r in range(reps)
        ]
        out.append(sum(accs) / reps)
    return torch.tensor(out)


def _ridge_probe_inputs(
    train_features, train_labels, test_features, test_labels, n_classes, ridge, post
):
    """The checked arguments of :func:`ridge_probe_accuracy`, in the order of
    :func:`_ridge_probe_accuracy`; features and posterior in float64."""
    n_classes = check_int("n_classes", n_classes, minimum=2)
    ridge = check_float("ridge", ridge, minimum=0.0, strict_min=True)
    ftr = check_tensor("train_features", train_features, ndim=2, floating=True).double()
    fte = check_tensor("test_features", test_features, ndim=2, floating=True).double()
    ytr = check_tensor(
        "train_labels", train_labels, shape=(ftr.shape[0],), integer=True
    )
    yte = check_tensor("test_labels", test_labels, shape=(fte.shape[0],), integer=True)
    if fte.shape[1] != ftr.shape[1]:
        raise ValueError(
            "train_features and test_features must have the same number of columns"
        )
    if post is not None:
        post = check_tensor(
            "test_posterior", post, shape=(fte.shape[0], n_classes), floating=True
        ).double()
    return ftr, ytr, fte, yte, n_classes, ridge, post


def _ridge_head(ftr, ytr, n_classes, ridge) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`ridge_probe_head` on checked inputs. The standardisation is folded into
    the head, and when there are more columns than rows the head is found in its
    :math:`n \\times n` (kernel) form: the same head, in fewer operations."""
    mu, sd = ftr.mean(0), ftr.std(0) + 1e-6
    a = torch.cat([(ftr - mu) / sd, torch.ones(len(ftr), 1, dtype=ftr.dtype)], 1)
    n, d = a.shape
    Y = F.one_hot(ytr, n_classes).double()
    if d <= n:
        W = torch.linalg.solve(
            a.T @ a / n + ridge * torch.eye(d, dtype=a.dtype), a.T @ Y / n
        )
    else:  # the same solution in its n x n (kernel) form
        coef = (
            torch.linalg.solve(a @ a.T / n + ridge * torch.eye(n, dtype=a.dtype), Y) / n
        )
        W = a.T @ coef
    # [(x - mu) / sd, 1] @ W = x @ (W_x / sd) + (w_1 - (mu / sd) @ W_x)
    Wx = W[:-1] / sd[:, None]
    return Wx, W[-1] - mu @ Wx


def _ridge_probe_accuracy(ftr, ytr, fte, yte, n_classes, ridge, post) -> float:
    """:func:`ridge_probe_accuracy` on checked inputs (the test features are never
    copied)."""
    Wx, b = _ridge_head(ftr, ytr, n_classes, ridge)
    pred = torch.addmm(b, fte, Wx).argmax(1)
    if post is not None:
        return float(post.gather(1, pred[:, None]).mean())
    return float((pred == yte).double().mean())


def fine_tune_linear_head_adam(
    model: nn.Module,
    features_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int,
    lr: float,
    head_init: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[nn.Module, torch.Tensor]:
    r"""Fine-tune a copy of ``model`` and a linear head on ``(x, y)`` with squared loss.

    Full-batch Adam for ``steps`` steps on all parameters, starting from the pretrained
    weights and either ``head_init`` (LP-FT style) or a small random head (the usual
    fine-tuning; drawn from ``generator``). The number of steps acts as the implicit
    constraint :math:`C(\gamma; \hat\theta_{FM}) \le c_0` of Chapter 1.

    Returns the fine-tuned copy (in the model's dtype) and its head as float64, like
    every other head in this module (the head is trained in the model's dtype).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    x = check_tensor("x", x, floating=True)
    y = check_tensor("y", y, ndim=1, floating=True)
    check_same_length(("x", "y"), x, y)
    steps = check_int("steps", steps, minimum=0)
    lr = check_float("lr", lr, minimum=0.0, strict_min=True)
    tuned = copy.deepcopy(model)
    with torch.no_grad():
        probe = features_fn(tuned, x[:1])
    k, dtype = probe.shape[1], probe.dtype
    if head_init is None:
        g = generator if generator is not None else make_generator(0)
        head = (0.01 * torch.randn(k, generator=g, dtype=dtype)).requires_grad_(True)
    else:
        head = (
            check_tensor("head_init", head_init, shape=(k,), floating=True)
            .detach()
            .to(dtype)
            .clone()
            .requires_grad_(True)
        )
    opt = torch.optim.Adam(list(tuned.parameters()) + [head], lr=lr)
    tuned.train()
    for _ in range(steps):
        loss = (features_fn(tuned, x) @ head - y).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    tuned.eval()
    return tuned, head.detach().double()
