"""The ``--restamp`` of Chapter 4's stored-run scripts (scripts/ch4_second_world.py,
scripts/ch4_fewshot.py): after a change to the code behind a results file, the script
reruns one job of the file with today's code and records today's fingerprint only if
the job reproduces its record; a record the job does not reproduce leaves the file
stale. Each is tried on a tiny results file written here, under a fingerprint of other
code (so that its code has "changed").

Oracle: the record written by the same code in this test (a rerun of it must come out
bit for bit), and a record moved by hand (which the job must not reproduce).
"""

import dataclasses
from dataclasses import asdict

import pytest
from scripts_loader import load_script

from fmlab import stored
from fmlab.chapters import ch4_second_world as w2
from fmlab.chapters import ch4_stored as ch4s


@pytest.fixture(scope="module")
def _module_cache(tmp_path_factory):
    """One model cache for this file's tests (the tiny pretraining of the second
    world's seed 105 is computed once for two of them; each job check reruns its
    pretraining in a fresh cache of its own, whatever this one holds)."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(autouse=True)
def _own_cache(_module_cache, monkeypatch):
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(_module_cache))
    monkeypatch.delenv("FMLAB_SEED_OFFSET", raising=False)


@pytest.fixture(scope="module")
def second_world_105(_module_cache):
    """The slice's tiny world at the pretraining the script's job reruns (105): its
    config and its record."""
    config = w2.SecondWorldConfig(**{**w2.SECOND_WORLD_SLICE, "pretrain_seeds": (105,)})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FMLAB_CACHE_DIR", str(_module_cache))
        mp.delenv("FMLAB_SEED_OFFSET", raising=False)
        return config, w2.second_world_pretraining(config, 105)


def _other_code():  # the fingerprint of a file whose code has changed since
    return [stored.read]


def test_the_second_worlds_restamp_needs_its_pretraining_to_reproduce(
    tmp_path, capsys, second_world_105
):
    config, record = second_world_105
    out = tmp_path / "second_world.json"

    def write(pretraining):
        part = {"config": asdict(config), "pretrainings": [pretraining]}
        stored.write(
            out,
            {"parts": {"main": part}, "meta": {}},
            script=w2.SECOND_WORLD_SCRIPT,
            sources=_other_code(),
            config={"main": asdict(config)},
        )

    script = load_script("ch4_second_world")
    # the zero-shot accuracy is the same in every run, so it must come out exactly
    moved = {**record, "zero_shot": [v + 0.1 for v in record["zero_shot"]]}
    write(moved)
    before = out.read_text()
    assert script.main(["--restamp", "--out", str(out)]) == 1
    assert out.read_text() == before  # not reproduced: the file stays stale
    assert "rerun the whole run" in capsys.readouterr().out
    write(record)
    assert script.main(["--restamp", "--out", str(out)]) == 0
    now = stored.read(out)["stored"]
    assert stored.changed_sources(out, w2.second_world_sources()) == []
    assert "bit for bit" in now["note"] and "pretraining 105" in now["note"]
    assert now["earlier"]["changed_since"]
    assert script.main(["--restamp", "--out", str(out)]) == 0  # nothing to do now
    assert "already records today's code" in capsys.readouterr().out
    with pytest.raises(ValueError, match="seed must be one of the part's"):
        w2.second_world_job_check(out, seed=7)
    with pytest.raises(ValueError, match="part must be one of"):
        w2.second_world_job_check(out, part="cv")


def test_the_few_shot_restamp_needs_its_two_draws_to_reproduce(tmp_path, capsys):
    pretrain, experiment = ch4s._slice_configs(None)
    experiment = dataclasses.replace(experiment, seeds=(0, 1))
    entry = ch4s.fewshot_run(pretrain, experiment)
    out = tmp_path / "fewshot.json"

    def write(entry):
        config = {"pretrain": asdict(pretrain), "experiment": asdict(experiment)}
        stored.write(
            out,
            {"meta": {}, "runs": [{**config, "entry": entry}]},
            script=ch4s.FEWSHOT_SCRIPT,
            sources=_other_code(),
            config={"runs": [config]},
        )

    script = load_script("ch4_fewshot")
    key = "prompt|zero-shot|2"  # the same in every draw: it must come out exactly
    shifted = [v + 0.001 for v in entry["accuracy"][key]]
    moved = {**entry, "accuracy": {**entry["accuracy"], key: shifted}}
    write(moved)
    before = out.read_text()
    assert script.main(["--restamp", "--out", str(out)]) == 1
    assert out.read_text() == before
    assert "rerun the whole run" in capsys.readouterr().out
    write(entry)
    assert script.main(["--restamp", "--out", str(out)]) == 0
    now = stored.read(out)["stored"]
    assert stored.changed_sources(out, ch4s.fewshot_sources()) == []
    assert "bit for bit" in now["note"] and "draws 0 and 1" in now["note"]
    with pytest.raises(ValueError, match="seeds must be two or more"):
        ch4s.fewshot_job_check(out, seeds=(0,))


def test_the_second_worlds_redo_seeds_reruns_only_the_named_pretrainings(
    tmp_path, monkeypatch, capsys, second_world_105
):
    """``--redo-seeds``: the named pretrainings of a part are computed again with
    today's code; the part's other pretrainings and the file's other parts stay as
    stored (oracle: values moved by hand, which only a rerun can restore; the rerun
    reads the tiny pretraining from this file's model cache)."""
    one, record = second_world_105
    tiny = dataclasses.replace(one, pretrain_seeds=(7, 105))
    moved = {**record, "contrast": [v + 100.0 for v in record["contrast"]]}
    kept = {**moved, "seed": 7}
    script = load_script("ch4_second_world")
    monkeypatch.setattr(
        script, "part_config", lambda name: tiny if name == "main" else None
    )
    out = tmp_path / "second_world.json"
    parts = {
        "main": {"config": asdict(tiny), "pretrainings": [kept, moved]},
        "other": {"config": {}, "pretrainings": []},
    }
    stored.write(
        out,
        {"parts": parts, "meta": {"wall_seconds": 0.0}},
        script=w2.SECOND_WORLD_SCRIPT,
        sources=w2.second_world_sources(),
        config={"main": asdict(tiny)},
    )
    redo = ["--parts", "main", "--redo-seeds", "105", "--out", str(out)]
    assert script.main(redo) == 0
    after = stored.read(out)
    redone = {p["seed"]: p["contrast"] for p in after["parts"]["main"]["pretrainings"]}
    assert redone[105] == record["contrast"]  # computed again
    assert redone[7] == kept["contrast"]  # kept as stored
    assert "other" in after["parts"]
    assert "pretraining 105" in capsys.readouterr().out
