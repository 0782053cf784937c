"""Stored runs: results files that know the code and the machine that produced them.

Some experiments cost more than a page can pay when the book is built (a sweep of many
seeds or sizes, a run at a paper's size on a GPU); a script runs them once and writes
their numbers into a results file that the page reads. Such a file is only as good as
its link to the code: if the code that produced it changes, the numbers on the page no
longer describe the library. This module keeps that link, for every chapter.

* :func:`fingerprint` hashes the source text of the package objects (functions,
  classes, modules) that produce the results, each separately. Only package code
  counts: a script's own settings are recorded in the file as data (its ``config``),
  never read back from the script by path, so a page runs from the installed wheel.
* :func:`write` stores a payload with a ``"stored"`` record: the fingerprint, the
  script that reruns it (as a reader would type it), the run's configuration, the
  :func:`environment` (torch, Python, machine, CPU capability, device) and,
  optionally, a **slice**: a small run of the same code whose result is kept beside
  the full one, so that a test can rerun it in seconds.
* :func:`load` reads it back and raises :class:`StaleResults`, naming the script to
  rerun and the sources that changed, when the fingerprint of today's code differs
  from the stored one.
* :func:`compare_runs` is the slice check's rule. Another CPU takes another rounding
  path (vector width, the order of a sum, MKL's kernels), and a few hundred optimizer
  steps amplify a difference in the last bit into one in the third digit, so a rerun
  is compared with its record the way the science reads it: each quantity's mean over
  the replicates within ``n_se`` standard errors of the difference of two means.
  :func:`other_rounding` names an environment that takes another rounding path than
  a record's, under which the tests rerun every slice. Slices are recorded on the
  portable path (:data:`PORTABLE_ROUNDING`: scalar kernels, which every x86-64 CPU
  runs alike), so the rerun takes the machine's own vector kernels, the faster path.
* :func:`restamp_checked` records today's code on a file after a rerun of part of it
  reproduced its record (a script's ``--restamp``).

Like :mod:`fmlab.claims`, this module reads and judges results and computes none, so it
is left out of the key of the model cache (:func:`fmlab.repro.code_fingerprint`).
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import inspect
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

__all__ = [
    "StaleResults",
    "changed_sources",
    "compare_runs",
    "decode_tensors",
    "encode_tensors",
    "environment",
    "fingerprint",
    "load",
    "origin",
    "other_rounding",
    "PORTABLE_ROUNDING",
    "read",
    "restamp",
    "restamp_checked",
    "source_text",
    "write",
]

#: environment variables that choose a rounding path: ATen's vector kernels, MKL's
#: conditional numerical reproducibility, oneDNN's instruction set
ROUNDING_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")

#: the rounding path slices are recorded on (``scripts/reslice.py``): ATen's scalar
#: kernels and MKL's compatible code path. A rerun of a slice then takes the machine's
#: vector kernels (:func:`other_rounding`), which train the slices about 1.4x faster
#: than the scalar ones (measured on this book's ten slices, one core)
PORTABLE_ROUNDING = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}


class StaleResults(RuntimeError):
    """A stored results file was produced by code that has changed since."""


def _name(source) -> str:
    module = getattr(source, "__module__", None)
    qual = getattr(source, "__qualname__", None)
    if qual is None:  # a module
        return source.__name__
    return f"{module}.{qual}"


def source_text(source) -> str:
    """The source text of a function, class or module (:func:`inspect.getsource`)."""
    return inspect.getsource(source)


def fingerprint(sources) -> dict[str, str]:
    """``{name: sha256 of its source text}`` for every source, and ``"all"``: the
    hash of the whole list (names and texts, in order). A source is a function, class
    or module; its name is its qualified name (``module.function``). Line endings are
    normalised, so a checkout on another system gives the same fingerprint.

    A fingerprint already made (a dict with ``"all"``) is returned as it is, so that
    a script can take it when it starts: the text of a function is read from its file
    at the line where it was defined at import, so a file edited while a long run goes
    on would give a wrong one at the end."""
    if isinstance(sources, dict) and "all" in sources:
        return dict(sources)
    if not sources:
        raise ValueError("sources must name at least one source")
    parts: dict[str, str] = {}
    whole = hashlib.sha256()
    for source in sources:
        if isinstance(source, (str, Path)):
            raise TypeError(
                "sources must be functions, classes or modules of the package, not "
                f"paths ({source}): a script's settings are recorded as data"
            )
        name = _name(source)
        text = source_text(source).replace("\r\n", "\n")
        digest = hashlib.sha256(text.encode()).hexdigest()
        parts[name] = digest
        whole.update(f"{name}\0{digest}\0".encode())
    return {"all": whole.hexdigest(), **parts}


def environment(device="cpu") -> dict:
    """Where a run happens: torch and Python versions, the machine, the CPU count,
    ATen's CPU capability (the vector instructions its kernels use), the rounding
    variables that are set (:data:`ROUNDING_VARIABLES`) and the ``device`` (with the
    GPU's name when it is one)."""
    import torch

    device = torch.device(device)
    out = {
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "machine": f"{platform.machine()} ({platform.processor() or 'cpu'})",
        "cpus": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "rounding": {k: os.environ[k] for k in ROUNDING_VARIABLES if k in os.environ},
        "device": str(device),
    }
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def other_rounding(record: dict) -> dict[str, str]:
    """Environment variables under which a rerun takes another rounding path than the
    run that wrote ``record`` (a ``"stored"`` record or its ``"environment"``): ATen's
    scalar kernels and MKL's compatible code path when the record used vector
    kernels at default settings; else this machine's own vector kernels."""
    import torch

    env = record.get("environment", record)
    capability = env.get("cpu_capability", "")
    if capability.upper() != "DEFAULT" and not env.get("rounding"):
        return dict(PORTABLE_ROUNDING)
    here = torch.backends.cpu.get_cpu_capability()
    if here.upper() == "DEFAULT":
        raise RuntimeError(
            f"the record ran at CPU capability {capability!r} with "
            f"{env.get('rounding')}; this machine has no other capability to rerun at"
        )
    return {"ATEN_CPU_CAPABILITY": here.lower()}


#: Tensors with more values than this are stored as base64 of their bytes, not a list.
_LIST_LIMIT = 1024


def encode_tensors(value):
    """A tensor, or a dict (nested) of tensors, as JSON-ready data: each tensor becomes
    ``{"dtype", "shape", "data"}`` with its values as a flat list, or, above
    :data:`_LIST_LIMIT` values (model weights), ``{"dtype", "shape", "base64"}`` with
    its bytes in little-endian order (a list of floats written one per line made a
    results file of two small models 7 MB). Either way the values are exact (a float32
    value is a float64 value, and JSON keeps float64 to the last bit), so
    :func:`decode_tensors` gives back the same tensors."""
    import base64

    import torch

    if isinstance(value, dict):
        return {k: encode_tensors(v) for k, v in value.items()}
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"value must be a tensor or a dict of them, got {type(value).__name__}"
        )
    head = {
        "dtype": str(value.dtype).removeprefix("torch."),
        "shape": list(value.shape),
    }
    flat = value.detach().cpu().contiguous().reshape(-1)
    if flat.numel() <= _LIST_LIMIT or value.dtype == torch.bool:
        return {**head, "data": flat.tolist()}
    raw = flat.numpy().astype(flat.numpy().dtype.newbyteorder("<"), copy=False)
    return {**head, "base64": base64.b64encode(raw.tobytes()).decode("ascii")}


