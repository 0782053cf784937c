"""A small causal transformer language model for Chapter 6 (GINC).

:class:`CausalLM` maps token ids ``(B, T)`` to next-token logits ``(B, T, V)``:

.. math::
    h^{(0)}_t = E[o_t] + P_t, \\qquad
    h' = h^{(\\ell-1)} + \\mathrm{Attn}(\\mathrm{LN}(h^{(\\ell-1)})), \\qquad
    h^{(\\ell)} = h' + \\mathrm{MLP}(\\mathrm{LN}(h')),

    p_\\theta(o_{t+1} = v \\mid o_{1:t}) = \\operatorname{softmax}\\big(
    \\mathrm{LN}(h^{(L)}_t) D^\\top + b\\big)_v ,

a GPT-2-style decoder (pre-layer-norm blocks, multi-head causal softmax attention, a
GELU MLP of width ``mlp_ratio * d``) in the shape of minGPT, sized for a CPU.
Position ``t`` attends to positions ``<= t`` only, so the logits at ``t`` depend on
``o_{1:t}`` alone.

Attention calls :func:`torch.nn.functional.scaled_dot_product_attention` with
``is_causal=True``, PyTorch's fused kernel, which on a CPU never builds the ``T x T``
mask and is several times faster than writing the softmax out. (Chapter 4's
:class:`fmlab.models.transformer.TinyTransformer` writes it out on purpose, so that
``torch.func`` transforms see plain operations; this model is only trained and run.)

Used in Chapter 6 (``notebooks/06-in-context-learning.ipynb``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .._validate import check_float, check_int, check_tensor
from ..repro import make_generator

__all__ = ["GPTConfig", "CausalLM"]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a :class:`CausalLM`.

    ``max_len`` is the longest sequence the model reads (its context window): the
    positional embedding has one row per position. In training mode only, ``dropout``
    is applied to the embeddings and to the output of every attention and MLP
    sublayer, and ``attention_dropout`` to the attention weights, as in GPT-2 (whose
    defaults are 0.1 for both). On a CPU, attention dropout makes PyTorch leave its
    fused attention kernel for a much slower one.
    """

    vocab_size: int
    max_len: int = 64
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0
    attention_dropout: float = 0.0

    def __post_init__(self):
        check_int("vocab_size", self.vocab_size, minimum=2)
        check_int("max_len", self.max_len, minimum=1)
        check_int("d_model", self.d_model, minimum=1)
        check_int("n_layers", self.n_layers, minimum=1)
        check_int("n_heads", self.n_heads, minimum=1)
        check_int("mlp_ratio", self.mlp_ratio, minimum=1)
        check_float("dropout", self.dropout, minimum=0.0, maximum=0.9)
        check_float(
            "attention_dropout", self.attention_dropout, minimum=0.0, maximum=0.9
        )
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads "
                f"({self.n_heads})"
            )


class _CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, h: torch.Tensor, last: bool = False) -> torch.Tensor:
        """``(B, T, d) -> (B, T, d)``; with ``last=True`` only the last position's
        query is computed, ``(B, 1, d)`` (keys and values still come from every
        position)."""
        B, T, d = h.shape
        qkv = self.qkv(h).view(B, T, 3, self.n_heads, d // self.n_heads)
        # each (B, heads, T, d_head): views of one tensor, split before transposing
        # (its backward then stacks along one axis instead of permuting a copy)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
        p = self.dropout if self.training else 0.0
        if last:  # the last query sees every key: no mask
            q = q[:, :, -1:]
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
            return self.proj(out.transpose(1, 2).reshape(B, 1, d))
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(B, T, d))


class _Block(nn.Module):
    def __init__(
        self,
        d_model: int,
        n_heads: int,
        mlp_ratio: int,
        dropout: float,
        attention_dropout: float,
    ):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = _CausalSelfAttention(d_model, n_heads, attention_dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, mlp_ratio * d_model)
        self.out = nn.Linear(mlp_ratio * d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, last: bool = False) -> torch.Tensor:
        """``(B, T, d) -> (B, T, d)``, or ``(B, 1, d)`` at the last position only."""
        a = self.drop(self.attn(self.ln1(h), last))
        h = (h[:, -1:] if last else h) + a
        return h + self.drop(self.out(F.gelu(self.fc(self.ln2(h)))))


class CausalLM(nn.Module):
    """A causal transformer language model: tokens ``(B, T)`` to logits ``(B, T, V)``.

    Parameters
    ----------
    config : GPTConfig
    seed : int
        Seeds the initialisation through :func:`fmlab.make_generator` (so the seed
        offset applies), independently of the global random stream. As in GPT-2, every
        weight matrix and embedding is normal with standard deviation 0.02, and the
        two projections that write into the residual stream (attention output, MLP
        output) with ``0.02 / sqrt(2 L)``; biases start at zero, layer norms at the
        identity.
    """

    def __init__(self, config: GPTConfig, *, seed: int = 0):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        seed = check_int("seed", seed, minimum=0)
        self.config = c = config
        with torch.random.fork_rng(devices=[]):  # keep the global stream untouched
            self.tok = nn.Embedding(c.vocab_size, c.d_model)
            self.pos = nn.Embedding(c.max_len, c.d_model)
            self.blocks = nn.ModuleList(
                [
                    _Block(
                        c.d_model,
                        c.n_heads,
                        c.mlp_ratio,
                        c.dropout,
                        c.attention_dropout,
                    )
                    for _ in range(c.n_layers)
                ]
            )
            self.ln_f = nn.LayerNorm(c.d_model)
            self.decoder = nn.Linear(c.d_model, c.vocab_size)
            self.drop = nn.Dropout(c.dropout)
        g = make_generator(seed)
        residual = 0.02 / math.sqrt(2 * c.n_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if ".ln" in name or name.startswith("ln_"):
                    continue  # layer norms start at the identity
                if name.endswith("bias"):
                    p.zero_()
                    continue
                std = residual if name.endswith(("proj.weight", "out.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits ``(B, T, V)``: position ``t`` sees ``tokens[:, : t + 1]``
        only."""
        return self._logits(tokens, last=False)

    def last_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """The next-token logits after the last position only, ``(B, V)``: the same
        numbers as ``forward(tokens)[:, -1]`` (up to rounding), for about half the
        work, since the last block computes its query, its MLP and the decoder at
        one position."""
        return self._logits(tokens, last=True)[:, -1]

    def _logits(self, tokens: torch.Tensor, last: bool) -> torch.Tensor:
        check_tensor("tokens", tokens, ndim=2, integer=True)
        T = tokens.shape[1]
        if T > self.config.max_len:
            raise ValueError(
                f"tokens has length {T}, longer than the context window "
                f"max_len = {self.config.max_len}"
            )
        if tokens.numel() and (
            tokens.min() < 0 or tokens.max() >= self.config.vocab_size
        ):
            raise ValueError(f"tokens must lie in [0, {self.config.vocab_size - 1}]")
        if last and T == 0:
            raise ValueError("tokens must hold at least one position")
        h = self.drop(self.tok(tokens) + self.pos.weight[:T])
        final = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            h = block(h, last and i == final)
        return self.decoder(self.ln_f(h))

    @property
    def context_window(self) -> int:
        """The longest sequence the model can read, ``config.max_len``."""
        return self.config.max_len

    def n_params(self) -> int:
        """Number of trainable scalars."""
        return sum(p.numel() for p in self.parameters())
