"""The theory page of Chapter 5 (``notebooks/05-implicit-bias.ipynb``): configs,
runners and result dataclasses.

Three experiments, each exact or nearly so:

* the per-block trace of the Hessian of a small masked LM, exactly (one HVP per
  parameter) against Hutchinson's estimate (:class:`BlockTraceConfig`,
  :func:`block_traces`);
* mini-batch SGD on the factorised categorical model
  :math:`p_\\theta = \\mathrm{softmax}(z)`, :math:`z_k = u_k v_k`, whose minimisers
  are the product of hyperbolas :math:`u_k v_k = c_k`
  (:mod:`fmlab.theory.sgd_manifold`): the runs drift along it toward the smallest
  :math:`\\operatorname{tr} H`, at the speed :math:`\\eta^2/B` of the limiting flow
  (:class:`SGDManifoldConfig`, :func:`manifold_sgd`, :class:`ManifoldResult`);
* the Dyck-language construction of Liu et al. (2023, section 6): a transferable and
  several memorising zero-loss solutions, each at its flattest rescaling, with their
  exact traces and downstream errors (:class:`DyckConfig`, :func:`dyck_solutions`).

The same-loss experiments of the chapter's second and third pages are in
:mod:`fmlab.chapters.ch5_implicit_bias` and :mod:`fmlab.chapters.ch5_sgd_noise`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._validate import check_float, check_int
from ..repro import make_generator
from ..theory.dyck_flatness import (
    downstream_error,
    exact_trace,
    memorizing_solution,
    pretraining_loss,
    rebalance,
    transferable_solution,
)
from ..theory.sgd_manifold import ManifoldModel, flow_trace, sgd_on_manifold_model
from ..train import cached
from .ch5_implicit_bias import block_trace_comparison

__all__ = [
    "BlockTraceConfig",
    "block_traces",
    "SGDManifoldConfig",
    "ManifoldResult",
    "manifold_sgd",
    "DyckConfig",
    "dyck_solutions",
    "examples_needed",
    "softmax_nll",
    "softmax_population_loss",
    "fit_softmax_regression",
]


# ---------------------------------------------------------------------------------
# exact block traces against Hutchinson's estimate
# ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockTraceConfig:
    """The small masked LM whose Hessian is computed exactly, block by block."""

    hidden: int = 6  # GRU state size: small enough for one HVP per parameter
    sentences: int = 48  # the loss is the masked-LM loss on these fixed sentences
    train_steps: int = 150  # brief Adam training, so the Hessian is near a minimum
    probes: int = 300  # Hutchinson probes
    seed: int = 0


def block_traces(config: BlockTraceConfig) -> dict:
    """:func:`fmlab.chapters.ch5_implicit_bias.block_trace_comparison` for ``config``
    (not cached: it takes a few seconds, and it times itself)."""
    if not isinstance(config, BlockTraceConfig):
        raise TypeError(
            f"config must be a BlockTraceConfig, got {type(config).__name__}"
        )
    return block_trace_comparison(
        hidden=config.hidden,
        sentences=config.sentences,
        train_steps=config.train_steps,
        probes=config.probes,
        seed=config.seed,
    )


# ---------------------------------------------------------------------------------
# SGD along a manifold of minimisers
# ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SGDManifoldConfig:
    """The SGD runs on the factorised categorical model."""

    p_star: tuple = (0.4, 0.3, 0.2, 0.1)  # the true distribution of the tokens
    s0: float = 1.5  # starting imbalance on every hyperbola: a sharp minimiser
    lrs: tuple = (0.01, 0.02, 0.03, 0.04)
    batches: tuple = (1, 2, 4, 8)
    runs: int = 256  # independent runs per setting
    steps: int = 20_000
    record_every: int = 100
    seed: int = 0
    replicates: int = 8  # the runs of a setting are split into this many replicates

    def __post_init__(self):
        check_int("runs", self.runs, minimum=1)
        check_int("replicates", self.replicates, minimum=1)
        if self.runs % self.replicates:
            raise ValueError("runs must be a multiple of replicates")

    @property
    def settings(self) -> list[tuple[float, int]]:
        """Every (learning rate, batch size), learning rate major."""
        return [(lr, b) for lr in self.lrs for b in self.batches]


@dataclass(frozen=True)
class ManifoldResult:
    """Recorded SGD runs: ``steps`` (k,) float64; per record, setting and run the
    trace of the Hessian ``trace`` and the excess loss ``excess`` (k, settings, runs),
    and the log-imbalance ``s`` (k, settings, runs, K-1)."""

    config: SGDManifoldConfig
    model: ManifoldModel
    s0: torch.Tensor
    steps: torch.Tensor
    trace: torch.Tensor
    excess: torch.Tensor
    s: torch.Tensor

    @property
    def settings(self) -> list[tuple[float, int]]:
        return self.config.settings

    def setting(self, lr: float, batch: int) -> int:
        """The index of the setting (``lr``, ``batch``)."""
        return self.settings.index((lr, batch))

    @property
    def min_trace(self) -> float:
        """The flattest minimiser's trace."""
        return self.model.min_trace()

    @property
    def entropy(self) -> float:
        """The optimal loss, the entropy of :math:`p^\\star` (nats)."""
        p = self.model.p_star
        return float(-(p * p.log()).sum())

    def replicate_means(self) -> torch.Tensor:
        """The mean trace of each replicate's runs: (k, settings, replicates)."""
        r = self.config.replicates
        return self.trace.reshape(*self.trace.shape[:2], r, -1).mean(-1)

    def half_time(self, path: torch.Tensor) -> float:
        """The step at which a trace path first falls below the midpoint of its start
        and the flattest minimiser's trace, interpolated linearly between the two
        records around the crossing (nan if it never does)."""
        mid = 0.5 * (path[0] + self.min_trace)
        below = (path < mid).nonzero()
        if not len(below):
            return float("nan")
        k = int(below[0, 0])
        if k == 0:
            return float(self.steps[0])
        frac = (path[k - 1] - mid) / (path[k - 1] - path[k])
        return float(self.steps[k - 1] + frac * (self.steps[k] - self.steps[k - 1]))

    def flow(self, lr: float, batch: int) -> torch.Tensor:
        """The limiting flow's trace at the recorded steps of (``lr``, ``batch``)."""
        return flow_trace(self.model, self.s0, lr**2 * self.steps, float(batch))

    def flow_deviation(self, path: torch.Tensor, lr: float, batch: int) -> float:
        """Mean relative deviation of a trace path from the flow's."""
        pred = self.flow(lr, batch)
        return float(((path - pred).abs() / pred).mean())

    def reached(self) -> list[int]:
        """The settings whose mean path (over all runs) reaches the midpoint."""
        return [
            i
            for i in range(len(self.settings))
            if not math.isnan(self.half_time(self.trace[:, i].mean(1)))
        ]

    def drift_exponents(self) -> torch.Tensor:
        """Per replicate, the least-squares slope of log half-time against
        :math:`\\log(\\eta^2/B)` over the settings that reach the midpoint."""
        reps, reached = self.replicate_means(), self.reached()
        x = torch.tensor([math.log(lr**2 / b) for lr, b in self.settings])[reached]
        xc = x - x.mean()
        out = []
        for r in range(reps.shape[2]):
            y = torch.tensor([math.log(self.half_time(reps[:, i, r])) for i in reached])
            out.append(float((xc * (y - y.mean())).sum() / xc.pow(2).sum()))
        return torch.tensor(out)

    def largest_flow_deviation(self, max_noise: float) -> torch.Tensor:
        """Per replicate, the largest mean relative deviation from the flow over the
        settings with :math:`\\eta^2/B \\le` ``max_noise``."""
        reps = self.replicate_means()
        small = [i for i, (lr, b) in enumerate(self.settings) if lr**2 / b <= max_noise]
        return torch.tensor(
            [
                max(
                    self.flow_deviation(reps[:, i, r], *self.settings[i]) for i in small
                )
                for r in range(reps.shape[2])
            ]
        )

    def flow_half_time(self) -> float:
        """The flow's own half-time, in units of :math:`\\eta^2 k/B`."""
        t = torch.linspace(0, 20, 20001, dtype=torch.float64)
        fl = flow_trace(self.model, self.s0, t, 1.0)
        return float(t[(fl < 0.5 * (fl[0] + self.min_trace)).nonzero()[0, 0]])

    def rows(self) -> list[dict]:
        """One row per setting: its half-time (raw and scaled by
        :math:`\\eta^2/B`), mean deviation from the flow, mean excess loss and final
        mean trace (means over all runs)."""
        out = []
        for i, (lr, b) in enumerate(self.settings):
            mean = self.trace[:, i].mean(1)
            th = self.half_time(mean)
            out.append(
                {
                    "η": lr,
                    "B": b,
                    "half-time": th,
                    "η²·half/B": lr**2 * th / b,
                    "dev. from flow": self.flow_deviation(mean, lr, b),
                    "excess loss": float(self.excess[1:, i].mean()),
                    "final tr H": float(self.trace[-1, i].mean()),
                }
            )
        return out


