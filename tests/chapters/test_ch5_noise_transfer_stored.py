"""The stored run of Chapter 5's transformer page (notebooks/05c-same-loss-transformer
.ipynb), Route 1: the script's configuration is the page's, the page reads the stored
run at seed offset 0 and computes it at any other offset or configuration. (That the
file records today's code, refuses a changed line and reruns to its record on another
rounding path: tests/chapters/test_stored_runs.py.)

Oracle: the page's own config cell; the result's shapes from the config.
"""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from scripts_loader import load_script

from fmlab.chapters import ch5_sgd_noise as ch5t

ROOT = Path(__file__).resolve().parents[2]


def _page_config():
    nb = json.loads(
        (ROOT / "notebooks" / "05c-same-loss-transformer.ipynb").read_text()
    )
    (cell,) = [
        "".join(c["source"])
        for c in nb["cells"]
        if c["cell_type"] == "code"
        and "tcfg = ch5t.NoiseTransferConfig(" in "".join(c["source"])
    ]
    cell = cell.split("tres = ")[0]  # the config only, not the run
    scope = {"ch5t": ch5t}
    exec(cell, scope)
    return scope["tcfg"]


def test_the_stored_run_is_the_pages_and_records_todays_code():
    config, res = ch5t.noise_transfer_results()
    page = _page_config()
    assert (
        config
        == page
        == ch5t.NoiseTransferConfig(**load_script("ch5_noise_transfer").PAGE_CONFIG)
    )
    assert res["stored"]["script"] == "scripts/ch5_noise_transfer.py"
    M, E = 1 + len(page.continue_lrs), page.n_models
    assert res["gap"].shape == res["trace_log_encoder"].shape == (M, E)
    assert res["accuracy"].shape == (M, E, len(page.probe_sizes))
    # the page's run is the stored one
    assert ch5t.noise_transfer(page)["stored"] == res["stored"]


def test_another_offset_or_config_is_computed_not_read(monkeypatch):
    calls = []

    def fake_cached(config, build, *, name):
        calls.append(config)
        return {"computed": True}

    monkeypatch.setattr(ch5t, "cached", fake_cached)
    page = _page_config()
    assert ch5t.noise_transfer(replace(page, continue_steps=999)) == {"computed": True}
    monkeypatch.setenv("FMLAB_SEED_OFFSET", "1")
    assert ch5t.noise_transfer(page) == {"computed": True}
    assert len(calls) == 2
    with pytest.raises(TypeError, match="NoiseTransferConfig"):
        ch5t.noise_transfer(dict(d_model=32))
