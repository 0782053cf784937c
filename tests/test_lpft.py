"""Tests of fmlab.lpft (Chapter 3) against independent oracles."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.optimize import minimize
from torch import nn

from fmlab.lpft import (
    LPFTConfig,
    accuracy,
    feature_change,
    fine_tune_classifier,
    layer_feature_change,
    linear_head,
    random_head,
    softmax_regression,
)
from fmlab.models.mlp import MLP


def _data(n=60, k=5, C=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(n, k, generator=g, dtype=torch.float64)
    y = torch.randint(C, (n,), generator=g)
    return f, y


def test_softmax_regression_matches_scipy():
    f, y = _data()
    l2 = 0.05
    W, b = softmax_regression(f, y, 3, l2=l2)

    def obj(theta):
        t = torch.from_numpy(theta).reshape(3, 6).requires_grad_(True)
        loss = F.cross_entropy(f @ t[:, :5].T + t[:, 5], y) + l2 * t[:, :5].pow(2).sum()
        (g,) = torch.autograd.grad(loss, t)
        return float(loss.detach()), g.numpy().ravel()

    ref = minimize(obj, np.zeros(18), jac=True, method="BFGS", options={"gtol": 1e-10})
    ours = obj(torch.cat([W, b[:, None]], 1).numpy().ravel())[0]
    assert ours == pytest.approx(ref.fun, abs=1e-9)
    # the weights are unique (strictly convex in W); the biases up to a common shift
    t = ref.x.reshape(3, 6)
    assert np.allclose(W.numpy(), t[:, :5], atol=1e-5)
    assert np.allclose((b - b.mean()).numpy(), t[:, 5] - t[:, 5].mean(), atol=1e-5)


def test_softmax_regression_stationary_point():
    f, y = _data(seed=1)
    W, b = softmax_regression(f, y, 3, l2=1e-3)
    Wt, bt = W.clone().requires_grad_(True), b.clone().requires_grad_(True)
    loss = F.cross_entropy(f @ Wt.T + bt, y) + 1e-3 * Wt.pow(2).sum()
    gW, gb = torch.autograd.grad(loss, (Wt, bt))
    assert float(gW.norm()) < 1e-8 and float(gb.norm()) < 1e-8


def test_binary_logistic_closed_form_symmetric_case():
    # two points x = +1 (class 1) and x = -1 (class 0): the optimum has b equal and
    # w1 - w0 = d solving sigmoid(-d) = 4 * l2 * d / 2 ... checked against brentq
    from scipy.optimize import brentq

    f = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    y = torch.tensor([1, 0])
    l2 = 0.1
    W, b = softmax_regression(f, y, 2, l2=l2)
    # by symmetry W = (-w, w); loss = log(1 + exp(-2w)) + 2 l2 w^2; derivative zero:
    w = brentq(lambda w: -2 / (1 + np.exp(2 * w)) + 4 * l2 * w, 0, 10)
    assert np.allclose(W[:, 0].numpy(), [-w, w], atol=1e-8)


def test_accuracy_and_feature_change_by_hand():
    enc = nn.Identity()
    head = linear_head(torch.eye(2), torch.zeros(2))
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 3.0]])
    assert accuracy(enc, head, x, torch.tensor([0, 1, 0])) == pytest.approx(2 / 3)

    class Shift(nn.Module):
        def forward(self, x):
            return x + torch.tensor([3.0, 4.0])

    assert feature_change(enc, Shift(), x) == pytest.approx(5.0)


def test_layer_feature_change_matches_definition():
    torch.manual_seed(0)
    a = MLP([3, 4, 2], final_activation=True)
    b = MLP([3, 4, 2], final_activation=True)
    x = torch.randn(7, 3)
    got = layer_feature_change(a, b, x)
    with torch.no_grad():
        h_a, h_b = torch.relu(a.net[0](x)), torch.relu(b.net[0](x))
    first = (h_b - h_a).norm(dim=1).mean() / h_a.norm(dim=1).mean()
    assert got.shape == (2,) and float(got[0]) == pytest.approx(float(first), rel=1e-6)


def test_fine_tune_first_layer_moves_only_in_span_of_inputs():
    torch.manual_seed(0)
    enc = MLP([6, 8, 4], final_activation=True)
    x = torch.zeros(20, 6)
    x[:, :3] = torch.randn(20, 3)  # inputs live in the first three coordinates
    y = torch.randint(3, (20,))
    res = fine_tune_classifier(
        enc,
        random_head(4, 3, torch.Generator().manual_seed(1)),
        x,
        y,
        lr=0.05,
        steps=30,
        track={"in": x, "out": torch.randn(5, 6) * torch.tensor([0, 0, 0, 1.0, 1, 1])},
    )
    dW = (res.encoder.net[0].weight - enc.net[0].weight).detach()
    assert float(dW[:, 3:].abs().max()) == 0.0 and float(dW[:, :3].abs().max()) > 1e-3
    assert res.train_loss[-1] < res.train_loss[0]
    assert (
        res.trace["train_loss"].shape == res.trace_steps.shape == res.trace["in"].shape
    )
    assert float(res.trace["in"][0]) == 0.0


def test_exact_probe_is_stationary_for_the_head():
    # a head at the exact optimum on frozen features with l2 = 0 and a frozen encoder
    # gives zero gradient for the head: fine-tuning only the head would not move it
    f, y = _data(n=40, k=3, C=2, seed=3)
    W, b = softmax_regression(f.float(), y, 2, l2=0.0, max_iter=200)
    head = linear_head(W, b)
    loss = F.cross_entropy(head(f.float()), y)
    grads = torch.autograd.grad(loss, list(head.parameters()))
    assert max(float(g.abs().max()) for g in grads) < 1e-5


def test_invalid_arguments_name_the_argument():
    f, y = _data()
    with pytest.raises(ValueError, match="labels"):
        softmax_regression(f, y + 5, 3, l2=0.1)
    with pytest.raises(TypeError, match="labels"):
        softmax_regression(f, y.double(), 3, l2=0.1)
    with pytest.raises(ValueError, match="l2"):
        softmax_regression(f, y, 3, l2=-1.0)
    with pytest.raises(ValueError, match="features and labels"):
        softmax_regression(f[:5], y, 3, l2=0.1)
    enc = MLP([5, 4], final_activation=True)
    with pytest.raises(ValueError, match="lr"):
        fine_tune_classifier(
            enc, random_head(4, 3, torch.Generator()), f.float(), y, lr=0.0, steps=1
        )
    with pytest.raises(TypeError, match="head"):
        fine_tune_classifier(enc, enc, f.float(), y, lr=0.1, steps=1)
    with pytest.raises(TypeError, match="generator"):
        random_head(4, 3, 0)
    with pytest.raises(ValueError, match="n_track"):
        LPFTConfig(n_track=10_000)
    with pytest.raises(ValueError, match="lrs"):
        LPFTConfig(lrs=())
