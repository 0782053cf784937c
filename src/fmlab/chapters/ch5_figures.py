"""The figures, tables, sliders and prose numbers of Chapter 5 (its three pages,
``notebooks/05-implicit-bias.ipynb``, ``05b-same-loss.ipynb`` and
``05c-same-loss-transformer.ipynb``), so that
the chapter's cells hold the experiment and not the drawing. Every function returns a
matplotlib ``Figure``, an :func:`fmlab.viz.table`, a slider or a dict of strings for
``glue``; none of them computes anything the chapter claims."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.lines import Line2D

from .. import stored
from ..claims import SeedEffect
from ..theory.sgd_manifold import flow_trace
from ..viz import PALETTE, Tables, slider_figure, table
from .ch5_sgd_noise import width_lr_pairs
from .ch5_theory import DyckConfig, ManifoldResult

__all__ = [
    "block_trace_table",
    "plot_manifold",
    "manifold_table",
    "manifold_slider",
    "dyck_table",
    "plot_dyck",
    "plot_same_loss",
    "lookup_comparison_table",
    "bartlett_table",
    "noise_trace_table",
    "noise_accuracy_table",
    "plot_noise",
    "effects_table",
    "prose_equal_loss",
    "prose_noise",
    "plot_recovery",
]


def mean_sd(x, f: str = "{:.2f}") -> str:
    """``mean ± sd`` of a tensor, with the format ``f``."""
    return f"{f.format(float(x.mean()))} ± {f.format(float(x.std()))}"


def _check(name: str, value, cls) -> None:
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be a {cls.__name__}, got {type(value).__name__}")


# --------------------------------------------------------------------------------------
# the theory page
# --------------------------------------------------------------------------------------
def block_trace_table(bt: dict, probes: int):
    """Exact block traces against Hutchinson's estimate (``bt`` from
    :func:`fmlab.chapters.ch5_theory.block_traces`)."""
    rows = [
        {
            "block": b,
            "exact": bt["exact"][b],
            f"Hutchinson ({probes} probes)": bt["hutchinson"][b],
            "± s.e.": bt["hutchinson_se"][b],
        }
        for b in bt["exact"]
    ]
    caption = (
        f"{bt['n_params']} parameters. Exact: {bt['n_params']} HVPs in "
        f"⏱ {bt['seconds_exact']:.2f} s; Hutchinson: {probes} HVPs in "
        f"⏱ {bt['seconds_hutchinson']:.2f} s"
    )
    return table(rows, caption=caption, digits=4)


#: the four settings the figures follow: (learning rate, batch size, colour)
_SHOWN = [
    (0.02, 1, "blue"),
    (0.04, 1, "orange"),
    (0.04, 4, "green"),
    (0.02, 4, "purple"),
]


def _hyperbola(ax, man: ManifoldResult, i: int, records, title: str):
    """The runs of setting ``i`` on the first hyperbola at the given records."""
    c1 = float(man.model.c[0])
    hyp_s = torch.linspace(-1.8, 1.8, 200, dtype=torch.float64)
    ax.plot(
        c1**0.5 * torch.exp(hyp_s),
        c1**0.5 * torch.exp(-hyp_s),
        color="grey",
        lw=1,
        label="minimisers $u_1v_1=c_1$",
    )
    for j, k in enumerate(records):
        s1 = man.s[k, i, :, 0]
        ax.scatter(
            c1**0.5 * torch.exp(s1),
            c1**0.5 * torch.exp(-s1),
            s=10,
            color=plt.cm.viridis(j / 4),
            label=f"step {int(man.steps[k])}",
        )
    ax.set(xlim=(0, 5.5), ylim=(0, 5.5), xlabel="$u_1$", ylabel="$v_1$", title=title)


def plot_manifold(man: ManifoldResult):
    """The trace against steps and against :math:`\\eta^2k/B` with the flow, the
    excess loss, and the runs on the first hyperbola."""
    _check("man", man, ManifoldResult)
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.6))
    (a0, a1), (a2, a3) = axes
    steps = man.steps
    for lr, b, col in _SHOWN:
        i = man.setting(lr, b)
        mean = man.trace[:, i].mean(1)
        label = f"η={lr}, B={b}"
        a0.plot(steps / 1000, mean, color=PALETTE[col], label=label)
        a0.fill_between(
            steps / 1000,
            man.trace[:, i].quantile(0.1, 1),
            man.trace[:, i].quantile(0.9, 1),
            color=PALETTE[col],
            alpha=0.15,
        )
        a1.plot(lr**2 * steps / b, mean, color=PALETTE[col], label=label)
        a2.plot(steps / 1000, man.excess[:, i].mean(1), color=PALETTE[col], label=label)
    max_lr = max(man.config.lrs)
    tgrid = torch.linspace(
        0, float(max_lr**2 * man.config.steps), 200, dtype=torch.float64
    )
    a1.plot(
        tgrid, flow_trace(man.model, man.s0, tgrid, 1.0), "k--", lw=1.2, label="flow"
    )
    for ax in (a0, a1):
        ax.axhline(man.min_trace, color="grey", lw=0.8, ls=":")
    a0.set(
        xlabel="SGD step (thousands)",
        ylabel=r"tr $\nabla^2 L$",
        title="Sharpness falls (mean, 10–90% band)",
    )
    a1.set(
        xlabel=r"$\eta^2\times$steps$/B$",
        ylabel=r"tr $\nabla^2 L$",
        xlim=(0, 13),
        title="Same η²/B, same path; the flow predicts it",
    )
    a2.set(
        xlabel="SGD step (thousands)",
        ylabel=r"$L - L^\star$ (nats)",
        ylim=(0, 0.1),
        title=f"The loss stays at its minimum (mean of {man.config.runs} runs)",
    )
    _hyperbola(
        a3,
        man,
        man.setting(0.04, 1),
        [0, 20, 50, 100, 200],
        "η=0.04, B=1: the runs slide along $\\Gamma$",
    )
    # the upper right legend names the settings for the three panels that draw them
    # (in the upper left panel it would cover a curve)
    a1.legend()
    a3.legend()
    fig.tight_layout()
    return fig


def manifold_table(man: ManifoldResult):
    """Per setting: half-time, scaled half-time, deviation from the flow, excess."""
    _check("man", man, ManifoldResult)
    rows = []
    for r in man.rows():
        reached = r["half-time"] == r["half-time"]
        rows.append(
            {
                "η": f"{r['η']:.2f}",
                "B": r["B"],
                "half-time (steps)": f"{r['half-time']:.0f}" if reached else "—",
                "η²·half-time/B": f"{r['η²·half/B']:.2f}" if reached else "—",
                "mean deviation from the flow": f"{r['dev. from flow']:.3f}",
                "excess loss (nats)": f"{r['excess loss']:.4f}",
            }
        )
    caption = (
        "Half-time: the step at which the mean trace (over all runs) first falls below "
        "the midpoint of its start and the flattest minimiser's, interpolated between "
        "records; deviation: the mean "
        "relative deviation of the mean path from the flow; excess: averaged over a run"
    )
    return table(rows, caption=caption)


def manifold_slider(man: ManifoldResult):
    """A slider over (learning rate, batch size): the mean trace against the flow,
    and the runs on the first hyperbola at five times."""
    _check("man", man, ManifoldResult)

    def render(lr, batch):
        i = man.setting(lr, batch)
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(7.0, 2.9))
        steps = man.steps / 1000
        label = f"SGD (mean of {man.config.runs} runs)"
        a1.plot(steps, man.trace[:, i].mean(1), color=PALETTE["blue"], label=label)
        a1.plot(steps, man.flow(lr, batch), "k--", lw=1.2, label="flow prediction")
        a1.axhline(man.min_trace, color="grey", lw=0.8, ls=":", label="flattest")
        a1.set(
            ylim=(0, 14.5),
            xlabel="SGD step (thousands)",
            ylabel=r"tr $\nabla^2 L$",
            title=f"η = {lr}, B = {batch}",
        )
        a1.legend(fontsize=7)
        _hyperbola(a2, man, i, [0, 50, 100, 150, 200], "Runs on $u_1v_1=c_1$")
        a2.lines[0].set_label(None)
        a2.legend(fontsize=7)
        fig.tight_layout()
        return fig

    return slider_figure(
        render,
        {"lr": list(man.config.lrs), "batch": list(man.config.batches)},
        labels={"lr": "learning rate η", "batch": "batch size B"},
        initial={"lr": 3, "batch": 0},
    )


def dyck_table(dyck: dict, config: DyckConfig):
    """Each Dyck solution: pretraining loss, exact trace, mean downstream errors."""
    _check("config", config, DyckConfig)
    rows = []
    for name, d in dyck.items():
        row = {"solution": name, "loss": f"{d['loss']:.1e}", "tr ∇²L": d["trace"]}
        for N, e in zip(config.downstream_sizes, d["errors"].mean(1)):
            row[f"N = {N}"] = float(e)
        rows.append(row)
    caption = (
        "Pretraining loss, exact trace at the flattest rescaling, and mean downstream "
        f"error / Var τ over {config.draws} draws of N examples"
    )
    return table(rows, caption=caption)


def plot_dyck(dyck: dict, config: DyckConfig):
    """Traces of the Dyck solutions, and their downstream error against the number
    of examples."""
    _check("config", config, DyckConfig)
    names = list(dyck)
    mem = [k for k in names if k.startswith("memorising")]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.4))
    a1.bar(
        range(len(names)),
        [dyck[k]["trace"] for k in names],
        color=[PALETTE["green"]] + [PALETTE["red"]] * len(mem),
    )
    a1.set(
        xticks=range(len(names)),
        # "memorising 0" on two lines: on one, four labels run into each other
        xticklabels=[k.replace(" ", "\n") for k in names],
        ylabel=r"tr $\nabla^2 L$ (flattest rescaling)",
        title="Both fit the masked task exactly",
    )
    for k in names:
        flat = k == "transferable"
        label = (
            k if flat else (f"memorising ({len(mem)} draws)" if k == mem[0] else None)
        )
        a2.plot(
            config.downstream_sizes,
            dyck[k]["errors"].mean(1),
            "o-",
            color=PALETTE["green"] if flat else PALETTE["red"],
            alpha=1 if flat else 0.6,
            label=label,
        )
    a2.set(
        xscale="log",
        xlabel="downstream examples",
        ylabel=r"error / Var $\tau$",
        title="Downstream: predict the bracket surplus",
    )
    a2.legend()
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------
# the same-loss page
# --------------------------------------------------------------------------------------
#: the models of the same-loss experiment: (label, accuracy key, gap key, colour)
_MODELS = [
    ("look-up table", "lookup", None, "black"),
    ("pretrained", "pretrained", "pretrained", "blue"),
    ("control (Adam)", "control", "control", "green"),
    ("adversarial", "adversarial", "adversarial", "red"),
]


def _accuracies_and_gaps(res: dict):
    E = res["pretrained_gap"].shape[0]
    accs = [res["lookup_accuracy"].expand(E, -1)]
    accs += [res[f"{key}_accuracy"] for _, key, _, _ in _MODELS[1:]]
    gaps = [torch.zeros(E)] + [res[f"{key}_gap"] for _, _, key, _ in _MODELS[1:]]
    return accs, gaps


def plot_same_loss(res: dict, transition: torch.Tensor, sizes, tolerance: float):
    """The language's transitions, pretraining to saturation, transfer of every model
    against the probe's training size, and the loss gap against transfer."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.2))
    (a0, a1), (a2, a3) = axes
    im = a0.imshow(transition, cmap="Greys", vmin=0, vmax=1)
    a0.set(
        title="Transition matrix: two blocks, each a noisy cycle",
        xlabel="next state",
        ylabel="state",
    )
    fig.colorbar(im, ax=a0, fraction=0.046)
    a0.grid(False)
    E = res["pretrain_gap"].shape[1]
    for e in range(E):
        a1.plot(
            res["pretrain_steps"],
            res["pretrain_gap"][:, e],
            "o-",
            ms=3,
            label=f"seed {e}",
        )
    a1.axhline(tolerance, color="grey", ls=":", lw=1, label="tolerance ε")
    a1.set(
        yscale="log",
        xlabel="Adam step",
        ylabel="gap $L_{pre}-L^\\star_{pre}$ (nats)",
        title="Pretraining to saturation",
    )
    a1.legend(fontsize=8)
    accs, gaps = _accuracies_and_gaps(res)
    big = len(sizes) - 1
    for (lab, _, _, col), acc in zip(_MODELS, accs):
        a2.errorbar(
            sizes,
            acc.mean(0),
            yerr=acc.std(0),
            fmt="o-",
            color=PALETTE[col],
            label=lab,
            capsize=2,
        )
    a2.plot(
        sizes, res["posterior_accuracy"], "k:", lw=1, label="probe on exact posterior"
    )
    a2.axhline(float(res["bayes_accuracy"]), color="grey", lw=0.8)
    a2.set(
        xscale="log",
        xlabel="probe training examples $n$",
        ylabel="block accuracy",
        title=f"Same loss, different transfer (mean ± sd, {E} seeds)",
    )
    for (lab, _, _, col), g, acc in zip(_MODELS, gaps, accs):
        a3.scatter(
            g,
            acc[:, big],
            color=PALETTE[col],
            label=lab,
            s=30,
            marker="x" if lab == "look-up table" else "o",
        )
    a3.axvline(tolerance, color="grey", ls=":", lw=1)
    a3.set(
        xlabel="gap (nats)",
        ylabel=f"block accuracy, n = {sizes[big]}",
        title="Loss gap vs transfer, every model",
    )
    # one legend for both lower panels (the same models in the same colours), below
    # them: inside, the curves of the left panel would run through it
    handles, labels = a2.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda k: labels[k].startswith("probe"))
    fig.legend(
        [handles[k] for k in order],
        [labels[k] for k in order],
        loc="lower center",
        ncol=3,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def lookup_comparison_table(runs: dict, worlds):
    """The look-up table, the probe on the exact posterior and the Bayes accuracy, on
    each random language with tied and untied emissions."""
    rows = [
        {
            "world": w,
            "emissions": "tied" if tied else "untied",
            "look-up table": r["lookup"],
            "probe on exact posterior": r["posterior"],
            "Bayes": r["bayes"],
        }
        for tied, rs in runs.items()
        for w, r in zip(worlds, rs)
    ]
    return table(rows, caption="Block accuracy of the ridge probe (no training)")


def _styles(*entries, ms: float = 6):
    """Grey legend handles for line styles, one per (marker, line style, label)."""
    return [
        plt.Line2D([], [], color="grey", marker=m, ms=ms, ls=ls, label=label)
        for m, ls, label in entries
    ]


def bartlett_table(res: dict):
    """The three traces at the pretrained models, per seed."""
    rows = [
        {"seed": e, "tr Σ": c, "Fisher": f, "Hutchinson": h}
        for e, (c, f, h) in enumerate(
            zip(
                res["bartlett_covariance"].tolist(),
                res["bartlett_fisher"].tolist(),
                res["bartlett_hutchinson"].tolist(),
            )
        )
    ]
    caption = (
        "Hutchinson's standard error, summed over seeds: "
        f"{float(res['bartlett_hutchinson_se']):.2f}"
    )
    return table(rows, caption=caption)


def _noise_names(tres: dict, lrs) -> list[str]:
    return ["pretrained"] + [f"SGD, η = {lr}" for lr in lrs]


def noise_trace_table(tres: dict, lrs):
    """Gap and block traces of the pretrained transformer and of each continued run,
    with the decoder's closed form (mean ± sd over seeds)."""
    rows = []
    for k, name in enumerate(_noise_names(tres, lrs)):
        rows.append(
            {
                "model": name,
                "η²/B": "—" if k == 0 else f"{float(tres['noise'][k - 1]):.1e}",
                "gap (nats)": mean_sd(tres["gap"][k], "{:.4f}"),
                "encoder tr": mean_sd(tres["trace_encoder"][k]),
                "decoder tr": mean_sd(tres["trace_head"][k]),
                "closed form": mean_sd(tres["head_closed_form"][k]),
            }
        )
    caption = (
        "Decoder trace of a saturated model, (d+1)·E[1 − ‖p*‖²]: "
        f"{float(tres['head_language_constant']):.2f}"
    )
    return table(rows, caption=caption)


def noise_accuracy_table(tres: dict, lrs, sizes):
    """Block accuracy of the probe per model and training size (mean ± sd)."""
    acc = tres["accuracy"]
    rows = [
        {"model": name}
        | {f"n = {n}": mean_sd(acc[k, :, j], "{:.3f}") for j, n in enumerate(sizes)}
        for k, name in enumerate(_noise_names(tres, lrs))
    ]
    return table(rows, caption="Block accuracy of the probe; mean ± sd over seeds")


def plot_noise(tres: dict, sizes):
    """The transformer: pretraining, and the encoder trace and transfer against the
    noise level of continued SGD."""
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    a0, a1, a2 = axes
    E = tres["pretrain_gap"].shape[1]
    for e in range(E):
        a0.plot(
            tres["pretrain_steps"],
            tres["pretrain_gap"][:, e],
            "o-",
            ms=3,
            color=plt.cm.tab10(e),  # the seed's colour in the other panels and legend
        )
    a0.set(
        yscale="log",
        xlabel="Adam step",
        ylabel="gap (nats)",
        title="Transformer: pretraining",
    )
    noise_x = torch.cat([torch.tensor([tres["noise"][0] / 10]), tres["noise"]])
    for e in range(E):
        col = plt.cm.tab10(e)
        a1.plot(
            noise_x, tres["trace_encoder"][:, e], "o-", color=col, label=f"seed {e}"
        )
        a2.plot(noise_x, tres["accuracy"][:, e, 0], "s--", color=col, alpha=0.7)
        a2.plot(noise_x, tres["accuracy"][:, e, -1], "o-", color=col)
    for ax in (a1, a2):
        ax.set_xscale("log")
        ax.set_xticks(noise_x.tolist(), ["pre"] + [f"{v:.0e}" for v in tres["noise"]])
        ax.set_xlabel(r"noise level $\eta^2/B$ of continued SGD")
    a1.set(ylabel=r"encoder block of tr $\nabla^2 L_{pre}$", title="Encoder flatness")
    a2.set(ylabel="block accuracy", title="Transfer")
    # the probe sizes by style, in the band between them; the seeds (the colours of
    # every panel) below the figure: inside, the curves would cross them
    a2.legend(
        handles=_styles(("o", "-", f"n = {sizes[-1]}"), ("s", "--", f"n = {sizes[0]}")),
        loc="center right",
    )
    fig.legend(
        handles=[
            plt.Line2D([], [], color=plt.cm.tab10(e), marker="o", label=f"seed {e}")
            for e in range(E)
        ],
        loc="lower center",
        ncol=E,
    )
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig


def effects_table(effects: dict, fmt: str = "{:+.3f}"):
    """Per-seed effects, one row each: mean, standard error, sd and every seed."""
    rows = []
    for name, x in effects.items():
        e = SeedEffect.of(x)
        rows.append(
            {
                "effect": name,
                "mean": fmt.format(e.mean),
                "s.e.": fmt.format(e.se).lstrip("+"),
                "per seed": ", ".join(fmt.format(v) for v in e.samples),
            }
        )
    return table(rows)


def _stored_run_text(record: dict | None) -> str:
    """How a page's stored run was obtained (its ``"stored"`` record, with the run's
    ``"wall_seconds"``), for its prose."""
    if record is None:
        return "this run, at another configuration or seed offset, was computed here"
    first = stored.origin(record)
    return (
        f"it took {record['wall_seconds'] / 60:.1f} minutes of one CPU core "
        f"({first['machine']}, torch {first['torch']}, run on "
        f"{first['written'][:10]})"
    )


def prose_equal_loss(res: dict, cfg, tolerance: float) -> dict[str, str]:
    """The numbers the same-loss page quotes from its config and its run."""
    x = cfg
    n_gru = int(res["n_params"])
    return {
        "ch5_position": str(x.position + 1),
        "ch5_probe_sizes": "{" + ", ".join(f"{n:,}" for n in x.probe_sizes) + "}",
        "ch5_probe_test": f"{x.n_probe_test:,}",
        "ch5_gru_pre_steps": f"{x.pretrain_steps:,}",
        "ch5_gru_pre_batch": str(x.pretrain_batch),
        "ch5_gru_adv_steps": str(x.adversarial_steps),
        "ch5_gru_reconv_steps": str(x.reconverge_steps),
        "ch5_gru_n_trace": f"{x.n_trace:,}",
        "ch5_tolerance": str(tolerance),
        "ch5_n_bartlett": f"{x.n_bartlett:,}",
        "ch5_bartlett_probes": str(x.bartlett_probes),
        "ch5_entropy": f"{float(res['entropy'][0]):.3f}",
        "ch5_n_params": f"{n_gru:,}",
        "ch5_sl_stored": _stored_run_text(res.get("stored")),
        "ch5_n_seeds": str(x.n_models),
        "ch5_gap_compared": f"control {float(res['control_gap'].mean()):.4f} vs "
        f"adversarial {float(res['adversarial_gap'].mean()):.4f}",
        "ch5_n_sgd_seeds": str(len(res["bartlett_fisher"])),
        "ch5_rec_steps": f"{x.recovery_steps:,}",
        "ch5_rec_arms": " and ".join(
            f"learning rate {lr}, batch {b}"
            for lr, b in zip(x.recovery_lrs, x.recovery_batches)
        ),
        "ch5_rec_noise": " and ".join(
            f"{lr**2 / b:.1e}" for lr, b in zip(x.recovery_lrs, x.recovery_batches)
        ),
    }


def plot_recovery(res: dict, cfg, band: float):
    """Plain SGD from the adversarial models in each arm: the gain in transfer (mean ±
    s.e. over seeds at each probe size of the recovery), the loss gap minus its start
    (within ``band``, shaded), and the encoder's trace at the start and the end, beside
    the controls. One legend below the panels: colour is the arm, line style the probe
    size."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2))
    steps = res["recovery_steps"]
    cols = [PALETTE["sky"], PALETTE["blue"]]
    E = res["adversarial_gap"].shape[0]
    arms = list(zip(cfg.recovery_lrs, cfg.recovery_batches))
    styles = ("-", "--")
    for i, (lr, b) in enumerate(arms):
        acc, gap = res[f"recovery{i}_accuracy"], res[f"recovery{i}_gap"]
        for j, ls in enumerate(styles[: len(cfg.recovery_sizes)]):
            a = acc[:, :, j] - acc[0, :, j]  # gain over the start, per seed
            axes[0].errorbar(
                steps,
                a.mean(1),
                yerr=a.std(1) / E**0.5,
                fmt="o" + ls,
                color=cols[i],
                ms=3,
                capsize=2,
            )
        axes[1].plot(steps, gap - gap[0], "o-", color=cols[i], ms=3, alpha=0.6)
    axes[0].set(
        xlabel="plain SGD step from the adversarial model",
        ylabel="block accuracy minus the start's",
        title="Transfer recovers",
    )
    axes[1].axhspan(-band, band, color="grey", alpha=0.15)
    axes[1].set(
        xlabel="plain SGD step",
        ylabel="gap minus the start's gap (nats)",
        title="…at the same loss (band: grey)",
    )
    names = ["adversarial"] + [f"lr {lr}, B {b}" for lr, b in arms] + ["control"]
    vals = [res["adversarial_trace_encoder"]]
    vals += [res[f"recovery{i}_trace_encoder"] for i in range(len(arms))]
    vals.append(res["control_trace_encoder"])
    for k, v in enumerate(vals):
        axes[2].scatter(v, torch.full((len(v),), float(k)), color="grey", s=12)
        axes[2].errorbar(float(v.mean()), k, xerr=float(v.std()), fmt="o", color="k")
    axes[2].set_yticks(range(len(names)), names, fontsize=8)
    axes[2].invert_yaxis()
    axes[2].set(
        xlabel=r"encoder block of tr $\nabla^2 L_{pre}$",
        title="The encoder's trace",
    )
    handles = [
        Line2D([], [], color=cols[i], marker="o", ms=3, label=f"SGD lr {lr}, batch {b}")
        for i, (lr, b) in enumerate(arms)
    ] + [
        Line2D([], [], color="grey", ls=ls, label=f"probe n = {n:,}")
        for n, ls in zip(cfg.recovery_sizes, styles)
    ]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def prose_noise(tres: dict, cfg) -> dict[str, str]:
    """The numbers the transformer section quotes from its config and its run."""
    return {
        "ch5_tf_n_params": f"{int(tres['n_params']):,}",
        "ch5_tf_pre_steps": f"{cfg.pretrain_steps:,}",
        "ch5_tf_pre_batch": str(cfg.pretrain_batch),
        "ch5_tf_cont_steps": f"{cfg.continue_steps:,}",
        "ch5_tf_cont_batch": str(cfg.continue_batch),
        "ch5_tf_lrs": ", ".join(str(lr) for lr in cfg.continue_lrs),
        "ch5_tf_noise": ", ".join(f"{v:.1e}" for v in cfg.noise_levels),
        "ch5_tf_n_seeds": str(cfg.n_models),
        "ch5_tf_gaps": f"{float(tres['gap'].min()):.4f} to "
        f"{float(tres['gap'].max()):.4f}",
        "ch5_tf_stored": _stored_run_text(tres.get("stored")),
    }


def width_sweep_table(wres: dict, compared, sizes) -> Tables:
    """The stored width sweep as two tables, one row per (width, learning rate) in
    each (mean ± sd over seeds), the rows the chapter compares at equal loss marked
    with *: the gap and the probe's accuracy at every size; then the block traces, at
    each model's own width and with every model embedded at the largest width. (One
    table of all fourteen columns was wider than the page's column.)"""
    largest = max(wres["meta"]["config"]["widths"])
    accuracy, traces, seeds = [], [], set()
    for key, g in wres.items():
        if key == "meta":
            continue
        width, lr = key
        seeds.add(len(g["gap"]))
        first = {"width": f"{width}*" if key in compared else str(width)}
        first["lr"] = f"{lr:g}"
        accuracy.append(
            first
            | {"parameters": f"{g['n_params']:,}"}
            | {"gap (nats)": mean_sd(g["gap"], "{:.4f}")}
            | {
                f"n = {n}": mean_sd(g["accuracy"][:, j], "{:.3f}")
                for j, n in enumerate(sizes)
            }
        )
        traces.append(
            first
            | {
                "encoder": mean_sd(g["trace_encoder"], "{:.1f}"),
                "decoder": mean_sd(g["trace_head"], "{:.1f}"),
                f"encoder at d = {largest}": mean_sd(
                    g["trace_embedded_encoder"], "{:.1f}"
                ),
                f"decoder at d = {largest}": mean_sd(
                    g["trace_embedded_head"], "{:.1f}"
                ),
            }
        )
    over = f"mean ± sd over {'/'.join(str(s) for s in sorted(seeds))} seeds"
    mark = "* a row the chapter compares at equal loss"
    return Tables(
        table(
            accuracy,
            caption=(
                "The stored width sweep (untied language): the loss gap and the block "
                f"accuracy of the probe at each training size n; {over}; {mark}"
            ),
        ),
        table(
            traces,
            caption=(
                "The same models' block traces (the Fisher trace of the encoder's and "
                "the decoder's parameters), at the model's own width and embedded at "
                f"d = {largest}; {over}; {mark}"
            ),
        ),
    )


def plot_width_sweep(wres: dict, compared, sizes, tolerance: float):
    """Left: every model's gap against its width (each learning rate a marker);
    right: the probe's accuracy against width at equal loss, one line per n."""
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(10, 3.6))
    markers = {}
    for key, g in wres.items():
        if key == "meta":
            continue
        width, lr = key
        m = markers.setdefault(lr, "osD^v"[len(markers) % 5])
        jitter = width * (1 + 0.04 * (torch.arange(len(g["gap"])) - 2.5) / 2.5)
        a0.scatter(
            jitter,
            g["gap"],
            marker=m,
            s=22,
            color=PALETTE["blue"] if key in compared else PALETTE["red"],
        )
    lowest = min(float(wres[k]["gap"].mean()) for k in compared)
    a0.axhspan(lowest, lowest + tolerance, color="grey", alpha=0.15, lw=0)
    a0.legend(
        [plt.Line2D([], [], ls="", marker=m, color="k") for m in markers.values()],
        [f"lr {lr:g}" for lr in markers],
        fontsize=8,
    )
    a0.set(
        xscale="log",
        yscale="log",
        xlabel="width $d$",
        ylabel="gap $L_{pre}-L^\\star_{pre}$ (nats)",
        title="Pretraining (blue: compared at equal loss)",
    )
    widths = [w for w, _ in compared]
    for j, n in enumerate(sizes):
        acc = torch.stack([wres[k]["accuracy"][:, j] for k in compared])
        a1.errorbar(
            widths, acc.mean(1), yerr=acc.std(1), fmt="o-", capsize=2, label=f"n = {n}"
        )
    a1.axhline(
        float(wres[compared[0]]["bayes_accuracy"]), color="grey", lw=0.8, label="Bayes"
    )
    a1.set(
        xscale="log",
        xlabel="width $d$",
        ylabel="block accuracy of the probe",
        title="Transfer at equal loss (mean ± sd)",
    )
    all_widths = sorted({k[0] for k in wres if k != "meta"})
    for ax, ticks in ((a0, all_widths), (a1, widths)):
        ax.minorticks_off()
        ax.set_xticks(ticks, [str(w) for w in ticks])
    lo, hi = (
        min(float(g["gap"].min()) for k, g in wres.items() if k != "meta"),
        max(float(g["gap"].max()) for k, g in wres.items() if k != "meta"),
    )
    yt = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0) if lo / 2 <= t <= hi * 2]
    a0.set_yticks(yt, [f"{t:g}" for t in yt])
    a1.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_width_flatness(wres: dict, groups, compared, ranks: dict):
    """Left: the encoder's trace of every model of ``groups`` (the sweep's groups at
    equal loss) at its own width and embedded at the largest width, one colour per
    learning rate; right: the probe's accuracy (largest probe size) against the
    embedded encoder trace, one colour per learning rate and one marker per width, with
    the pooled rank correlations of the encoder's trace over ``compared`` and over
    ``groups`` (``ranks["encoder"]`` and ``ranks["all"]``, results of
    :func:`~fmlab.chapters.ch5_sgd_noise.width_trace_transfer_rank`)."""
    largest = max(wres["meta"]["config"]["widths"])
    n_big = wres["meta"]["config"]["probe_sizes"][-1]
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(10, 3.8))
    blocks = ("encoder", "embedded_encoder")
    rates = sorted({lr for _, lr in groups}, reverse=True)
    colour = {lr: PALETTE[c] for lr, c in zip(rates, ("blue", "orange", "green"))}
    widths = sorted({w for w, _ in groups})
    marker = {w: m for w, m in zip(widths, "os^Dv")}
    for key in groups:
        (w, lr), g = key, wres[key]
        x = torch.full_like(g["trace_encoder"], float(widths.index(w)))
        shift = 0.3 * (rates.index(lr) - (len(rates) - 1) / 2)
        own, emb = g["trace_encoder"], g["trace_embedded_encoder"]
        a0.scatter(x + shift - 0.06, own, s=16, fc="none", ec=colour[lr])
        a0.scatter(x + shift + 0.06, emb, s=16, color=colour[lr])
        a1.scatter(
            g["trace_embedded_encoder"],
            g["accuracy"][:, -1],
            color=colour[lr],
            marker=marker[w],
            s=30 if key in compared else 18,
            edgecolors="k" if key in compared else "none",
            linewidths=0.8,
        )
    a0.set_xticks(range(len(widths)), [str(w) for w in widths])
    top = max(float(wres[k][f"trace_{b}"].max()) for k in groups for b in blocks)
    a0.set_ylim(0, 1.5 * top)  # room for the legend above the points
    a0.legend(
        [plt.Line2D([], [], ls="", marker="o", color=colour[lr]) for lr in rates]
        + [
            plt.Line2D([], [], ls="", marker="o", mfc="none", color="grey"),
            plt.Line2D([], [], ls="", marker="o", color="grey"),
        ],
        [f"lr {lr:g}" for lr in rates] + ["own width", f"embedded at d = {largest}"],
        fontsize=8,
        ncol=2,
        loc="upper right",
    )
    a0.set(
        xlabel="width $d$",
        ylabel="encoder trace",
        title="Encoder flatness (lower is flatter)",
    )
    a1.legend(
        [plt.Line2D([], [], ls="", marker=marker[w], color="grey") for w in widths],
        [f"d = {w}" for w in widths],
        fontsize=8,
    )
    a1.set(
        xlabel=f"encoder trace embedded at d = {largest}",
        ylabel=f"probe block accuracy (n = {n_big})",
        title=f"Rank correlation {ranks['encoder']['pooled']:+.2f} (outlined), "
        f"{ranks['all']['pooled']:+.2f} (all)",
    )
    fig.tight_layout()
    return fig


