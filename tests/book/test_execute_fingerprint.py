"""The build's key for a chapter page's executed outputs (scripts/execute_chapters.py):
a stored result of a chapter (``fmlab/chapters/results/chN_*.json``, written by a script
outside the build) or a change to its entries in the claims registry re-executes that
chapter's pages and no other."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location(
        "execute_chapters", ROOT / "scripts" / "execute_chapters.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_stored_result_changes_only_its_chapters_fingerprint(tmp_path, monkeypatch):
    ex = _module()
    monkeypatch.setattr(ex, "RESULTS", tmp_path)
    page5, page4 = (
        ROOT / "notebooks" / "05b-same-loss.ipynb",
        ROOT / "notebooks" / "04-kernel-view.ipynb",
    )
    before5, before4 = ex._fingerprint(page5), ex._fingerprint(page4)
    assert ex._fingerprint(page5) == before5  # deterministic
    (tmp_path / "ch5_sweep.json").write_text('{"runs": []}\n')
    changed = ex._fingerprint(page5)
    assert changed != before5 and ex._fingerprint(page4) == before4
    (tmp_path / "ch5_sweep.json").write_text('{"runs": [1]}\n')
    assert ex._fingerprint(page5) not in (before5, changed)


def test_a_registry_entry_changes_only_its_chapters_fingerprint(tmp_path, monkeypatch):
    ex = _module()
    registry = tmp_path / "claims.yml"
    text = (ROOT / "book" / "claims.yml").read_text()
    registry.write_text(text)
    monkeypatch.setattr(ex, "REGISTRY", registry)
    page3, page4 = (
        ROOT / "notebooks" / "03-lp-vs-ft.ipynb",
        ROOT / "notebooks" / "04-kernel-view.ipynb",
    )
    before3, before4 = ex._fingerprint(page3), ex._fingerprint(page4)
    old = (
        "  ch3.ft_minus_lp_id:\n    chapter: 3\n    kind: finding\n    status: claimed"
    )
    assert old in text
    registry.write_text(text.replace(old, old.replace("claimed", "measured")))
    assert ex._fingerprint(page3) != before3 and ex._fingerprint(page4) == before4
