"""The figures, tables and slider of Chapter 2 (``notebooks/02-interface.ipynb``), so
that the chapter's cells hold the experiment and not the drawing. Every function
returns a matplotlib ``Figure``, an :func:`fmlab.viz.table` or a slider; none of them
computes anything the chapter claims."""

from __future__ import annotations

from dataclasses import replace

import matplotlib.pyplot as plt
import torch
from matplotlib.lines import Line2D

from ..data.contrastive import ManifoldConfig, MixtureOfManifolds
from ..theory.contrastive import spectral_minimizer
from ..viz import PALETTE, slider_figure, table
from .ch2_interface import (
    TRAINED,
    LatentClassesResult,
    SameLossResult,
    SweepConfig,
    SweepResult,
    TrainedEncodersResult,
)

__all__ = [
    "slow_and_fast_functions",
    "prose_connectivity",
    "plot_latent_class_training",
    "slack_table",
    "plot_slack",
    "hinge_table",
    "plot_connectivity_sweep",
    "render_sweep_state",
    "sweep_slider",
    "plot_trained_spectral",
    "trained_encoders_table",
    "loss_table",
    "same_loss_table",
    "plot_probe_predictions",
    "prose_latent_classes",
    "prose_trained_encoders",
    "prose_same_loss",
]

#: The colours of classes and seeds, in order.
COLORS = list(PALETTE.values())


def _check(name: str, value, cls) -> None:
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be a {cls.__name__}, got {type(value).__name__}")


def _sci(v: float) -> str:
    return f"{float(v):.1e}"


# --------------------------------------------------------------------------------------
# Part I
# --------------------------------------------------------------------------------------
def plot_latent_class_training(result: LatentClassesResult):
    """Part I's figure: the latent classes, both sides of the bound and the best head
    along training, and the interface plot :math:`L^{\\mu}_{\\text{sup}}` vs
    :math:`L_{\\text{un}}`.

    One legend below the panels gives the seeds (colours, shared by both plots) and
    the line styles, so that no legend covers an axis."""
    _check("result", result, LatentClassesResult)
    r = result
    tau, ell0 = r.tau, r.ell0
    fig, axes = plt.subplots(
        1,
        3,
        figsize=(8.5, 3.7),
        gridspec_kw={"width_ratios": [0.8, 1.1, 1.1]},
        layout="constrained",
    )
    for c in range(r.class_probs.numel()):
        pts = r.points[r.labels == c]
        axes[0].scatter(pts[:, 0], pts[:, 1], s=4, color=COLORS[c % len(COLORS)])
    axes[0].set(title="Latent classes (input space)", aspect="equal")
    axes[0].axis("off")
    st = r.steps.clamp_min(1)
    for i in range(len(r.seeds)):
        col = COLORS[i % len(COLORS)]
        axes[1].plot(st, r.bound[i], "o-", color=col, ms=3)
        axes[1].plot(st, r.mean_classifier[i], "s--", color=col, ms=3, alpha=0.8)
        axes[1].plot(st, r.best_head[i], "^:", color=col, ms=3, alpha=0.8)
    axes[1].axhline(ell0, color=PALETTE["black"], lw=1, ls="-.")
    axes[1].set(
        xscale="log",
        yscale="log",
        xlabel="pretraining step (0 shown at 1)",
        ylabel="population loss",
        title="The chain along training",
    )
    hi = float(r.unsupervised.max()) * 1.05
    xs = torch.linspace(tau * ell0, hi, 50)
    axes[2].axvspan(0, tau * ell0, color=PALETTE["red"], alpha=0.12)
    axes[2].text(
        0.03,
        0.97,
        r"$L_{un}<\tau\ell(0)$" "\nimpossible",
        transform=axes[2].transAxes,
        va="top",
    )
    axes[2].plot(xs, (xs - tau * ell0) / (1 - tau), color=PALETTE["black"])
    for i in range(len(r.seeds)):
        axes[2].plot(
            r.unsupervised[i], r.mean_classifier[i], "o", color=COLORS[i % len(COLORS)]
        )
    axes[2].set(
        xlabel=r"pretraining loss $L_{un}(f)$",
        ylabel=r"$L^\mu_{sup}(f)$",
        xlim=(0, hi),
        ylim=(0, None),
        title=r"The interface: $L^\mu_{sup}\leq g(L_{un})$",
    )
    # one legend for both plots: the seeds by colour, the quantities by line style
    _legend_below(
        fig,
        [f"seed {s}" for s in r.seeds],
        [
            dict(marker="o", label="bound (middle)"),
            dict(marker="s", ls="--", label=r"$L^\mu_{sup}$ (mean classifier)"),
            dict(marker="^", ls=":", label=r"$L^\star_{adapt}$ (best head)"),
            dict(lw=1, ls="-.", label=r"$\ell(0)$"),
            dict(label="g (right)"),
            dict(marker="o", ls="", label="checkpoint (right)"),
        ],
        ncol=4,
        marker="o",
    )
    return fig


