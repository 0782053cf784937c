"""Benchmark: Hutchinson's trace estimator against the exact trace of the Hessian (Chapter 5).

Run from the repository root:

    OMP_NUM_THREADS=2 .venv/bin/python scripts/bench_hessian_trace.py

The model is a one-member bidirectional-GRU masked LM of Chapter 5
(``notebooks/05-implicit-bias.ipynb``), briefly trained on the chapter's HMM language so that
the Hessian is that of a model near a minimum. The loss is the masked-LM loss on a fixed
batch of sentences. The exact trace sums the diagonal with one Hessian-vector product per
parameter (``fmlab.theory.flatness.hessian_trace_exact``); Hutchinson's estimator uses
``--probes`` Rademacher HVPs. Both run in this one process, one after the other, and the
script prints their values, the relative error, the estimator's standard error and the
speed-up. It exits with status 1 unless the estimate is within 5% of the exact trace and at
least 10 times faster. This is a script, not a timed test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fmlab.data.hmm_language import HMMLanguage, HMMLanguageConfig
from fmlab.implicit_bias import train_phase
from fmlab.models.masked_lm import BiGRUMaskedLM
from fmlab.repro import make_generator, seed_everything
from fmlab.theory.flatness import hessian_trace_exact, hutchinson_trace


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

    seed_everything(args.seed)
    lang = HMMLanguage(HMMLanguageConfig())
    model = BiGRUMaskedLM(
        lang.config.vocab_size,
        hidden=args.hidden,
        d_ff=2 * args.hidden,
        generator=make_generator(args.seed),
    )
    train_phase(
        model,
        lang,
        steps=args.train_steps,
        batch=128,
        lr=1e-2,
        warmup=50,
        generator=make_generator(args.seed + 1),
        desc="training",
    )
    tokens, _ = lang.sample(args.sentences, make_generator(args.seed + 2))
    params = {k: v.detach() for k, v in model.named_parameters()}
    n_params = sum(p.numel() for p in params.values())

    def loss(p):
        return masked_lm_loss_functional(model, p, tokens)

    t0 = time.perf_counter()
    exact = hessian_trace_exact(loss, params, chunk=128)
    t_exact = time.perf_counter() - t0
    t0 = time.perf_counter()
    est = hutchinson_trace(
        loss,
        params,
        n_probes=args.probes,
        generator=make_generator(args.seed + 3),
        chunk=25,
    )
    t_hutch = time.perf_counter() - t0

    rel = abs(est.value - exact) / abs(exact)
    speedup = t_exact / t_hutch
    print(
        f"parameters: {n_params}, sentences: {args.sentences}, threads: {torch.get_num_threads()}"
    )
    print(f"exact trace      {exact:12.4f}   ({n_params} HVPs, {t_exact:7.2f} s)")
    print(
        f"Hutchinson       {est.value:12.4f} ± {est.stderr:.4f}   ({args.probes} HVPs, {t_hutch:7.2f} s)"
    )
    print(
        f"relative error   {rel:12.4%}   (standard error {est.stderr / abs(exact):.2%})"
    )
    print(f"speed-up         {speedup:12.1f}x")
    ok = rel <= 0.05 and speedup >= 10
    print("PASS" if ok else "FAIL", "(needs error <= 5% and speed-up >= 10x)")
    return 0 if ok else 1


def masked_lm_loss_functional(model, params, tokens):
    """The masked-LM loss of ``model`` with weights ``params`` (for ``torch.func``)."""
    logits = functional_call(model, params, (tokens,))
    E, n, T, V = logits.shape
    return F.cross_entropy(logits.reshape(-1, V), tokens.expand(E, n, T).reshape(-1))


if __name__ == "__main__":
    sys.exit(main())
