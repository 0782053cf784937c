"""Tests for GINC (fmlab.data.ginc), exact Bayesian ICL (fmlab.theory.bayes_icl),
the LSTM and the in-context evaluation (fmlab.chapters.ch6_icl). Oracles: brute-force
enumeration
of every hidden path (and every token sequence) of tiny HMMs, an independent scaled
forward algorithm, empirical transition counts, and structural properties."""

import itertools
import math

import pytest
import torch
from torch import nn

from fmlab import make_generator, seed_everything
from fmlab.chapters.ch6_icl import (
    GINCPretrainConfig,
    _nested_last_logits,
    bayes_pretraining_loss,
    in_context_grid,
    load_ginc_lm,
    next_token_logits,
    order_sensitivity,
    pretrain_ginc_lm,
    random_concept_accuracy,
)
from fmlab.data.ginc import (
    DELIMITER,
    GINC,
    GINC_PRESETS,
    GINCConfig,
    assemble_prompts,
    distinguishability,
    ginc_bayes_predictor,
    ginc_preset,
    permutation_mixture,
    smoothed_documents,
)
from fmlab.models.lstm import LSTMLanguageModel
from fmlab.theory.bayes_icl import (
    bayes_posterior_predictive,
    forward_log_alpha,
    forward_log_alpha_deterministic,
    log_likelihood,
    log_likelihood_given_state,
    next_token_distribution,
    prefix_log_likelihoods,
    smooth_transitions,
)


def random_hmm(C=2, H=3, V=3, seed=0, zeros=False):
    g = make_generator(seed)
    T = torch.rand(C, H, H, generator=g, dtype=torch.float64)
    if zeros:
        T = T * (torch.rand(C, H, H, generator=g, dtype=torch.float64) > 0.4)
        T[:, :, 0] += 0.05  # keep every row non-empty
    T = T / T.sum(2, keepdim=True)
    emit = torch.rand(C, H, V, generator=g, dtype=torch.float64)
    emit = emit / emit.sum(2, keepdim=True)
    mu = torch.rand(C, H, generator=g, dtype=torch.float64)
    mu = mu / mu.sum(1, keepdim=True)
    return T, emit, mu


def brute_joint(tokens, T, emit, mu):
    """p(o_{1:t} | theta) by summing over all H^t hidden paths: (B, C)."""
    B, t = tokens.shape
    C, H, _ = T.shape
    out = torch.zeros(B, C, dtype=torch.float64)
    for b in range(B):
        for c in range(C):
            for path in itertools.product(range(H), repeat=t):
                p = mu[c, path[0]] * emit[c, path[0], tokens[b, 0]]
                for s in range(1, t):
                    p = p * T[c, path[s - 1], path[s]] * emit[c, path[s], tokens[b, s]]
                out[b, c] += p
    return out


# -- exact inference against brute force ---------------------------------------------


def test_forward_likelihood_matches_enumeration_of_all_hidden_paths():
    T, emit, mu = random_hmm(C=2, H=3, V=3, seed=1)
    tokens = torch.randint(3, (4, 5), generator=make_generator(2))
    brute = brute_joint(tokens, T, emit, mu)
    assert torch.allclose(
        log_likelihood(tokens, T, emit, mu).exp(), brute, rtol=1e-10, atol=0
    )
    prefixes = prefix_log_likelihoods(tokens, T, emit, mu).exp()
    for t in range(1, 6):
        assert torch.allclose(
            prefixes[:, :, t - 1], brute_joint(tokens[:, :t], T, emit, mu), rtol=1e-10
        )


def test_forward_alpha_is_joint_of_observations_and_last_state():
    T, emit, mu = random_hmm(C=2, H=3, V=2, seed=3)
    tokens = torch.randint(2, (2, 4), generator=make_generator(4))
    la = forward_log_alpha(tokens, T, emit, mu).exp()  # (B, C, H)
    for b, c, h in itertools.product(range(2), range(2), range(3)):
        total = 0.0
        for path in itertools.product(range(3), repeat=4):
            if path[-1] != h:
                continue
            p = mu[c, path[0]] * emit[c, path[0], tokens[b, 0]]
            for s in range(1, 4):
                p = p * T[c, path[s - 1], path[s]] * emit[c, path[s], tokens[b, s]]
            total += float(p)
        assert la[b, c, h].item() == pytest.approx(total, rel=1e-10)