def _legend_below(fig, colours, styles, *, ncol, marker=None):
    """One legend under the panels (room reserved by the constrained layout): an entry
    per colour of the palette, labelled by ``colours``, then one per line style, each a
    dict of :class:`~matplotlib.lines.Line2D` keywords drawn in black unless it names
    its colour."""
    handles = [
        Line2D([], [], color=COLORS[i % len(COLORS)], marker=marker, ms=4, label=lab)
        for i, lab in enumerate(colours)
    ] + [Line2D([], [], **{"color": PALETTE["black"], "ms": 4, **st}) for st in styles]
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol)


def slack_table(result: LatentClassesResult):
    """The two steps between Arora et al.'s bound and :math:`L^\\star_{\\text{adapt}}`,
    and the spread that controls the first, at every (seed, checkpoint)."""
    _check("result", result, LatentClassesResult)
    r = result
    rows = [
        {
            "seed": s,
            "step": int(t),
            "spread s(f)": r.spread[i, j],
            "Jensen step": r.bound[i, j] - r.mean_classifier[i, j],
            "its bound": r.jensen_bound[i, j],
            "mean-classifier step": r.mean_classifier[i, j] - r.best_head[i, j],
        }
        for i, s in enumerate(r.seeds)
        for j, t in enumerate(r.steps)
    ]
    caption = (
        "Where the bound loses: the Jensen step bound − L^μ_sup, its bound (the middle "
        "term of ch2-eq-slack) and the mean-classifier step L^μ_sup − L*_adapt"
    )
    return table(rows, caption=caption, digits=4)


def plot_slack(result: LatentClassesResult):
    """:func:`slack_table` drawn as the lines it is: left, the two steps between
    Arora et al.'s bound and :math:`L^\\star_{\\text{adapt}}` along training (the
    Jensen step beside its bound, the middle term of ch2-eq-slack, and the
    mean-classifier step); right, the within-class spread that controls the Jensen
    step. One line per seed, in the colours of :func:`plot_latent_class_training`."""
    _check("result", result, LatentClassesResult)
    r = result
    st = r.steps.clamp_min(1)
    jensen = r.bound - r.mean_classifier
    head = r.mean_classifier - r.best_head
    fig, axes = plt.subplots(
        1,
        2,
        figsize=(8.5, 3.6),
        gridspec_kw={"width_ratios": [1.4, 1]},
        layout="constrained",
    )
    for i in range(len(r.seeds)):
        col = COLORS[i % len(COLORS)]
        axes[0].plot(st, jensen[i], "o-", color=col, ms=3)
        axes[0].plot(st, r.jensen_bound[i], "--", color=col, lw=1.2, alpha=0.8)
        axes[0].plot(st, head[i], "^:", color=col, ms=3)
        axes[1].plot(st, r.spread[i], "o-", color=col, ms=3)
    axes[0].set(
        xscale="log",
        yscale="log",
        xlabel="pretraining step (0 shown at 1)",
        ylabel="loss difference",
        title="Where the bound loses",
    )
    axes[1].set(
        xscale="log",
        yscale="log",
        xlabel="pretraining step (0 shown at 1)",
        ylabel="spread $s(f)$",
        title="Within-class spread",
    )
    _legend_below(
        fig,
        [f"seed {s}" for s in r.seeds],
        [
            dict(marker="o", label=r"Jensen step: bound $-\,L^\mu_{sup}$"),
            dict(lw=1.2, ls="--", label="bound on the Jensen step"),
            dict(
                marker="^",
                ls=":",
                label=r"mean-classifier step: $L^\mu_{sup}-L^\star_{adapt}$",
            ),
        ],
        ncol=3,
    )
    return fig


