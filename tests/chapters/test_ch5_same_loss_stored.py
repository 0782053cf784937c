"""The stored run of Chapter 5's same-loss page (notebooks/05b-same-loss.ipynb):
the script's configuration is the page's, the file records today's code, a changed line
makes the load name the script, and its pretraining reruns to its record.

Oracles: the page's own config cell; the fingerprint mechanism of
fmlab.chapters.ch5_stored; a rerun with today's code on this machine.
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from fmlab.chapters import ch5_implicit_bias as ch5
from fmlab.chapters import ch5_stored as stored

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location(
        "same_loss_script", ROOT / "scripts" / "ch5_same_loss.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def _page_config():
    nb = json.loads((ROOT / "notebooks" / "05b-same-loss.ipynb").read_text())
    (cell,) = [
        "".join(c["source"])
        for c in nb["cells"]
        if c["cell_type"] == "code"
        and "cfg = ch5.SameLossConfig(" in "".join(c["source"])
    ]
    scope = {"ch5": ch5}
    exec(cell, scope)
    return scope["cfg"]


def test_the_stored_run_is_the_pages_and_records_todays_code():
    config, res = ch5.same_loss_results()
    page = _page_config()
    assert config == page == ch5.SameLossConfig(**_script().PAGE_CONFIG)
    assert res["stored"]["script"] == "scripts/ch5_same_loss.py"
    assert res["adversarial_gap"].shape == (page.n_models,)
    assert res["recovery0_accuracy"].shape == (3, page.n_models, 2)
    # the page's run is the stored one; another config is not
    assert ch5.same_loss_run(page)["stored"] == res["stored"]


def test_a_changed_line_makes_the_stored_run_name_its_script(monkeypatch):
    real = stored.source_text

    def edited(source):  # the experiment with one line changed
        text = real(source)
        if source is ch5:
            text = text.replace("warmup=100,", "warmup=50,")
        return text

    monkeypatch.setattr(stored, "source_text", edited)
    with pytest.raises(
        stored.StaleResults,
        match=r"ch5_implicit_bias.*Rerun scripts/ch5_same_loss\.py",
    ):
        ch5.same_loss_results()


def test_the_stored_runs_pretraining_reruns_to_its_record():
    """The language, the exact-posterior probes, the 1,500 pretraining steps of the six
    models and their evaluation, rerun with today's code (about a minute on one core),
    within SAME_LOSS_SLICE_TOL of the record (on the machine that stored it, bit for
    bit)."""
    torch.set_num_threads(1)
    check = ch5.same_loss_slice_check()
    assert check["ok"], check
