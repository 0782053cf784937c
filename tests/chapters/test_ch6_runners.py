"""Chapter 6's runners (fmlab.chapters.ch6_bayes and the runners of ch6_icl) and figures
at a tiny config: each against the library calls it stands for, or a direct
computation."""

import itertools

import matplotlib
import numpy as np
import pytest
import torch

from fmlab import SeedEffect, make_generator
from fmlab.chapters import ch6_bayes, ch6_figures
from fmlab.chapters import ch6_icl as ch6
from fmlab.data.ginc import (
    GINC,
    distinguishability,
    ginc_bayes_predictor,
    ginc_preset,
    token_names,
)

matplotlib.use("Agg")


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FMLAB_PROGRESS", "0")
    return tmp_path


def _tiny_config(**kw):
    base = dict(
        world=ginc_preset("tiny"),
        width=8,
        n_heads=2,
        steps=3,
        warmup=1,
        window=12,  # prompts with n = 2 examples of k = 3 have 10 tokens
        ns=(0, 2),
        ks=(3,),
        bayes_ks=(3, 4),
        eval_seeds=(1, 2, 3),
        n_prompts=12,
        n_prompts_bayes=10,
        epsilon=0.1,
    )
    return ch6.Chapter6Config(**{**base, **kw})


def test_path_sum_is_the_forward_recursion_on_a_random_hmm():
    g = torch.Generator().manual_seed(0)
    H, V, obs = 3, 2, [1, 0, 0, 1]
    T = torch.rand(H, H, generator=g, dtype=torch.float64)
    T /= T.sum(1, keepdim=True)
    O = torch.rand(H, V, generator=g, dtype=torch.float64)
    O /= O.sum(1, keepdim=True)
    mu = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    alpha = mu * O[:, obs[0]]
    for o in obs[1:]:
        alpha = (alpha @ T) * O[:, o]
    assert float(ch6_bayes.path_sum(T, O, obs, mu)) == pytest.approx(float(alpha.sum()))
    # from a fixed previous state h: p(o_1:L | h_0 = h) = sum_h' T[h, h'] ... (backward)
    beta = torch.ones(H, dtype=torch.float64)
    for o in reversed(obs):
        beta = T @ (O[:, o] * beta)
    for h in range(H):
        assert float(ch6_bayes.path_sum(T, O, obs, T[h])) == pytest.approx(
            float(beta[h])
        )


def test_config_gives_the_chapters_pretraining_config():
    cfg = ch6.Chapter6Config()
    p = cfg.pretrain_config(1)
    assert (p.seed, p.schedule, p.corpus, p.corpus_eps) == (
        1,
        "linear",
        "documents",
        0.15,
    )
    assert cfg.world.vocab_size == 150 and p.world == cfg.world
    assert (p.steps, p.warmup, p.lr, p.dropout) == (1500, 225, 3e-3, 0.0)


