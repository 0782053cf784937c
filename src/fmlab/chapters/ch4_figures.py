"""The figures, tables and sliders of Chapter 4 (``notebooks/04-kernel-view.ipynb`` and
``notebooks/04b-natural-tasks-and-lora.ipynb``), so that the chapter's cells hold the
experiment and not the drawing. Every function returns a matplotlib ``Figure``, a table
(:func:`fmlab.viz.table`) or a slider figure; none of them computes anything the chapter
claims."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.ticker import NullLocator

from ..viz import PALETTE, Tables, slider_figure, table

__all__ = [
    "two_regimes",
    "plot_two_regimes",
    "plot_pretraining",
    "plot_signgd_step",
    "plot_kernel_accuracies",
    "plot_laziness",
    "plot_width",
    "plot_lora_errors",
    "render_lora_rank",
    "render_learning_rate",
    "few_shot_table",
    "accuracies",
    "laziness_table",
    "laziness",
    "linearization_slider",
    "lora_rank_slider",
    "width_table",
    "width_stored_text",
    "timing_table",
    "malladi_table",
    "two_worlds",
    "two_worlds_table",
    "two_worlds_text",
    "cv_head_table",
    "cv_head_text",
]

#: Colours of the methods, the same in every figure of the chapter.
COLORS = {
    ("prompt", "SGD-FT"): PALETTE["blue"],
    ("prompt", "K-SGD"): PALETTE["sky"],
    ("prompt", "Adam-FT"): PALETTE["green"],
    ("prompt", "K-A-SignGD"): PALETTE["yellow"],
    ("prompt", "LoRA-SGD-FT"): PALETTE["purple"],
    ("standard", "LP"): PALETTE["black"],
    ("standard", "SGD-FT"): PALETTE["red"],
    ("standard", "K-SGD"): PALETTE["orange"],
    ("bag of words", "LR"): "#999999",
}


def two_regimes(
    starts=((3.0, 1.5), (0.0, 1.0)), lr: float = 1.0, steps: int = 30
) -> list[dict]:
    """A toy of the two regimes of fine-tuning: the model f(θ) = θ₁θ₂ (θ₁ a head, θ₂
    the feature it reads) fine-tuned by gradient descent at rate ``lr`` on one example
    x = 1, y = +1 with the logistic loss, from each start in ``starts``.

    Per start, along the run (t = 0..steps): the parameters ``theta`` (t, 2), the
    output ``f``, its linearization at the start ``f_lin`` = f₀ + ⟨∇f(θ₀), θ_t − θ₀⟩,
    the output derivative ``chi`` = −σ(−f), and ``rel_error``, the last step's
    |f − f_lin| / |f − f₀|. Since f is bilinear, f − f_lin = (θ₁−θ₁⁰)(θ₂−θ₂⁰) exactly:
    the gap is the second-order term, the part of the change a kernel cannot make."""
    out = []
    for start in starts:
        th0 = np.asarray(start, dtype=float)
        theta = np.empty((steps + 1, 2))
        theta[0] = th0
        for t in range(steps):
            a, b = theta[t]
            chi = -1.0 / (1.0 + np.exp(a * b))  # ∂ℓ/∂f at y = +1
            theta[t + 1] = theta[t] - lr * chi * np.array([b, a])
        f = theta[:, 0] * theta[:, 1]
        f_lin = f[0] + (theta - th0) @ np.array([th0[1], th0[0]])
        out.append(
            {
                "start": tuple(start),
                "theta": theta,
                "f": f,
                "f_lin": f_lin,
                "chi": -1.0 / (1.0 + np.exp(f)),
                "rel_error": float(abs(f[-1] - f_lin[-1]) / abs(f[-1] - f[0])),
            }
        )
    return out


def plot_two_regimes(lr: float = 1.0, steps: int = 30):
    """:func:`two_regimes` drawn: left, the paths of θ across the contours of f;
    right, the change of f against the change of its linearization along the run."""
    lazy, rich = two_regimes(lr=lr, steps=steps)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(8.0, 3.4))
    grid = np.linspace(-0.2, 3.8, 200)
    a, b = np.meshgrid(grid, grid)
    levels = [1, 2, 3, 4.5, 6]
    cs = ax0.contour(a, b, a * b, levels=levels, colors="#bbbbbb")
    # labels along θ₂ = 3.2, clear of the title, the paths and the legend
    ax0.clabel(cs, fontsize=7, fmt="f = %g", manual=[(v / 3.2, 3.2) for v in levels])
    runs = (
        (lazy, PALETTE["blue"], "confident start"),
        (rich, PALETTE["red"], "undecided start"),
    )
    for run, color, name in runs:
        th, f, f_lin = run["theta"], run["f"], run["f_lin"]
        label = f"{name}, |χ₀| = {abs(run['chi'][0]):.3f}".rstrip("0").rstrip(".")
        ax0.plot(th[:, 0], th[:, 1], ".-", color=color, ms=3, lw=1, label=label)
        ax0.plot(*th[0], "o", color=color, ms=6, mfc="white")
        ax1.plot(f_lin - f[0], f - f[0], ".-", color=color, ms=3, lw=1, label=label)
    top = max(float(r["f"][-1] - r["f"][0]) for r in (lazy, rich))
    lazy_line = r"$f = f_{\rm lin}$ (lazy)"
    ax1.plot([0, top], [0, top], "--", color="#999999", lw=1, label=lazy_line)
    ax0.set(
        xlabel=r"$\theta_1$ (the head)",
        ylabel=r"$\theta_2$ (the feature)",
        xlim=(-0.2, 3.8),
        ylim=(-0.2, 3.8),
        title="the parameters along training",
    )
    ax1.set(
        xlabel=r"$f_{\rm lin} - f_0$ (linearization)",
        ylabel=r"$f - f_0$ (the model)",
        title="the output along training",
    )
    for ax in (ax0, ax1):
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_pretraining(losses: torch.Tensor, every: int = 50):
    """The masked-LM loss of pretraining, averaged over windows of ``every`` steps."""
    fig, ax = plt.subplots(figsize=(5.5, 3.0))
    n = len(losses) // every * every
    smooth = losses[:n].reshape(-1, every).mean(1)
    ax.plot(np.arange(len(smooth)) * every + every / 2, smooth, color=PALETTE["blue"])
    ax.set(
        xlabel="pretraining step",
        ylabel="masked-LM loss (mini-batch)",
        title="Pretraining the masked LM",
    )
    fig.tight_layout()
    return fig


def plot_signgd_step(checks, step_lrs, entk_resid, shown: int = 2):
    """Left: predicted vs actual change of f for one SignGD step (learning rate
    ``step_lrs[shown]``); right: the relative error against the step size."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8.5, 3.4), layout="constrained")
    c0 = checks[0]
    ax1.scatter(
        c0.predicted[shown].numpy(), c0.actual[shown].numpy(), s=10, c=PALETTE["blue"]
    )
    lim = float(c0.predicted[shown].abs().max()) * 1.1
    ax1.plot([-lim, lim], [-lim, lim], color=PALETTE["black"], lw=1)
    ax1.set(
        xlabel=r"predicted $-\eta\,\mathrm{sign}(\chi)\,K^{(A\text{-}SignGD)}(x, x_t)$",
        ylabel=r"actual $f_{t+1}(x) - f_t(x)$",
        title=rf"one SignGD step, $\eta$ = {step_lrs[shown]:g}",
    )
    ax1.locator_params(axis="x", nbins=5)  # room between the tick labels
    for i, c in enumerate(checks):
        ax2.loglog(
            step_lrs,
            c.rel_error,
            "o-",
            color=PALETTE["blue"],
            label="A-SignGD kernel" if i == 0 else None,
        )
        ax2.loglog(
            step_lrs,
            entk_resid[i],
            "s--",
            color=PALETTE["orange"],
            label="best multiple of the eNTK column" if i == 0 else None,
        )
    ax2.set(
        xlabel=r"step size $\eta$",
        ylabel="relative error of the prediction",
        title=f"{len(checks)} training examples",
    )
    # the right panel's legend below the panels, where it covers no line
    fig.legend(*ax2.get_legend_handles_labels(), loc="outside lower center", ncol=2)
    return fig


