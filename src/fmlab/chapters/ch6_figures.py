"""Chapter 6's figures, slider and tables.

The first page (:mod:`fmlab.chapters.ch6_bayes`): the GINC world, the posterior and
accuracy of the exact Bayes predictor over the number of examples, the smoothing sweep
and the slider over one prompt's posterior. The second page
(:mod:`fmlab.chapters.ch6_icl`): pretraining, the transformers' in-context accuracy
beside the Bayes predictor's, the agreement of the two, the losses inside documents and
examples, and the tables. Each function draws from a runner's result and computes
nothing a claim decides.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch

from ..data.ginc import GINC, ginc_bayes_predictor
from ..repro import make_generator
from ..viz import PALETTE, slider_figure, table
from .ch6_bayes import BayesCurves, SmoothingSweep
from .ch6_icl import BoundaryDiagnostics, Chapter6Config, TransformerICL

__all__ = [
    "plot_world",
    "plot_bayes_curves",
    "plot_smoothing",
    "posterior_slider",
    "plot_ginc_pretraining",
    "plot_in_context",
    "in_context_table",
    "room_table",
    "plot_agreement",
    "plot_diagnostics",
    "paper_comparison",
    "model_text",
    "prose_diagnostics",
    "worlds_table",
    "paper_size_text",
    "prose_worlds",
]


# -- the first page: the exact Bayes predictor ----------------------------------------
def plot_world(world: GINC, names):
    """The memory matrix (delimiter column in red), the entity chain and the property
    chains of the first five concepts."""
    cfg = world.config
    shown = min(5, len(world.property_transitions))  # the first five concepts
    # the memory, with a token in each of its cells, takes the left of the figure at
    # full height; the chains are small squares in two rows beside it
    cols = (shown + 2) // 2  # the entity chain and the concepts, in two rows
    fig = plt.figure(figsize=(8.5, 3.6), layout="constrained")
    grid = fig.add_gridspec(2, 1 + cols, width_ratios=[2.3] + [1] * cols)
    ax = fig.add_subplot(grid[:, 0])
    chains = [fig.add_subplot(grid[i // cols, 1 + i % cols]) for i in range(1 + shown)]
    ax.imshow(np.zeros_like(world.memory.numpy()), cmap="Greys", vmin=0, vmax=1)
    for e in range(cfg.n_entities):
        for s in range(cfg.n_properties):
            colour = PALETTE["red"] if s == 0 else "black"
            ax.text(
                s,
                e,
                names[int(world.memory[e, s])],
                ha="center",
                va="center",
                fontsize=9,
                color=colour,
            )
    ax.set(
        title="memory M", xlabel="property s", ylabel="entity e", xticks=[], yticks=[]
    )
    ax.grid(False)
    chains[0].imshow(world.entity_transition.numpy(), cmap="Blues", vmin=0, vmax=1)
    chains[0].set(title="entities A", xticks=[], yticks=[])
    for c in range(shown):
        chains[1 + c].imshow(
            world.property_transitions[c].numpy(), cmap="Blues", vmin=0, vmax=1
        )
        chains[1 + c].set(title=f"concept {c}: $B^{{({c})}}$", xticks=[], yticks=[])
    for axx in chains:
        axx.grid(False)
        axx.title.set_fontsize(10)
    return fig


def plot_bayes_curves(curves: BayesCurves):
    """The mean posterior of the prompt concept (left) and the Bayes accuracy (right)
    over the number of examples, one line per example length (± sd over seeds)."""
    ns = np.array(curves.ns)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for j, k in enumerate(curves.ks):
        for axx, arr in zip(axes, (curves.posterior, curves.accuracy)):
            axx.errorbar(
                ns,
                arr[:, :, j].mean(0),
                arr[:, :, j].std(0),
                marker="o",
                capsize=2,
                label=f"k = {k}",
            )
    axes[0].set(
        xlabel="number of examples n",
        ylabel=r"mean $p^\varepsilon(c^\star\mid S_n)$",
        title="Posterior of the prompt concept",
    )
    axes[1].set(
        xlabel="number of examples n",
        ylabel="accuracy",
        title="Bayes-optimal in-context accuracy",
    )
    axes[0].legend()
    return fig


def plot_smoothing(sweep: SmoothingSweep):
    """Bayes accuracy over n for every smoothing at k = 3 and 5, and the share of
    prompts impossible under every concept without smoothing."""
    scfg = sweep.config
    # constrained layout keeps room below the panels for the legend of the ε lines
    fig, axes = plt.subplots(1, 3, figsize=(8.5, 3.6), layout="constrained")
    for eps, arr in sweep.accuracy.items():
        for j, axx in enumerate(axes[:2]):
            axx.plot(scfg.ns, arr[:, :, j].mean(0), "o-", label=f"ε = {eps:g}")
    impossible0 = sweep.impossible[0.0]
    for j, k in enumerate(scfg.ks[:2]):
        axes[j].set(
            xlabel="number of examples n", ylabel="Bayes accuracy", title=f"k = {k}"
        )
        axes[2].plot(scfg.ns, impossible0[:, :, j].mean(0), "s-", label=f"k = {k}")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels))
    axes[2].set(
        xlabel="number of examples n",
        ylabel="fraction",
        title="ε = 0: prompts impossible\nunder every concept",
    )
    axes[2].legend()
    return fig


def posterior_slider(
    world: GINC, cfg: Chapter6Config, curves: BayesCurves, names, concept: int = 1
):
    """Sliders over n and k. Left: the exact posterior over the pretraining concepts
    (log scale) for one prompt of ``concept`` (seed ``500 + k``), with the prompt
    below. Right: the Bayes accuracy over n at that k (mean over seeds), n marked."""
    ns, bks = np.array(curves.ns), list(curves.ks)
    C = cfg.world.n_seen
    one_prompt = {
        k: world.sample_prompts(
            1, max(cfg.ns), k, make_generator(500 + k), concepts=torch.tensor([concept])
        )
        for k in bks
    }
    ba = curves.accuracy.mean(0)

    def render(n, k):
        pr = one_prompt[k].with_examples(n)
        res = ginc_bayes_predictor(world, pr.tokens, cfg.epsilon)
        postr = res.posterior[0].clamp_min(1e-30).numpy()
        fig, (ax1, ax2) = plt.subplots(
            1, 2, figsize=(9.6, 3.1), gridspec_kw={"width_ratios": [1, 1.15]}
        )
        cols = [
            PALETTE["orange"] if c == int(pr.concepts[0]) else PALETTE["blue"]
            for c in range(C)
        ]
        ax1.bar(range(C), postr, color=cols, bottom=1e-30)
        ax1.set(
            yscale="log",
            ylim=(1e-30, 30),
            xticks=range(C),
            xlabel="concept c",
            ylabel=r"$p^\varepsilon(c\mid S_n)$",
            title=f"Bayes predicts '{names[int(res.prediction[0])]}', "
            f"label '{names[int(pr.labels[0])]}'",
        )
        ax1.set_yticks(  # few ticks, plain labels: log axes draw slowly
            [1e-30, 1e-20, 1e-10, 1.0], ["1e-30", "1e-20", "1e-10", "1"]
        )
        ax1.minorticks_off()
        j = bks.index(k)
        ax2.plot(
            ns,
            ba[:, j],
            marker="o",
            ms=3,
            color=PALETTE["black"],
            ls="--",
            label="Bayes, seen concepts",
        )
        ax2.axvline(n, color=PALETTE["purple"], lw=1)
        ax2.set(
            ylim=(0, 1.02),
            xlabel="number of examples n",
            ylabel="accuracy",
            title=f"k = {k}: in-context accuracy",
        )
        ax2.legend(fontsize=8, loc="lower right")
        text = world.decode(pr.tokens[0])
        text = text if len(text) < 150 else "… " + text[-148:]
        fig.tight_layout()
        # below the axes' labels (tight_layout keeps those inside the figure), growing
        # downwards when the prompt wraps onto a second line
        fig.text(
            0.01, -0.02, "prompt: " + text, va="top", fontsize=9, family="monospace"
        )
        return fig

    return slider_figure(
        render,
        {"n": list(cfg.ns), "k": bks},
        labels={"n": "examples n", "k": "example length k"},
        initial={"n": 0, "k": 0},
    )


# -- the second page: the trained transformers ----------------------------------------
def plot_ginc_pretraining(res: TransformerICL, cfg: Chapter6Config):
    """The first run's training loss (means over 40 steps) beside its validation loss,
    the best context-free loss and the Bayes-optimal loss."""
    w = min(40, len(res.losses))  # steps per mean
    smooth = res.losses.unfold(0, w, w).mean(1)
    fig, ax = plt.subplots()
    ax.plot(
        torch.arange(len(smooth)) * w + w // 2,
        smooth,
        label="training loss (random windows of the corpus)",
    )
    ax.axhline(
        res.unigram,
        color=PALETTE["sky"],
        ls="-.",
        label=f"best context-free (unigram) loss {res.unigram:.3f}",
    )
    ax.axhline(
        res.val_loss[0],
        color=PALETTE["orange"],
        ls="--",
        label=f"validation loss {res.val_loss[0]:.3f}",
    )
    ax.axhline(
        res.bayes_loss,
        color=PALETTE["black"],
        ls=":",
        label=f"Bayes-optimal loss {res.bayes_loss:.3f}",
    )
    ax.set(
        xlabel="step",
        ylabel="next-token cross-entropy (nats)",
        ylim=(1.0, max(4.0, res.unigram + 0.3)),  # every line the legend names
        title=f"Pretraining a {cfg.n_layers}-layer transformer of width {cfg.width}",
    )
    ax.legend()
    return fig


def plot_in_context(res: TransformerICL):
    """In-context accuracy over n at each k the transformer reads: the first run
    (solid) beside the Bayes predictor (dashed), on seen and unseen concepts (± sd over
    evaluation seeds), and the random-concept learner on unseen concepts (dotted)."""
    ns = np.array(res.ns)
    acc, acc_un = res.stack("seen", "accuracy"), res.stack("unseen", "accuracy")
    bayes = res.stack("seen", "bayes_accuracy", bayes=True)
    bayes_un = res.stack("unseen", "bayes_accuracy", bayes=True)
    # constrained layout keeps room below the panels for the legend
    fig, axes = plt.subplots(
        1,
        len(res.ks),
        figsize=(8.5, 3.6),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    axes = axes[0]
    for j, k in enumerate(res.ks):
        axx = axes[j]
        series = [
            (bayes[:, :, j], "Bayes, seen", PALETTE["black"], "--"),
            (acc[:, :, j], "transformer, seen", PALETTE["blue"], "-"),
            (bayes_un[:, :, j], "Bayes, unseen", PALETTE["red"], "--"),
            (acc_un[:, :, j], "transformer, unseen", PALETTE["orange"], "-"),
        ]
        for arr, lab, col, ls in series:
            axx.errorbar(
                ns,
                arr.mean(0),
                arr.std(0),
                color=col,
                ls=ls,
                marker="o",
                ms=3,
                capsize=2,
                label=lab,
            )
        axx.axhline(
            res.chance_unseen[k],
            color="grey",
            lw=1,
            ls=":",
            label="random pretraining concept",
        )
        axx.set(title=f"k = {k}", ylim=(0, 1.02), xlabel="number of examples n")
    axes[0].set_ylabel("in-context accuracy")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3)
    return fig


def in_context_table(res: TransformerICL):
    """Accuracy on seen concepts over n, transformer (first run) and Bayes predictor,
    mean ± sd over evaluation seeds."""
    acc = res.stack("seen", "accuracy")
    bayes = res.stack("seen", "bayes_accuracy", bayes=True)
    rows = []
    for i, n in enumerate(res.ns):
        row = {"n": n}
        for j, k in enumerate(res.ks):
            row[f"transformer, k = {k}"] = (
                f"{acc[:, i, j].mean():.3f} ± {acc[:, i, j].std():.3f}"
            )
            row[f"Bayes, k = {k}"] = (
                f"{bayes[:, i, j].mean():.3f} ± {bayes[:, i, j].std():.3f}"
            )
        rows.append(row)
    return table(
        rows,
        caption="Accuracy on seen concepts (mean ± sd over evaluation seeds)",
    )


def room_table(res: TransformerICL):
    """At each k: the Bayes predictor's accuracy at n = 0 and its gain to the largest
    n (the room examples have), beside the transformer's (first run); means over the
    evaluation seeds."""
    acc = res.stack("seen", "accuracy").mean(0)
    bayes = res.stack("seen", "bayes_accuracy", bayes=True).mean(0)
    gain = {k: res.gains("seen", k) for k in res.ks}
    bayes_gain = {k: res.gains("seen", k, bayes=True) for k in res.ks}
    rows = [
        {
            "k": k,
            "Bayes, n = 0": bayes[0, j],
            "Bayes gain": f"{bayes_gain[k].mean():+.3f}",
            "transformer, n = 0": acc[0, j],
            "transformer gain": f"{gain[k].mean():+.3f}",
        }
        for j, k in enumerate(res.ks)
    ]
    return table(rows, caption="The room examples have, and what the transformer uses")


def plot_agreement(res: TransformerICL):
    """How often the first run predicts what the Bayes predictor predicts, over n, one
    line per k (± sd over evaluation seeds), beside chance agreement."""
    ns = np.array(res.ns)
    agree = res.stack("seen", "agreement")
    chance = res.stack("seen", "chance_agreement")
    fig, ax = plt.subplots(figsize=(7.5, 3.3), layout="constrained")
    for j, k in enumerate(res.ks):
        ax.errorbar(
            ns,
            agree[:, :, j].mean(0),
            agree[:, :, j].std(0),
            marker="o",
            capsize=2,
            label=f"k = {k}",
        )
    ax.plot(ns, chance.mean((0, 2)), "k:", label="chance agreement (mean over k)")
    ax.set(
        xlabel="number of examples n",
        ylabel="P(transformer = Bayes)",
        ylim=(0, 1),
        title="Agreement with the Bayes predictor",
    )
    # the legend beside the axes, off the chance line and the curves
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return fig


def plot_diagnostics(diag: BoundaryDiagnostics, window: int):
    """Left: the next-token loss along pretraining documents of the transformer, the
    Bayes predictor and the predictor told the concept (log position axis). Right: the
    loss inside each example of prompts with eight examples."""
    pos = np.arange(2, window + 2)  # position of the predicted token
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 3.5))
    for name, lab, col, ls in (
        ("model", "transformer", PALETTE["blue"], "-"),
        ("bayes", "Bayes predictor", PALETTE["black"], "--"),
        ("oracle", "told the concept", PALETTE["orange"], ":"),
    ):
        curve = np.stack([getattr(d, name).numpy() for d in diag.documents])
        ax1.plot(pos, curve.mean(0), color=col, ls=ls, label=lab)
    ax1.set(
        xscale="log",
        xticks=[2, 4, 8, 16, 32, 64],
        xticklabels=["2", "4", "8", "16", "32", "64"],
        xlabel="position of the predicted token",
        ylabel="next-token loss (nats)",
        title="Pretraining documents",
    )
    ax1.minorticks_off()
    ax1.legend(fontsize=8)
    for (k, exs), mk in zip(diag.examples.items(), ("o", "s")):
        ex_m = np.stack([e.model.numpy() for e in exs])
        ex_b = np.stack([e.bayes.numpy() for e in exs])
        i_ex = np.arange(1, ex_m.shape[1] + 1)
        ax2.plot(
            i_ex,
            ex_m.mean(0),
            color=PALETTE["blue"],
            marker=mk,
            label=f"transformer, k = {k}",
        )
        ax2.plot(
            i_ex,
            ex_b.mean(0),
            color=PALETTE["black"],
            ls="--",
            marker=mk,
            label=f"Bayes, k = {k}",
        )
    ax2.axvspan(0.5, 1.5, color=PALETTE["sky"], alpha=0.2, lw=0)
    ax2.set(
        xlabel="example (1: no boundary before it)",
        ylabel="loss inside the example (nats)",
        title="Prompts with eight examples",
    )
    ax2.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig


def model_text(cfg: Chapter6Config, res: TransformerICL) -> str:
    """The transformer in words: layers, width, parameters."""
    return f"{cfg.n_layers} layers, width {cfg.width}, {res.n_params:,} parameters"


def paper_comparison(cfg: Chapter6Config, res: TransformerICL, effect: dict, unseen):
    """The paper's setting and numbers (Xie et al. 2022 at V = 150, the authors'
    stored results) beside this chapter's; ``effect[k]`` and ``unseen`` are the
    keyed gains (:class:`fmlab.SeedEffect`)."""
    pcfg = cfg.pretrain_config()
    val = np.mean(res.val_loss)
    gk = {k: f"{effect[k].mean:+.3f} ± {effect[k].se:.3f}" for k in cfg.ks}
    rows = [
        ("world", "10 entities × 10 properties, V = 150, 5 + 5 concepts", "the same"),
        (
            "pretraining data",
            "1 000 documents × 10 240 tokens of the HMMs",
            f"200 × 5 120 tokens, state jumps at rate {cfg.corpus_eps}",
        ),
        ("model", "GPT-2, 4 layers, width 768 (the smallest)", model_text(cfg, res)),
        (
            "training",
            "6 250 steps × 8 windows of 1 024 tokens",
            f"{pcfg.steps} steps × {pcfg.batch_size} windows of {pcfg.window} tokens",
        ),
        (
            "training runs",
            "5 seeds",
            f"{len(cfg.model_seeds)} seeds × {len(cfg.eval_seeds)} evaluation seeds",
        ),
        (
            "validation loss (Bayes)",
            "not reported",
            f"{val:.2f} ({res.bayes_loss:.2f})",
        ),
        ("gain n = 0 → 8, k = 3", "+0.147", gk[3]),
        ("gain n = 0 → 8, k = 5", "+0.108", gk[5]),
        (
            "gain on unseen concepts",
            "fails (held-out concept labels)",
            f"{unseen.mean:+.3f} ± {unseen.se:.3f}",
        ),
    ]
    cols = ("", "Xie et al. 2022 (V = 150, authors' stored results)", "this chapter")
    return table(
        [dict(zip(cols, r)) for r in rows], caption="The paper and this chapter"
    )


def prose_diagnostics(gap_early: dict, gap_late: dict, excess: dict, share) -> dict:
    """The numbers the text quotes from the losses inside documents: the excess losses
    over the predictor told the concept early and late in the window, and over the Bayes
    predictor after an entity change and where the entity stays."""
    return {
        "ch6_gap_early": f"{gap_early['model'].mean():.2f}",
        "ch6_gap_late": f"{gap_late['model'].mean():.2f}",
        "ch6_bgap_early": f"{gap_early['bayes'].mean():.2f}",
        "ch6_bgap_late": f"{gap_late['bayes'].mean():.2f}",
        "ch6_excess_change": f"{excess['after_change'].mean():.2f}",
        "ch6_excess_steady": f"{excess['steady'].mean():.2f}",
        "ch6_change_share": f"{100 * share:.0f}%",
    }


def _mean(values) -> float:
    return float(np.mean(values))


def worlds_table(worlds, smoothed: dict | None = None):
    """The stored runs across worlds (:func:`fmlab.chapters.ch6_worlds.
    worlds_results`), one row per world: the transformer's gain from n = 0 to 8 on the
    paper's documents at k = 3 / 5 (mean over training runs x evaluation seeds),
    ``smoothed`` (``{offset: (gain k = 3, gain k = 5)}``: the page's own runs on
    documents with jumps, where measured), the gains of the Bayes predictor of the
    documents with jumps (rate 0.15) and of the paper's documents (smoothing 1e-8),
    the share of prompts with eight examples impossible under every unsmoothed
    pretraining HMM, and the share of concept pairs that meet the distinguishability
    condition (smoothing 0.01)."""
    smoothed = smoothed or {}
    rows = []
    for w in worlds["worlds"]:
        o = w["offset"]

        def pair(d):
            return " / ".join(f"{_mean(d[k]):+.3f}" for k in ("3", "5"))

        sm = smoothed.get(o)
        rows.append(
            {
                "world": o,
                "transformer, paper's documents": pair(w["gain"]),
                "transformer, with jumps": (
                    "" if sm is None else " / ".join(f"{v:+.3f}" for v in sm)
                ),
                "Bayes, with jumps": pair(w["bayes_gain_eps0.15"]),
                "Bayes, paper's documents": pair(w["bayes_gain_eps1e-08"]),
                "impossible prompts": " / ".join(
                    f"{w['impossible'][k]:.2f}" for k in ("3", "5")
                ),
                "distinguishable pairs": " / ".join(
                    f"{w['distinguishable'][k]:.2f}" for k in ("3", "5")
                ),
            }
        )
    return table(
        rows,
        caption="Gains from n = 0 to 8 examples at k = 3 / 5, per world (stored run)",
    )


def paper_size_text(paper) -> str:
    """One sentence on the stored run at the paper's model size: its gains per world,
    or that the file is absent."""
    if paper is None:
        return (
            "The run at the paper's model size (scripts/ch6_worlds.py --scale paper "
            "--device cuda) has not been made yet: its results file is absent."
        )
    parts = [
        f"world {w['offset']}: "
        + " / ".join(f"{_mean(w['gain'][k]):+.3f}" for k in ("3", "5"))
        for w in paper["worlds"]
    ]
    return (
        "At the paper's model size (4 layers of width 768 on the paper's corpus), "
        "the gains at k = 3 / 5 are " + "; ".join(parts) + "."
    )


_COUNTS = ("none", "one", "two", "three", "four", "five", "six", "seven", "eight")


def prose_worlds(worlds, per_world: dict, held: list, paper) -> dict:
    """The numbers and sentences the text quotes from the stored runs across worlds:
    the pooled gain, the worlds where the gain holds by the margin rule (``held``)
    and the others, and how the worlds of each group differ in the Bayes gain of the
    paper's documents, the share of impossible prompts and of distinguishable pairs
    (means over ``k = 3`` and ``5``)."""
    pooled = np.concatenate(list(per_world.values()))
    failed = [o for o in per_world if o not in held]
    by = {w["offset"]: w for w in worlds["worlds"]}

    def avg(offsets, field, inner=_mean):
        if not offsets:
            return float("nan")
        return float(
            np.mean(
                [np.mean([inner(v) for v in by[o][field].values()]) for o in offsets]
            )
        )

    def describe(offsets):
        return (
            f"Bayes gain {avg(offsets, 'bayes_gain_eps1e-08'):+.3f}, "
            f"{avg(offsets, 'impossible', float):.2f} of the prompts impossible, "
            f"{avg(offsets, 'distinguishable', float):.2f} of the pairs distinguishable"
        )

    offsets = list(per_world)
    model = np.array([per_world[o].mean() for o in offsets])
    exact = np.array([avg([o], "bayes_gain_eps1e-08") for o in offsets])
    rank = np.corrcoef(model.argsort().argsort(), exact.argsort().argsort())[0, 1]
    pairs = "; ".join(
        f"world {o}: {m:+.3f} against {e:+.3f}"
        for o, m, e in zip(offsets, model, exact)
    )
    reading = (
        "World by world, the transformer's gain goes with the gain of the near-exact "
        "Bayes predictor of the paper's documents (means over k = 3 and 5, the "
        f"transformer against that predictor: {pairs}; rank correlation {rank:.1f})."
    )
    if failed and held:
        reading += (
            " The share of prompts that no concept allows and the share of "
            "distinguishable pairs barely differ between the worlds where it learns "
            f"({describe(held)}) and the others ({describe(failed)})."
        )
    se = pooled.std(ddof=1) / np.sqrt(len(pooled))
    return {
        "ch6_w_pooled": f"{pooled.mean():+.3f} ± {se:.3f}",
        "ch6_w_held": _COUNTS[len(held)]
        if len(held) < len(_COUNTS)
        else str(len(held)),
        "ch6_w_held_list": ", ".join(f"world {o}" for o in held) or "none",
        "ch6_w_failed_list": ", ".join(f"world {o}" for o in failed) or "none",
        "ch6_w_reading": reading,
        "ch6_w_paper": paper_size_text(paper),
    }
