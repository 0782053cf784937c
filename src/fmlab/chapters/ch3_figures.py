"""Chapter 3's figures, sliders and tables.

The linear theory (:mod:`fmlab.chapters.ch3_linear`): the OOD loss over training and
the ratio of LP's to FT's OOD loss, a slider over feature error and shift angle, and
the picture of features moving. The nonlinear experiment
(:mod:`fmlab.chapters.ch3_lpft`): the overlap sweep and its slider, the two orderings
against the overlap angle, the learning-rate slider, the feature change along
training, and the tables. Each function draws from a runner's result and computes
nothing a claim decides.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.collections import LineCollection

from .._validate import check_int
from ..theory.feature_distortion import DistortionSweep, id_loss, ood_loss
from ..viz import PALETTE, slider_figure, table
from .ch3_linear import FeaturePicture, LinearTheoryConfig
from .ch3_lpft import _NAMES, METHODS, best_validation, feature_change_at_loss

__all__ = [
    "rule_report",
    "TALK",
    "linear_losses",
    "linear_slider",
    "feature_picture_slider",
    "overlap_slider",
    "orderings",
    "accuracy_table",
    "learning_rate_slider",
    "plot_learning_rate",
    "plot_feature_change",
    "orderings_table",
    "describe",
    "paper_table",
]

#: The talk's numbers (Raghunathan, after Kumar et al. 2022): ID and OOD accuracy (%)
#: averaged over ten data sets, and scratch vs LP on Living-17.
TALK = {
    "lp": (82.9, 66.2),
    "ft": (85.1, 59.3),
    "lpft": (85.7, 68.9),
    "living17_scratch": (92.4, 58.2),
    "living17_lp": (96.5, 82.2),
}


def _colors():
    return {
        "lp": PALETTE["blue"],
        "ft": PALETTE["red"],
        "lpft": PALETTE["green"],
        "scratch": PALETTE["purple"],
    }


# -- the linear theory ----------------------------------------------------------------
def _band(ax, t, curves, color, label, ls="-"):
    ax.plot(t, curves.median(0).values, color=color, ls=ls, label=label)
    ax.fill_between(
        t, curves.min(0).values, curves.max(0).values, color=color, alpha=0.15, lw=0
    )


def _floor(x):
    return x.clamp_min(1e-12)


def linear_losses(sweep: DistortionSweep, lin: LinearTheoryConfig):
    """Left: the OOD loss over training at a 45° shift for three feature errors (median
    over instances, band: range). Right: the worst ratio over time of LP's to FT's OOD
    loss against the feature error, at 45° and 90°, with the slope of
    :math:`\\varepsilon^2`."""
    col = _colors()
    E, t = list(sweep.feature_errors), sweep.times.numpy()
    a45, a90 = lin.shift_angles_deg.index(45.0), lin.shift_angles_deg.index(90.0)
    sup_ratio = (sweep.lp_ood.unsqueeze(-1) / sweep.ft_ood).amax(-1)
    fig, axes = plt.subplots(1, 2, figsize=(8.6, 3.35))
    ax = axes[0]
    for i, ls in zip([E.index(0.0), E.index(0.01), E.index(0.1)], [":", "--", "-"]):
        lp = float(_floor(sweep.lp_ood[i, a45]).median())
        ax.plot(t, np.full_like(t, lp), color=col["lp"], ls=ls)
        _band(ax, t, sweep.ft_ood[i, a45], col["ft"], None, ls)
        _band(ax, t, _floor(sweep.lpft_ood[i, a45]), col["lpft"], None, ls)
        ax.plot([], [], color="gray", ls=ls, label=f"ε = {E[i]}")
    for m in ("lp", "ft", "lpft"):
        ax.plot([], [], color=col[m], label=_NAMES[m])
    ax.set(
        yscale="log",
        ylim=(1e-12, 1),
        xlabel="gradient-flow time t",
        ylabel=r"$L_{ood}$",
        # on two lines: on one it is wider than the panel, over the top tick label
        title="OOD loss at a 45° shift\n(a loss of 0 is drawn at 1e-12)",
    )
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(0, lin.horizon)
    ax.legend(ncol=2, fontsize=8)
    ax = axes[1]
    eps_pos = [e for e in E if e > 0]
    for a, color in [(a45, PALETTE["purple"]), (a90, PALETTE["black"])]:
        vals = sup_ratio[1:, a]
        label = f"α = {lin.shift_angles_deg[a]:.0f}°"
        ax.plot(eps_pos, vals.median(1).values, "o-", color=color, label=label)
        ax.fill_between(
            eps_pos, vals.min(1).values, vals.max(1).values, color=color, alpha=0.15
        )
    ax.plot(eps_pos, [e**2 for e in eps_pos], color="gray", ls="--", label="ε²")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="feature error ε (radians)",
        ylabel=r"worst $t$:  $L_{ood}(LP) / L_{ood}(FT(t))$",
        title="The ratio goes to 0",
    )
    ax.legend()
    fig.tight_layout()
    return fig


def linear_slider(
    sweep: DistortionSweep,
    lin: LinearTheoryConfig,
    eps: Sequence[float] = (0.0, 0.01, 0.03, 0.1, 0.3),
    angles: Sequence[float] = (0.0, 22.5, 45.0, 90.0),
):
    """Sliders over feature error and shift angle: the OOD losses (solid; median over
    instances, band: range) and the ID losses (dotted) of LP, FT and LP-FT over
    training."""
    col, t = _colors(), sweep.times.numpy()
    E = list(sweep.feature_errors)

    def render(eps, angle):
        i, a = E.index(eps), lin.shift_angles_deg.index(angle)
        fig, ax = plt.subplots(figsize=(9.9, 4.1))
        lp_ood = float(_floor(sweep.lp_ood[i, a]).median())
        ax.plot(t, np.full_like(t, lp_ood), color=col["lp"], label="LP")
        _band(ax, t, _floor(sweep.ft_ood[i, a]), col["ft"], "FT")
        _band(ax, t, _floor(sweep.lpft_ood[i, a]), col["lpft"], "LP-FT", ls="--")
        lp_id = float(_floor(sweep.lp_id[i]).median())
        ax.plot(t, np.full_like(t, lp_id), color=col["lp"], ls=":", lw=1.2)
        for m, curves in (("ft", sweep.ft_id[i]), ("lpft", sweep.lpft_id[i])):
            ax.plot(t, _floor(curves).median(0).values, color=col[m], ls=":", lw=1.2)
        ax.plot([], [], color="gray", ls=":", lw=1.2, label="ID loss")
        ax.set(
            yscale="log",
            ylim=(1e-12, 3),
            xlabel="gradient-flow time t",
            ylabel="loss",
            title=f"feature error ε = {eps}, shift angle α = {angle:g}°",
        )
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlim(0, lin.horizon)
        ax.legend(fontsize=8, loc="lower left", ncol=2)
        return fig

    return slider_figure(
        render,
        {"eps": list(eps), "angle": list(angles)},
        labels={"eps": "feature error ε", "angle": "shift angle α (°)"},
        initial={"eps": list(eps).index(0.03), "angle": list(angles).index(45.0)},
    )


def feature_picture_slider(pic: FeaturePicture):
    """A slider over training time: the feature vectors of ID (circles) and OOD
    (diamonds) inputs under FT (left) and LP-FT (right), coloured by label, with the
    head :math:`v(t)` (arrow) and the prediction it assigns to every point of the
    feature plane (background)."""
    p = pic.problem
    vmax = float(torch.cat([p.y, pic.y_ood]).abs().max())
    grid = torch.linspace(-2.5, 2.5, 200, dtype=torch.float64)
    times = pic.runs["FT"].times.tolist()

    def render(t_index):
        fig, axes = plt.subplots(1, 2, figsize=(9.5, 4.3))
        for ax, (name, tr) in zip(axes, pic.runs.items()):
            Bt, vt = tr.B[t_index], tr.v[t_index]
            field = (vt[0] * grid[None, :] + vt[1] * grid[:, None]).numpy()
            shade = dict(cmap="coolwarm", vmin=-vmax, vmax=vmax)
            ax.imshow(
                field,
                extent=(-2.5, 2.5, -2.5, 2.5),
                origin="lower",
                alpha=0.55,
                **shade,
            )
            for xs, ys, marker, size in [
                (p.X, p.y, "o", 40),
                (pic.x_ood, pic.y_ood, "D", 60),
            ]:
                f0, ft = xs @ p.B0.T, xs @ Bt.T
                lines = torch.stack([f0, ft], 1).numpy()
                ax.add_collection(LineCollection(lines, colors="0.45", lw=0.8))
                ax.scatter(
                    ft[:, 0], ft[:, 1], c=ys, s=size, marker=marker, zorder=3,
                    edgecolors="k", **shade,
                )  # fmt: skip
            ax.annotate(
                "",
                xy=tuple(vt.tolist()),
                xytext=(0, 0),
                arrowprops=dict(arrowstyle="->", lw=2, color="k"),
            )
            lid, lood = float(id_loss(p, vt, Bt)), float(ood_loss(p, vt, Bt))
            ax.set(
                xlim=(-2.5, 2.5),
                ylim=(-2.5, 2.5),
                aspect="equal",
                xlabel="feature 1",
                ylabel="feature 2",
                title=f"{name}, t = {times[t_index]:.1f}\n"
                f"ID loss {lid:.1e}, OOD loss {lood:.1e}",
            )
            ax.grid(False)
        fig.tight_layout()
        return fig

    return slider_figure(
        render,
        {"t_index": list(range(len(times)))},
        labels={"t_index": "training time"},
        readouts={"t_index": [f"t = {t:g}" for t in times]},
        initial={"t_index": len(times) - 1},
    )


# -- the nonlinear experiment ---------------------------------------------------------
def _summary(sweep: Mapping[float, dict]):
    """Angles and, per method, (A, 2, 2): [ID, OOD] x [mean, sd] in %."""
    angles = sorted(sweep)
    out = {}
    for m in METHODS:
        acc = [100 * sweep[a]["acc"][m] for a in angles]
        out[m] = torch.stack(
            [torch.stack([x.mean(0), x.std(0)], -1) for x in acc]
        )  # (A, 2 splits, 2 stats)
    return angles, out


def overlap_slider(sweep: Mapping[float, dict], initial: float = 75.0):
    """The overlap sweep with a slider over the angle. Left: ID (dashed) and OOD
    (solid) test accuracy of LP, FT, LP-FT and scratch against the overlap angle
    (mean, band: ± sd over seeds); the slider's angle is marked. Right: every seed's ID
    against OOD accuracy at that angle (stars: means)."""
    angles, summ = _summary(sweep)
    col = _colors()
    n_seeds = {a: len(sweep[a]["acc"]["lp"]) for a in angles}

    def render(angle):
        fig, axes = plt.subplots(
            1, 2, figsize=(8.6, 3.55), gridspec_kw={"width_ratios": [1.25, 1]}
        )
        ax = axes[0]
        for m in METHODS:
            for k, ls in ((1, "-"), (0, "--")):
                mean, sd = summ[m][:, k, 0], summ[m][:, k, 1]
                label = _NAMES[m] if k == 1 else None
                ax.plot(angles, mean, ls, marker="o", ms=4, color=col[m], label=label)
                ax.fill_between(angles, mean - sd, mean + sd, color=col[m], alpha=0.12)
        ax.axvline(angle, color="0.4", ls=":", lw=1.5)
        ax.plot([], [], "k-", label="OOD")
        ax.plot([], [], "k--", label="ID")
        ax.set(
            xticks=angles,
            xticklabels=[f"{a:g}°\n({n_seeds[a]})" for a in angles],
            xlabel="overlap angle a (seeds)",
            ylabel="test accuracy (%)",
            ylim=(20, 100),
            title="Accuracy against the overlap (mean ± sd)",
        )
        ax.legend(loc="lower left", ncol=2, fontsize=8)
        ax = axes[1]
        res = sweep[angle]
        for m in METHODS:
            pts = 100 * res["acc"][m]
            ax.scatter(pts[:, 0], pts[:, 1], color=col[m], s=24, label=_NAMES[m])
            mean = pts.mean(0)
            ax.scatter(
                [float(mean[0])], [float(mean[1])], color=col[m], marker="*", s=200,
                edgecolors="k", zorder=4,
            )  # fmt: skip
        ax.set(
            xlabel="ID test accuracy (%)",
            ylabel="OOD test accuracy (%)",
            xlim=(80, 96),
            ylim=(20, 100),
            title=f"Every seed at a = {angle:g}° (cos²a = {res['overlap']:.3f})",
        )
        ax.legend(loc="lower left", fontsize=8)
        fig.tight_layout()
        return fig

    return slider_figure(
        render,
        {"angle": angles},
        labels={"angle": "overlap angle a"},
        readouts={"angle": [f"{a:g}°" for a in angles]},
        initial={"angle": angles.index(initial)},
    )


def orderings(sweep: Mapping[float, dict], key_angles: Sequence[float] = ()):
    """The two OOD orderings of the talk against the overlap angle: LP − FT and
    LP-FT − LP OOD accuracy, every seed (dots) and the mean ± 3 s.e. (bars); the
    angles at which the chapter's keys are decided are shaded."""
    angles = sorted(sweep)
    fig, axes = plt.subplots(1, 2, figsize=(8.6, 3.2))
    pairs = [("lp", "ft", "LP − FT, OOD"), ("lpft", "lp", "LP-FT − LP, OOD")]
    for ax, (a_m, b_m, title) in zip(axes, pairs):
        for x, a in enumerate(angles):
            d = 100 * (sweep[a]["acc"][a_m][:, 1] - sweep[a]["acc"][b_m][:, 1])
            se = float(d.std()) / math.sqrt(len(d))
            color = PALETTE["blue"] if float(d.mean()) - 3 * se > 0 else "0.5"
            ax.scatter(np.full(len(d), x), d, s=12, color=color, alpha=0.7)
            ax.errorbar(
                x + 0.18, float(d.mean()), yerr=3 * se, fmt="s", color="k", capsize=3
            )
            if a in key_angles:
                ax.axvspan(x - 0.4, x + 0.4, color=PALETTE["orange"], alpha=0.15)
        ax.axhline(0, color="k", lw=0.8)
        ax.set(
            xticks=range(len(angles)),
            xticklabels=[f"{a:g}°" for a in angles],
            xlabel="overlap angle a",
            ylabel="points",
            title=title,
        )
        if a_m == "lp":
            ax.set_yscale("symlog", linthresh=5)
            # plain ticks, none at ±1: the locator's ±10⁰ crowd the 0 between them
            lo, hi = ax.get_ylim()
            ticks = [t for t in (-50, -20, -10, -5, 0, 5, 10, 20, 50) if lo <= t <= hi]
            ax.set_yticks(ticks, [f"{t:g}".replace("-", "\u2212") for t in ticks])
            ax.set_yticks([], minor=True)
    fig.tight_layout()
    return fig


