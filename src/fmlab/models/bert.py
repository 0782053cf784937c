"""A small BERT-style masked language model, stored as an ensemble (Chapter 5).

Used in Chapter 5 (``notebooks/05-implicit-bias.ipynb``) for the experiment of Liu et
al. (2023) with the architecture they used for it: a bidirectional transformer whose
representation reaches the vocabulary through a normalisation and a **linear** decoder.

**The model.** Tokens :math:`x_1,\\dots,x_T \\in \\{0,\\dots,V-1\\}`; the id :math:`V`
is the ``[MASK]`` token. With :math:`N(h) = (h - \\bar h)/\\sqrt{\\mathrm{var}(h) +
\\epsilon}` a layer normalisation *without* gain or bias (over the feature axis),

.. math::
    h^{(0)}_t = \\mathrm{Emb}[x_t] + P_t, \\qquad
    a^{(\\ell)} = N\\big(h^{(\\ell-1)}
        + \\mathrm{Attn}_\\ell(h^{(\\ell-1)})\\big), \\qquad
    h^{(\\ell)} = N\\big(a^{(\\ell)}
        + W_{2,\\ell}\\,\\mathrm{gelu}(W_{1,\\ell} a^{(\\ell)} + b_{1,\\ell})
        + b_{2,\\ell}\\big),

(post-normalisation blocks, as in BERT), multi-head softmax attention over all positions
(bidirectional), and the prediction for a masked position :math:`t`

.. math::
    p_\\theta(\\cdot \\mid x_{-t}) = \\mathrm{softmax}\\big(D\\, \\phi_t + c\\big),
    \\qquad \\phi_t = h^{(L)}_t \\text{ on the sentence with } x_t = \\texttt{[MASK]}.

The representation :math:`\\phi` has :math:`\\lVert\\phi_t\\rVert^2 \\approx d` whatever
the weights, so the decoder :math:`(D, c)` cannot be rescaled against the layer before
it: at a given prediction its share of the trace of the Hessian is fixed (see
:func:`fmlab.chapters.ch5_sgd_noise.head_trace_closed_form`). The *contextual
representation* handed
to downstream linear probes is :math:`(\\phi_1, \\dots, \\phi_T)` of the unmasked
sentence, concatenated (the protocol of Liu et al., 2023).

**An ensemble in one module.** ``n_models`` independent models live in the same tensors
with a leading ensemble axis and run with batched matrix products; training the sum of
their losses with an elementwise optimizer trains each exactly as if it were alone.
Plain tensor code, so ``torch.func`` transforms apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .._validate import check_float, check_int, check_tensor

__all__ = ["BertConfig", "EnsembleBert", "HEAD_PARAMETERS", "embed_width"]

#: names of the decoder's parameters (the "head"); every other parameter is "encoder"
HEAD_PARAMETERS = ("dec_w", "dec_b")


@dataclass(frozen=True)
class BertConfig:
    """Shape of an :class:`EnsembleBert` (``vocab_size`` counts the real tokens
    only)."""

    vocab_size: int
    length: int
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 2
    d_ff: int = 64
    eps: float = 1e-5

    def __post_init__(self):
        check_int("vocab_size", self.vocab_size, minimum=2)
        check_int("length", self.length, minimum=2)
        check_int("d_model", self.d_model, minimum=2)
        check_int("n_layers", self.n_layers, minimum=1)
        check_int("n_heads", self.n_heads, minimum=1)
        check_int("d_ff", self.d_ff, minimum=1)
        check_float("eps", self.eps, minimum=0.0, strict_min=True)
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads "
                f"({self.n_heads})"
            )

    @property
    def mask_id(self) -> int:
        """The id of ``[MASK]``: :math:`V`."""
        return self.vocab_size


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ/√d_head) v for ``(batch, heads, T, d_head)`` tensors.

    One fused kernel in ordinary calls; written out under ``torch.func`` transforms
    (per-example gradients), where the fused CPU kernel has no batching rule and would
    run once per example.
    """
    if torch._C._functorch.is_functorch_wrapped_tensor(q):
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
        return att @ v
    return F.scaled_dot_product_attention(q, k, v)


