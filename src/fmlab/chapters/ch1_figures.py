"""The figures, tables, slider and run-dependent sentences of Chapter 1
(``notebooks/01-pretraining-and-adaptation.ipynb``), so that the chapter's cells hold
the experiment and not the drawing.

Figures are returned as matplotlib ``Figure``s, tables as :func:`fmlab.viz.table`
objects, sentences as ``IPython.display.Markdown`` for ``glue``. Nothing here computes a
quantity that a claim of the chapter decides: the claims are written out in the
notebook, from the result dataclasses of :mod:`fmlab.chapters.ch1_modular`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import Markdown
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from ..claims import SeedEffect
from ..data.latent import TwoViewConfig, TwoViewLatentModel
from ..viz import PALETTE, slider_figure, table
from .ch1_modular import (
    Chapter1Config,
    DecompositionSweep,
    FineTuning,
    Interface,
    Pretraining,
    Representations,
)

__all__ = [
    "loss_map",
    "two_view_world",
    "pretraining_losses",
    "representation_table",
    "tradeoff",
    "best_radius_table",
    "largest_n_table",
    "peak_sentence",
    "fine_tuning_table",
    "fine_tuning_verdict",
    "fine_tuning_summary",
    "fine_tuning_where",
    "interface_bound",
    "final_checkpoint_table",
    "ranking_sentence",
    "decomposition_slider",
]


def _models(cfg: Chapter1Config) -> list[str]:
    return [f"model {s}" for s in cfg.pretrain_seeds]


def _own_tasks(cfg: Chapter1Config) -> torch.Tensor:
    """Index in ``eval_tasks`` of each model's own task (its labelling seed is its
    pretraining seed)."""
    return torch.tensor([cfg.eval_tasks.index(s) for s in cfg.pretrain_seeds])


def loss_map():
    """Chapter 1's map of the four losses of the modular analysis and who studies what.

    The book's own drawing of the relations in Fig. 22 of Bommasani et al. (2021,
    section 4.10): empirical and population pretraining loss, minimal adaptation loss,
    and the downstream loss of the adapted model, with each arrow labelled by the
    chapters of this book that study it.
    """
    fig, ax = plt.subplots(figsize=(9.6, 5.4))
    ax.set(xlim=(0, 10), ylim=(-0.3, 6.3))
    ax.axis("off")
    top, bottom, left, right = 5.0, 1.0, 1.6, 8.0
    boxes = [
        (
            left,
            top,
            "empirical pretraining loss\n" r"$\widehat L_{pre}(\hat\theta_{FM})$",
        ),
        (right, top, "population pretraining loss\n" r"$L_{pre}(\hat\theta_{FM})$"),
        (
            right,
            bottom,
            "minimal adaptation loss\n" r"$L^\star_{adapt}(\hat\theta_{FM})$",
        ),
        (
            left,
            bottom,
            "downstream loss\n" r"$L_{adapt}(\gamma_{task},\hat\theta_{FM})$",
        ),
    ]
    colours = [PALETTE["sky"], PALETTE["sky"], PALETTE["orange"], PALETTE["orange"]]
    w, h = 3.0, 1.0
    for (x, y, text), colour in zip(boxes, colours):
        ax.add_patch(
            FancyBboxPatch(
                (x - w / 2, y - h / 2),
                w,
                h,
                boxstyle="round,pad=0.08",
                fc=colour,
                ec="black",
                alpha=0.35,
                lw=1.2,
            )
        )
        ax.text(x, y, text, ha="center", va="center", fontsize=10)

    def arrow(a, b, colour="black", ls="-", lw=1.6):
        ax.add_patch(
            FancyArrowPatch(
                a, b, arrowstyle="-|>", mutation_scale=16, color=colour, lw=lw, ls=ls
            )
        )

    def label(x, y, text, colour="black", ha="center"):
        ax.text(x, y, text, ha=ha, va="center", fontsize=8.5, color=colour)

    arrow((left + w / 2 + 0.1, top), (right - w / 2 - 0.1, top))
    label(
        (left + right) / 2,
        top + 0.75,
        "generalization of pretraining (standard theory)\n"
        "Ch. 5: which minimiser the optimizer picks",
    )
    arrow(
        (right, top - h / 2 - 0.1),
        (right, bottom + h / 2 + 0.1),
        PALETTE["red"],
        lw=2.8,
    )
    label(
        right - 0.2,
        (top + bottom) / 2,
        "the interface: a small $L_{pre}$ ⇒ a small $L^\\star_{adapt}$?\n"
        "Ch. 1: a bound in a latent-class world\n"
        "Ch. 2: contrastive theorems, where they break\n"
        "Ch. 5: same $L_{pre}$, different downstream",
        PALETTE["red"],
        ha="right",
    )
    arrow((right - w / 2 - 0.1, bottom), (left + w / 2 + 0.1, bottom))
    label(
        (left + right) / 2,
        bottom - 0.95,
        "+ generalization error of the adaptation\n"
        "Ch. 1: the decomposition (6)\n"
        "Ch. 3: linear probing vs fine-tuning\n"
        "Ch. 4: a kernel view of fine-tuning",
    )
    arrow(
        (left, top - h / 2 - 0.1), (left, bottom + h / 2 + 0.1), PALETTE["purple"], "--"
    )
    label(
        left + 0.15,
        (top + bottom) / 2,
        "in-context learning (Ch. 6):\nno adapted parameters,\noutside the framework",
        PALETTE["purple"],
        ha="left",
    )
    return fig


def two_view_world(config: TwoViewConfig, n: int = 1500, task: int = 0, seed: int = 0):
    """The two-view world of Chapter 1, drawn before its definitions: a hidden class
    emits a visible and a masked view (left); draws of the visible view, coloured by
    their hidden class (middle) and by the downstream label of one balanced labelling
    of the classes (right), on its first two coordinates."""
    world = TwoViewLatentModel(config)
    c, xa, _ = world.sample(n, torch.Generator().manual_seed(seed))
    y = world.task_signs(task)[c]
    fig, axes = plt.subplots(1, 3, figsize=(11.5, 3.8), width_ratios=(1.1, 1, 1))
    ax = axes[0]
    ax.set(xlim=(0, 10), ylim=(0, 10))
    ax.axis("off")
    nodes = {
        "c": (5.0, 8.3, f"hidden class $c$\n(one of {config.n_classes})"),
        "a": (2.2, 2.6, f"visible view $x_A$\n({config.dim_a} numbers)"),
        "b": (7.8, 2.6, f"masked view $x_B$\n({config.dim_b} numbers)"),
    }
    for x, yy, text in nodes.values():
        ax.text(
            x,
            yy,
            text,
            ha="center",
            va="center",
            fontsize=10,
            bbox=dict(boxstyle="round,pad=0.4", fc="white", ec=PALETTE["blue"]),
        )
    for end in ("a", "b"):
        ax.add_patch(
            FancyArrowPatch(
                (nodes["c"][0], nodes["c"][1] - 0.9),
                (nodes[end][0], nodes[end][1] + 0.9),
                arrowstyle="-|>",
                mutation_scale=14,
                color="0.3",
            )
        )
    ax.add_patch(
        FancyArrowPatch(
            (3.7, 1.9),
            (6.3, 1.9),
            arrowstyle="-|>",
            mutation_scale=14,
            linestyle="--",
            color=PALETTE["orange"],
        )
    )
    ax.text(
        5.0,
        0.9,
        "pretraining: predict $x_B$ from $x_A$",
        ha="center",
        fontsize=9,
        color=PALETTE["orange"],
    )
    ax.set_title("the world")
    pts = xa[:, :2].numpy()
    axes[1].scatter(pts[:, 0], pts[:, 1], c=c.numpy(), cmap="tab20", s=6, alpha=0.7)
    axes[1].set_title("$x_A$ by hidden class")
    for label, colour in ((1, PALETTE["blue"]), (-1, PALETTE["orange"])):
        keep = (y == label).numpy()
        axes[2].scatter(
            pts[keep, 0],
            pts[keep, 1],
            s=6,
            alpha=0.7,
            color=colour,
            label=f"$y={label:+d}$",
        )
    axes[2].set_title("$x_A$ by task label $y=s_c$")
    axes[2].legend(loc="upper right", fontsize=8, markerscale=2)
    for ax in axes[1:]:
        ax.set(xlabel="first coordinate of $x_A$", ylabel="second coordinate")
    fig.tight_layout()
    return fig


def pretraining_losses(pre: Pretraining, cfg: Chapter1Config, every: int = 25):
    """Mini-batch pretraining loss (means over windows of ``every`` steps) against the
    Bayes loss; the legend gives each model's population loss."""
    fig, ax = plt.subplots()
    every = min(every, pre.losses.shape[1])
    for s, losses, pop in zip(cfg.pretrain_seeds, pre.losses, pre.population_loss):
        smooth = losses.unfold(0, every, every).mean(1)
        ax.plot(
            torch.arange(len(smooth)) * every + every // 2,
            smooth,
            label=f"model {s}: training loss (population {pop:.4f})",
        )
    ax.axhline(
        pre.bayes_loss,
        color=PALETTE["black"],
        ls="--",
        label=f"best possible (Bayes) loss {pre.bayes_loss:.4f}",
    )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="pretraining step",
        ylabel=r"$\ell_{pre}$ (mini-batch)",
        title="Pretraining by masked-view prediction",
    )
    ax.legend()
    return fig


