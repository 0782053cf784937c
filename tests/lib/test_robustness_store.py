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
