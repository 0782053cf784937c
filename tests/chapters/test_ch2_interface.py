"""Chapter 2's runners at tiny configs (as the Flax examples test
``train_and_evaluate``), so that a broken runner fails here in seconds and not in the
book build; and the figures, tables and slider drawn from their results.

The mathematics the runners call is tested against oracles in
``tests/lib/test_contrastive.py``; here the runners' results are checked against the
theorems the chapter states about them.
"""

import math
import os

import matplotlib.pyplot as plt
import pytest
import torch

from fmlab.chapters import ch2_figures as fig2
from fmlab.chapters import ch2_interface as ch2
from fmlab.theory import contrastive as tc
from fmlab.viz import Table

TINY_LATENT = ch2.LatentClassesConfig(
    world=ch2.LatentClassConfig(
        n_classes=3, clusters_per_class=2, points_per_cluster=3
    ),
    seeds=(0, 1),
    steps=4,
    checkpoints=(0, 2, 4),
)
TINY_CHECK = ch2.MinimiserCheckConfig(
    world=ch2.ManifoldConfig(points_per_class=6, separation=2.1), seeds=(0, 1)
)
TINY_SWEEP = ch2.SweepConfig(
    base=ch2.ManifoldConfig(points_per_class=8),
    along_stds=(0.1, 0.8),
    separations=(2.0, 2.2, 2.4),
)
TINY_TRAINED = ch2.TrainedEncodersConfig(
    world=ch2.ManifoldConfig(points_per_class=6, along_std=0.4, separation=2.2),
    seeds=(0, 1),
    steps=6,
    checkpoints=(0, 3, 6),
)
TINY_SAME = ch2.SameLossEncodersConfig(
    world=ch2.ManifoldConfig(points_per_class=6, arcs=3, jitter_std=0.0),
    seeds=(0, 1),
    steps=5,
    fit_steps=5,
)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every runner once, in a fresh cache; then every runner again, from the cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FMLAB_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        runs = {
            "latent": ch2.latent_classes(TINY_LATENT),
            "check": ch2.minimiser_check(TINY_CHECK),
            "sweep": ch2.connectivity(TINY_SWEEP),
            "trained": ch2.trained_encoders(TINY_TRAINED),
            "same": ch2.same_loss(TINY_SAME),
        }
        files = sorted(os.listdir(os.environ["FMLAB_CACHE_DIR"]))
        again = {
            "latent": ch2.latent_classes(TINY_LATENT),
            "check": ch2.minimiser_check(TINY_CHECK),
            "sweep": ch2.connectivity(TINY_SWEEP),
            "trained": ch2.trained_encoders(TINY_TRAINED),
            "same": ch2.same_loss(TINY_SAME),
        }
        assert sorted(os.listdir(os.environ["FMLAB_CACHE_DIR"])) == files
    return runs, again


def _equal(a, b):
    """Dataclasses, containers, tensors and numbers, compared exactly."""
    if hasattr(a, "__dataclass_fields__"):
        assert type(a) is type(b)
        for name in a.__dataclass_fields__:
            _equal(getattr(a, name), getattr(b, name))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _equal(x, y)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    else:
        assert a == b or (a != a and b != b)  # NaN equals NaN here


def test_cached_results_come_back_exactly(results):
    runs, again = results
    for name in runs:
        _equal(runs[name], again[name])


def test_latent_classes_holds_the_chain_at_every_checkpoint(results):
    r = results[0]["latent"]
    assert isinstance(r, ch2.LatentClassesResult)
    shape = (len(TINY_LATENT.seeds), len(TINY_LATENT.checkpoints))
    assert r.bound.shape == r.best_head.shape == r.spread.shape == shape
    assert r.steps.tolist() == list(TINY_LATENT.checkpoints)
    assert r.tau == pytest.approx(1 / 3) and r.ell0 == math.log(2)
    assert bool((r.best_head <= r.mean_classifier).all())
    assert bool((r.mean_classifier <= r.bound + 1e-12).all())
    assert bool((r.unsupervised >= r.tau * r.ell0 - 1e-12).all())
    assert bool((r.max_mean_gap <= 2 * r.radius + 1e-9).all())
    assert len(r.final_features) == len(TINY_LATENT.seeds)
    for f in r.final_features:  # on the sphere of radius R
        assert torch.allclose(f.norm(dim=1), torch.full_like(f[:, 0], r.radius))
    # the last checkpoint's features are the final encoder's
    t = tc.curl_terms(r.final_features[0], r.labels, r.class_probs)
    assert t.unsupervised == pytest.approx(float(r.unsupervised[0, -1]), abs=1e-6)


