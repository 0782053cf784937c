"""Two theories of the pretraining-adaptation interface for contrastive learning
(Chapter 2).

Used in ``notebooks/02-interface.ipynb``. Every function computes a *population*
quantity
exactly, as a finite sum over the finite supports of :mod:`fmlab.data.contrastive`.

**Latent classes** (Arora et al. 2019). For a representation :math:`f` and a convex,
non-increasing loss :math:`\\ell` (logistic :math:`\\log(1+e^{-v})` or hinge
:math:`\\max(0,1-v)`),

.. math::
    L_{\\text{un}}(f) = \\mathbb E_{c, c^- \\sim \\rho}\\;\\mathbb E_{x, x^+ \\sim
    \\mathcal D_c,\\, x^- \\sim \\mathcal D_{c^-}}
    \\big[\\ell\\big(f(x)^\\top (f(x^+) - f(x^-))\\big)\\big],

the mean classifier of a two-class task :math:`\\{c, c'\\}` scores
:math:`f(x)^\\top(\\mu_c - \\mu_{c'})` with :math:`\\mu_c = \\mathbb E_{\\mathcal D_c}
f`, and its loss
averaged over tasks drawn from :math:`\\rho^2` conditioned on :math:`c \\ne c'` is

.. math::
    L^{\\mu}_{\\text{sup}}(f) = \\mathbb E_{(c,c') \\sim \\rho^2 \\mid c \\neq c'}\\;
    \\mathbb E_{x \\sim \\mathcal D_c}
    \\big[\\ell\\big(f(x)^\\top(\\mu_c - \\mu_{c'})\\big)\\big]
    \\;\\le\\; \\frac{L_{\\text{un}}(f) - \\tau\\,\\ell(0)}{1 - \\tau},
    \\qquad \\tau = \\sum_c \\rho(c)^2 .

**Augmentation graphs** (HaoChen et al. 2021). For a graph with weights :math:`w(x,x')`
and
marginal :math:`w_x`,

.. math::
    L_{\\text{spec}}(f) = -2\\,\\mathbb E_{(x,x^+)\\sim w}\\big[f(x)^\\top f(x^+)\\big]
    + \\mathbb E_{x, x' \\sim w_\\cdot}\\big[(f(x)^\\top f(x'))^2\\big]
    = \\lVert \\bar A - F F^\\top \\rVert_F^2 - \\lVert \\bar A \\rVert_F^2,

with :math:`\\bar A = D^{-1/2} W D^{-1/2}` and rows :math:`F_x = \\sqrt{w_x}\\, f(x)`.
Its
minimisers span the top-:math:`k` eigenvectors of :math:`\\bar A`, and their best linear
probe
has squared loss at most :math:`\\phi / \\lambda_{k+1}`, where :math:`\\phi` is the
probability
that a positive pair straddles two classes and :math:`\\lambda_{k+1}` the
:math:`(k{+}1)`-th
smallest eigenvalue of the normalised Laplacian :math:`I - \\bar A`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .._validate import (
    check_choice,
    check_float,
    check_int,
    check_same_length,
    check_tensor,
)

__all__ = [
    "pointwise_loss",
    "loss_at_zero",
    "collision_probability",
    "class_means",
    "within_class_spread",
    "unsupervised_contrastive_loss",
    "mean_classifier_loss",
    "contrastive_bound",
    "contrastive_loss_on_triples",
    "CurlTerms",
    "curl_terms",
    "BestHead",
    "best_head_loss",
    "jensen_slack_bound",
    "normalized_adjacency",
    "spectral_contrastive_loss",
    "make_spectral_loss",
    "spectral_loss_on_pairs",
    "SpectralMinimizer",
    "spectral_minimizer",
    "minimize_spectral_loss",
    "weighted_span_distance",
    "laplacian_eigenvalues",
    "top_eigenvectors",
    "label_leakage",
    "spectral_probe_bound",
    "approximate_minimizer_bound",
    "outside_subspace",
    "ProbeResult",
    "linear_probe_loss",
    "automorphism_defect",
]

_LOSSES = ("logistic", "hinge")


def pointwise_loss(v: torch.Tensor, loss: str = "logistic") -> torch.Tensor:
    """:math:`\\ell(v)`: ``"logistic"`` :math:`\\log(1+e^{-v})` or ``"hinge"``
    :math:`\\max(0, 1-v)`."""
    check_choice("loss", loss, _LOSSES)
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"v must be a torch.Tensor, got {type(v).__name__}")
    return F.softplus(-v) if loss == "logistic" else torch.relu(1.0 - v)


def loss_at_zero(loss: str = "logistic") -> float:
    """:math:`\\ell(0)`: :math:`\\log 2` for the logistic loss, 1 for the hinge loss."""
    check_choice("loss", loss, _LOSSES)
    return math.log(2.0) if loss == "logistic" else 1.0


def _check_probs(name: str, probs, size: int | None = None) -> torch.Tensor:
    probs = check_tensor(name, probs, ndim=1, floating=True)
    if size is not None and probs.numel() != size:
        raise ValueError(f"{name} must have {size} entries, got {probs.numel()}")
    if bool((probs < 0).any()) or abs(float(probs.sum()) - 1.0) > 1e-9:
        raise ValueError(
            f"{name} must be non-negative and sum to 1, "
            f"got sum {float(probs.sum()):.6g}"
        )
    return probs.double()


def collision_probability(class_probs: torch.Tensor) -> float:
    """:math:`\\tau = \\Pr_{c, c^- \\sim \\rho}[c = c^-] = \\sum_c \\rho(c)^2`."""
    return float(_check_probs("class_probs", class_probs).pow(2).sum())


def _check_features_labels(features, labels, n_classes: int | None = None):
    features = check_tensor("features", features, ndim=2, floating=True)
    labels = check_tensor("labels", labels, ndim=1, integer=True)
    check_same_length(("features", "labels"), features, labels)
    if labels.numel() == 0:
        raise ValueError("features must have at least one row")
    if int(labels.min()) < 0:
        raise ValueError("labels must be non-negative class indices")
    K = int(labels.max()) + 1 if n_classes is None else n_classes
    if int(labels.max()) >= K:
        raise ValueError(
            f"labels must be < {K} (the number of classes), got {int(labels.max())}"
        )
    counts = torch.bincount(labels, minlength=K)
    if bool((counts == 0).any()):
        raise ValueError(
            "every class must have at least one point; empty classes: "
            f"{torch.nonzero(counts == 0).flatten().tolist()}"
        )
    return features.double(), labels, K


def class_means(
    features: torch.Tensor, labels: torch.Tensor, n_classes: int | None = None
) -> torch.Tensor:
    """:math:`\\mu_c`, the mean representation of each class (uniform within the class):
    ``(K, k)``."""
    f, y, K = _check_features_labels(features, labels, n_classes)
    sums = torch.zeros(K, f.shape[1], dtype=f.dtype).index_add(0, y, f)
    return sums / torch.bincount(y, minlength=K)[:, None].to(f.dtype)


def within_class_spread(
    features: torch.Tensor, labels: torch.Tensor, class_probs: torch.Tensor
) -> float:
    """:math:`\\mathbb E_{c\\sim\\rho}\\,\\mathbb E_{x\\sim\\mathcal D_c}\\lVert
    f(x)-\\mu_c\\rVert^2`: the spread that
    makes Jensen's inequality (and hence Arora et al.'s bound) loose."""
    rho = _check_probs("class_probs", class_probs)
    f, y, K = _check_features_labels(features, labels, rho.numel())
    sq = (f - class_means(f, y, K)[y]).pow(2).sum(1)
    per_class = torch.zeros(K, dtype=f.dtype).index_add(0, y, sq) / torch.bincount(
        y, minlength=K
    ).to(f.dtype)
    return float((rho * per_class).sum())


def unsupervised_contrastive_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    class_probs: torch.Tensor,
    *,
    loss: str = "logistic",
) -> torch.Tensor:
    """The population loss :math:`L_{\\text{un}}(f)` of Arora et al. with one negative,
    exactly.

    Parameters
    ----------
    features : (N, k) tensor
        :math:`f(x)` at every point of the support.
    labels : (N,) integer tensor
        The latent class of each point; :math:`\\mathcal D_c` is uniform over the
        class's points.
    class_probs : (K,) tensor
        :math:`\\rho`.
    loss : {"logistic", "hinge"}

    Returns a 0-dim float64 tensor (differentiable in ``features``).
    """
    check_choice("loss", loss, _LOSSES)
    rho = _check_probs("class_probs", class_probs)
    f, y, K = _check_features_labels(features, labels, rho.numel())
    counts = torch.bincount(y, minlength=K).double()
    neg_prob = rho[y] / counts[y]  # probability that x^- is this point
    total = f.new_zeros(())
    for c in range(K):
        idx = torch.nonzero(y == c).flatten()
        s = f[idx] @ f.T  # f(x)^T f(z) for x in class c and every z
        v = s[:, idx][:, :, None] - s[:, None, :]  # (anchor, positive, negative)
        per_anchor = (pointwise_loss(v, loss) * neg_prob).sum(-1).mean(1)
        total = total + rho[c] * per_anchor.mean()
    return total


def mean_classifier_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    class_probs: torch.Tensor,
    *,
    loss: str = "logistic",
) -> torch.Tensor:
    """:math:`L^{\\mu}_{\\text{sup}}(f)`: the mean classifier's loss averaged over
    two-class tasks.

    A task is an ordered pair :math:`(c, c')` drawn from :math:`\\rho^2` conditioned on
    :math:`c \\neq c'` (equivalently: an unordered pair with probability proportional to
    :math:`\\rho(c)\\rho(c')`, its two classes weighted equally); the loss is taken on
    :math:`x \\sim \\mathcal D_c` with score :math:`f(x)^\\top(\\mu_c - \\mu_{c'})`.
    Returns a 0-dim float64 tensor.
    """
    check_choice("loss", loss, _LOSSES)
    rho = _check_probs("class_probs", class_probs)
    f, y, K = _check_features_labels(features, labels, rho.numel())
    tau = float(rho.pow(2).sum())
    if tau >= 1.0 - 1e-12:
        raise ValueError(
            "class_probs puts all mass on one class; there is no two-class task"
        )
    mu = class_means(f, y, K)
    scores = f @ mu.T  # (N, K): f(x)^T mu_c'
    margin = scores.gather(1, y[:, None]) - scores  # f(x)^T (mu_{c(x)} - mu_c')
    per_point = pointwise_loss(
        margin, loss
    )  # (N, K); the column c' = c(x) is excluded below
    pair_prob = rho[y][:, None] * rho[None, :] / (1.0 - tau)
    pair_prob = pair_prob.masked_fill(torch.nn.functional.one_hot(y, K).bool(), 0.0)
    counts = torch.bincount(y, minlength=K).double()
    return (per_point * pair_prob / counts[y][:, None]).sum()


def contrastive_bound(
    unsupervised_loss: float, tau: float, *, loss: str = "logistic"
) -> float:
    """The right-hand side :math:`(L_{\\text{un}} - \\tau\\,\\ell(0)) / (1 - \\tau)` of
    Arora et al.'s bound."""
    if isinstance(unsupervised_loss, torch.Tensor) and unsupervised_loss.numel() == 1:
        unsupervised_loss = float(unsupervised_loss)
    unsupervised_loss = check_float("unsupervised_loss", unsupervised_loss)
    tau = check_float("tau", tau, minimum=0.0, maximum=1.0)
    if tau >= 1.0:
        raise ValueError("tau must be < 1")
    return (unsupervised_loss - tau * loss_at_zero(loss)) / (1.0 - tau)


