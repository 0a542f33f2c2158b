"""Real distributed runs on MPI: one process per worker (or a block of workers per process).

:func:`run` runs any method of :mod:`permk.methods` — the *same* definition the simulator
runs, through the same driver loop — on :class:`MPIBackend`, which holds this process's workers
and exchanges their messages with MPI; ``permk.distributed.marina``, ``ef21``, ``gd``, ``dcgd``
(every method of :func:`permk.methods.catalog`) are its thin spellings (:func:`shorthand`). They take the arguments of :func:`permk.marina` & co. and
return the same :class:`~permk.methods.RunResult` (a :class:`DistributedRunResult`, which adds
the bytes measured on the MPI buffers) on every rank. A script::

    import permk, permk.distributed as pd
    q = permk.Quadratic.synthetic(n=8, d=10_000, lam=1e-6, noise_scale=0.1, seed=0)
    res = pd.marina(q, permk.PermK(), rounds=1000, seed=1)   # each rank evaluates its own workers
    if res.workers.start == 0:
        print(res.grad_norm_sq[-1], res.bytes_per_worker[:5], res.theory_bytes_per_worker[:5])

runs with ``mpiexec -n 4 python script.py``.

Each process only evaluates the workers it holds: the problem is a :class:`LocalProblem`
(``n``, ``d``, ``x0``, ``workers`` and the held workers' gradients: ``local_grads(x)`` or
``local_grad(i, x)``), so the problem's data never has to exist on one process. ``n`` workers
are spread over ``size`` processes in contiguous blocks (:func:`workers_of`); a global problem
(e.g. :meth:`permk.Quadratic.synthetic`) is wrapped in :class:`LocalView` for this process.

Communication (``mode="p2p"``: every rank aggregates, the paper's peer-to-peer model;
``mode="server"``: messages are gathered on rank 0, which aggregates and broadcasts the
aggregate, from which every rank forms the new iterate, as in Algorithm "MARINA"'s
"broadcast g^t"), chosen by the compressor's capabilities:

* a shared plan (``capabilities.shared_plan``: PermK, shared-seed RandK, BlockPermK, …): every
  rank recomputes the round's plan from ``(seed, t)``, so only *values* travel
  (``Allgatherv``/``Gatherv``); each rank adds them at the recomputed coordinates in worker order
  (bit for bit the simulator's ``aggregate``), or places them when the plan is disjoint. With a
  problem that has the coordinate oracle ``local_grad_coords(x, rows, cols)`` only the sent
  coordinates are evaluated, for all the rank's workers in one call (``path="fused"``; with a
  native problem kernel and a Rust compressor the values are computed in Rust,
  ``path="rust"``). The plan is computed once per round (:meth:`permk.Compressor.round`), and
  round ``t + 1``'s plan on a background thread while round ``t`` communicates (``prefetch``:
  by default when plans cost a millisecond or more, e.g. PermK at large ``d``). When every rank
  holds one worker and the plan gives each worker one contiguous block of a disjoint round
  (``BlockPermK(n)``), each rank writes its values into its block of the aggregate buffer and
  one ``Allgatherv`` in place fills in the others. When all ranks share one node (p2p mode,
  ``MPIBackend(window="auto")``, the default), the other shared plans' values (PermK's) go
  through an MPI-3 shared-memory window instead of an ``Allgatherv``: each rank writes its
  workers' values into their place in the window, one barrier, and every rank sums them from
  there (the same bits; :meth:`MPIBackend._mean_values_shared`);
* otherwise (TopK, quantizers): ``(index, value)`` pairs (uint32 indices; no lengths exchanged
  when the messages have a fixed size); EF21 with a native problem kernel and a Rust compressor
  computes its workers' messages in one Rust call (``path="rust"``);
* full-gradient exchanges (MARINA's full rounds, EF21's initial exchange): ``Allreduce`` of each
  rank's sum over its workers (``reduce="allreduce"``; server mode: ``Reduce`` + ``Bcast``; the
  problem's own ``local_grad_sum(x)`` when it has one), or,
  with ``reduce="ordered"``, the workers' vectors gathered and summed in worker order, so that
  every sum in the run is the simulator's worker-order sum.

The record (``‖∇f‖²``, ``f − f*``) uses the local problem's global ``grad``/``loss`` when it
has them (a :class:`LocalView` does: every rank holds the whole problem), else collectives over
the workers (not counted as communication).

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
the seed, the compressor or any argument, an error on some ranks only) as
:class:`LaunchError` with the same message on every rank. The theory's step is computed once,
on rank 0, and sent to the others. An error during the run on one rank prints that rank's
traceback and calls ``MPI_Abort``, which ends the whole job with a non-zero exit (no rank is
left waiting in a collective). Importing this module installs the same abort for an exception
raised anywhere in an MPI job's script (:func:`install_excepthook`).
"""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
import time
import traceback
from dataclasses import dataclass, fields
from typing import Any, Callable, Literal, Protocol, Sequence, runtime_checkable

