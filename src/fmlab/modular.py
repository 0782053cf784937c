"""The modular analysis of Chapter 1, end to end: pretrain, adapt, decompose.

Pretraining minimises the empirical masked-view loss of :class:`~fmlab.data.TwoViewLatentModel`
with a :class:`~fmlab.models.MaskedViewPredictor`, keeping checkpoints. Adaptation is a
linear probe on the representation (with a constant feature for the bias) under
:math:`\\|\\gamma\\|_2 \\le c_0`, or fine-tuning. Population quantities are computed on a large
fresh sample (``population_size`` draws), which plays the role of :math:`p_{\\text{task}}`:
the minimal adaptation loss is then solved exactly for that quadratic.

Used in Chapter 1 (``notebooks/01-pretraining-and-adaptation.ipynb``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ._validate import check_int, check_tensor
from .adapt import Moments, fine_tune, quadratic_loss, second_moments
from .data.latent import TwoViewConfig, TwoViewLatentModel
from .models.mlp import MaskedViewPredictor
from .repro import make_generator, seed_everything
from .theory.decomposition import Decomposition, decompose_adaptation_loss
from .train import cached, train

__all__ = [
    "PretrainConfig",
    "pretrain_masked_view",
    "load_checkpoint",
    "probe_features",
    "pretraining_loss",
    "task_moments",
    "TaskSample",
    "draw_task_sample",
    "decompose_at",
    "fine_tune_population_loss",
    "DecompositionGrid",
    "decomposition_grid",
    "interface_curve",
]


@dataclass(frozen=True)
class PretrainConfig:
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
        check_int("steps", self.steps, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        for c in self.checkpoints:
            check_int("checkpoints", c, minimum=0, maximum=self.steps)


def _build_model(cfg: PretrainConfig) -> MaskedViewPredictor:
    w = cfg.world
    return MaskedViewPredictor(
        w.dim_a, w.dim_b, width=cfg.width, rep_dim=cfg.rep_dim, depth=cfg.depth
    )


def pretrain_masked_view(cfg: PretrainConfig) -> dict:
    """Pretrain (or load from the cache) and return ``{"losses", "checkpoints"}``.

    ``checkpoints`` maps each step in ``cfg.checkpoints`` to a state dict; ``losses`` is
    the mini-batch training loss at every step. Each mini-batch is a fresh draw, so the
    empirical distribution :math:`\\hat p_{\\text{pre}}` has ``steps * batch_size`` examples.
    """
    if not isinstance(cfg, PretrainConfig):
        raise TypeError(f"cfg must be a PretrainConfig, got {type(cfg).__name__}")

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


def load_checkpoint(cfg: PretrainConfig, state: dict) -> MaskedViewPredictor:
    """A model of ``cfg``'s architecture holding the weights ``state``."""
    model = _build_model(cfg)
    model.load_state_dict(state)
    model.eval()
    return model


def probe_features(model: MaskedViewPredictor, xa: torch.Tensor) -> torch.Tensor:
    """The linear probe's inputs: the representation :math:`\\phi(x_A)` and a constant 1."""
    xa = check_tensor("xa", xa, ndim=2, floating=True)
    f = model.features(xa)
    return torch.cat([f, torch.ones(len(f), 1, dtype=f.dtype)], dim=1)


@torch.no_grad()
def pretraining_loss(
    model: MaskedViewPredictor, world: TwoViewLatentModel, n: int, seed: int
) -> float:
    """The pretraining loss on ``n`` fresh draws (the population loss :math:`L_{\\text{pre}}` for large n)."""
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
    """``n`` labelled examples of the task :math:`y = s_c` (the empirical :math:`\\hat p_{\\text{task}}`)."""
    c, xa, _ = world.sample(check_int("n", n, minimum=1), make_generator(seed))
    return TaskSample(xa=xa, y=signs[c].float(), seed=seed)


