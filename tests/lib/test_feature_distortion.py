"""Tests of fmlab.theory.feature_distortion (Chapter 3) against independent oracles."""

import math

import numpy as np
import pytest
import torch
from scipy.integrate import solve_ivp

from fmlab.theory.feature_distortion import (
    LinearShiftConfig,
    conserved_quantity,
    distortion_sweep,
    gradient_flow,
    id_loss,
    linear_probe_head,
    loss_gradients,
    make_linear_shift_problem,
    ood_loss,
    subspace_sine_distance,
)

SMALL = LinearShiftConfig(
    dim=6,
    rank=2,
    id_dim=3,
    n=5,
    feature_error=0.2,
    shift_angle=0.7,
    head_scale=0.3,
    seed=3,
)


def test_problem_geometry():
    p = make_linear_shift_problem(SMALL)
    eye_k = torch.eye(2, dtype=torch.float64)
    assert torch.allclose(p.B_star @ p.B_star.T, eye_k, atol=1e-12)
    assert torch.allclose(p.B0 @ p.B0.T, eye_k, atol=1e-12)
    # the inputs lie in S and span it
    assert torch.allclose(p.X @ p.P_perp, torch.zeros_like(p.X), atol=1e-12)
    assert torch.linalg.matrix_rank(p.X) == 3
    # every principal angle between the row spaces equals the feature error
    qa, _ = torch.linalg.qr(p.B0.T)
    qb, _ = torch.linalg.qr(p.B_star.T)
    cosines = torch.linalg.svdvals(qa.T @ qb)
    assert torch.allclose(
        cosines, torch.full((2,), math.cos(0.2), dtype=torch.float64), atol=1e-12
    )
    assert subspace_sine_distance(p.B0, p.B_star) == pytest.approx(
        math.sin(0.2), abs=1e-12
    )


def test_losses_match_monte_carlo_and_definition():
    p = make_linear_shift_problem(SMALL)
    g = torch.Generator().manual_seed(0)
    v = torch.randn(2, generator=g, dtype=torch.float64)
    B = torch.randn(2, 6, generator=g, dtype=torch.float64)
    # ID loss: the mean squared error on the training inputs, by its definition
    direct = ((p.X @ B.T @ v - p.y) ** 2).mean()
    assert float(id_loss(p, v, B)) == pytest.approx(float(direct), rel=1e-12)
    # OOD loss: Monte Carlo over inputs with second moment sigma_ood
    L = torch.linalg.cholesky(p.sigma_ood + 1e-15 * torch.eye(6, dtype=torch.float64))
    x = torch.randn(400_000, 6, generator=g, dtype=torch.float64) @ L.T
    mc = ((x @ B.T @ v - x @ p.B_star.T @ p.v_star) ** 2).mean()
    assert float(ood_loss(p, v, B)) == pytest.approx(float(mc), rel=0.01)


def test_gradients_match_autograd():
    p = make_linear_shift_problem(SMALL)
    g = torch.Generator().manual_seed(1)
    v = torch.randn(2, generator=g, dtype=torch.float64, requires_grad=True)
    B = torch.randn(2, 6, generator=g, dtype=torch.float64, requires_grad=True)
    loss = ((p.X @ B.T @ v - p.y) ** 2).mean()
    gv_ref, gB_ref = torch.autograd.grad(loss, (v, B))
    gv, gB = loss_gradients(p.X, p.y, v.detach(), B.detach())
    assert torch.allclose(gv, gv_ref, atol=1e-12)
    assert torch.allclose(gB, gB_ref, atol=1e-12)
    # the gradient in B never leaves the span of the training inputs
    assert torch.allclose(gB @ p.P_perp, torch.zeros_like(gB), atol=1e-12)


def test_linear_probe_is_least_squares():
    p = make_linear_shift_problem(SMALL)
    F = p.X @ p.B0.T
    ref = np.linalg.lstsq(F.numpy(), p.y.numpy(), rcond=None)[0]
    assert np.allclose(linear_probe_head(p.X, p.y, p.B0).numpy(), ref, atol=1e-10)
    # with perfect features LP recovers v_star and has zero OOD loss
    perfect = make_linear_shift_problem(
        LinearShiftConfig(**{**SMALL.__dict__, "feature_error": 0.0})
    )
    v = linear_probe_head(perfect.X, perfect.y, perfect.B0)
    assert torch.allclose(v, perfect.v_star, atol=1e-10)
    assert float(ood_loss(perfect, v, perfect.B0)) < 1e-20


