"""Chapter 2's library: latent-class and augmentation-graph data, the two contrastive
losses.

Oracles: explicit enumeration of every (x, x+, x-) triple and every task, the matrix
form
||A-bar - F F^T||^2 of the spectral loss, double sums over vertex pairs, numpy least
squares,
Monte Carlo averages of the mini-batch losses, autograd gradients, and the inequalities
the
chapter proves (checked on random instances).
"""

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from fmlab.chapters.ch2_interface import (
    CurlConfig,
    SpectralConfig,
    SphereEncoder,
    connectivity_sweep,
    pretrain_spectral,
    scrambled_indicators,
    spectral_along_training,
)
from fmlab.data.contrastive import (
    LatentClassConfig,
    LatentClassModel,
    ManifoldConfig,
    MixtureOfManifolds,
    class_mixing_arc_map,
)
from fmlab.repro import make_generator
from fmlab.theory.contrastive import (
    approximate_minimizer_bound,
    automorphism_defect,
    best_head_loss,
    class_means,
    collision_probability,
    contrastive_bound,
    contrastive_loss_on_triples,
    curl_terms,
    jensen_slack_bound,
    label_leakage,
    laplacian_eigenvalues,
    linear_probe_loss,
    loss_at_zero,
    make_spectral_loss,
    mean_classifier_loss,
    minimize_spectral_loss,
    normalized_adjacency,
    outside_subspace,
    pointwise_loss,
    spectral_contrastive_loss,
    spectral_loss_on_pairs,
    spectral_minimizer,
    spectral_probe_bound,
    top_eigenvectors,
    unsupervised_contrastive_loss,
    weighted_span_distance,
)


def _ell(v, loss):
    return math.log1p(math.exp(-v)) if loss == "logistic" else max(0.0, 1.0 - v)


def _tiny_latent(seed=0):
    """Unequal class sizes and a non-uniform rho, to exercise the general formulas."""
    g = make_generator(seed)
    labels = torch.tensor([0, 0, 1, 1, 1, 2, 2, 0, 2])
    feats = torch.randn(len(labels), 3, generator=g, dtype=torch.float64)
    rho = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    return feats, labels, rho


def _random_graph(n=10, seed=0):
    g = make_generator(seed)
    A = torch.rand(n, n, generator=g, dtype=torch.float64) ** 3
    W = A + A.T
    return W / W.sum()


# ----------------------------------------------------------------------- latent classes
@pytest.mark.parametrize("loss", ["logistic", "hinge"])
def test_unsupervised_loss_matches_enumeration_of_all_triples(loss):
    f, y, rho = _tiny_latent()
    members = [[i for i in range(len(y)) if y[i] == c] for c in range(3)]
    total = 0.0
    for c, cn in itertools.product(range(3), repeat=2):
        for i, j, n in itertools.product(members[c], members[c], members[cn]):
            p = rho[c] * rho[cn] / (len(members[c]) ** 2 * len(members[cn]))
            total += float(p) * _ell(float(f[i] @ (f[j] - f[n])), loss)
    assert float(unsupervised_contrastive_loss(f, y, rho, loss=loss)) == pytest.approx(
        total, rel=1e-12
    )


@pytest.mark.parametrize("loss", ["logistic", "hinge"])
def test_mean_classifier_loss_matches_unordered_task_enumeration(loss):
    f, y, rho = _tiny_latent(1)
    tau = float(rho.pow(2).sum())
    mu = [f[y == c].mean(0) for c in range(3)]
    total = 0.0
    for a, b in itertools.combinations(
        range(3), 2
    ):  # task {a, b}: prob 2 rho_a rho_b / (1 - tau)
        p_task = 2 * float(rho[a] * rho[b]) / (1 - tau)
        la = np.mean(
            [
                _ell(float(f[i] @ (mu[a] - mu[b])), loss)
                for i in range(len(y))
                if y[i] == a
            ]
        )
        lb = np.mean(
            [
                _ell(float(f[i] @ (mu[b] - mu[a])), loss)
                for i in range(len(y))
                if y[i] == b
            ]
        )
        total += p_task * 0.5 * (la + lb)  # the two classes of a task weighted equally
    assert float(mean_classifier_loss(f, y, rho, loss=loss)) == pytest.approx(
        total, rel=1e-12
    )


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("loss", ["logistic", "hinge"])
def test_arora_bound_holds_for_random_representations(seed, loss):
    f, y, rho = _tiny_latent(seed)
    t = curl_terms(3.0 * f, y, rho, loss=loss)
    assert t.mean_classifier <= t.bound + 1e-12


