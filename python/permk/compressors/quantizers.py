"""Unbiased quantizers ``Q ∈ U(ω)`` (:class:`~permk.compressors.rust.Quantizer`): natural
compression and QSGD, used alone (independently by every worker) or inside
:class:`~permk.compressors.Compose`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validate import check_int
from .base import Compressor, ceil_log2
from .rust import Quantizer

__all__ = ["NaturalCompression", "QSGD"]


@dataclass(frozen=True)
class NaturalCompression(Quantizer):
    """Natural compression: ``x`` is rounded at random to one of the two nearest powers of two
    (unbiasedly); ``ω = 1/8``. A value is sent as sign + exponent: 9 bits for 32-bit floats,
    12 for 64-bit ones.

    >>> NaturalCompression().omega(1, 100)
    0.125
    """

    @property
    def name(self) -> str:
        return "Natural"

    def quantizer_args(self) -> dict[str, Any]:
        return {"quantizer": "natural"}

    def omega(self, n: int, d: int) -> float:
        self.check(n, d)
        return 0.125

    def value_bits(self, float_bits: int = 32) -> int:
        return 9 if float_bits <= 32 else 12

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray:
        return 2.0 * np.abs(A)


@dataclass(frozen=True)
class QSGD(Quantizer):
    """QSGD with ``s`` levels: ``Q(x)_j = ‖x‖ sign(x_j) ξ_j / s`` with ``ξ_j`` the random
    rounding of ``s|x_j|/‖x‖``; ``ω = min(d/s², √d/s)``. A message is the norm (one float) and
    per value a sign and a level (``1 + ⌈log2(s+1)⌉`` bits).

    >>> QSGD(4).omega(1, 16)
    1.0
    """

    s: int

    def __post_init__(self) -> None:
        check_int(self.s, "s", low=1, high=2**32)

    @property
    def name(self) -> str:
        return f"QSGD(s={self.s})"

    @classmethod
    def default(cls, n: int, d: int) -> QSGD:
        """``QSGD(⌈√d⌉)``: ``ω = 1`` (at most one ``‖x‖`` of variance per value)."""
        return cls(max(1, math.isqrt(d - 1) + 1))

    @classmethod
    def examples(cls, n: int, d: int, rng: np.random.Generator | None = None) -> list[Compressor]:
        return [cls(3 if rng is None else int(rng.integers(1, 7)))]

    def quantizer_args(self) -> dict[str, Any]:
        return {"quantizer": "qsgd", "s": self.s}

    def omega(self, n: int, d: int) -> float:
        self.check(n, d)
        return min(d / self.s**2, math.sqrt(d) / self.s)

    def value_bits(self, float_bits: int = 32) -> int:
        return 1 + ceil_log2(self.s + 1)

    def overhead_bits(self, float_bits: int = 32) -> int:
        return float_bits

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray:
        return np.broadcast_to(np.linalg.norm(A, axis=1, keepdims=True), np.shape(A))