def representation_table(rep: Representations, cfg: Chapter1Config):
    """Excess minimal adaptation loss per representation (rows) and model (columns)."""
    per_model = rep.excess.mean(-1)  # (model, representation): mean over the tasks
    rows = [
        {"representation": name, **dict(zip(_models(cfg), per_model[:, j]))}
        for j, name in enumerate(rep.names)
    ]
    return table(
        rows,
        caption="L*_adapt − L_Bayes (c0 = ∞), mean over ten tasks; Bayes task loss "
        f"L_Bayes {rep.bayes_task_loss.min():.3f} to {rep.bayes_task_loss.max():.3f}",
    )


def tradeoff(dec: DecompositionSweep, shown=(0, 2, 5)):
    """L*, generalization error (± s.e. over models x samples) and L(gamma_task)
    against c0, one panel for each n in ``dec.ns[i]``, ``i`` in ``shown``."""
    Lstar_c0 = dec.minimal_loss[:, 0, :, 0].mean(0)  # L* depends on model and c0 only
    ge_pool = dec.generalization_error.mean(-1).mean(0)  # (n, c0)
    L_pool = dec.adapted_loss.mean(-1).mean(0)
    pooled = dec.generalization_error.permute(1, 2, 0, 3).flatten(2)
    ge_se = pooled.std(-1) / pooled.shape[-1] ** 0.5
    fig, axes = plt.subplots(1, len(shown), figsize=(12, 3.4), sharey=True)
    for ax, i in zip(axes, shown):
        ax.plot(
            dec.c0s, Lstar_c0, "o-", color=PALETTE["blue"], label=r"$L^\star_{adapt}$"
        )
        ax.errorbar(
            dec.c0s,
            ge_pool[i],
            yerr=ge_se[i],
            fmt="s-",
            color=PALETTE["orange"],
            label="generalization error",
        )
        ax.plot(
            dec.c0s,
            L_pool[i],
            "^-",
            color=PALETTE["black"],
            label=r"$L_{adapt}(\gamma_{task})$",
        )
        ax.set(
            xscale="log",
            yscale="log",
            xlabel=r"constraint radius $c_0$",
            title=f"n = {dec.ns[i]}",
        )
        ax.set_xticks(dec.c0s, [f"{c:g}" for c in dec.c0s])
        ax.minorticks_off()
    axes[0].set_ylabel(f"loss (mean over {pooled.shape[-1]} samples)")
    axes[0].legend()
    return fig