def test_bound_is_an_equality_when_every_class_collapses_to_a_point():
    _, y, rho = _tiny_latent()
    centres = torch.randn(3, 4, generator=make_generator(3), dtype=torch.float64)
    t = curl_terms(centres[y], y, rho)
    assert t.bound == pytest.approx(t.mean_classifier, abs=1e-12)
    assert t.unsupervised >= t.tau * math.log(2) - 1e-12  # the floor tau * l(0)


def test_collision_probability_and_bound_closed_forms():
    rho = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    assert collision_probability(rho) == pytest.approx(0.375)
    assert contrastive_bound(0.5, 0.375) == pytest.approx(
        (0.5 - 0.375 * math.log(2)) / 0.625
    )
    assert loss_at_zero("hinge") == 1.0 and loss_at_zero() == pytest.approx(math.log(2))
    assert float(pointwise_loss(torch.tensor(0.0))) == pytest.approx(math.log(2))


def test_class_means_by_loop():
    f, y, _ = _tiny_latent()
    mu = class_means(f, y)
    for c in range(3):
        assert torch.allclose(mu[c], f[y == c].mean(0))


def test_minibatch_triple_loss_is_an_unbiased_estimate_of_the_population_loss():
    world = LatentClassModel(
        LatentClassConfig(n_classes=3, clusters_per_class=2, points_per_cluster=4)
    )
    enc = SphereEncoder(2, width=16, rep_dim=4, radius=1.5)
    with torch.no_grad():
        pop = float(
            unsupervised_contrastive_loss(
                enc(world.points.float()).double(), world.labels, world.class_probs
            )
        )
        b = world.sample_triples(200_000, make_generator(5))
        vals = pointwise_loss(
            (enc(b["x"]) * (enc(b["x_pos"]) - enc(b["x_neg"]))).sum(1)
        ).double()
        est = float(
            contrastive_loss_on_triples(enc(b["x"]), enc(b["x_pos"]), enc(b["x_neg"]))
        )
    se = float(vals.std()) / math.sqrt(len(vals))
    assert abs(est - pop) < 5 * se + 1e-6


def test_latent_class_model_structure_and_sampling():
    cfg = LatentClassConfig(
        n_classes=4,
        clusters_per_class=2,
        points_per_cluster=3,
        class_probs=(0.4, 0.3, 0.2, 0.1),
    )
    world = LatentClassModel(cfg)
    assert world.points.shape == (24, 2) and world.members.shape == (4, 6)
    assert torch.equal(
        world.labels[world.members], torch.arange(4)[:, None].expand(4, 6)
    )
    b = world.sample_triples(40_000, make_generator(1))
    assert torch.equal(world.labels[b["i"]], b["c"]) and torch.equal(
        world.labels[b["i_pos"]], b["c"]
    )
    assert torch.equal(world.labels[b["i_neg"]], b["c_neg"])
    freq = torch.bincount(b["c"], minlength=4).double() / 40_000
    assert torch.allclose(freq, world.class_probs, atol=0.01)
    assert world.collision_probability() == pytest.approx(0.16 + 0.09 + 0.04 + 0.01)


