"""Chapter 4: checks of the comparisons that page 04's running text states.

The text of a page says what its runs show ("near chance", "no better than the probe",
"loses more accuracy than"); each such comparison is checked on the numbers the page
computed, with its verdict line beside the text. Each function here takes what one
section of the page computed and issues one check (:func:`fmlab.claims.claim`) per
statement of that section, so that a page cell makes them with one call. These are
checks of what the runs on the page show, not findings: none is a headline key, and
the findings the page claims or measures (the margin rule over runs or pretrainings)
are made on the page itself.

The words of the text are read with one fixed tolerance each, stated in every check:
*near* 50% (chance) is a mean within :data:`NEAR_CHANCE` points of 50%; two methods are
*near* each other when their mean difference is within :data:`NEAR` points (the band
of the paper's agreement, Malladi et al. 2023); *a few points* is less than
:data:`FEW` points; *well above* is at least :data:`WELL_ABOVE` points above.

Used in Chapter 4: ``notebooks/04-kernel-view.ipynb``.
"""

from __future__ import annotations

import numpy as np

from ..claims import SeedEffect, claim
from .ch4_second_world import per_pretraining

__all__ = [
    "accuracy_checks",
    "analog_checks",
    "probe_checks",
    "laziness_checks",
    "two_worlds_checks",
    "NEAR_CHANCE",
    "NEAR",
    "FEW",
    "WELL_ABOVE",
]

#: Points from 50% within which a mean accuracy is "near chance".
NEAR_CHANCE = 5.0
#: Points within which two methods' mean accuracies are "near" each other.
NEAR = 3.0
#: "A few points": less than this many.
FEW = 10.0
#: "Well above": at least this many points above.
WELL_ABOVE = 5.0

WIDE = "SGD-FT, wide grid"


def _acc(runs, setting: str, method: str, k: int) -> np.ndarray:
    return 100 * np.asarray(runs.accuracy[(setting, method, k)], dtype=float)


def accuracy_checks(runs) -> None:
    """The accuracy table's reading (few-shot runs ``runs``,
    :class:`~.ch4_fewshot.FewShotRuns`): the bag of words near 50% at every k;
    standard fine-tuning from a fresh head at k = 4 well below prompt-based
    fine-tuning and closer to chance than to it; at k = 16 and 64,
    at the lazy learning rates, at most a few points beyond the linear probe on
    average, and so with the wide search (k = 16)."""
    bow = {k: _acc(runs, "bag of words", "LR", k).mean() for k in runs.shots}
    claim(
        f"the few-shot bag of words stays near 50% (mean within {NEAR_CHANCE:g} "
        "points) at every $k$",
        all(abs(a - 50) < NEAR_CHANCE for a in bow.values()),
        "mean accuracy " + ", ".join(f"{a:.1f}% at k = {k}" for k, a in bow.items()),
    )
    std4 = _acc(runs, "standard", "SGD-FT", 4).mean()
    prompt4 = _acc(runs, "prompt", "SGD-FT", 4).mean()
    claim(
        "from a fresh head, standard fine-tuning at $k=4$ ends well below prompt-based "
        f"fine-tuning (at least {WELL_ABOVE:g} points) and closer to chance (50%) than "
        "to it (means over runs)",
        bool(prompt4 - std4 >= WELL_ABOVE and std4 - 50 < prompt4 - std4),
        f"standard {std4:.1f}%, prompt-based {prompt4:.1f}% at k = 4",
    )
    lazy = {
        k: runs.points(("standard", "SGD-FT"), ("standard", "LP"), k).mean()
        for k in runs.shots[1:]
    }
    wide = runs.points(("standard", WIDE), ("standard", "LP"), 16)
    claim(
        "at the lazy learning rates standard fine-tuning gets at most a few points "
        f"beyond the linear probe on average (less than {FEW:g} points; $k$ = 16 and "
        f"64), and so does the wide search (less than {FEW:g} points, $k=16$)",
        all(d < FEW for d in lazy.values()) and bool(wide.mean() < FEW),
        "standard SGD-FT − LP, lazy scales: "
        + ", ".join(f"{d:+.1f} at k = {k}" for k, d in lazy.items())
        + f"; wide search: {wide.mean():+.1f} at k = 16 (points, means over runs)",
    )


