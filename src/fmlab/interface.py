"""The pretraining-adaptation interface of contrastive learning, end to end (Chapter 2).

Used in ``notebooks/02-interface.ipynb``. Three experiments:

* :func:`pretrain_curl` trains an encoder on sampled triples :math:`(x, x^+, x^-)` of a
  :class:`~fmlab.data.contrastive.LatentClassModel` and keeps checkpoints;
  :func:`curl_along_training` evaluates both sides of Arora et al.'s bound exactly at each.
* :func:`connectivity_sweep` builds augmentation graphs of a
  :class:`~fmlab.data.contrastive.MixtureOfManifolds` over a grid of augmentation strengths and
  class separations, and computes, for the minimiser of the spectral contrastive loss, the
  minimal adaptation loss of a linear probe beside HaoChen et al.'s guarantee.
* :func:`pretrain_spectral` minimises the population spectral contrastive loss over an MLP
  encoder or a free lookup table (no inductive bias), for the counterexample section.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from ._validate import check_choice, check_float, check_int
from .data.contrastive import (
    LatentClassConfig,
    LatentClassModel,
    ManifoldConfig,
    MixtureOfManifolds,
)
from .models.mlp import MLP
from .repro import make_generator, seed_everything
from .theory.contrastive import (
    contrastive_loss_on_triples,
    curl_terms,
    label_leakage,
    laplacian_eigenvalues,
    linear_probe_loss,
    spectral_contrastive_loss,
    spectral_minimizer,
    within_class_spread,
)
from .train import cached, progress, train

__all__ = [
    "SphereEncoder",
    "CurlConfig",
    "pretrain_curl",
    "load_curl_encoder",
    "curl_along_training",
    "SweepResult",
    "connectivity_sweep",
    "SpectralConfig",
    "pretrain_spectral",
]


class SphereEncoder(nn.Module):
    """An MLP whose output is rescaled to the sphere of radius ``radius``: :math:`\\lVert f(x)\\rVert = R`.

    Bounded representations keep the contrastive loss from being driven to zero by scale
    alone (Arora et al. assume :math:`\\lVert f(x)\\rVert \\le R`).
    """

    def __init__(
        self,
        dim_in: int,
        *,
        width: int = 64,
        depth: int = 2,
        rep_dim: int = 8,
        radius: float = 2.0,
    ):
        super().__init__()
        depth = check_int("depth", depth, minimum=1)
        self.radius = check_float("radius", radius, minimum=0.0, strict_min=True)
        self.net = MLP(
            [check_int("dim_in", dim_in, minimum=1)]
            + [check_int("width", width, minimum=1)] * depth
            + [check_int("rep_dim", rep_dim, minimum=1)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.net(x)
        return self.radius * g / g.norm(dim=1, keepdim=True).clamp_min(1e-12)


@dataclass(frozen=True)
class CurlConfig:
    """Everything that determines a contrastively pretrained encoder on latent classes."""

    world: LatentClassConfig = field(default_factory=LatentClassConfig)
    width: int = 64
    depth: int = 2
    rep_dim: int = 8
    radius: float = 2.0
    steps: int = 600
    batch_size: int = 256
    lr: float = 3e-3
    loss: str = "logistic"
    checkpoints: tuple[int, ...] = (0, 5, 10, 20, 40, 80, 150, 300, 600)
    seed: int = 0

    def __post_init__(self):
        check_int("steps", self.steps, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        check_choice("loss", self.loss, ("logistic", "hinge"))
        for c in self.checkpoints:
            check_int("checkpoints", c, minimum=0, maximum=self.steps)


def _curl_encoder(cfg: CurlConfig) -> SphereEncoder:
    return SphereEncoder(
        2, width=cfg.width, depth=cfg.depth, rep_dim=cfg.rep_dim, radius=cfg.radius
    )


def pretrain_curl(cfg: CurlConfig) -> dict:
    """Train (or load from the cache) and return ``{"losses", "checkpoints"}``.

    Each step draws a fresh batch of triples, so the training loss is an unbiased estimate
    of the population loss :math:`L_{\\text{un}}` at the current parameters.
    """
    if not isinstance(cfg, CurlConfig):
        raise TypeError(f"cfg must be a CurlConfig, got {type(cfg).__name__}")

    def build():
        seed_everything(cfg.seed)
        world = LatentClassModel(cfg.world)
        model = _curl_encoder(cfg)
        g = make_generator(cfg.seed + 1)

        def loss_fn(m, batch):  # one forward pass for the three views
            f, f_pos, f_neg = m(
                torch.cat([batch["x"], batch["x_pos"], batch["x_neg"]])
            ).chunk(3)
            return contrastive_loss_on_triples(f, f_pos, f_neg, loss=cfg.loss)

        res = train(
            model,
            loss_fn,
            lambda step: world.sample_triples(cfg.batch_size, g),
            steps=cfg.steps,
            lr=cfg.lr,
            checkpoints=cfg.checkpoints,
            desc=f"contrastive pretraining (seed {cfg.seed})",
        )
        return {"losses": res.losses, "checkpoints": res.checkpoints}

    return cached(cfg, build, name="ch2_curl")


def load_curl_encoder(cfg: CurlConfig, state: dict) -> SphereEncoder:
    """An encoder of ``cfg``'s shape with the weights ``state`` (a checkpoint), in eval mode."""
    if not isinstance(cfg, CurlConfig):
        raise TypeError(f"cfg must be a CurlConfig, got {type(cfg).__name__}")
    if not isinstance(state, dict):
        raise TypeError(f"state must be a state dict, got {type(state).__name__}")
    model = _curl_encoder(cfg)
    model.load_state_dict(state)
    return model.eval()


