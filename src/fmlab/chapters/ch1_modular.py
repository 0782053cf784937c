r"""The modular analysis of Chapter 1, end to end: pretrain, adapt, decompose, bound.

Pretraining minimises the empirical masked-view loss of
:class:`~fmlab.data.TwoViewLatentModel` with a
:class:`~fmlab.models.MaskedViewPredictor`, keeping checkpoints. Adaptation is a linear
probe on the representation (with a constant feature for the bias) under
:math:`\|\gamma\|_2 \le c_0`, or fine-tuning. Population quantities are computed on a
large fresh sample, which plays the role of :math:`p_{\text{task}}`: the minimal
adaptation loss is then solved exactly for that quadratic. Where a quantity only needs
:math:`x_A`, the exact posterior :math:`p(c \mid x_A)` replaces the labels, so that no
label noise enters (:func:`representation_excess_losses`, :func:`interface_bounds`).

Used in Chapter 1 (``notebooks/01-pretraining-and-adaptation.ipynb``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

from .._validate import check_float, check_int, check_tensor
from ..adapt import fine_tune_linear_head_adam, linear_probe
from ..data.latent import TwoViewConfig, TwoViewLatentModel
from ..models.mlp import MaskedViewPredictor
from ..repro import make_generator, seed_everything
from ..theory.decomposition import (
    Decomposition,
    decompose_adaptation_loss,
    posterior_readout,
)
from ..theory.least_squares import (
    Moments,
    ball_constrained_least_squares,
    ball_constrained_path,
    quadratic_loss,
    second_moments,
)
from ..train import cached, train

__all__ = [
    "ViewPretrainConfig",
    "ViewFineTuneConfig",
    "pretrain_masked_view",
    "load_checkpoint",
    "probe_features",
    "masked_view_loss",
    "task_moments",
    "TaskSample",
    "draw_task_sample",
    "decompose_at",
    "fine_tune_population_loss",
    "DecompositionGrid",
    "decomposition_grid",
    "representation_excess_losses",
    "InterfaceBound",
    "interface_bounds",
    "interface_bound_at",
    "interface_curves",
    "Chapter1Config",
    "pretrain_configs",
    "pretrained_models",
    "Pretraining",
    "pretraining",
    "Representations",
    "representations",
    "DecompositionSweep",
    "decomposition",
    "FineTuning",
    "fine_tuning",
    "Interface",
    "interface",
]


@dataclass(frozen=True)
class ViewPretrainConfig:
    """Everything that determines a pretrained masked-view predictor."""

    world: TwoViewConfig = field(default_factory=TwoViewConfig)
    width: int = 64
    rep_dim: int = 16
    depth: int = 2
    steps: int = 1500
    batch_size: int = 256
    lr: float = 3e-3
    checkpoints: tuple[int, ...] = (0, 10, 25, 50, 100, 200, 400, 800, 1500)
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.world, TwoViewConfig):
            raise TypeError(
                f"world must be a TwoViewConfig, got {type(self.world).__name__}"
            )
        check_int("width", self.width, minimum=1)
        check_int("rep_dim", self.rep_dim, minimum=1)
        check_int("depth", self.depth, minimum=1)
        check_int("steps", self.steps, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        check_float("lr", self.lr, minimum=0.0, strict_min=True)
        for c in self.checkpoints:
            check_int("checkpoints", c, minimum=0, maximum=self.steps)
        check_int("seed", self.seed, minimum=0)


@dataclass(frozen=True)
class ViewFineTuneConfig:
    """Fine-tuning of Chapter 1: full-batch Adam on every weight and a fresh head."""

    steps: int = 100
    lr: float = 1e-3

    def __post_init__(self):
        check_int("steps", self.steps, minimum=1)
        check_float("lr", self.lr, minimum=0.0, strict_min=True)


def _build_model(cfg: ViewPretrainConfig) -> MaskedViewPredictor:
    w = cfg.world
    return MaskedViewPredictor(
        w.dim_a, w.dim_b, width=cfg.width, rep_dim=cfg.rep_dim, depth=cfg.depth
    )


def pretrain_masked_view(cfg: ViewPretrainConfig) -> dict:
    r"""Pretrain (or load from the cache) and return ``{"losses", "checkpoints"}``.

    ``checkpoints`` maps each step in ``cfg.checkpoints`` to a state dict; ``losses`` is
    the mini-batch training loss at every step. Each mini-batch is a fresh draw, so the
    empirical distribution :math:`\hat p_{\text{pre}}` has ``steps * batch_size``
    examples.
    """
    if not isinstance(cfg, ViewPretrainConfig):
        raise TypeError(f"cfg must be a ViewPretrainConfig, got {type(cfg).__name__}")

    def build():
        seed_everything(cfg.seed)
        world = TwoViewLatentModel(cfg.world)
        model = _build_model(cfg)
        g = make_generator(cfg.seed + 1)

        def batch(_step):
            _, xa, xb = world.sample(cfg.batch_size, g)
            return xa, xb

        def loss_fn(m, b):
            xa, xb = b
            return (m(xa) - xb).pow(2).mean()

        res = train(
            model,
            loss_fn,
            batch,
            steps=cfg.steps,
            lr=cfg.lr,
            checkpoints=cfg.checkpoints,
            desc=f"pretraining (seed {cfg.seed})",
        )
        return {
            "losses": res.losses,
            "checkpoints": {int(k): v for k, v in res.checkpoints.items()},
        }

    return cached(cfg, build, name="ch01_masked_view")


def load_checkpoint(cfg: ViewPretrainConfig, state: dict) -> MaskedViewPredictor:
    """A model of ``cfg``'s architecture holding the weights ``state``."""
    if not isinstance(cfg, ViewPretrainConfig):
        raise TypeError(f"cfg must be a ViewPretrainConfig, got {type(cfg).__name__}")
    model = _build_model(cfg)
    model.load_state_dict(state)
    model.eval()
    return model


