"""Every chapter page has the book's shape (see ``../shared/GUIDE.md``, section 2).

- no code cell over 25 non-blank lines, the import cell (the first code cell) at most
  10;
- no ``def`` or ``class`` in a notebook, except in a cell tagged ``exercise-solution``;
- no table built by hand: no padded ``print`` formats, ``ljust``/``rjust`` or literal
  HTML tables (``fmlab.viz.table`` renders every table);
- at most 400 code lines on a page;
- drawing lives in the library, so at most two cells hide their input, besides the
  evidence cells (cells that call ``claim(`` or ``finding(``), which are collapsed on
  the web page so that their one-line verdict stands beside the result.

Chapters not yet converted are on ``NOT_YET_CONVERTED``; each chapter issue removes
its chapter from the list.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

NOT_YET_CONVERTED: set[str] = set()

MAX_CELL, MAX_IMPORT_CELL, MAX_PAGE, MAX_HIDDEN = 25, 10, 400, 2
HAND_TABLE = re.compile(r"\{[^{}]*:[<>^]\d+|\.ljust\(|\.rjust\(|<table|<tr>")
DEFINITION = re.compile(r"^\s*(def|class|async def)\s", re.M)
EVIDENCE = re.compile(r"(?<![\w.])(claim|finding)\(")


def code_cells(path: Path) -> list[dict]:
    return [
        c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"
    ]


def lines(cell: dict) -> list[str]:
    return [ln for ln in "".join(cell["source"]).splitlines() if ln.strip()]


def shape_problems(path: Path) -> list[str]:
    cells = code_cells(path)
    out = []
    for i, cell in enumerate(cells):
        n, tags = len(lines(cell)), cell.get("metadata", {}).get("tags", [])
        limit = MAX_IMPORT_CELL if i == 0 else MAX_CELL
        if n > limit:
            out.append(f"code cell {i} has {n} lines (at most {limit})")
        src = "".join(cell["source"])
        if DEFINITION.search(src) and "exercise-solution" not in tags:
            out.append(f"code cell {i} defines a function or class")
        if HAND_TABLE.search(src):
            out.append(f"code cell {i} builds a table by hand (use fmlab.viz.table)")
    total = sum(len(lines(c)) for c in cells)
    if total > MAX_PAGE:
        out.append(f"{total} code lines on the page (at most {MAX_PAGE})")
    hidden = sum(
        "hide-input" in c.get("metadata", {}).get("tags", [])
        and not EVIDENCE.search("".join(c["source"]))
        for c in cells
    )
    if hidden > MAX_HIDDEN:
        out.append(f"{hidden} cells hide their input (at most {MAX_HIDDEN})")
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_chapter_has_the_books_shape(path):
    if path.stem in NOT_YET_CONVERTED:
        pytest.skip(f"{path.stem} is not converted yet (NOT_YET_CONVERTED)")
    assert shape_problems(path) == []


def test_the_allowlist_names_only_existing_chapters():
    assert NOT_YET_CONVERTED <= {p.stem for p in NOTEBOOKS}


def test_the_shape_checker_catches_a_heavy_cell(tmp_path):
    nb = {
        "cells": [
            {"cell_type": "code", "metadata": {}, "source": ["import fmlab\n"]},
            {"cell_type": "code", "metadata": {}, "source": ["x = 1\n"] * 30},
            {"cell_type": "code", "metadata": {}, "source": ["def f():\n  pass\n"]},
            {"cell_type": "code", "metadata": {}, "source": ['print(f"{a:>8}")\n']},
        ]
    }
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    found = shape_problems(path)
    assert any("30 lines" in p for p in found)
    assert any("defines" in p for p in found)
    assert any("by hand" in p for p in found)
