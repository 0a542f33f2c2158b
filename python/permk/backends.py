"""Communication backends: the ``n`` workers of a problem as seen by one process, with the
exchanges the methods are made of.

A method (:mod:`permk.methods`) never talks to workers directly; each round it asks its backend
for one of these exchanges, and the backend evaluates the oracles the fastest way the problem
and the compressor allow:

* ``mean_grad(x)`` — ``(1/n) Σ_i ∇f_i(x)``: every worker sends its whole gradient;
* ``compressed_mean(c, x)`` — ``(1/n) Σ_i C_i(∇f_i(x))``;
* ``compressed_mean_diff(c, x, y)`` — ``(1/n) Σ_i C_i(∇f_i(x) − ∇f_i(y))`` (MARINA);
* ``error_feedback(c, x, G)`` — worker ``i`` sends ``c_i = C_i(∇f_i(x) − G_i)`` and keeps
  ``G_i + c_i``: returns ``((1/n) Σ_i c_i, G + C)`` (EF21);
* ``local_grads(x)`` and ``mean_rows(V)`` — the held workers' gradients, and an average of
  per-worker rows (EF21's initial exchange);
* ``metrics(x)`` — ``‖∇f(x)‖²`` and ``f(x) − f*`` for the record (not communication).

:class:`Simulator` holds all ``n`` workers; :class:`permk.distributed.MPIBackend` holds a block
of them per process and exchanges messages with MPI. Both choose their path by capability:

* ``"rust"`` — the problem has a native kernel (``problem.kernel``, e.g. the synthetic
  quadratic) and the compressor one (``compressor.kernel``): the whole exchange is one Rust call;
* ``"fused"`` — the compressor's coordinates are a pure function of ``(seed, round)``
  (``capabilities.shared_plan``) and the problem has the coordinate oracle
  ``local_grad_coords(x, rows, cols)``: only the sent coordinates are evaluated, ``O(d)`` per
  round instead of ``O(nd)``;
* ``"dense"`` — whole local gradients, then the compressor's ``aggregate``.

``path=`` forces one (for tests); the path a run used is in ``params["path"]``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from ._validate import check_choice, check_int, check_output, check_real
from .compressors import Compressor

__all__ = ["Backend", "Simulator", "EXCHANGES", "PATHS", "check_problem"]

Array = np.ndarray

#: The exchanges a backend offers (a method declares the one its rounds are made of).
EXCHANGES = ("mean_grad", "compressed_mean", "compressed_mean_diff", "error_feedback")
#: Evaluation paths, fastest first.
PATHS = ("rust", "fused", "dense")


@runtime_checkable
class Backend(Protocol):
    """The workers of a run as one process sees them (see the module docstring)."""

    n: int
    d: int
    workers: range

    def path(self, compressor: Compressor, exchange: str) -> str:
        """The path ``exchange`` takes with ``compressor`` (ValueError if a forced path is not available)."""
        ...

    def mean_grad(self, x: Array) -> Array: ...

    def compressed_mean(self, compressor: Compressor, x: Array, *, seed: int, round: int) -> Array: ...

    def compressed_mean_diff(self, compressor: Compressor, x: Array, y: Array, *, seed: int, round: int) -> Array: ...

    def error_feedback(self, compressor: Compressor, x: Array, G: Array, *, seed: int, round: int) -> tuple[Array, Array]: ...

    def local_grads(self, x: Array) -> Array: ...

    def mean_rows(self, rows: Array) -> Array: ...

    def metrics(self, x: Array) -> tuple[float, float | None]: ...


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


def finite(a: Array) -> bool:
    """Whether every entry of an oracle's answer (or a difference of two) is finite: the dense
    paths hand a compressor finite inputs only, and report the rest as divergence."""
    return bool(np.isfinite(a).all())


def native_pair(problem: Any, compressor: Compressor) -> tuple[Any, Any] | None:
    """``(problem.kernel, compressor.kernel)`` when both are native, else None."""
    pk, ck = getattr(problem, "kernel", None), compressor.kernel
    return (pk, ck) if pk is not None and ck is not None else None


def choose_path(forced: str, available: dict[str, bool], what: str) -> str:
    """The fastest available path, or the forced one (ValueError naming what it needs)."""
    if forced == "auto":
        return next(p for p in PATHS if available.get(p, False))
    if not available.get(forced, False):
        needs = {
            "rust": "a problem with a native kernel (Quadratic.synthetic) and a compressor with a Rust kernel and a shared plan",
            "fused": "a compressor with a shared plan (capabilities.shared_plan: PermK, RandK, BlockPermK, ...) and a problem "
                     "with the coordinate oracle local_grad_coords(x, rows, cols)",
        }.get(forced, "")
        raise ValueError(f"path={forced!r} is not available for {what}: it needs {needs}")
    return forced


class Simulator:
    """All ``n`` workers of ``problem`` in this process (the single-process simulator).

    Every user oracle's answer is checked where it is used (shape and dtype; the drivers treat a
    non-finite value as divergence): a ``grad`` of the wrong shape is a ValueError naming the
    oracle and both shapes, not a silently wrong run.
    """

    def __init__(self, problem: Any, *, path: str = "auto") -> None:
        self.n, self.d = check_problem(problem)
        self.problem = problem
        self.workers = range(self.n)
        self.forced = check_choice(path, "path", ("auto", *PATHS))
        self._rows: list[tuple[Array, Array]] = []  # the local gradients of the last two points
        self._grad: tuple[Array, Array] | None = None
        self._own_G: Array | None = None  # EF21's estimators, owned by this backend (see error_feedback)
        self._paths: dict[tuple[int, str], tuple[Compressor, str]] = {}

    # -- paths ---------------------------------------------------------------------------------
    def path(self, compressor: Compressor, exchange: str) -> str:
        hit = self._paths.get((id(compressor), exchange))
        if hit is None:
            hit = self._paths[(id(compressor), exchange)] = (compressor, self._choose(compressor, exchange))
        return hit[1]

    def _choose(self, compressor: Compressor, exchange: str) -> str:
        check_choice(exchange, "exchange", EXCHANGES)
        if exchange == "mean_grad":
            return "dense"
        shared = compressor.capabilities.shared_plan
        coords = hasattr(self.problem, "local_grad_coords")
        native = native_pair(self.problem, compressor)
        available = {"dense": True, "fused": exchange != "error_feedback" and shared and coords}
        if exchange == "compressed_mean_diff":
            available["rust"] = native is not None and shared
        elif exchange == "error_feedback":
            available["rust"] = native is not None
        return choose_path(self.forced, available, f"{exchange} with {compressor.name}")

    # -- oracles -------------------------------------------------------------------------------
    def local_grads(self, x: Array) -> Array:
        """All workers' gradients at ``x``, shape ``(n, d)`` (kept for the last two points)."""
        for cx, rows in self._rows:
            if cx is x:
                return rows
        rows = check_output(self.problem.local_grads(x), (self.n, self.d), "problem.local_grads(x)")
        self._rows = [(x, rows)] + self._rows[:1]
        return rows

    def _coords(self, x: Array, rows: Array, cols: Array) -> Array:
        return check_output(self.problem.local_grad_coords(x, rows, cols), (len(rows),), "problem.local_grad_coords(x, rows, cols)")

    def grad(self, x: Array) -> Array:
        """``∇f(x)`` from the problem (the last one is kept: MARINA's full rounds record it too)."""
        if self._grad is not None and self._grad[0] is x:
            return self._grad[1]
        g = check_output(self.problem.grad(x), (self.d,), "problem.grad(x)")
        self._grad = (x, g)
        return g

    # -- exchanges -----------------------------------------------------------------------------
    def mean_grad(self, x: Array) -> Array:
        return self.grad(x)

    def mean_rows(self, rows: Array) -> Array:
        return np.asarray(rows, dtype=np.float64).mean(axis=0)

    def _plan_values(self, compressor: Compressor, x: Array, y: Array | None, seed: int, round: int) -> Array:
        """The fused path: only the plan's coordinates of the local gradients are computed."""
        r = compressor.round(self.n, self.d, seed=seed, round=round)
        rows, cols = r.rows(0, self.n), r.coords(0, self.n)
        vals = self._coords(x, rows, cols)
        if y is not None:
            vals = vals - self._coords(y, rows, cols)
        return r.mean(vals * r.scales()[rows])

    def _diverged(self) -> Array:
        """The aggregate of a round whose oracle values are not finite: NaN, which the driver
        reports as divergence (``diverged_at``) instead of the compressor refusing its input."""
        return np.full(self.d, np.nan)

    def compressed_mean(self, compressor: Compressor, x: Array, *, seed: int, round: int) -> Array:
        if self.path(compressor, "compressed_mean") == "fused":
            return self._plan_values(compressor, x, None, seed, round)
        A = self.local_grads(x)
        return compressor.aggregate(A, seed=seed, round=round) if finite(A) else self._diverged()

    def compressed_mean_diff(self, compressor: Compressor, x: Array, y: Array, *, seed: int, round: int) -> Array:
        path = self.path(compressor, "compressed_mean_diff")
        if path == "rust":
            return self.problem.kernel.compressed_mean_diff(compressor.kernel, x, y, seed, round)  # type: ignore[no-any-return]
        if path == "fused":
            return self._plan_values(compressor, x, y, seed, round)
        new = self.local_grads(x)
        with np.errstate(invalid="ignore", over="ignore"):
            D = new - self.local_grads(y)
        return compressor.aggregate(D, seed=seed, round=round) if finite(D) else self._diverged()

    def error_feedback(self, compressor: Compressor, x: Array, G: Array, *, seed: int, round: int) -> tuple[Array, Array]:
        """EF21's exchange. On the Rust path the estimators are updated in place in a buffer this
        backend owns: a ``G`` it did not return itself (a resumed state) is copied first, so a
        caller's state is never modified."""
        if self.path(compressor, "error_feedback") == "rust":
            if G is not self._own_G:
                G = self._own_G = np.array(G, dtype=np.float64, order="C")
            offsets, idx, vals, ok = self.problem.kernel.error_feedback(compressor.kernel, x, G, seed, round, 0)
            if not ok:  # a non-finite residual: the run has diverged (G is left as it was)
                return self._diverged(), G
            return np.bincount(idx, weights=vals, minlength=self.d) / self.n, G
        with np.errstate(invalid="ignore", over="ignore"):
            D = self.local_grads(x) - G
        if not finite(D):
            return self._diverged(), G
        C = compressor.compress_all(D, seed=seed, round=round)
        return C.sum(axis=0) / self.n, G + C

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