def probe_features(model: MaskedViewPredictor, xa: torch.Tensor) -> torch.Tensor:
    r"""The linear probe's inputs: the representation :math:`\phi(x_A)` and a 1."""
    xa = check_tensor("xa", xa, ndim=2, floating=True)
    f = model.features(xa)
    return torch.cat([f, torch.ones(len(f), 1, dtype=f.dtype)], dim=1)


@torch.no_grad()
def masked_view_loss(
    model: MaskedViewPredictor, world: TwoViewLatentModel, n: int, seed: int
) -> float:
    r"""The pretraining loss on ``n`` fresh draws (:math:`L_{\text{pre}}`, large n)."""
    n = check_int("n", n, minimum=1)
    _, xa, xb = world.sample(n, make_generator(seed))
    return float((model(xa) - xb).pow(2).mean())


@torch.no_grad()
def task_moments(
    model: MaskedViewPredictor,
    world: TwoViewLatentModel,
    signs: torch.Tensor,
    n: int,
    seed: int,
) -> Moments:
    """Second moments of (features, label) over ``n`` fresh task draws."""
    c, xa, _ = world.sample(check_int("n", n, minimum=1), make_generator(seed))
    return second_moments(probe_features(model, xa), signs[c].float())


@dataclass(frozen=True)
class TaskSample:
    """A downstream training set: inputs, labels, and the seed that drew them."""

    xa: torch.Tensor
    y: torch.Tensor
    seed: int


def draw_task_sample(
    world: TwoViewLatentModel, signs: torch.Tensor, n: int, seed: int
) -> TaskSample:
    r"""``n`` labelled examples of the task :math:`y = s_c` (the empirical
    :math:`\hat p_{\text{task}}`)."""
    c, xa, _ = world.sample(check_int("n", n, minimum=1), make_generator(seed))
    return TaskSample(xa=xa, y=signs[c].float(), seed=seed)


@torch.no_grad()
def decompose_at(
    model: MaskedViewPredictor, sample: TaskSample, population: Moments, c0: float
) -> Decomposition:
    r"""Eq. (6) for a probe with :math:`\|\gamma\| \le c_0` trained on ``sample``."""
    empirical = second_moments(probe_features(model, sample.xa), sample.y)
    return decompose_adaptation_loss(empirical, population, c0)


