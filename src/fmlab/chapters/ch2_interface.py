"""The pretraining-adaptation interface of contrastive learning (Chapter 2).

The experiments of ``notebooks/02-interface.ipynb``, each a config, a runner (cached
with :func:`fmlab.cached`) and a result dataclass:

* Part I, :func:`latent_classes`: encoders pretrained on sampled triples of a
  :class:`~fmlab.data.contrastive.LatentClassModel` (:func:`pretrain_curl`), with both
  sides of Arora et al.'s bound and the best head evaluated exactly at every checkpoint
  (:func:`curl_along_training`).
* Part II, :func:`minimiser_check` (the spectral loss minimised by L-BFGS beside the
  eigendecomposition), :func:`connectivity` (:func:`connectivity_sweep`: the minimiser's
  linear probe beside HaoChen et al.'s guarantee over a grid of
  :class:`~fmlab.data.contrastive.MixtureOfManifolds`) and :func:`trained_encoders`
  (MLPs trained on the population spectral loss, :func:`pretrain_spectral`, against the
  guarantee for approximate minimisers).
* Part III, :func:`same_loss`: representations with the same pretraining loss (an MLP,
  a lookup table, an MLP fitted to a scrambled minimiser) and their images under a graph
  automorphism.

The figures and tables are in :mod:`fmlab.chapters.ch2_figures`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from .._validate import check_choice, check_float, check_int
from ..data.contrastive import (
    AugmentationGraph,
    LatentClassConfig,
    LatentClassModel,
    ManifoldConfig,
    MixtureOfManifolds,
    class_mixing_arc_map,
)
from ..models.mlp import MLP, SphereEncoder
from ..repro import make_generator, seed_everything
from ..theory.contrastive import (
    ProbeResult,
    SpectralMinimizer,
    approximate_minimizer_bound,
    best_head_loss,
    class_means,
    contrastive_loss_on_triples,
    curl_terms,
    jensen_slack_bound,
    label_leakage,
    laplacian_eigenvalues,
    linear_probe_loss,
    make_spectral_loss,
    minimize_spectral_loss,
    outside_subspace,
    spectral_contrastive_loss,
    spectral_minimizer,
    top_eigenvectors,
    within_class_spread,
)
from ..train import cached, progress, train

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
    "scrambled_indicators",
    "spectral_along_training",
    "LatentClassConfig",
    "ManifoldConfig",
    "LatentClassesConfig",
    "LatentClassesResult",
    "latent_classes",
    "MinimiserCheckConfig",
    "MinimiserCheck",
    "minimiser_check",
    "SweepConfig",
    "connectivity",
    "TrainedEncodersConfig",
    "TrainedEncodersResult",
    "trained_encoders",
    "TRAINED",
    "SameLossEncodersConfig",
    "Evaluation",
    "SameLossResult",
    "same_loss",
]


@dataclass(frozen=True)
class CurlConfig:
    """Everything that determines a contrastively pretrained encoder on latent
    classes."""

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
        if not isinstance(self.world, LatentClassConfig):
            raise TypeError(
                f"world must be a LatentClassConfig, got {type(self.world).__name__}"
            )
        check_int("width", self.width, minimum=1)
        check_int("depth", self.depth, minimum=1)
        check_int("rep_dim", self.rep_dim, minimum=1)
        check_float("radius", self.radius, minimum=0.0, strict_min=True)
        check_int("steps", self.steps, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        check_float("lr", self.lr, minimum=0.0, strict_min=True)
        check_choice("loss", self.loss, ("logistic", "hinge"))
        if not isinstance(self.checkpoints, tuple):
            raise TypeError(
                "checkpoints must be a tuple of steps, got "
                f"{type(self.checkpoints).__name__}"
            )
        for c in self.checkpoints:
            check_int("checkpoints", c, minimum=0, maximum=self.steps)
        check_int("seed", self.seed, minimum=0)


def _curl_encoder(cfg: CurlConfig) -> SphereEncoder:
    return SphereEncoder(
        2, width=cfg.width, depth=cfg.depth, rep_dim=cfg.rep_dim, radius=cfg.radius
    )


def pretrain_curl(cfg: CurlConfig) -> dict:
    """Train (or load from the cache) and return ``{"losses", "checkpoints"}``.

    Each step draws a fresh batch of triples, so the training loss is an unbiased
    estimate
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
    """An encoder of ``cfg``'s shape with the weights ``state`` (a checkpoint), in eval
    mode."""
    if not isinstance(cfg, CurlConfig):
        raise TypeError(f"cfg must be a CurlConfig, got {type(cfg).__name__}")
    if not isinstance(state, dict):
        raise TypeError(f"state must be a state dict, got {type(state).__name__}")
    model = _curl_encoder(cfg)
    model.load_state_dict(state)
    return model.eval()


