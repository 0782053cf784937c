"""Benchmark: Hutchinson's trace estimator against the exact Hessian trace (Chapter 5).

Run from the repository root:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_hessian_trace.py

The model is a one-member bidirectional-GRU masked LM of Chapter 5
(``notebooks/05-implicit-bias.ipynb``), briefly trained on the chapter's HMM language so
that the Hessian is that of a model near a minimum; the loss is the masked-LM loss on a
fixed batch of sentences
(``fmlab.chapters.ch5_implicit_bias.block_trace_comparison``). The exact
trace of each parameter block (the recurrent encoder, the MLP head) sums the diagonal
with one Hessian-vector product per parameter
(``fmlab.theory.flatness.hessian_block_traces_exact``); Hutchinson's estimator uses
``--probes`` Rademacher HVPs for all blocks at once. The script prints both per block
and in total, the relative error and the speed-up (CPU time). The speed-up can be at
most about the ratio of Hessian-vector products, parameters / probes. The script exits
with status 1 unless the total estimate is within 5% of the exact trace and the speed-up
is at least half that ratio. This is a script, not a timed test: timings depend on the
machine."""

from __future__ import annotations

import argparse
import sys

from fmlab.chapters.ch5_implicit_bias import block_trace_comparison


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--hidden",
        type=int,
        default=16,
        help="GRU state size (parameters grow like its square)",
    )
    ap.add_argument(
        "--sentences",
        type=int,
        default=64,
        help="sentences in the fixed batch that defines the loss",
    )
    ap.add_argument(
        "--probes", type=int, default=300, help="Rademacher probes for Hutchinson"
    )
    ap.add_argument(
        "--train-steps", type=int, default=300, help="Adam steps before measuring"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    r = block_trace_comparison(
        hidden=args.hidden,
        sentences=args.sentences,
        train_steps=args.train_steps,
        probes=args.probes,
        seed=args.seed,
    )
    P = r["n_params"]
    print(f"parameters: {P}, sentences: {args.sentences}")
    for b in r["exact"]:
        print(
            f"{b:>8}: exact {r['exact'][b]:10.4f}   Hutchinson "
            f"{r['hutchinson'][b]:10.4f} ± {r['hutchinson_se'][b]:.4f}"
        )
    exact = sum(r["exact"].values())
    est = sum(r["hutchinson"].values())
    rel = abs(est - exact) / abs(exact)
    speedup = r["seconds_exact"] / r["seconds_hutchinson"]
    print(f"   total: exact {exact:10.4f} ({P} HVPs, {r['seconds_exact']:7.2f} s CPU)")
    print(
        f"          Hutchinson {est:10.4f} ({args.probes} HVPs, "
        f"{r['seconds_hutchinson']:7.2f} s CPU)"
    )
    print(f"relative error   {rel:12.4%}")
    print(f"speed-up         {speedup:12.1f}x")
    bound = P / args.probes
    ok = rel <= 0.05 and speedup >= 0.5 * bound
    print(f"HVP ratio        {bound:12.1f}x")
    print(
        "PASS" if ok else "FAIL",
        f"(needs error <= 5% and speed-up >= {0.5 * bound:.1f}x, half the HVP ratio)",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