def test_transformer_runners_agree_with_the_library_calls(cache):
    cfg = _tiny_config()
    res = ch6.transformer_in_context(cfg)
    world = GINC(cfg.world)
    assert len(res.val_loss) == 2 and res.losses.shape == (cfg.steps,)
    for split in ("seen", "unseen"):
        direct = [
            ch6.evaluate_in_context(
                cfg.pretrain_config(s),
                cfg.ns,
                cfg.ks,
                seeds=cfg.eval_seeds,
                n_prompts=cfg.n_prompts,
                epsilon=cfg.epsilon,
                concepts={"seen": "seen", "unseen": "pattern"}[split],
            )
            for s in cfg.model_seeds
        ]
        acc = res.stack(split, "accuracy", run=1)
        assert acc.shape == (3, 2, 1)
        assert np.array_equal(
            acc, torch.stack([g.accuracy["transformer"] for g in direct[1]]).numpy()
        )
        want = np.concatenate(
            [ch6.gain_per_seed(d, 3, name="transformer") for d in direct]
        )
        assert np.array_equal(res.pooled_gain(split, 3), want)
        b = res.stack(split, "bayes_accuracy", bayes=True)
        assert np.array_equal(res.gains(split, 3, bayes=True), b[:, -1, 0] - b[:, 0, 0])
    assert 0 <= res.chance_unseen[3] <= 1
    assert res.bayes_loss < res.unigram
    # the first page's Bayes curves read the same prompts, without the model
    curves = ch6_bayes.bayes_curves(cfg)
    assert curves.ks == (3, 4) and curves.accuracy.shape == (3, 2, 2)
    assert np.array_equal(
        curves.accuracy[:, :, :1], res.stack("seen", "bayes_accuracy", bayes=True)
    )
    for j, k in enumerate(curves.ks):
        assert np.allclose(
            curves.gain[k], curves.accuracy[:, -1, j] - curves.accuracy[:, 0, j]
        )
    # diagnostics and orders: the library calls on the first run, cached
    diag = ch6.boundary_diagnostics(cfg, n_documents=4, n_examples=2, n_prompts=5)
    model = ch6.load_ginc_lm(cfg.pretrain_config())
    doc = ch6.document_losses(model, world, cfg.window + 1, n_documents=4, seed=102)
    assert torch.equal(diag.documents[1].model, doc.model)
    ex = ch6.prompt_example_losses(
        model, world, 2, 3, n_prompts=5, seed=203, epsilon=cfg.epsilon
    )
    assert torch.equal(diag.examples[3][2].bayes, ex.bayes)
    again = ch6.boundary_diagnostics(cfg, n_documents=4, n_examples=2, n_prompts=5)
    assert torch.equal(again.documents[0].oracle, diag.documents[0].oracle)
    assert len(list(cache.glob("ginc_diagnostics-*.pt"))) == 1
    orders = ch6.order_experiment(cfg, n=2, k=3, n_prompts=6, seeds=(4, 5))
    direct = ch6.order_sensitivity(
        model, world, world.sample_prompts(6, 2, 3, make_generator(5)), cfg.epsilon
    )
    assert len(orders) == 2 and orders[1].model_changed == direct.model_changed
    assert torch.equal(orders[1].bayes_accuracy, direct.bayes_accuracy)
    # every figure and table draws from these results
    for fig in (
        ch6_figures.plot_ginc_pretraining(res, cfg),
        ch6_figures.plot_in_context(res),
        ch6_figures.plot_agreement(res),
        ch6_figures.plot_diagnostics(diag, cfg.window),
        ch6_figures.plot_bayes_curves(curves),
    ):
        assert isinstance(fig, matplotlib.figure.Figure)
    ch6_figures.posterior_slider(world, cfg, curves, token_names(5), concept=1)
    effect = {3: SeedEffect.of(res.pooled_gain("seen", 3))}
    ch6_figures.in_context_table(res)
    ch6_figures.room_table(res)
    assert "8" in ch6_figures.model_text(cfg, res)
    with pytest.raises(KeyError):  # the paper table quotes k = 3 and 5
        ch6_figures.paper_comparison(cfg, res, effect, effect[3])


def test_stacked_training_is_separate_training_up_to_rounding(cache):
    # oracle: the one-model loop (_train), run once per seed
    cfg = _tiny_config(steps=12, warmup=3)
    cfgs = [cfg.pretrain_config(s) for s in cfg.model_seeds]
    alone = [ch6._train(c) for c in cfgs]
    together = ch6._train_stacked(cfgs)
    for a, t in zip(alone, together):
        assert torch.allclose(a["losses"], t["losses"], atol=1e-5)
        for name, v in a["state_dict"].items():
            assert torch.allclose(v, t["state_dict"][name], atol=1e-5), name
        assert abs(a["val_loss"] - t["val_loss"]) < 1e-5
    # the cached runs: one entry per run, each what the one-run call returns
    runs = ch6.pretrain_ginc_lms(cfgs)
    assert len(list(cache.glob("ginc_lm-*.pt"))) == 2
    for c, r in zip(cfgs, runs):
        assert torch.equal(ch6.pretrain_ginc_lm(c)["losses"], r["losses"])