def test_posterior_and_posterior_predictive_match_enumeration():
    T, emit, mu = random_hmm(C=3, H=2, V=3, seed=5)
    prior = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    tokens = torch.randint(3, (3, 4), generator=make_generator(6))
    res = bayes_posterior_predictive(tokens, T, emit, mu, prior=prior)
    joint = brute_joint(tokens, T, emit, mu) * prior
    assert torch.allclose(res.posterior, joint / joint.sum(1, keepdim=True), rtol=1e-10)
    for v in range(3):
        ext = torch.cat([tokens, torch.full((3, 1), v)], dim=1)
        num = (brute_joint(ext, T, emit, mu) * prior).sum(1)
        assert torch.allclose(res.predictive[:, v], num / joint.sum(1), rtol=1e-10)
        per = brute_joint(ext, T, emit, mu) / brute_joint(tokens, T, emit, mu)
        assert torch.allclose(
            next_token_distribution(tokens, T, emit, mu)[:, :, v], per, rtol=1e-10
        )
    assert torch.allclose(res.predictive.sum(1), torch.ones(3, dtype=torch.float64))


def test_zero_probability_sequences_give_nan_posterior_not_errors():
    T, emit, mu = random_hmm(C=2, H=3, V=3, seed=7, zeros=True)
    emit = torch.zeros_like(emit)
    emit[:, 0, 0] = 1.0
    emit[:, 1:, 1] = 1.0  # token 2 is never emitted
    tokens = torch.tensor([[0, 1, 2], [0, 1, 1]])
    res = bayes_posterior_predictive(tokens, T, emit, mu)
    assert bool(res.impossible[0]) and not bool(res.impossible[1])
    assert (
        torch.isnan(res.posterior[0]).all() and torch.isfinite(res.posterior[1]).all()
    )
    brute = brute_joint(tokens[1:], T, emit, mu)
    assert torch.allclose(res.log_likelihood[1].exp(), brute[0], rtol=1e-10)


def test_likelihood_given_previous_state_matches_enumeration():
    T, emit, _ = random_hmm(C=2, H=3, V=3, seed=8)
    tokens = torch.randint(3, (2, 3), generator=make_generator(9))
    lb = log_likelihood_given_state(tokens, T, emit).exp()  # (B, C, H)
    for b, c, h0 in itertools.product(range(2), range(2), range(3)):
        total = 0.0
        for path in itertools.product(range(3), repeat=3):
            p, prev = 1.0, h0
            for s in range(3):
                p *= float(T[c, prev, path[s]] * emit[c, path[s], tokens[b, s]])
                prev = path[s]
            total += p
        assert lb[b, c, h0].item() == pytest.approx(total, rel=1e-10)


def test_log_space_forward_survives_long_sequences():
    """2000 tokens underflow a naive product; compare with a scaled forward pass."""
    T, emit, mu = random_hmm(C=2, H=4, V=5, seed=10)
    tokens = torch.randint(5, (2, 2000), generator=make_generator(11))
    ll = log_likelihood(tokens, T, emit, mu)
    assert torch.isfinite(ll).all() and (ll < -1000).all()
    for b in range(2):
        for c in range(2):  # independent implementation: normalise alpha at every step
            alpha = mu[c] * emit[c, :, tokens[b, 0]]
            total = math.log(alpha.sum())
            alpha = alpha / alpha.sum()
            for t in range(1, 2000):
                alpha = (alpha @ T[c]) * emit[c, :, tokens[b, t]]
                total += math.log(alpha.sum())
                alpha = alpha / alpha.sum()
            assert ll[b, c].item() == pytest.approx(total, rel=1e-9)


def test_smoothing_keeps_rows_stochastic_and_bounds_entries():
    T, _, _ = random_hmm(C=2, H=5, seed=12, zeros=True)
    S = smooth_transitions(T, 0.1)
    assert torch.allclose(S.sum(2), torch.ones(2, 5, dtype=torch.float64))
    assert S.min() >= 0.1 / 5 - 1e-15
    assert torch.equal(smooth_transitions(T, 0.0), T)


# -- the GINC generator -------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    return GINC(ginc_preset("tiny"))


def test_paper_preset_is_the_paper_configuration():
    c = GINC_PRESETS["paper"]
    assert (c.n_entities, c.n_properties, c.vocab_size, c.n_concepts) == (
        10,
        10,
        50,
        10,
    )
    assert (c.n_documents, c.document_length) == (1000, 10240)
    assert (c.transition_temp, c.start_temp, c.entity_stickiness) == (0.1, 10.0, 0.9)
    assert c.n_seen == 5 and GINC(c).unseen_concepts.tolist() == [5, 6, 7, 8, 9]


