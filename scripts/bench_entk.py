"""Benchmark: where the time of an eNTK goes, three ways (Chapter 4).

On the chapter's pretrained masked LM with the prompt-based output, the kernel of the
weight matrices of the transformer blocks (every ``nn.Linear`` inside them, most of the
model's parameters) is computed three ways, each forming the per-example Jacobian J and
then paying the same Gram product J J^T:

* torch.func: ``vmap(jacrev(f))`` (``fmlab.theory.kernels.jacobian``);
* loop: one forward and one backward pass per example;
* batched: one batched backward pass with hooks and an ``einsum`` per layer
  (BackPACK / Opacus style, ``fmlab.theory.kernels.linear_per_example_gradients``).

For each n it prints the time of each Jacobian, of the Gram product, the Gram product's
share of the torch.func total, and the speed-up of torch.func over the other two (best
of ``--repeats`` runs, CPU time of this process by default), exactly what the chapter
measures in its build (``fmlab.theory.kernels.time_entk``).

    python scripts/bench_entk.py [--n 16 64 256] [--threads 1] [--device cpu]
    python scripts/bench_entk.py --quick   # n = 16 once, a briefly pretrained model

The model is the chapter's (``ChapterConfig().pretrain``, pretrained once and then read
from fmlab's cache, like the build's). ``--pretrain-steps`` pretrains the same
architecture for fewer steps instead, and ``--quick`` sets 20 steps, ``--n 16`` and
``--repeats 1``: the times depend on the architecture and on n, not on how long the
weights were trained. A quick run takes about ten seconds on one core with a cold cache;
pretraining the chapter's model into a cold cache takes about a minute.

It is a script, not a timed test: timings depend on the machine and on its load. With
``--device cuda`` (where a GPU exists) it times on the GPU with the wall clock, after
synchronising, and reports the same ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform

import torch

from fmlab.adapt.lora import only_targets_trainable
from fmlab.chapters.ch4_kernel_view import ChapterConfig
from fmlab.chapters.ch4_world import pretrain_masked_lm, test_set
from fmlab.data.sentiment_language import SentimentLanguage
from fmlab.models.transformer import PromptClassifier
from fmlab.theory.kernels import time_entk


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--n", type=int, nargs="+", default=[16, 64, 256], help="numbers of examples"
    )
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument("--repeats", type=int, default=3, help="runs per method")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--pretrain-steps",
        type=int,
        default=None,
        help="pretrain the chapter's architecture for this many steps (default: the "
        "chapter's model)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="--n 16 --repeats 1 --pretrain-steps 20: checks the script in seconds",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.repeats, args.pretrain_steps = [16], 1, 20
    if min(args.n) < 2:
        parser.error("--n: every number of examples must be at least 2")
    if args.pretrain_steps is not None and args.pretrain_steps < 1:
        parser.error("--pretrain-steps must be at least 1")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU is available here")
    config = ChapterConfig().pretrain  # the chapter's model (trained once, then cached)
    if args.pretrain_steps is not None:
        config = dataclasses.replace(config, steps=args.pretrain_steps)
    mlm, _ = pretrain_masked_lm(config)
    lang = SentimentLanguage(config.language)
    model = only_targets_trainable(PromptClassifier(mlm, lang)).to(device)
    x_all = test_set(lang, 2 * ((max(args.n) + 1) // 2)).x_prompt.to(device)
    clock = "process" if device.type == "cpu" else "wall"
    results = []
    for n in args.n:
        if device.type == "cuda":
            torch.cuda.synchronize()
        result = time_entk(model, x_all[:n], repeats=args.repeats, clock=clock)
        result.update(threads=args.threads, device=str(device), clock=clock)
        results.append(result)
        ms = {k: 1000 * v for k, v in result.items() if isinstance(v, float)}
        print(
            f"n = {n} ({result['parameters']:,} parameters): Jacobian torch.func "
            f"{ms['jacobian_torch_func']:.0f} ms, loop {ms['jacobian_loop']:.0f} ms, "
            f"batched {ms['jacobian_batched']:.0f} ms; Gram product "
            f"{ms['gram']:.0f} ms ({100 * result['gram_share']:.0f}% of the "
            f"torch.func total); torch.func is {result['speedup_vs_loop']:.1f}x faster "
            f"than the loop and {result['speedup_vs_batched']:.1f}x as fast as the "
            f"batched backward (same matrix up to {result['max_rel_diff']:.1e})"
        )
    print(
        json.dumps(
            {
                "results": results,
                "load_average": os.getloadavg()[0],
                "cpu_count": os.cpu_count(),
                "machine": platform.processor() or platform.machine(),
                "torch": torch.__version__,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