def manifold_sgd(config: SGDManifoldConfig) -> ManifoldResult:
    """Run every setting's SGD runs in parallel (cached): ``config.runs`` runs per
    (learning rate, batch) setting, from the sharp minimiser with imbalance
    ``config.s0`` on every hyperbola."""
    if not isinstance(config, SGDManifoldConfig):
        raise TypeError(
            f"config must be a SGDManifoldConfig, got {type(config).__name__}"
        )
    c = config
    model = ManifoldModel(torch.tensor(c.p_star, dtype=torch.float64))
    s0 = torch.full((len(c.p_star) - 1,), c.s0, dtype=torch.float64)

    def run():
        per_run = [(lr, b) for lr, b in c.settings for _ in range(c.runs)]
        lr = torch.tensor([lr for lr, _ in per_run], dtype=torch.float64)
        bs = torch.tensor([b for _, b in per_run], dtype=torch.float64)
        paths = sgd_on_manifold_model(
            model,
            s0,
            lr,
            bs,
            steps=c.steps,
            record_every=c.record_every,
            generator=make_generator(c.seed),
        )
        return dict(vars(paths))

    raw = cached(c, run, name="ch05_manifold")
    k, n = len(raw["steps"]), len(c.settings)
    return ManifoldResult(
        config=c,
        model=model,
        s0=s0,
        steps=raw["steps"].double(),
        trace=raw["trace"].reshape(k, n, c.runs),
        excess=raw["excess"].reshape(k, n, c.runs),
        s=raw["s"].reshape(k, n, c.runs, -1),
    )


