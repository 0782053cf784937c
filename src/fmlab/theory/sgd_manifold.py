"""A manifold of minimisers on which SGD's own noise lowers the trace of the Hessian
(Chapter 5).

Used in Chapter 5 (``notebooks/05-implicit-bias.ipynb``). The smallest language model:
tokens :math:`y \\in \\{1,\\dots,K\\}` drawn i.i.d. from :math:`p^\\star`, and a
factorised model

.. math::
    p_\\theta(y) = \\mathrm{softmax}(z)_y, \\qquad z_k = u_k v_k \\; (k < K),
    \\qquad z_K = 0,

with parameters :math:`\\theta = (u, v) \\in \\mathbb{R}^{2(K-1)}`, trained by
cross-entropy on mini-batches of :math:`B` fresh tokens. The model is well specified, so
the global minimisers are

.. math::
    \\Gamma = \\{(u, v) : u_k v_k = c_k\\}, \\qquad
    c_k = \\log(p^\\star_k / p^\\star_K),

a product of :math:`K-1` hyperbolas. With :math:`F = \\operatorname{diag}(p) - pp^\\top`
the Hessian is :math:`J^\\top F J` plus a term whose trace vanishes (each :math:`z_k`
has zero diagonal second derivatives), so everywhere

.. math::
    \\operatorname{tr}\\nabla^2 L(\\theta) = \\sum_{k<K} p_k(1-p_k)\\,(u_k^2 + v_k^2),

which on :math:`\\Gamma` ranges from :math:`\\sum_k 2F_{kk}|c_k|` (balanced,
:math:`|u_k| = |v_k|`) to infinity. Write :math:`u_k = \\sqrt{|c_k|}e^{s_k}`,
:math:`|v_k| = \\sqrt{|c_k|}e^{-s_k}`; then :math:`u_k^2+v_k^2 = 2|c_k|\\cosh 2s_k`.

**The limiting flow.** At a minimiser the mini-batch gradient has covariance :math:`H/B`
(the Bartlett identity). Li, Wang and Arora (2022, Corollary 5.2) show that SGD with
learning rate :math:`\\eta` then follows, on the time scale :math:`t = \\eta^2 \\times`
steps, :math:`\\dot\\theta = -\\frac{1}{4B}\\nabla_\\Gamma \\operatorname{tr}
H(\\theta)`. On one hyperbola this is :math:`\\dot s_k = -\\frac{F_{kk}}{2B}\\tanh 2
s_k`, solved by

.. math::
    \\sinh 2 s_k(t) = \\sinh 2 s_k(0)\\, e^{-F_{kk} t / B}.

:func:`sgd_on_manifold_model` simulates SGD (many runs and settings at once);
:func:`flow_trace` evaluates the prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import check_float, check_int, check_tensor

__all__ = [
    "ManifoldModel",
    "hessian_trace_uv",
    "excess_loss_uv",
    "sgd_on_manifold_model",
    "flow_trace",
    "SGDPaths",
]


@dataclass(frozen=True)
class ManifoldModel:
    """The factorised categorical model: the true distribution ``p_star`` (K,),
    float64."""

    p_star: torch.Tensor

    def __post_init__(self):
        p = check_tensor("p_star", self.p_star, ndim=1, floating=True)
        if p.numel() < 2 or bool((p <= 0).any()) or abs(float(p.sum()) - 1) > 1e-9:
            raise ValueError(
                "p_star must be a positive probability vector with at least 2 entries"
            )

    @property
    def c(self) -> torch.Tensor:
        """The constraints :math:`c_k = \\log(p^\\star_k/p^\\star_K)` of the manifold,
        ``(K-1,)``."""
        p = self.p_star.double()
        return (p[:-1] / p[-1]).log()

    @property
    def fisher_diag(self) -> torch.Tensor:
        """:math:`F_{kk} = p^\\star_k(1-p^\\star_k)`, ``(K-1,)``: the curvature weights
        on the manifold."""
        p = self.p_star.double()[:-1]
        return p * (1 - p)

    def point(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The minimiser with log-imbalance ``s`` (``(K-1,)`` or ``(R, K-1)``): ``(u,
        v)``."""
        c = self.c
        r = c.abs().sqrt()
        return r * torch.exp(s), torch.sign(c) * r * torch.exp(-s)

    def min_trace(self) -> float:
        """The smallest :math:`\\operatorname{tr} H` on the manifold, :math:`\\sum_k
        2F_{kk}|c_k|`."""
        return float((2 * self.fisher_diag * self.c.abs()).sum())


def _probs(u, v):
    z = torch.cat([u * v, torch.zeros(*u.shape[:-1], 1, dtype=u.dtype)], dim=-1)
    return torch.softmax(z, dim=-1)


