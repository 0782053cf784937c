"""The Dyck-language construction of Liu et al. (2023, section 6): flatness picks
transferable features.

Used in Chapter 5 (``notebooks/05-implicit-bias.ipynb``).

**Language.** Sentences of even length :math:`n` over brackets, written as signs
:math:`x_j \\in \\{+1 (\\text{"("}), -1 (\\text{")"})\\}`, with as many of each
(:math:`\\sum_j x_j = 0`), uniform over all :math:`\\binom{n}{n/2}` of them. Pretraining
masks one uniform position :math:`i`; since the counts balance, the masked sign is
:math:`y = -\\sum_{j \\ne i} x_j`.

**Encoding.** Token :math:`j` is a vector in :math:`\\mathbb{R}^{2n}`: :math:`x_j e_j`
if visible and :math:`e_{n+j}` if masked. A sentence is the matrix :math:`X \\in
\\mathbb{R}^{n\\times 2n}` of its tokens.

**Model.** One attention layer and one MLP layer, read at the first token:

.. math::
    a(X) = \\sum_j \\mathrm{softmax}_j\\big((W_Q X_1)^\\top W_K X_j\\big)\\, W_V X_j,
    \\qquad
    f_\\theta(X) = \\sum_{r=1}^m w_{2,r}\\, \\mathrm{relu}(w_{1,r}^\\top a(X)),

trained with the squared loss :math:`L(\\theta) = \\mathbb{E}(f_\\theta(X) - y)^2`.
Where the loss is zero, :math:`\\nabla^2 L = 2\\mathbb{E}[\\nabla f \\nabla f^\\top]`,
so :math:`\\operatorname{tr}\\nabla^2 L = 2\\mathbb{E}\\lVert\\nabla_\\theta f\\rVert^2`
(Lemma D.4), computed exactly by summing over every masked sentence
(:func:`exact_trace`).

**Two solutions with zero pretraining loss.** With :math:`W_Q = W_K = 0` the attention
averages the tokens. (1) *Transferable*: two neurons reading the bracket count,
:math:`w_{1} = \\beta(\\mathbf 1_n, 0)`, :math:`w_{2} = -\\beta(\\mathbf 1_n, 0)`,
output weights :math:`\\mp\\gamma`. (2) *Memorising*: :math:`m` random Gaussian neurons,
output weights fitted by minimum-norm least squares to every masked sentence. Both are
then *rebalanced*: the loss is invariant under :math:`w_{1,r} \\to c_r w_{1,r}/\\alpha`,
:math:`w_{2,r} \\to w_{2,r}/c_r`, :math:`W_V \\to \\alpha W_V`, and :func:`rebalance`
picks the scales that minimise the trace in closed form, so each solution is compared at
its flattest.

**Downstream.** Random sequences :math:`x \\in \\{\\pm1\\}^n` (no mask, not balanced)
with target :math:`\\tau(x) = \\sum_j x_j`, the bracket surplus; a minimum-norm linear
head on the neurons :math:`\\mathrm{relu}(W_1 a(X))`, trained on :math:`N` examples,
population error exact over all :math:`2^n` sequences (:func:`downstream_error`)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch.func import grad, vmap

from .._validate import check_int

__all__ = [
    "DyckSolution",
    "balanced_sentences",
    "masked_inputs",
    "downstream_inputs",
    "dyck_forward",
    "transferable_solution",
    "memorizing_solution",
    "rebalance",
    "pretraining_loss",
    "exact_trace",
    "downstream_error",
]


@dataclass
class DyckSolution:
    """Parameters of the single-layer transformer: ``wq, wk, wv`` (2n, 2n), ``w1`` (m,
    2n), ``w2`` (m,)."""

    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor

    def params(self) -> dict[str, torch.Tensor]:
        return {
            "wq": self.wq,
            "wk": self.wk,
            "wv": self.wv,
            "w1": self.w1,
            "w2": self.w2,
        }

    @property
    def n_neurons(self) -> int:
        return self.w1.shape[0]


def balanced_sentences(n: int) -> torch.Tensor:
    """All sign sequences of length ``n`` (even) with zero sum: ``(binom(n, n/2), n)``,
    float64."""
    n = check_int("n", n, minimum=2)
    if n % 2:
        raise ValueError(f"n must be even, got {n}")
    rows = [
        [1.0 if j in ups else -1.0 for j in range(n)]
        for ups in itertools.combinations(range(n), n // 2)
    ]
    return torch.tensor(rows, dtype=torch.float64)


def masked_inputs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every masked sentence, encoded: inputs ``(N, n, 2n)`` and targets ``(N,)`` (the
    masked sign).

    Each balanced sentence appears once per mask position, so the rows are equally
    likely."""
    sents = balanced_sentences(n)
    X, y = [], []
    eye = torch.eye(2 * n, dtype=torch.float64)
    for s in sents:
        base = s[:, None] * eye[:n]  # visible encodings x_j e_j
        for i in range(n):
            enc = base.clone()
            enc[i] = eye[n + i]
            X.append(enc)
            y.append(s[i])
    return torch.stack(X), torch.tensor(y, dtype=torch.float64)