def contrastive_loss_on_triples(
    f: torch.Tensor, f_pos: torch.Tensor, f_neg: torch.Tensor, *, loss: str = "logistic"
) -> torch.Tensor:
    """The empirical loss :math:`\\frac1n\\sum_i \\ell(f(x_i)^\\top(f(x_i^+) -
    f(x_i^-)))` on a batch."""
    f = check_tensor("f", f, ndim=2, floating=True, finite=False)
    f_pos = check_tensor(
        "f_pos", f_pos, shape=tuple(f.shape), floating=True, finite=False
    )
    f_neg = check_tensor(
        "f_neg", f_neg, shape=tuple(f.shape), floating=True, finite=False
    )
    return pointwise_loss((f * (f_pos - f_neg)).sum(1), loss).mean()


@dataclass(frozen=True)
class CurlTerms:
    """Both sides of Arora et al.'s bound for one representation."""

    unsupervised: float  # L_un(f)
    mean_classifier: float  # L^mu_sup(f)
    bound: float  # (L_un - tau l(0)) / (1 - tau)
    tau: float

    @property
    def slack(self) -> float:
        """bound − :math:`L^{\\mu}_{\\text{sup}}` (≥ 0 by the theorem)."""
        return self.bound - self.mean_classifier


@torch.no_grad()
def curl_terms(
    features: torch.Tensor,
    labels: torch.Tensor,
    class_probs: torch.Tensor,
    *,
    loss: str = "logistic",
) -> CurlTerms:
    """:math:`L_{\\text{un}}`, :math:`L^{\\mu}_{\\text{sup}}` and the bound, all
    exact."""
    tau = collision_probability(class_probs)
    un = float(unsupervised_contrastive_loss(features, labels, class_probs, loss=loss))
    mc = float(mean_classifier_loss(features, labels, class_probs, loss=loss))
    return CurlTerms(
        unsupervised=un,
        mean_classifier=mc,
        bound=contrastive_bound(un, tau, loss=loss),
        tau=tau,
    )


