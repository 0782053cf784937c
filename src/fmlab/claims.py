"""Claims: the sentences of a chapter that the build checks.

``claim(statement, condition, evidence)`` shows the reader a visible "verified" line
with the numbers behind it, and raises :class:`ClaimFailed` when the condition is
false, so that a chapter whose experiment stops showing its effect fails its build.

Two kinds of claim (the ``kind`` argument):

* a **check** is an exact statement (an identity, a theorem's inequality at every point,
  a closed form). It can fail only through a bug in the code: a regression test.
* a **finding** is a statement about a random experiment. Its margin follows the book's
  rule, written once here and on the how-to-run page: *the mean effect over seeds
  exceeds
  its null value by more than three standard errors of the seed spread, and every seed
  has the claimed sign.* :func:`finding` applies that rule to a sample of per-seed
  effects; a chapter that needs another rule states it next to the claim.

A statement may carry inline mathematics between dollar signs, written in TeX as in the
prose (``"the bound $L^\\star \\le \\varphi/\\lambda_{k+1}$ holds"``): the verdict line
typesets it like the page's own formulas; the plain-text verdict keeps the TeX.

A claim may carry a stable ``key`` (``"ch6.icl_gain_k3"``) and the ``value`` behind the
verdict, so that the claims index (``_build/claims.json`` and the back-matter page
"Every claim in this book") and other chapters can refer to it.

Two environment variables serve the robustness run (``scripts/check_seeds.py``):
``FMLAB_CLAIMS_COLLECT=1`` records a failed claim (shown as a red line) instead of
raising, so one run reports every verdict; ``FMLAB_CLAIMS_LOG=path`` appends every
verdict to a JSON-lines file.
"""

from __future__ import annotations

import html
import json
import math
import numbers
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch

__all__ = [
    "claim",
    "finding",
    "SeedEffect",
    "ClaimFailed",
    "ClaimRecord",
    "claims_table",
    "reset_claims",
    "MARGIN_RULE",
    "registry",
    "registry_path",
    "ledger_status",
    "LEDGER_STATUSES",
    "PHENOMENON_FIELDS",
]

MARGIN_RULE = (
    "the mean effect over seeds exceeds its null value by more than 3 standard errors "
    "of the seed spread, and every seed has the claimed sign"
)

_MATH = re.compile(r"(?<!\\)\$(.+?)(?<!\\)\$")
_DOLLAR = re.compile(r"(?<!\\)\$")

_KEY = re.compile(r"^ch[0-9]+\.[a-z0-9_]+(\.[a-z0-9_]+)*$")
_KINDS = ("finding", "check")
_STATUSES = ("claimed", "measured")
_REGISTRY_NAME = Path("book") / "claims.yml"


def registry_path() -> Path:
    """Where the claims registry is: ``$FMLAB_CLAIMS_REGISTRY``, else the first
    ``book/claims.yml`` found from the working directory upwards, else the copy packed
    into a wheel of fmlab (``fmlab/_registry/claims.yml``)."""
    env = os.environ.get("FMLAB_CLAIMS_REGISTRY")
    if env:
        return Path(env)
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / _REGISTRY_NAME).is_file():
            return folder / _REGISTRY_NAME
    packaged = Path(__file__).with_name("_registry") / "claims.yml"
    if packaged.is_file():  # the copy a wheel of fmlab carries
        return packaged
    raise FileNotFoundError(
        "no claims registry: book/claims.yml was not found from the working "
        f"directory {here} upwards; set FMLAB_CLAIMS_REGISTRY to its path"
    )


# The reproduction ledger (``phenomena`` in the registry): one row per phenomenon of the
# sources. A row's fields, and which of them can change its status:
PHENOMENON_FIELDS = {
    "chapter": "the chapter that studies it",
    "title": "the phenomenon, as one sentence",
    "paper": "the source's number, or what the source states",
    "caveat": "what limits the result against the paper's (demotes reproduced)",
    "note": "what describes the result without limiting it (never changes the status)",
    "retired": "a key moved to the paper's level, with its old numbers",
}
LEDGER_STATUSES = ("reproduced", "partly", "not reproduced", "not studied")


def ledger_status(held: Sequence[bool], caveat: str | None = None) -> str:
    """A ledger row's status, from its keys' verdicts alone (``held``: each key of the
    phenomenon claimed and verified by this build) and its ``caveat``:

    *not studied*: the phenomenon has no key; *not reproduced*: no key holds;
    *partly*: some keys hold, or all do but a caveat limits the result; *reproduced*:
    every key holds and nothing limits it. A row's ``note`` describes the result and
    is not an argument: it never changes the status.
    """
    held = [bool(h) for h in held]
    if not held:
        return "not studied"
    if all(held):
        return "partly" if (caveat or "").strip() else "reproduced"
    return "partly" if any(held) else "not reproduced"