def _learning_rates_text(groups: dict, compared) -> str:
    """Which learning rate each width trained with, as a sentence fragment: the rate of
    the compared group, and at a width with several rates, the others and their mean
    gaps."""
    by_width: dict = {}
    for w, lr in sorted(groups):
        by_width.setdefault(w, []).append(lr)
    chosen = dict(compared)
    single = [w for w, lrs in by_width.items() if len(lrs) == 1]
    parts = []
    if single:
        rates = sorted({by_width[w][0] for w in single})
        parts.append(
            " and ".join(f"{r:g}" for r in rates)
            + " at "
            + ("width " if len(single) == 1 else "widths ")
            + ", ".join(map(str, single))
        )
    for w, lrs in by_width.items():
        if len(lrs) == 1:
            continue
        pick = chosen.get(w, min(lrs, key=lambda r: groups[(w, r)]["gap"].mean()))
        others = ", ".join(
            f"{r:g} (mean gap {float(groups[(w, r)]['gap'].mean()):.3f} nats)"
            for r in sorted(lrs, reverse=True)
            if r != pick
        )
        parts.append(f"{pick:g} at width {w}, where the sweep also tried {others}")
    return "; ".join(parts)


def prose_width(wres: dict, compared) -> dict[str, str]:
    """The numbers the width-sweep prose quotes, as text for ``glue``: widths,
    parameters, seeds, tolerance, core minutes, the compared widths and their gaps, the
    left-out width's gap, the gains (widest − narrowest compared width) at every probe
    size, the accuracies at the largest, the Bayes accuracy, the decoder's trace per
    unit of d + 1, and the ledger's summary."""
    cfg = wres["meta"]["config"]
    groups = {k: g for k, g in wres.items() if k != "meta"}
    widths = sorted({w for w, _ in groups})
    first, last = wres[compared[0]], wres[compared[-1]]
    gain = last["accuracy"] - first["accuracy"]  # per seed and probe size
    gaps = torch.stack([wres[k]["gap"].mean() for k in compared])
    out_widths = [w for w in widths if w not in {w for w, _ in compared}]
    left = [
        min((k for k in groups if k[0] == w), key=lambda k: groups[k]["gap"].mean())
        for w in out_widths
    ]
    top = [float(wres[k]["accuracy"][:, -1].mean()) for k in compared]
    core = sum(float(g["seconds"].sum()) for g in groups.values())  # one core per job
    texts = {
        "ch5_w_widths": "{" + ", ".join(map(str, widths)) + "}",
        "ch5_w_params": f"{min(g['n_params'] for g in groups.values()):,} to "
        f"{max(g['n_params'] for g in groups.values()):,}",
        "ch5_w_seeds": str(len(first["gap"])),
        "ch5_w_tol": f"{cfg['tolerance']}",
        "ch5_w_core_minutes": f"{core / 60:.0f}",
        "ch5_w_compared": ", ".join(str(w) for w, _ in compared),
        "ch5_w_gaps": f"{gaps.min():.4f} to {gaps.max():.4f}",
        "ch5_w_narrow_gap": ", ".join(f"{groups[k]['gap'].mean():.3f}" for k in left)
        or "—",
        "ch5_w_acc_top": ", ".join(f"{a:.3f}" for a in top),
        "ch5_w_bayes": f"{first['bayes_accuracy']:.3f}",
        "ch5_w_dec_per_d": ", ".join(
            f"{float(wres[k]['trace_head'].mean()) / (k[0] + 1):.2f}" for k in compared
        ),
        "ch5_w_lrs": _learning_rates_text(groups, compared),
        "ch5_w_summary": f"{100 * float(gain[:, -1].mean()):+.1f} points "
        f"(n = {cfg['probe_sizes'][-1]}), d = {compared[0][0]} to "
        f"d = {compared[-1][0]}: not reproduced",
    }
    for j, n in enumerate(cfg["probe_sizes"]):
        g = SeedEffect.of(gain[:, j])
        texts[f"ch5_w_gain_{n}"] = f"{100 * g.mean:+.1f} ± {100 * g.se:.1f}"
    return texts