def accuracy_table(results: Mapping[float, dict]):
    """ID and OOD test accuracy (mean ± sd over seeds, %) of every method at each
    angle of ``results``, and the chosen hyper-parameter values."""
    rows = []
    for m in METHODS:
        row = {"method": _NAMES[m]}
        for a, res in results.items():
            acc = 100 * res["acc"][m]
            for k, split in enumerate(("ID", "OOD")):
                row[f"{split}, {a:g}°"] = (
                    f"{acc[:, k].mean():.1f} ± {acc[:, k].std():.1f}"
                )
            values, counts = res["chosen"][m].unique(return_counts=True)
            row[f"chosen, {a:g}°"] = ("λ " if m == "lp" else "η ") + ", ".join(
                f"{v:g} ({n})" for v, n in zip(values.tolist(), counts.tolist())
            )
        rows.append(row)
    return table(rows, caption="mean ± sd over seeds; chosen values (seeds)")


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
    fig, axes = plt.subplots(1, 2, figsize=(8.6, 3.45))
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
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi + 0.08 * (hi - lo))  # room for the n× above FT's best rates
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
            [float(mean[0])], [float(mean[1])], color=col[m], marker="*", s=220,
            edgecolors="k", zorder=4,
        )  # fmt: skip
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


def learning_rate_slider(res: dict, lrs: Sequence[float]):
    """:func:`plot_learning_rate` at every rate of the grid, starting at FT's most
    frequent choice."""
    lrs = list(lrs)
    return slider_figure(
        lambda lr: plot_learning_rate(res, lrs, lrs.index(lr)),
        {"lr": lrs},
        labels={"lr": "learning rate η"},
        initial={"lr": int(res["chosen_index"]["ft"].mode().values)},
    )