def test_worlds_table_and_prose_read_the_stored_fields():
    from fmlab.chapters import ch6_worlds

    def world(offset, gain):
        pair = {"3": [gain, gain], "5": [gain, gain]}
        return {
            "offset": offset,
            "gain": {"3": [[gain, gain]], "5": [[gain, gain]]},
            "bayes_gain_eps0.15": pair,
            "bayes_gain_eps1e-08": pair,
            "impossible": {"3": 0.5, "5": 0.7},
            "distinguishable": {"3": 0.4, "5": 0.9},
        }

    worlds = {"worlds": [world(0, 0.1), world(1, -0.02)]}
    pooled = ch6_worlds.pooled_gain(worlds)
    assert np.allclose(pooled, [0.1, 0.1, -0.02, -0.02])
    per = {
        w["offset"]: ch6_worlds.pooled_gain({"worlds": [w]}) for w in worlds["worlds"]
    }
    prose = ch6_figures.prose_worlds(worlds, per, [0], None)
    assert prose["ch6_w_held"] == "one" and prose["ch6_w_failed_list"] == "world 1"
    assert "absent" in prose["ch6_w_paper"]
    text = str(ch6_figures.worlds_table(worlds, {0: (0.2, 0.1)}))
    assert "+0.100 / +0.100" in text and "+0.200 / +0.100" in text


def test_smoothing_sweep_is_the_bayes_grid_at_each_epsilon(cache):
    cfg = _tiny_config()
    scfg = ch6_bayes.SmoothingConfig(
        epsilons=(0.0, 0.1), ns=(0, 2), ks=(3, 4), n_prompts=8, seeds=(1, 2, 3)
    )
    sweep = ch6_bayes.smoothing_sweep(cfg, scfg)
    world = GINC(cfg.world)
    for eps in scfg.epsilons:
        g = ch6.in_context_grid(
            None, world, (0, 2), (3, 4), n_prompts=8, seed=2, epsilon=eps
        )
        assert np.array_equal(sweep.accuracy[eps][1], g.bayes_accuracy.numpy())
        assert np.array_equal(sweep.impossible[eps][1], g.bayes_impossible.numpy())
    assert (sweep.impossible[0.1] == 0).all()
    again = ch6_bayes.smoothing_sweep(cfg, scfg)
    assert np.array_equal(again.accuracy[0.0], sweep.accuracy[0.0])
    assert len(list(cache.glob("ginc_smoothing-*.pt"))) == 1
    assert isinstance(ch6_figures.plot_smoothing(sweep), matplotlib.figure.Figure)
    assert isinstance(
        ch6_figures.plot_world(world, token_names(5)), matplotlib.figure.Figure
    )
    with pytest.raises(ValueError, match="epsilons"):
        ch6_bayes.SmoothingConfig(epsilons=(1.5,))


def test_concentration_condition_is_the_worst_competitor_of_D(cache):
    cfg = _tiny_config()
    ccfg = ch6_bayes.ConditionConfig(
        n_segments=5, seed=1, n_prompts=7, n_examples=3, k=3, prompt_seed=2
    )
    cond = ch6_bayes.concentration_condition(cfg, ccfg)
    world = GINC(cfg.world)
    C = cfg.world.n_seen
    for k in cfg.bayes_ks:
        D = distinguishability(world, k, cfg.epsilon, n_segments=5, seed=1)
        for cs, s0 in itertools.product(range(C), range(D.shape[1])):
            others = [D[cs, s0, c] for c in range(C) if c != cs]
            assert float(cond.worst_margin[k][cs, s0]) == pytest.approx(
                float(min(others))
            )
    pr = world.sample_prompts(7, 3, 3, make_generator(2))
    post = ginc_bayes_predictor(world, pr.tokens, cfg.epsilon).posterior
    assert torch.allclose(cond.posterior, post[torch.arange(7), pr.concepts])
    assert torch.equal(cond.concepts, pr.concepts)


def test_runners_reject_a_wrong_config():
    for runner in (
        ch6.transformer_in_context,
        ch6.boundary_diagnostics,
        ch6.order_experiment,
        ch6_bayes.bayes_curves,
    ):
        with pytest.raises(TypeError, match="Chapter6Config"):
            runner(object())