def prose_width_flatness(wres: dict, compared, equal, ranks: dict) -> dict[str, str]:
    """The numbers the prose on flatness across widths quotes, as text for ``glue``:
    the largest width, the largest logit change of a compared model's embedding, the
    encoder's and decoder's traces per compared width at their own width and embedded,
    the compared widths with the flattest and the sharpest embedded encoder, and the
    rank correlations (``ranks``: name -> result of
    :func:`~fmlab.chapters.ch5_sgd_noise.width_trace_transfer_rank`); for the widths
    with several learning rates among ``equal`` (the groups at equal loss), the
    embedded encoder trace and the accuracy at the largest and the smallest rate, and
    the mean accuracy change between them (points); and the number of models at equal
    loss."""
    largest = max(wres["meta"]["config"]["widths"])
    groups = [wres[k] for k in compared]

    def per_width(name, f="{:.1f}"):
        return ", ".join(f.format(float(wres[k][name].mean())) for k in compared)

    texts = {
        "ch5_wf_largest": str(largest),
        "ch5_wf_error": f"{max(float(g['embedding_error'].max()) for g in groups):.1e}",
        "ch5_wf_enc_own": per_width("trace_encoder"),
        "ch5_wf_enc_emb": per_width("trace_embedded_encoder"),
        "ch5_wf_dec_own": per_width("trace_head"),
        "ch5_wf_dec_emb": per_width("trace_embedded_head"),
    }
    enc = {k: float(wres[k]["trace_embedded_encoder"].mean()) for k in compared}

    def at(key):
        g = wres[key]
        return (
            f"{float(g['trace_embedded_encoder'].mean()):.1f} at lr {key[1]:g} "
            f"(accuracy {float(g['accuracy'][:, -1].mean()):.3f})"
        )

    pairs = width_lr_pairs(equal)
    texts["ch5_wf_by_lr"] = "; ".join(
        f"d = {big[0]}: {at(big)}, {at(small)}" for big, small in pairs
    )
    top = {k: float(wres[k]["accuracy"][:, -1].mean()) for pair in pairs for k in pair}
    texts["ch5_wf_lr_acc"] = ", ".join(
        f"{100 * (top[s] - top[b]):+.1f} (d = {b[0]})" for b, s in pairs
    )
    texts["ch5_wf_n_equal"] = str(sum(len(wres[k]["gap"]) for k in equal))
    for name, pick in (("flattest", min), ("sharpest", max)):
        w, lr = pick(enc, key=enc.get)
        texts[f"ch5_wf_{name}"] = f"d = {w} (learning rate {lr:g})"
    for block, r in ranks.items():
        e = SeedEffect.of(r["per_replicate"])
        texts[f"ch5_wf_rank_{block}"] = f"{r['pooled']:+.2f}"
        texts[f"ch5_wf_rank_{block}_rep"] = f"{e.mean:+.2f} ± {e.se:.2f}"
    return texts


