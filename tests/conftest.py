import os

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
LONGEST_FIRST = (
    "tests/book/test_downloads.py",  # a wheel installed, two chapters run from it
    "tests/chapters/test_stored_runs.py",  # every stored run's slice, rerun
    "tests/book/test_lab.py",  # JupyterLab in Chromium
)


def pytest_collection_modifyitems(session, config, items):
    def rank(item):
        for i, name in enumerate(LONGEST_FIRST):
            if item.nodeid.startswith(name):
                return i
        return len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every other test keeps its place