# ------------------------------------------------------------------------ spectral loss
def test_spectral_loss_equals_double_sum_and_matrix_form():
    W = _random_graph(8)
    f = torch.randn(8, 3, generator=make_generator(2), dtype=torch.float64)
    wx = W.sum(1)
    double_sum = sum(
        -2 * W[i, j] * (f[i] @ f[j]) + wx[i] * wx[j] * (f[i] @ f[j]) ** 2
        for i in range(8)
        for j in range(8)
    )
    Abar = normalized_adjacency(W)
    F = wx.sqrt()[:, None] * f
    matrix = (Abar - F @ F.T).pow(2).sum() - Abar.pow(2).sum()
    got = float(spectral_contrastive_loss(f, W))
    assert got == pytest.approx(float(double_sum), rel=1e-12)
    assert got == pytest.approx(float(matrix), rel=1e-12)


def test_spectral_minimizer_matches_eigenvalues_is_stationary_and_agrees_with_lbfgs():
    W = _random_graph(12, seed=3)
    k = 3
    sol = spectral_minimizer(W, k)
    nu = torch.linalg.eigvalsh(normalized_adjacency(W)).flip(0)
    assert sol.loss == pytest.approx(
        -float(nu[:k].clamp_min(0).pow(2).sum()), rel=1e-12
    )
    assert float(spectral_contrastive_loss(sol.features, W)) == pytest.approx(
        sol.loss, rel=1e-10
    )
    f = sol.features.clone().requires_grad_(True)
    spectral_contrastive_loss(f, W).backward()
    assert float(f.grad.abs().max()) < 1e-10
    g = make_generator(0)
    for _ in range(5):  # no random perturbation does better
        assert (
            float(
                spectral_contrastive_loss(
                    sol.features
                    + 1e-3 * torch.randn(12, k, generator=g, dtype=torch.float64),
                    W,
                )
            )
            >= sol.loss
        )
    found = minimize_spectral_loss(W, k, make_generator(1))
    assert float(spectral_contrastive_loss(found, W)) == pytest.approx(
        sol.loss, abs=1e-9
    )
    assert weighted_span_distance(found, sol.features, W.sum(1)) < 1e-4


def test_minibatch_spectral_loss_is_unbiased():
    world = MixtureOfManifolds(
        ManifoldConfig(points_per_class=8, separation=2.1, jitter_std=0.2)
    )
    G = world.augmentation_graph()
    f = torch.randn(world.n_points, 2, generator=make_generator(0), dtype=torch.float64)
    g = make_generator(1)
    ests = []
    for _ in range(300):
        i, j = world.sample_pairs(64, g)
        ests.append(float(spectral_loss_on_pairs(f[i], f[j])))
    ests = torch.tensor(ests, dtype=torch.float64)
    pop = float(spectral_contrastive_loss(f, G.weights))
    assert abs(float(ests.mean()) - pop) < 5 * float(ests.std()) / math.sqrt(len(ests))


def test_sampled_pairs_follow_the_graph_weights():
    world = MixtureOfManifolds(
        ManifoldConfig(
            n_classes=2,
            points_per_class=4,
            separation=2.05,
            along_std=0.8,
            jitter_std=0.3,
        )
    )
    W = world.augmentation_graph().weights
    i, j = world.sample_pairs(200_000, make_generator(3))
    counts = torch.zeros_like(W).index_put_(
        (i, j), torch.ones(len(i), dtype=torch.float64), accumulate=True
    ) / len(i)
    emp = 0.5 * (counts + counts.T)
    assert float((emp - W).abs().max()) < 4 * math.sqrt(float(W.max()) / 200_000) + 1e-4


def test_augmentation_graph_is_a_symmetric_distribution():
    G = MixtureOfManifolds(
        ManifoldConfig(points_per_class=12, separation=2.0)
    ).augmentation_graph()
    W = G.weights
    assert (
        torch.allclose(W, W.T)
        and float(W.sum()) == pytest.approx(1.0)
        and bool((W >= 0).all())
    )
    A = MixtureOfManifolds(
        ManifoldConfig(points_per_class=12, separation=2.0)
    ).augmentation_kernel()
    assert torch.allclose(A.sum(1), torch.ones(A.shape[0], dtype=torch.float64))