def family_flatness_table(families: dict):
    """Flatness against transfer within one learning rate of the stored width sweep
    (page 05c): one row per trace and learning rate, ``families`` mapping a trace's name
    to the result of :func:`~fmlab.chapters.ch5_sgd_noise.width_family_flatness`."""
    rows = []
    for name, fam in families.items():
        for lr, f in fam.items():
            rows.append(
                {
                    "trace": name,
                    "learning rate": f"{lr:g}",
                    "widths": ", ".join(str(k[0]) for k in f["groups"]),
                    "models": f["n"],
                    "rank corr. with accuracy": f"{f['rank']:+.2f} ± "
                    f"{f['rank_se']:.2f}",
                    "the same, given the gap": f"{f['partial']:+.2f} ± "
                    f"{f['partial_se']:.2f}",
                    "gap's rank corr. with accuracy": f"{f['gap_rank']:+.2f}",
                }
            )
    return table(rows)


def prose_family_flatness(families: dict) -> dict[str, str]:
    """The numbers page 05c quotes on flatness within one learning rate of the width
    sweep, for the rate with the most widths at equal loss: the rate, its widths, the
    model count, the gap's rank correlation with the accuracy, and per trace
    (``families``: name -> result of
    :func:`~fmlab.chapters.ch5_sgd_noise.width_family_flatness`) the rank and partial
    correlations with their standard errors."""
    first = next(iter(families.values()))
    lr = max(first, key=lambda r: (len(first[r]["groups"]), -r))
    f = first[lr]
    texts = {
        "ch5_ff_lr": f"{lr:g}",
        "ch5_ff_widths": ", ".join(str(k[0]) for k in f["groups"]),
        "ch5_ff_n": str(f["n"]),
        "ch5_ff_gap_rank": f"{f['gap_rank']:+.2f}",
    }
    for name, fam in families.items():
        g = fam[lr]
        texts[f"ch5_ff_{name}_rank"] = f"{g['rank']:+.2f} ± {g['rank_se']:.2f}"
        texts[f"ch5_ff_{name}_partial"] = f"{g['partial']:+.2f} ± {g['partial_se']:.2f}"
    return texts


