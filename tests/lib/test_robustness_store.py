"""scripts/check_seeds.py --store: the stored robustness run the reproduction notes
read (keyed verdicts by offset, merged across runs)."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(offset, value, verified=True, errors=()):
    claims = [
        {
            "key": "ch9.gain",
            "verified": verified,
            "claimed": True,
            "value": value,
            "strength": value * 10,
            "statement": "s",
            "kind": "finding",
        },
        {"key": None, "verified": True, "statement": "unkeyed", "kind": "check"},
    ]
    return {
        "chapter": "09-x",
        "offset": offset,
        "claims": claims,
        "errors": list(errors),
    }


def test_store_merges_keyed_verdicts_by_offset(tmp_path):
    seeds = _module("check_seeds", ROOT / "scripts" / "check_seeds.py")
    path = tmp_path / "robustness.json"
    seeds.store([_result(0, 0.2), _result(1, 0.3)], path)
    seeds.store(
        [_result(1, 0.1, verified=False), _result(2, 0.5, errors=["boom"])], path
    )
    data = json.loads(path.read_text())
    by = data["keys"]["ch9.gain"]["offsets"]
    assert list(by) == ["0", "1"]  # the errored run is not stored
    assert by["0"]["value"] == 0.2 and by["1"]["value"] == 0.1
    assert by["1"]["verified"] is False
    assert list(data["keys"]) == ["ch9.gain"]  # unkeyed claims are not stored


def test_notes_text_names_the_weakest_offset():
    ext = _module("fmlab_sphinx", ROOT / "book" / "_ext" / "fmlab_sphinx.py")
    entry = {
        "offsets": {
            "0": {"verified": True, "claimed": True, "value": 0.2, "strength": 2.0},
            "3": {"verified": True, "claimed": True, "value": 0.1, "strength": 1.2},
        }
    }
    text = ext._robustness_text(entry)
    assert text.startswith("holds at 2 of 2 offsets (0, 3)")
    assert "weakest 1.20× the rule's 3 s.e., at offset 3" in text
    assert "values 0.1 to 0.2" in text
    assert "no stored run" in ext._robustness_text(None)


def test_a_stored_key_is_recorded_once_whatever_the_offsets(tmp_path):
    seeds = _module("check_seeds", ROOT / "scripts" / "check_seeds.py")
    path = tmp_path / "robustness.json"
    path.write_text(  # an old record with the stored key once per offset
        json.dumps({"keys": {"ch9.gain": {"offsets": {"0": {"value": 0.2}}}}})
    )
    stored = {"ch9.gain": "scripts/ch9_sweep.py"}
    seeds.store([_result(k, 0.2) for k in (0, 1, 2)], path, stored=stored)
    entry = json.loads(path.read_text())["keys"]["ch9.gain"]
    assert list(entry) == ["stored"]  # no per-offset copies of one run
    assert entry["stored"]["script"] == "scripts/ch9_sweep.py"
    assert entry["stored"]["value"] == 0.2 and entry["stored"]["verified"] is True
    ext = _module("fmlab_sphinx", ROOT / "book" / "_ext" / "fmlab_sphinx.py")
    text = ext._robustness_text(entry)
    assert text.startswith("one stored run (scripts/ch9_sweep.py)")
    assert "holds, 2.00× the rule's 3 s.e." in text and "offsets (" not in text


def test_the_registry_names_the_stored_keys_and_the_record_has_them_once():
    seeds = _module("check_seeds", ROOT / "scripts" / "check_seeds.py")
    stored = seeds.stored_keys()
    assert stored, "the registry marks the keys read from stored runs"
    record = json.loads((ROOT / "book" / "robustness.json").read_text())["keys"]
    for key, script in stored.items():
        assert (ROOT / script).is_file(), script
        if key in record:
            assert list(record[key]) == ["stored"], key
            assert record[key]["stored"]["script"] == script


def test_the_record_holds_every_registered_key_at_every_offset():
    """book/robustness.json, which the reproduction notes read, holds every key of the
    registry: a key judged on the page at offsets 0-4 and at least three offsets beyond
    them (never used while designing, by the book's convention 900 and up); a key read
    from a stored run (its registry names the script) once, under ``stored``. A key
    added or re-registered without its robustness run fails here."""
    import yaml

    keys = yaml.safe_load((ROOT / "book" / "claims.yml").read_text())["keys"]
    record = json.loads((ROOT / "book" / "robustness.json").read_text())["keys"]
    problems = []
    for key, entry in keys.items():
        have = record.get(key, {})
        if entry.get("stored"):
            if "stored" not in have:
                problems.append(f"{key}: no stored record")
            continue
        offsets = {int(o) for o in have.get("offsets", {})}
        if missing := {0, 1, 2, 3, 4} - offsets:
            problems.append(f"{key}: offsets {sorted(missing)} missing")
        if len([o for o in offsets if o >= 900]) < 3:
            problems.append(f"{key}: fewer than three offsets from 900 up")
    assert not problems, "run scripts/check_seeds.py --store for:\n" + "\n".join(
        problems
    )
