"""Execute the book's chapters on every core, into the cache that Jupyter Book reads.

    python scripts/execute_chapters.py [--jobs 2] [--cache _build/.jupyter_cache]

``make book`` runs this before ``jupyter-book build``. Jupyter Book (myst-nb in
``execute_notebooks: cache`` mode) executes notebooks one after another, on one core.
This script finds the chapters whose current code has no entry in the same jupyter-cache
database, or whose entry was made with other fmlab code (the entry stores the chapter's
code fingerprint, :func:`fmlab.repro.code_fingerprint`, so an edit to the library
re-executes exactly the chapters that depend on it), executes them ``--jobs`` at a time
(one kernel each, one intra-op thread each via ``OMP_NUM_THREADS``), longest first,
and stores each executed notebook in the cache exactly as myst-nb would (same hash of
the code cells, same ``execution_seconds``). The build that follows then finds every
chapter in the cache and only renders it.

Any error (a failed claim included) stops the build: the script prints the traceback of
each failed chapter and exits non-zero, and nothing is cached for a failed chapter.

Finally it writes every chapter, as executed and cached (the outputs the pages are
rendered from), to ``_build/executed/``: ``make test`` runs nbval in strict mode on
those files. (myst-nb's own copy in ``_build/jupyter_execute`` has no outputs in cache
mode.) Their Markdown is baked (``scripts/bake_notebooks.py``): glued numbers,
citations and cross-references become the text the page shows, so that the downloaded
notebook reads right in Jupyter; code cells and outputs are left as executed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import nbformat
import yaml
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn
from jupyter_cache.executors.utils import single_nb_execution

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "src" / "fmlab" / "chapters" / "results"
REGISTRY = ROOT / "book" / "claims.yml"


def _chapters() -> list[Path]:
    """The notebooks of the table of contents, in reading order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = []

    def walk(entries):
        for e in entries or []:
            if "file" in e:
                files.append(e["file"])
            walk(e.get("sections"))
            walk(e.get("chapters"))

    files.append(toc["root"])
    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return [ROOT / f"{f}.ipynb" for f in files if (ROOT / f"{f}.ipynb").exists()]


def _config() -> dict:
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    execute = cfg.get("execute", {})
    return {"timeout": int(execute.get("timeout", 900))}


def _execute(
    path: str, timeout: int
) -> tuple[str, str | None, str | None, float, dict]:
    """Run a notebook in a fresh kernel: (notebook JSON, error, traceback, seconds,
    model cache use). The last counts the entries of :func:`fmlab.cached` the chapter
    computed and loaded (``{"computed": n, "loaded": m}``), read from the log that
    ``FMLAB_CACHE_LOG`` names."""
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "cache.log"
        log.touch()
        os.environ["FMLAB_CACHE_LOG"] = str(log)  # the kernel inherits it
        try:
            result = single_nb_execution(
                nb,
                cwd=str(Path(path).parent),
                allow_errors=False,
                timeout=timeout,
                meta_override=True,
            )
        finally:
            del os.environ["FMLAB_CACHE_LOG"]
        words = [line.split()[0] for line in log.read_text().splitlines() if line]
    use = {w: words.count(w) for w in ("computed", "loaded")}
    err = None if result.err is None else type(result.err).__name__
    return nbformat.writes(nb), err, result.exc_string, result.time, use