def size_sweep_table(sres: dict, compared):
    """The stored size sweep of page 05c (``fmlab.chapters.ch5_size``): one row per
    hidden size, with its parameters, gap and the probe's expected accuracy at every
    probe size (mean ± sd over replicates), and whether it is among the ``compared``
    sizes at equal loss."""
    sizes = sres["meta"]["config"]["probe_sizes"]
    rows = []
    for h in sorted(k for k in sres if k != "meta"):
        g = sres[h]
        row = {
            "hidden size": h,
            "parameters": f"{g['n_params']:,}",
            "gap (nats)": mean_sd(g["gap"], "{:.4f}"),
        }
        for j, n in enumerate(sizes):
            row[f"n = {n:,}"] = mean_sd(g["accuracy"][:, j], "{:.3f}")
        row["equal loss"] = "yes" if h in compared else ""
        rows.append(row)
    return table(rows)


def prose_size(sres: dict, compared) -> dict[str, str]:
    """The numbers page 05c quotes from the stored size sweep: its design (sizes,
    replicates, steps, projection, tolerance), the Bayes accuracy, the compared sizes
    and their gaps, and the gain of the largest over the smallest compared size at
    every probe size (points, mean ± standard error over replicates)."""
    cfg = sres["meta"]["config"]
    sizes = sorted(k for k in sres if k != "meta")
    lo, hi = sres[compared[0]], sres[compared[-1]]
    texts = {
        "ch5_sz_sizes": ", ".join(str(h) for h in sizes),
        "ch5_sz_models": str(cfg["n_models"]),
        "ch5_sz_steps": f"{cfg['steps']:,}",
        "ch5_sz_batch": str(cfg["batch"]),
        "ch5_sz_proj": str(cfg["projection"]),
        "ch5_sz_tol": f"{cfg['tolerance']}",
        "ch5_sz_bayes": f"{float(lo['bayes_accuracy']):.3f}",
        "ch5_sz_compared": ", ".join(str(h) for h in compared),
        "ch5_sz_gaps": ", ".join(f"{float(sres[h]['gap'].mean()):.4f}" for h in sizes),
        "ch5_sz_acc_top": ", ".join(
            f"{float(sres[h]['accuracy'][:, -1].mean()):.3f}" for h in compared
        ),
        "ch5_sz_minutes": f"{sum(float(sres[h]['seconds']) for h in sizes) / 60:.0f}",
    }
    for j, n in enumerate(cfg["probe_sizes"]):
        e = SeedEffect.of(100 * (hi["accuracy"][:, j] - lo["accuracy"][:, j]))
        texts[f"ch5_sz_gain_{n}"] = f"{e.mean:+.2f} ± {e.se:.2f}"
    return texts