def hinge_table(seeds, hinge, logistic):
    """Exercise: Arora et al.'s terms for the hinge loss beside the logistic slack, per
    seed (``hinge`` and ``logistic`` are lists of
    :class:`~fmlab.theory.contrastive.CurlTerms`)."""
    rows = [
        {
            "seed": s,
            "hinge L_un": h.unsupervised,
            "τ": h.tau,
            "hinge L^μ_sup": _sci(h.mean_classifier),
            "hinge bound": _sci(h.bound),
            "hinge slack": _sci(h.slack),
            "logistic slack": _sci(lg.slack),
        }
        for s, h, lg in zip(seeds, hinge, logistic)
    ]
    return table(rows, caption="Hinge and logistic loss, pretrained encoders", digits=6)


# --------------------------------------------------------------------------------------
# Part II
# --------------------------------------------------------------------------------------
def plot_connectivity_sweep(sweep: SweepResult, trivial: float):
    """Part II's figure: :math:`L^\\star_{\\text{adapt}}` of the minimiser and the
    guarantee over the grid, what the two knobs do to the graph, and a heat map.

    One legend below the panels gives the separations (colours, shared by both line
    plots) and the lines, so that no legend covers a curve."""
    _check("sweep", sweep, SweepResult)
    L, B = sweep.minimal_adaptation_loss, sweep.bound
    fig, axes = plt.subplots(
        1,
        3,
        figsize=(8.5, 3.6),
        layout="constrained",
        gridspec_kw={"width_ratios": [1.25, 1.1, 1]},
    )
    for j, sep in enumerate(sweep.separations):
        col = COLORS[j % len(COLORS)]
        axes[0].plot(sweep.along_stds, L[:, j], "o-", color=col, ms=4)
        axes[0].plot(sweep.along_stds, B[:, j].clamp_max(10), ":", color=col)
    axes[0].axhline(trivial, color=PALETTE["black"], lw=1, ls="--")
    axes[0].set(
        xscale="log",
        yscale="log",
        ylim=(1e-4, 12),
        xlabel=r"augmentation along the manifold $\sigma$",
        ylabel=r"$L^\star_{adapt}(f^\star)$ (solid), $\phi/\lambda_{k+1}$ (dotted)",
        title="Better within-class connectivity",
    )
    axes[1].plot(
        sweep.along_stds,
        sweep.lambda_next[:, 0],
        "o-",
        color=PALETTE["blue"],
        ms=4,
    )
    for j, sep in enumerate(sweep.separations):
        axes[1].plot(
            sweep.along_stds,
            sweep.leakage[:, j],
            "s--",
            color=COLORS[j % len(COLORS)],
            alpha=0.8,
            ms=4,
        )
    axes[1].set(
        xscale="log",
        yscale="log",
        xlabel=r"$\sigma$",
        title="What the knobs do to the graph",
    )
    im = axes[2].imshow(
        L.T.clamp_min(1e-6).log10(), origin="lower", aspect="auto", cmap="viridis"
    )
    axes[2].set(
        xticks=range(len(sweep.along_stds)),
        xticklabels=sweep.along_stds,
        yticks=range(len(sweep.separations)),
        yticklabels=sweep.separations,
        xlabel=r"$\sigma$",
        ylabel="separation",
        title=r"$\log_{10} L^\star_{adapt}(f^\star)$",
    )
    axes[2].grid(False)
    fig.colorbar(im, ax=axes[2])
    # one legend for both line plots: the separations by colour, the curves by style
    _legend_below(
        fig,
        [f"separation {sep}" for sep in sweep.separations],
        [
            dict(lw=1, ls="--", label="constant predictor (left)"),
            dict(
                color=PALETTE["blue"], marker="o", label=r"gap $\lambda_{k+1}$ (middle)"
            ),
            dict(marker="s", ls="--", label=r"leakage $\phi$ (middle)"),
        ],
        ncol=4,
    )
    return fig