def test_linear_probe_matches_weighted_least_squares():
    g = make_generator(4)
    f = torch.randn(30, 4, generator=g, dtype=torch.float64)
    y = torch.randint(3, (30,), generator=g)
    p = torch.rand(30, generator=g, dtype=torch.float64)
    p = p / p.sum()
    X = np.c_[f.numpy(), np.ones(30)]
    Y = np.eye(3)[y.numpy()]
    s = np.sqrt(p.numpy())[:, None]
    coef = np.linalg.lstsq(s * X, s * Y, rcond=None)[0]
    pred = X @ coef
    res = linear_probe_loss(f, y, p)
    assert res.mse == pytest.approx(
        float((p.numpy() * ((Y - pred) ** 2).sum(1)).sum()), rel=1e-9
    )
    assert res.error == pytest.approx(
        float(p.numpy()[pred.argmax(1) != y.numpy()].sum()), abs=1e-12
    )


@pytest.mark.parametrize("seed", range(4))
def test_probe_guarantee_and_leakage_identity_on_random_labelled_graphs(seed):
    W = _random_graph(14, seed)
    y = torch.randint(3, (14,), generator=make_generator(seed + 10))
    y[:3] = torch.arange(3)
    phi = label_leakage(W, y)
    brute = sum(float(W[i, j]) for i in range(14) for j in range(14) if y[i] != y[j])
    assert phi == pytest.approx(brute, rel=1e-12)
    # Dirichlet form: tr(Y^T D^1/2 (I - A-bar) D^1/2 Y) = phi for one-hot Y
    Yw = W.sum(1).sqrt()[:, None] * torch.nn.functional.one_hot(y, 3).double()
    dirichlet = float(
        torch.trace(
            Yw.T @ (torch.eye(14, dtype=torch.float64) - normalized_adjacency(W)) @ Yw
        )
    )
    assert dirichlet == pytest.approx(phi, rel=1e-10)
    for k in (1, 3, 6):
        sol = spectral_minimizer(W, k)
        assert (
            linear_probe_loss(sol.features, y, W.sum(1)).mse
            <= spectral_probe_bound(W, y, k) + 1e-12
        )


def test_arc_permutation_is_an_automorphism_and_preserves_the_loss():
    world = MixtureOfManifolds(
        ManifoldConfig(points_per_class=12, arcs=3, jitter_std=0.0, along_std=0.3)
    )
    W = world.augmentation_graph().weights
    perm = world.arc_permutation(class_mixing_arc_map(3, 3))
    assert automorphism_defect(W, perm) == 0.0
    f = torch.randn(world.n_points, 3, generator=make_generator(0), dtype=torch.float64)
    assert float(spectral_contrastive_loss(f[perm], W)) == pytest.approx(
        float(spectral_contrastive_loss(f, W)), rel=1e-12
    )
    # with jitter across touching circles the same map is not an automorphism
    touching = MixtureOfManifolds(
        ManifoldConfig(points_per_class=12, arcs=3, jitter_std=0.3, separation=2.0)
    )
    assert automorphism_defect(touching.augmentation_graph().weights, perm) > 1e-6
    # class indicators: constant on arcs, so after the map every class is spread evenly
    ind = torch.nn.functional.one_hot(world.labels, 3).double()
    assert linear_probe_loss(ind, world.labels).mse < 1e-20
    assert linear_probe_loss(ind[perm], world.labels).mse == pytest.approx(2 / 3)


def test_laplacian_has_one_zero_eigenvalue_per_component():
    world = MixtureOfManifolds(
        ManifoldConfig(points_per_class=12, arcs=3, jitter_std=0.0)
    )
    lam = laplacian_eigenvalues(world.augmentation_graph().weights)
    assert int((lam < 1e-10).sum()) == 9


