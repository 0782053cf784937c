"""Tests for Chapter 6's transformer language model (fmlab.models.gpt) and the pieces of
fmlab.chapters.ch6_icl around it. Oracles: attention written out by hand with an
explicit causal
mask, perturbation of future tokens, the schedule of fmlab.train.lr_factor as the
optimiser follows it, and accuracies recomputed from the stored predictions (the
schedule's closed forms are tested in tests/lib/test_train_schedule.py)."""

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from fmlab import make_generator, seed_everything
from fmlab.chapters.ch6_icl import (
    GINCPretrainConfig,
    build_model,
    document_losses,
    evaluate_in_context,
    gain_per_seed,
    in_context_grid,
    load_ginc_lm,
    next_token_logits,
    pretrain_ginc_lm,
    prompt_example_losses,
)
from fmlab.data.ginc import (
    DELIMITER,
    GINC,
    assemble_prompts,
    ginc_bayes_predictor,
    ginc_preset,
    prompt_length,
)
from fmlab.models.gpt import CausalLM, GPTConfig
from fmlab.train import lr_factor


@pytest.fixture(scope="module")
def tiny():
    return GINC(ginc_preset("tiny"))


def _reference_forward(model: CausalLM, tokens: torch.Tensor) -> torch.Tensor:
    """The same network with attention written out: scores, a -inf mask, softmax."""
    c = model.config
    T = tokens.shape[1]
    h = model.tok(tokens) + model.pos.weight[:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for block in model.blocks:
        x = block.ln1(h)
        B, _, d = x.shape
        q, k, v = block.attn.qkv(x).split(d, dim=-1)
        dh = d // c.n_heads
        q, k, v = (z.view(B, T, c.n_heads, dh).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(dh)
        scores = scores.masked_fill(~mask, float("-inf"))
        att = torch.softmax(scores, dim=-1) @ v
        h = h + block.attn.proj(att.transpose(1, 2).reshape(B, T, d))
        h = h + block.out(F.gelu(block.fc(block.ln2(h))))
    return model.decoder(model.ln_f(h))


def test_causal_lm_matches_attention_written_out():
    model = CausalLM(
        GPTConfig(vocab_size=11, max_len=9, d_model=16, n_layers=2, n_heads=4), seed=3
    ).eval()
    tokens = torch.randint(11, (5, 9), generator=make_generator(1))
    with torch.no_grad():
        assert torch.allclose(
            model(tokens), _reference_forward(model, tokens), atol=1e-5
        )


def test_causal_lm_last_logits_are_the_last_position_of_forward():
    model = CausalLM(
        GPTConfig(vocab_size=11, max_len=9, d_model=16, n_layers=3, n_heads=4), seed=5
    ).eval()
    for T in (1, 4, 9):
        tokens = torch.randint(11, (6, T), generator=make_generator(T))
        with torch.no_grad():
            last = model.last_logits(tokens)
            assert last.shape == (6, 11)
            torch.testing.assert_close(last, model(tokens)[:, -1], atol=1e-5, rtol=0)
    assert next_token_logits(model, tokens, batch_size=4).shape == (6, 11)
    with pytest.raises(ValueError, match="at least one position"):
        model.last_logits(torch.zeros(2, 0, dtype=torch.long))


def test_causal_lm_never_looks_ahead():
    model = CausalLM(GPTConfig(vocab_size=7, max_len=8, d_model=8, n_heads=2)).eval()
    x = torch.randint(7, (3, 8), generator=make_generator(2))
    y = x.clone()
    y[:, 5] = (y[:, 5] + 1) % 7
    with torch.no_grad():
        a, b = model(x), model(y)
    assert a.shape == (3, 8, 7)
    assert torch.equal(a[:, :5], b[:, :5]) and not torch.allclose(a[:, 5:], b[:, 5:])


def test_causal_lm_initialisation_is_seeded_and_scaled():
    c = GPTConfig(vocab_size=50, max_len=16, d_model=64, n_layers=4, n_heads=4)
    a, b, other = CausalLM(c, seed=0), CausalLM(c, seed=0), CausalLM(c, seed=1)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["tok.weight"], other.state_dict()["tok.weight"])
    assert float(a.blocks[0].fc.weight.detach().std()) == pytest.approx(0.02, rel=0.05)
    assert float(a.blocks[0].out.weight.detach().std()) == pytest.approx(
        0.02 / math.sqrt(8), rel=0.05
    )
    assert torch.equal(a.blocks[0].fc.bias, torch.zeros(256))


def test_dropout_acts_in_training_mode_only():
    c = GPTConfig(vocab_size=9, max_len=6, d_model=16, n_heads=2, dropout=0.5)
    model, plain = CausalLM(c, seed=4), CausalLM(replace(c, dropout=0.0), seed=4)
    x = torch.randint(9, (4, 6), generator=make_generator(5))
    with torch.no_grad():
        assert torch.equal(model.eval()(x), plain.eval()(x))
        seed_everything(0)
        assert not torch.allclose(model.train()(x), plain.eval()(x))


def test_causal_lm_rejects_prompts_longer_than_its_window():
    model = CausalLM(GPTConfig(vocab_size=5, max_len=4, d_model=8, n_heads=2))
    assert model.context_window == 4
    with pytest.raises(ValueError, match="context window"):
        model(torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="tokens"):
        model(torch.full((1, 3), 5))
    with pytest.raises(ValueError, match="n_heads"):
        GPTConfig(vocab_size=5, d_model=10, n_heads=4)
    with pytest.raises(TypeError, match="config"):
        CausalLM({"vocab_size": 5})


def test_prompt_length_is_the_length_of_an_assembled_prompt(tiny):
    for n, k in [(0, 2), (0, 5), (3, 3), (8, 5)]:
        pr = tiny.sample_prompts(2, n, k, make_generator(n + k))
        assert pr.tokens.shape[1] == prompt_length(n, k)
        assert assemble_prompts(pr.examples).shape[1] == prompt_length(n, k)
    with pytest.raises(ValueError, match="example_length"):
        prompt_length(2, 1)


def _tiny_pretraining(tiny, steps):
    """A transformer pretraining config small enough for a unit test."""
    return GINCPretrainConfig(
        world=tiny.config,
        width=8,
        n_heads=2,
        steps=steps,
        warmup=1,
        batch_size=4,
        window=12,
    )


def test_transformer_pretraining_is_cached_and_evaluated_within_its_window(
    tmp_path, monkeypatch, tiny
):
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FMLAB_PROGRESS", "0")
    cfg = _tiny_pretraining(tiny, steps=4)
    first = pretrain_ginc_lm(cfg)
    assert first["losses"].shape == (4,) and math.isfinite(first["val_loss"])
    second = pretrain_ginc_lm(cfg)
    assert all(
        torch.equal(first["state_dict"][k], second["state_dict"][k])
        for k in first["state_dict"]
    )
    model = load_ginc_lm(cfg)
    assert isinstance(model, CausalLM) and model.context_window == 12
    assert isinstance(build_model(GINCPretrainConfig(arch="lstm")), torch.nn.Module)
    # prompts of 2 (k + 1) + k - 1 = 11 tokens fit a window of 12; at k = 4 they do not
    grid = in_context_grid(
        {"lm": model}, tiny, (0, 2), (3,), n_prompts=20, seed=0, epsilon=0.1
    )
    pr = tiny.sample_prompts(20, 2, 3, make_generator(3))
    assert next_token_logits(model, pr.tokens).shape == (20, tiny.config.vocab_size)
    entry = grid.predictions[(2, 3)]
    assert grid.accuracy["lm"][1, 0] == pytest.approx(
        float((entry["lm"] == entry["labels"]).double().mean())
    )
    with pytest.raises(ValueError, match="context window"):
        in_context_grid(
            {"lm": model}, tiny, (0, 2), (4,), n_prompts=5, seed=0, epsilon=0.1
        )


def test_gain_per_seed_is_the_paired_difference_of_accuracies(tiny):
    grids = [
        in_context_grid(
            None, tiny, (0, 1, 3), (3, 4), n_prompts=40, seed=s, epsilon=0.1
        )
        for s in range(3)
    ]
    want = np.array(
        [float(g.bayes_accuracy[2, 1] - g.bayes_accuracy[0, 1]) for g in grids]
    )
    assert np.allclose(gain_per_seed(grids, 4), want)
    assert np.allclose(
        gain_per_seed(grids, 3, n_from=1, n_to=3),
        [float(g.bayes_accuracy[2, 0] - g.bayes_accuracy[1, 0]) for g in grids],
    )
    with pytest.raises(ValueError, match="k must be one of"):
        gain_per_seed(grids, 5)
    with pytest.raises(ValueError, match="n_to"):
        gain_per_seed(grids, 3, n_to=2)
    with pytest.raises(ValueError, match="name"):
        gain_per_seed(grids, 3, name="lm")
    with pytest.raises(TypeError, match="grids"):
        gain_per_seed([], 3)


def test_pretrain_config_validates_its_arguments():
    with pytest.raises(ValueError, match="arch"):
        GINCPretrainConfig(arch="rnn")
    with pytest.raises(ValueError, match="width"):
        GINCPretrainConfig(width=30, n_heads=4)
    with pytest.raises(ValueError, match="warmup"):
        GINCPretrainConfig(steps=10, warmup=11)
    assert GINCPretrainConfig().tokens_seen == 1300 * 64 * 64


def test_evaluation_is_cached_and_round_trips(tmp_path, monkeypatch, tiny):
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FMLAB_PROGRESS", "0")
    cfg = _tiny_pretraining(tiny, steps=3)
    kw = dict(seeds=(1, 2), n_prompts=15, epsilon=0.1)
    first = evaluate_in_context(cfg, (0, 2), (3,), **kw)
    assert len(list(tmp_path.glob("ginc_icl-*.pt"))) == 1
    again = evaluate_in_context(cfg, (0, 2), (3,), **kw)
    direct = in_context_grid(
        {"transformer": load_ginc_lm(cfg)},
        tiny,
        (0, 2),
        (3,),
        n_prompts=15,
        seed=2,
        epsilon=0.1,
    )
    for a, b in ((first[1], again[1]), (first[1], direct)):
        assert torch.equal(a.bayes_accuracy, b.bayes_accuracy)
        assert torch.equal(a.accuracy["transformer"], b.accuracy["transformer"])
        assert all(
            torch.equal(
                a.predictions[key]["transformer"], b.predictions[key]["transformer"]
            )
            for key in a.predictions
        )
    bayes_only = evaluate_in_context(cfg, (0, 1), (4,), model_ks=(), **kw)
    assert bayes_only[0].accuracy == {} and bayes_only[0].ks == (4,)
    with pytest.raises(ValueError, match="model_ks"):
        in_context_grid(
            {"t": load_ginc_lm(cfg)},
            tiny,
            (0,),
            (3,),
            n_prompts=2,
            seed=0,
            epsilon=0.1,
            model_ks=(5,),
        )


# -- the per-position diagnostic ------------------------------------------------------


class _FixedLM(torch.nn.Module):
    """A 'language model' whose next-token law ignores the context: log-probabilities
    ``logp`` (V,) at every position."""

    def __init__(self, logp: torch.Tensor):
        super().__init__()
        self.register_buffer("logp", logp.float())

    def forward(self, tokens):
        return self.logp.expand(*tokens.shape, -1)


def _brute_mixture(tokens, T, emit, mu):
    """p(o_{1:t} | c) summed over all hidden paths: (B, C)."""
    B, t = tokens.shape
    C, H, _ = T.shape
    out = torch.zeros(B, C, dtype=torch.float64)
    for b in range(B):
        for c in range(C):
            for path in itertools.product(range(H), repeat=t):
                p = mu[c, path[0]] * emit[path[0], tokens[b, 0]]
                for s in range(1, t):
                    p = p * T[c, path[s - 1], path[s]] * emit[path[s], tokens[b, s]]
                out[b, c] += p
    return out


def test_document_losses_match_enumeration_and_a_fixed_model():
    # a tiny world whose entities move (in the preset's world they never do)
    tiny = GINC(ginc_preset("tiny", entity_stickiness=0.5, seed=5))
    L, n_docs, seed = 4, 6, 3
    V = tiny.config.vocab_size
    q = torch.softmax(torch.arange(V, dtype=torch.float64) / 3, 0)
    res = document_losses(
        _FixedLM(q.log()), tiny, L, n_documents=n_docs, seed=seed, skip=2
    )
    docs = tiny.sample_documents(n_docs, L, make_generator(seed))  # the same draw
    seen = tiny.seen_concepts
    T, emit, mu = (
        tiny.transition_matrices(seen),
        tiny.emission_matrix(),
        tiny.start_probs,
    )
    joint = [
        _brute_mixture(docs.tokens[:, :t], T, emit, mu[seen]) for t in range(1, L + 1)
    ]
    mix = torch.stack([j.mean(1).log() for j in joint], 1)  # (B, L)
    own = torch.stack([j[torch.arange(n_docs), docs.concepts].log() for j in joint], 1)
    assert res.bayes.shape == res.oracle.shape == res.model.shape == (L - 1,)
    assert torch.allclose(res.bayes, -(mix[:, 1:] - mix[:, :-1]).mean(0), rtol=1e-9)
    assert torch.allclose(res.oracle, -(own[:, 1:] - own[:, :-1]).mean(0), rtol=1e-9)
    expect = -q.log()[docs.tokens[:, 1:]].mean(0)
    assert torch.allclose(res.model, expect, rtol=1e-5)
    m = res.mean(2, 3)  # positions 2..3: the first two entries
    assert m["bayes"] == pytest.approx(float(res.bayes[:2].mean()))
    with pytest.raises(ValueError, match="last"):
        res.mean(3, 2)
    # entity changes, counted by hand from the hidden states (skip = 2: predictions
    # of tokens 3 and 4, 1-based)
    ent = (docs.states // tiny.config.n_properties).tolist()
    after, steady = [], []
    for b in range(n_docs):
        for t in (2, 3):  # 0-based index of the predicted token
            loss = -q.log()[docs.tokens[b, t]].item()
            if ent[b][t - 1] != ent[b][t - 2]:
                after.append(loss)
            if ent[b][t] == ent[b][t - 1] == ent[b][t - 2]:
                steady.append(loss)
    assert after and steady
    for got, want in ((res.after_change, after), (res.steady, steady)):
        assert got["share"] == pytest.approx(len(want) / (2 * n_docs))
        assert got["model"] == pytest.approx(sum(want) / len(want), rel=1e-5)


def test_prompt_example_losses_against_the_predictor_and_token_counts(tiny):
    n, k, B, seed, eps = 2, 3, 5, 7, 0.05
    V = tiny.config.vocab_size
    # delimiter with probability 1/2, every other token 1 / (2 (V - 1))
    logp = torch.full((V,), math.log(0.5 / (V - 1)), dtype=torch.float64)
    logp[DELIMITER] = math.log(0.5)
    res = prompt_example_losses(
        _FixedLM(logp), tiny, n, k, n_prompts=B, seed=seed, epsilon=eps
    )
    pr = tiny.sample_prompts(B, n, k, make_generator(seed))
    full = torch.cat([pr.tokens, pr.examples[:, -1, -1:]], 1)
    assert full.shape[1] == (n + 1) * (k + 1) - 1
    # the Bayes losses from the posterior predictive after every prefix (the sparse
    # forward algorithm of ginc_bayes_predictor, a separate code path)
    per_token = torch.stack(
        [
            -ginc_bayes_predictor(tiny, full[:, :t], eps)
            .predictive.gather(1, full[:, t : t + 1])
            .squeeze(1)
            .log()
            for t in range(1, full.shape[1])
        ],
        1,
    )  # (B, L - 1), entry t - 1 predicts token t
    for i in range(n + 1):
        cols = [i * (k + 1) + j - 1 for j in range(1, k)]  # tokens 2..k of example i
        assert res.bayes[i].item() == pytest.approx(per_token[:, cols].mean().item())
        ex = pr.examples[:, i, 1:]
        expect = -logp[ex].mean().item()
        assert res.model[i].item() == pytest.approx(expect, rel=1e-5)
    # boundary tokens: n delimiters (log 2 each) and n first tokens, never delimiters
    assert (pr.examples[:, 1:, 0] != DELIMITER).all()
    expect_b = 0.5 * (math.log(2) - math.log(0.5 / (V - 1)))
    assert res.model_boundary == pytest.approx(expect_b, rel=1e-5)
    model = CausalLM(GPTConfig(vocab_size=V, max_len=8, d_model=8, n_heads=2))
    with pytest.raises(ValueError, match="context window"):
        prompt_example_losses(model, tiny, n, k, n_prompts=2, seed=0, epsilon=eps)
    with pytest.raises(ValueError, match="epsilon"):
        prompt_example_losses(model, tiny, 1, 2, n_prompts=2, seed=0, epsilon=0.0)


def test_pretraining_follows_the_librarys_schedule(monkeypatch, tiny):
    """The rate the optimiser uses at every step is ``lr`` times
    :func:`fmlab.train.lr_factor` (the cosine to ``lr / 10``, or the line to 0),
    held at the last step's after it."""
    from fmlab.chapters import ch6_icl

    seen = []

    class Recording(torch.optim.lr_scheduler.LambdaLR):
        def step(self, *args, **kwargs):
            super().step(*args, **kwargs)
            seen.append(self.get_last_lr()[0] / self.base_lrs[0])

    monkeypatch.setattr(torch.optim.lr_scheduler, "LambdaLR", Recording)
    for schedule, shape, floor in (
        ("cosine", "warmup-then-cosine", 0.1),
        ("linear", "linear", 0.0),
    ):
        seen.clear()
        cfg = replace(_tiny_pretraining(tiny, steps=6), warmup=2, schedule=schedule)
        ch6_icl._train(cfg)
        expected = [
            lr_factor(min(s, 5), steps=6, warmup=2, shape=shape, floor=floor)
            for s in range(7)
        ]
        assert seen == pytest.approx(expected, rel=1e-12)


def test_the_chapter_draws_its_documents_with_jumps_from_the_data_layer():
    from fmlab.chapters import ch6_icl
    from fmlab.data import ginc

    assert ch6_icl.smoothed_documents is ginc.smoothed_documents


def test_pretraining_inside_documents_with_jumps(tmp_path, monkeypatch, tiny):
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FMLAB_PROGRESS", "0")
    cfg = replace(
        _tiny_pretraining(tiny, steps=3),
        schedule="linear",
        corpus="documents",
        corpus_eps=0.05,
    )
    run = pretrain_ginc_lm(cfg)
    assert run["losses"].shape == (3,) and math.isfinite(run["val_loss"])
    with pytest.raises(ValueError, match="corpus_eps"):
        replace(cfg, corpus="stream")
    with pytest.raises(ValueError):
        replace(cfg, schedule="step")


def test_bayes_on_prompts_is_remembered_only_for_the_same_prompts(tiny):
    from fmlab.chapters.ch6_icl import _bayes_on_prompts

    pr = tiny.sample_prompts(30, 2, 3, make_generator(8))
    first = _bayes_on_prompts(tiny, pr.tokens, 0.1, "seen")
    assert _bayes_on_prompts(tiny, pr.tokens.clone(), 0.1, "seen") is first
    fresh = ginc_bayes_predictor(tiny, pr.tokens, 0.1, concepts="seen")
    assert torch.equal(first.prediction, fresh.prediction)
    other = _bayes_on_prompts(tiny, pr.tokens, 0.2, "seen")
    assert other is not first
    changed = pr.tokens.clone()
    changed[0, 0] = (changed[0, 0] + 1) % tiny.config.vocab_size
    assert _bayes_on_prompts(tiny, changed, 0.1, "seen") is not first


def test_bayes_on_prompts_never_serves_another_seed_offsets_world(monkeypatch):
    # the same config draws other HMMs at another offset: the same tokens must not hit
    from fmlab.chapters.ch6_icl import _bayes_on_prompts

    world = GINC(ginc_preset("tiny"))
    tokens = world.sample_prompts(20, 2, 3, make_generator(9)).tokens
    first = _bayes_on_prompts(world, tokens, 0.1, "seen")
    monkeypatch.setenv("FMLAB_SEED_OFFSET", "5")
    other = GINC(ginc_preset("tiny"))
    again = _bayes_on_prompts(other, tokens, 0.1, "seen")
    assert again is not first
    fresh = ginc_bayes_predictor(other, tokens, 0.1, concepts="seen")
    torch.testing.assert_close(
        again.posterior, fresh.posterior, rtol=0, atol=0, equal_nan=True
    )