def best_radius_table(dec: DecompositionSweep, best: torch.Tensor, cfg: Chapter1Config):
    """The radius with the smallest mean downstream loss, per model and n."""
    rows = [
        {
            "": f"model {s}",
            **{f"n={n}": f"{dec.c0s[int(k)]:g}" for n, k in zip(dec.ns, row)},
        }
        for s, row in zip(cfg.pretrain_seeds, best)
    ]
    return table(rows, caption="radius with the smallest mean L(γ_task)", digits=3)


def largest_n_table(dec: DecompositionSweep, inactive: int):
    """Mean generalization error over c0 at the largest n."""
    ge = dec.generalization_error[:, -1]  # (model, c0, sample)
    return table(
        {"c0": [f"{c:g}" for c in dec.c0s], "mean GE": ge.mean(-1).mean(0)},
        caption=f"n = {dec.ns[-1]}; the probes at c0 = {dec.c0s[-2]:g} and "
        f"{dec.c0s[-1]:g} coincide (constraint inactive) in {inactive} of "
        f"{ge[:, -1].numel()} samples",
        digits=4,
    )


def peak_sentence(ge_last: torch.Tensor, c0s) -> Markdown:
    """Where the mean generalization error at the largest n peaks over the radii."""
    peak = int(ge_last.argmax())
    return Markdown(
        f"in this run the mean error is largest at $c_0={c0s[peak]:g}$"
        + (", a moderate radius" if 0 < peak < len(c0s) - 1 else "")
        + f", only {ge_last.max() / ge_last.min():.1f} times its smallest "
        "value over the grid"
    )