# -------------------------------------------------------------------- interface helpers
def test_sphere_encoder_has_the_stated_norm():
    enc = SphereEncoder(2, width=8, rep_dim=5, radius=2.5)
    out = enc(torch.randn(7, 2))
    assert torch.allclose(out.norm(dim=1), torch.full((7,), 2.5), atol=1e-5)


def test_connectivity_sweep_shapes_and_guarantee():
    res = connectivity_sweep(
        ManifoldConfig(points_per_class=12), (0.1, 0.8), (2.0, 2.3), k=3
    )
    assert res.minimal_adaptation_loss.shape == (2, 2)
    assert bool((res.minimal_adaptation_loss <= res.bound + 1e-12).all())


def test_pretrain_spectral_table_reaches_the_minimum(tmp_path, monkeypatch):
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path))
    world = ManifoldConfig(
        points_per_class=6, separation=3.0, jitter_std=0.1, along_std=0.5
    )
    out = pretrain_spectral(
        SpectralConfig(world=world, encoder="table", rep_dim=3, steps=400, lr=1e-2)
    )
    W = MixtureOfManifolds(world).augmentation_graph().weights
    assert spectral_minimizer(W, 3).loss == pytest.approx(
        -3.0, abs=1e-6
    )  # three nearly disconnected circles
    assert float(spectral_contrastive_loss(out["features"], W)) == pytest.approx(
        -3.0, abs=1e-2
    )


# --------------------------------------------------------------------------- validation
def test_invalid_arguments_name_the_argument():
    f, y, rho = _tiny_latent()
    with pytest.raises(ValueError, match="class_probs"):
        LatentClassConfig(n_classes=3, class_probs=(0.5, 0.5))
    with pytest.raises(ValueError, match="class_probs"):
        unsupervised_contrastive_loss(
            f, y, torch.tensor([0.5, 0.6, 0.1], dtype=torch.float64)
        )
    with pytest.raises(ValueError, match="loss"):
        mean_classifier_loss(f, y, rho, loss="squared")
    with pytest.raises(TypeError, match="labels"):
        unsupervised_contrastive_loss(f, y.double(), rho)
    with pytest.raises(ValueError, match="points_per_class"):
        ManifoldConfig(points_per_class=10, arcs=3)
    with pytest.raises(ValueError, match="separation"):
        ManifoldConfig(separation=0.0)
    with pytest.raises(ValueError, match="weights"):
        spectral_contrastive_loss(
            torch.zeros(3, 1, dtype=torch.float64),
            torch.tensor(
                [[0.5, 0.2, 0.0], [0.0, 0.2, 0.0], [0.0, 0.0, 0.1]], dtype=torch.float64
            ),
        )
    with pytest.raises(ValueError, match="k"):
        spectral_minimizer(_random_graph(5), 0)
    with pytest.raises(ValueError, match="features"):
        spectral_contrastive_loss(
            torch.zeros(4, 2, dtype=torch.float64), _random_graph(5)
        )
    with pytest.raises(ValueError, match="arc_map"):
        MixtureOfManifolds(ManifoldConfig(arcs=3)).arc_permutation([0, 1, 2])
    with pytest.raises(ValueError, match="tau"):
        contrastive_bound(0.5, 1.5)
    with pytest.raises(ValueError, match="steps"):
        CurlConfig(steps=0)
    with pytest.raises(ValueError, match="encoder"):
        SpectralConfig(encoder="cnn")
    with pytest.raises(TypeError, match="generator"):
        LatentClassModel().sample_triples(4, generator=0)
    with pytest.raises(ValueError, match="perm"):
        automorphism_defect(_random_graph(4), torch.tensor([0, 0, 1, 2]))


def test_within_class_spread_by_loop():
    from fmlab.theory.contrastive import within_class_spread

    f, y, rho = _tiny_latent(2)
    want = sum(
        float(rho[c]) * float(((f[y == c] - f[y == c].mean(0)) ** 2).sum(1).mean())
        for c in range(3)
    )
    assert within_class_spread(f, y, rho) == pytest.approx(want, rel=1e-12)