@dataclass(frozen=True)
class BestHead:
    """The best norm-constrained linear head of every two-class task, averaged over
    tasks.

    ``loss`` is the task-averaged loss of the heads found, an upper bound on
    :math:`L^\\star_{\\text{adapt}}`; ``lower`` is a certified lower bound (the loss
    minus
    the Frank-Wolfe duality gap of each task's convex problem), so the true value lies
    in
    ``[lower, loss]``. ``heads[c, c']`` is the head of the task with :math:`y=+1` on
    class ``c`` (zero on the diagonal; ``heads[c', c] = -heads[c, c']``).
    """

    loss: float
    lower: float
    heads: torch.Tensor

    @property
    def gap(self) -> float:
        """``loss - lower``: how far from optimal the heads can be, at most."""
        return self.loss - self.lower


@torch.no_grad()
def best_head_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    class_probs: torch.Tensor,
    norm_bound: float,
    *,
    max_iter: int = 20000,
    tol: float = 1e-9,
) -> BestHead:
    """:math:`L^\\star_{\\text{adapt}}(f)` of Part I: the best head of norm at most
    ``c_0``.

    For the task :math:`\\{c, c'\\}` (label :math:`+1` on :math:`\\mathcal D_c`,
    :math:`-1` on
    :math:`\\mathcal D_{c'}`, each class with weight 1/2) the head solves

    .. math::
        \\min_{\\lVert\\gamma\\rVert_2 \\le c_0}\\;
        \\tfrac12\\,\\mathbb E_{x\\sim\\mathcal D_c}\\,\\ell\\big(\\gamma^\\top
        f(x)\\big)
        + \\tfrac12\\,\\mathbb E_{x\\sim\\mathcal D_{c'}}\\,\\ell\\big(-\\gamma^\\top
        f(x)\\big)

    with the logistic :math:`\\ell`, and tasks are weighted as in
    :func:`mean_classifier_loss` (:math:`\\rho(c)\\rho(c')/(1-\\tau)` per ordered pair),
    so
    that :math:`L^\\star_{\\text{adapt}} \\le L^{\\mu}_{\\text{sup}}` whenever every
    :math:`\\lVert\\mu_c - \\mu_{c'}\\rVert \\le c_0`. Solved for all tasks at once by
    accelerated projected gradient (FISTA with restarts) from :math:`\\gamma = 0`, until
    every task's Frank-Wolfe gap
    :math:`\\nabla h(\\gamma)^\\top\\gamma + c_0\\lVert\\nabla h(\\gamma)\\rVert \\ge
    h(\\gamma) - h^\\star`
    is below ``tol``, or until no step improves any task (round-off), or ``max_iter``
    steps.
    """
    rho = _check_probs("class_probs", class_probs)
    f, y, K = _check_features_labels(features, labels, rho.numel())
    c0 = check_float("norm_bound", norm_bound, minimum=0.0, strict_min=True)
    max_iter = check_int("max_iter", max_iter, minimum=1)
    tol = check_float("tol", tol, minimum=0.0, strict_min=True)
    tau = float(rho.pow(2).sum())
    if tau >= 1.0 - 1e-12:
        raise ValueError(
            "class_probs puts all mass on one class; there is no two-class task"
        )
    pairs = [(a, b) for a in range(K) for b in range(a + 1, K)]
    a_idx = torch.tensor([a for a, _ in pairs])
    b_idx = torch.tensor([b for _, b in pairs])
    # the points of task t (class a: label +1, class b: -1), padded with weight 0
    members = [torch.nonzero(y == c).flatten() for c in range(K)]
    size = max(len(members[a]) + len(members[b]) for a, b in pairs)
    index = torch.zeros(len(pairs), size, dtype=torch.long)
    weight = f.new_zeros(len(pairs), size)
    sign = f.new_zeros(len(pairs), size)
    for t, (a, b) in enumerate(pairs):
        na, nb = len(members[a]), len(members[b])
        index[t, : na + nb] = torch.cat([members[a], members[b]])
        weight[t, :na], weight[t, na : na + nb] = 0.5 / na, 0.5 / nb
        sign[t, :na], sign[t, na : na + nb] = 1.0, -1.0
    Z = sign[:, :, None] * f[index]  # (T, M, k): y f(x)
    # smoothness: h'' <= (1/4) E[f f^T], so the step 1/L with L = lambda_max / 4
    second = torch.einsum("tn,tni,tnj->tij", weight, Z, Z)
    lip = 0.25 * torch.linalg.eigvalsh(second)[:, -1].clamp_min(1e-12)

    def value_grad(g):
        m = torch.einsum("tnk,tk->tn", Z, g)
        val = (weight * F.softplus(-m)).sum(1)
        grad = -torch.einsum("tn,tnk->tk", weight * torch.sigmoid(-m), Z)
        return val, grad

    def frank_wolfe(g, grad):  # >= h(g) - min h over the ball, by convexity
        return ((grad * g).sum(1) + c0 * grad.norm(dim=1)).clamp_min(0.0)

    T, k = len(pairs), f.shape[1]
    g = f.new_zeros(T, k)
    val, grad = value_grad(g)
    z, t_mom = g.clone(), torch.ones(T, dtype=f.dtype)
    stalled = 0
    for it in range(max_iter):
        _, zgrad = value_grad(z)
        new = z - zgrad / lip[:, None]
        new = new * torch.clamp(c0 / new.norm(dim=1, keepdim=True), max=1.0)
        new_val, new_grad = value_grad(new)
        keep = new_val < val  # otherwise restart the momentum from the best point
        stalled = 0 if bool(keep.any()) else stalled + 1
        if stalled == 2:  # not even a plain gradient step helps: optimal to round-off
            break
        t_next = 0.5 * (1 + torch.sqrt(1 + 4 * t_mom**2))
        beta = ((t_mom - 1) / t_next)[:, None]
        z = torch.where(keep[:, None], new + beta * (new - g), g)
        t_mom = torch.where(keep, t_next, torch.ones_like(t_mom))
        g = torch.where(keep[:, None], new, g)
        val = torch.where(keep, new_val, val)
        grad = torch.where(keep[:, None], new_grad, grad)
        if it % 10 == 9 and bool((frank_wolfe(g, grad) < tol).all()):
            break
    fw = frank_wolfe(g, grad)
    task_prob = 2.0 * rho[a_idx] * rho[b_idx] / (1.0 - tau)
    heads = f.new_zeros(K, K, k)
    heads[a_idx, b_idx] = g
    heads[b_idx, a_idx] = -g
    return BestHead(
        loss=float((task_prob * val).sum()),
        lower=float((task_prob * (val - fw)).sum()),
        heads=heads,
    )


