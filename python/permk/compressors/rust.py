"""The compressors whose kernels are the Rust core's: :class:`RustCompressor` (a kernel named
by its arguments) and :class:`Sparsifier` (a kernel that selects and scales coordinates, the
part of :class:`~permk.compressors.Compose` that follows a quantizer in the same kernel)."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .._core import Spec
from .._validate import as_float_array, check_int, check_seed
from .base import Capabilities, Compressor, Message, PendingRound, Plan, Round

__all__ = ["RustCompressor", "Sparsifier"]


@dataclass(frozen=True)
class RustCompressor(Compressor):
    """A compressor whose kernels are the Rust core's (``permk._core.Spec``): a subclass names
    its kernel and parameters in :meth:`kernel_args` (``docs/extending.md``), and its
    :attr:`capabilities` (a shared plan only where it says so: its kernel decides)."""

    capabilities = Capabilities()

    @abc.abstractmethod
    def kernel_args(self) -> dict[str, Any]:
        """The arguments of ``permk._core.Spec``: ``{"sparsifier": name, **params}`` (and
        ``"quantizer"``)."""

    @cached_property
    def kernel(self) -> Spec:  # type: ignore[override]
        return Spec(**self.kernel_args())

    def check(self, n: int, d: int) -> None:
        super().check(n, d)
        self.kernel.check(n, d)

    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> Message:
        x = as_float_array(x, 1, "x")
        n = check_int(n_workers, "n_workers", low=1)
        w = check_int(worker, "worker", high=n)
        idx, val = self.kernel.compress(x, w, n, check_seed(seed), check_int(round, "round"))
        return Message(worker=w, n_workers=n, d=x.shape[0], indices=idx, values=val)

    def plan(self, n: int, d: int, *, seed: int, round: int) -> Plan | None:
        if not self.capabilities.shared_plan:
            return None
        self.check(n, d)
        return Plan(*self.kernel.plan(n, d, check_seed(seed), check_int(round, "round")), disjoint=self.disjoint(n, d))

    def round(self, n: int, d: int, *, seed: int, round: int) -> Round:
        self.check(n, d)
        if not self.capabilities.shared_plan:
            raise ValueError(f"{self.name} has no shared plan (capabilities.shared_plan is False)")
        return self.kernel.round(n, d, check_seed(seed), check_int(round, "round"))  # type: ignore[no-any-return]

    def round_ahead(self, n: int, d: int, *, seed: int, round: int) -> PendingRound:
        self.check(n, d)
        if not self.capabilities.shared_plan:
            raise ValueError(f"{self.name} has no shared plan (capabilities.shared_plan is False)")
        return self.kernel.round_ahead(n, d, check_seed(seed), check_int(round, "round"))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Sparsifier(RustCompressor):
    """A Rust-kernel compressor that selects and scales coordinates (PermK, RandK, TopK,
    Identity, BlockPermK, CoordinateSampling): the part of :class:`Compose` that follows a
    quantizer in the same Rust kernel."""


