"""What one MPI process knows of a problem: :class:`LocalProblem` (the workers it holds and their
oracles) and :class:`LocalView` (a global problem seen from one process)."""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from .._validate import check_int, index_array, start_point
from ..transport.mpi import block, world

__all__ = ["LaunchError", "workers_of", "LocalProblem", "LocalView", "as_local"]


class LaunchError(ValueError):
    """A run cannot start as launched; raised with the same message on every rank (so the job
    ends without ``MPI_Abort``: every rank reports it)."""

    collective = True


def workers_of(n: int, comm: Any = None, *, size: int | None = None, rank: int | None = None) -> range:
    """The workers a process holds: ``n`` workers in contiguous blocks over the processes, the
    first ``n mod size`` processes holding one more (a :class:`LaunchError` when there are fewer
    workers than processes).

    >>> [workers_of(10, size=4, rank=r) for r in range(4)]
    [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    """
    n = check_int(n, "n", low=1)
    if size is None or rank is None:
        c = world(comm)
        size, rank = c.Get_size(), c.Get_rank()
    size = check_int(size, "size", low=1)
    rank = check_int(rank, "rank", high=size)
    if n < size:
        raise LaunchError(
            f"n={n} workers cannot be spread over {size} processes (every process holds at least one "
            f"worker): launch with mpiexec -n k for some k <= {n}"
        )
    return block(n, size, rank)


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
    seed, round, workers)`` (:class:`permk.FiniteSumProblem`).
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