def curl_along_training(cfg: CurlConfig) -> dict[str, torch.Tensor]:
    """Both sides of Arora et al.'s bound, and the best head, at every checkpoint
    (exact).

    Returns float64 tensors (one entry per checkpoint, in increasing step order):
    ``steps``; ``unsupervised`` :math:`L_{\\text{un}}`; ``mean_classifier``
    :math:`L^{\\mu}_{\\text{sup}}`; ``bound``; ``best_head`` and ``best_head_lower``,
    the
    interval that holds :math:`L^\\star_{\\text{adapt}}` (best head of norm at most
    :math:`2R`, :func:`~fmlab.theory.contrastive.best_head_loss`; only for the logistic
    loss, NaN otherwise); ``max_mean_gap``, the largest
    :math:`\\lVert\\mu_c-\\mu_{c'}\\rVert`; ``jensen_bound``, the bound on the slack
    (:func:`~fmlab.theory.contrastive.jensen_slack_bound`, logistic loss only);
    ``spread`` (:math:`\\mathbb E\\lVert f(x)-\\mu_c\\rVert^2`); ``probe_error`` (error
    rate
    of the least-squares :math:`K`-way linear probe with bias, on the population); and
    the
    scalar ``tau``. The evaluation is cached beside the trained model.
    """
    if not isinstance(cfg, CurlConfig):
        raise TypeError(f"cfg must be a CurlConfig, got {type(cfg).__name__}")
    run = pretrain_curl(cfg)

    def evaluate():
        world = LatentClassModel(cfg.world)
        x = world.points.float()
        y, rho = world.labels, world.class_probs
        steps = sorted(run["checkpoints"])
        rows = []
        for s in steps:
            with torch.no_grad():
                f = load_curl_encoder(cfg, run["checkpoints"][s])(x).double()
            t = curl_terms(f, y, rho, loss=cfg.loss)
            probe = linear_probe_loss(f, y, rho[y] / world.members.shape[1])
            mu = class_means(f, y, rho.numel())
            if cfg.loss == "logistic":
                head = best_head_loss(f, y, rho, 2 * cfg.radius, tol=1e-6)
                best, lower = head.loss, head.lower
                jensen = jensen_slack_bound(f, y, rho)
            else:
                best = lower = jensen = float("nan")
            rows.append(
                (
                    t.unsupervised,
                    t.mean_classifier,
                    t.bound,
                    best,
                    lower,
                    float(torch.cdist(mu, mu).max()),
                    jensen,
                    within_class_spread(f, y, rho),
                    probe.error,
                )
            )
        rows = torch.tensor(rows, dtype=torch.float64)
        names = (
            "unsupervised",
            "mean_classifier",
            "bound",
            "best_head",
            "best_head_lower",
            "max_mean_gap",
            "jensen_bound",
            "spread",
            "probe_error",
        )
        out = {name: rows[:, i].clone() for i, name in enumerate(names)}
        out["steps"] = torch.tensor(steps)
        out["tau"] = torch.tensor(world.collision_probability(), dtype=torch.float64)
        return out

    return cached(cfg, evaluate, name="ch2_curl_eval")


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
    """For every (along_std, separation): graph, spectral minimiser, probe and
    guarantee."""
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
    """An encoder trained on the exact population spectral contrastive loss of a
    manifold graph.

    ``encoder = "mlp"`` is an MLP on the input coordinates; ``"table"`` is a free vector
    per
    point (a lookup table: any function of the input, no inductive bias).

    ``start = "random"`` starts from the random initialisation. ``start = "scrambled"``
    (MLP only, on a world with ``arcs > 1`` and ``rep_dim == n_classes``) first fits the
    MLP for ``fit_steps`` Adam steps, by least squares, to the scrambled class
    indicators
    :math:`\\sqrt{r}\\,e_{y(\\pi x)}` (``pi`` from
    :func:`~fmlab.data.contrastive.class_mixing_arc_map`), an exact minimiser of the
    spectral loss whose linear probe is at chance, and then pretrains as usual for
    ``steps`` steps (``steps = 0``: the fitted MLP itself).
    """

    world: ManifoldConfig = field(default_factory=ManifoldConfig)
    encoder: str = "mlp"
    rep_dim: int = 3
    width: int = 64
    depth: int = 2
    steps: int = 1500
    lr: float = 3e-3
    init_scale: float = 0.5
    checkpoints: tuple[int, ...] = ()
    start: str = "random"
    fit_steps: int = 0
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.world, ManifoldConfig):
            raise TypeError(
                f"world must be a ManifoldConfig, got {type(self.world).__name__}"
            )
        check_choice("encoder", self.encoder, ("mlp", "table"))
        check_int("rep_dim", self.rep_dim, minimum=1)
        check_int("width", self.width, minimum=1)
        check_int("depth", self.depth, minimum=1)
        check_choice("start", self.start, ("random", "scrambled"))
        # a scrambled start may stop after the fit (steps = 0): no pretraining at all
        check_int("steps", self.steps, minimum=0 if self.start == "scrambled" else 1)
        check_float("lr", self.lr, minimum=0.0, strict_min=True)
        check_float("init_scale", self.init_scale, minimum=0.0, strict_min=True)
        if not isinstance(self.checkpoints, tuple):
            raise TypeError(
                "checkpoints must be a tuple of steps, got "
                f"{type(self.checkpoints).__name__}"
            )
        for c in self.checkpoints:
            check_int("checkpoints", c, minimum=0, maximum=self.steps)
        check_int("fit_steps", self.fit_steps, minimum=0)
        if self.start == "scrambled":
            if self.encoder != "mlp":
                raise ValueError("start='scrambled' needs encoder='mlp'")
            if self.world.arcs < 2 or self.rep_dim != self.world.n_classes:
                raise ValueError(
                    "start='scrambled' needs world.arcs >= 2 and rep_dim == "
                    f"world.n_classes, got arcs={self.world.arcs}, "
                    f"rep_dim={self.rep_dim}, n_classes={self.world.n_classes}"
                )
            if self.fit_steps < 1:
                raise ValueError("start='scrambled' needs fit_steps >= 1")
        elif self.fit_steps:
            raise ValueError("fit_steps is only used with start='scrambled'")
        check_int("seed", self.seed, minimum=0)