def decode_tensors(value):
    """The inverse of :func:`encode_tensors`."""
    import base64

    import numpy as np
    import torch

    keys = set(value) if isinstance(value, dict) else set()
    if keys not in ({"dtype", "shape", "data"}, {"dtype", "shape", "base64"}):
        return {k: decode_tensors(v) for k, v in value.items()}
    dtype = getattr(torch, value["dtype"])
    if "data" in value:
        return torch.tensor(value["data"], dtype=dtype).reshape(value["shape"])
    np_dtype = torch.empty(0, dtype=dtype).numpy().dtype.newbyteorder("<")
    raw = np.frombuffer(base64.b64decode(value["base64"]), dtype=np_dtype)
    return torch.from_numpy(raw.astype(raw.dtype.newbyteorder("="))).reshape(
        value["shape"]
    )


def _jsonable(config) -> dict:
    """A configuration (a dataclass or a dict) as plain JSON data."""
    import dataclasses

    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dataclass or a dict, got {type(config)}")
    return json.loads(json.dumps(config))


def write(
    path,
    payload: dict,
    *,
    script: str,
    sources,
    config,
    device="cpu",
    slice: dict | None = None,
    note: str = "",
) -> dict:
    """Write ``payload`` (a JSON-serialisable dict without a ``"stored"`` key) to
    ``path`` as JSON, with a ``"stored"`` record: the ``script`` that reruns it (as a
    reader would type it), the code's :func:`fingerprint`, the run's ``config`` (a
    dataclass or dict, stored as data), the :func:`environment` of ``device``, the
    time, an optional ``slice`` (``{"config": ..., "result": ...}``: a small run of the
    same code, on the CPU, which the tests rerun) and an optional ``note``. Returns
    the record."""
    if "stored" in payload:
        raise ValueError("payload must not have a 'stored' key")
    if not isinstance(script, str) or not script:
        raise ValueError(f"script must name the script that reruns it, got {script!r}")
    record = {
        "script": script,
        "fingerprint": fingerprint(sources),
        "config": _jsonable(config),
        "environment": environment(device),
        "written": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if slice is not None:
        if set(slice) != {"config", "result"}:
            raise ValueError("slice must have exactly the keys 'config' and 'result'")
        record["slice"] = {
            "config": _jsonable(slice["config"]),
            "result": json.loads(json.dumps(slice["result"])),
            "environment": environment("cpu"),  # a slice runs on the CPU
        }
    if note:
        record["note"] = note
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"stored": record, **payload}, indent=1) + "\n")
    return record


