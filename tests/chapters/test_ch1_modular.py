"""Chapter 1's library: exact constrained probes, the decomposition, the two-view world,
the interface bound.

Oracles: least squares by numpy, projected gradient descent, explicit Gaussian
densities, Monte Carlo, scipy's Spearman correlation, and the masked-view loss computed
from samples of the hidden view.
"""

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from fmlab.adapt import fine_tune_linear_head_adam, linear_probe
from fmlab.chapters.ch1_modular import (
    ViewFineTuneConfig,
    ViewPretrainConfig,
    decomposition_grid,
    draw_task_sample,
    interface_bound_at,
    interface_bounds,
    probe_features,
    representation_excess_losses,
    task_moments,
)
from fmlab.data import TwoViewConfig, TwoViewLatentModel
from fmlab.models import MaskedViewPredictor
from fmlab.repro import make_generator, seed_everything
from fmlab.theory import (
    decompose_adaptation_loss,
    interface_constant,
    posterior_readout,
    spearman,
)
from fmlab.theory.least_squares import (
    Moments,
    ball_constrained_least_squares,
    ball_constrained_path,
    quadratic_loss,
    second_moments,
)


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
    tuned, head = fine_tune_linear_head_adam(
        model, probe_features, sample.xa, sample.y, steps=0, lr=0.1, head_init=head0
    )
    assert head.dtype == torch.float64 and torch.equal(head, head0.double())
    _, head = fine_tune_linear_head_adam(
        model, probe_features, sample.xa, sample.y, steps=3, lr=0.01
    )
    assert head.dtype == torch.float64 and head.shape == (4,)
    with pytest.raises(ValueError, match="head_init must have size 4"):
        fine_tune_linear_head_adam(
            model,
            probe_features,
            sample.xa,
            sample.y,
            steps=1,
            lr=0.1,
            head_init=torch.zeros(3),
        )
    with pytest.raises(ValueError, match="lr must be > 0"):
        fine_tune_linear_head_adam(
            model, probe_features, sample.xa, sample.y, steps=1, lr=0.0
        )
    with pytest.raises(ValueError, match="checkpoints"):
        ViewPretrainConfig(steps=10, checkpoints=(0, 20))


@pytest.mark.parametrize("lr", [0.0, -1e-3, float("nan"), float("inf")])
def test_configs_validate_learning_rates(lr):
    with pytest.raises(ValueError, match="lr must be"):
        ViewPretrainConfig(lr=lr)
    with pytest.raises(ValueError, match="lr must be"):
        ViewFineTuneConfig(lr=lr)
    with pytest.raises(TypeError, match="lr must be a real number"):
        ViewFineTuneConfig(lr="0.1")
    with pytest.raises(ValueError, match="steps"):
        ViewFineTuneConfig(steps=0)


def test_ball_constrained_path_matches_single_solves_and_projected_gradient():
    X, y = _problem()
    m = second_moments(X, y)
    c0s = (0.05, 0.3, 1.0, 3.0, float("inf"))
    path = ball_constrained_path(m, c0s)
    assert path.shape == (5, 5) and path.dtype == torch.float64
    for c0, g in zip(c0s, path):
        assert torch.allclose(g, ball_constrained_least_squares(m, c0), atol=1e-12)
    assert torch.allclose(path[1], _projected_gradient(m, 0.3), atol=1e-5)
    with pytest.raises(TypeError, match="sequence"):
        ball_constrained_path(m, 1.0)
    with pytest.raises(ValueError, match="c0s must be > 0"):
        ball_constrained_path(m, (1.0, 0.0))


def test_decomposition_grid_matches_pointwise_decomposition():
    world = TwoViewLatentModel(TwoViewConfig(n_classes=5, dim_a=2, dim_b=6))
    seed_everything(0)
    model = MaskedViewPredictor(2, 6, width=8, rep_dim=4)
    signs = world.task_signs(1)
    pop = task_moments(model, world, signs, 3000, seed=2)
    ns, c0s, seeds = (4, 30), (0.1, 1.0, float("inf")), (5, 6)
    grid = decomposition_grid(model, world, signs, pop, ns, c0s, seeds)
    for i, n in enumerate(ns):
        for k, seed in enumerate(seeds):
            sample = draw_task_sample(world, signs, n, seed)
            emp = second_moments(probe_features(model, sample.xa).detach(), sample.y)
            for j, c0 in enumerate(c0s):
                d = decompose_adaptation_loss(emp, pop, c0)
                assert grid.adapted_loss[i, j, k] == pytest.approx(d.adapted_loss)
                assert grid.minimal_loss[i, j, k] == pytest.approx(d.minimal_loss)
                assert grid.generalization_error[i, j, k] == pytest.approx(
                    d.generalization_error, abs=1e-10
                )
                assert grid.erm_slack[i, j, k] == pytest.approx(d.erm_slack, abs=1e-10)


def _small_world():
    return TwoViewLatentModel(
        TwoViewConfig(n_classes=4, dim_a=2, dim_b=6, noise_a=0.6, noise_b=0.4, seed=3)
    )