_REGISTRY_CACHE: dict = {}


def registry() -> dict:
    """The keys of the claims registry (``book/claims.yml``), checked, by key."""
    path = registry_path()
    stamp = (str(path), path.stat().st_mtime_ns)
    if _REGISTRY_CACHE.get("stamp") != stamp:
        data = _load_yaml(path)
        keys = data.get("keys") or {}
        phenomena = data.get("phenomena") or {}
        for key, entry in keys.items():
            _check_entry(key, entry, phenomena)
        _REGISTRY_CACHE.update(stamp=stamp, keys=keys, phenomena=phenomena)
    return _REGISTRY_CACHE["keys"]


def _load_yaml(path) -> dict:
    """The registry file, refusing a mapping that names one field twice (YAML would
    silently keep the last, so a second ``caveat`` of a ledger row would hide the
    first)."""
    import yaml

    class _Strict(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            name = loader.construct_object(key_node, deep=deep)
            if name in seen:
                raise ValueError(
                    f"claims registry {path}, line {key_node.start_mark.line + 1}: "
                    f"{name!r} is given twice in one entry"
                )
            seen.add(name)
        return loader.construct_mapping(node, deep)

    _Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_Strict) or {}


def _check_entry(key: str, entry: dict, phenomena: dict) -> None:
    where = f"claims registry: {key}"
    if not _KEY.match(key):
        raise ValueError(f"{where}: a key looks like 'ch6.icl_gain_k3'")
    for field in ("chapter", "kind", "status", "quantity", "source", "phenomenon"):
        if field not in entry:
            raise ValueError(f"{where} has no {field!r}")
    if entry["kind"] not in _KINDS:
        raise ValueError(f"{where}: kind must be one of {_KINDS}")
    if entry["status"] not in _STATUSES:
        raise ValueError(f"{where}: status must be one of {_STATUSES}")
    if f"ch{entry['chapter']}." != key[: key.index(".") + 1]:
        raise ValueError(f"{where}: chapter {entry['chapter']} does not match the key")
    if entry["phenomenon"] not in phenomena:
        raise ValueError(f"{where}: phenomenon {entry['phenomenon']!r} is not listed")
    if entry["kind"] == "finding":
        if ("margin" in entry) == ("null_value" in entry or "direction" in entry):
            raise ValueError(
                f"{where}: a finding has either null and direction, or a margin"
            )
        if "margin" in entry and not float(entry["margin"]) > 0:
            raise ValueError(f"{where}: margin must be positive")
        if "direction" in entry and entry["direction"] not in (">", "<"):
            raise ValueError(f"{where}: direction must be '>' or '<'")


class ClaimFailed(AssertionError):
    """Raised when a chapter's claim does not hold for the numbers just computed."""


@dataclass(frozen=True)
class ClaimRecord:
    """One verdict, as the claims table, claims index and robustness run list it."""

    statement: str
    evidence: str
    verified: bool = True
    kind: str = "finding"
    key: str | None = None
    value: float | dict | None = None
    anchor: str = ""
    claimed: bool = True
    strength: float | None = None
    headline: str = ""

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "kind": self.kind,
            "statement": self.statement,
            "verified": self.verified,
            "claimed": self.claimed,
            "evidence": self.evidence,
            "value": self.value,
            "strength": self.strength,
            "headline": self.headline,
            "anchor": self.anchor,
        }


_RECORDS: list[ClaimRecord] = []
_COUNTER = [0]


def _as_bool(name: str, condition) -> bool:
    if isinstance(condition, (bool, np.bool_)):
        return bool(condition)
    if (
        isinstance(condition, torch.Tensor)
        and condition.numel() == 1
        and condition.dtype == torch.bool
    ):
        return bool(condition.item())
    raise TypeError(
        f"{name} must be a bool (or a one-element bool tensor), got "
        f"{type(condition).__name__}; compare numbers explicitly, e.g. a < b"
    )


def _as_number(name: str, value) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"{name} must be a single number, "
                f"got a tensor of shape {tuple(value.shape)}"
            )
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (numbers.Real, np.floating, np.integer)
    ):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def _check_value(value):
    if value is None:
        return None
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"value's keys must be strings, got {type(k).__name__}")
            out[k] = _as_number(f"value[{k!r}]", v)
        return out
    return _as_number("value", value)


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in (
        "",
        "0",
        "false",
        "no",
        "off",
    )