def _rayleigh(weights: torch.Tensor, h: torch.Tensor) -> float:
    """How fast ``h`` varies across the edges of the graph, per unit of its mass:
    half the sum of w(x, x')(h(x) − h(x'))² over the sum of w_x h(x)²."""
    diff = (h[:, None] - h[None, :]).pow(2)
    return float(0.5 * (weights * diff).sum() / (weights.sum(1) * h.pow(2)).sum())


WAVES = ManifoldConfig(points_per_class=16, separation=2.1, along_std=0.6)


def slow_and_fast_functions(world: ManifoldConfig = WAVES, k: int = 3):
    """Part II's picture before the probe's guarantee: on the augmentation graph of a
    small ``world`` (by default three circles of 16 views with strong augmentations),
    the graph itself (edges drawn by weight), a class's indicator, the slowest
    non-constant eigenfunction and the (k+1)-th, each titled with its Rayleigh quotient
    (an eigenfunction's quotient is its eigenvalue λ_i of the normalised Laplacian)."""
    _check("world", world, ManifoldConfig)
    graph = MixtureOfManifolds(world).augmentation_graph()
    W, pts = graph.weights, graph.points.numpy()
    wx = W.sum(1)
    nu, u = torch.linalg.eigh(W / torch.sqrt(wx[:, None] * wx[None, :]))
    order = nu.argsort(descending=True)
    h = u[:, order] / wx.sqrt()[:, None]  # eigenfunctions D^{-1/2} u_i, slowest first
    label = (graph.labels == 0).double() - (graph.labels == 0).double().mean()
    shown = [
        ("class 1 against the rest", label, _rayleigh(W, label)),
        ("2nd eigenfunction", h[:, 1], 1 - float(nu[order[1]])),
        (
            f"eigenfunction {k + 1} ($\\lambda_{{k+1}}$)",
            h[:, k],
            1 - float(nu[order[k]]),
        ),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(12.0, 3.3))
    ax = axes[0]
    strong = (W > 0.02 * W.max()).nonzero().tolist()
    for i, j in strong:
        if i < j:
            ax.plot(*pts[[i, j]].T, color="0.6", lw=0.4 + 2 * float(W[i, j] / W.max()))
    for c in range(int(graph.labels.max()) + 1):
        m = (graph.labels == c).numpy()
        ax.scatter(pts[m, 0], pts[m, 1], s=14, color=COLORS[c], zorder=3)
    ax.set_title("the graph (points: classes)")
    for ax, (name, f, q) in zip(axes[1:], shown):
        lim = float(f.abs().max())
        ax.scatter(
            pts[:, 0],
            pts[:, 1],
            c=f.numpy(),
            cmap="coolwarm",
            s=14,
            vmin=-lim,
            vmax=lim,
        )
        ax.set_title(f"{name}\nRayleigh quotient {q:.3f}")
    for ax in axes:
        ax.set(aspect="equal", xticks=[], yticks=[])
        ax.grid(False)
    fig.tight_layout()
    return fig


