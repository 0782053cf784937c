"""The linear theory of Chapter 3: LP, FT and LP-FT in a two-layer linear network.

Configurations and runners for the theory half of ``notebooks/03-lp-vs-ft.ipynb``,
after :cite:t:`kumar2022finetuning`. The mathematics lives in
:mod:`fmlab.theory.feature_distortion` (the model :math:`f_{v,B}(x) = v^\\top Bx`, its
ID and OOD losses, the gradient flow integrated in float64); this module fixes the
chapter's grids and draws the instances:

* :func:`linear_sweep`: LP, FT and LP-FT for every feature error :math:`\\varepsilon`,
  shift angle :math:`\\alpha` and instance of :class:`LinearTheoryConfig`;
* :func:`feature_picture`: a two-feature instance whose features can be drawn, FT and
  LP-FT from it, and the same setting on several instances;
* :func:`mean_feature_move`: :math:`\\frac1n\\sum_i\\lVert(B_{\\text{end}} -
  B_0)x_i\\rVert`, batched.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from .._validate import check_float, check_int
from ..repro import make_generator
from ..theory.feature_distortion import (
    DistortionSweep,
    LinearShiftConfig,
    LinearShiftProblem,
    Trajectory,
    conserved_quantity,
    distortion_sweep,
    gradient_flow,
    id_loss,
    linear_probe_head,
    make_linear_shift_problem,
    ood_loss,
)
from ..train import cached

__all__ = [
    "LinearTheoryConfig",
    "linear_sweep",
    "PictureConfig",
    "FeaturePicture",
    "feature_picture",
    "mean_feature_move",
    # the theory's names the chapter uses, re-exported for its cells
    "LinearShiftConfig",
    "conserved_quantity",
    "gradient_flow",
    "id_loss",
    "ood_loss",
    "linear_probe_head",
    "make_linear_shift_problem",
]


@dataclass(frozen=True)
class LinearTheoryConfig:
    """The grid of the linear theory: instances of ``base`` at every feature error
    (radians) and seed, OOD losses at every shift angle (degrees), the gradient flow
    integrated to ``horizon`` with step ``dt`` and recorded at ``n_times`` times."""

    base: LinearShiftConfig = field(
        default_factory=lambda: LinearShiftConfig(
            dim=20, rank=3, id_dim=10, n=40, head_scale=0.1
        )
    )
    feature_errors: tuple = (0.0, 0.003, 0.01, 0.03, 0.1, 0.3)
    shift_angles_deg: tuple = (0.0, 22.5, 45.0, 67.5, 90.0)
    seeds: tuple = tuple(range(8))
    horizon: float = 25.0
    n_times: int = 101
    dt: float = 0.02

    def __post_init__(self):
        if not isinstance(self.base, LinearShiftConfig):
            raise TypeError(
                f"base must be a LinearShiftConfig, got {type(self.base).__name__}"
            )
        for name in ("feature_errors", "shift_angles_deg", "seeds"):
            if not isinstance(getattr(self, name), tuple) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty tuple")
        for a in self.shift_angles_deg:
            check_float("shift_angles_deg", a, minimum=0.0, maximum=90.0)
        check_float("horizon", self.horizon, minimum=0.0, strict_min=True)
        check_int("n_times", self.n_times, minimum=2)
        check_float("dt", self.dt, minimum=0.0, strict_min=True)

    @property
    def times(self) -> torch.Tensor:
        """The recorded times, ``n_times`` points from 0 to ``horizon``."""
        return torch.linspace(0, self.horizon, self.n_times)


def linear_sweep(cfg: LinearTheoryConfig) -> DistortionSweep:
    """LP (closed form), FT and LP-FT (gradient flow) on the grid of ``cfg``
    (:func:`fmlab.theory.feature_distortion.distortion_sweep`); cached on disk."""
    if not isinstance(cfg, LinearTheoryConfig):
        raise TypeError(f"cfg must be a LinearTheoryConfig, got {type(cfg).__name__}")
    alphas = tuple(math.radians(a) for a in cfg.shift_angles_deg)
    return cached(
        cfg,
        lambda: distortion_sweep(
            cfg.base, cfg.feature_errors, alphas, cfg.seeds, cfg.times, dt=cfg.dt
        ),
        name="ch03_linear",
    )


@dataclass(frozen=True)
class PictureConfig:
    """The two-feature instance of the picture: ``k = 2`` features of inputs in
    :math:`\\mathbb{R}^6`, an ID subspace of dimension 3, OOD inputs in its orthogonal
    complement, features ``feature_error_deg`` degrees from optimal; ``n_ood`` OOD
    inputs are drawn; ``times`` are the frames; ``instances`` more instances of the
    same setting (seeds ``0 .. instances - 1``) are run to ``horizon``, long enough for
    FT to fit its training data (a small random head can sit near the saddle point at
    the origin for a long time)."""

    problem: LinearShiftConfig = field(
        default_factory=lambda: LinearShiftConfig(
            dim=6,
            rank=2,
            id_dim=3,
            n=12,
            feature_error=math.radians(4),
            shift_angle=math.pi / 2,
            head_scale=0.05,
            seed=2,
        )
    )
    n_ood: int = 12
    times: tuple = (0.0, 0.5, 1.0, 2.0, 4.0, 16.0)
    instances: int = 8
    horizon: float = 128.0
    dt: float = 0.01

    def __post_init__(self):
        check_int("n_ood", self.n_ood, minimum=1)
        check_float("horizon", self.horizon, minimum=max(self.times))
        check_int("instances", self.instances, minimum=2)
        check_float("dt", self.dt, minimum=0.0, strict_min=True)


@dataclass(frozen=True)
class FeaturePicture:
    """What :func:`feature_picture` returns.

    ``problem`` is the drawn instance, ``x_ood`` ``(n_ood, d)`` its OOD inputs (in
    :math:`S^\\perp`) and ``y_ood`` their labels; ``runs`` maps ``"FT"`` and ``"LP-FT"``
    to their trajectories at ``times``. ``instances`` holds the problems of the other
    instances, and ``ends`` the FT (first ``I``) and LP-FT (last ``I``) states at the
    horizon, batch axis ``2I``.
    """

    problem: LinearShiftProblem
    x_ood: torch.Tensor
    y_ood: torch.Tensor
    runs: dict
    instances: tuple
    ends: Trajectory


def feature_picture(cfg: PictureConfig) -> FeaturePicture:
    """FT and LP-FT on the picture's instance, and on ``cfg.instances`` more; cached
    on disk."""
    if not isinstance(cfg, PictureConfig):
        raise TypeError(f"cfg must be a PictureConfig, got {type(cfg).__name__}")
    return cached(cfg, lambda: _feature_picture(cfg), name="ch03_picture")


def _feature_picture(cfg: PictureConfig) -> FeaturePicture:
    p = make_linear_shift_problem(cfg.problem)
    g = make_generator(11)
    x_ood = torch.randn(cfg.n_ood, p.X.shape[1], generator=g, dtype=torch.float64)
    x_ood = x_ood @ p.P_perp
    y_ood = x_ood @ p.B_star.T @ p.v_star
    v_lp = linear_probe_head(p.X, p.y, p.B0)
    runs = {
        "FT": gradient_flow(p.X, p.y, p.v0, p.B0, list(cfg.times), dt=cfg.dt),
        "LP-FT": gradient_flow(p.X, p.y, v_lp, p.B0, list(cfg.times), dt=cfg.dt),
    }
    probs = tuple(
        make_linear_shift_problem(dataclasses.replace(cfg.problem, seed=s))
        for s in range(cfg.instances)
    )
    X, y, B0 = (torch.stack([getattr(q, a) for q in probs]) for a in ("X", "y", "B0"))
    v0 = torch.cat([torch.stack([q.v0 for q in probs]), linear_probe_head(X, y, B0)])
    ends = gradient_flow(
        torch.cat([X, X]),
        torch.cat([y, y]),
        v0,
        torch.cat([B0, B0]),
        [cfg.horizon],
        dt=cfg.dt,
    )
    return FeaturePicture(p, x_ood, y_ood, runs, probs, ends)


def mean_feature_move(
    B_end: torch.Tensor, B0: torch.Tensor, xs: torch.Tensor
) -> torch.Tensor:
    """The mean feature change :math:`\\frac1n\\sum_i\\lVert(B_{\\text{end}} -
    B_0)x_i\\rVert` over the rows :math:`x_i` of ``xs`` (leading axes batch)."""
    return (xs @ (B_end - B0).transpose(-1, -2)).norm(dim=-1).mean(-1)