# ---------------------------------------------------------------------------------
# the Dyck construction
# ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DyckConfig:
    """The two kinds of zero-loss solutions of the Dyck task."""

    n: int = 8  # sentence length: 560 masked inputs
    neurons: int = 800  # random neurons of a memorising solution: enough to interpolate
    seeds: tuple = (0, 1, 2)  # one memorising solution per seed
    downstream_sizes: tuple = (2, 4, 8, 16, 32, 64, 128)
    draws: int = 10  # downstream training sets per size


def dyck_solutions(config: DyckConfig) -> dict:
    """Each solution (``"transferable"``, ``"memorising <seed>"``), rebalanced to its
    flattest point, with its pretraining ``loss``, exact ``trace`` and downstream
    ``errors`` (sizes, draws) (cached)."""
    if not isinstance(config, DyckConfig):
        raise TypeError(f"config must be a DyckConfig, got {type(config).__name__}")
    c = config

    def run():
        sols = {"transferable": rebalance(transferable_solution(c.n))}
        for s in c.seeds:
            sols[f"memorising {s}"] = rebalance(
                memorizing_solution(c.n, c.neurons, make_generator(s))
            )
        out = {}
        for name, sol in sols.items():
            errs = [
                [
                    downstream_error(sol, N, make_generator(1000 * N + d))
                    for d in range(c.draws)
                ]
                for N in c.downstream_sizes
            ]
            out[name] = {
                "loss": pretraining_loss(sol),
                "trace": exact_trace(sol),
                "errors": torch.tensor(errs),
            }
        return out

    return cached(c, run, name="ch05_dyck")


def examples_needed(errors: torch.Tensor, sizes, level: float = 0.01) -> float:
    """The smallest size of ``sizes`` whose mean error (over draws, ``errors`` (sizes,
    draws)) is below ``level`` (inf if none)."""
    level = check_float("level", level, minimum=0.0, strict_min=True)
    ok = (errors.mean(1) < level).nonzero()
    return sizes[int(ok[0, 0])] if len(ok) else float("inf")


# ---------------------------------------------------------------------------------
# the exercise on a misspecified model
# ---------------------------------------------------------------------------------
def softmax_nll(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    r""":math:`-\log\mathrm{softmax}(Wx+b)_y` for one input ``x`` and label ``y``
    (a 0-d tensor), with ``p = {"W", "b"}``."""
    return -torch.log_softmax(x @ p["W"].T + p["b"], -1).gather(-1, y.reshape(1))[0]


def softmax_population_loss(
    p: dict, X: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """The population cross-entropy :math:`-\frac1n\\sum_i\\sum_y q_i(y)
    \\log\\mathrm{softmax}(Wx_i+b)_y` of a softmax regression ``p = {"W", "b"}``,
    with label probabilities ``targets`` ``(n, C)``."""
    return -(targets * torch.log_softmax(X @ p["W"].T + p["b"], -1)).sum(1).mean()


def fit_softmax_regression(X: torch.Tensor, targets: torch.Tensor) -> dict:
    """The minimiser of :func:`softmax_population_loss`, by L-BFGS to rounding:
    ``{"W", "b"}`` (the problem is convex, so the minimiser is unique up to the
    softmax's shift)."""
    C = targets.shape[1]
    w = {
        "W": torch.zeros(C, X.shape[1], dtype=X.dtype, requires_grad=True),
        "b": torch.zeros(C, dtype=X.dtype, requires_grad=True),
    }
    opt = torch.optim.LBFGS(
        list(w.values()),
        max_iter=1000,
        tolerance_grad=1e-13,
        tolerance_change=1e-15,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        loss = softmax_population_loss(w, X, targets)
        loss.backward()
        return loss

    opt.step(closure)
    return {k: v.detach() for k, v in w.items()}
