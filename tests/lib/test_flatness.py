"""Tests of fmlab.theory.flatness, sgd_manifold and dyck_flatness (Chapter 5).

Oracles: ``torch.autograd.functional.hessian`` (double backward, a different code path
from the forward-over-reverse HVPs under test), brute-force sums over labels, closed
forms."""

import math

import pytest
import torch
import torch.nn.functional as F

from fmlab.theory.dyck_flatness import (
    downstream_error,
    dyck_forward,
    exact_trace,
    masked_inputs,
    memorizing_solution,
    pretraining_loss,
    rebalance,
    transferable_solution,
)
from fmlab.theory.flatness import (
    bartlett_gap,
    fisher_trace,
    fisher_trace_exact,
    flatten,
    gradient_covariance,
    hessian_block_traces_exact,
    hessian_trace_exact,
    hutchinson_trace,
    hvp,
    parameter_blocks,
)
from fmlab.theory.sgd_manifold import (
    ManifoldModel,
    excess_loss_uv,
    flow_trace,
    hessian_trace_uv,
    sgd_on_manifold_model,
)


@pytest.fixture(autouse=True)
def _float64_one_thread():
    """These oracles compare to 1e-10, so every test here runs in float64; and on one
    thread, since tiny tensors only pay synchronisation for a second one. Both restored
    after."""
    old, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    yield
    torch.set_default_dtype(old)
    torch.set_num_threads(threads)


# -- a tiny well-specified classifier on a finite input set -------------------------
def _tiny(seed=0, d=3, h=4, C=3, n=6):
    g = torch.Generator().manual_seed(seed)
    params = {
        "a": torch.randn(h, d, generator=g),
        "b": torch.randn(h, generator=g),
        "c": torch.randn(C, h, generator=g),
    }
    X = torch.randn(n, d, generator=g)
    return params, X


def _logits(p, x):
    return torch.tanh(x @ p["a"].T + p["b"]) @ p["c"].T


def _logp(p, x, y):
    return F.log_softmax(_logits(p, x), dim=-1).gather(-1, y.reshape(1))[0]


def _population_loss(p, X, target):
    """Cross-entropy of the model against fixed conditionals ``target`` (n, C), uniform
    x."""
    return -(target * F.log_softmax(_logits(p, X), dim=-1)).sum(1).mean()


def _autograd_hessian(loss, params):
    names = list(params)
    shapes = [params[k].shape for k in names]
    sizes = [params[k].numel() for k in names]

    def f(w):
        parts = torch.split(w, sizes)
        return loss({k: t.reshape(s) for k, t, s in zip(names, parts, shapes)})

    return torch.autograd.functional.hessian(f, flatten(params))


def test_hvp_and_exact_trace_match_autograd_hessian():
    params, X = _tiny()
    with torch.no_grad():
        target = torch.softmax(
            _logits(params, X) + 0.3, -1
        )  # a point that is not a minimum
    loss = lambda p: _population_loss(p, X, target)  # noqa: E731
    H = _autograd_hessian(loss, params)
    assert hessian_trace_exact(loss, params, chunk=7) == pytest.approx(
        float(H.trace()), rel=1e-10
    )
    v = {k: torch.randn_like(t) for k, t in params.items()}
    assert torch.allclose(flatten(hvp(loss, params, v)), H @ flatten(v), atol=1e-10)


def test_hutchinson_is_exact_for_a_diagonal_hessian_and_close_otherwise():
    d = torch.tensor([1.0, 2.0, 5.0, 0.5])
    est = hutchinson_trace(
        lambda p: 0.5 * (d * p["w"] ** 2).sum(), {"w": torch.ones(4)}, n_probes=3
    )
    assert est.value == pytest.approx(
        float(d.sum()), abs=1e-12
    )  # v_i^2 = 1: every probe is exact
    params, X = _tiny(1)
    with torch.no_grad():
        target = torch.softmax(_logits(params, X), -1)
    loss = lambda p: _population_loss(p, X, target)  # noqa: E731
    exact = float(_autograd_hessian(loss, params).trace())
    est = hutchinson_trace(
        loss,
        params,
        n_probes=2000,
        generator=torch.Generator().manual_seed(0),
        chunk=500,
    )
    assert abs(est.value - exact) < 4 * est.stderr
    assert abs(est.value - exact) < 0.05 * abs(exact)