def _anchor(key: str | None, index: int) -> str:
    if key is not None:
        return "claim-" + key.replace(".", "-").replace("_", "-")
    return f"claim-{index}"


class _Verdict:
    """What a notebook cell shows: a coloured line in HTML, a plain line in text.

    The HTML carries the record as a ``data-fmlab-claim`` attribute and an ``id``, which
    the book's Sphinx extension reads to build the claims index and link to the line.
    """

    def __init__(self, record: ClaimRecord):
        self.record = record

    def _label(self) -> str:
        r = self.record
        if not r.claimed:
            word = "holds here" if r.verified else "does not hold"
            return f"measured, not claimed ({word})"
        word = "verified" if r.verified else "FAILED"
        return f"{word} {r.kind}"

    def _mark(self) -> str:
        r = self.record
        if not r.claimed:
            return "○"
        return "✔" if r.verified else "✘"

    def __repr__(self) -> str:
        r = self.record
        mark = self._mark()
        key = f" [{r.key}]" if r.key else ""
        tail = f" ({r.evidence})" if r.evidence else ""
        return f"{mark} {self._label()}{key}: {r.statement}{tail}"

    def headline(self) -> str:
        """The verdict's number in a few words: a finding's mean ± s.e. and how many
        standard errors it lies from its null (or its equivalence margin); a check's
        value, or its evidence when that is short."""
        r = self.record
        return (
            r.headline or _short(r.evidence) or ("checked" if r.kind == "check" else "")
        )

    def _repr_html_(self) -> str:
        """One line beside the result: the mark and its number, linking to the
        claim's row on the claims page (the book's Sphinx extension points the link
        there), then the statement; the full evidence is the line's tooltip and on
        the claims page."""
        r = self.record
        statement = statement_html(r.statement)
        state = "measured" if not r.claimed else "ok" if r.verified else "failed"
        colour = {"measured": "#546e7a", "ok": "#2e7d32", "failed": "#b71c1c"}[state]
        title = f"{self._label()}: {r.evidence}" if r.evidence else self._label()
        number = html.escape(self.headline())
        data = html.escape(json.dumps(r.as_dict(), ensure_ascii=False), quote=True)
        return (
            f'<div class="fmlab-claim fmlab-{r.kind} fmlab-{state}'
            f'{"" if r.claimed else " fmlab-measured"}" id="{r.anchor}" '
            f'data-fmlab-claim="{data}">'
            f'<a class="fmlab-verdict" href="#{r.anchor}" '
            f'title="{html.escape(title, quote=True)}" style="color:{colour};'
            f'font-weight:600;text-decoration:none">{self._mark()}'
            f"{' ' + number if number else ''}</a> "
            + (
                ""
                if r.claimed
                else '<span class="fmlab-measured-word">(measured, '
                + ("holds here" if r.verified else "does not hold")
                + ")</span> "
            )
            + f'<span class="fmlab-statement">{statement}</span></div>'
        )


def statement_parts(statement: str) -> list[tuple[str, str]]:
    """A statement split into ``("text", ...)`` and ``("math", TeX)`` parts: inline
    mathematics stands between dollar signs (``\\$`` is a literal dollar)."""
    parts, last = [], 0
    for match in _MATH.finditer(statement):
        if match.start() > last:
            parts.append(("text", statement[last : match.start()]))
        parts.append(("math", match.group(1)))
        last = match.end()
    if last < len(statement):
        parts.append(("text", statement[last:]))
    return [
        (kind, text.replace("\\$", "$") if kind == "text" else text)
        for kind, text in parts
    ]


def statement_html(statement: str) -> str:
    """The statement as HTML, its mathematics in the spans that the book's MathJax
    typesets (the markup Sphinx gives inline math)."""
    return "".join(
        html.escape(text)
        if kind == "text"
        else '<span class="math notranslate nohighlight">\\('
        + html.escape(text)
        + "\\)</span>"
        for kind, text in statement_parts(statement)
    )


def _short(evidence: str, limit: int = 60) -> str:
    """A check's evidence as its headline when it is short enough for one line."""
    return evidence if len(evidence) <= limit else ""


