"""Argument checks shared by fmlab's public functions.

Every check names the argument and says what was expected, in the spirit of
scikit-learn's input validation: a reader who passes the wrong thing learns which
argument was wrong and why, instead of meeting a shape error deep inside torch.
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence

import torch


def check_int(
    name: str, value, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """``value`` as an int; raise if it is not an integer in [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be an integer, got {type(value).__name__} ({value!r})"
        )
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_float(
    name: str,
    value,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict_min: bool = False,
) -> float:
    """Return ``value`` as a finite float, or raise if it is not a real number in range.

    ``strict_min`` makes the lower bound exclusive (``value > minimum``).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a real number, got {type(value).__name__} ({value!r})"
        )
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if minimum is not None:
        if strict_min and value <= minimum:
            raise ValueError(f"{name} must be > {minimum}, got {value}")
        if not strict_min and value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_tensor(
    name: str,
    value,
    *,
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
    floating: bool | None = None,
    integer: bool = False,
    finite: bool = True,
) -> torch.Tensor:
    """Check that ``value`` is a torch.Tensor of the expected rank, shape and dtype.

    ``shape`` may contain ``None`` for a free dimension. ``floating=True`` demands a
    floating dtype; ``integer=True`` an integer dtype (for token ids and labels).
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if shape is not None:
        ndim = len(shape)
    if ndim is not None and value.ndim != ndim:
        raise ValueError(
            f"{name} must have {ndim} dimensions, got shape {tuple(value.shape)}"
        )
    if shape is not None:
        for axis, (want, got) in enumerate(zip(shape, value.shape)):
            if want is not None and want != got:
                raise ValueError(
                    f"{name} must have size {want} along axis {axis}, "
                    f"got shape {tuple(value.shape)}"
                )
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {value.dtype}")
    if integer and (
        value.is_floating_point() or value.is_complex() or value.dtype == torch.bool
    ):
        raise TypeError(f"{name} must have an integer dtype, got {value.dtype}")
    if finite and value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} contains NaN or infinite entries")
    return value


def check_same_length(names: Sequence[str], *tensors: torch.Tensor) -> int:
    """Check that the tensors agree along their first axis and return that length."""
    lengths = [t.shape[0] for t in tensors]
    if len(set(lengths)) > 1:
        pairs = ", ".join(f"{n}: {l}" for n, l in zip(names, lengths))
        raise ValueError(
            f"{' and '.join(names)} must have the same number of rows, got {pairs}"
        )
    return lengths[0]


def check_choice(name: str, value, choices: Sequence) -> None:
    """Raise unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
