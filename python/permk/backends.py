"""Backends: the ``n`` workers of a problem as one process sees them, and the transport the
exchanges of :mod:`permk.exchanges` run over.

A backend evaluates the oracles of the workers it holds and moves numbers between workers; it
does no method's arithmetic:

* ``local_grads(x)``, ``grad_blocks(x)``, ``coords(x, rows, cols)`` — the held workers'
  gradients, whole, in blocks of workers (``problem.local_grad_blocks``) or at some coordinates
  (``problem.local_grad_coords``); ``kernel`` — the problem's native kernel;
* ``mean_grad(x)``, ``mean_rows(V)`` — the mean of whole per-worker vectors;
* ``plan(c, seed, round)`` — a round's shared plan (:meth:`permk.Compressor.round`);
* ``mean_values(c, r, fill)`` — a shared plan's values gathered in worker order and summed by
  the round (only values travel);
* ``mean_pairs(c, msgs)`` — messages sent as ``(index, value)`` pairs, summed in worker order;
* ``own(H)`` — per-worker rows the backend may update in place (see :mod:`permk.exchanges`);
* ``metrics(x)`` — ``‖∇f(x)‖²`` and ``f(x) − f*`` for the record (not communication).

:class:`Simulator` holds all ``n`` workers; :class:`permk.distributed.MPIBackend` holds a block
of them per process and moves the numbers with MPI. Each exchange chooses its path
(``"rust"``, ``"fused"``, ``"dense"``: :mod:`permk.exchanges`) from the capabilities of the
problem and the compressor; ``path=`` forces one (for tests).
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol, runtime_checkable

import numpy as np

from ._validate import check_choice, check_int, check_output, check_real
from .compressors import Compressor, Messages, Round
from .exchanges import PATHS, Exchange, Fill, Transport, choose_path

__all__ = ["Backend", "Simulator", "HeldWorkers", "PATHS", "check_problem"]

Array = np.ndarray

@runtime_checkable
class Backend(Transport, Protocol):
    """What a method's backend is: the transport of :mod:`permk.exchanges`, plus the record."""

    def metrics(self, x: Array) -> tuple[float, float | None]:
        """``‖∇f(x)‖²`` and ``f(x) − f*`` (None without ``f*``), not counted as communication."""
        ...


def check_problem(problem: Any, required: tuple[str, ...] = ("n", "d", "x0", "loss", "grad", "local_grads")) -> tuple[int, int]:
    """``(n, d)`` of a problem that has the attributes ``required`` (TypeError naming the first
    missing one otherwise); ``n`` and ``d`` must be positive integers (a float like 2.5 is not)."""
    missing = [a for a in required if not hasattr(problem, a)]
    if missing:
        raise TypeError(
            f"the problem must implement the Problem protocol of permk.problems (n, d, x0, loss, grad, "
            f"local_grads); it has no {', '.join(missing)}"
        )
    return check_int(problem.n, "problem.n", low=1), check_int(problem.d, "problem.d", low=1)


class Paths:
    """The path of each (exchange, compressor) pair on one backend, chosen once: the fastest
    available, or the forced one (``where`` ends the error message of an unavailable one)."""

    def __init__(self, forced: str, where: str = "") -> None:
        self.forced = check_choice(forced, "path", ("auto", *PATHS))
        self.where = where
        self._chosen: dict[tuple[int, str], tuple[Any, str]] = {}

    def __call__(self, backend: Any, exchange: Exchange, compressor: Compressor | None) -> str:
        key = (id(compressor), exchange.name)
        hit = self._chosen.get(key)
        if hit is None or hit[0] is not compressor:
            what = exchange.name if compressor is None else f"{exchange.name} with {compressor.name}"
            hit = self._chosen[key] = (compressor, choose_path(self.forced, exchange.available(backend, compressor), what + self.where))
        return hit[1]