def read(path) -> dict:
    """The whole file at ``path``, without any check."""
    return json.loads(Path(path).read_text())


def origin(record: dict) -> dict:
    """Where and when the run behind a ``"stored"`` record was made: the first record
    of its history (a restamp keeps the record it replaces under ``"earlier"``), as
    ``{"written", "torch", "machine"}``."""
    while "earlier" in record:
        record = record["earlier"]
    env = record.get("environment", record)
    return {
        "written": record.get("written", ""),
        "torch": env.get("torch", ""),
        "machine": env.get("machine", ""),
    }


def changed_sources(path, sources) -> list[str]:
    """The names of the sources whose text differs from the one recorded at ``path``
    (empty when the fingerprint matches)."""
    then = read(path).get("stored", {}).get("fingerprint", {})
    now = fingerprint(sources)
    if now["all"] == then.get("all"):
        return []
    return sorted(
        n for n in set(now) | set(then) if n != "all" and now.get(n) != then.get(n)
    )


def restamp(path, *, sources, note: str, slice: dict | None = None) -> dict:
    """Record the fingerprint of today's code on the results at ``path`` without
    rerunning them: only for a change that a rerun of part of the results has shown
    not to move them (the caller's check; ``note`` says which). ``slice`` replaces the
    stored slice (else it is kept, with the environment it was run in: the slice
    check's rerun path, :func:`other_rounding`, is chosen from it). The new record's
    ``"environment"`` is this machine's, where the check ran; the earlier record (with
    its own history, down to the run's :func:`origin`) is kept under ``"earlier"``
    with the names of the sources that changed. Returns the new record."""
    path = Path(path)
    data = read(path)
    before = data.pop("stored")
    changed = changed_sources(path, sources)
    # the earlier record (with its own earlier ones, nested) without its bulk
    earlier = {k: v for k, v in before.items() if k not in ("fingerprint", "slice")}
    earlier["changed_since"] = changed
    kept = slice is None and "slice" in before
    if kept:
        slice = {k: before["slice"][k] for k in ("config", "result")}
    config = before.get("config", data.get("meta", {}).get("config", {}))
    device = before.get("environment", {}).get("device", "cpu")
    write(
        path,
        data,
        script=before["script"],
        sources=sources,
        config=config,
        device=device,
        slice=slice,
        note=note,
    )
    data = read(path)
    data["stored"]["earlier"] = earlier
    if kept:  # where the slice ran, not where this restamp ran
        data["stored"]["slice"]["environment"] = before["slice"]["environment"]
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data["stored"]