def test_minimiser_check_finds_the_eigendecomposition(results):
    r = results[0]["check"]
    W = r.graph.weights
    assert len(r.found) == len(TINY_CHECK.seeds)
    for f in r.found:
        gap = float(tc.spectral_contrastive_loss(f, W)) - r.exact.loss
        assert abs(gap) < 1e-8
        dist = tc.weighted_span_distance(f, r.exact.features, r.graph.marginal)
        assert dist < 1e-3


def test_connectivity_obeys_the_guarantee(results):
    s = results[0]["sweep"]
    assert s.minimal_adaptation_loss.shape == (2, 3)
    assert bool((s.minimal_adaptation_loss <= s.bound + 1e-12).all())
    assert s.along_stds == TINY_SWEEP.along_stds


def test_trained_encoders_obey_the_guarantee_for_approximate_minimisers(results):
    r = results[0]["trained"]
    assert r.adapt.shape == (2, 3) and r.steps.tolist() == [0, 3, 6]
    assert bool((r.excess >= -1e-6).all())
    assert bool((r.adapt <= r.guarantee + 1e-12).all())
    assert r.leakage == pytest.approx(tc.label_leakage(r.graph.weights, r.graph.labels))


def test_same_loss_compares_f_and_f_composed_with_the_automorphism(results):
    r = results[0]["same"]
    assert list(r.evaluations) == ["class indicators", *ch2.TRAINED]
    assert tc.automorphism_defect(r.graph.weights, r.perm) == 0.0
    assert r.n_arcs == 9 and float(r.laplacian[8]) < 1e-10
    for evals in r.evaluations.values():
        for e in evals:
            assert e.loss == pytest.approx(e.loss_pi, abs=1e-9)
            assert e.excess >= -1e-9
    ind = r.evaluations["class indicators"][0]
    assert ind.probe.mse < 1e-12 and ind.probe_pi.mse == pytest.approx(2 / 3)
    mlp = r.probe_losses("MLP")
    assert mlp.shape == (2,) and mlp.dtype == torch.float32
    assert torch.equal(
        r.probe_losses("MLP", composed=True),
        torch.tensor([e.probe_pi.mse for e in r.evaluations["MLP"]]),
    )


def test_figures_tables_and_slider_draw_from_the_results(results):
    runs = results[0]
    figs = [
        fig2.plot_latent_class_training(runs["latent"]),
        fig2.plot_connectivity_sweep(runs["sweep"], 2 / 3),
        fig2.plot_trained_spectral(runs["trained"], 0.2, 0.1, 2 / 3),
        fig2.plot_probe_predictions(runs["same"]),
        fig2.plot_slack(runs["latent"]),
    ]
    assert all(isinstance(f, plt.Figure) for f in figs)
    n = len(runs["latent"].seeds)  # one line per seed and quantity
    assert [len(ax.lines) for ax in figs[-1].axes][:2] == [3 * n, n]
    plt.close("all")
    r = runs["latent"]
    hinge = [
        tc.curl_terms(f, r.labels, r.class_probs, loss="hinge")
        for f in r.final_features
    ]
    tables = [
        fig2.slack_table(runs["latent"]),
        fig2.hinge_table(TINY_LATENT.seeds, hinge, hinge),
        fig2.trained_encoders_table(runs["trained"], TINY_TRAINED.k),
        fig2.loss_table({"f": 1.0}, {"f": 0.5}),
        fig2.same_loss_table(runs["same"]),
    ]
    assert all(isinstance(t, Table) for t in tables)
    assert len(tables[0].rows) == 2 * 3 and len(tables[4].rows) == 1 + 3 * 2
    assert "<table" in tables[4]._repr_html_()
    slider = fig2.sweep_slider(TINY_SWEEP, runs["sweep"])
    assert slider is not None
    prose = {
        **fig2.prose_latent_classes(runs["latent"]),
        **fig2.prose_trained_encoders(runs["trained"], 0.2, 0.1),
        **fig2.prose_same_loss(runs["same"]),
    }
    assert all(k.startswith("ch2_") and isinstance(v, str) for k, v in prose.items())
    with pytest.raises(TypeError, match="result"):
        fig2.plot_latent_class_training(runs["sweep"])


def test_configs_validate_their_arguments():
    with pytest.raises(TypeError, match="world"):
        ch2.LatentClassesConfig(world=ch2.ManifoldConfig())
    with pytest.raises(TypeError, match="seeds"):
        ch2.TrainedEncodersConfig(seeds=[0, 1])
    with pytest.raises(ValueError, match="checkpoints"):
        ch2.LatentClassesConfig(steps=10, checkpoints=(0, 20))
    with pytest.raises(ValueError, match="k"):
        ch2.SameLossEncodersConfig(k=2)
    with pytest.raises(TypeError, match="cfg"):
        ch2.same_loss(TINY_TRAINED)