def size_trace_table(sres: dict, compared):
    """Flatness along the stored size sweep of page 05c: one row per ``compared`` size
    (at equal loss), the gap (in thousandths of a nat), each block's Fisher trace at its
    own width and embedded at the largest size
    (:func:`fmlab.chapters.ch5_size.embed_hidden`) and moved to the common gap (the
    columns marked *, ``size_trace_at_matched_gap`` of :mod:`fmlab.chapters.ch5_size`),
    and the probe's
    expected accuracy at the largest probe size, mean ± sd over replicates."""
    from .ch5_size import size_trace_at_matched_gap

    enc = size_trace_at_matched_gap(sres, compared, "encoder")
    head = size_trace_at_matched_gap(sres, compared, "head")
    n = sres["meta"]["config"]["probe_sizes"][-1]
    return table(  # seven short columns: the page's column is narrow
        [
            {
                "hidden": h,
                "gap (10⁻³ nats)": mean_sd(1000 * enc["gap"][i], "{:.1f}"),
                "encoder, own size": mean_sd(enc["native"][i]),
                "encoder, embedded*": mean_sd(enc["adjusted"][i]),
                "head, own size": mean_sd(head["native"][i]),
                "head, embedded*": mean_sd(head["adjusted"][i]),
                f"accuracy (n = {n:,})": mean_sd(sres[h]["accuracy"][:, -1], "{:.3f}"),
            }
            for i, h in enumerate(compared)
        ]
    )


