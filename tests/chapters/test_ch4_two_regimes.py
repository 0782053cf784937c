"""Chapter 4's picture of the two regimes of fine-tuning (before Theorem 5.5): the toy
f(θ) = θ₁θ₂ fine-tuned on one example is lazy from a confident start and leaves its
linearization from an undecided one, for the reason the page gives (the size of χ)."""

import time

import matplotlib
import numpy as np

from fmlab.chapters import ch4_figures as fig4
from fmlab.viz import text_collisions

matplotlib.use("Agg")


def test_the_gap_to_the_linearization_is_the_second_order_term():
    for run in fig4.two_regimes():
        d = run["theta"] - run["theta"][0]
        gap = run["f"] - run["f_lin"]
        np.testing.assert_allclose(gap, d[:, 0] * d[:, 1], atol=1e-12)
        # one gradient step of the logistic loss at y = +1, by hand
        a, b = run["start"]
        chi = -1 / (1 + np.exp(a * b))
        np.testing.assert_allclose(run["theta"][1], [a - chi * b, b - chi * a])


def test_small_chi_is_lazy_and_chi_one_half_is_not():
    lazy, rich = fig4.two_regimes()
    assert abs(lazy["chi"][0]) < 0.02 and abs(rich["chi"][0]) == 0.5
    # the confident start stays within 10% of its linearization, the undecided one
    # does not: its linearization sees the head alone (∂f/∂θ₂ = θ₁ = 0 at the start)
    assert lazy["rel_error"] < 0.1 < 0.5 < rich["rel_error"]
    # the numbers the figure's caption gives: |χ₀| 0.011, gaps of 6% and 59%
    assert round(abs(lazy["chi"][0]), 3) == 0.011
    assert (round(100 * lazy["rel_error"]), round(100 * rich["rel_error"])) == (6, 59)
    np.testing.assert_allclose(rich["f_lin"], rich["theta"][:, 0])
    # both runs learn the example (f > 0 at the end), the undecided one from f₀ = 0
    assert rich["f"][0] == 0 and min(lazy["f"][-1], rich["f"][-1]) > 5
    # the lazy run's parameters move far less
    move = [np.linalg.norm(r["theta"][-1] - r["theta"][0]) for r in (lazy, rich)]
    assert move[0] < move[1] / 4


def test_the_figure_is_cheap():
    t0 = time.perf_counter()
    fig = fig4.plot_two_regimes()
    assert time.perf_counter() - t0 < 2.0
    assert len(fig.axes) == 2
    assert text_collisions(fig) == []