def plot_kernel_accuracies(acc: dict, shots, bars, references: dict):
    """Bars of mean test accuracy (error bars: standard error over seeds) for each
    (setting, method) in ``bars`` and each k in ``shots``; ``references`` maps a label
    to a vertical line (e.g. the zero-shot prompt, the Bayes-optimal accuracy).

    The bars are horizontal, one panel per k, so that every method's name is written
    once, in full, beside its bar; a method not run at some k is marked there."""
    bars = list(bars)
    # one row per method, top to bottom, with a gap between settings
    rows, y = [], 0.0
    for i, (setting, _) in enumerate(bars):
        if i and setting != bars[i - 1][0]:
            y += 0.5
        rows.append(y)
        y += 1
    fig, axes = plt.subplots(
        1,
        len(shots),
        figsize=(8.5, 0.22 * y + 1.6),
        sharey=True,
        layout="constrained",
    )
    fig.get_layout_engine().set(wspace=0.06)
    axes = np.atleast_1d(axes)
    styles = iter([("--", PALETTE["black"]), (":", PALETTE["black"])])
    lines = {label: next(styles) for label in references}
    for ax, k in zip(axes, shots):
        runs = 0
        for row, (setting, method) in zip(rows, bars):
            if (setting, method, k) not in acc:
                ax.text(0.42, row, "not run", va="center", color="#777777")
                continue
            v = np.asarray(acc[(setting, method, k)])
            se = v.std(ddof=1) / np.sqrt(len(v))
            ax.barh(
                row,
                v.mean(),
                xerr=se,
                height=0.8,
                color=COLORS[(setting, method)],
                capsize=2,
            )
            runs = len(v)
        handles = [
            ax.axvline(
                value, color=lines[label][1], ls=lines[label][0], lw=1, label=label
            )
            for label, value in references.items()
        ]
        ax.set(
            xlim=(0.4, 1.0),
            xticks=(0.4, 0.6, 0.8, 1.0),
            xlabel="test accuracy",
            title=f"k = {k} per class\n({runs} seeds)",
        )
        ax.grid(axis="y", visible=False)
        ax.tick_params(axis="y", length=0)
    axes[0].set_yticks(rows, [f"{s} {m}" for s, m in bars])
    axes[0].invert_yaxis()
    if references:
        fig.legend(handles=handles, loc="outside lower center", ncol=len(references))
    return fig