def fine_tune_population_loss(
    model: MaskedViewPredictor,
    sample: TaskSample,
    world: TwoViewLatentModel,
    signs: torch.Tensor,
    cfg: ViewFineTuneConfig,
    *,
    n_pop: int,
    seed: int,
) -> float:
    """Fine-tune encoder and a fresh head on ``sample``; return the population loss.

    The head starts at small random values drawn with ``seed``; the population loss is
    the exact quadratic of ``n_pop`` fresh draws (another stream of the same seed).
    """
    if not isinstance(cfg, ViewFineTuneConfig):
        raise TypeError(f"cfg must be a ViewFineTuneConfig, got {type(cfg).__name__}")
    tuned, head = fine_tune_linear_head_adam(
        model,
        probe_features,
        sample.xa,
        sample.y,
        steps=cfg.steps,
        lr=cfg.lr,
        generator=make_generator(seed),
    )
    with torch.no_grad():
        pop = task_moments(tuned, world, signs, n_pop, seed=10_000 + seed)
    return quadratic_loss(head, pop)


@dataclass(frozen=True)
class DecompositionGrid:
    """Terms of eq. (6) on a grid.

    Each tensor has shape ``(len(ns), len(c0s), len(task_seeds))``.
    """

    ns: tuple[int, ...]
    c0s: tuple[float, ...]
    adapted_loss: torch.Tensor
    minimal_loss: torch.Tensor
    generalization_error: torch.Tensor
    erm_slack: torch.Tensor


def _quadratic_losses(heads: torch.Tensor, m: Moments) -> torch.Tensor:
    """:func:`~fmlab.adapt.quadratic_loss` of every row of ``heads``."""
    return ((heads @ m.sigma) * heads).sum(1) - 2 * heads @ m.b + m.c


@torch.no_grad()
def decomposition_grid(
    model: MaskedViewPredictor,
    world: TwoViewLatentModel,
    signs: torch.Tensor,
    population: Moments,
    ns,
    c0s,
    task_seeds,
) -> DecompositionGrid:
    """Eq. (6) for every task size ``n``, constraint ``c0`` and task-sample seed.

    For each ``(n, seed)`` one task sample is drawn and probed at every ``c0``, so the
    curves over ``c0`` share their sample (as a practitioner's sweep would). The
    population minimisers are solved once per radius, the empirical ones once per sample
    (one eigendecomposition for all radii).
    """
    ns = tuple(check_int("ns", n, minimum=1) for n in ns)
    c0s = tuple(float(c) for c in c0s)
    if any(not c > 0 for c in c0s):
        raise ValueError(f"c0s must all be > 0, got {c0s}")
    task_seeds = tuple(check_int("task_seeds", s, minimum=0) for s in task_seeds)
    if not (ns and c0s and task_seeds):
        raise ValueError("ns, c0s and task_seeds must each hold at least one value")
    if not isinstance(population, Moments):
        raise TypeError(
            f"population must be a Moments, got {type(population).__name__}"
        )
    shape = (len(ns), len(c0s), len(task_seeds))
    out = {
        k: torch.empty(shape, dtype=torch.float64)
        for k in ("L", "Lstar", "ge", "slack")
    }
    g_star = ball_constrained_path(population, c0s)
    L_star = _quadratic_losses(g_star, population)
    for i, n in enumerate(ns):
        for k, seed in enumerate(task_seeds):
            sample = draw_task_sample(world, signs, n, seed)
            empirical = second_moments(probe_features(model, sample.xa), sample.y)
            g_task = ball_constrained_path(empirical, c0s)
            L_task = _quadratic_losses(g_task, population)
            Lhat_task = _quadratic_losses(g_task, empirical)
            Lhat_star = _quadratic_losses(g_star, empirical)
            out["L"][i, :, k] = L_task
            out["Lstar"][i, :, k] = L_star
            out["ge"][i, :, k] = (L_task - Lhat_task) + (Lhat_star - L_star)
            out["slack"][i, :, k] = Lhat_star - Lhat_task
    return DecompositionGrid(ns, c0s, out["L"], out["Lstar"], out["ge"], out["slack"])


