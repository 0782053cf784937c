"""Theory: quantities of the book's theorems, computed exactly or estimated."""

from .decomposition import (
    Decomposition,
    decompose_adaptation_loss,
    interface_constant,
    posterior_readout,
    spearman,
)

__all__ = [
    "Decomposition",
    "decompose_adaptation_loss",
    "interface_constant",
    "posterior_readout",
    "spearman",
]