def scrambled_indicators(world: MixtureOfManifolds) -> torch.Tensor:
    """:math:`\\sqrt{r}\\,e_{y(\\pi x)}` at every point, with :math:`\\pi` from
    :func:`~fmlab.data.contrastive.class_mixing_arc_map` (float64, ``(N, r)``).

    With no jitter every arc is a component of the augmentation graph and :math:`\\pi`
    an
    automorphism, so this is an exact minimiser of :math:`L_{\\text{spec}}` with
    :math:`k = r` outputs, and a linear probe on it is at chance (Chapter 2, Part III).
    """
    if not isinstance(world, MixtureOfManifolds):
        raise TypeError(
            f"world must be a MixtureOfManifolds, got {type(world).__name__}"
        )
    r, q = world.config.n_classes, world.config.arcs
    perm = world.arc_permutation(class_mixing_arc_map(r, q))
    onehot = torch.nn.functional.one_hot(world.labels[perm], r).double()
    return r**0.5 * onehot


class _Table(nn.Module):
    def __init__(self, n: int, k: int, scale: float):
        super().__init__()
        self.table = nn.Parameter(scale * torch.randn(n, k))

    def forward(self, x):  # x is ignored: one free vector per point
        return self.table


def pretrain_spectral(cfg: SpectralConfig) -> dict:
    """Minimise :math:`L_{\\text{spec}}` by full-batch Adam (cached).

    Returns ``{"losses", "features", "checkpoints"}``: the loss at every step, the final
    :math:`f(x)` at every point (float64, shape ``(N, rep_dim)``) and, for every step in
    ``cfg.checkpoints``, :math:`f(x)` at that step.
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
        if cfg.start == "scrambled":
            target = scrambled_indicators(world).float()
            train(
                model,
                lambda m, batch: (m(x) - target).pow(2).sum(1).mean(),
                lambda step: None,
                steps=cfg.fit_steps,
                lr=cfg.lr,
                desc=f"fit to scrambled indicators (seed {cfg.seed})",
            )
        if cfg.steps == 0:  # the fitted model itself
            with torch.no_grad():
                feats = model(x).double()
            along = {0: feats.clone()} if 0 in cfg.checkpoints else {}
            return {"losses": torch.empty(0), "features": feats, "checkpoints": along}
        loss = make_spectral_loss(W, torch.float32)  # checked once, not every step
        res = train(
            model,
            lambda m, batch: loss(m(x)),
            lambda step: None,
            steps=cfg.steps,
            lr=cfg.lr,
            checkpoints=cfg.checkpoints,
            desc=f"spectral pretraining ({cfg.encoder}, seed {cfg.seed})",
        )
        with torch.no_grad():
            feats = model(x).double()
            along = {}
            for step, state in res.checkpoints.items():
                model.load_state_dict(state)
                along[step] = model(x).double()
        return {"losses": res.losses, "features": feats, "checkpoints": along}

    return cached(cfg, build, name="ch2_spectral")


def spectral_along_training(cfg: SpectralConfig) -> dict[str, torch.Tensor]:
    """Evaluate the encoder of ``cfg`` at each of its checkpoints, exactly (Part II).

    Returns float64 tensors over ``cfg.checkpoints`` (in increasing order): ``steps``;
    ``excess``, :math:`\\varepsilon = L_{\\text{spec}}(f_t) - \\min L_{\\text{spec}}`;
    ``adapt``, :math:`L^\\star_{\\text{adapt}}(f_t)` (best linear probe with bias,
    squared
    loss on one-hot labels); ``guarantee``, the bound of
    :func:`~fmlab.theory.contrastive.approximate_minimizer_bound` at that excess.
    """
    if not isinstance(cfg, SpectralConfig):
        raise TypeError(f"cfg must be a SpectralConfig, got {type(cfg).__name__}")
    if not cfg.checkpoints:
        raise ValueError("cfg.checkpoints must name at least one step")
    run = pretrain_spectral(cfg)
    graph = MixtureOfManifolds(cfg.world).augmentation_graph()
    best = spectral_minimizer(graph.weights, cfg.rep_dim).loss
    steps = sorted(run["checkpoints"])
    rows = []
    for t in steps:
        f = run["checkpoints"][t]
        eps = float(spectral_contrastive_loss(f, graph.weights)) - best
        adapt = linear_probe_loss(f, graph.labels, graph.marginal).mse
        bound = approximate_minimizer_bound(
            graph.weights, graph.labels, cfg.rep_dim, max(eps, 0.0)
        )
        rows.append((eps, adapt, bound))
    rows = torch.tensor(rows, dtype=torch.float64)
    return {
        "steps": torch.tensor(steps),
        "excess": rows[:, 0].clone(),
        "adapt": rows[:, 1].clone(),
        "guarantee": rows[:, 2].clone(),
    }


# --------------------------------------------------------------------------------------
# the chapter's experiments: one config, one runner and one result per section
# --------------------------------------------------------------------------------------
def _check_seeds(seeds) -> tuple[int, ...]:
    if not isinstance(seeds, tuple) or not seeds:
        raise TypeError(f"seeds must be a non-empty tuple of ints, got {seeds!r}")
    return tuple(check_int("seeds", s, minimum=0) for s in seeds)


def _check_world(world, cls) -> None:
    if not isinstance(world, cls):
        raise TypeError(f"world must be a {cls.__name__}, got {type(world).__name__}")


@dataclass(frozen=True)
class LatentClassesConfig:
    """Part I: encoders pretrained on latent classes (one :class:`CurlConfig` per
    seed, with the defaults of :class:`CurlConfig` for the architecture)."""

    world: LatentClassConfig = field(
        default_factory=lambda: LatentClassConfig(
            n_classes=6, clusters_per_class=3, points_per_cluster=12
        )
    )
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 300
    lr: float = 3e-3
    checkpoints: tuple[int, ...] = (0, 5, 10, 20, 40, 80, 150, 300)

    def __post_init__(self):
        _check_world(self.world, LatentClassConfig)
        _check_seeds(self.seeds)
        self.curl_configs()  # validates steps, lr and checkpoints

    def curl_configs(self) -> list[CurlConfig]:
        """The pretraining run of each seed."""
        return [
            CurlConfig(
                world=self.world,
                steps=self.steps,
                lr=self.lr,
                checkpoints=self.checkpoints,
                seed=s,
            )
            for s in self.seeds
        ]


@dataclass(frozen=True)
class LatentClassesResult:
    """Part I, evaluated exactly at every checkpoint of every seed.

    The tensors named after :func:`curl_along_training`'s entries have shape
    ``(seed, checkpoint)``.
    """

    seeds: tuple[int, ...]
    steps: torch.Tensor  # the checkpoints, in increasing order
    tau: float  # collision probability
    ell0: float  # l(0) = log 2
    radius: float  # R: every representation lies on the sphere of radius R
    points: torch.Tensor  # (N, 2) the inputs
    labels: torch.Tensor  # (N,) their latent class
    class_probs: torch.Tensor  # (K,) rho
    unsupervised: torch.Tensor  # L_un
    mean_classifier: torch.Tensor  # L^mu_sup
    bound: torch.Tensor  # (L_un - tau l(0)) / (1 - tau)
    best_head: torch.Tensor  # L*_adapt (best head of norm <= 2R)
    best_head_lower: torch.Tensor  # certified lower end of L*_adapt
    max_mean_gap: torch.Tensor  # largest ||mu_c - mu_c'||
    jensen_bound: torch.Tensor  # middle term of the slack bound
    spread: torch.Tensor  # within-class spread s(f)
    probe_error: torch.Tensor  # error of the K-way least-squares probe
    raw_probe_error: float  # the same probe on the raw input
    final_features: tuple[torch.Tensor, ...]  # f(x) after pretraining, per seed


_CURVES = (
    "unsupervised",
    "mean_classifier",
    "bound",
    "best_head",
    "best_head_lower",
    "max_mean_gap",
    "jensen_bound",
    "spread",
    "probe_error",
)


def latent_classes(cfg: LatentClassesConfig) -> LatentClassesResult:
    """Train (cached) an encoder per seed and evaluate Arora et al.'s chain exactly
    along training (:func:`curl_along_training`)."""
    if not isinstance(cfg, LatentClassesConfig):
        raise TypeError(f"cfg must be a LatentClassesConfig, got {type(cfg).__name__}")

    def build():
        world = LatentClassModel(cfg.world)
        runs = cfg.curl_configs()
        curves = [curl_along_training(c) for c in runs]
        finals = []
        for c in runs:
            state = pretrain_curl(c)["checkpoints"][c.steps]
            with torch.no_grad():
                finals.append(
                    load_curl_encoder(c, state)(world.points.float()).double()
                )
        return LatentClassesResult(
            seeds=cfg.seeds,
            steps=curves[0]["steps"],
            tau=world.collision_probability(),
            ell0=math.log(2),
            radius=runs[0].radius,
            points=world.points,
            labels=world.labels,
            class_probs=world.class_probs,
            **{n: torch.stack([cv[n] for cv in curves]) for n in _CURVES},
            raw_probe_error=linear_probe_loss(world.points, world.labels).error,
            final_features=tuple(finals),
        )

    return cached(cfg, build, name="ch2_latent_classes")


@dataclass(frozen=True)
class MinimiserCheckConfig:
    """Part II: the spectral loss minimised over all functions on a small graph."""

    world: ManifoldConfig = field(
        default_factory=lambda: ManifoldConfig(
            points_per_class=16, separation=2.1, along_std=0.3, jitter_std=0.1
        )
    )
    k: int = 3
    seeds: tuple[int, ...] = (0, 1, 2)  # random starts of L-BFGS

    def __post_init__(self):
        _check_world(self.world, ManifoldConfig)
        check_int("k", self.k, minimum=1)
        _check_seeds(self.seeds)


@dataclass(frozen=True)
class MinimiserCheck:
    """The eigendecomposition's minimiser beside L-BFGS's, one per random start."""

    graph: AugmentationGraph
    exact: SpectralMinimizer
    found: tuple[torch.Tensor, ...]  # (N, k) tables found by L-BFGS


def minimiser_check(cfg: MinimiserCheckConfig) -> MinimiserCheck:
    """:func:`~fmlab.theory.contrastive.spectral_minimizer` and
    :func:`~fmlab.theory.contrastive.minimize_spectral_loss` from each seed (cached)."""
    if not isinstance(cfg, MinimiserCheckConfig):
        raise TypeError(f"cfg must be a MinimiserCheckConfig, got {type(cfg).__name__}")

    def build():
        graph = MixtureOfManifolds(cfg.world).augmentation_graph()
        exact = spectral_minimizer(graph.weights, cfg.k)
        found = tuple(
            minimize_spectral_loss(graph.weights, cfg.k, make_generator(s))
            for s in cfg.seeds
        )
        return MinimiserCheck(graph, exact, found)

    return cached(cfg, build, name="ch2_minimiser_check")


@dataclass(frozen=True)
class SweepConfig:
    """Part II's grid: augmentation strength along the circles times separation."""

    base: ManifoldConfig = field(
        default_factory=lambda: ManifoldConfig(
            n_classes=3, points_per_class=48, jitter_std=0.1
        )
    )
    along_stds: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
    separations: tuple[float, ...] = (1.9, 2.0, 2.1, 2.2, 2.3)
    k: int = 3

    def __post_init__(self):
        if not isinstance(self.base, ManifoldConfig):
            raise TypeError(
                f"base must be a ManifoldConfig, got {type(self.base).__name__}"
            )
        for name in ("along_stds", "separations"):
            if not isinstance(getattr(self, name), tuple):
                raise TypeError(f"{name} must be a tuple of floats")
        check_int("k", self.k, minimum=1)


