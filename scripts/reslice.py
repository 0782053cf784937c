"""Replace the slice kept in a stored results file (:mod:`fmlab.stored`) by a fresh run
of the slice its module defines today, on this machine, leaving the stored results
and their fingerprint as they are.

    python scripts/reslice.py ch6_worlds ch5_size_sweep   # after editing their *_SLICE
    python scripts/reslice.py --all                       # every file it knows

A slice is a small run of the same code as the stored results (for example a few
training steps of three replicates), which ``tests/chapters/test_stored_runs.py``
reruns under another rounding path and compares with the record. When a module's
``*_SLICE`` settings change (a smaller slice, say), the record must be rerun: this
script does so and records a note in the file's history. It refuses a file whose code
has changed since its results were stored (that needs the file's own script, with
``--restamp`` or a full rerun), since a slice must come from the code that produced
the results beside it.

The slice is recorded on the portable rounding path
(:data:`fmlab.stored.PORTABLE_ROUNDING`: ATen's scalar kernels, MKL's compatible path),
which this script sets before it imports torch; the tests then rerun it on the
machine's own vector kernels, the faster path. A script that writes a whole results
file records its slice on the path it ran on; ``reslice.py`` afterwards moves the slice
to the portable one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace

# The stored files whose slice this script can recompute. ch5_same_loss's whole module
# is in its fingerprint, so a new slice setting there (an edit of that module) needs
# scripts/ch5_same_loss.py --restamp first, which checks a job of the run; after it,
# this script can record the slice again.
NAMES = (
    "ch3_lpft",
    "ch4_fewshot",
    "ch4_natural",
    "ch4_second_world",
    "ch5_noise_transfer",
    "ch5_same_loss",
    "ch5_size_sweep",
    "ch5_width_sweep",
    "ch6_pretrained",
    "ch6_worlds",
)


#: :data:`fmlab.stored.PORTABLE_ROUNDING`, written out: it must be set before torch is
#: imported, and importing fmlab imports torch
PORTABLE = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}


def _spec(name: str):
    """The results file of ``name``, its sources, and the slice's config and runner."""
    if name == "ch3_lpft":
        from fmlab.chapters import ch3_stored as m

        config = m.config_record(m.lpft_slice_config())
        return m.LPFT_RESULTS, m.lpft_sources(), config, m.lpft_slice
    if name == "ch4_fewshot":
        from fmlab.chapters import ch4_stored as m

        return (
            m.FEWSHOT_RESULTS,
            m.fewshot_sources(),
            m.fewshot_slice_config(),
            m.fewshot_slice,
        )
    if name == "ch4_natural":
        from fmlab.chapters import ch4_natural_stored as m

        return (
            m.NATURAL_RESULTS,
            m.natural_sources(),
            m.natural_slice_config(),
            m.natural_slice,
        )
    if name == "ch4_second_world":
        from fmlab.chapters import ch4_second_world as m

        return (
            m.SECOND_WORLD_RESULTS,
            m.second_world_sources(),
            m.slice_config(),
            m.second_world_slice,
        )
    if name == "ch5_noise_transfer":
        from fmlab.chapters import ch5_sgd_noise as m

        config = asdict(replace(m.NoiseTransferConfig(), **m.NOISE_TRANSFER_SLICE))
        return (
            m.NOISE_TRANSFER_RESULTS,
            m.noise_transfer_sources(),
            config,
            m.noise_transfer_slice,
        )
    if name == "ch5_same_loss":
        from fmlab import stored
        from fmlab.chapters import ch5_implicit_bias as m

        page = stored.read(m.SAME_LOSS_RESULTS)["meta"]["config"]
        config = asdict(replace(m.same_loss_config(page), **m.SAME_LOSS_SLICE))
        return m.SAME_LOSS_RESULTS, m.same_loss_sources(), config, m.same_loss_slice
    if name == "ch5_size_sweep":
        from fmlab.chapters import ch5_size as m

        config = asdict(m.SizeSweepConfig(**m.SIZE_SWEEP_SLICE))
        return m.SIZE_SWEEP_RESULTS, m.size_sweep_sources(), config, m.size_sweep_slice
    if name == "ch5_width_sweep":
        from fmlab.chapters import ch5_sgd_noise as m

        config = asdict(m.WidthSweepConfig(**m.WIDTH_SWEEP_SLICE))
        return (
            m.WIDTH_SWEEP_RESULTS,
            m.width_sweep_sources(),
            config,
            m.width_sweep_slice,
        )
    if name == "ch6_pretrained":
        from fmlab.chapters import ch6_pretrained as m

        config = asdict(replace(m.pretrained_config(), **m.PRETRAINED_SLICE))
        return m.PRETRAINED_RESULTS, m.pretrained_sources(), config, m.pretrained_slice
    from fmlab.chapters import ch6_worlds as m

    config = asdict(m.WorldsConfig(**m.WORLDS_SLICE))
    return m.WORLDS_RESULTS, m.worlds_sources(), config, m.worlds_slice


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", choices=NAMES, help="the results files")
    ap.add_argument("--all", action="store_true", help="every file in NAMES")
    a = ap.parse_args(argv)
    if a.all == bool(a.names):
        ap.error("name the results files, or give --all")
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.update(PORTABLE)  # before torch is imported
    import torch

    from fmlab import stored

    assert stored.PORTABLE_ROUNDING == PORTABLE, "reslice.PORTABLE is out of date"
    torch.set_num_threads(1)
    if torch.backends.cpu.get_cpu_capability().upper() != "DEFAULT":
        raise SystemExit("torch was imported before the rounding path was set")
    status = 0
    for name in a.names or NAMES:
        path, sources, config, run = _spec(name)
        changed = stored.changed_sources(path, sources)
        if changed:
            print(f"{name}: its code changed ({', '.join(changed)}); rerun its script")
            status = 1
            continue
        before = stored.read(path)["stored"]["slice"]["config"]
        t0 = time.time()
        result = run(config)
        seconds = time.time() - t0
        now = json.loads(json.dumps(config))  # tuples as the file keeps them
        moved = {k: (before.get(k), v) for k, v in now.items() if before.get(k) != v}
        note = (
            f"Slice replaced (scripts/reslice.py): settings {moved or 'unchanged'} "
            f"(was, now), recorded on the portable rounding path {PORTABLE}; the "
            f"stored results are unchanged; the new slice took {seconds:.1f} s."
        )
        stored.restamp(
            path, sources=sources, note=note, slice={"config": config, "result": result}
        )
        print(f"{name}: {note}")
    return status


if __name__ == "__main__":
    sys.exit(main())
