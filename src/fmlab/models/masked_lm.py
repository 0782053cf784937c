"""A bidirectional recurrent masked language model, stored as an ensemble (Chapter 5).

Used in Chapter 5 (``notebooks/05-implicit-bias.ipynb``). A forward recurrent network
reads the sentence left to right and a backward one right to left. The prediction for
position :math:`t` reads only the forward state *before* :math:`t` and the backward
state *after* it,

.. math::
    p_\\theta(x_t = \\cdot \\mid x_{-t}) = \\mathrm{softmax}\\big(W_2\\,
    \\mathrm{gelu}(W_1 [\\overrightarrow{h}_{t-1}; \\overleftarrow{h}_{t+1}] + b_1)
    + b_2\\big),

so it never sees :math:`x_t`: it is exactly a single-mask masked language model, and one
pass over a sentence gives the predictions for all :math:`T` choices of the masked
position (the structure of the forward-backward algorithm). Liu et al. (2023) used LSTMs
on their HMM data; the cell here is a GRU,

.. math::
    r, z = \\sigma(a_{r,z} + U_{r,z} h_{t-1} + c_{r,z}),\\quad
    \\tilde h = \\tanh(a_n + r \\odot (U_n h_{t-1} + c_n)),\\quad
    h_t = (1 - z)\\odot \\tilde h + z \\odot h_{t-1},

with :math:`a = \\mathrm{Emb}(x_t)` (a one-hot input times a weight matrix).

The *contextual representation* handed to downstream linear probes is, at every
position, :math:`[\\overrightarrow{h}_t; \\overleftarrow{h}_t]` computed on the unmasked
sentence, concatenated over positions (the linear-probe protocol of Liu et al., 2023).

**An ensemble in one module.** ``n_models`` independent models live in the same tensors,
with a leading ensemble axis, and run with batched matrix products. Training the *sum*
of their losses with an elementwise optimizer (SGD, Adam) trains each member exactly as
if it were alone, at a fraction of the cost of separate runs on a CPU. Everything is
plain tensor code, so ``torch.func`` transforms (per-example gradients, Hessian-vector
products) apply.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._validate import check_int, check_tensor

__all__ = ["BiGRUMaskedLM", "masked_lm_logits", "masked_lm_loss", "member_losses"]


class _TableRows(torch.autograd.Function):
    """Rows of a batch of tables: ``table (B, V, D)``, ``idx (B, N)`` give ``(B, N,
    D)`` with ``out[b, i] = table[b, idx[b, i]]``.

    The same map as the batched product of one-hot rows with the table, and the same
    arithmetic on the way back (the gradient is that product's, one-hot transposed
    times the incoming gradient), but a gather on the way forward, several times
    cheaper than multiplying by zeros. Written with ``setup_context`` and
    ``generate_vmap_rule``, and linear in ``table``, so ``torch.func`` transforms
    (``grad``, ``vmap``, ``jvp``) and double backward all apply."""

    generate_vmap_rule = True

    @staticmethod
    def forward(table, idx):
        B, V, D = table.shape
        flat = (idx + torch.arange(B)[:, None] * V).reshape(-1)
        return table.reshape(B * V, D).index_select(0, flat).reshape(B, -1, D)

    @staticmethod
    def setup_context(ctx, inputs, output):
        table, idx = inputs
        ctx.save_for_backward(idx)
        ctx.save_for_forward(idx)
        ctx.vocab = table.shape[1]

    @staticmethod
    def backward(ctx, grad):
        (idx,) = ctx.saved_tensors
        onehot = (idx[..., None] == torch.arange(ctx.vocab)).to(grad.dtype)
        return torch.bmm(onehot.transpose(1, 2), grad), None

    @staticmethod
    def jvp(ctx, table_tangent, idx_tangent):
        (idx,) = ctx.saved_tensors
        return _TableRows.forward(table_tangent, idx)


class BiGRUMaskedLM(nn.Module):
    """``n_models`` bidirectional-GRU masked language models (see the module docstring).

    Parameters
    ----------
    vocab_size : int
        Number of tokens :math:`V`.
    hidden : int
        State size of each direction.
    d_ff : int
        Width of the output MLP.
    n_models : int
        Ensemble size :math:`E` (independent members, trained in lockstep).
    generator : torch.Generator, optional
        Source of the initial weights (default: the global stream).

    Tokens passed to the methods are ``(n, T)`` (the same sentences for every member) or
    ``(E, n, T)`` (each member its own); outputs always carry the leading axis ``E``.
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        hidden: int = 32,
        d_ff: int = 64,
        n_models: int = 1,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        self.vocab_size = V = check_int("vocab_size", vocab_size, minimum=2)
        self.hidden = h = check_int("hidden", hidden, minimum=1)
        self.d_ff = check_int("d_ff", d_ff, minimum=1)
        self.n_models = E = check_int("n_models", n_models, minimum=1)

        def uniform(*shape, fan_in):
            bound = fan_in**-0.5
            return nn.Parameter(
                (torch.rand(*shape, generator=generator) * 2 - 1) * bound
            )

        # recurrent part: index 0 of axis 1 reads left to right, index 1 right to left
        self.emb = uniform(E, 2, V, 3 * h, fan_in=h)
        self.rec = uniform(E, 2, h, 3 * h, fan_in=h)
        self.rec_bias = uniform(E, 2, 1, 3 * h, fan_in=h)
        self.h0 = nn.Parameter(torch.zeros(E, 2, 1, h))
        # output MLP on [forward state before t; backward state after t]
        self.w1 = uniform(E, 2 * h, self.d_ff, fan_in=2 * h)
        self.b1 = uniform(E, 1, self.d_ff, fan_in=2 * h)
        self.w2 = uniform(E, self.d_ff, V, fan_in=self.d_ff)
        self.b2 = uniform(E, 1, V, fan_in=self.d_ff)

    # -- helpers ------------------------------------------------------------------
    def check_tokens(self, tokens) -> torch.Tensor:
        """Validate token ids (range included); the transforms-friendly methods check
        shapes only."""
        tokens = self._tokens(tokens)
        if tokens.numel() and (
            int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size
        ):
            raise ValueError(f"tokens must lie in [0, {self.vocab_size - 1}]")
        return tokens

    def _tokens(self, tokens) -> torch.Tensor:
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(
                f"tokens must be a torch.Tensor, got {type(tokens).__name__}"
            )
        if tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise TypeError(f"tokens must have an integer dtype, got {tokens.dtype}")
        if tokens.ndim == 2:
            tokens = tokens.expand(self.n_models, *tokens.shape)
        if tokens.ndim != 3 or tokens.shape[0] != self.n_models:
            raise ValueError(
                f"tokens must have shape (n, T) or ({self.n_models}, n, T), "
                f"got {tuple(tokens.shape)}"
            )
        return tokens

    def _scan(self, tok: torch.Tensor, steps: int) -> torch.Tensor:
        """The first ``steps`` GRU steps of both directions on checked tokens ``(E, n,
        T)``: ``(E, 2, n, steps, hidden)``, entry ``j`` of axis 3 having read ``j + 1``
        tokens (``[:, 0]`` left to right, ``[:, 1]`` right to left)."""
        E, n, T = tok.shape
        h, V = self.hidden, self.vocab_size
        seq = torch.stack([tok, tok.flip(-1)], dim=1).reshape(E * 2, n * T)  # (2E, nT)
        # a = Emb(x_t) for every position at once (rows of the table: _TableRows)
        a = _TableRows.apply(self.emb.reshape(E * 2, V, 3 * h), seq)
        # per-position views made once, by split and unbind (slicing a[:, :, t] or
        # a[..., :2h] would make autograd write full-size zero tensors on the way back)
        a_rz, a_n = (
            x.unbind(2) for x in a.reshape(E * 2, n, T, 3 * h).split((2 * h, h), -1)
        )
        U = self.rec.reshape(E * 2, h, 3 * h)
        c = self.rec_bias.reshape(E * 2, 1, 3 * h)
        state = self.h0.reshape(E * 2, 1, h).expand(E * 2, n, h)
        out = []
        for t in range(steps):
            b_rz, b_n = torch.baddbmm(c, state, U).split((2 * h, h), dim=-1)
            r, z = torch.sigmoid(a_rz[t] + b_rz).chunk(2, dim=-1)
            cand = torch.tanh(a_n[t] + r * b_n)
            state = (1 - z) * cand + z * state
            out.append(state)
        if not out:  # one-token sentences: no state is read
            return state.new_zeros(E, 2, n, 0, h)
        return torch.stack(out, dim=2).reshape(E, 2, n, steps, h)

    def states(self, tokens: torch.Tensor) -> torch.Tensor:
        """States after reading each position: ``(E, 2, n, T, hidden)``.

        ``[:, 0, :, t]`` is :math:`\\overrightarrow{h}_t` (read :math:`x_1..x_t`) and
        ``[:, 1, :, t]``
        is :math:`\\overleftarrow{h}_t` (read :math:`x_T..x_t`).
        """
        tok = self._tokens(tokens)
        s = self._scan(tok, tok.shape[-1])
        return torch.stack([s[:, 0], s[:, 1].flip(-2)], dim=1)

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """Contextual representations, ``(E, n, T, 2 hidden)``:
        :math:`[\\overrightarrow{h}_t;\\overleftarrow{h}_t]`."""
        s = self.states(tokens)
        return torch.cat([s[:, 0], s[:, 1]], dim=-1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Masked-token logits for every position: ``(E, n, T, V)``; position ``t``
        ignores token ``t``."""
        tok = self._tokens(tokens)
        E, n, T = tok.shape
        # position t reads the forward state before t and the backward state after
        # it; the states after the last step of either direction are never read, so
        # the scan stops one step short
        s = self._scan(tok, T - 1)
        h0 = self.h0.expand(E, 2, n, self.hidden)
        before = torch.cat([h0[:, 0, :, None], s[:, 0]], dim=2)  # forward, t - 1
        after = torch.cat(
            [s[:, 1].flip(-2), h0[:, 1, :, None]], dim=2
        )  # backward, t + 1
        ctx = torch.cat([before, after], dim=-1).reshape(E, n * T, 2 * self.hidden)
        u = F.gelu(torch.baddbmm(self.b1, ctx, self.w1))
        return torch.baddbmm(self.b2, u, self.w2).reshape(E, n, T, self.vocab_size)

    def member(self, index: int) -> "BiGRUMaskedLM":
        """A one-member copy of member ``index`` (weights copied)."""
        index = check_int("index", index, minimum=0, maximum=self.n_models - 1)
        one = BiGRUMaskedLM(
            self.vocab_size, hidden=self.hidden, d_ff=self.d_ff, n_models=1
        )
        with torch.no_grad():
            for (name, p), q in zip(self.named_parameters(), one.parameters()):
                q.copy_(p[index : index + 1])
        return one


def masked_lm_logits(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """``model(tokens)`` after checking the model: logits ``(E, n, T, V)``."""
    if not isinstance(model, BiGRUMaskedLM):
        raise TypeError(f"model must be a BiGRUMaskedLM, got {type(model).__name__}")
    return model(model.check_tokens(tokens))


def member_losses(
    model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor | None = None
) -> torch.Tensor:
    """Each member's masked-LM loss, ``(E,)``:
    :math:`\\frac{1}{nT}\\sum_{i,t} -\\log p_\\theta(y_{it} \\mid x_{i,-t})`.

    The mask position is uniform, and all :math:`T` positions of each sentence are
    scored
    (an unbiased, lower-variance estimate of the same population loss). ``targets``
    (shaped like ``tokens`` or ``(E, n, T)``) default to the tokens themselves; the
    sampled-label Fisher estimator passes labels drawn from the model instead.
    """
    logits = masked_lm_logits(model, tokens)
    E, n, T, V = logits.shape
    y = tokens if targets is None else check_tensor("targets", targets, integer=True)
    y = y.expand(E, n, T) if y.ndim == 2 else y
    if tuple(y.shape) != (E, n, T):
        raise ValueError(
            f"targets must have shape (n, T) or (E, n, T) = ({E}, {n}, {T}), "
            f"got {tuple(y.shape)}"
        )
    nll = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), reduction="none")
    return nll.reshape(E, n * T).mean(1)


def masked_lm_loss(
    model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor | None = None
) -> torch.Tensor:
    """The *sum* over members of :func:`member_losses` (a scalar to train all
    members at once)."""
    return member_losses(model, tokens, targets).sum()
