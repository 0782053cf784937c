"""Tests of fmlab.models.bert and fmlab.chapters.ch5_sgd_noise (Chapter 5).

Oracles: the model's own definition evaluated member by member and position by position
(a different code path from the batched one), brute-force sums over labels with plain
autograd, and the exact conditionals of the HMM language.
"""

import pytest
import torch
import torch.nn.functional as F
from scripts_loader import load_script

from fmlab.chapters.ch5_sgd_noise import (
    NoiseTransferConfig,
    bert_blocks,
    bert_fisher_trace,
    bert_kl_gap,
    head_trace_closed_form,
    train_bert,
)
from fmlab.data.hmm_language import HMMLanguage, HMMLanguageConfig
from fmlab.models.bert import BertConfig, EnsembleBert, embed_width, masked_lm_nll

CFG = BertConfig(vocab_size=5, length=6, d_model=8, n_layers=2, n_heads=2, d_ff=12)


def _model(E=2, seed=0):
    return EnsembleBert(CFG, n_models=E, generator=torch.Generator().manual_seed(seed))


def _tokens(n=7, seed=1):
    return torch.randint(0, 5, (n, 6), generator=torch.Generator().manual_seed(seed))


def test_the_masked_prediction_never_sees_the_masked_token():
    m = _model()
    x = _tokens()
    pos = torch.full((len(x),), 3)
    other = x.clone()
    other[:, 3] = (x[:, 3] + 1) % 5  # change only the masked token
    with torch.no_grad():
        assert torch.equal(m.masked_logits(x, pos), m.masked_logits(other, pos))
        # ... but another position's token does matter
        moved = x.clone()
        moved[:, 1] = (x[:, 1] + 1) % 5
        assert not torch.allclose(m.masked_logits(x, pos), m.masked_logits(moved, pos))


def test_members_are_independent_models():
    m = _model(E=3)
    x = _tokens()
    with torch.no_grad():
        full = m.all_masked_logits(x)
        for e in range(3):
            one = EnsembleBert(CFG, n_models=1)
            for (_, p), q in zip(m.named_parameters(), one.parameters()):
                q.copy_(p[e : e + 1])
            assert torch.allclose(one.all_masked_logits(x)[0], full[e], atol=1e-6)


def test_all_masked_logits_matches_one_position_at_a_time():
    m = _model()
    x = _tokens()
    with torch.no_grad():
        full = m.all_masked_logits(x)
        for t in range(6):
            one = m.masked_logits(x, torch.full((len(x),), t))
            assert torch.allclose(full[:, :, t], one, atol=1e-6)


def test_the_representation_is_normalised():
    phi = _model().features(_tokens())
    assert torch.allclose(phi.mean(-1), torch.zeros(()), atol=1e-5)
    assert torch.allclose(phi.pow(2).sum(-1), torch.full((), 8.0), rtol=1e-3)


