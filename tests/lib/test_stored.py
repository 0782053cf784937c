"""The book's stored runs (fmlab.stored): fingerprints, records, restamps and the rule
that compares a rerun with its record.

Oracles: files and modules written by the tests themselves; hand-computed means and
standard errors; torch's own report of its CPU capability in a subprocess."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from fmlab import stored


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
        config={"steps": 3},
    )
    assert rec["fingerprint"]["produce_mod.produce"]
    assert rec["config"] == {"steps": 3} and rec["written"]
    env = rec["environment"]
    assert {"torch", "python", "machine", "cpus", "cpu_capability", "device"} <= set(
        env
    )
    assert env["device"] == "cpu" and env["cpu_capability"]
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
    # a script's file is no source: its settings are recorded as data
    with pytest.raises(TypeError, match="paths"):
        stored.fingerprint([code])


def test_a_file_without_a_fingerprint_or_no_file_names_the_script(tmp_path):
    out = tmp_path / "old.json"
    out.write_text(json.dumps({"runs": []}))
    with pytest.raises(stored.StaleResults, match="no code fingerprint.*scripts/x.py"):
        stored.load(out, script="scripts/x.py", sources=[stored.fingerprint])
    with pytest.raises(FileNotFoundError, match="scripts/x.py"):
        stored.load(tmp_path / "none.json", script="scripts/x.py", sources=[json])
    with pytest.raises(ValueError):
        stored.write(out, {"stored": 1}, script="s", sources=[json], config={})
    with pytest.raises(ValueError, match="slice"):
        stored.write(out, {}, script="s", sources=[json], config={}, slice={"x": 1})
    with pytest.raises(ValueError):
        stored.fingerprint([])


def test_restamp_keeps_the_payload_and_the_earlier_record(tmp_path):
    code = tmp_path / "restamp_mod.py"
    code.write_text("def produce():\n    return 1\n")
    mod = _module(code, "restamp_mod")
    out = tmp_path / "r.json"
    slice_run = {"config": {"n": 2}, "result": {"gap": [0.1, 0.2]}}
    stored.write(
        out,
        {"runs": [1, 2]},
        script="scripts/s.py",
        sources=[mod.produce],
        config={"n": 9},
        slice=slice_run,
    )
    # the slice as if it had run on another machine (its rerun path is chosen from it)
    data = stored.read(out)
    elsewhere = {**data["stored"]["slice"]["environment"], "cpu_capability": "AVX2"}
    data["stored"]["slice"]["environment"] = elsewhere
    out.write_text(json.dumps(data))
    code.write_text("def produce():\n    return 1  # same value\n")
    mod = _module(code, "restamp_mod")
    assert stored.changed_sources(out, [mod.produce]) == ["restamp_mod.produce"]
    rec = stored.restamp(out, sources=[mod.produce], note="checked")
    assert rec["slice"]["environment"] == elsewhere  # kept, not relabelled here
    assert rec["earlier"]["changed_since"] == ["restamp_mod.produce"]
    data = stored.load(out, script="scripts/s.py", sources=[mod.produce])
    assert data["runs"] == [1, 2] and data["stored"]["note"] == "checked"
    # the config and the slice survive a restamp
    assert data["stored"]["config"] == {"n": 9}
    assert data["stored"]["slice"]["result"] == slice_run["result"]


def test_a_checked_restamp_needs_the_rerun_job_to_reproduce_its_record(tmp_path):
    code = tmp_path / "checked_mod.py"
    code.write_text("def produce():\n    return 1\n")
    mod = _module(code, "checked_mod")
    out = tmp_path / "r.json"
    stored.write(
        out, {"runs": [1]}, script="scripts/s.py", sources=[mod.produce], config={}
    )
    calls = []

    def check(ok):
        return lambda path: calls.append(path) or {"gap": 0.0, "bitwise": 1, "ok": ok}

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
        "today's code, j reproduced its record bit for bit" in data["stored"]["note"]
        and "gap 0.00" in data["stored"]["note"]
    )
    assert len(calls) == 2


def test_tensors_survive_their_json_form_to_the_last_bit():
    g = torch.Generator().manual_seed(0)
    value = {
        "a": torch.randn(3, 4, generator=g),
        "b": {"c": torch.randn(5, dtype=torch.float64, generator=g) * 1e-300},
        "n": torch.tensor(7),
        "i": torch.arange(6).reshape(2, 3),
        "w": torch.randn(40, 30, generator=g),  # above the list limit: base64 bytes
    }
    coded = stored.encode_tensors(value)
    assert "base64" in coded["w"] and "data" in coded["a"]
    back = stored.decode_tensors(json.loads(json.dumps(coded)))
    pairs = [(value[k], back[k]) for k in ("a", "w")] + [
        (value["b"]["c"], back["b"]["c"])
    ]
    for x, y in pairs:
        assert x.dtype == y.dtype and torch.equal(x, y)
    assert back["n"].shape == () and int(back["n"]) == 7
    assert torch.equal(back["i"], value["i"])
    with pytest.raises(TypeError, match="value"):
        stored.encode_tensors({"x": [1.0]})


def test_a_rerun_is_compared_by_the_spread_of_its_record():
    """Means over replicates within 3 two-sample standard errors: the record
    (1, 2, 3) and a rerun (1, 2, 3 + d) have variances 1 and v(d), so the standard
    error of the difference of their means is sqrt((1 + v(d)) / 3)."""
    record = {"gap": [1.0, 2.0, 3.0], "acc": [[0.5, 0.6], [0.7, 0.6], [0.6, 0.6]]}

    def ratio(d):
        new = [1.0, 2.0, 3.0 + d]
        mean = sum(new) / 3
        var = sum((x - mean) ** 2 for x in new) / 2
        return (d / 3) / ((1 + var) / 3) ** 0.5

    res = stored.compare_runs(record, {"gap": [1.0, 2.0, 3.5], "acc": record["acc"]})
    assert res["gap"] == pytest.approx(ratio(0.5)) and res["acc"] == 0.0
    assert res["ok"] and not res["bitwise"]
    # one replicate far off widens the rerun's own spread (the ratio tends to 1)
    assert stored.compare_runs(record, {"gap": [1.0, 2.0, 43.0], "acc": record["acc"]})[
        "ok"
    ]
    shifted = {"gap": [4.0, 5.0, 6.0], "acc": record["acc"]}  # every replicate moves
    res = stored.compare_runs(record, shifted)
    assert res["gap"] == pytest.approx(3 / (2 / 3) ** 0.5) and not res["ok"]
    # a column without spread in either run must be reproduced exactly
    moved = {"gap": record["gap"], "acc": [[0.5, 0.61], [0.7, 0.61], [0.6, 0.61]]}
    res = stored.compare_runs(record, moved)
    assert res["acc"] == float("inf") and not res["ok"]
    same = stored.compare_runs(record, dict(record))
    assert same["bitwise"] and same["ok"]
    with pytest.raises(ValueError, match="same quantities"):
        stored.compare_runs(record, {"gap": record["gap"]})
    with pytest.raises(ValueError, match="two replicates"):
        stored.compare_runs({"gap": [1.0]}, {"gap": [1.0]})
    with pytest.raises(FloatingPointError, match="gap"):
        stored.compare_runs({"gap": [1.0, 2.0]}, {"gap": [1.0, float("nan")]})


def test_other_rounding_takes_another_path_than_the_record():
    """The environment other_rounding names does change torch's CPU capability in a
    fresh process (torch reports it), and differs from the record's."""
    here = stored.environment()
    env = stored.other_rounding({"environment": here})
    if here["cpu_capability"].upper() != "DEFAULT":
        assert env == {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch; print(torch.backends.cpu.get_cpu_capability())",
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip().upper() == env["ATEN_CPU_CAPABILITY"].upper()
    assert run.stdout.strip() != here["cpu_capability"]
    # a record that already ran capped is rerun at this machine's own vector kernels
    capped = {"cpu_capability": "DEFAULT", "rounding": {"MKL_CBWR": "COMPATIBLE"}}
    if here["cpu_capability"].upper() != "DEFAULT":
        assert stored.other_rounding(capped) == {
            "ATEN_CPU_CAPABILITY": here["cpu_capability"].lower()
        }


def test_a_cached_load_reads_once_and_again_after_a_change(tmp_path):
    code = tmp_path / "cached_mod.py"
    code.write_text("def produce():\n    return 1\n")
    mod = _module(code, "cached_mod")
    out, s = tmp_path / "c.json", "scripts/c.py"
    with pytest.raises(FileNotFoundError, match=s):
        stored.load_cached(out, script=s, sources=[mod.produce])
    stored.write(out, {"runs": [1]}, script=s, sources=[mod.produce], config={})
    first = stored.load_cached(out, script=s, sources=[mod.produce])
    assert stored.load_cached(out, script=s, sources=[mod.produce]) is first
    before = out.stat().st_mtime_ns
    stored.write(out, {"runs": [2]}, script=s, sources=[mod.produce], config={})
    os.utime(out, ns=(before + 10**9, before + 10**9))  # a newer file
    assert stored.load_cached(out, script=s, sources=[mod.produce])["runs"] == [2]
    code.write_text("def produce():\n    return 2\n")  # the code changed
    mod = _module(code, "cached_mod")
    with pytest.raises(stored.StaleResults, match=s):
        stored.load_cached(out, script=s, sources=[mod.produce])