@torch.no_grad()
def jensen_slack_bound(
    features: torch.Tensor, labels: torch.Tensor, class_probs: torch.Tensor
) -> float:
    """An upper bound on the slack of Arora et al.'s bound for the logistic loss.

    The slack bound − :math:`L^{\\mu}_{\\text{sup}}` equals :math:`J/(1-\\tau)` with
    :math:`J` Jensen's gap; since :math:`\\ell'' \\le 1/4`,

    .. math::
        J \\le \\tfrac18\\,\\mathbb E_{c, c^-}\\,\\mathbb E_{x\\sim\\mathcal D_c}\\,
        f(x)^\\top(\\Sigma_c + \\Sigma_{c^-})f(x),

    with :math:`\\Sigma_c` the covariance of :math:`f` under :math:`\\mathcal D_c`.
    Returns
    that right-hand side divided by :math:`1 - \\tau`.
    """
    rho = _check_probs("class_probs", class_probs)
    f, y, K = _check_features_labels(features, labels, rho.numel())
    tau = float(rho.pow(2).sum())
    if tau >= 1.0 - 1e-12:
        raise ValueError(
            "class_probs puts all mass on one class; there is no two-class task"
        )
    centred = f - class_means(f, y, K)[y]
    counts = torch.bincount(y, minlength=K).double()
    cov = torch.einsum("n,ni,nj->nij", 1.0 / counts[y], centred, centred)
    cov = torch.zeros(K, f.shape[1], f.shape[1], dtype=f.dtype).index_add(0, y, cov)
    quad = torch.einsum("ni,cij,nj->nc", f, cov, f)  # f(x)^T Sigma_c' f(x)
    own = quad.gather(1, y[:, None]).squeeze(1)  # f(x)^T Sigma_{c(x)} f(x)
    per_point = own + quad @ rho  # E over c^- ~ rho
    anchor = rho[y] / counts[y]  # probability of the anchor x
    return float((anchor * per_point).sum()) / (8.0 * (1.0 - tau))


