"""Pretraining a small language model on GINC and measuring its in-context learning.

:func:`pretrain_ginc_lm` trains a next-token model on random windows of a GINC world's
pretraining corpus and caches the result on disk by config hash (:func:`fmlab.cached`).
The model is a small causal transformer (:class:`fmlab.models.gpt.CausalLM`) or, for
comparison, an LSTM (:class:`fmlab.models.lstm.LSTMLanguageModel`).
:func:`in_context_grid` evaluates trained models and the exact Bayes predictor
(:func:`fmlab.data.ginc.ginc_bayes_predictor`) on the same prompts over a grid
of example counts ``n`` and example lengths ``k``.

In-context **accuracy** is the fraction of prompts whose predicted next token (the
argmax of the model's next-token distribution after the prompt) equals the prompt's
label.

Used in Chapter 6 (``notebooks/06b-icl-transformer.ipynb``; the first page,
``notebooks/06-in-context-learning.ipynb``, uses the config and the Bayes-only
evaluation through :mod:`fmlab.chapters.ch6_bayes`).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .._validate import check_choice, check_float, check_int, check_tensor
from ..data.ginc import (
    DELIMITER,
    GINC,
    GINC_PRESETS,
    GINCConfig,
    Prompts,
    ginc_bayes_predictor,
    ginc_preset,
    prompt_length,
    smoothed_documents,
)
from ..models.gpt import CausalLM, GPTConfig
from ..models.lstm import LSTMLanguageModel
from ..repro import make_generator, seed_everything, seed_offset
from ..theory.bayes_icl import (
    prefix_log_likelihoods,
    smooth_transitions,
)
from ..train import cached, lr_factor, progress

__all__ = [
    "GINCPretrainConfig",
    "build_model",
    "pretrain_ginc_lm",
    "pretrain_ginc_lms",
    "load_ginc_lm",
    "next_token_logits",
    "bayes_pretraining_loss",
    "ICLGrid",
    "in_context_grid",
    "evaluate_in_context",
    "gain_per_seed",
    "random_concept_accuracy",
    "DocumentLosses",
    "document_losses",
    "ExampleLosses",
    "prompt_example_losses",
    "OrderSensitivity",
    "order_sensitivity",
    "Chapter6Config",
    "TransformerICL",
    "transformer_in_context",
    "BoundaryDiagnostics",
    "boundary_diagnostics",
    "order_experiment",
]

_ARCHS = ("transformer", "lstm")
_SCHEDULES = ("cosine", "linear")
_CORPORA = ("stream", "documents")


@dataclass(frozen=True)
class GINCPretrainConfig:
    """Everything that determines a pretrained GINC model (the cache key). The
    defaults are Chapter 6's transformer.

    ``arch = "transformer"``: a causal transformer (:class:`fmlab.models.gpt.CausalLM`)
    of width ``width`` (the model dimension), ``n_layers`` blocks and ``n_heads``
    heads, whose context window is ``window`` tokens. ``arch = "lstm"``: an LSTM
    (:class:`fmlab.models.lstm.LSTMLanguageModel`) with ``width`` hidden units,
    ``n_layers`` layers and token embeddings of size ``embed_dim``. ``dropout`` is the
    dropout rate in training (see either model).

    Training: ``steps`` AdamW steps (betas 0.9, 0.95, decoupled ``weight_decay`` on
    the weight matrices) on ``batch_size`` random windows of ``window + 1`` tokens of
    the corpus (the model reads ``window`` tokens and predicts each next one); the
    learning rate rises linearly to ``lr`` over ``warmup`` steps and then follows a
    cosine down to ``lr / 10`` at the last step (:func:`fmlab.train.lr_factor`, shape
    ``"warmup-then-cosine"``); the gradient norm is clipped at 1. ``schedule =
    "linear"`` decays linearly to 0 after the warm-up instead (shape ``"linear"``, the
    schedule of Xie et al. 2022).

    Corpus: ``corpus = "stream"`` reads windows anywhere in the world's flat corpus
    (documents joined by the delimiter, so a window may straddle two documents);
    ``corpus = "documents"`` reads every window inside one document, with no
    separator (as Xie et al. 2022). ``corpus_eps > 0`` (documents only) draws the
    documents from the eps-smoothed HMMs: at each token, with probability
    ``corpus_eps``, the hidden state jumps to a uniformly random state
    (:func:`fmlab.data.ginc.smoothed_documents`), a departure from the paper's data.
    """

    world: GINCConfig = GINC_PRESETS["cpu"]
    arch: str = "transformer"
    width: int = 64
    n_layers: int = 2
    n_heads: int = 4
    dropout: float = 0.1
    embed_dim: int = 64
    steps: int = 1300
    batch_size: int = 64
    window: int = 64
    lr: float = 1e-2
    warmup: int = 50
    weight_decay: float = 0.0
    seed: int = 0
    schedule: str = "cosine"
    corpus: str = "stream"
    corpus_eps: float = 0.0

    def __post_init__(self):
        if not isinstance(self.world, GINCConfig):
            raise TypeError(
                f"world must be a GINCConfig, got {type(self.world).__name__}"
            )
        check_choice("arch", self.arch, _ARCHS)
        check_int("width", self.width, minimum=1)
        check_int("n_layers", self.n_layers, minimum=1)
        check_int("n_heads", self.n_heads, minimum=1)
        if self.arch == "transformer" and self.width % self.n_heads:
            raise ValueError(
                f"width ({self.width}) must be divisible by n_heads ({self.n_heads})"
            )
        check_float("dropout", self.dropout, minimum=0.0, maximum=0.9)
        check_int("embed_dim", self.embed_dim, minimum=1)
        check_int("steps", self.steps, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        check_int("window", self.window, minimum=2)
        check_float("lr", self.lr, minimum=0.0, strict_min=True)
        check_int("warmup", self.warmup, minimum=0, maximum=self.steps)
        check_float("weight_decay", self.weight_decay, minimum=0.0)
        check_int("seed", self.seed, minimum=0)
        check_choice("schedule", self.schedule, _SCHEDULES)
        check_choice("corpus", self.corpus, _CORPORA)
        check_float("corpus_eps", self.corpus_eps, minimum=0.0, maximum=1.0)
        if self.corpus_eps > 0 and self.corpus != "documents":
            raise ValueError('corpus_eps > 0 needs corpus = "documents"')

    @property
    def tokens_seen(self) -> int:
        """Number of next-token predictions made in training: steps x batch x window."""
        return self.steps * self.batch_size * self.window


def build_model(cfg: GINCPretrainConfig) -> nn.Module:
    """A freshly initialised model for ``cfg`` (seeded by ``cfg.seed``)."""
    if not isinstance(cfg, GINCPretrainConfig):
        raise TypeError(f"cfg must be a GINCPretrainConfig, got {type(cfg).__name__}")
    if cfg.arch == "transformer":
        shape = GPTConfig(
            vocab_size=cfg.world.vocab_size,
            max_len=cfg.window,
            d_model=cfg.width,
            n_layers=cfg.n_layers,
            n_heads=cfg.n_heads,
            dropout=cfg.dropout,
        )
        return CausalLM(shape, seed=cfg.seed)
    seed_everything(
        cfg.seed
    )  # the LSTM's default initialisation uses the global stream
    return LSTMLanguageModel(
        cfg.world.vocab_size,
        embed_dim=cfg.embed_dim,
        hidden_dim=cfg.width,
        n_layers=cfg.n_layers,
        dropout=cfg.dropout,
    )


def _windows(corpus: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    return corpus[starts.unsqueeze(1) + torch.arange(length)]


def _corpus(cfg: GINCPretrainConfig, world: GINC) -> torch.Tensor:
    if cfg.corpus == "stream":
        return world.pretraining_corpus()
    c = world.config
    g = make_generator(c.corpus_seed)
    if cfg.corpus_eps > 0:
        return smoothed_documents(
            world, c.n_documents, c.document_length, g, cfg.corpus_eps
        )
    return world.sample_documents(c.n_documents, c.document_length, g).tokens


def _draw_windows(corpus: torch.Tensor, cfg, g: torch.Generator) -> torch.Tensor:
    """``batch_size`` windows of ``window + 1`` tokens: anywhere in a flat stream, or
    (a 2-D corpus of documents) each inside one document."""
    length = cfg.window + 1
    if corpus.ndim == 1:
        starts = torch.randint(0, len(corpus) - length, (cfg.batch_size,), generator=g)
        return _windows(corpus, starts, length)
    N, L = corpus.shape
    d = torch.randint(0, N, (cfg.batch_size,), generator=g)
    s = torch.randint(0, L - length + 1, (cfg.batch_size,), generator=g)
    return corpus[d.unsqueeze(1), s.unsqueeze(1) + torch.arange(length)]


def _train(cfg: GINCPretrainConfig) -> dict:
    seed_everything(cfg.seed)
    world = GINC(cfg.world)
    corpus = _corpus(cfg, world)
    if corpus.shape[-1] <= cfg.window + 1:
        raise ValueError(
            f"the corpus ({len(corpus)} tokens) is shorter than window + 1 = "
            f"{cfg.window + 1}"
        )
    model = build_model(cfg)
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    others = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [
            {"params": matrices, "weight_decay": cfg.weight_decay},
            {"params": others, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    shape, floor = (
        ("linear", 0.0) if cfg.schedule == "linear" else ("warmup-then-cosine", 0.1)
    )
    sched = torch.optim.lr_scheduler.LambdaLR(  # after the last step: the last factor
        opt,
        lambda s: lr_factor(
            min(s, cfg.steps - 1),
            steps=cfg.steps,
            warmup=cfg.warmup,
            shape=shape,
            floor=floor,
        ),
    )
    g = make_generator(cfg.seed + 10_000)
    V = cfg.world.vocab_size
    losses = torch.empty(cfg.steps)
    model.train()
    start = time.process_time()
    for step in progress(
        range(cfg.steps),
        total=cfg.steps,
        desc=f"pretraining a {cfg.arch} on GINC (seed {cfg.seed})",
    ):
        x = _draw_windows(corpus, cfg, g)
        loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, V), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses[step] = loss.detach()
    cpu_seconds = time.process_time() - start
    model.eval()
    # validation: fresh documents from the seen concepts, scored from their first token
    docs = world.sample_documents(
        256, cfg.window + 1, make_generator(cfg.seed + 20_000)
    )
    with torch.no_grad():
        logits = model(docs.tokens[:, :-1])
        val = F.cross_entropy(
            logits.reshape(-1, V), docs.tokens[:, 1:].reshape(-1)
        ).item()
    return {
        "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "losses": losses,
        "val_loss": val,
        "cpu_seconds": cpu_seconds,
    }


def _stacked_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``K`` linear maps at once: ``x`` ``(K, ..., in)``, ``w`` ``(K, out, in)``, ``b``
    ``(K, out)`` to ``(K, ..., out)`` (one batched matmul)."""
    K, shape = x.shape[0], x.shape[1:-1]
    y = torch.baddbmm(b.unsqueeze(1), x.reshape(K, -1, x.shape[-1]), w.transpose(1, 2))
    return y.view(K, *shape, w.shape[1])