def test_curl_along_training_reports_both_sides_at_every_checkpoint(
    tmp_path, monkeypatch
):
    from fmlab.chapters.ch2_interface import curl_along_training

    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path))
    cfg = CurlConfig(
        world=LatentClassConfig(
            n_classes=3, clusters_per_class=2, points_per_cluster=3
        ),
        width=8,
        rep_dim=3,
        steps=4,
        batch_size=16,
        checkpoints=(0, 2, 4),
    )
    out = curl_along_training(cfg)
    assert out["steps"].tolist() == [0, 2, 4]
    assert bool((out["bound"] >= out["mean_classifier"] - 1e-12).all())
    assert float(out["tau"]) == pytest.approx(1 / 3)
    assert set(out) >= {"unsupervised", "spread", "probe_error", "jensen_bound"}
    assert bool((out["best_head_lower"] <= out["best_head"]).all())
    assert bool((out["best_head"] <= out["mean_classifier"]).all())
    assert bool((out["max_mean_gap"] <= 2 * cfg.radius + 1e-9).all())


# --------------------------------------- best head, slack and approximate minimisers
def _task_loss(gamma, f, y, a, b):
    """Task {a, b}: E_a l(g^T f) / 2 + E_b l(-g^T f) / 2, logistic, by loops."""
    fa = [f[i] for i in range(len(y)) if y[i] == a]
    fb = [f[i] for i in range(len(y)) if y[i] == b]
    la = np.mean([np.log1p(np.exp(-gamma @ v)) for v in fa])
    lb = np.mean([np.log1p(np.exp(gamma @ v)) for v in fb])
    return 0.5 * la + 0.5 * lb


@pytest.mark.parametrize("c0", [0.3, 1.5, 50.0])
def test_best_head_matches_a_constrained_scipy_solve_task_by_task(c0):
    from scipy.optimize import minimize

    f, y, rho = _tiny_latent()
    fn, yn = f.numpy(), y.numpy()
    res = best_head_loss(f, y, rho, c0, tol=1e-10)
    tau = float((rho**2).sum())
    total = 0.0
    for a, b in itertools.combinations(range(3), 2):
        cons = {"type": "ineq", "fun": lambda g: c0**2 - g @ g}
        best = min(
            minimize(
                _task_loss,
                x0,
                args=(fn, yn, a, b),
                method="SLSQP",
                constraints=[cons],
                options={"ftol": 1e-14, "maxiter": 500},
            ).fun
            for x0 in (np.zeros(3), np.full(3, 0.1), -np.full(3, 0.1))
        )
        total += 2 * float(rho[a] * rho[b]) / (1 - tau) * best
        head = res.heads[a, b].numpy()
        assert np.linalg.norm(head) <= c0 * (1 + 1e-12)
        assert _task_loss(head, fn, yn, a, b) == pytest.approx(best, abs=1e-7)
        assert torch.equal(res.heads[b, a], -res.heads[a, b])
    assert res.lower - 1e-9 <= total <= res.loss + 1e-9
    assert res.loss == pytest.approx(total, abs=1e-7)
    assert 0 <= res.gap < 1e-6


def test_best_head_is_never_worse_than_the_mean_classifier():
    for seed in range(3):
        g = make_generator(seed)
        labels = torch.arange(4).repeat_interleave(5)
        f = torch.randn(20, 3, generator=g, dtype=torch.float64)
        f = 2.0 * f / f.norm(dim=1, keepdim=True)  # ||f|| = R = 2
        rho = torch.full((4,), 0.25, dtype=torch.float64)
        mu = class_means(f, labels)
        assert float(torch.cdist(mu, mu).max()) <= 4.0
        res = best_head_loss(f, labels, rho, 4.0)
        assert res.loss <= float(mean_classifier_loss(f, labels, rho)) + 1e-12