def test_world_structure(tiny):
    c = tiny.config
    assert (tiny.memory[:, 0] == DELIMITER).all() and (tiny.memory[:, 1:] >= 1).all()
    T = tiny.transition_matrices("all")
    assert torch.allclose(
        T.sum(2), torch.ones(c.n_concepts, c.n_states, dtype=torch.float64)
    )
    P = c.n_properties
    for th, e, s, e2, s2 in itertools.product(
        range(c.n_concepts),
        range(c.n_entities),
        range(P),
        range(c.n_entities),
        range(P),
    ):
        want = tiny.entity_transition[e, e2] * tiny.property_transitions[th, s, s2]
        assert T[th, e * P + s, e2 * P + s2] == pytest.approx(float(want), abs=1e-15)
    assert torch.allclose(
        tiny.start_probs.sum(1), torch.ones(c.n_concepts, dtype=torch.float64)
    )
    assert torch.equal(tiny.emission_matrix().argmax(1), tiny.state_tokens)


def test_permutation_mixture_is_a_mixture_of_permutations():
    M = permutation_mixture(6, 4, 0.1, make_generator(0))
    assert torch.allclose(
        M.sum(0), torch.ones(6, dtype=torch.float64)
    )  # doubly stochastic
    assert torch.allclose(M.sum(1), torch.ones(6, dtype=torch.float64))
    assert M.max() > 0.5  # peaked weights at a small temperature


def test_documents_follow_the_transition_matrix(tiny):
    docs = tiny.sample_documents(
        3000, 40, make_generator(1), concepts=torch.tensor([1])
    )
    assert (docs.concepts == 1).all()
    assert torch.equal(docs.tokens, tiny.state_tokens[docs.states])
    H = tiny.n_states
    counts = torch.zeros(H, H, dtype=torch.float64)
    counts.index_put_(
        (docs.states[:, :-1].reshape(-1), docs.states[:, 1:].reshape(-1)),
        torch.ones(docs.states[:, 1:].numel(), dtype=torch.float64),
        accumulate=True,
    )
    T = tiny.transition_matrices(torch.tensor([1]))[0]
    rows = counts.sum(1, keepdim=True)
    emp = counts / rows
    se = (T * (1 - T) / rows).sqrt()
    assert ((emp - T).abs() <= 5 * se + 1e-3).all()


def _mixture_log_likelihood(world, tokens, eps):
    """log p(document) under the mixture of the seen concepts' eps-smoothed HMMs, up to
    the constant log of the number of concepts."""
    idx = world.seen_concepts
    T = smooth_transitions(world.transition_matrices(idx), eps)
    lls = prefix_log_likelihoods(
        tokens, T, world.emission_matrix(), world.start_probs[idx]
    )[..., -1]
    return lls.logsumexp(1)


def test_smoothed_documents_jump_only_when_eps_is_positive(tiny):
    clean = smoothed_documents(tiny, 64, 40, make_generator(0), 0.0)
    noisy = smoothed_documents(tiny, 64, 40, make_generator(0), 0.5)
    assert clean.shape == noisy.shape == (64, 40)
    assert int(clean.max()) < tiny.config.vocab_size and int(clean.min()) >= 0
    # eps = 0: every document is possible under some pretraining concept
    assert torch.isfinite(_mixture_log_likelihood(tiny, clean, 0.0)).all()
    # eps = 0.5: random jumps make the documents less likely under the concepts
    clean_ll = _mixture_log_likelihood(tiny, clean, 0.0).mean()
    assert _mixture_log_likelihood(tiny, noisy, 0.0).mean() < clean_ll - 5
    again = smoothed_documents(tiny, 64, 40, make_generator(0), 0.5)
    assert torch.equal(noisy, again)


def test_smoothed_documents_follow_the_smoothed_transitions(tiny):
    """Oracle: the mean log-likelihood of samples is largest under the distribution
    they were drawn from (Gibbs' inequality), so among smoothed mixtures the documents
    with jumps at rate eps are most likely at eps."""
    eps = 0.2
    docs = smoothed_documents(tiny, 400, 30, make_generator(3), eps)
    ll = {
        e: float(_mixture_log_likelihood(tiny, docs, e).mean()) for e in (0.1, eps, 0.4)
    }
    assert max(ll, key=ll.get) == eps
    # and the argument is checked
    with pytest.raises(ValueError):
        smoothed_documents(tiny, 4, 10, make_generator(0), 1.5)


