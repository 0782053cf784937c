"""Build what the site offers for download: the source and the library.

    python scripts/build_downloads.py [--out _build/downloads]

``make book`` runs this before rendering. It writes to ``--out``:

- ``fmlab-book-<commit>.tar.gz``: the whole project at the built commit (``git
  archive HEAD``; from a tree that is not a git checkout, e.g. an unpacked archive,
  every file that is not a build output);
- ``fmlab-<version>-py3-none-any.whl``: the library as a wheel (``pip wheel
  --no-deps``), with the claims registry ``book/claims.yml`` inside it as package data
  (``fmlab/_registry/claims.yml``), so that a chapter run outside the source tree can
  find it;
- ``notebooks/<chapter>.ipynb``: every executed chapter of ``_build/executed`` baked for
  Jupyter as ``make lab`` bakes it (``scripts/bake_notebooks.py --lab``): its text
  reads as the page does and is numbered as the book ("Theorem 6.1", "(6.4)"), and
  each slider figure shows its first frame as an image until the chapter runs. The
  site offers it as each chapter's ".ipynb (executed)" download;
- ``manifest.json``: the two file names, the commit, its date, whether the working
  tree had uncommitted changes, and the build time. The book's Sphinx extension reads
  it to link the files from the landing page, the preface, how-to-run and every
  chapter, and copies them into the site (``_build/html/downloads/``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what a tree that is not a git checkout leaves out of its source archive
NOT_SOURCE = {".venv", "_build", ".jupyter_cache", ".fmlab_cache", "_webassets", ".git"}


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def _commit() -> tuple[str, str, bool]:
    """(commit, its date, dirty): from git, else from the line git archive wrote into
    scripts/build_commit.txt."""
    sha = _git("rev-parse", "HEAD")
    if sha:
        date = _git("show", "-s", "--format=%cI", "HEAD") or ""
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
        return sha, date, dirty
    line = (ROOT / "scripts" / "build_commit.txt").read_text().split()
    if line and not line[0].startswith("$Format"):
        return line[0], line[1] if len(line) > 1 else "", False
    return "unknown", "", True


def _archive(out: Path, sha: str) -> str:
    short = sha[:10]
    name = f"fmlab-book-{short}.tar.gz"
    prefix = f"fmlab-book-{short}/"
    if _git("rev-parse", "HEAD"):
        subprocess.run(
            ["git", "archive", "--format=tar.gz", f"--prefix={prefix}", "-o"]
            + [str(out / name), "HEAD"],
            cwd=ROOT,
            check=True,
        )
        return name
    with tarfile.open(out / name, "w:gz") as tar:
        for path in sorted(ROOT.rglob("*")):
            rel = path.relative_to(ROOT)
            if path.is_file() and not (set(rel.parts) & NOT_SOURCE):
                if "__pycache__" in rel.parts or rel.suffix == ".pyc":
                    continue
                tar.add(path, arcname=prefix + str(rel))
    return name


def _wheel(out: Path) -> str:
    """Build the wheel from a copy of the package, with the registry added."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "fmlab"
        tree.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, tree / name)
        shutil.copytree(
            ROOT / "src",
            tree / "src",
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
        )
        registry = tree / "src" / "fmlab" / "_registry"
        registry.mkdir(exist_ok=True)
        shutil.copy2(ROOT / "book" / "claims.yml", registry / "claims.yml")
        dist = Path(tmp) / "dist"
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
            + ["--no-build-isolation", "--disable-pip-version-check"]
            + ["-w", str(dist), str(tree)],
            check=True,
        )
        (wheel,) = dist.glob("fmlab-*.whl")
        shutil.copy2(wheel, out / wheel.name)
        return wheel.name


def _notebooks(out: Path, executed: Path) -> list[str]:
    """The executed chapters, baked for Jupyter and numbered as the book."""
    if not any(executed.glob("*.ipynb")):
        return []
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bake_notebooks", ROOT / "scripts" / "bake_notebooks.py"
    )
    bake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bake)
    written = bake.bake_folder(executed, out / "notebooks", lab=True)
    return [p.name for p in written]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "downloads")
    parser.add_argument(
        "--executed",
        type=Path,
        default=ROOT / "_build" / "executed",
        help=argparse.SUPPRESS,
    )
    args = parser.parse_args(argv)
    out = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    sha, date, dirty = _commit()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    manifest = {
        "commit": sha,
        "commit_date": date,
        "dirty": dirty,
        "built": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "version": version,
        "archive": _archive(out, sha),
        "wheel": _wheel(out),
        "notebooks": _notebooks(out, args.executed),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    sizes = ", ".join(
        f"{manifest[k]} ({(out / manifest[k]).stat().st_size / 2**20:.1f} MB)"
        for k in ("archive", "wheel")
    )
    sizes += f", {len(manifest['notebooks'])} executed chapters baked for Jupyter"
    print(f"build_downloads: {sizes}" + (" [uncommitted changes]" if dirty else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
