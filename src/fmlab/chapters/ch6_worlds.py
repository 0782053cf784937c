"""In-context learning on the paper's own data, across worlds (Chapter 6, page 06b).

The page pretrains on documents with random state jumps; this module measures what the
same transformer learns in context when it is pretrained on the paper's documents
(no jumps, ``corpus_eps = 0``) in several worlds (the seed offsets ``offsets``: each
draws a new GINC world, corpus, model and prompts), beside what separates the worlds:

* the gains from ``n = 0`` to ``n = 8`` examples (``k = 3`` and ``5``) of the trained
  transformer (one per training seed, every evaluation seed), exactly as the page
  measures them (:func:`fmlab.chapters.ch6_icl.in_context_grid`);
* the same gains of the Bayes predictor of the page (smoothing 0.01), of the smoothed
  corpus's own Bayes predictor (the jump rate 0.15) and of the near-exact predictor of
  the paper's documents (smoothing 1e-8);
* the share of prompts with eight examples that are impossible under every unsmoothed
  pretraining HMM (a boundary that no concept allows);
* the share of the triples (prompt concept, start property, other concept) that meet
  the distinguishability condition of the concentration theorem at the smoothing 0.01
  (:func:`fmlab.data.ginc.distinguishability`).

Training a model per world takes longer than a page may, so
``scripts/ch6_worlds.py`` runs it into ``results/ch6_worlds.json`` with the fingerprint
of the code below (:mod:`fmlab.stored`). The same script at the paper's scale
(``--scale paper``: 4 layers of width 768, window 1024, batch 8, 6000 steps on the
paper's corpus of 1000 documents of 10 240 tokens; a GPU) writes
``results/ch6_paper_size.json``; the page says when that file is absent.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from .. import stored
from .._validate import check_choice, check_int
from ..data.ginc import GINC, distinguishability, ginc_preset
from ..repro import single_threaded
from . import ch6_icl

__all__ = [
    "WORLDS_RESULTS",
    "PAPER_SIZE_RESULTS",
    "WORLDS_SCRIPT",
    "WorldsConfig",
    "WORLDS_SLICE",
    "worlds_config",
    "worlds_run",
    "worlds_slice",
    "worlds_results",
    "worlds_sources",
    "pooled_gain",
]

WORLDS_RESULTS = Path(__file__).parent / "results" / "ch6_worlds.json"
PAPER_SIZE_RESULTS = Path(__file__).parent / "results" / "ch6_paper_size.json"
WORLDS_SCRIPT = "scripts/ch6_worlds.py"


@dataclass(frozen=True)
class WorldsConfig:
    """Everything that determines :func:`worlds_run`. The defaults are the page's
    transformer (``scale = "book"``) pretrained on the paper's documents of the page's
    world; ``scale = "paper"`` is the paper's model and corpus (:meth:`pretrain`)."""

    scale: str = "book"
    offsets: tuple = (0, 1, 2, 3, 4)
    model_seeds: tuple = (0,)
    corpus_eps: float = 0.0  # the paper's documents
    steps: int = 0  # 0: the scale's own
    ns: tuple = (0, 1, 2, 4, 8)
    ks: tuple = (3, 5)
    eval_seeds: tuple = (1, 2, 3, 4, 5)
    n_prompts: int = 800
    epsilon: float = 0.01  # the page's Bayes predictor
    bayes_eps: tuple = (0.15, 1e-8)  # the jump rate's predictor; near-exact
    n_segments: int = 100  # distinguishability: segments per (concept, start)

    def __post_init__(self):
        check_choice("scale", self.scale, ("book", "paper", "tiny"))
        for o in self.offsets:
            check_int("offsets", o, minimum=0)
        check_int("steps", self.steps, minimum=0)
        check_int("n_prompts", self.n_prompts, minimum=1)

    def pretrain(self, seed: int) -> ch6_icl.GINCPretrainConfig:
        """The training run with ``seed`` (no dropout, so runs train stacked)."""
        chapter = ch6_icl.Chapter6Config()
        base = chapter.pretrain_config(seed)
        if self.scale == "paper":  # Xie et al.: GPT-2 small-ish, their recipe
            base = replace(
                base,
                world=ginc_preset("paper", vocab_size=150),
                width=768,
                n_layers=4,
                n_heads=12,
                window=1024,
                batch_size=8,
                steps=6000,
                lr=8e-4,
                warmup=1000,
            )
        elif self.scale == "tiny":
            base = replace(
                base,
                world=ginc_preset("cpu", vocab_size=150, n_documents=20),
                width=16,
                n_heads=2,
                steps=40,
                warmup=5,
            )
        steps = self.steps or base.steps
        return replace(
            base,
            corpus_eps=self.corpus_eps,
            steps=steps,
            warmup=min(base.warmup, steps),
        )