def test_groups_split_the_trace_of_independent_members():
    d = torch.tensor(
        [[1.0, 2.0], [3.0, 4.0], [0.5, 0.0]]
    )  # three members, block-diagonal Hessian
    est = hutchinson_trace(
        lambda p: 0.5 * (d * p["w"] ** 2).sum(),
        {"w": torch.ones(3, 2)},
        n_probes=4,
        groups=3,
    )
    assert torch.allclose(est.per_group, d.sum(1))
    with pytest.raises(ValueError, match="groups"):
        hutchinson_trace(lambda p: p["w"].sum(), {"w": torch.ones(2, 2)}, groups=3)


BLOCKS = {"encoder": ["a", "b"], "head": ["c"]}


def _block_diagonal_traces(H, params, blocks):
    """Sum the autograd Hessian's diagonal over each block's coordinates."""
    offsets, i = {}, 0
    for k, t in params.items():
        offsets[k] = (i, i + t.numel())
        i += t.numel()
    diag = H.diagonal()
    return {
        b: float(sum(diag[offsets[k][0] : offsets[k][1]].sum() for k in ks))
        for b, ks in blocks.items()
    }


def test_block_traces_match_the_autograd_hessian():
    params, X = _tiny(4)
    with torch.no_grad():
        target = torch.softmax(_logits(params, X) - 0.2, -1)
    loss = lambda p: _population_loss(p, X, target)  # noqa: E731
    oracle = _block_diagonal_traces(_autograd_hessian(loss, params), params, BLOCKS)
    exact = hessian_block_traces_exact(loss, params, BLOCKS, chunk=5)
    for b in BLOCKS:
        assert exact[b] == pytest.approx(oracle[b], rel=1e-10)
    est = hutchinson_trace(
        loss,
        params,
        n_probes=3000,
        chunk=500,
        generator=torch.Generator().manual_seed(5),
        blocks=BLOCKS,
    )
    assert sum(e.value for e in est.per_block.values()) == pytest.approx(est.value)
    for b in BLOCKS:
        e = est.per_block[b]
        assert abs(e.value - oracle[b]) < 4 * e.stderr
        assert e.stderr < 0.05 * abs(oracle[b])


def test_block_traces_are_exact_per_probe_for_a_diagonal_hessian():
    d = {"u": torch.tensor([1.0, 2.0]), "w": torch.tensor([[3.0, 0.5], [4.0, 0.0]])}
    est = hutchinson_trace(
        lambda p: 0.5 * sum((d[k] * p[k] ** 2).sum() for k in p),
        {"u": torch.ones(2), "w": torch.ones(2, 2)},
        n_probes=3,
        blocks=lambda k: "first" if k == "u" else "second",
        groups=None,
    )
    assert est.per_block["first"].value == pytest.approx(3.0, abs=1e-12)
    assert est.per_block["second"].value == pytest.approx(7.5, abs=1e-12)
    assert est.per_block["second"].stderr == pytest.approx(0.0, abs=1e-12)