def render_sweep_state(base: ManifoldConfig, s: float, sep: float, k: int, title: str):
    """One state of Part II's slider: the circles coloured by :math:`f^\\star_2`, and
    the representation (coordinates 2 and 3, i.e. :math:`D^{1/2}f^\\star`) coloured by
    class."""
    _check("base", base, ManifoldConfig)
    graph = MixtureOfManifolds(replace(base, along_std=s, separation=sep))
    G = graph.augmentation_graph()
    fstar = spectral_minimizer(G.weights, k).features * G.marginal.sqrt()[:, None]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(7.6, 3.0))
    a1.scatter(
        G.points[:, 0].numpy(),
        G.points[:, 1].numpy(),
        c=fstar[:, 1].numpy(),
        cmap="coolwarm",
        s=9,
    )
    a1.set(
        aspect="equal", title=rf"$\sigma$ = {s}, separation {sep}: colour = $f^\star_2$"
    )
    a1.axis("off")
    for c in range(base.n_classes):
        m = G.labels == c
        a2.scatter(fstar[m, 1].numpy(), fstar[m, 2].numpy(), s=9, color=COLORS[c])
    a2.set(
        xticks=[], yticks=[], xlabel="coordinate 2", ylabel="coordinate 3", title=title
    )
    a2.grid(False)
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.1, top=0.9, wspace=0.15)
    return fig


def sweep_slider(cfg: SweepConfig, sweep: SweepResult):
    """Part II's slider: :func:`render_sweep_state` at every augmentation strength and
    every other separation of the sweep, titled with the cell's
    :math:`L^\\star_{\\text{adapt}}` and guarantee."""
    _check("cfg", cfg, SweepConfig)
    _check("sweep", sweep, SweepResult)
    L, B = sweep.minimal_adaptation_loss, sweep.bound

    def render(s, sep):
        i, j = cfg.along_stds.index(s), cfg.separations.index(sep)
        title = (
            rf"$L^\star_{{adapt}}$ = {L[i, j]:.3f}, bound {min(B[i, j].item(), 99):.2f}"
        )
        return render_sweep_state(cfg.base, s, sep, cfg.k, title)

    with plt.rc_context({"savefig.bbox": "standard"}):  # the figures set their margins
        return slider_figure(
            render,
            {"s": list(cfg.along_stds), "sep": list(cfg.separations[::2])},
            labels={"s": "augmentation σ", "sep": "separation"},
            initial={"s": 1, "sep": 1},
        )


def plot_trained_spectral(
    result: TrainedEncodersResult, exact_bound: float, minimiser_loss: float, trivial
):
    """Part II's trained encoders: :math:`L^\\star_{\\text{adapt}}(f_t)` and the
    guarantee for approximate minimisers along training (one line per seed), beside
    the guarantee :math:`\\phi/\\lambda_{k+1}` of exact minimisers."""
    _check("result", result, TrainedEncodersResult)
    adapt, bound = result.adapt, result.guarantee
    x = result.steps.clamp_min(1)
    fig, ax = plt.subplots(figsize=(8.2, 3.6))
    for i in range(adapt.shape[0]):
        col = COLORS[i % len(COLORS)]
        ax.plot(
            x, adapt[i], "o-", color=col, ms=4, label=f"$L^\\star_{{adapt}}$, seed {i}"
        )
        ax.plot(x, bound[i], "s--", color=col, ms=4, alpha=0.8)
    ax.plot([], [], "k--s", ms=4, label="guarantee for approx. minimisers")
    ax.axhline(exact_bound, color=PALETTE["red"], lw=1.2, label=r"$\phi/\lambda_{k+1}$")
    ax.axhline(minimiser_loss, color=PALETTE["black"], lw=1, ls=":", label="$f^\\star$")
    ax.axhline(trivial, color=PALETTE["black"], lw=1, ls="--", label="constant")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="pretraining step (0 shown at 1)",
        ylabel="squared loss of the best probe",
        title="Trained MLP encoders vs the guarantees",
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def trained_encoders_table(result: TrainedEncodersResult, k: int):
    """The excess loss, :math:`L^\\star_{\\text{adapt}}` and the guarantee for
    approximate minimisers at every (seed, checkpoint), under a caption with the
    graph's leakage and spectrum."""
    _check("result", result, TrainedEncodersResult)
    r, nu = result, result.minimiser.eigenvalues
    rows = [
        {
            "seed": i,
            "step": int(t),
            "excess ε": _sci(r.excess[i, j]),
            "L*_adapt(f_t)": r.adapt[i, j],
            "guarantee (ch2-eq-approx-bound)": r.guarantee[i, j],
        }
        for i in range(r.adapt.shape[0])
        for j, t in enumerate(r.steps)
    ]
    caption = (
        f"φ = {r.leakage:.4f}, λ_(k+1) = {1 - nu[k]:.4f}, "
        f"ν_k² − ν_(k+1)² = {nu[k - 1] ** 2 - nu[k] ** 2:.4f}"
    )
    return table(rows, caption=caption, digits=4)


