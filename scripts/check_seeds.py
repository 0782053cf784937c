"""The robustness run: every chapter at several seed offsets, every claim's verdict.

    python scripts/check_seeds.py                      # offsets 1-4, every chapter
    python scripts/check_seeds.py --offsets 0 1 2 3 4 --chapters 03 06 --jobs 2

Each (chapter, offset) is executed in its own kernel with ``FMLAB_SEED_OFFSET`` set (so
every seed of the chapter is a new, independent draw; see ``fmlab.repro``) and with
``FMLAB_CLAIMS_COLLECT=1``, so a failed claim is recorded instead of stopping the
chapter.
The script prints a table, claim x offset, with the value of every keyed claim, writes
it as JSON (``--out``, default ``_build/seed_check.json``), and exits non-zero if any
claim failed or any chapter stopped on an error. It is not part of ``make test`` (it
takes about as long as building the book once per offset); run it as ``make seeds``
before resolving any change to a claim.

``--store book/robustness.json`` also merges every keyed claim's verdict, value and
strength at each offset into that file (with the commit and date of the run), which the
book's reproduction notes read: a later run replaces the same key at the same offset and
keeps the rest. A key whose registry entry names a ``stored`` script reads its value
from a results file, the same at every offset, so it is recorded once, under
``"stored"`` (with that script), not once per offset.

Claims are matched across offsets by their key, or by their statement where they have
none; a statement must therefore not contain run-dependent numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def _worker(notebook: str, log: str, timeout: int) -> int:
    """Execute one notebook (in this process's environment); 0 if it ran to the end."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(Path(notebook).parent)}},
    )
    try:
        client.execute()
    except CellExecutionError as err:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(
                json.dumps({"error": str(err).strip().splitlines()[-1][:400]}) + "\n"
            )
        return 1
    return 0


def _run(notebook: Path, offset: int, timeout: int) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as fh:
        log = fh.name
    env = dict(os.environ)
    env.update(
        FMLAB_SEED_OFFSET=str(offset),
        FMLAB_CLAIMS_COLLECT="1",
        FMLAB_CLAIMS_LOG=log,
        FMLAB_PROGRESS="0",
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
        PYDEVD_DISABLE_FILE_VALIDATION="1",
    )
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", str(notebook), log, str(timeout)],
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    claims, errors = [], []
    for line in Path(log).read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        (errors if "error" in row else claims).append(row.get("error", row))
    os.unlink(log)
    if proc.returncode != 0 and not errors:
        errors.append(
            (proc.stderr or proc.stdout).strip()[-400:] or f"exit {proc.returncode}"
        )
    return {
        "chapter": notebook.stem,
        "offset": offset,
        "seconds": round(seconds, 1),
        "claims": claims,
        "errors": errors,
    }


def _table(results: list[dict], offsets: list[int]) -> tuple[str, bool]:
    rows: dict[tuple[str, str], dict] = {}
    order: list[tuple[str, str]] = []
    for res in sorted(results, key=lambda r: (r["chapter"], r["offset"])):
        for c in res["claims"]:
            ident = (res["chapter"], c["key"] or c["statement"])
            if ident not in rows:
                rows[ident] = {
                    "kind": c["kind"],
                    "key": c["key"],
                    "statement": c["statement"],
                    "by": {},
                }
                order.append(ident)
            rows[ident]["by"][res["offset"]] = c
    ok = True
    lines = [
        "| chapter | claim | kind | "
        + " | ".join(f"offset {k}" for k in offsets)
        + " |"
    ]
    lines.append("| --- | --- | --- | " + " | ".join("---" for _ in offsets) + " |")
    for ident in sorted(order, key=lambda i: (i[0], order.index(i))):
        row = rows[ident]
        label = f"`{row['key']}`" if row["key"] else row["statement"][:90]
        cells = []
        for k in offsets:
            c = row["by"].get(k)
            if c is None:
                cells.append("–")
                ok = False
                continue
            claimed = c.get("claimed", True)
            mark = ("✔" if c["verified"] else "✘") if claimed else "○"
            ok &= bool(c["verified"]) or not claimed
            v = c.get("value")
            if isinstance(v, (int, float)):
                mark += f" {v:+.3g}"
            if c.get("strength") is not None:
                mark += f" ({c['strength']:.2f}×)"
            cells.append(mark)
        kind = (
            row["kind"]
            if all(c.get("claimed", True) for c in row["by"].values())
            else "measured"
        )
        lines.append(
            f"| {ident[0][:2]} | {label} | {kind} | " + " | ".join(cells) + " |"
        )
    lines += ["", _worst_table(rows, order, offsets)]
    return "\n".join(lines), ok