def plot_feature_change(res: dict):
    """ID feature change against training loss for FT and LP-FT (the chosen runs).

    One line per seed; the dot on each FT line marks where its loss first reaches the
    final loss of LP-FT on the same seed, the comparison of
    :func:`~fmlab.chapters.ch3_lpft.matched_loss_change_ratio`.
    """
    col = _colors()
    fig, ax = plt.subplots(figsize=(9.9, 4.6))
    S = res["acc"]["lp"].shape[0]
    for m in ("ft", "lpft"):
        idx = res["chosen_index"][m]
        for s in range(S):
            tr = res["trace"][m][s, int(idx[s])]
            label = _NAMES[m] if s == 0 else None
            ax.plot(tr[:, 0], tr[:, 1], color=col[m], alpha=0.6, lw=1.2, label=label)
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


def orderings_table(sweep: Mapping[float, dict], holds: Mapping[float, dict]):
    """One row per overlap angle: :math:`\\cos^2 a`, the number of seeds, and the two
    OOD orderings (mean ± s.e. over seeds, points) with ``holds[a][name]`` (whether
    the ordering is clear, :func:`~fmlab.chapters.ch3_lpft.clear_orderings`) beside
    each."""
    rows = []
    for a, res in sweep.items():
        row = {"a": f"{a:g}°", "cos²a": f"{res['overlap']:.3f}"}
        row["seeds"] = len(res["acc"]["lp"])
        for name, (m1, m2) in (
            ("LP − FT", ("lp", "ft")),
            ("LP-FT − LP", ("lpft", "lp")),
        ):
            d = 100 * (res["acc"][m1][:, 1] - res["acc"][m2][:, 1])
            se = float(d.std()) / math.sqrt(len(d))
            mark = "✔" if holds[a][name] else "✘"
            row[f"{name}, OOD"] = f"{float(d.mean()):+.2f} ± {se:.2f} {mark}"
        if "LP-FT − LP ≥ 1" in holds[a]:
            row["LP-FT − LP ≥ 1 point"] = "✔" if holds[a]["LP-FT − LP ≥ 1"] else "✘"
        rows.append(row)
    return table(
        rows,
        caption="mean ± s.e. over seeds (points); ✔: clear (the mean beyond 0, or "
        "beyond +1 point, by more than 3 s.e., and every seed beyond it too)",
    )