def _show(obj) -> None:
    """Display ``obj`` in a notebook (each claim of a cell, not only the last)."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython is a dependency of the book
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(obj)
    else:
        print(repr(obj))


def claim(
    statement: str,
    condition,
    evidence: str = "",
    *,
    kind: str = "check",
    key: str | None = None,
    value=None,
) -> None:
    """Check an exact statement the text makes and show that it was verified.

    Parameters
    ----------
    statement : str
        The claim in words, as the chapter states it. Keep run-dependent numbers out of
        it (they belong in ``evidence``), so that the statement is the same at every
        seed.
    condition : bool
        Whether the numbers just computed support it.
    evidence : str
        The numbers behind the verdict, shown to the reader.
    kind : {"check"}
        Only checks are claimed with a bare condition: an identity, a theorem's
        inequality at every point, a closed form, a fact of the construction. A
        statement about a random experiment is a *finding*: use :func:`finding` with
        its per-seed samples, which applies the margin rule.
    key : str, optional
        A headline key ``"chN.name"`` defined in the claims registry
        (``book/claims.yml``) as a check.
    value : float or dict of str to float, optional
        The measured number(s) behind the verdict, listed in the claims index.

    Raises
    ------
    ClaimFailed
        When ``condition`` is false; the message carries the statement and evidence.
        (With ``FMLAB_CLAIMS_COLLECT=1`` the failure is shown and recorded instead.)
    """
    if kind == "finding":
        raise TypeError(
            "kind='finding' needs samples: a statement about a random experiment is "
            "claimed with fmlab.finding(statement, samples, ...), which applies the "
            "margin rule; claim() takes only checks"
        )
    if kind not in _KINDS:
        raise ValueError(f"kind must be 'check', got {kind!r}")
    if key is not None:
        entry = _entry(key, "check")
        if entry["status"] != "claimed":
            raise ValueError(f"claims registry: the check {key} must be claimed")
    value = _check_value(value)
    headline = f"{value:.4g}" if isinstance(value, float) else ""
    _record(
        statement,
        _as_bool("condition", condition),
        evidence,
        "check",
        key,
        value,
        headline=headline,
    )


def _entry(key, kind: str) -> dict:
    if not isinstance(key, str) or not _KEY.match(key):
        raise ValueError(
            f"key must look like 'ch6.icl_gain_k3' (lower case), got {key!r}"
        )
    keys = registry()
    if key not in keys:
        raise KeyError(
            f"key {key!r} is not in the claims registry ({registry_path()}): a "
            "headline key is defined there first (quantity, null, direction, source)"
        )
    entry = keys[key]
    if entry["kind"] != kind:
        raise ValueError(
            f"key {key!r} is registered as a {entry['kind']}, not as a {kind}"
        )
    return entry


def _record(
    statement: str,
    ok: bool,
    evidence: str,
    kind: str,
    key: str | None,
    value,
    *,
    claimed: bool = True,
    strength: float | None = None,
    headline: str = "",
) -> None:
    if not isinstance(statement, str) or not statement.strip():
        raise TypeError("statement must be a non-empty string")
    if len(_DOLLAR.findall(statement)) % 2:
        raise ValueError(
            f"statement has an unmatched $ (inline mathematics stands between two; "
            f"write \\$ for a dollar sign): {statement!r}"
        )
    if "`" in statement:  # the verdict line renders mathematics, not Markdown
        raise ValueError(f"statement has a backtick (not rendered): {statement!r}")
    if not isinstance(evidence, str):
        raise TypeError(f"evidence must be a string, got {type(evidence).__name__}")
    value = _check_value(value)
    _COUNTER[0] += 1
    record = ClaimRecord(
        statement=statement,
        evidence=evidence,
        verified=ok,
        kind=kind,
        key=key,
        value=value,
        anchor=_anchor(key, _COUNTER[0]),
        claimed=claimed,
        strength=strength,
        headline=headline,
    )
    log = os.environ.get("FMLAB_CLAIMS_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record.as_dict(), ensure_ascii=False) + "\n")
    if claimed and not ok and not _flag("FMLAB_CLAIMS_COLLECT"):
        raise ClaimFailed(f"claim failed: {statement} (evidence: {evidence})")
    _RECORDS[:] = [
        r
        for r in _RECORDS
        if r.statement != statement and (key is None or r.key != key)
    ]
    _RECORDS.append(record)
    _show(_Verdict(record))


@dataclass(frozen=True)
class SeedEffect:
    """Per-seed effects and their summary: mean, standard deviation, standard error.

    The standard error is ``sd / sqrt(n)`` with the sample standard deviation (ddof 1).
    """

    samples: tuple[float, ...]

    @classmethod
    def of(cls, samples) -> "SeedEffect":
        if isinstance(samples, torch.Tensor):
            samples = samples.detach().double().flatten().tolist()
        elif isinstance(samples, np.ndarray):
            samples = samples.astype(float).ravel().tolist()
        if isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence):
            raise TypeError(
                "samples must be a sequence of numbers (one per seed), "
                f"got {type(samples).__name__}"
            )
        values = tuple(_as_number(f"samples[{i}]", v) for i, v in enumerate(samples))
        if len(values) < 3:
            raise ValueError(f"samples must hold at least 3 seeds, got {len(values)}")
        return cls(values)

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def mean(self) -> float:
        return float(np.mean(self.samples))

    @property
    def sd(self) -> float:
        return float(np.std(self.samples, ddof=1))

    @property
    def se(self) -> float:
        return self.sd / math.sqrt(self.n)

    def holds(
        self, *, null: float = 0.0, direction: str = ">", every_seed: bool = True
    ) -> bool:
        """The book's margin rule: mean beyond ``null`` by > 3 s.e., every seed too."""
        if direction not in (">", "<"):
            raise ValueError(f"direction must be '>' or '<', got {direction!r}")
        sign = 1.0 if direction == ">" else -1.0
        beyond = sign * (self.mean - null) > 3 * self.se
        every = all(sign * (v - null) > 0 for v in self.samples)
        return bool(beyond and (every or not every_seed))

    def strength(self, *, null: float = 0.0, direction: str = ">") -> float:
        """How far the mean clears ``null``, in units of the rule's 3 s.e.: above 1
        the mean part of the rule holds; 1.5 leaves room for new seeds."""
        sign = 1.0 if direction == ">" else -1.0
        if self.se == 0:
            return math.inf if sign * (self.mean - null) > 0 else -math.inf
        return sign * (self.mean - null) / (3 * self.se)

    def within(self, margin: float, *, every_seed: bool = True) -> bool:
        """Two-sided equivalence, |effect| < ``margin``: two one-sided tests, each by
        the margin rule (mean − 3 s.e. > −margin and mean + 3 s.e. < margin), and
        every seed inside (−margin, margin)."""
        return self.holds(null=-margin, direction=">", every_seed=every_seed) and (
            self.holds(null=margin, direction="<", every_seed=every_seed)
        )

    def describe(self, fmt: str = "{:+.3f}", unit: str = "") -> str:
        f = lambda v: fmt.format(v) + unit  # noqa: E731
        per_seed = ", ".join(fmt.format(v) for v in self.samples)
        return (
            f"mean {f(self.mean)} ± {fmt.format(self.se).lstrip('+')} s.e. "
            f"(sd {fmt.format(self.sd).lstrip('+')}, {self.n} seeds: {per_seed})"
        )