class Owned:
    """Per-worker rows (an exchange's ``H``) a backend may update in place: the arrays it handed
    out itself (the last few); any other array is copied first, so a caller's is never modified."""

    KEEP = 4

    def __init__(self) -> None:
        self._arrays: list[Array] = []

    def __call__(self, H: Array) -> Array:
        for a in self._arrays:
            if a is H:
                return H
        H = np.array(H, dtype=np.float64, order="C")
        self._arrays = [H, *self._arrays[: self.KEEP - 1]]
        return H


class HeldWorkers:
    """What every backend shares: the held workers' oracles (``local_grads`` kept for the last
    two points, ``coords``), the problem's native ``kernel``, the path of each exchange, and
    the per-worker rows it owns. A backend sets ``n``, ``d``, ``workers``, ``problem`` and calls
    ``__init__`` with the path a run forces."""

    n: int
    d: int
    workers: range
    problem: Any

    def __init__(self, path: str, where: str = "") -> None:
        self._paths = Paths(path, where)
        self.forced = self._paths.forced
        self.own = Owned()
        self._rows: list[tuple[Array, Array]] = []  # the local gradients of the last two points

    def path(self, exchange: Exchange, compressor: Compressor | None) -> str:
        return self._paths(self, exchange, compressor)

    @property
    def kernel(self) -> Any:
        return getattr(self.problem, "kernel", None)

    @property
    def has_coords(self) -> bool:
        return hasattr(self.problem, "local_grad_coords")

    def local_grads(self, x: Array) -> Array:
        """The held workers' gradients at ``x``, shape ``(len(workers), d)`` (kept for the last
        two points)."""
        for cx, rows in self._rows:
            if cx is x:
                return rows
        rows = self._evaluate(x)
        self._rows = [(x, rows)] + self._rows[:1]
        return rows

    def grad_blocks(self, x: Array) -> Iterator[tuple[int, int, Array]]:
        """The held workers' gradients at ``x`` in blocks of consecutive workers, ``(lo, hi, G)``
        (``lo``, ``hi`` counted from the first held worker; ``G`` valid until the next block is
        drawn): the problem's ``local_grad_blocks(x)`` when it has one (never the whole
        ``(len(workers), d)`` array), else one block, :meth:`local_grads`."""
        blocks = getattr(self.problem, "local_grad_blocks", None)
        if blocks is None:
            yield 0, len(self.workers), self.local_grads(x)
            return
        at = 0
        for lo, hi, G in blocks(x):
            if lo != at or not lo < hi <= len(self.workers):
                raise ValueError(f"problem.local_grad_blocks(x) must give consecutive blocks of the {len(self.workers)} held "
                                 f"workers from 0, got ({lo}, {hi}) after {at}")
            yield lo, hi, check_output(G, (hi - lo, self.d), "problem.local_grad_blocks(x)")
            at = hi
        if at != len(self.workers):
            raise ValueError(f"problem.local_grad_blocks(x) gave the rows of {at} of the {len(self.workers)} held workers")

    def message_blocks(self, compressor: Compressor, x: Array, H: Array | None, beta: float, seed: int,
                       round: int) -> Iterator[tuple[int, int, Messages | None]] | None:
        """The held workers' messages on the inputs ``∇f_i(x) − β h_i`` (``h_i`` the rows of
        ``H``) in blocks of consecutive workers ``(lo, hi, messages)``, ``messages`` None when an
        input of the block is not finite: the problem's ``local_message_blocks`` when it has one
        (checked: consecutive blocks, one message per worker, coordinates in ``range(d)``), else
        None (the exchange then compresses :meth:`grad_blocks` itself)."""
        own = getattr(self.problem, "local_message_blocks", None)
        if own is None:
            return None
        return self._checked_messages(own(x, compressor, H, beta, start=self.workers.start, n_workers=self.n, seed=seed, round=round))

    def _checked_messages(self, blocks: Iterator[tuple[int, int, Messages | None]]) -> Iterator[tuple[int, int, Messages | None]]:
        name, at = "problem.local_message_blocks(...)", 0
        for lo, hi, msgs in blocks:
            if lo != at or not lo < hi <= len(self.workers):
                raise ValueError(f"{name} must give consecutive blocks of the {len(self.workers)} held workers from 0, "
                                 f"got ({lo}, {hi}) after {at}")
            if msgs is not None:
                off, idx, vals = (np.asarray(a) for a in msgs)
                if off.shape != (hi - lo + 1,) or idx.ndim != 1 or vals.shape != idx.shape or (off.size and (off[0] != 0 or off[-1] != idx.size)) \
                        or np.any(np.diff(off) < 0) or (idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.d)):
                    raise ValueError(f"{name} gave malformed messages for workers {lo} … {hi - 1}: offsets {off.shape}, indices "
                                     f"{idx.shape}, values {vals.shape} (one message per worker, coordinates in range({self.d}))")
            yield lo, hi, msgs
            at = hi
        if at != len(self.workers):
            raise ValueError(f"{name} gave the messages of {at} of the {len(self.workers)} held workers")

    def _evaluate(self, x: Array) -> Array:
        return check_output(self.problem.local_grads(x), (len(self.workers), self.d), "problem.local_grads(x)")

    def coords(self, x: Array, rows: Array, cols: Array) -> Array:
        return check_output(self.problem.local_grad_coords(x, rows, cols), (len(rows),), "problem.local_grad_coords(x, rows, cols)")


