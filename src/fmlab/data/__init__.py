"""Data generators with exact probabilities (nothing is downloaded)."""

from .latent import TwoViewConfig, TwoViewLatentModel

__all__ = ["TwoViewConfig", "TwoViewLatentModel"]
