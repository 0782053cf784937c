"""Chapter 4's second world from the paper's cross-validated probe head, as the page
shows it beside the fresh head's: the table and the quoted numbers, on hand-made
pretrainings with known numbers."""

import numpy as np

from fmlab.chapters import ch4_figures as fig4


def _pretraining(seed, contrast, ft_minus_lp, kc, **extra):
    n = len(contrast)
    return {
        "seed": seed,
        "zero_shot": [60.0] * n,
        "prompt_ft": [80.0 + (seed == 101 and "cv_c" in extra) * 0.4] * n,
        "prompt_entk": [79.0] * n,
        "contrast": list(contrast),
        "std_ft_minus_lp": [ft_minus_lp] * n,
        "kc_ratio": list(kc),
        **{k: list(v) for k, v in extra.items()},
    }


WORLDS = {
    "main": {  # a fresh head; a seed the cv part does not hold is left out
        "pretrainings": [
            _pretraining(100, [4.0, 6.0], 8.0, [1.0, 3.0, 5.0]),
            _pretraining(101, [1.0, 3.0], 6.0, [0.5, 0.7]),
            _pretraining(102, [9.0, 9.0], 1.0, [9.0, 9.0]),
        ]
    },
    "cv": {
        "pretrainings": [
            _pretraining(
                100, [1.0, -3.0], -2.0, [0.2, 0.4], cv_probe=[60, 70], cv_c=[1, 100]
            ),
            _pretraining(
                101, [2.0, 4.0], 1.0, [3.0, 1.0], cv_probe=[50, 50], cv_c=[10, 10]
            ),
        ]
    },
}


def test_the_cv_table_puts_each_pretraining_beside_its_fresh_head():
    first, second = fig4.cv_head_table(WORLDS).tables
    assert first.columns == [
        "pretraining",
        "runs",
        "contrast, fresh head",
        "contrast, CV probe",
        "standard FT − LP, fresh head",
        "standard FT − LP, CV probe",
    ]
    assert first.rows[0] == ["100", "2", "+5.0", "-1.0", "+8.0", "-2.0"]
    assert first.rows[1] == ["101", "2", "+2.0", "+3.0", "+6.0", "+1.0"]
    # means over pretrainings of the per-pretraining means, with their s.e.
    se = np.std([-1.0, 3.0], ddof=1) / np.sqrt(2)
    assert first.rows[2][:4] == ["mean ± s.e.", "4", "+3.5 ± 1.5", f"+1.0 ± {se:.1f}"]
    assert second.rows[0] == ["100", "3.00", "0.30", "65.0", "50.5"]
    assert second.rows[1] == ["101", "0.60", "2.00", "50.0", "10"]
    assert second.rows[2][-2:] == ["57.5", ""]


def test_the_quoted_cv_numbers_are_the_per_pretraining_means():
    text = fig4.cv_head_text(WORLDS)
    assert text["ch4_w2_cv"] == f"+1.0 ± {np.std([-1.0, 3.0], ddof=1) / 2**0.5:.1f}"
    assert text["ch4_w2_cv_range"] == "-1.0 to +3.0"
    assert text["ch4_w2_cv_fresh"] == "+3.5 ± 1.5"
    assert text["ch4_w2_cv_n"] == "2"
    assert text["ch4_w2_cv_std_ft_minus_lp"] == "-2.0 to +1.0"
    assert text["ch4_w2_cv_same"] == "1 of 2"
    assert text["ch4_w2_cv_prompt_diff"] == "0.4"  # pretraining 101's prompt FT