def prose_size_traces(sres: dict, compared) -> dict[str, str]:
    """The numbers page 05c quotes on flatness along the size sweep: the embedding's
    size and largest logit change, the change of each block's embedded trace at the
    common gap from the smallest to the largest ``compared`` size (mean ± standard
    error over replicates, in percent, and in how many replicates the largest size is
    the flatter), the within-size
    slopes, and the partial rank correlation of the embedded encoder trace with the
    accuracy given the gap over all compared models."""
    from .ch5_sgd_noise import partial_rank_correlation
    from .ch5_size import size_trace_at_matched_gap

    out = {
        "ch5_szf_largest": str(max(k for k in sres if k != "meta")),
    }
    error = max(float(sres[h]["embedding_error"].max()) for h in compared)
    out["ch5_szf_error"] = f"{error:.1e}"
    for block in ("encoder", "head"):
        t = size_trace_at_matched_gap(sres, compared, block)
        d = t["adjusted"][-1] - t["adjusted"][0]
        e = SeedEffect.of(d)
        out[f"ch5_szf_{block}_change"] = f"{e.mean:+.2f} ± {e.se:.2f}"
        out[f"ch5_szf_{block}_pct"] = (
            f"{100 * e.mean / float(t['adjusted'][0].mean()):+.0f}%"
        )
        out[f"ch5_szf_{block}_flatter"] = f"{int((d < 0).sum())} of {d.numel()}"
        out[f"ch5_szf_{block}_slope"] = f"{t['slope']:+.0f}"
    t = size_trace_at_matched_gap(sres, compared, "encoder")
    acc = torch.stack([sres[h]["accuracy"][:, -1] for h in compared])
    r = partial_rank_correlation(t["trace"], acc, t["gap"])
    out["ch5_szf_partial_rank"] = f"{r:+.2f}"
    return out