class EnsembleBert(nn.Module):
    """``n_models`` BERT-style masked LMs (see the module docstring).

    Parameters
    ----------
    config : BertConfig
    n_models : int
        Ensemble size :math:`E`.
    generator : torch.Generator, optional
        Source of the initial weights: normal with standard deviation
        :math:`1/\\sqrt{\\text{fan-in}}` (embeddings :math:`1/\\sqrt d`), biases zero.

    Token tensors are ``(n, T)`` (the same sentences for every member) or ``(E, n, T)``.
    """

    def __init__(
        self,
        config: BertConfig,
        *,
        n_models: int = 1,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        if not isinstance(config, BertConfig):
            raise TypeError(f"config must be a BertConfig, got {type(config).__name__}")
        self.config = c = config
        self.n_models = E = check_int("n_models", n_models, minimum=1)
        d, f, V = c.d_model, c.d_ff, c.vocab_size

        def normal(*shape, fan_in):
            w = torch.randn(E, *shape, generator=generator) / math.sqrt(fan_in)
            return nn.Parameter(w)

        def zeros(*shape):
            return nn.Parameter(torch.zeros(E, *shape))

        self.tok = normal(V + 1, d, fan_in=d)
        self.pos = normal(c.length, d, fan_in=d)
        for i in range(c.n_layers):
            self.register_parameter(f"l{i}_qkv_w", normal(d, 3 * d, fan_in=d))
            self.register_parameter(f"l{i}_qkv_b", zeros(1, 3 * d))
            self.register_parameter(f"l{i}_o_w", normal(d, d, fan_in=d))
            self.register_parameter(f"l{i}_o_b", zeros(1, d))
            self.register_parameter(f"l{i}_ff1_w", normal(d, f, fan_in=d))
            self.register_parameter(f"l{i}_ff1_b", zeros(1, f))
            self.register_parameter(f"l{i}_ff2_w", normal(f, d, fan_in=f))
            self.register_parameter(f"l{i}_ff2_b", zeros(1, d))
        self.dec_w = normal(d, V, fan_in=d)
        self.dec_b = zeros(1, V)

    # -- helpers ---------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def check_tokens(self, tokens, *, allow_mask: bool = False) -> torch.Tensor:
        """Validate token ids (range included) and broadcast to ``(E, n, T)``."""
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(
                f"tokens must be a torch.Tensor, got {type(tokens).__name__}"
            )
        if tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise TypeError(f"tokens must have an integer dtype, got {tokens.dtype}")
        tokens = self._tokens(tokens)
        top = self.config.vocab_size + (1 if allow_mask else 0)
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= top):
            raise ValueError(f"tokens must lie in [0, {top - 1}]")
        return tokens

    def _tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.ndim == 2:
            tokens = tokens.expand(self.n_models, *tokens.shape)
        if (
            tokens.ndim != 3
            or tokens.shape[0] != self.n_models
            or tokens.shape[2] != self.config.length
        ):
            raise ValueError(
                f"tokens must have shape (n, {self.config.length}) or "
                f"({self.n_models}, n, {self.config.length}), got {tuple(tokens.shape)}"
            )
        return tokens

    def _norm(self, h: torch.Tensor) -> torch.Tensor:
        # N(h) in one fused kernel (no gain, no bias): the same function as
        # (h - mean) / sqrt(var + eps) with the biased variance
        return F.layer_norm(h, h.shape[-1:], eps=self.config.eps)

    def _linear(self, x, w, b):
        E = x.shape[0]
        shape = x.shape
        out = torch.baddbmm(b, x.reshape(E, -1, shape[-1]), w)
        return out.reshape(*shape[:-1], w.shape[-1])

    # -- the network -----------------------------------------------------------------
    def encode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Normalised representations :math:`\\phi_t`: ``(E, n, T, d)``.

        ``tokens`` may contain the mask id :math:`V`.
        """
        tok = self._tokens(tokens)
        E, n, T = tok.shape
        c = self.config
        d, H = c.d_model, c.n_heads
        dh = d // H
        emb = torch.gather(
            self.tok, 1, tok.reshape(E, n * T, 1).expand(-1, -1, d)
        ).reshape(E, n, T, d)
        h = emb + self.pos[:, None]
        for i in range(c.n_layers):
            p = lambda name: getattr(self, f"l{i}_{name}")  # noqa: E731
            qkv = self._linear(h, p("qkv_w"), p("qkv_b"))
            q, k, v = qkv.reshape(E * n, T, 3, H, dh).permute(2, 0, 3, 1, 4)
            mix = _attention(q, k, v).transpose(1, 2).reshape(E, n, T, d)
            h = self._norm(h + self._linear(mix, p("o_w"), p("o_b")))
            ff = F.gelu(self._linear(h, p("ff1_w"), p("ff1_b")))
            h = self._norm(h + self._linear(ff, p("ff2_w"), p("ff2_b")))
        return h

    def decode(self, phi: torch.Tensor) -> torch.Tensor:
        """Logits :math:`D\\phi + c` for representations ``(E, ..., d)``."""
        return self._linear(phi, self.dec_w, self.dec_b)

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """The probe's features: :math:`\\phi_t` of the unmasked sentence, ``(E, n, T,
        d)``."""
        return self.encode(self.check_tokens(tokens))

    def masked_logits(
        self, tokens: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Logits of :math:`p_\\theta(\\cdot\\mid x_{-t})` with :math:`t` =
        ``positions``.

        ``tokens`` ``(n, T)`` or ``(E, n, T)``, ``positions`` ``(n,)`` or ``(E, n)``;
        returns ``(E, n, V)``. No input validation (the hot path of training); use
        :meth:`check_tokens` first for untrusted input.
        """
        tok = self._tokens(tokens)
        E, n, T = tok.shape
        pos = positions.expand(E, n) if positions.ndim == 1 else positions
        masked = tok.scatter(2, pos[..., None], self.config.mask_id)
        phi = self.encode(masked)
        at = torch.gather(phi, 2, pos[..., None, None].expand(-1, -1, 1, phi.shape[-1]))
        return self.decode(at[:, :, 0])

    def all_masked_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of every single-mask conditional: ``(E, n, T, V)``.

        Row ``[:, i, t]`` is the prediction for position ``t`` of sentence ``i`` with
        only that position masked (``n T`` forward passes, batched).
        """
        tok = self.check_tokens(tokens)
        E, n, T = tok.shape
        rep = tok.repeat_interleave(T, dim=1)  # (E, n T, T)
        pos = torch.arange(T).repeat(n).expand(E, -1)
        return self.masked_logits(rep, pos).reshape(E, n, T, -1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Same as :meth:`all_masked_logits`: ``(E, n, T, V)``."""
        return self.all_masked_logits(tokens)

    def n_params(self) -> int:
        """Trainable scalars of one member."""
        return sum(p[0].numel() for p in self.parameters())


