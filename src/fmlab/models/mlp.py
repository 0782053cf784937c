"""A plain MLP and the masked-view predictor of Chapter 1.

:class:`MaskedViewPredictor` is :math:`f_\\theta(x_A) = D\\,\\phi_\\theta(x_A)`: an MLP
encoder
:math:`\\phi_\\theta` (the "foundation model" whose output is the representation handed
to
downstream tasks) followed by a linear decoder :math:`D` that predicts the hidden view.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .._validate import check_float, check_int, check_tensor

__all__ = ["MLP", "MaskedViewPredictor", "SphereEncoder"]


class MLP(nn.Module):
    """Linear layers with ReLU between them: ``dims = (in, hidden..., out)``.

    With ``final_activation=True`` a ReLU follows the last layer too.
    """

    def __init__(self, dims: Sequence[int], *, final_activation: bool = False):
        super().__init__()
        dims = [check_int("dims", d, minimum=1) for d in dims]
        if len(dims) < 2:
            raise ValueError(
                f"dims must list at least an input and an output size, got {dims}"
            )
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(dims) - 2 or final_activation:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)
        self.dims = tuple(dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tensor("x", x, shape=(None, self.dims[0]), floating=True, finite=False)
        return self.net(x)


class MaskedViewPredictor(nn.Module):
    """Predict a hidden view ``x_B`` from a visible one ``x_A`` via a representation.

    Parameters
    ----------
    dim_a, dim_b : int
        Sizes of the visible and hidden views.
    width : int
        Hidden width of the encoder.
    rep_dim : int
        Size of the representation :math:`\\phi(x_A)`.
    depth : int
        Number of hidden layers of the encoder (at least 1).
    """

    def __init__(
        self,
        dim_a: int,
        dim_b: int,
        *,
        width: int = 64,
        rep_dim: int = 16,
        depth: int = 2,
    ):
        super().__init__()
        depth = check_int("depth", depth, minimum=1)
        width = check_int("width", width, minimum=1)
        self.encoder = MLP([dim_a] + [width] * depth + [rep_dim], final_activation=True)
        self.decoder = nn.Linear(
            check_int("rep_dim", rep_dim, minimum=1),
            check_int("dim_b", dim_b, minimum=1),
        )

    def features(self, xa: torch.Tensor) -> torch.Tensor:
        """The representation :math:`\\phi_\\theta(x_A)`, shape ``(n, rep_dim)``."""
        return self.encoder(xa)

    def forward(self, xa: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.features(xa))


class SphereEncoder(nn.Module):
    """An MLP whose output is rescaled to the sphere of radius ``radius``:
    :math:`\\lVert f(x)\\rVert = R`.

    Bounded representations keep the contrastive loss from being driven to zero by scale
    alone (Arora et al. assume :math:`\\lVert f(x)\\rVert \\le R`).
    """

    def __init__(
        self,
        dim_in: int,
        *,
        width: int = 64,
        depth: int = 2,
        rep_dim: int = 8,
        radius: float = 2.0,
    ):
        super().__init__()
        depth = check_int("depth", depth, minimum=1)
        self.radius = check_float("radius", radius, minimum=0.0, strict_min=True)
        self.net = MLP(
            [check_int("dim_in", dim_in, minimum=1)]
            + [check_int("width", width, minimum=1)] * depth
            + [check_int("rep_dim", rep_dim, minimum=1)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.net(x)
        return self.radius * g / g.norm(dim=1, keepdim=True).clamp_min(1e-12)
