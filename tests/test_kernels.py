"""Tests of Chapter 4's code: eNTKs, SignGD kernels, kernel regression, LoRA, the language,
the tiny transformer. Oracles: a per-example autograd loop, finite differences, explicit
formulas, a primal solver (scipy), brute-force Bayes posteriors."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from fmlab.data.sentiment_language import SentimentLanguage, SentimentLanguageConfig
from fmlab.kernel_view import (
    CLSClassifier,
    FineTuneConfig,
    PromptClassifier,
    fine_tune,
    logistic_loss,
    output_derivative,
    signgd_step_check,
)
from fmlab.lora import apply_lora, lora_targets, weight_gradients
from fmlab.models.transformer import TinyTransformer, TransformerConfig
from fmlab.theory.kernels import (
    empirical_kernels,
    empirical_ntk,
    empirical_ntk_autograd_loop,
    fit_kernel_logistic,
    flat_params,
    jacobian,
    kernel_distance,
    kernel_predict,
    kernels_from_jacobians,
    linearized_outputs,
    lora_projected_kernel,
    time_entk,
)


class TwoOut(nn.Module):
    """A small MLP with scalar or vector output."""

    def __init__(self, m=None, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, m or 1))
        self.m = m

    def forward(self, x):
        out = self.net(x)
        return out.squeeze(-1) if self.m is None else out


@pytest.fixture(scope="module")
def lang():
    return SentimentLanguage(SentimentLanguageConfig(max_len=5))


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


# -- Jacobians and kernels --------------------------------------------------------------
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
    s, w, l = lang.sample_sentences(6, torch.Generator().manual_seed(0), domain="task")
    x = lang.task_inputs(w, l)
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


# -- kernel regression ------------------------------------------------------------------
def primal_logistic(phi, y, f0, reg, psi=None):
    """min_delta mean log(1+exp(-y (f0 + phi delta))) + reg/2 |delta|^2 with delta in span(psi)."""
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
    g = torch.Generator().manual_seed(0)
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


# -- LoRA -----------------------------------------------------------------------------------
def test_lora_kernel_is_random_projection_of_weight_gradients(lang, tiny):
    model = PromptClassifier(tiny, lang)
    s, w, l = lang.sample_sentences(5, torch.Generator().manual_seed(1), domain="task")
    x = lang.task_inputs(w, l)
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
    g = torch.Generator().manual_seed(0)
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


# -- the language, the model, the classifiers --------------------------------------------------
def test_language_probabilities_and_posterior(lang):
    for probs in lang.word_probs.values():
        assert torch.allclose(probs.sum(1), torch.ones(2, dtype=torch.float64))
    words = torch.tensor(
        [
            [
                lang.index["good"],
                lang.index["scary"],
                lang.index["the"],
                lang.pad_id,
                lang.pad_id,
            ]
        ]
    )
    for domain in ("pretrain", "task"):
        p = lang.word_probs[domain]
        like_pos = p[0, words[0, :3]].prod()
        like_neg = p[1, words[0, :3]].prod()
        brute = math.log(0.3 * like_pos / (0.7 * like_neg))
        assert lang.log_odds(
            words, domain=domain, prior_positive=0.3
        ).item() == pytest.approx(brute)
    # "scary" is neutral in pretraining, positive in the task domain
    assert (
        lang.word_probs["pretrain"][0, lang.index["scary"]]
        == lang.word_probs["pretrain"][1, lang.index["scary"]]
    )
    assert (
        lang.word_probs["task"][0, lang.index["scary"]]
        > lang.word_probs["task"][1, lang.index["scary"]]
    )
    with pytest.raises(ValueError, match="domain"):
        lang.sample_sentences(2, torch.Generator(), domain="web")
    with pytest.raises(ValueError, match="irony_max"):
        SentimentLanguageConfig(irony_min=0.3, irony_max=0.2)


def test_language_documents(lang):
    g = torch.Generator().manual_seed(0)
    docs = lang.sample_pretraining(50, g)
    assert docs.shape == (50, lang.seq_len) and (docs[:, 0] == lang.cls_id).all()
    text = lang.decode(docs)
    assert any(t.endswith("it was great .") for t in text) and any(
        t.endswith("it was terrible .") for t in text
    )
    s, w, l = lang.sample_sentences(3, g, domain="task")
    prompted = lang.task_inputs(w, l)
    assert ((prompted == lang.mask_id).sum(1) == 1).all()
    assert all(t.endswith("it was [MASK] .") for t in lang.decode(prompted))
    assert not (lang.task_inputs(w, l, prompt="none") == lang.mask_id).any()


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
    s, w, l = lang.sample_sentences(4, torch.Generator().manual_seed(2), domain="task")
    x = lang.task_inputs(w, l)
    logits = tiny(x)
    at_mask = logits[x == lang.mask_id]
    expected = at_mask[:, lang.great_id] - at_mask[:, lang.terrible_id]
    assert torch.allclose(PromptClassifier(tiny, lang)(x), expected, atol=1e-5)
    swapped = PromptClassifier(tiny, lang, label_words=("terrible", "great"))
    assert torch.allclose(swapped(x), -expected, atol=1e-5)
    with pytest.raises(ValueError, match="label_words"):
        PromptClassifier(tiny, lang, label_words=("great", "nonsense"))
    cls = CLSClassifier(tiny, seed=0)
    xp = lang.task_inputs(w, l, prompt="none")
    assert torch.allclose(cls(xp), cls.head(tiny.hidden(xp)[:, 0]).squeeze(-1))


def test_output_derivative_is_the_loss_gradient():
    f = torch.tensor([0.3, -1.2, 2.0], requires_grad=True)
    y = torch.tensor([1.0, 1.0, -1.0])
    (logistic_loss(f, y) * 3).backward()
    assert torch.allclose(output_derivative(f.detach(), y), f.grad)


def test_signgd_fine_tuning_step_and_theorem_4_3(lang, tiny):
    model = PromptClassifier(tiny, lang)
    s, w, l = lang.sample_sentences(6, torch.Generator().manual_seed(3), domain="task")
    x, y = lang.task_inputs(w, l), s.float()
    lr = 1e-3
    tuned = fine_tune(model, x, y, FineTuneConfig("signgd", lr, 1))
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
        FineTuneConfig("lion")
    with pytest.raises(ValueError, match="batch_size"):
        FineTuneConfig(batch_size=0)
    with pytest.raises(TypeError, match="config"):
        fine_tune(tiny, torch.zeros(2, 3, dtype=torch.long), torch.ones(2), {"lr": 1})


def test_time_entk_reports_same_matrix():
    out = time_entk(TwoOut(), torch.randn(6, 3), chunk_size=4, repeats=2)
    assert out["max_rel_diff"] < 1e-5 and out["speedup"] > 0
    assert out["speedup_ceiling"] == pytest.approx(
        out["seconds_loop"] / out["seconds_gram"]
    )
    with pytest.raises(ValueError, match="repeats"):
        time_entk(TwoOut(), torch.randn(6, 3), repeats=0)
    with pytest.raises(ValueError, match="two examples"):
        time_entk(TwoOut(), torch.randn(1, 3))
