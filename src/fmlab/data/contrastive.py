"""Data for contrastive pretraining: latent classes, and augmentation graphs on
manifolds.

Two generators, both with *finite support*, so that every population quantity of
Chapter 2 (``notebooks/02-interface.ipynb``) is an exact finite sum rather than a Monte
Carlo estimate.

**Latent classes** (:class:`LatentClassModel`, the setting of Arora et al. 2019). A
class
:math:`c \\in \\{1,\\dots,K\\}` is drawn from :math:`\\rho`; each class has a
distribution
:math:`\\mathcal D_c`, here uniform over :math:`m` points of the plane, made of a few
small
clusters scattered over a grid, so that no class is linearly separable from the others
in
the raw input. A similar pair is :math:`x, x^+ \\sim \\mathcal D_c` i.i.d.; a negative
is
:math:`x^- \\sim \\mathcal D_{c^-}` with an independent :math:`c^- \\sim \\rho`.

**Mixture of manifolds** (:class:`MixtureOfManifolds`, the test bed of HaoChen et al.
2021).
Each class is a circle (a one-dimensional manifold) of :math:`m` points; the circles sit
at
the corners of a regular polygon whose side is the ``separation`` of neighbouring
centres.
Natural data :math:`\\bar x` is uniform over all points. An augmentation first moves
:math:`\\bar x` *along its circle* by a wrapped Gaussian step of angular width
``along_std``
(:math:`s`), then adds isotropic *jitter* of width ``jitter_std`` (:math:`\\varepsilon`)
in the
plane, both restricted to the finite point set (a point is chosen with probability
proportional to the Gaussian weight). With ``arcs > 1`` each circle is broken into arcs
separated by gaps and the step along the circle cannot leave its arc. The population
augmentation graph has weights

.. math::
    w(x, x') = \\sum_{\\bar x} p(\\bar x)\\, A(x\\mid\\bar x)\\, A(x'\\mid\\bar x),

the probability that :math:`(x, x')` is a positive pair.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._validate import check_float, check_int
from ..repro import make_generator

__all__ = [
    "LatentClassConfig",
    "LatentClassModel",
    "ManifoldConfig",
    "MixtureOfManifolds",
    "AugmentationGraph",
    "class_mixing_arc_map",
]


def _check_generator(generator) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator, got {type(generator).__name__}"
        )
    return generator


# --------------------------------------------------------------------------------------
# latent classes
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LatentClassConfig:
    """Parameters of :class:`LatentClassModel`.

    ``class_probs`` is :math:`\\rho` (``None`` for uniform); ``seed`` fixes the points.
    """

    n_classes: int = 6
    clusters_per_class: int = 3
    points_per_cluster: int = 12
    cluster_std: float = 0.12
    class_probs: tuple[float, ...] | None = None
    seed: int = 0

    def __post_init__(self):
        check_int("n_classes", self.n_classes, minimum=2)
        check_int("clusters_per_class", self.clusters_per_class, minimum=1)
        check_int("points_per_cluster", self.points_per_cluster, minimum=1)
        check_float("cluster_std", self.cluster_std, minimum=0.0)
        check_int("seed", self.seed, minimum=0)
        if self.class_probs is not None:
            if (
                not isinstance(self.class_probs, tuple)
                or len(self.class_probs) != self.n_classes
            ):
                raise ValueError(
                    f"class_probs must be a tuple of {self.n_classes} probabilities, "
                    f"got {self.class_probs!r}"
                )
            for p in self.class_probs:
                check_float("class_probs", p, minimum=0.0, strict_min=True)
            if abs(sum(self.class_probs) - 1.0) > 1e-9:
                raise ValueError(
                    f"class_probs must sum to 1, got {sum(self.class_probs)}"
                )


class LatentClassModel:
    """Finite-support latent-class model of similar pairs and negatives (module
    docstring).

    Attributes
    ----------
    points : (N, 2) float64 tensor, the support of all class distributions
    labels : (N,) int64 tensor, the latent class of each point
    class_probs : (K,) float64 tensor, :math:`\\rho`
    members : (K, m) int64 tensor, the indices of each class's points
    """

    def __init__(self, config: LatentClassConfig = LatentClassConfig()):
        if not isinstance(config, LatentClassConfig):
            raise TypeError(
                f"config must be a LatentClassConfig, got {type(config).__name__}"
            )
        self.config = c = config
        g = make_generator(c.seed)
        n_clusters = c.n_classes * c.clusters_per_class
        side = math.ceil(math.sqrt(1.3 * n_clusters))
        cells = torch.randperm(side * side, generator=g)[:n_clusters]
        centres = torch.stack([cells // side, cells % side], 1).double()
        centres = centres - centres.mean(0)
        cluster_class = torch.arange(n_clusters) % c.n_classes
        cluster_class = cluster_class[torch.randperm(n_clusters, generator=g)]
        per = c.points_per_cluster
        noise = torch.randn(n_clusters, per, 2, generator=g, dtype=torch.float64)
        pts = centres[:, None, :] + c.cluster_std * noise
        order = torch.argsort(
            cluster_class, stable=True
        )  # group the points class by class
        self.points = pts[order].reshape(-1, 2)
        self.labels = cluster_class[order].repeat_interleave(per)
        m = c.clusters_per_class * per
        self.members = torch.arange(len(self.labels)).reshape(c.n_classes, m)
        if c.class_probs is None:
            self.class_probs = torch.full(
                (c.n_classes,), 1.0 / c.n_classes, dtype=torch.float64
            )
        else:
            self.class_probs = torch.tensor(c.class_probs, dtype=torch.float64)

    @property
    def n_points(self) -> int:
        return int(self.labels.numel())

    def collision_probability(self) -> float:
        """:math:`\\tau = \\Pr_{c, c^- \\sim \\rho}[c = c^-] = \\sum_c \\rho(c)^2`."""
        return float(self.class_probs.pow(2).sum())

    def sample_triples(
        self, n: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """Draw ``n`` triples :math:`(x, x^+, x^-)` and their classes.

        Returns a dict with float32 inputs ``x``, ``x_pos``, ``x_neg`` of shape ``(n,
        2)``,
        the classes ``c`` and ``c_neg`` and the point indices ``i``, ``i_pos``,
        ``i_neg``.
        """
        n = check_int("n", n, minimum=1)
        g = _check_generator(generator)
        K, m = self.members.shape
        c = torch.multinomial(self.class_probs, n, replacement=True, generator=g)
        c_neg = torch.multinomial(self.class_probs, n, replacement=True, generator=g)
        i = self.members[c, torch.randint(m, (n,), generator=g)]
        i_pos = self.members[c, torch.randint(m, (n,), generator=g)]
        i_neg = self.members[c_neg, torch.randint(m, (n,), generator=g)]
        x = self.points.float()
        return {
            "x": x[i],
            "x_pos": x[i_pos],
            "x_neg": x[i_neg],
            "c": c,
            "c_neg": c_neg,
            "i": i,
            "i_pos": i_pos,
            "i_neg": i_neg,
        }

    def __repr__(self) -> str:
        c = self.config
        return (
            f"LatentClassModel(K={c.n_classes}, clusters/class={c.clusters_per_class}, "
            f"points/class={self.members.shape[1]}, "
            f"tau={self.collision_probability():.4f})"
        )


# --------------------------------------------------------------------------------------
# mixture of manifolds and its augmentation graph
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AugmentationGraph:
    """A population augmentation graph on finitely many points.

    ``weights[x, x']`` is :math:`w(x, x')` (symmetric, non-negative, summing to 1);
    ``labels`` the downstream class of each point; ``points`` its input coordinates.
    """

    weights: torch.Tensor  # (N, N) float64
    labels: torch.Tensor  # (N,) int64
    points: torch.Tensor  # (N, d) float64

    @property
    def marginal(self) -> torch.Tensor:
        """:math:`w_x = \\sum_{x'} w(x, x')`, the distribution of one augmented view."""
        return self.weights.sum(1)

    @property
    def n_classes(self) -> int:
        return int(self.labels.max()) + 1


@dataclass(frozen=True)
class ManifoldConfig:
    """Parameters of :class:`MixtureOfManifolds` (see the module docstring).

    ``arc_fill`` is the fraction of each arc's share of the circle that holds points
    when
    ``arcs > 1`` (the rest is a gap).
    """

    n_classes: int = 3
    points_per_class: int = 48
    radius: float = 1.0
    separation: float = 3.0
    along_std: float = 0.3
    jitter_std: float = 0.1
    arcs: int = 1
    arc_fill: float = 0.6

    def __post_init__(self):
        check_int("n_classes", self.n_classes, minimum=2)
        check_int("points_per_class", self.points_per_class, minimum=2)
        check_float("radius", self.radius, minimum=0.0, strict_min=True)
        check_float("separation", self.separation, minimum=0.0, strict_min=True)
        check_float("along_std", self.along_std, minimum=0.0)
        check_float("jitter_std", self.jitter_std, minimum=0.0)
        check_int("arcs", self.arcs, minimum=1)
        check_float(
            "arc_fill", self.arc_fill, minimum=0.0, maximum=1.0, strict_min=True
        )
        if self.points_per_class % self.arcs:
            raise ValueError(
                f"points_per_class ({self.points_per_class}) must be a multiple of "
                f"arcs ({self.arcs})"
            )


def _gaussian_rows(
    d2: torch.Tensor, std: float, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Row-normalised Gaussian weights exp(-d2 / 2 std^2); std = 0 gives the
    identity."""
    if std == 0.0:
        return torch.eye(d2.shape[0], dtype=torch.float64)
    logits = -d2 / (2 * std**2)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return torch.softmax(logits, dim=1)


class MixtureOfManifolds:
    """Circles in the plane, one per class, and their augmentation kernel (module
    docstring).

    Attributes
    ----------
    points : (N, 2) float64; labels : (N,) int64; arc_id : (N,) int64 (global arc index
    ``class * arcs + arc``); angle : (N,) float64, the position on the circle.
    """

    def __init__(self, config: ManifoldConfig = ManifoldConfig()):
        if not isinstance(config, ManifoldConfig):
            raise TypeError(
                f"config must be a ManifoldConfig, got {type(config).__name__}"
            )
        self.config = c = config
        r, m, q = c.n_classes, c.points_per_class, c.arcs
        circum = c.separation / (
            2 * math.sin(math.pi / r)
        )  # polygon with side = separation
        phi = 2 * math.pi * torch.arange(r, dtype=torch.float64) / r
        centres = circum * torch.stack([torch.cos(phi), torch.sin(phi)], 1)
        per_arc = m // q
        if q == 1:
            angle = 2 * math.pi * torch.arange(m, dtype=torch.float64) / m
        else:
            span = 2 * math.pi / q * c.arc_fill
            within = (
                torch.arange(per_arc, dtype=torch.float64) * span / max(per_arc - 1, 1)
            )
            angle = (2 * math.pi * torch.arange(q, dtype=torch.float64) / q)[
                :, None
            ] + within[None, :]
            angle = angle.reshape(-1)
        self.angle = angle.repeat(r)
        self.labels = torch.arange(r).repeat_interleave(m)
        self.arc_id = self.labels * q + (torch.arange(m) // per_arc).repeat(r)
        self.points = centres[self.labels] + c.radius * torch.stack(
            [torch.cos(self.angle), torch.sin(self.angle)], 1
        )
        self._kernel = None

    @property
    def n_points(self) -> int:
        return int(self.labels.numel())

    def natural_probs(self) -> torch.Tensor:
        """:math:`p(\\bar x)`: uniform over the points."""
        return torch.full((self.n_points,), 1.0 / self.n_points, dtype=torch.float64)

    def augmentation_kernel(self) -> torch.Tensor:
        """The row-stochastic matrix :math:`A(x \\mid \\bar x)`, shape ``(N, N)``,
        float64."""
        if self._kernel is None:
            c = self.config
            d = self.angle[:, None] - self.angle[None, :]
            if c.arcs == 1:  # wrapped angular distance along the full circle
                d = torch.remainder(d + math.pi, 2 * math.pi) - math.pi
            same = self.arc_id[:, None] == self.arc_id[None, :]
            along = _gaussian_rows(d**2, c.along_std, same)
            jitter = _gaussian_rows(
                torch.cdist(self.points, self.points).pow(2), c.jitter_std
            )
            self._kernel = along @ jitter
        return self._kernel

    def augmentation_graph(self) -> AugmentationGraph:
        """The population augmentation graph :math:`w = A^\\top \\operatorname{diag}(p)
        A`."""
        A = self.augmentation_kernel()
        W = A.T @ (self.natural_probs()[:, None] * A)
        W = 0.5 * (W + W.T)
        return AugmentationGraph(
            weights=W, labels=self.labels.clone(), points=self.points.clone()
        )

    def sample_pairs(
        self, n: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Indices ``(i, i_pos)`` of ``n`` positive pairs: two augmentations of one
        natural point."""
        n = check_int("n", n, minimum=1)
        g = _check_generator(generator)
        A = self.augmentation_kernel()
        base = torch.multinomial(self.natural_probs(), n, replacement=True, generator=g)
        i = torch.multinomial(A[base], 1, generator=g).squeeze(1)
        i_pos = torch.multinomial(A[base], 1, generator=g).squeeze(1)
        return i, i_pos

    def arc_permutation(self, arc_map) -> torch.Tensor:
        """The point permutation that sends arc ``a`` onto arc ``arc_map[a]``, point by
        point.

        ``arc_map`` is a permutation of ``range(n_classes * arcs)``. When augmentations
        cannot
        leave an arc (``jitter_std = 0``), every such map is an automorphism of the
        augmentation graph.
        """
        n_arcs = self.config.n_classes * self.config.arcs
        arc_map = torch.as_tensor(list(arc_map), dtype=torch.int64)
        if arc_map.shape != (n_arcs,) or not torch.equal(
            torch.sort(arc_map).values, torch.arange(n_arcs)
        ):
            raise ValueError(
                f"arc_map must be a permutation of range({n_arcs}), "
                f"got {arc_map.tolist()}"
            )
        per_arc = self.config.points_per_class // self.config.arcs
        pos = torch.arange(self.n_points) % per_arc
        return arc_map[self.arc_id] * per_arc + pos

    def __repr__(self) -> str:
        c = self.config
        return (
            f"MixtureOfManifolds(r={c.n_classes}, m={c.points_per_class}, "
            f"separation={c.separation}, "
            f"along_std={c.along_std}, jitter_std={c.jitter_std}, arcs={c.arcs})"
        )


def class_mixing_arc_map(n_classes: int, arcs: int) -> list[int]:
    """Send arc ``j`` of class ``c`` to arc ``j`` of class ``(c + j) mod n_classes``.

    With ``arcs`` a multiple of ``n_classes`` every class is spread evenly over all
    classes,
    so a representation that was constant on classes becomes useless for the labels.
    """
    n_classes = check_int("n_classes", n_classes, minimum=2)
    arcs = check_int("arcs", arcs, minimum=1)
    return [
        ((c + j) % n_classes) * arcs + j for c in range(n_classes) for j in range(arcs)
    ]
