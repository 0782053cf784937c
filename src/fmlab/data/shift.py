"""A world with a style shift: the pretraining, ID and OOD distributions of Chapter 3.

Each example has a *content* vector :math:`z \\in \\mathbb{R}^p` and a *style*
:math:`j \\in \\{0, \\dots, J-1\\}`. The content comes from one of :math:`K` object
types (clusters),

.. math::
    t \\sim \\mathrm{Unif}\\{1,\\dots,K\\}, \\qquad z = \\mu_t + \\tau\\,\\xi,
    \\qquad \\xi \\sim N(0, I_p),

and the style decides how the content is rendered into the input,

.. math::
    x = R_j z + \\sigma\\,\\varepsilon \\in \\mathbb{R}^D,
    \\qquad \\varepsilon \\sim N(0, I_D),

where the :math:`R_j \\in \\mathbb{R}^{D\\times p}` have orthonormal columns and the
column spaces of different styles are mutually orthogonal (:math:`Jp \\le D`): the same
object drawn as a photo or as a sketch activates disjoint input directions. With
:math:`\\sigma = 0` (the default) an input of style :math:`j` lies exactly in the column
space of :math:`R_j`, so OOD inputs are orthogonal to every ID input: the assumption of
the linear theory of feature distortion, exactly.

**Overlapping styles** (``overlap_deg`` :math:`= a`, in degrees). The styles may share
part of their input directions instead:

.. math::
    R_j = \\cos(a)\\, R_{\\text{shared}} + \\sin(a)\\, Q_j ,

with :math:`R_{\\text{shared}}, Q_0, \\dots, Q_{J-1}` mutually orthogonal
:math:`p`-frames (:math:`(J+1)p \\le D`). Every :math:`R_j` still has orthonormal
columns, and :math:`R_i^\\top R_j = \\cos^2(a)\\, I` for :math:`i \\ne j`: an OOD
input's projection on the ID inputs' span is :math:`\\cos^2(a)` times the ID rendering
of the same content (:meth:`StyleShiftWorld.overlap`). :math:`a = 90°` gives
orthogonal styles again, :math:`a = 0` no shift at all. ``overlap_deg=None`` (the
default) is the orthogonal construction above.

* **Pretraining (source) distribution**: every style, uniformly; the pretraining label
  is the object type :math:`t` (a :math:`K`-way classification, like supervised
  ImageNet pretraining).
* **Downstream task**: :math:`C` classes given by a fixed linear rule on the content,
  :math:`y = \\arg\\max_c (Wz)_c`, which cuts across object types, so a representation
  trained to recognise types carries it only in part.
* **ID** data: style 0 (what the labelled examples look like). **OOD** data: the other
  styles, with the same labelling rule (a pure style shift).

Used in Chapter 3 (``notebooks/03-lp-vs-ft.ipynb``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from .._validate import check_float, check_int, check_tensor
from ..repro import make_generator

__all__ = ["StyleShiftConfig", "StyleShiftWorld", "LabelledSample", "sample_worlds"]


@dataclass(frozen=True)
class StyleShiftConfig:
    """Parameters of :class:`StyleShiftWorld`; ``seed`` fixes the world.

    ``seed`` draws the style subspaces, the type means and the downstream rule.
    ``overlap_deg``: ``None`` for mutually orthogonal styles, or the angle
    :math:`a \\in [0, 90]` (degrees) of overlapping ones (module docstring).
    """

    dim_input: int = 64
    dim_content: int = 16
    n_styles: int = 4
    n_types: int = 128
    n_classes: int = 4
    type_spread: float = 1.5
    content_noise: float = 0.8
    input_noise: float = 0.0
    seed: int = 0
    overlap_deg: float | None = None

    def __post_init__(self):
        D = check_int("dim_input", self.dim_input, minimum=2)
        p = check_int("dim_content", self.dim_content, minimum=1)
        J = check_int("n_styles", self.n_styles, minimum=2)
        if J * p > D:
            raise ValueError(
                f"n_styles * dim_content must be <= dim_input, got {J} * {p} > {D}"
            )
        if self.overlap_deg is not None:
            check_float("overlap_deg", self.overlap_deg, minimum=0.0, maximum=90.0)
            if (J + 1) * p > D:
                raise ValueError(
                    "overlapping styles need (n_styles + 1) * dim_content <= "
                    f"dim_input, got ({J} + 1) * {p} > {D}"
                )
        check_int("n_types", self.n_types, minimum=2)
        check_int("n_classes", self.n_classes, minimum=2)
        check_float("type_spread", self.type_spread, minimum=0.0, strict_min=True)
        check_float("content_noise", self.content_noise, minimum=0.0)
        check_float("input_noise", self.input_noise, minimum=0.0)
        check_int("seed", self.seed, minimum=0)


@dataclass(frozen=True)
class LabelledSample:
    """Inputs ``x`` (n, D), float32; int64 ``types``, ``labels``, ``styles`` (n,)."""

    x: torch.Tensor
    types: torch.Tensor
    labels: torch.Tensor
    styles: torch.Tensor

    def __len__(self) -> int:
        return self.x.shape[0]


class StyleShiftWorld:
    """The distributions of the module docstring, with exact sampling."""

    def __init__(self, config: StyleShiftConfig = StyleShiftConfig()):
        if not isinstance(config, StyleShiftConfig):
            raise TypeError(
                f"config must be a StyleShiftConfig, got {type(config).__name__}"
            )
        self.config = c = config
        g = make_generator(c.seed)
        q, _ = torch.linalg.qr(
            torch.randn(c.dim_input, c.dim_input, generator=g, dtype=torch.float64)
        )
        p = c.dim_content
        if c.overlap_deg is None:
            frames = [q[:, j * p : (j + 1) * p] for j in range(c.n_styles)]
        else:  # R_j = cos(a) R_shared + sin(a) Q_j, R_shared the first p columns
            a = math.radians(c.overlap_deg)
            frames = [
                math.cos(a) * q[:, :p] + math.sin(a) * q[:, (j + 1) * p : (j + 2) * p]
                for j in range(c.n_styles)
            ]
        #: (J, D, p): style j renders content through render[j]
        self.render = torch.stack(frames)
        self._render_all = torch.cat(list(self.render), dim=1)  # (D, J * p)
        #: (K, p): the mean content of each object type
        self.type_means = c.type_spread * torch.randn(
            c.n_types, p, generator=g, dtype=torch.float64
        )
        #: (C, p): the downstream rule y = argmax_c (W z)_c
        self.rule = torch.randn(c.n_classes, p, generator=g, dtype=torch.float64)

    def sample(self, n: int, styles, generator: torch.Generator) -> LabelledSample:
        """Draw ``n`` examples, each with a style drawn uniformly from ``styles``.

        ``styles`` is a sequence of style indices; ``generator`` supplies every draw.
        """
        n = check_int("n", n, minimum=1)
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator, got {type(generator).__name__}"
            )
        styles = [
            check_int("styles", s, minimum=0, maximum=self.config.n_styles - 1)
            for s in styles
        ]
        if not styles:
            raise ValueError("styles must name at least one style")
        c = self.config
        pick = torch.randint(len(styles), (n,), generator=generator)
        style = torch.tensor(styles, dtype=torch.long)[pick]
        t = torch.randint(c.n_types, (n,), generator=generator)
        z = self.type_means[t] + c.content_noise * torch.randn(
            n, c.dim_content, generator=generator, dtype=torch.float64
        )
        # place z in its style's block of a (J * p)-vector, then render all blocks at
        # once: x = [R_0 ... R_{J-1}] (e_style ⊗ z) = R_style z
        blocks = torch.zeros(n, c.n_styles, c.dim_content, dtype=torch.float64)
        blocks[torch.arange(n), style] = z
        x = blocks.reshape(n, -1) @ self._render_all.T
        if c.input_noise > 0:
            x = x + c.input_noise * torch.randn(
                n, c.dim_input, generator=generator, dtype=torch.float64
            )
        y = (z @ self.rule.T).argmax(1)
        return LabelledSample(x=x.float(), types=t, labels=y, styles=style)

    def source(self, n: int, generator: torch.Generator) -> LabelledSample:
        """Pretraining data: every style."""
        return self.sample(n, range(self.config.n_styles), generator)

    def in_distribution(self, n: int, generator: torch.Generator) -> LabelledSample:
        """ID data: style 0."""
        return self.sample(n, (0,), generator)

    def out_of_distribution(self, n: int, generator: torch.Generator) -> LabelledSample:
        """OOD data: every style but 0."""
        return self.sample(n, range(1, self.config.n_styles), generator)

    def overlap(self) -> float:
        """:math:`\\cos^2(a)`: the factor by which :math:`R_0^\\top R_j` scales the
        content of an OOD input of style :math:`j` (0 for orthogonal styles).

        A change of the first layer learned on ID inputs reaches an OOD input scaled by
        this factor.
        """
        a = self.config.overlap_deg
        return 0.0 if a is None else math.cos(math.radians(a)) ** 2

    def style_coordinates(self, x: torch.Tensor) -> torch.Tensor:
        """The energy of each input in each style's subspace, ``(n, J)``.

        Entry :math:`(i, j)` is :math:`\\lVert R_j^\\top x_i\\rVert^2`.
        """
        x = check_tensor(
            "x", x, shape=(None, self.config.dim_input), floating=True
        ).double()
        return torch.einsum("jdp,nd->njp", self.render, x).pow(2).sum(-1)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"StyleShiftWorld(D={c.dim_input}, p={c.dim_content}, styles={c.n_styles}, "
            f"types={c.n_types}, classes={c.n_classes}, overlap={c.overlap_deg}, "
            f"seed={c.seed})"
        )


def sample_worlds(
    worlds: Sequence[StyleShiftWorld],
    n: int,
    styles,
    generators: Sequence[torch.Generator],
) -> LabelledSample:
    """``worlds[w].sample(n, styles, generators[w])`` for every world at once, stacked.

    The worlds must differ only in their seed and overlap angle (the same sizes and
    noise levels). Each world draws from its own generator exactly what
    :meth:`StyleShiftWorld.sample` draws, in the same order; the rest (the type means,
    the rendering, the rule) is done for all worlds in batched products, which give
    the same numbers as the worlds' own. Returns a :class:`LabelledSample` whose
    fields carry a leading world axis: ``x`` ``(W, n, D)``, the others ``(W, n)``.
    Chapter 3 pretrains the encoders of many worlds together on such batches.
    """
    worlds = list(worlds)
    generators = list(generators)
    if not worlds or not all(isinstance(w, StyleShiftWorld) for w in worlds):
        raise TypeError("worlds must be a non-empty sequence of StyleShiftWorld")
    if len(generators) != len(worlds):
        raise ValueError(
            f"generators must have one entry per world, got {len(generators)} and "
            f"{len(worlds)}"
        )
    if not all(isinstance(g, torch.Generator) for g in generators):
        raise TypeError("generators must be torch.Generator objects")
    c = worlds[0].config
    shape = replace(c, seed=0, overlap_deg=None)
    if any(replace(w.config, seed=0, overlap_deg=None) != shape for w in worlds):
        raise ValueError("worlds must differ only in their seed and overlap angle")
    n = check_int("n", n, minimum=1)
    styles = [check_int("styles", s, minimum=0, maximum=c.n_styles - 1) for s in styles]
    if not styles:
        raise ValueError("styles must name at least one style")
    W = len(worlds)
    picks, types, noise, input_noise = [], [], [], []
    for g in generators:  # each world's draws, in the order of sample()
        picks.append(torch.randint(len(styles), (n,), generator=g))
        types.append(torch.randint(c.n_types, (n,), generator=g))
        noise.append(torch.randn(n, c.dim_content, generator=g, dtype=torch.float64))
        if c.input_noise > 0:
            input_noise.append(
                torch.randn(n, c.dim_input, generator=g, dtype=torch.float64)
            )
    style = torch.tensor(styles, dtype=torch.long)[torch.stack(picks)]  # (W, n)
    t = torch.stack(types)
    rows = torch.arange(W)[:, None]
    means = torch.stack([w.type_means for w in worlds])  # (W, K, p)
    z = means[rows, t] + c.content_noise * torch.stack(noise)  # (W, n, p)
    blocks = torch.zeros(W, n, c.n_styles, c.dim_content, dtype=torch.float64)
    blocks[rows, torch.arange(n), style] = z
    render = torch.stack([w._render_all for w in worlds]).transpose(1, 2)
    x = torch.bmm(blocks.reshape(W, n, -1), render)  # (W, n, D)
    if c.input_noise > 0:
        x = x + c.input_noise * torch.stack(input_noise)
    rule = torch.stack([w.rule for w in worlds]).transpose(1, 2)  # (W, p, C)
    y = torch.bmm(z, rule).argmax(-1)
    return LabelledSample(x=x.float(), types=t, labels=y, styles=style)