def test_prompt_format_and_labels_by_enumeration(tiny):
    n, k = 3, 4
    pr = tiny.sample_prompts(40, n, k, make_generator(2))
    assert pr.tokens.shape == (40, n * (k + 1) + k - 1)
    assert (
        pr.tokens[:, k :: k + 1] == DELIMITER
    ).all()  # delimiter after every example
    assert torch.equal(pr.tokens[:, -(k - 1) :], pr.examples[:, -1, :-1])
    assert (pr.start_property >= 1).all()
    first_props = tiny.memory[:, :][
        :, pr.start_property
    ]  # tokens any entity emits at s0
    assert all(
        int(pr.examples[b, i, 0]) in first_props[:, b].tolist()
        for b in range(40)
        for i in range(n + 1)
    )
    c = tiny.config
    H, P = c.n_states, c.n_properties
    T = tiny.transition_matrices("all")
    for b in range(
        40
    ):  # label = argmax_v p(o_k = v | x, theta*) by enumerating hidden paths
        x, th, s0 = (
            pr.examples[b, -1, :-1],
            int(pr.concepts[b]),
            int(pr.start_property[b]),
        )
        probs = torch.zeros(c.vocab_size, dtype=torch.float64)
        for path in itertools.product(range(H), repeat=k):
            if path[0] % P != s0:
                continue
            if any(tiny.state_tokens[path[s]] != x[s] for s in range(k - 1)):
                continue
            p = 1.0 / c.n_entities
            for s in range(1, k):
                p *= float(T[th, path[s - 1], path[s]])
            probs[tiny.state_tokens[path[-1]]] += p
        assert int(pr.labels[b]) == int(probs.argmax())


def test_pattern_prompts_format_and_labels_by_enumeration(tiny):
    # oracle: Xie et al.'s construction for unseen concepts, checked token by token,
    # and each label by enumerating every hidden path from a uniform first state
    n, k = 2, 3
    pr = tiny.sample_pattern_prompts(60, n, k, make_generator(4))
    c = tiny.config
    H = c.n_states
    assert pr.uniform_start and pr.tokens.shape == (60, n * (k + 1) + k - 1)
    assert (pr.tokens[:, k :: k + 1] == DELIMITER).all()
    assert set(pr.concepts.tolist()) <= set(tiny.unseen_concepts.tolist())
    for b in range(60):  # each example: one entity's row of the memory, slots >= 1
        for ex in pr.examples[b]:
            rows = [
                e
                for e in range(c.n_entities)
                if set(ex.tolist()) <= set(tiny.memory[e, 1:].tolist())
            ]
            assert rows, ex
    T = tiny.transition_matrices("all")
    for b in range(60):
        x, th = pr.examples[b, -1, :-1], int(pr.concepts[b])
        probs = torch.zeros(c.vocab_size, dtype=torch.float64)
        for path in itertools.product(range(H), repeat=k):
            if any(tiny.state_tokens[path[s]] != x[s] for s in range(k - 1)):
                continue
            p = 1.0 / H
            for s in range(1, k):
                p *= float(T[th, path[s - 1], path[s]])
            probs[tiny.state_tokens[path[-1]]] += p
        assert probs.sum() > 0  # the test input is possible under its concept
        assert int(pr.labels[b]) == int(probs.argmax())
    fewer = pr.with_examples(1)
    assert fewer.uniform_start and torch.equal(fewer.labels, pr.labels)


def test_with_examples_and_reordering(tiny):
    pr = tiny.sample_prompts(5, 3, 3, make_generator(3))
    zero = pr.with_examples(0)
    assert torch.equal(zero.tokens, pr.examples[:, -1, :-1]) and torch.equal(
        zero.labels, pr.labels
    )
    assert torch.equal(pr.with_examples(3).tokens, pr.tokens)
    assert torch.equal(pr.reordered(torch.arange(3)).tokens, pr.tokens)
    rev = pr.reordered(torch.tensor([2, 1, 0]))
    assert torch.equal(rev.examples[:, 0], pr.examples[:, 2]) and torch.equal(
        rev.examples[:, 3], pr.examples[:, 3]
    )
    assert torch.equal(assemble_prompts(pr.examples), pr.tokens)