# --------------------------------------------------------------------------------------
# spectral contrastive learning on an augmentation graph
# --------------------------------------------------------------------------------------
def _check_weights(weights) -> torch.Tensor:
    W = check_tensor("weights", weights, ndim=2, floating=True)
    if W.shape[0] != W.shape[1]:
        raise ValueError(f"weights must be square, got shape {tuple(W.shape)}")
    W = W.double()
    if bool((W < 0).any()):
        raise ValueError("weights must be non-negative")
    if float((W - W.T).abs().max()) > 1e-10 * max(float(W.abs().max()), 1e-300):
        raise ValueError("weights must be symmetric")
    if abs(float(W.sum()) - 1.0) > 1e-8:
        raise ValueError(
            "weights must sum to 1 (a distribution over positive pairs), "
            f"got {float(W.sum()):.6g}"
        )
    if bool((W.sum(1) <= 0).any()):
        raise ValueError(
            "every point must have positive weight "
            "(no isolated zero-probability points)"
        )
    return W


def normalized_adjacency(weights: torch.Tensor) -> torch.Tensor:
    """:math:`\\bar A = D^{-1/2} W D^{-1/2}` with :math:`D =
    \\operatorname{diag}(w_x)`."""
    W = _check_weights(weights)
    s = W.sum(1).rsqrt()
    return s[:, None] * W * s[None, :]


