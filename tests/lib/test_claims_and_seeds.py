"""The seed knob (FMLAB_SEED_OFFSET), claim kinds, keys and values, the margin rule."""

import html
import json
import math
import re

import pytest
import torch

import fmlab
from fmlab import ClaimFailed, SeedEffect, claim, claims_table, finding, reset_claims
from fmlab.claims import _Verdict
from fmlab.repro import effective_seed, make_generator, seed_everything, seed_offset


# -- seed offsets ------------------------------------------------------------------
def test_offset_zero_keeps_every_seed(monkeypatch):
    monkeypatch.delenv("FMLAB_SEED_OFFSET", raising=False)
    assert seed_offset() == 0
    assert [effective_seed(s) for s in (0, 1, 7, 2**40)] == [0, 1, 7, 2**40]
    a = torch.randn(3, generator=make_generator(5))
    b = torch.randn(3, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


def test_offset_gives_new_independent_seeds(monkeypatch):
    base = range(200)
    seen = set()
    for k in range(5):
        mapped = [effective_seed(s, k) for s in base]
        assert len(set(mapped)) == len(mapped)
        assert all(0 <= m < 2**63 for m in mapped)
        seen |= set(mapped)
    # five offsets of 200 seeds: 1000 distinct seeds, no stream shared between offsets
    assert len(seen) == 1000
    monkeypatch.setenv("FMLAB_SEED_OFFSET", "3")
    assert seed_offset() == 3
    g = make_generator(1)
    assert torch.equal(
        torch.rand(4, generator=g),
        torch.rand(4, generator=torch.Generator().manual_seed(effective_seed(1, 3))),
    )
    seed_everything(1)
    x = torch.rand(4)
    monkeypatch.setenv("FMLAB_SEED_OFFSET", "0")
    seed_everything(1)
    assert not torch.equal(x, torch.rand(4))


@pytest.mark.parametrize("raw", ["-1", "two", "1.5"])
def test_bad_offset_is_a_clear_error(monkeypatch, raw):
    monkeypatch.setenv("FMLAB_SEED_OFFSET", raw)
    with pytest.raises(ValueError, match="FMLAB_SEED_OFFSET"):
        seed_offset()


def test_cache_key_depends_on_offset(tmp_path, monkeypatch):
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path))
    calls = []

    def build():
        calls.append(1)
        return {"x": torch.ones(1)}

    monkeypatch.delenv("FMLAB_SEED_OFFSET", raising=False)
    fmlab.cached({"seed": 0}, build, name="m")
    fmlab.cached({"seed": 0}, build, name="m")
    monkeypatch.setenv("FMLAB_SEED_OFFSET", "2")
    fmlab.cached({"seed": 0}, build, name="m")
    assert len(calls) == 2
    assert len(list(tmp_path.glob("m-*.pt"))) == 2


# -- claims ------------------------------------------------------------------------
REGISTRY = """
keys:
  ch9.identity: {chapter: 9, kind: check, status: claimed, quantity: q, source: s,
                 phenomenon: p}
  ch9.amp: {chapter: 9, kind: check, status: claimed, quantity: q, source: s,
            phenomenon: p}
  ch9.false: {chapter: 9, kind: check, status: claimed, quantity: q, source: s,
              phenomenon: p}
  ch9.a_beats_b: {chapter: 9, kind: finding, status: claimed, quantity: q,
                  source: s, phenomenon: p, null_value: 0.0, direction: ">"}
  ch9.not_yet: {chapter: 9, kind: finding, status: measured, quantity: q,
                source: s, phenomenon: p, null_value: 0.0, direction: ">"}
  ch9.same: {chapter: 9, kind: finding, status: claimed, quantity: q,
             source: s, phenomenon: p, margin: 0.5}
phenomena:
  p: {chapter: 9, title: t, paper: none}
"""


@pytest.fixture(autouse=True)
def test_registry(tmp_path, monkeypatch):
    path = tmp_path / "claims.yml"
    path.write_text(REGISTRY)
    monkeypatch.setenv("FMLAB_CLAIMS_REGISTRY", str(path))
    return path