def compare_runs(record: dict, rerun: dict, *, n_se: float = 3.0) -> dict:
    """The slice check's rule: for every quantity of ``record`` (a dict of
    per-replicate values, the replicates along the first axis, e.g. gaps ``(R,)`` or
    accuracies ``(R, probe sizes)``), the rerun's mean over replicates differs from the
    record's by at most ``n_se`` standard errors of that difference, column by column.
    A rerun on another rounding path is, after enough optimizer steps, another draw of
    the training's chaos from the same seeds, so the standard error is the two-sample
    one, :math:`\\sqrt{s_{old}^2/R + s_{new}^2/R}` with the replicates' standard
    deviations :math:`s`. Returns per quantity the largest ``|difference| / standard
    error`` (``"<name>"``), ``"bitwise"`` (whether every value is identical) and
    ``"ok"``."""
    import torch

    if not record or set(record) != set(rerun):
        raise ValueError(
            f"record and rerun must hold the same quantities: {sorted(record)} vs "
            f"{sorted(rerun)}"
        )
    out: dict = {}
    bitwise = True
    for name in sorted(record):
        old = torch.as_tensor(record[name], dtype=torch.float64)
        new = torch.as_tensor(rerun[name], dtype=torch.float64)
        if old.shape != new.shape or old.ndim == 0 or old.shape[0] < 2:
            raise ValueError(
                f"{name}: needs at least two replicates of one shape, got "
                f"{tuple(old.shape)} and {tuple(new.shape)}"
            )
        if not torch.isfinite(new).all():
            raise FloatingPointError(f"{name}: the rerun gave a non-finite value")
        bitwise = bitwise and torch.equal(old, new)
        se = ((old.var(0) + new.var(0)) / old.shape[0]).sqrt()
        diff = (new.mean(0) - old.mean(0)).abs()
        # a quantity without spread in either run must be reproduced exactly
        ratio = torch.where(
            se > 0, diff / se.clamp_min(1e-300), torch.where(diff > 0, math.inf, 0.0)
        )
        out[name] = float(ratio.max())
    out["bitwise"] = bitwise
    out["ok"] = all(out[name] <= n_se for name in record)
    return out


def restamp_checked(path, *, sources, check, job: str, slice=None) -> int:
    """A script's ``--restamp``: when the code behind the results at ``path`` has
    changed, ``check(path)`` reruns part of the run (``job`` names it) with today's
    code and returns its comparison with the record (:func:`compare_runs`); only if
    its ``"ok"`` is true is today's fingerprint recorded (:func:`restamp`), with a note
    giving the comparison, and the slice recomputed by ``slice()`` when given. Returns
    the script's exit status: 0 when the file records today's code at the end, 1 when
    the job did not reproduce its record (the whole run must then be rerun)."""
    path = Path(path)
    changed = changed_sources(path, sources)
    if not changed:
        print(f"{path} already records today's code")
        return 0
    t0 = time.time()
    res = check(path)
    print(f"changed: {', '.join(changed)}; rerun of {job}: {res}")
    if not res["ok"]:
        print("the job does not reproduce its record: rerun the whole run")
        return 1
    diffs = ", ".join(
        f"{k} {v:.2f}" for k, v in res.items() if k not in ("ok", "bitwise")
    )
    same = "bit for bit" if res.get("bitwise") else "within the replicate spread"
    note = (
        f"Restamped without a rerun: {', '.join(changed)} changed; rerun with "
        f"today's code, {job} reproduced its record {same} (largest differences in "
        f"standard errors: {diffs}; {time.time() - t0:.0f} s)."
    )
    restamp(path, sources=sources, note=note, slice=slice() if slice else None)
    print(note)
    return 0


@functools.lru_cache(maxsize=16)
def _load_kept(path: str, mtime_ns: int, code: str, script: str, sources: tuple):
    return load(path, script=script, sources=list(sources))


def load_cached(path, *, script: str, sources) -> dict:
    """:func:`load`, kept in memory while the file (its modification time) and the code
    behind it (today's fingerprint of ``sources``) stay the same: a page reads its
    stored file once, however many runs it looks up in it. The same errors as
    :func:`load`; the dict returned is shared between calls, so copy what you change."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no stored results at {path}; run {script}")
    code = fingerprint(sources)["all"]
    return _load_kept(str(path), path.stat().st_mtime_ns, code, script, tuple(sources))


def load(path, *, script: str, sources, hint: str = "") -> dict:
    """The payload stored at ``path`` by :func:`write`, with its ``"stored"`` record.
    Raises :class:`FileNotFoundError` (naming ``script``) if there is no such file,
    and :class:`StaleResults` (naming ``script`` and the changed sources) if the file
    has no fingerprint or the code's fingerprint today differs from the stored one;
    ``hint`` is added to that message."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no stored results at {path}; run {script}")
    data = read(path)
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
