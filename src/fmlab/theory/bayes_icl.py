"""Exact Bayesian in-context prediction for a mixture of HMMs (Chapter 6).

For concepts :math:`c \\in \\{1,\\dots,C\\}` with prior :math:`\\pi(c)`, each an HMM
with initial law :math:`\\mu_c`, transition matrix :math:`T_c` and emission matrix
:math:`O_c`, the **forward variables**

.. math::
    \\alpha_t^{c}(h) = p(o_{1:t}, h_t = h \\mid c), \\qquad
    \\alpha_1^{c} = \\mu_c \\odot O_c[:, o_1], \\qquad
    \\alpha_{t+1}^{c} = (T_c^\\top \\alpha_t^{c}) \\odot O_c[:, o_{t+1}]

give the likelihood :math:`p(o_{1:t}\\mid c) = \\sum_h \\alpha_t^c(h)`, the **posterior
over concepts** :math:`p(c \\mid o_{1:t}) \\propto \\pi(c)\\, p(o_{1:t}\\mid c)` and the
**posterior predictive**

.. math::
    p(o_{t+1} = v \\mid o_{1:t}) = \\sum_c p(c \\mid o_{1:t})\\,
    \\frac{\\big(\\alpha_t^{c\\top} T_c O_c\\big)_v}{\\sum_h \\alpha_t^c(h)} .

Everything is computed for a batch of sequences and all concepts at once, in log space:
:math:`\\log\\alpha_{t+1} = \\log\\big(\\exp(\\log\\alpha_t - m_t)\\, T\\big) + m_t +
\\log O[:, o_{t+1}]` with
:math:`m_t = \\max_h \\log\\alpha_t(h)`, which never underflows however long the
sequence.

In-context prompts are not drawn from the pretraining distribution: the delimiter and
the jump to a fresh example can have probability zero under every pretraining HMM, and
then the posterior is 0/0. :func:`smooth_transitions` mixes every transition matrix with
the uniform one, :math:`T^{(\\varepsilon)} = (1-\\varepsilon)\\,T +
\\varepsilon\\,\\mathbf{1}\\mathbf{1}^\\top / H`; ``epsilon`` is an explicit parameter
of :func:`fmlab.data.ginc.ginc_bayes_predictor`.

Used in Chapter 6 (``notebooks/06-in-context-learning.ipynb``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import check_float, check_tensor

__all__ = [
    "smooth_transitions",
    "forward_log_alpha",
    "forward_log_alpha_deterministic",
    "log_likelihood",
    "prefix_log_likelihoods",
    "next_token_distribution",
    "BayesPrediction",
    "bayes_posterior_predictive",
    "log_likelihood_given_state",
]


def smooth_transitions(transitions: torch.Tensor, epsilon: float) -> torch.Tensor:
    """:math:`(1-\\varepsilon)\\,T + \\varepsilon / H` for transition matrices
    ``(..., H, H)``."""
    transitions = check_tensor("transitions", transitions, floating=True)
    if transitions.ndim < 2 or transitions.shape[-1] != transitions.shape[-2]:
        raise ValueError(
            "transitions must end in two equal axes (H, H), got shape "
            f"{tuple(transitions.shape)}"
        )
    epsilon = check_float("epsilon", epsilon, minimum=0.0, maximum=1.0)
    H = transitions.shape[-1]
    return (1.0 - epsilon) * transitions + epsilon / H


def _check_hmm(tokens, transitions, emissions, initial):
    tokens = check_tensor("tokens", tokens, ndim=2, integer=True)
    if tokens.shape[1] < 1:
        raise ValueError("tokens must hold at least one position")
    transitions = check_tensor("transitions", transitions, ndim=3, floating=True)
    C, H, H2 = transitions.shape
    if H != H2:
        raise ValueError(
            f"transitions must have shape (C, H, H), got {tuple(transitions.shape)}"
        )
    emissions = check_tensor("emissions", emissions, floating=True)
    if emissions.ndim == 2:
        emissions = emissions.unsqueeze(0).expand(C, -1, -1)
    if emissions.ndim != 3 or emissions.shape[:2] != (C, H):
        raise ValueError(
            f"emissions must have shape (H, V) or (C, H, V) with C={C}, H={H}, got "
            f"{tuple(emissions.shape)}"
        )
    V = emissions.shape[2]
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= V):
        raise ValueError(f"tokens must lie in [0, {V - 1}]")
    initial = check_tensor("initial", initial, floating=True)
    B = tokens.shape[0]
    if initial.ndim == 2:
        initial = initial.unsqueeze(0).expand(B, -1, -1)
    if initial.ndim != 3 or initial.shape != (B, C, H):
        raise ValueError(
            f"initial must have shape (C, H) or (B, C, H) with B={B}, C={C}, H={H}, "
            f"got {tuple(initial.shape)}"
        )
    return tokens, transitions, emissions, initial


def _log(x: torch.Tensor) -> torch.Tensor:
    return torch.log(x.clamp_min(0.0))  # log 0 = -inf is intended


def _forward(tokens, transitions, emissions, initial, prefixes: bool = False):
    r"""Log forward variables at the last position, layout ``(C, B, H)``.

    With ``prefixes=True`` also return :math:`\log p(o_{1:t}\mid c)` for every ``t``,
    shape ``(C, B, t)``.
    """
    logO = _log(emissions).permute(0, 2, 1)  # (C, V, H)
    la = _log(initial).permute(1, 0, 2) + logO[:, tokens[:, 0]]  # (C, B, H)
    lls = [torch.logsumexp(la, dim=2)] if prefixes else None
    for t in range(1, tokens.shape[1]):
        m = la.amax(dim=2, keepdim=True)
        m = torch.where(
            torch.isfinite(m), m, torch.zeros_like(m)
        )  # all -inf: keep -inf
        q = torch.bmm(torch.exp(la - m), transitions)  # (C, B, H)
        la = _log(q) + m + logO[:, tokens[:, t]]
        if prefixes:
            lls.append(torch.logsumexp(la, dim=2))
    return (la, torch.stack(lls, dim=2)) if prefixes else la


def forward_log_alpha(
    tokens: torch.Tensor,
    transitions: torch.Tensor,
    emissions: torch.Tensor,
    initial: torch.Tensor,
) -> torch.Tensor:
    """:math:`\\log \\alpha_t^c(h)` at the last position ``t``, shape ``(B, C, H)``.

    Parameters
    ----------
    tokens : (B, t) int
        Observed sequences (all of the same length ``t >= 1``).
    transitions : (C, H, H) float
        Row-stochastic transition matrix of each concept.
    emissions : (H, V) or (C, H, V) float
        Emission probabilities (shared or per concept).
    initial : (C, H) or (B, C, H) float
        Law of the first hidden state (per concept, optionally per sequence).
    """
    args = _check_hmm(tokens, transitions, emissions, initial)
    return _forward(*args).permute(1, 0, 2)


def log_likelihood(tokens, transitions, emissions, initial) -> torch.Tensor:
    """:math:`\\log p(o_{1:t} \\mid c)` for every sequence and concept, shape
    ``(B, C)``."""
    return torch.logsumexp(
        forward_log_alpha(tokens, transitions, emissions, initial), dim=2
    )


def prefix_log_likelihoods(tokens, transitions, emissions, initial) -> torch.Tensor:
    r""":math:`\log p(o_{1:t} \mid c)` for every prefix length ``t``: shape
    ``(B, C, T)``."""
    args = _check_hmm(tokens, transitions, emissions, initial)
    return _forward(*args, prefixes=True)[1].permute(1, 0, 2)


def _predict(la, transitions, emissions):
    """Next-token law per concept from log forward variables ``(C, B, H)``:
    ``(B, C, V)``."""
    post_h = torch.softmax(
        la, dim=2
    )  # NaN where the sequence is impossible under the concept
    return torch.bmm(torch.bmm(post_h, transitions), emissions).permute(1, 0, 2)


def next_token_distribution(tokens, transitions, emissions, initial) -> torch.Tensor:
    """:math:`p(o_{t+1} = v \\mid o_{1:t}, c)`, shape ``(B, C, V)``.

    Rows are NaN for concepts under which the observed sequence has probability zero.
    """
    tokens, transitions, emissions, initial = _check_hmm(
        tokens, transitions, emissions, initial
    )
    return _predict(
        _forward(tokens, transitions, emissions, initial), transitions, emissions
    )


@dataclass(frozen=True)
class BayesPrediction:
    """The exact Bayesian in-context predictor on a batch of prompts.

    ``log_likelihood`` and ``posterior`` are ``(B, C)``; ``per_concept`` is
    :math:`p(o_{t+1}\\mid o_{1:t},c)` ``(B, C, V)``; ``predictive`` is the posterior
    predictive ``(B, V)``. A prompt impossible under every concept has NaN posterior.
    """

    log_likelihood: torch.Tensor
    posterior: torch.Tensor
    per_concept: torch.Tensor
    predictive: torch.Tensor

    @property
    def prediction(self) -> torch.Tensor:
        """The Bayes-optimal next token
        :math:`\\arg\\max_v p(o_{t+1}=v\\mid o_{1:t})`, ``(B,)``."""
        return self.predictive.nan_to_num(-1.0).argmax(dim=1)

    @property
    def impossible(self) -> torch.Tensor:
        """Prompts with probability zero under every concept, ``(B,)`` bool."""
        return ~torch.isfinite(self.log_likelihood).any(dim=1)


def bayes_posterior_predictive(
    tokens, transitions, emissions, initial, prior=None
) -> BayesPrediction:
    """Posterior over concepts and posterior predictive (see the module docstring).

    ``prior`` is a ``(C,)`` probability vector (uniform if omitted).
    """
    tokens, transitions, emissions, initial = _check_hmm(
        tokens, transitions, emissions, initial
    )
    return _posterior_predictive_from_alpha(
        _forward(tokens, transitions, emissions, initial), transitions, emissions, prior
    )


def _posterior_predictive_from_alpha(
    la, transitions, emissions, prior
) -> BayesPrediction:
    C = transitions.shape[0]
    if prior is None:
        prior = torch.full((C,), 1.0 / C, dtype=transitions.dtype)
    prior = check_tensor("prior", prior, shape=(C,), floating=True)
    ll = torch.logsumexp(la, dim=2).T  # (B, C)
    post = torch.softmax(ll + _log(prior.to(ll.dtype)), dim=1)
    per = _predict(la, transitions, emissions)
    pred = torch.einsum("bc,bcv->bv", post, per.nan_to_num(0.0))
    pred = torch.where(
        torch.isnan(post).any(1, keepdim=True),
        torch.full_like(pred, float("nan")),
        pred,
    )
    return BayesPrediction(ll, post, per, pred)


def forward_log_alpha_deterministic(
    tokens: torch.Tensor,
    transitions: torch.Tensor,
    state_tokens: torch.Tensor,
    initial: torch.Tensor,
) -> torch.Tensor:
    r""":math:`\log\alpha_t` of :func:`forward_log_alpha` for HMMs whose emission is a
    function of the state (state ``h`` always emits ``state_tokens[h]``), as in GINC.

    Then :math:`\alpha_t` vanishes outside the states :math:`S(o_t)` that emit
    :math:`o_t`, and each step only needs the block :math:`T[S(o_t), S(o_{t+1})]`: the
    cost per step is
    :math:`|S|^2` instead of :math:`H^2`. Returns the same ``(B, C, H)`` tensor as the
    dense recursion (``-inf`` off the support).
    """
    tokens = check_tensor("tokens", tokens, ndim=2, integer=True)
    transitions = check_tensor("transitions", transitions, ndim=3, floating=True)
    C, H, _ = transitions.shape
    state_tokens = check_tensor("state_tokens", state_tokens, shape=(H,), integer=True)
    if tokens.shape[1] < 1:
        raise ValueError("tokens must hold at least one position")
    if tokens.numel() and tokens.min() < 0:
        raise ValueError("tokens must be non-negative")
    V = (
        max(int(state_tokens.max()), int(tokens.max())) + 1
    )  # a token no state emits has empty support
    B, T_len = tokens.shape
    initial = check_tensor("initial", initial, floating=True)
    if initial.ndim == 2:
        initial = initial.unsqueeze(0).expand(B, -1, -1)
    if initial.shape != (B, C, H):
        raise ValueError(
            f"initial must have shape (C, H) or (B, C, H) with B={B}, C={C}, H={H}, "
            f"got {tuple(initial.shape)}"
        )
    # the support of every token, padded to the largest one
    counts = torch.bincount(state_tokens, minlength=V)
    S = int(counts.max())
    order = torch.argsort(state_tokens, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(S)
    valid_v = slot.unsqueeze(0) < counts.unsqueeze(1)  # (V, S)
    support = torch.where(
        valid_v,
        order[(starts.unsqueeze(1) + slot).clamp(max=H - 1)],
        torch.zeros((), dtype=torch.long),
    )
    idx = support[tokens]  # (B, T, S) state indices
    valid = valid_v[tokens]  # (B, T, S)
    neg = torch.tensor(float("-inf"), dtype=transitions.dtype)
    la = _log(
        initial.permute(1, 0, 2).gather(2, idx[:, 0].unsqueeze(0).expand(C, -1, -1))
    )
    la = torch.where(valid[:, 0].unsqueeze(0), la, neg)  # (C, B, S)
    flatT = transitions.reshape(C, H * H)
    for t in range(1, T_len):
        pair = (idx[:, t - 1].unsqueeze(2) * H + idx[:, t].unsqueeze(1)).reshape(
            -1
        )  # (B*S*S,)
        block = flatT[:, pair].reshape(C, B, S, S)
        m = la.amax(dim=2, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        q = torch.einsum("cbi,cbij->cbj", torch.exp(la - m), block)
        la = torch.where(valid[:, t].unsqueeze(0), _log(q) + m, neg)
    out = torch.full((C, B, H), float("-inf"), dtype=transitions.dtype)
    vb, vs = valid[:, -1].nonzero(
        as_tuple=True
    )  # scatter back only the real (not padded) slots
    out[:, vb, idx[vb, -1, vs]] = la[:, vb, vs]
    return out.permute(1, 0, 2)


def log_likelihood_given_state(tokens, transitions, emissions) -> torch.Tensor:
    r""":math:`\log p(o_{1:t} \mid h_0 = h, c)` for every previous state ``h``: shape
    ``(B, C, H)``.

    ``h_0`` is the hidden state *before* the first token, so the first token's state is
    reached by one transition from it. Computed by the backward recursion
    :math:`\beta_{s-1}(h) = \sum_{h'} T(h, h')\, O(h', o_s)\, \beta_s(h')`,
    :math:`\beta_t = 1`, in log space.
    """
    C = check_tensor("transitions", transitions, ndim=3, floating=True).shape[0]
    H = transitions.shape[1]
    tokens, transitions, emissions, _ = _check_hmm(
        tokens,
        transitions,
        emissions,
        torch.full((C, H), 1.0 / H, dtype=transitions.dtype),
    )
    logO = _log(emissions).permute(0, 2, 1)  # (C, V, H)
    lb = torch.zeros(C, tokens.shape[0], H, dtype=transitions.dtype)
    Tt = transitions.transpose(1, 2)
    for t in range(tokens.shape[1] - 1, -1, -1):
        v = lb + logO[:, tokens[:, t]]
        m = v.amax(dim=2, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        lb = _log(torch.bmm(torch.exp(v - m), Tt)) + m
    return lb.permute(1, 0, 2)