def test_fisher_block_traces_at_a_well_specified_minimum_are_hessian_blocks():
    """At the minimum of a well-specified model the Fisher is the Hessian, block by
    block."""
    params, X = _tiny(5)
    with torch.no_grad():
        truth = torch.softmax(_logits(params, X), -1)
    loss = lambda p: _population_loss(p, X, truth)  # noqa: E731
    oracle = _block_diagonal_traces(_autograd_hessian(loss, params), params, BLOCKS)
    # 4000 label draws per example, as 4000 copies of the inputs drawn once each (the
    # same estimator: independent labels for each row; one batched pass, not 4000)
    est = fisher_trace(
        _logp,
        _logits,
        params,
        X.repeat(4000, 1),
        generator=torch.Generator().manual_seed(6),
        blocks=BLOCKS,
    )
    for b in BLOCKS:
        e = est.per_block[b]
        assert abs(e.value - oracle[b]) < 4 * e.stderr


def test_parameter_blocks_must_partition_the_parameters():
    params = {"a": torch.ones(2), "b": torch.ones(3)}
    assert parameter_blocks(params, {"x": ["a"], "y": ["b"]}) == {
        "x": ("a",),
        "y": ("b",),
    }
    assert parameter_blocks(params, lambda k: k.upper()) == {"A": ("a",), "B": ("b",)}
    with pytest.raises(ValueError, match="in no block"):
        parameter_blocks(params, {"x": ["a"]})
    with pytest.raises(ValueError, match="in both"):
        parameter_blocks(params, {"x": ["a", "b"], "y": ["b"]})
    with pytest.raises(ValueError, match="not in params"):
        parameter_blocks(params, {"x": ["a", "b", "c"]})
    with pytest.raises(TypeError, match="blocks"):
        parameter_blocks(params, ["a", "b"])


def test_fisher_trace_exact_matches_brute_force_and_sampled_estimator():
    params, X = _tiny(2)
    brute = 0.0
    probs = torch.softmax(_logits(params, X), -1)
    for i in range(len(X)):
        for y in range(probs.shape[1]):
            p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
            gs = torch.autograd.grad(
                F.log_softmax(_logits(p, X[i]), -1)[y], list(p.values())
            )
            brute += (
                float(probs[i, y]) * sum(float(g.pow(2).sum()) for g in gs) / len(X)
            )
    exact = fisher_trace_exact(_logp, _logits, params, X)
    assert exact == pytest.approx(brute, rel=1e-10)
    # 3000 label draws per example: 1000 copies of the inputs, three draws each
    est = fisher_trace(
        _logp,
        _logits,
        params,
        X.repeat(1000, 1),
        n_labels=3,
        generator=torch.Generator().manual_seed(1),
    )
    assert abs(est.value - exact) < 4 * est.stderr


def test_bartlett_identity_holds_at_the_minimum_of_a_well_specified_model_only():
    params, X = _tiny(3)
    with torch.no_grad():
        truth = torch.softmax(
            _logits(params, X), -1
        )  # data generated by the model itself
    n, C = truth.shape
    xs = X.repeat_interleave(C, 0)
    ys = torch.arange(C).repeat(n)
    w = (truth / n).reshape(-1)  # exact population: weights q(x) p*(y|x)
    nll = lambda p, x, y: -_logp(p, x, y)  # noqa: E731
    loss = lambda p: _population_loss(p, X, truth)  # noqa: E731
    mean, cov = gradient_covariance(nll, params, xs, ys, w)
    H = _autograd_hessian(loss, params)
    assert mean.abs().max() < 1e-12  # a stationary point
    assert bartlett_gap(cov, H) < 1e-10
    assert fisher_trace_exact(_logp, _logits, params, X) == pytest.approx(
        float(H.trace()), rel=1e-10
    )
    moved = {
        k: v + 0.3 for k, v in params.items()
    }  # same data, parameters off the minimum
    _, cov2 = gradient_covariance(nll, moved, xs, ys, w)
    assert bartlett_gap(cov2, _autograd_hessian(loss, moved)) > 1e-2