def loss_table(pretraining: dict, adaptation: dict):
    """Exercise: the pretraining and minimal adaptation loss of named
    representations."""
    rows = [
        {"representation": n, "L_spec": pretraining[n], "L*_adapt": adaptation[n]}
        for n in pretraining
    ]
    return table(rows, digits=6)


# --------------------------------------------------------------------------------------
# Part III
# --------------------------------------------------------------------------------------
def same_loss_table(result: SameLossResult):
    """Every representation of Part III and its image under :math:`\\pi`: excess
    pretraining loss, pretraining loss, probe loss and error."""
    _check("result", result, SameLossResult)
    lam, m = result.laplacian, result.n_arcs
    rows = [
        {
            "representation": name,
            "seed": result.seeds[i] if name in TRAINED else "",
            "ε": _sci(e.excess),
            "L_pre(f)": f"{e.loss:.5f}",
            "L_pre(f∘π)": f"{e.loss_pi:.5f}",
            "L*(f)": e.probe.mse,
            "L*(f∘π)": e.probe_pi.mse,
            "err(f)": e.probe.error,
            "err(f∘π)": e.probe_pi.error,
        }
        for name, evals in result.evaluations.items()
        for i, e in enumerate(evals)
    ]
    caption = (
        f"zero Laplacian eigenvalues: {int((lam < 1e-10).sum())}; "
        f"λ_{m + 1} = {lam[m]:.3f}; minimum of L_spec: {result.minimum:.4f}"
    )
    return table(rows, caption=caption, digits=3)


