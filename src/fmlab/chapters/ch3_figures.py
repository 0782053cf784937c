"""Chapter 3's figures: accuracies of LP, FT and LP-FT, the learning-rate slider's
frames, and the feature change along training. Each function draws from the result of
:func:`fmlab.chapters.ch3_lpft.run_lpft_experiment` and computes nothing a claim
decides."""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import torch

from .._validate import check_int
from ..viz import PALETTE
from .ch3_lpft import _NAMES, METHODS, feature_change_at_loss

__all__ = ["plot_lpft_accuracies", "plot_learning_rate", "plot_feature_change"]


# -- figures --------------------------------------------------------------------------
def _colors():
    return {"lp": PALETTE["blue"], "ft": PALETTE["red"], "lpft": PALETTE["green"]}


def plot_lpft_accuracies(res: dict):
    """Bars of each method's ID and OOD test accuracy (mean, sd), one dot per seed."""
    acc = {m: 100 * res["acc"][m] for m in METHODS}
    S = acc["lp"].shape[0]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for j, m in enumerate(METHODS):
        for k, (split, color) in enumerate(
            [("ID", PALETTE["blue"]), ("OOD", PALETTE["orange"])]
        ):
            xpos = j + (k - 0.5) * 0.36
            ax.bar(
                xpos,
                float(acc[m][:, k].mean()),
                width=0.34,
                color=color,
                alpha=0.8,
                label=split if j == 0 else None,
                yerr=float(acc[m][:, k].std()),
                capsize=3,
            )
            ax.scatter([xpos] * S, acc[m][:, k], color="k", s=8, zorder=3)
    lo = float(min(acc[m].min() for m in METHODS))
    ax.set(
        xticks=range(len(METHODS)),
        xticklabels=[_NAMES[m] for m in METHODS],
        ylabel="accuracy (%)",
        ylim=(max(0.0, 10 * math.floor(lo / 10) - 10), 100),
        title=f"ID and OOD test accuracy (bars: mean ± sd over {S} seeds; dots: seeds)",
    )
    ax.legend(loc="upper right", ncol=2)
    return fig


def plot_learning_rate(res: dict, lrs: Sequence[float], index: int):
    """One frame of the learning-rate slider: FT and LP-FT at the ``index``-th rate.

    Left: ID validation accuracy against the learning rate (mean over seeds), the
    current rate marked, and each method's chosen rates. Right: ID against OOD test
    accuracy of every seed at the current rate; LP (which has no learning rate) at its
    chosen ``l2`` for reference.
    """
    lrs = list(lrs)
    index = check_int("index", index, minimum=0, maximum=len(lrs) - 1)
    col = _colors()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.9))
    ax = axes[0]
    for m in ("ft", "lpft"):
        val = 100 * res["sweep"][m][:, :, 0]
        ax.plot(lrs, val.nanmean(0), "o-", color=col[m], label=_NAMES[m])
        picks = res["chosen_index"][m]
        for j in sorted(set(picks.tolist())):
            n = int((picks == j).sum())
            ax.annotate(
                f"{n}×",
                (lrs[j], float(val[:, j].nanmean())),
                textcoords="offset points",
                xytext=(0, 7 if m == "ft" else -14),
                ha="center",
                fontsize=8,
                color=col[m],
            )
    lp_val = 100 * res["sweep"]["lp"][:, :, 0].gather(
        1, res["chosen_index"]["lp"][:, None]
    )
    ax.axhline(float(lp_val.mean()), color=col["lp"], ls="--", lw=1.2, label="LP")
    ax.axvline(lrs[index], color="0.4", ls=":", lw=1.5)
    ax.set(
        xscale="log",
        xlabel="learning rate",
        ylabel="ID validation accuracy (%)",
        title="The search (n× = seeds that chose this rate)",
    )
    ax.legend(loc="lower right")
    ax = axes[1]
    lp = 100 * res["acc"]["lp"]
    ax.scatter(lp[:, 0], lp[:, 1], color=col["lp"], marker="s", s=28, label="LP")
    for m in ("ft", "lpft"):
        pts = 100 * res["sweep"][m][:, index, 1:]
        ax.scatter(pts[:, 0], pts[:, 1], color=col[m], s=28, label=_NAMES[m])
        mean = pts.nanmean(0)
        ax.scatter(
            [float(mean[0])],
            [float(mean[1])],
            color=col[m],
            marker="*",
            s=220,
            edgecolors="k",
            zorder=4,
        )
    allpts = torch.cat(
        [100 * res["sweep"][m][:, :, 1:].reshape(-1, 2) for m in ("ft", "lpft")] + [lp]
    )
    allpts = allpts[torch.isfinite(allpts).all(1)]
    lo, hi = allpts.min(0).values, allpts.max(0).values
    ax.set(
        xlim=(float(lo[0]) - 1, float(hi[0]) + 1),
        ylim=(float(lo[1]) - 2, float(hi[1]) + 2),
        xlabel="ID test accuracy (%)",
        ylabel="OOD test accuracy (%)",
        title=f"Every seed at learning rate {lrs[index]:g} (stars: means)",
    )
    ax.legend(loc="lower left")
    fig.tight_layout()
    return fig


def plot_feature_change(res: dict):
    """ID feature change against training loss for FT and LP-FT (the chosen runs).

    One line per seed; the dot on each FT line marks where its loss first reaches the
    final loss of LP-FT on the same seed, the comparison of
    :func:`matched_loss_change_ratio`.
    """
    col = _colors()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    S = res["acc"]["lp"].shape[0]
    for m in ("ft", "lpft"):
        idx = res["chosen_index"][m]
        for s in range(S):
            tr = res["trace"][m][s, int(idx[s])]
            ax.plot(
                tr[:, 0],
                tr[:, 1],
                color=col[m],
                alpha=0.6,
                lw=1.2,
                label=_NAMES[m] if s == 0 else None,
            )
    for s in range(S):
        ft = res["trace"]["ft"][s, int(res["chosen_index"]["ft"][s])]
        lp = res["trace"]["lpft"][s, int(res["chosen_index"]["lpft"][s])]
        target = float(lp[-1, 0])
        ax.scatter([target], [feature_change_at_loss(ft, target)], color="k", s=12)
        ax.scatter([target], [float(lp[-1, 1])], color=col["lpft"], s=12)
    ax.set(
        xlabel="training loss (decreasing →)",
        ylabel=r"ID mean $\|\Delta\phi(x)\|_2$",
        title="Feature change along training (dots: matched training loss)",
    )
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_ylim(bottom=0)
    ax.invert_xaxis()
    ax.legend()
    return fig
