"""The kernels that run a compressor's bulk calls: :class:`Kernel`, the protocol, and its two
Python implementations.

Every compressor runs ``compress_all``, ``compress_rows``, ``compress_shifted_rows``,
``aggregate``, ``round`` and ``round_ahead`` on one :class:`Kernel`, chosen once
(:attr:`permk.Compressor.bulk_kernel`):

1. its native kernel, a ``permk._core.Spec`` (the built-in compressors: Rust);
2. else, with a shared plan, a :class:`PlanKernel` over its checked ``plan``;
3. else a :class:`WorkerKernel` over its checked ``compress``, worker by worker.

The three give the same bits for the same compressor: the values ``scale_i · x_j`` computed in
float64 and rounded once to the input's dtype, messages in worker order, aggregates summed in
worker order from zero and divided by ``n``. The arguments reach a kernel checked (by
:class:`permk.Compressor`), positionally, as ``permk._core.Spec`` takes them.
"""

from __future__ import annotations

import abc
from typing import Callable, Protocol, runtime_checkable

import numpy as np

from .._core import Spec
from .._validate import all_finite, as_float_array
from .messages import Message, PendingRound, Plan, PlanRound, ReadyRound, Round, aggregate_messages, scaled

__all__ = ["Kernel", "RustKernel", "PlanKernel", "WorkerKernel"]

#: The Rust core's kernel of a built-in compressor (``permk._core.Spec``, made from the
#: compressor's :meth:`~permk.RustCompressor.kernel_args`): :attr:`permk.Compressor.kernel`. It
#: implements :class:`Kernel` natively, and the exchanges' ``"rust"`` path hands it to a
#: problem's native kernel.
RustKernel = Spec

#: ``(offsets, indices, values)`` of a block of workers' messages (:class:`permk.Messages`).
MessageArrays = tuple[np.ndarray, np.ndarray, np.ndarray]


@runtime_checkable
class Kernel(Protocol):
    """The bulk calls of a compressor, on checked arguments (``a``: a 2-D float array; ``seed``,
    ``round``, ``start``, ``n_workers``: checked integers). ``permk._core.Spec`` implements it
    natively; :class:`PlanKernel` and :class:`WorkerKernel` in Python."""

    def compress_all(self, a: np.ndarray, seed: int, round: int, /) -> np.ndarray:
        """The ``(n, d)`` array of compressed rows ``C_i(a[i])``."""
    def compress_rows(self, a: np.ndarray, start: int, n_workers: int, seed: int, round: int, /) -> MessageArrays:
        """The messages of workers ``start … start + m − 1`` (the rows of ``a``)."""
    def compress_shifted_rows(self, G: np.ndarray, H: np.ndarray | None, beta: float, start: int, n_workers: int,
                              seed: int, round: int, rows: np.ndarray | None = None, /) -> MessageArrays | None:
        """:meth:`compress_rows` of ``G[rows] − β·H``, or None when an input is not finite."""
    def aggregate(self, a: np.ndarray, seed: int, round: int, /) -> np.ndarray:
        """``(1/n) Σ_i C_i(a[i])``, summed in worker order and divided by ``n``."""
    def round(self, n: int, d: int, seed: int, round: int, /) -> Round:
        """The round's shared plan, computed once."""
    def round_ahead(self, n: int, d: int, seed: int, round: int, /) -> PendingRound:
        """:meth:`round`, started now, taken with ``wait()``."""


class _PythonKernel(abc.ABC):
    """What the two Python kernels share: the shifted inputs formed as one array, a round
    computed at once, and the checks the native kernel makes itself. ``name``: the
    compressor's, for the errors."""

    def __init__(self, name: str) -> None:
        self.name = name

    @abc.abstractmethod
    def compress_rows(self, a: np.ndarray, start: int, n_workers: int, seed: int, round: int, /) -> MessageArrays: ...

    @abc.abstractmethod
    def round(self, n: int, d: int, seed: int, round: int, /) -> Round: ...

    def compress_shifted_rows(self, G: np.ndarray, H: np.ndarray | None, beta: float, start: int, n_workers: int,
                              seed: int, round: int, rows: np.ndarray | None = None, /) -> MessageArrays | None:
        if rows is not None:
            G = G[rows]
        with np.errstate(invalid="ignore", over="ignore"):
            V = G if H is None else G - (H if beta == 1.0 else H * beta)
        if not all_finite(V):
            return None
        return self.compress_rows(as_float_array(V, 2, "A"), start, n_workers, seed, round)

    def round_ahead(self, n: int, d: int, seed: int, round: int, /) -> PendingRound:
        return ReadyRound(self.round(n, d, seed, round))

    def _check_rows(self, a: np.ndarray, start: int, n_workers: int) -> None:
        if start + a.shape[0] > n_workers:
            raise ValueError(f"A holds {a.shape[0]} rows from worker {start}: more than the {n_workers} workers")