def spectral_contrastive_loss(
    features: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """The population spectral contrastive loss :math:`L_{\\text{spec}}(f)`, exactly.

    ``features`` is ``(N, k)``: :math:`f(x)` at every vertex. Returns a 0-dim tensor in
    the
    dtype of ``features`` (float64 weights are cast), differentiable in ``features``.
    """
    W = _check_weights(weights)
    f = check_tensor("features", features, ndim=2, floating=True)
    if f.shape[0] != W.shape[0]:
        raise ValueError(
            f"features must have {W.shape[0]} rows (one per vertex), got {f.shape[0]}"
        )
    W = W.to(f.dtype)
    return _spectral_loss(f, W, W.sum(1))


def _spectral_loss(f: torch.Tensor, W: torch.Tensor, wx: torch.Tensor) -> torch.Tensor:
    attract = (f * (W @ f)).sum()
    M = f.T @ (wx[:, None] * f)  # E_x[f f^T]
    return -2.0 * attract + (M * M).sum()


def make_spectral_loss(weights: torch.Tensor, dtype: torch.dtype = torch.float32):
    """:func:`spectral_contrastive_loss` for a training loop: ``weights`` are checked
    and cast to ``dtype`` once, and the returned ``loss(features)`` does no checks (it
    computes exactly the same numbers, a third faster on Chapter 2's small graphs)."""
    W = _check_weights(weights)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    W = W.to(dtype)
    wx = W.sum(1)

    def loss(features: torch.Tensor) -> torch.Tensor:
        return _spectral_loss(features, W, wx)

    return loss


def spectral_loss_on_pairs(f: torch.Tensor, f_pos: torch.Tensor) -> torch.Tensor:
    """Unbiased mini-batch estimate of :math:`L_{\\text{spec}}` from ``n >= 2`` positive
    pairs.

    :math:`-\\frac2n\\sum_i f(x_i)^\\top f(x_i^+) + \\frac{1}{n(n-1)}\\sum_{i\\neq
    j}(f(x_i)^\\top f(x_j^+))^2`:
    for :math:`i \\ne j`, :math:`x_i` and :math:`x_j^+` are independent draws from the
    marginal.
    """
    f = check_tensor("f", f, ndim=2, floating=True, finite=False)
    f_pos = check_tensor(
        "f_pos", f_pos, shape=tuple(f.shape), floating=True, finite=False
    )
    n = f.shape[0]
    if n < 2:
        raise ValueError(f"f must hold at least 2 pairs, got {n}")
    G = f @ f_pos.T
    off = (G.pow(2).sum() - G.diagonal().pow(2).sum()) / (n * (n - 1))
    return -2.0 * G.diagonal().mean() + off


@dataclass(frozen=True)
class SpectralMinimizer:
    """A minimiser of :math:`L_{\\text{spec}}` over all :math:`f` with :math:`k`
    outputs."""

    features: torch.Tensor  # (N, k): f*(x) = w_x^{-1/2} F*_x
    eigenvalues: torch.Tensor  # (N,) eigenvalues of A-bar, descending
    loss: float  # -sum_{i<=k} max(nu_i, 0)^2


def spectral_minimizer(weights: torch.Tensor, k: int) -> SpectralMinimizer:
    """The minimiser from the eigendecomposition :math:`\\bar A = \\sum_i \\nu_i u_i
    u_i^\\top`.

    :math:`F^* = [u_1, \\dots, u_k]\\operatorname{diag}(\\sqrt{\\max(\\nu_i, 0)})` is a
    best PSD
    approximation of rank :math:`\\le k` of :math:`\\bar A` (Eckart-Young), hence
    minimises
    :math:`\\lVert \\bar A - FF^\\top\\rVert_F`; the minimal loss is
    :math:`-\\sum_{i\\le k}\\max(\\nu_i,0)^2`.
    With ties at :math:`\\nu_k = \\nu_{k+1}` the minimiser is not unique and this is one
    of them.
    """
    W = _check_weights(weights)
    k = check_int("k", k, minimum=1, maximum=W.shape[0])
    Abar = normalized_adjacency(W)
    nu, U = torch.linalg.eigh(Abar)
    nu, U = nu.flip(0), U.flip(1)
    top = nu[:k].clamp_min(0.0)
    Fstar = U[:, :k] * top.sqrt()
    f = Fstar * W.sum(1).rsqrt()[:, None]
    return SpectralMinimizer(features=f, eigenvalues=nu, loss=-float(top.pow(2).sum()))


def minimize_spectral_loss(
    weights: torch.Tensor, k: int, generator: torch.Generator, *, max_iter: int = 2000
) -> torch.Tensor:
    """Minimise :math:`L_{\\text{spec}}` over *all* functions on the vertices by L-BFGS.

    Starts from a random ``(N, k)`` table drawn from ``generator`` and hands the loss
    and its
    autograd gradient to SciPy's L-BFGS-B. No eigendecomposition is involved, so this is
    an
    independent check of :func:`spectral_minimizer`. Returns the table, float64.
    """
    import numpy as np
    from scipy.optimize import minimize

    W = _check_weights(weights)
    k = check_int("k", k, minimum=1, maximum=W.shape[0])
    max_iter = check_int("max_iter", max_iter, minimum=1)
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator, got {type(generator).__name__}"
        )
    shape = (W.shape[0], k)
    start = 0.5 * torch.randn(shape, generator=generator, dtype=torch.float64)

    def fun(flat):
        f = torch.from_numpy(flat.reshape(shape)).requires_grad_(True)
        loss = spectral_contrastive_loss(f, W)
        loss.backward()
        return float(loss.detach()), f.grad.numpy().ravel().astype(np.float64)

    res = minimize(
        fun,
        start.numpy().ravel(),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": max_iter, "ftol": 1e-15, "gtol": 1e-12, "maxcor": 30},
    )
    return torch.from_numpy(res.x.reshape(shape)).clone()


