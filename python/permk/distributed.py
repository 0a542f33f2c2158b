"""Real distributed runs on MPI: one process per worker (or a block of workers per process).

The drivers :func:`marina`, :func:`ef21` and :func:`gd` take the arguments of
:func:`permk.marina`, :func:`permk.ef21` and :func:`permk.gd` and return the same
:class:`~permk.methods.RunResult` (a :class:`DistributedRunResult`, which adds the bytes
measured on the MPI buffers) on every rank. They run the *same* step functions as the
simulator (:func:`~permk.methods.marina_update`, :func:`~permk.methods.ef21_update`) and the
same driver loop, with MPI-backed callables. A script::

    import permk, permk.distributed as pd
    q = permk.Quadratic.synthetic(n=8, d=10_000, lam=1e-6, noise_scale=0.1, seed=0)
    res = pd.marina(pd.LocalView(q), permk.PermK(), rounds=1000, seed=1)   # this rank's workers
    if res.workers.start == 0:
        print(res.grad_norm_sq[-1], res.bytes_per_worker[:5], res.theory_bytes_per_worker[:5])

runs with ``mpiexec -n 4 python script.py`` (or ``mpiexec -n 4 python -m mpi4py script.py``).

Each process only evaluates the workers it holds: the problem is a :class:`LocalProblem`
(``n``, ``d``, ``x0``, ``workers`` and ``local_grad(i, x)`` for the held workers ``i``), so the
problem's data never has to exist on one process. ``n`` workers are spread over ``size``
processes in contiguous blocks (:func:`workers_of`); :class:`LocalView` turns a global problem
(e.g. :meth:`permk.Quadratic.synthetic`) into the local problem of one process.

Communication (``mode="p2p"``: every rank aggregates, the paper's peer-to-peer model;
``mode="server"``: messages are gathered on rank 0, which aggregates and broadcasts the
aggregate, from which every rank forms the new iterate, as in Algorithm "MARINA"'s
"broadcast g^t"):

* PermK, shared-seed RandK, BlockPermK (``shares_coordinates``, with a ``plan``): every rank
  recomputes the round's plan from ``(seed, t)``, so only *values* travel
  (``Allgatherv``/``Gatherv``); each rank scatter-adds them at the recomputed coordinates in
  worker order (bit for bit the simulator's ``aggregate``).
* TopK and other data-dependent compressors: ``(index, value)`` pairs (uint32 indices).
* MARINA's full-gradient rounds, EF21's initial exchange and the recorded ``‖∇f‖²``:
  ``Allreduce`` of each rank's sum over its workers (``reduce="allreduce"``; server mode:
  ``Reduce`` + ``Bcast``), or, with ``reduce="ordered"``, the workers' vectors gathered and
  summed in worker order, so that every sum in the run is the simulator's worker-order sum.

Bit-for-bit agreement with the single-process simulator (``permk.marina(..., path="dense")``):
compressed rounds agree exactly for every compressor, since both sum the messages in worker
order from 0 and divide by ``n``. Full-gradient rounds agree exactly with ``reduce="ordered"``
when the simulator's problem computes ``∇f`` as the worker-order mean of the local gradients;
with ``reduce="allreduce"`` (tree order) or against the closed-form ``∇f`` of
:class:`~permk.SyntheticQuadratic` they differ by rounding, of the order of
``n u (1/n) Σ_i |∇f_i(x)_j|`` per coordinate (``u = 2^-53``) per full-gradient round, carried
on by the iteration like any perturbation of ``g`` (observed: 1e-16 after 60 rounds).

Failures: every rank validates the run before any round; an argument error is raised on every
rank as it would be by the simulator (``TypeError``/``ValueError``), and a bad launch (``n``
smaller than the number of processes or not matching the ranks' problems, ranks disagreeing on
the seed or any argument, an error on some ranks only) as :class:`LaunchError` with the same
message on every rank. An error during the run on one rank prints that rank's
traceback and calls ``MPI_Abort``, which ends the whole job with a non-zero exit (no rank is
left waiting in a collective). For errors in your own script outside the drivers, launch with
``python -m mpi4py`` or call :func:`install_excepthook`.
"""

from __future__ import annotations

import hashlib
import sys
import traceback
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Literal, Protocol, Sequence, runtime_checkable

import numpy as np

from ._validate import check_int
from .compressors import Compressor, Identity, Message, PermK, Plan, TopK
from .methods import (
    EF21State,
    MarinaState,
    RunResult,
    _check_compressor,
    _check_resume,
    _drive,
    _ef21_params,
    _marina_params,
    ef21_init,
    ef21_update,
    marina_init,
    marina_round_bits,
    marina_update,
)
from .problems import Quadratic, SyntheticQuadratic

__all__ = [
    "LocalProblem",
    "LocalView",
    "LaunchError",
    "DistributedRunResult",
    "workers_of",
    "marina",
    "ef21",
    "gd",
    "install_excepthook",
    "synthetic_local",
]

