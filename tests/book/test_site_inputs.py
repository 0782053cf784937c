"""``make book`` skips Sphinx when the site's inputs did not change
(``scripts/site_inputs.py``): the fingerprint moves with every input and with nothing
the build itself rewrites.

Oracle: files edited by hand in a scratch tree (not a git checkout, so every file but
the build outputs is a source)."""

from pathlib import Path

from scripts_loader import load_script

ROOT = Path(__file__).resolve().parents[2]


def _module(root: Path):
    module = load_script("site_inputs")
    module.ROOT = root
    module.RECORD = root / "_build" / "html" / ".fmlab-inputs"
    return module


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_fingerprint_follows_the_inputs_and_nothing_else(tmp_path):
    m = _module(tmp_path)
    _write(tmp_path / "book" / "page.md", "# A page\n")
    _write(tmp_path / "_build" / "executed" / "01.ipynb", "{}")
    _write(tmp_path / "_build" / ".jupyter_cache" / "global.db", "read at 1")
    _write(tmp_path / "_build" / "downloads" / "fmlab.whl", "zipped at 1")
    _write(tmp_path / "_build" / "html" / "index.html", "<html>")
    first = m.fingerprint()
    # what the build rewrites every time: not an input
    _write(tmp_path / "_build" / ".jupyter_cache" / "global.db", "read at 2")
    _write(tmp_path / "_build" / "downloads" / "fmlab.whl", "zipped at 2")
    _write(tmp_path / "_build" / "html" / "page.html", "<html>")
    assert m.fingerprint() == first
    # inputs: a source, an executed chapter, a PDF to link
    for path, text in (
        (tmp_path / "book" / "page.md", "# A page, edited\n"),
        (tmp_path / "_build" / "executed" / "01.ipynb", '{"cells": []}'),
        (tmp_path / "_build" / "downloads" / "book.pdf", "%PDF"),
    ):
        before = m.fingerprint()
        _write(path, text)
        assert m.fingerprint() != before, path
    # --check: true only once --record has recorded today's inputs on a built site
    assert m.main(["--check"]) == 1
    assert m.main(["--record"]) == 0
    assert m.main(["--check"]) == 0
    _write(tmp_path / "book" / "page.md", "# A page, edited again\n")
    assert m.main(["--check"]) == 1
