import os
from pathlib import Path

import pytest

os.environ.setdefault("FMLAB_PROGRESS", "0")


@pytest.fixture(autouse=True)
def _figures_drawn(monkeypatch):
    """Every test here draws its figures (and so does every process it starts).
    `make test` sets ``FMLAB_DRAW=0`` only for nbval's re-execution of the chapters
    (``_build/executed``), which compares text and never images
    (:func:`fmlab.viz.drawing`)."""
    monkeypatch.setenv("FMLAB_DRAW", "1")


# The longest test files, started first: `make test` hands whole files to its two
# workers in collection order (xdist's loadfile), so a long file collected last would
# run alone at the end while the other worker idles.
WHEEL_TEST = "tests/book/test_downloads.py::test_wheel_installs_and_a_downloaded"
LONGEST_FIRST = (
    "tests/book/test_downloads.py",  # a wheel installed, two chapters run from it
    "tests/chapters/test_stored_runs.py",  # every stored run's slice, rerun
    "tests/book/test_lab.py",  # JupyterLab in Chromium
)


def pytest_collection_modifyitems(session, config, items):
    # The chapters that the wheel test executes in a fresh environment under nbval
    # (tests/book/test_downloads.py, WHEEL_CHAPTERS: cold, from the installed wheel,
    # every text output compared with the page) are not re-executed by nbval here too,
    # when that test is collected and has a built site to run on.
    wheel = [i for i in items if i.nodeid.startswith(WHEEL_TEST)]
    if wheel and wheel[0].module.MANIFEST.exists():
        chapters = {Path(c).name for c in wheel[0].module.WHEEL_CHAPTERS}
        twice = [
            i
            for i in items
            if Path(i.nodeid.split("::")[0]).suffix == ".ipynb"
            and Path(i.nodeid.split("::")[0]).stem in chapters
        ]
        if twice:
            config.hook.pytest_deselected(items=twice)
            items[:] = [i for i in items if i not in twice]

    def rank(item):
        for i, name in enumerate(LONGEST_FIRST):
            if item.nodeid.startswith(name):
                return i
        return len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every other test keeps its place
