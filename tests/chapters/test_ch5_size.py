"""The size sweep of Chapter 5 in the paper's design (fmlab.chapters.ch5_size)."""

import importlib.util
from pathlib import Path

import pytest
import torch

from fmlab.chapters import ch5_size


def test_the_size_script_writes_what_the_page_reads(tmp_path, monkeypatch):
    """A tiny sweep (two sizes, two replicates, a few steps) through the script: the
    file loads with today's fingerprint, every replicate has a gap and an accuracy per
    probe size, and size_sweep_compared keeps the sizes near the smallest mean gap."""
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "size_sweep", root / "scripts" / "ch5_size_sweep.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "s.json"
    tiny = dict(sizes=(8,), n_models=3, steps=3, probe_sizes=(20,), n_probe_test=50)
    monkeypatch.setattr(ch5_size, "SIZE_SWEEP_SLICE", tiny)  # the file's slice
    config = ch5_size.SizeSweepConfig(sizes=(8, 16), n_models=2, steps=3)
    run = ch5_size.size_sweep_run(config, 8)
    assert len(run["gap"]) == 2 and torch.tensor(run["accuracy"]).shape == (2, 3)
    assert 0.5 <= run["bayes_accuracy"] <= 1.0
    with pytest.raises(ValueError, match="size"):
        ch5_size.size_sweep_run(config, 12)
    args = ["--sizes", "16", "32", "--models", "2", "--steps", "3", "--out", str(out)]
    assert script.main(args) == 0
    res = ch5_size.size_sweep_results(out)
    assert res["meta"]["stored"]["script"] == "scripts/ch5_size_sweep.py"
    assert res["meta"]["stored"]["config"]["sizes"] == [16, 32]
    assert len(res["meta"]["stored"]["slice"]["result"]["gap"]) == 3
    assert set(k for k in res if k != "meta") == {16, 32}
    assert len(ch5_size.size_sweep_compared(res, 1e9)) == 2
    assert len(ch5_size.size_sweep_compared(res, 1e-12)) == 1
    with pytest.raises(ValueError):
        ch5_size.size_sweep_compared(res, 0.0)
    with pytest.raises(ValueError):
        ch5_size.SizeSweepConfig(tolerance=0.0)
    with pytest.raises(FileNotFoundError, match="scripts/ch5_size_sweep.py"):
        ch5_size.size_sweep_results(tmp_path / "none.json")


def test_the_stored_size_sweep_matches_its_code():
    res = ch5_size.size_sweep_results()
    cfg = res["meta"]["config"]
    assert sorted(k for k in res if k != "meta") == list(cfg["sizes"])
    for h in cfg["sizes"]:
        assert res[h]["gap"].shape == (cfg["n_models"],)
        assert res[h]["accuracy"].shape == (cfg["n_models"], len(cfg["probe_sizes"]))
