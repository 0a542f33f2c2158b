"""Starting an MPI run safely: every rank validates the run and the ranks agree on it
(:func:`agree`, else the same :class:`LaunchError` on every rank), thread limits for ranks that
share a machine, and an uncaught exception on one rank aborting the whole job
(:func:`install_excepthook`, :func:`guarded`) instead of leaving the others waiting."""

from __future__ import annotations

import hashlib
import os
import sys
import traceback
from typing import Any, Callable

import numpy as np

from .._validate import check_output, start_point
from ..methods import State
from ..transport.mpi import mpi
from .local import LaunchError, LocalView, workers_of

__all__ = ["install_excepthook", "launched_by_mpiexec", "digest", "problem_digest", "shared_digest", "agree",
           "limit_threads_once", "guarded"]


_LAUNCHER_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS")


def launched_by_mpiexec() -> bool:
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




def digest(*arrays: Any) -> str:
    h = hashlib.blake2b(digest_size=12)
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return h.hexdigest()


def problem_digest(local: Any, d: int) -> str:
    """A digest of the problem data every rank must share, for the launch check: the problem's
    own ``fingerprint()`` when it has one; else its global ``grad`` (and ``loss``, when present)
    at ``x0`` and at a fixed pseudo-random point, which differ for different data (a
    :class:`~permk.distributed.LocalProblem` without a global ``grad`` shares only ``x0``, ``n``
    and ``d``, which the check compares anyway)."""
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
    return digest(*values)


def _flat(info: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in info.items():
        if isinstance(v, dict):
            out.update({f"{k}[{kk!r}]": vv for kk, vv in _flat(v).items()})
        else:
            out[k] = v
    return out


def agree(comm: Any, setup: Callable[[], dict[str, Any]]) -> dict[str, Any]:
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


def limit_threads_once(comm: Any) -> None:
    """Once per process: ``cores // (ranks on this machine)`` threads (:mod:`permk.parallel`),
    so that MPI ranks sharing a machine do not oversubscribe its cores."""
    if _THREADS_SET:
        return
    from ..parallel import limit_threads, threads_per_process

    local = comm.Split_type(mpi().COMM_TYPE_SHARED)
    try:
        _THREADS_SET.append(limit_threads(threads_per_process(local.Get_size())))
    finally:
        local.Free()


def guarded(comm: Any, abort_on_error: bool, fn: Callable[[], Any]) -> Any:
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


def shared_digest(state: State) -> str:
    """A digest of the state's shared arrays, its round and seed: the same on every rank."""
    return digest(*(getattr(state, name) for name in state.shared_arrays()), [state.round, state.seed % 2**52])