def plot_laziness(by_lr: dict, shots, lr_scales_by_k: dict):
    """Linearization error and kernel change against the learning-rate scale c, per k,
    for both settings (mean over seeds; error bars: standard error)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    markers = dict(zip(shots, ("o", "s", "^", "D")))
    grid = sorted({float(c) for k in shots for c in lr_scales_by_k[k]})
    for setting, color in (("prompt", PALETTE["blue"]), ("standard", PALETTE["red"])):
        for k in shots:
            cs = lr_scales_by_k[k]
            for ax, m in zip(axes, ("lin_error", "kernel_change")):
                v = np.asarray(by_lr[(setting, k)][m], dtype=float)
                mean = np.nanmean(v, 0)
                se = np.nanstd(v, 0, ddof=1) / np.sqrt(v.shape[0])
                ax.errorbar(
                    cs,
                    mean,
                    yerr=se,
                    marker=markers[k],
                    color=color,
                    capsize=2,
                    label=f"{setting}, k = {k}",
                )
    for ax, title in zip(
        axes,
        (
            r"linearization error $\|f_{FT}-f_{lin}\|/\|f_{FT}-f_0\|$",
            r"kernel change $\|K_{FT}-K_0\|_F/\|K_0\|_F$",
        ),
    ):
        ax.set(
            xscale="log",
            yscale="log",
            xlabel=r"learning-rate scale $c$ ($\eta = c/\bar K$)",
            title=title,
        )
        ax.title.set_fontsize(9)
        # the grid's scales as plain numbers, not 6×10⁻¹ and 2×10⁰
        ax.set_xticks(grid, [f"{c:g}" for c in grid])
        ax.xaxis.set_minor_locator(NullLocator())
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    return fig


def plot_width(stats: dict, widths, floors: dict):
    """Mean |chi| at the start of prompt-based fine-tuning against width, one dot per
    pretraining seed, with horizontal reference floors."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
    for i, w in enumerate(widths):
        for ax, key in ((ax1, "chi"), (ax2, "accuracy")):
            vals = stats[(key, w)]
            ax.scatter([i] * len(vals), vals, color=PALETTE["blue"])
            ax.plot([i - 0.15, i + 0.15], [np.mean(vals)] * 2, color=PALETTE["blue"])
    styles = iter(["--", ":"])
    for label, value in floors.items():
        ax1.axhline(value, color=PALETTE["black"], ls=next(styles), lw=1, label=label)
    for ax, ylabel in (
        (ax1, r"mean $|\chi|$ at $\theta_0$"),
        (ax2, "zero-shot accuracy"),
    ):
        ax.set(
            xlim=(-0.5, len(widths) - 0.5),
            xticks=range(len(widths)),
            xticklabels=[str(w) for w in widths],
            xlabel="width d",
            ylabel=ylabel,
        )
    ax1.legend(fontsize=7)
    ax1.set_title("Output derivative before fine-tuning", fontsize=10)
    ax2.set_title("The prompt, zero-shot", fontsize=10)
    fig.tight_layout()
    return fig


