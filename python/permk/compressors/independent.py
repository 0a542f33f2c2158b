"""The compressors every worker runs on its own: RandK (independent across workers, its
coordinates recomputed by the receiver from ``(seed, round, worker)``), TopK (deterministic,
contractive) and the identity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validate import check_int
from .base import Capabilities, Compressor
from .rust import Sparsifier

__all__ = ["RandK", "TopK", "Identity"]


@dataclass(frozen=True)
class RandK(Sparsifier):
    """Independent RandK: each worker sends ``k`` uniformly random coordinates scaled by ``d/k``.

    ``C_i ∈ U(ω)`` with ``ω = d/k - 1``; independence gives ``(A, B) = (ω/n, 0)`` (Lemma 1).
    Worker ``i``'s coordinates are a pure function of ``(seed, round, i)``, so the receiver
    recomputes them ("shared-seed RandK"): no indices are sent.

    >>> RandK(10).ab_constants(n=10, d=100)
    (0.9, 0.0)
    """

    k: int
    tunable = "k"
    capabilities = Capabilities(shared_plan=True, fixed_size=True)
    ab_exact = True

    def __post_init__(self) -> None:
        check_int(self.k, "k", low=1)

    @property
    def name(self) -> str:
        return f"RandK(k={self.k})"

    @classmethod
    def examples(cls, n: int, d: int, rng: np.random.Generator | None = None) -> list[Compressor]:
        return [cls(max(1, d // 3) if rng is None else int(rng.integers(1, d + 1)))]

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray:
        return np.shape(A)[1] / self.k * np.abs(A)

    def kernel_args(self) -> dict[str, Any]:
        return {"sparsifier": "randk", "k": self.k}

    def omega(self, n: int, d: int) -> float:
        self.check(n, d)
        return d / self.k - 1.0

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        return (self.omega(n, d) / n, 0.0)

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return self.k


@dataclass(frozen=True)
class TopK(Sparsifier):
    """TopK: the ``k`` largest-magnitude coordinates (ties: lower index), unscaled.

    Deterministic and biased; contractive with ``α = k/d`` (eq. (contractive)). The receiver
    needs the indices, which :meth:`bits_per_worker` counts. Used with EF21.

    >>> TopK(5).alpha(3, 100), TopK(5).ab_constants(3, 100) is None
    (0.05, True)
    """

    k: int
    tunable = "k"
    capabilities = Capabilities(unbiased=False, fixed_size=True, needs_indices=True, deterministic=True)

    def __post_init__(self) -> None:
        check_int(self.k, "k", low=1)

    @property
    def name(self) -> str:
        return f"TopK(k={self.k})"

    @classmethod
    def examples(cls, n: int, d: int, rng: np.random.Generator | None = None) -> list[Compressor]:
        return [cls(max(1, d // 3) if rng is None else int(rng.integers(1, d + 1)))]

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray:
        return np.abs(A)

    def kernel_args(self) -> dict[str, Any]:
        return {"sparsifier": "topk", "k": self.k}

    def alpha(self, n: int, d: int) -> float:
        self.check(n, d)
        return self.k / d

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return self.k


@dataclass(frozen=True)
class Identity(Sparsifier):
    """No compression: every worker sends its whole vector (GD / uncompressed MARINA).

    >>> Identity().ab_constants(4, 10), Identity().omega(4, 10)
    ((0.0, 0.0), 0.0)
    """

    capabilities = Capabilities(fixed_size=True, deterministic=True, dense=True, lossless=True)
    ab_exact = True

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray:
        return np.abs(A)

    def kernel_args(self) -> dict[str, Any]:
        return {"sparsifier": "identity"}

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        self.check(n, d)
        return (0.0, 0.0)

    def omega(self, n: int, d: int) -> float:
        self.check(n, d)
        return 0.0

    def alpha(self, n: int, d: int) -> float:
        self.check(n, d)
        return 1.0

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return d