Array = np.ndarray
Mode = Literal["p2p", "server"]
Reduce = Literal["allreduce", "ordered"]


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError:  # pragma: no cover - exercised only without mpi4py
        raise ImportError("permk.distributed needs mpi4py and an MPI library: pip install 'permk[mpi]'") from None
    return MPI


def _world(comm: Any) -> Any:
    return _mpi().COMM_WORLD if comm is None else comm


class LaunchError(ValueError):
    """A run cannot start as launched; raised with the same message on every rank."""


def workers_of(n: int, comm: Any = None, *, size: int | None = None, rank: int | None = None) -> range:
    """The workers a process holds: ``n`` workers in contiguous blocks over the processes, the
    first ``n mod size`` processes holding one more.

    >>> [workers_of(10, size=4, rank=r) for r in range(4)]
    [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    """
    n = check_int(n, "n", low=1)
    if size is None or rank is None:
        c = _world(comm)
        size, rank = c.Get_size(), c.Get_rank()
    if n < size:
        raise LaunchError(
            f"n={n} workers cannot be spread over {size} processes (every process holds at least one "
            f"worker): launch with mpiexec -n k for some k <= {n}"
        )
    q, r = divmod(n, size)
    start = rank * q + min(rank, r)
    return range(start, start + q + (rank < r))


def install_excepthook(comm: Any = None) -> None:
    """Make an uncaught exception on any rank print its traceback and abort the whole MPI job
    (what ``python -m mpi4py script.py`` does), instead of leaving the other ranks waiting."""
    c = _world(comm)

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        sys.stderr.write(f"[permk.distributed] rank {c.Get_rank()}/{c.Get_size()}: uncaught exception\n")
        sys.stderr.write("".join(traceback.format_exception(kind, value, tb)))
        sys.stderr.flush()
        c.Abort(1)

    sys.excepthook = hook


# ---------------------------------------------------------------------------------------------
# local problems
# ---------------------------------------------------------------------------------------------
@runtime_checkable
class LocalProblem(Protocol):
    """What one process knows of ``f = (1/n) Σ_i f_i``: the workers it holds and their oracles.

    Required: ``n``, ``d``, ``x0`` (the same on every rank), ``workers`` (the held workers, a
    contiguous ``range``: see :func:`workers_of`) and ``local_grad(i, x)`` (``∇f_i(x)`` for a
    held worker ``i``). Optional, used when present: ``local_loss(i, x)`` (``f_i(x)``; with
    ``f_star`` the run records ``f(x) − f*``), ``local_grad_coords(i, x, cols)``
    (``∇f_i(x)[cols]``: PermK/RandK rounds then evaluate only the sent coordinates), and the
    global constants ``L_minus``, ``L_plus``, ``L_pm``, ``L_i``, ``mu`` for the theory's step
    (else pass ``gamma=``).
    """

    n: int
    d: int
    x0: np.ndarray

    @property
    def workers(self) -> Sequence[int]:
        """The workers this process holds (a contiguous range)."""
        ...

    def local_grad(self, i: int, x: np.ndarray) -> np.ndarray:
        """``∇f_i(x)``, shape ``(d,)``, for a held worker ``i``."""
        ...


_CONSTANTS = ("L_minus", "L_plus", "L_pm", "L_i", "mu")


