"""Tests of the HMM language, the masked LM and the Chapter 5 experiment helpers.

Oracle for the language: brute-force enumeration of every sentence (and every hidden
path) of a tiny HMM. Oracle for the Fisher trace of the masked LM: an explicit sum over
positions and labels with autograd."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from fmlab.chapters.ch5_implicit_bias import (
    GRU_BLOCKS,
    SameLossConfig,
    adversarial_probe_loss,
    kl_gap,
    mlm_fisher_trace,
    mlm_gradient_covariance_trace,
    single_threaded,
)
from fmlab.data.hmm_language import HMMLanguage, HMMLanguageConfig
from fmlab.models.masked_lm import BiGRUMaskedLM, member_losses


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: a second intra-op thread only adds synchronisation (restored
    after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


TINY = HMMLanguageConfig(
    n_blocks=2,
    states_per_block=2,
    length=4,
    stay=0.8,
    cycle_noise=0.2,
    emission_noise=0.3,
    seed=1,
)


def _brute_force(lang):
    """Joint p(x, h) by enumerating every hidden path; returns sentences, p(x), p(h_t |
    x)."""
    c = lang.config
    H, V, T = c.n_states, c.vocab_size, c.length
    seqs = torch.tensor(list(itertools.product(range(V), repeat=T)))
    px = torch.zeros(len(seqs), dtype=torch.float64)
    post = torch.zeros(len(seqs), T, H, dtype=torch.float64)
    steps = torch.arange(T)
    for path in itertools.product(range(H), repeat=T):
        h = torch.tensor(path)
        prior = lang.initial[h[0]] * torch.prod(lang.transition[h[:-1], h[1:]])
        joint = prior * torch.prod(lang.emission[h.expand(len(seqs), -1), seqs], dim=1)
        px += joint
        post[:, steps, h] += joint[:, None]
    return seqs, px, post / px[:, None, None]


@pytest.fixture(scope="module")
def tiny():
    lang = HMMLanguage(TINY)
    return (lang, *_brute_force(lang))


def test_the_language_is_a_distribution_and_the_forward_algorithm_is_exact(tiny):
    lang, seqs, px, _ = tiny
    assert float(px.sum()) == pytest.approx(1.0, abs=1e-12)
    assert torch.allclose(lang.log_likelihood(seqs).exp(), px, atol=1e-14)
    assert torch.allclose(
        lang.transition.sum(1), torch.ones(TINY.n_states, dtype=torch.float64)
    )


def test_masked_conditionals_match_enumeration(tiny):
    lang, seqs, px, _ = tiny
    V, T = TINY.vocab_size, TINY.length
    table = px.reshape([V] * T)
    cond = lang.masked_conditionals(seqs)
    for i, s in enumerate(seqs.tolist()):
        for t in range(T):
            idx = list(s)
            idx[t] = slice(None)
            column = table[tuple(idx)]
            assert torch.allclose(cond[i, t], column / column.sum(), atol=1e-13)


def test_state_posterior_and_block_posterior_match_enumeration(tiny):
    lang, seqs, _, post = tiny
    assert torch.allclose(lang.state_posterior(seqs), post, atol=1e-13)
    blocks = post.reshape(*post.shape[:2], TINY.n_blocks, TINY.states_per_block).sum(-1)
    assert torch.allclose(lang.block_posterior(seqs), blocks, atol=1e-13)


def test_optimal_loss_is_the_exact_conditional_entropy(tiny):
    lang, seqs, px, _ = tiny
    cond = lang.masked_conditionals(seqs)
    # E_x (1/T) sum_t -log p(x_t | x_-t), every sentence weighted by p(x)
    true_tok = cond.gather(-1, seqs[..., None])[..., 0]
    exact = float((px[:, None] * -true_tok.log()).sum() / TINY.length)
    est, se = lang.optimal_mlm_loss(n=20_000, seed=3)
    assert abs(est - exact) < 4 * se
    bayes = float((px * lang.block_posterior(seqs)[:, 2].max(-1).values).sum())
    assert lang.bayes_accuracy(2, n=20_000) == pytest.approx(bayes, abs=0.01)


def test_sampling_follows_the_model(tiny):
    lang, seqs, px, _ = tiny
    tokens, states = lang.sample(40_000, torch.Generator().manual_seed(0))
    V = TINY.vocab_size
    codes = (tokens * V ** torch.arange(TINY.length - 1, -1, -1)).sum(1)
    freq = torch.bincount(codes, minlength=len(seqs)).double() / len(tokens)
    code_of = (seqs * V ** torch.arange(TINY.length - 1, -1, -1)).sum(1)
    assert (freq[code_of] - px).abs().max() < 0.01
    assert states.max() < TINY.n_states


def test_tied_emissions_hide_the_block_from_token_counts():
    lang = HMMLanguage(HMMLanguageConfig())
    S = lang.config.states_per_block
    for k in range(1, lang.config.n_blocks):
        assert torch.equal(lang.emission[:S], lang.emission[k * S : (k + 1) * S])
    succ = [
        tuple(
            lang.transition[k * S : (k + 1) * S, k * S : (k + 1) * S].argmax(1).tolist()
        )
        for k in range(2)
    ]
    assert succ[0] != succ[1]  # the blocks differ only in their cycles


def test_untied_emissions_show_the_block_in_every_token_and_stay_exact():
    cfg = HMMLanguageConfig(**{**TINY.__dict__, "tied": False})
    lang = HMMLanguage(cfg)
    assert cfg.vocab_size == cfg.n_states
    assert torch.equal(lang.emission.argmax(1), torch.arange(cfg.n_states))
    assert torch.allclose(
        lang.emission.sum(1), torch.ones(cfg.n_states, dtype=torch.float64)
    )
    seqs, px, _ = _brute_force(lang)
    assert float(px.sum()) == pytest.approx(1.0, abs=1e-12)
    T = cfg.length
    for t in range(T):  # p(x_t | x_-t) by summing the joint over x_t
        rest = [j for j in range(T) if j != t]
        joint = px.reshape([cfg.vocab_size] * T)
        cond = joint / joint.sum(dim=t, keepdim=True)
        want = cond.permute(*rest, t).reshape(-1, cfg.vocab_size)
        got = lang.masked_conditionals(seqs)[:, t]
        idx = torch.stack([seqs[:, j] for j in rest], 1)
        flat = torch.zeros(len(seqs), dtype=torch.long)
        for j in range(T - 1):
            flat = flat * cfg.vocab_size + idx[:, j]
        assert torch.allclose(got, want[flat], atol=1e-12)


def test_language_arguments_are_validated():
    with pytest.raises(ValueError, match="stay"):
        HMMLanguageConfig(stay=1.5)
    with pytest.raises(TypeError, match="n_blocks"):
        HMMLanguageConfig(n_blocks=2.0)
    lang = HMMLanguage(TINY)
    with pytest.raises(ValueError, match="tokens"):
        lang.masked_conditionals(torch.full((2, TINY.length), 99))
    with pytest.raises(ValueError, match="task"):
        lang.bayes_accuracy(0, task="colour")
    with pytest.raises(TypeError, match="tied"):
        HMMLanguageConfig(tied=1)


# -- the masked language model -----------------------------------------------------
def test_the_prediction_at_t_never_sees_token_t():
    model = BiGRUMaskedLM(
        5, hidden=4, d_ff=6, n_models=2, generator=torch.Generator().manual_seed(0)
    )
    x = torch.randint(5, (3, 6), generator=torch.Generator().manual_seed(1))
    base = model(x)
    for t in range(6):
        y = x.clone()
        y[:, t] = (y[:, t] + 1) % 5
        out = model(y)
        assert torch.allclose(out[:, :, t], base[:, :, t], atol=1e-6)
        others = [s for s in range(6) if s != t]
        assert not torch.allclose(out[:, :, others], base[:, :, others])


def test_ensemble_members_are_independent_models():
    model = BiGRUMaskedLM(
        5, hidden=4, d_ff=6, n_models=3, generator=torch.Generator().manual_seed(0)
    )
    x = torch.randint(5, (4, 6), generator=torch.Generator().manual_seed(1))
    for e in range(3):
        assert torch.allclose(model.member(e)(x)[0], model(x)[e], atol=1e-6)
    losses = member_losses(model, x)
    losses[1].backward()
    assert model.w2.grad[0].abs().max() == 0 and model.w2.grad[1].abs().max() > 0
    with pytest.raises(ValueError, match="tokens"):
        model(torch.zeros(2, 4, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="tokens"):
        member_losses(model, torch.full((2, 6), 7))


def test_the_gru_follows_its_equations_step_by_step():
    """States and logits against a plain loop over the module docstring's equations
    (one member, one sentence at a time)."""
    model = BiGRUMaskedLM(
        5, hidden=4, d_ff=6, n_models=2, generator=torch.Generator().manual_seed(0)
    )
    x = torch.randint(5, (3, 6), generator=torch.Generator().manual_seed(1))
    states, logits = model.states(x), model(x)
    for e in range(2):
        for d, order in ((0, range(6)), (1, range(5, -1, -1))):
            h = model.h0[e, d, 0]
            for t in order:
                a, g = (
                    model.emb[e, d, x[:, t]],
                    h @ model.rec[e, d] + model.rec_bias[e, d],
                )
                r, z = torch.sigmoid(a[:, :8] + g[..., :8]).chunk(2, -1)
                h = (1 - z) * torch.tanh(a[:, 8:] + r * g[..., 8:]) + z * h
                assert torch.allclose(states[e, d, :, t], h, atol=1e-6)
        h0 = model.h0[e].expand(2, 3, 4)
        before = torch.cat([h0[0, :, None], states[e, 0, :, :-1]], 1)
        after = torch.cat([states[e, 1, :, 1:], h0[1, :, None]], 1)
        u = F.gelu(torch.cat([before, after], -1) @ model.w1[e] + model.b1[e])
        assert torch.allclose(logits[e], u @ model.w2[e] + model.b2[e], atol=1e-6)


def test_table_rows_are_the_one_hot_product_to_the_last_bit():
    from torch.func import jvp, vmap

    from fmlab.models.masked_lm import _TableRows

    g = torch.Generator().manual_seed(0)
    table = torch.randn(3, 7, 5, dtype=torch.float64, generator=g, requires_grad=True)
    idx = torch.randint(7, (3, 11), generator=g)
    onehot = (idx[..., None] == torch.arange(7)).double()
    rows, product = _TableRows.apply(table, idx), torch.bmm(onehot, table)
    assert torch.equal(rows, product)
    w = torch.randn(3, 11, 5, dtype=torch.float64, generator=g)
    (g1,) = torch.autograd.grad((rows * w).sum(), table)
    (g2,) = torch.autograd.grad((product * w).sum(), table)
    assert torch.equal(g1, g2)
    assert torch.autograd.gradcheck(_TableRows.apply, (table, idx))
    assert torch.autograd.gradgradcheck(_TableRows.apply, (table, idx))
    v = torch.randn_like(table)
    _, t1 = jvp(lambda t: _TableRows.apply(t, idx), (table.detach(),), (v,))
    assert torch.equal(t1, torch.bmm(onehot, v))
    tables = torch.stack([table.detach(), v])  # vmap over a batch of tables
    per = vmap(lambda t: _TableRows.apply(t, idx))(tables)
    assert torch.equal(per, torch.stack([product.detach(), torch.bmm(onehot, v)]))


def test_mlm_fisher_trace_matches_a_sum_over_positions_and_labels():
    torch.manual_seed(0)
    model = BiGRUMaskedLM(
        3, hidden=3, d_ff=4, n_models=2, generator=torch.Generator().manual_seed(0)
    )
    x = torch.randint(3, (4, 3), generator=torch.Generator().manual_seed(1))
    n, T, V = 4, 3, 3
    exact = torch.zeros(2)
    exact_blocks = {b: torch.zeros(2) for b in GRU_BLOCKS}
    for e in range(2):
        member = model.member(e)
        probs = torch.softmax(member(x)[0], -1).detach()
        for i in range(n):
            for t in range(T):
                for y in range(V):
                    member.zero_grad()
                    F.log_softmax(member(x[i : i + 1])[0, 0, t], -1)[y].backward()
                    grads = {k: p.grad for k, p in member.named_parameters()}
                    w = probs[i, t, y] / (n * T)
                    for b, names in GRU_BLOCKS.items():
                        sq = sum(float(grads[k].pow(2).sum()) for k in names)
                        exact_blocks[b][e] += w * sq
                        exact[e] += w * sq
    # the same four sentences repeated: 3000 independent label draws each, in one vmap
    est = mlm_fisher_trace(
        model,
        x.repeat(3000, 1),
        generator=torch.Generator().manual_seed(2),
        blocks=GRU_BLOCKS,
    )
    assert torch.all((est.per_group - exact).abs() < 4 * est.per_group_stderr)
    assert torch.allclose(est.per_group, exact, rtol=0.05)
    for b, e in est.per_block.items():
        assert torch.all((e.per_group - exact_blocks[b]).abs() < 4 * e.per_group_stderr)


def test_gradient_covariance_trace_matches_explicit_gradients():
    model = BiGRUMaskedLM(
        3, hidden=3, d_ff=4, n_models=1, generator=torch.Generator().manual_seed(0)
    )
    x = torch.randint(3, (3, 3), generator=torch.Generator().manual_seed(1))
    grads = []
    for i in range(3):
        for t in range(3):
            model.zero_grad()
            (-F.log_softmax(model(x[i : i + 1])[0, 0, t], -1)[x[i, t]]).backward()
            grads.append(
                torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
            )
    G = torch.stack(grads)
    expected = float((G - G.mean(0)).pow(2).sum(1).mean())
    assert float(mlm_gradient_covariance_trace(model, x)[0]) == pytest.approx(
        expected, rel=1e-5
    )


def test_kl_gap_is_cross_entropy_minus_entropy():
    lang = HMMLanguage(TINY)
    model = BiGRUMaskedLM(
        TINY.vocab_size,
        hidden=3,
        d_ff=4,
        n_models=2,
        generator=torch.Generator().manual_seed(0),
    )
    x, _ = lang.sample(50, torch.Generator().manual_seed(0))
    p = lang.masked_conditionals(x)
    logq = F.log_softmax(model(x).double(), -1).detach()
    ce = -(p * logq).sum(-1).mean((1, 2))
    ent = -(p * p.log()).sum(-1).mean()
    assert torch.allclose(kl_gap(model, x, p), ce - ent, atol=1e-12)
    assert bool((kl_gap(model, x, p) > 0).all())


# -- the adversary's probe ----------------------------------------------------------
def test_adversarial_loss_is_differentiable_and_per_member():
    model = BiGRUMaskedLM(
        5, hidden=3, d_ff=4, n_models=2, generator=torch.Generator().manual_seed(0)
    )
    x = torch.randint(5, (16, 6), generator=torch.Generator().manual_seed(1))
    labels = torch.randint(2, (16,), generator=torch.Generator().manual_seed(2))
    loss = adversarial_probe_loss(model, x, labels, 2)
    assert loss.shape == (2,) and bool(torch.isfinite(loss).all())
    loss.sum().backward()
    assert model.emb.grad.abs().sum() > 0


def test_single_threaded_restores_the_thread_count_and_configs_are_checked():
    torch.set_num_threads(2)  # the fixture restores the original count afterwards
    with single_threaded():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="n_checkpoints"):
        SameLossConfig(continue_steps=100, n_checkpoints=3)
    with pytest.raises(ValueError, match="position"):
        SameLossConfig(position=10)


def test_lookup_table_reads_the_block_only_when_emissions_are_untied():
    from fmlab.chapters.ch5_implicit_bias import lookup_table_transfer

    kw = dict(position=4, n_train=1500, n_test=1500, seed=3)
    tied = lookup_table_transfer(HMMLanguageConfig(emission_noise=0.05), **kw)
    untied = lookup_table_transfer(
        HMMLanguageConfig(emission_noise=0.05, tied=False), **kw
    )
    for r in (tied, untied):  # a linear probe cannot beat the Bayes rule (up to noise)
        assert 0.0 <= r["lookup"] <= 1.0
        assert r["posterior"] <= r["bayes"] + 0.03
    assert tied["lookup"] < 0.6 < tied["bayes"]
    assert untied["lookup"] > untied["bayes"] - 0.05
    with pytest.raises(TypeError, match="language"):
        lookup_table_transfer("hmm", position=0)


def test_tied_conditionals_depend_on_the_posterior_only_through_its_block_marginal():
    lang = HMMLanguage(HMMLanguageConfig())
    x, _ = lang.sample(20, torch.Generator().manual_seed(0))
    q = lang.masked_state_posterior(x)  # (n, T, H)
    K, S = lang.config.n_blocks, lang.config.states_per_block
    marginal = q.reshape(*q.shape[:2], K, S).sum(2)  # sum the block out
    E0 = lang.emission[:S]
    assert torch.allclose(lang.masked_conditionals(x), marginal @ E0, atol=1e-12)


def test_block_trace_comparison_agrees_with_its_exact_reference():
    from fmlab.chapters.ch5_implicit_bias import block_trace_comparison

    r = block_trace_comparison(hidden=2, sentences=6, train_steps=3, probes=400)
    h, V = 2, 5
    gru = 2 * V * 3 * h + 2 * h * 3 * h + 2 * 3 * h + 2 * h
    head = 2 * h * 2 * h + 2 * h + 2 * h * V + V
    assert r["n_params"] == gru + head
    for b in ("encoder", "head"):
        assert abs(r["hutchinson"][b] - r["exact"][b]) < 4 * r["hutchinson_se"][b]