def test_paper_scale_is_the_papers_model_and_corpus():
    # oracle: Xie et al.'s settings (GPT-2 with 4 layers of width 768, 12 heads,
    # blocks of 1024 tokens, batch 8, learning rate 8e-4 with 1000 warm-up steps,
    # 1000 documents of 10 240 tokens) and the parameter count of that shape
    from fmlab.chapters.ch6_worlds import WorldsConfig

    cfg = WorldsConfig(scale="paper").pretrain(0)
    assert (cfg.width, cfg.n_layers, cfg.n_heads, cfg.window) == (768, 4, 12, 1024)
    assert (cfg.batch_size, cfg.steps, cfg.lr, cfg.warmup) == (8, 6000, 8e-4, 1000)
    assert (cfg.world.n_documents, cfg.world.document_length) == (1000, 10240)
    assert cfg.corpus_eps == 0 and cfg.dropout == 0 and cfg.world.vocab_size == 150
    d, V, L = 768, 150, 4
    per_block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * (4 * d * d) + 5 * d
    want = V * d + 1024 * d + L * per_block + 2 * d + V * d + V
    assert ch6.build_model(cfg).n_params() == want
    assert abs(want / 1e6 - 29.4) < 0.1


def test_the_pages_runs_are_read_from_their_stored_file_at_offset_0_only(
    cache, monkeypatch
):
    # oracle: the stored file itself (decoded by hand), and a stand-in for the
    # training that records what it was asked to train
    import json
    from dataclasses import asdict, replace

    from fmlab import stored
    from fmlab.chapters import ch6_pretrained as cp

    def plain(config):
        return json.loads(json.dumps(asdict(config)))

    data = stored.read(cp.PRETRAINED_RESULTS)
    cfg = ch6.Chapter6Config()  # the page's config
    assert data["stored"]["config"] == plain(cfg)
    pcfgs = [cfg.pretrain_config(s) for s in cfg.model_seeds]
    asked = []

    def fake_train(cfgs, device="cpu"):
        asked.append([c.seed for c in cfgs])
        return [{"state_dict": {}, "losses": torch.zeros(1), "val_loss": 0.0}] * len(
            cfgs
        )

    sources = cp.pretrained_sources()  # the real training code, for the fingerprint
    monkeypatch.setattr(cp, "pretrained_sources", lambda: sources)
    monkeypatch.setattr(ch6, "_train_stacked", fake_train)
    monkeypatch.delenv("FMLAB_SEED_OFFSET", raising=False)
    runs = ch6.pretrain_ginc_lms(pcfgs)
    assert asked == [] and not list(cache.glob("ginc_lm-*.pt"))
    for c, run, record in zip(pcfgs, runs, data["runs"]):
        assert record["config"] == plain(c)
        want = stored.decode_tensors(record["state_dict"])
        assert all(torch.equal(run["state_dict"][n], v) for n, v in want.items())
        assert run["losses"].tolist() == record["losses"]
        assert run["val_loss"] == record["val_loss"]
        assert ch6.pretrain_ginc_lm(c)["val_loss"] == record["val_loss"]
    assert ch6.load_ginc_lm(pcfgs[1]).n_params() > 0
    # another seed of the same pretraining trains, alone; so does another config
    ch6.pretrain_ginc_lms([pcfgs[0], replace(pcfgs[0], seed=7)])
    ch6.pretrain_ginc_lm(replace(pcfgs[0], steps=1499, seed=2))
    assert asked == [[7], [2]]
    monkeypatch.setenv("FMLAB_SEED_OFFSET", "3")  # another world: trained live
    assert cp.stored_run(pcfgs[0]) is None
    ch6.pretrain_ginc_lms(pcfgs)
    assert asked[-1] == [0, 1]
    # changed code behind the stored runs stops the page, naming the script
    monkeypatch.delenv("FMLAB_SEED_OFFSET")
    real = stored.source_text
    monkeypatch.setattr(
        stored,
        "source_text",
        lambda src: real(src) + ("#" if src is ch6.GINCPretrainConfig else ""),
    )
    with pytest.raises(stored.StaleResults, match="Rerun scripts/ch6_pretrained.py"):
        ch6.pretrain_ginc_lm(pcfgs[0])