def test_gradient_flow_matches_scipy_and_conserves():
    p = make_linear_shift_problem(SMALL)
    times = [0.0, 0.5, 2.0, 5.0]
    traj = gradient_flow(p.X, p.y, p.v0, p.B0, times, dt=0.005)

    def rhs(_t, z):
        v = torch.from_numpy(z[:2])
        B = torch.from_numpy(z[2:]).reshape(2, 6)
        gv, gB = loss_gradients(p.X, p.y, v, B)
        return -np.concatenate([gv.numpy(), gB.numpy().ravel()])

    z0 = np.concatenate([p.v0.numpy(), p.B0.numpy().ravel()])
    sol = solve_ivp(
        rhs, (0, 5.0), z0, t_eval=times, rtol=1e-11, atol=1e-12, method="DOP853"
    )
    for i in range(len(times)):
        assert np.allclose(traj.v[i].numpy(), sol.y[:2, i], atol=1e-8)
        assert np.allclose(traj.B[i].numpy().ravel(), sol.y[2:, i], atol=1e-8)
    q = conserved_quantity(traj.v, traj.B)
    assert torch.allclose(q, q[0].expand_as(q), atol=1e-9)
    # B moves only inside S: its action on the orthogonal complement is frozen
    assert torch.allclose(
        traj.B @ p.P_perp, (p.B0 @ p.P_perp).expand_as(traj.B), atol=1e-10
    )


def test_scalar_flow_closed_form():
    # k = d = n = 1: with v = b initially, v = b stays, and p = v*b solves
    # dp/dt = -4 p (p - a) (x = 1, loss (p - a)^2): a logistic equation, closed form.
    a, p0 = 2.0, 0.25
    X = torch.ones(1, 1, dtype=torch.float64)
    y = torch.tensor([a], dtype=torch.float64)
    s = math.sqrt(p0)
    traj = gradient_flow(
        X,
        y,
        torch.tensor([s], dtype=torch.float64),
        torch.tensor([[s]], dtype=torch.float64),
        [0.0, 0.1, 0.3, 1.0],
        dt=0.001,
    )
    for t, v, B in zip(traj.times.tolist(), traj.v, traj.B):
        exact = a / (1 + (a / p0 - 1) * math.exp(-4 * a * t))
        assert float(v[0] * B[0, 0]) == pytest.approx(exact, rel=1e-9)


def test_sweep_shapes_and_lp_ft_monotone():
    times = torch.linspace(0, 4, 5)
    r = distortion_sweep(SMALL, (0.0, 0.1), (0.0, math.pi / 2), (0, 1), times, dt=0.02)
    assert (
        r.ft_ood.shape == (2, 2, 2, 5)
        and r.lp_ood.shape == (2, 2, 2)
        and r.lpft_id.shape == (2, 2, 5)
    )
    # gradient flow never increases the training loss: LP-FT's ID loss stays below LP's
    assert bool((r.lpft_id <= r.lp_id[..., None] + 1e-12).all())
    assert bool((r.ft_id[..., 1:] <= r.ft_id[..., :-1] + 1e-12).all())
    # perfect features: LP-FT does not move, LP is exact
    assert (
        float(r.lp_ood[0].abs().max()) < 1e-20
        and float(r.lpft_ood[0].abs().max()) < 1e-20
    )


def test_invalid_arguments_name_the_argument():
    with pytest.raises(ValueError, match="rank"):
        LinearShiftConfig(dim=6, rank=4, id_dim=3)
    with pytest.raises(ValueError, match="feature_error"):
        LinearShiftConfig(feature_error=2.0)
    with pytest.raises(ValueError, match="n must be"):
        LinearShiftConfig(n=3, id_dim=10)
    with pytest.raises(TypeError, match="config"):
        make_linear_shift_problem("not a config")
    p = make_linear_shift_problem(SMALL)
    with pytest.raises(ValueError, match="times"):
        gradient_flow(p.X, p.y, p.v0, p.B0, [1.0, 0.5])
    with pytest.raises(ValueError, match="dt"):
        gradient_flow(p.X, p.y, p.v0, p.B0, [1.0], dt=0.0)
    with pytest.raises(ValueError, match="v0"):
        gradient_flow(p.X, p.y, p.v0[:1], p.B0, [1.0])
    with pytest.raises(ValueError, match="B must have"):
        ood_loss(p, p.v0, p.B0[:, :3])
    with pytest.raises(TypeError, match="problem"):
        id_loss(None, p.v0, p.B0)
    with pytest.raises(ValueError, match="y must have"):
        linear_probe_head(p.X, p.y[:2], p.B0)
