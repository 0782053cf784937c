"""The paper's cross-validated probe head (Malladi et al., 2023, footnote 2;
fmlab.chapters.ch4_world.cross_validated_probe_head): the folds are scikit-learn's
StratifiedKFold's, the penalty is the one with the best held-out accuracy (ties to the
strongest), the refit is the two-class multinomial fit the authors' code makes, and the
head is scaled as their code scales it.

Oracles: scikit-learn's documented fold assignment (its StratifiedKFold example) and
the assignment worked out by hand from its rule; the two-class multinomial objective
minimised directly by scipy (BFGS), fold by fold for the held-out accuracies and on all
examples for the refit; a case where every penalty ties by construction.
"""

import numpy as np
import pytest
import torch

from fmlab.chapters import ch4_fewshot as ch4f
from fmlab.chapters import ch4_world as ch4w
from fmlab.repro import make_generator


def _multinomial_fit(z, y, c):
    """Scikit-learn's two-class multinomial logistic regression at inverse penalty
    ``c``, minimised directly: ``c`` times the summed cross-entropy of softmax(W z +
    b) plus ||W||^2 / 2, the intercepts unpenalised. Returns the row of class +1
    (``coef_``, ``intercept_``), in the symmetric solution W0 = -W1."""
    from scipy.optimize import minimize

    z, lab = z.numpy(), (y.numpy() > 0).astype(int)
    n, d = z.shape

    def obj(t):
        w, b = t[: 2 * d].reshape(2, d), t[2 * d :]
        logits = z @ w.T + b
        ce = np.logaddexp(logits[:, 0], logits[:, 1]) - logits[np.arange(n), lab]
        return c * ce.sum() + 0.5 * (w * w).sum()

    t = minimize(obj, np.zeros(2 * d + 2), method="BFGS", options={"gtol": 1e-9}).x
    w, b = t[: 2 * d].reshape(2, d), t[2 * d :]
    return (w[1] - w[0]) / 2, (b[1] - b[0]) / 2


@pytest.fixture(scope="module")
def features():
    g = make_generator(7)
    z = torch.randn(30, 3, generator=g, dtype=torch.float64)
    y = torch.tensor([1.0, -1.0] * 15, dtype=torch.float64)
    z[:, 0] += 0.6 * y  # a signal the penalty has to let through
    return z, y


def test_the_folds_are_stratified_kfold_s():
    # scikit-learn's example: StratifiedKFold(n_splits=2) on y = [0, 0, 1, 1] tests
    # [0, 2] then [1, 3]
    assert ch4w.stratified_folds(torch.tensor([0, 0, 1, 1]), 2).tolist() == [0, 1, 0, 1]
    # seven of each class, alternating +1, -1 (as few_shot_task draws them), 5 folds:
    # the sorted labels' every fifth entry from f holds, of class -1, 2 2 1 1 1 and,
    # of class +1, 1 1 2 2 1; each class fills the folds in blocks, in order
    y = torch.tensor([1.0, -1.0] * 7)
    minus, plus = [0, 0, 1, 1, 2, 3, 4], [0, 1, 2, 2, 3, 3, 4]
    want = [f for pair in zip(plus, minus) for f in pair]
    assert ch4w.stratified_folds(y, 5).tolist() == want


def test_the_chosen_penalty_has_the_best_held_out_accuracy(features):
    z, y = features
    cs = (1e-3, 1e-2, 1e-1, 1.0, 10.0)
    out = ch4w.cross_validated_probe_head(z, y, cs=cs, head_scale=1.0)
    fold = ch4w.stratified_folds(y, 5)
    acc = []
    for c in cs:
        per_fold = []
        for f in range(5):
            tr, te = fold != f, fold == f
            w, b = _multinomial_fit(z[tr], y[tr], c)
            pred = np.where(z[te].numpy() @ w + b > 0, 1.0, -1.0)
            per_fold.append(float((pred == y[te].numpy()).mean()))
        acc.append(np.mean(per_fold))
    assert np.allclose(out["cv_accuracy"].numpy(), acc, atol=1e-12)
    first_best = int(np.flatnonzero(np.isclose(acc, max(acc)))[0])
    assert out["C"] == cs[first_best]
    assert len(set(np.round(acc, 9))) > 1  # the choice is not a tie here


def test_the_refit_is_the_multinomial_fit_and_the_head_half_its_logit(features):
    z, y = features
    cs = (0.05,)
    full = ch4w.cross_validated_probe_head(z, y, cs=cs, head_scale=1.0)
    half = ch4w.cross_validated_probe_head(z, y, cs=cs)  # the authors' scaling
    coef, intercept = _multinomial_fit(z, y, 0.05)
    # coef_ is half the fitted logit, and the authors' head is coef_ itself
    assert np.allclose(half["w"].numpy(), coef, atol=1e-5)
    assert half["b"] == pytest.approx(intercept, abs=1e-5)
    assert torch.allclose(full["w"], 2 * half["w"]) and full["b"] == 2 * half["b"]
    assert full["reg"] == pytest.approx(1 / (2 * 0.05 * 30))


def test_ties_go_to_the_strongest_penalty():
    g = make_generator(3)
    y = torch.tensor([1.0, -1.0] * 10, dtype=torch.float64)
    # separated by a wide margin: every penalty classifies every held-out example
    z = torch.randn(20, 4, generator=g, dtype=torch.float64)
    z[:, 0] = 5.0 * y
    out = ch4w.cross_validated_probe_head(z, y)
    assert (out["cv_accuracy"] == 1).all() and out["C"] == ch4w.CV_PROBE_CS[0]
    # features that carry nothing: only the (unpenalised) intercept moves, so every
    # penalty predicts alike
    flat = ch4w.cross_validated_probe_head(torch.zeros(20, 4), y, cs=(0.1, 1.0, 10.0))
    assert len(set(flat["cv_accuracy"].tolist())) == 1 and flat["C"] == 0.1
    assert ch4w.CV_PROBE_CS[0] == pytest.approx(1e-4)
    assert ch4w.CV_PROBE_CS[-1] == pytest.approx(1e4)
    assert len(ch4w.CV_PROBE_CS) == 10


def test_bad_input_names_the_argument(features):
    z, y = features
    head = ch4w.cross_validated_probe_head
    with pytest.raises(ValueError, match="y must hold labels"):
        head(z, torch.zeros(30))
    with pytest.raises(ValueError, match="z must have 2 dimensions"):
        head(z[:, 0], y)
    with pytest.raises(ValueError, match="y must have"):
        head(z, y[:10])
    with pytest.raises(ValueError, match="cs must be a non-empty tuple"):
        head(z, y, cs=())
    with pytest.raises(ValueError, match="cs must be increasing"):
        head(z, y, cs=(1.0, 0.1))
    with pytest.raises(ValueError, match="cs must be > 0"):
        head(z, y, cs=(0.0, 1.0))
    with pytest.raises(ValueError, match="head_scale must be > 0"):
        head(z, y, head_scale=0.0)
    with pytest.raises(ValueError, match="folds must be >= 2"):
        head(z, y, folds=1)
    with pytest.raises(ValueError, match="every class needs at least folds = 5"):
        head(z[:8], y[:8])
    with pytest.raises(ValueError, match="at least two classes"):
        ch4w.stratified_folds(torch.ones(10), 2)


def test_the_standard_head_takes_the_cv_probe():
    config = ch4f.KernelExperimentConfig(standard_head="cv_probe")
    assert config.standard_head == "cv_probe"
    with pytest.raises(ValueError, match="standard_head must be one of"):
        ch4f.KernelExperimentConfig(standard_head="sklearn")