def curl_along_training(cfg: CurlConfig) -> dict[str, torch.Tensor]:
    """Exact :math:`L_{\\text{un}}`, :math:`L^{\\mu}_{\\text{sup}}` and the bound at every checkpoint.

    Returns float64 tensors ``steps``, ``unsupervised``, ``mean_classifier``, ``bound``, ``spread``
    (the within-class spread :math:`\\mathbb E\\lVert f(x)-\\mu_c\\rVert^2`), ``probe_error`` (error rate of the
    least-squares :math:`K`-way linear probe with bias, on the population) and the scalar ``tau``.
    """
    run = pretrain_curl(cfg)
    world = LatentClassModel(cfg.world)
    x = world.points.float()
    steps = sorted(run["checkpoints"])
    rows = []
    for s in steps:
        with torch.no_grad():
            f = load_curl_encoder(cfg, run["checkpoints"][s])(x).double()
        t = curl_terms(f, world.labels, world.class_probs, loss=cfg.loss)
        probe = linear_probe_loss(
            f, world.labels, world.class_probs[world.labels] / world.members.shape[1]
        )
        rows.append(
            (
                t.unsupervised,
                t.mean_classifier,
                t.bound,
                within_class_spread(f, world.labels, world.class_probs),
                probe.error,
            )
        )
    rows = torch.tensor(rows, dtype=torch.float64)
    return {
        "steps": torch.tensor(steps),
        "unsupervised": rows[:, 0],
        "mean_classifier": rows[:, 1],
        "bound": rows[:, 2],
        "spread": rows[:, 3],
        "probe_error": rows[:, 4],
        "tau": torch.tensor(world.collision_probability(), dtype=torch.float64),
    }


@dataclass(frozen=True)
class SweepResult:
    """Grids over (along_std, separation) for the spectral minimiser with ``k`` outputs.

    Every tensor has shape ``(len(along_stds), len(separations))``.
    """

    along_stds: tuple[float, ...]
    separations: tuple[float, ...]
    k: int
    minimal_adaptation_loss: (
        torch.Tensor
    )  # best linear probe's squared loss on one-hot labels
    probe_error: torch.Tensor  # its misclassification rate
    leakage: torch.Tensor  # phi
    lambda_next: torch.Tensor  # lambda_{k+1}
    bound: torch.Tensor  # phi / lambda_{k+1}
    pretraining_loss: torch.Tensor  # minimal spectral contrastive loss


