"""The build's key for a chapter page's executed outputs (scripts/execute_chapters.py):
a stored result of a chapter (``fmlab/chapters/results/chN_*.json``, written by a script
outside the build) re-executes that chapter's pages and no other."""

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
