"""What the site offers for download runs.

- every chapter's ``.ipynb`` download is the executed notebook (outputs and figures);
- the source archive and the wheel named by ``_build/downloads/manifest.json`` are in
  the site and linked from its landing page;
- the wheel installs offline into a fresh virtual environment
  (``--system-site-packages``
  plus a path to this environment's packages, which are the pinned requirements, so
  that PyTorch is not installed again), imports from there, carries the claims
  registry and the stored results, and two downloaded chapters run top to bottom in
  that environment, outside the source tree: one that trains its models (02) and one
  that reads a stored run (05b); every keyed value they compute equals the build's,
  and nbval compares every text output with the page, as `make test` does for the
  other chapters (tests/conftest.py leaves these two to this test: re-executing them
  there as well would repeat the same comparison from a warm model cache).

Needs a built book (``make book``); without one the tests skip with a loud reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest
from scripts_loader import load_script

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
MANIFEST = ROOT / "_build" / "downloads" / "manifest.json"
# run in the fresh environment: a chapter that trains, one that reads a stored run
WHEEL_CHAPTERS = ("notebooks/02-interface", "notebooks/05b-same-loss")


def _chapters() -> list[str]:
    """The chapters of the table of contents, as the build lists them
    (``scripts/execute_chapters.py``), e.g. ``notebooks/02-interface``."""
    module = load_script("execute_chapters")
    return [p.relative_to(ROOT).with_suffix("").as_posix() for p in module._chapters()]


def _need_site():
    if not (HTML / "index.html").exists() or not MANIFEST.exists():
        message = "DOWNLOADS NOT TESTED: no built book with downloads; run `make book`"
        print("\n" + "!" * 78 + f"\n{message}\n" + "!" * 78)
        pytest.skip(message)
    return json.loads(MANIFEST.read_text())


@pytest.mark.parametrize("chapter", _chapters())
def test_downloaded_chapter_has_outputs(chapter):
    _need_site()
    import nbformat

    page = HTML / "_sources" / f"{chapter}.ipynb"
    assert page.exists(), f"{chapter}: no .ipynb download in the site"
    nb = nbformat.read(page, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    with_outputs = [c for c in code if c.get("outputs")]
    assert len(with_outputs) >= len(code) // 2, (
        f"{chapter}: the download has outputs in {len(with_outputs)} of {len(code)} "
        "code cells: it is not the executed notebook"
    )
    assert all(c.get("execution_count") for c in code), (
        f"{chapter}: a code cell of the download was never executed"
    )
    figures = sum(
        "image/png" in o.get("data", {}) for c in with_outputs for o in c["outputs"]
    )
    assert figures, f"{chapter}: the download has no figure"


def test_archive_and_wheel_are_in_the_site_and_linked():
    manifest = _need_site()
    landing = (HTML / "index.html").read_text(encoding="utf-8")
    preface = (HTML / "book" / "preface.html").read_text(encoding="utf-8")
    for key in ("archive", "wheel"):
        name = manifest[key]
        assert (HTML / "downloads" / name).is_file(), f"{name} is not in the site"
        assert f"downloads/{name}" in preface, f"the preface does not link {name}"
        if "http-equiv" not in landing:  # index.html is not a redirect to the preface
            assert f"downloads/{name}" in landing
    with tarfile.open(HTML / "downloads" / manifest["archive"]) as tar:
        names = {
            Path(n).relative_to(Path(n).parts[0]).as_posix() for n in tar.getnames()
        }
    for needed in (
        "Makefile",
        "README.md",
        "requirements.txt",
        "src/fmlab/__init__.py",
    ):
        assert needed in names, f"the source archive has no {needed}"
    assert any(n.startswith("notebooks/") and n.endswith(".ipynb") for n in names)
    assert (HTML / "claims.json").is_file(), "claims.json is not published"


def test_wheel_installs_and_a_downloaded_chapter_runs(tmp_path):
    manifest = _need_site()
    wheel = HTML / "downloads" / manifest["wheel"]
    env_dir = tmp_path / "reader-env"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run(
        # no pip or setuptools of its own: the ones of this environment (on the path
        # below) are the versions the pinned packages were installed with
        [base, "-m", "venv", "--system-site-packages", "--without-pip", str(env_dir)],
        check=True,
    )
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # this environment's packages (PyTorch and the rest) on the path, but not its
    # editable install of fmlab (a plain path line does not run the .pth files there)
    ours = sysconfig.get_paths()["purelib"]
    (Path(site) / "book_dependencies.pth").write_text(ours + "\n")
    install = subprocess.run(
        [python, "-m", "pip", "install", "--no-index", "--quiet"]
        + ["--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, (
        f"pip install of the wheel failed:\n{install.stderr}"
    )
    check = subprocess.run(
        [
            python,
            "-c",
            "import pathlib, fmlab, fmlab.chapters, fmlab.theory;"
            "p = pathlib.Path(fmlab.__file__).parent;"
            "print(p); print((p / '_registry' / 'claims.yml').is_file())",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert check.returncode == 0, check.stderr
    where, registry = check.stdout.split()
    assert Path(where).is_relative_to(env_dir), f"fmlab imported from {where}"
    assert registry == "True", "the wheel does not carry the claims registry"

    # downloaded chapters, run top to bottom outside the source tree
    build = {
        (r["document"], r["key"]): r["value"]
        for r in json.loads((ROOT / "_build" / "claims.json").read_text())
        if r.get("key")
    }
    sanitize = tmp_path / "nbval_sanitize.cfg"  # what nbval may ignore (make test's)
    sanitize.write_bytes((ROOT / "nbval_sanitize.cfg").read_bytes())
    runs = {}  # both chapters at once, each in its own kernel on its own core
    for chapter in WHEEL_CHAPTERS:
        notebook = tmp_path / f"{Path(chapter).name}.ipynb"
        notebook.write_bytes((HTML / "_sources" / f"{chapter}.ipynb").read_bytes())
        log = tmp_path / f"{Path(chapter).name}.jsonl"
        env = dict(os.environ)
        env.update(
            FMLAB_CACHE_DIR=str(tmp_path / f"models-{Path(chapter).name}"),
            FMLAB_CLAIMS_LOG=str(log),
            FMLAB_PROGRESS="0",
            OMP_NUM_THREADS="1",
            # the keyed values are compared, not the pictures; drawing reads nothing
            # from the package's files (fmlab.viz.drawing)
            FMLAB_DRAW="0",
        )
        env.pop("PYTHONPATH", None)
        env.pop("FMLAB_CLAIMS_REGISTRY", None)
        proc = subprocess.Popen(
            [  # nbval as in make test: re-executed in a kernel of this environment
                python,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--nbval",
                "--nbval-current-env",
                "--nbval-sanitize-with",
                str(sanitize),
                str(notebook),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=env,
        )
        runs[chapter] = (proc, log)
    try:
        for chapter, (proc, log) in runs.items():
            _check_downloaded_run(chapter, proc, log, build)
    finally:
        for proc, _ in runs.values():
            if proc.poll() is None:
                proc.kill()


def _check_downloaded_run(chapter, proc, log, build):
    """Wait for one downloaded chapter's run; its keyed values must be the build's."""
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, (
        f"{chapter} failed in the fresh environment (nbval):\n{stdout[-4000:]}"
        f"\n{stderr[-2000:]}"
    )
    keyed = {
        r["key"]: r.get("value")
        for r in map(json.loads, log.read_text().splitlines())
        if r.get("key")
    }
    expected = {k: v for (doc, k), v in build.items() if doc == chapter}
    assert expected, f"the build recorded no keyed claim of {chapter}"
    assert set(keyed) == set(expected), f"{chapter}: other keys than the build's"
    for key, value in expected.items():
        assert keyed[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (
            f"{chapter}: {key} is {keyed[key]} from the wheel, {value} in the build"
        )