def _failure_summary(path: Path, text: str) -> str:
    """Where a chapter stopped, in a reader's words: the chapter, the code cell (its
    number and first line), the failed claim if a claim failed, and how to rerun that
    chapter alone."""
    nb = nbformat.reads(text, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    where, what = "an unknown cell", ""
    for number, cell in enumerate(code, start=1):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
            where = f"code cell {number} of {len(code)} (starting `{first[:60]}`)"
            e = errors[0]
            what = f"{e.get('ename', 'error')}: {e.get('evalue', '')}"[:600]
            break
    return (
        f"execute_chapters: chapter {path.stem} stopped in {where}\n"
        f"  {what}\n"
        f"  rerun this chapter alone: make chapter CH={path.name.split('-')[0]}"
    )


def _fingerprint(path: Path) -> str:
    """The hash of the fmlab code this chapter's outputs depend on (its own modules
    and every fmlab module they import, transitively:
    :func:`fmlab.repro.code_fingerprint`), of its
    stored results (``fmlab/chapters/results/chN_*.json``) and of its keys in the
    claims registry (a key's status or null decides what the page prints). The ledger
    rows (``phenomena``) are left out: the site renders them at build time and no
    output of a page prints them, so editing a caveat re-executes nothing."""
    from fmlab.repro import code_fingerprint

    number = path.name[:2]
    chapter = f"ch{int(number)}" if number.isdigit() else None
    code = code_fingerprint(chapter, outputs=True)
    if chapter is None:
        return code
    h = hashlib.sha256(code.encode())
    # results the chapter reads but does not compute (a script outside the build
    # stores them in the package): they change its page, so they count too
    for p in sorted(RESULTS.glob(f"{chapter}_*.json")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    registry = yaml.safe_load(REGISTRY.read_text()) or {}
    mine = {
        k: v
        for k, v in (registry.get("keys") or {}).items()
        if v.get("chapter") == int(number)
    }
    h.update(json.dumps(mine, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


# cold execution times (s) of the chapters, by number (a chapter's second page by its
# file name's prefix, e.g. "05b"), measured in a parallel build
COLD_SECONDS = {
    "05": 30,
    "05b": 140,
    "05c": 125,
    "04": 120,
    "04b": 140,
    "06b": 230,
    "06": 30,
    "03": 105,
    "01": 20,
    "02": 15,
}


def _expected_seconds(cache, path: Path) -> float:
    """Seconds this chapter took when last cached (any version), else a guess."""
    best = None
    for record in cache.list_cache_records():
        if Path(record.uri) == path:
            seconds = (record.data or {}).get("execution_seconds")
            if seconds is not None and (best is None or record.created > best[0]):
                best = (record.created, float(seconds))
    if best is not None:
        return best[1]
    # no history (a fresh clone): cold times measured on the 2-core machine; only their
    # order matters, and an unknown chapter goes first
    page = path.name.split("-")[0]
    return 1000.0 + COLD_SECONDS.get(page, COLD_SECONDS.get(path.name[:2], 1000.0))


def machine_gflops(seconds: float = 1.0) -> float:
    """This machine's speed now: GFLOP/s of a 1024 x 1024 single-precision matrix
    product on one thread, the best of repeats over about ``seconds``. The runtimes page
    prints it beside the chapters' times. Measured before and after the chapters, on an
    idle core, it misses contention between the two running chapters: in one build it
    read 91 GFLOP/s against 98 in another while the pages took 27% longer."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        a, b = (torch.randn(1024, 1024, generator=g) for _ in range(2))
        a @ b  # warm-up
        best, end = math.inf, time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t)
    finally:
        torch.set_num_threads(threads)
    return 2 * 1024**3 / best / 1e9


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--cache", type=Path, default=ROOT / "_build" / ".jupyter_cache"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        help="execute only the chapters whose file names start with these, e.g. 04",
    )
    parser.add_argument(
        "--export",
        type=Path,
        default=ROOT / "_build" / "executed",
        help="where to write the executed chapters (for nbval)",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")

    cache = get_cache(str(args.cache))
    todo = []
    chapters = _chapters()
    if args.only:
        chapters = [p for p in chapters if any(p.name.startswith(o) for o in args.only)]
        if not chapters:
            parser.error(f"no chapter matches {args.only}")
    for path in chapters:
        nb = nbformat.read(str(path), as_version=4)
        try:
            record = cache.match_cache_notebook(nb)
        except KeyError:
            todo.append(path)
            continue
        # the notebook is unchanged, but the library it runs may not be
        if (record.data or {}).get("fmlab_code") != _fingerprint(path):
            todo.append(path)
    if not todo:
        print("execute_chapters: every chapter is in the execution cache")
        return _export(cache, args.export, strict=not args.only)
    todo.sort(key=lambda p: -_expected_seconds(cache, p))
    timeout = _config()["timeout"]
    print(
        f"execute_chapters: {len(todo)} chapter(s), {args.jobs} at a time, "
        "longest first: " + ", ".join(p.stem for p in todo),
        flush=True,
    )
    speed_before = machine_gflops()
    start = time.perf_counter()
    failed, total = [], 0.0
    with ProcessPoolExecutor(max_workers=min(args.jobs, len(todo))) as pool:
        futures = {pool.submit(_execute, str(p), timeout): p for p in todo}
        for fut in as_completed(futures):
            path = futures[fut]
            text, err, tb, seconds, use = fut.result()
            total += seconds
            if err is not None:
                failed.append(path)
                print(
                    f"\nFAILED {path.name} after {seconds:.1f} s: {err}\n{tb}\n"
                    + _failure_summary(path, text),
                    flush=True,
                )
                continue
            record = cache.add_nb_to_project(str(path))
            cache.cache_notebook_bundle(
                CacheBundleIn(
                    nbformat.reads(text, as_version=4),
                    record.uri,
                    data={
                        "execution_seconds": seconds,
                        "fmlab_code": _fingerprint(path),
                        # what the model cache held: the runtimes page compares a run
                        # that computed nothing with the budget of a cached run
                        "cache_computed": use["computed"],
                        "cache_loaded": use["loaded"],
                    },
                ),
                check_validity=False,
                overwrite=True,
            )
            print(
                f"  {path.stem}: {seconds:.1f} s ({use['computed']} cache entries "
                f"computed, {use['loaded']} loaded)",
                flush=True,
            )
    wall = time.perf_counter() - start
    speed = [round(speed_before, 1), round(machine_gflops(), 1)]
    print(f"execute_chapters: this machine's speed before and after: {speed} GFLOP/s")
    if total and not failed:
        # the runtimes page reports the parallel efficiency of the last real execution
        (args.cache / "fmlab_execution.json").write_text(
            json.dumps(
                {
                    "wall_seconds": round(wall, 1),
                    "chapter_seconds": round(total, 1),
                    "jobs": min(args.jobs, len(todo)),
                    "chapters": [p.stem for p in todo],
                    "gflops": speed,
                }
            )
        )
    print(
        f"execute_chapters: {wall:.1f} s wall for {total:.1f} s of chapter execution "
        f"({wall / total:.2f}x the serial time)"
        if total
        else "",
        flush=True,
    )
    if failed:
        print("execute_chapters: FAILED: " + ", ".join(p.name for p in failed))
        return 1
    return _export(cache, args.export, strict=not args.only)


def _export(cache, folder: Path, strict: bool = True) -> int:
    """Write each chapter merged with its cached outputs to ``folder`` (with
    ``strict=False``, skip chapters not executed yet), its Markdown baked by
    ``scripts/bake_notebooks.py`` (glued values, citations and references as the page
    shows them; code cells untouched): they are also the site's ``.ipynb`` downloads.
    """
    bake = _bake_module()
    book = bake.load_book(ROOT)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.ipynb"):
        old.unlink()
    for path in _chapters():
        nb = nbformat.read(str(path), as_version=4)
        try:
            _, executed = cache.merge_match_into_notebook(nb)
        except KeyError:
            if not strict:
                continue
            print(f"execute_chapters: {path.name} is not in the execution cache")
            return 1
        doc = path.relative_to(ROOT).with_suffix("").as_posix()
        executed = bake.bake_notebook(executed, book, doc)
        nbformat.write(executed, str(folder / path.name))
    return 0


def _bake_module():
    """``scripts/bake_notebooks.py``, imported from beside this file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bake_notebooks", Path(__file__).with_name("bake_notebooks.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    sys.exit(main())