def test_claim_records_kind_key_value(capsys):
    reset_claims()
    claim("an identity", True, "0 = 0", kind="check", key="ch9.identity", value=0)
    out = capsys.readouterr().out
    assert "✔ verified check [ch9.identity]: an identity (0 = 0)" in out
    rec = claims_table().records[-1]
    assert (rec.kind, rec.key, rec.value, rec.anchor) == (
        "check",
        "ch9.identity",
        0.0,
        "claim-ch9-identity",
    )
    claim("dict value", True, kind="check", value={"k4": 1.5, "k16": torch.tensor(2.0)})
    assert claims_table().records[-1].value == {"k4": 1.5, "k16": 2.0}


def test_claim_html_carries_the_record():
    reset_claims()
    claim("a < b & c", True, "x", key="ch9.amp")
    page = _Verdict(claims_table().records[-1])._repr_html_()
    assert 'id="claim-ch9-amp"' in page
    data = re.search(r'data-fmlab-claim="([^"]*)"', page).group(1)
    assert json.loads(html.unescape(data))["statement"] == "a < b & c"


def test_statement_math_is_typeset_like_the_prose():
    """Inline TeX between dollar signs becomes the span MathJax typesets (Sphinx's
    markup for inline math); a literal dollar is written \\$; the text keeps the TeX."""
    from fmlab.claims import statement_html, statement_parts

    s = r"costs \$5 when $L^\star_{k+1} < 2$ holds"
    assert statement_parts(s) == [
        ("text", "costs $5 when "),
        ("math", r"L^\star_{k+1} < 2"),
        ("text", " holds"),
    ]
    assert statement_html(s) == (
        "costs $5 when "
        r'<span class="math notranslate nohighlight">\(L^\star_{k+1} &lt; 2\)</span>'
        " holds"
    )
    reset_claims()
    claim(s, True, "e")
    record = claims_table().records[-1]
    assert statement_html(s) in _Verdict(record)._repr_html_()
    assert s in repr(_Verdict(record))
    with pytest.raises(ValueError, match=r"statement has an unmatched \$"):
        claim("half $x", True, "e")
    with pytest.raises(ValueError, match="statement has a backtick"):
        claim("reads `[CLS]`", True, "e")


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        ({"kind": "theorem"}, ValueError, "kind"),
        ({"kind": "finding"}, TypeError, "samples"),
        ({"key": "ch9.unregistered"}, KeyError, "registry"),
        ({"key": "ch9.a_beats_b"}, ValueError, "registered as a finding"),
        ({"key": "Ch6.X"}, ValueError, "key"),
        ({"key": "icl_gain"}, ValueError, "key"),
        ({"value": "big"}, TypeError, "value"),
        ({"value": float("nan")}, ValueError, "value"),
        ({"value": torch.ones(2)}, ValueError, "value"),
    ],
)
def test_claim_rejects_bad_arguments(kwargs, err, match):
    with pytest.raises(err, match=match):
        claim("s", True, "e", **kwargs)


def test_collect_mode_and_log(monkeypatch, tmp_path, capsys):
    log = tmp_path / "claims.jsonl"
    monkeypatch.setenv("FMLAB_CLAIMS_LOG", str(log))
    with pytest.raises(ClaimFailed):
        claim("false", False, "e")
    monkeypatch.setenv("FMLAB_CLAIMS_COLLECT", "1")
    claim("false again", False, "e", key="ch9.false")
    assert "✘ FAILED check [ch9.false]: false again" in capsys.readouterr().out
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["statement"], r["verified"]) for r in rows] == [
        ("false", False),
        ("false again", False),
    ]


# -- the margin rule ---------------------------------------------------------------
def test_seed_effect_summary_matches_definitions():
    e = SeedEffect.of([1.0, 2.0, 3.0, 6.0])
    assert e.n == 4 and e.mean == 3.0
    sd = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + 0 + (6 - 3) ** 2) / 3)
    assert math.isclose(e.sd, sd) and math.isclose(e.se, sd / 2)