def plot_lora_errors(ranks, err_mean, err_sd, slope):
    """The relative error of the LoRA kernel against the rank, with a 1/sqrt(k) line."""
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ax.errorbar(
        ranks,
        err_mean,
        yerr=err_sd,
        fmt="o-",
        color=PALETTE["purple"],
        capsize=3,
        label="LoRA kernel error (mean, sd over projections)",
    )
    ax.plot(
        ranks,
        err_mean[0] / np.sqrt(np.asarray(ranks) / ranks[0]),
        "--",
        color=PALETTE["black"],
        lw=1,
        label=r"$\propto 1/\sqrt{k}$",
    )
    ax.set(
        xscale="log",
        yscale="log",
        xticks=ranks,
        xticklabels=[str(r) for r in ranks],
        xlabel="LoRA rank k",
        ylabel=r"$\|K_{LoRA}-K\|_F/\|K\|_F$",
        title=f"Kernel distortion vs rank (fitted slope {slope:.2f})",
    )
    ax.minorticks_off()
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def render_lora_rank(rank, k_full, examples, ranks, err_mean, err_sd):
    """One state of the LoRA-rank slider: LoRA kernel entries against the full ones."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.3))
    kl = examples[rank]
    top = float(max(k_full.max(), kl.max())) * 1.05
    bottom = float(min(k_full.min(), kl.min(), 0))
    ax1.scatter(
        k_full.flatten().numpy(), kl.flatten().numpy(), s=4, color=PALETTE["purple"]
    )
    ax1.plot([bottom, top], [bottom, top], color=PALETTE["black"], lw=1)
    ax1.set(
        xlim=(bottom, top),
        ylim=(bottom, top),
        xlabel=r"$K(x_i, x_j)$",
        ylabel=r"$K_{LoRA}(x_i, x_j)$",
        title=f"rank k = {rank}",
    )
    ax2.errorbar(
        ranks, err_mean, yerr=err_sd, fmt="o-", color=PALETTE["purple"], capsize=3
    )
    i = list(ranks).index(rank)
    ax2.plot([rank], [err_mean[i]], "o", ms=12, mfc="none", mec=PALETTE["red"], mew=2)
    ax2.set(
        xscale="log",
        yscale="log",
        xticks=ranks,
        xticklabels=[str(r) for r in ranks],
        xlabel="rank k",
        ylabel="relative kernel error",
    )
    ax2.minorticks_off()
    fig.tight_layout()
    return fig


def render_learning_rate(index, examples, lr_scales, f_lim):
    """One state of the learning-rate slider: f_FT against its linearization f_lin on
    the test set, for both settings, at ``lr_scales[index]``."""
    fig, ax = plt.subplots(figsize=(5.0, 3.6))
    for setting, color in (("prompt", PALETTE["blue"]), ("standard", PALETTE["red"])):
        ex = examples[setting]
        ax.scatter(
            ex["f_lin"][index].numpy(),
            ex["f_ft"][index].numpy(),
            s=5,
            color=color,
            alpha=0.6,
            label=setting,
        )
    ax.plot([-f_lim, f_lim], [-f_lim, f_lim], color=PALETTE["black"], lw=1)
    ax.set(
        xlim=(-f_lim, f_lim),
        ylim=(-f_lim, f_lim),
        xlabel=r"linearized model $f_{lin}(x)$",
        ylabel=r"fine-tuned $f_{FT}(x)$",
        title=f"c = {lr_scales[index]:g}",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# -- tables and sliders of the chapter's pages
# -----------------------------------------------


def _pct(v) -> str:
    """Mean and standard error over runs, in accuracy points."""
    v = 100 * np.asarray(v, dtype=float)
    return f"{v.mean():.1f} ± {v.std(ddof=1) / np.sqrt(len(v)):.1f}"


#: The rows of the accuracy table, in order.
TABLE_METHODS = (
    ("prompt", "zero-shot"),
    ("prompt", "SGD-FT"),
    ("prompt", "K-SGD"),
    ("prompt", "Adam-FT"),
    ("prompt", "K-A-SignGD"),
    ("prompt", "K-SignGD"),
    ("prompt", "LoRA-SGD-FT"),
    ("prompt", "SGD-FT, wide grid"),
    ("prompt", "SGD-FT, fixed c"),
    ("prompt", "K-SGD, same steps"),
    ("prompt", "K-SGD, analog ridge"),
    ("prompt", "Adam-FT, fixed lr"),
    ("prompt", "K-A-SignGD, analog ridge"),
    ("prompt", "SignGD-FT, batch 1"),
    ("prompt", "K-A-SignGD, same steps"),
    ("standard", "LP"),
    ("standard", "SGD-FT"),
    ("standard", "SGD-FT, wide grid"),
    ("standard", "K-SGD"),
    ("standard", "SGD-FT, fixed c"),
    ("standard", "K-SGD, same steps"),
    ("bag of words", "LR"),
)

#: The bars of :func:`plot_kernel_accuracies`, in order.
BARS = (
    ("prompt", "SGD-FT"),
    ("prompt", "K-SGD"),
    ("prompt", "Adam-FT"),
    ("prompt", "K-A-SignGD"),
    ("prompt", "LoRA-SGD-FT"),
    ("standard", "LP"),
    ("standard", "SGD-FT"),
    ("standard", "K-SGD"),
    ("bag of words", "LR"),
)


def few_shot_table(runs, bayes_accuracy: float):
    """Test accuracy of every method, mean ± standard error over runs, per k
    (``runs``: a :class:`~fmlab.chapters.ch4_fewshot.FewShotRuns`)."""
    acc = runs.accuracy
    rows = [
        {"setting": setting, "method": method}
        | {
            f"k = {k}": _pct(acc[(setting, method, k)])
            if (setting, method, k) in acc
            else "–"
            for k in runs.shots
        }
        for setting, method in TABLE_METHODS
    ]
    caption = (
        "Test accuracy (%), mean ± standard error over runs ("
        + ", ".join(f"{len(c.seeds)} at k = {c.shots[0]}" for c in runs.configs)
        + f"); Bayes-optimal {100 * bayes_accuracy:.1f}%"
    )
    return table(rows, caption=caption)


def accuracies(runs, zero_shot: float, bayes_accuracy: float):
    """:func:`plot_kernel_accuracies` of the chapter's methods, with the zero-shot
    prompt and the Bayes-optimal accuracy as reference lines."""
    return plot_kernel_accuracies(
        runs.accuracy,
        runs.shots,
        BARS,
        {"prompt, zero-shot": zero_shot, "Bayes-optimal": bayes_accuracy},
    )


def laziness_table(runs):
    """The kernel-behaviour measures of the runs validation chose, mean over runs."""
    measures = {
        "acc. f0": "acc0",
        "acc. f_FT": "acc_ft",
        "acc. f_lin": "acc_lin",
        "linearization error": "lin_error",
        "kernel change": "kernel_change",
    }
    rows = [
        {"setting": setting, "optimizer": opt, "k": k}
        | {
            name: f"{np.nanmean(runs.dynamics[(setting, opt, k)][m]):.3f}"
            for name, m in measures.items()
        }
        for setting, opt in (("prompt", "SGD"), ("prompt", "Adam"), ("standard", "SGD"))
        for k in runs.shots
        if (setting, opt, k) in runs.dynamics
    ]
    return table(
        rows,
        caption="Kernel behaviour of the runs chosen on validation data, mean over "
        "runs",
    )


def matched_table(runs, k: int = 16, c: float = 1.0):
    """Per setting at ``k``: the output derivative and the head's share of the eNTK's
    trace before the first step, and the kernel-behaviour measures of the SGD run at
    the same learning-rate scale ``c`` (mean ± standard error over runs)."""

    def pm(v, f="{:.3f}"):
        v = np.asarray(v, dtype=float)
        se = v.std(ddof=1) / np.sqrt(len(v))
        return f"{f.format(v.mean())} ± {f.format(se)}"

    rows = []
    for setting in ("prompt", "standard"):
        start = runs.dynamics[(setting, "start", k)]
        rows.append(
            {
                "setting": setting,
                "mean |χ| on the training set": pm(start["chi_train"]),
                "head's share of tr K": pm(100 * start["head_share"], "{:.1f}") + "%",
                f"linearization error (c = {c:g})": pm(
                    runs.at_scale(setting, "lin_error", k, c)
                ),
                f"kernel change (c = {c:g})": pm(
                    runs.at_scale(setting, "kernel_change", k, c)
                ),
            }
        )
    return table(
        rows,
        caption=f"Before the first step, and after T steps at the scale c = {c:g}, "
        f"k = {k} (mean ± standard error over runs)",
    )


def laziness(runs):
    """:func:`plot_laziness` of the whole learning-rate grid."""
    return plot_laziness(runs.by_lr, runs.shots, runs.lr_scales)


def linearization_slider(runs, k: int = 16):
    """The SGD runs of the first run at ``k``, prompt-based and standard, for every
    learning-rate scale of the grid: :func:`render_learning_rate` under a slider."""
    example, lr_scales = runs.examples[k], runs.lr_scales[k]
    f_lim = 1.05 * max(
        float(torch.cat([ex["f_ft"].flatten(), ex["f_lin"].flatten()]).abs().max())
        for ex in example.values()
    )
    return slider_figure(
        lambda c: render_learning_rate(lr_scales.index(c), example, lr_scales, f_lim),
        {"c": list(lr_scales)},
        labels={"c": "learning rate c"},
        initial={"c": 1},
    )


def lora_rank_slider(lora, ranks, err_mean, err_sd):
    """:func:`render_lora_rank` under a slider over the ranks (``lora``: a
    :class:`~fmlab.chapters.ch4_kernel_view.LoRAKernel`)."""
    return slider_figure(
        lambda rank: render_lora_rank(
            rank, lora.errors.k_full, lora.errors.examples, ranks, err_mean, err_sd
        ),
        {"rank": list(ranks)},
        labels={"rank": "LoRA rank k"},
        initial={"rank": 3},
    )


def width_table(width_stats: dict, widths, floor: float):
    """Zero-shot accuracy and mean |chi| of each pretrained model, per width and
    seed, beside the paper's base-vs-large comparison."""
    rows = [
        {
            "width": str(w),
            "zero-shot accuracy, per seed": ", ".join(
                f"{a:.3f}" for a in width_stats[("accuracy", w)]
            ),
            "mean |χ|, per seed": ", ".join(
                f"{c:.3f}" for c in width_stats[("chi", w)]
            ),
            "mean |χ|": f"{np.mean(width_stats[('chi', w)]):.3f}",
        }
        for w in widths
    ]
    return table(
        rows,
        caption=f"The prompt at θ0, per pretraining seed; floor of mean |χ| (the Bayes "
        f"posterior) {floor:.3f}; paper, base vs large: 0.32 vs 0.32 (SST-2), 0.32 vs "
        "0.25 (MR)",
    )