def _excess_losses(psi: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    r"""The best probe's loss :math:`\hat{\mathbb{E}}(m_t - \gamma^\top\psi)^2`.

    One value for each column :math:`m_t` of ``targets``.
    """
    out = torch.empty(targets.shape[1], dtype=torch.float64)
    for t in range(targets.shape[1]):
        mom = second_moments(psi, targets[:, t])
        out[t] = quadratic_loss(ball_constrained_least_squares(mom, float("inf")), mom)
    return out


def _task_signs(world: TwoViewLatentModel, task_seeds) -> torch.Tensor:
    seeds = tuple(check_int("task_seeds", s, minimum=0) for s in task_seeds)
    if not seeds:
        raise ValueError("task_seeds must hold at least one seed")
    return torch.stack([world.task_signs(s) for s in seeds])


@torch.no_grad()
def representation_excess_losses(
    world: TwoViewLatentModel,
    encoders: Mapping[str, Callable[[torch.Tensor], torch.Tensor]],
    task_seeds,
    *,
    n: int,
    seed: int,
) -> dict[str, torch.Tensor]:
    r"""Excess minimal adaptation loss (:math:`c_0 = \infty`) of representations.

    For each representation ``encoders[name](x_A)`` (shape ``(n, k)``) and each task
    ``world.task_signs(t)``, the best linear probe with a bias, fitted to :math:`m(x_A)
    = \mathbb{E}[y \mid x_A]` on ``n`` fresh draws: since the label noise :math:`y - m`
    is uncorrelated with every function of :math:`x_A`, this is
    :math:`L^\star_{\text{adapt}}(c_0=\infty) - L^{\text{Bayes}}_{\text{task}}`,
    estimated without label noise. Returns ``{name: tensor of shape
    (len(task_seeds),)}``.
    """
    if not isinstance(world, TwoViewLatentModel):
        raise TypeError(
            f"world must be a TwoViewLatentModel, got {type(world).__name__}"
        )
    if not isinstance(encoders, Mapping) or not encoders:
        raise TypeError("encoders must be a non-empty mapping of name -> callable")
    S = _task_signs(world, task_seeds)
    n = check_int("n", n, minimum=2)
    _, xa, _ = world.sample(n, make_generator(seed))
    targets = world.posterior(xa) @ S.T
    out = {}
    for name, enc in encoders.items():
        if not callable(enc):
            raise TypeError(f"encoders[{name!r}] must be callable")
        f = check_tensor(f"encoders[{name!r}](xa)", enc(xa), ndim=2, floating=True)
        psi = torch.cat([f.double(), torch.ones(n, 1, dtype=torch.float64)], dim=1)
        out[name] = _excess_losses(psi, targets)
    return out


@dataclass(frozen=True)
class InterfaceBound:
    """Both sides of Chapter 1's interface bound for one model and one task.

    All numbers are averages over the same draws of :math:`x_A`, so the chain
    ``excess_minimal_loss <= readout_loss <= bound`` holds exactly for them (the theorem
    holds for every distribution of :math:`x_A`, the empirical one included).
    """

    excess_minimal_loss: float  # min_gamma E(m - gamma^T psi)^2 = L*(inf) - Bayes
    readout_loss: float  # E(m - w^T f_theta)^2: the head used in the proof
    excess_pretraining_loss: float  # E||f_theta - f*||^2 / d_B = L_pre - Bayes
    constant: float  # kappa = d_B ||N^+ s||^2

    @property
    def bound(self) -> float:
        r"""The right-hand side :math:`\kappa\,(L_{pre} - L_{pre}^{Bayes})`."""
        return self.constant * self.excess_pretraining_loss


@torch.no_grad()
def interface_bounds(
    model: MaskedViewPredictor,
    world: TwoViewLatentModel,
    task_seeds,
    *,
    n: int,
    seed: int,
) -> list[InterfaceBound]:
    r"""Evaluate Chapter 1's interface bound on ``n`` fresh draws of :math:`x_A`.

    For each task :math:`s` = ``world.task_signs(t)``, with
    :math:`m(x_A) = \mathbb{E}[y \mid x_A] = s^\top p(x_A)`, :math:`f^\star = N^\top p`
    the Bayes prediction of :math:`x_B`, :math:`f_\theta = D\phi_\theta + d` the model's
    prediction, :math:`\psi = [\phi_\theta; 1]` the probe's features and
    :math:`w = N^+ s`, it returns
    :math:`\min_\gamma \hat{\mathbb{E}}(m - \gamma^\top\psi)^2` (the excess of the
    minimal adaptation loss at :math:`c_0 = \infty` over the Bayes task loss),
    :math:`\hat{\mathbb{E}}(m - w^\top f_\theta)^2`,
    :math:`\hat{\mathbb{E}}\lVert f_\theta - f^\star\rVert^2 / d_B` (the excess
    pretraining loss) and :math:`\kappa = d_B\lVert N^+ s\rVert^2`. The posterior is
    exact, so the only randomness is the draw of :math:`x_A`. Everything is float64; the
    model's prediction is recomputed in float64 from its features, so that
    :math:`w^\top f_\theta` lies exactly in the span of the probe's features.
    """
    if not isinstance(model, MaskedViewPredictor):
        raise TypeError(
            f"model must be a MaskedViewPredictor, got {type(model).__name__}"
        )
    if not isinstance(world, TwoViewLatentModel):
        raise TypeError(
            f"world must be a TwoViewLatentModel, got {type(world).__name__}"
        )
    S = _task_signs(world, task_seeds)
    n = check_int("n", n, minimum=2)
    N = world.means_b
    W = torch.stack([posterior_readout(N, s) for s in S])  # (T, d_B)
    _, xa, _ = world.sample(n, make_generator(seed))
    post = world.posterior(xa)
    m = post @ S.T  # (n, T)
    f_star = post @ N
    phi = model.features(xa).double()
    dec = model.decoder
    f_theta = phi @ dec.weight.double().T + dec.bias.double()
    psi = torch.cat([phi, torch.ones(n, 1, dtype=torch.float64)], dim=1)
    best = _excess_losses(psi, m)
    readout = (m - f_theta @ W.T).pow(2).mean(0)
    excess_pre = float((f_theta - f_star).pow(2).sum(1).mean()) / N.shape[1]
    kappa = N.shape[1] * W.pow(2).sum(1)
    return [
        InterfaceBound(
            excess_minimal_loss=float(best[t]),
            readout_loss=float(readout[t]),
            excess_pretraining_loss=excess_pre,
            constant=float(kappa[t]),
        )
        for t in range(len(S))
    ]


def interface_bound_at(
    model: MaskedViewPredictor,
    world: TwoViewLatentModel,
    task_seed: int,
    *,
    n: int,
    seed: int,
) -> InterfaceBound:
    """:func:`interface_bounds` for the single task ``world.task_signs(task_seed)``."""
    return interface_bounds(model, world, (task_seed,), n=n, seed=seed)[0]


@torch.no_grad()
def interface_curves(
    cfg: ViewPretrainConfig,
    world: TwoViewLatentModel,
    task_seeds,
    *,
    n: int,
    seed: int,
) -> dict[str, torch.Tensor]:
    """Both sides of the interface bound at every checkpoint of ``cfg``'s run.

    Returns float64 tensors ``steps`` ``(C,)``, ``excess_pretraining_loss`` ``(C,)``,
    ``excess_minimal_loss`` and ``readout_loss`` ``(C, T)``, ``constant`` ``(T,)`` and
    ``bound`` ``(C, T)``, for the ``C`` checkpoints and ``T`` tasks.
    """
    ckpts = pretrain_masked_view(cfg)["checkpoints"]
    steps = sorted(ckpts)
    rows = [
        interface_bounds(
            load_checkpoint(cfg, ckpts[s]), world, task_seeds, n=n, seed=seed
        )
        for s in steps
    ]

    def grab(attr):
        return torch.tensor(
            [[getattr(b, attr) for b in row] for row in rows], dtype=torch.float64
        )

    excess_pre = grab("excess_pretraining_loss")[:, 0]
    constant = grab("constant")[0]
    return {
        "steps": torch.tensor(steps, dtype=torch.float64),
        "excess_pretraining_loss": excess_pre,
        "excess_minimal_loss": grab("excess_minimal_loss"),
        "readout_loss": grab("readout_loss"),
        "constant": constant,
        "bound": excess_pre[:, None] * constant[None, :],
    }


# --------------------------------------------------------------------------------------
# The chapter's experiment: one config, one runner per section, each returning a result
# dataclass (cached on disk by config, seed offset and code).
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chapter1Config:
    """Everything Chapter 1's experiment depends on (the defaults are the chapter's)."""

    world: TwoViewConfig = field(
        default_factory=lambda: TwoViewConfig(
            n_classes=16, dim_a=4, dim_b=24, noise_a=0.35, noise_b=0.5
        )
    )
    pretrain_seeds: tuple[int, ...] = (0, 1, 2)  # one pretrained model each
    steps: int = 1500  # Adam steps of pretraining, 256 fresh examples each
    checkpoints: tuple[int, ...] = (0, 10, 25, 50, 100, 200, 400, 800, 1500)
    ns: tuple[int, ...] = (8, 16, 32, 64, 128, 256)  # task sample sizes n
    c0s: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0)  # constraint radii
    task_seeds: tuple[int, ...] = tuple(range(100, 120))  # task samples per (model, n)
    eval_tasks: tuple[int, ...] = tuple(range(10))  # labellings s for population checks
    n_population: int = 100_000  # fresh draws standing in for the population
    n_eval: int = 20_000  # fresh draws of x_A where the exact posterior is used
    fine_tune: ViewFineTuneConfig = field(
        default_factory=lambda: ViewFineTuneConfig(steps=100, lr=1e-3)
    )
    ft_ns: tuple[int, ...] = (16, 64, 256)  # task sizes at which fine-tuning runs
    ft_samples: int = 3  # task samples (the first task_seeds) fine-tuned per (model, n)

    def __post_init__(self):
        if not isinstance(self.world, TwoViewConfig):
            raise TypeError(
                f"world must be a TwoViewConfig, got {type(self.world).__name__}"
            )
        if not isinstance(self.fine_tune, ViewFineTuneConfig):
            raise TypeError(
                "fine_tune must be a ViewFineTuneConfig, got "
                f"{type(self.fine_tune).__name__}"
            )
        for name in ("pretrain_seeds", "ns", "c0s", "task_seeds", "eval_tasks"):
            if not isinstance(getattr(self, name), tuple) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty tuple")
        if not set(self.pretrain_seeds) <= set(self.eval_tasks):
            raise ValueError("each pretrain seed must also be an eval task (own task)")
        if not set(self.ft_ns) <= set(self.ns):
            raise ValueError(f"ft_ns {self.ft_ns} must be among ns {self.ns}")
        check_int(
            "ft_samples", self.ft_samples, minimum=1, maximum=len(self.task_seeds)
        )
        check_int("n_population", self.n_population, minimum=2)
        check_int("n_eval", self.n_eval, minimum=4)


