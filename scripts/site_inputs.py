"""A fingerprint of everything the rendered site is built from, so that ``make book``
can skip Sphinx (and the downloads) when none of it changed since the last build.

    python scripts/site_inputs.py            # print the fingerprint of the inputs now
    python scripts/site_inputs.py --check    # exit 0 when the built site has them
    python scripts/site_inputs.py --record   # record them on the built site

An unchanged rebuild still took 35 s of Sphinx (the pages that read the claims and
runtimes are re-read every time) and 6 s of downloads. The inputs are hashed by
content: every file of the source tree that git tracks or would track (or, outside a
git checkout, every file but the build outputs), the commit (the downloads' archive is
named after it), the executed chapters and the notebooks of their execution cache, a
PDF from ``make pdf`` (the next build links it), the fetched web assets' pins and the
environment's install stamp. The record lives in the built site
(``_build/html/.fmlab-inputs``), so removing the site removes it.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "_build" / "html" / ".fmlab-inputs"
# build outputs and caches of a tree that is not a git checkout (the source archive)
_NOT_SOURCES = {"_build", ".venv", ".git", ".fmlab_cache", "_webassets", "__pycache__"}


def _source_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.split(b"\0")
        files = [ROOT / name.decode() for name in listed if name]
    except (OSError, subprocess.CalledProcessError):
        files = [
            p
            for p in ROOT.rglob("*")
            if p.is_file() and not _NOT_SOURCES & set(p.relative_to(ROOT).parts)
        ]
    return sorted(p for p in files if p.is_file())


def _built_inputs() -> list[Path]:
    """The built files the site reads. Not the execution cache's database (every read
    rewrites it) but its executed notebooks; not the wheel and the archive, which the
    build makes again from the sources (their zip and tar times differ every time),
    but a PDF, which only ``make pdf`` makes."""
    build = ROOT / "_build"
    paths = [p for p in (build / "executed").rglob("*") if p.is_file()]
    paths += [p for p in (build / ".jupyter_cache").rglob("*.ipynb")]
    paths.append(build / ".jupyter_cache" / "fmlab_execution.json")  # the times
    paths += list((build / "downloads").glob("*.pdf"))
    paths += [ROOT / "_webassets" / "vendor" / ".pins", ROOT / ".venv" / ".installed"]
    return sorted(p for p in paths if p.is_file())


def fingerprint() -> str:
    """The SHA-256 of the inputs (paths and contents), with the commit."""
    h = hashlib.sha256()
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        commit = b"(no git checkout)"
    h.update(commit)
    for path in _source_files() + _built_inputs():
        h.update(str(path.relative_to(ROOT)).encode() + b"\0")
        h.update(path.read_bytes() if path.name != ".installed" else b"")
        if path.name == ".installed":  # an empty stamp: its time is what changes
            h.update(str(path.stat().st_mtime_ns).encode())
        h.update(b"\0")
    return h.hexdigest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--check", action="store_true", help="exit 0 when the site has these inputs"
    )
    what.add_argument(
        "--record", action="store_true", help="record these inputs on the built site"
    )
    a = parser.parse_args(argv)
    now = fingerprint()
    if a.check:
        built = (ROOT / "_build" / "html" / "index.html").is_file()
        recorded = RECORD.read_text().strip() if RECORD.is_file() else ""
        return 0 if built and recorded == now else 1
    if a.record:
        RECORD.write_text(now + "\n")
        return 0
    print(now)
    return 0


if __name__ == "__main__":
    sys.exit(main())
