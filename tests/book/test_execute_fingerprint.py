"""The build's key for a chapter page's executed outputs (scripts/execute_chapters.py):
a stored result of a chapter (``fmlab/chapters/results/chN_*.json``, written by a script
outside the build) or a change to its keys in the claims registry re-executes that
chapter's pages and no other; a ledger row's edit re-executes none."""

import importlib.util
import os
from pathlib import Path

from scripts_loader import load_script

ROOT = Path(__file__).resolve().parents[2]


def _module():
    return load_script("execute_chapters")


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


def _on_a_copy_of_the_registry(tmp_path, monkeypatch):
    """The build's module reading a copy of the claims registry that a test may edit:
    (module, the copy's path, its text)."""
    ex = _module()
    registry = tmp_path / "claims.yml"
    text = (ROOT / "book" / "claims.yml").read_text()
    registry.write_text(text)
    monkeypatch.setattr(ex, "REGISTRY", registry)
    return ex, registry, text


def test_a_registry_entry_changes_only_its_chapters_fingerprint(tmp_path, monkeypatch):
    ex, registry, text = _on_a_copy_of_the_registry(tmp_path, monkeypatch)
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


def test_a_ledger_row_reexecutes_nothing(tmp_path, monkeypatch):
    # the site renders the ledger at build time; no page output prints a row
    ex, registry, text = _on_a_copy_of_the_registry(tmp_path, monkeypatch)
    page3 = ROOT / "notebooks" / "03-lp-vs-ft.ipynb"
    before = ex._fingerprint(page3)
    old = "    title: LP-FT beats LP both in and out of distribution\n"
    assert old in text
    registry.write_text(text.replace(old, old.replace("beats", "is ahead of")))
    assert ex._fingerprint(page3) == before


def test_execution_counts_what_the_model_cache_computed_and_loaded(
    tmp_path, monkeypatch
):
    # a two-cell notebook asks fmlab.cached for the same entry twice: the first call
    # computes it, the second loads it; the runtimes page reads these counts
    import nbformat

    ex = _module()
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path / "cache"))
    nb = nbformat.v4.new_notebook()
    code = (
        "import torch, fmlab\n"
        'fmlab.cached({"a": 1}, lambda: {"w": torch.ones(2)}, name="t")'
    )
    nb.cells = [nbformat.v4.new_code_cell(code), nbformat.v4.new_code_cell(code)]
    path = tmp_path / "page.ipynb"
    nbformat.write(nb, str(path))
    text, err, _, seconds, use = ex._execute(str(path), timeout=120)
    assert err is None and seconds > 0
    assert use == {"computed": 1, "loaded": 1}
    assert "FMLAB_CACHE_LOG" not in os.environ


def test_the_runtimes_page_compares_a_cached_run_with_the_cached_budget():
    spec = importlib.util.spec_from_file_location(
        "fmlab_sphinx", ROOT / "book" / "_ext" / "fmlab_sphinx.py"
    )
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    verdict = ext.runtime_verdict
    assert verdict(150.0, [180.0, 20.0], 3).startswith("within the budget of a first")
    assert "3 cache entries computed" in verdict(150.0, [180.0, 20.0], 3)
    assert verdict(25.0, [180.0, 20.0], 0).startswith(
        "over the budget of a run with its models cached, 20 s"
    )
    assert verdict(25.0, [60.0], 0).startswith("within the budget of a first run")
    assert "not recorded" in verdict(25.0, [180.0, 20.0], None)
    # the time under a chapter's title, as a reader says it
    said = [ext._duration(s) for s in (5.4, 59.4, 59.6, 62.0, 306.2, 300.0)]
    assert said == ["5 s", "59 s", "1 min", "1 min 2 s", "5 min 6 s", "5 min"]


def test_the_machine_speed_is_a_plausible_number():
    gflops = _module().machine_gflops(seconds=0.2)
    assert 0.1 < gflops < 10_000