@contextlib.contextmanager
def _offset(offset: int):
    """Run the block at seed ``offset`` (a new world, corpus, model and prompts)."""
    old = os.environ.get("FMLAB_SEED_OFFSET")
    os.environ["FMLAB_SEED_OFFSET"] = str(offset)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("FMLAB_SEED_OFFSET", None)
        else:
            os.environ["FMLAB_SEED_OFFSET"] = old


def _gains(grids, k: int, name=None) -> list:
    return ch6_icl.gain_per_seed(grids, k, name=name).tolist()


def worlds_run(config: WorldsConfig, offset: int, device="cpu") -> dict:
    """Train ``config``'s runs in the world of seed ``offset`` (together, as stacked
    weights, on ``device``; every batch is drawn by the CPU's generators) and measure
    the quantities of the module docstring, as plain lists for JSON."""
    if not isinstance(config, WorldsConfig):
        raise TypeError(f"config must be a WorldsConfig, got {type(config)}")
    c, t0 = config, time.time()
    with _offset(offset), single_threaded():
        cfgs = [c.pretrain(s) for s in c.model_seeds]
        world = GINC(cfgs[0].world)
        runs = ch6_icl._train_stacked(cfgs, device=device)
        models = []
        for cfg, run in zip(cfgs, runs):
            model = ch6_icl.build_model(cfg)
            model.load_state_dict(run["state_dict"])
            models.append(model.eval())
        out = {"offset": offset, "val_loss": [r["val_loss"] for r in runs]}
        gains = {k: [[] for _ in models] for k in c.ks}
        bayes = {k: [] for k in c.ks}
        for s in c.eval_seeds:
            named = {f"run{i}": m for i, m in enumerate(models)}
            grid = ch6_icl.in_context_grid(
                named,
                world,
                c.ns,
                c.ks,
                n_prompts=c.n_prompts,
                seed=s,
                epsilon=c.epsilon,
            )
            for k in c.ks:
                for i in range(len(models)):
                    gains[k][i] += _gains([grid], k, f"run{i}")
                bayes[k] += _gains([grid], k)
        out["gain"] = {str(k): v for k, v in gains.items()}
        out["bayes_gain"] = {str(k): v for k, v in bayes.items()}
        for eps in c.bayes_eps:
            grids = [
                ch6_icl.in_context_grid(
                    None,
                    world,
                    (0, max(c.ns)),
                    c.ks,
                    n_prompts=c.n_prompts,
                    seed=s,
                    epsilon=eps,
                )
                for s in c.eval_seeds
            ]
            out[f"bayes_gain_eps{eps:g}"] = {str(k): _gains(grids, k) for k in c.ks}
        exact = [
            ch6_icl.in_context_grid(
                None,
                world,
                (max(c.ns),),
                c.ks,
                n_prompts=c.n_prompts,
                seed=s,
                epsilon=0.0,
            )
            for s in c.eval_seeds[:1]
        ]
        out["impossible"] = {
            str(k): float(exact[0].bayes_impossible[0, j]) for j, k in enumerate(c.ks)
        }
        dist = {}
        for k in c.ks:
            d = distinguishability(world, k, c.epsilon, n_segments=c.n_segments)
            C = d.shape[0]
            off = ~torch.eye(C, dtype=torch.bool).view(C, 1, C).expand_as(d)
            dist[str(k)] = float((d[off] > 0).double().mean())
        out["distinguishable"] = dist
    out["seconds"] = time.time() - t0
    return out


