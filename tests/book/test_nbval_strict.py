"""nbval's strict comparison bites: a page that differs from its re-execution fails.

``make test`` runs nbval in strict mode on the executed chapters that the build produced
(``_build/executed``, written by ``scripts/execute_chapters.py``): it re-executes each
one and compares every text output with the page. These tests take the opening of one
executed chapter, up to its first output that prints a number, and run nbval in one
subprocess on it as built (it must pass) and on a copy with that one printed number
changed (it must fail)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXECUTED = ROOT / "_build" / "executed"
SANITIZE = ROOT / "nbval_sanitize.cfg"
DIGIT = re.compile(r"[0-9]")


def _texts(output: dict) -> list[tuple[dict, str]]:
    """(container, key) of every text field of an output that nbval compares."""
    if output.get("output_type") == "stream":
        return [(output, "text")]
    data = output.get("data", {})
    return [(data, k) for k in ("text/plain", "text/html") if k in data]


def _joined(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def _opening() -> tuple[str, dict, int]:
    """The opening of the first executed chapter, up to its first printed number."""
    chapters = sorted(EXECUTED.glob("*.ipynb"))
    if not chapters:
        pytest.skip(f"no executed chapters in {EXECUTED}: build the book first")
    nb = json.loads(chapters[0].read_text())
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        for output in cell.get("outputs", []):
            texts = _texts(output)
            if texts and DIGIT.search(_joined(texts[0][0][texts[0][1]])):
                nb["cells"] = nb["cells"][: i + 1]
                return chapters[0].name, nb, i
    pytest.fail(f"{chapters[0].name} prints no number to tamper with")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """nbval on the opening as built and on a copy with one printed number changed,
    in one pytest process (two kernels, one interpreter start): its report, and the
    two files' names."""
    name, nb, last = _opening()
    tampered = copy.deepcopy(nb)
    for output in tampered["cells"][last]["outputs"]:
        for container, key in _texts(output):
            text = _joined(container[key])
            match = DIGIT.search(text)
            if match:
                new = str((int(match.group()) + 1) % 10)
                container[key] = text[: match.start()] + new + text[match.end() :]
        if _texts(output):
            break
    assert tampered != nb
    where = tmp_path_factory.mktemp("nbval")
    (where / name).write_text(json.dumps(nb))
    (where / f"tampered-{name}").write_text(json.dumps(tampered))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist"]
        + ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", str(SANITIZE)]
        + ["-q", "-rA", "--rootdir", str(where), name, f"tampered-{name}"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return run.stdout, name, f"tampered-{name}"


def _outcomes(report: str, name: str) -> list[str]:
    """The outcome of each cell of ``name`` in a ``-rA`` report ("PASSED", ...)."""
    return re.findall(rf"^(\w+) {re.escape(name)}::", report, flags=re.M)


def test_page_as_built_passes(runs):
    report, name, _ = runs
    outcomes = _outcomes(report, name)
    assert outcomes and set(outcomes) == {"PASSED"}, (
        f"the untouched opening of {name} failed:\n{report}"
    )


def test_one_changed_number_fails(runs):
    report, _, tampered = runs
    assert "FAILED" in _outcomes(report, tampered), (
        f"nbval accepted a page whose printed number was changed:\n{report}"
    )
    assert "mismatch" in report.lower(), report