def pretrain_configs(cfg: Chapter1Config) -> list[ViewPretrainConfig]:
    """One :class:`ViewPretrainConfig` per pretrained model of the chapter."""
    return [
        ViewPretrainConfig(
            world=cfg.world, steps=cfg.steps, checkpoints=cfg.checkpoints, seed=s
        )
        for s in cfg.pretrain_seeds
    ]


def pretrained_models(
    cfg: Chapter1Config, step: int | None = None
) -> list[MaskedViewPredictor]:
    """The chapter's models at checkpoint ``step`` (default: the end of pretraining)."""
    return [
        load_checkpoint(
            pc,
            pretrain_masked_view(pc)["checkpoints"][pc.steps if step is None else step],
        )
        for pc in pretrain_configs(cfg)
    ]


@dataclass(frozen=True)
class Pretraining:
    """Pretraining by masked-view prediction, one row per model."""

    losses: torch.Tensor  # (model, step): mini-batch training loss
    population_loss: tuple[
        float, ...
    ]  # L_pre of the final model, on n_population draws
    bayes_loss: float  # the Bayes pretraining loss L_pre^Bayes


def pretraining(cfg: Chapter1Config) -> Pretraining:
    """Pretrain the chapter's models (cached) and measure their population loss."""

    def build():
        world = TwoViewLatentModel(cfg.world)
        runs = [pretrain_masked_view(pc) for pc in pretrain_configs(cfg)]
        return Pretraining(
            losses=torch.stack([run["losses"] for run in runs]),
            population_loss=tuple(
                masked_view_loss(m, world, cfg.n_population, seed=7)
                for m in pretrained_models(cfg)
            ),
            bayes_loss=world.optimal_pretraining_loss(),
        )

    return cached(cfg, build, name="ch01_pretraining")


