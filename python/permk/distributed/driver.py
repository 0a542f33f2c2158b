"""Running a method on MPI: :func:`run`, the same method definition and driver loop the
simulator runs, on :class:`~permk.transport.mpi.MPIBackend`, returning a
:class:`DistributedRunResult` (the bytes measured on the MPI buffers added) on every rank."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Literal

import numpy as np

from ..compressors import Compressor, Identity
from ..methods import Algorithm, Method, RoundInfo, RunResult, State
from ..methods.driver import check_start, prepare, resolve, start, drive
from ..transport.mpi import MPIBackend, world
from .launch import agree, digest, guarded, limit_threads_once, problem_digest, shared_digest
from .local import as_local

__all__ = ["DistributedRunResult", "run", "shorthand", "Mode", "Reduce"]

Array = np.ndarray
Mode = Literal["p2p", "server"]
Reduce = Literal["allreduce", "ordered"]


@dataclass(frozen=True, eq=False)
class DistributedRunResult(RunResult):
    """A :class:`~permk.methods.RunResult` of an MPI run (the same on every rank), plus what was
    measured on the buffers handed to MPI. Per-round arrays have one entry per round run.

    Attributes
    ----------
    mode
        How the run communicated: :func:`run`'s ``mode``.
    reduce
        How its full gradients were summed: :func:`run`'s ``reduce``.
    n_procs
        The number of MPI processes.
    workers
        This rank's workers.
    bytes_sent
        ``(n_procs, rounds)``, the bytes each rank handed to MPI as its workers' messages
        (values, and indices where they travel) in each round.
    bytes_broadcast
        ``(rounds,)``, the bytes rank 0 broadcast back (server mode; 0 in p2p mode).
    bytes_per_worker
        ``(rounds,)``, the largest message of one worker in each round, measured.
    theory_bytes_per_worker
        ``(rounds,)``, the theory's largest message at float64 values: ``8d`` on full-gradient
        rounds, ``8 ζ`` on compressed rounds (``8⌈d/n⌉`` for PermK with ``d ≥ n``), plus 4 bytes
        per index for compressors whose indices travel (TopK; the paper counts ``⌈log2 d⌉`` bits
        per index in ``bits_per_worker``, MPI carries 32).
    """

    mode: str
    reduce: str
    n_procs: int
    workers: range
    bytes_sent: Array
    bytes_broadcast: Array
    bytes_per_worker: Array
    theory_bytes_per_worker: Array


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
    digests = comm.allgather(shared_digest(res.state))
    if len(set(digests)) != 1:
        raise RuntimeError(
            "the ranks ended with different iterates: the MPI library's reductions are not identical on "
            "every rank; use reduce='ordered' or mode='server'"
        )
    base = {f.name: getattr(res, f.name) for f in fields(RunResult)}
    return DistributedRunResult(**base, mode=backend.mode, reduce=backend.reduce, n_procs=backend.size,
                                workers=backend.workers, bytes_sent=sent, bytes_broadcast=down, bytes_per_worker=wmax,
                                theory_bytes_per_worker=np.ascontiguousarray(arr[:, 3]))



def run(method: Algorithm, problem: Any, compressor: Compressor, *, rounds: int, seed: int, comm: Any = None,
        mode: Mode = "p2p", reduce: Reduce = "allreduce", abort_on_error: bool = True, record_every: int = 1,
        progress: bool = False, path: str = "auto", state: State | None = None, x0: Any = None, prefetch: bool | Literal["auto"] = "auto",
        window: bool | Literal["auto"] = "auto", **options: Any) -> DistributedRunResult:
    """Run ``method`` on MPI: the arguments and result of :func:`permk.run`, with the problem a
    :class:`~permk.distributed.LocalProblem` of this rank (or a global problem, viewed through
    :class:`~permk.distributed.LocalView`),
    plus ``comm`` (default ``COMM_WORLD``), ``mode`` (``"p2p"`` or ``"server"``), ``reduce``
    (``"allreduce"`` or ``"ordered"``: how full gradients are summed), ``abort_on_error`` and
    ``prefetch`` (compute round ``t + 1``'s shared plan on a background thread while round ``t``
    communicates: ``True``, ``False``, or ``"auto"``, when plans take a millisecond or more to
    compute) and ``window`` (a shared plan's values through an MPI-3 shared-memory window when every
    rank is on one node: ``"auto"``, ``True`` or ``False``, which always sends them through an
    ``Allgatherv``, e.g. to measure a network between the ranks); the iterates are the same either way. Every rank must call it with the same
    arguments. Every rank validates the run; the theory's step is computed once, on rank 0, and
    sent to the others."""
    method, options = resolve(method, options)
    comm = world(comm)
    rank = comm.Get_rank()
    limit_threads_once(comm)
    held: dict[str, Any] = {}

    def check() -> dict[str, Any]:
        local = as_local(problem, comm)
        backend = MPIBackend(local, comm, mode=mode, reduce=reduce, path=path, prefetch=prefetch, window=window)
        prepared = prepare(method, local, compressor, n=backend.n, d=backend.d, rounds=rounds, seed=seed,
                           record_every=record_every, **options)
        transport = {"backend": "mpi", "mode": mode, "reduce": reduce, "n_procs": comm.Get_size()}
        params = prepared.with_step(local) if rank == 0 or prepared.gamma is not None else None
        begin = check_start(method, local, backend, state, x0, seed, rounds)
        held.update(backend=backend, begin=begin, prepared=prepared, params=params, path=method.path(backend, prepared.sent, prepared.own),
                    transport=transport)
        return {"n": backend.n, "d": backend.d, "workers": (backend.workers.start, backend.workers.stop),
                "params": {**prepared.record(), "path": held["path"]}, "rounds": rounds, "record_every": record_every,
                "start": shared_digest(begin) if isinstance(begin, State) else digest(begin),
                "problem": problem_digest(local, backend.d),
                "compressor": f"{type(compressor).__qualname__} {compressor.fingerprint()}"}

    agree(comm, check)
    # the theory's step, computed once on rank 0
    params = replace(comm.bcast(held["params"], root=0), path=held["path"], transport=held["transport"])
    backend: MPIBackend = held["backend"]
    sent = held["prepared"].sent

    def go() -> DistributedRunResult:
        with backend.bytes.paused():  # the initial exchanges are not counted
            first = start(method, backend, sent, params, held["begin"], seed)
        per_round: list[tuple[int, int, int, int]] = []

        def count(info: RoundInfo) -> None:
            per_round.append(backend.bytes.take())

        res = drive(method, backend, sent, params, first, rounds=rounds, record_every=record_every,
                    progress=progress and rank == 0, on_round=count)
        backend.close()
        return _finish(backend, res, per_round)

    return guarded(comm, abort_on_error, go)  # type: ignore[no-any-return]


def _where(method: Method) -> str:
    """A cross-reference to a method: ``:func:`permk.NAME``` for the package's method objects,
    else to the method's class."""
    import permk

    if getattr(permk, method.name, None) is method:
        return f":func:`permk.{method.name}`"
    return f":class:`{type(method).__module__}.{type(method).__qualname__}`"


