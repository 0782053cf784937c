"""Chapter 1's runners at a tiny config (as the Flax examples test
``train_and_evaluate``), so that a broken runner fails here and not in the book build;
and its figure module, which must draw every result without computing a claim.

Oracles: the library functions each runner stacks (called directly), the identity and
inequality of eq. (6), the chain of the interface proof, and the cache's round trip.
"""

import dataclasses

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

from fmlab.chapters import ch1_figures as fig1  # noqa: E402
from fmlab.chapters import ch1_modular as ch1  # noqa: E402
from fmlab.data import TwoViewConfig, TwoViewLatentModel  # noqa: E402

TINY = ch1.Chapter1Config(
    world=TwoViewConfig(n_classes=4, dim_a=2, dim_b=4),
    pretrain_seeds=(0, 1, 2),  # a finding needs three seeds
    steps=6,
    checkpoints=(0, 3, 6),
    ns=(4, 8),
    c0s=(0.5, 2.0),
    task_seeds=(100, 101),
    eval_tasks=(0, 1, 2),
    n_population=400,
    n_eval=300,
    fine_tune=ch1.ViewFineTuneConfig(steps=2, lr=1e-3),
    ft_ns=(8,),
    ft_samples=1,
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FMLAB_PROGRESS", "0")
    return tmp_path


def _equal(a, b) -> bool:
    """Field by field equality of two result dataclasses (tensors exactly)."""
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            if not (torch.equal(x, y) and x.dtype == y.dtype):
                return False
        elif x != y:
            return False
    return True


def test_runners_at_a_tiny_config(cache):
    world, K = TwoViewLatentModel(TINY.world), len(TINY.pretrain_seeds)
    pre = ch1.pretraining(TINY)
    assert pre.losses.shape == (K, TINY.steps)
    assert len(pre.population_loss) == K and pre.bayes_loss > 0
    assert all(p > pre.bayes_loss for p in pre.population_loss)

    rep = ch1.representations(TINY)
    assert rep.excess.shape == (K, 3, len(TINY.eval_tasks))
    assert rep.bayes_task_loss.shape == (len(TINY.eval_tasks),)
    assert bool((rep.excess >= -1e-9).all())
    # the raw input's excess does not depend on the model
    assert torch.equal(rep.excess[0, 0], rep.excess[1, 0])

    dec = ch1.decomposition(TINY)
    shape = (K, len(TINY.ns), len(TINY.c0s), len(TINY.task_seeds))
    assert dec.adapted_loss.shape == shape
    L, Ls, GE, slack = (
        dec.adapted_loss,
        dec.minimal_loss,
        dec.generalization_error,
        dec.erm_slack,
    )
    assert torch.allclose(L, Ls + GE - slack, atol=1e-9)  # eq. (6) as an identity
    assert bool((slack >= -1e-9).all())  # the ERM property
    models = ch1.pretrained_models(TINY)
    pop = ch1.task_moments(
        models[1], world, world.task_signs(1), TINY.n_population, seed=8
    )
    direct = ch1.decomposition_grid(
        models[1], world, world.task_signs(1), pop, TINY.ns, TINY.c0s, TINY.task_seeds
    )
    assert torch.equal(dec.generalization_error[1], direct.generalization_error)

    ft = ch1.fine_tuning(TINY)
    assert ft.fine_tuned.shape == (K, 1, 1) and ft.ns == (8,)
    assert ft.best_c0[0] in TINY.c0s
    j = TINY.c0s.index(ft.best_c0[0])
    assert torch.equal(ft.best_probe[:, 0, 0], dec.adapted_loss[:, 1, j, 0])
    assert bool((ft.fine_tuned > 0).all()) and bool((ft.free_probe > 0).all())

    itf = ch1.interface(TINY)
    C, T = len(TINY.checkpoints), len(TINY.eval_tasks)
    assert itf.excess_minimal_loss.shape == (K, C, T)
    assert itf.excess_pretraining_loss.shape == (K, C)
    lhs, mid, rhs = itf.excess_minimal_loss, itf.readout_loss, itf.bound
    assert bool((lhs <= mid + 1e-12).all()) and bool((mid <= rhs + 1e-12).all())
    assert torch.equal(itf.class_means, world.means_b)
    one = ch1.interface_bound_at(models[0], world, 2, n=TINY.n_eval // 2, seed=7)
    assert itf.excess_minimal_loss[0, -1, 2].item() == pytest.approx(
        one.excess_minimal_loss, rel=1e-12
    )

    # a second call reads every result back from the cache, unchanged
    n_files = len(list(cache.glob("ch01_*.pt")))
    for runner, first in [
        (ch1.pretraining, pre),
        (ch1.representations, rep),
        (ch1.decomposition, dec),
        (ch1.fine_tuning, ft),
        (ch1.interface, itf),
    ]:
        again = runner(TINY)
        assert type(again) is type(first) and _equal(again, first)
    assert len(list(cache.glob("ch01_*.pt"))) == n_files

    # every figure, table, slider and sentence of the chapter draws these results
    figures = [
        fig1.pretraining_losses(pre, TINY),
        fig1.tradeoff(dec, shown=(0, 1)),
        fig1.interface_bound(itf, rep.bayes_task_loss, TINY),
    ]
    assert all(isinstance(f, plt.Figure) for f in figures)
    best = dec.adapted_loss.mean(-1).argmin(-1)
    tables = [
        fig1.representation_table(rep, TINY),
        fig1.best_radius_table(dec, best, TINY),
        fig1.largest_n_table(dec, 0),
        fig1.fine_tuning_table(ft),
        fig1.final_checkpoint_table(pre, itf, TINY),
    ]
    assert all("<table" in t._repr_html_() and repr(t) for t in tables)
    ge_last = dec.generalization_error[:, -1].mean(-1).mean(0)
    sentences = [
        fig1.peak_sentence(ge_last, TINY.c0s),
        fig1.fine_tuning_verdict(ft, 8),
        fig1.fine_tuning_summary(ft, ns=(8,)),
        fig1.fine_tuning_where(ft, rep, TINY, n=8),
        fig1.ranking_sentence(pre, itf, TINY),
    ]
    assert all(s.data for s in sentences)
    assert fig1.decomposition_slider(dec, initial=1) is not None
    plt.close("all")


def test_chapter_config_validates_its_arguments():
    assert ch1.Chapter1Config() == ch1.Chapter1Config()  # the chapter's defaults
    with pytest.raises(ValueError, match="ft_ns"):
        ch1.Chapter1Config(ft_ns=(12,))
    with pytest.raises(ValueError, match="eval task"):
        ch1.Chapter1Config(pretrain_seeds=(0, 11))
    with pytest.raises(ValueError, match="ns"):
        ch1.Chapter1Config(ns=())
    with pytest.raises(TypeError, match="world"):
        ch1.Chapter1Config(world={"n_classes": 4})
    with pytest.raises(ValueError, match="ft_samples"):
        ch1.Chapter1Config(ft_samples=21)


def test_pretrain_configs_carry_the_chapter_config():
    pcs = ch1.pretrain_configs(TINY)
    assert [pc.seed for pc in pcs] == list(TINY.pretrain_seeds)
    assert all(
        pc.world == TINY.world
        and pc.steps == TINY.steps
        and pc.checkpoints == TINY.checkpoints
        for pc in pcs
    )


def test_loss_map_draws_four_boxes_and_four_arrows():
    fig = fig1.loss_map()
    ax = fig.axes[0]
    assert sum(isinstance(p, FancyBboxPatch) for p in ax.patches) == 4
    assert sum(isinstance(p, FancyArrowPatch) for p in ax.patches) == 4
    texts = " ".join(t.get_text() for t in ax.texts)
    for chapter in range(1, 7):
        assert f"Ch. {chapter}" in texts
    plt.close(fig)
