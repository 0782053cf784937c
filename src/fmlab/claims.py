"""Claims: the sentences of a chapter that the build checks.

``claim(statement, condition, evidence)`` shows the reader a visible "verified" line
with the numbers behind it, and raises :class:`ClaimFailed` when the condition is
false, so that a chapter whose experiment stops showing its effect fails its build.
Every claim is recorded, and :func:`claims_table` lists them at the end of a chapter.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["claim", "ClaimFailed", "ClaimRecord", "claims_table", "reset_claims"]


class ClaimFailed(AssertionError):
    """Raised when a chapter's claim does not hold for the numbers just computed."""


@dataclass(frozen=True)
class ClaimRecord:
    statement: str
    evidence: str


_RECORDS: list[ClaimRecord] = []


def _as_bool(name: str, condition) -> bool:
    if isinstance(condition, (bool, np.bool_)):
        return bool(condition)
    if isinstance(condition, torch.Tensor) and condition.numel() == 1 and condition.dtype == torch.bool:
        return bool(condition.item())
    raise TypeError(
        f"{name} must be a bool (or a one-element bool tensor), got {type(condition).__name__}; "
        "compare numbers explicitly, e.g. a < b"
    )


class _Verified:
    """What a notebook cell shows: a green line in HTML, a plain line in text."""

    def __init__(self, statement: str, evidence: str):
        self.statement, self.evidence = statement, evidence

    def __repr__(self) -> str:
        tail = f" ({self.evidence})" if self.evidence else ""
        return f"✔ verified: {self.statement}{tail}"

    def _repr_html_(self) -> str:
        ev = f' <span class="fmlab-evidence">({html.escape(self.evidence)})</span>' if self.evidence else ""
        return (
            '<div class="fmlab-claim" style="border-left:4px solid #2e7d32;background:#edf7ee;'
            'padding:4px 10px;margin:4px 0;font-family:sans-serif">'
            f'<b style="color:#2e7d32">✔ verified</b>: {html.escape(self.statement)}{ev}</div>'
        )


def _show(obj) -> None:
    """Display ``obj`` in a notebook (every claim of a cell, not just the last) or print it."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython is a dependency of the book
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(obj)
    else:
        print(repr(obj))


def claim(statement: str, condition, evidence: str = "") -> None:
    """Check a claim the text makes and show that it was verified.

    Parameters
    ----------
    statement : str
        The claim in words, as the chapter states it.
    condition : bool
        Whether the numbers just computed support it.
    evidence : str
        The numbers behind the verdict, shown to the reader.

    The verified line is displayed at once (a green line in a notebook, a plain line in
    a terminal), so a cell may check several claims, in a loop if need be.

    Raises
    ------
    ClaimFailed
        When ``condition`` is false; the message carries the statement and evidence.
    """
    if not isinstance(statement, str) or not statement.strip():
        raise TypeError("statement must be a non-empty string")
    if not isinstance(evidence, str):
        raise TypeError(f"evidence must be a string, got {type(evidence).__name__}")
    if not _as_bool("condition", condition):
        raise ClaimFailed(f"claim failed: {statement} (evidence: {evidence})")
    _RECORDS[:] = [r for r in _RECORDS if r.statement != statement]
    _RECORDS.append(ClaimRecord(statement, evidence))
    _show(_Verified(statement, evidence))


def reset_claims() -> None:
    """Forget the recorded claims (each chapter starts with this)."""
    _RECORDS.clear()


class _ClaimsTable:
    def __init__(self, records):
        self.records = list(records)

    def __repr__(self) -> str:
        lines = [f"{len(self.records)} claims verified by this build:"]
        lines += [f"  ✔ {r.statement} ({r.evidence})" for r in self.records]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>✔</td><td>{html.escape(r.statement)}</td><td>{html.escape(r.evidence)}</td></tr>"
            for r in self.records
        )
        return (
            '<table class="fmlab-claims"><thead><tr><th></th><th>claim</th><th>evidence</th></tr>'
            f"</thead><tbody>{rows}</tbody></table>"
        )


def claims_table() -> _ClaimsTable:
    """Every claim verified since the last :func:`reset_claims`, as a table."""
    return _ClaimsTable(_RECORDS)
