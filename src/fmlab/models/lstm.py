"""A small LSTM language model (Chapter 6, ``notebooks/06-in-context-learning.ipynb``).

:math:`p_\\theta(o_{t+1} \\mid o_{1:t}) = \\operatorname{softmax}(W h_t + b)` with
:math:`h_t = \\operatorname{LSTM}(\\operatorname{Embed}(o_1), \\dots,
\\operatorname{Embed}(o_t))`.
"""

from __future__ import annotations

import torch
from torch import nn

from .._validate import check_float, check_int, check_tensor

__all__ = ["LSTMLanguageModel"]


class LSTMLanguageModel(nn.Module):
    """Next-token model: tokens ``(B, T)`` to logits ``(B, T, V)``.

    Parameters
    ----------
    vocab_size : int
        Number of tokens :math:`V`.
    embed_dim, hidden_dim : int
        Sizes of the token embedding and of the LSTM state.
    n_layers : int
        Number of stacked LSTM layers.
    dropout : float
        Dropout between layers and before the output layer (0 disables it).
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        embed_dim: int = 64,
        hidden_dim: int = 128,
        n_layers: int = 1,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=2)
        embed_dim = check_int("embed_dim", embed_dim, minimum=1)
        hidden_dim = check_int("hidden_dim", hidden_dim, minimum=1)
        n_layers = check_int("n_layers", n_layers, minimum=1)
        dropout = check_float("dropout", dropout, minimum=0.0, maximum=0.9)
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(
            embed_dim,
            hidden_dim,
            num_layers=n_layers,
            batch_first=True,
            dropout=dropout if n_layers > 1 else 0.0,
        )
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(hidden_dim, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.forward_with_state(tokens)[0]

    def forward_with_state(self, tokens: torch.Tensor, state=None):
        """Logits ``(B, T, V)`` and the LSTM state after the last token.

        ``state`` (as returned by an earlier call) continues a sequence, so a long
        prompt can be processed in pieces and a shared prefix computed once.
        """
        tokens = check_tensor("tokens", tokens, ndim=2, integer=True)
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise ValueError(f"tokens must lie in [0, {self.vocab_size - 1}]")
        out, state = self.lstm(self.drop(self.embed(tokens)), state)
        return self.head(self.drop(out)), state