def finding(
    statement: str,
    samples,
    *,
    key: str | None = None,
    null: float | None = None,
    direction: str | None = None,
    margin: float | None = None,
    every_seed: bool = True,
    fmt: str = "{:+.3f}",
    unit: str = "",
    context: str = "",
) -> SeedEffect:
    """Claim that a per-seed effect is beyond ``null`` (or within ``±margin``), by the
    book's margin rule.

    Parameters
    ----------
    statement : str
        The finding in words.
    samples : sequence of float
        One effect per seed (e.g. a paired difference of two methods' accuracies). At
        least three, and not all equal: samples with no spread come from an exact
        statement or a fact of the construction, which is a check (:func:`claim`).
    key : str, optional
        A headline key defined in the claims registry (``book/claims.yml``). The
        registry gives the null and direction (or margin), and whether the key is
        *claimed* (a failed verdict stops the build) or only *measured* (shown, never
        failing: a phenomenon not reproduced yet). The stored value is the mean of the
        samples, the quantity the verdict tests.
    null, direction
        Without a key: the value the effect must clear (default 0) and the claimed side
        (``">"``, the default, or ``"<"``). With a key they may be omitted; if given,
        they must agree with the registry.
    margin : float, optional
        Two-sided equivalence instead: the effect lies within ``±margin`` (two one-sided
        tests, each by the rule).
    every_seed : bool
        Also require every seed on the claimed side (the book's rule).
    fmt, unit : str
        How numbers are printed in the evidence.
    context : str
        Extra evidence printed before the summary.

    Returns
    -------
    SeedEffect
        The summary, so that the prose can quote its numbers.
    """
    effect = SeedEffect.of(samples)
    if effect.sd == 0:
        raise ValueError(
            f"the samples of {statement!r} have zero spread ({effect.samples[0]:g} at "
            "every seed): an exact statement or a fact of the construction is a check; "
            "claim it with fmlab.claim(..., kind='check')"
        )
    claimed = True
    if key is not None:
        entry = _entry(key, "finding")
        given = {"null": null, "direction": direction, "margin": margin}
        for name, value in given.items():
            registered = entry.get("null_value" if name == "null" else name)
            same = (
                registered is not None
                and value == registered
                or (
                    isinstance(value, numbers.Real)
                    and registered is not None
                    and not isinstance(registered, str)
                    and math.isclose(float(value), float(registered), abs_tol=1e-12)
                )
            )
            if value is not None and not same:
                raise ValueError(
                    f"{key}: {name}={value!r} differs from the claims registry "
                    f"({registered!r}); a key's meaning changes only in book/claims.yml"
                )
        null, direction, margin = (
            entry.get(n) for n in ("null_value", "direction", "margin")
        )
        claimed = entry["status"] == "claimed"
    if margin is not None:
        margin = _as_number("margin", margin)
        if margin <= 0:
            raise ValueError(f"margin must be positive, got {margin}")
        ok = effect.within(margin, every_seed=every_seed)
        strength = min(
            effect.strength(null=-margin, direction=">"),
            effect.strength(null=margin, direction="<"),
        )
        m = fmt.format(margin).lstrip("+")
        rule = f"rule: mean − 3 s.e. > −{m} and mean + 3 s.e. < {m}"
        if every_seed:
            rule += f", every seed inside ±{m}"
    else:
        null = 0.0 if null is None else _as_number("null", null)
        direction = ">" if direction is None else direction
        if direction not in (">", "<"):
            raise ValueError(f"direction must be '>' or '<', got {direction!r}")
        ok = effect.holds(null=null, direction=direction, every_seed=every_seed)
        strength = effect.strength(null=null, direction=direction)
        rule = (
            f"rule: mean > {null:g} + 3 s.e."
            if direction == ">"
            else f"rule: mean < {null:g} − 3 s.e."
        )
        if every_seed:
            rule += ", every seed " + direction + f" {null:g}"
    rule += f" (mean clears it by {strength:.2f}× the 3 s.e.)"
    headline = f"{fmt.format(effect.mean)}{unit} ± {fmt.format(effect.se).lstrip('+')}"
    if margin is not None:
        headline += f", within ±{m}"
    elif effect.se > 0:
        # the side is named: a mean on the wrong side of its null must not read as
        # support ("13 s.e. from 0" said nothing of which way)
        z = abs(effect.mean - null) / effect.se
        side = "above" if effect.mean >= null else "below"
        headline += f", {z:.1f} s.e. {side} {null:g}"
    evidence = (
        (context + "; " if context else "") + effect.describe(fmt, unit) + f"; {rule}"
    )
    _record(
        statement,
        ok,
        evidence,
        "finding",
        key,
        effect.mean,
        claimed=claimed,
        strength=float(strength) if math.isfinite(strength) else None,
        headline=headline,
    )
    return effect


