"""Every Python script in ``scripts/`` answers ``--help``: it imports what it needs from
today's fmlab, exits 0 and prints its usage line, without running anything.

A script whose imports went stale (a name moved or renamed in the library) fails here,
not the next time someone runs it. The scripts are found by glob, so a new one is
covered without editing this file. They run one after another in one fresh Python
process (``runpy``, as ``__main__``, each with its own ``sys.argv``): torch and fmlab
are imported once instead of once a script, and nothing a script sets leaks into the
test process.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
TIMEOUT_S = 180  # one process imports torch and fmlab once, then every script

# Runs each script named on its command line with `--help`, as `python script --help`
# would, and prints one JSON line per script: its exit code, stdout and error.
DRIVER = r"""
import contextlib, io, json, runpy, sys, traceback
for path in sys.argv[1:]:
    out, code, error = io.StringIO(), None, ""
    sys.argv = [path, "--help"]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        code = 0  # ran to the end without exiting: --help did nothing
        error = "the script returned without exiting on --help"
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        code, error = 1, traceback.format_exc()
    record = {"path": path, "code": code, "stdout": out.getvalue(), "error": error}
    sys.__stdout__.write(json.dumps(record) + "\n")
"""


@pytest.fixture(scope="module")
def answers():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FMLAB_PROGRESS": "0"}
    paths = [str(p.relative_to(ROOT)) for p in SCRIPTS]
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, *paths],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line[:1] == "{"]
    return {r["path"]: r for r in records}


def test_there_are_scripts():
    assert len(SCRIPTS) >= 2


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_script_answers_help(script, answers):
    r = answers.get(str(script.relative_to(ROOT)))
    assert r is not None, f"{script.name}: the driver never reached it"
    assert r["code"] == 0 and not r["error"], r["error"][-2000:]
    assert r["stdout"].startswith(f"usage: {script.name}"), r["stdout"][:500]