def width_stored_text(width_stats: dict) -> str:
    """How page 04b's pretrainings were obtained, for its prose: from the ``"stored"``
    record that :func:`~.ch4_kernel_view.width_test` adds when it reads the stored run
    (with the run's ``"wall_seconds"``), or computed here when there is none."""
    from .. import stored

    record = width_stats.get("stored")
    if record is None:
        return "at this configuration or seed offset they were computed here"
    first = stored.origin(record)
    return (
        f"they took {record['wall_seconds'] / 60:.1f} minutes of one CPU core "
        f"({first['machine']}, torch {first['torch']}, run on "
        f"{first['written'][:10]})"
    )


def timing_table(bench: dict):
    """CPU times of the three ways to the eNTK's Jacobian and of the Gram product
    (from :func:`fmlab.theory.kernels.time_entk`), behind the sign ⏱."""
    names = {
        "jacobian_torch_func": "Jacobian by torch.func vmap(jacrev)",
        "jacobian_loop": "Jacobian by a per-example loop",
        "jacobian_batched": "Jacobian by batched backward + einsum",
        "gram": "Gram product J Jᵀ",
    }
    rows = [
        {"step": label, "CPU time, best of 3": f"⏱ {1000 * bench[k]:.1f} ms"}
        for k, label in names.items()
    ]
    return table(
        rows,
        caption=f"eNTK of {bench['n']} sentences, {bench['parameters']:,} parameters",
    )


