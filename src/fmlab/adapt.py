r"""Adaptation: linear probing under a norm constraint, and fine-tuning.

Chapter 1 frames adaptation as the constrained problem

.. math::
    \gamma_{\text{task}} = \arg\min_{\|\gamma\|_2 \le c_0} \widehat
    L_{\text{adapt}}(\gamma),

For squared loss and a linear head on fixed features :math:`\phi(x)` every such loss is
a quadratic :math:`L(\gamma) = \gamma^\top \Sigma \gamma - 2 b^\top \gamma + c` built
from the second moments :math:`\Sigma = \mathbb{E}[\phi\phi^\top]`, :math:`b =
\mathbb{E}[\phi y]`, :math:`c = \mathbb{E}[y^2]` of either the empirical or the
population distribution, and the constrained minimiser is found exactly
(:func:`ball_constrained_least_squares`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ._validate import check_float, check_int, check_same_length, check_tensor
from .repro import make_generator

__all__ = [
    "Moments",
    "second_moments",
    "quadratic_loss",
    "ball_constrained_least_squares",
    "ball_constrained_path",
    "linear_probe",
    "fine_tune",
]


@dataclass(frozen=True)
class Moments:
    """Second moments that define a squared loss on a linear head (all float64)."""

    sigma: torch.Tensor  # (k, k)
    b: torch.Tensor  # (k,)
    c: float


def second_moments(features: torch.Tensor, y: torch.Tensor) -> Moments:
    r"""Moments :math:`(\Sigma, b, c)` of features ``(n, k)`` and targets ``(n,)``."""
    features = check_tensor("features", features, ndim=2, floating=True)
    y = check_tensor("y", y, ndim=1, floating=True)
    n = check_same_length(("features", "y"), features, y)
    if n == 0:
        raise ValueError("features must have at least one row")
    f, t = features.double(), y.double()
    return Moments(sigma=f.T @ f / n, b=f.T @ t / n, c=float(t.pow(2).mean()))


def quadratic_loss(gamma: torch.Tensor, moments: Moments) -> float:
    r"""The mean squared error of a head.

    It is :math:`\gamma^\top\Sigma\gamma - 2b^\top\gamma + c`.
    """
    if not isinstance(moments, Moments):
        raise TypeError(f"moments must be a Moments, got {type(moments).__name__}")
    gamma = check_tensor(
        "gamma", gamma, shape=(moments.b.shape[0],), floating=True
    ).double()
    return float(gamma @ moments.sigma @ gamma - 2 * moments.b @ gamma + moments.c)


def _check_radius(name: str, c0) -> float:
    if isinstance(c0, bool) or not isinstance(c0, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(c0).__name__}")
    c0 = float(c0)
    if not c0 > 0:  # also rejects NaN
        raise ValueError(f"{name} must be > 0, got {c0}")
    return c0


def ball_constrained_path(moments: Moments, c0s, *, tol: float = 1e-12) -> torch.Tensor:
    r"""Exact minimisers of the quadratic loss over balls :math:`\|\gamma\|_2 \le c_0`.

    One eigendecomposition of :math:`\Sigma` serves every radius in ``c0s`` (a sweep
    of Chapter 1's constraint). Returns a float64 tensor of shape ``(len(c0s), k)``, row
    ``i`` the minimiser for ``c0s[i]``; see :func:`ball_constrained_least_squares` for
    the method. ``inf`` means no constraint.
    """
    if not isinstance(moments, Moments):
        raise TypeError(f"moments must be a Moments, got {type(moments).__name__}")
    if isinstance(c0s, (int, float)):
        raise TypeError("c0s must be a sequence of radii, got a single number")
    radii = [_check_radius("c0s", c) for c in c0s]
    if not radii:
        raise ValueError("c0s must hold at least one radius")
    evals, evecs = torch.linalg.eigh(moments.sigma.double())
    evals = evals.clamp_min(0.0)
    beta = evecs.T @ moments.b.double()
    scale = max(float(evals.max()), 1e-300)
    positive = evals > scale * 1e-12
    # minimum-norm unconstrained minimiser (pseudo-inverse): only directions with signal
    free = torch.where(
        positive,
        beta / torch.where(positive, evals, torch.ones_like(evals)),
        torch.zeros_like(beta),
    )
    in_range = bool((beta[~positive].abs() <= 1e-12 * (1 + beta.abs().max())).all())
    free_norm = float(free.norm())
    out = torch.empty(len(radii), len(beta), dtype=torch.float64)
    for i, c0 in enumerate(radii):
        if free_norm <= c0 and in_range:
            out[i] = evecs @ free
            continue

        def norm_at(lam: float) -> float:
            return float((beta / (evals + lam)).norm())

        lo, hi = 0.0, max(scale, float(beta.norm()) / c0)
        while norm_at(hi) > c0:
            hi *= 2.0
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if norm_at(mid) > c0:
                lo = mid
            else:
                hi = mid
            if hi - lo <= tol * max(1.0, hi):
                break
        out[i] = evecs @ (beta / (evals + hi))
    return out


def ball_constrained_least_squares(
    moments: Moments, c0: float, *, tol: float = 1e-12
) -> torch.Tensor:
    r"""Exact minimiser of the quadratic loss over a ball :math:`\|\gamma\|_2 \le c_0`.

    The KKT conditions give :math:`\gamma(\lambda) = (\Sigma + \lambda I)^{-1} b` with
    :math:`\lambda \ge 0`: :math:`\lambda = 0` if the unconstrained (minimum-norm)
    minimiser lies in the ball, otherwise the unique :math:`\lambda > 0` with
    :math:`\|\gamma(\lambda)\| = c_0`, found by bisection on the eigenbasis of
    :math:`\Sigma` (the norm is decreasing in :math:`\lambda`). ``c0 = inf`` means no
    constraint. Returns a float64 tensor of shape ``(k,)``.
    """
    c0 = _check_radius("c0", c0)
    return ball_constrained_path(moments, [c0], tol=tol)[0]


def linear_probe(
    features: torch.Tensor, y: torch.Tensor, c0: float = float("inf")
) -> torch.Tensor:
    r"""Linear probing as problem (3): the constrained empirical-risk minimiser.

    The constraint is :math:`\|\gamma\| \le c_0`.

    Returns the head ``gamma`` of shape ``(k,)`` (float64). Add a constant column to
    ``features`` for a bias.
    """
    return ball_constrained_least_squares(second_moments(features, y), c0)


def fine_tune(
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