def rule_report(res: Mapping[float, dict]) -> dict:
    """What the prose cites about each overlap angle :math:`a` of ``res`` (angle ->
    result of :func:`~fmlab.chapters.ch3_lpft.run_lpft_experiment`), as text (name ->
    text; ``{a}`` is the angle in whole degrees):

    * ``alpha_{a}``: the linear theory's shift angle :math:`\\alpha` with
      :math:`\\cos\\alpha = \\cos^2 a` (an OOD input keeps :math:`\\cos^4 a` of its
      energy in the span of the ID inputs);
    * ``bv_id_{a}``, ``bv_ood_{a}``: LP-FT at its single best validation rate minus LP
      (at the rule's choice), mean ± standard error over the seeds, in points;
    * ``bv_ft_lpft_id_{a}``: FT minus LP-FT in distribution, both at their best
      validation rates;
    * ``lp_train``, ``lp_train_max``: the chosen probe's training accuracy, mean and
      largest over every world of every angle.
    """
    out, fits = {}, []
    for a, r in res.items():
        cos2 = math.cos(math.radians(a)) ** 2
        out[f"alpha_{a:.0f}"] = f"{math.degrees(math.acos(cos2)):.0f}°"
        best = {m: 100 * best_validation(r, m) for m in ("ft", "lpft")}
        lp = 100 * r["acc"]["lp"]
        diffs = {
            f"bv_id_{a:.0f}": best["lpft"][:, 0] - lp[:, 0],
            f"bv_ood_{a:.0f}": best["lpft"][:, 1] - lp[:, 1],
            f"bv_ft_lpft_id_{a:.0f}": best["ft"][:, 0] - best["lpft"][:, 0],
        }
        for name, d in diffs.items():
            se = float(d.std()) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
            out[name] = f"{float(d.mean()):+.2f} ± {se:.2f}"
        fits.append(100 * r["lp_train_acc"])
    fits = torch.cat(fits)
    out["lp_train"] = f"{float(fits.mean()):.1f}%"
    out["lp_train_max"] = f"{float(fits.max()):.1f}%"
    return out


