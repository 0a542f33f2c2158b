"""Argument checks shared by the public API: clear ValueError/TypeError naming the argument."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

_U64 = 2**64


def check_int(value: Any, name: str, *, low: int = 0, high: int | None = None) -> int:
    """``value`` as a Python int in ``[low, high)`` (``high=None``: below 2**64)."""
    if type(value) is int:  # the common case, without the slower ABC checks below
        if low <= value < (_U64 if high is None else high):
            return value
    elif isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    v = int(value)
    hi = _U64 if high is None else high
    if not low <= v < hi:
        bound = "2**64" if high is None else str(high)
        raise ValueError(f"{name} must be in [{low}, {bound}), got {v}")
    return v


def check_seed(seed: Any) -> int:
    """A seed shared by all workers: a non-negative integer below 2**64."""
    if seed is None:
        raise TypeError(
            "seed is required: shared randomness must be a pure function of (seed, round); "
            "pass a non-negative integer"
        )
    return check_int(seed, "seed")


def as_float_array(a: Any, ndim: int, name: str) -> np.ndarray:
    """``a`` as a float64/float32 array of ``ndim`` dimensions, without copying when possible.

    Integer and boolean arrays are converted to float64; complex or object arrays raise TypeError.
    """
    arr = np.asarray(a)
    if arr.dtype not in (np.float64, np.float32):
        if arr.dtype.kind in "biu":
            arr = arr.astype(np.float64)
        else:
            raise TypeError(f"{name} must be a real float32 or float64 array, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        shape = "(n_workers, d)" if ndim == 2 else "(d,)"
        raise ValueError(f"{name} must have shape {shape}, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must be non-empty, got shape {arr.shape}")
    return arr