@dataclass(frozen=True)
class Representations:
    r"""Excess minimal adaptation loss :math:`L^\star_{adapt}(c_0=\infty) - L^{Bayes}`
    of three representations, per model and task (see
    :func:`representation_excess_losses`)."""

    names: tuple[str, ...]  # raw input, network at initialization, pretrained network
    excess: torch.Tensor  # (model, representation, task)
    bayes_task_loss: torch.Tensor  # (task,): L_task^Bayes of each labelling


def representations(cfg: Chapter1Config) -> Representations:
    """Compare the raw input, the untrained and the pretrained network as features."""

    def build():
        world = TwoViewLatentModel(cfg.world)
        names = ("raw input x_A", "network at initialization", "pretrained network")
        inits, models = pretrained_models(cfg, step=0), pretrained_models(cfg)
        excess = [
            representation_excess_losses(
                world,
                dict(zip(names, (lambda xa: xa, init.features, model.features))),
                cfg.eval_tasks,
                n=cfg.n_eval,
                seed=8,
            )
            for init, model in zip(inits, models)
        ]
        bayes_task = torch.tensor(
            [
                world.bayes_task_loss(world.task_signs(t), n=cfg.n_eval, seed=8)
                for t in cfg.eval_tasks
            ]
        )
        table = torch.stack([torch.stack([e[k] for k in names]) for e in excess])
        return Representations(names, table, bayes_task)

    return cached(cfg, build, name="ch01_representations")


