"""What a transport is: the ``n`` workers of a problem as one process sees them, and how
numbers move between them.

A transport evaluates the oracles of the workers it holds and moves numbers between workers;
it does no method's arithmetic (that is :mod:`permk.exchanges`, written once for every
transport):

* ``local_grads(x)``, ``local_grads_rows(x, rows)``, ``grad_blocks(x)``, ``coords(x, rows,
  cols)``, ``message_blocks(...)`` — the held workers' gradients, whole, of some of them (a
  round's participants), in blocks of workers (``problem.local_grad_blocks``), at some
  coordinates (``problem.local_grad_coords``), or compressed by the problem itself
  (``problem.local_message_blocks``); ``kernel`` — the problem's :class:`NativeKernel`;
* ``mean_grad(x)``, ``mean_rows(V)`` — the mean of whole per-worker vectors;
* ``plan(c, seed, round)`` — a round's shared plan (:meth:`permk.Compressor.round`);
* ``mean_values(c, r, fill)`` — a shared plan's values gathered in worker order and summed by
  the round (only values travel);
* ``mean_pairs(c, msgs)`` — messages sent as ``(index, value)`` pairs, summed in worker order;
* ``own(H)`` — per-worker rows the transport may update in place (see :mod:`permk.exchanges`);
* ``metrics(x)`` — ``‖∇f(x)‖²`` and ``f(x) − f*`` for the record (not communication).

:class:`permk.transport.Simulator` holds all ``n`` workers in one process;
:class:`permk.transport.mpi.MPIBackend` holds a block of them per process and moves the numbers
with MPI. :class:`HeldWorkers` is what both share: the held workers' oracles, checked.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol, runtime_checkable

import numpy as np

from .._validate import all_finite, check_choice, check_int, check_output
from ..compressors import Compressor, Messages, Round

__all__ = ["Fill", "NativeKernel", "Transport", "Backend", "HeldWorkers", "PATHS", "check_problem"]

Array = np.ndarray
#: Evaluation paths of the compressed exchanges, fastest first (:mod:`permk.exchanges`).
PATHS = ("rust", "fused", "dense")
#: ``fill(start, stop, divide, out)``: workers ``start..stop``'s values of a round in plan order
#: (each ``(v + 0)/divide`` when ``divide`` is given), written into ``out`` when given.
Fill = Callable[[int, int, "int | None", "Array | None"], Array]


@runtime_checkable
class NativeKernel(Protocol):
    """A problem's native (Rust) kernel of its oracles and of the compressed exchanges'
    arithmetic (``permk._core.Tridiagonal``, the synthetic quadratic's): what the exchanges'
    ``"rust"`` path calls. ``spec`` is a compressor's native kernel (``Compressor.kernel``).
    A kernel may have more, found by name: ``local_grads_rows`` (some workers' gradients) and
    ``dasha_pp_values`` (DASHA-PP's round: :func:`permk.dasha` with ``participation``)."""

    def local_grads(self, x: Array, start: int = 0, stop: int | None = None) -> Array: ...
    def round_values(self, round: Any, x: Array, y: Array | None, start: int, stop: int, *,
                     divide: int | None = None, out: Array | None = None) -> Array: ...
    def compressed_mean_diff(self, spec: Any, x_new: Array, x_old: Array, seed: int, round: int) -> Array: ...
    def error_feedback(self, spec: Any, x: Array, G: Array, seed: int, round: int,
                       start: int = 0) -> tuple[Array, Array, Array, bool]: ...


@runtime_checkable
class Transport(Protocol):
    """What an exchange needs of a transport: the held workers' oracles, and moving numbers.

    ``n``, ``d``, ``workers`` (the held workers, a contiguous range), ``forced`` (the path a
    run forces, or ``"auto"``), ``local`` (True when nothing travels: one process holds every
    worker and counts no bytes), ``kernel`` (the problem's native kernel or None),
    ``has_coords`` (the problem has ``local_grad_coords``), ``paths`` (the exchanges' chosen
    paths, kept by :mod:`permk.exchanges`), ``where`` (ends the message of a path that is not
    available: ``""`` or, e.g., ``" on torch.distributed"``). The array operations
    (:meth:`rows_of`, :meth:`all_finite`, :meth:`add_at`) are numpy's in
    :class:`HeldWorkers`; a transport of other arrays (the DDP transport's tensors) gives its own."""

    n: int
    d: int
    workers: range
    forced: str
    local: bool
    paths: dict[Any, Any]
    where: str

    @property
    def kernel(self) -> NativeKernel | None: ...
    @property
    def has_coords(self) -> bool: ...
    def local_grads(self, x: Array) -> Array: ...
    def local_grads_rows(self, x: Array, rows: Array) -> Array: ...
    def local_grads_rows_pair(self, x: Array, y: Array, rows: Array) -> tuple[Array, Array]: ...
    def grad_blocks(self, x: Array) -> Iterator[tuple[int, int, Array]]: ...
    def message_blocks(self, compressor: Compressor, x: Array, H: Array | None, beta: float, seed: int,
                       round: int) -> Iterator[tuple[int, int, Messages | None]] | None: ...
    def coords(self, x: Array, rows: Array, cols: Array) -> Array: ...
    def mean_grad(self, x: Array) -> Array: ...
    def mean_rows(self, rows: Array) -> Array: ...
    def plan(self, compressor: Compressor, seed: int, round: int) -> Round: ...
    def mean_values(self, compressor: Compressor, r: Round, fill: Fill) -> Array: ...
    def mean_pairs(self, compressor: Compressor, msgs: Messages) -> Array: ...
    def own(self, H: Array) -> Array: ...
    def rows_of(self, a: Any, what: str) -> Array:
        """``a`` as the held workers' rows in this transport's arrays, checked (an error naming ``what``)."""
        ...
    def all_finite(self, a: Array) -> bool:
        """Whether every value of ``a`` is finite (a transport may answer True without looking)."""
        ...
    def add_at(self, H: Array, rows: Array, cols: Array, vals: Array) -> None:
        """``H[rows, cols] += vals`` in place."""
        ...


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


class Owned:
    """Per-worker rows (an exchange's ``H``) a transport may update in place: the arrays it handed
    out itself (the last few); any other array is copied first (float32 rows stay float32, any
    other dtype becomes float64), so a caller's is never modified."""

    KEEP = 4

    def __init__(self) -> None:
        self._arrays: list[Array] = []

    def __call__(self, H: Array) -> Array:
        for a in self._arrays:
            if a is H:
                return H
        H = np.array(H, dtype=np.float32 if np.asarray(H).dtype == np.float32 else np.float64, order="C")
        self._arrays = [H, *self._arrays[: self.KEEP - 1]]
        return H


class HeldWorkers:
    """What every transport shares: the held workers' oracles (``local_grads`` kept for the last
    two points, ``coords``, blocks, the problem's own messages), the problem's native ``kernel``,
    the path a run forces and the exchanges' chosen ``paths``, and the per-worker rows it owns. A
    transport sets ``n``, ``d``, ``workers``, ``problem`` and calls ``__init__`` with the path a
    run forces (``where`` ends the error message of a path that is not available)."""

    n: int
    d: int
    workers: range
    problem: Any

    def __init__(self, path: str, where: str = "") -> None:
        self.forced = check_choice(path, "path", ("auto", *PATHS))
        self.where = where
        self.paths: dict[Any, Any] = {}
        self.own = Owned()
        self._rows: list[tuple[Array, Array]] = []  # the local gradients of the last two points
        self._partial: list[tuple[Array, tuple[list[Array], Array, Array]]] = []  # rows kept at the last two points evaluated row by row

    @property
    def kernel(self) -> NativeKernel | None:
        return getattr(self.problem, "kernel", None)

    # -- the array operations of the exchanges, on numpy arrays -----------------------------------
    def rows_of(self, a: Any, what: str) -> Array:
        """``a`` as float64 rows of the held workers — float32 rows kept float32 (a method's
        shifts in a float32 problem's dtype) — the same array when it already is one, or an
        error naming ``what``: a TypeError for values that are not real numbers (complex,
        strings, None), a ValueError for the wrong shape."""
        arr = np.asarray(a)
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"{what} must hold real numbers, got dtype {arr.dtype}")
        if arr.shape != (len(self.workers), self.d):
            raise ValueError(f"{what} must hold the {len(self.workers)} held workers' rows of length {self.d}, got shape {arr.shape}")
        return np.asarray(arr, dtype=np.float32 if arr.dtype == np.float32 else np.float64)

    @staticmethod
    def all_finite(a: Array) -> bool:
        """Whether every value of ``a`` is finite (a diverged round's inputs are not)."""
        return all_finite(a)

    @staticmethod
    def add_at(H: Array, rows: Array, cols: Array, vals: Array) -> None:
        """``H[rows, cols] += vals`` (repeated pairs add up)."""
        np.add.at(H, (rows, cols), vals)

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

    def local_grads_rows(self, x: Array, rows: Array) -> Array:
        """The gradients at ``x`` of the held workers ``rows`` (indices counted from the first
        held worker, increasing), one row each, evaluating only theirs: the native kernel's
        ``local_grads_rows`` when the problem has one, else ``local_grad(i, x)`` of each, else
        the rows of :meth:`local_grads` (all held workers evaluated). Partial participation
        evaluates only the round's participants this way. A worker's row at ``x`` is kept until
        it is evaluated at another point (a participant of two rounds in a row reuses its
        gradient at the point between them), as are the last two points' whole gradients."""
        return self._rows_at([x], np.asarray(rows, dtype=np.int64))[0]

    def local_grads_rows_pair(self, x: Array, y: Array, rows: Array) -> tuple[Array, Array]:
        """:meth:`local_grads_rows` at ``x`` and at ``y`` (the two points of a difference), each
        worker's two gradients one after the other (a worker's data, e.g. its matrix, read
        twice while in cache) where the problem evaluates workers one by one (``local_grad``);
        the same values."""
        gx, gy = self._rows_at([x, y], np.asarray(rows, dtype=np.int64))
        return gx, gy

    def _rows_at(self, points: list[Array], rows: Array) -> list[Array]:
        """The rows ``rows`` of the held workers' gradients at each point: kept ones reused (the
        whole gradients of the last two points; the rows evaluated at the last two points
        evaluated row by row), the others evaluated — worker by worker, all points of a worker
        in turn, where the problem evaluates workers one by one."""
        m, d, start = len(rows), self.d, self.workers.start
        out: list[Array] = []
        todo: list[Array] = []
        none = np.zeros(0, dtype=np.int64)
        for x in points:
            whole = next((w for cx, w in self._rows if cx is x), None)
            if whole is not None:
                out.append(whole if m == len(self.workers) else whole[rows])
                todo.append(none)
                continue
            if m == len(self.workers) and not hasattr(self.problem, "local_grad"):
                out.append(self.local_grads(x))
                todo.append(none)
                continue
            kept = self._partial_at(x)
            if kept is None:
                out.append(np.empty((m, d)))
                todo.append(np.arange(m))
                continue
            blocks, block_of, row_of = kept
            o = np.empty((m, d))
            b = block_of[rows]
            for k in np.unique(b[b >= 0]).tolist():  # the kept rows, block by block
                js = np.flatnonzero(b == k)
                o[js] = blocks[k][row_of[rows[js]]]
            out.append(o)
            todo.append(np.flatnonzero(b < 0))
        if not any(len(t) for t in todo):
            return out
        kernel = self.kernel
        if kernel is not None and hasattr(kernel, "local_grads_rows"):
            for x, o, js in zip(points, out, todo):
                if len(js):
                    got = kernel.local_grads_rows(np.ascontiguousarray(x, dtype=np.float64), rows[js] + start)
                    o[js] = check_output(got, (len(js), d), "kernel.local_grads_rows(x, rows)")
        elif hasattr(self.problem, "local_grad"):
            miss = [set(js.tolist()) for js in todo]
            for j, r in enumerate(rows.tolist()):  # a worker's points in turn
                for x, o, mk in zip(points, out, miss):
                    if j in mk:
                        o[j] = check_output(self.problem.local_grad(start + r, x), (d,), f"problem.local_grad({start + r}, x)")
        else:
            for k, (x, js) in enumerate(zip(points, todo)):
                if len(js):
                    out[k] = self.local_grads(x)[rows]
        for x, o, js in zip(points, out, todo):
            if len(js):
                self._keep(x, rows[js], o[js] if len(js) < m else o)
        return out

    def _partial_at(self, x: Array) -> tuple[list[Array], Array, Array] | None:
        """The rows kept at the point ``x``: ``(blocks, block_of, row_of)``, held worker ``r``'s
        row ``blocks[block_of[r]][row_of[r]]`` (``block_of[r] < 0``: not kept), or None."""
        for cx, kept in self._partial:
            if cx is x:
                return kept
        return None

    def _keep(self, x: Array, rows: Array, block: Array) -> None:
        """Keep the rows ``block`` of the held workers ``rows`` at the point ``x`` (the rows of
        the last two points evaluated row by row are kept)."""
        kept = self._partial_at(x)
        if kept is None:
            held = len(self.workers)
            kept = ([], np.full(held, -1, dtype=np.int64), np.zeros(held, dtype=np.int64))
            self._partial = [(x, kept)] + self._partial[:1]
        blocks, block_of, row_of = kept
        block_of[rows] = len(blocks)
        row_of[rows] = np.arange(len(rows))
        blocks.append(block)

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
