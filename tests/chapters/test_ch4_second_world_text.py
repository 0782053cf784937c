"""Chapter 4's second world as the page shows it: the strings its text quotes and the
figure and table of the stored run, on hand-made pretrainings with known numbers."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from fmlab.chapters import ch4_figures as fig4  # noqa: E402


def _pretraining(seed, contrast, zero_shot, ft_minus_lp, kc):
    n = len(contrast)
    return {
        "seed": seed,
        "contrast": list(contrast),
        "zero_shot": [zero_shot] * n,
        "std_ft_minus_lp": [ft_minus_lp] * n,
        "prompt_abs_ft_minus_entk": [1.0 + (seed - 100) / 2] * n,  # 1.0, 1.5, 2.0
        "std_ft": [70.0 + ft_minus_lp] * n,
        "std_entk": [68.0 + seed - 100] * n,  # 68, 69, 70: not FT − LP's offset
        "kc_ratio": list(kc),
        "seconds": 1.0,
    }


WORLDS = {
    "main": {
        "pretrainings": [
            _pretraining(100, [2.0, 4.0], 60.0, 9.0, [0.5, 2.5]),
            _pretraining(101, [5.0, 7.0], 62.0, 11.0, [3.0, 1.0]),
            _pretraining(102, [8.0, 10.0], 64.0, 13.0, [2.0, 0.1]),
        ]
    },
    "book": {
        "pretrainings": [
            _pretraining(100, [-1.0, 1.0], 70.0, 1.0, [1.0, 1.0]),
            _pretraining(101, [0.5, 1.5], 70.0, 2.0, [1.0, 1.0]),
            _pretraining(102, [-2.0, 0.0], 70.0, 0.0, [1.0, 1.0]),
        ]
    },
}


def test_the_quoted_numbers_are_the_per_pretraining_means():
    text = fig4.two_worlds_text(WORLDS)
    # per-pretraining means 3, 6, 9: mean 6, sd 3, s.e. 3/sqrt(3)
    assert text["ch4_w2_main"] == f"+6.0 ± {3 / np.sqrt(3):.1f}"
    assert text["ch4_w2_main_range"] == "+3.0 to +9.0"
    assert text["ch4_w2_main_n"] == "3"
    assert text["ch4_w2_main_runs"] == "6"
    assert text["ch4_w2_main_zero_shot"] == "60.0 to 64.0"
    assert text["ch4_w2_main_std_ft_minus_lp"] == "+9.0 to +13.0"
    assert text["ch4_w2_main_std_ft_minus_entk"] == "+11.0 to +13.0"
    assert text["ch4_w2_main_std_ft"] == "79.0 to 83.0"
    assert text["ch4_w2_main_std_entk"] == "68.0 to 70.0"
    assert text["ch4_w2_main_prompt_gap"] == "1.0 to 2.0"
    assert text["ch4_w2_main_kc"] == "3 of 6"  # 2.5, 3.0 and 2.0 reach 2
    assert text["ch4_w2_main_kc_median"] == "1.50"
    # the same value at every pretraining prints once
    assert text["ch4_w2_book_zero_shot"] == "70.0"
    assert text["ch4_w2_book_range"] == "-1.0 to +1.0"  # means 0, +1, -1
    assert "ch4_w2_screen" not in text  # only the worlds that were run


def test_the_figure_and_table_take_the_worlds_that_were_run():
    fig = fig4.two_worlds(WORLDS, np.array([1.0, -1.0, 2.0]))
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert len(labels) == 3  # book, main, this page's runs
    assert labels[0].startswith("no job")
    rows = fig4.two_worlds_table(WORLDS).rows
    assert len(rows) == 6  # one row per pretraining
    assert [r[3] for r in rows[3:]] == ["+3.0", "+6.0", "+9.0"]  # main, after book
