"""Chapter 1's library: exact constrained probes, the decomposition, the two-view world.

Oracles: least squares by numpy, projected gradient descent, explicit Gaussian densities,
Monte Carlo, and scipy's Spearman correlation.
"""


import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from fmlab import (
    Moments,
    ball_constrained_least_squares,
    fine_tune,
    linear_probe,
    quadratic_loss,
    second_moments,
)
from fmlab.data import TwoViewConfig, TwoViewLatentModel
from fmlab.models import MaskedViewPredictor
from fmlab.modular import (
    PretrainConfig,
    decomposition_grid,
    draw_task_sample,
    probe_features,
    task_moments,
)
from fmlab.repro import make_generator
from fmlab.theory import decompose_adaptation_loss, spearman


def _problem(n=40, k=5, seed=0):
    g = make_generator(seed)
    X = torch.randn(n, k, generator=g, dtype=torch.float64)
    y = X @ torch.randn(k, generator=g, dtype=torch.float64) + 0.3 * torch.randn(
        n, generator=g, dtype=torch.float64
    )
    return X, y


def _projected_gradient(m: Moments, c0: float, iters=20000):
    step = 0.5 / float(torch.linalg.eigvalsh(m.sigma).max())
    g = torch.zeros_like(m.b)
    for _ in range(iters):
        g = g - step * 2 * (m.sigma @ g - m.b)
        if g.norm() > c0:
            g = g * (c0 / g.norm())
    return g


def test_second_moments_and_quadratic_loss_match_direct_formulas():
    X, y = _problem()
    m = second_moments(X, y)
    gamma = torch.randn(5, dtype=torch.float64)
    direct = float(((X @ gamma - y) ** 2).mean())
    assert quadratic_loss(gamma, m) == pytest.approx(direct, rel=1e-10)


@pytest.mark.parametrize("c0", [0.05, 0.3, 1.0, 3.0])
def test_ball_constrained_solution_matches_projected_gradient(c0):
    X, y = _problem()
    m = second_moments(X, y)
    exact = ball_constrained_least_squares(m, c0)
    brute = _projected_gradient(m, c0)
    assert float(exact.norm()) <= c0 * (1 + 1e-9)
    assert quadratic_loss(exact, m) <= quadratic_loss(brute, m) + 1e-9
    assert torch.allclose(exact, brute, atol=1e-5)


def test_ball_constrained_kkt_and_unconstrained_limit():
    X, y = _problem()
    m = second_moments(X, y)
    free = torch.from_numpy(np.linalg.lstsq(X.numpy(), y.numpy(), rcond=None)[0])
    assert torch.allclose(
        ball_constrained_least_squares(m, float("inf")), free, atol=1e-9
    )
    c0 = 0.5 * float(free.norm())
    g = ball_constrained_least_squares(m, c0)
    grad = m.sigma @ g - m.b  # KKT: grad = -lambda * g with lambda > 0
    lam = -float(grad @ g) / float(g @ g)
    assert lam > 0 and torch.allclose(grad, -lam * g, atol=1e-8)
    assert float(g.norm()) == pytest.approx(c0, rel=1e-9)


def test_interpolation_when_fewer_samples_than_features():
    X, y = _problem(n=4, k=10)
    g = linear_probe(X, y)
    assert torch.allclose(X @ g, y, atol=1e-8)
    assert torch.allclose(g, torch.linalg.pinv(X) @ y, atol=1e-8)  # minimum norm


def test_linear_probe_validates():
    X, y = _problem()
    with pytest.raises(ValueError, match="c0 must be > 0"):
        linear_probe(X, y, -1.0)
    with pytest.raises(ValueError, match="same number of rows"):
        linear_probe(X, y[:-1])
    with pytest.raises(TypeError, match="floating"):
        linear_probe(X.long(), y)
    with pytest.raises(ValueError, match="features must have 2 dimensions"):
        linear_probe(X[0], y)


def test_decomposition_terms_and_inequality():
    X, y = _problem(n=30)
    Xp, yp = _problem(n=20000, seed=1)
    emp, pop = second_moments(X, y), second_moments(Xp, yp)
    for c0 in (0.1, 1.0, 10.0):
        d = decompose_adaptation_loss(emp, pop, c0)
        # independent recomputation of each term
        gt, gs = (
            ball_constrained_least_squares(emp, c0),
            ball_constrained_least_squares(pop, c0),
        )
        assert d.gap_at_task == pytest.approx(
            quadratic_loss(gt, pop) - quadratic_loss(gt, emp)
        )
        assert d.gap_at_star == pytest.approx(
            quadratic_loss(gs, emp) - quadratic_loss(gs, pop)
        )
        assert d.erm_slack >= -1e-12
        assert d.adapted_loss <= d.bound + 1e-12
        assert d.adapted_loss == pytest.approx(d.bound - d.erm_slack)
    with pytest.raises(ValueError, match="same feature size"):
        decompose_adaptation_loss(emp, second_moments(Xp[:, :3], yp), 1.0)