def embed_width(model: EnsembleBert, width: int) -> EnsembleBert:
    """The same function at a larger width, by replicating every unit (Liu et al.,
    2023, Appendix B.4).

    ``width`` must be a multiple :math:`m\\,d` of the model's width :math:`d`. Every
    feature of the residual stream, of the attention heads and of the MLP is copied
    :math:`m` times (unit :math:`i` of the wide model is unit :math:`\\lfloor i/m
    \\rfloor` of the narrow one). A weight that reads replicated features is divided by
    :math:`m`, so each output is the same sum; a normalisation without gain or bias sees
    the same mean and variance; the heads (still ``n_heads``, now :math:`m` times wider)
    see :math:`m` times the dot products under a scale :math:`1/\\sqrt{m\\,d_h}`, so the
    queries are divided by :math:`\\sqrt m` as well. Logits and every attention pattern
    are unchanged; the representation :math:`\\phi` is replicated. Returns a new
    ensemble with the same members.
    """
    if not isinstance(model, EnsembleBert):
        raise TypeError(f"model must be an EnsembleBert, got {type(model).__name__}")
    c = model.config
    d = c.d_model
    width = check_int("width", width, minimum=d)
    if width % d:
        raise ValueError(
            f"width ({width}) must be a multiple of the model's width d_model ({d})"
        )
    m = width // d
    big = BertConfig(
        c.vocab_size,
        c.length,
        d_model=width,
        n_layers=c.n_layers,
        n_heads=c.n_heads,
        d_ff=m * c.d_ff,
        eps=c.eps,
    )
    # every weight is overwritten below; its own generator leaves the global RNG alone
    out = EnsembleBert(big, n_models=model.n_models, generator=torch.Generator())

    def rep(w, *dims):  # a copy with every unit of the given axes repeated m times
        for ax in dims:
            w = w.repeat_interleave(m, dim=ax)
        return w

    new = {}
    with torch.no_grad():
        new["tok"] = rep(model.tok, 2)
        new["pos"] = rep(model.pos, 2)
        for i in range(c.n_layers):
            p = lambda name: getattr(model, f"l{i}_{name}")  # noqa: E731
            qkv_w = rep(p("qkv_w"), 1, 2) / m  # (E, d', 3d'): [q | k | v] blocks
            qkv_b = rep(p("qkv_b"), 2)
            qkv_w[..., :width] /= math.sqrt(m)
            qkv_b[..., :width] /= math.sqrt(m)
            new[f"l{i}_qkv_w"], new[f"l{i}_qkv_b"] = qkv_w, qkv_b
            new[f"l{i}_o_w"] = rep(p("o_w"), 1, 2) / m
            new[f"l{i}_o_b"] = rep(p("o_b"), 2)
            new[f"l{i}_ff1_w"] = rep(p("ff1_w"), 1, 2) / m
            new[f"l{i}_ff1_b"] = rep(p("ff1_b"), 2)
            new[f"l{i}_ff2_w"] = rep(p("ff2_w"), 1, 2) / m
            new[f"l{i}_ff2_b"] = rep(p("ff2_b"), 2)
        new["dec_w"] = rep(model.dec_w, 1) / m
        new["dec_b"] = model.dec_b.clone()
        for name, value in new.items():
            getattr(out, name).copy_(value)
    return out


def masked_lm_nll(
    model: EnsembleBert,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    targets: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each member's mean :math:`-\\log p_\\theta(y_i \\mid x_{i,-t_i})`: ``(E,)``.

    ``targets`` default to the masked tokens themselves.
    """
    logits = model.masked_logits(tokens, positions)
    E, n, V = logits.shape
    tok = model._tokens(tokens)
    pos = positions.expand(E, n) if positions.ndim == 1 else positions
    y = torch.gather(tok, 2, pos[..., None])[..., 0] if targets is None else targets
    y = check_tensor("targets", y, integer=True).expand(E, n)
    nll = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), reduction="none")
    return nll.reshape(E, n).mean(1)
