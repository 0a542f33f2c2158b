"""The contracts of a problem: :class:`Problem`, a distributed problem ``f = (1/n) Σ_i f_i`` on
``R^d`` (eq. (1) of the paper), and :class:`FiniteSumProblem`, one whose ``f_i`` are finite sums
with minibatch oracles.

A *problem* is any object with the attributes and methods of :class:`Problem`; users plug in
their own with numpy only. Optional capabilities, used when present:

* ``local_grad_coords(x, rows, cols)`` — ``∇f_{rows[k]}(x)[cols[k]]`` for every ``k``: MARINA
  with PermK or RandK then evaluates only the coordinates that are sent (``O(d)`` work per
  round instead of ``O(nd)``; the same signature serves one MPI rank's workers);
* ``kernel`` — a native (Rust) kernel of the oracles
  (:meth:`permk.problems.Quadratic.synthetic`): whole rounds run in Rust (``path="rust"``);
* ``exact_smoothness(workers)`` — the exact constants in closed form, for
  :func:`permk.theory.smoothness`;
* ``f_star`` and the constants ``L_minus``, ``L_plus``, ``L_pm``, ``L_i``, ``mu`` for the
  theory's step sizes and the record of ``f(x) − f*``.

**The finite-sum protocol** (:class:`FiniteSumProblem`). Worker ``i`` holds ``m_i`` samples and
``f_i = (1/m_i) Σ_j f_ij``; ``f = (1/n) Σ_i f_i``. Besides the full-gradient oracles of
:class:`Problem` (so ``permk.marina``, ``permk.ef21``, ``permk.gd`` run on these problems
unchanged), such a problem exposes

* ``sample_counts`` — the ``m_i``, shape ``(n,)``;
* ``minibatch_grads(x, b, *, seed, round, workers=None)`` — ``∇f_{iB_i}(x) = (1/b) Σ_{j ∈ B_i}
  ∇f_ij(x)`` of every requested worker at once, shape ``(len(workers), d)``;
* ``minibatch_grads_pair(x, y, b, *, seed, round, workers=None)`` — the same minibatches at two
  points, ``(∇f_{iB_i}(x), ∇f_{iB_i}(y))``: the difference is what VR-MARINA, DASHA-PAGE and
  DASHA-MVR send. The minibatches are :func:`permk.problems.minibatch_indices`'s (uniform with
  replacement, a pure function of ``(seed, round, worker)``; :mod:`permk.problems.finite_sum`).

>>> import numpy as np, permk
>>> isinstance(permk.Quadratic([np.eye(2)], np.zeros((1, 2))), Problem)
True
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np

__all__ = ["Problem", "FiniteSumProblem"]


@runtime_checkable
class Problem(Protocol):
    """The protocol of a distributed problem ``f = (1/n) Σ_i f_i`` on ``R^d``.

    Optional, used when present: ``local_grad(i, x)``, ``local_grad_coords(x, rows, cols)``
    (``∇f_{rows[k]}(x)[cols[k]]`` for every ``k``), ``f_star`` and the smoothness constants
    ``L_minus``, ``L_plus``, ``L_pm`` (see :mod:`permk.theory`), ``L_i``, ``mu``.
    """

    n: int
    d: int
    x0: np.ndarray

    def loss(self, x: np.ndarray) -> float:
        """``f(x)``."""
        ...

    def grad(self, x: np.ndarray) -> np.ndarray:
        """``∇f(x)``, shape ``(d,)``."""
        ...

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        """``[∇f_1(x), …, ∇f_n(x)]``, shape ``(n, d)``."""
        ...


@runtime_checkable
class FiniteSumProblem(Protocol):
    """A problem ``f = (1/n) Σ_i f_i`` with ``f_i = (1/m_i) Σ_j f_ij`` (see the module docstring):
    the full-gradient oracles of :class:`permk.problems.Problem` plus the minibatch oracles.
    Optional, used when present: ``local_grad_coords(x, rows, cols)`` and the constants
    ``L_minus``, ``L_plus``, ``L_pm``, ``L_i``, ``L_max``, ``L_sample_rms``."""

    n: int
    d: int
    x0: np.ndarray
    sample_counts: np.ndarray

    def loss(self, x: np.ndarray) -> float:
        """``f(x)``."""
        ...

    def grad(self, x: np.ndarray) -> np.ndarray:
        """``∇f(x)``, shape ``(d,)``."""
        ...

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        """``[∇f_1(x), …, ∇f_n(x)]``, shape ``(n, d)``."""
        ...

    def minibatch_grads(self, x: np.ndarray, batch_size: int, *, seed: int, round: int,
                        workers: Sequence[int] | None = None) -> np.ndarray:
        """``[∇f_{iB_i}(x)]`` for ``i`` in ``workers`` (default all), shape ``(len(workers), d)``."""
        ...

    def minibatch_grads_pair(self, x: np.ndarray, y: np.ndarray, batch_size: int, *, seed: int, round: int,
                             workers: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``([∇f_{iB_i}(x)], [∇f_{iB_i}(y)])`` with the same minibatches at both points."""
        ...
