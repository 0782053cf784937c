"""fmlab: the library behind *The Theory of Foundation Models, Executed*.

The public API; each name's docstring says which chapter uses it.
"""

from .adapt import (
    Moments,
    ball_constrained_least_squares,
    fine_tune,
    linear_probe,
    quadratic_loss,
    second_moments,
)
from .claims import ClaimFailed, SeedEffect, claim, claims_table, finding, reset_claims
from .repro import (
    config_hash,
    effective_seed,
    get_device,
    make_generator,
    seed_everything,
    seed_offset,
    single_threaded,
)
from .train import cache_dir, cached, progress, train
from .viz import PALETTE, fig_to_png, slider_figure, use_style

__version__ = "0.1.0"

__all__ = [
    "Moments",
    "ball_constrained_least_squares",
    "fine_tune",
    "linear_probe",
    "quadratic_loss",
    "second_moments",
    "ClaimFailed",
    "SeedEffect",
    "claim",
    "claims_table",
    "finding",
    "reset_claims",
    "config_hash",
    "effective_seed",
    "get_device",
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