def malladi_table(runs, zero_shot: float, n_params: int, d_model: int):
    """The paper's SST-2 numbers (%, 16 / 64 shots per class) beside this chapter's
    (%, mean over runs, k = 4 / 16 / 64)."""
    acc, dyn = runs.accuracy, runs.dynamics

    def row(setting, method):
        return " / ".join(
            f"{100 * acc[(setting, method, k)].mean():.1f}"
            if (setting, method, k) in acc
            else "–"
            for k in runs.shots
        )

    lin = dyn[("prompt", "SGD", 16)]
    rows = [
        ("zero-shot prompt", "79.0", f"{100 * zero_shot:.1f}"),
        ("prompt-based SGD-FT", "89.0 / 89.7", row("prompt", "SGD-FT")),
        ("prompt-based eNTK K(SGD)", "88.3 / 89.2", row("prompt", "K-SGD")),
        ("prompt-based Adam-FT", "88.3 / 89.3", row("prompt", "Adam-FT")),
        ("K(A-SignGD)", "88.3 / 89.1", row("prompt", "K-A-SignGD")),
        ("SGD-LoRA-FT", "89.1 (16 shots)", row("prompt", "LoRA-SGD-FT")),
        (
            "standard SGD-FT (paper: from a linear probe; here: a fresh head)",
            "79.7 / 85.6",
            row("standard", "SGD-FT"),
        ),
        ("standard linear probe", "–", row("standard", "LP")),
        ("standard eNTK", "62.3 / 77.7", row("standard", "K-SGD")),
        ("bag of words", "–", row("bag of words", "LR")),
        (
            "Linearization, prompt SGD-FT, 16 shots: Taylor vs FT",
            "87.5 vs 88.3 (Adam)",
            f"{100 * np.nanmean(lin['acc_lin']):.1f} vs "
            f"{100 * np.nanmean(lin['acc_ft']):.1f}",
        ),
        (
            "Fixed Features: kernel change, prompt SGD-FT, 16 / 64",
            "0.1–1 on sentiment",
            " / ".join(
                f"{np.nanmean(dyn[('prompt', 'SGD', k)]['kernel_change']):.2f}"
                for k in (16, 64)
            ),
        ),
        (
            "model",
            "RoBERTa-base, 12 layers, width 768",
            f"2 layers, width {d_model}, {n_params:,} parameters",
        ),
        ("data", "14 natural-language tasks", "one generated language with negation"),
        (
            "seeds",
            "5 few-shot draws",
            " / ".join(str(len(c.seeds)) for c in runs.configs)
            + " runs at k = 4 / 16 / 64",
        ),
    ]
    return table(
        [
            {"": a, "paper (SST-2, RoBERTa-base)": b, "this chapter": c}
            for a, b, c in rows
        ]
    )


#: The worlds of the stored second-world run (:mod:`..ch4_second_world`), as the
#: figure and the table name them, in order.
WORLDS = {
    "book": "no job for [CLS] (this page's world)",
    "main": "[CLS] learns sentence length, w = 1",
    "offset": "[CLS] learns sentence length, w = 1, new pretrainings (offset 903)",
    "screen": "a topic in the text, w = 0",
}

#: Their tick labels in :func:`two_worlds`, short enough for five columns.
TICKS = {
    "book": "no job\nfor [CLS]",
    "main": "[CLS] learns\nlength",
    "offset": "[CLS] learns\nlength, new\npretrainings",
    "screen": "topic in\nthe text,\nw = 0",
}


def _per_pretraining(part) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error over runs of each pretraining's contrast."""
    c = [np.asarray(p["contrast"], dtype=float) for p in part["pretrainings"]]
    return (
        np.array([v.mean() for v in c]),
        np.array([v.std(ddof=1) / np.sqrt(len(v)) for v in c]),
    )


def two_worlds(worlds: dict, page: np.ndarray, paper=(1.2, 13.6), paper_mean=7.9):
    """The contrast (FT − eNTK) standard − (FT − eNTK) prompt per pretraining, one
    column per world of the stored run (``worlds``: :func:`second_world_results`),
    and this page's runs at k = 16 (``page``, per run), beside the paper's range of
    per-task contrasts at 64 shots (shaded) and its mean (dashed)."""
    names = [n for n in WORLDS if n in worlds]
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    ax.axhspan(*paper, color=PALETTE["sky"], alpha=0.25, lw=0, label="paper, six tasks")
    ax.axhline(
        paper_mean, color=PALETTE["blue"], ls="--", lw=1, label="paper, their mean"
    )
    ax.axhline(0, color="#999999", lw=0.8)
    colors = [PALETTE["black"], PALETTE["red"], PALETTE["purple"], PALETTE["orange"]]
    labels = []
    for i, name in enumerate(names):
        mean, se = _per_pretraining(worlds[name])
        x = i + np.linspace(-0.25, 0.25, len(mean))
        ax.errorbar(x, mean, se, fmt="o", color=colors[i % 4], ms=5, capsize=2)
        labels.append(TICKS[name])
    i = len(names)
    page = np.asarray(page, dtype=float)
    ax.errorbar(
        [i],
        [page.mean()],
        [page.std(ddof=1) / np.sqrt(len(page))],
        fmt="s",
        color=PALETTE["green"],
        ms=5,
        capsize=2,
    )
    labels.append("this page's\nruns, k = 16")
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set(
        ylabel="contrast (points)",
        title="(FT − eNTK) without the prompt minus with it, per pretraining",
    )
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def two_worlds_table(worlds: dict):
    """Per pretraining of each world of the stored run: mean over runs of the
    contrast and of what is reported beside it (points, the kernel-change ratio
    dimensionless)."""
    rows = []
    for name in (n for n in WORLDS if n in worlds):
        for p in worlds[name]["pretrainings"]:
            m = {k: float(np.mean(p[k])) for k in p if isinstance(p[k], list)}
            rows.append(
                {
                    "world": WORLDS[name],
                    "pretraining": str(p["seed"]),
                    "runs": str(len(p["contrast"])),
                    "contrast": f"{m['contrast']:+.1f}",
                    "zero-shot (%)": f"{m['zero_shot']:.1f}",
                    "standard FT − LP": f"{m['std_ft_minus_lp']:+.1f}",
                    "prompt |FT − eNTK|": f"{m['prompt_abs_ft_minus_entk']:.1f}",
                    "KC ratio": f"{np.median(p['kc_ratio']):.2f}",
                }
            )
    caption = (
        "Per pretraining, means over its k = 64 runs (each side chosen on validation "
        "data over the wide search); KC ratio: median over runs of the kernel change "
        "of the validated standard run over the validated prompt run"
    )
    return table(rows, caption=caption)