def test_jensen_slack_bound_matches_loops_and_bounds_the_slack():
    f, y, rho = _tiny_latent()
    K = 3
    mu = class_means(f, y)
    cov = []
    for c in range(K):
        d = f[y == c] - mu[c]
        cov.append(d.T @ d / d.shape[0])
    total = 0.0
    for c, cn in itertools.product(range(K), repeat=2):
        for i in torch.nonzero(y == c).flatten():
            p = rho[c] * rho[cn] / int((y == c).sum())
            total += float(p * f[i] @ (cov[c] + cov[cn]) @ f[i])
    tau = float((rho**2).sum())
    bound = jensen_slack_bound(f, y, rho)
    assert bound == pytest.approx(total / (8 * (1 - tau)), rel=1e-12)
    assert curl_terms(f, y, rho).slack <= bound + 1e-12
    # collapsed classes: no spread, no slack
    collapsed = mu[y]
    assert jensen_slack_bound(collapsed, y, rho) == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("seed", range(6))
def test_approximate_minimizer_bound_holds_for_perturbed_and_random_encoders(seed):
    g = make_generator(100 + seed)
    n, k = 12, 3
    A = torch.rand(n, n, generator=g, dtype=torch.float64)
    A = A / A.sum(1, keepdim=True)
    p = torch.rand(n, generator=g, dtype=torch.float64)
    W = A.T @ ((p / p.sum())[:, None] * A)  # an augmentation graph: PSD A-bar
    W = 0.5 * (W + W.T)
    y = torch.randint(3, (n,), generator=g)
    y[:3] = torch.arange(3)
    sol = spectral_minimizer(W, k)
    assert approximate_minimizer_bound(W, y, k, 0.0) == pytest.approx(
        spectral_probe_bound(W, y, k), rel=1e-12
    )
    for scale in (1e-3, 1e-2, 1e-1, 1.0):
        f = sol.features + scale * torch.randn(n, k, generator=g, dtype=torch.float64)
        eps = float(spectral_contrastive_loss(f, W)) - sol.loss
        assert eps >= -1e-12
        bound = approximate_minimizer_bound(W, y, k, max(eps, 0.0))
        assert linear_probe_loss(f, y, W.sum(1)).mse <= bound + 1e-12
    assert approximate_minimizer_bound(W, y, k, 0.5) > approximate_minimizer_bound(
        W, y, k, 0.1
    )


def test_approximate_minimizer_bound_is_infinite_without_an_eigengap():
    world = MixtureOfManifolds(
        ManifoldConfig(points_per_class=12, arcs=3, jitter_std=0.0)
    )
    G = world.augmentation_graph()
    assert math.isinf(approximate_minimizer_bound(G.weights, G.labels, 3, 0.0))


def test_outside_subspace_against_explicit_projections():
    g = make_generator(5)
    n = 10
    p = torch.rand(n, generator=g, dtype=torch.float64)
    p = p / p.sum()
    U, _ = torch.linalg.qr(torch.randn(n, 4, generator=g, dtype=torch.float64))
    f = torch.randn(n, 3, generator=g, dtype=torch.float64)
    F = np.sqrt(p.numpy())[:, None] * f.numpy()
    P_F = F @ np.linalg.pinv(F)
    P_U = U.numpy() @ U.numpy().T
    expected = float(np.linalg.norm((np.eye(n) - P_U) @ P_F) ** 2)
    assert outside_subspace(f, U, p) == pytest.approx(expected, rel=1e-10)
    inside = (U[:, :2] @ torch.randn(2, 3, generator=g, dtype=torch.float64)) / (
        p.sqrt()[:, None]
    )
    assert outside_subspace(inside, U, p) == pytest.approx(0.0, abs=1e-12)


