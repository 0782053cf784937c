"""Tests of fmlab.chapters.ch5_theory (Chapter 5, the theory page) at tiny configs.

Oracles: the closed-form flow of the manifold model (whose half-times scale exactly like
(η²/B)⁻¹), hand-made paths with known crossings, the Bartlett identity of a
well-specified softmax regression (Σ = H at its minimiser), and the closed-form trace
6·n^(1/3) of the transferable Dyck solution.
"""

import math

import pytest
import torch

from fmlab.chapters import ch5_theory as ch5
from fmlab.theory import flatness as fl
from fmlab.theory.sgd_manifold import ManifoldModel, flow_trace


def _result(paths, lrs=(0.01, 0.02), batches=(1, 2), record_every=10):
    """A ManifoldResult whose runs follow the given trace paths (k, settings, runs)."""
    k, n, runs = paths.shape
    cfg = ch5.SGDManifoldConfig(
        lrs=lrs, batches=batches, runs=runs, replicates=runs, record_every=record_every
    )
    model = ManifoldModel(torch.tensor(cfg.p_star, dtype=torch.float64))
    s0 = torch.full((len(cfg.p_star) - 1,), cfg.s0, dtype=torch.float64)
    steps = torch.arange(k, dtype=torch.float64) * record_every
    zeros = torch.zeros(k, n, runs)
    return ch5.ManifoldResult(
        cfg, model, s0, steps, paths, zeros, zeros[..., None].expand(-1, -1, -1, 3)
    )


def test_half_time_interpolates_between_records():
    man = _result(torch.ones(3, 4, 1))
    lo = man.min_trace
    # a straight line from lo + 10 to lo at steps 0, 10, 20: midpoint lo + 5 at step 10
    path = torch.tensor([lo + 10, lo + 4, lo], dtype=torch.float64)
    assert man.half_time(path) == pytest.approx(10 * (5 / 6))
    assert math.isnan(man.half_time(torch.full((3,), lo + 10, dtype=torch.float64)))


def test_the_flow_itself_has_drift_exponent_minus_one():
    lrs, batches = (0.02, 0.03, 0.04), (1, 2, 4)
    cfg = ch5.SGDManifoldConfig(lrs=lrs, batches=batches, runs=2, replicates=2)
    model = ManifoldModel(torch.tensor(cfg.p_star, dtype=torch.float64))
    s0 = torch.full((3,), cfg.s0, dtype=torch.float64)
    steps = torch.arange(0, 20_001, 10, dtype=torch.float64)
    paths = torch.stack(
        [flow_trace(model, s0, lr**2 * steps, float(b)) for lr, b in cfg.settings], 1
    )
    paths = paths[..., None].expand(-1, -1, 2)
    zeros = torch.zeros_like(paths)
    man = ch5.ManifoldResult(
        cfg, model, s0, steps, paths, zeros, zeros[..., None].expand(-1, -1, -1, 3)
    )
    assert len(man.reached()) >= 5
    assert torch.allclose(man.drift_exponents(), torch.tensor(-1.0), atol=1e-3)
    assert float(man.largest_flow_deviation(4e-4).max()) < 1e-12
    # every reached setting's scaled half-time is the flow's own
    for i in man.reached():
        lr, b = cfg.settings[i]
        scaled = lr**2 * man.half_time(paths[:, i, 0]) / b
        assert scaled == pytest.approx(man.flow_half_time(), rel=2e-3)


def test_manifold_sgd_runs_and_lowers_the_trace():
    cfg = ch5.SGDManifoldConfig(
        lrs=(0.04,), batches=(1,), runs=4, replicates=2, steps=400, record_every=100
    )
    man = ch5.manifold_sgd(cfg)
    assert man.trace.shape == (5, 1, 4) and man.s.shape == (5, 1, 4, 3)
    assert bool((man.trace[-1] < man.trace[0]).all())
    assert man.replicate_means().shape == (5, 1, 2)


def test_replicates_must_divide_the_runs():
    with pytest.raises(ValueError):
        ch5.SGDManifoldConfig(runs=10, replicates=4)


def test_examples_needed():
    errors = torch.tensor([[0.5, 0.3], [0.02, 0.0], [0.001, 0.003]])
    assert ch5.examples_needed(errors, (2, 4, 8)) == 8
    assert ch5.examples_needed(errors, (2, 4, 8), level=0.2) == 4
    assert ch5.examples_needed(errors * 100, (2, 4, 8)) == float("inf")


def test_softmax_regression_fit_satisfies_bartlett_when_well_specified():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(20, 3, generator=g, dtype=torch.float64)
    W = torch.randn(3, 3, generator=g, dtype=torch.float64)
    targets = torch.softmax(X @ W.T, -1)  # a softmax regression generates the labels
    fit = ch5.fit_softmax_regression(X, targets)
    xs, ys = X.repeat_interleave(3, 0), torch.arange(3).repeat(20)
    mean_g, cov = fl.gradient_covariance(
        ch5.softmax_nll, fit, xs, ys, (targets / 20).reshape(-1)
    )
    H = fl.hessian_matrix(lambda p: ch5.softmax_population_loss(p, X, targets), fit)
    assert float(mean_g.norm()) < 1e-6
    assert fl.bartlett_gap(cov, H) < 1e-6


def test_dyck_solutions_tiny():
    cfg = ch5.DyckConfig(n=4, neurons=60, seeds=(0,), downstream_sizes=(2, 8), draws=2)
    out = ch5.dyck_solutions(cfg)
    assert set(out) == {"transferable", "memorising 0"}
    assert out["transferable"]["trace"] == pytest.approx(6 * 4 ** (1 / 3))
    assert out["memorising 0"]["errors"].shape == (2, 2)


def test_block_traces_tiny():
    bt = ch5.block_traces(
        ch5.BlockTraceConfig(hidden=2, sentences=6, train_steps=3, probes=64)
    )
    for b, exact in bt["exact"].items():
        assert abs(bt["hutchinson"][b] - exact) < 5 * bt["hutchinson_se"][b] + 1e-9