def describe(cfg) -> dict:
    """The numbers of a :class:`~fmlab.chapters.ch3_lpft.LPFTConfig` as the prose
    cites them (name -> text)."""
    w = cfg.world
    out = dict(
        p=w.dim_content,
        K=w.n_types,
        J=w.n_styles,
        D=w.dim_input,
        k=cfg.rep_dim,
        fnorm=cfg.feature_norm,
        C=w.n_classes,
        ntrain=cfg.n_train,
        nval=cfg.n_val,
        select_se=cfg.select_se,
        heads=cfg.ft_heads,
        ft_min=cfg.ft_min_lr,
        ntest=cfg.n_test,
        ls=cfg.label_smoothing,
        steps=cfg.ft_steps,
        momentum=cfg.momentum,
        S=len(cfg.seeds),
        ntrack=cfg.n_track,
        pre_steps=cfg.pretrain_steps,
    )
    text = {n: f"{v:,}" if isinstance(v, int) else f"{v:g}" for n, v in out.items()}
    for name in ("lrs", "l2s", "scratch_lrs"):
        grid = getattr(cfg, name)
        text[name] = "{" + ", ".join(f"{v:g}" for v in grid) + "}"
        text[f"n{name}"] = f"{len(grid)}"
    return text


def paper_table(acc: Mapping, angles: Mapping, effects: Mapping, ratio_geo: float):
    """The talk beside this book. ``acc`` maps each angle to ``{method: (S, 2)}``
    accuracies in %; ``angles`` names the angles (``"distortion"``, ``"LP-FT"``);
    ``effects`` holds the :class:`~fmlab.claims.SeedEffect` of each comparison;
    ``ratio_geo`` is the geometric mean of the feature-change ratio."""
    a_d, a_l = angles["distortion"], angles["LP-FT"]

    def pair(x):
        return f"{float(x[0]):.1f} / {float(x[1]):.1f}"

    def eff(name, a):
        e = effects[name]
        return f"{e.mean:+.2f} ± {e.se:.2f} at {a:g}°"

    t = TALK
    rows = [
        (
            f"{_NAMES[m]} accuracy, ID / OOD (%)",
            pair(t[m]),
            f"{pair(acc[a_d][m].mean(0))} at {a_d:g}°; "
            f"{pair(acc[a_l][m].mean(0))} at {a_l:g}°",
        )
        for m in ("lp", "ft", "lpft")
    ]
    rows += [
        ("FT − LP, ID", f"{t['ft'][0] - t['lp'][0]:+.1f}", eff("ft_lp_id", a_d)),
        ("LP − FT, OOD", f"{t['lp'][1] - t['ft'][1]:+.1f}", eff("lp_ft_ood", a_d)),
        (
            "LP − scratch, OOD",
            f"{t['living17_lp'][1] - t['living17_scratch'][1]:+.1f} (Living-17)",
            eff("lp_scratch_ood", a_d),
        ),
        (
            "LP-FT − LP, OOD",
            f"{t['lpft'][1] - t['lp'][1]:+.1f}",
            eff("lpft_lp_ood", a_l),
        ),
        ("LP-FT − LP, ID", f"{t['lpft'][0] - t['lp'][0]:+.1f}", eff("lpft_lp_id", a_l)),
        (
            "FT / LP-FT ID feature change at the same training loss",
            "about 10×",
            f"{ratio_geo:.0f}× (geometric mean) at {a_d:g}°",
        ),
    ]
    return table(
        [{"": q, "the talk": talk, "this book": ours} for q, talk, ours in rows],
        caption="the talk: averages over ten data sets (Living-17 for scratch); this "
        "book: mean ± s.e. over seeds, each its own generated world",
    )