import numpy as np

from ._validate import check_choice, check_int, check_output, check_real, start_point
from .backends import HeldWorkers
from .compressors import Compressor, Identity, Messages, PendingRound, Ranges, Round
from .exchanges import Fill
from .methods import Method, RoundInfo, RunResult, State, drive
from .methods import catalog as method_catalog
from .methods import check_start, resolve, setup as method_setup, start
from .problems import index_array

#: The module's own names; ``__all__`` adds every catalog method's shorthand, read when it is
#: asked for (``from permk.distributed import *``), so importing the module scans no plugins.
_OWN_NAMES = [
    "LocalProblem",
    "LocalView",
    "LaunchError",
    "DistributedRunResult",
    "MPIBackend",
    "workers_of",
    "run",
    "shorthand",
    "install_excepthook",
]

Array = np.ndarray
Mode = Literal["p2p", "server"]
Reduce = Literal["allreduce", "ordered"]
#: ``prefetch="auto"`` computes the next round's plan ahead when the fastest of the first
#: ``PREFETCH_PROBES`` plans computed on this rank took at least ``PREFETCH_MIN_SECONDS``.
PREFETCH_MIN_SECONDS = 1e-3
PREFETCH_PROBES = 3


class _Holder:
    slot: Any = None


def _only_held_here() -> int:
    """What ``sys.getrefcount`` says of an object held by one attribute alone, measured as
    :meth:`MPIBackend._aggregate_buffer` measures (the count differs between CPython versions)."""
    h = _Holder()
    h.slot = object()
    buf = h.slot
    return sys.getrefcount(buf)


_ONLY_HELD_HERE = _only_held_here()


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError:  # pragma: no cover - exercised only without mpi4py
        raise ImportError("permk.distributed needs mpi4py and an MPI library: pip install 'permk[mpi]'") from None
    return MPI


def _world(comm: Any) -> Any:
    return _mpi().COMM_WORLD if comm is None else comm


class LaunchError(ValueError):
    """A run cannot start as launched; raised with the same message on every rank (so the job
    ends without ``MPI_Abort``: every rank reports it)."""

    collective = True


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
    size = check_int(size, "size", low=1)
    rank = check_int(rank, "rank", high=size)
    if n < size:
        raise LaunchError(
            f"n={n} workers cannot be spread over {size} processes (every process holds at least one "
            f"worker): launch with mpiexec -n k for some k <= {n}"
        )
    q, r = divmod(n, size)
    start = rank * q + min(rank, r)
    return range(start, start + q + (rank < r))


# ---------------------------------------------------------------------------------------------
# aborting the job on an uncaught exception
# ---------------------------------------------------------------------------------------------
_LAUNCHER_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS")


def _launched_by_mpiexec() -> bool:
    """Whether this process is one of several started by an MPI launcher."""
    for var in _LAUNCHER_VARS:
        try:
            if int(os.environ.get(var, "1")) > 1:
                return True
        except ValueError:
            continue
    return False