def shorthand(method: Method) -> Callable[..., DistributedRunResult]:
    """``method`` on MPI as a function of the simulator's arguments: ``shorthand(permk.marina)``
    is ``permk.distributed.marina``, :func:`run` with ``permk.marina``. A method that takes no
    compressor (``takes_compressor`` False: GD) is called without one and runs with the identity.

    Every method of :func:`permk.methods.catalog` has its shorthand as an attribute of
    :mod:`permk.distributed` (``permk.distributed.ef21``, ...), made on first use."""

    def with_compressor(problem: Any, compressor: Compressor, *, rounds: int, seed: int, **options: Any) -> DistributedRunResult:
        return run(method, problem, compressor, rounds=rounds, seed=seed, **options)

    def without_compressor(problem: Any, *, rounds: int, seed: int, **options: Any) -> DistributedRunResult:
        return run(method, problem, Identity(), rounds=rounds, seed=seed, **options)

    fn = with_compressor if method.takes_compressor else without_compressor
    fn.__name__ = fn.__qualname__ = method.name
    fn.__module__ = __name__
    # the method's own docstring is not copied: its cross-references are relative to its module
    fn.__doc__ = (f"{method.label} on MPI: :func:`~permk.distributed.run` with ``permk.{method.name}``, whose arguments and "
                  "options it takes (a :class:`~permk.distributed.LocalProblem` of this rank or a global problem), returning a "
                  ":class:`~permk.distributed.DistributedRunResult`; a state's per-worker arrays hold this rank's rows (a "
                  "simulator's state, of all n rows, is cut to them).\n\n"
                  f"The method, its parameters and its theory: {_where(method)}.")
    return fn
