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

runs with ``mpiexec -n 4 python script.py``. Each rank holds a contiguous block of the workers:

>>> import permk.distributed as pd
>>> [pd.workers_of(10, size=4, rank=r) for r in range(4)]
[range(0, 3), range(3, 6), range(6, 8), range(8, 10)]

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
  one ``Allgatherv`` in place fills in the others;
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

from typing import Any

from ..methods import catalog as method_catalog
from ..transport.mpi import MPIBackend as MPIBackend, mpi
from .driver import DistributedRunResult as DistributedRunResult, run as run, shorthand
from .launch import install_excepthook, launched_by_mpiexec
from .local import LaunchError as LaunchError, LocalProblem as LocalProblem, LocalView as LocalView, workers_of as workers_of

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

if launched_by_mpiexec():  # a raising rank must end the job, wherever in the script it raises
    mpi()
    install_excepthook()


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
