"""Stored runs (fmlab.chapters.ch5_stored) and the stored width sweep of Chapter 5."""

import importlib.util
import json
import sys

import pytest
import torch

from fmlab.chapters import ch5_stored as stored


def _module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_changing_a_line_of_the_code_makes_the_load_name_the_script(tmp_path):
    code = tmp_path / "produce_mod.py"
    code.write_text(
        "def produce():\n    return 1 + 1\n\n\ndef other():\n    return 0\n"
    )
    mod = _module(code, "produce_mod")
    out = tmp_path / "results.json"
    rec = stored.write(
        out,
        {"value": mod.produce()},
        script="scripts/make_it.py",
        sources=[mod.produce],
    )
    assert rec["fingerprint"]["produce_mod.produce"]
    assert {"torch", "python", "machine", "cpus", "written"} <= set(rec)
    data = stored.load(out, script="scripts/make_it.py", sources=[mod.produce])
    assert data["value"] == 2 and data["stored"]["script"] == "scripts/make_it.py"

    # a change elsewhere in the module leaves the fingerprint of produce alone
    code.write_text(
        "def produce():\n    return 1 + 1\n\n\ndef other():\n    return 9\n"
    )
    mod = _module(code, "produce_mod")
    stored.load(out, script="scripts/make_it.py", sources=[mod.produce])

    # one changed line of the producing code: the load names the script and the source
    code.write_text(
        "def produce():\n    return 1 + 2\n\n\ndef other():\n    return 9\n"
    )
    mod = _module(code, "produce_mod")
    with pytest.raises(
        stored.StaleResults, match=r"produce_mod\.produce.*scripts/make_it"
    ):
        stored.load(out, script="scripts/make_it.py", sources=[mod.produce])
    # files count as sources too
    with pytest.raises(stored.StaleResults, match="scripts/make_it.py"):
        stored.load(out, script="scripts/make_it.py", sources=[code])


def test_a_file_without_a_fingerprint_or_no_file_names_the_script(tmp_path):
    out = tmp_path / "old.json"
    out.write_text(json.dumps({"runs": []}))
    with pytest.raises(stored.StaleResults, match="no code fingerprint.*scripts/x.py"):
        stored.load(out, script="scripts/x.py", sources=[stored.fingerprint])
    with pytest.raises(FileNotFoundError, match="scripts/x.py"):
        stored.load(tmp_path / "none.json", script="scripts/x.py", sources=[json])
    with pytest.raises(ValueError):
        stored.write(out, {"stored": 1}, script="s", sources=[json])
    with pytest.raises(ValueError):
        stored.fingerprint([])


def test_the_stored_width_sweep_matches_its_code_and_refuses_a_change(monkeypatch):
    from fmlab.chapters import ch5_sgd_noise as ch5t

    res = ch5t.width_sweep_results()  # the fingerprint of today's code matches
    assert res["meta"]["stored"]["script"] == "scripts/ch5_width_sweep.py"
    names = set(res["meta"]["stored"]["fingerprint"])
    assert "fmlab.chapters.ch5_sgd_noise.width_sweep_run" in names
    assert "scripts/ch5_width_sweep.py" in names

    real = stored.source_text

    def edited(source):  # width_sweep_run with one line changed
        text = real(source)
        if source is ch5t.width_sweep_run:
            text = text.replace("lr=c.pretrain_lr", "lr=2 * c.pretrain_lr")
        return text

    monkeypatch.setattr(stored, "source_text", edited)
    with pytest.raises(
        stored.StaleResults, match=r"width_sweep_run.*Rerun scripts/ch5_width_sweep\.py"
    ):
        ch5t.width_sweep_results()


def test_one_job_of_the_stored_width_sweep_reruns_to_its_record():
    """Width 32 at learning rate 0.01, chunk 0 of the stored sweep, rerun with today's
    code (three models, 2000 Adam steps: about 2 min on one core) and compared with its
    record within WIDTH_SWEEP_SLICE_TOL (gaps 2e-3 nats, accuracies 0.01, traces 5%
    relative; on the machine that stored it the rerun is bit for bit)."""
    from fmlab.chapters import ch5_sgd_noise as ch5t

    torch.set_num_threads(1)
    check = ch5t.width_sweep_slice_check()
    assert check["ok"], check


def test_restamp_keeps_the_payload_and_the_earlier_record(tmp_path):
    code = tmp_path / "restamp_mod.py"
    code.write_text("def produce():\n    return 1\n")
    mod = _module(code, "restamp_mod")
    out = tmp_path / "r.json"
    stored.write(out, {"runs": [1, 2]}, script="scripts/s.py", sources=[mod.produce])
    code.write_text("def produce():\n    return 1  # same value\n")
    mod = _module(code, "restamp_mod")
    assert stored.changed_sources(out, [mod.produce]) == ["restamp_mod.produce"]
    rec = stored.restamp(out, sources=[mod.produce], note="checked")
    assert rec["earlier"]["changed_since"] == ["restamp_mod.produce"]
    data = stored.load(out, script="scripts/s.py", sources=[mod.produce])
    assert data["runs"] == [1, 2] and data["stored"]["note"] == "checked"


def test_a_checked_restamp_needs_the_rerun_job_to_reproduce_its_record(tmp_path):
    code = tmp_path / "checked_mod.py"
    code.write_text("def produce():\n    return 1\n")
    mod = _module(code, "checked_mod")
    out = tmp_path / "r.json"
    stored.write(out, {"runs": [1]}, script="scripts/s.py", sources=[mod.produce])
    calls = []

    def check(ok):
        return lambda path: calls.append(path) or {"gap": 0.0, "ok": ok}

    # unchanged code: nothing to rerun
    assert (
        stored.restamp_checked(out, sources=[mod.produce], check=check(True), job="j")
        == 0
    )
    assert calls == []
    code.write_text("def produce():\n    return 1  # the same\n")
    mod = _module(code, "checked_mod")
    # a job that does not reproduce its record leaves the file stale
    assert (
        stored.restamp_checked(out, sources=[mod.produce], check=check(False), job="j")
        == 1
    )
    with pytest.raises(stored.StaleResults, match="scripts/s.py"):
        stored.load(out, script="scripts/s.py", sources=[mod.produce])
    # one that does records today's code, with the differences in the note
    assert (
        stored.restamp_checked(out, sources=[mod.produce], check=check(True), job="j")
        == 0
    )
    data = stored.load(out, script="scripts/s.py", sources=[mod.produce])
    assert (
        "today's code, j reproduced" in data["stored"]["note"]
        and "gap 0.0e+00" in data["stored"]["note"]
    )
    assert len(calls) == 2


def test_tensors_survive_their_json_form_to_the_last_bit():
    g = torch.Generator().manual_seed(0)
    value = {
        "a": torch.randn(3, 4, generator=g),
        "b": {"c": torch.randn(5, dtype=torch.float64, generator=g) * 1e-300},
        "n": torch.tensor(7),
        "i": torch.arange(6).reshape(2, 3),
    }
    back = stored.decode_tensors(json.loads(json.dumps(stored.encode_tensors(value))))
    for x, y in ((value["a"], back["a"]), (value["b"]["c"], back["b"]["c"])):
        assert x.dtype == y.dtype and torch.equal(x, y)
    assert back["n"].shape == () and int(back["n"]) == 7
    assert torch.equal(back["i"], value["i"])
    with pytest.raises(TypeError, match="value"):
        stored.encode_tensors({"x": [1.0]})