def hessian_trace_uv(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """:math:`\\operatorname{tr}\\nabla^2 L = \\sum_k p_k(1-p_k)(u_k^2+v_k^2)` at any
    point (batched over rows)."""
    p = _probs(u, v)[..., :-1]
    return (p * (1 - p) * (u**2 + v**2)).sum(-1)


def excess_loss_uv(
    u: torch.Tensor, v: torch.Tensor, p_star: torch.Tensor
) -> torch.Tensor:
    """:math:`L(\\theta) - L^\\star = \\mathrm{KL}(p^\\star \\,\\|\\, p_\\theta)`
    (batched over rows)."""
    p = _probs(u, v)
    ps = p_star.to(p.dtype)
    return (ps * (ps.log() - p.log())).sum(-1)


@dataclass
class SGDPaths:
    """Recorded SGD runs: ``steps`` (k,), and per record and run ``trace``/``excess``
    (k, R), ``s`` (k, R, K-1)."""

    steps: torch.Tensor
    trace: torch.Tensor
    excess: torch.Tensor
    s: torch.Tensor


def sgd_on_manifold_model(
    model: ManifoldModel,
    s0: torch.Tensor,
    lr: torch.Tensor,
    batch: torch.Tensor,
    *,
    steps: int,
    record_every: int,
    generator: torch.Generator,
) -> SGDPaths:
    """Mini-batch SGD on the cross-entropy of fresh tokens, for ``R`` runs in parallel.

    Parameters
    ----------
    model : ManifoldModel
    s0 : tensor (K-1,)
        Starting minimiser, by its log-imbalance (``model.point(s0)``).
    lr, batch : tensors (R,)
        Learning rate and batch size of each run (runs may differ in both).
    steps, record_every : int
        Number of SGD steps, and the spacing of the records (step 0 included).
    generator : torch.Generator
        The only source of randomness: the tokens of every mini-batch.

    Each step draws the token counts of a batch, :math:`n \\sim \\mathrm{Multinomial}(B,
    p^\\star)` (by a chain of binomials, so runs with different :math:`B` share one
    call), and uses the exact mini-batch gradient :math:`\\nabla_z = p_\\theta - n/B`,
    :math:`\\nabla_u = \\nabla_z \\odot v`, :math:`\\nabla_v = \\nabla_z \\odot u`.
    There is no added noise of any kind."""
    if not isinstance(model, ManifoldModel):
        raise TypeError(f"model must be a ManifoldModel, got {type(model).__name__}")
    K = model.p_star.numel()
    s0 = check_tensor("s0", s0, shape=(K - 1,), floating=True).double()
    lr = check_tensor("lr", lr, ndim=1, floating=True).double()
    batch = check_tensor("batch", batch, shape=(lr.shape[0],)).double()
    if bool((lr <= 0).any()) or bool((batch < 1).any()):
        raise ValueError("lr must be > 0 and batch >= 1 in every run")
    steps = check_int("steps", steps, minimum=1)
    record_every = check_int("record_every", record_every, minimum=1, maximum=steps)
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator, got {type(generator).__name__}"
        )
    R = lr.shape[0]
    u0, v0 = model.point(s0)
    u, v = u0.expand(R, -1).clone(), v0.expand(R, -1).clone()
    p_star = model.p_star.double()
    cond = p_star / torch.flip(
        torch.flip(p_star, [0]).cumsum(0), [0]
    )  # p_k / (p_k + ... + p_K)
    rec_steps, rec_tr, rec_ex, rec_s = [], [], [], []

    def record(k):
        rec_steps.append(k)
        rec_tr.append(hessian_trace_uv(u, v))
        rec_ex.append(excess_loss_uv(u, v, p_star))
        rec_s.append(0.5 * (u.abs() / v.abs()).log())

    record(0)
    for k in range(1, steps + 1):
        left = batch.clone()
        counts = []
        for j in range(K - 1):
            nj = torch.binomial(left, cond[j].expand(R), generator=generator)
            counts.append(nj)
            left = left - nj
        freq = torch.stack(counts, dim=-1) / batch[:, None]  # (R, K-1)
        gz = _probs(u, v)[:, :-1] - freq
        u, v = u - lr[:, None] * gz * v, v - lr[:, None] * gz * u
        if k % record_every == 0:
            record(k)
    return SGDPaths(
        steps=torch.tensor(rec_steps),
        trace=torch.stack(rec_tr),
        excess=torch.stack(rec_ex),
        s=torch.stack(rec_s),
    )


def flow_trace(
    model: ManifoldModel, s0: torch.Tensor, t: torch.Tensor, batch: float
) -> torch.Tensor:
    """The predicted :math:`\\operatorname{tr} H` along the limiting flow at times ``t``
    (:math:`t = \\eta^2 \\times` steps).

    :math:`\\sum_k 2F_{kk}|c_k|\\cosh 2s_k(t)` with :math:`\\sinh 2s_k(t) = \\sinh
    2s_k(0)e^{-F_{kk}t/B}`."""
    if not isinstance(model, ManifoldModel):
        raise TypeError(f"model must be a ManifoldModel, got {type(model).__name__}")
    K = model.p_star.numel()
    s0 = check_tensor("s0", s0, shape=(K - 1,), floating=True).double()
    t = check_tensor(
        "t", torch.as_tensor(t, dtype=torch.float64), ndim=1, floating=True
    )
    batch = check_float("batch", batch, minimum=0.0, strict_min=True)
    F = model.fisher_diag
    s = 0.5 * torch.asinh(torch.sinh(2 * s0) * torch.exp(-F * t[:, None] / batch))
    return (2 * F * model.c.abs() * torch.cosh(2 * s)).sum(-1)