def fine_tuning_table(ft: FineTuning):
    """Mean population losses of the two probes and of fine-tuning, per n."""
    rows = [
        {
            "n": n,
            "probe, c0 = ∞": ft.free_probe[:, b].mean(),
            "probe, best c0": ft.best_probe[:, b].mean(),
            "best c0": f"{c0:g}",
            "fine-tuning": ft.fine_tuned[:, b].mean(),
        }
        for b, (n, c0) in enumerate(zip(ft.ns, ft.best_c0))
    ]
    k = ft.fine_tuned.shape
    return table(
        rows, caption=f"population losses, means over {k[0]} models × {k[2]} samples"
    )


def _probe_minus_ft(ft: FineTuning, n: int) -> torch.Tensor:
    b = ft.ns.index(n)
    return ft.best_probe[:, b].mean(-1) - ft.fine_tuned[:, b].mean(-1)


def fine_tuning_verdict(ft: FineTuning, n: int) -> Markdown:
    """A sentence on the best-radius probe against fine-tuning at ``n`` (no claim): how
    many samples fine-tuning wins, and whether the difference is clear (every model
    agrees, the mean well outside its standard error); the numbers are in
    :func:`fine_tuning_table`."""
    b = ft.ns.index(n)
    diff = _probe_minus_ft(ft, n)  # > 0: fine-tuning better
    eff = SeedEffect.of(diff)
    wins = int((ft.best_probe[:, b] > ft.fine_tuned[:, b]).sum())
    if eff.holds(direction=">"):
        side = "clearly in favour of fine-tuning"
    elif eff.holds(direction="<"):
        side = "clearly in favour of the probe"
    else:
        side = "too close to call"
    return Markdown(
        f"at $n={n}$ fine-tuning has the lower loss on {wins} of "
        f"{ft.best_probe[:, b].numel()} samples, {side}"
    )


def fine_tuning_summary(ft: FineTuning, ns=(64, 256)) -> Markdown:
    """Whether the probe-vs-fine-tuning difference is clear (every model agrees, the
    mean well outside its standard error) at any of ``ns``, said as a result."""
    clears = [
        n
        for n in ns
        if any(SeedEffect.of(_probe_minus_ft(ft, n)).holds(direction=d) for d in "<>")
    ]
    return Markdown(
        "So this run shows neither that fine-tuning beats a well-constrained probe nor "
        "the reverse."
        if not clears
        else "So in this run one method is clearly better at "
        + " and ".join(f"$n={n}$" for n in clears)
        + ", but with other seeds the difference shrinks into the spread between "
        "models: neither method is established as the better one."
    )


