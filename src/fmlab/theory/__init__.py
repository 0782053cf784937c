"""Theory: quantities of the book's theorems, computed exactly or estimated."""

from .decomposition import Decomposition, decompose_adaptation_loss, spearman

__all__ = ["Decomposition", "decompose_adaptation_loss", "spearman"]