def _populations(cfg: Chapter1Config, world, models) -> list[Moments]:
    """Each model's population moments on its own task (labelling seed = model seed)."""
    return [
        task_moments(m, world, world.task_signs(s), cfg.n_population, seed=8)
        for s, m in zip(cfg.pretrain_seeds, models)
    ]


@dataclass(frozen=True)
class DecompositionSweep:
    """The terms of eq. (6) for every model (on its own task), n, c0 and task sample.

    Each tensor has shape ``(model, len(ns), len(c0s), len(task_seeds))``.
    """

    ns: tuple[int, ...]
    c0s: tuple[float, ...]
    adapted_loss: torch.Tensor  # L(gamma_task)
    minimal_loss: torch.Tensor  # L*_adapt = L(gamma*_task)
    generalization_error: torch.Tensor  # both brackets of eq. (6)
    erm_slack: torch.Tensor  # Lhat(gamma*) - Lhat(gamma_task) >= 0


def decomposition(cfg: Chapter1Config) -> DecompositionSweep:
    """:func:`decomposition_grid` for each pretrained model, stacked."""

    def build():
        world = TwoViewLatentModel(cfg.world)
        models = pretrained_models(cfg)
        grids = [
            decomposition_grid(
                m, world, world.task_signs(s), pop, cfg.ns, cfg.c0s, cfg.task_seeds
            )
            for s, m, pop in zip(
                cfg.pretrain_seeds, models, _populations(cfg, world, models)
            )
        ]
        return DecompositionSweep(
            ns=cfg.ns,
            c0s=cfg.c0s,
            adapted_loss=torch.stack([g.adapted_loss for g in grids]),
            minimal_loss=torch.stack([g.minimal_loss for g in grids]),
            generalization_error=torch.stack([g.generalization_error for g in grids]),
            erm_slack=torch.stack([g.erm_slack for g in grids]),
        )

    return cached(cfg, build, name="ch01_decomposition")