def test_flatness_arguments_are_validated():
    with pytest.raises(TypeError, match="params"):
        hutchinson_trace(lambda p: p, {})
    with pytest.raises(TypeError, match="loss_fn"):
        hessian_trace_exact(3, {"w": torch.ones(2)})
    with pytest.raises(ValueError, match="n_probes"):
        hutchinson_trace(lambda p: p["w"].sum(), {"w": torch.ones(2)}, n_probes=1)
    with pytest.raises(ValueError, match="same shape"):
        bartlett_gap(torch.eye(2), torch.eye(3))


# -- the manifold model ------------------------------------------------------------
P_STAR = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)


def _uv_loss(theta, p_star):
    K = p_star.numel()
    u, v = theta[: K - 1], theta[K - 1 :]
    z = torch.cat([u * v, torch.zeros(1)])
    return -(p_star * F.log_softmax(z, -1)).sum()


@pytest.mark.parametrize("on_manifold", [True, False])
def test_manifold_trace_formula_matches_autograd(on_manifold):
    m = ManifoldModel(P_STAR)
    u, v = m.point(torch.tensor([0.7, -0.2, 1.1]))
    if not on_manifold:
        u, v = u + 0.3, v - 0.1
    H = torch.autograd.functional.hessian(
        lambda th: _uv_loss(th, P_STAR), torch.cat([u, v])
    )
    assert float(hessian_trace_uv(u, v)) == pytest.approx(float(H.trace()), rel=1e-10)
    excess = _uv_loss(torch.cat([u, v]), P_STAR) + (P_STAR * P_STAR.log()).sum()
    assert float(excess_loss_uv(u, v, P_STAR)) == pytest.approx(
        float(excess), abs=1e-12
    )
    if on_manifold:
        assert float(excess) == pytest.approx(0.0, abs=1e-12)


def test_flow_solves_the_projected_trace_flow():
    """Integrate -1/(4B) grad_Gamma tr H by small Euler steps with autograd and
    re-projection."""
    m = ManifoldModel(P_STAR)
    s0 = torch.tensor([1.0, -0.5, 0.8])
    B, dt, n_steps = 2.0, 1e-3, 2000
    c = m.c
    u, v = m.point(s0)
    for _ in range(n_steps):
        th = torch.cat([u, v]).requires_grad_(True)
        tr = hessian_trace_uv(th[:3], th[3:])
        gr = torch.autograd.grad(tr, th)[0]
        tang = torch.cat([u, -v])  # tangent of u v = c, coordinate by coordinate
        tang = tang.reshape(2, 3)
        g2 = gr.reshape(2, 3)
        coef = (g2 * tang).sum(0) / tang.pow(2).sum(0)
        u = u - dt / (4 * B) * coef * tang[0]
        v = v - dt / (4 * B) * coef * tang[1]
        r = (c / (u * v)).sqrt()  # back onto the hyperbolas
        u, v = u * r, v * r
    pred = flow_trace(m, s0, torch.tensor([dt * n_steps]), B)
    assert float(hessian_trace_uv(u, v)) == pytest.approx(float(pred[0]), rel=1e-3)


def test_sgd_on_manifold_model_uses_the_true_minibatch_gradient_and_drifts():
    m = ManifoldModel(P_STAR)
    s0 = torch.full((3,), 1.2)
    # one step with a huge batch is (nearly) a full gradient step: zero at a minimiser
    paths = sgd_on_manifold_model(
        m,
        s0,
        torch.tensor([0.01]),
        torch.tensor([1e7]),
        steps=1,
        record_every=1,
        generator=torch.Generator().manual_seed(0),
    )
    assert (paths.s[1] - paths.s[0]).abs().max() < 1e-3
    paths = sgd_on_manifold_model(
        m,
        s0,
        torch.full((8,), 0.05),
        torch.full((8,), 1.0),
        steps=4000,
        record_every=4000,
        generator=torch.Generator().manual_seed(0),
    )
    assert float(paths.trace[-1].mean()) < 0.5 * float(paths.trace[0].mean())
    with pytest.raises(ValueError, match="lr"):
        sgd_on_manifold_model(
            m,
            s0,
            torch.tensor([-1.0]),
            torch.tensor([1.0]),
            steps=1,
            record_every=1,
            generator=torch.Generator(),
        )
    with pytest.raises(ValueError, match="p_star"):
        ManifoldModel(torch.tensor([0.5, 0.6]))