def plot_probe_predictions(result: SameLossResult, seed_index: int = 0):
    """Part III's figure: the probe's predicted class at every point, for the labels
    and each kind of representation (one seed)."""
    _check("result", result, SameLossResult)
    ev = {name: result.evaluations[name][seed_index] for name in TRAINED}
    panels = [
        ("labels y(x)", result.graph.labels),
        ("probe on MLP f", ev["MLP"].probe.prediction),
        ("probe on MLP f∘π", ev["MLP"].probe_pi.prediction),
        ("probe on lookup table", ev["lookup table"].probe.prediction),
        ("MLP, scrambled fit", ev["MLP, scrambled fit"].probe.prediction),
    ]
    points = result.graph.points
    fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels), 3.0))
    for ax, (name, lab) in zip(list(axes), panels):
        ax.scatter(points[:, 0], points[:, 1], c=[COLORS[int(c)] for c in lab], s=6)
        ax.set_title(name, fontsize=9)
        ax.set(aspect="equal")
        ax.axis("off")
    fig.suptitle(
        "Same pretraining loss, different downstream: the probe's predicted class "
        f"(seed {result.seeds[seed_index]})",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


# --------------------------------------------------------------------------------------
# the numbers the prose quotes (glued into the page; none decides a claim)
# --------------------------------------------------------------------------------------
def prose_latent_classes(result: LatentClassesResult) -> dict[str, str]:
    """Part I's numbers in the text: means over seeds at the start and the end of
    pretraining, formatted as the text quotes them."""
    _check("result", result, LatentClassesResult)
    bound, mean_clf, best = result.bound, result.mean_classifier, result.best_head
    slack, spread = bound - mean_clf, result.spread
    return {
        "ch2_seeds1": f"{bound.shape[0]}",
        "ch2_checks1": f"{bound.numel()}",
        "ch2_final_bound": f"{bound[:, -1].mean():.4f}",
        "ch2_final_mc": f"{mean_clf[:, -1].mean():.4f}",
        "ch2_final_best": f"{best[:, -1].mean():.4f}",
        "ch2_start_bound": f"{bound[:, 0].mean():.2f}",
        "ch2_drop_factor": f"{(bound[:, 0] / bound[:, -1]).mean():.0f}",
        "ch2_raw_error": f"{result.raw_probe_error:.0%}",
        # the worst seed's error; "none" when every seed's probe is exact
        "ch2_probe_error": (
            "none"
            if result.probe_error[:, -1].max() == 0
            else f"at most {result.probe_error[:, -1].max():.1%}"
        ),
        "ch2_spread_factor": f"{(spread[:, 0] / spread[:, -1]).mean():.1f}",
        "ch2_slack_end": f"{slack[:, -1].mean():.4f}",
        "ch2_mc_step_end": f"{(mean_clf - best)[:, -1].mean():.4f}",
        "ch2_best_ratio": f"{(best / mean_clf)[:, -1].mean():.2f}",
        "ch2_jensen_ratio": f"{(slack / result.jensen_bound)[:, -1].mean():.2f}",
    }


def prose_connectivity(
    result: SweepResult, trivial: float, config: SweepConfig
) -> dict[str, str]:
    """Part II's numbers in the text about the connectivity sweep: in how many grid
    cells the guarantee is informative (below ``trivial``), and the grid's sizes."""
    _check("result", result, SweepResult)
    _check("config", config, SweepConfig)
    bound = result.bound
    return {
        "ch2_informative": f"{int((bound < trivial).sum())} of {bound.numel()}",
        "ch2_cells": f"{bound.numel()}",
        "ch2_points": f"{config.base.n_classes * config.base.points_per_class}",
    }


def prose_trained_encoders(
    result: TrainedEncodersResult, exact_bound: float, minimiser_loss: float
) -> dict[str, str]:
    """Part II's numbers in the text about trained encoders."""
    _check("result", result, TrainedEncodersResult)
    adapt = result.adapt
    return {
        "ch2_seeds2": f"{adapt.shape[0]}",
        "ch2_checkpoints2": f"{adapt.shape[1]}",
        "ch2_exact_bound2": f"{exact_bound:.3f}",
        "ch2_adapt2_start": f"{adapt[:, 0].mean():.3f}",
        "ch2_adapt2_end": f"{adapt[:, -1].mean():.3f}",
        "ch2_star_loss2": f"{minimiser_loss:.3f}",
        "ch2_guarantee_end": f"{result.guarantee[:, -1].mean():.3f}",
        "ch2_excess_end": f"{result.excess[:, -1].max():.1e}",
    }


def prose_same_loss(result: SameLossResult) -> dict[str, str]:
    """Part III's numbers in the text: the largest excess loss of each kind of
    representation and the mean probe losses over seeds."""
    _check("result", result, SameLossResult)
    out = {
        f"ch2_eps_{key}": f"{max(e.excess for e in result.evaluations[name]):.1e}"
        for name, key in zip(TRAINED, ("mlp", "table", "fit"))
    }
    out["ch2_seeds3"] = f"{len(result.evaluations['MLP'])}"
    out["ch2_mlp_L"] = f"{result.probe_losses('MLP').mean():.3f}"
    out["ch2_mlp_Lpi"] = f"{result.probe_losses('MLP', composed=True).mean():.3f}"
    out["ch2_tab_L"] = f"{result.probe_losses('lookup table').mean():.3f}"
    out["ch2_fit_L"] = f"{result.probe_losses('MLP, scrambled fit').mean():.3f}"
    return out
