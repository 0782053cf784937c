"""The claims index that the build writes (_build/claims.json) and its page.

Needs a built book (``make test`` builds it first); skips with a message otherwise.
"""

import json
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = ROOT / "_build" / "claims.json"
CHAPTERS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))

# Keys whose meaning an issue fixes; each must be in the book (see the chapters'
# issues). The registry (book/claims.yml) defines them; the build fails on a registered
# key that no chapter produced.
REQUIRED_KEYS = [
    "ch1.interface_bound",
    "ch3.ft_minus_lp_id",
    "ch3.lp_minus_ft_ood",
    "ch3.lpft_minus_lp_ood",
    "ch3.lpft_minus_lp_id",
    "ch3.feature_change_ratio_10x",
    "ch3.lp_minus_scratch_ood",
    "ch4.prompt_minus_standard_k16",
    "ch4.entk_minus_ft_validated",
    "ch4.asigngd_minus_adam_validated",
    "ch4.entk_steps_minus_ft_prompt",
    "ch4.prompt_kernel_change_validated_below_2",
    "ch4.lora_kernel_error_slope_half",
    "ch4.second_world_contrast_six",
    "ch5.sgd_trace_drop",
    "ch5.encoder_trace_ratio_adv",
    "ch5.width_transfer_gain",
    "ch6.bayes_icl_gain_k3",
    "ch6.icl_gain_k3",
    "ch6.icl_gain_k5",
    "ch6.unseen_pattern_gain",
]


@pytest.fixture(scope="module")
def claims():
    if not CLAIMS.exists():
        pytest.skip(f"no {CLAIMS.relative_to(ROOT)}: build the book first (make book)")
    return json.loads(CLAIMS.read_text())


def test_every_claim_is_listed_and_verified(claims):
    fields = {"chapter", "key", "kind", "statement", "verified", "evidence", "value"}
    assert claims, "the claims index is empty"
    for row in claims:
        assert fields <= set(row), f"missing fields in {row}"
        assert row["verified"] is True or row["claimed"] is False, (
            f"unverified claim in the build: {row['statement']}"
        )
        assert row["kind"] in ("finding", "check")


def test_every_key_is_registered_with_its_tested_quantity(claims):
    import yaml

    registry = yaml.safe_load((ROOT / "book" / "claims.yml").read_text())["keys"]
    for row in claims:
        if row["key"]:
            entry = registry[row["key"]]
            assert row["kind"] == entry["kind"] and row["quantity"] == entry["quantity"]
            assert row["claimed"] == (entry["status"] == "claimed")
            if row["kind"] == "finding":
                assert isinstance(row["value"], float), row["key"]


def test_claims_page_opens_with_the_ledger():
    page = (ROOT / "_build" / "html" / "book" / "claims.html").read_text()
    assert 'id="reproduction-ledger"' in page
    assert page.index("reproduction-ledger") < page.index("claims-headlines")
    for status in ("reproduced", "not reproduced"):
        assert status in page


def test_every_chapter_has_a_keyed_claim(claims):
    documents = {f"notebooks/{c}" for c in CHAPTERS}
    keyed = {r["document"] for r in claims if r["key"]}
    assert documents <= {r["document"] for r in claims}, (
        "a chapter's claims are missing"
    )
    assert documents <= keyed, f"chapters without a keyed finding: {documents - keyed}"


def test_keys_are_unique_and_required_keys_exist(claims):
    keys = Counter(r["key"] for r in claims if r["key"])
    assert not [k for k, n in keys.items() if n > 1], f"duplicate keys: {keys}"
    missing = [k for k in REQUIRED_KEYS if k not in keys]
    assert not missing, f"keys the issues name are missing: {missing}"


def test_index_page_links_every_claim(claims):
    page = (ROOT / "_build" / "html" / "book" / "claims.html").read_text()
    for row in claims:
        target = row["link"].split("#")[1]
        assert f"#{target}" in page, f"claims index lacks a link to {row['link']}"
        chapter = (ROOT / "_build" / "html" / row["link"].split("#")[0]).read_text()
        assert f'id="{target}"' in chapter, f"no anchor {target} in {row['link']}"


def test_every_verdict_mark_links_to_its_row_on_the_claims_page(claims):
    """A verdict line beside a result links to the claim's row on the claims page,
    where the full evidence stands."""
    import re

    html_dir = ROOT / "_build" / "html"
    index = (html_dir / "book" / "claims.html").read_text()
    rows = set(re.findall(r'<tr[^>]* id="(row-[^"]+)"', index))
    for document in sorted({r["document"] for r in claims}):
        page = (html_dir / f"{document}.html").read_text()
        links = re.findall(r'class="fmlab-verdict" href="([^"]+)"', page)
        assert links, f"{document}: no verdict marks"
        for link in links:
            path, _, target = link.partition("#")
            assert path.endswith("book/claims.html"), f"{document}: {link}"
            assert target in rows, f"{document}: no row {target} on the claims page"