def _stacked_layer_norm(x, w, b):
    """Layer norm of ``x`` ``(K, B, T, d)`` with each model's own weight and bias."""
    return torch.addcmul(
        b[:, None, None], F.layer_norm(x, x.shape[-1:]), w[:, None, None]
    )


def _stacked_logits(p: dict, tokens: torch.Tensor, n_layers: int, n_heads: int):
    """The logits ``(K, B, T, V)`` of ``K`` causal transformers
    (:class:`fmlab.models.gpt.CausalLM`, no dropout) whose parameters ``p`` are
    stacked along a leading axis, each reading its own batch ``tokens[k]``: the
    same arithmetic as ``K`` separate models, with one batched matmul per layer."""
    K, B, T = tokens.shape
    V, d = p["tok.weight"].shape[1:]
    flat = tokens + V * torch.arange(K, device=tokens.device).view(K, 1, 1)
    h = F.embedding(flat, p["tok.weight"].reshape(K * V, d))
    h = h + p["pos.weight"][:, None, :T]
    for i in range(n_layers):
        q = f"blocks.{i}."
        a = _stacked_layer_norm(h, p[q + "ln1.weight"], p[q + "ln1.bias"])
        qkv = _stacked_linear(a, p[q + "attn.qkv.weight"], p[q + "attn.qkv.bias"])
        qkv = qkv.view(K * B, T, 3, n_heads, d // n_heads)
        qq, kk, vv = (t.transpose(1, 2) for t in qkv.unbind(2))
        att = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
        att = att.transpose(1, 2).reshape(K, B, T, d)
        h = h + _stacked_linear(att, p[q + "attn.proj.weight"], p[q + "attn.proj.bias"])
        m = _stacked_layer_norm(h, p[q + "ln2.weight"], p[q + "ln2.bias"])
        m = F.gelu(_stacked_linear(m, p[q + "fc.weight"], p[q + "fc.bias"]))
        h = h + _stacked_linear(m, p[q + "out.weight"], p[q + "out.bias"])
    h = _stacked_layer_norm(h, p["ln_f.weight"], p["ln_f.bias"])
    return _stacked_linear(h, p["decoder.weight"], p["decoder.bias"])


def _stackable(cfgs) -> bool:
    first = replace(cfgs[0], seed=0)
    return all(
        c.arch == "transformer" and c.dropout == 0 and replace(c, seed=0) == first
        for c in cfgs
    )


def _validation_loss(model: nn.Module, world: GINC, cfg: GINCPretrainConfig) -> float:
    """Mean next-token loss on 256 fresh documents of ``window + 1`` tokens from the
    seen concepts, scored from their first token."""
    docs = world.sample_documents(
        256, cfg.window + 1, make_generator(cfg.seed + 20_000)
    )
    model.eval()
    with torch.no_grad():
        logits = model(docs.tokens[:, :-1])
    V = cfg.world.vocab_size
    return F.cross_entropy(logits.reshape(-1, V), docs.tokens[:, 1:].reshape(-1)).item()


def _train_stacked(cfgs, device="cpu") -> list:
    """Train transformers that differ only in their seed (no dropout) at once, as
    stacked weights: one forward pass of all of them (:func:`_stacked_logits`), the
    sum of their own losses on their own batches (each run keeps the data stream of
    :func:`_train`), each run's gradient clipped at norm 1 on its own, and one AdamW
    step (element by element, so each run sees its own update). The same runs as
    :func:`_train` up to rounding. ``device`` is where the models train; the corpus
    and every batch are drawn on the CPU, so a seed gives the same data anywhere.
    Returns one dict per config, as :func:`_train`; ``cpu_seconds`` is the loop's CPU
    time divided by the number of runs."""
    cfg = cfgs[0]
    seed_everything(cfg.seed)
    world = GINC(cfg.world)
    corpus = _corpus(cfg, world)
    if corpus.shape[-1] <= cfg.window + 1:
        raise ValueError(
            f"the corpus ({corpus.shape[-1]} tokens) is shorter than window + 1 = "
            f"{cfg.window + 1}"
        )
    models = [build_model(c) for c in cfgs]
    params = {
        name: torch.stack([dict(m.named_parameters())[name].detach() for m in models])
        .to(device)
        .requires_grad_(True)
        for name, _ in models[0].named_parameters()
    }
    matrices = [p for p in params.values() if p.ndim >= 3]
    others = [p for p in params.values() if p.ndim < 3]
    opt = torch.optim.AdamW(
        [
            {"params": matrices, "weight_decay": cfg.weight_decay},
            {"params": others, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    shape, floor = (
        ("linear", 0.0) if cfg.schedule == "linear" else ("warmup-then-cosine", 0.1)
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: lr_factor(
            min(s, cfg.steps - 1),
            steps=cfg.steps,
            warmup=cfg.warmup,
            shape=shape,
            floor=floor,
        ),
    )
    gens = [make_generator(c.seed + 10_000) for c in cfgs]
    K, V = len(cfgs), cfg.world.vocab_size
    losses = torch.empty(K, cfg.steps)
    start = time.process_time()
    seeds = ", ".join(str(c.seed) for c in cfgs)
    for step in progress(
        range(cfg.steps),
        total=cfg.steps,
        desc=f"pretraining {K} transformers on GINC (seeds {seeds})",
    ):
        x = torch.stack([_draw_windows(corpus, cfg, g) for g in gens]).to(device)
        logits = _stacked_logits(params, x[..., :-1], cfg.n_layers, cfg.n_heads)
        loss = F.cross_entropy(
            logits.reshape(K, -1, V).transpose(1, 2),
            x[..., 1:].reshape(K, -1),
            reduction="none",
        ).mean(1)
        opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        with torch.no_grad():  # each run's gradient clipped at norm 1 on its own
            sq = sum(p.grad.pow(2).reshape(K, -1).sum(1) for p in params.values())
            coef = (1.0 / (sq.sqrt() + 1e-6)).clamp(max=1.0)
            for p in params.values():
                p.grad.mul_(coef.view(-1, *([1] * (p.ndim - 1))))
        opt.step()
        sched.step()
        losses[:, step] = loss.detach().cpu()
    cpu_seconds = (time.process_time() - start) / K
    out = []
    for k, (c, model) in enumerate(zip(cfgs, models)):
        model.load_state_dict(
            {n: v[k].detach().cpu().clone() for n, v in params.items()}
        )
        out.append(
            {
                "state_dict": {
                    n: v.detach().clone() for n, v in model.state_dict().items()
                },
                "losses": losses[k].clone(),
                "val_loss": _validation_loss(model, world, c),
                "cpu_seconds": cpu_seconds,
            }
        )
    return out


def _stored_run(cfg: GINCPretrainConfig) -> dict | None:
    """The run of ``cfg`` stored with the book (page 06b's pretrainings at seed offset
    0, :func:`fmlab.chapters.ch6_pretrained.stored_run`), or None."""
    from .ch6_pretrained import stored_run

    return stored_run(cfg)


def pretrain_ginc_lms(cfgs, device="cpu") -> list:
    """:func:`pretrain_ginc_lm` of several configs that differ only in their seed: the
    runs stored with the book are read (at seed offset 0, page 06b's:
    :mod:`fmlab.chapters.ch6_pretrained`), the others not yet in the cache are trained
    together as stacked weights (:func:`_train_stacked`, transformers without dropout)
    and cached one by one."""
    cfgs = tuple(cfgs)
    if not cfgs or not all(isinstance(c, GINCPretrainConfig) for c in cfgs):
        raise TypeError("cfgs must be a non-empty sequence of GINCPretrainConfig")
    if not _stackable(cfgs):
        return [pretrain_ginc_lm(c) for c in cfgs]
    kept = {i: r for i, c in enumerate(cfgs) if (r := _stored_run(c)) is not None}
    todo = [i for i in range(len(cfgs)) if i not in kept]
    trained: dict = {}

    def build(i: int) -> dict:
        if i not in trained:  # the first miss trains it and every later run at once
            rest = [j for j in todo if j >= i]
            runs = _train_stacked([cfgs[j] for j in rest], device=device)
            trained.update(zip(rest, runs))
        return trained[i]

    return [
        kept[i] if i in kept else cached(c, lambda i=i: build(i), name="ginc_lm")
        for i, c in enumerate(cfgs)
    ]


def pretrain_ginc_lm(cfg: GINCPretrainConfig) -> dict:
    """Train (or load from the on-disk cache) the model of ``cfg``; page 06b's runs at
    seed offset 0 are read from the book's stored file instead
    (:mod:`fmlab.chapters.ch6_pretrained`).

    Returns a dict with ``state_dict``, the training ``losses`` per step, ``val_loss``
    (the mean next-token cross-entropy on 256 fresh documents of ``window + 1`` tokens,
    scored from their first token) and ``cpu_seconds``, the CPU time the training loop
    took when the entry was made (a machine-dependent measurement, stored so that a
    cached run reports the same number).
    """
    if not isinstance(cfg, GINCPretrainConfig):
        raise TypeError(f"cfg must be a GINCPretrainConfig, got {type(cfg).__name__}")
    run = _stored_run(cfg)  # page 06b's runs at seed offset 0, stored with the book
    if run is not None:
        return run
    if _stackable((cfg,)):  # the transformer's one training loop, alone or stacked
        return cached(cfg, lambda: _train_stacked((cfg,))[0], name="ginc_lm")
    return cached(cfg, lambda: _train(cfg), name="ginc_lm")


def load_ginc_lm(cfg: GINCPretrainConfig) -> nn.Module:
    """The pretrained model of ``cfg`` in eval mode (trained first if not cached)."""
    model = build_model(cfg)
    model.load_state_dict(pretrain_ginc_lm(cfg)["state_dict"])
    return model.eval()


@torch.no_grad()
def next_token_logits(
    model: nn.Module, tokens: torch.Tensor, batch_size: int = 1024
) -> torch.Tensor:
    """The model's next-token logits after each prompt: tokens ``(B, T)`` to logits
    ``(B, V)``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    tokens = check_tensor("tokens", tokens, ndim=2, integer=True)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    model.eval()
    # a model that can compute the last position alone (CausalLM) does so
    last = getattr(model, "last_logits", None) or (lambda t: model(t)[:, -1])
    return torch.cat(
        [last(tokens[i : i + batch_size]) for i in range(0, len(tokens), batch_size)]
    )


def _seen_documents(world: GINC, n_documents: int, length: int, seed: int):
    """``n_documents`` fresh pretraining documents of ``length`` tokens and their prefix
    log-likelihoods ``(B, C, length)`` under each pretraining concept (no smoothing)."""
    docs = world.sample_documents(n_documents, length, make_generator(seed))
    idx = world.seen_concepts
    lls = prefix_log_likelihoods(
        docs.tokens,
        world.transition_matrices(idx),
        world.emission_matrix(),
        world.start_probs[idx],
    )
    return docs, lls


def bayes_pretraining_loss(
    world: GINC, length: int, n_documents: int = 256, seed: int = 0
) -> float:
    """The smallest possible next-token cross-entropy on documents of ``length`` tokens.

    The mean over positions 2..``length`` of :math:`-\\log p(o_{t}\\mid o_{1:t-1})`
    under the exact pretraining mixture (no smoothing), on ``n_documents`` fresh
    documents; the reference line for :func:`pretrain_ginc_lm`'s ``val_loss`` (same
    positions).
    """
    if not isinstance(world, GINC):
        raise TypeError(f"world must be a GINC, got {type(world).__name__}")
    length = check_int("length", length, minimum=2)
    n_documents = check_int("n_documents", n_documents, minimum=1)
    _, lls = _seen_documents(world, n_documents, length, seed)  # (B, C, T)
    mix = torch.logsumexp(
        lls - math.log(len(world.seen_concepts)), dim=1
    )  # log p(o_{1:t}) under the mixture
    return -(mix[:, -1] - mix[:, 0]).mean().item() / (length - 1)


@torch.no_grad()
def _nested_last_logits(model: nn.Module, full: Prompts, ns) -> dict:
    """Next-token logits after ``full.with_examples(n)`` for every ``n`` in ``ns``.

    A model with ``forward_with_state`` (the LSTM) reads the shared prefix of examples
    once and continues from the saved state; any other model reads every prompt in full.
    """
    if not hasattr(model, "forward_with_state"):
        return {n: next_token_logits(model, full.with_examples(n).tokens) for n in ns}
    model.eval()
    B, _, k = full.examples.shape
    delim = torch.full((B, 1), DELIMITER, dtype=full.examples.dtype)
    test = full.examples[:, -1, :-1]
    out, state, done = {}, None, 0
    for n in sorted(set(ns)):
        while done < n:  # advance the state over one more example and its delimiter
            _, state = model.forward_with_state(
                torch.cat([full.examples[:, done], delim], dim=1), state
            )
            done += 1
        out[n] = model.forward_with_state(test, state)[0][:, -1]
    return out


#: What prompts :func:`in_context_grid` draws: from the pretraining concepts, from the
#: held-out ones (their HMMs), or random slot patterns labelled by a held-out concept
#: (:meth:`fmlab.data.ginc.GINC.sample_pattern_prompts`, Xie et al.'s unseen concepts).
_PROMPT_KINDS = ("seen", "unseen", "pattern")

_BAYES_SEEN: OrderedDict = OrderedDict()  # the last few Bayes predictions computed


def _bayes_on_prompts(world: GINC, tokens: torch.Tensor, epsilon: float, prior: str):
    """:func:`~fmlab.data.ginc.ginc_bayes_predictor` on ``tokens``, remembered for the
    last 64 calls: every training run of a chapter is evaluated on the same prompts,
    and the Bayes predictor does not depend on the run. The key holds the world (its
    config and the seed offset, which together draw its HMMs), the smoothing, the prior
    and the prompt tokens themselves (a hash of their bytes)."""
    digest = hashlib.blake2b(tokens.numpy().tobytes(), digest_size=16).hexdigest()
    world_key = (world.config, seed_offset())
    key = (world_key, float(epsilon), prior, tuple(tokens.shape), digest)
    if key in _BAYES_SEEN:
        _BAYES_SEEN.move_to_end(key)
        return _BAYES_SEEN[key]
    out = ginc_bayes_predictor(world, tokens, epsilon, concepts=prior)
    _BAYES_SEEN[key] = out
    if len(_BAYES_SEEN) > 64:
        _BAYES_SEEN.popitem(last=False)
    return out


@dataclass
class ICLGrid:
    r"""In-context results on a grid of ``ns`` x ``ks``; arrays are indexed ``[i_n,
    i_k]``.

    ``bayes_accuracy`` is the accuracy of the Bayes predictor, ``true_posterior`` the
    mean Bayes posterior of the prompt concept (NaN when it is outside the prior),
    ``bayes_impossible`` the fraction of prompts with probability zero under every
    concept of the prior (possible only when ``epsilon = 0``; they count as errors).
    For every model name, ``accuracy[name]`` is its accuracy, ``agreement[name]`` the
    fraction of prompts where it predicts the same token as the Bayes predictor, and
    ``chance_agreement[name]`` the agreement expected if the two predictions were
    independent with the same marginals,
    :math:`\sum_v \hat p_{\text{model}}(v)\,\hat p_{\text{Bayes}}(v)`; they are NaN
    at the ``k`` where the model was not evaluated. ``predictions[(n, k)]`` keeps the
    labels, concepts and raw predictions.
    """

    ns: tuple
    ks: tuple
    bayes_accuracy: torch.Tensor
    true_posterior: torch.Tensor
    bayes_impossible: torch.Tensor
    accuracy: dict = field(default_factory=dict)
    agreement: dict = field(default_factory=dict)
    chance_agreement: dict = field(default_factory=dict)
    predictions: dict = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict:
        """The grid as plain dicts, lists and tensors (what the on-disk cache
        stores)."""
        return {
            "ns": list(self.ns),
            "ks": list(self.ks),
            "bayes_accuracy": self.bayes_accuracy,
            "true_posterior": self.true_posterior,
            "bayes_impossible": self.bayes_impossible,
            "accuracy": dict(self.accuracy),
            "agreement": dict(self.agreement),
            "chance_agreement": dict(self.chance_agreement),
            "predictions": {f"{n},{k}": v for (n, k), v in self.predictions.items()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ICLGrid":
        """The inverse of :meth:`as_dict`."""
        preds = {}
        for key, v in d["predictions"].items():
            n, k = (int(x) for x in key.split(","))
            preds[(n, k)] = v
        return cls(
            tuple(d["ns"]),
            tuple(d["ks"]),
            d["bayes_accuracy"],
            d["true_posterior"],
            d["bayes_impossible"],
            dict(d["accuracy"]),
            dict(d["agreement"]),
            dict(d["chance_agreement"]),
            preds,
        )


def in_context_grid(
    models,
    world: GINC,
    ns,
    ks,
    *,
    n_prompts: int,
    seed: int,
    epsilon: float,
    concepts: str = "seen",
    prior_concepts: str = "seen",
    model_ks=None,
) -> ICLGrid:
    """Evaluate models and the Bayes predictor on the same fresh prompts.

    For every ``k`` in ``ks``, ``n_prompts`` prompts with ``max(ns)`` examples are drawn
    from ``concepts`` (``"seen"`` or ``"unseen"``) with a generator seeded by ``seed``
    and ``k``; the prompt with ``n`` examples keeps the first ``n`` of them and the same
    test example (:meth:`fmlab.data.ginc.Prompts.with_examples`), so the curves over
    ``n`` are paired. The Bayes predictor has smoothing ``epsilon`` and a uniform prior
    over ``prior_concepts`` (``"seen"``, the pretraining distribution, or ``"all"``).

    ``models`` is a dict name -> model (or None / empty for the Bayes predictor only).
    The models are evaluated at the ``k`` in ``model_ks`` (default: every ``k``), and
    every prompt they read must fit their context window (a model with a
    ``context_window`` attribute, such as :class:`fmlab.models.gpt.CausalLM`);
    otherwise a ``ValueError`` says which prompt is too long.
    """
    models = {} if models is None else models
    if not isinstance(models, dict) or not all(
        isinstance(m, nn.Module) for m in models.values()
    ):
        raise TypeError("models must be a dict of name -> torch.nn.Module, or None")
    if not isinstance(world, GINC):
        raise TypeError(f"world must be a GINC, got {type(world).__name__}")
    ns = tuple(check_int("ns", n, minimum=0) for n in ns)
    ks = tuple(check_int("ks", k, minimum=2) for k in ks)
    if not ns or not ks:
        raise ValueError("ns and ks must be non-empty")
    model_ks = ks if model_ks is None else tuple(model_ks)
    if not set(model_ks) <= set(ks):
        raise ValueError(f"model_ks must be a subset of ks {ks}, got {model_ks}")
    n_prompts = check_int("n_prompts", n_prompts, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    check_choice("concepts", concepts, _PROMPT_KINDS)
    check_choice("prior_concepts", prior_concepts, ("seen", "all"))
    if models and model_ks:
        longest = max(prompt_length(max(ns), k) for k in model_ks)
        for name, model in models.items():
            window = getattr(model, "context_window", None)
            if window is not None and longest > window:
                raise ValueError(
                    f"ns and ks: the longest prompt has {longest} tokens, more than "
                    f"the context window of model {name!r} ({window}); evaluate only "
                    "prompts that fit the window the model was trained on"
                )
    shape = (len(ns), len(ks))
    grid = ICLGrid(
        ns,
        ks,
        *(torch.full(shape, float("nan"), dtype=torch.float64) for _ in range(3)),
    )
    for name in models:
        for d in (grid.accuracy, grid.agreement, grid.chance_agreement):
            d[name] = torch.full(shape, float("nan"), dtype=torch.float64)
    V = world.config.vocab_size
    prior_idx = world.concept_indices(prior_concepts)
    for j, k in enumerate(ks):
        g = make_generator(seed * 1_000_003 + k)
        if concepts == "pattern":  # random slot patterns labelled by unseen concepts
            full = world.sample_pattern_prompts(n_prompts, max(ns), k, g)
        else:
            full = world.sample_prompts(n_prompts, max(ns), k, g, concepts=concepts)
        evaluated = models if k in model_ks else {}
        last_logits = {
            name: _nested_last_logits(model, full, ns)
            for name, model in evaluated.items()
        }
        for i, n in enumerate(ns):
            pr = full.with_examples(n)
            bayes = _bayes_on_prompts(world, pr.tokens, epsilon, prior_concepts)
            b = bayes.prediction
            grid.bayes_accuracy[i, j] = (
                ((b == pr.labels) & ~bayes.impossible).double().mean()
            )
            grid.bayes_impossible[i, j] = bayes.impossible.double().mean()
            # (B, C): where the prompt concept sits in the prior
            hit = prior_idx.unsqueeze(0) == pr.concepts.unsqueeze(1)
            if bool(hit.any(1).all()):
                grid.true_posterior[i, j] = (bayes.posterior * hit).sum(1).mean()
            entry = {"labels": pr.labels, "bayes": b, "concepts": pr.concepts}
            pb = torch.bincount(b, minlength=V).double() / n_prompts
            for name in evaluated:
                m = last_logits[name][n].argmax(1)
                grid.accuracy[name][i, j] = (m == pr.labels).double().mean()
                grid.agreement[name][i, j] = (m == b).double().mean()
                pm = torch.bincount(m, minlength=V).double() / n_prompts
                grid.chance_agreement[name][i, j] = (pm * pb).sum()
                entry[name] = m
            grid.predictions[(n, k)] = entry
    return grid


@dataclass(frozen=True)
class _EvaluationKey:
    model: GINCPretrainConfig
    ns: tuple
    ks: tuple
    model_ks: tuple
    seeds: tuple
    n_prompts: int
    epsilon: float
    concepts: str
    version: int = 1


def evaluate_in_context(
    cfg: GINCPretrainConfig,
    ns,
    ks,
    *,
    seeds,
    n_prompts: int,
    epsilon: float,
    concepts: str = "seen",
    model_ks=None,
) -> list:
    """:func:`in_context_grid` of the pretrained model of ``cfg`` (named ``cfg.arch``)
    and the Bayes predictor, once per evaluation seed, cached on disk.

    The world is ``GINC(cfg.world)``. Returns one :class:`ICLGrid` per seed in
    ``seeds``. Like the trained model, the grids are kept in the cache
    (:func:`fmlab.cached`), keyed by ``cfg``, the evaluation arguments and the seed
    offset, so a rerun with the model cached does not evaluate again; a clean run
    computes the same numbers.
    """
    if not isinstance(cfg, GINCPretrainConfig):
        raise TypeError(f"cfg must be a GINCPretrainConfig, got {type(cfg).__name__}")
    seeds = tuple(check_int("seeds", s, minimum=0) for s in seeds)
    if not seeds:
        raise ValueError("seeds must be non-empty")
    check_choice("concepts", concepts, _PROMPT_KINDS)
    key = _EvaluationKey(
        cfg,
        tuple(int(n) for n in ns),
        tuple(int(k) for k in ks),
        tuple(int(k) for k in (ks if model_ks is None else model_ks)),
        seeds,
        check_int("n_prompts", n_prompts, minimum=1),
        check_float("epsilon", epsilon, minimum=0.0, maximum=1.0),
        concepts,
    )

    def build() -> dict:
        world = GINC(cfg.world)
        models = {cfg.arch: load_ginc_lm(cfg)} if key.model_ks else {}
        grids = [
            in_context_grid(
                models,
                world,
                key.ns,
                key.ks,
                n_prompts=key.n_prompts,
                seed=s,
                epsilon=key.epsilon,
                concepts=key.concepts,
                model_ks=key.model_ks,
            ).as_dict()
            for s in progress(seeds, total=len(seeds), desc="in-context evaluation")
        ]
        return {"grids": grids}

    return [ICLGrid.from_dict(d) for d in cached(key, build, name="ginc_icl")["grids"]]


def gain_per_seed(
    grids, k: int, *, name: str | None = None, n_from: int = 0, n_to: int | None = None
) -> np.ndarray:
    """Per-seed paired gain in accuracy from ``n_from`` to ``n_to`` examples at length
    ``k``.

    ``grids`` is a list of :class:`ICLGrid` (one per evaluation seed) with the same
    ``ns`` and ``ks``; ``name`` selects a model (``None``: the Bayes predictor);
    ``n_to`` defaults to the largest ``n``. Returns one number per grid: accuracy at
    ``n_to`` minus accuracy at ``n_from``, on the same test examples.
    """
    if isinstance(grids, ICLGrid):
        grids = [grids]
    if not grids or not all(isinstance(g, ICLGrid) for g in grids):
        raise TypeError("grids must be a non-empty list of ICLGrid")
    ns, ks = grids[0].ns, grids[0].ks
    if any(g.ns != ns or g.ks != ks for g in grids):
        raise ValueError("grids must all have the same ns and ks")
    k = check_int("k", k, minimum=2)
    if k not in ks:
        raise ValueError(f"k must be one of the grids' ks {ks}, got {k}")
    n_to = max(ns) if n_to is None else n_to
    for arg, n in (("n_from", n_from), ("n_to", n_to)):
        if check_int(arg, n, minimum=0) not in ns:
            raise ValueError(f"{arg} must be one of the grids' ns {ns}, got {n}")
    if name is not None and name not in grids[0].accuracy:
        raise ValueError(
            f"name must be one of the grids' models {list(grids[0].accuracy)}, "
            f"got {name!r}"
        )
    i0, i1, j = ns.index(n_from), ns.index(n_to), ks.index(k)
    acc = [g.bayes_accuracy if name is None else g.accuracy[name] for g in grids]
    return np.array([float(a[i1, j] - a[i0, j]) for a in acc])


def random_concept_accuracy(world: GINC, prompts: Prompts) -> float:
    r"""Accuracy of a learner that knows every pretraining HMM exactly but picks the
    concept at random: the mean over seen concepts :math:`c` of the fraction of prompts
    whose label equals :math:`\arg\max_v p(o_k = v \mid \text{test input}, c)`. The
    chance level for prompts from unseen concepts.
    """
    if not isinstance(world, GINC):
        raise TypeError(f"world must be a GINC, got {type(world).__name__}")
    if not isinstance(prompts, Prompts):
        raise TypeError(f"prompts must be Prompts, got {type(prompts).__name__}")
    x = prompts.examples[:, -1, :-1]
    hits = [
        (
            world.most_likely_next_token(
                x,
                torch.full_like(prompts.labels, c),
                prompts.start_property,
                uniform_start=prompts.uniform_start,
            )
            == prompts.labels
        )
        .double()
        .mean()
        for c in world.seen_concepts.tolist()
    ]
    return float(torch.stack(hits).mean())


def _token_losses(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The model's next-token cross-entropy at every position: tokens ``(B, L)`` to
    losses ``(B, L - 1)`` (position ``t`` predicts token ``t + 1``), float64."""
    model.eval()
    with torch.no_grad():
        logits = model(tokens[:, :-1])
    return F.cross_entropy(
        logits.transpose(1, 2), tokens[:, 1:], reduction="none"
    ).double()


def _mixture_losses(lls: torch.Tensor, n_concepts: int) -> torch.Tensor:
    """Per-position losses of the Bayes predictor from prefix log-likelihoods ``(B, C,
    L)`` under a uniform prior: :math:`-\\log p(o_{t+1} \\mid o_{1:t})`, ``(B, L -
    1)``."""
    mix = torch.logsumexp(lls - math.log(n_concepts), dim=1)  # log p(o_{1:t})
    return -(mix[:, 1:] - mix[:, :-1])


@dataclass(frozen=True)
class DocumentLosses:
    r"""Mean next-token losses along pretraining documents.

    ``model``, ``bayes`` and ``oracle`` hold one value per position: entry ``t``
    (0-based) is the mean over documents of :math:`-\log p(o_{t+2} \mid o_{1:t+1})`,
    the loss of predicting the token at position ``t + 2`` from the ``t + 1`` tokens
    before it. ``model`` is the trained model's loss, ``bayes`` the loss of the exact
    pretraining mixture (the Bayes predictor, which must infer the concept from the
    prefix), ``oracle`` the loss of the exact HMM of each document's own concept (a
    predictor told the concept); ``bayes - oracle`` is what not knowing the concept
    costs at each position.

    ``after_change`` and ``steady`` split the predictions at positions after
    ``skip`` (where the prefix has identified the concept) by the hidden entity:
    *after a change* means that the last token read is the first one at a new entity
    (the entity changed between the two tokens before the predicted one); *steady*
    means that the last three entities (the predicted token's included) are equal.
    Each is a dict with the mean ``model`` and ``bayes`` losses and the ``share`` of
    predictions in the class.
    """

    model: torch.Tensor
    bayes: torch.Tensor
    oracle: torch.Tensor
    after_change: dict
    steady: dict

    def mean(self, first: int, last: int) -> dict:
        """Mean losses over the predicted positions ``first..last`` (1-based, the
        position of the predicted token; ``2 <= first <= last <= length``)."""
        n = len(self.model) + 1
        first = check_int("first", first, minimum=2, maximum=n)
        last = check_int("last", last, minimum=first, maximum=n)
        sl = slice(first - 2, last - 1)
        return {
            name: float(getattr(self, name)[sl].mean())
            for name in ("model", "bayes", "oracle")
        }


def document_losses(
    model: nn.Module,
    world: GINC,
    length: int,
    *,
    n_documents: int,
    seed: int,
    skip: int = 8,
) -> DocumentLosses:
    """:class:`DocumentLosses` of ``model``, the Bayes predictor and the
    concept-knowing predictor on ``n_documents`` fresh pretraining documents of
    ``length`` tokens (drawn with :func:`fmlab.make_generator` of ``seed``), read from
    their first token.

    The diagnostic of Chapter 6: the Bayes predictor's loss falls along a document as
    the prefix identifies the concept, and a model that has learned that inference
    falls with it. The transitions are not smoothed (documents come from the
    pretraining distribution itself).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(world, GINC):
        raise TypeError(f"world must be a GINC, got {type(world).__name__}")
    length = check_int("length", length, minimum=4)
    n_documents = check_int("n_documents", n_documents, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    skip = check_int("skip", skip, minimum=2, maximum=length - 1)
    docs, lls = _seen_documents(world, n_documents, length, seed)  # lls (B, C, L)
    idx = world.seen_concepts
    own = lls[torch.arange(n_documents), docs.concepts]  # the document's own concept
    losses = {
        "model": _token_losses(model, docs.tokens),
        "bayes": _mixture_losses(lls, len(idx)),
    }  # (B, L - 1): entry t predicts token t + 1 (0-based)
    entity = docs.states // world.config.n_properties
    moved = entity[:, 1:] != entity[:, :-1]  # (B, L - 1): entry t is t -> t + 1
    after = torch.zeros_like(moved)
    after[:, 1:] = moved[:, :-1]  # the entity changed just before the last token read
    steady = torch.zeros_like(moved)
    steady[:, 1:] = ~moved[:, 1:] & ~moved[:, :-1]
    late = (torch.arange(length - 1) >= skip - 1).expand_as(moved)

    def split(mask):
        mask = mask & late
        out = {name: float(v[mask].mean()) for name, v in losses.items()}
        out["share"] = float(mask.double().sum() / late.double().sum())
        return out

    return DocumentLosses(
        model=losses["model"].mean(0),
        bayes=losses["bayes"].mean(0),
        oracle=-(own[:, 1:] - own[:, :-1]).mean(0),
        after_change=split(after),
        steady=split(steady),
    )


@dataclass(frozen=True)
class ExampleLosses:
    r"""Mean next-token losses inside the examples of prompts, one value per example.

    The prompts hold ``n + 1`` examples of ``k`` tokens joined by the delimiter (the
    last one complete, with its sampled last token). ``model[i]`` and ``bayes[i]`` are
    the mean losses on tokens 2..k of example ``i`` (0-based), each predicted from
    everything before it: tokens that the prompt concept generates from the previous
    hidden state, exactly as in a pretraining document. Example 0 has no boundary
    before it; every later one follows a delimiter and a jump to a fresh entity at the
    start property. ``model_boundary`` and ``bayes_boundary`` are the mean losses on
    the boundary tokens themselves (each delimiter and the first token after it).
    The Bayes predictor is smoothed by ``epsilon``.
    """

    model: torch.Tensor
    bayes: torch.Tensor
    model_boundary: float
    bayes_boundary: float
    epsilon: float


def prompt_example_losses(
    model: nn.Module,
    world: GINC,
    n: int,
    k: int,
    *,
    n_prompts: int,
    seed: int,
    epsilon: float,
) -> ExampleLosses:
    """:class:`ExampleLosses` of ``model`` and of the Bayes predictor on ``n_prompts``
    fresh prompts (seen concepts, generator seeded by ``seed``) with ``n`` examples of
    length ``k`` and a complete test example.

    The in-prompt counterpart of :func:`document_losses`: if the examples
    reveal the concept, the loss inside later examples is lower than inside the first.
    The model must read ``(n + 1)(k + 1) - 1`` tokens within its context window.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(world, GINC):
        raise TypeError(f"world must be a GINC, got {type(world).__name__}")
    n = check_int("n", n, minimum=1)
    k = check_int("k", k, minimum=2)
    n_prompts = check_int("n_prompts", n_prompts, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    epsilon = check_float("epsilon", epsilon, minimum=0.0, maximum=1.0, strict_min=True)
    window = getattr(model, "context_window", None)
    if window is not None and (n + 1) * (k + 1) - 2 > window:
        raise ValueError(
            f"n and k: the model would read {(n + 1) * (k + 1) - 2} tokens, more than "
            f"its context window ({window})"
        )
    pr = world.sample_prompts(n_prompts, n, k, make_generator(seed))
    tokens = torch.cat([pr.tokens, pr.examples[:, -1, -1:]], dim=1)
    idx = world.seen_concepts
    lls = prefix_log_likelihoods(
        tokens,
        smooth_transitions(world.transition_matrices(idx), epsilon),
        world.emission_matrix(),
        world.start_probs[idx],
    )
    losses = {
        "model": _token_losses(model, tokens),
        "bayes": _mixture_losses(lls, len(idx)),
    }
    target = torch.arange(
        1, tokens.shape[1]
    )  # 0-based position of each predicted token
    example, place = target // (k + 1), target % (k + 1)  # place k: the delimiter
    inside = (place >= 1) & (place < k)
    boundary = ~inside
    out = {
        name: torch.stack([v[:, inside & (example == i)].mean() for i in range(n + 1)])
        for name, v in losses.items()
    }
    return ExampleLosses(
        model=out["model"],
        bayes=out["bayes"],
        model_boundary=float(losses["model"][:, boundary].mean()),
        bayes_boundary=float(losses["bayes"][:, boundary].mean()),
        epsilon=epsilon,
    )


@dataclass(frozen=True)
class OrderSensitivity:
    """Predictions of a model and of the Bayes predictor under every order of the
    examples.

    ``orders`` lists the permutations; ``model_accuracy`` and ``bayes_accuracy`` hold
    one accuracy per order; ``model_changed`` and ``bayes_changed`` are the fractions of
    prompts whose prediction is not the same under every order.
    """

    orders: list
    model_accuracy: torch.Tensor
    bayes_accuracy: torch.Tensor
    model_changed: float
    bayes_changed: float


def order_sensitivity(
    model: nn.Module,
    world: GINC,
    prompts: Prompts,
    epsilon: float,
    max_orders: int = 24,
) -> OrderSensitivity:
    """Evaluate ``model`` and the Bayes predictor on ``prompts`` with the in-context
    examples permuted (the first ``max_orders`` permutations in lexicographic order; the
    test example stays last)."""
    import itertools

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(world, GINC):
        raise TypeError(f"world must be a GINC, got {type(world).__name__}")
    if not isinstance(prompts, Prompts):
        raise TypeError(f"prompts must be Prompts, got {type(prompts).__name__}")
    if prompts.n_examples < 2:
        raise ValueError(
            "prompts must hold at least 2 in-context examples, got "
            f"{prompts.n_examples}"
        )
    max_orders = check_int("max_orders", max_orders, minimum=1)
    orders = list(
        itertools.islice(itertools.permutations(range(prompts.n_examples)), max_orders)
    )
    m_pred, b_pred = [], []
    for order in orders:
        pr = prompts.reordered(torch.tensor(order))
        m_pred.append(next_token_logits(model, pr.tokens).argmax(1))
        b_pred.append(ginc_bayes_predictor(world, pr.tokens, epsilon).prediction)
    m_pred, b_pred = torch.stack(m_pred), torch.stack(b_pred)  # (orders, B)
    return OrderSensitivity(
        orders=orders,
        model_accuracy=(m_pred == prompts.labels).double().mean(1),
        bayes_accuracy=(b_pred == prompts.labels).double().mean(1),
        model_changed=float((m_pred != m_pred[0]).any(0).double().mean()),
        bayes_changed=float((b_pred != b_pred[0]).any(0).double().mean()),
    )


# -- the chapter's configuration and runners ------------------------------------------
@dataclass(frozen=True)
class Chapter6Config:
    """The world, the transformers and the evaluation of Chapter 6 (both pages).

    The world is the ``"cpu"`` preset at the paper's largest vocabulary; the models are
    ``len(model_seeds)`` causal transformers trained on windows inside documents with
    random state jumps at rate ``corpus_eps`` (:meth:`pretrain_config`). Prompts have
    ``ns`` examples of the lengths ``ks`` (the transformer and the Bayes predictor) or
    ``bayes_ks`` (the Bayes predictor alone), ``n_prompts`` (``n_prompts_bayes`` where
    only the Bayes predictor is evaluated) per point and evaluation seed; the Bayes
    predictor is smoothed by ``epsilon``.
    """

    world: GINCConfig = ginc_preset("cpu", vocab_size=150)  # the paper's largest V
    width: int = 64
    n_layers: int = 2
    n_heads: int = 4
    dropout: float = 0.0
    window: int = 64
    steps: int = 1500
    lr: float = 3e-3
    warmup: int = 225
    corpus_eps: float = 0.15
    model_seeds: tuple = (0, 1)
    ns: tuple = (0, 1, 2, 4, 8)
    ks: tuple = (3, 5)
    bayes_ks: tuple = (3, 5, 8, 10)
    eval_seeds: tuple = (1, 2, 3, 4, 5)
    n_prompts: int = 800
    n_prompts_bayes: int = 400
    epsilon: float = 0.01

    def pretrain_config(self, seed: int = 0) -> GINCPretrainConfig:
        """The :class:`GINCPretrainConfig` of the training run with ``seed``."""
        return GINCPretrainConfig(
            world=self.world,
            arch="transformer",
            width=self.width,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            dropout=self.dropout,
            window=self.window,
            steps=self.steps,
            lr=self.lr,
            warmup=self.warmup,
            schedule="linear",
            corpus="documents",  # windows inside one document, no separator
            corpus_eps=self.corpus_eps,
            seed=seed,
        )


_SPLITS = ("seen", "unseen")
#: The prompts of each split: the unseen concepts are read as Xie et al. build them,
#: random slot patterns labelled by a held-out concept.
_SPLIT_PROMPTS = {"seen": "seen", "unseen": "pattern"}


@dataclass(frozen=True)
class TransformerICL:
    """The trained transformers of :class:`Chapter6Config` and their in-context
    evaluation (:func:`transformer_in_context`).

    ``grids[split][r]`` is the list of :class:`ICLGrid` (one per evaluation seed) of
    training run ``r`` on prompts of the ``split``: ``"seen"``, prompts from the
    pretraining concepts; ``"unseen"``, random slot patterns labelled by a held-out
    concept (:meth:`fmlab.data.ginc.GINC.sample_pattern_prompts`, as Xie et al. build
    their prompts for unseen concepts); every run reads the same prompts.
    ``val_loss`` holds each run's validation loss; ``losses`` and ``cpu_seconds`` are
    the first run's training losses per step and training time (per run, when runs
    were trained together). ``bayes_loss`` is the Bayes-optimal loss on documents
    of ``window + 1`` tokens, ``unigram`` the entropy of the corpus's token frequencies
    (the best context-free loss), ``chance_unseen[k]`` the accuracy on unseen concepts
    of a learner that picks a pretraining concept at random
    (:func:`random_concept_accuracy`).
    """

    ns: tuple
    ks: tuple
    model: str
    grids: dict
    val_loss: tuple
    losses: torch.Tensor
    cpu_seconds: float
    n_params: int
    tokens_seen: int
    bayes_loss: float
    unigram: float
    chance_unseen: dict

    def stack(
        self, split: str, attr: str, *, run: int = 0, bayes: bool = False
    ) -> np.ndarray:
        """One quantity of run ``run``'s grids as an array (evaluation seeds, n, k):
        ``attr`` is ``"accuracy"``, ``"agreement"`` or ``"chance_agreement"`` (the
        model's), or with ``bayes=True`` an attribute of the Bayes predictor
        (``"bayes_accuracy"``, ``"true_posterior"``)."""
        check_choice("split", split, _SPLITS)
        grids = self.grids[split][run]
        vals = [
            getattr(g, attr) if bayes else getattr(g, attr)[self.model] for g in grids
        ]
        return torch.stack(vals).numpy()

    def gains(self, split: str, k: int, *, run: int = 0, bayes: bool = False):
        """Accuracy at the largest ``n`` minus at ``n = 0``, one per evaluation seed
        (:func:`gain_per_seed`), of run ``run`` (or of the Bayes predictor)."""
        name = None if bayes else self.model
        return gain_per_seed(self.grids[split][run], k, name=name)

    def pooled_gain(self, split: str, k: int) -> np.ndarray:
        """The gains of every training run x evaluation seed, concatenated."""
        return np.concatenate(
            [gain_per_seed(g, k, name=self.model) for g in self.grids[split]]
        )


def transformer_in_context(cfg: Chapter6Config) -> TransformerICL:
    """Pretrain the transformers of ``cfg`` (one per model seed) and evaluate each, with
    the Bayes predictor, on the same prompts from seen concepts and on random slot
    patterns labelled by unseen ones (the runs trained together by
    :func:`pretrain_ginc_lms`; every step cached)."""
    if not isinstance(cfg, Chapter6Config):
        raise TypeError(f"cfg must be a Chapter6Config, got {type(cfg).__name__}")
    runs = pretrain_ginc_lms([cfg.pretrain_config(s) for s in cfg.model_seeds])
    grids = {
        split: [
            evaluate_in_context(
                cfg.pretrain_config(s),
                cfg.ns,
                cfg.ks,
                n_prompts=cfg.n_prompts,
                concepts=_SPLIT_PROMPTS[split],
                seeds=cfg.eval_seeds,
                epsilon=cfg.epsilon,
            )
            for s in cfg.model_seeds
        ]
        for split in _SPLITS
    }
    world = GINC(cfg.world)
    pcfg = cfg.pretrain_config()
    corpus = world.pretraining_corpus()
    freq = torch.bincount(corpus, minlength=cfg.world.vocab_size).double() / len(corpus)
    chance = {
        k: random_concept_accuracy(
            world,
            world.sample_pattern_prompts(1000, 0, k, make_generator(40 + k)),
        )
        for k in cfg.ks
    }
    return TransformerICL(
        ns=tuple(cfg.ns),
        ks=tuple(cfg.ks),
        model=pcfg.arch,
        grids=grids,
        val_loss=tuple(float(r["val_loss"]) for r in runs),
        losses=runs[0]["losses"],
        cpu_seconds=float(runs[0]["cpu_seconds"]),
        n_params=build_model(pcfg).n_params(),
        tokens_seen=pcfg.tokens_seen,
        bayes_loss=bayes_pretraining_loss(world, pcfg.window + 1),
        unigram=float(-(freq[freq > 0] * freq[freq > 0].log()).sum()),
        chance_unseen=chance,
    )


@dataclass(frozen=True)
class BoundaryDiagnostics:
    """Next-token losses of the first training run of :class:`Chapter6Config` and of
    the Bayes predictor (:func:`boundary_diagnostics`): ``documents`` holds one
    :class:`DocumentLosses` per evaluation seed (fresh documents of ``window + 1``
    tokens), ``examples[k]`` one :class:`ExampleLosses` per evaluation seed (prompts
    with ``n_examples`` complete examples of length ``k``)."""

    documents: list
    examples: dict


@dataclass(frozen=True)
class _DiagnosticsKey:
    model: GINCPretrainConfig
    ks: tuple
    seeds: tuple
    n_documents: int
    n_examples: int
    n_prompts: int
    epsilon: float


def boundary_diagnostics(
    cfg: Chapter6Config,
    *,
    n_documents: int = 256,
    n_examples: int = 8,
    n_prompts: int = 400,
) -> BoundaryDiagnostics:
    """:func:`document_losses` (seeds ``100 + s``) and :func:`prompt_example_losses`
    (seeds ``200 + s``) of the first training run, for every evaluation seed ``s`` of
    ``cfg`` and every ``k`` in ``cfg.ks``; cached."""
    if not isinstance(cfg, Chapter6Config):
        raise TypeError(f"cfg must be a Chapter6Config, got {type(cfg).__name__}")
    key = _DiagnosticsKey(
        cfg.pretrain_config(),
        tuple(cfg.ks),
        tuple(cfg.eval_seeds),
        check_int("n_documents", n_documents, minimum=1),
        check_int("n_examples", n_examples, minimum=1),
        check_int("n_prompts", n_prompts, minimum=1),
        cfg.epsilon,
    )

    def build() -> BoundaryDiagnostics:
        world = GINC(cfg.world)
        model = load_ginc_lm(key.model)
        docs = [
            document_losses(
                model, world, cfg.window + 1, n_documents=n_documents, seed=100 + s
            )
            for s in key.seeds
        ]
        examples = {
            k: [
                prompt_example_losses(
                    model,
                    world,
                    n_examples,
                    k,
                    n_prompts=n_prompts,
                    seed=200 + s,
                    epsilon=cfg.epsilon,
                )
                for s in key.seeds
            ]
            for k in key.ks
        }
        return BoundaryDiagnostics(docs, examples)

    return cached(key, build, name="ginc_diagnostics")


@dataclass(frozen=True)
class _OrderKey:
    model: GINCPretrainConfig
    n: int
    k: int
    n_prompts: int
    seeds: tuple
    epsilon: float


def order_experiment(
    cfg: Chapter6Config,
    *,
    n: int = 3,
    k: int = 5,
    n_prompts: int = 300,
    seeds=(31, 32, 33),
) -> list:
    """:func:`order_sensitivity` of the first training run on ``n_prompts`` fresh
    prompts with ``n`` examples of length ``k``, one :class:`OrderSensitivity` per
    seed in ``seeds``; cached."""
    if not isinstance(cfg, Chapter6Config):
        raise TypeError(f"cfg must be a Chapter6Config, got {type(cfg).__name__}")
    key = _OrderKey(
        cfg.pretrain_config(),
        check_int("n", n, minimum=2),
        check_int("k", k, minimum=2),
        check_int("n_prompts", n_prompts, minimum=1),
        tuple(check_int("seeds", s, minimum=0) for s in seeds),
        cfg.epsilon,
    )

    def build() -> dict:
        world = GINC(cfg.world)
        model = load_ginc_lm(key.model)
        return {
            "orders": [
                order_sensitivity(
                    model,
                    world,
                    world.sample_prompts(n_prompts, n, k, make_generator(s)),
                    cfg.epsilon,
                )
                for s in key.seeds
            ]
        }

    return cached(key, build, name="ginc_orders")["orders"]