def connectivity(cfg: SweepConfig) -> SweepResult:
    """:func:`connectivity_sweep` over ``cfg``'s grid (cached)."""
    if not isinstance(cfg, SweepConfig):
        raise TypeError(f"cfg must be a SweepConfig, got {type(cfg).__name__}")

    def build():
        return connectivity_sweep(cfg.base, cfg.along_stds, cfg.separations, cfg.k)

    return cached(cfg, build, name="ch2_connectivity")


@dataclass(frozen=True)
class TrainedEncodersConfig:
    """Part II: MLP encoders trained on the exact population spectral loss of one
    graph of the sweep, one :class:`SpectralConfig` per seed."""

    world: ManifoldConfig = field(
        default_factory=lambda: ManifoldConfig(
            n_classes=3,
            points_per_class=48,
            jitter_std=0.1,
            along_std=0.4,
            separation=2.2,
        )
    )
    k: int = 3
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 400
    lr: float = 1e-2
    checkpoints: tuple[int, ...] = (0, 25, 50, 100, 200, 400)

    def __post_init__(self):
        _check_world(self.world, ManifoldConfig)
        _check_seeds(self.seeds)
        self.spectral_configs()  # validates k, steps, lr and checkpoints

    def spectral_configs(self) -> list[SpectralConfig]:
        """The pretraining run of each seed."""
        return [
            SpectralConfig(
                world=self.world,
                rep_dim=self.k,
                steps=self.steps,
                lr=self.lr,
                checkpoints=self.checkpoints,
                seed=s,
            )
            for s in self.seeds
        ]