class LocalView:
    """A global :class:`~permk.Problem` seen from one process: only the oracles of the workers in
    ``workers`` (default: this process's block, :func:`workers_of`) are ever called.

    For :class:`~permk.Quadratic` (and :meth:`~permk.Quadratic.synthetic`) it also provides
    ``local_loss(i, x) = ½ xᵀ(∇f_i(x) + ∇f_i(0))`` and ``f_star``; the constants and
    ``local_grad_coords`` are passed through when the problem has them.

    >>> import permk
    >>> q = permk.Quadratic.synthetic(n=4, d=6, lam=1e-3, noise_scale=0.1, seed=0)
    >>> v = LocalView(q, workers=range(0, 4))
    >>> bool(abs(sum(v.local_loss(i, q.x0) for i in v.workers) / 4 - q.loss(q.x0)) < 1e-9)
    True
    >>> LocalView(q, workers=range(2, 4)).workers
    range(2, 4)
    """

    def __init__(self, problem: Any, workers: Sequence[int] | None = None, *, comm: Any = None) -> None:
        self.problem = problem
        self.n = int(problem.n)
        self.d = int(problem.d)
        self.x0 = np.asarray(problem.x0, dtype=np.float64)
        ws = workers_of(self.n, comm) if workers is None else workers
        ws = [check_int(i, "worker", high=self.n) for i in ws]
        if not ws or ws != list(range(ws[0], ws[0] + len(ws))):
            raise ValueError(f"workers must be a non-empty contiguous range of worker indices, got {ws}")
        self.workers = range(ws[0], ws[0] + len(ws))
        self._grad0: dict[int, np.ndarray] = {}
        if hasattr(problem, "local_grad_coords"):
            self.local_grad_coords = self._local_grad_coords
        if hasattr(problem, "local_loss") or isinstance(problem, Quadratic):
            self.local_loss = self._local_loss

    def __getattr__(self, name: str) -> Any:
        # the global constants (L_minus, L_plus, L_pm, L_i, mu) are the wrapped problem's
        if name in _CONSTANTS and "problem" in self.__dict__:
            return getattr(self.problem, name)
        raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")

    def _held(self, i: int) -> int:
        i = check_int(i, "i", high=self.n)
        if i not in self.workers:
            raise ValueError(f"worker {i} is not held by this process (it holds {self.workers})")
        return i

    def local_grad(self, i: int, x: Any) -> np.ndarray:
        i = self._held(i)
        if hasattr(self.problem, "local_grad"):
            return np.asarray(self.problem.local_grad(i, x), dtype=np.float64)
        return np.asarray(self.problem.local_grads(x), dtype=np.float64)[i]

    def _local_grad_coords(self, i: int, x: Any, cols: Any) -> np.ndarray:
        i = self._held(i)
        cols = np.ascontiguousarray(cols, dtype=np.int64)
        return np.asarray(self.problem.local_grad_coords(x, np.full(cols.shape, i, dtype=np.int64), cols))

    def _local_loss(self, i: int, x: Any) -> float:
        i = self._held(i)
        if hasattr(self.problem, "local_loss"):
            return float(self.problem.local_loss(i, x))
        # f_i(x) = ½ xᵀA_i x − b_iᵀx = ½ xᵀ(∇f_i(x) + ∇f_i(0)) for a quadratic.
        if i not in self._grad0:
            self._grad0[i] = self.local_grad(i, np.zeros(self.d))
        x = np.asarray(x, dtype=np.float64)
        return float(0.5 * (x @ (self.local_grad(i, x) + self._grad0[i])))

    @property
    def f_star(self) -> float | None:
        if not hasattr(self, "local_loss"):
            return None
        return getattr(self.problem, "f_star", None)

    def __repr__(self) -> str:
        return f"LocalView({self.problem!r}, workers={self.workers})"


def synthetic_local(n: int, d: int, lam: float, noise_scale: float, seed: int = 0, *, comm: Any = None) -> LocalView:
    """This process's view of :meth:`permk.Quadratic.synthetic` (what ``permk quadratic --mpi`` runs)."""
    return LocalView(SyntheticQuadratic(n, d, lam, noise_scale, seed=seed), comm=comm)


# ---------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DistributedRunResult(RunResult):
    """A :class:`~permk.methods.RunResult` of an MPI run (the same on every rank), plus what was
    measured on the buffers handed to MPI. Per-round arrays have one entry per round run.

    Attributes
    ----------
    mode, reduce, n_procs : how the run communicated; workers : this rank's workers.
    bytes_sent : ``(n_procs, rounds)``: bytes each rank handed to MPI as its workers' messages
        (values, and indices where they travel) in each round.
    bytes_broadcast : ``(rounds,)``: bytes rank 0 broadcast back (server mode; 0 in p2p mode).
    bytes_per_worker : ``(rounds,)``: the largest message of one worker in each round, measured.
    theory_bytes_per_worker : ``(rounds,)``: the theory's largest message at float64 values:
        ``8d`` on full-gradient rounds, ``8 ζ`` on compressed rounds (``8⌈d/n⌉`` for PermK with
        ``d ≥ n``), plus 4 bytes per index for compressors whose indices travel (TopK; the paper
        counts ``⌈log2 d⌉`` bits per index in ``bits_per_worker``, MPI carries 32).
    """

    mode: str
    reduce: str
    n_procs: int
    workers: range
    bytes_sent: Array
    bytes_broadcast: Array
    bytes_per_worker: Array
    theory_bytes_per_worker: Array