def test_chapter_pages_fold_their_reproduction_notes():
    """Every chapter that reads as a lesson ends with its reproduction notes, folded,
    with the chapter's ledger rows."""
    from test_lesson import NOT_YET_LESSONS

    for name in CHAPTERS:
        if name in NOT_YET_LESSONS:
            continue
        page = (ROOT / "_build" / "html" / "notebooks" / f"{name}.html").read_text()
        assert '<details class="fmlab-repro">' in page, f"{name}: notes not folded"
        notes = page[page.index('<details class="fmlab-repro">') :]
        assert "this build:" in notes, f"{name}: no ledger rows in the notes"


def test_statement_math_is_typeset_like_the_prose(claims):
    """A statement's inline TeX ($...$) reaches the pages as the spans MathJax typesets:
    on the verdict line beside the result and in the claim's row on the claims page."""
    import html
    import re

    from fmlab.claims import statement_parts

    html_dir = ROOT / "_build" / "html"
    with_math = [r for r in claims if "$" in r["statement"]]
    assert with_math, "no claim statement carries mathematics"
    span = re.compile(r'<span class="math notranslate nohighlight">(.*?)</span>', re.S)

    def formulas(path):
        return {html.unescape(m) for m in span.findall(path.read_text())}

    index = formulas(html_dir / "book" / "claims.html")
    for r in with_math:
        page = formulas(html_dir / f"{r['document']}.html")
        for kind, tex in statement_parts(r["statement"]):
            if kind == "math":
                assert f"\\({tex}\\)" in page, f"{r['document']}: {tex} not typeset"
                assert f"\\({tex}\\)" in index, f"claims page: {tex} not typeset"


# --- the ledger's status rule (no build needed) ------------------------------------


def _ext():
    import importlib.util

    path = ROOT / "book" / "_ext" / "fmlab_sphinx.py"
    spec = importlib.util.spec_from_file_location("fmlab_sphinx_ledger", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_rows_status_comes_from_its_keys_and_only_a_caveat_demotes():
    from fmlab.claims import ledger_status

    assert ledger_status([]) == "not studied"
    assert ledger_status([True, True]) == "reproduced"
    assert ledger_status([True, True], caveat="the whole model is not sharper") == (
        "partly"
    )
    assert ledger_status([True, True], caveat="  ") == "reproduced"
    assert ledger_status([True, False]) == "partly"
    assert ledger_status([False, False]) == "not reproduced"
    assert ledger_status([False], caveat="anything") == "not reproduced"


def test_ledger_rows_a_note_never_changes_the_status():
    ext = _ext()
    registry = {
        "keys": {
            "ch9.a": {"phenomenon": "described"},
            "ch9.b": {"phenomenon": "limited"},
            "ch9.c": {"phenomenon": "measured"},
        },
        "phenomena": {
            "described": {"chapter": 9, "title": "t", "note": "with a prompt"},
            "limited": {"chapter": 9, "title": "t", "caveat": "a part only"},
            "measured": {"chapter": 9, "title": "t", "note": "why it fails"},
            "unstudied": {"chapter": 9, "title": "t", "note": "later"},
        },
    }
    by_key = {
        "ch9.a": ("doc", {"verified": True, "claimed": True}),
        "ch9.b": ("doc", {"verified": True}),
        "ch9.c": ("doc", {"verified": True, "claimed": False}),  # measured: not held
    }
    status = {r["id"]: r["status"] for r in ext.ledger_rows(registry, by_key)}
    assert status == {
        "described": "reproduced",
        "limited": "partly",
        "measured": "not reproduced",
        "unstudied": "not studied",
    }


def test_every_ledger_row_uses_the_registered_fields():
    import yaml

    from fmlab.claims import PHENOMENON_FIELDS

    data = yaml.safe_load((ROOT / "book" / "claims.yml").read_text(encoding="utf-8"))
    for pid, row in data["phenomena"].items():
        unknown = set(row) - set(PHENOMENON_FIELDS)
        assert not unknown, f"ledger row {pid}: unknown fields {sorted(unknown)}"


@pytest.mark.parametrize("chapter", [1, 2, 3, 5])
def test_a_caveat_stands_only_where_it_can_demote(chapter):
    """A caveat limits a result whose keys are all claimed (it turns reproduced into
    partly); on a row with a measured key it could change nothing, so what it says
    there describes the result and belongs in the row's note."""
    import yaml

    data = yaml.safe_load((ROOT / "book" / "claims.yml").read_text(encoding="utf-8"))
    for pid, row in data["phenomena"].items():
        if row["chapter"] != chapter or not row.get("caveat"):
            continue
        keys = [e for e in data["keys"].values() if e["phenomenon"] == pid]
        assert keys and all(e["status"] == "claimed" for e in keys), (
            f"ledger row {pid}: a caveat on a row whose keys are not all claimed "
            "changes nothing; write it as the row's note"
        )