def two_worlds_text(worlds: dict) -> dict[str, str]:
    """The numbers the page's text quotes from the stored run, as strings named for
    ``glue``. Per world ``w`` of ``worlds`` (:func:`second_world_results`):
    ``ch4_w2_{w}``, the mean ± standard error over pretrainings of each pretraining's
    mean contrast (points); ``ch4_w2_{w}_range``, its lowest to highest pretraining;
    ``ch4_w2_{w}_n``, the pretrainings; ``ch4_w2_{w}_runs``, the runs;
    ``ch4_w2_{w}_zero_shot`` and ``ch4_w2_{w}_std_ft_minus_lp``, the lowest to
    highest pretraining's mean zero-shot accuracy (%), standard FT − LP and standard
    FT − eNTK (points); ``ch4_w2_{w}_std_ft`` and ``ch4_w2_{w}_std_entk``, the same
    spans of the validated standard run's and its eNTK's accuracy (%);
    ``ch4_w2_{w}_prompt_gap``, the same span of the prompt side's
    |FT − eNTK| (points); ``ch4_w2_{w}_kc``, the runs whose
    validated standard run changed its eNTK at least twice as much as the validated
    prompt run ("a of b"), and ``ch4_w2_{w}_kc_median``, the median of that ratio over
    runs."""
    out = {}
    for w in (n for n in WORLDS if n in worlds):
        pre = worlds[w]["pretrainings"]
        m = {
            k: np.array([np.mean(p[k]) for p in pre], dtype=float)
            for k in (
                "contrast",
                "zero_shot",
                "std_ft_minus_lp",
                "std_ft",
                "std_entk",
                "prompt_abs_ft_minus_entk",
            )
        }
        m["std_ft_minus_entk"] = np.array(
            [np.mean(np.subtract(p["std_ft"], p["std_entk"])) for p in pre]
        )
        c = m["contrast"]
        se = c.std(ddof=1) / np.sqrt(len(c)) if len(c) > 1 else float("nan")
        kc = np.concatenate([np.asarray(p["kc_ratio"], dtype=float) for p in pre])
        out |= {
            f"ch4_w2_{w}": f"{c.mean():+.1f} ± {se:.1f}",
            f"ch4_w2_{w}_range": f"{c.min():+.1f} to {c.max():+.1f}",
            f"ch4_w2_{w}_n": f"{len(c)}",
            f"ch4_w2_{w}_runs": f"{sum(len(p['contrast']) for p in pre)}",
            f"ch4_w2_{w}_zero_shot": _span(m["zero_shot"], "{:.1f}"),
            f"ch4_w2_{w}_std_ft_minus_lp": _span(m["std_ft_minus_lp"], "{:+.1f}"),
            f"ch4_w2_{w}_std_ft_minus_entk": _span(m["std_ft_minus_entk"], "{:+.1f}"),
            f"ch4_w2_{w}_std_ft": _span(m["std_ft"], "{:.1f}"),
            f"ch4_w2_{w}_std_entk": _span(m["std_entk"], "{:.1f}"),
            f"ch4_w2_{w}_prompt_gap": _span(m["prompt_abs_ft_minus_entk"], "{:.1f}"),
            f"ch4_w2_{w}_kc": f"{int((kc >= 2).sum())} of {len(kc)}",
            f"ch4_w2_{w}_kc_median": f"{np.median(kc):.2f}",
        }
    return out


def _heads(worlds: dict) -> list[tuple[dict, dict]]:
    """The pretrainings of the ``cv`` part of the stored run (standard fine-tuning
    from the paper's cross-validated probe), each beside the main part's of the same
    seed (from a fresh head)."""
    main = {p["seed"]: p for p in worlds["main"]["pretrainings"]}
    return [(main[p["seed"]], p) for p in worlds["cv"]["pretrainings"]]


