"""A block-structured HMM language with exact masked-token conditionals.

Chapter 5 (``notebooks/05-implicit-bias.ipynb``) needs a language whose *optimal* masked
language modelling loss is known, so that "two models with the same, optimal pretraining
loss" is a statement one can check. Sentences :math:`x = (x_1, \\dots, x_T)` over a
vocabulary of :math:`V` tokens come from a hidden Markov model with :math:`H = KS`
hidden states in :math:`K` blocks of :math:`S`,

.. math::
    h_1 \\sim \\pi, \\qquad h_{t+1} \\mid h_t \\sim A_{h_t, \\cdot}, \\qquad
    x_t \\mid h_t \\sim E_{h_t, \\cdot}.

**Block-structured transitions.** The chain stays in its block with probability ``stay``
(otherwise it jumps to a uniformly random state of another block). Inside block
:math:`k` it follows a noisy cycle: with probability ``1 - cycle_noise`` it moves to the
successor of the current state in a cyclic order :math:`\\sigma_k` of the :math:`S`
states, else to a uniform state of the block. Each block has its own cycle.

**Tied emissions.** State :math:`s` of *every* block emits token :math:`s` with
probability ``1 - emission_noise`` and a uniform token otherwise (so :math:`V = S`).
Every block uses the same tokens with the same frequencies: the block of :math:`h_t` is
invisible in token counts and shows only in the *order* of tokens. (Liu et al., 2023
used block-diagonal emissions, which reveal the block from a single token; tying them
makes the block a genuinely contextual property, so that a linear probe measures how a
model represents context.) ``tied=False`` gives the block-diagonal alternative: state
:math:`h` emits token :math:`h` with probability ``1 - emission_noise`` and a uniform
token of all :math:`V = KS` otherwise.

**Exact conditionals.** With the scaled forward and backward quantities

.. math::
    \\hat\\alpha_t(h) = P(h_t = h \\mid x_{<t}), \\qquad
    \\beta_t(h) \\propto P(x_{>t} \\mid h_t = h),

the single-mask conditional used by masked language modelling and the posterior of the
hidden state are

.. math::
    p^\\star(x_t = v \\mid x_{-t}) = \\sum_h q_t(h)\\, E_{h v}, \\qquad
    q_t(h) = P(h_t = h \\mid x_{-t}) \\propto \\hat\\alpha_t(h)\\beta_t(h), \\qquad
    P(h_t = h \\mid x) \\propto q_t(h) E_{h x_t}.

The optimal masked-LM loss (position :math:`t` uniform) is the conditional entropy
:math:`\\mathbb{E}_{x, t}\\, H(p^\\star(\\cdot \\mid x_{-t}))`; a model's loss is that
entropy plus :math:`\\mathbb{E}_{x,t}\\, \\mathrm{KL}(p^\\star(\\cdot\\mid x_{-t})
\\,\\|\\, p_\\theta(\\cdot\\mid x_{-t}))`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import check_choice, check_float, check_int, check_tensor
from ..repro import make_generator

__all__ = ["HMMLanguageConfig", "HMMLanguage"]


@dataclass(frozen=True)
class HMMLanguageConfig:
    """Parameters of :class:`HMMLanguage` (see the module docstring).

    ``seed`` fixes the cycles of the blocks (the "world"); samples use their own
    generators."""

    n_blocks: int = 2
    states_per_block: int = 5
    length: int = 10
    stay: float = 0.9
    cycle_noise: float = 0.1
    emission_noise: float = 0.3
    seed: int = 0
    tied: bool = True

    def __post_init__(self):
        check_int("n_blocks", self.n_blocks, minimum=1)
        check_int("states_per_block", self.states_per_block, minimum=2)
        check_int("length", self.length, minimum=2)
        check_float("stay", self.stay, minimum=0.0, maximum=1.0)
        check_float("cycle_noise", self.cycle_noise, minimum=0.0, maximum=1.0)
        check_float("emission_noise", self.emission_noise, minimum=0.0, maximum=1.0)
        check_int("seed", self.seed, minimum=0)
        if not isinstance(self.tied, bool):
            raise TypeError(f"tied must be a bool, got {type(self.tied).__name__}")

    @property
    def n_states(self) -> int:
        """:math:`H = KS`."""
        return self.n_blocks * self.states_per_block

    @property
    def vocab_size(self) -> int:
        """:math:`V = S` with tied emissions, :math:`V = KS` with untied ones."""
        return self.states_per_block if self.tied else self.n_states


def _cycle_orders(n_blocks: int, S: int, g: torch.Generator) -> list[torch.Tensor]:
    """Random cyclic orders of ``range(S)``, pairwise distinct as cycles when
    possible."""
    orders: list[torch.Tensor] = []
    seen: set[tuple[int, ...]] = set()
    n_cycles = 1
    for k in range(2, S):
        n_cycles *= k  # (S-1)! distinct directed cycles
    for _ in range(n_blocks):
        for _attempt in range(1000):
            order = torch.randperm(S, generator=g)
            succ = torch.empty(S, dtype=torch.long)
            succ[order] = order.roll(-1)
            key = tuple(succ.tolist())
            if key not in seen or len(seen) >= n_cycles:
                break
        seen.add(key)
        orders.append(order)
    return orders


class HMMLanguage:
    """The language of Chapter 5: sampling, exact conditionals, entropy (see module
    docstring).

    Attributes ``initial`` (H,), ``transition`` (H, H) and ``emission`` (H, V) are
    float64 row-stochastic tensors; ``state_block`` (H,) gives the block of each state
    and ``cycles`` the cyclic order of each block."""

    def __init__(self, config: HMMLanguageConfig = HMMLanguageConfig()):
        if not isinstance(config, HMMLanguageConfig):
            raise TypeError(
                f"config must be an HMMLanguageConfig, got {type(config).__name__}"
            )
        self.config = c = config
        K, S = c.n_blocks, c.states_per_block
        H = K * S
        g = make_generator(c.seed)
        self.cycles = _cycle_orders(K, S, g)
        self.state_block = torch.arange(H) // S
        A = torch.zeros(H, H, dtype=torch.float64)
        for k, order in enumerate(self.cycles):
            P = torch.zeros(S, S, dtype=torch.float64)
            P[order, order.roll(-1)] = 1.0
            inner = (1 - c.cycle_noise) * P + c.cycle_noise / S
            blk = slice(k * S, (k + 1) * S)
            A[blk, blk] = (c.stay if K > 1 else 1.0) * inner
            if K > 1:
                A[blk, self.state_block != k] = (1 - c.stay) / ((K - 1) * S)
        V = c.vocab_size
        E0 = (1 - c.emission_noise) * torch.eye(
            S, dtype=torch.float64
        ) + c.emission_noise / S
        self.initial = torch.full((H,), 1.0 / H, dtype=torch.float64)
        self.transition = A / A.sum(1, keepdim=True)
        if c.tied:
            self.emission = E0.repeat(K, 1)
        else:  # state h emits its own token h: the block shows in every token
            self.emission = (1 - c.emission_noise) * torch.eye(
                H, dtype=torch.float64
            ) + c.emission_noise / V

    # -- sampling -----------------------------------------------------------------
    def sample(
        self, n: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw ``n`` sentences: tokens ``(n, T)`` and hidden states ``(n, T)``, both
        int64."""
        n = check_int("n", n, minimum=1)
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator, got {type(generator).__name__}"
            )
        T = self.config.length
        states = torch.empty(n, T, dtype=torch.long)
        tokens = torch.empty(n, T, dtype=torch.long)
        h = torch.multinomial(
            self.initial.expand(n, -1), 1, generator=generator
        ).squeeze(1)
        for t in range(T):
            if t > 0:
                h = torch.multinomial(
                    self.transition[h], 1, generator=generator
                ).squeeze(1)
            states[:, t] = h
            tokens[:, t] = torch.multinomial(
                self.emission[h], 1, generator=generator
            ).squeeze(1)
        return tokens, states

    # -- exact inference ----------------------------------------------------------
    def _check_tokens(self, tokens) -> torch.Tensor:
        tokens = check_tensor(
            "tokens", tokens, shape=(None, self.config.length), integer=True
        )
        if tokens.numel() and (
            int(tokens.min()) < 0 or int(tokens.max()) >= self.config.vocab_size
        ):
            raise ValueError(f"tokens must lie in [0, {self.config.vocab_size - 1}]")
        return tokens

    def _forward_backward(
        self, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive forward ``alpha_hat[t] = P(h_t | x_<t)`` and normalised backward
        ``beta``."""
        n, T = tokens.shape
        A, E = self.transition, self.emission
        lik = E[:, tokens].permute(1, 2, 0)  # (n, T, H): E[h, x_t]
        alpha_hat = torch.empty(n, T, A.shape[0], dtype=torch.float64)
        prior = self.initial.expand(n, -1)
        for t in range(T):
            alpha_hat[:, t] = prior
            post = prior * lik[:, t]
            post = post / post.sum(1, keepdim=True)
            prior = post @ A
        beta = torch.empty_like(alpha_hat)
        b = torch.ones(n, A.shape[0], dtype=torch.float64)
        for t in range(T - 1, -1, -1):
            beta[:, t] = b
            b = (lik[:, t] * b) @ A.T
            b = b / b.sum(1, keepdim=True)
        return alpha_hat, beta

    def masked_state_posterior(self, tokens: torch.Tensor) -> torch.Tensor:
        """:math:`P(h_t = h \\mid x_{-t})` for every position: shape ``(n, T, H)``,
        float64."""
        tokens = self._check_tokens(tokens)
        a, b = self._forward_backward(tokens)
        q = a * b
        return q / q.sum(-1, keepdim=True)

    def masked_conditionals(self, tokens: torch.Tensor) -> torch.Tensor:
        """Exact :math:`p^\\star(x_t = \\cdot \\mid x_{-t})` for every position: ``(n,
        T, V)``, float64.

        Row ``[i, t]`` is what an ideal masked language model predicts when position
        ``t`` of sentence ``i`` is masked (the token at ``t`` is never looked at)."""
        return self.masked_state_posterior(tokens) @ self.emission

    def state_posterior(self, tokens: torch.Tensor) -> torch.Tensor:
        """:math:`P(h_t = h \\mid x)` given the whole sentence: ``(n, T, H)``,
        float64."""
        tokens = self._check_tokens(tokens)
        q = self.masked_state_posterior(tokens)
        p = q * self.emission[:, tokens].permute(1, 2, 0)
        return p / p.sum(-1, keepdim=True)

    def log_likelihood(self, tokens: torch.Tensor) -> torch.Tensor:
        """:math:`\\log p(x)` of each sentence, shape ``(n,)`` (the forward
        algorithm)."""
        tokens = self._check_tokens(tokens)
        n, T = tokens.shape
        lik = self.emission[:, tokens].permute(1, 2, 0)
        prior = self.initial.expand(n, -1)
        out = torch.zeros(n, dtype=torch.float64)
        for t in range(T):
            joint = prior * lik[:, t]
            z = joint.sum(1)
            out += z.log()
            prior = (joint / z[:, None]) @ self.transition
        return out

    # -- the optimal pretraining loss and the downstream ceiling ----------------
    def optimal_mlm_loss(
        self, n: int = 20_000, seed: int = 12345
    ) -> tuple[float, float]:
        """The entropy of the masked-token conditional: the smallest masked-LM loss.

        :math:`\\mathbb{E}_{x}\\frac1T\\sum_t H(p^\\star(\\cdot\\mid x_{-t}))`, with the
        per-context entropies exact and the outer expectation over ``n`` fresh
        sentences. Returns the estimate and its standard error (nats)."""
        n = check_int("n", n, minimum=2)
        tokens, _ = self.sample(n, make_generator(seed))
        p = self.masked_conditionals(tokens)
        ent = -(p * p.clamp_min(1e-300).log()).sum(-1).mean(1)
        return float(ent.mean()), float(ent.std() / n**0.5)

    def block_posterior(self, tokens: torch.Tensor) -> torch.Tensor:
        """:math:`P(\\text{block of } h_t = k \\mid x)`: ``(n, T, K)``, float64."""
        p = self.state_posterior(tokens)
        return p.reshape(
            *p.shape[:-1], self.config.n_blocks, self.config.states_per_block
        ).sum(-1)

    def bayes_accuracy(
        self, position: int, task: str = "block", n: int = 20_000, seed: int = 54321
    ) -> float:
        """Best possible accuracy of predicting the block (or state) of :math:`h_t` from
        the sentence.

        :math:`\\mathbb{E}_x \\max_k P(\\text{label}_t = k \\mid x)`, the posterior
        exact and the expectation over ``n`` fresh sentences."""
        position = check_int(
            "position", position, minimum=0, maximum=self.config.length - 1
        )
        check_choice("task", task, ("block", "state"))
        n = check_int("n", n, minimum=1)
        tokens, _ = self.sample(n, make_generator(seed))
        post = (
            self.block_posterior(tokens)
            if task == "block"
            else self.state_posterior(tokens)
        )
        return float(post[:, position].max(-1).values.mean())

    def __repr__(self) -> str:
        c = self.config
        return (
            f"HMMLanguage(H={c.n_states} states in {c.n_blocks} blocks, "
            f"V={c.vocab_size}, T={c.length}, stay={c.stay}, "
            f"cycle_noise={c.cycle_noise}, emission_noise={c.emission_noise}, "
            f"{'tied' if c.tied else 'untied'} emissions, seed={c.seed})"
        )