@dataclass(frozen=True)
class TrainedEncodersResult:
    """Part II's trained encoders, evaluated exactly at every checkpoint; the
    tensors have shape ``(seed, checkpoint)``."""

    steps: torch.Tensor  # the checkpoints
    excess: torch.Tensor  # epsilon = L_spec(f_t) - min L_spec
    adapt: torch.Tensor  # L*_adapt(f_t)
    guarantee: torch.Tensor  # the bound for approximate minimisers at that excess
    graph: AugmentationGraph
    minimiser: SpectralMinimizer  # f*, from the eigendecomposition
    leakage: float  # phi, the label leakage of the graph


_ALONG = ("excess", "adapt", "guarantee")


def trained_encoders(cfg: TrainedEncodersConfig) -> TrainedEncodersResult:
    """Train (cached) an encoder per seed and evaluate it with
    :func:`spectral_along_training`."""
    if not isinstance(cfg, TrainedEncodersConfig):
        raise TypeError(
            f"cfg must be a TrainedEncodersConfig, got {type(cfg).__name__}"
        )

    def build():
        evals = [spectral_along_training(c) for c in cfg.spectral_configs()]
        graph = MixtureOfManifolds(cfg.world).augmentation_graph()
        return TrainedEncodersResult(
            steps=evals[0]["steps"],
            **{n: torch.stack([e[n] for e in evals]) for n in _ALONG},
            graph=graph,
            minimiser=spectral_minimizer(graph.weights, cfg.k),
            leakage=label_leakage(graph.weights, graph.labels),
        )

    return cached(cfg, build, name="ch2_trained_encoders")