def cv_head_table(worlds: dict):
    """Per pretraining of the ``cv`` part of the stored run, beside the main part's
    same pretraining: the contrast, standard FT − LP (means over runs, points) and the
    kernel-change ratio (median over runs) from a fresh head and from the paper's
    cross-validated probe, and the probe's own test accuracy and :math:`C` (median
    over runs); a last row gives the mean ± standard error over pretrainings of the
    per-pretraining means (of the medians, for the ratio)."""
    pairs = _heads(worlds)
    cols = {
        "contrast": ("contrast", np.mean),
        "standard FT − LP": ("std_ft_minus_lp", np.mean),
        "KC ratio": ("kc_ratio", np.median),
    }
    rows, per, heads = [], {}, ("fresh head", "CV probe")
    for fresh, cv in pairs:
        row = {"pretraining": str(cv["seed"]), "runs": str(len(cv["contrast"]))}
        for name, (key, stat) in cols.items():
            for head, p in (("fresh head", fresh), ("CV probe", cv)):
                v = float(stat(p[key]))
                per.setdefault((name, head), []).append(v)
                fmt = "{:.2f}" if key == "kc_ratio" else "{:+.1f}"
                row[f"{name}, {head}"] = fmt.format(v)
        row["CV probe (%)"] = f"{np.mean(cv['cv_probe']):.1f}"
        row["its C"] = f"{np.median(cv['cv_c']):.3g}"
        rows.append(row)
    last = {
        "pretraining": "mean ± s.e.",
        "runs": str(sum(len(c["contrast"]) for _, c in pairs)),
    }
    for (name, head), v in per.items():
        v = np.asarray(v)
        se = v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
        fmt = "{:.2f} ± {:.2f}" if name == "KC ratio" else "{:+.1f} ± {:.1f}"
        last[f"{name}, {head}"] = fmt.format(v.mean(), se)
    last["CV probe (%)"] = f"{np.mean([np.mean(c['cv_probe']) for _, c in pairs]):.1f}"
    last["its C"] = ""
    rows.append(last)
    first = ["pretraining", "runs"] + [
        f"{n}, {h}" for n in ("contrast", "standard FT − LP") for h in heads
    ]
    second = ["pretraining"] + [f"KC ratio, {h}" for h in heads]
    caption = (
        "The second world from two starts of standard fine-tuning: a fresh head (the "
        "registered runs) and the paper's cross-validated probe (its footnote 2; "
        "LogisticRegressionCV's settings, the head scaled as the authors' code scales "
        "it). The same pretrainings and draws, the prompt-based runs recomputed; means "
        "over each pretraining's k = 64 runs (points)"
    )
    return Tables(
        table(rows, columns=first, caption=caption),
        table(
            rows,
            columns=second + ["CV probe (%)", "its C"],
            caption="The same runs: the kernel-change ratio (median over runs), the "
            "CV probe's own test accuracy (%, mean) and its C (median over runs)",
        ),
    )


def cv_head_text(worlds: dict) -> dict[str, str]:
    """The numbers the page's text quotes from the ``cv`` part, as strings named for
    ``glue``: ``ch4_w2_cv``, the mean ± standard error over pretrainings of each
    pretraining's mean contrast from the cross-validated probe (points);
    ``ch4_w2_cv_range``, its lowest to highest pretraining; ``ch4_w2_cv_n``, the
    pretrainings; ``ch4_w2_cv_fresh``, the same mean ± standard error from a fresh head
    on the same pretrainings; ``ch4_w2_cv_std_ft_minus_lp``, the lowest to highest
    pretraining's mean standard FT − LP from the probe; ``ch4_w2_cv_same``, the
    pretrainings whose prompt-side accuracies (zero-shot, validated FT, its eNTK) are
    the main part's bit for bit ("a of b"), and ``ch4_w2_cv_prompt_diff``, the
    largest difference between the two parts' prompt-side accuracies in any run
    (zero-shot, validated FT, its eNTK; points)."""
    pairs = _heads(worlds)
    out = {}
    for name, k in (("ch4_w2_cv", 1), ("ch4_w2_cv_fresh", 0)):
        c = np.array([np.mean(pair[k]["contrast"]) for pair in pairs])
        se = c.std(ddof=1) / np.sqrt(len(c)) if len(c) > 1 else float("nan")
        out[name] = f"{c.mean():+.1f} ± {se:.1f}"
        if k == 1:
            out["ch4_w2_cv_range"] = f"{c.min():+.1f} to {c.max():+.1f}"
    out["ch4_w2_cv_n"] = f"{len(pairs)}"
    lp = np.array([np.mean(cv["std_ft_minus_lp"]) for _, cv in pairs])
    out["ch4_w2_cv_std_ft_minus_lp"] = _span(lp, "{:+.1f}")
    prompt = ("zero_shot", "prompt_ft", "prompt_entk")
    same = sum(all(fresh[n] == cv[n] for n in prompt) for fresh, cv in pairs)
    out["ch4_w2_cv_same"] = f"{same} of {len(pairs)}"
    diff = max(
        float(np.max(np.abs(np.subtract(fresh[n], cv[n]))))
        for fresh, cv in pairs
        for n in prompt
    )
    out["ch4_w2_cv_prompt_diff"] = f"{diff:.1f}"
    return out


def _span(v: np.ndarray, fmt: str) -> str:
    """ "lo to hi" of ``v`` in ``fmt`` (one number when they print alike)."""
    lo, hi = fmt.format(v.min()), fmt.format(v.max())
    return lo if lo == hi else f"{lo} to {hi}"
