"""The stored pretrainings of Chapter 4's second page (notebooks/04b-natural-tasks-and-
lora.ipynb): the script's configuration is the page's, the page reads the stored width
test and model of the experiments at seed offset 0 and computes them at any other
offset or configuration, and the stored model is the one behind the stored width test.
(That the file records today's code, refuses a changed line and reruns to its record
on another rounding path: tests/chapters/test_stored_runs.py.)

Oracles: the page's own config cell; the width test's record of the seed-0 width-32
model, recomputed from the stored weights by the functions that define mean |chi| and
the zero-shot accuracy.
"""

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from scripts_loader import load_script

from fmlab.chapters import ch4_figures as fig4
from fmlab.chapters import ch4_kernel_view as ch4
from fmlab.chapters import ch4_natural_stored as ch4s
from fmlab.chapters import ch4_world as ch4w
from fmlab.models.transformer import PromptClassifier

ROOT = Path(__file__).resolve().parents[2]


def _page_config() -> ch4.ChapterConfig:
    nb = json.loads(
        (ROOT / "notebooks" / "04b-natural-tasks-and-lora.ipynb").read_text()
    )
    (cell,) = [
        "".join(c["source"])
        for c in nb["cells"]
        if c["cell_type"] == "code"
        and "cfg = ch4.ChapterConfig(" in "".join(c["source"])
    ]
    scope = {"ch4": ch4}
    exec(cell, scope)
    return scope["cfg"]


def test_the_stored_run_is_the_pages_and_records_todays_code():
    page = _page_config()
    assert page == ch4.ChapterConfig(**load_script("ch4_natural").PAGE_CONFIG)
    data = ch4s.natural_results()
    assert data["stored"]["config"] == json.loads(json.dumps(asdict(page)))
    assert data["stored"]["script"] == "scripts/ch4_natural.py"
    # the page's width test is the stored one, with its record
    width = ch4.width_test(page)
    assert width["stored"]["fingerprint"] == data["stored"]["fingerprint"]
    assert width["stored"]["wall_seconds"] == data["meta"]["wall_seconds"]
    for w in page.widths:
        for name in ("chi", "accuracy"):
            assert len(width[(name, w)]) == len(page.pretrain_seeds)
    assert "minutes of one CPU core" in fig4.width_stored_text(width)
    assert "computed here" in fig4.width_stored_text({})


def test_the_stored_model_is_the_one_behind_the_stored_width_test():
    page = _page_config()
    mlm, losses = ch4s.stored_pretraining(page.pretrain)
    assert not mlm.training and losses.shape == (page.pretrain_steps,)
    s = ch4.setting(page)
    assert all(
        (a == b).all()
        for a, b in zip(s.mlm.state_dict().values(), mlm.state_dict().values())
    )
    width = ch4.width_test(page)
    test = ch4w.test_set(s.lang, page.n_test)
    f = ch4w.outputs(PromptClassifier(mlm, s.lang), test.x_prompt)
    seed0 = page.pretrain_seeds.index(0)
    assert (
        float(ch4w.output_derivative(f, test.y).abs().mean())
        == (width[("chi", page.d_model)][seed0])
    )
    assert ch4w.sign_accuracy(f, test.y) == width[("accuracy", page.d_model)][seed0]


def test_another_offset_or_config_is_computed_not_read(monkeypatch):
    calls = []

    def fake_width(base, **call):
        calls.append(("width", base, call))
        return {"computed": True}

    def fake_pretrain(config):
        calls.append(("pretrain", config))
        raise RuntimeError("trained")

    monkeypatch.setattr(ch4, "output_derivative_by_width", fake_width)
    monkeypatch.setattr(ch4, "pretrain_masked_lm", fake_pretrain)
    page = _page_config()
    assert ch4.width_test(replace(page, narrow_steps=2999)) == {"computed": True}
    with pytest.raises(RuntimeError, match="trained"):
        ch4.setting(replace(page, pretrain_steps=1999))
    assert ch4s.stored_pretraining(replace(page.pretrain, seed=1)) is None
    monkeypatch.setenv("FMLAB_SEED_OFFSET", "1")
    assert ch4.width_test(page) == {"computed": True}
    assert ch4s.stored_pretraining(page.pretrain) is None
    with pytest.raises(RuntimeError, match="trained"):
        ch4.setting(page)
    assert [c[0] for c in calls] == ["width", "pretrain", "width", "pretrain"]


def test_the_slice_is_small():
    """The slice is a few dozen steps of tiny models (the whole of every slice must
    stay within a minute of make test)."""
    c = ch4s.natural_slice_config()
    assert c["d_model"] <= 16 and c["narrow"] <= 8
    assert c["pretrain_steps"] + c["narrow_steps"] <= 60
    assert len(c["pretrain_seeds"]) == 3
