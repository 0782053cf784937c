"""A tiny transformer in one readable file (in the spirit of minGPT / nanoGPT).

:class:`TinyTransformer` maps token ids ``(n, T)`` to hidden states ``(n, T, d)`` and to
logits over the vocabulary ``(n, T, V)``:

.. math::
    h^{(0)}_t = E[x_t] + P_t, \\qquad
    h^{(\\ell)} = h' + \\mathrm{MLP}(\\mathrm{LN}(h')), \\quad
    h' = h^{(\\ell-1)} + \\mathrm{Attn}(\\mathrm{LN}(h^{(\\ell-1)})),

with pre-layer-norm blocks, multi-head softmax attention, a GELU MLP of width ``4 d``,
a final layer norm, and a linear decoder, ``logits = LN(h^{(L)}) D^T + b``. (The decoder
is not tied to the token embedding: in this book's short pretraining runs a tied decoder
was much slower to pick up the signal carried by rare tokens.) With ``causal=False``
every position attends to every non-padding position (a masked language model, Chapter
4); with ``causal=True`` position ``t`` attends to positions ``<= t`` (an autoregressive
model).

Attention is written out with plain tensor operations (no fused kernels), so the model
works unchanged under ``torch.func`` transforms (``vmap``, ``jacrev``, ``jvp``), which
the empirical NTK of Chapter 4 (``notebooks/04-kernel-view.ipynb``) relies on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .._validate import check_float, check_int, check_tensor
from ..repro import make_generator

__all__ = ["TransformerConfig", "TinyTransformer"]


@dataclass(frozen=True)
class TransformerConfig:
    """Shape of a :class:`TinyTransformer`.

    ``pad_id`` (optional) is a token that no position attends to; ``None`` means no
    padding.
    ``relative_bias=True`` adds to every attention score a learned bias per head and per
    offset :math:`s - t` between key and query positions (as in T5), started at zero; it
    lets a head attend to "the previous word" from the first step on. The default
    ``False`` adds no parameter and computes exactly what earlier versions computed.
    """

    vocab_size: int
    max_len: int = 16
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    causal: bool = False
    pad_id: int | None = None
    init_scale: float = 1.0
    relative_bias: bool = False

    def __post_init__(self):
        check_int("vocab_size", self.vocab_size, minimum=2)
        check_int("max_len", self.max_len, minimum=1)
        check_int("d_model", self.d_model, minimum=1)
        check_int("n_layers", self.n_layers, minimum=1)
        check_int("n_heads", self.n_heads, minimum=1)
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by "
                f"n_heads ({self.n_heads})"
            )
        if not isinstance(self.causal, bool):
            raise TypeError(f"causal must be a bool, got {type(self.causal).__name__}")
        check_float("init_scale", self.init_scale, minimum=0.0, strict_min=True)
        if not isinstance(self.relative_bias, bool):
            raise TypeError(
                f"relative_bias must be a bool, got {type(self.relative_bias).__name__}"
            )
        if self.pad_id is not None:
            check_int("pad_id", self.pad_id, minimum=0, maximum=self.vocab_size - 1)


class SelfAttention(nn.Module):
    """Multi-head softmax attention over the positions a mask allows."""

    def __init__(self, d_model: int, n_heads: int, max_len: int | None = None):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        if max_len is not None:  # a learned bias per head and offset s - t
            self.max_len = max_len
            self.rel_bias = nn.Parameter(torch.zeros(n_heads, 2 * max_len - 1))

    def forward(self, h: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        n, T, d = h.shape
        q, k, v = self.qkv(h).split(d, dim=-1)
        heads = lambda z: z.view(n, T, self.n_heads, d // self.n_heads).transpose(1, 2)  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)  # (n, heads, T, d_head)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.n_heads)
        if hasattr(self, "rel_bias"):
            offset = torch.arange(T, device=h.device)
            offset = offset[None, :] - offset[:, None] + self.max_len - 1  # (T, T)
            scores = scores + self.rel_bias[:, offset]
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v  # (n, heads, T, d_head)
        return self.proj(out.transpose(1, 2).reshape(n, T, d))


class Block(nn.Module):
    """A pre-layer-norm transformer block: attention, then an MLP, each with a
    residual."""

    def __init__(self, d_model: int, n_heads: int, max_len: int | None = None):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads, max_len)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, h: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.ln1(h), allowed)
        return h + self.out(F.gelu(self.fc(self.ln2(h))))


class TinyTransformer(nn.Module):
    """A small transformer encoder (``causal=False``) or decoder (``causal=True``).

    Parameters
    ----------
    config : TransformerConfig
    seed : int
        Seeds the initialisation, independently of the global random stream: every
        weight matrix is normal with standard deviation ``init_scale / sqrt(fan_in)``
        (embeddings: ``init_scale / sqrt(d)``), biases zero, layer norms the identity.
    """

    def __init__(self, config: TransformerConfig, *, seed: int = 0):
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(
                f"config must be a TransformerConfig, got {type(config).__name__}"
            )
        seed = check_int("seed", seed, minimum=0)
        self.config = c = config
        with torch.random.fork_rng(
            devices=[]
        ):  # torch's default init must not touch the global stream
            self.tok = nn.Embedding(c.vocab_size, c.d_model)
            self.pos = nn.Embedding(c.max_len, c.d_model)
            self.blocks = nn.ModuleList(
                [
                    Block(
                        c.d_model,
                        c.n_heads,
                        c.max_len if c.relative_bias else None,
                    )
                    for _ in range(c.n_layers)
                ]
            )
            self.ln_f = nn.LayerNorm(c.d_model)
            self.decoder = nn.Linear(c.d_model, c.vocab_size)
        g = make_generator(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias") or ".ln" in name or name.startswith("ln_"):
                    continue  # biases start at 0, layer norms at the identity
                fan_in = (
                    p.shape[1]
                    if p.ndim == 2 and "tok" not in name and "pos" not in name
                    else c.d_model
                )
                p.copy_(
                    torch.randn(p.shape, generator=g) * c.init_scale / math.sqrt(fan_in)
                )

    def _allowed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Boolean ``(n, T, T)``: may position ``t`` (row) attend to position ``s``
        (column)."""
        n, T = tokens.shape
        allowed = torch.ones(n, T, T, dtype=torch.bool, device=tokens.device)
        if self.config.pad_id is not None:
            allowed = allowed & (tokens != self.config.pad_id)[:, None, :]
        if self.config.causal:
            allowed = (
                allowed
                & torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
            )
        # a row with nothing allowed (a padding query in a causal model) attends to
        # itself
        return allowed | torch.eye(T, dtype=torch.bool, device=tokens.device)

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """Final hidden states ``LN(h^{(L)})``, shape ``(n, T, d)``."""
        check_tensor("tokens", tokens, ndim=2, integer=True)
        T = tokens.shape[1]
        if T > self.config.max_len:
            raise ValueError(f"tokens has length {T} > max_len {self.config.max_len}")
        h = self.tok(tokens) + self.pos.weight[:T]
        allowed = self._allowed(tokens)
        for block in self.blocks:
            h = block(h, allowed)
        return self.ln_f(h)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits over the vocabulary, ``(n, T, V)``."""
        return self.decoder(self.hidden(tokens))

    def n_params(self) -> int:
        """Number of trainable scalars."""
        return sum(p.numel() for p in self.parameters())