def fine_tuning_where(
    ft: FineTuning, rep: Representations, cfg: Chapter1Config, n: int = 64
) -> Markdown:
    """Is fine-tuning's advantage at ``n`` largest for the model whose pretrained
    representation has the largest excess L* on its own task?"""
    own = _own_tasks(cfg)
    worst = int(rep.excess[:, -1][torch.arange(len(own)), own].argmax())
    gap = _probe_minus_ft(ft, n)
    return Markdown(
        "In this run the model with the largest $L^\\star_{\\text{adapt}}$ on its task "
        f"is model {cfg.pretrain_seeds[worst]}, and fine-tuning's advantage at $n={n}$ "
        "is " + ("largest" if int(gap.argmax()) == worst else "not largest") + " there."
    )


def interface_bound(itf: Interface, bayes_task_loss: torch.Tensor, cfg: Chapter1Config):
    """Left: both sides of the interface bound along pretraining, each model on its own
    task; right: every (model, checkpoint, task) triple against the line left = right,
    with the trivial guarantee of the head gamma = 0."""
    lhs, rhs = itf.excess_minimal_loss, itf.bound
    trivial = 1.0 - bayes_task_loss
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 3.6), layout="constrained")
    for a, (s, colour) in enumerate(zip(cfg.pretrain_seeds, PALETTE.values())):
        x, t = itf.excess_pretraining_loss[a], cfg.eval_tasks.index(s)
        axes[0].plot(x, lhs[a, :, t], "o-", color=colour, ms=4)
        axes[0].plot(x, rhs[a, :, t], "--", color=colour)
    axes[0].set(
        xscale="log",
        yscale="log",
        xlabel=r"$L_{pre}-L^{Bayes}_{pre}$",
        ylabel=r"$L^\star_{adapt}-L^{Bayes}_{task}$",
        title="Along pretraining (each model on its own task)",
    )
    # the left panel's legend below the panels, where it covers no curve: the models
    # by colour, the two sides of the bound by line style
    black = PALETTE["black"]
    handles = [
        Line2D([], [], color=colour, label=f"model {s}")
        for s, colour in zip(cfg.pretrain_seeds, PALETTE.values())
    ] + [
        Line2D([], [], color=black, marker="o", ms=4, label="actual (left)"),
        Line2D([], [], color=black, ls="--", label="bound (left)"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles))
    axes[1].scatter(rhs.flatten(), lhs.flatten(), s=6, alpha=0.5, color=PALETTE["blue"])
    lim = (float(lhs.min()) * 0.5, float(rhs.max()) * 2)
    axes[1].plot(lim, lim, color=PALETTE["black"], lw=1, label="left = right")
    axes[1].axvline(
        float(trivial.max()),
        color=PALETTE["red"],
        ls=":",
        label=r"trivial: $1-L^{Bayes}_{task}$",
    )
    axes[1].set(
        xscale="log",
        yscale="log",
        xlim=lim,
        ylim=lim,
        xlabel=r"bound $\kappa_s(L_{pre}-L^{Bayes}_{pre})$",
        ylabel=r"actual $L^\star_{adapt}-L^{Bayes}_{task}$",
        title="All checkpoints, models and tasks",
    )
    axes[1].legend(fontsize=8)
    return fig


def _final_rows(pre: Pretraining, itf: Interface, cfg: Chapter1Config) -> dict:
    own, arange = _own_tasks(cfg), torch.arange(len(cfg.pretrain_seeds))
    final_lhs = itf.excess_minimal_loss[:, -1]
    return {
        "L_pre": torch.tensor(pre.population_loss),
        "L_pre − Bayes": itf.excess_pretraining_loss[:, -1],
        "excess L*, mean of 10 tasks": final_lhs.mean(-1),
        "excess L*, own task": final_lhs[arange, own],
        "κ_s of own task": itf.constant[own],
        "bound, own task": itf.bound[:, -1][arange, own],
    }


def final_checkpoint_table(pre: Pretraining, itf: Interface, cfg: Chapter1Config):
    """Pretraining loss, excess L* and the bound after pretraining, per model."""
    rows = [
        {"final checkpoint": name, **dict(zip(_models(cfg), vals))}
        for name, vals in _final_rows(pre, itf, cfg).items()
    ]
    return table(rows, digits=4)


