"""Feature distortion in a two-layer linear network (Chapter 3).

The setting of :cite:t:`kumar2022finetuning`, in the notation of
``notebooks/03-lp-vs-ft.ipynb``. A two-layer linear network

.. math::
    f_{v,B}(x) = v^\\top B x, \\qquad v \\in \\mathbb{R}^k,\\;
    B \\in \\mathbb{R}^{k\\times d},

is adapted to noiseless labels :math:`y = v_\\star^\\top B_\\star x` (the rows of
:math:`B_\\star` are orthonormal). The ID training inputs are the rows of
:math:`X \\in \\mathbb{R}^{n\\times d}`; they span a subspace :math:`S` of dimension
:math:`m < d`. With :math:`w = B^\\top v - B_\\star^\\top v_\\star` the error of the
end-to-end linear map,

.. math::
    L_{\\text{id}}(v, B) = \\tfrac1n \\lVert X w \\rVert^2, \\qquad
    L_{\\text{ood}}(v, B) = w^\\top \\Sigma_{\\text{ood}}\\, w,

the second for OOD inputs with second moment :math:`\\Sigma_{\\text{ood}}`.
``id_loss`` is also the training objective, since the labels are noiseless.

* **LP** keeps :math:`B = B_0` and solves least squares for the head
  (:func:`linear_probe_head`).
* **FT** runs gradient flow on :math:`L_{\\text{id}}` over :math:`(v, B)` from
  :math:`(v_0, B_0)` (:func:`gradient_flow`, a fixed-step fourth-order Runge-Kutta
  integrator).
* **LP-FT** runs the same gradient flow from :math:`(v_{\\text{lp}}, B_0)`.

Everything is float64 and batched over a leading axis, so a sweep over feature errors
and seeds is one call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._validate import check_float, check_int, check_tensor
from ..repro import make_generator

__all__ = [
    "LinearShiftConfig",
    "LinearShiftProblem",
    "make_linear_shift_problem",
    "subspace_sine_distance",
    "id_loss",
    "ood_loss",
    "loss_gradients",
    "linear_probe_head",
    "Trajectory",
    "gradient_flow",
    "conserved_quantity",
    "DistortionSweep",
    "distortion_sweep",
]


@dataclass(frozen=True)
class LinearShiftConfig:
    """One random instance of the linear feature-distortion setting.

    Parameters
    ----------
    dim : int
        Input dimension :math:`d`.
    rank : int
        Number of features :math:`k` (rows of :math:`B`).
    id_dim : int
        Dimension :math:`m` of the ID subspace :math:`S`; needs :math:`k \\le m` and
        :math:`k \\le d - m`.
    n : int
        Number of ID training inputs (at least ``id_dim``, so that they span :math:`S`).
    feature_error : float
        The angle :math:`\\varepsilon \\in [0, \\pi/2]` between the row spaces of
        :math:`B_0` and :math:`B_\\star` (all principal angles equal it); 0 is perfect
        features.
    shift_angle : float
        :math:`\\alpha \\in [0, \\pi/2]`: OOD inputs have second moment
        :math:`\\cos^2\\alpha\\,P_S + \\sin^2\\alpha\\,P_\\perp`; 0 is no shift,
        :math:`\\pi/2` is OOD
        inputs orthogonal to every training input.
    head_scale : float
        Standard deviation of each entry of the random FT head :math:`v_0`.
    seed : int
        Seeds the random instance.
    """

    dim: int = 20
    rank: int = 3
    id_dim: int = 10
    n: int = 40
    feature_error: float = 0.1
    shift_angle: float = math.pi / 4
    head_scale: float = 0.1
    seed: int = 0

    def __post_init__(self):
        d = check_int("dim", self.dim, minimum=2)
        k = check_int("rank", self.rank, minimum=1)
        m = check_int("id_dim", self.id_dim, minimum=1, maximum=d - 1)
        check_int("n", self.n, minimum=m)
        if k > m or k > d - m:
            raise ValueError(
                "rank must be <= id_dim and <= dim - id_dim, got "
                f"rank={k}, id_dim={m}, dim={d}"
            )
        if 2 * k > d:
            raise ValueError(
                "rank must be <= dim / 2 (B0 tilts B_star into k new directions), "
                f"got rank={k}, dim={d}"
            )
        check_float(
            "feature_error", self.feature_error, minimum=0.0, maximum=math.pi / 2
        )
        check_float("shift_angle", self.shift_angle, minimum=0.0, maximum=math.pi / 2)
        check_float("head_scale", self.head_scale, minimum=0.0)
        check_int("seed", self.seed, minimum=0)


@dataclass(frozen=True)
class LinearShiftProblem:
    """The tensors of one instance (all float64).

    Shapes: ``X (n, d)``, ``B_star, B0 (k, d)``.
    """

    X: torch.Tensor
    y: torch.Tensor
    B_star: torch.Tensor
    v_star: torch.Tensor
    B0: torch.Tensor
    v0: torch.Tensor
    P_S: torch.Tensor  # orthogonal projector onto the ID subspace S
    sigma_ood: torch.Tensor

    @property
    def P_perp(self) -> torch.Tensor:
        """The projector onto the orthogonal complement of :math:`S`."""
        return torch.eye(self.P_S.shape[0], dtype=self.P_S.dtype) - self.P_S


def make_linear_shift_problem(config: LinearShiftConfig) -> LinearShiftProblem:
    """Draw an instance: a random ID subspace, truth, tilted features and a random head.

    :math:`B_\\star` has orthonormal rows in a random position (generic with respect to
    :math:`S`); :math:`B_0 = \\cos\\varepsilon\\,B_\\star + \\sin\\varepsilon\\,E` with
    :math:`E` orthonormal rows orthogonal to those of :math:`B_\\star`, so :math:`B_0`
    also has orthonormal rows and every principal angle between the two row spaces is
    :math:`\\varepsilon`. The ID inputs are
    standard normal in :math:`S`; :math:`v_\\star` is a random unit vector and
    :math:`v_0 \\sim N(0, \\sigma_0^2 I)` with :math:`\\sigma_0` = ``head_scale``.
    """
    if not isinstance(config, LinearShiftConfig):
        raise TypeError(
            f"config must be a LinearShiftConfig, got {type(config).__name__}"
        )
    c = config
    g = make_generator(c.seed)
    d, k, m = c.dim, c.rank, c.id_dim
    dt = torch.float64
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=dt))
    basis_S = Q[:, :m]
    P_S = basis_S @ basis_S.T
    R, _ = torch.linalg.qr(torch.randn(d, 2 * k, generator=g, dtype=dt))
    B_star, E = R[:, :k].T.contiguous(), R[:, k:].T.contiguous()
    B0 = math.cos(c.feature_error) * B_star + math.sin(c.feature_error) * E
    v_star = torch.randn(k, generator=g, dtype=dt)
    v_star = v_star / v_star.norm()
    v0 = c.head_scale * torch.randn(k, generator=g, dtype=dt)
    X = torch.randn(c.n, m, generator=g, dtype=dt) @ basis_S.T
    y = X @ B_star.T @ v_star
    ca, sa = math.cos(c.shift_angle), math.sin(c.shift_angle)
    sigma_ood = ca**2 * P_S + sa**2 * (torch.eye(d, dtype=dt) - P_S)
    return LinearShiftProblem(
        X=X,
        y=y,
        B_star=B_star,
        v_star=v_star,
        B0=B0,
        v0=v0,
        P_S=P_S,
        sigma_ood=sigma_ood,
    )


def subspace_sine_distance(B: torch.Tensor, B_star: torch.Tensor) -> float:
    """:math:`\\lVert P_{B} - P_{B_\\star}\\rVert_2`: the sine of the largest angle.

    The angle is between the row spaces of ``B`` and ``B_star`` (both ``(k, d)`` of full
    row rank).
    """
    B = check_tensor("B", B, ndim=2, floating=True).double()
    B_star = check_tensor(
        "B_star", B_star, shape=(None, B.shape[1]), floating=True
    ).double()

    def proj(M):
        q, _ = torch.linalg.qr(M.T)
        return q @ q.T

    return float(torch.linalg.matrix_norm(proj(B) - proj(B_star), ord=2))


def _end_to_end_error(v, B, B_star, v_star):
    return B.transpose(-1, -2) @ v.unsqueeze(-1) - (B_star.T @ v_star).unsqueeze(-1)


def id_loss(
    problem: LinearShiftProblem, v: torch.Tensor, B: torch.Tensor
) -> torch.Tensor:
    """The ID loss :math:`\\frac1n\\lVert X w\\rVert^2`, :math:`w = B^\\top v -
    B_\\star^\\top v_\\star`.

    ``v`` has shape ``(..., k)`` and ``B`` shape ``(..., k, d)``; returns shape
    ``(...)``.
    """
    _check_problem(problem)
    v, B = _check_vB(problem, v, B)
    w = _end_to_end_error(v, B, problem.B_star, problem.v_star).squeeze(-1)
    return (w @ problem.X.T).pow(2).mean(-1)


def ood_loss(
    problem: LinearShiftProblem, v: torch.Tensor, B: torch.Tensor
) -> torch.Tensor:
    """The OOD loss :math:`w^\\top\\Sigma_{\\text{ood}} w`, :math:`w = B^\\top v -
    B_\\star^\\top v_\\star`.

    The exact expectation of :math:`(f_{v,B}(x) - y)^2` over OOD inputs with second
    moment
    :math:`\\Sigma_{\\text{ood}}`. Shapes as in :func:`id_loss`.
    """
    _check_problem(problem)
    v, B = _check_vB(problem, v, B)
    w = _end_to_end_error(v, B, problem.B_star, problem.v_star).squeeze(-1)
    return ((w @ problem.sigma_ood) * w).sum(-1)


def loss_gradients(X: torch.Tensor, y: torch.Tensor, v: torch.Tensor, B: torch.Tensor):
    """Gradients of :math:`\\widehat L(v,B) = \\frac1n\\lVert XB^\\top v - y\\rVert^2`.

    With the residual :math:`r = XB^\\top v - y`,

    .. math::
        \\nabla_v \\widehat L = \\tfrac2n B X^\\top r, \\qquad
        \\nabla_B \\widehat L = \\tfrac2n\\, v\\, (X^\\top r)^\\top .

    Every row of :math:`\\nabla_B` is a multiple of :math:`X^\\top r`, a combination of
    training
    inputs: the gradient never points out of :math:`S`. Shapes: ``X (..., n, d)``,
    ``y (..., n)``, ``v (..., k)``, ``B (..., k, d)``. Returns ``(grad_v, grad_B)``.
    """
    n = X.shape[-2]
    r = (X @ (B.transpose(-1, -2) @ v.unsqueeze(-1))).squeeze(-1) - y  # (..., n)
    xr = (X.transpose(-1, -2) @ r.unsqueeze(-1)).squeeze(-1)  # (..., d)
    grad_v = (2.0 / n) * (B @ xr.unsqueeze(-1)).squeeze(-1)
    grad_B = (2.0 / n) * v.unsqueeze(-1) * xr.unsqueeze(-2)
    return grad_v, grad_B


def linear_probe_head(
    X: torch.Tensor, y: torch.Tensor, B: torch.Tensor
) -> torch.Tensor:
    """LP: the minimum-norm least-squares head :math:`(XB^\\top)^{+} y`, features fixed.

    Shapes: ``X (..., n, d)``, ``y (..., n)``, ``B (..., k, d)``; returns ``(..., k)``.
    """
    X = check_tensor("X", X, floating=True)
    y = check_tensor("y", y, floating=True)
    B = check_tensor("B", B, floating=True)
    if X.ndim < 2 or B.ndim < 2:
        raise ValueError(
            "X and B must have at least 2 dimensions, got shapes "
            f"{tuple(X.shape)} and {tuple(B.shape)}"
        )
    if B.shape[-1] != X.shape[-1]:
        raise ValueError(
            f"B must have {X.shape[-1]} columns (the input dimension of X), "
            f"got shape {tuple(B.shape)}"
        )
    if y.shape != X.shape[:-1]:
        raise ValueError(
            f"y must have shape {tuple(X.shape[:-1])}, got {tuple(y.shape)}"
        )
    F = X.double() @ B.double().transpose(-1, -2)  # (..., n, k)
    return (torch.linalg.pinv(F) @ y.double().unsqueeze(-1)).squeeze(-1)


@dataclass(frozen=True)
class Trajectory:
    """Gradient-flow states at the requested ``times``.

    ``v`` has shape ``(T, ..., k)`` and ``B`` shape ``(T, ..., k, d)``.
    """

    times: torch.Tensor
    v: torch.Tensor
    B: torch.Tensor


def gradient_flow(
    X: torch.Tensor,
    y: torch.Tensor,
    v0: torch.Tensor,
    B0: torch.Tensor,
    times,
    *,
    dt: float = 0.01,
) -> Trajectory:
    """Integrate the flow :math:`\\dot v = -\\nabla_v L,\\ \\dot B = -\\nabla_B L`.

    The flow starts at ``(v0, B0)``. Fourth-order Runge-Kutta with step ``dt``
    (float64); the state is recorded at each of ``times`` (non-decreasing, starting at
    or after 0; each is rounded to the step grid).
    All tensors may carry the same leading batch shape, so many independent problems
    integrate together. Used for FT (from a random head) and LP-FT (from the LP head).
    """
    X = check_tensor("X", X, floating=True).double()
    y = check_tensor("y", y, floating=True).double()
    v = check_tensor("v0", v0, floating=True).double()
    B = check_tensor("B0", B0, floating=True).double()
    dt = check_float("dt", dt, minimum=0.0, strict_min=True)
    if X.ndim < 2 or B.ndim != v.ndim + 1 or B.shape[:-1] != v.shape:
        raise ValueError(
            "v0 (..., k) and B0 (..., k, d) do not match: "
            f"{tuple(v.shape)} and {tuple(B.shape)}"
        )
    if B.shape[-1] != X.shape[-1] or y.shape != X.shape[:-1]:
        raise ValueError(
            f"X (..., n, d), y (..., n) and B0 (..., k, d) do not match: "
            f"{tuple(X.shape)}, {tuple(y.shape)}, {tuple(B.shape)}"
        )
    times = torch.as_tensor(times, dtype=torch.float64).flatten()
    if (
        times.numel() == 0
        or bool((times < 0).any())
        or bool((times[1:] < times[:-1]).any())
    ):
        raise ValueError(
            "times must be a non-empty, non-decreasing sequence of numbers >= 0"
        )
    if not bool(torch.isfinite(times).all()):
        raise ValueError("times must be finite")
    marks = torch.round(times / dt).long()

    def field(v, B):
        gv, gB = loss_gradients(X, y, v, B)
        return -gv, -gB

    vs, Bs = [], []
    step = 0
    for mark in marks.tolist():
        while step < mark:
            k1v, k1B = field(v, B)
            k2v, k2B = field(v + 0.5 * dt * k1v, B + 0.5 * dt * k1B)
            k3v, k3B = field(v + 0.5 * dt * k2v, B + 0.5 * dt * k2B)
            k4v, k4B = field(v + dt * k3v, B + dt * k3B)
            v = v + dt / 6.0 * (k1v + 2 * k2v + 2 * k3v + k4v)
            B = B + dt / 6.0 * (k1B + 2 * k2B + 2 * k3B + k4B)
            step += 1
        vs.append(v.clone())
        Bs.append(B.clone())
    return Trajectory(times=marks.double() * dt, v=torch.stack(vs), B=torch.stack(Bs))


def conserved_quantity(v: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """:math:`vv^\\top - BB^\\top`, constant along the gradient flow of any loss of
    :math:`B^\\top v`."""
    v = check_tensor("v", v, floating=True)
    B = check_tensor("B", B, floating=True)
    if B.shape[:-1] != v.shape:
        raise ValueError(
            "v (..., k) and B (..., k, d) do not match: "
            f"{tuple(v.shape)} and {tuple(B.shape)}"
        )
    return v.unsqueeze(-1) * v.unsqueeze(-2) - B @ B.transpose(-1, -2)


def _check_problem(problem):
    if not isinstance(problem, LinearShiftProblem):
        raise TypeError(
            f"problem must be a LinearShiftProblem, got {type(problem).__name__}"
        )


def _check_vB(problem, v, B):
    k, d = problem.B_star.shape
    v = check_tensor("v", v, floating=True).double()
    B = check_tensor("B", B, floating=True).double()
    if v.ndim < 1 or v.shape[-1] != k:
        raise ValueError(f"v must have last dimension {k}, got shape {tuple(v.shape)}")
    if B.shape[-2:] != (k, d) or B.shape[:-2] != v.shape[:-1]:
        raise ValueError(
            f"B must have shape (..., {k}, {d}) matching v, got {tuple(B.shape)}"
        )
    return v, B


@dataclass(frozen=True)
class DistortionSweep:
    """LP, FT and LP-FT on a grid of feature errors, shift angles and seeds.

    Shapes: ``E = len(feature_errors)``, ``A = len(shift_angles)``, ``S = len(seeds)``,
    ``T = len(times)``. OOD losses carry the shift-angle axis; ID losses do not (the ID
    inputs do not depend on the shift).
    """

    feature_errors: tuple
    shift_angles: tuple
    seeds: tuple
    times: torch.Tensor  # (T,)
    lp_id: torch.Tensor  # (E, S)
    lp_ood: torch.Tensor  # (E, A, S)
    ft_id: torch.Tensor  # (E, S, T)
    ft_ood: torch.Tensor  # (E, A, S, T)
    lpft_id: torch.Tensor  # (E, S, T)
    lpft_ood: torch.Tensor  # (E, A, S, T)
    problems: tuple = ()  # the E * S instances, ε-major
    ft: Trajectory | None = None  # FT states, batch axis E * S (ε-major)
    lpft: Trajectory | None = None  # LP-FT states, same layout


def distortion_sweep(
    base: LinearShiftConfig,
    feature_errors,
    shift_angles,
    seeds,
    times,
    *,
    dt: float = 0.01,
) -> DistortionSweep:
    """Run LP (closed form), FT and LP-FT (gradient flow) for every error and seed.

    Each ``(feature_error, seed)`` is one instance of ``base`` with those two fields
    replaced; all instances integrate together in one batched :func:`gradient_flow`. The
    OOD losses are then evaluated exactly for each shift angle.
    """
    import dataclasses

    if not isinstance(base, LinearShiftConfig):
        raise TypeError(f"base must be a LinearShiftConfig, got {type(base).__name__}")
    eps = tuple(
        check_float("feature_errors", e, minimum=0.0, maximum=math.pi / 2)
        for e in feature_errors
    )
    alphas = tuple(
        check_float("shift_angles", a, minimum=0.0, maximum=math.pi / 2)
        for a in shift_angles
    )
    seeds = tuple(check_int("seeds", s, minimum=0) for s in seeds)
    if not (eps and alphas and seeds):
        raise ValueError(
            "feature_errors, shift_angles and seeds must each hold at least one value"
        )
    probs = [
        [
            make_linear_shift_problem(
                dataclasses.replace(base, feature_error=e, seed=s)
            )
            for s in seeds
        ]
        for e in eps
    ]
    flat = [p for row in probs for p in row]
    X = torch.stack([p.X for p in flat])
    y = torch.stack([p.y for p in flat])
    B0 = torch.stack([p.B0 for p in flat])
    v_lp = linear_probe_head(X, y, B0)
    ft = gradient_flow(X, y, torch.stack([p.v0 for p in flat]), B0, times, dt=dt)
    lpft = gradient_flow(X, y, v_lp, B0, times, dt=dt)
    E, A, S, T = len(eps), len(alphas), len(seeds), ft.times.numel()
    out = {
        k: torch.empty(shape, dtype=torch.float64)
        for k, shape in (
            ("lp_id", (E, S)),
            ("lp_ood", (E, A, S)),
            ("ft_id", (E, S, T)),
            ("ft_ood", (E, A, S, T)),
            ("lpft_id", (E, S, T)),
            ("lpft_ood", (E, A, S, T)),
        )
    }
    for i in range(E):
        for j in range(S):
            b = i * S + j
            base_p = probs[i][j]
            out["lp_id"][i, j] = id_loss(base_p, v_lp[b], B0[b])
            out["ft_id"][i, j] = id_loss(base_p, ft.v[:, b], ft.B[:, b])
            out["lpft_id"][i, j] = id_loss(base_p, lpft.v[:, b], lpft.B[:, b])
            for a, alpha in enumerate(alphas):
                ca, sa = math.cos(alpha), math.sin(alpha)
                p = dataclasses.replace(
                    base_p, sigma_ood=ca**2 * base_p.P_S + sa**2 * base_p.P_perp
                )
                out["lp_ood"][i, a, j] = ood_loss(p, v_lp[b], B0[b])
                out["ft_ood"][i, a, j] = ood_loss(p, ft.v[:, b], ft.B[:, b])
                out["lpft_ood"][i, a, j] = ood_loss(p, lpft.v[:, b], lpft.B[:, b])
    return DistortionSweep(
        feature_errors=eps,
        shift_angles=alphas,
        seeds=seeds,
        times=ft.times,
        **out,
        problems=tuple(flat),
        ft=ft,
        lpft=lpft,
    )
