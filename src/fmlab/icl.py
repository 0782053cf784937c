"""Pretraining a small language model on GINC and measuring its in-context learning.

:func:`pretrain_ginc_lm` trains a next-token model (an LSTM) on
random windows of a GINC world's pretraining corpus and caches the result on disk by
config hash (:func:`fmlab.cached`). :func:`in_context_grid` evaluates a trained model and
the exact Bayes predictor (:func:`fmlab.theory.bayes_icl.ginc_bayes_predictor`) on the
same prompts over a grid of example counts ``n`` and example lengths ``k``.

In-context **accuracy** is the fraction of prompts whose predicted next token (the argmax
of the model's next-token distribution after the prompt) equals the prompt's label.

Used in Chapter 6 (``notebooks/06-in-context-learning.ipynb``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ._validate import check_choice, check_float, check_int, check_tensor
from .data.ginc import DELIMITER, GINC, GINC_PRESETS, GINCConfig, Prompts
from .models.lstm import LSTMLanguageModel
from .repro import make_generator, seed_everything
from .theory.bayes_icl import ginc_bayes_predictor, prefix_log_likelihoods
from .train import cached, progress

__all__ = [
    "GINCPretrainConfig",
    "build_model",
    "pretrain_ginc_lm",
    "load_ginc_lm",
    "next_token_logits",
    "bayes_pretraining_loss",
    "ICLGrid",
    "in_context_grid",
    "random_concept_accuracy",
    "OrderSensitivity",
    "order_sensitivity",
]


@dataclass(frozen=True)
class GINCPretrainConfig:
    """Everything that determines a pretrained GINC model (the cache key).

    The model is an LSTM (:class:`fmlab.models.lstm.LSTMLanguageModel`) with ``width``
    hidden units. Training: ``steps`` Adam steps on ``batch_size`` random windows of
    ``window + 1`` tokens of the corpus, one-cycle learning rate peaking at ``lr``,
    gradient norm clipped at 1.
    """

    world: GINCConfig = GINC_PRESETS["cpu"]
    width: int = 256
    n_layers: int = 1
    embed_dim: int = 64
    steps: int = 1000
    batch_size: int = 32
    window: int = 128
    lr: float = 1e-2
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.world, GINCConfig):
            raise TypeError(
                f"world must be a GINCConfig, got {type(self.world).__name__}"
            )
        check_int("width", self.width, minimum=1)
        check_int("n_layers", self.n_layers, minimum=1)
        check_int("embed_dim", self.embed_dim, minimum=1)
        check_int("steps", self.steps, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        check_int("window", self.window, minimum=2)
        check_float("lr", self.lr, minimum=0.0, strict_min=True)
        check_int("seed", self.seed, minimum=0)


def build_model(cfg: GINCPretrainConfig) -> nn.Module:
    """A freshly initialised model for ``cfg`` (seeded by ``cfg.seed``)."""
    if not isinstance(cfg, GINCPretrainConfig):
        raise TypeError(f"cfg must be a GINCPretrainConfig, got {type(cfg).__name__}")
    seed_everything(
        cfg.seed
    )  # the LSTM's default initialisation draws from the global stream
    return LSTMLanguageModel(
        cfg.world.vocab_size,
        embed_dim=cfg.embed_dim,
        hidden_dim=cfg.width,
        n_layers=cfg.n_layers,
    )


def _windows(corpus: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    return corpus[starts.unsqueeze(1) + torch.arange(length)]


def _train(cfg: GINCPretrainConfig) -> dict:
    seed_everything(cfg.seed)
    world = GINC(cfg.world)
    corpus = world.pretraining_corpus()
    if len(corpus) <= cfg.window + 1:
        raise ValueError(
            f"the corpus ({len(corpus)} tokens) is shorter than window + 1 = {cfg.window + 1}"
        )
    model = build_model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=cfg.lr, total_steps=cfg.steps, pct_start=0.1
    )
    g = make_generator(cfg.seed + 10_000)
    V = cfg.world.vocab_size
    losses = torch.empty(cfg.steps)
    model.train()
    for step in progress(
        range(cfg.steps),
        total=cfg.steps,
        desc=f"pretraining LSTM-{cfg.width} (seed {cfg.seed})",
    ):
        x = _windows(
            corpus,
            torch.randint(
                0, len(corpus) - cfg.window - 1, (cfg.batch_size,), generator=g
            ),
            cfg.window + 1,
        )
        loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, V), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses[step] = loss.detach()
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
    }


def pretrain_ginc_lm(cfg: GINCPretrainConfig) -> dict:
    """Train (or load from the on-disk cache) the model of ``cfg``.

    Returns a dict with ``state_dict``, the training ``losses`` per step and ``val_loss``,
    the mean next-token cross-entropy on 256 fresh documents of ``window + 1`` tokens.
    """
    if not isinstance(cfg, GINCPretrainConfig):
        raise TypeError(f"cfg must be a GINCPretrainConfig, got {type(cfg).__name__}")
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
    """The model's next-token logits after each prompt: ``(B, T)`` tokens to ``(B, V)``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    tokens = check_tensor("tokens", tokens, ndim=2, integer=True)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    model.eval()
    return torch.cat(
        [
            model(tokens[i : i + batch_size])[:, -1]
            for i in range(0, len(tokens), batch_size)
        ]
    )


