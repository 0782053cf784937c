"""Every figure of the book reads: no two texts collide (issue 42).

Each figure a chapter shows goes through :func:`fmlab.viz.render_png`, which measures
every text's box as drawn at the figure's final size and, when two overlap (titles,
axis and tick labels, legends, annotations), writes a line marked
:data:`fmlab.viz.COLLISION_MARK` to the notebook's stderr. This test reads the executed
notebooks of the build and fails on any such line; the unit tests below check the
measurement itself on figures built to collide or not.
"""

import json
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from fmlab.viz import COLLISION_MARK, text_collisions  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXECUTED = sorted((ROOT / "_build" / "executed").glob("*.ipynb"))


def _collisions(path: Path) -> list[str]:
    out = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        for o in cell.get("outputs", []):
            text = "".join(o.get("text", ""))
            out += [
                f"cell {i}: {ln}" for ln in text.splitlines() if COLLISION_MARK in ln
            ]
    return out


@pytest.mark.parametrize("path", EXECUTED, ids=[p.stem for p in EXECUTED])
def test_no_figure_has_colliding_text(path):
    assert _collisions(path) == []


def test_the_book_has_executed_notebooks():
    if not EXECUTED:
        pytest.skip("no executed notebooks in _build/executed: run `make book` first")


def test_collisions_are_found_and_clean_figures_pass():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1], label="a long legend label")
    ax.legend(loc="upper left")
    ax.text(0.02, 0.95, "a text under the legend", transform=ax.transAxes)
    found = text_collisions(fig)
    assert any("overlaps" in f and "legend" in f for f in found), found
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1], label="line")
    ax.legend(loc="lower right")
    ax.set_title("a title")
    ax.set_xlabel("x")
    assert text_collisions(fig) == []
    plt.close(fig)


def test_crowded_tick_labels_collide():
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.set_xticks(range(30), [f"label {i}" for i in range(30)])
    assert any("overlaps" in f for f in text_collisions(fig))
    plt.close(fig)


def test_texts_of_several_lines_are_checked():
    """A text of several lines reaches the renderer line by line, without its artist:
    it is checked too."""
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.bar(range(9), range(9))
    ax.set_xticks(range(9), [f"prompt\nmethod {i}" for i in range(9)])
    assert any("prompt" in f for f in text_collisions(fig))
    plt.close(fig)