def ranking_sentence(pre: Pretraining, itf: Interface, cfg: Chapter1Config) -> Markdown:
    """Whether the pretraining loss and the mean excess L* rank the models alike, and
    whether, each on its own task, the actual excess and the bound do, said in words
    (the orders themselves are in :func:`final_checkpoint_table`)."""
    rows = _final_rows(pre, itf, cfg)

    def order(v):
        return ", ".join(str(cfg.pretrain_seeds[int(i)]) for i in torch.argsort(v))

    by_pre, by_mean = (
        order(rows["L_pre − Bayes"]),
        order(rows["excess L*, mean of 10 tasks"]),
    )
    by_own, by_bound = (
        order(rows["excess L*, own task"]),
        order(rows["bound, own task"]),
    )
    pre_vs_mean = "the same way" if by_pre == by_mean else "differently"
    own_vs_bound = "the same way" if by_own == by_bound else "differently"
    return Markdown(
        "The pretraining loss and the mean excess $L^\\star_{\\text{adapt}}$ over the "
        f"ten tasks rank the models {pre_vs_mean}; each on its own task (as in "
        "the decomposition experiment), the actual excess and the bound "
        "$\\kappa_s(L_{\\text{pre}}-L^{\\text{Bayes}}_{\\text{pre}})$ rank them "
        f"{own_vs_bound} (the table above gives every model's numbers)."
    )


def decomposition_slider(dec: DecompositionSweep, initial: int = 2):
    """A slider over n: the three curves over c0 (means over models and samples), and
    the bound L* + generalization error beside the actual loss at every radius."""
    c0s = dec.c0s
    Lstar_c0 = dec.minimal_loss[:, 0, :, 0].mean(0).numpy()
    ge_pool = dec.generalization_error.mean(-1).mean(0).numpy()
    L_pool = dec.adapted_loss.mean(-1).mean(0).numpy()

    def render(n):
        i = dec.ns.index(n)
        fig, (ax1, ax2) = plt.subplots(
            1,
            2,
            figsize=(8.5, 3.3),
            gridspec_kw={"width_ratios": [1.3, 1]},
            layout="constrained",
        )
        ax1.plot(c0s, Lstar_c0, "o-", color=PALETTE["blue"], label=r"$L^\star_{adapt}$")
        ax1.plot(
            c0s, ge_pool[i], "s-", color=PALETTE["orange"], label="generalization error"
        )
        ax1.plot(
            c0s,
            L_pool[i],
            "^-",
            color=PALETTE["black"],
            label=r"$L_{adapt}(\gamma_{task})$",
        )
        ax1.set(
            xscale="log",
            yscale="log",
            ylim=(3e-3, 12),
            xlabel="$c_0$",
            title=f"n = {n}",
        )
        ax1.set_xticks(c0s, [f"{c:g}" for c in c0s])
        ax1.minorticks_off()
        x = np.arange(len(c0s), dtype=float)
        ge = np.maximum(ge_pool[i], 0)
        ax2.bar(x - 0.2, Lstar_c0, width=0.4, color=PALETTE["blue"], label=r"$L^\star$")
        ax2.bar(
            x - 0.2,
            ge,
            width=0.4,
            bottom=Lstar_c0,
            color=PALETTE["orange"],
            label="gen. error",
        )
        ax2.bar(
            x + 0.2,
            L_pool[i],
            width=0.4,
            color=PALETTE["black"],
            label=r"$L(\gamma_{task})$",
        )
        ax2.set(
            xticks=x,
            xticklabels=[f"{c:g}" for c in c0s],
            ylim=(0, 1.6),
            xlabel="$c_0$",
            title="bound (left bar) and actual loss (right bar)",
        )
        # one legend for both panels (the same colours), below them, at the same place
        # in every frame of the slider
        fig.legend(
            handles=ax1.get_lines(), loc="outside lower center", ncol=3, fontsize=9
        )
        return fig

    return slider_figure(
        render, {"n": list(dec.ns)}, labels={"n": "task size n"}, initial={"n": initial}
    )