@dataclass(frozen=True)
class FineTuning:
    """Population losses of fine-tuning and of two probes on the same task samples.

    Each tensor has shape ``(model, len(ns), samples)``.
    """

    ns: tuple[int, ...]
    fine_tuned: torch.Tensor  # fine-tuning every weight and a fresh head
    free_probe: torch.Tensor  # the unconstrained probe, c0 = inf
    best_probe: torch.Tensor  # the probe at the grid's best radius for this n
    best_c0: tuple[float, ...]  # that radius, chosen on the mean over models (oracle)


def fine_tuning(cfg: Chapter1Config) -> FineTuning:
    """Fine-tune each model on the first ``ft_samples`` task samples at each ``ft_ns``.

    The best-radius probe is an oracle choice that flatters the probe: the radius with
    the smallest mean population loss over models and samples in :func:`decomposition`.
    """

    def build():
        world = TwoViewLatentModel(cfg.world)
        models = pretrained_models(cfg)
        populations = _populations(cfg, world, models)
        seeds = cfg.task_seeds[: cfg.ft_samples]
        ft = torch.zeros(len(models), len(cfg.ft_ns), len(seeds))
        free = torch.zeros(len(models), len(cfg.ft_ns), len(seeds))
        for a, (s, model, pop) in enumerate(
            zip(cfg.pretrain_seeds, models, populations)
        ):
            signs = world.task_signs(s)
            for b, n in enumerate(cfg.ft_ns):
                for k, seed in enumerate(seeds):
                    sample = draw_task_sample(world, signs, n, seed)
                    ft[a, b, k] = fine_tune_population_loss(
                        model,
                        sample,
                        world,
                        signs,
                        cfg.fine_tune,
                        n_pop=cfg.n_eval,
                        seed=seed,
                    )
                    with torch.no_grad():
                        head = linear_probe(probe_features(model, sample.xa), sample.y)
                    free[a, b, k] = quadratic_loss(head, pop)
        L = decomposition(cfg).adapted_loss
        best = L.mean(-1).mean(0).argmin(-1)  # (n,): best radius, pooled over models
        idx = [cfg.ns.index(n) for n in cfg.ft_ns]
        oracle = torch.stack([L[:, i, int(best[i]), : len(seeds)] for i in idx], 1)
        best_c0 = tuple(cfg.c0s[int(best[i])] for i in idx)
        return FineTuning(cfg.ft_ns, ft, free, oracle, best_c0)

    return cached(cfg, build, name="ch01_fine_tuning")


@dataclass(frozen=True)
class Interface:
    """Both sides of the interface bound at every checkpoint (:func:`interface_curves`),
    stacked over models: shapes ``(model, checkpoint)`` or ``(model, checkpoint,
    task)``."""

    steps: torch.Tensor  # (checkpoint,)
    excess_pretraining_loss: torch.Tensor  # (model, checkpoint): L_pre - L_pre^Bayes
    excess_minimal_loss: torch.Tensor  # (model, checkpoint, task): left side
    readout_loss: torch.Tensor  # (model, checkpoint, task): the proof's head
    bound: torch.Tensor  # (model, checkpoint, task): right side
    constant: torch.Tensor  # (task,): kappa_s = d_B ||N^+ s||^2
    class_means: torch.Tensor  # N, (K, d_B): the class means nu_c of x_B


def interface(cfg: Chapter1Config) -> Interface:
    """Evaluate the interface bound along pretraining, on ``n_eval // 2`` draws."""

    def build():
        world = TwoViewLatentModel(cfg.world)
        curves = [
            interface_curves(pc, world, cfg.eval_tasks, n=cfg.n_eval // 2, seed=7)
            for pc in pretrain_configs(cfg)
        ]

        def stack(key):
            return torch.stack([c[key] for c in curves])

        return Interface(
            steps=curves[0]["steps"],
            excess_pretraining_loss=stack("excess_pretraining_loss"),
            excess_minimal_loss=stack("excess_minimal_loss"),
            readout_loss=stack("readout_loss"),
            bound=stack("bound"),
            constant=curves[0]["constant"],
            class_means=world.means_b,
        )

    return cached(cfg, build, name="ch01_interface")
