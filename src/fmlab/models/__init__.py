"""Small models: an MLP and the masked-view predictor of Chapter 1."""

from .mlp import MLP, MaskedViewPredictor

__all__ = ["MLP", "MaskedViewPredictor"]
