"""Stored runs: results files that know the code that produced them.

Some experiments cost more than a page can pay when the book is built; a script runs
them once and writes their numbers into a results file that the page reads. Such a file
is only as good as its link to the code: if the code that produced it changes, the
numbers on the page no longer describe the code in the repository. This module keeps
that link.

* :func:`fingerprint` hashes the source text of the objects (functions, classes,
  modules) and files that produce the results, each separately.
* :func:`write` stores a payload together with a ``"stored"`` record: the fingerprint,
  the script that reruns it, the torch and Python versions, the machine and its CPUs,
  and the time of writing.
* :func:`load` reads it back and raises :class:`StaleResults`, naming the script to
  rerun and the sources that changed, when the fingerprint of the code today differs
  from the stored one.

The sources are passed as Python objects (their text is read with
:func:`inspect.getsource`) or as paths; a name is recorded for each, so that a changed
source can be named. A source's name is its qualified name (``module.function``) or its
path relative to the repository.

The module is generic; it sits among Chapter 5's modules because that chapter is the
first to store runs, and because a module outside ``fmlab/chapters/ch*`` would enter
the code fingerprint of every chapter's trained models
(:func:`fmlab.repro.code_fingerprint`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import inspect
import json
import os
import platform
import sys
import time
from pathlib import Path

__all__ = [
    "StaleResults",
    "changed_sources",
    "decode_tensors",
    "encode_tensors",
    "fingerprint",
    "load",
    "restamp",
    "restamp_checked",
    "source_text",
    "write",
]

ROOT = Path(__file__).resolve().parents[3]


class StaleResults(RuntimeError):
    """A stored results file was produced by code that has changed since."""


def _name(source) -> str:
    if isinstance(source, (str, Path)):
        path = Path(source).resolve()
        try:
            return path.relative_to(ROOT).as_posix()
        except ValueError:
            return path.as_posix()
    module = getattr(source, "__module__", None)
    qual = getattr(source, "__qualname__", None)
    if qual is None:  # a module
        return source.__name__
    return f"{module}.{qual}"


def source_text(source) -> str:
    """The source text of ``source``: a path's contents, or the text of a function,
    class or module by :func:`inspect.getsource`."""
    if isinstance(source, (str, Path)):
        return Path(source).read_text()
    return inspect.getsource(source)


def fingerprint(sources) -> dict[str, str]:
    """A fingerprint already made (a dict with ``"all"``) is returned as it is, so that
    a script can take it when it starts: the text of a function is read from its file
    at the line where it was defined at import, so a file edited while a long run goes
    on would give a wrong one at the end.

    ``{name: sha256 of its source text}`` for every source, and ``"all"``: the
    hash of the whole list (names and texts, in order). Line endings are normalised, so
    a checkout on another system gives the same fingerprint."""
    if isinstance(sources, dict) and "all" in sources:
        return dict(sources)
    if not sources:
        raise ValueError("sources must name at least one source")
    parts: dict[str, str] = {}
    whole = hashlib.sha256()
    for source in sources:
        name = _name(source)
        text = source_text(source).replace("\r\n", "\n")
        digest = hashlib.sha256(text.encode()).hexdigest()
        parts[name] = digest
        whole.update(f"{name}\0{digest}\0".encode())
    return {"all": whole.hexdigest(), **parts}


def encode_tensors(value):
    """A tensor, or a dict (nested) of tensors, as JSON-ready data: each tensor becomes
    ``{"dtype", "shape", "data"}`` with its values as a flat list. Floats are written
    exactly (a float32 value is a float64 value, and JSON keeps float64 to the last
    bit), so :func:`decode_tensors` gives back the same tensors."""
    import torch

    if isinstance(value, dict):
        return {k: encode_tensors(v) for k, v in value.items()}
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"value must be a tensor or a dict of them, got {type(value).__name__}"
        )
    return {
        "dtype": str(value.dtype).removeprefix("torch."),
        "shape": list(value.shape),
        "data": value.reshape(-1).tolist(),
    }


def decode_tensors(value):
    """The inverse of :func:`encode_tensors`."""
    import torch

    if isinstance(value, dict) and set(value) != {"dtype", "shape", "data"}:
        return {k: decode_tensors(v) for k, v in value.items()}
    dtype = getattr(torch, value["dtype"])
    return torch.tensor(value["data"], dtype=dtype).reshape(value["shape"])


def write(path, payload: dict, *, script: str, sources, note: str = "") -> dict:
    """Write ``payload`` (a JSON-serialisable dict without a ``"stored"`` key) to
    ``path`` as JSON, with a ``"stored"`` record: the code's :func:`fingerprint`, the
    ``script`` that reruns it (as a reader would type it), the torch and Python
    versions, the machine, its CPU count, the time, and an optional ``note``. Returns
    the record."""
    if "stored" in payload:
        raise ValueError("payload must not have a 'stored' key")
    import torch

    record = {
        "script": script,
        "fingerprint": fingerprint(sources),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "machine": f"{platform.machine()} ({platform.processor() or 'cpu'})",
        "cpus": os.cpu_count(),
        "written": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if note:
        record["note"] = note
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"stored": record, **payload}, indent=1) + "\n")
    return record


def changed_sources(path, sources) -> list[str]:
    """The names of the sources whose text differs from the one recorded at ``path``
    (empty when the fingerprint matches)."""
    then = json.loads(Path(path).read_text()).get("stored", {}).get("fingerprint", {})
    now = fingerprint(sources)
    if now["all"] == then.get("all"):
        return []
    return sorted(
        n for n in set(now) | set(then) if n != "all" and now.get(n) != then.get(n)
    )


def restamp(path, *, sources, note: str) -> dict:
    """Record the fingerprint of today's code on the results at ``path`` without
    rerunning them: only for a change that a rerun of part of the results has shown
    not to move them (the caller's check; ``note`` says which). The earlier record is
    kept under ``"earlier"`` with the names of the sources that changed. Returns the
    new record."""
    path = Path(path)
    data = json.loads(path.read_text())
    before = data.pop("stored")
    changed = changed_sources(path, sources)
    earlier = {k: v for k, v in before.items() if k != "fingerprint"}
    earlier["changed_since"] = changed
    write(path, data, script=before["script"], sources=sources, note=note)
    data = json.loads(path.read_text())
    data["stored"]["earlier"] = earlier
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data["stored"]


def restamp_checked(path, *, sources, check, job: str) -> int:
    """A sweep script's ``--restamp``: when the code behind the results at ``path``
    has changed, ``check(path)`` reruns one job of the sweep (``job`` names it) with
    today's code and returns its largest differences from the record and ``"ok"``;
    only if that is true is today's fingerprint recorded (:func:`restamp`), with a
    note giving the differences. Returns the script's exit status: 0 when the file
    records today's code at the end, 1 when the job did not reproduce its record (the
    whole sweep must then be rerun)."""
    path = Path(path)
    changed = changed_sources(path, sources)
    if not changed:
        print(f"{path} already records today's code")
        return 0
    t0 = time.time()
    res = check(path)
    print(f"changed: {', '.join(changed)}; rerun of {job}: {res}")
    if not res["ok"]:
        print("the job does not reproduce its record: rerun the whole sweep")
        return 1
    diffs = ", ".join(f"{k} {v:.1e}" for k, v in res.items() if k != "ok")
    note = (
        f"Restamped without a rerun: {', '.join(changed)} changed; rerun with "
        f"today's code, {job} reproduced its record (largest differences: {diffs}; "
        f"{time.time() - t0:.0f} s)."
    )
    restamp(path, sources=sources, note=note)
    print(note)
    return 0


def load(path, *, script: str, sources, hint: str = "") -> dict:
    """The payload stored at ``path`` by :func:`write`, with its ``"stored"`` record.
    Raises :class:`FileNotFoundError` (naming ``script``) if there is no such file,
    and :class:`StaleResults` (naming ``script`` and the changed sources) if the file
    has no fingerprint or the code's fingerprint today differs from the stored one;
    ``hint`` is added to that message."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no stored results at {path}; run {script}")
    data = json.loads(path.read_text())
    stored = data.get("stored")
    if not stored or "fingerprint" not in stored:
        raise StaleResults(
            f"{path.name} records no code fingerprint, so nothing says which code "
            f"produced it; rerun {script}"
        )
    now = fingerprint(sources)
    then = stored["fingerprint"]
    if now["all"] != then.get("all"):
        changed = sorted(
            n for n in set(now) | set(then) if n != "all" and now.get(n) != then.get(n)
        )
        raise StaleResults(
            f"{path.name} was produced by code that has changed since "
            f"({', '.join(changed)}); its numbers no longer describe the code. "
            f"Rerun {script}{hint}"
        )
    return data
