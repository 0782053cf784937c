"""The ridge-classifier probes of fmlab.adapt.probes (Chapter 5's transfer measure).

Oracles: the closed-form head solved again by hand in standardised coordinates (in its
primal form, so the kernel form is checked against it), separable data, a one-hot
posterior that reproduces the plain hit rate and a uniform one that gives 1/K whatever
the probe predicts, and the curve as the mean over its disjoint training blocks."""

import pytest
import torch
import torch.nn.functional as F

from fmlab.adapt import ridge_probe_accuracy, ridge_probe_curve, ridge_probe_head
from fmlab.repro import make_generator


def _standardised_head(x, y, k, ridge):
    """The head of the docstring, solved in the standardised coordinates (primal)."""
    mu, sd = x.mean(0), x.std(0) + 1e-6
    Z = torch.cat([(x - mu) / sd, torch.ones(len(x), 1, dtype=torch.float64)], 1)
    W = torch.linalg.solve(
        Z.T @ Z / len(x) + ridge * torch.eye(Z.shape[1], dtype=torch.float64),
        Z.T @ F.one_hot(y, k).double() / len(x),
    )
    return lambda t: torch.cat([(t - mu) / sd, torch.ones(len(t), 1)], 1) @ W


@pytest.mark.parametrize("n, d", [(50, 6), (20, 45)])  # primal and kernel forms
def test_the_head_is_the_closed_form_ridge_solution_on_standardised_features(n, d):
    g = make_generator(3)
    x = 3.0 + 2.0 * torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randint(4, (n,), generator=g)
    t = torch.randn(30, d, generator=g, dtype=torch.float64)
    W, b = ridge_probe_head(x, y, 4, ridge=0.3)
    assert W.shape == (d, 4) and b.shape == (4,) and W.dtype == torch.float64
    assert torch.allclose(t @ W + b, _standardised_head(x, y, 4, 0.3)(t), atol=1e-9)
    with pytest.raises(ValueError, match="labels"):
        ridge_probe_head(x, y[:-1], 4)
    with pytest.raises(ValueError, match="n_classes"):
        ridge_probe_head(x, y, 1)


def test_ridge_probe_primal_and_kernel_forms_agree_and_separate_easy_data():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(3, (60,), generator=g)
    feats = F.one_hot(y, 3).double() + 0.05 * torch.randn(
        60, 3, generator=g, dtype=torch.float64
    )
    assert ridge_probe_accuracy(feats[:30], y[:30], feats[30:], y[30:], 3) == 1.0
    wide = torch.cat(
        [feats, torch.randn(60, 40, generator=g, dtype=torch.float64)], 1
    )  # d > n: kernel form
    acc_kernel = ridge_probe_accuracy(
        wide[:30], y[:30], wide[30:], y[30:], 3, ridge=0.5
    )
    scores = _standardised_head(wide[:30], y[:30], 3, 0.5)(wide[30:])
    assert acc_kernel == pytest.approx(
        float((scores.argmax(1) == y[30:]).double().mean())
    )
    curve = ridge_probe_curve(feats, y, feats, y, 3, (10, 30))
    assert curve.shape == (2,)
    with pytest.raises(ValueError, match="columns"):
        ridge_probe_accuracy(feats, y, wide, y, 3)
    with pytest.raises(ValueError, match="ridge"):
        ridge_probe_accuracy(feats, y, feats, y, 3, ridge=0.0)


def _probe_data(n=60, m=40, d=5, seed=0):
    g = make_generator(seed)
    x, xt = torch.randn(n, d, generator=g), torch.randn(m, d, generator=g)
    y, yt = (x[:, 0] > 0).long(), (xt[:, 0] > 0).long()
    return x, y, xt, yt


def test_posterior_scored_probe_reduces_to_hits_and_to_chance():
    x, y, xt, yt = _probe_data()
    plain = ridge_probe_accuracy(x, y, xt, yt, 2)
    onehot = ridge_probe_accuracy(
        x, y, xt, yt, 2, test_posterior=F.one_hot(yt, 2).double()
    )
    assert onehot == pytest.approx(plain, abs=1e-12)
    uniform = torch.full((len(yt), 2), 0.5)
    assert ridge_probe_accuracy(
        x, y, xt, yt, 2, test_posterior=uniform
    ) == pytest.approx(0.5)
    curve = ridge_probe_curve(x, y, xt, yt, 2, (20, 60), test_posterior=uniform)
    assert torch.allclose(curve, torch.full((2,), 0.5, dtype=curve.dtype))
    with pytest.raises(ValueError, match="test_posterior"):
        ridge_probe_accuracy(x, y, xt, yt, 2, test_posterior=uniform[:5])


def test_the_curve_averages_the_probe_over_up_to_three_disjoint_blocks():
    x, y, xt, yt = _probe_data(n=100, d=8, seed=1)
    curve = ridge_probe_curve(x, y, xt, yt, 2, (10, 40, 100), ridge=0.1)
    assert curve.dtype == torch.get_default_dtype()
    blocks = {10: 3, 40: 2, 100: 1}  # min(3, N // m) blocks of the first rows
    for value, (m, reps) in zip(curve, blocks.items()):
        accs = [
            ridge_probe_accuracy(
                x[r * m : (r + 1) * m], y[r * m : (r + 1) * m], xt, yt, 2, 0.1
            )
            for r in range(reps)
        ]
        assert value == torch.tensor(sum(accs) / reps)
    with pytest.raises(ValueError, match="sizes"):
        ridge_probe_curve(x, y, xt, yt, 2, (101,))
