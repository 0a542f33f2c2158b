"""What the workers send, and the plans they send it by: the data types of the compressors.

:class:`Message` (one worker's message) and :class:`Messages` (a block of workers' messages);
:class:`Plan` (every worker's coordinates and scale in one round, what a shared-plan compressor
computes from ``(seed, round)``) and :class:`Round` (a round's plan computed once for all its
exchanges: the native ``permk._core.Round``, or :class:`PlanRound` over a :class:`Plan`);
:func:`aggregate_messages`, the server's average. :func:`check_plan` and :func:`check_message`
check a compressor's answer where it is used, naming the compressor.

A round is **disjoint** when no coordinate is sent by two workers: its aggregate is then placed,
not summed (the same bits), and on MPI each worker's values land in place. That is a fact of the
round's coordinates, and it is defined here once: :attr:`Round.disjoint`, which the native round
computes and :class:`PlanRound` reads from :attr:`Plan.disjoint` — computed from the plan's
coordinates, never declared (a declaration could contradict them).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple, Protocol, Sequence, runtime_checkable

import numpy as np

from .._validate import as_float_array, check_int, check_items

__all__ = ["Message", "Messages", "Plan", "Ranges", "Round", "PendingRound", "PlanRound", "ReadyRound",
           "aggregate_messages", "check_message", "check_plan", "scaled"]


@dataclass(frozen=True, eq=False)
class Message:
    """What one worker sends in one round: ``values`` at coordinates ``indices`` of ``R^d``.

    For PermK and RandK the indices are a function of ``(seed, round, worker)`` that the
    receiver recomputes, so they are not transmitted (see :meth:`permk.Compressor.bits_per_worker`).
    Indices are checked: integers in ``[0, d)``, as many as values. Messages compare by value.
    """

    worker: int
    n_workers: int
    d: int
    indices: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        n = check_int(self.n_workers, "n_workers", low=1)
        check_int(self.worker, "worker", high=n)
        d = check_int(self.d, "d", low=1)
        idx = np.asarray(self.indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise TypeError(f"indices must be a 1-D integer array, got dtype {idx.dtype} and shape {idx.shape}")
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= d):
            raise ValueError(f"indices must lie in [0, d) = [0, {d}), got values in [{int(idx.min())}, {int(idx.max())}]")
        vals = np.asarray(self.values)
        if vals.shape != idx.shape:
            raise ValueError(f"values must have the shape of indices {idx.shape}, got {vals.shape}")
        object.__setattr__(self, "indices", idx.astype(np.int64, copy=False))
        object.__setattr__(self, "values", vals)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (self.worker, self.n_workers, self.d) == (other.worker, other.n_workers, other.d) and bool(
            np.array_equal(self.indices, other.indices) and np.array_equal(self.values, other.values)
        )

    __hash__ = None  # type: ignore[assignment]

    def to_dense(self) -> np.ndarray:
        """The message as a vector of ``R^d`` (``C_i(x)``)."""
        out = np.zeros(self.d, dtype=self.values.dtype)
        out[self.indices] = self.values
        return out


class Messages(NamedTuple):
    """The messages of a block of workers, in worker order (CSR): worker ``start + j`` sends
    ``values[offsets[j]:offsets[j+1]]`` at ``indices[offsets[j]:offsets[j+1]]``."""

    offsets: np.ndarray
    indices: np.ndarray
    values: np.ndarray

    def dense(self, d: int) -> np.ndarray:
        """The compressed rows as an ``(m, d)`` array."""
        m = len(self.offsets) - 1
        out = np.zeros((m, d), dtype=self.values.dtype if self.values.size else np.float64)
        rows = np.repeat(np.arange(m), np.diff(self.offsets))
        out[rows, self.indices] = self.values
        return out


class Plan(NamedTuple):
    """The coordinates every worker sends in one round (CSR): worker ``i`` sends
    ``coords[offsets[i]:offsets[i+1]]``, each value multiplied by ``scales[i]``."""

    offsets: np.ndarray
    coords: np.ndarray
    scales: np.ndarray

    def worker(self, i: int) -> np.ndarray:
        """The coordinates worker ``i`` sends."""
        return self.coords[self.offsets[i] : self.offsets[i + 1]]

    @property
    def disjoint(self) -> bool:
        """Whether no coordinate is sent by two workers (see the module docstring), computed
        from :attr:`coords` in ``O(len(coords) + max(coords))``."""
        c = np.asarray(self.coords)
        return c.size == 0 or bool(int(c.min()) >= 0 and int(np.bincount(c.astype(np.int64, copy=False)).max()) <= 1)


def check_plan(p: Any, n: int, d: int, who: str) -> Plan:
    """``p``, the answer of ``who``'s ``plan(n, d, ...)``, as a checked :class:`Plan` (TypeError
    unless it is one) of ``n`` workers with integer coordinates in ``[0, d)`` and ``n`` finite
    scales (ValueError naming ``who`` and the field otherwise)."""
    if p is None:
        raise ValueError(f"{who} has no shared plan (capabilities.shared_plan is False, or its plan() returned None)")
    if not isinstance(p, Plan):
        raise TypeError(f"{who}.plan must return a permk.Plan, got {type(p).__name__}")
    offsets, coords, scales = np.asarray(p.offsets), np.asarray(p.coords), np.asarray(p.scales, dtype=np.float64)
    if offsets.shape != (n + 1,) or offsets.dtype.kind not in "iu" or offsets[0] != 0 or (np.diff(offsets) < 0).any():
        raise ValueError(f"{who}.plan returned offsets that are not {n + 1} non-decreasing integers from 0: {offsets!r}")
    if coords.ndim != 1 or (coords.size and coords.dtype.kind not in "iu") or len(coords) != int(offsets[-1]):
        raise ValueError(f"{who}.plan returned coords that are not {int(offsets[-1])} integers (offsets[-1])")
    if coords.size and (int(coords.min()) < 0 or int(coords.max()) >= d):
        raise ValueError(f"{who}.plan returned coords outside [0, d) = [0, {d})")
    if scales.shape != (n,) or not np.isfinite(scales).all():
        raise ValueError(f"{who}.plan returned scales that are not {n} finite numbers: shape {scales.shape}")
    return Plan(offsets.astype(np.int64, copy=False), coords.astype(np.int64, copy=False), scales)


def check_message(m: Any, worker: int, n_workers: int, d: int, who: str) -> Message:
    """``m``, the answer of ``who``'s ``compress`` for ``worker`` of ``n_workers`` in dimension
    ``d``: a :class:`Message` (TypeError otherwise) of that worker, count and dimension with
    real values (ValueError naming ``who`` and the field otherwise; the indices are checked by
    :class:`Message` itself)."""
    if not isinstance(m, Message):
        raise TypeError(f"{who}.compress must return a permk.Message, got {type(m).__name__}")
    for field_, got, want in (("worker", m.worker, worker), ("n_workers", m.n_workers, n_workers), ("d", m.d, d)):
        if got != want:
            raise ValueError(f"{who}.compress returned a Message with {field_}={got!r}, expected {want!r}")
    if m.values.dtype.kind not in "biuf":
        raise TypeError(f"{who}.compress returned a Message whose values have dtype {m.values.dtype}, expected real numbers")
    return m


class Ranges(NamedTuple):
    """A plan whose workers send one contiguous range each (:meth:`Round.ranges`): worker ``i``
    sends coordinates ``starts[i]:stops[i]`` (none when equal), each value multiplied by
    ``scales[i]``."""

    starts: np.ndarray
    stops: np.ndarray
    scales: np.ndarray


@runtime_checkable
class Round(Protocol):
    """One round's shared plan, computed once and used by every exchange of the round
    (:meth:`permk.Compressor.round`): what the native ``permk._core.Round`` is, and what
    :class:`PlanRound` gives a Python compressor from its ``plan``.

    Worker ``i``'s values are entries ``offsets()[i]:offsets()[i+1]`` of the round's values
    concatenated in worker order, at its coordinates in plan order, each multiplied by
    ``scales()[i]``."""

    @property
    def n(self) -> int:
        """The number of workers."""
    @property
    def d(self) -> int:
        """The dimension."""
    @property
    def disjoint(self) -> bool:
        """No coordinate is sent by two workers this round (the module docstring)."""
    def offsets(self) -> np.ndarray:
        """The ``n + 1`` offsets of the workers' values in the round's values (``int64``)."""
    def scales(self) -> np.ndarray:
        """Each worker's scale (``n`` floats)."""
    def coords(self, start: int, stop: int) -> np.ndarray:
        """The coordinates workers ``start … stop − 1`` send, in plan order."""
    def rows(self, start: int, stop: int) -> np.ndarray:
        """The worker of each value of workers ``start … stop − 1`` (parallel to :meth:`coords`)."""
    def ranges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(starts, stops, scales)`` when every worker sends one contiguous range of
        coordinates (BlockPermK, PermK with ``n > d``; computed in ``O(n)``), else None."""
    def gather(self, a: np.ndarray, start: int, *, divide: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """The values of workers ``start … start + len(a) − 1``, read from their rows of ``a``
        (one row per worker, ``d`` columns) at their coordinates and scaled, in plan order;
        ``divide=k`` divides each by ``k`` (as ``(v + 0) / k``); ``out`` is written and returned."""
    def mean(self, values: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
        """The average ``(1/n) Σ_i C_i`` in ``R^d`` of the round's values (all workers', in plan
        order), summed in worker order; ``out`` is written and returned."""


class PendingRound(Protocol):
    """A round being computed ahead (:meth:`permk.Compressor.round_ahead`); ``wait()`` returns it."""

    def wait(self) -> Round: ...


class PlanRound:
    """:class:`Round` over an explicit :class:`Plan` (the plan of a Python compressor), with
    the native round's arithmetic: values ``scale_i * a_ij`` rounded once, summed in worker
    order into zeros (a disjoint plan: placed), then divided by ``n``."""

    def __init__(self, plan: Plan, d: int) -> None:
        self.plan, self.n, self.d = plan, len(plan.offsets) - 1, int(d)

    @cached_property
    def disjoint(self) -> bool:
        """:attr:`Plan.disjoint` of the round's plan (computed once)."""
        return self.plan.disjoint

    def _span(self, start: int, stop: int) -> tuple[int, int]:
        start, stop = check_int(start, "start", low=0, high=self.n + 1), check_int(stop, "stop", low=0, high=self.n + 1)
        if start > stop:
            raise ValueError(f"start ({start}) must not exceed stop ({stop})")
        return start, stop

    def offsets(self) -> np.ndarray:
        return self.plan.offsets

    def scales(self) -> np.ndarray:
        return self.plan.scales

    def coords(self, start: int, stop: int) -> np.ndarray:
        start, stop = self._span(start, stop)
        return self.plan.coords[self.plan.offsets[start] : self.plan.offsets[stop]]

    def rows(self, start: int, stop: int) -> np.ndarray:
        start, stop = self._span(start, stop)
        return np.repeat(np.arange(start, stop, dtype=np.int64), np.diff(self.plan.offsets[start : stop + 1]))

    def ranges(self) -> None:
        return None

    @staticmethod
    def _check_out(out: np.ndarray, size: int, dtype: np.dtype[Any], *inputs: np.ndarray) -> None:
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out: must be a numpy array, got {type(out).__name__}")
        if out.shape != (size,) or out.dtype != dtype or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"out: must be a writeable C-contiguous {dtype} array of shape ({size},), got {out.dtype} {out.shape}")
        if any(np.may_share_memory(out, a) for a in inputs):
            raise ValueError("out: must not share memory with the inputs")

    def gather(self, a: np.ndarray, start: int, *, divide: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
        a = as_float_array(a, 2, "a", allow_empty=True)
        m = a.shape[0]
        start, stop = self._span(start, start + m)
        if a.shape[1] != self.d:
            raise ValueError(f"a must have {self.d} columns, got shape {a.shape}")
        if divide is not None:
            divide = check_int(divide, "divide", low=1, high=2**53 + 1)
        rows = self.rows(start, stop)
        if out is not None:
            self._check_out(out, len(rows), a.dtype, a)
        vals = scaled(a[rows - start, self.coords(start, stop)], self.plan.scales[rows])
        if divide is not None:  # the worker-order sum's term 0 + v, divided by n
            vals += 0.0
            vals /= a.dtype.type(divide)
        if out is None:
            return vals
        out[...] = vals
        return out

    def mean(self, values: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (int(self.plan.offsets[-1]),):
            raise ValueError(f"values must hold the {int(self.plan.offsets[-1])} values of the round, got shape {values.shape}")
        if out is not None:
            self._check_out(out, self.d, np.dtype(np.float64), values)
        if self.disjoint:  # one term per coordinate: 0.0 + v, as the worker-order sum computes it
            agg = np.zeros(self.d) if out is None else out
            agg.fill(0.0)
            agg[self.plan.coords] = values + 0.0
            agg /= self.n
            return agg
        total = np.bincount(self.plan.coords, weights=values, minlength=self.d)
        if out is None:
            return total / self.n
        np.divide(total, self.n, out=out)
        return out


class ReadyRound:
    """A round computed at once: the :class:`PendingRound` of a round that is not computed on a
    background thread; ``wait()`` returns it, once."""

    def __init__(self, r: Round) -> None:
        self._round: Round | None = r

    def wait(self) -> Round:
        if self._round is None:
            raise ValueError("wait: this round was already taken")
        r, self._round = self._round, None
        return r


def aggregate_messages(messages: Sequence[Message]) -> np.ndarray:
    """The server's average ``(1/n) Σ_i C_i(a_i)`` from all ``n`` workers' messages.

    Summed in worker order, then divided by ``n``: bit for bit what
    every compressor's ``aggregate`` returns. Refused: ``messages`` that is not a sequence of
    :class:`Message` (TypeError naming it or the entry), an empty one, or one without exactly one
    message of each worker, all of the same ``n`` and ``d`` (ValueError).
    """
    messages = check_items(messages, Message, "messages", "permk.Message")
    if not messages:
        raise ValueError("messages must not be empty")
    n, d = messages[0].n_workers, messages[0].d
    ordered = sorted(messages, key=lambda m: m.worker)
    if [m.worker for m in ordered] != list(range(n)) or any(m.d != d or m.n_workers != n for m in ordered):
        raise ValueError(f"need exactly one message from each of the {n} workers, all with the same d")
    acc = np.zeros(d, dtype=np.result_type(*[m.values.dtype for m in ordered]))
    for m in ordered:
        acc += m.to_dense()
    return acc / acc.dtype.type(n)


def scaled(x: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``scale · x`` computed in float64 and rounded once to ``x``'s dtype (as the Rust kernels do)."""
    return (x.astype(np.float64) * scales).astype(x.dtype)