def bayes_pretraining_loss(
    world: GINC, length: int, n_documents: int = 256, seed: int = 0
) -> float:
    """The smallest possible next-token cross-entropy on documents of ``length`` tokens.

    The mean over positions 2..``length`` of :math:`-\\log p(o_{t}\\mid o_{1:t-1})` under the
    exact pretraining mixture (no smoothing), on ``n_documents`` fresh documents; the
    reference line for :func:`pretrain_ginc_lm`'s ``val_loss`` (same positions).
    """
    if not isinstance(world, GINC):
        raise TypeError(f"world must be a GINC, got {type(world).__name__}")
    length = check_int("length", length, minimum=2)
    n_documents = check_int("n_documents", n_documents, minimum=1)
    docs = world.sample_documents(n_documents, length, make_generator(seed))
    idx = world.seen_concepts
    lls = prefix_log_likelihoods(
        docs.tokens,
        world.transition_matrices(idx),
        world.emission_matrix(),
        world.start_probs[idx],
    )  # (B, C, T)
    mix = torch.logsumexp(
        lls - math.log(len(idx)), dim=1
    )  # log p(o_{1:t}) under the mixture
    return -(mix[:, -1] - mix[:, 0]).mean().item() / (length - 1)


@torch.no_grad()
def _nested_last_logits(model: nn.Module, full: Prompts, ns) -> dict:
    """Next-token logits after ``full.with_examples(n)`` for every ``n`` in ``ns``.

    A model with ``forward_with_state`` (the LSTM) reads the shared prefix of examples once
    and continues from the saved state; any other model reads every prompt in full.
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


@dataclass
class ICLGrid:
    r"""In-context results on a grid of ``ns`` x ``ks``; every array is indexed ``[i_n, i_k]``.

    ``bayes_accuracy`` is the accuracy of the Bayes predictor, ``true_posterior`` the mean
    Bayes posterior of the prompt concept (NaN when it is outside the prior),
    ``bayes_impossible`` the fraction of prompts with probability zero under every concept
    of the prior (possible only when ``epsilon = 0``; they count as errors). For every
    model name, ``accuracy[name]`` is its accuracy, ``agreement[name]`` the fraction of
    prompts where it predicts the same token as the Bayes predictor, and
    ``chance_agreement[name]`` the agreement expected if the two predictions were
    independent with the same marginals, :math:`\sum_v \hat p_{\text{model}}(v)\,\hat p_{\text{Bayes}}(v)`.
    ``predictions[(n, k)]`` keeps the labels and raw predictions.
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
) -> ICLGrid:
    """Evaluate models and the Bayes predictor on the same fresh prompts.

    For every ``k`` in ``ks``, ``n_prompts`` prompts with ``max(ns)`` examples are drawn from
    ``concepts`` (``"seen"`` or ``"unseen"``) with a generator seeded by ``seed`` and ``k``;
    the prompt with ``n`` examples keeps the first ``n`` of them and the same test example
    (:meth:`fmlab.data.ginc.Prompts.with_examples`), so the curves over ``n`` are paired.
    The Bayes predictor has smoothing ``epsilon`` and a uniform prior over
    ``prior_concepts`` (``"seen"``, the pretraining distribution, or ``"all"``).

    ``models`` is a dict name -> model (or None / empty for the Bayes predictor only).
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
    n_prompts = check_int("n_prompts", n_prompts, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    check_choice("concepts", concepts, ("seen", "unseen"))
    check_choice("prior_concepts", prior_concepts, ("seen", "all"))
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
        full = world.sample_prompts(
            n_prompts,
            max(ns),
            k,
            make_generator(seed * 1_000_003 + k),
            concepts=concepts,
        )
        last_logits = {
            name: _nested_last_logits(model, full, ns) for name, model in models.items()
        }
        for i, n in enumerate(ns):
            pr = full.with_examples(n)
            bayes = ginc_bayes_predictor(
                world, pr.tokens, epsilon, concepts=prior_concepts
            )
            b = bayes.prediction
            grid.bayes_accuracy[i, j] = (
                ((b == pr.labels) & ~bayes.impossible).double().mean()
            )
            grid.bayes_impossible[i, j] = bayes.impossible.double().mean()
            hit = prior_idx.unsqueeze(0) == pr.concepts.unsqueeze(
                1
            )  # (B, C): where c* sits in the prior
            if bool(hit.any(1).all()):
                grid.true_posterior[i, j] = (bayes.posterior * hit).sum(1).mean()
            entry = {"labels": pr.labels, "bayes": b, "concepts": pr.concepts}
            pb = torch.bincount(b, minlength=V).double() / n_prompts
            for name, model in models.items():
                m = last_logits[name][n].argmax(1)
                grid.accuracy[name][i, j] = (m == pr.labels).double().mean()
                grid.agreement[name][i, j] = (m == b).double().mean()
                pm = torch.bincount(m, minlength=V).double() / n_prompts
                grid.chance_agreement[name][i, j] = (pm * pb).sum()
                entry[name] = m
            grid.predictions[(n, k)] = entry
    return grid


def random_concept_accuracy(world: GINC, prompts: Prompts) -> float:
    r"""Accuracy of a learner that knows every pretraining HMM exactly but picks the concept
    at random: the mean over seen concepts :math:`c` of the fraction of prompts whose label
    equals :math:`\arg\max_v p(o_k = v \mid \text{test input}, c)`. The chance level for
    prompts from unseen concepts.
    """
    if not isinstance(world, GINC):
        raise TypeError(f"world must be a GINC, got {type(world).__name__}")
    if not isinstance(prompts, Prompts):
        raise TypeError(f"prompts must be Prompts, got {type(prompts).__name__}")
    x = prompts.examples[:, -1, :-1]
    hits = [
        (
            world.most_likely_next_token(
                x, torch.full_like(prompts.labels, c), prompts.start_property
            )
            == prompts.labels
        )
        .double()
        .mean()
        for c in world.seen_concepts.tolist()
    ]
    return float(torch.stack(hits).mean())


@dataclass(frozen=True)
class OrderSensitivity:
    """Predictions of a model and of the Bayes predictor under every order of the examples.

    ``orders`` lists the permutations; ``model_accuracy`` and ``bayes_accuracy`` hold one
    accuracy per order; ``model_changed`` and ``bayes_changed`` are the fractions of prompts
    whose prediction is not the same under every order.
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
    """Evaluate ``model`` and the Bayes predictor on ``prompts`` with the in-context examples
    permuted (the first ``max_orders`` permutations in lexicographic order; the test
    example stays last)."""
    import itertools

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(world, GINC):
        raise TypeError(f"world must be a GINC, got {type(world).__name__}")
    if not isinstance(prompts, Prompts):
        raise TypeError(f"prompts must be Prompts, got {type(prompts).__name__}")
    if prompts.n_examples < 2:
        raise ValueError(
            f"prompts must hold at least 2 in-context examples, got {prompts.n_examples}"
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
