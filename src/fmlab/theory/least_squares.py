r"""Least squares on a linear head under a norm constraint (Chapter 1).

For squared loss and a linear head on fixed features :math:`\phi(x)` every adaptation
loss is a quadratic :math:`L(\gamma) = \gamma^\top \Sigma \gamma - 2 b^\top \gamma + c`
built from the second moments :math:`\Sigma = \mathbb{E}[\phi\phi^\top]`,
:math:`b = \mathbb{E}[\phi y]`, :math:`c = \mathbb{E}[y^2]` of either the empirical or
the population distribution. Its minimiser over a ball :math:`\|\gamma\|_2 \le c_0` is
found exactly (:func:`ball_constrained_least_squares`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import check_same_length, check_tensor

__all__ = [
    "Moments",
    "second_moments",
    "quadratic_loss",
    "ball_constrained_least_squares",
    "ball_constrained_path",
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