def _worst_table(rows: dict, order: list, offsets: list[int]) -> str:
    """Every keyed finding at its worst offset: how many times the mean clears the
    rule's 3 standard errors there (below 1 fails; below 1.5 leaves little room)."""
    lines = [
        "| key | status | worst offset | strength there | every offset holds |",
        "| --- | --- | --- | --- | --- |",
    ]
    for ident in order:
        row = rows[ident]
        if not row["key"] or row["kind"] != "finding":
            continue
        seen = {k: c for k, c in row["by"].items() if c.get("strength") is not None}
        if not seen:
            continue
        worst = min(seen, key=lambda k: seen[k]["strength"])
        claimed = all(c.get("claimed", True) for c in row["by"].values())
        holds = all(row["by"].get(k, {}).get("verified") for k in offsets)
        lines.append(
            f"| `{row['key']}` | {'claimed' if claimed else 'measured'} | {worst} | "
            f"{seen[worst]['strength']:.2f}× | {'yes' if holds else 'no'} |"
        )
    return "\n".join(lines)


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return out.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def stored_keys(registry: Path = ROOT / "book" / "claims.yml") -> dict[str, str]:
    """The keys whose value a chapter reads from a stored run, with the script that
    writes it: ``{key: script}`` from the registry's ``stored`` fields."""
    import yaml

    keys = yaml.safe_load(registry.read_text(encoding="utf-8")).get("keys") or {}
    return {k: e["stored"] for k, e in keys.items() if e.get("stored")}


def store(results: list[dict], path: Path, stored: dict | None = None) -> dict:
    """Merge the keyed verdicts of ``results`` into the robustness file at ``path``:
    ``{"keys": {key: {"offsets": {offset: {verified, claimed, value, strength,
    commit, date}}}}}``. A later run replaces a key at the same offset.

    A key of ``stored`` (``{key: script}``, by default :func:`stored_keys`) takes its
    value from a results file, so every offset gives the same number: it is recorded
    once, as ``{"stored": {script, verified, claimed, value, strength, commit,
    date}}``, and never per offset (that would read as several checks of one run)."""
    stored = stored_keys() if stored is None else stored
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    keys = data.setdefault("keys", {})
    stamp = {"commit": _commit(), "date": time.strftime("%Y-%m-%d")}
    for res in results:
        if res["errors"]:
            continue
        for c in res["claims"]:
            if not c.get("key"):
                continue
            verdict = {
                "verified": bool(c["verified"]),
                "claimed": bool(c.get("claimed", True)),
                "value": c.get("value"),
                "strength": c.get("strength"),
                **stamp,
            }
            if c["key"] in stored:
                keys[c["key"]] = {"stored": {"script": stored[c["key"]], **verdict}}
                continue
            entry = keys.setdefault(c["key"], {"offsets": {}})
            entry.pop("stored", None)
            entry.setdefault("offsets", {})[str(res["offset"])] = verdict
    for entry in keys.values():
        if "offsets" in entry:
            entry["offsets"] = dict(
                sorted(entry["offsets"].items(), key=lambda i: int(i[0]))
            )
    data["keys"] = dict(sorted(keys.items()))
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--offsets", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument(
        "--chapters",
        nargs="+",
        default=None,
        help="notebook name prefixes, e.g. 01 06 (default: every chapter)",
    )
    parser.add_argument("--jobs", type=int, default=2, help="chapters executed at once")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "seed_check.json")
    parser.add_argument(
        "--store",
        type=Path,
        default=None,
        help="merge the keyed verdicts into this file (the book reads "
        "book/robustness.json)",
    )
    args = parser.parse_args(argv)

    notebooks = sorted(NOTEBOOKS.glob("*.ipynb"))
    if args.chapters:
        notebooks = [
            p for p in notebooks if any(p.name.startswith(c) for c in args.chapters)
        ]
        if not notebooks:
            parser.error(f"no notebook matches {args.chapters}")
    if any(k < 0 for k in args.offsets):
        parser.error("offsets must be >= 0")
    jobs = [(nb, k) for k in args.offsets for nb in notebooks]
    # longest chapters first (the later chapters are the slow ones), so two workers
    # finish together
    jobs.sort(
        key=lambda j: (-int(j[0].name[:2]) if j[0].name[:2].isdigit() else 0, j[1])
    )
    results = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(_run, nb, k, args.timeout) for nb, k in jobs]
        for fut in futures:
            res = fut.result()
            n_bad = sum(
                not c["verified"] and c.get("claimed", True) for c in res["claims"]
            )
            status = (
                "error: " + res["errors"][0] if res["errors"] else f"{n_bad} failed"
            )
            print(
                f"{res['chapter']:>34s} offset {res['offset']}: "
                f"{len(res['claims'])} claims, "
                f"{status} ({res['seconds']:.0f} s)",
                flush=True,
            )
            results.append(res)
            if args.store is not None:  # each run as it ends: a stopped run keeps it
                store([res], args.store)
    table, ok = _table(results, sorted(set(args.offsets)))
    ok &= not any(r["errors"] for r in results)
    print()
    print(table)
    for r in results:
        for e in r["errors"]:
            print(f"\nERROR in {r['chapter']} at offset {r['offset']}: {e}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    if args.store is not None:
        store(results, args.store)
        print(f"keyed verdicts merged into {args.store}")
    print(
        f"\n{'every claim held' if ok else 'SOME CLAIMS FAILED'}; details in {args.out}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        sys.exit(_worker(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    sys.exit(main())
