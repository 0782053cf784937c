"""The ``--restamp`` of scripts/ch3_lpft.py: after a change to the code behind
``results/ch3_lpft.json``, the script reruns one experiment of the file (the one at
60°) with today's code and records today's fingerprint only if it reproduces its
record; a record it does not reproduce leaves the file stale. Tried on a tiny results
file written here, under a fingerprint of other code (so that its code has "changed").

Oracle: the record written by the same code in this test (a rerun of it must come out
bit for bit), and a record moved by hand (which the job must not reproduce).
"""

import pytest
from scripts_loader import load_script

from fmlab import stored
from fmlab.chapters import ch3_lpft as ch3
from fmlab.chapters import ch3_stored


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path / "models"))
    monkeypatch.delenv("FMLAB_SEED_OFFSET", raising=False)


def _other_code():  # the fingerprint of a file whose code has changed since
    return [stored.read]


def test_the_lpft_restamp_needs_its_experiment_to_reproduce(tmp_path, capsys):
    # the slice's tiny experiment on two worlds, at the angle the job reruns, beside
    # another angle that the job leaves alone
    tiny = ch3.LPFTConfig(**{**ch3_stored.LPFT_SLICE, "seeds": (0, 1)})
    configs = [ch3.at_angle(tiny, 75.0), ch3.at_angle(tiny, 60.0)]
    runs = [ch3_stored.lpft_run(c) for c in configs]
    out = tmp_path / "lpft.json"

    def write(runs):
        stored.write(
            out,
            {"meta": {}, "runs": runs},
            script=ch3_stored.LPFT_SCRIPT,
            sources=_other_code(),
            config={"experiments": [r["config"] for r in runs]},
        )

    script = load_script("ch3_lpft")
    # the pretraining loss of the 60° run, moved far beyond its spread by hand
    result = runs[1]["result"]
    loss = result["pretrain_loss"]
    moved_loss = {**loss, "data": [v + 100.0 for v in loss["data"]]}
    moved = {**runs[1], "result": {**result, "pretrain_loss": moved_loss}}
    write([runs[0], moved])
    before = out.read_text()
    assert script.main(["--restamp", "--out", str(out)]) == 1
    assert out.read_text() == before  # not reproduced: the file stays stale
    assert "rerun the whole run" in capsys.readouterr().out
    write(runs)
    assert script.main(["--restamp", "--out", str(out)]) == 0
    now = stored.read(out)["stored"]
    assert stored.changed_sources(out, ch3_stored.lpft_sources()) == []
    assert "bit for bit" in now["note"] and "60°" in now["note"]
    assert now["earlier"]["changed_since"]
    assert script.main(["--restamp", "--out", str(out)]) == 0  # nothing to do now
    assert "already records today's code" in capsys.readouterr().out
    with pytest.raises(ValueError, match="angle must be one of"):
        ch3_stored.lpft_job_check(out, angle=45.0)
