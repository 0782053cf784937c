"""Every Python script in ``scripts/`` answers ``--help``: it imports what it needs from
today's fmlab, exits 0 and prints its usage line, without running anything.

A script whose imports went stale (a name moved or renamed in the library) fails here,
not the next time someone runs it. The scripts are found by glob, so a new one is
covered without editing this file.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
TIMEOUT_S = 60  # a script imports torch and fmlab (a few seconds), then exits


def test_there_are_scripts():
    assert len(SCRIPTS) >= 2


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_script_answers_help(script):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FMLAB_PROGRESS": "0"}
    done = subprocess.run(
        [sys.executable, str(script.relative_to(ROOT)), "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"usage: {script.name}"), done.stdout[:500]
