"""The learning-rate schedule of fmlab.train (Chapters 5 and 6).

Oracle: each shape's closed form, written out at a few steps (the ramp
:math:`\\min(1, (s+1)/w)`, the cosines, the straight line)."""

import math

import pytest

from fmlab.train import LR_SHAPES, lr_factor


def _all(steps, **kw):
    return [lr_factor(s, steps=steps, **kw) for s in range(steps + 1)]


def test_cosine_is_the_ramp_times_one_half_cosine_over_the_whole_run():
    steps, w = 100, 10
    f = _all(steps, warmup=w)  # "cosine" is the default shape
    for s in (0, 4, 9, 10, 37, 50, 99):
        ramp = min(1.0, (s + 1) / w)
        assert f[s] == pytest.approx(ramp * 0.5 * (1 + math.cos(math.pi * s / steps)))
    assert f[0] == pytest.approx(0.1) and f[50] == pytest.approx(0.5) and f[100] == 0
    assert f[9] > f[10] > f[11]  # the cosine has been running during the warm-up
    assert _all(5)[0] == 1.0  # no warm-up: the full rate at the first step
    floored = _all(steps, warmup=w, floor=0.2)
    assert floored[100] == pytest.approx(0.2) and floored[0] == pytest.approx(0.1)


def test_constant_is_the_ramp_alone():
    assert _all(6, warmup=4, shape="constant") == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0]
    assert _all(3, shape="constant") == [1.0] * 4


def test_warmup_then_cosine_warms_up_then_reaches_the_floor_at_the_last_step():
    steps, w = 101, 10
    f = _all(steps, warmup=w, shape="warmup-then-cosine", floor=0.1)
    assert f[:w] == pytest.approx([(s + 1) / w for s in range(w)])
    assert f[w] == pytest.approx(1.0) and f[steps - 1] == pytest.approx(0.1)
    mid = w + (steps - 1 - w) // 2  # halfway through the cosine (exact here)
    assert f[mid] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert all(a >= b for a, b in zip(f[w:], f[w + 1 :]))
    assert f[steps] == pytest.approx(0.1)  # after the last update it stays there


def test_linear_warms_up_holds_then_decays_to_zero():
    steps, w = 100, 15
    f = _all(steps, warmup=w, shape="linear")
    assert f[:w] == pytest.approx([(s + 1) / w for s in range(w)])
    assert f[w] == pytest.approx(1.0)
    assert f[w + 17] == pytest.approx((steps - w - 17) / (steps - w))
    assert f[steps - 1] == pytest.approx(1 / (steps - w)) and f[steps] == 0.0
    # Chapter 5's constant-then-decay: no warm-up, the rate held for 3/4 of the run
    g = _all(8, shape="linear", decay_start=6)
    assert g == [1.0] * 6 + [1.0, 0.5, 0.0]
    h = _all(10, warmup=2, shape="linear", decay_start=5)
    assert h[:5] == [0.5, 1.0, 1.0, 1.0, 1.0] and h[5:] == pytest.approx(
        [1.0, 0.8, 0.6, 0.4, 0.2, 0.0]
    )


def test_a_run_shorter_than_its_warmup_or_without_steps_has_a_finite_schedule():
    assert _all(0) == [1.0]  # LambdaLR asks for step 0 even when no step follows
    assert _all(3, warmup=100) == pytest.approx(
        [(s + 1) / 100 * 0.5 * (1 + math.cos(math.pi * s / 3)) for s in range(4)]
    )
    assert _all(1, warmup=1, shape="warmup-then-cosine") == [1.0, 1.0]


def test_arguments_are_checked_and_named():
    assert set(LR_SHAPES) == {"cosine", "constant", "warmup-then-cosine", "linear"}
    with pytest.raises(ValueError, match="step"):
        lr_factor(102, steps=101, warmup=10)
    with pytest.raises(ValueError, match="shape"):
        lr_factor(0, steps=10, shape="step")
    with pytest.raises(ValueError, match="floor"):
        lr_factor(0, steps=10, shape="linear", floor=0.1)
    with pytest.raises(ValueError, match="floor"):
        lr_factor(0, steps=10, floor=1.5)
    with pytest.raises(ValueError, match="decay_start"):
        lr_factor(0, steps=10, decay_start=5)
    with pytest.raises(ValueError, match="decay_start"):
        lr_factor(0, steps=10, warmup=4, shape="linear", decay_start=3)
    with pytest.raises(ValueError, match="warmup"):
        lr_factor(0, steps=10, warmup=11, shape="warmup-then-cosine")
    with pytest.raises(ValueError, match="warmup"):
        lr_factor(0, steps=10, warmup=-1)
    with pytest.raises(TypeError, match="step"):
        lr_factor(1.0, steps=10)