def analog_checks(runs, k: int = 16) -> None:
    """The reading of the table of runs beside their analogs at ``k``: the standard
    runs at c = 1 scatter far more widely around their step-matched eNTK than the
    prompt-based runs (at least twice the standard deviation), some beyond ±3, and
    end well below the prompt-based runs at that scale; the eNTK at the
    ridge 1/T scatters more widely around its run than the step-matched analog (on
    which side it lands is printed, not read: it depends on the pretraining); rank-8
    LoRA lands near full fine-tuning at every k it is run."""
    fixed = "SGD-FT, fixed c"
    prompt = runs.points(("prompt", "K-SGD, same steps"), ("prompt", fixed), k)
    std = runs.points(("standard", "K-SGD, same steps"), ("standard", fixed), k)
    std_acc = _acc(runs, "standard", fixed, k).mean()
    prompt_acc = _acc(runs, "prompt", fixed, k).mean()
    out = int((abs(std) >= 3).sum())
    claim(
        "at $c=1$ the standard runs scatter far more widely (at least twice the "
        "standard deviation) around their step-matched eNTK than the prompt-based "
        "runs, some beyond ±3, and end well below the prompt-based runs at that scale "
        f"(at least {WELL_ABOVE:g} points, means over runs)",
        bool(std.std(ddof=1) >= 2 * prompt.std(ddof=1))
        and out >= 1
        and bool(prompt_acc - std_acc >= WELL_ABOVE),
        f"sd of analog − run: standard {std.std(ddof=1):.2f}, prompt "
        f"{prompt.std(ddof=1):.2f} points; {out} of {len(std)} standard runs outside "
        f"±3; SGD-FT at c = 1: standard {std_acc:.1f}%, prompt-based "
        f"{prompt_acc:.1f}% on average",
    )
    ridge = runs.points(("prompt", "K-SGD, analog ridge"), ("prompt", fixed), k)
    below = int((ridge < 0).sum())
    claim(
        "the eNTK at the ridge $1/T$ scatters more widely around its run than the "
        "step-matched eNTK",
        bool(ridge.std(ddof=1) > prompt.std(ddof=1)),
        f"sd of analog − run: ridge {ridge.std(ddof=1):.2f}, same steps "
        f"{prompt.std(ddof=1):.2f} points; below the run in {below} of {len(ridge)}",
    )
    lora = {
        kk: runs.points(("prompt", "LoRA-SGD-FT"), ("prompt", "SGD-FT"), kk).mean()
        for kk in runs.shots
        if ("prompt", "LoRA-SGD-FT", kk) in runs.accuracy
    }
    claim(
        f"rank-8 LoRA fine-tuning lands near full fine-tuning (mean within {NEAR:g} "
        "points) at every $k$ it is run",
        bool(lora) and all(abs(d) < NEAR for d in lora.values()),
        "LoRA-SGD-FT − SGD-FT, prompt-based: "
        + ", ".join(f"{d:+.1f} at k = {kk}" for kk, d in lora.items())
        + " (points, means over runs)",
    )


def probe_checks(runs, contrast: np.ndarray, k: int = 16) -> None:
    """The reading of the table of the two gaps at ``k`` (``contrast``: the contrast
    per run): its mean is far below the paper's 17 points and single runs go either
    way; standard fine-tuning with the wide search, and its eNTK, each end at most a
    few points beyond the linear probe."""
    contrast = np.asarray(contrast, dtype=float)
    claim(
        "the contrast's mean is far below the paper's gap of 17-19 points (less than "
        "a third of it), and single runs go either way",
        bool(contrast.mean() < 17 / 3 and contrast.min() < 0 < contrast.max()),
        f"mean {contrast.mean():+.1f}, runs {contrast.min():+.1f} to "
        f"{contrast.max():+.1f} points",
    )
    wide = runs.points(("standard", WIDE), ("standard", "LP"), k)
    entk = runs.points(("standard", "K-SGD"), ("standard", "LP"), k)
    claim(
        "from a fresh head, standard fine-tuning with the wide search and its eNTK "
        f"each end at most a few points beyond the linear probe (less than {FEW:g} "
        f"points), on average at $k={k}$",
        bool(wide.mean() < FEW and entk.mean() < FEW),
        f"standard FT − LP {wide.mean():+.1f}, standard eNTK − LP {entk.mean():+.1f} "
        "points (means over runs)",
    )


def laziness_checks(runs, k: int = 16) -> None:
    """The reading of the laziness table at ``k``: at the scales validation picks, the
    standard kernel does not move more than the prompt's in every run; over the runs,
    the prompt-based kernel moves more at the largest scale than at the smallest on
    average. (The comparisons at the same scale c = 1, and the validated prompt-based
    runs against the threshold of 2, are the page's findings, with their own verdicts;
    the text prints their numbers and reads no direction into them.)"""
    val = runs.log_ratio("kernel_change", k)
    grow = runs.kernel_change_growth()
    claim(
        "at the scales validation picks, the standard kernel does not move more than "
        "the prompt's in every run; the prompt-based kernel moves more at the largest "
        "scale $c$ than at the smallest, on average over runs",
        bool((val <= 0).any() and grow.mean() > 0),
        f"log ratio, validated runs: mean {val.mean():+.2f}, at or below 0 in "
        f"{int((val <= 0).sum())} of {len(val)}; log(largest c / smallest c): mean "
        f"{grow.mean():+.2f}, {grow.min():+.2f} to {grow.max():+.2f} over {len(grow)} "
        "runs",
    )