def test_posterior_readout_reads_the_task_off_the_bayes_prediction():
    world = _small_world()
    s = world.task_signs(0)
    w = posterior_readout(world.means_b, s)
    assert torch.allclose(world.means_b @ w, s, atol=1e-12)
    # independent: numpy's minimum-norm least-squares solution of N w = s
    w_np = np.linalg.lstsq(world.means_b.numpy(), s.numpy(), rcond=None)[0]
    assert torch.allclose(w, torch.from_numpy(w_np), atol=1e-10)
    assert interface_constant(world.means_b, s) == pytest.approx(
        6 * float((w_np**2).sum()), rel=1e-10
    )
    _, xa, _ = world.sample(50, make_generator(1))
    assert torch.allclose(
        world.bayes_prediction(xa) @ w, world.posterior(xa) @ s, atol=1e-10
    )
    low_rank = torch.cat([world.means_b[:3], world.means_b[:1]])
    with pytest.raises(ValueError, match="rank K = 4"):
        posterior_readout(low_rank, s)
    with pytest.raises(ValueError, match="signs must have size 4"):
        posterior_readout(world.means_b, torch.ones(3, dtype=torch.float64))


def _trained_model(world, steps, seed=0):
    seed_everything(seed)
    model = MaskedViewPredictor(2, 6, width=16, rep_dim=8)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = make_generator(seed + 1)
    for _ in range(steps):
        _, xa, xb = world.sample(128, g)
        loss = (model(xa) - xb).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.mark.parametrize("steps", [0, 30, 300])
def test_interface_bound_terms_match_independent_computations(steps):
    world = _small_world()
    model = _trained_model(world, steps)
    tasks = (0, 1, 2)
    bounds = interface_bounds(model, world, tasks, n=4000, seed=9)
    _, xa, _ = world.sample(4000, make_generator(9))  # the same draws
    with torch.no_grad():
        phi = model.features(xa).double().numpy()
        pred = model(xa).double().numpy()
    post = world.posterior(xa).numpy()
    f_star = post @ world.means_b.numpy()
    psi = np.hstack([phi, np.ones((len(phi), 1))])
    for t, b in zip(tasks, bounds):
        s = world.task_signs(t).numpy()
        m = post @ s
        coef = np.linalg.lstsq(psi, m, rcond=None)[0]
        assert b.excess_minimal_loss == pytest.approx(
            np.mean((m - psi @ coef) ** 2), rel=1e-6, abs=1e-10
        )
        w = np.linalg.lstsq(world.means_b.numpy(), s, rcond=None)[0]
        assert b.readout_loss == pytest.approx(
            np.mean((m - pred @ w) ** 2), rel=1e-4, abs=1e-7
        )
        assert b.excess_pretraining_loss == pytest.approx(
            np.mean((pred - f_star) ** 2), rel=1e-4
        )
        assert b.constant == pytest.approx(6 * (w**2).sum(), rel=1e-10)
        assert b.bound == pytest.approx(b.constant * b.excess_pretraining_loss)
        # the theorem's chain, exactly on these draws
        assert b.excess_minimal_loss <= b.readout_loss + 1e-12
        assert b.readout_loss <= b.bound + 1e-12
    single = interface_bound_at(model, world, 1, n=4000, seed=9)
    for field in ("excess_minimal_loss", "readout_loss", "excess_pretraining_loss"):
        assert getattr(single, field) == pytest.approx(getattr(bounds[1], field))
    assert single.constant == bounds[1].constant


def test_interface_bound_sides_are_excess_population_losses():
    """Both excesses are population losses minus Bayes losses (Monte Carlo oracle)."""
    world = _small_world()
    model = _trained_model(world, 100)
    b = interface_bound_at(model, world, 0, n=200_000, seed=4)
    # pretraining side: the masked-view loss with the hidden view, minus the Bayes loss
    c, xa, xb = world.sample(200_000, make_generator(5))
    with torch.no_grad():
        l_model = float((model(xa).double() - xb.double()).pow(2).mean())
    l_bayes = float((world.bayes_prediction(xa) - xb.double()).pow(2).mean())
    assert b.excess_pretraining_loss == pytest.approx(l_model - l_bayes, abs=3e-3)
    # adaptation side: the best probe fitted to noisy labels, minus the Bayes task loss
    s = world.task_signs(0)
    feats = probe_features(model, xa).detach()
    mom = second_moments(feats, s[c])
    l_star = quadratic_loss(ball_constrained_least_squares(mom, float("inf")), mom)
    l_task = float((world.posterior(xa) @ s - s[c]).pow(2).mean())
    assert b.excess_minimal_loss == pytest.approx(l_star - l_task, abs=3e-3)


def test_representation_excess_losses():
    world = _small_world()
    model = _trained_model(world, 100)
    out = representation_excess_losses(
        world,
        {"raw": lambda xa: xa, "posterior": world.posterior, "model": model.features},
        (0, 1),
        n=3000,
        seed=2,
    )
    assert set(out) == {"raw", "posterior", "model"}
    # the posterior itself is a perfect representation: every m = s^T p is linear in it
    assert torch.allclose(
        out["posterior"], torch.zeros(2, dtype=torch.float64), atol=1e-12
    )
    _, xa, _ = world.sample(3000, make_generator(2))
    psi = np.hstack([xa.double().numpy(), np.ones((3000, 1))])
    for t in range(2):
        m = (world.posterior(xa) @ world.task_signs(t)).numpy()
        coef = np.linalg.lstsq(psi, m, rcond=None)[0]
        assert float(out["raw"][t]) == pytest.approx(np.mean((m - psi @ coef) ** 2))
    with pytest.raises(TypeError, match="encoders"):
        representation_excess_losses(world, {}, (0,), n=10, seed=0)
    with pytest.raises(ValueError, match="task_seeds"):
        representation_excess_losses(world, {"raw": lambda x: x}, (), n=10, seed=0)