# ---------------------------------------------------------------------------------------------
# the communication of one run
# ---------------------------------------------------------------------------------------------
class _Comm:
    """The collectives of one run on one rank, with the byte counters."""

    def __init__(self, comm: Any, problem: Any, mode: str, reduce: str) -> None:
        self.MPI = _mpi()
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.problem = problem
        self.n, self.d = int(problem.n), int(problem.d)
        ws = [int(i) for i in problem.workers]
        self.workers = range(ws[0], ws[-1] + 1)
        self.blocks = [workers_of(self.n, size=self.size, rank=r) for r in range(self.size)]
        self.mode, self.reduce = mode, reduce
        self.counting = True
        self.up = 0  # bytes of worker messages handed to MPI this round
        self.down = 0  # bytes broadcast by the root this round
        self.worker_max = 0  # the largest single worker message this round
        self._cache: list[tuple[Array, Array]] = []
        self._buffers: dict[tuple[int, str], Array] = {}

    # -- counters --------------------------------------------------------------------------
    def take(self) -> tuple[int, int, int]:
        out = (self.up, self.down, self.worker_max)
        self.up = self.down = self.worker_max = 0
        return out

    def _sent(self, nbytes: int, per_worker: int) -> None:
        if self.counting:
            self.up += int(nbytes)
            self.worker_max = max(self.worker_max, int(per_worker))

    def _bcast(self, buf: Array) -> None:
        self.comm.Bcast(buf, root=0)
        if self.counting and self.rank == 0:
            self.down += buf.nbytes

    # -- local gradients -------------------------------------------------------------------
    def rows(self, x: Array) -> Array:
        """The held workers' gradients at ``x``, shape ``(m, d)`` (cached for the last two x)."""
        for cx, r in self._cache:
            if cx is x:
                return r
        r = np.empty((len(self.workers), self.d))
        for j, i in enumerate(self.workers):
            g = np.asarray(self.problem.local_grad(i, x), dtype=np.float64)
            if g.shape != (self.d,):
                raise ValueError(f"local_grad({i}, x) returned shape {g.shape}, expected ({self.d},)")
            r[j] = g
        self._cache = [(x, r)] + self._cache[:1]
        return r

    # -- means over all workers --------------------------------------------------------------
    def mean_rows(self, rows: Array) -> Array:
        """``(1/n) Σ_i v_i`` over all workers from the held rows ``v_i`` (one per held worker)."""
        n, d, MPI = self.n, self.d, self.MPI
        if self.reduce == "ordered":
            plan = Plan(np.arange(n + 1, dtype=np.int64) * d, np.tile(np.arange(d, dtype=np.int64), n), np.ones(n))
            return self._mean_plan(plan, np.ascontiguousarray(rows, dtype=np.float64).ravel(), 8 * d)
        acc = np.zeros(d)
        for r in rows:
            acc += r
        self._sent(acc.nbytes, acc.nbytes)
        out = np.empty(d)
        if self.mode == "p2p":
            self.comm.Allreduce(acc, out, op=MPI.SUM)
            return out / n
        self.comm.Reduce(acc, out if self.rank == 0 else None, op=MPI.SUM, root=0)
        return self._share(out / n if self.rank == 0 else None)

    def mean_scalars(self, vals: Sequence[float]) -> float:
        """``(1/n) Σ_i s_i`` over all workers, summed in worker order (the recorded loss; not counted)."""
        buf = np.asarray(vals, dtype=np.float64)
        counts = [len(b) for b in self.blocks]
        allv = np.empty(self.n)
        self.comm.Allgatherv(buf, [allv, counts, _displs(counts), self.MPI.DOUBLE])
        acc = 0.0
        for v in allv:
            acc += float(v)
        return acc / self.n

    def mean_plan(self, plan: Plan, values: Array, *, unique: bool = False) -> Array:
        """``(1/n) Σ_i C_i(a_i)`` from the held workers' values at the plan's coordinates
        (concatenated in worker order): only values travel. ``unique``: every coordinate is
        sent by exactly one worker (PermK with ``d ≥ n``), so the blocks are placed, not summed."""
        off = plan.offsets
        sizes = np.diff(off[self.workers.start : self.workers.stop + 1])
        return self._mean_plan(plan, values, 8 * int(sizes.max(initial=0)), unique=unique)

    def _mean_plan(self, plan: Plan, values: Array, per_worker: int, *, unique: bool = False) -> Array:
        off = plan.offsets
        counts = [int(off[b.stop] - off[b.start]) for b in self.blocks]
        values = np.ascontiguousarray(values, dtype=np.float64)
        if values.size != counts[self.rank]:
            raise ValueError(f"this rank's message has {values.size} values, the plan says {counts[self.rank]}")
        self._sent(values.nbytes, per_worker)
        recv = self._gather(values, counts, self.MPI.DOUBLE)
        if recv is None:
            return self._share(None)
        if unique:
            # one term per coordinate: 0.0 + v (as the worker-order sum computes it, -0.0 -> 0.0)
            out = np.zeros(self.d)
            recv += 0.0
            out[plan.coords] = recv
            out /= self.n
            return self._share(out)
        # worker-order sum from 0: np.bincount adds the weights one after the other
        return self._share(np.bincount(plan.coords, weights=recv, minlength=self.d) / self.n)

    def mean_pairs(self, msgs: Sequence[Message], fixed: int | None) -> Array:
        """``(1/n) Σ_i C_i(a_i)`` from the held workers' messages, sent as (index, value) pairs.
        ``fixed``: every message's length when known to all ranks (TopK); else the lengths are
        exchanged first (8 bytes per rank, counted)."""
        MPI = self.MPI
        wide = self.d >= 2**32
        idx = np.ascontiguousarray(np.concatenate([m.indices for m in msgs]).astype(np.uint64 if wide else np.uint32))
        val = np.ascontiguousarray(np.concatenate([m.values for m in msgs]), dtype=np.float64)
        lens = [len(m.values) for m in msgs]
        if fixed is not None:
            if any(k != fixed for k in lens):
                raise ValueError(f"a message has {lens} values, expected {fixed} per worker")
            counts = [fixed * len(b) for b in self.blocks]
        else:
            mine = np.array([val.size], dtype=np.int64)
            allc = np.empty(self.size, dtype=np.int64)
            self.comm.Allgather(mine, allc)
            self._sent(mine.nbytes, 0)
            counts = [int(c) for c in allc]
        self._sent(idx.nbytes + val.nbytes, max(lens) * (8 + idx.itemsize))
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

    def _buffer(self, size: int, dtype: Any) -> Array:
        """A receive buffer, reused across rounds (its contents are consumed before the next
        collective)."""
        key = (int(size), np.dtype(dtype).str)
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


