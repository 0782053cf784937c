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
]

MARGIN_RULE = (
    "the mean effect over seeds exceeds its null value by more than 3 standard errors "
    "of the seed spread, and every seed has the claimed sign"
)

_KEY = re.compile(r"^ch[0-9]+\.[a-z0-9_]+(\.[a-z0-9_]+)*$")
_KINDS = ("finding", "check")


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

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "kind": self.kind,
            "statement": self.statement,
            "verified": self.verified,
            "evidence": self.evidence,
            "value": self.value,
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
        word = "verified" if r.verified else "FAILED"
        return f"{word} {r.kind}"

    def __repr__(self) -> str:
        r = self.record
        mark = "✔" if r.verified else "✘"
        key = f" [{r.key}]" if r.key else ""
        tail = f" ({r.evidence})" if r.evidence else ""
        return f"{mark} {self._label()}{key}: {r.statement}{tail}"

    def _repr_html_(self) -> str:
        r = self.record
        colour, bg, mark = (
            ("#2e7d32", "#edf7ee", "✔") if r.verified else ("#b71c1c", "#fdecea", "✘")
        )
        ev = (
            f' <span class="fmlab-evidence">({html.escape(r.evidence)})</span>'
            if r.evidence
            else ""
        )
        key = f' <code class="fmlab-key">{html.escape(r.key)}</code>' if r.key else ""
        data = html.escape(json.dumps(r.as_dict(), ensure_ascii=False), quote=True)
        return (
            f'<div class="fmlab-claim fmlab-{r.kind}" id="{r.anchor}" '
            f'data-fmlab-claim="{data}" '
            f'style="border-left:4px solid {colour};background:{bg};'
            'padding:4px 10px;margin:4px 0;font-family:sans-serif">'
            f'<b style="color:{colour}">{mark} {self._label()}</b>{key}: '
            f"{html.escape(r.statement)}{ev}</div>"
        )


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
    kind: str = "finding",
    key: str | None = None,
    value=None,
) -> None:
    """Check a claim the text makes and show that it was verified.

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
    kind : {"finding", "check"}
        ``"check"`` for an exact statement, ``"finding"`` for a random experiment (see
        the module docstring for the margin rule; :func:`finding` applies it).
    key : str, optional
        A stable identifier ``"chN.name"`` (lower case, digits, underscores; further
        ``.part``\\ s allowed), unique in the book.
    value : float or dict of str to float, optional
        The measured number(s) behind the verdict, listed in the claims index.

    The verdict is displayed at once (a green line in a notebook, a plain line in a
    terminal), so a cell may check several claims, in a loop if need be.

    Raises
    ------
    ClaimFailed
        When ``condition`` is false; the message carries the statement and evidence.
        (With ``FMLAB_CLAIMS_COLLECT=1`` the failure is shown and recorded instead.)
    """
    if not isinstance(statement, str) or not statement.strip():
        raise TypeError("statement must be a non-empty string")
    if not isinstance(evidence, str):
        raise TypeError(f"evidence must be a string, got {type(evidence).__name__}")
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    if key is not None and (not isinstance(key, str) or not _KEY.match(key)):
        raise ValueError(
            f"key must look like 'ch6.icl_gain_k3' (lower case), got {key!r}"
        )
    value = _check_value(value)
    ok = _as_bool("condition", condition)
    _COUNTER[0] += 1
    record = ClaimRecord(
        statement=statement,
        evidence=evidence,
        verified=ok,
        kind=kind,
        key=key,
        value=value,
        anchor=_anchor(key, _COUNTER[0]),
    )
    log = os.environ.get("FMLAB_CLAIMS_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record.as_dict(), ensure_ascii=False) + "\n")
    if not ok and not _flag("FMLAB_CLAIMS_COLLECT"):
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
    null: float = 0.0,
    direction: str = ">",
    every_seed: bool = True,
    fmt: str = "{:+.3f}",
    unit: str = "",
    context: str = "",
) -> SeedEffect:
    """Claim that a per-seed effect is beyond ``null``, by the book's margin rule.

    Parameters
    ----------
    statement : str
        The finding in words.
    samples : sequence of float
        One effect per seed (e.g. a paired difference of two methods' accuracies).
    key : str, optional
        Stable key for the claims index; the claim's value is the mean effect.
    null : float
        The value the effect must clear: 0 for "A beats B"; ``-margin`` for a
        non-inferiority claim ("A is at most ``margin`` worse than B").
    direction : {">", "<"}
        The claimed side of ``null``.
    every_seed : bool
        Also require every seed on the claimed side (the book's rule; turn off only for
        a
        non-inferiority claim, and say so in the text).
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
    null = _as_number("null", null)
    ok = effect.holds(null=null, direction=direction, every_seed=every_seed)
    rule = (
        f"rule: mean {direction} {null:g} + 3 s.e."
        if direction == ">"
        else (f"rule: mean < {null:g} − 3 s.e.")
    )
    if every_seed:
        rule += ", every seed " + direction + f" {null:g}"
    evidence = (
        (context + "; " if context else "") + effect.describe(fmt, unit) + f"; {rule}"
    )
    claim(statement, ok, evidence, kind="finding", key=key, value=effect.mean)
    return effect


def reset_claims() -> None:
    """Forget the recorded claims (each chapter starts with this)."""
    _RECORDS.clear()
    _COUNTER[0] = 0


class _ClaimsTable:
    def __init__(self, records):
        self.records = list(records)

    def __repr__(self) -> str:
        lines = [f"{len(self.records)} claims checked by this build:"]
        lines += [
            f"  {'✔' if r.verified else '✘'} [{r.kind}] {r.statement} ({r.evidence})"
            for r in self.records
        ]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{'✔' if r.verified else '✘'}</td><td>{r.kind}</td>"
            f'<td><a href="#{r.anchor}">{html.escape(r.statement)}</a></td>'
            f"<td>{html.escape(r.evidence)}</td></tr>"
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