def weighted_span_distance(
    features_a: torch.Tensor, features_b: torch.Tensor, probs: torch.Tensor
) -> float:
    """Frobenius distance of the orthogonal projections onto the column spans of
    :math:`D^{1/2} f_a` and :math:`D^{1/2} f_b` (``probs`` is :math:`w_x`): 0 iff the
    two
    representations are invertible linear maps of each other."""
    fa = check_tensor("features_a", features_a, ndim=2, floating=True).double()
    fb = check_tensor("features_b", features_b, ndim=2, floating=True).double()
    check_same_length(("features_a", "features_b"), fa, fb)
    p = _check_probs("probs", probs, fa.shape[0]).sqrt()[:, None]

    def proj(f):
        U, S, _ = torch.linalg.svd(p * f, full_matrices=False)
        U = U[:, S > S.max() * 1e-10]
        return U @ U.T

    return float((proj(fa) - proj(fb)).norm())


def top_eigenvectors(weights: torch.Tensor, m: int) -> torch.Tensor:
    """The orthonormal eigenvectors :math:`u_1, \\dots, u_m` of :math:`\\bar A` with the
    largest eigenvalues, as the columns of an ``(N, m)`` float64 tensor (one choice of
    basis when eigenvalues tie at :math:`\\nu_m = \\nu_{m+1}`)."""
    W = _check_weights(weights)
    m = check_int("m", m, minimum=1, maximum=W.shape[0])
    _, U = torch.linalg.eigh(normalized_adjacency(W))
    return U.flip(1)[:, :m].contiguous()


def laplacian_eigenvalues(weights: torch.Tensor) -> torch.Tensor:
    """Eigenvalues :math:`0 = \\lambda_1 \\le \\lambda_2 \\le \\dots` of :math:`I -
    \\bar A`."""
    return (1.0 - torch.linalg.eigvalsh(normalized_adjacency(weights))).flip(0)


def _check_graph_labels(W: torch.Tensor, labels) -> torch.Tensor:
    labels = check_tensor("labels", labels, ndim=1, integer=True)
    if labels.numel() != W.shape[0]:
        raise ValueError(
            f"labels must have {W.shape[0]} entries (one per vertex), "
            f"got {labels.numel()}"
        )
    if int(labels.min()) < 0:
        raise ValueError("labels must be non-negative class indices")
    return labels


def label_leakage(weights: torch.Tensor, labels: torch.Tensor) -> float:
    """:math:`\\phi = \\Pr_{(x, x^+) \\sim w}[y(x) \\neq y(x^+)]`: how much augmentation
    mixes classes."""
    W = _check_weights(weights)
    y = _check_graph_labels(W, labels)
    return float(W[y[:, None] != y[None, :]].sum())


def spectral_probe_bound(weights: torch.Tensor, labels: torch.Tensor, k: int) -> float:
    """:math:`\\phi / \\lambda_{k+1}`, the guarantee on the probe's squared loss
    (``inf`` if :math:`\\lambda_{k+1} = 0`)."""
    W = _check_weights(weights)
    k = check_int("k", k, minimum=1, maximum=W.shape[0] - 1)
    lam = float(laplacian_eigenvalues(W)[k])
    phi = label_leakage(W, labels)
    return phi / lam if lam > 1e-12 else float("inf")


def approximate_minimizer_bound(
    weights: torch.Tensor, labels: torch.Tensor, k: int, excess: float
) -> float:
    """A guarantee for *every* representation, not only the minimisers (Chapter 2, Part
    II).

    For :math:`f` with :math:`k` outputs and excess pretraining loss
    :math:`\\varepsilon = L_{\\text{spec}}(f) - \\min L_{\\text{spec}} \\ge 0`,

    .. math::
        L^\\star_{\\text{adapt}}(f) \\le \\Big(\\sqrt{\\phi/\\lambda_{k+1}}
        + \\sqrt{p_{\\max}\\,\\varepsilon / (\\nu_k^2 - \\bar\\nu_{k+1}^2)}\\Big)^2,

    with :math:`\\nu_i` the eigenvalues of :math:`\\bar A` in decreasing order,
    :math:`\\bar\\nu_{k+1}^2 = \\max_{i>k}\\nu_i^2` (:math:`=\\nu_{k+1}^2` when
    :math:`\\bar A` is positive semidefinite, as for every augmentation graph),
    :math:`\\lambda_{k+1} = 1-\\nu_{k+1}` and :math:`p_{\\max}` the largest class
    probability under :math:`w_x`. At :math:`\\varepsilon = 0` it is
    :func:`spectral_probe_bound`. Returns ``inf`` when :math:`\\nu_k \\le 0`,
    :math:`\\lambda_{k+1} = 0` or there is no eigengap (:math:`\\nu_k^2 \\le
    \\bar\\nu_{k+1}^2`).
    The proof is in the notebook.
    """
    W = _check_weights(weights)
    y = _check_graph_labels(W, labels)
    k = check_int("k", k, minimum=1, maximum=W.shape[0] - 1)
    if isinstance(excess, torch.Tensor) and excess.numel() == 1:
        excess = float(excess)
    eps = check_float("excess", excess, minimum=-1e-9)
    eps = max(eps, 0.0)  # round-off at an exact minimiser
    nu = torch.linalg.eigvalsh(normalized_adjacency(W)).flip(0)
    nu_k, nu_rest = float(nu[k - 1]), float(nu[k:].pow(2).max())
    lam = 1.0 - float(nu[k])
    gap = nu_k**2 - nu_rest
    if nu_k <= 0.0 or lam <= 1e-12 or gap <= 1e-12:
        return float("inf")
    p_max = float(torch.bincount(y, weights=W.sum(1)).max())
    phi = label_leakage(W, y)
    return (math.sqrt(phi / lam) + math.sqrt(p_max * eps / gap)) ** 2