def _displs(counts: Sequence[int]) -> list[int]:
    return [int(v) for v in np.concatenate([[0], np.cumsum(counts)[:-1]])] if counts else []


class _GlobalView:
    """What the shared driver loop needs of the problem (``grad``, ``loss``, ``f_star``),
    computed with collectives over the local problems; its traffic is not counted."""

    def __init__(self, c: _Comm, f_star: float | None) -> None:
        self.c = c
        self.n, self.d = c.n, c.d
        self.f_star = f_star

    def grad(self, x: Array) -> Array:
        c = self.c
        c.counting, saved = False, (c.up, c.down, c.worker_max)
        try:
            return c.mean_rows(c.rows(x))
        finally:
            c.counting = True
            c.up, c.down, c.worker_max = saved

    def loss(self, x: Array) -> float:
        p = self.c.problem
        return self.c.mean_scalars([float(p.local_loss(i, x)) for i in self.c.workers])


# ---------------------------------------------------------------------------------------------
# set-up: collective validation, then a guarded run
# ---------------------------------------------------------------------------------------------
def _digest(*arrays: Any) -> str:
    h = hashlib.blake2b(digest_size=12)
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return h.hexdigest()


def _flat(info: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in info.items():
        if isinstance(v, dict):
            out.update({f"{k}[{kk!r}]": vv for kk, vv in v.items()})
        else:
            out[k] = v
    return out


def _agree(comm: Any, setup: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``setup`` on every rank, then check that every rank succeeded and agrees: else every
    rank raises the same :class:`LaunchError`."""
    size = comm.Get_size()
    exc: Exception | None = None
    try:
        info, err = setup(), None
    except Exception as e:  # reported collectively below
        exc, info, err = e, {}, f"{type(e).__name__}: {e}"
    reports = comm.allgather((err, info))
    errors = [(r, e) for r, (e, _) in enumerate(reports) if e is not None]
    if errors:
        if exc is not None and len(errors) == size and all(e == err for _, e in errors):
            raise exc  # the same error on every rank: raise it as is
        listing = "; ".join(f"rank {r}: {e}" for r, e in errors)
        raise LaunchError(f"the run cannot start ({listing})")
    ref = _flat(reports[0][1])
    for r, (_, info_r) in enumerate(reports):
        other = _flat(info_r)
        for k in ref:
            if k != "workers" and other.get(k) != ref[k]:
                raise LaunchError(
                    f"the ranks disagree on {k}: rank 0 has {ref[k]!r}, rank {r} has {other.get(k)!r} "
                    "(every rank must run the same problem size, seed and arguments)"
                )
    n = reports[0][1]["n"]
    for r, (_, other) in enumerate(reports):
        want = workers_of(n, size=size, rank=r)
        if tuple(other["workers"]) != (want.start, want.stop):
            raise LaunchError(
                f"bad launch: rank {r} holds workers range{tuple(other['workers'])} but n={n} workers on "
                f"{size} processes put range({want.start}, {want.stop}) there; build each rank's problem "
                "for the workers given by permk.distributed.workers_of(n)"
            )
    return info


def _guarded(comm: Any, abort_on_error: bool, fn: Callable[[], Any]) -> Any:
    """Run ``fn``; if it raises on this rank (and other ranks may be waiting in a collective),
    print the traceback and abort the whole job."""
    try:
        return fn()
    except BaseException:
        if not abort_on_error or comm.Get_size() == 1:
            raise
        sys.stderr.write(f"[permk.distributed] rank {comm.Get_rank()}/{comm.Get_size()} failed; aborting the job:\n")
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
        comm.Abort(1)
        raise  # pragma: no cover - Abort does not return


def _check_common(problem: Any, compressor: Compressor, mode: str, reduce: str) -> tuple[int, int]:
    for attr in ("n", "d", "x0", "workers", "local_grad"):
        if not hasattr(problem, attr):
            raise TypeError(
                f"the problem must be a permk.distributed.LocalProblem (missing {attr!r}); wrap a global "
                "problem with permk.distributed.LocalView(problem)"
            )
    if mode not in ("p2p", "server"):
        raise ValueError(f"mode must be 'p2p' or 'server', got {mode!r}")
    if reduce not in ("allreduce", "ordered"):
        raise ValueError(f"reduce must be 'allreduce' or 'ordered', got {reduce!r}")
    n, d = _check_compressor(problem, compressor)
    ws = list(problem.workers)
    if not ws or ws != list(range(ws[0], ws[0] + len(ws))):
        raise ValueError(f"problem.workers must be a non-empty contiguous range, got {ws}")
    x0 = np.asarray(problem.x0, dtype=np.float64)
    if x0.shape != (d,):
        raise ValueError(f"problem.x0 must have shape ({d},), got {x0.shape}")
    return n, d


def _setup_info(problem: Any, compressor: Compressor, params: dict[str, Any], state: Any, x0: Array | None, *,
                rounds: int, record_every: int) -> dict[str, Any]:
    """What every rank must agree on before the first round (checked by :func:`_agree`)."""
    n, d = params["n"], params["d"]
    if state is not None:
        start = _digest(state.x, state.g, [state.round, state.seed % 2**52])
    else:
        x_init = np.asarray(problem.x0 if x0 is None else x0, dtype=np.float64)
        if x_init.shape != (d,):
            raise ValueError(f"x0 must have shape ({d},), got {x_init.shape}")
        start = _digest(x_init)
    return {"n": n, "d": d, "workers": (problem.workers[0], problem.workers[-1] + 1), "params": params,
            "rounds": rounds, "record_every": record_every, "start": start, "compressor": repr(compressor),
            "f_star": getattr(problem, "f_star", None) if hasattr(problem, "local_loss") else None}


def _finish(comm: Any, c: _Comm, res: RunResult, per_round: list[tuple[int, int, int, int]], mode: str, reduce: str) -> DistributedRunResult:
    MPI = c.MPI
    arr = np.array(per_round, dtype=np.int64).reshape(-1, 4)
    up = np.ascontiguousarray(arr[:, 0])
    sent = np.empty((c.size, up.size), dtype=np.int64)
    comm.Allgather(up, sent)
    down = np.ascontiguousarray(arr[:, 1])
    comm.Bcast(down, root=0)
    wmax = np.empty(up.size, dtype=np.int64)
    comm.Allreduce(np.ascontiguousarray(arr[:, 2]), wmax, op=MPI.MAX)
    digests = comm.allgather(_digest(res.x, res.state.g))
    if len(set(digests)) != 1:
        raise RuntimeError(
            "the ranks ended with different iterates: the MPI library's reductions are not identical on "
            "every rank; use reduce='ordered' or mode='server'"
        )
    base = {f.name: getattr(res, f.name) for f in fields(RunResult)}
    return DistributedRunResult(**base, mode=mode, reduce=reduce, n_procs=c.size, workers=c.workers, bytes_sent=sent,
                                bytes_broadcast=down, bytes_per_worker=wmax,
                                theory_bytes_per_worker=np.ascontiguousarray(arr[:, 3]))


# ---------------------------------------------------------------------------------------------
# drivers
# ---------------------------------------------------------------------------------------------
def marina(
    problem: LocalProblem,
    compressor: Compressor,
    *,
    rounds: int,
    seed: int,
    gamma: float | None = None,
    p: float | None = None,
    gamma_multiplier: float = 1.0,
    pl: bool = False,
    constants: str = "exact",
    float_bits: int = 32,
    record_every: int = 1,
    progress: bool = False,
    path: str = "auto",
    state: MarinaState | None = None,
    x0: Array | None = None,
    comm: Any = None,
    mode: Mode = "p2p",
    reduce: Reduce = "allreduce",
    abort_on_error: bool = True,
    _method: str = "marina",
) -> DistributedRunResult:
    """Algorithm "MARINA" on MPI: the arguments and result of :func:`permk.marina`, with the
    problem a :class:`LocalProblem` of this rank, plus ``comm`` (default ``COMM_WORLD``),
    ``mode`` (``"p2p"`` or ``"server"``), ``reduce`` (``"allreduce"`` or ``"ordered"``: how
    full gradients are summed) and ``abort_on_error``. ``path``: ``"fused"`` evaluates only the
    sent coordinates (``local_grad_coords``), ``"dense"`` whole local gradients, ``"auto"``
    the former when available. Every rank must call it with the same arguments.
    """
    comm = _world(comm)
    if path not in ("auto", "fused", "dense"):
        raise ValueError(f"path must be 'auto', 'fused' or 'dense' on MPI, got {path!r}")

    def setup() -> dict[str, Any]:
        n, d = _check_common(problem, compressor, mode, reduce)
        params = _marina_params(problem, compressor, rounds=rounds, seed=seed, gamma=gamma, p=p,  # type: ignore[arg-type]
                                gamma_multiplier=gamma_multiplier, pl=pl, constants=constants, float_bits=float_bits,
                                record_every=record_every, method=_method)
        plan_ok = compressor.shares_coordinates
        fused = hasattr(problem, "local_grad_coords") and plan_ok
        if path == "fused" and not fused:
            raise ValueError("path='fused' needs a compressor with a plan and a problem with local_grad_coords(i, x, cols)")
        used = "fused" if (path in ("auto", "fused") and fused) else "dense"
        params.update(path=used, backend="mpi", mode=mode, reduce=reduce, n_procs=comm.Get_size())
        if state is not None:
            _check_resume(state, MarinaState, seed)
        return _setup_info(problem, compressor, params, state, x0, rounds=rounds, record_every=record_every)

    info = _agree(comm, setup)
    params = info["params"]
    n, d, gam, pp = info["n"], info["d"], params["gamma"], params["p"]

    def run() -> DistributedRunResult:
        c = _Comm(comm, problem, mode, reduce)
        view = _GlobalView(c, info["f_star"])
        if state is None:
            x_init = np.array(problem.x0 if x0 is None else x0, dtype=np.float64)
            c.counting = False
            st = marina_init(x_init, c.mean_rows(c.rows(x_init)), seed=seed)  # the initial exchange is not counted
            c.counting = True
            c.take()
        else:
            st = state
        s_seed = st.seed
        fused = params["path"] == "fused"
        plan_ok = compressor.shares_coordinates
        fixed = compressor.floats_per_worker(n, d) if isinstance(compressor, TopK) else None
        coords = getattr(problem, "local_grad_coords", None)
        unique = isinstance(compressor, PermK) and d >= n

        def compressed_mean(x_new: Array, x_old: Array, t: int) -> Array:
            plan = compressor.plan(n, d, seed=s_seed, round=t) if plan_ok else None
            if plan is None:
                D = c.rows(x_new) - c.rows(x_old)
                msgs = [compressor.compress(D[j], worker=i, n_workers=n, seed=s_seed, round=t) for j, i in enumerate(c.workers)]
                return c.mean_pairs(msgs, fixed)
            parts = []
            for j, i in enumerate(c.workers):
                cols = plan.worker(i)
                if fused:
                    diff = np.asarray(coords(i, x_new, cols)) - np.asarray(coords(i, x_old, cols))  # type: ignore[misc]
                else:
                    diff = c.rows(x_new)[j][cols] - c.rows(x_old)[j][cols]
                parts.append(diff * plan.scales[i])
            return c.mean_plan(plan, np.concatenate(parts) if parts else np.zeros(0), unique=unique)

        full_bytes = 8 * d
        tail_bytes = _theory_bytes(compressor, n, d, plan_ok)
        per_round: list[tuple[int, int, int, int]] = []

        def step(s: MarinaState) -> tuple[MarinaState, bool]:
            new, heads = marina_update(s, gamma=gam, p=pp, full_mean=lambda x: c.mean_rows(c.rows(x)), compressed_mean=compressed_mean)
            per_round.append((*c.take(), full_bytes if heads else tail_bytes))
            return new, heads

        full_bits, tail_bits, expected = marina_round_bits(compressor, n, d, pp, float_bits)
        res = _drive(method=_method, problem=view, compressor=compressor, state=st, step=step,  # type: ignore[arg-type]
                     round_bits=lambda heads: full_bits if heads else tail_bits, expected_round_bits=expected,
                     rounds=rounds, record_every=record_every, progress=progress and comm.Get_rank() == 0, params=params)
        return _finish(comm, c, res, per_round, mode, reduce)

    return _guarded(comm, abort_on_error, run)  # type: ignore[no-any-return]


def _theory_bytes(compressor: Compressor, n: int, d: int, plan_ok: bool) -> int:
    """The theory's largest message of one worker on a compressed round, at float64 values (and
    32-bit indices where the receiver needs them)."""
    k = compressor.floats_per_worker(n, d)
    if plan_ok:
        return 8 * k
    return k * (8 + (4 if d < 2**32 else 8))


def gd(
    problem: LocalProblem,
    *,
    rounds: int,
    seed: int = 0,
    gamma: float | None = None,
    gamma_multiplier: float = 1.0,
    pl: bool = False,
    float_bits: int = 32,
    record_every: int = 1,
    progress: bool = False,
    state: MarinaState | None = None,
    x0: Array | None = None,
    comm: Any = None,
    mode: Mode = "p2p",
    reduce: Reduce = "allreduce",
    abort_on_error: bool = True,
) -> DistributedRunResult:
    """Gradient descent on MPI (:func:`permk.gd`): every round is a full-gradient round."""
    return marina(problem, Identity(), rounds=rounds, seed=seed, gamma=gamma, p=1.0, gamma_multiplier=gamma_multiplier,
                  pl=pl, float_bits=float_bits, record_every=record_every, progress=progress, path="dense",
                  state=state, x0=x0, comm=comm, mode=mode, reduce=reduce, abort_on_error=abort_on_error, _method="gd")


def ef21(
    problem: LocalProblem,
    compressor: Compressor,
    *,
    rounds: int,
    seed: int = 0,
    gamma: float | None = None,
    gamma_multiplier: float = 1.0,
    pl: bool = False,
    constants: str = "exact",
    float_bits: int = 32,
    count_indices: bool = True,
    record_every: int = 1,
    progress: bool = False,
    state: EF21State | None = None,
    x0: Array | None = None,
    comm: Any = None,
    mode: Mode = "p2p",
    reduce: Reduce = "allreduce",
    abort_on_error: bool = True,
) -> DistributedRunResult:
    """EF21 on MPI (:func:`permk.ef21`): each rank keeps the estimators ``g_i`` of its workers;
    TopK messages travel as (index, value) pairs. ``state.G`` holds this rank's rows (a
    simulator state with all ``n`` rows is sliced)."""
    comm = _world(comm)

    def setup() -> dict[str, Any]:
        n, d = _check_common(problem, compressor, mode, reduce)
        params = _ef21_params(problem, compressor, rounds=rounds, seed=seed, gamma=gamma,  # type: ignore[arg-type]
                              gamma_multiplier=gamma_multiplier, pl=pl, constants=constants, float_bits=float_bits,
                              record_every=record_every)
        params.update(backend="mpi", mode=mode, reduce=reduce, n_procs=comm.Get_size())
        if state is not None:
            _check_resume(state, EF21State, seed)
            m = len(problem.workers)
            if state.G.shape not in ((n, d), (m, d)):
                raise ValueError(f"state.G must hold all {n} rows or this rank's {m}, got shape {state.G.shape}")
        return _setup_info(problem, compressor, params, state, x0, rounds=rounds, record_every=record_every)

    info = _agree(comm, setup)
    params = info["params"]
    n, d, gam = info["n"], info["d"], params["gamma"]

    def run() -> DistributedRunResult:
        c = _Comm(comm, problem, mode, reduce)
        view = _GlobalView(c, info["f_star"])
        if state is None:
            x_init = np.array(problem.x0 if x0 is None else x0, dtype=np.float64)
            G0 = c.rows(x_init).copy()
            c.counting = False
            g0 = c.mean_rows(G0)  # the initial exchange of ∇f_i(x^0) is not counted
            c.counting = True
            c.take()
            st = replace(ef21_init(x_init, G0, seed=seed), g=g0)
        else:
            G = state.G[c.workers.start : c.workers.stop] if state.G.shape[0] == n else state.G
            st = replace(state, G=np.array(G, dtype=np.float64))
        s_seed = st.seed
        plan_ok = compressor.shares_coordinates
        fixed = compressor.floats_per_worker(n, d) if isinstance(compressor, TopK) else None
        sent: dict[str, Any] = {}

        def compress_rows(D: Array, t: int) -> Array:
            if plan_ok:
                plan = compressor.plan(n, d, seed=s_seed, round=t)
                assert plan is not None
                C = np.zeros_like(D)
                parts = []
                for j, i in enumerate(c.workers):
                    cols = plan.worker(i)
                    v = D[j][cols] * plan.scales[i]
                    C[j][cols] = v
                    parts.append(v)
                sent.update(plan=plan, values=np.concatenate(parts))
                return C
            msgs = [compressor.compress(D[j], worker=i, n_workers=n, seed=s_seed, round=t) for j, i in enumerate(c.workers)]
            sent.update(msgs=msgs)
            return np.stack([m.to_dense() for m in msgs])

        def mean(C: Array) -> Array:
            if plan_ok:
                return c.mean_plan(sent.pop("plan"), sent.pop("values"), unique=isinstance(compressor, PermK) and d >= n)
            return c.mean_pairs(sent.pop("msgs"), fixed)

        tail_bytes = _theory_bytes(compressor, n, d, plan_ok)
        per_round: list[tuple[int, int, int, int]] = []

        def step(s: EF21State) -> tuple[EF21State, None]:
            new = ef21_update(s, gamma=gam, local_grads=c.rows, compress_rows=compress_rows, mean=mean)
            per_round.append((*c.take(), tail_bytes))
            return new, None

        bits = float(compressor.bits_per_worker(n, d, float_bits=float_bits, indices=count_indices))
        expected = compressor.expected_bits_per_worker(n, d, float_bits=float_bits, indices=count_indices)
        res = _drive(method="ef21", problem=view, compressor=compressor, state=st, step=step,  # type: ignore[arg-type]
                     round_bits=lambda _: bits, expected_round_bits=expected, rounds=rounds,
                     record_every=record_every, progress=progress and comm.Get_rank() == 0, params=params)
        return _finish(comm, c, res, per_round, mode, reduce)

    return _guarded(comm, abort_on_error, run)  # type: ignore[no-any-return]