def _by_seed(part, name: str) -> dict[int, float]:
    """Each pretraining's mean of ``name``, by pretraining seed."""
    seeds = [p["seed"] for p in part["pretrainings"]]
    return dict(zip(seeds, per_pretraining(part, (name,))[name]))


def two_worlds_checks(worlds: dict, paper=(1.2, 13.6), paper_mean=7.9) -> None:
    """The reading of the stored worlds (``worlds``:
    :func:`~.ch4_second_world.second_world_results`): per pretraining and per set,
    what the section on the second world states, comparing the two worlds on the
    pretraining seeds they share (``"book"`` and ``"main"``)."""
    con = {w: per_pretraining(worlds[w])["contrast"] for w in worlds if w != "stored"}
    length = np.array(con["main"] + con["offset"])
    claim(
        "the length world's contrast is inside the paper's per-task range at 64 "
        f"shots ({paper[0]:+.1f} to {paper[1]:+.1f}), below its six-task mean "
        f"({paper_mean:+.1f}), on every pretraining of both sets",
        bool(((length > paper[0]) & (length < paper_mean)).all()),
        f"contrast {length.min():+.1f} to {length.max():+.1f} points over "
        f"{len(length)} pretrainings",
    )
    names = ("zero_shot", "std_entk", "std_ft")
    book = {n: _by_seed(worlds["book"], n) for n in names}
    main = {n: _by_seed(worlds["main"], n) for n in names}
    shared = [s for s in book["zero_shot"] if s in main["zero_shot"]]
    zs_cost = [book["zero_shot"][s] - main["zero_shot"][s] for s in shared]
    entk_loss = [book["std_entk"][s] - main["std_entk"][s] for s in shared]
    ft_loss = [book["std_ft"][s] - main["std_ft"][s] for s in shared]
    lp = np.concatenate(
        [
            per_pretraining(worlds[w], ("std_ft_minus_lp",))["std_ft_minus_lp"]
            for w in ("main", "offset")
        ]
    )
    claim(
        "on each pretraining seed the two worlds share, the job of [CLS] costs the "
        "prompt zero-shot accuracy and the fresh head's eNTK loses more accuracy than "
        "standard fine-tuning does; in the length world standard fine-tuning ends "
        f"well above the linear probe (at least {WELL_ABOVE:g} points) on every "
        "pretraining",
        bool(
            shared
            and min(zs_cost) > 0
            and all(e > f for e, f in zip(entk_loss, ft_loss))
            and (lp >= WELL_ABOVE).all()
        ),
        f"seeds {', '.join(map(str, shared))}: zero-shot lower by "
        + ", ".join(f"{d:.1f}" for d in zs_cost)
        + "; eNTK lower by "
        + ", ".join(f"{d:.1f}" for d in entk_loss)
        + ", FT by "
        + ", ".join(f"{d:.1f}" for d in ft_loss)
        + f" points; standard FT − LP {lp.min():+.1f} to {lp.max():+.1f}",
    )
    own = SeedEffect.of(con["book"])
    kc = {
        w: np.concatenate(
            [np.asarray(p["kc_ratio"]) for p in worlds[w]["pretrainings"]]
        )
        for w in ("book", "main", "offset")
    }
    share = {w: float((v >= 2).mean()) for w, v in kc.items()}
    claim(
        "in this page's world the contrast is within 2 s.e. of 0 over its "
        "pretrainings; its standard runs change their eNTK at least twice as much as "
        "the prompt runs in a larger share of runs than in the length world's (both "
        "sets)",
        bool(abs(own.mean) < 2 * own.se)
        and share["book"] > max(share["main"], share["offset"]),
        f"contrast {own.mean:+.1f} ± {own.se:.1f}; share of runs with ratio ≥ 2: "
        + ", ".join(f"{w} {int((v >= 2).sum())} of {len(v)}" for w, v in kc.items()),
    )
    topic, zs_book = (
        np.array(per_pretraining(worlds[w], ("zero_shot",))["zero_shot"])
        for w in ("screen", "book")
    )
    se = np.sqrt(topic.var(ddof=1) / len(topic) + zs_book.var(ddof=1) / len(zs_book))
    screen = np.array(con["screen"])
    claim(
        "the topic world's zero-shot accuracy is within 2 s.e. of this page's world's "
        "(the difference of the means), and its contrast is above 0 on average but "
        "not on every pretraining",
        bool(abs(topic.mean() - zs_book.mean()) < 2 * se)
        and bool(screen.mean() > 0 >= screen.min()),
        f"zero-shot {topic.min():.1f}-{topic.max():.1f}% vs "
        f"{zs_book.min():.1f}-{zs_book.max():.1f}%; contrast {screen.mean():+.1f} on "
        f"average, lowest {screen.min():+.1f}",
    )