def ceilings_table(ceilings: dict, rooms: dict):
    """The exact ceilings of page 05c (:func:`fmlab.chapters.ch5_room.probe_ceilings`):
    one row per world and probe size, the Bayes accuracy beside the probe on the exact
    posterior, on the look-up table and on the raw tokens."""
    rows = []
    for name, out in ceilings.items():
        for j, n in enumerate(rooms[name].probe_sizes):
            rows.append(
                {
                    "world": name,
                    "probe examples": f"{n:,}",
                    "Bayes": f"{out['bayes']:.3f}",
                    "exact posterior": f"{out['posterior'][j]:.3f}",
                    "look-up table": f"{out['lookup'][j]:.3f}",
                    "raw tokens": f"{out['tokens'][j]:.3f}",
                }
            )
    return table(
        rows, caption="Expected accuracy of the ridge probe (no model trained)"
    )


def prose_ceilings(ceilings: dict, rooms: dict) -> dict[str, str]:
    """The numbers page 05c quotes from the ceilings, for each world ``i`` (in order):
    its Bayes accuracy, the posterior probe and the look-up table at the largest probe
    size, and the room between them (points)."""
    texts = {}
    for i, (name, out) in enumerate(ceilings.items()):
        j = len(rooms[name].probe_sizes) - 1
        texts[f"ch5_rm_bayes_{i}"] = f"{out['bayes']:.3f}"
        texts[f"ch5_rm_post_{i}"] = f"{out['posterior'][j]:.3f}"
        texts[f"ch5_rm_lut_{i}"] = f"{out['lookup'][j]:.3f}"
        room = 100 * (out["posterior"][j] - out["lookup"][j])
        texts[f"ch5_rm_room_{i}"] = f"{room:.0f}"
        texts[f"ch5_rm_n_{i}"] = f"{rooms[name].probe_sizes[j]:,}"
    return texts
