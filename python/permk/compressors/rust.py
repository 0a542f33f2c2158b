"""The compressors whose kernels are the Rust core's: :class:`RustCompressor` (a kernel named
by its arguments), and its two kinds that :class:`~permk.compressors.Compose` joins in one
kernel: :class:`Sparsifier` (selects and scales coordinates) after :class:`Quantizer` (an
unbiased quantizer)."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .._core import Spec
from .._validate import as_float_array, check_int, check_seed
from .base import Capabilities, Compressor
from .kernels import RustKernel
from .messages import Message, Plan

__all__ = ["RustCompressor", "Sparsifier", "Quantizer", "native_compress"]


def native_compress(kernel: RustKernel, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> Message:
    """Worker ``worker``'s message from the native ``kernel``, its arguments checked."""
    x = as_float_array(x, 1, "x")
    n = check_int(n_workers, "n_workers", low=1)
    w = check_int(worker, "worker", high=n)
    idx, val = kernel.compress(x, w, n, check_seed(seed), check_int(round, "round"))
    return Message(worker=w, n_workers=n, d=x.shape[0], indices=idx, values=val)


@dataclass(frozen=True)
class RustCompressor(Compressor):
    """A compressor whose kernels are the Rust core's (a
    :class:`~permk.compressors.kernels.RustKernel`): a subclass names its kernel and parameters
    in :meth:`~permk.RustCompressor.kernel_args` (``docs/extending.md``), and its
    :attr:`~permk.Compressor.capabilities` (a shared plan only where it says so: its kernel
    decides). Every bulk call and its round run in that kernel."""

    capabilities = Capabilities()

    @abc.abstractmethod
    def kernel_args(self) -> dict[str, Any]:
        """The arguments of the :class:`~permk.compressors.kernels.RustKernel`:
        ``{"sparsifier": name, **params}`` (and ``"quantizer"``)."""

    @cached_property
    def kernel(self) -> RustKernel:  # type: ignore[override]
        return Spec(**self.kernel_args())

    def check(self, n: int, d: int) -> None:
        super().check(n, d)
        self.kernel.check(n, d)

    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> Message:
        return native_compress(self.kernel, x, worker=worker, n_workers=n_workers, seed=seed, round=round)

    def plan(self, n: int, d: int, *, seed: int, round: int) -> Plan | None:
        if not self.capabilities.shared_plan:
            return None
        self.check(n, d)
        return Plan(*self.kernel.plan(n, d, check_seed(seed), check_int(round, "round")))


@dataclass(frozen=True)
class Sparsifier(RustCompressor):
    """A Rust-kernel compressor that selects and scales coordinates (PermK, RandK, TopK,
    Identity, BlockPermK, CoordinateSampling): the part of a :class:`~permk.Compose` that
    follows a quantizer in the same Rust kernel."""


@dataclass(frozen=True)
class Quantizer(RustCompressor):
    """An unbiased quantizer ``Q ∈ U(ω)``: used alone (independently by every worker, so
    ``(A, B) = (ω/n, 0)``) or inside a :class:`~permk.Compose`; a subclass names its kernel in
    :meth:`~permk.Quantizer.quantizer_args`."""

    capabilities = Capabilities(fixed_size=True, dense=True)

    @abc.abstractmethod
    def quantizer_args(self) -> dict[str, Any]:
        """``{"quantizer": name, **params}`` of the
        :class:`~permk.compressors.kernels.RustKernel`."""

    def kernel_args(self) -> dict[str, Any]:
        return {"sparsifier": "identity", **self.quantizer_args()}

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        return (self.omega(n, d) / n, 0.0)

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return d

    @abc.abstractmethod
    def omega(self, n: int, d: int) -> float: ...
