"""Page 03's stored experiments (fmlab.chapters.ch3_stored): the switch reads exactly
the page's configs at seed offset 0 and nothing else, and gives back the tensors
as they were computed.

Oracles: the page's own config cell, executed; the results computed live at a tiny
config (for the encoding round trip); the seed offset's documented meaning. The slice
rerun under another rounding path is in tests/chapters/test_stored_runs.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fmlab.chapters import ch3_lpft as ch3
from fmlab.chapters import ch3_stored
from fmlab.repro import single_threaded
from fmlab.train import fresh_model_cache

PAGE = Path(__file__).resolve().parents[2] / "notebooks" / "03-lp-vs-ft.ipynb"


def _page_configs() -> list:
    """The configs of the page's five experiments, from its own cells: the config
    cell executed, the two angles of ``ANGLES`` and the overlap sweep's call."""
    cells = ["".join(c["source"]) for c in json.loads(PAGE.read_text())["cells"]]
    (config_cell,) = [c for c in cells if c.startswith("cfg = ch3.LPFTConfig(")]
    scope = {"ch3": ch3}
    exec(config_cell, scope)
    cfg, angles = scope["cfg"], scope["ANGLES"]
    sweep = "ch3.overlap_sweep(cfg, (60.0, 70.0, 90.0), seeds=cfg.seeds[:3], known=res)"
    assert any(sweep in c for c in cells), "the page's overlap sweep call changed"
    out = [ch3.at_angle(cfg, a) for a in angles.values()]
    return out + [ch3.at_angle(cfg, a, seeds=cfg.seeds[:3]) for a in (60, 70, 90)]


def test_the_file_holds_exactly_the_pages_experiments():
    stored = [r["config"] for r in ch3_stored.lpft_results()["runs"]]
    page = [ch3_stored.config_record(c) for c in _page_configs()]
    assert stored == page


def test_the_switch_reads_the_page_at_offset_zero_only(monkeypatch):
    cfg = _page_configs()[0]
    monkeypatch.delenv("FMLAB_SEED_OFFSET", raising=False)
    res = ch3_stored.stored_result(cfg)
    S, G = len(cfg.seeds), len(cfg.lrs)
    assert res["acc"]["lp"].shape == (S, 2) and res["acc"]["lp"].dtype == torch.float64
    assert res["trace"]["lpft"].shape[:2] == (S, G)
    assert res["chosen_index"]["ft"].dtype == torch.long
    assert isinstance(res["overlap"], float)
    assert res["overlap"] == pytest.approx(torch.cos(torch.tensor(75.0).deg2rad()) ** 2)
    monkeypatch.setenv("FMLAB_SEED_OFFSET", "1")
    assert ch3_stored.stored_result(cfg) is None
    monkeypatch.delenv("FMLAB_SEED_OFFSET")
    other = ch3.at_angle(cfg, 75.0, n_val=cfg.n_val + 1)
    assert ch3_stored.stored_result(other) is None
    shared = ch3.with_shared(cfg, 0.0, 75.0)  # the same world, another class
    assert ch3_stored.stored_result(shared) is None


def test_config_records_round_trip():
    for cfg in _page_configs() + [ch3.with_shared(ch3.LPFTConfig(), 0.5, 60.0)]:
        assert ch3_stored.lpft_config(ch3_stored.config_record(cfg)) == cfg


def test_a_result_is_stored_to_the_last_bit():
    """A computed result (a tiny config) through the file's encoding and back:
    every tensor identical, in value, dtype and shape, and the numbers kept."""
    cfg = ch3.LPFTConfig(**{**ch3_stored.LPFT_SLICE, "seeds": (0, 1)})
    with fresh_model_cache(), single_threaded():
        res = ch3._lpft_results(cfg)
    back = ch3_stored._decode(json.loads(json.dumps(ch3_stored._encode(res))))
    assert back.keys() == res.keys()

    def same(a, b):
        if isinstance(a, dict):
            assert a.keys() == b.keys()
            for k in a:
                same(a[k], b[k])
        elif isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a.nan_to_num(-7.0), b.nan_to_num(-7.0))
            assert torch.equal(a.isnan(), b.isnan())
        else:
            assert type(a) is type(b) and a == b

    same(res, back)