def test_sgd_never_crosses_the_balanced_point():
    """One step multiplies u_k^2 - v_k^2 by 1 - lr^2 g_k^2 with |g_k| < 1 (the page's
    identity ch5-eq-balance), so no run's log-imbalance s_k ever changes sign, however
    close to 0 it starts and however noisy the steps (until rounding: at lr = 0.3 the
    imbalance reaches 1e-16 within 1500 steps)."""
    m = ManifoldModel(P_STAR)
    s0 = torch.tensor([0.02, -0.01, 0.5], dtype=torch.float64)
    paths = sgd_on_manifold_model(
        m,
        s0,
        torch.full((64,), 0.1),
        torch.full((64,), 1.0),
        steps=3000,
        record_every=1,
        generator=torch.Generator().manual_seed(0),
    )
    assert bool((torch.sign(paths.s) == torch.sign(s0)).all())
    assert float(paths.s[-1, :, 2].max()) < 0.5  # and the sharp coordinate drifted in


# -- the Dyck construction ---------------------------------------------------------
def test_dyck_trace_is_the_hessian_trace_at_zero_loss():
    n = 4
    sol = rebalance(memorizing_solution(n, 40, torch.Generator().manual_seed(0)))
    assert pretraining_loss(sol) < 1e-20
    X, y = masked_inputs(n)
    names = ["wq", "wk", "wv", "w1", "w2"]
    params = sol.params()
    loss = lambda p: (dyck_forward(p, X) - y).pow(2).mean()  # noqa: E731
    H = _autograd_hessian(loss, {k: params[k] for k in names})
    assert exact_trace(sol) == pytest.approx(float(H.trace()), rel=1e-8)


@pytest.mark.parametrize("n", [4, 6])
def test_transferable_solution_fits_and_its_flattest_trace_is_6_n_cuberoot(n):
    sol = transferable_solution(n)
    assert pretraining_loss(sol) < 1e-30  # zero up to rounding
    flat = rebalance(sol)
    X, _ = masked_inputs(n)
    assert torch.allclose(dyck_forward(flat.params(), X), dyck_forward(sol.params(), X))
    assert exact_trace(flat) == pytest.approx(6 * n ** (1 / 3), rel=1e-10)
    assert exact_trace(flat) <= exact_trace(sol)


def test_rebalancing_never_raises_the_trace_and_keeps_the_function():
    sol = memorizing_solution(6, 150, torch.Generator().manual_seed(1))
    flat = rebalance(sol)
    X, _ = masked_inputs(6)
    assert torch.allclose(
        dyck_forward(flat.params(), X), dyck_forward(sol.params(), X), atol=1e-8
    )
    assert exact_trace(flat) <= exact_trace(sol) + 1e-9
    # a small random change of the scales does not beat the closed form
    g = torch.Generator().manual_seed(2)
    c = torch.exp(0.1 * torch.randn(flat.n_neurons, generator=g))
    other = type(flat)(flat.wq, flat.wk, flat.wv, flat.w1 * c[:, None], flat.w2 / c)
    assert exact_trace(other) >= exact_trace(flat) - 1e-9


def test_transferable_features_solve_the_downstream_task_from_two_signs():
    flat = rebalance(transferable_solution(6))
    # 64 draws contain both signs of tau with overwhelming probability
    assert downstream_error(flat, 64, torch.Generator().manual_seed(0)) < 1e-12
    with pytest.raises(ValueError, match="n_train"):
        downstream_error(flat, 0, torch.Generator())
    with pytest.raises(ValueError, match="n must be even"):
        masked_inputs(5)
    assert math.isfinite(exact_trace(flat))