def test_top_eigenvectors_are_orthonormal_eigenvectors():
    W = _random_graph(9, 3)
    U = top_eigenvectors(W, 4)
    Abar = normalized_adjacency(W)
    nu = torch.linalg.eigvalsh(Abar).flip(0)[:4]
    assert torch.allclose(U.T @ U, torch.eye(4, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(Abar @ U, U * nu, atol=1e-12)


def test_make_spectral_loss_gives_exactly_the_same_numbers():
    W = _random_graph(10, 1)
    for dtype in (torch.float32, torch.float64):
        f = torch.randn(10, 3, generator=make_generator(2)).to(dtype)
        assert torch.equal(
            make_spectral_loss(W, dtype)(f), spectral_contrastive_loss(f, W)
        )
    with pytest.raises(TypeError, match="dtype"):
        make_spectral_loss(W, torch.int64)


def test_scrambled_indicators_are_a_minimiser_with_a_probe_at_chance():
    world = MixtureOfManifolds(
        ManifoldConfig(points_per_class=12, arcs=3, jitter_std=0.0, along_std=0.3)
    )
    G = world.augmentation_graph()
    f = scrambled_indicators(world)
    assert float(spectral_contrastive_loss(f, G.weights)) == pytest.approx(
        spectral_minimizer(G.weights, 3).loss, abs=1e-12
    )
    assert linear_probe_loss(f, G.labels, G.marginal).mse == pytest.approx(2 / 3)


def test_pretrain_spectral_keeps_checkpoints_and_a_scrambled_start(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path))
    world = ManifoldConfig(points_per_class=6, arcs=3, jitter_std=0.0, along_std=0.3)
    cfg = SpectralConfig(world=world, width=8, steps=6, lr=1e-2, checkpoints=(0, 3, 6))
    out = pretrain_spectral(cfg)
    assert sorted(out["checkpoints"]) == [0, 3, 6]
    assert torch.equal(out["checkpoints"][6], out["features"])
    ev = spectral_along_training(cfg)
    assert ev["steps"].tolist() == [0, 3, 6]
    assert bool((ev["excess"] >= -1e-6).all())
    assert math.isinf(float(ev["guarantee"][0]))  # no eigengap: nine arcs, k = 3
    scr = SpectralConfig(
        world=world,
        width=16,
        steps=1,
        lr=1e-2,
        start="scrambled",
        fit_steps=300,
        checkpoints=(0,),
    )
    fitted = pretrain_spectral(scr)["checkpoints"][0]
    G = MixtureOfManifolds(world).augmentation_graph()
    assert linear_probe_loss(fitted, G.labels, G.marginal).mse > 0.5
    only_fit = pretrain_spectral(replace(scr, steps=0))
    assert only_fit["losses"].numel() == 0
    assert torch.equal(only_fit["checkpoints"][0], only_fit["features"])
    assert linear_probe_loss(only_fit["features"], G.labels, G.marginal).mse > 0.5


def test_config_validation_names_the_argument():
    with pytest.raises(ValueError, match="lr"):
        CurlConfig(lr=0.0)
    with pytest.raises(TypeError, match="lr"):
        CurlConfig(lr="fast")
    with pytest.raises(ValueError, match="radius"):
        CurlConfig(radius=-1.0)
    with pytest.raises(TypeError, match="world"):
        CurlConfig(world=ManifoldConfig())
    with pytest.raises(ValueError, match="lr"):
        SpectralConfig(lr=-1e-3)
    with pytest.raises(ValueError, match="scrambled"):
        SpectralConfig(encoder="table", start="scrambled", fit_steps=5)
    with pytest.raises(ValueError, match="fit_steps"):
        SpectralConfig(fit_steps=5)
    with pytest.raises(ValueError, match="checkpoints"):
        SpectralConfig(steps=5, checkpoints=(6,))
    with pytest.raises(ValueError, match="steps"):
        SpectralConfig(steps=0)  # only a scrambled start may skip pretraining
    f, y, rho = _tiny_latent()
    with pytest.raises(ValueError, match="norm_bound"):
        best_head_loss(f, y, rho, 0.0)
    with pytest.raises(ValueError, match="excess"):
        approximate_minimizer_bound(_random_graph(6), torch.arange(6) % 2, 2, -1.0)
