"""MPI as a transport: :class:`MPIBackend` holds this process's block of workers and moves their
numbers between all ranks with MPI (mpi4py). :mod:`permk.distributed` runs methods on it.

Communication (``mode="p2p"``: every rank aggregates, the paper's peer-to-peer model;
``mode="server"``: messages are gathered on rank 0, which aggregates and broadcasts the
aggregate), chosen by the compressor's capabilities:

* a shared plan (``capabilities.shared_plan``: PermK, shared-seed RandK, BlockPermK, …): every
  rank recomputes the round's plan from ``(seed, t)``, so only *values* travel
  (``Allgatherv``/``Gatherv``); each rank adds them at the recomputed coordinates in worker order
  (bit for bit the simulator's ``aggregate``), or places them when the plan is disjoint. The plan
  is computed once per round (:meth:`permk.Compressor.round`), and round ``t + 1``'s plan on a
  background thread while round ``t`` communicates (``prefetch``: by default when plans cost a
  millisecond or more, e.g. PermK at large ``d``). When every rank holds one worker and the plan
  gives each worker one contiguous block of a disjoint round (``BlockPermK(n)``), each rank
  writes its values into its block of the aggregate buffer and one ``Allgatherv`` in place fills
  in the others. When all ranks share one node (p2p mode, ``MPIBackend(window="auto")``, the
  default), the other shared plans' values (PermK's) go through an MPI-3 shared-memory window
  instead of an ``Allgatherv``: each rank writes its workers' values into their place in the
  window, one barrier, and every rank sums them from there (the same bits);
* otherwise (TopK, quantizers): ``(index, value)`` pairs (uint32 indices; no lengths exchanged
  when the messages have a fixed size);
* full-gradient exchanges: ``Allreduce`` of each rank's sum over its workers
  (``reduce="allreduce"``; server mode: ``Reduce`` + ``Bcast``; the problem's own
  ``local_grad_sum(x)`` when it has one), or, with ``reduce="ordered"``, the workers' vectors
  gathered and summed in worker order, so that every sum in the run is the simulator's.

Every exchange tells the transport's :class:`~permk.transport.counting.ByteCounter`
(``backend.bytes``) what it handed to MPI.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Sequence

import numpy as np

from .._buffers import Reusable
from .._validate import check_choice, check_int, check_output, check_real
from ..compressors import Compressor, Messages, PendingRound, Ranges, Round
from .base import Fill, HeldWorkers
from .counting import ByteCounter

__all__ = ["MPIBackend", "block", "mpi", "world", "PREFETCH_MIN_SECONDS", "PREFETCH_PROBES"]

Array = np.ndarray
#: ``prefetch="auto"`` computes the next round's plan ahead when the fastest of the first
#: ``PREFETCH_PROBES`` plans computed on this rank took at least ``PREFETCH_MIN_SECONDS``.
PREFETCH_MIN_SECONDS = 1e-3
PREFETCH_PROBES = 3


def mpi() -> Any:
    """The ``mpi4py.MPI`` module (ImportError saying how to install it)."""
    try:
        from mpi4py import MPI
    except ImportError:  # pragma: no cover - exercised only without mpi4py
        raise ImportError("permk.distributed needs mpi4py and an MPI library: pip install 'permk[mpi]'") from None
    return MPI


def world(comm: Any) -> Any:
    """``comm``, or ``COMM_WORLD`` when None."""
    return mpi().COMM_WORLD if comm is None else comm


def block(n: int, size: int, rank: int) -> range:
    """The workers process ``rank`` of ``size`` holds, ``n ≥ size`` workers spread in contiguous
    blocks, the first ``n mod size`` processes holding one more.

    >>> [block(10, 4, r) for r in range(4)]
    [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    """
    q, r = divmod(n, size)
    start = rank * q + min(rank, r)
    return range(start, start + q + (rank < r))


def _displs(counts: Sequence[int]) -> list[int]:
    return [int(v) for v in np.concatenate([[0], np.cumsum(counts)[:-1]])] if counts else []


class MPIBackend(HeldWorkers):
    """The workers of this process, and the exchanges between all ranks (see the module
    docstring). Counts the bytes each round hands to MPI."""

    def __init__(self, problem: Any, comm: Any = None, *, mode: str = "p2p", reduce: str = "allreduce", path: str = "auto",
                 prefetch: bool | Literal["auto"] = "auto", window: bool | Literal["auto"] = "auto") -> None:
        for attr in ("n", "d", "x0", "workers"):
            if not hasattr(problem, attr):
                raise TypeError(f"the problem must be a permk.distributed.LocalProblem (missing {attr!r}), or a global problem")
        if not (hasattr(problem, "local_grads") or hasattr(problem, "local_grad")):
            raise TypeError("the local problem needs local_grads(x) (the held workers' gradients) or local_grad(i, x)")
        self.mode = check_choice(mode, "mode", ("p2p", "server"))
        self.reduce = check_choice(reduce, "reduce", ("allreduce", "ordered"))
        self.local = False
        super().__init__(path, " on MPI")
        self.comm = world(comm)
        self.MPI = mpi()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.problem = problem
        self.n = check_int(problem.n, "problem.n", low=1)
        self.d = check_int(problem.d, "problem.d", low=1)
        ws = [check_int(i, "worker", high=self.n) for i in problem.workers]
        if not ws or ws != list(range(ws[0], ws[0] + len(ws))):
            raise ValueError(f"problem.workers must be a non-empty contiguous range, got {ws}")
        self.workers = range(ws[0], ws[-1] + 1)
        self.blocks = [block(self.n, self.size, r) for r in range(self.size)] if self.n >= self.size else []
        self.bytes = ByteCounter()
        self._buffers: dict[tuple[int, str, str], Array] = {}
        if not (isinstance(prefetch, bool) or prefetch == "auto"):
            raise TypeError(f"prefetch must be True, False or 'auto', got {prefetch!r}")
        self.prefetch: bool | str = prefetch
        if not (isinstance(window, bool) or window == "auto"):
            raise TypeError(f"window must be True, False or 'auto', got {window!r}")
        self.window: bool | str = window
        self._win: Any = None  # the shared-memory window of a shared plan's values: (win, node comm, (2, size) view)
        self._parity = 0
        self._ahead: tuple[Compressor, tuple[int, int], PendingRound] | None = None
        self._plan_seconds: dict[int, list[float]] = {}
        self._theory: dict[int, tuple[Compressor, int]] = {}
        self._agg = Reusable(self.d)

    def _bcast(self, buf: Array) -> None:
        self.comm.Bcast(buf, root=0)
        if self.rank == 0:
            self.bytes.broadcast(buf.nbytes)

    # -- local oracles -------------------------------------------------------------------------
    def _evaluate(self, x: Array) -> Array:
        """The held workers' gradients: ``local_grads(x)``, or ``local_grad(i, x)`` of each."""
        if hasattr(self.problem, "local_grads"):
            return super()._evaluate(x)
        r = np.empty((len(self.workers), self.d))
        for j, i in enumerate(self.workers):
            r[j] = check_output(self.problem.local_grad(i, x), (self.d,), f"problem.local_grad({i}, x)")
        return r

    # -- transport -----------------------------------------------------------------------------
    def mean_rows(self, rows: Array) -> Array:
        """``(1/n) Σ_i v_i`` over all workers from the held rows ``v_i`` (one per held worker)."""
        d = self.d
        self.bytes.theory(8 * d)
        if self.reduce == "ordered":
            return self._mean_ordered(np.ascontiguousarray(rows, dtype=np.float64).ravel())
        acc = np.zeros(d)
        for r in rows:
            acc += r
        return self._mean_of_sums(acc)

    def _mean_of_sums(self, acc: Array) -> Array:
        """``(1/n) Σ_ranks acc`` from this rank's sum ``acc`` over its workers (``Allreduce``;
        server mode: ``Reduce`` + ``Bcast``)."""
        self.bytes.sent(acc.nbytes, per_worker=acc.nbytes)
        out = np.empty(self.d)
        if self.mode == "p2p":
            self.comm.Allreduce(acc, out, op=self.MPI.SUM)
            return out / self.n
        self.comm.Reduce(acc, out if self.rank == 0 else None, op=self.MPI.SUM, root=0)
        return self._share(out / self.n if self.rank == 0 else None)

    def mean_grad(self, x: Array) -> Array:
        """``∇f(x)`` as the mean of the workers' gradients: with ``reduce="allreduce"`` and a
        problem that sums its held workers' gradients itself (``local_grad_sum(x)``, e.g. in
        closed form), that sum; otherwise :meth:`mean_rows` of :meth:`local_grads`."""
        local_sum = getattr(self.problem, "local_grad_sum", None)
        if local_sum is None or self.reduce == "ordered":
            return self.mean_rows(self.local_grads(x))
        self.bytes.theory(8 * self.d)
        acc = check_output(local_sum(x), (self.d,), "problem.local_grad_sum(x)")
        return self._mean_of_sums(np.ascontiguousarray(acc))

    def plan(self, compressor: Compressor, seed: int, round: int) -> Round:
        """Round ``round``'s plan: the one computed ahead if it is that round's, else computed now.
        Then round ``round + 1``'s plan is started on a background thread, to be ready when this
        round's communication is over (it is a pure function of ``(seed, round + 1)``): always
        with ``prefetch=True``; with ``"auto"`` when the fastest of the first
        :data:`PREFETCH_PROBES` plans computed here took at least :data:`PREFETCH_MIN_SECONDS`
        (a thread costs 20–100 µs to start and competes for the cores: it pays for costly plans
        only, such as PermK's permutation of a large ``d``)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] is compressor and ahead[1] == (seed, round):
            r = ahead[2].wait()
        else:
            t0 = time.perf_counter()
            r = compressor.round(self.n, self.d, seed=seed, round=round)
            probes = self._plan_seconds.setdefault(id(compressor), [])
            if len(probes) < PREFETCH_PROBES:
                probes.append(time.perf_counter() - t0)
        probes = self._plan_seconds[id(compressor)]
        costly = len(probes) == PREFETCH_PROBES and min(probes) >= PREFETCH_MIN_SECONDS
        if self.prefetch is True or (self.prefetch == "auto" and costly):
            self._ahead = (compressor, (seed, round + 1), compressor.round_ahead(self.n, self.d, seed=seed, round=round + 1))
        return r

    def mean_values(self, compressor: Compressor, r: Round, fill: Fill) -> Array:
        """``(1/n) Σ_i C_i(a_i)`` of a shared plan's round from the held workers' values
        (``fill``): only values travel, gathered in worker order, and the round sums them — bit
        for bit the simulator's. When every rank holds one worker and the round gives each worker
        one contiguous block, the values are written in place."""
        self.bytes.theory(self._theory_bytes(compressor))
        if self.size == self.n and r.disjoint:
            ranges = r.ranges()
            if ranges is not None:
                return self._mean_in_place(r, Ranges(*ranges), fill)
        ws = self.workers
        off = r.offsets()
        view = self._shared_window(int(off[-1]))
        if view is not None:
            return self._mean_values_shared(r, fill, view)
        # the held workers' values into a send buffer kept across rounds (a fresh array of d/n
        # floats costs its page faults every round)
        send = self._buffer(int(off[ws.stop] - off[ws.start]), np.float64, "send")
        return self._mean_round(r, fill(ws.start, ws.stop, None, send))

    def mean_pairs(self, compressor: Compressor, msgs: Messages) -> Array:
        """``(1/n) Σ_i C_i(a_i)`` from the held workers' messages, sent as (index, value) pairs."""
        self.bytes.theory(self._theory_bytes(compressor))
        return self._mean_pairs(msgs, compressor)

    def _mean_in_place(self, r: Round, ranges: Ranges, fill: Fill) -> Array:
        """A disjoint round in which every rank's one worker sends one contiguous block (BlockPermK
        with ``m = n``): each rank writes its values straight into its block of the aggregate
        buffer, and an ``Allgatherv`` in place (server: ``Gatherv`` to rank 0) whose
        displacements are the round's block starts fills in the other blocks — no send buffer,
        no packing, no placement loop, no pass over ``R^d``. The values are ``(0 + v)/n``: the
        worker-order sum's term divided by ``n``, the same bits as dividing the placed sum (a
        coordinate no block covers is 0)."""
        w = self.workers.start
        lo, hi = int(ranges.starts[w]), int(ranges.stops[w])
        counts, displs = (ranges.stops - ranges.starts).tolist(), ranges.starts.tolist()
        holder = self.mode == "p2p" or self.rank == 0
        out = self._agg.get() if holder else None
        if out is not None and sum(counts) != self.d:
            out.fill(0.0)
        dest = out[lo:hi] if out is not None else self._buffer(hi - lo, np.float64)
        vals = fill(w, w + 1, self.n, dest)
        self.bytes.sent(vals.nbytes, per_worker=vals.nbytes)
        spec = [out, counts, displs, self.MPI.DOUBLE]
        if self.mode == "p2p":
            self.comm.Allgatherv(self.MPI.IN_PLACE, spec)
        elif self.rank == 0:
            self.comm.Gatherv(self.MPI.IN_PLACE, spec, root=0)
        else:
            self.comm.Gatherv(vals, None, root=0)
        return self._share(out)

    def _theory_bytes(self, compressor: Compressor) -> int:
        """The theory's largest message of one worker on a compressed round, at float64 values
        (and 32-bit indices where they travel: without a shared plan). For a compressor whose
        message size is random (``capabilities.random_size``) it is the bound, which a round's
        largest message may not reach."""
        hit = self._theory.get(id(compressor))
        if hit is None or hit[0] is not compressor:
            k = compressor.floats_per_worker(self.n, self.d)
            values_only = compressor.capabilities.shared_plan or compressor.capabilities.dense
            hit = self._theory[id(compressor)] = (compressor, 8 * k if values_only else k * (8 + (4 if self.d < 2**32 else 8)))
        return hit[1]

    def _shared_window(self, total: int) -> Array | None:
        """Two buffers of at least ``total`` float64 values in one MPI-3 shared-memory window of
        all ranks (``MPI_Win_allocate_shared``, a ``(2, size)`` view), when the values of a shared
        plan's round go through shared memory (:meth:`_mean_values_shared`): p2p mode, more than
        one rank, all of them on one node, and ``window`` not False. None otherwise. Collective
        on first use and when a larger round comes (every rank asks for the same ``total``)."""
        if self.window is False or self.mode != "p2p" or self.size == 1:
            return None
        if self._win is None:
            node = self.comm.Split_type(self.MPI.COMM_TYPE_SHARED)
            if node.Get_size() != self.size:
                node.Free()
                if self.window is True:
                    raise ValueError("window=True needs every rank on one node (a shared-memory window of all ranks)")
                self.window = False
                return None
            self._win = (None, node, np.empty((2, 0)))
        win, node, view = self._win
        if view.shape[1] < total:
            if win is not None:
                win.Unlock_all()
                win.Free()
            size = max(total, 2 * view.shape[1])
            win = self.MPI.Win.Allocate_shared(2 * size * 8 if node.Get_rank() == 0 else 0, 8, comm=node)
            buf, _ = win.Shared_query(0)
            view = np.ndarray(buffer=buf, dtype=np.float64, shape=(2, size))
            win.Lock_all()
            self._win = (win, node, view)
        return view

    def _mean_values_shared(self, r: Round, fill: Fill, view: Array) -> Array:
        """A shared plan's round through the shared-memory window ``view``: each rank writes its
        workers' values straight into their place among all workers' values (worker order), one
        barrier, and every rank sums them from the window (:meth:`Round.mean`, the same bits as
        after an ``Allgatherv``). No copy through MPI's buffers and one synchronisation instead
        of a collective's many: on one node the values need no transport. The two buffers
        alternate from exchange to exchange: exchange ``t + 2`` overwrites exchange ``t``'s
        buffer only after passing exchange ``t + 1``'s barrier, which no rank passes before it has
        read exchange ``t``'s values."""
        off = r.offsets()
        ws = self.workers
        total = int(off[-1])
        buf = view[self._parity, :total]
        self._parity ^= 1
        lo, hi = int(off[ws.start]), int(off[ws.stop])
        dest = buf[lo:hi]
        values = fill(ws.start, ws.stop, None, dest)
        if values is not dest:
            dest[...] = values
        sizes = np.diff(off[ws.start : ws.stop + 1])
        self.bytes.sent(dest.nbytes, per_worker=8 * int(sizes.max(initial=0)))
        win, node, _ = self._win
        win.Sync()
        node.Barrier()
        win.Sync()
        return r.mean(buf, out=self._agg.get())

    def close(self) -> None:
        """Frees the shared-memory window (collective: every rank calls it, as :func:`run` does
        at the end of a run). The backend can be used again (a new window is made when needed)."""
        if self._win is not None:
            win, node, _ = self._win
            if win is not None:
                win.Unlock_all()
                win.Free()
            node.Free()
            self._win = None

    def _mean_round(self, r: Round, values: Array) -> Array:
        """``(1/n) Σ_i C_i(a_i)`` from the held workers' values of round ``r``: only values travel
        (gathered in worker order), and the round sums them — bit for bit the simulator's."""
        off = r.offsets()
        sizes = np.diff(off[self.workers.start : self.workers.stop + 1])
        counts = [int(off[b.stop] - off[b.start]) for b in self.blocks]
        values = np.ascontiguousarray(values, dtype=np.float64)
        if values.size != counts[self.rank]:
            raise ValueError(f"this rank's message has {values.size} values, the plan says {counts[self.rank]}")
        self.bytes.sent(values.nbytes, per_worker=8 * int(sizes.max(initial=0)))
        recv = self._gather(values, counts, self.MPI.DOUBLE)
        return self._share(None if recv is None else r.mean(recv, out=self._agg.get()))

    def _mean_dense(self, msgs: Messages) -> Array:
        """``(1/n) Σ_i C_i(a_i)`` from messages that hold every coordinate in order
        (``capabilities.dense``): only the values travel, and the rows are summed in worker
        order from 0 (the bits of the pairs' sum)."""
        d = self.d
        lens = np.diff(msgs.offsets)
        if lens.size and (lens != d).any():
            raise ValueError(f"a dense compressor's message has {lens.tolist()} values, expected d = {d} per worker")
        return self._mean_ordered(np.ascontiguousarray(msgs.values, dtype=np.float64))

    def _mean_ordered(self, vals: Array) -> Array:
        """``(1/n) Σ_i v_i`` from the held workers' whole rows ``vals`` (flat, ``d`` values per
        held worker): every row is gathered and summed in worker order from 0, as the simulator
        sums."""
        d = self.d
        self.bytes.sent(vals.nbytes, per_worker=8 * d)
        recv = self._gather(vals, [len(b) * d for b in self.blocks], self.MPI.DOUBLE)
        if recv is None:
            return self._share(None)
        acc = np.zeros(d)
        for row in recv.reshape(self.n, d):
            acc += row
        return self._share(acc / self.n)

    def _mean_pairs(self, msgs: Messages, compressor: Compressor) -> Array:
        """``(1/n) Σ_i C_i(a_i)`` from the held workers' messages, sent as (index, value) pairs
        (only the values for a compressor with ``capabilities.dense``). Fixed-size messages
        (``capabilities.fixed_size``) need no lengths; otherwise the lengths are exchanged first
        (8 bytes per rank, counted)."""
        if compressor.capabilities.dense:
            return self._mean_dense(msgs)
        MPI = self.MPI
        wide = self.d >= 2**32
        idx = np.ascontiguousarray(msgs.indices.astype(np.uint64 if wide else np.uint32))
        val = np.ascontiguousarray(msgs.values, dtype=np.float64)
        lens = np.diff(msgs.offsets)
        if compressor.capabilities.fixed_size:
            fixed = compressor.floats_per_worker(self.n, self.d)
            if lens.size and (lens != fixed).any():
                raise ValueError(f"a message has {lens.tolist()} values, expected {fixed} per worker")
            counts = [fixed * len(b) for b in self.blocks]
        else:
            mine = np.array([val.size], dtype=np.int64)
            allc = np.empty(self.size, dtype=np.int64)
            self.comm.Allgather(mine, allc)
            self.bytes.sent(mine.nbytes, per_worker=0)
            counts = [int(c) for c in allc]
        self.bytes.sent(idx.nbytes + val.nbytes, per_worker=int(lens.max(initial=0)) * (8 + idx.itemsize))
        ri = self._gather(idx, counts, MPI.UINT64_T if wide else MPI.UINT32_T)
        rv = self._gather(val, counts, MPI.DOUBLE)
        if ri is None or rv is None:
            return self._share(None)
        return self._share(np.bincount(ri.astype(np.int64), weights=rv, minlength=self.d) / self.n)

    def _gather(self, buf: Array, counts: list[int], mpitype: Any) -> Array | None:
        """Every rank's ``buf`` concatenated in rank (= worker) order: on every rank (p2p,
        ``Allgatherv``) or on rank 0 (server, ``Gatherv``; None elsewhere)."""
        spec = [self._buffer(sum(counts), buf.dtype), counts, _displs(counts), mpitype]
        if self.mode == "p2p":
            self.comm.Allgatherv(buf, spec)
            return spec[0]  # type: ignore[no-any-return]
        root = self.rank == 0
        self.comm.Gatherv(buf, spec if root else None, root=0)
        return spec[0] if root else None  # type: ignore[return-value]

    def _buffer(self, size: int, dtype: Any, role: str = "") -> Array:
        """A send or receive buffer, reused across rounds (its contents are consumed by the
        collective it is written for, before the next one); ``role`` keeps apart buffers of one
        size that a collective uses together (a send and a receive buffer)."""
        key = (int(size), np.dtype(dtype).str, role)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = np.empty(size, dtype=dtype)
        return buf

    def _share(self, mean: Array | None) -> Array:
        """The aggregate on every rank: p2p, every rank computed it; server, rank 0 broadcasts it."""
        if self.mode == "p2p":
            assert mean is not None
            return mean
        out = mean if (self.rank == 0 and mean is not None) else np.empty(self.d)
        self._bcast(out)
        return out

    # -- record --------------------------------------------------------------------------------
    @property
    def f_star(self) -> float | None:
        f = getattr(self.problem, "f_star", None)
        return None if f is None else check_real(f, "problem.f_star")

    def metrics(self, x: Array) -> tuple[float, float | None]:
        """``‖∇f(x)‖²`` and ``f(x) − f*``: from the local problem's global ``grad``/``loss`` when
        it has them, else by collectives over the workers (not counted)."""
        with np.errstate(over="ignore", invalid="ignore"):
            if hasattr(self.problem, "grad"):
                g = check_output(self.problem.grad(x), (self.d,), "problem.grad(x)")
            else:
                with self.bytes.paused():
                    g = self.mean_grad(x)
            f_star = self.f_star
            gap = None
            if f_star is not None and hasattr(self.problem, "loss"):
                gap = float(self.problem.loss(x)) - f_star
            elif f_star is not None and hasattr(self.problem, "local_loss"):
                gap = self._mean_scalars([float(self.problem.local_loss(i, x)) for i in self.workers]) - f_star
            return float(g @ g), gap

    def _mean_scalars(self, vals: Sequence[float]) -> float:
        """``(1/n) Σ_i s_i`` over all workers, summed in worker order (the recorded loss; not counted)."""
        buf = np.asarray(vals, dtype=np.float64)
        counts = [len(b) for b in self.blocks]
        allv = np.empty(self.n)
        self.comm.Allgatherv(buf, [allv, counts, _displs(counts), self.MPI.DOUBLE])
        acc = 0.0
        for v in allv:
            acc += float(v)
        return acc / self.n