#: The trained representations of Part III, in the order the chapter shows them.
TRAINED = ("MLP", "lookup table", "MLP, scrambled fit")


@dataclass(frozen=True)
class SameLossEncodersConfig:
    """Part III: representations of the arcs test bed, pretrained or fitted."""

    world: ManifoldConfig = field(
        default_factory=lambda: ManifoldConfig(
            n_classes=3,
            points_per_class=48,
            arcs=3,
            jitter_std=0.0,
            along_std=0.3,
            separation=3.0,
        )
    )
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 400  # full-batch Adam steps on the exact population loss
    lr: float = 1e-2
    fit_steps: int = 600  # least-squares steps towards the scrambled indicators
    k: int = 3

    def __post_init__(self):
        _check_world(self.world, ManifoldConfig)
        _check_seeds(self.seeds)
        if self.k != self.world.n_classes:
            raise ValueError(
                f"k must equal world.n_classes (class indicators), got k={self.k}"
            )
        self.spectral_configs()  # validates steps, lr and fit_steps

    def spectral_configs(self) -> dict[str, list[SpectralConfig]]:
        """How each trained representation is obtained, one config per seed."""
        how = dict(
            zip(
                TRAINED,
                (
                    dict(encoder="mlp", steps=self.steps),
                    dict(encoder="table", steps=self.steps),
                    dict(
                        encoder="mlp",
                        start="scrambled",
                        fit_steps=self.fit_steps,
                        steps=0,
                    ),
                ),
            )
        )
        return {
            name: [
                SpectralConfig(
                    world=self.world, rep_dim=self.k, lr=self.lr, seed=s, **kw
                )
                for s in self.seeds
            ]
            for name, kw in how.items()
        }