def connectivity_sweep(
    base: ManifoldConfig, along_stds, separations, k: int
) -> SweepResult:
    """For every (along_std, separation): graph, spectral minimiser, probe and guarantee."""
    if not isinstance(base, ManifoldConfig):
        raise TypeError(f"base must be a ManifoldConfig, got {type(base).__name__}")
    along_stds = tuple(check_float("along_stds", s, minimum=0.0) for s in along_stds)
    separations = tuple(
        check_float("separations", s, minimum=0.0, strict_min=True) for s in separations
    )
    if not along_stds or not separations:
        raise ValueError("along_stds and separations must be non-empty")
    k = check_int("k", k, minimum=1)
    shape = (len(along_stds), len(separations))
    out = {
        name: torch.zeros(shape, dtype=torch.float64)
        for name in ("L", "err", "phi", "lam", "bound", "pre")
    }
    cells = [(i, j) for i in range(shape[0]) for j in range(shape[1])]
    for i, j in progress(cells, total=len(cells), desc="connectivity sweep"):
        cfg = replace(base, along_std=along_stds[i], separation=separations[j])
        graph = MixtureOfManifolds(cfg).augmentation_graph()
        sol = spectral_minimizer(graph.weights, k)
        probe = linear_probe_loss(sol.features, graph.labels, graph.marginal)
        lam = float(laplacian_eigenvalues(graph.weights)[k])
        phi = label_leakage(graph.weights, graph.labels)
        out["L"][i, j], out["err"][i, j] = probe.mse, probe.error
        out["phi"][i, j], out["lam"][i, j] = phi, lam
        out["bound"][i, j] = phi / lam if lam > 1e-12 else float("inf")
        out["pre"][i, j] = sol.loss
    return SweepResult(
        along_stds,
        separations,
        k,
        out["L"],
        out["err"],
        out["phi"],
        out["lam"],
        out["bound"],
        out["pre"],
    )


@dataclass(frozen=True)
class SpectralConfig:
    """An encoder trained on the exact population spectral contrastive loss of a manifold graph.

    ``encoder = "mlp"`` is an MLP on the input coordinates; ``"table"`` is a free vector per
    point (a lookup table: any function of the input, no inductive bias).
    """

    world: ManifoldConfig = field(default_factory=ManifoldConfig)
    encoder: str = "mlp"
    rep_dim: int = 3
    width: int = 64
    depth: int = 2
    steps: int = 1500
    lr: float = 3e-3
    init_scale: float = 0.5
    seed: int = 0

    def __post_init__(self):
        check_choice("encoder", self.encoder, ("mlp", "table"))
        check_int("rep_dim", self.rep_dim, minimum=1)
        check_int("steps", self.steps, minimum=1)
        check_float("lr", self.lr, minimum=0.0, strict_min=True)
        check_float("init_scale", self.init_scale, minimum=0.0, strict_min=True)


class _Table(nn.Module):
    def __init__(self, n: int, k: int, scale: float):
        super().__init__()
        self.table = nn.Parameter(scale * torch.randn(n, k))

    def forward(self, x):  # x is ignored: one free vector per point
        return self.table


def pretrain_spectral(cfg: SpectralConfig) -> dict:
    """Minimise :math:`L_{\\text{spec}}` by full-batch Adam (cached).

    Returns ``{"losses", "features"}``: the loss at every step and the final
    :math:`f(x)` at every point (float64, shape ``(N, rep_dim)``).
    """
    if not isinstance(cfg, SpectralConfig):
        raise TypeError(f"cfg must be a SpectralConfig, got {type(cfg).__name__}")

    def build():
        seed_everything(cfg.seed)
        world = MixtureOfManifolds(cfg.world)
        graph = world.augmentation_graph()
        W = graph.weights
        x = world.points.float()
        if cfg.encoder == "mlp":
            model = MLP([2] + [cfg.width] * cfg.depth + [cfg.rep_dim])
        else:
            model = _Table(world.n_points, cfg.rep_dim, cfg.init_scale)
        res = train(
            model,
            lambda m, batch: spectral_contrastive_loss(m(x), W),
            lambda step: None,
            steps=cfg.steps,
            lr=cfg.lr,
            desc=f"spectral pretraining ({cfg.encoder}, seed {cfg.seed})",
        )
        with torch.no_grad():
            feats = model(x).double()
        return {"losses": res.losses, "features": feats}

    return cached(cfg, build, name="ch2_spectral")
