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
from typing import Callable

import torch
from torch import nn

from .._validate import check_float, check_int, check_same_length, check_tensor
from ..repro import make_generator
from ..theory.least_squares import ball_constrained_least_squares, second_moments

__all__ = [
    "linear_probe",
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
