"""The single-process simulator: all ``n`` workers of a problem in this process, nothing on a
wire."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validate import check_output, check_real
from ..compressors import Compressor, Messages, Round
from .base import Fill, HeldWorkers, check_problem

__all__ = ["Simulator"]

Array = np.ndarray


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