@torch.no_grad()
def decompose_at(
    model: MaskedViewPredictor, sample: TaskSample, population: Moments, c0: float
) -> Decomposition:
    """Eq. (6) for a linear probe with :math:`\\|\\gamma\\| \\le c_0` trained on ``sample``."""
    empirical = second_moments(probe_features(model, sample.xa), sample.y)
    return decompose_adaptation_loss(empirical, population, c0)


def fine_tune_population_loss(
    model: MaskedViewPredictor,
    sample: TaskSample,
    world: TwoViewLatentModel,
    signs: torch.Tensor,
    *,
    steps: int,
    lr: float,
    n_pop: int,
    seed: int,
) -> float:
    """Fine-tune encoder and a fresh head on ``sample``; return the population task loss."""
    tuned, head = fine_tune(
        model,
        probe_features,
        sample.xa,
        sample.y,
        steps=steps,
        lr=lr,
        generator=make_generator(seed),
    )
    with torch.no_grad():
        pop = task_moments(tuned, world, signs, n_pop, seed=10_000 + seed)
    return quadratic_loss(head.double(), pop)


@dataclass(frozen=True)
class DecompositionGrid:
    """Terms of eq. (6) on a grid: each tensor has shape ``(len(ns), len(c0s), len(task_seeds))``."""

    ns: tuple[int, ...]
    c0s: tuple[float, ...]
    adapted_loss: torch.Tensor
    minimal_loss: torch.Tensor
    generalization_error: torch.Tensor
    erm_slack: torch.Tensor


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
    curves over ``c0`` share their sample (as a practitioner's sweep would).
    """
    ns = tuple(check_int("ns", n, minimum=1) for n in ns)
    c0s = tuple(float(c) for c in c0s)
    if any(not c > 0 for c in c0s):
        raise ValueError(f"c0s must all be > 0, got {c0s}")
    task_seeds = tuple(check_int("task_seeds", s, minimum=0) for s in task_seeds)
    if not (ns and c0s and task_seeds):
        raise ValueError("ns, c0s and task_seeds must each hold at least one value")
    shape = (len(ns), len(c0s), len(task_seeds))
    out = {
        k: torch.empty(shape, dtype=torch.float64)
        for k in ("L", "Lstar", "ge", "slack")
    }
    for i, n in enumerate(ns):
        for k, seed in enumerate(task_seeds):
            sample = draw_task_sample(world, signs, n, seed)
            empirical = second_moments(probe_features(model, sample.xa), sample.y)
            for j, c0 in enumerate(c0s):
                d = decompose_adaptation_loss(empirical, population, c0)
                out["L"][i, j, k] = d.adapted_loss
                out["Lstar"][i, j, k] = d.minimal_loss
                out["ge"][i, j, k] = d.generalization_error
                out["slack"][i, j, k] = d.erm_slack
    return DecompositionGrid(ns, c0s, out["L"], out["Lstar"], out["ge"], out["slack"])


@torch.no_grad()
def interface_curve(
    cfg: PretrainConfig,
    world: TwoViewLatentModel,
    signs: torch.Tensor,
    c0: float,
    *,
    n_pop: int,
    seed: int,
) -> dict[str, torch.Tensor]:
    """Population pretraining loss and minimal adaptation loss at every checkpoint of ``cfg``.

    Returns tensors ``steps``, ``pretraining_loss`` and ``minimal_adaptation_loss``.
    """
    from .adapt import ball_constrained_least_squares

    ckpts = pretrain_masked_view(cfg)["checkpoints"]
    steps = sorted(ckpts)
    lpre, lstar = [], []
    for step in steps:
        model = load_checkpoint(cfg, ckpts[step])
        lpre.append(pretraining_loss(model, world, n_pop, seed))
        pop = task_moments(model, world, signs, n_pop, seed + 1)
        lstar.append(quadratic_loss(ball_constrained_least_squares(pop, c0), pop))
    return {
        "steps": torch.tensor(steps),
        "pretraining_loss": torch.tensor(lpre, dtype=torch.float64),
        "minimal_adaptation_loss": torch.tensor(lstar, dtype=torch.float64),
    }
