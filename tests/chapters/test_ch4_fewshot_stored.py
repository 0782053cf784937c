"""Page 04's stored k = 16 runs (fmlab.chapters.ch4_stored): the stored configs are the
page's own, the page reads them at seed offset 0 with exactly those configs and
computes them at any other offset or config, and the stored entry has the shape of the
one the model cache keeps. (That the file records today's code, refuses a changed line
and reruns to its record on another rounding path: tests/chapters/test_stored_runs.py.)

Oracles: the page's own config cells, executed here; the file's own record.
"""

import json
from dataclasses import asdict, replace
from pathlib import Path

import torch

from fmlab.chapters import ch4_fewshot as ch4f
from fmlab.chapters import ch4_kernel_view as ch4
from fmlab.chapters import ch4_stored as ch4st

ROOT = Path(__file__).resolve().parents[2]


def _page_configs():
    nb = json.loads((ROOT / "notebooks" / "04-kernel-view.ipynb").read_text())
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    scope = {"ch4": ch4}
    for marker in ("cfg = ch4.ChapterConfig(", "configs = ("):
        (cell,) = [c for c in cells if marker in c]
        exec(cell, scope)
    return scope["cfg"].pretrain, scope["configs"]


def test_the_stored_runs_are_the_pages_k16_runs():
    pretrain, configs = _page_configs()
    assert pretrain == ch4st.FEWSHOT_PRETRAIN
    (k16,) = [c for c in configs if c.shots == (16,)]
    assert k16 == ch4st.FEWSHOT_EXPERIMENT
    assert len(k16.seeds) == 20  # every draw of the page, none cut
    data = ch4st.fewshot_results()
    (run,) = data["runs"]
    want = json.loads(json.dumps({"pretrain": asdict(pretrain)}))["pretrain"]
    assert run["pretrain"] == want
    assert data["stored"]["script"] == "scripts/ch4_fewshot.py"


def test_the_switch_reads_only_the_stored_configs_at_offset_zero(monkeypatch):
    monkeypatch.delenv("FMLAB_SEED_OFFSET", raising=False)
    pretrain, exp = ch4st.FEWSHOT_PRETRAIN, ch4st.FEWSHOT_EXPERIMENT
    entry = ch4st.stored_entry(pretrain, exp)
    assert entry is not None
    assert set(entry) == {
        "accuracy",
        "chosen",
        "dynamics",
        "by_lr",
        "diverged",
        "example",
    }
    assert all(len(v) == 20 for v in entry["accuracy"].values())
    f_ft = entry["example"]["prompt"]["f_ft"]
    assert isinstance(f_ft, torch.Tensor) and f_ft.shape == (3, exp.n_test)
    assert ch4st.stored_entry(pretrain, replace(exp, seeds=tuple(range(19)))) is None
    assert ch4st.stored_entry(replace(pretrain, seed=1), exp) is None
    monkeypatch.setenv("FMLAB_SEED_OFFSET", "1")
    assert ch4st.stored_entry(pretrain, exp) is None


def test_run_kernel_experiment_serves_the_stored_entry(monkeypatch):
    monkeypatch.delenv("FMLAB_SEED_OFFSET", raising=False)

    def computed(*args, **kwargs):
        raise AssertionError("computed, though the run is stored")

    monkeypatch.setattr(ch4f, "cached", computed)  # the stored path only
    res = ch4f.run_kernel_experiment(ch4st.FEWSHOT_PRETRAIN, ch4st.FEWSHOT_EXPERIMENT)
    entry = ch4st.fewshot_results()["runs"][0]["entry"]
    assert (
        res.accuracy[("prompt", "SGD-FT", 16)] == entry["accuracy"]["prompt|SGD-FT|16"]
    )
    assert (
        res.chosen[("standard", "SGD-FT, wide grid", 16)]
        == (entry["chosen"]["standard|SGD-FT, wide grid|16"])
    )
