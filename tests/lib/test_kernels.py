"""Tests of Chapter 4's code: eNTKs, SignGD kernels, kernel regression, LoRA, the
language, the tiny transformer. Oracles: a per-example autograd loop, finite
differences, explicit formulas, a primal solver (scipy), brute-force Bayes
posteriors."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from fmlab.adapt.lora import (
    apply_lora,
    lora_targets,
    only_targets_trainable,
    weight_gradients,
)
from fmlab.chapters.ch4_kernel_behaviour import signgd_step_check
from fmlab.chapters.ch4_world import (
    LogisticFineTuneConfig,
    few_shot_task,
    fine_tune_logistic,
    fit_logistic_regression,
    logistic_loss,
    logistic_probe_head,
    output_derivative,
)
from fmlab.data.sentiment_language import SentimentLanguage, SentimentLanguageConfig
from fmlab.models.transformer import (
    CLSClassifier,
    PromptClassifier,
    TinyTransformer,
    TransformerConfig,
)
from fmlab.repro import make_generator, seed_everything
from fmlab.theory.kernels import (
    empirical_kernels,
    empirical_ntk,
    empirical_ntk_autograd_loop,
    fit_kernel_logistic,
    flat_params,
    jacobian,
    kernel_distance,
    kernel_gradient_descent,
    kernel_predict,
    kernels_from_jacobians,
    linear_per_example_gradients,
    linearized_outputs,
    lora_projected_kernel,
    time_entk,
)


class TwoOut(nn.Module):
    """A small MLP with scalar or vector output."""

    def __init__(self, m=None, seed=0):
        super().__init__()
        seed_everything(seed)
        self.net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, m or 1))
        self.m = m

    def forward(self, x):
        out = self.net(x)
        return out.squeeze(-1) if self.m is None else out


@pytest.fixture(scope="module")
def lang():
    return SentimentLanguage(SentimentLanguageConfig(max_units=4))


@pytest.fixture(scope="module")
def tiny(lang):
    cfg = TransformerConfig(
        vocab_size=lang.vocab_size,
        max_len=lang.seq_len,
        d_model=8,
        n_layers=1,
        n_heads=2,
        pad_id=lang.pad_id,
    )
    return TinyTransformer(cfg, seed=3)


def per_example_grads(model, x):
    rows = []
    for i in range(x.shape[0]):
        model.zero_grad()
        model(x[i : i + 1]).sum().backward()
        rows.append(torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()]))
    return torch.stack(rows)


# -- Jacobians and kernels
# --------------------------------------------------------------
def test_jacobian_matches_per_example_backward():
    model = TwoOut()
    x = torch.randn(7, 3)
    assert torch.allclose(
        jacobian(model, x, chunk_size=3), per_example_grads(model, x), atol=1e-6
    )


def test_jacobian_matches_finite_differences():
    model = TwoOut(seed=1).double()
    x = torch.randn(4, 3, dtype=torch.float64)
    j = jacobian(model, x)
    v = torch.randn(j.shape[1], dtype=torch.float64)
    theta = flat_params(model)

    def f_at(vec):
        m = TwoOut(seed=1).double()
        start = 0
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(vec[start : start + p.numel()].view_as(p))
                start += p.numel()
        return m(x)

    eps = 1e-6
    fd = (f_at(theta + eps * v) - f_at(theta - eps * v)) / (2 * eps)
    assert torch.allclose(j @ v, fd, atol=1e-8)


def test_entk_matches_autograd_loop_scalar_and_vector_outputs(lang, tiny):
    model = PromptClassifier(tiny, lang)
    s, w, lengths = lang.sample_sentences(6, make_generator(0), domain="task")
    x = lang.task_inputs(w, lengths)
    k_func = empirical_ntk(model, x[:4], x[2:], chunk_size=3)
    k_loop = empirical_ntk_autograd_loop(model, x[:4], x[2:])
    assert k_func.shape == (4, 4)
    assert torch.allclose(k_func, k_loop, rtol=1e-4, atol=1e-5)
    vec = TwoOut(m=2)
    xv = torch.randn(5, 3)
    kv = empirical_ntk(vec, xv)
    assert kv.shape == (5, 5, 2, 2)
    assert torch.allclose(kv, empirical_ntk_autograd_loop(vec, xv), atol=1e-5)
    # chunks that do not divide n give the same kernel, block by block
    for chunk in (1, 2, 3):
        assert torch.allclose(empirical_ntk(vec, xv, chunk_size=chunk), kv, atol=1e-6)
        assert torch.allclose(
            empirical_ntk(vec, xv[:2], xv, chunk_size=chunk), kv[:2], atol=1e-6
        )
    # symmetric, positive semi-definite
    flat = kv.permute(0, 2, 1, 3).reshape(10, 10)
    assert torch.allclose(flat, flat.T, atol=1e-5)
    assert torch.linalg.eigvalsh(flat.double()).min() > -1e-5


def test_signgd_kernels_match_their_formulas():
    model = TwoOut(seed=2)
    x1, x2 = torch.randn(4, 3), torch.randn(3, 3)
    g1, g2 = per_example_grads(model, x1), per_example_grads(model, x2)
    ks = empirical_kernels(
        model, x1, x2, kernels=("sgd", "asymmetric_signgd", "signgd"), chunk_size=2
    )
    assert torch.allclose(ks["sgd"], g1 @ g2.T, atol=1e-6)
    assert torch.allclose(ks["asymmetric_signgd"], g1 @ g2.sign().T, atol=1e-6)
    assert torch.allclose(ks["signgd"], g1.sign() @ g2.sign().T, atol=1e-6)
    # the diagonal of the asymmetric kernel is the l1 norm of the gradient
    k_aa = empirical_ntk(model, x1, kernel="asymmetric_signgd")
    assert torch.allclose(k_aa.diagonal(), g1.abs().sum(1), atol=1e-5)
    assert torch.allclose(kernels_from_jacobians(g1, g2)["sgd"], g1 @ g2.T)


def test_linearized_outputs_is_first_order_taylor():
    m0 = TwoOut(seed=4).double()
    m1 = TwoOut(seed=4).double()
    with torch.no_grad():
        for p in m1.parameters():
            p.add_(1e-3 * torch.randn_like(p))
    x = torch.randn(6, 3, dtype=torch.float64)
    lin = linearized_outputs(m0, m1, x)
    expected = m0(x).detach() + jacobian(m0, x) @ (flat_params(m1) - flat_params(m0))
    assert torch.allclose(lin, expected, atol=1e-10)
    # second-order small: |f1 - f_lin| << |f1 - f0|
    assert (m1(x).detach() - lin).norm() < 1e-2 * (m1(x) - m0(x)).detach().norm()
    # exact for a model that is linear in its parameters
    wrap0, wrap1 = Wrap(nn.Linear(3, 1).double()), Wrap(nn.Linear(3, 1).double())
    assert torch.allclose(
        linearized_outputs(wrap0, wrap1, x), wrap1(x).detach(), atol=1e-12
    )


class Wrap(nn.Module):
    def __init__(self, lin):
        super().__init__()
        self.lin = lin

    def forward(self, x):
        return self.lin(x).squeeze(-1)


def test_kernel_distance():
    k0 = torch.eye(3)
    assert kernel_distance(k0, 2 * k0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="k0"):
        kernel_distance(torch.zeros(2, 2), torch.ones(2, 2))
    with pytest.raises(ValueError, match="k1"):
        kernel_distance(k0, torch.ones(2, 2))


# -- kernel regression
# ------------------------------------------------------------------
def primal_logistic(phi, y, f0, reg, psi=None):
    """min_delta mean log(1+exp(-y (f0 + phi delta))) + reg/2 |delta|^2 with delta in
    span(psi)."""
    from scipy.optimize import minimize

    phi, y, f0 = phi.numpy(), y.numpy(), f0.numpy()
    if (
        psi is None
    ):  # unrestricted: the representer theorem puts the minimiser in span(phi)

        def obj(d):
            m = y * (f0 + phi @ d)
            return np.logaddexp(0, -m).mean() + 0.5 * reg * d @ d, phi.T @ (
                -y / (1 + np.exp(m))
            ) / len(y) + reg * d

        res = minimize(
            obj,
            np.zeros(phi.shape[1]),
            jac=True,
            method="L-BFGS-B",
            options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 5000},
        )
        return f0 + phi @ res.x, res.x
    psi = psi.numpy()

    def obj(a):
        d = psi.T @ a
        m = y * (f0 + phi @ d)
        g_d = phi.T @ (-y / (1 + np.exp(m))) / len(y) + reg * d
        return np.logaddexp(0, -m).mean() + 0.5 * reg * d @ d, psi @ g_d

    res = minimize(
        obj,
        np.zeros(psi.shape[0]),
        jac=True,
        method="L-BFGS-B",
        options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 5000},
    )
    return f0 + phi @ (psi.T @ res.x), psi.T @ res.x


def test_kernel_logistic_regression_matches_primal_solution():
    g = make_generator(0)
    n, p = 12, 30
    phi = torch.randn(n, p, generator=g, dtype=torch.float64)
    y = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    f0 = 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
    reg = 0.05
    k = phi @ phi.T
    alpha = fit_kernel_logistic(k, y, reg=reg, f0=f0)
    fitted = kernel_predict(k, alpha, f0)
    primal_fit, delta = primal_logistic(phi, y, f0, reg)
    assert np.allclose(fitted.numpy(), primal_fit, atol=1e-5)
    # prediction on new points = f0 + <phi(x), delta>
    phi_new = torch.randn(5, p, generator=g, dtype=torch.float64)
    assert np.allclose(
        kernel_predict(phi_new @ phi.T, alpha).numpy(),
        phi_new.numpy() @ delta,
        atol=1e-5,
    )
    # asymmetric: delta restricted to span(sign phi), penalty S = <sign, sign>
    psi = phi.sign()
    alpha_a = fit_kernel_logistic(phi @ psi.T, y, reg=reg, f0=f0, penalty=psi @ psi.T)
    primal_a, _ = primal_logistic(phi, y, f0, reg, psi=psi)
    assert np.allclose(
        kernel_predict(phi @ psi.T, alpha_a, f0).numpy(), primal_a, atol=1e-5
    )


def test_kernel_gradient_descent_is_gradient_descent_on_a_linear_model():
    # f(x) = f0(x) + <phi(x), theta>, theta from 0: T steps of GD on the mean logistic
    # loss end where the kernel analog with K = phi phi^T ends, on train and new inputs
    g = make_generator(1)
    n, p, lr, steps = 10, 25, 0.3, 40
    phi = torch.randn(n, p, generator=g, dtype=torch.float64)
    phi_new = torch.randn(6, p, generator=g, dtype=torch.float64)
    y = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    f0 = 0.5 * torch.randn(n, generator=g, dtype=torch.float64)
    f0_new = 0.5 * torch.randn(6, generator=g, dtype=torch.float64)
    theta = torch.zeros(p, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([theta], lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.softplus(-y * (f0 + phi @ theta)).mean().backward()
        opt.step()
    k = phi @ phi.T
    f_new = kernel_gradient_descent(
        k, phi_new @ phi.T, y, lr=lr, steps=steps, f0_train=f0, f0_eval=f0_new
    )
    assert torch.allclose(f_new, f0_new + phi_new @ theta.detach(), atol=1e-10)
    f_tr = kernel_gradient_descent(k, k, y, lr=lr, steps=steps, f0_train=f0, f0_eval=f0)
    assert torch.allclose(f_tr, f0 + phi @ theta.detach(), atol=1e-10)
    # no steps: the starting outputs
    assert torch.equal(kernel_gradient_descent(k, k, y, lr=lr, steps=0, f0_eval=f0), f0)


def test_kernel_gradient_descent_validates_arguments():
    k, y = torch.eye(3), torch.ones(3)
    with pytest.raises(ValueError, match="k_eval"):
        kernel_gradient_descent(k, torch.ones(2, 4), y, lr=0.1, steps=1)
    with pytest.raises(ValueError, match="y must hold labels"):
        kernel_gradient_descent(k, k, torch.zeros(3), lr=0.1, steps=1)
    with pytest.raises(ValueError, match="lr"):
        kernel_gradient_descent(k, k, y, lr=0.0, steps=1)
    with pytest.raises(ValueError, match="steps"):
        kernel_gradient_descent(k, k, y, lr=0.1, steps=-1)
    with pytest.raises(FloatingPointError, match="diverged"):
        kernel_gradient_descent(1e300 * k.double(), k, -y, lr=1e10, steps=3)


def test_kernel_logistic_validates_arguments():
    k = torch.eye(3)
    with pytest.raises(ValueError, match="y must hold labels"):
        fit_kernel_logistic(k, torch.tensor([0.0, 1.0, 1.0]), reg=1.0)
    with pytest.raises(ValueError, match="reg"):
        fit_kernel_logistic(k, torch.ones(3), reg=0.0)
    with pytest.raises(ValueError, match="k_train"):
        fit_kernel_logistic(torch.ones(3, 2), torch.ones(3), reg=1.0)
    with pytest.raises(ValueError, match="kernels must be among"):
        empirical_kernels(TwoOut(), torch.randn(2, 3), kernels=("adam",))
    with pytest.raises(TypeError, match="model"):
        jacobian("not a model", torch.randn(2, 3))
    with pytest.raises(ValueError, match="chunk_size"):
        jacobian(TwoOut(), torch.randn(2, 3), chunk_size=0)


# -- LoRA ---------------------------------------------------------------------------
def test_lora_kernel_is_random_projection_of_weight_gradients(lang, tiny):
    model = PromptClassifier(tiny, lang)
    s, w, lengths = lang.sample_sentences(5, make_generator(1), domain="task")
    x = lang.task_inputs(w, lengths)
    lora = apply_lora(model, 3, seed=0)
    assert torch.allclose(lora(x), model(x))  # B = 0: same function
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    targets = lora_targets(model)
    grads = weight_gradients(model, x, targets)
    # weight gradients agree with the per-example backward
    model.zero_grad()
    model(x[:1]).sum().backward()
    name = targets[0]
    assert torch.allclose(
        grads[name][0], model.get_submodule(name).weight.grad, atol=1e-6
    )
    proj = {n: lora.get_submodule(n).lora_A.detach() for n in targets}
    k_formula = lora_projected_kernel(grads, grads, proj)
    assert torch.allclose(empirical_ntk(lora, x), k_formula, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="same, non-empty"):
        lora_projected_kernel(grads, grads, {})
    with pytest.raises(ValueError, match="rank"):
        apply_lora(model, 0, seed=0)


def test_lora_kernel_is_unbiased():
    """E[A^T A] = I: averaged over many projections the LoRA kernel is the full one."""
    g = make_generator(0)
    grads = {"w": torch.randn(4, 3, 6, generator=g)}
    full = lora_projected_kernel(grads, grads, {"w": torch.eye(6)})
    mean = (
        sum(
            lora_projected_kernel(
                grads, grads, {"w": torch.randn(2, 6, generator=g) / 2**0.5}
            )
            for _ in range(4000)
        )
        / 4000
    )
    assert (mean - full).norm() / full.norm() < 0.05


# -- the language, the model, the classifiers
# --------------------------------------------------
def unit_log_likelihood(lang, tokens, s, domain):
    """log p(sentence | s) from the generative description, unit by unit (oracle)."""
    c = lang.config
    nu = lang.negation_rate(domain)
    neutral = set(lang.neutral_ids.tolist())
    pos, neg = lang.positive_ids.tolist(), lang.negative_ids.tolist()
    total, i = 0.0, 0
    toks = [t for t in tokens if t != lang.pad_id]
    while i < len(toks):
        negated = toks[i] == lang.not_id
        w = toks[i + 1] if negated else toks[i]
        i += 2 if negated else 1
        p = nu if negated else 1 - nu
        if w in neutral:
            p *= (1 - c.opinion_rate) / len(neutral)
        else:
            word = lang.words[w]
            if domain == "task" and word in ("scary", "predictable"):
                # the reversed pair of the review domain: "scary" is praise there
                weight, eta = c.domain_rate, c.domain_ambiguity
                pol = 1 if word == "scary" else -1
            else:
                j = pos.index(w) if w in pos else neg.index(w)
                pol = 1 if w in pos else -1
                if domain == "pretrain":
                    weight = float(lang.pair_weight[j])
                else:
                    weight = (1 - c.domain_rate) * float(lang.task_pair_weight[j])
                eta = float(lang.ambiguity[j])
            # the word says `pol`; the opinion means pol (not negated) or -pol (negated)
            meaning = -pol if negated else pol
            p *= c.opinion_rate * weight * ((1 - eta) if meaning == s else eta)
        total += math.log(p)
    return total


def test_language_posterior_is_exact(lang):
    shifted = SentimentLanguage(SentimentLanguageConfig(max_units=4, domain_rate=0.3))
    for language in (lang, shifted):
        w_task = language.sample_sentences(40, make_generator(0), domain="task")[1]
        w_pre = language.sample_sentences(40, make_generator(1))[1]
        for domain, words in (("task", w_task), ("pretrain", w_pre)):
            got = language.log_odds(words, domain=domain, prior_positive=0.3)
            for row, value in zip(words.tolist(), got.tolist()):
                brute = (
                    math.log(0.3 / 0.7)
                    + unit_log_likelihood(language, row, 1, domain)
                    - unit_log_likelihood(language, row, -1, domain)
                )
                assert value == pytest.approx(brute, abs=1e-9)
    # "not" flips the evidence of the word after it
    good, not_id = lang.index["good"], lang.not_id
    pair = lang.log_odds(torch.tensor([[good, 0], [not_id, good]]), domain="pretrain")
    assert pair[0] == pytest.approx(-pair[1].item()) and pair[0] > 0
    # "scary" is a complaint in pretraining text and praise in the shifted reviews
    scary = torch.tensor([[shifted.index["scary"]]])
    assert shifted.log_odds(scary, domain="pretrain").item() < 0
    assert shifted.log_odds(scary, domain="task").item() > 0
    assert (
        shifted.sample_sentences(500, make_generator(2), domain="task")[1]
        == shifted.index["scary"]
    ).any()
    assert not (
        lang.sample_sentences(500, make_generator(2), domain="task")[1]
        == lang.index["scary"]
    ).any()  # domain_rate = 0: the pair is unused


def test_language_sampler_is_calibrated(lang):
    """Sentences drawn from the sampler have the posterior that log_odds computes."""
    for domain in ("pretrain", "task"):
        s, w, _ = lang.sample_sentences(
            60_000, make_generator(2), domain=domain, prior_positive=0.5
        )
        post = torch.sigmoid(lang.log_odds(w, domain=domain))
        for lo, hi in ((0.05, 0.3), (0.3, 0.7), (0.7, 0.95)):
            sel = (post > lo) & (post <= hi)
            assert sel.sum() > 2000
            empirical = (s[sel] > 0).double().mean().item()
            assert empirical == pytest.approx(post[sel].mean().item(), abs=0.02)


@pytest.mark.parametrize("domain_rate", [0.0, 0.3])
def test_word_frequencies_and_bag_of_words(domain_rate):
    lang = SentimentLanguage(
        SentimentLanguageConfig(max_units=4, domain_rate=domain_rate)
    )
    for domain in ("pretrain", "task"):
        s, w, lengths = lang.sample_sentences(
            40_000, make_generator(3), domain=domain, prior_positive=0.5
        )
        counts = lang.bag_of_words(w)
        assert torch.equal(counts.sum(1), (w != lang.pad_id).sum(1).float())
        units = (w != lang.pad_id).sum(1) - (w == lang.not_id).sum(1)
        freq = lang.word_frequencies(domain)
        for row, sign in enumerate((1, -1)):
            sel = s == sign
            empirical = counts[sel].sum(0) / units[sel].sum()
            assert torch.allclose(empirical.double(), freq[row], atol=4e-3)
    # with a negation rate of 1/2, every word is as frequent under both sentiments
    assert torch.allclose(*lang.word_frequencies("task"), atol=1e-15)
    assert not torch.allclose(*lang.word_frequencies("pretrain"), atol=1e-3)


def test_language_documents(lang):
    g = make_generator(0)
    docs = lang.sample_pretraining(50, g)
    assert docs.shape == (50, lang.seq_len) and (docs[:, 0] == lang.cls_id).all()
    text = lang.decode(docs)
    assert any(t.endswith("it was great .") for t in text) and any(
        t.endswith("it was terrible .") for t in text
    )
    s, w, lengths = lang.sample_sentences(30, g, domain="task")
    assert (lengths <= lang.max_tokens).all() and (lengths >= 1).all()
    assert torch.equal(lengths, (w != lang.pad_id).sum(1))
    assert not ((w[:, :-1] == lang.not_id) & (w[:, 1:] == lang.not_id)).any()
    assert not (
        w[torch.arange(30), lengths - 1] == lang.not_id
    ).any()  # never ends on "not"
    prompted = lang.task_inputs(w, lengths)
    assert ((prompted == lang.mask_id).sum(1) == 1).all()
    assert all(t.endswith("it was [MASK] .") for t in lang.decode(prompted))
    assert not (lang.task_inputs(w, lengths, prompt="none") == lang.mask_id).any()
    with pytest.raises(ValueError, match="domain"):
        lang.sample_sentences(2, g, domain="web")
    with pytest.raises(ValueError, match="irony_max"):
        SentimentLanguageConfig(irony_min=0.3, irony_max=0.2)


def test_transformer_ignores_padding_and_respects_causality(lang):
    cfg = TransformerConfig(
        vocab_size=lang.vocab_size,
        max_len=8,
        d_model=8,
        n_layers=2,
        n_heads=2,
        pad_id=lang.pad_id,
    )
    model = TinyTransformer(cfg, seed=0)
    x = torch.tensor([[2, 10, 11, 12, 0, 0, 0, 0]])  # right-padded with [PAD] = 0
    x2 = torch.tensor([[2, 10, 11, 12]])
    assert torch.allclose(model(x)[0, :4], model(x2)[0], atol=1e-5)
    causal = TinyTransformer(
        TransformerConfig(
            vocab_size=lang.vocab_size, max_len=8, d_model=8, n_heads=2, causal=True
        ),
        seed=0,
    )
    a = torch.tensor([[2, 10, 11, 12, 13]])
    b = torch.tensor([[2, 10, 11, 20, 21]])
    assert torch.allclose(causal(a)[0, :3], causal(b)[0, :3], atol=1e-6)
    assert not torch.allclose(causal(a)[0, 3], causal(b)[0, 3])
    with pytest.raises(ValueError, match="divisible"):
        TransformerConfig(vocab_size=10, d_model=6, n_heads=4)
    with pytest.raises(ValueError, match="tokens has length"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_prompt_and_cls_outputs(lang, tiny):
    s, w, lengths = lang.sample_sentences(4, make_generator(2), domain="task")
    x = lang.task_inputs(w, lengths)
    logits = tiny(x)
    at_mask = logits[x == lang.mask_id]
    expected = at_mask[:, lang.great_id] - at_mask[:, lang.terrible_id]
    assert torch.allclose(PromptClassifier(tiny, lang)(x), expected, atol=1e-5)
    swapped = PromptClassifier(tiny, lang, label_words=("terrible", "great"))
    assert torch.allclose(swapped(x), -expected, atol=1e-5)
    with pytest.raises(ValueError, match="label_words"):
        PromptClassifier(tiny, lang, label_words=("great", "nonsense"))
    cls = CLSClassifier(tiny, seed=0)
    xp = lang.task_inputs(w, lengths, prompt="none")
    assert torch.allclose(cls(xp), cls.head(tiny.hidden(xp)[:, 0]).squeeze(-1))


def test_output_derivative_is_the_loss_gradient():
    f = torch.tensor([0.3, -1.2, 2.0], requires_grad=True)
    y = torch.tensor([1.0, 1.0, -1.0])
    (logistic_loss(f, y) * 3).backward()
    assert torch.allclose(output_derivative(f.detach(), y), f.grad)


def test_signgd_fine_tuning_step_and_theorem_4_3(lang, tiny):
    model = PromptClassifier(tiny, lang)
    s, w, lengths = lang.sample_sentences(6, make_generator(3), domain="task")
    x, y = lang.task_inputs(w, lengths), s.float()
    lr = 1e-3
    tuned = fine_tune_logistic(model, x, y, LogisticFineTuneConfig("signgd", lr, 1))
    loss = logistic_loss(model(x), y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    expected = flat_params(model) - lr * torch.cat(
        [g.sign().reshape(-1) for g in grads]
    )
    assert torch.allclose(flat_params(tuned), expected, atol=1e-7)
    check = signgd_step_check(model, x[0], float(y[0]), x[1:], (1e-6, 1e-4))
    assert check.rel_error[0] < 1e-3
    assert check.rel_error[1] / check.rel_error[0] == pytest.approx(
        100, rel=0.2
    )  # first order


def test_fine_tune_validates(lang, tiny):
    with pytest.raises(ValueError, match="optimizer"):
        LogisticFineTuneConfig("lion")
    with pytest.raises(ValueError, match="batch_size"):
        LogisticFineTuneConfig(batch_size=0)
    with pytest.raises(TypeError, match="config"):
        fine_tune_logistic(
            tiny, torch.zeros(2, 3, dtype=torch.long), torch.ones(2), {"lr": 1}
        )


def test_linear_per_example_gradients_match_the_loop(lang, tiny):
    model = only_targets_trainable(PromptClassifier(tiny, lang))
    s, w, lengths = lang.sample_sentences(5, make_generator(4), domain="task")
    x = lang.task_inputs(w, lengths)
    grads = linear_per_example_gradients(model, x)
    rows = torch.cat([g.reshape(5, -1) for g in grads.values()], dim=1)
    assert torch.allclose(rows, jacobian(model, x), atol=1e-6)
    params = [p for p in model.parameters() if p.requires_grad]
    for i in range(5):
        g = torch.autograd.grad(model(x[i : i + 1]).sum(), params)
        flat = torch.cat([t.reshape(-1) for t in g])
        assert torch.allclose(rows[i], flat, atol=1e-6)
    # a trainable parameter outside an nn.Linear is refused, by name
    with pytest.raises(ValueError, match="tok.weight"):
        linear_per_example_gradients(PromptClassifier(tiny, lang), x)


def test_only_targets_trainable(lang, tiny):
    model = PromptClassifier(tiny, lang)
    sub = only_targets_trainable(model)
    names = [n for n, p in sub.named_parameters() if p.requires_grad]
    targets = lora_targets(model)
    assert names and all(n.rsplit(".", 1)[0] in targets for n in names)
    assert len(names) == 2 * len(targets)  # weight and bias of each
    assert all(p.requires_grad for p in model.parameters())  # the original untouched
    with pytest.raises(ValueError, match="targets"):
        only_targets_trainable(model, ["mlm.tok"])


def test_time_entk_reports_same_matrix():
    out = time_entk(TwoOut(), torch.randn(6, 3), chunk_size=4, repeats=2)
    assert out["max_rel_diff"] < 1e-5 and out["speedup_vs_loop"] > 0
    for way in ("torch_func", "loop", "batched"):
        assert out[f"total_{way}"] == pytest.approx(
            out[f"jacobian_{way}"] + out["gram"]
        )
    assert out["gram_share"] == pytest.approx(out["gram"] / out["total_torch_func"])
    assert time_entk(TwoOut(), torch.randn(3, 3), repeats=1, clock="wall")["n"] == 3
    with pytest.raises(ValueError, match="repeats"):
        time_entk(TwoOut(), torch.randn(6, 3), repeats=0)
    with pytest.raises(ValueError, match="two examples"):
        time_entk(TwoOut(), torch.randn(1, 3))
    with pytest.raises(ValueError, match="clock"):
        time_entk(TwoOut(), torch.randn(3, 3), clock="sundial")


# -- linear probe, bag of words, few-shot splits, relative attention bias
# ----------------
def test_fit_logistic_regression_matches_scipy():
    from scipy.optimize import minimize

    g = make_generator(5)
    z = torch.randn(20, 4, generator=g, dtype=torch.float64)
    y = torch.where(
        z[:, 0] + torch.randn(20, generator=g, dtype=torch.float64) > 0, 1.0, -1.0
    )
    reg = 0.1
    w, b = fit_logistic_regression(z, y, reg=reg)

    def obj(t):
        m = y.numpy() * (z.numpy() @ t[:4] + t[4])
        return np.logaddexp(0, -m).mean() + 0.5 * reg * t[:4] @ t[:4]

    ref = minimize(obj, np.zeros(5), method="BFGS", options={"gtol": 1e-10}).x
    assert np.allclose(w.numpy(), ref[:4], atol=1e-5) and b == pytest.approx(
        ref[4], abs=1e-5
    )
    with pytest.raises(ValueError, match="y must hold labels"):
        fit_logistic_regression(z, torch.zeros(20), reg=1.0)
    probe = logistic_probe_head(z[:10], y[:10], z[10:], y[10:], (1e-2, 1.0))
    assert probe["reg"] in (1e-2, 1.0) and 0 <= probe["val_acc"] <= 1


def test_cls_head_and_few_shot_splits(lang, tiny):
    train = few_shot_task(lang, 3, 0)
    val = few_shot_task(lang, 3, 0, split="validation")
    assert train.y.tolist() == [1.0, -1.0] * 3 and val.y.tolist() == train.y.tolist()
    assert not torch.equal(train.words, val.words)
    assert torch.equal(few_shot_task(lang, 3, 0).words, train.words)
    with pytest.raises(ValueError, match="split"):
        few_shot_task(lang, 3, 0, split="test")
    w = torch.randn(tiny.config.d_model, dtype=torch.float64)
    cls = CLSClassifier(tiny, head=(w, 0.5))
    h = tiny.hidden(train.x_plain)[:, 0]
    assert torch.allclose(cls(train.x_plain), h @ w.float() + 0.5, atol=1e-5)
    with pytest.raises(ValueError, match="exactly one"):
        CLSClassifier(tiny, seed=0, head=(w, 0.0))


def test_relative_attention_bias(lang):
    base = dict(
        vocab_size=lang.vocab_size, max_len=8, d_model=8, n_heads=2, pad_id=lang.pad_id
    )
    plain = TinyTransformer(TransformerConfig(**base), seed=3)
    rel = TinyTransformer(TransformerConfig(**base, relative_bias=True), seed=3)
    x = torch.tensor([[2, 10, 11, 12, 13, 0, 0, 0]])
    # started at zero, the bias changes nothing (and the other weights are the same)
    assert torch.allclose(plain(x), rel(x), atol=1e-6)
    assert sum(p.numel() for p in rel.parameters()) == plain.n_params() + 2 * 2 * 15
    # a large bias at offset -1 makes every head of layer 1 attend to the previous word
    attn = rel.blocks[0].attn
    with torch.no_grad():
        attn.rel_bias.fill_(-30.0)
        attn.rel_bias[:, 8 - 1 - 1] = 30.0
    h = torch.randn(1, 8, 8, generator=make_generator(6))
    v = attn.qkv(h).split(8, dim=-1)[2]
    out = attn(h, torch.zeros(1, 1, 8, 8))  # additive mask: every position allowed
    assert torch.allclose(out[0, 1:], attn.proj(v[0, :-1]), atol=1e-4)


@pytest.mark.parametrize("relative_bias", [False, True])
def test_hidden_at_positions_equals_the_full_computation(lang, relative_bias):
    cfg = TransformerConfig(
        vocab_size=lang.vocab_size,
        max_len=8,
        d_model=8,
        n_heads=2,
        n_layers=2,
        pad_id=lang.pad_id,
        relative_bias=relative_bias,
    )
    model = TinyTransformer(cfg, seed=4)
    if relative_bias:
        with torch.no_grad():
            for block in model.blocks:
                block.attn.rel_bias.normal_(generator=make_generator(7))
    x = torch.tensor([[2, 10, 11, 12, 13, 0, 0, 0], [2, 14, 15, 16, 17, 18, 19, 20]])
    at = torch.tensor([3, 6])
    with torch.no_grad():
        full = model.hidden(x)[torch.arange(2), at]
        assert torch.allclose(model.hidden(x, at), full, atol=1e-5)
    with pytest.raises(ValueError, match="at"):
        model.hidden(x, torch.tensor([3]))
