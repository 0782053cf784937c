r"""The generalization decomposition of the adaptation loss (Chapter 1, eq. 6).

With :math:`L = L_{\text{adapt}}`, :math:`\widehat L = \widehat L_{\text{adapt}}`,
:math:`\gamma_{\text{task}}` the constrained empirical minimiser and
:math:`\gamma^\star` the constrained population minimiser (so that
:math:`L(\gamma^\star) = L^\star`),

.. math::
    L(\gamma_{\text{task}}) - L^\star
    = \underbrace{[L(\gamma_{\text{task}}) - \widehat L(\gamma_{\text{task}})]
      + [\widehat L(\gamma^\star) - L(\gamma^\star)]}_{\text{generalization error}} -
      \underbrace{[\widehat L(\gamma^\star) - \widehat L(\gamma_{\text{task}})]}_{\ge 0
      \text{ (ERM)}},

so :math:`L(\gamma_{\text{task}}) \le L^\star + \text{generalization error}`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import check_tensor
from .least_squares import Moments, ball_constrained_least_squares, quadratic_loss

__all__ = [
    "Decomposition",
    "decompose_adaptation_loss",
    "spearman",
    "posterior_readout",
    "interface_constant",
]


@dataclass(frozen=True)
class Decomposition:
    """The terms of eq. (6) for one adaptation problem."""

    adapted_loss: float  # L(gamma_task): population loss of the adapted model
    minimal_loss: float  # L*: minimal adaptation loss
    gap_at_task: float  # L(gamma_task) - Lhat(gamma_task)
    gap_at_star: float  # Lhat(gamma*) - L(gamma*)
    erm_slack: float  # Lhat(gamma*) - Lhat(gamma_task) >= 0
    norm_task: float  # ||gamma_task||
    norm_star: float  # ||gamma*||

    @property
    def generalization_error(self) -> float:
        """The sum of the two gaps: the generalization error of eq. (6)."""
        return self.gap_at_task + self.gap_at_star

    @property
    def bound(self) -> float:
        r"""The right-hand side of eq. (6): :math:`L^\star` + generalization error."""
        return self.minimal_loss + self.generalization_error


def decompose_adaptation_loss(
    empirical: Moments, population: Moments, c0: float
) -> Decomposition:
    """Solve both constrained problems exactly and return every term of eq. (6)."""
    if not isinstance(empirical, Moments):
        raise TypeError(f"empirical must be a Moments, got {type(empirical).__name__}")
    if not isinstance(population, Moments):
        raise TypeError(
            f"population must be a Moments, got {type(population).__name__}"
        )
    if empirical.b.shape != population.b.shape:
        raise ValueError(
            "empirical and population must have the same feature size, got "
            f"{tuple(empirical.b.shape)} "
            f"and {tuple(population.b.shape)}"
        )
    g_task = ball_constrained_least_squares(empirical, c0)
    g_star = ball_constrained_least_squares(population, c0)
    L_task, Lhat_task = (
        quadratic_loss(g_task, population),
        quadratic_loss(g_task, empirical),
    )
    L_star, Lhat_star = (
        quadratic_loss(g_star, population),
        quadratic_loss(g_star, empirical),
    )
    return Decomposition(
        adapted_loss=L_task,
        minimal_loss=L_star,
        gap_at_task=L_task - Lhat_task,
        gap_at_star=Lhat_star - L_star,
        erm_slack=Lhat_star - Lhat_task,
        norm_task=float(g_task.norm()),
        norm_star=float(g_star.norm()),
    )


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman rank correlation of two 1-D tensors (``scipy.stats.spearmanr``).

    Ties get average ranks. Raises ``ValueError`` when either input is constant, where
    the correlation is undefined.
    """
    from scipy.stats import spearmanr

    x = check_tensor("x", x, ndim=1, floating=True)
    y = check_tensor("y", y, ndim=1, floating=True)
    if x.shape != y.shape or x.numel() < 2:
        raise ValueError(
            f"x and y must have the same length >= 2, got {x.numel()} and {y.numel()}"
        )
    xs, ys = x.detach().double().numpy(), y.detach().double().numpy()
    if (xs == xs[0]).all() or (ys == ys[0]).all():
        raise ValueError("x or y is constant; the rank correlation is undefined")
    return float(spearmanr(xs, ys).statistic)


def posterior_readout(means_b: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    r"""The head :math:`w = N^+ s` that reads a task off the Bayes prediction (Ch. 1).

    In the two-view world the Bayes prediction of the masked view is :math:`f^\star(x_A)
    = N^\top p(x_A)`, with :math:`N \in \mathbb{R}^{K\times d_B}` the matrix of class
    means :math:`\nu_c` (``means_b``) and :math:`p(x_A)` the posterior over the
    :math:`K` classes. When :math:`\operatorname{rank} N = K`, :math:`NN^+ = I_K`, so
    :math:`w = N^+ s` satisfies :math:`Nw = s` and :math:`w^\top f^\star(x_A) = s^\top
    p(x_A) = \mathbb{E}[y \mid x_A]` for the task :math:`y = s_c`. Returns ``w`` of
    shape ``(d_B,)`` (float64).

    Raises ``ValueError`` when ``rank N < K`` (then no such ``w`` exists for every
    ``s``).
    """
    N = check_tensor("means_b", means_b, ndim=2, floating=True).double()
    K = N.shape[0]
    s = check_tensor("signs", signs, shape=(K,), floating=True).double()
    rank = int(torch.linalg.matrix_rank(N))
    if rank < K:
        raise ValueError(
            f"means_b must have rank K = {K} (one row per class), got rank {rank}"
        )
    return torch.linalg.pinv(N) @ s


def interface_constant(means_b: torch.Tensor, signs: torch.Tensor) -> float:
    r"""The constant :math:`\kappa = d_B\lVert N^+ s\rVert^2` of Chapter 1's interface.

    .. math::
        L^\star_{\text{adapt}}(\theta; c_0=\infty) - L^{\text{Bayes}}_{\text{task}}
        \;\le\; \kappa\,\big(L_{\text{pre}}(\theta) - L^{\text{Bayes}}_{\text{pre}}\big)

    for every masked-view predictor :math:`D\phi_\theta + d` with a linear decoder (see
    :func:`posterior_readout` for ``N`` and ``s``).
    """
    w = posterior_readout(means_b, signs)
    return float(means_b.shape[1] * w.pow(2).sum())