def test_posterior_matches_explicit_gaussian_densities():
    world = TwoViewLatentModel(
        TwoViewConfig(n_classes=5, dim_a=3, dim_b=4, noise_a=0.7)
    )
    _, xa, _ = world.sample(50, make_generator(1))
    cov = world.config.noise_a**2 * torch.eye(3, dtype=torch.float64)
    logp = torch.stack(
        [
            torch.distributions.MultivariateNormal(world.means_a[c], cov).log_prob(
                xa.double()
            )
            for c in range(5)
        ],
        1,
    )
    assert torch.allclose(world.posterior(xa), torch.softmax(logp, 1), atol=1e-10)


def test_bayes_losses_match_monte_carlo():
    world = TwoViewLatentModel(
        TwoViewConfig(n_classes=6, dim_a=2, dim_b=5, noise_a=0.6, noise_b=0.4)
    )
    c, xa, xb = world.sample(200_000, make_generator(2))
    mc_pre = float((world.bayes_prediction(xa) - xb.double()).pow(2).mean())
    assert world.optimal_pretraining_loss(n=200_000, seed=3) == pytest.approx(
        mc_pre, rel=0.01
    )
    s = world.task_signs(0)
    assert float(s.sum()) == 0.0 and set(s.tolist()) == {-1.0, 1.0}
    mc_task = float((world.posterior(xa) @ s - s[c]).pow(2).mean())
    assert world.bayes_task_loss(s, n=200_000, seed=4) == pytest.approx(
        mc_task, rel=0.02
    )


def test_world_validates():
    with pytest.raises(ValueError, match="n_classes"):
        TwoViewConfig(n_classes=1)
    with pytest.raises(ValueError, match="noise_a"):
        TwoViewConfig(noise_a=0.0)
    world = TwoViewLatentModel()
    with pytest.raises(ValueError, match="xa must have size 4"):
        world.posterior(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="n must be >= 1"):
        world.sample(0, make_generator(0))
    with pytest.raises(TypeError, match="generator"):
        world.sample(3, 0)
    with pytest.raises(TypeError, match="config"):
        TwoViewLatentModel({"n_classes": 3})


def test_spearman_matches_scipy():
    g = make_generator(5)
    x, y = torch.randn(30, generator=g), torch.randn(30, generator=g)
    y[3] = y[4]  # a tie
    assert spearman(x, y) == pytest.approx(
        spearmanr(x.numpy(), y.numpy()).statistic, abs=1e-12
    )
    assert spearman(x, 2 * x + 1) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="constant"):
        spearman(x, torch.ones(30))


def test_grid_and_fine_tune_shapes():
    world = TwoViewLatentModel()
    model = MaskedViewPredictor(4, 24, width=8, rep_dim=3)
    signs = world.task_signs(0)
    pop = task_moments(model, world, signs, 2000, seed=0)
    grid = decomposition_grid(
        model, world, signs, pop, ns=(5, 10), c0s=(0.5, 1.0, 2.0), task_seeds=(0, 1)
    )
    assert grid.adapted_loss.shape == (2, 3, 2)
    assert bool(
        (
            grid.adapted_loss <= grid.minimal_loss + grid.generalization_error + 1e-9
        ).all()
    )
    with pytest.raises(ValueError, match="c0s"):
        decomposition_grid(
            model, world, signs, pop, ns=(5,), c0s=(0.0,), task_seeds=(0,)
        )
    sample = draw_task_sample(world, signs, 16, seed=0)
    head0 = torch.zeros(4)
    tuned, head = fine_tune(
        model, probe_features, sample.xa, sample.y, steps=0, lr=0.1, head_init=head0
    )
    assert torch.equal(head, head0)
    with pytest.raises(ValueError, match="head_init must have size 4"):
        fine_tune(
            model,
            probe_features,
            sample.xa,
            sample.y,
            steps=1,
            lr=0.1,
            head_init=torch.zeros(3),
        )
    with pytest.raises(ValueError, match="lr must be > 0"):
        fine_tune(model, probe_features, sample.xa, sample.y, steps=1, lr=0.0)
    with pytest.raises(ValueError, match="checkpoints"):
        PretrainConfig(steps=10, checkpoints=(0, 20))