def install_excepthook(comm: Any = None) -> None:
    """Make an uncaught exception on any rank print its traceback and abort the whole MPI job
    (what ``python -m mpi4py script.py`` does), instead of leaving the other ranks waiting.

    Importing :mod:`permk.distributed` calls it when the process was started by an MPI launcher
    with several processes; it does nothing outside MPI jobs."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        MPI = sys.modules.get("mpi4py.MPI")
        if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
            previous(kind, value, tb)
            return
        c = MPI.COMM_WORLD if comm is None else comm
        if c.Get_size() == 1 or getattr(value, "collective", False):
            previous(kind, value, tb)  # one process, or an error every rank raises: no abort needed
            return
        sys.stderr.write(f"[permk.distributed] rank {c.Get_rank()}/{c.Get_size()}: uncaught exception\n")
        sys.stderr.write("".join(traceback.format_exception(kind, value, tb)))
        sys.stderr.flush()
        c.Abort(1)

    sys.excepthook = hook


if _launched_by_mpiexec():  # a raising rank must end the job, wherever in the script it raises
    _mpi()
    install_excepthook()


# ---------------------------------------------------------------------------------------------
# local problems
# ---------------------------------------------------------------------------------------------
@runtime_checkable
class LocalProblem(Protocol):
    """What one process knows of ``f = (1/n) Σ_i f_i``: the workers it holds and their oracles.

    Required: ``n``, ``d``, ``x0`` (the same on every rank), ``workers`` (the held workers, a
    contiguous ``range``: see :func:`workers_of`) and the held workers' gradients, either
    ``local_grads(x)`` (shape ``(len(workers), d)``) or ``local_grad(i, x)`` (``∇f_i(x)`` for a
    held worker ``i``). Optional, used when present: ``local_grad_coords(x, rows, cols)``
    (``∇f_{rows[k]}(x)[cols[k]]`` for held workers: PermK/RandK rounds then evaluate only the
    sent coordinates), ``local_grad_sum(x)`` (``Σ_i ∇f_i(x)`` over the held workers, shape
    ``(d,)``: full-gradient rounds with ``reduce="allreduce"`` then send it instead of summing
    ``local_grads``), ``local_loss(i, x)`` (``f_i(x)``; with ``f_star`` the run records
    ``f(x) − f*``), global ``grad(x)``/``loss(x)`` for the record, a native ``kernel``, and the
    global constants ``L_minus``, ``L_plus``, ``L_pm``, ``L_i``, ``mu`` for the theory's step
    (else pass ``gamma=``); for the finite-sum methods (VR-MARINA, SGD) the global
    ``sample_counts`` and ``L_sample_rms`` and the held workers' minibatch oracles
    ``minibatch_grads(x, b, *, seed, round, workers)`` and ``minibatch_grads_pair(x, y, b, *,
    seed, round, workers)`` (:class:`permk.classification.FiniteSumProblem`).
    """

    n: int
    d: int
    x0: np.ndarray

    @property
    def workers(self) -> Sequence[int]:
        """The workers this process holds (a contiguous range)."""
        ...


_PASS_THROUGH = ("L_minus", "L_plus", "L_pm", "L_i", "mu", "kernel", "exact_smoothness", "hessians", "sample_counts", "L_sample_rms")


class LocalView:
    """A global :class:`~permk.Problem` seen from one process: only the oracles of the workers in
    ``workers`` (default: this process's block, :func:`workers_of`) are called for the round's
    messages; the global ``grad``, ``loss``, ``f_star``, the constants and a native ``kernel``
    are passed through.

    >>> import permk
    >>> q = permk.Quadratic.synthetic(n=4, d=6, lam=1e-3, noise_scale=0.1, seed=0)
    >>> v = LocalView(q, workers=range(0, 4))
    >>> bool(abs(sum(v.local_loss(i, q.x0) for i in v.workers) / 4 - q.loss(q.x0)) < 1e-9)
    True
    >>> LocalView(q, workers=range(2, 4)).local_grads(q.x0).shape
    (2, 6)
    """

    def __init__(self, problem: Any, workers: Sequence[int] | None = None, *, comm: Any = None) -> None:
        for attr in ("n", "d", "x0"):
            if not hasattr(problem, attr):
                raise TypeError(f"LocalView wraps a global problem (permk.problems.Problem); it has no {attr!r}")
        if not (hasattr(problem, "local_grads") or hasattr(problem, "local_grad")):
            raise TypeError("LocalView wraps a global problem (permk.problems.Problem); it has no local_grads or local_grad")
        self.problem = problem
        self.n = check_int(problem.n, "problem.n", low=1)
        self.d = check_int(problem.d, "problem.d", low=1)
        self.x0 = start_point(problem.x0, self.d, "problem.x0")
        ws = list(workers_of(self.n, comm) if workers is None else workers)
        ws = [check_int(i, "worker", high=self.n) for i in ws]
        if not ws or ws != list(range(ws[0], ws[0] + len(ws))):
            raise ValueError(f"workers must be a non-empty contiguous range of worker indices, got {ws}")
        self.workers = range(ws[0], ws[0] + len(ws))
        self._grad0: dict[int, np.ndarray] = {}
        if hasattr(problem, "local_grad_coords"):
            self.local_grad_coords = self._local_grad_coords
        if hasattr(problem, "local_loss") or hasattr(problem, "hessians"):
            self.local_loss = self._local_loss
        if hasattr(problem, "minibatch_grads"):
            self.minibatch_grads = self._minibatch_grads
        if hasattr(problem, "minibatch_grads_pair"):
            self.minibatch_grads_pair = self._minibatch_grads_pair

    def __getattr__(self, name: str) -> Any:
        # the global constants, a native kernel and the exact constants are the wrapped problem's
        if name in _PASS_THROUGH and "problem" in self.__dict__:
            return getattr(self.problem, name)
        raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")

    def _held(self, i: int) -> int:
        i = check_int(i, "i", high=self.n)
        if i not in self.workers:
            raise ValueError(f"worker {i} is not held by this process (it holds {self.workers})")
        return i

    def grad(self, x: Any) -> np.ndarray:
        """The global ``∇f(x)`` (every process holds the whole problem)."""
        return np.asarray(self.problem.grad(x), dtype=np.float64)

    def loss(self, x: Any) -> float:
        """The global ``f(x)``."""
        return float(self.problem.loss(x))

    @property
    def f_star(self) -> float | None:
        return getattr(self.problem, "f_star", None)

    def local_grads(self, x: Any) -> np.ndarray:
        """The held workers' gradients, shape ``(len(workers), d)``."""
        ws = self.workers
        kernel = getattr(self.problem, "kernel", None)
        if kernel is not None:
            return kernel.local_grads(np.ascontiguousarray(x, dtype=np.float64), ws.start, ws.stop)  # type: ignore[no-any-return]
        if hasattr(self.problem, "local_grad"):
            return np.stack([np.asarray(self.problem.local_grad(i, x), dtype=np.float64) for i in ws])
        return np.asarray(self.problem.local_grads(x), dtype=np.float64)[ws.start : ws.stop]

    def local_grad(self, i: int, x: Any) -> np.ndarray:
        i = self._held(i)
        if hasattr(self.problem, "local_grad"):
            return np.asarray(self.problem.local_grad(i, x), dtype=np.float64)
        return np.asarray(self.problem.local_grads(x), dtype=np.float64)[i]

    def _local_grad_coords(self, x: Any, rows: Any, cols: Any) -> np.ndarray:
        r = index_array(rows, "rows")
        if r.size and (int(r.min()) < self.workers.start or int(r.max()) >= self.workers.stop):
            raise ValueError(f"rows must be workers held by this process ({self.workers})")
        return np.asarray(self.problem.local_grad_coords(x, r, cols))

    def _held_workers(self, workers: Any) -> Any:
        w = index_array(workers, "workers")
        if w.size and (int(w.min()) < self.workers.start or int(w.max()) >= self.workers.stop):
            raise ValueError(f"workers must be held by this process ({self.workers})")
        return w

    def _minibatch_grads(self, x: Any, batch_size: int, *, seed: int, round: int, workers: Any) -> Any:
        return self.problem.minibatch_grads(x, batch_size, seed=seed, round=round, workers=self._held_workers(workers))

    def _minibatch_grads_pair(self, x: Any, y: Any, batch_size: int, *, seed: int, round: int, workers: Any) -> Any:
        return self.problem.minibatch_grads_pair(x, y, batch_size, seed=seed, round=round, workers=self._held_workers(workers))

    def _local_loss(self, i: int, x: Any) -> float:
        i = self._held(i)
        if hasattr(self.problem, "local_loss"):
            return float(self.problem.local_loss(i, x))
        # f_i(x) = ½ xᵀA_i x − b_iᵀx = ½ xᵀ(∇f_i(x) + ∇f_i(0)) for a quadratic.
        if i not in self._grad0:
            self._grad0[i] = self.local_grad(i, np.zeros(self.d))
        x = np.asarray(x, dtype=np.float64)
        return float(0.5 * (x @ (self.local_grad(i, x) + self._grad0[i])))

    def __repr__(self) -> str:
        return f"LocalView({self.problem!r}, workers={self.workers})"


def as_local(problem: Any, comm: Any = None) -> Any:
    """``problem`` as this process's local problem: a :class:`LocalProblem` as it is, a global
    problem wrapped in :class:`LocalView`."""
    return problem if hasattr(problem, "workers") else LocalView(problem, comm=comm)


# ---------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
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
# the backend
# ---------------------------------------------------------------------------------------------
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
        self.comm = _world(comm)
        self.MPI = _mpi()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.problem = problem
        self.n = check_int(problem.n, "problem.n", low=1)
        self.d = check_int(problem.d, "problem.d", low=1)
        ws = [check_int(i, "worker", high=self.n) for i in problem.workers]
        if not ws or ws != list(range(ws[0], ws[0] + len(ws))):
            raise ValueError(f"problem.workers must be a non-empty contiguous range, got {ws}")
        self.workers = range(ws[0], ws[-1] + 1)
        self.blocks = [workers_of(self.n, size=self.size, rank=r) for r in range(self.size)] if self.n >= self.size else []
        self.counting = True
        self.up = self.down = self.worker_max = self.theory = 0
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
        self._agg: Array | None = None

    # -- counters ------------------------------------------------------------------------------
    def take(self) -> tuple[int, int, int, int]:
        """This round's ``(bytes sent, bytes broadcast, largest worker message, theory bytes per
        worker)``, and reset them. A round of several exchanges (RandDIANA's full gradients and
        compressed message) counts the sum of their largest worker messages and of their
        theory sizes."""
        out = (self.up, self.down, self.worker_max, self.theory)
        self.up = self.down = self.worker_max = self.theory = 0
        return out

    def _sent(self, nbytes: int, per_worker: int) -> None:
        if self.counting:
            self.up += int(nbytes)
            self.worker_max += int(per_worker)

    def _bcast(self, buf: Array) -> None:
        self.comm.Bcast(buf, root=0)
        if self.counting and self.rank == 0:
            self.down += buf.nbytes

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
        if self.counting:
            self.theory += 8 * d
        if self.reduce == "ordered":
            return self._mean_ordered(np.ascontiguousarray(rows, dtype=np.float64).ravel())
        acc = np.zeros(d)
        for r in rows:
            acc += r
        return self._mean_of_sums(acc)

    def _mean_of_sums(self, acc: Array) -> Array:
        """``(1/n) Σ_ranks acc`` from this rank's sum ``acc`` over its workers (``Allreduce``;
        server mode: ``Reduce`` + ``Bcast``)."""
        self._sent(acc.nbytes, acc.nbytes)
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
        if self.counting:
            self.theory += 8 * self.d
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
        one contiguous block, the values are written in place (:meth:`_mean_in_place`)."""
        if self.counting:
            self.theory += self._theory_bytes(compressor)
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
        if self.counting:
            self.theory += self._theory_bytes(compressor)
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
        out = self._aggregate_buffer() if holder else None
        if out is not None and sum(counts) != self.d:
            out.fill(0.0)
        dest = out[lo:hi] if out is not None else self._buffer(hi - lo, np.float64)
        vals = fill(w, w + 1, self.n, dest)
        self._sent(vals.nbytes, vals.nbytes)
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
        self._sent(dest.nbytes, 8 * int(sizes.max(initial=0)))
        win, node, _ = self._win
        win.Sync()
        node.Barrier()
        win.Sync()
        return r.mean(buf, out=self._aggregate_buffer())

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
        self._sent(values.nbytes, 8 * int(sizes.max(initial=0)))
        recv = self._gather(values, counts, self.MPI.DOUBLE)
        return self._share(None if recv is None else r.mean(recv, out=self._aggregate_buffer()))

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
        self._sent(vals.nbytes, 8 * d)
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
            self._sent(mine.nbytes, 0)
            counts = [int(c) for c in allc]
        self._sent(idx.nbytes + val.nbytes, int(lens.max(initial=0)) * (8 + idx.itemsize))
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

    def _aggregate_buffer(self) -> Array:
        """A ``(d,)`` array for a round's aggregate: the last one handed out when nothing but this
        backend holds it any more (the method has consumed it: ``g + Δ`` made a new array), else
        a new one. A fresh array of ``d`` floats costs page faults on first touch (~1 ms per
        8 MB), which is as much as the exchange of a large block round."""
        buf = self._agg
        if buf is None or sys.getrefcount(buf) > _ONLY_HELD_HERE:
            buf = self._agg = np.empty(self.d)
        return buf

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

    def _uncounted(self, fn: Callable[[], Any]) -> Any:
        saved, self.counting = (self.up, self.down, self.worker_max, self.theory), False
        try:
            return fn()
        finally:
            self.counting = True
            self.up, self.down, self.worker_max, self.theory = saved

    def metrics(self, x: Array) -> tuple[float, float | None]:
        """``‖∇f(x)‖²`` and ``f(x) − f*``: from the local problem's global ``grad``/``loss`` when
        it has them, else by collectives over the workers (not counted)."""
        with np.errstate(over="ignore", invalid="ignore"):
            if hasattr(self.problem, "grad"):
                g = check_output(self.problem.grad(x), (self.d,), "problem.grad(x)")
            else:
                g = self._uncounted(lambda: self.mean_grad(x))
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


# ---------------------------------------------------------------------------------------------
# set-up: collective validation, then a guarded run
# ---------------------------------------------------------------------------------------------
def _digest(*arrays: Any) -> str:
    h = hashlib.blake2b(digest_size=12)
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return h.hexdigest()


def problem_digest(local: Any, d: int) -> str:
    """A digest of the problem data every rank must share, for the launch check: the problem's
    own ``fingerprint()`` when it has one; else its global ``grad`` (and ``loss``, when present)
    at ``x0`` and at a fixed pseudo-random point, which differ for different data (a
    :class:`LocalProblem` without a global ``grad`` shares only ``x0``, ``n`` and ``d``, which
    the check compares anyway)."""
    problem = local.problem if isinstance(local, LocalView) else local
    own = getattr(problem, "fingerprint", None)
    if callable(own):
        return f"fingerprint {own()}"
    if not hasattr(local, "grad"):
        return "no global oracle"
    x0 = start_point(local.x0, d, "problem.x0")
    z = np.random.default_rng(0x70726F62).standard_normal(d)
    values = [check_output(local.grad(x), (d,), "problem.grad(x)") for x in (x0, z)]
    if hasattr(local, "loss"):
        values.append(np.array([float(local.loss(x)) for x in (x0, z)]))
    return _digest(*values)


def _flat(info: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in info.items():
        if isinstance(v, dict):
            out.update({f"{k}[{kk!r}]": vv for kk, vv in _flat(v).items()})
        else:
            out[k] = v
    return out


def _agree(comm: Any, setup: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``setup`` on every rank, then check that every rank succeeded and agrees on every entry
    of its result (but ``workers``, checked against the layout): else every rank raises the same
    :class:`LaunchError`. Returns this rank's result."""
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
            exc.collective = True  # type: ignore[attr-defined]  # raised on every rank: no abort
            raise exc  # the same error on every rank: raise it as is
        listing = "; ".join(f"rank {r}: {e}" for r, e in errors)
        raise LaunchError(f"the run cannot start ({listing})")
    ref = _flat(reports[0][1])
    for r, (_, info_r) in enumerate(reports):
        other = _flat(info_r)
        for k in sorted(set(ref) | set(other)):
            if k != "workers" and other.get(k) != ref.get(k):
                raise LaunchError(
                    f"the ranks disagree on {k}: rank 0 has {ref.get(k)!r}, rank {r} has {other.get(k)!r} "
                    "(every rank must run the same problem (size and data), seed, compressor and arguments)"
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


_THREADS_SET: list[int] = []


def _limit_threads_once(comm: Any) -> None:
    """Once per process: ``cores // (ranks on this machine)`` threads (:mod:`permk.parallel`),
    so that MPI ranks sharing a machine do not oversubscribe its cores."""
    if _THREADS_SET:
        return
    from .parallel import limit_threads, threads_per_process

    local = comm.Split_type(_mpi().COMM_TYPE_SHARED)
    try:
        _THREADS_SET.append(limit_threads(threads_per_process(local.Get_size())))
    finally:
        local.Free()


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


def _shared_digest(state: State) -> str:
    """A digest of the state's shared arrays, its round and seed: the same on every rank."""
    return _digest(*(getattr(state, name) for name in state.shared_arrays()), [state.round, state.seed % 2**52])


def _finish(backend: MPIBackend, res: RunResult, per_round: list[tuple[int, int, int, int]]) -> DistributedRunResult:
    comm, MPI = backend.comm, backend.MPI
    arr = np.array(per_round, dtype=np.int64).reshape(-1, 4)
    up = np.ascontiguousarray(arr[:, 0])
    sent = np.empty((backend.size, up.size), dtype=np.int64)
    comm.Allgather(up, sent)
    down = np.ascontiguousarray(arr[:, 1])
    comm.Bcast(down, root=0)
    wmax = np.empty(up.size, dtype=np.int64)
    comm.Allreduce(np.ascontiguousarray(arr[:, 2]), wmax, op=MPI.MAX)
    digests = comm.allgather(_shared_digest(res.state))
    if len(set(digests)) != 1:
        raise RuntimeError(
            "the ranks ended with different iterates: the MPI library's reductions are not identical on "
            "every rank; use reduce='ordered' or mode='server'"
        )
    base = {f.name: getattr(res, f.name) for f in fields(RunResult)}
    return DistributedRunResult(**base, mode=backend.mode, reduce=backend.reduce, n_procs=backend.size,
                                workers=backend.workers, bytes_sent=sent, bytes_broadcast=down, bytes_per_worker=wmax,
                                theory_bytes_per_worker=np.ascontiguousarray(arr[:, 3]))


# ---------------------------------------------------------------------------------------------
# drivers
# ---------------------------------------------------------------------------------------------
def run(method: Method, problem: Any, compressor: Compressor, *, rounds: int, seed: int, comm: Any = None,
        mode: Mode = "p2p", reduce: Reduce = "allreduce", abort_on_error: bool = True, record_every: int = 1,
        progress: bool = False, path: str = "auto", state: State | None = None, x0: Any = None, prefetch: bool | Literal["auto"] = "auto",
        **options: Any) -> DistributedRunResult:
    """Run ``method`` on MPI: the arguments and result of :func:`permk.run`, with the problem a
    :class:`LocalProblem` of this rank (or a global problem, viewed through :class:`LocalView`),
    plus ``comm`` (default ``COMM_WORLD``), ``mode`` (``"p2p"`` or ``"server"``), ``reduce``
    (``"allreduce"`` or ``"ordered"``: how full gradients are summed), ``abort_on_error`` and
    ``prefetch`` (compute round ``t + 1``'s shared plan on a background thread while round ``t``
    communicates: ``True``, ``False``, or ``"auto"``, when plans take a millisecond or more to
    compute; the iterates are the same either way). Every rank must call it with the same
    arguments."""
    method, options = resolve(method, options)
    comm = _world(comm)
    rank = comm.Get_rank()
    _limit_threads_once(comm)
    holder: dict[str, Any] = {}

    def setup() -> dict[str, Any]:
        local = as_local(problem, comm)
        backend = MPIBackend(local, comm, mode=mode, reduce=reduce, path=path, prefetch=prefetch)
        params = method_setup(method, local, compressor, n=backend.n, d=backend.d, rounds=rounds, seed=seed,
                              record_every=record_every, step=rank == 0, **options)
        sent = holder["sent"] = method.sent_compressor(compressor, params)
        params.update(path=method.exchange.path(backend, sent), backend="mpi", mode=mode, reduce=reduce,
                      n_procs=comm.Get_size())
        begin = check_start(method, local, backend, state, x0, seed)
        start_digest = _shared_digest(begin) if isinstance(begin, State) else _digest(begin)
        holder.update(backend=backend, begin=begin, params=params)
        theory_keys = ("gamma", "gamma_source", "L_minus", "L_plus", "L_pm", "mu", "constants")
        shared = {k: v for k, v in params.items() if k not in theory_keys or params["gamma_source"] == "user"}
        return {"n": backend.n, "d": backend.d, "workers": (backend.workers.start, backend.workers.stop),
                "params": shared, "rounds": rounds, "record_every": record_every, "start": start_digest,
                "problem": problem_digest(local, backend.d),
                "compressor": f"{type(compressor).__qualname__} {compressor.fingerprint()}"}

    _agree(comm, setup)
    params = comm.bcast(holder["params"], root=0)  # the theory's step, computed once on rank 0
    backend: MPIBackend = holder["backend"]

    def go() -> DistributedRunResult:
        backend.counting = False  # the initial exchanges are not counted
        first = start(method, backend, holder["sent"], params, holder["begin"], seed)
        backend.counting = True
        backend.take()
        per_round: list[tuple[int, int, int, int]] = []

        def count(info: RoundInfo) -> None:
            per_round.append(backend.take())

        res = drive(method, backend, holder["sent"], params, first, rounds=rounds, record_every=record_every,
                    progress=progress and rank == 0, on_round=count)
        backend.close()
        return _finish(backend, res, per_round)

    return _guarded(comm, abort_on_error, go)  # type: ignore[no-any-return]


def shorthand(method: Method) -> Callable[..., DistributedRunResult]:
    """``method`` on MPI as a function of the simulator's arguments: ``shorthand(permk.marina)``
    is ``permk.distributed.marina``, :func:`run` with ``permk.marina``. A method that takes no
    compressor (``takes_compressor`` False: GD) is called without one and runs with the identity.

    Every method of :func:`permk.methods.catalog` has its shorthand as an attribute of this
    module (``permk.distributed.ef21``, ...), made on first use."""

    def with_compressor(problem: Any, compressor: Compressor, *, rounds: int, seed: int, **options: Any) -> DistributedRunResult:
        return run(method, problem, compressor, rounds=rounds, seed=seed, **options)

    def without_compressor(problem: Any, *, rounds: int, seed: int, **options: Any) -> DistributedRunResult:
        return run(method, problem, Identity(), rounds=rounds, seed=seed, **options)

    fn = with_compressor if method.takes_compressor else without_compressor
    fn.__name__ = fn.__qualname__ = method.name
    fn.__module__ = __name__
    fn.__doc__ = (f"{method.label} on MPI: :func:`run` with ``permk.{method.name}``, whose arguments and options it takes "
                  f"(a :class:`LocalProblem` of this rank or a global problem), returning a :class:`DistributedRunResult`; "
                  "a state's per-worker arrays hold this rank's rows (a simulator's state, of all n rows, is cut to them).\n\n"
                  f"``permk.{method.name}``: {inspect.getdoc(method) or ''}")
    return fn


def __getattr__(name: str) -> Any:
    """The shorthand (:func:`shorthand`) of the catalog's method ``name``, or ``__all__``: the
    module's own names and every catalog method's shorthand."""
    if name == "__all__":
        return [*_OWN_NAMES, *method_catalog()]
    method = method_catalog().get(name)
    if method is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    fn = globals()[name] = shorthand(method)
    return fn


def __dir__() -> list[str]:
    return sorted({*globals(), *method_catalog()})

