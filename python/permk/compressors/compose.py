"""Composition: a sparsifier applied after a quantizer, ``C_i ∘ Q_i`` (Lemma "Composition")."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .._core import Spec
from ..testing import magnitude_bound
from .base import COMPRESSORS, Capabilities, Compressor
from .kernels import RustKernel
from .messages import Message
from .rust import Quantizer, Sparsifier, native_compress

__all__ = ["Compose"]


@dataclass(frozen=True)
class Compose(Compressor):
    """``C_i ∘ Q_i``: quantize, then sparsify (Lemma "Composition").

    If ``{C_i} ∈ U(A, B)`` and ``Q_i ∈ U(ω)`` are independent of the ``C_i``, the paper's Lemma
    "Composition" states ``{C_i ∘ Q_i} ∈ U((ω+1)A, B)``. Its proof bounds the deviation from the
    *quantized* mean ``(1/n) Σ Q_i(a_i)``; the deviation of that mean from ``ā`` adds
    ``(1 − B) E‖(1/n) Σ Q_i(a_i) − ā‖² ≤ (1 − B)(ω/n)(1/n) Σ‖a_i‖²`` (the ``Q_i`` are independent
    across workers here). So ``ab_constants`` returns ``((ω+1)A + (1−B)ω/n, B)``: the paper's
    constants when ``B = 1`` (PermK, ``d ≥ n``), and e.g. ``(((ω+1)(ω_C+1) − 1)/n, 0)`` for
    independent RandK (``A = ω_C/n, B = 0``). (For PermK with ``n = 2, d = 1``, ``A = B = 0``
    and the paper's constants would claim zero variance.)

    With a :class:`Sparsifier` both run in one Rust kernel and only the sent coordinates are
    quantized (QSGD uses the norm of the worker's whole input, as ``Q_i`` acts on it first);
    any other compressor (defined in Python, ``GroupPermK``, ``PermutationOfMappings``) is
    applied to the quantized vector ``Q_i(x)``.

    >>> import permk
    >>> Compose(permk.PermK(), permk.NaturalCompression()).ab_constants(4, 40)
    (1.125, 1.0)
    """

    sparsifier: Compressor
    quantizer: Quantizer

    def __post_init__(self) -> None:
        if not isinstance(self.quantizer, Quantizer):
            raise TypeError(f"Compose's quantizer must be a Quantizer (NaturalCompression, QSGD), got {type(self.quantizer).__name__}")
        if not isinstance(self.sparsifier, Compressor) or isinstance(self.sparsifier, (Quantizer, Compose)):
            raise TypeError(f"Compose's sparsifier must be a compressor that is not itself quantized, got {type(self.sparsifier).__name__}")

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        # the quantizer's own randomness: no shared plan, not deterministic; its size is not tunable here
        return dataclasses.replace(self.sparsifier.capabilities, shared_plan=False, deterministic=False, tunable=None)

    @cached_property
    def kernel(self) -> RustKernel | None:  # type: ignore[override]
        if isinstance(self.sparsifier, Sparsifier):
            return Spec(**self.sparsifier.kernel_args(), **self.quantizer.quantizer_args())
        return None

    @property
    def name(self) -> str:
        return f"{self.sparsifier.name}∘{self.quantizer.name}"

    @classmethod
    def default(cls, n: int, d: int) -> Compose:
        """PermK after natural compression."""
        c = COMPRESSORS.builtins()
        return cls(c["permk"](), c["naturalcompression"]())

    @classmethod
    def examples(cls, n: int, d: int, rng: np.random.Generator | None = None) -> list[Compressor]:
        """The package's sparsifiers (from its catalog) after its quantizers."""
        c = COMPRESSORS.builtins()
        permk, randk, blockpermk, topk = c["permk"], c["randk"], c["blockpermk"], c["topk"]
        natural, qsgd = c["naturalcompression"], c["qsgd"]
        if rng is None:
            return [cls(permk(), natural()), cls(randk(max(1, d // 2)), qsgd(2)),
                    cls(blockpermk(min(n, d, 2)), qsgd(5)), cls(topk(max(1, d // 2)), natural())]
        return [cls(permk(), natural()), cls(randk(int(rng.integers(1, d + 1))), qsgd(int(rng.integers(1, 5))))]

    def check(self, n: int, d: int) -> None:
        if self.kernel is not None:
            super().check(n, d)
            self.kernel.check(n, d)
        else:
            self.sparsifier.check(n, d)

    def ab_constants(self, n: int, d: int) -> tuple[float, float] | None:
        ab = self.sparsifier.ab_constants(n, d)
        if ab is None:
            return None
        a, b = ab
        w = self.quantizer.omega(n, d)
        return ((w + 1.0) * a + max(0.0, 1.0 - b) * w / n, b)

    def omega(self, n: int, d: int) -> float | None:
        w = self.sparsifier.omega(n, d)
        if w is None:
            return None
        return (w + 1.0) * (self.quantizer.omega(n, d) + 1.0) - 1.0

    def floats_per_worker(self, n: int, d: int) -> int:
        return self.sparsifier.floats_per_worker(n, d)

    def expected_floats_per_worker(self, n: int, d: int) -> float:
        return self.sparsifier.expected_floats_per_worker(n, d)

    def value_bits(self, float_bits: int = 32) -> int:
        return self.quantizer.value_bits(float_bits)

    def overhead_bits(self, float_bits: int = 32) -> int:
        return self.quantizer.overhead_bits(float_bits)

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray | None:
        quantized = magnitude_bound(self.quantizer, A)
        return None if quantized is None else magnitude_bound(self.sparsifier, quantized)

    # the calls: one Rust kernel for a Sparsifier, else the sparsifier on Q_i(x)
    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> Message:
        if self.kernel is not None:
            return native_compress(self.kernel, x, worker=worker, n_workers=n_workers, seed=seed, round=round)
        q = self.quantizer.checked_compress(x, worker=worker, n_workers=n_workers, seed=seed, round=round)
        return self.sparsifier.checked_compress(q.to_dense(), worker=worker, n_workers=n_workers, seed=seed, round=round)