def downstream_inputs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All ``2^n`` unmasked sign sequences, encoded ``(2^n, n, 2n)``, and
    :math:`\\tau(x) = \\sum_j x_j`."""
    n = check_int("n", n, minimum=1)
    seqs = torch.tensor(
        list(itertools.product([1.0, -1.0], repeat=n)), dtype=torch.float64
    )
    eye = torch.eye(2 * n, dtype=torch.float64)
    X = seqs[:, :, None] * eye[:n][None]
    return X, seqs.sum(1)


def _attend(p, X):
    q = X[..., 0, :] @ p["wq"].T  # query of the first token
    k = X @ p["wk"].T
    att = torch.softmax((k @ q[..., None])[..., 0], dim=-1)
    return (att[..., None] * (X @ p["wv"].T)).sum(-2)


def neurons(p: dict, X: torch.Tensor) -> torch.Tensor:
    """The MLP activations :math:`\\mathrm{relu}(W_1 a(X))`: ``(N, m)`` (the downstream
    features)."""
    return torch.relu(_attend(p, X) @ p["w1"].T)


def dyck_forward(p: dict, X: torch.Tensor) -> torch.Tensor:
    """:math:`f_\\theta(X)` for a batch ``(N, n, 2n)`` (or one sentence ``(n, 2n)``)."""
    return neurons(p, X) @ p["w2"]


def _zeros(n):
    return torch.zeros(2 * n, 2 * n, dtype=torch.float64)


def transferable_solution(n: int) -> DyckSolution:
    """Solution (1): uniform attention and two neurons reading the bracket count (before
    rebalancing)."""
    n = check_int("n", n, minimum=2)
    ones = torch.cat([torch.ones(n), torch.zeros(n)]).double()
    w1 = torch.stack([ones, -ones])
    w2 = torch.tensor([-float(n), float(n)], dtype=torch.float64)
    return DyckSolution(
        _zeros(n), _zeros(n), torch.eye(2 * n, dtype=torch.float64), w1, w2
    )


def memorizing_solution(n: int, m: int, generator: torch.Generator) -> DyckSolution:
    """Solution (2): ``m`` random Gaussian neurons with minimum-norm least-squares
    output weights."""
    n = check_int("n", n, minimum=2)
    m = check_int("m", m, minimum=1)
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator, got {type(generator).__name__}"
        )
    w1 = torch.randn(m, 2 * n, generator=generator, dtype=torch.float64)
    sol = DyckSolution(
        _zeros(n),
        _zeros(n),
        torch.eye(2 * n, dtype=torch.float64),
        w1,
        torch.zeros(m, dtype=torch.float64),
    )
    X, y = masked_inputs(n)
    Phi = neurons(sol.params(), X)
    sol.w2 = torch.linalg.lstsq(Phi, y[:, None], driver="gelsd").solution[:, 0]
    return sol


def pretraining_loss(sol: DyckSolution) -> float:
    """:math:`\\mathbb{E}(f_\\theta(X) - y)^2` over every masked sentence (exact)."""
    n = sol.wv.shape[0] // 2
    X, y = masked_inputs(n)
    return float((dyck_forward(sol.params(), X) - y).pow(2).mean())


def _trace_terms(sol: DyckSolution):
    """Per-neuron :math:`P_r = \\mathbb{E}[\\partial f/\\partial w_{2,r}]^2`, :math:`Q_r
    = \\mathbb{E}\\lVert\\partial f/\\partial w_{1,r}\\rVert^2`, and :math:`R =
    \\mathbb{E}\\lVert\\partial f/\\partial W_V\\rVert_F^2` (uniform attention,
    :math:`W_Q = W_K = 0`)."""
    n = sol.wv.shape[0] // 2
    X, _ = masked_inputs(n)
    abar = X.mean(1)  # uniform attention: the mean encoding
    a = abar @ sol.wv.T
    pre = a @ sol.w1.T
    act = (pre > 0).double()
    P = torch.relu(pre).pow(2).mean(0)
    Q = sol.w2.pow(2) * (act * a.pow(2).sum(1, keepdim=True)).mean(0)
    g = (act * sol.w2) @ sol.w1  # (N, 2n): df/da
    R = (g.pow(2).sum(1) * abar.pow(2).sum(1)).mean()
    return P, Q, R


def rebalance(sol: DyckSolution) -> DyckSolution:
    """The same function at its flattest point of the rescaling symmetry (closed form).

    With :math:`W_V \\to \\alpha W_V`, :math:`w_{1,r} \\to c_r w_{1,r}/\\alpha`,
    :math:`w_{2,r} \\to w_{2,r}/c_r`, :math:`\\tfrac12\\operatorname{tr}\\nabla^2 L =
    \\sum_r(c_r^2 P_r + \\alpha^2 Q_r/c_r^2) + R/\\alpha^2`, minimised by :math:`c_r^2 =
    \\alpha\\sqrt{Q_r/P_r}` and :math:`\\alpha^3 = R / \\sum_r\\sqrt{P_rQ_r}`. Requires
    uniform attention (:math:`W_Q = W_K = 0`) and zero pretraining loss. Dead neurons
    are dropped."""
    if not isinstance(sol, DyckSolution):
        raise TypeError(f"sol must be a DyckSolution, got {type(sol).__name__}")
    if bool(sol.wq.abs().max() > 0) or bool(sol.wk.abs().max() > 0):
        raise ValueError("rebalance needs uniform attention (wq = wk = 0)")
    P, Q, R = _trace_terms(sol)
    alive = (P > 0) & (Q > 0)
    P, Q = P[alive], Q[alive]
    s = (P * Q).sqrt().sum()
    alpha = (R / s) ** (1.0 / 3.0)
    c = (alpha * (Q / P).sqrt()).sqrt()
    return DyckSolution(
        sol.wq.clone(),
        sol.wk.clone(),
        alpha * sol.wv,
        sol.w1[alive] * (c / alpha)[:, None],
        sol.w2[alive] / c,
    )


def exact_trace(sol: DyckSolution) -> float:
    """:math:`2\\mathbb{E}\\lVert\\nabla_\\theta f_\\theta(X)\\rVert^2` over every
    masked sentence, all parameters.

    Equal to :math:`\\operatorname{tr}\\nabla^2 L` wherever the pretraining loss is zero
    (per-example gradients by ``torch.func``; the unit tests compare with the autograd
    Hessian)."""
    if not isinstance(sol, DyckSolution):
        raise TypeError(f"sol must be a DyckSolution, got {type(sol).__name__}")
    n = sol.wv.shape[0] // 2
    X, _ = masked_inputs(n)
    gs = vmap(grad(lambda p, x: dyck_forward(p, x)), in_dims=(None, 0))(sol.params(), X)
    return float(
        2 * sum(t.reshape(t.shape[0], -1).pow(2).sum(1) for t in gs.values()).mean()
    )


def downstream_error(
    sol: DyckSolution, n_train: int, generator: torch.Generator
) -> float:
    """Population squared error of predicting :math:`\\tau(x)` with a minimum-norm
    linear head on the neurons.

    ``n_train`` sequences are drawn uniformly (with replacement) from the ``2^n``; the
    head (with a bias) is the minimum-norm least-squares fit; the error is exact over
    all ``2^n`` sequences, divided by :math:`\\operatorname{Var}\\tau = n` (so 1 is the
    error of predicting 0)."""
    n = sol.wv.shape[0] // 2
    n_train = check_int("n_train", n_train, minimum=1)
    X, tau = downstream_inputs(n)
    Phi = torch.cat(
        [neurons(sol.params(), X), torch.ones(len(X), 1, dtype=torch.float64)], 1
    )
    idx = torch.randint(len(X), (n_train,), generator=generator)
    head = torch.linalg.pinv(Phi[idx], rtol=1e-10) @ tau[idx]
    return float((Phi @ head - tau).pow(2).mean() / n)