class Simulator(HeldWorkers):
    """All ``n`` workers of ``problem`` in this process (the single-process simulator).

    Every user oracle's answer is checked where it is used (shape and dtype; the drivers treat a
    non-finite value as divergence): a ``grad`` of the wrong shape is a ValueError naming the
    oracle and both shapes, not a silently wrong run.
    """

    def __init__(self, problem: Any, *, path: str = "auto") -> None:
        self.n, self.d = check_problem(problem)
        self.problem = problem
        self.workers = range(self.n)
        self.local = True
        super().__init__(path)
        self._grad: tuple[Array, Array] | None = None

    # -- oracles -------------------------------------------------------------------------------
    def grad(self, x: Array) -> Array:
        """``∇f(x)`` from the problem (the last one is kept: MARINA's full rounds record it too)."""
        if self._grad is not None and self._grad[0] is x:
            return self._grad[1]
        g = check_output(self.problem.grad(x), (self.d,), "problem.grad(x)")
        self._grad = (x, g)
        return g

    # -- transport -----------------------------------------------------------------------------
    def mean_grad(self, x: Array) -> Array:
        return self.grad(x)

    def mean_rows(self, rows: Array) -> Array:
        return np.asarray(rows, dtype=np.float64).mean(axis=0)

    def plan(self, compressor: Compressor, seed: int, round: int) -> Round:
        return compressor.round(self.n, self.d, seed=seed, round=round)

    def mean_values(self, compressor: Compressor, r: Round, fill: Fill) -> Array:
        return r.mean(np.asarray(fill(0, self.n, None, None), dtype=np.float64))

    def mean_pairs(self, compressor: Compressor, msgs: Messages) -> Array:
        return np.bincount(msgs.indices, weights=msgs.values, minlength=self.d) / self.n

    # -- record --------------------------------------------------------------------------------
    @property
    def f_star(self) -> float | None:
        f = getattr(self.problem, "f_star", None)
        return None if f is None else check_real(f, "problem.f_star")

    def metrics(self, x: Array) -> tuple[float, float | None]:
        with np.errstate(over="ignore", invalid="ignore"):
            g = self.grad(x)
            f_star = self.f_star
            gap = None if f_star is None else _scalar(self.problem.loss(x), "problem.loss(x)") - f_star
            return float(g @ g), gap


def _scalar(value: Any, name: str) -> float:
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf" or arr.shape not in ((), (1,)):
        raise ValueError(f"{name} returned {value!r} (shape {arr.shape}, dtype {arr.dtype}), expected a real number")
    return float(arr.reshape(()))