def test_margin_rule():
    clear = SeedEffect.of([1.0, 1.1, 0.9, 1.05, 0.95])
    assert clear.holds() and not clear.holds(direction="<")
    # a large mean carried by one seed: every seed must show the sign
    assert not SeedEffect.of([5.0, -0.1, 0.2, 0.3]).holds()
    # the right sign everywhere but too noisy: mean within 3 s.e. of zero
    assert not SeedEffect.of([0.01, 3.0, 0.02, 0.01]).holds()
    # non-inferiority: not worse than -0.5
    assert SeedEffect.of([-0.2, 0.1, -0.1, 0.0, 0.05]).holds(null=-0.5)
    with pytest.raises(ValueError, match="at least 3"):
        SeedEffect.of([1.0, 2.0])
    with pytest.raises(TypeError, match="samples"):
        SeedEffect.of("123")


def test_finding_claims_by_the_rule():
    reset_claims()
    e = finding("A beats B", torch.tensor([0.3, 0.5, 0.4]), key="ch9.a_beats_b")
    rec = claims_table().records[-1]
    assert rec.kind == "finding" and math.isclose(rec.value, e.mean)
    assert "3 seeds" in rec.evidence and "s.e." in rec.evidence
    with pytest.raises(ClaimFailed):
        finding("B beats A", [0.3, 0.5, 0.4], direction="<")


def test_finding_takes_its_meaning_from_the_registry(capsys):
    reset_claims()
    with pytest.raises(ValueError, match="differs from the claims registry"):
        finding("A beats B", [0.3, 0.5, 0.4], key="ch9.a_beats_b", null=-0.5)
    # a measured key is shown, never fails, and is marked as not claimed
    finding("not reproduced yet", [-0.3, 0.1, -0.2], key="ch9.not_yet")
    rec = claims_table().records[-1]
    assert not rec.claimed and not rec.verified and math.isclose(rec.value, -0.4 / 3)
    assert "measured, not claimed (does not hold)" in capsys.readouterr().out
    # its line on the page names the side of the null and why it carries no tick
    line = _Verdict(rec)._repr_html_()
    assert "s.e. below 0" in rec.headline and "(measured, does not hold)" in line
    # the page's claims table marks it measured, never with a tick
    finding("it holds here", [0.3, 0.35, 0.4], key="ch9.not_yet")
    html = claims_table()._repr_html_()
    assert "<td>○</td><td>measured</td>" in html and "<td>✔</td>" not in html
    assert "[measured] it holds here" in repr(claims_table())
    # equivalence: two one-sided tests within the registered margin
    finding("A and B agree", [0.05, -0.02, 0.01, 0.0], key="ch9.same")
    assert claims_table().records[-1].strength > 1
    with pytest.raises(ClaimFailed):
        finding("A and B agree", [0.45, 0.3, 0.6, 0.2], key="ch9.same")


def test_findings_need_spread_and_samples():
    with pytest.raises(ValueError, match="zero spread.*check"):
        finding("a construction", [1.0, 1.0, 1.0])
    with pytest.raises(TypeError, match="samples"):
        claim("a bare boolean finding", True, kind="finding")


def test_strength_is_the_mean_over_three_standard_errors():
    e = SeedEffect.of([1.0, 2.0, 3.0])
    assert math.isclose(e.strength(), 2.0 / (3 * e.se))
    assert math.isclose(e.strength(null=3.0, direction="<"), 1.0 / (3 * e.se))


def test_registry_refuses_a_field_given_twice(test_registry):
    text = test_registry.read_text().replace(
        "  p: {chapter: 9, title: t, paper: none}",
        "  p:\n    chapter: 9\n    title: t\n    paper: none\n"
        "    caveat: one\n    caveat: two",
    )
    test_registry.write_text(text)
    with pytest.raises(ValueError, match="'caveat' is given twice"):
        fmlab.claims.registry()
