"""fmlab: the library behind *The Theory of Foundation Models, Executed*.

The top level holds the core (claims, seeding, training loop, figures). The layers
below it, each importing only those above it in this list:

- :mod:`fmlab.theory`: exact mathematics on tensors;
- :mod:`fmlab.data` and :mod:`fmlab.models`: generators with exact probabilities, and
  one file per model;
- :mod:`fmlab.adapt`: probes, fine-tuning and LoRA shared by chapters;
- :mod:`fmlab.chapters`: each chapter's configs, runners, results and figures.
"""

from .claims import ClaimFailed, SeedEffect, claim, claims_table, finding, reset_claims
from .repro import (
    config_hash,
    effective_seed,
    make_generator,
    seed_everything,
    seed_offset,
    single_threaded,
)
from .train import cache_dir, cached, progress, train
from .viz import PALETTE, fig_to_png, slider_figure, use_style

__version__ = "0.1.0"

__all__ = [
    "ClaimFailed",
    "SeedEffect",
    "claim",
    "claims_table",
    "finding",
    "reset_claims",
    "config_hash",
    "effective_seed",
    "make_generator",
    "seed_everything",
    "seed_offset",
    "single_threaded",
    "cache_dir",
    "cached",
    "progress",
    "train",
    "PALETTE",
    "fig_to_png",
    "slider_figure",
    "use_style",
]