def test_bayes_predictor_on_ginc_matches_brute_force(tiny):
    pr = tiny.sample_prompts(3, 1, 2, make_generator(4))
    eps = 0.05
    res = ginc_bayes_predictor(tiny, pr.tokens, eps)
    seen = tiny.seen_concepts
    T = smooth_transitions(tiny.transition_matrices(seen), eps)
    emit = tiny.emission_matrix()
    brute = brute_joint(
        pr.tokens,
        T,
        emit.unsqueeze(0).expand(len(seen), -1, -1),
        tiny.start_probs[seen],
    )
    assert torch.allclose(res.posterior, brute / brute.sum(1, keepdim=True), rtol=1e-9)


@pytest.mark.parametrize("eps", [0.0, 0.05])
def test_sparse_forward_for_deterministic_emissions_matches_dense(tiny, eps):
    """The dense recursion is checked against enumeration above; the sparse one against
    it."""
    pr = tiny.sample_prompts(50, 3, 4, make_generator(6))
    T = smooth_transitions(tiny.transition_matrices("all"), eps)
    mu = tiny.start_probs
    dense = forward_log_alpha(pr.tokens, T, tiny.emission_matrix(), mu)
    sparse = forward_log_alpha_deterministic(pr.tokens, T, tiny.state_tokens, mu)
    assert torch.equal(torch.isfinite(dense), torch.isfinite(sparse))
    fin = torch.isfinite(dense)
    assert torch.allclose(dense[fin], sparse[fin], rtol=1e-12, atol=1e-12)
    never = torch.full(
        (1, 2), tiny.config.vocab_size + 3
    )  # a token no state emits: probability 0
    assert torch.isinf(
        forward_log_alpha_deterministic(never, T, tiny.state_tokens, mu)
    ).all()


def test_distinguishability_is_nonpositive_against_itself(tiny):
    D = distinguishability(tiny, 3, 0.1, n_segments=20)
    C, P = tiny.config.n_seen, tiny.config.n_properties
    assert D.shape == (C, P - 1, C)
    assert (D.diagonal(dim1=0, dim2=2) <= 1e-12).all()  # min_h p <= max_h p


def test_bayes_pretraining_loss_matches_exact_entropy(tiny):
    L = 3
    c = tiny.config
    seen = tiny.seen_concepts
    T = tiny.transition_matrices(seen)
    emit = tiny.emission_matrix().unsqueeze(0).expand(len(seen), -1, -1)
    seqs = torch.tensor(list(itertools.product(range(c.vocab_size), repeat=L)))
    p = brute_joint(seqs, T, emit, tiny.start_probs[seen]).mean(
        1
    )  # mixture probability
    p1 = brute_joint(seqs[:, :1], T, emit, tiny.start_probs[seen]).mean(1)
    keep = p > 0
    exact = -(p[keep] * (p[keep].log() - p1[keep].log())).sum().item() / (L - 1)
    est = bayes_pretraining_loss(tiny, L, n_documents=20000, seed=1)
    assert est == pytest.approx(exact, abs=0.02)


# -- models and evaluation ------------------------------------------------------------


def test_lstm_is_causal_and_shaped():
    seed_everything(0)
    m = LSTMLanguageModel(7, embed_dim=8, hidden_dim=16)
    x = torch.randint(7, (2, 6))
    y = x.clone()
    y[:, 4] = (y[:, 4] + 1) % 7
    a, b = m(x), m(y)
    assert a.shape == (2, 6, 7)
    assert torch.allclose(a[:, :4], b[:, :4]) and not torch.allclose(a[:, 4:], b[:, 4:])


class _BayesAsModel(nn.Module):
    """A 'language model' whose last-position logits are the exact posterior
    predictive."""

    def __init__(self, world, eps):
        super().__init__()
        self.world, self.eps = world, eps

    def forward(self, tokens):
        pred = ginc_bayes_predictor(self.world, tokens, self.eps).predictive
        out = torch.zeros(tokens.shape[0], tokens.shape[1], pred.shape[1])
        out[:, -1] = pred.clamp_min(1e-30).log().float()
        return out


def test_in_context_grid_with_the_bayes_predictor_as_model(tiny):
    grid = in_context_grid(
        {"bayes": _BayesAsModel(tiny, 0.1)},
        tiny,
        (0, 2),
        (3, 4),
        n_prompts=60,
        seed=0,
        epsilon=0.1,
    )
    assert torch.allclose(grid.accuracy["bayes"], grid.bayes_accuracy)
    assert torch.allclose(
        grid.agreement["bayes"], torch.ones(2, 2, dtype=torch.float64)
    )
    assert ((grid.true_posterior > 0) & (grid.true_posterior <= 1)).all()
    assert (grid.chance_agreement["bayes"] <= 1).all()
    unseen = in_context_grid(
        None, tiny, (1,), (3,), n_prompts=30, seed=0, epsilon=0.1, concepts="unseen"
    )
    assert torch.isnan(unseen.true_posterior).all()
    pr = tiny.sample_prompts(50, 0, 3, make_generator(5), concepts="unseen")
    assert 0.0 <= random_concept_accuracy(tiny, pr) <= 1.0