def outside_subspace(
    features: torch.Tensor, basis: torch.Tensor, probs: torch.Tensor
) -> float:
    """:math:`\\lVert (I - P_U) P_F \\rVert_F^2`: how much of the span of
    :math:`F = D^{1/2} f` lies outside the span of the orthonormal columns ``basis``
    (:math:`U`); ``probs`` is :math:`w_x`. It lies in :math:`[0, \\operatorname{rank}
    F]`."""
    f = check_tensor("features", features, ndim=2, floating=True).double()
    U = check_tensor("basis", basis, ndim=2, floating=True).double()
    check_same_length(("features", "basis"), f, U)
    p = _check_probs("probs", probs, f.shape[0]).sqrt()[:, None]
    Uf, S, _ = torch.linalg.svd(p * f, full_matrices=False)
    Uf = Uf[:, S > S.max() * 1e-10]
    resid = Uf - U @ (U.T @ Uf)
    return float(resid.pow(2).sum())


@dataclass(frozen=True)
class ProbeResult:
    """The best linear probe of one-hot labels, on the population."""

    mse: float  # min over (B, b) of E ||onehot(y) - B f(x) - b||^2
    error: float  # Pr[argmax (B f(x) + b) != y] for that head
    prediction: torch.Tensor = field(
        repr=False
    )  # (N,) argmax (B f(x) + b) at every point


def linear_probe_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    probs: torch.Tensor | None = None,
    *,
    bias: bool = True,
) -> ProbeResult:
    """Minimal adaptation loss of a linear probe with squared loss on one-hot labels.

    Solves the weighted least-squares problem
    :math:`\\min_{B,b} \\sum_x p(x)\\,\\lVert e_{y(x)} - B f(x) - b\\rVert^2` exactly
    (minimum-norm
    solution when the features are rank deficient). ``probs`` is the distribution of
    :math:`x` (uniform if ``None``; for an augmentation graph use its marginal
    :math:`w_x`).
    """
    f = check_tensor("features", features, ndim=2, floating=True).double()
    y = check_tensor("labels", labels, ndim=1, integer=True)
    n = check_same_length(("features", "labels"), f, y)
    if n == 0:
        raise ValueError("features must have at least one row")
    if int(y.min()) < 0:
        raise ValueError("labels must be non-negative class indices")
    p = (
        torch.full((n,), 1.0 / n, dtype=torch.float64)
        if probs is None
        else _check_probs("probs", probs, n)
    )
    if not isinstance(bias, bool):
        raise TypeError(f"bias must be a bool, got {type(bias).__name__}")
    X = torch.cat([f, torch.ones(n, 1, dtype=torch.float64)], 1) if bias else f
    Y = F.one_hot(y, int(y.max()) + 1).double()
    s = p.sqrt()[:, None]
    coef = torch.linalg.pinv(s * X, rtol=1e-10) @ (s * Y)
    pred = X @ coef
    mse = float((p * (Y - pred).pow(2).sum(1)).sum())
    error = float((p * (pred.argmax(1) != y).double()).sum())
    return ProbeResult(mse=mse, error=error, prediction=pred.argmax(1))


def automorphism_defect(weights: torch.Tensor, perm: torch.Tensor) -> float:
    """:math:`\\max_{x,x'} |w(\\pi x, \\pi x') - w(x, x')|`: zero iff :math:`\\pi` is a
    graph automorphism."""
    W = _check_weights(weights)
    perm = check_tensor("perm", perm, shape=(W.shape[0],), integer=True)
    if not torch.equal(torch.sort(perm).values, torch.arange(W.shape[0])):
        raise ValueError("perm must be a permutation of range(N)")
    return float((W[perm][:, perm] - W).abs().max())