def test_nll_is_cross_entropy_at_the_masked_position():
    m = _model()
    x = _tokens()
    pos = torch.randint(0, 6, (len(x),), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        lg = m.masked_logits(x, pos)
        ref = torch.stack(
            [F.cross_entropy(lg[e], x[torch.arange(len(x)), pos]) for e in range(2)]
        )
        assert torch.allclose(masked_lm_nll(m, x, pos), ref)


def test_head_trace_closed_form_is_the_exact_fisher_trace_of_the_decoder():
    torch.set_default_dtype(torch.float64)
    try:
        m = _model(E=1, seed=4)
        x = _tokens(5, seed=5)
        pos = torch.tensor([0, 2, 5, 1, 3])
        closed = head_trace_closed_form(m, x, pos)
        brute = 0.0
        for i in range(len(x)):
            with torch.no_grad():
                p = torch.softmax(m.masked_logits(x[i : i + 1], pos[i : i + 1]), -1)
            for y in range(5):
                lp = F.log_softmax(m.masked_logits(x[i : i + 1], pos[i : i + 1]), -1)
                gw, gb = torch.autograd.grad(lp[0, 0, y], [m.dec_w, m.dec_b])
                sq = float(gw.pow(2).sum() + gb.pow(2).sum())
                brute += float(p[0, 0, y]) * sq / len(x)
        assert float(closed[0]) == pytest.approx(brute, rel=1e-8)
    finally:
        torch.set_default_dtype(torch.float32)


def test_fisher_trace_blocks_add_up_and_the_head_matches_the_closed_form():
    m = _model(E=2, seed=6)
    x = _tokens(400, seed=7)
    pos = torch.randint(0, 6, (400,), generator=torch.Generator().manual_seed(8))
    est = bert_fisher_trace(m, x, pos, generator=torch.Generator().manual_seed(9))
    assert set(est.per_block) == {"encoder", "head"}
    total = est.per_block["encoder"].per_group + est.per_block["head"].per_group
    assert torch.allclose(total, est.per_group, rtol=1e-5)
    head = est.per_block["head"]
    closed = head_trace_closed_form(m, x, pos).float()
    assert ((head.per_group - closed).abs() < 4 * head.per_group_stderr).all()
    assert bert_blocks("m.dec_w") == "head" and bert_blocks("l0_qkv_w") == "encoder"


def test_kl_gap_is_zero_for_the_true_conditionals_and_positive_for_a_model():
    lang = HMMLanguage(HMMLanguageConfig(length=6, seed=1))
    x, _ = lang.sample(50, torch.Generator().manual_seed(0))
    m = _model()
    gap = bert_kl_gap(m, x, lang.masked_conditionals(x))
    assert (gap > 0).all()
    with pytest.raises(ValueError, match="true_conditionals"):
        bert_kl_gap(m, x, lang.masked_conditionals(x)[:, :3])


def test_training_lowers_the_loss_and_arguments_are_validated():
    lang = HMMLanguage(HMMLanguageConfig(length=6, seed=1))
    x, _ = lang.sample(200, torch.Generator().manual_seed(0))
    cond = lang.masked_conditionals(x)
    m = _model()
    before = bert_kl_gap(m, x, cond)
    train_bert(
        m,
        lang,
        steps=60,
        batch=32,
        lr=1e-2,
        optimizer="adam",
        warmup=5,
        generator=torch.Generator().manual_seed(1),
    )
    assert (bert_kl_gap(m, x, cond) < before).all()
    with pytest.raises(ValueError, match="optimizer"):
        train_bert(
            m, lang, steps=1, batch=1, lr=1.0, optimizer="rmsprop",
            generator=torch.Generator(),
        )  # fmt: skip
    with pytest.raises(ValueError, match="schedule"):
        train_bert(
            m, lang, steps=1, batch=1, lr=1.0, optimizer="sgd", schedule="step",
            generator=torch.Generator(),
        )  # fmt: skip
    with pytest.raises(ValueError, match="tokens"):
        m.features(torch.full((2, 6), 5))
    with pytest.raises(ValueError, match="d_model"):
        BertConfig(vocab_size=5, length=6, d_model=9, n_heads=2)
    with pytest.raises(ValueError, match="continue_lrs"):
        NoiseTransferConfig(continue_lrs=())
    assert NoiseTransferConfig(continue_lrs=(0.1,), continue_batch=10).noise_levels[
        0
    ] == pytest.approx(1e-3)


class _Masked(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, tokens, positions):
        return self.inner.masked_logits(tokens, positions)


def test_per_example_gradients_match_a_loop_with_the_fused_attention():
    # under torch.func the attention is written out; outside it is the fused kernel
    from torch.func import functional_call, grad, vmap

    w = _Masked(_model(E=1))
    x, pos = _tokens(n=4), torch.tensor([0, 2, 3, 5])
    params = {k: v.detach() for k, v in w.named_parameters()}

    def f(p, xi, ti):
        return functional_call(w, p, (xi[None], ti[None]))[..., 0].sum()

    per = vmap(grad(f), in_dims=(None, 0, 0))(params, x, pos)
    for i in range(len(x)):
        w.zero_grad()
        w(x[i : i + 1], pos[i : i + 1])[..., 0].sum().backward()
        for k, p in w.named_parameters():
            torch.testing.assert_close(per[k][i], p.grad, rtol=1e-4, atol=1e-6)


def _perturbed(E=2, seed=0):
    """A model whose biases are not zero (the embedding must carry them too)."""
    m = _model(E=E, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return m


@pytest.mark.parametrize("factor", [1, 2, 3])
def test_embed_width_keeps_every_prediction_and_replicates_the_representation(factor):
    m = _perturbed()
    big = embed_width(m, factor * CFG.d_model)
    assert big.config.d_model == factor * CFG.d_model
    assert big.config.d_ff == factor * CFG.d_ff and big.n_models == m.n_models
    x = _tokens(n=20)
    with torch.no_grad():
        torch.testing.assert_close(
            big.all_masked_logits(x), m.all_masked_logits(x), atol=1e-5, rtol=1e-5
        )
        rep = m.features(x).repeat_interleave(factor, dim=-1)
        torch.testing.assert_close(big.features(x), rep, atol=1e-5, rtol=1e-5)


def test_embed_width_rescales_each_parameter_traces_as_derived():
    """With replicated units the gradient of the wide model is replicated too, so each
    parameter tensor's Fisher trace is the narrow one's divided by (copies x scale²):
    embeddings and biases of replicated outputs by m, weights between replicated
    features unchanged, the decoder's weights times m; the q|k|v tensor lies between
    (its query part is times m)."""
    m, factor = _perturbed(), 3
    big = embed_width(m, factor * CFG.d_model)
    x = _tokens(n=40, seed=3)
    pos = torch.randint(
        0, CFG.length, (40,), generator=torch.Generator().manual_seed(4)
    )

    def per_name(model):
        est = bert_fisher_trace(
            model,
            x,
            pos,
            generator=torch.Generator().manual_seed(5),
            blocks=lambda k: k.split(".")[-1],
        )
        return {k: e.per_group for k, e in est.per_block.items()}

    small, wide = per_name(m), per_name(big)
    expected = {"tok": 1 / factor, "pos": 1 / factor, "dec_w": factor, "dec_b": 1.0}
    for i in range(CFG.n_layers):
        expected |= {f"l{i}_{w}_w": 1.0 for w in ("o", "ff1", "ff2")}
        expected |= {f"l{i}_{b}_b": 1 / factor for b in ("o", "ff1", "ff2")}
    for name, ratio in expected.items():
        torch.testing.assert_close(
            wide[name], ratio * small[name], rtol=1e-3, atol=1e-6
        )
    for i in range(CFG.n_layers):
        w, s_ = wide[f"l{i}_qkv_w"], small[f"l{i}_qkv_w"]
        assert (w > s_ * (1 - 1e-4)).all() and (w < factor * s_ * (1 + 1e-4)).all()


def test_embed_width_names_a_bad_width():
    m = _model()
    with pytest.raises(ValueError, match="width"):
        embed_width(m, 12)  # not a multiple of 8
    with pytest.raises(ValueError, match="width"):
        embed_width(m, 4)
    with pytest.raises(TypeError, match="model"):
        embed_width(torch.nn.Linear(2, 2), 16)


def test_the_width_sweep_script_writes_what_the_page_reads(tmp_path, monkeypatch):
    """The script at a tiny config (two widths, a few steps, a small trace set) writes
    a file that width_sweep_results groups by (width, lr), and width_sweep_compared
    keeps the widths whose mean gaps are within the tolerance of the smallest. (The
    file's slice is the stored one's business: tests/chapters/test_stored_runs.py
    reruns it; here it is a stand-in, so that this test trains only the tiny runs.)"""
    from fmlab.chapters.ch5_sgd_noise import (
        WidthSweepConfig,
        width_sweep_compared,
        width_sweep_results,
        width_sweep_run,
    )

    sweep = load_script("ch5_width_sweep")
    monkeypatch.setattr(sweep, "_slice", lambda: {"config": {}, "result": {}})
    out = tmp_path / "w.json"
    args = ["--widths", "16", "32", "--seeds", "2", "--per-job", "2", "--steps", "3"]
    args += ["--trace-examples", "60"]
    assert sweep.main(args + ["--jobs", "1", "--out", str(out)]) == 0
    res = width_sweep_results(out)  # its fingerprint is today's code's
    assert res["meta"]["stored"]["script"] == "scripts/ch5_width_sweep.py"
    assert set(k for k in res if k != "meta") == {(16, 0.01), (32, 0.01)}
    g = res[(16, 0.01)]
    assert g["gap"].shape == (2,) and g["accuracy"].shape == (2, 4)
    assert (g["gap"] > 0).all() and g["trace_head"].shape == (2,)
    for key in ((16, 0.01), (32, 0.01)):  # both embedded at the config's 128
        assert (res[key]["embedding_error"] < 1e-4).all()
        assert res[key]["trace_embedded_head"].shape == (2,)
    both = width_sweep_compared(res, 1e9)
    assert both == [(16, 0.01), (32, 0.01)]
    tight = width_sweep_compared(res, 1e-12)
    assert len(tight) == 1  # only the width with the smallest mean gap
    with pytest.raises(ValueError, match="tolerance"):
        width_sweep_compared(res, 0.0)
    with pytest.raises(ValueError, match="width"):
        width_sweep_run(WidthSweepConfig(), 24, 0, 1)
    with pytest.raises(ValueError, match="widths"):
        WidthSweepConfig(widths=(15,))
    with pytest.raises(FileNotFoundError, match="run scripts/ch5_width_sweep.py"):
        width_sweep_results(tmp_path / "missing.json")


def test_the_stored_width_sweep_is_complete():
    """The stored sweep has every width of the config, six seeds per group, at least
    three widths at equal loss (the page's comparison), and their embedded traces."""
    from fmlab.chapters.ch5_sgd_noise import (
        WidthSweepConfig,
        width_sweep_compared,
        width_sweep_results,
    )

    res = width_sweep_results()
    assert {k[0] for k in res if k != "meta"} >= set(WidthSweepConfig().widths)
    for key, g in res.items():
        if key != "meta":
            assert len(g["gap"]) == 6 and torch.isfinite(g["accuracy"]).all()
    compared = width_sweep_compared(res, res["meta"]["config"]["tolerance"])
    assert len(compared) >= 3
    for key in compared:  # every compared model was measured embedded at d = 128
        g = res[key]
        assert g["trace_embedded_encoder"].shape == g["gap"].shape
        assert (g["embedding_error"] < 1e-4).all()


def _synthetic_sweep():
    """Three (width, lr) groups of three models: two at equal loss, one far from
    it; the embedded encoder trace falls as the accuracy rises (rank correlation -1)."""

    def group(gap, trace, acc):
        t = torch.tensor(trace, dtype=torch.float64)
        return {
            "gap": torch.tensor(gap, dtype=torch.float64),
            "trace_embedded_encoder": t,
            "trace_embedded_head": torch.zeros(3, dtype=torch.float64),
            "accuracy": torch.tensor(acc, dtype=torch.float64)[:, None].repeat(1, 2),
        }

    return {
        "meta": {},
        (16, 0.01): group([0.50, 0.52, 0.51], [9.0, 8.0, 7.0], [0.1, 0.2, 0.3]),
        (32, 0.01): group([0.02, 0.021, 0.019], [3.0, 2.0, 1.0], [0.7, 0.8, 0.9]),
        (64, 0.003): group([0.018, 0.02, 0.02], [6.0, 5.0, 4.0], [0.4, 0.5, 0.6]),
    }


def test_width_sweep_equal_loss_keeps_every_group_near_the_lowest_gap():
    from fmlab.chapters.ch5_sgd_noise import width_sweep_equal_loss

    res = _synthetic_sweep()
    assert width_sweep_equal_loss(res, 0.01) == [(32, 0.01), (64, 0.003)]
    assert len(width_sweep_equal_loss(res, 1.0)) == 3
    with pytest.raises(ValueError, match="tolerance"):
        width_sweep_equal_loss(res, -1.0)


def test_width_trace_transfer_rank_on_monotone_data():
    from fmlab.chapters.ch5_sgd_noise import width_trace_transfer_rank

    res = _synthetic_sweep()
    keys = [(16, 0.01), (32, 0.01), (64, 0.003)]
    r = width_trace_transfer_rank(res, keys, "encoder")
    assert r["pooled"] == pytest.approx(-1.0)
    # replicate i: one model per group; trace and accuracy order agree in each
    assert torch.allclose(
        r["per_replicate"], torch.full((3,), -1.0, dtype=r["per_replicate"].dtype)
    )
    with pytest.raises(ValueError, match="block"):
        width_trace_transfer_rank(res, keys, "decoder")
    with pytest.raises(ValueError, match="groups"):
        width_trace_transfer_rank(res, keys[:1], "encoder")


def test_width_lr_pairs_pairs_the_extreme_rates_of_each_width():
    from fmlab.chapters.ch5_sgd_noise import width_lr_pairs

    keys = [(32, 0.01), (32, 0.003), (64, 0.003), (128, 0.005), (128, 0.003)]
    keys.append((128, 0.004))
    assert width_lr_pairs(keys) == [
        ((32, 0.01), (32, 0.003)),
        ((128, 0.005), (128, 0.003)),
    ]
    assert width_lr_pairs([(16, 0.01)]) == []


def test_embed_width_leaves_the_global_random_state_alone():
    m = _model()
    torch.manual_seed(7)
    before = torch.rand(3)
    torch.manual_seed(7)
    embed_width(m, 2 * CFG.d_model)
    assert torch.equal(torch.rand(3), before)


def test_the_log_coordinate_trace_ignores_a_rescaling_that_keeps_the_function():
    """Queries times c and keys divided by c (weights and biases) leave every logit
    unchanged; the plain encoder trace moves, the trace in log coordinates does not."""
    from fmlab.chapters.ch5_sgd_noise import bert_log_fisher_trace

    model, tok = _model(), _tokens(40)
    pos = torch.randint(0, 6, (40,), generator=torch.Generator().manual_seed(3))
    d = CFG.d_model
    scaled = EnsembleBert(CFG, n_models=2, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for name in ("l0_qkv_w", "l0_qkv_b", "l1_qkv_w", "l1_qkv_b"):
            getattr(scaled, name)[..., :d] *= 10.0
            getattr(scaled, name)[..., d : 2 * d] /= 10.0
        assert torch.allclose(
            scaled.masked_logits(tok, pos), model.masked_logits(tok, pos), atol=1e-5
        )

    def traces(fn, m):
        est = fn(m, tok, pos, generator=torch.Generator().manual_seed(4))
        return est.per_block["encoder"].per_group

    plain = traces(bert_fisher_trace, model), traces(bert_fisher_trace, scaled)
    logs = traces(bert_log_fisher_trace, model), traces(bert_log_fisher_trace, scaled)
    assert (plain[1] / plain[0] - 1).abs().min() > 0.02  # the plain trace moves
    torch.testing.assert_close(logs[1], logs[0], rtol=1e-4, atol=1e-6)


def test_partial_rank_correlation_removes_a_common_cause():
    from fmlab.chapters.ch5_sgd_noise import partial_rank_correlation
    from fmlab.theory.decomposition import spearman

    g = torch.Generator().manual_seed(0)
    z = torch.randn(400, generator=g, dtype=torch.float64)
    x = z + 0.3 * torch.randn(400, generator=g, dtype=torch.float64)
    y = -z + 0.3 * torch.randn(400, generator=g, dtype=torch.float64)
    assert spearman(x, y) < -0.8  # both follow z
    assert abs(partial_rank_correlation(x, y, z)) < 0.15  # nothing else links them
    assert partial_rank_correlation(x, x + 0.01 * z, z) > 0.9
    # explained exactly by z: no residual left to correlate, 0 (not rounding noise)
    assert partial_rank_correlation(z, y, z) == 0.0
    # ties share their average rank: the answer does not depend on their order
    t = torch.tensor([0.5, 0.5, 0.7, 0.7, 0.9, 0.1])
    u, w = torch.tensor([1.0, 2, 3, 4, 5, 6]), torch.tensor([3.0, 1, 2, 6, 5, 4])
    flipped = [1, 0, 3, 2, 4, 5]
    assert partial_rank_correlation(u, t, w) == pytest.approx(
        partial_rank_correlation(u[flipped], t[flipped], w[flipped])
    )
    with pytest.raises(ValueError):
        partial_rank_correlation(x[:3], y[:3], z[:3])


def test_width_family_flatness_never_pools_two_learning_rates():
    from fmlab.chapters.ch5_sgd_noise import width_family_flatness, width_sweep_results

    res = width_sweep_results()
    fam = width_family_flatness(res, res["meta"]["config"]["tolerance"], n_boot=20)
    assert fam, "at least one learning rate has two widths at equal loss"
    for lr, f in fam.items():
        assert {k[1] for k in f["groups"]} == {lr} and len(f["groups"]) >= 2
        assert f["n"] == 6 * len(f["groups"])
        assert -1 <= f["partial"] <= 1 and f["partial_se"] > 0