@dataclass(frozen=True)
class Evaluation:
    """A representation ``f`` and ``f∘π``, on the population (Part III)."""

    loss: float  # L_spec(f)
    loss_pi: float  # L_spec(f∘π)
    excess: float  # L_spec(f) - min L_spec
    outside: (
        float  # ||(I - P_m) P||_F^2: the part of f that is not a function of the arc
    )
    probe: ProbeResult  # best linear probe on f
    probe_pi: ProbeResult  # best linear probe on f∘π


@dataclass(frozen=True)
class SameLossResult:
    """Part III: the graph, the automorphism ``perm`` (:math:`\\pi`) and an
    :class:`Evaluation` of every representation, per seed (one for the class
    indicators, which need no seed)."""

    seeds: tuple[int, ...]
    graph: AugmentationGraph
    perm: torch.Tensor  # pi as an index tensor: f∘π is f[perm]
    laplacian: torch.Tensor  # eigenvalues lambda_1 <= lambda_2 <= ... of I - A-bar
    minimum: float  # min L_spec with k outputs
    n_arcs: int  # m, the number of components
    evaluations: dict[str, list[Evaluation]]

    def probe_losses(self, name: str, *, composed: bool = False) -> torch.Tensor:
        """``L*_adapt`` of representation ``name`` per seed (of ``f∘π`` if
        ``composed``)."""
        return torch.tensor(
            [(e.probe_pi if composed else e.probe).mse for e in self.evaluations[name]]
        )