class PlanKernel(_PythonKernel):
    """A compressor with a shared plan, run from ``plan(n, d, *, seed, round)`` (a checked
    :class:`permk.Plan`): the sent values ``scale_i · a_ij`` gathered at the plan's coordinates."""

    def __init__(self, plan: Callable[..., Plan], name: str) -> None:
        super().__init__(name)
        self.plan = plan

    def _planned(self, a: np.ndarray, start: int, n: int, seed: int, round: int) -> tuple[Plan, np.ndarray, np.ndarray]:
        """The plan, and the sent values of workers ``start …`` (the rows of ``a``) with their
        rows in ``a``, in worker order."""
        m, d = a.shape
        plan = self.plan(n, d, seed=seed, round=round)
        lo, hi = int(plan.offsets[start]), int(plan.offsets[start + m])
        rows = np.repeat(np.arange(m), np.diff(plan.offsets[start : start + m + 1]))
        vals = scaled(a[rows, plan.coords[lo:hi]], plan.scales[start + rows])
        if not np.isfinite(vals).all():
            raise ValueError(f"non-finite value (NaN or inf) in the input or the compressed output (overflow) of {self.name}")
        return plan, rows, vals

    def compress_all(self, a: np.ndarray, seed: int, round: int, /) -> np.ndarray:
        n, d = a.shape
        plan, rows, vals = self._planned(a, 0, n, seed, round)
        out = np.zeros((n, d), dtype=a.dtype)
        out[rows, plan.coords] = vals
        return out

    def compress_rows(self, a: np.ndarray, start: int, n_workers: int, seed: int, round: int, /) -> MessageArrays:
        self._check_rows(a, start, n_workers)
        plan, _, vals = self._planned(a, start, n_workers, seed, round)
        offsets = plan.offsets[start : start + a.shape[0] + 1]
        return offsets - offsets[0], plan.coords[offsets[0] : offsets[-1]].copy(), vals

    def aggregate(self, a: np.ndarray, seed: int, round: int, /) -> np.ndarray:
        n, d = a.shape
        plan, _, vals = self._planned(a, 0, n, seed, round)
        if a.dtype == np.float32:  # sums in float32, in worker order, as aggregate_messages does
            acc32 = np.zeros(d, dtype=np.float32)
            for w in range(n):
                sl = slice(plan.offsets[w], plan.offsets[w + 1])
                acc32[plan.coords[sl]] += vals[sl]
            return acc32 / np.float32(n)
        return np.bincount(plan.coords, weights=vals.astype(np.float64), minlength=d) / n

    def round(self, n: int, d: int, seed: int, round: int, /) -> Round:
        return PlanRound(self.plan(n, d, seed=seed, round=round), d)


class WorkerKernel(_PythonKernel):
    """A compressor without a shared plan, run from ``compress(x, *, worker, n_workers, seed,
    round)`` (a checked :class:`permk.Message`) worker by worker."""

    def __init__(self, compress: Callable[..., Message], name: str) -> None:
        super().__init__(name)
        self.compress = compress

    def _messages(self, a: np.ndarray, start: int, n: int, seed: int, round: int) -> list[Message]:
        return [self.compress(a[j], worker=start + j, n_workers=n, seed=seed, round=round) for j in range(a.shape[0])]

    def compress_all(self, a: np.ndarray, seed: int, round: int, /) -> np.ndarray:
        return np.stack([m.to_dense() for m in self._messages(a, 0, a.shape[0], seed, round)])

    def compress_rows(self, a: np.ndarray, start: int, n_workers: int, seed: int, round: int, /) -> MessageArrays:
        self._check_rows(a, start, n_workers)
        msgs = self._messages(a, start, n_workers, seed, round)
        offsets = np.concatenate([[0], np.cumsum([len(m.indices) for m in msgs])]).astype(np.int64)
        if not msgs:
            return offsets, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=a.dtype)
        return offsets, np.concatenate([m.indices for m in msgs]).astype(np.int64), np.concatenate([m.values for m in msgs])

    def aggregate(self, a: np.ndarray, seed: int, round: int, /) -> np.ndarray:
        return aggregate_messages(self._messages(a, 0, a.shape[0], seed, round))

    def round(self, n: int, d: int, seed: int, round: int, /) -> Round:
        raise ValueError(f"{self.name} has no shared plan (capabilities.shared_plan is False)")