def worlds_sources() -> list:
    """The package code that produces the stored runs, for their fingerprint
    (:mod:`fmlab.stored`); the script's settings are in the file as its config."""
    from ..data import ginc
    from ..models import gpt
    from ..repro import _splitmix64, effective_seed, make_generator, seed_everything
    from ..theory import bayes_icl
    from ..train import lr_factor

    return [
        WorldsConfig,
        worlds_run,
        worlds_config,
        worlds_slice,
        _offset,
        ch6_icl.Chapter6Config,
        ch6_icl.GINCPretrainConfig,
        ch6_icl._train_stacked,
        ch6_icl._stacked_logits,
        ch6_icl._stacked_linear,
        ch6_icl._stacked_layer_norm,
        ch6_icl._validation_loss,
        ch6_icl._corpus,
        ch6_icl._draw_windows,
        ch6_icl.build_model,
        ch6_icl.in_context_grid,
        ch6_icl._nested_last_logits,
        ch6_icl.next_token_logits,
        ch6_icl._bayes_on_prompts,
        ch6_icl.gain_per_seed,
        lr_factor,
        seed_everything,
        make_generator,
        effective_seed,
        _splitmix64,  # effective_seed's mixer
        ginc,
        gpt,
        bayes_icl,
    ]


def worlds_config(record: dict) -> WorldsConfig:
    """The :class:`WorldsConfig` recorded as data in a results file."""
    return WorldsConfig(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
    )


#: The slice the tests rerun (under another rounding path than the record's): a tiny
#: transformer, three training runs, 20 steps, one world, 200 prompts; seconds.
WORLDS_SLICE = dict(
    scale="tiny",
    offsets=(0,),
    model_seeds=(0, 1, 2),
    steps=10,
    eval_seeds=(1, 2),
    n_prompts=100,
    bayes_eps=(0.15,),
    n_segments=20,
)


def worlds_slice(record: dict | None = None, device="cpu") -> dict:
    """Run the slice (the config ``record``, by default :data:`WORLDS_SLICE`) in its
    first world: the gains of each training run (the replicates, first axis) at each
    ``k`` and evaluation seed, and each run's validation loss, the quantities that
    :func:`fmlab.stored.compare_runs` compares."""
    config = WorldsConfig(**WORLDS_SLICE) if record is None else worlds_config(record)
    out = worlds_run(config, config.offsets[0], device=device)
    runs = range(len(config.model_seeds))
    return {  # the validation losses too: gains on 200 prompts rarely move a bit
        "gain": [[out["gain"][str(k)][r] for k in config.ks] for r in runs],
        "val_loss": out["val_loss"],
    }


def worlds_results(path: Path | str | None = None, *, paper: bool = False):
    """The stored runs across worlds (``paper``: at the paper's scale): ``{"meta",
    "worlds": [per world: gains (k -> per run, per evaluation seed), Bayes gains,
    impossible shares, distinguishable shares]}``, or None when the file is absent.
    Raises :class:`fmlab.stored.StaleResults`, naming the script, when the code
    behind it has changed since."""
    default = PAPER_SIZE_RESULTS if paper else WORLDS_RESULTS
    path = Path(default if path is None else path)
    if not path.exists():
        return None
    data = stored.load(path, script=WORLDS_SCRIPT, sources=worlds_sources())
    return {"meta": data["meta"] | {"stored": data["stored"]}, "worlds": data["worlds"]}


def pooled_gain(results: dict) -> np.ndarray:
    """The transformer's gain from ``n = 0`` to the largest ``n``, ``k = 3`` and ``5``
    averaged, one per world x training run x evaluation seed (the registry's
    ``ch6.unsmoothed_gain_pooled``)."""
    out = []
    for w in results["worlds"]:
        per_k = np.array([w["gain"][k] for k in sorted(w["gain"])])  # (k, run, seed)
        out.append(per_k.mean(0).reshape(-1))
    return np.concatenate(out)