def same_loss(cfg: SameLossEncodersConfig) -> SameLossResult:
    """Train (cached) every representation of Part III and evaluate it and its image
    under the automorphism :math:`\\pi` exactly."""
    if not isinstance(cfg, SameLossEncodersConfig):
        raise TypeError(
            f"cfg must be a SameLossEncodersConfig, got {type(cfg).__name__}"
        )

    def build():
        arcs = MixtureOfManifolds(cfg.world)
        G = arcs.augmentation_graph()
        r = cfg.world.n_classes
        perm = arcs.arc_permutation(class_mixing_arc_map(r, cfg.world.arcs))
        best = spectral_minimizer(G.weights, cfg.k).loss
        n_arcs = r * cfg.world.arcs
        arc_basis = top_eigenvectors(G.weights, n_arcs)  # D^1/2-weighted indicators

        def evaluate(f):
            return Evaluation(
                loss=float(spectral_contrastive_loss(f, G.weights)),
                loss_pi=float(spectral_contrastive_loss(f[perm], G.weights)),
                excess=float(spectral_contrastive_loss(f, G.weights)) - best,
                outside=outside_subspace(f, arc_basis, G.marginal),
                probe=linear_probe_loss(f, G.labels, G.marginal),
                probe_pi=linear_probe_loss(f[perm], G.labels, G.marginal),
            )

        indicator = math.sqrt(r) * torch.nn.functional.one_hot(G.labels, r).double()
        evaluations = {"class indicators": [evaluate(indicator)]}
        for name, runs in cfg.spectral_configs().items():
            evaluations[name] = [
                evaluate(pretrain_spectral(c)["features"]) for c in runs
            ]
        return SameLossResult(
            seeds=cfg.seeds,
            graph=G,
            perm=perm,
            laplacian=laplacian_eigenvalues(G.weights),
            minimum=best,
            n_arcs=n_arcs,
            evaluations=evaluations,
        )

    return cached(cfg, build, name="ch2_same_loss")