def test_nested_prompts_reuse_the_lstm_state(tiny):
    seed_everything(1)
    m = LSTMLanguageModel(tiny.config.vocab_size, embed_dim=4, hidden_dim=8).eval()
    full = tiny.sample_prompts(7, 4, 3, make_generator(7))
    nested = _nested_last_logits(m, full, (0, 1, 4))
    for n in (0, 1, 4):
        assert torch.allclose(
            nested[n], next_token_logits(m, full.with_examples(n).tokens), atol=1e-6
        )


def test_order_sensitivity_of_the_bayes_predictor_against_itself(tiny):
    pr = tiny.sample_prompts(40, 3, 3, make_generator(8))
    res = order_sensitivity(_BayesAsModel(tiny, 0.1), tiny, pr, 0.1)
    assert len(res.orders) == 6
    assert torch.allclose(res.model_accuracy, res.bayes_accuracy)
    assert res.model_changed == res.bayes_changed


def test_lstm_pretraining_is_cached_and_reloads(tmp_path, monkeypatch, tiny):
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FMLAB_PROGRESS", "0")
    cfg = GINCPretrainConfig(
        world=tiny.config,
        arch="lstm",
        width=8,
        embed_dim=4,
        steps=3,
        warmup=1,
        batch_size=4,
        window=16,
    )
    first = pretrain_ginc_lm(cfg)
    assert len(list(tmp_path.glob("ginc_lm-*.pt"))) == 1
    second = pretrain_ginc_lm(cfg)
    assert all(
        torch.equal(first["state_dict"][k], second["state_dict"][k])
        for k in first["state_dict"]
    )
    model = load_ginc_lm(cfg)
    tokens = torch.randint(tiny.config.vocab_size, (3, 5))
    assert next_token_logits(model, tokens).shape == (3, tiny.config.vocab_size)


# -- argument validation -------------------------------------------------------------


def test_invalid_arguments_name_the_argument(tiny):
    with pytest.raises(ValueError, match="n_entities"):
        GINCConfig(n_entities=0)
    with pytest.raises(TypeError, match="transition_temp"):
        GINCConfig(transition_temp="hot")
    with pytest.raises(ValueError, match="name"):
        ginc_preset("huge")
    with pytest.raises(ValueError, match="n_prompts"):
        tiny.sample_prompts(0, 1, 3, make_generator(0))
    with pytest.raises(ValueError, match="example_length"):
        tiny.sample_prompts(2, 1, 1, make_generator(0))
    with pytest.raises(ValueError, match="concepts"):
        tiny.sample_prompts(2, 1, 3, make_generator(0), concepts="some")
    with pytest.raises(ValueError, match="start_property"):
        tiny.sample_prompts(2, 1, 3, make_generator(0), start_property=0)
    with pytest.raises(ValueError, match="epsilon"):
        ginc_bayes_predictor(tiny, torch.zeros(1, 2, dtype=torch.long), 1.5)
    with pytest.raises(ValueError, match="tokens"):
        ginc_bayes_predictor(tiny, torch.full((1, 2), 99), 0.1)
    with pytest.raises(TypeError, match="tokens"):
        ginc_bayes_predictor(tiny, torch.zeros(1, 2), 0.1)
    T, emit, mu = random_hmm()
    with pytest.raises(ValueError, match="initial"):
        log_likelihood(torch.zeros(2, 3, dtype=torch.long), T, emit, mu[:1])
    with pytest.raises(ValueError, match="transitions"):
        smooth_transitions(torch.ones(2, 3, 4, dtype=torch.float64), 0.1)
    with pytest.raises(ValueError, match="order"):
        tiny.sample_prompts(2, 2, 3, make_generator(0)).reordered(torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="steps"):
        GINCPretrainConfig(steps=0)
    with pytest.raises(ValueError, match="concepts"):
        in_context_grid(
            None, tiny, (0,), (3,), n_prompts=2, seed=0, epsilon=0.1, concepts="all"
        )
    with pytest.raises(ValueError, match="tokens"):
        LSTMLanguageModel(5)(torch.full((1, 2), 7))