def reset_claims() -> None:
    """Forget the recorded claims (each chapter starts with this)."""
    _RECORDS.clear()
    _COUNTER[0] = 0


def _table_mark(r) -> tuple[str, str]:
    """A row's mark and kind in :func:`claims_table`: the verdict line's mark, and a
    measured (not claimed) result's kind reads "measured"."""
    return _Verdict(r)._mark(), (r.kind if r.claimed else "measured")


class _ClaimsTable:
    def __init__(self, records):
        self.records = list(records)

    def __repr__(self) -> str:
        lines = [f"{len(self.records)} claims checked by this build:"]
        lines += [
            "  {} [{}] {} ({})".format(*_table_mark(r), r.statement, r.evidence)
            for r in self.records
        ]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            "<tr><td>{}</td><td>{}</td>".format(*_table_mark(r))
            + f'<td><a href="#{r.anchor}">{statement_html(r.statement)}</a></td>'
            + f"<td>{html.escape(r.evidence)}</td></tr>"
            for r in self.records
        )
        return (
            '<table class="fmlab-claims"><thead><tr><th></th><th>kind</th>'
            "<th>claim</th>"
            f"<th>evidence</th></tr></thead><tbody>{rows}</tbody></table>"
        )


def claims_table() -> _ClaimsTable:
    """Every claim checked since the last :func:`reset_claims`, as a table."""
    return _ClaimsTable(_RECORDS)
