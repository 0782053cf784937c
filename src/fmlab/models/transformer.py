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

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .._validate import check_float, check_int, check_tensor
from ..repro import make_generator

__all__ = ["TransformerConfig", "TinyTransformer", "PromptClassifier", "CLSClassifier"]


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
    """Multi-head softmax attention with an additive mask (and, optionally, a learned
    bias per head and per offset between key and query positions)."""

    def __init__(self, d_model: int, n_heads: int, max_len: int | None = None):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        if max_len is not None:  # a learned bias per head and offset s - t
            self.max_len = max_len
            self.rel_bias = nn.Parameter(torch.zeros(n_heads, 2 * max_len - 1))

    def forward(
        self, h: torch.Tensor, mask: torch.Tensor, at: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attention of the positions of ``h`` ``(n, T, d)`` to each other.

        ``mask`` ``(n, 1, T, T)`` is added to the scores: 0 where query ``t`` (row) may
        attend to key ``s`` (column), ``-inf`` where not. With ``at`` (one position per
        row, ``(n,)``), only the queries at those positions are computed and the output
        is ``(n, d)``; keys and values still come from every position.
        """
        n, T, d = h.shape
        H = self.n_heads
        qkv = self.qkv(h).view(n, T, 3, H, d // H).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (n, H, T, d_head)
        rows = torch.arange(n, device=h.device)
        if at is not None:
            q = q[rows, :, at][:, :, None]  # (n, H, 1, d_head)
            mask = mask[rows, :, at][:, :, None]  # (n, 1, 1, T)
        if hasattr(self, "rel_bias"):
            keys = torch.arange(T, device=h.device)
            queries = keys[:, None] if at is None else at[:, None, None]
            offset = keys - queries + self.max_len - 1  # (T, T) or (n, 1, T)
            bias = self.rel_bias[:, offset]  # (H, T, T) or (H, n, 1, T)
            mask = mask + (bias if at is None else bias.transpose(0, 1))
        out = _attention(q, k, v, mask)  # (n, H, T or 1, d_head)
        if at is not None:
            return self.proj(out.reshape(n, d))
        return self.proj(out.transpose(1, 2).reshape(n, T, d))


def _attention(q, k, v, mask):
    """softmax(q kᵀ/√d_head + mask) v for ``(n, heads, T, d_head)`` tensors.

    Written out: at Chapter 4's sizes (a few tokens, heads of width 8) it is faster on a
    CPU than the fused ``scaled_dot_product_attention``, and it has batching rules for
    the ``torch.func`` transforms behind the per-example Jacobians.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + mask
    return torch.softmax(scores, dim=-1) @ v


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

    def forward(
        self, h: torch.Tensor, mask: torch.Tensor, at: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``(n, T, d) -> (n, T, d)``, or ``(n, d)`` at the positions ``at``."""
        a = self.attn(self.ln1(h), mask, at)
        h = (h if at is None else h[torch.arange(h.shape[0], device=h.device), at]) + a
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

    def _mask(self, tokens: torch.Tensor) -> torch.Tensor:
        """Additive attention mask ``(n, 1, T, T)``: 0 where position ``t`` (row) may
        attend to position ``s`` (column), ``-inf`` where not."""
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
        allowed = allowed | torch.eye(T, dtype=torch.bool, device=tokens.device)
        zero = torch.zeros((), dtype=self.tok.weight.dtype, device=tokens.device)
        return torch.where(allowed, zero, -math.inf)[:, None]

    def hidden(
        self, tokens: torch.Tensor, at: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Final hidden states ``LN(h^{(L)})``, shape ``(n, T, d)``.

        ``at`` (a long tensor ``(n,)``, one position per row) returns ``(n, d)``, the
        states at those positions only; the last block then computes its queries and
        its MLP only there (the same numbers, in less time).
        """
        check_tensor("tokens", tokens, ndim=2, integer=True)
        T = tokens.shape[1]
        if T > self.config.max_len:
            raise ValueError(f"tokens has length {T} > max_len {self.config.max_len}")
        if at is not None:
            at = check_tensor("at", at, shape=(tokens.shape[0],), integer=True)
        h = self.tok(tokens) + self.pos.weight[:T]
        mask = self._mask(tokens)
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            h = block(h, mask, at if i == last else None)
        return self.ln_f(h)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits over the vocabulary, ``(n, T, V)``."""
        return self.decoder(self.hidden(tokens))

    def n_params(self) -> int:
        """Number of trainable scalars."""
        return sum(p.numel() for p in self.parameters())


class PromptClassifier(nn.Module):
    """Prompt-based output: :math:`f(x) = \\text{logit}_{great} -
    \\text{logit}_{terrible}` at ``[MASK]``.

    ``lang`` is the language the model was pretrained on; only its word index
    (``lang.index``, word to token id) and ``lang.mask_id`` are used. ``label_words``
    names the words for :math:`y=+1` and :math:`y=-1` (other choices make a less natural
    prompt)."""

    def __init__(
        self,
        mlm: TinyTransformer,
        lang,
        label_words: tuple[str, str] = ("great", "terrible"),
    ):
        super().__init__()
        if not isinstance(mlm, TinyTransformer):
            raise TypeError(f"mlm must be a TinyTransformer, got {type(mlm).__name__}")
        if len(label_words) != 2 or any(w not in lang.index for w in label_words):
            raise ValueError(
                f"label_words must be two words of the vocabulary, got {label_words!r}"
            )
        self.mlm = copy.deepcopy(mlm)
        self.mask_id = lang.mask_id
        self.pos_id, self.neg_id = (lang.index[w] for w in label_words)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        at_mask = (tokens == self.mask_id).long().argmax(1)  # one [MASK] per row
        h_mask = self.mlm.hidden(tokens, at_mask)  # (n, d)
        w, b = self.mlm.decoder.weight, self.mlm.decoder.bias
        return h_mask @ (w[self.pos_id] - w[self.neg_id]) + (
            b[self.pos_id] - b[self.neg_id]
        )


class CLSClassifier(nn.Module):
    """Standard output: a new linear head on the ``[CLS]`` position, :math:`f(x) =
    \\Gamma^\\top h_0(x) + c`.

    ``head=(Gamma, c)`` sets the head (the linear-probing solution, as in the paper);
    otherwise it is drawn :math:`\\Gamma \\sim \\mathcal N(0, I/d)` from ``seed``, with
    :math:`c = 0`.
    """

    def __init__(
        self,
        mlm: TinyTransformer,
        *,
        seed: int | None = None,
        head: tuple[torch.Tensor, float] | None = None,
    ):
        super().__init__()
        if not isinstance(mlm, TinyTransformer):
            raise TypeError(f"mlm must be a TinyTransformer, got {type(mlm).__name__}")
        if (seed is None) == (head is None):
            raise ValueError("give exactly one of seed (a random head) and head")
        self.mlm = copy.deepcopy(mlm)
        d = mlm.config.d_model
        self.head = nn.Linear(d, 1)
        with torch.no_grad():
            if head is None:
                g = make_generator(check_int("seed", seed, minimum=0))
                self.head.weight.copy_(torch.randn(1, d, generator=g) / d**0.5)
                self.head.bias.zero_()
            else:
                weight = check_tensor("head[0]", head[0], shape=(d,), floating=True)
                self.head.weight.copy_(weight[None].float())
                self.head.bias.fill_(check_float("head[1]", float(head[1])))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        at_cls = torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device)
        return self.head(self.mlm.hidden(tokens, at_cls)).squeeze(-1)
