"""The exact Bayesian in-context predictor of GINC: the runs of Chapter 6's first page.

Every quantity here is computed from the GINC world of a
:class:`~fmlab.chapters.ch6_icl.Chapter6Config` and the exact predictor
:func:`fmlab.data.ginc.ginc_bayes_predictor` (no trained model):

- :func:`path_sum`: the brute-force sum over hidden paths
  :math:`\\sum_{h_{1:L}} \\pi(h_1) O(h_1, o_1) \\prod_t T(h_{t-1}, h_t) O(h_t, o_t)`
  that the page checks the forward recursion against (symbolically, with ``sympy``);
- :func:`bayes_curves`: the posterior of the prompt concept and the Bayes accuracy over
  ``n`` and ``k``, on the prompts that the transformers of the second page read;
- :func:`smoothing_sweep`: the Bayes accuracy against the smoothing;
- :func:`concentration_condition`: the sufficient condition :math:`D(c) > 0` of the
  concentration theorem, and the posterior after many examples where it holds.

Used in Chapter 6 (``notebooks/06-in-context-learning.ipynb``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from .._validate import check_float, check_int
from ..data.ginc import GINC, distinguishability, ginc_bayes_predictor
from ..repro import make_generator
from ..train import cached
from .ch6_icl import Chapter6Config, evaluate_in_context, gain_per_seed, in_context_grid

__all__ = [
    "path_sum",
    "BayesCurves",
    "bayes_curves",
    "SmoothingConfig",
    "SmoothingSweep",
    "smoothing_sweep",
    "ConditionConfig",
    "ConditionCheck",
    "concentration_condition",
]


def path_sum(T, O, obs, first):
    """The sum over every hidden path :math:`h_1, \\dots, h_L` (``L = len(obs)``) of
    ``first[h_1] * O[h_1, obs[0]] * prod_t T[h_{t-1}, h_t] * O[h_t, obs[t]]``.

    With ``first`` the law of the first state this is :math:`p(o_{1:L})`; with
    ``first = T[h, :]`` it is :math:`p(o_{1:L}\\mid h_0 = h)`. Works on anything
    indexable by ``[i, j]`` and ``[i]`` (``sympy`` matrices included), by brute force
    over all :math:`H^L` paths: an oracle for small cases, not a method.
    """
    H = len(first)
    total = 0
    for path in itertools.product(range(H), repeat=len(obs)):
        pr = first[path[0]] * O[path[0], obs[0]]
        for t in range(1, len(obs)):
            pr *= T[path[t - 1], path[t]] * O[path[t], obs[t]]
        total += pr
    return total


def _check_cfg(cfg) -> None:
    if not isinstance(cfg, Chapter6Config):
        raise TypeError(f"cfg must be a Chapter6Config, got {type(cfg).__name__}")


@dataclass(frozen=True)
class BayesCurves:
    """The Bayes predictor over ``ns`` x ``ks`` (:func:`bayes_curves`): ``posterior``
    and ``accuracy`` are arrays (evaluation seeds, n, k) of the mean posterior of the
    prompt concept and the accuracy; ``gain[k]`` is the accuracy at the largest ``n``
    minus at ``n = 0``, one per evaluation seed."""

    ns: tuple
    ks: tuple
    posterior: np.ndarray
    accuracy: np.ndarray
    gain: dict


def bayes_curves(cfg: Chapter6Config) -> BayesCurves:
    """The Bayes predictor on seen concepts at every ``k`` in ``cfg.bayes_ks``: at the
    ``k`` in ``cfg.ks`` on the prompts the transformers are evaluated on
    (``cfg.n_prompts`` per point), at the others on ``cfg.n_prompts_bayes`` prompts;
    the evaluation seeds and ``epsilon`` of ``cfg`` (cached by
    :func:`~fmlab.chapters.ch6_icl.evaluate_in_context`, without a model)."""
    _check_cfg(cfg)
    evaluate = dict(seeds=cfg.eval_seeds, epsilon=cfg.epsilon, model_ks=())
    pcfg = cfg.pretrain_config()
    short = evaluate_in_context(
        pcfg, cfg.ns, cfg.ks, n_prompts=cfg.n_prompts, **evaluate
    )
    ceiling_ks = tuple(k for k in cfg.bayes_ks if k not in cfg.ks)
    long = evaluate_in_context(
        pcfg, cfg.ns, ceiling_ks, n_prompts=cfg.n_prompts_bayes, **evaluate
    )
    posterior, accuracy = (
        np.concatenate(
            [
                torch.stack([getattr(g, attr) for g in grids]).numpy()
                for grids in (short, long)
            ],
            axis=2,
        )
        for attr in ("true_posterior", "bayes_accuracy")
    )
    gain = {k: gain_per_seed(short if k in cfg.ks else long, k) for k in cfg.bayes_ks}
    return BayesCurves(
        tuple(cfg.ns), tuple(cfg.ks) + ceiling_ks, posterior, accuracy, gain
    )


@dataclass(frozen=True)
class SmoothingConfig:
    """The smoothing sweep: Bayes accuracies at every ``epsilon`` in ``epsilons``, on
    ``n_prompts`` prompts per point with ``ns`` examples of the lengths ``ks``, one
    draw per seed in ``seeds``."""

    epsilons: tuple = (0.0, 1e-8, 1e-2, 1e-1, 0.5)
    ns: tuple = (0, 1, 8)
    ks: tuple = (3, 5)
    n_prompts: int = 300
    seeds: tuple = (11, 12, 13, 14, 15)

    def __post_init__(self):
        for e in self.epsilons:
            check_float("epsilons", e, minimum=0.0, maximum=1.0)
        check_int("n_prompts", self.n_prompts, minimum=1)


@dataclass(frozen=True)
class SmoothingSweep:
    """:func:`smoothing_sweep`'s result: ``accuracy[eps]`` and ``impossible[eps]`` are
    arrays (seeds, n, k) of the Bayes accuracy and of the fraction of prompts with
    probability zero under every pretraining concept (possible only at ``eps = 0``)."""

    config: SmoothingConfig
    accuracy: dict
    impossible: dict


def smoothing_sweep(cfg: Chapter6Config, scfg: SmoothingConfig) -> SmoothingSweep:
    """The Bayes predictor of ``cfg``'s world (:func:`in_context_grid` without a model)
    at every smoothing of ``scfg``; cached."""
    _check_cfg(cfg)
    if not isinstance(scfg, SmoothingConfig):
        raise TypeError(f"scfg must be a SmoothingConfig, got {type(scfg).__name__}")

    def build() -> dict:
        world = GINC(cfg.world)
        grids = [
            [
                in_context_grid(
                    None,
                    world,
                    scfg.ns,
                    scfg.ks,
                    n_prompts=scfg.n_prompts,
                    seed=s,
                    epsilon=eps,
                )
                for s in scfg.seeds
            ]
            for eps in scfg.epsilons
        ]
        return {
            attr: torch.stack(
                [torch.stack([getattr(g, attr) for g in gs]) for gs in grids]
            )
            for attr in ("bayes_accuracy", "bayes_impossible")
        }

    raw = cached({"world": cfg.world, "sweep": scfg}, build, name="ginc_smoothing")
    return SmoothingSweep(
        scfg,
        *(
            {e: raw[attr][i].numpy() for i, e in enumerate(scfg.epsilons)}
            for attr in ("bayes_accuracy", "bayes_impossible")
        ),
    )


@dataclass(frozen=True)
class ConditionConfig:
    """The check of the concentration theorem's condition: :math:`D` estimated from
    ``n_segments`` segments (seed ``seed``) at every ``k`` of the chapter's
    ``bayes_ks``; then ``n_prompts`` prompts with ``n_examples`` examples of length
    ``k`` (seed ``prompt_seed``) for the posterior after many examples."""

    n_segments: int = 100
    seed: int = 5
    n_prompts: int = 1000
    n_examples: int = 16
    k: int = 5
    prompt_seed: int = 21


@dataclass(frozen=True)
class ConditionCheck:
    """:func:`concentration_condition`'s result. ``worst_margin[k]`` is
    :math:`\\min_{c\\ne c^\\star} D(c^\\star, s_0, c)`, shape (C, P - 1) over the prompt
    concept and the start property; ``concepts``, ``start_property`` and
    ``posterior`` describe the check's prompts (the posterior of the prompt concept
    after ``n_examples`` examples)."""

    config: ConditionConfig
    worst_margin: dict
    concepts: torch.Tensor
    start_property: torch.Tensor
    posterior: torch.Tensor


def concentration_condition(
    cfg: Chapter6Config, ccfg: ConditionConfig
) -> ConditionCheck:
    """Estimate :math:`D` (:func:`fmlab.data.ginc.distinguishability`) at every ``k``
    in ``cfg.bayes_ks`` and the posterior of the prompt concept on the check's prompts,
    with ``cfg.epsilon``; cached."""
    _check_cfg(cfg)
    if not isinstance(ccfg, ConditionConfig):
        raise TypeError(f"ccfg must be a ConditionConfig, got {type(ccfg).__name__}")

    def build() -> dict:
        world = GINC(cfg.world)
        C = cfg.world.n_seen
        off = ~torch.eye(C, dtype=torch.bool)  # the competitors c != c*
        margins = {}
        for k in cfg.bayes_ks:
            D = distinguishability(
                world, k, cfg.epsilon, n_segments=ccfg.n_segments, seed=ccfg.seed
            )
            margins[k] = torch.stack([D[cs][:, off[cs]].amin(1) for cs in range(C)])
        pr = world.sample_prompts(
            ccfg.n_prompts, ccfg.n_examples, ccfg.k, make_generator(ccfg.prompt_seed)
        )
        post = ginc_bayes_predictor(world, pr.tokens, cfg.epsilon).posterior
        return {
            "margins": margins,
            "concepts": pr.concepts,
            "start_property": pr.start_property,
            "posterior": post.gather(1, pr.concepts[:, None]).squeeze(1),
        }

    raw = cached(
        {
            "world": cfg.world,
            "bayes_ks": cfg.bayes_ks,
            "epsilon": cfg.epsilon,
            "check": ccfg,
        },
        build,
        name="ginc_condition",
    )
    return ConditionCheck(
        ccfg, raw["margins"], raw["concepts"], raw["start_property"], raw["posterior"]
    )
