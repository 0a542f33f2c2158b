"""Theory tools: smoothness constants and Hessian variance, AB constants measured, and the
communication complexity of MARINA and EF21.

* :func:`smoothness` — ``L_−``, ``L_+``, ``L_±`` (Assumption "L+", Definition "Hessian variance",
  eq. (HV)) of any problem: exact from the Hessians of a quadratic (Example "quadratic
  functions"), a *lower estimate* from pairs of points, or a *local estimate* from Lanczos on the
  matrices of Theorem "second-order characterization" at a point.
* :func:`group_hessian_variance` — the group constants ``L_±^{G_k}`` and ``L̂²_G`` of Appendix
  "Group Hessian Variance" and the step size of its Theorem (theorem:AB_group).
* :func:`estimate_ab` — Monte Carlo estimate of the AB inequality (Assumption "AB inequality",
  eq. (AB)) of any compressor, built-in or defined in Python.
* :func:`complexity` — rounds and floats per worker of MARINA (Theorems AB and AB-PL) and EF21
  (Appendix "EF21 Analysis") with the optimal ``p`` and ``K``, next to the closed forms of the
  paper's Tables; :func:`complexity_plot` and :func:`complexity_cli` draw and print them.

>>> import numpy as np, permk
>>> from permk.theory import smoothness, complexity
>>> class TwoQuadratics:  # f_i(x) = ½ xᵀA_i x with A_1 = I, A_2 = 3I: any numpy object will do
...     n, d, x0 = 2, 3, np.ones(3)
...     def hessians(self): return [np.eye(3), 3 * np.eye(3)]
...     def local_grads(self, x): return np.stack([x, 3 * x])
...     def grad(self, x): return 2 * x
...     def loss(self, x): return float(x @ x)
>>> s = smoothness(TwoQuadratics())
>>> round(s.L_minus, 12), round(s.L_plus**2, 12), round(s.L_pm**2, 12), s.kind
(2.0, 5.0, 1.0, 'exact')
>>> c = complexity("marina", permk.PermK, n=10, d=1000, L_minus=1.0, L_plus=1.0, L_pm=0.0, eps=1e-3, delta0=1.0)
>>> c.rounds, round(c.floats_per_round)  # L± = 0: GD's 2Δ⁰L−/ε rounds, ≈ d/n floats each
(2000, 100)
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import numbers
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from statistics import NormalDist
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence, Union

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as sla
from scipy.optimize import minimize_scalar

from ._validate import as_float_array, check_int, check_seed
from .compressors import Compressor, Identity, PermK, RandK, TopK
from .methods import ef21_stepsize, marina_stepsize

if TYPE_CHECKING:
    from .problems import Problem

__all__ = [
    "Smoothness",
    "smoothness",
    "GroupHessianVariance",
    "group_hessian_variance",
    "ABInput",
    "ABEstimate",
    "estimate_ab",
    "Complexity",
    "complexity",
    "table_complexity",
    "complexity_table",
    "format_complexity_table",
    "complexity_plot",
    "add_complexity_parser",
    "complexity_command",
    "complexity_cli",
]

SmoothnessMethod = Literal["exact", "pairs", "power"]
#: A user Hessian-vector product: ``hvp(i, x, v)`` is ``∇²f_i(x) v``, ``hvp(None, x, v)`` the
#: ``(n, d)`` array of all of them.
HVP = Callable[[Any, np.ndarray, np.ndarray], Any]

_KIND = {"exact": "exact", "pairs": "lower estimate", "power": "local estimate"}
#: Operators of at most this dimension are materialised and diagonalised densely.
_DENSE_MAX = 32
#: Lanczos basis size: large enough for the clustered extreme eigenvalues of discretised
#: operators (10x fewer products than ARPACK's default of 20 on a tridiagonal d = 3000).
_NCV = 80
#: Central differences: truncation O(h²) against rounding O(eps/h) balance at h ~ eps^(1/3).
_FD_STEP = float(np.finfo(np.float64).eps ** (1.0 / 3.0))
#: Largest search subspace of the pairs estimator (it stores ``n·d`` floats per direction).
_MAX_BASIS = 24
#: Directions added per Ritz step for L+ and for L± (top singular vectors of the local images).
_BLOCK = 2
_TOL = {"exact": 1e-12, "power": 1e-9}


# =============================================================================================
# Smoothness constants
# =============================================================================================
@dataclass(frozen=True)
class Smoothness:
    """The smoothness constants of ``f = (1/n) Σ f_i`` and how they were obtained.

    ``L_minus`` is the Lipschitz constant of ``∇f``, ``L_plus`` that of Assumption "L+",
    ``L_pm`` the square root of the Hessian variance (Definition "Hessian variance", eq. (HV)),
    ``L_i`` the constants of the ``∇f_i`` and ``mu`` the PL constant ``λ_min(∇²f)`` of a
    strongly convex quadratic. ``kind`` says what the numbers are: ``"exact"``,
    ``"lower estimate"`` (the true constants are at least these) or ``"local estimate"``
    (the constants of the Hessians at one point: pairs shrinking to it give these values, so
    they are at most the global constants, up to their numerical error).
    ``uncertainty`` maps each constant to a half-width in its own units (see :func:`smoothness`).
    """

    L_minus: float
    L_plus: float
    L_pm: float
    method: str
    uncertainty: Mapping[str, float]
    L_i: tuple[float, ...] | None = None
    mu: float | None = None
    evaluations: int = 0
    note: str = ""

    @property
    def kind(self) -> str:
        """``"exact"``, ``"lower estimate"`` or ``"local estimate"``."""
        return _KIND[self.method]

    @property
    def hessian_variance(self) -> float:
        """``L_±²`` (Definition "Hessian variance")."""
        return self.L_pm**2


class _Oracles:
    """A problem's oracles, restricted to a subset of its workers (a group)."""

    def __init__(self, problem: Problem, workers: Sequence[int] | None = None) -> None:
        missing = [a for a in ("n", "d", "x0", "grad", "local_grads") if not hasattr(problem, a)]
        if missing:
            raise TypeError(f"problem must implement the Problem protocol (permk.problems); it has no {', '.join(missing)}")
        self.problem = problem
        self.n_all = check_int(problem.n, "problem.n", low=1)
        self.d = check_int(problem.d, "problem.d", low=1)
        self.whole = workers is None
        self.workers = np.arange(self.n_all) if workers is None else np.asarray(workers, dtype=np.intp)
        self.n = len(self.workers)

    def x0(self) -> np.ndarray:
        return _point(self.problem.x0, self.d, "problem.x0")

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        G = _finite(self.problem.local_grads(x), (self.n_all, self.d), "problem.local_grads(x)")
        return G if self.whole else G[self.workers]

    def local_grad(self, i: int, x: np.ndarray) -> np.ndarray:
        w = int(self.workers[i])
        if hasattr(self.problem, "local_grad"):
            return _finite(self.problem.local_grad(w, x), (self.d,), "problem.local_grad(i, x)")
        return self.local_grads(x)[i]

    def grad(self, x: np.ndarray) -> np.ndarray:
        if self.whole:
            return _finite(self.problem.grad(x), (self.d,), "problem.grad(x)")
        return self.local_grads(x).mean(axis=0)

    def hessians(self) -> list[Any]:
        get = getattr(self.problem, "hessians", None)
        if get is None:
            raise TypeError(
                "method='exact' needs problem.hessians() (the matrices ∇²f_i of a quadratic); "
                "use method='pairs' or method='power' for other problems"
            )
        mats = list(get())
        if len(mats) != self.n_all:
            raise ValueError(f"problem.hessians() returned {len(mats)} matrices, expected n = {self.n_all}")
        return mats if self.whole else [mats[w] for w in self.workers]


def _finite(value: Any, shape: tuple[int, ...], name: str) -> np.ndarray:
    """An oracle's answer as a float64 array of the expected shape, finite."""
    v = np.asarray(value, dtype=np.float64)
    if v.shape != shape:
        raise ValueError(f"{name} returned shape {v.shape}, expected {shape}")
    if not np.isfinite(v).all():
        raise ValueError(f"{name} returned non-finite values")
    return v


def _point(x: Any, d: int, name: str) -> np.ndarray:
    v = np.array(x, dtype=np.float64)
    if v.shape != (d,):
        raise ValueError(f"{name} must have shape ({d},), got {v.shape}")
    if not np.isfinite(v).all():
        raise ValueError(f"{name} must be finite")
    return v


# -- local Hessians: rows(v) = [H_i v]_i, sum_rows(W) = Σ_i H_i W_i, mean(v) = H v ------------
class _Matrices:
    """The Hessians of a quadratic, stacked as ``J = [A_1; …; A_n]`` (never squared)."""

    def __init__(self, matrices: list[Any], n: int, d: int) -> None:
        self.sparse = any(sp.issparse(A) for A in matrices)
        blocks = [_symmetric_matrix(A, i, d, self.sparse) for i, A in enumerate(matrices)]
        self.blocks = blocks
        self.n, self.d = n, d
        if self.sparse:
            self.J: Any = sp.vstack(blocks, format="csr")
            self.JT: Any = self.J.T.tocsr()
        else:
            self.J = np.concatenate(blocks)
            self.JT = self.J.T
        self.H: Any = sum(blocks[1:], blocks[0]) / n
        self.calls = 0

    def rows(self, v: np.ndarray) -> np.ndarray:
        self.calls += 1
        return np.asarray(self.J @ v).reshape(self.n, self.d)

    def sum_rows(self, W: np.ndarray) -> np.ndarray:
        self.calls += 1
        return np.asarray(self.JT @ W.ravel())  # Σ A_iᵀ W_i = Σ A_i W_i

    def mean(self, v: np.ndarray) -> np.ndarray:
        self.calls += 1
        return np.asarray(self.H @ v)


def _symmetric_matrix(A: Any, i: int, d: int, sparse: bool) -> Any:
    M: Any = sp.csr_array(A, dtype=np.float64) if sparse else np.asarray(A, dtype=np.float64)
    if M.shape != (d, d):
        raise ValueError(f"hessians()[{i}] has shape {M.shape}, expected ({d}, {d})")
    values = np.asarray(M.data if sparse else M)
    if not np.isfinite(values).all():
        raise ValueError(f"hessians()[{i}] must be finite")
    if values.size and float(abs(M - M.T).max()) > 1e-10 * (1.0 + float(np.abs(values).max())):
        raise ValueError(f"hessians()[{i}] must be symmetric")
    return M


class _FiniteDifferences:
    """Hessian-vector products by central differences of the gradients at ``x``:
    ``H_i v ≈ (∇f_i(x + hv) − ∇f_i(x − hv)) / 2h`` with ``h‖v‖ = step·(1 + ‖x‖)``."""

    def __init__(self, oracles: _Oracles, x: np.ndarray, step: float) -> None:
        self.o, self.x = oracles, x
        self.length = step * (1.0 + float(np.linalg.norm(x)))
        self.calls = 0

    def _diff(self, fn: Callable[[np.ndarray], np.ndarray], v: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        norm = float(np.linalg.norm(v))
        if norm == 0.0:
            return np.zeros(shape)
        h = self.length / norm
        return (fn(self.x + h * v) - fn(self.x - h * v)) / (2.0 * h)

    def rows(self, v: np.ndarray) -> np.ndarray:
        self.calls += 1
        return self._diff(self.o.local_grads, v, (self.o.n, self.o.d))

    def sum_rows(self, W: np.ndarray) -> np.ndarray:
        self.calls += 1
        return np.sum([self._diff(partial(self.o.local_grad, i), W[i], (self.o.d,)) for i in range(self.o.n)], axis=0)

    def mean(self, v: np.ndarray) -> np.ndarray:
        self.calls += 1
        return self._diff(self.o.grad, v, (self.o.d,))


class _UserHVP:
    """Hessian-vector products from the user's ``hvp(i, x, v)`` (``i=None``: all workers)."""

    def __init__(self, hvp: HVP, oracles: _Oracles, x: np.ndarray) -> None:
        self.hvp, self.o, self.x = hvp, oracles, x
        self.calls = 0

    def rows(self, v: np.ndarray) -> np.ndarray:
        self.calls += 1
        R = _finite(self.hvp(None, self.x, v), (self.o.n_all, self.o.d), "hvp(None, x, v)")
        return R if self.o.whole else R[self.o.workers]

    def sum_rows(self, W: np.ndarray) -> np.ndarray:
        self.calls += 1
        rows = [_finite(self.hvp(int(w), self.x, W[i]), (self.o.d,), "hvp(i, x, v)") for i, w in enumerate(self.o.workers)]
        return np.sum(rows, axis=0)

    def mean(self, v: np.ndarray) -> np.ndarray:
        return self.rows(v).mean(axis=0)


_Hessians = Union[_Matrices, _FiniteDifferences, _UserHVP]


def _operators(h: _Hessians, n: int) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """``H`` (whose largest |eigenvalue| is ``L_−``), ``L_+ = (1/n) Σ H_i²`` and
    ``L_± = L_+ − H²`` (the matrices of Theorem "second-order characterization" at ``x = y``)."""

    def plus(v: np.ndarray) -> np.ndarray:
        return h.sum_rows(h.rows(v)) / n

    def pm(v: np.ndarray) -> np.ndarray:
        R = h.rows(v)
        return h.sum_rows(R) / n - h.mean(R.mean(axis=0))

    return {"L_minus": h.mean, "L_plus": plus, "L_pm": pm}


@dataclass(frozen=True)
class _Eig:
    value: float
    vector: np.ndarray
    image: np.ndarray

    @property
    def residual(self) -> float:
        """``‖Mv − λv‖``: some eigenvalue of ``M`` lies within it of ``λ`` (M symmetric)."""
        return float(np.linalg.norm(self.image - self.value * self.vector))


def _extreme_eig(matvec: Callable[[np.ndarray], np.ndarray], d: int, which: str, tol: float, rng: np.random.Generator) -> _Eig:
    """The eigenpair of the symmetric operator ``matvec`` with the largest eigenvalue
    (``which="LA"``) or the largest |eigenvalue| (``"LM"``): Lanczos (ARPACK) or, for
    ``d <= 32``, a dense eigendecomposition. The value is the Rayleigh quotient."""
    if d <= _DENSE_MAX:
        M = np.column_stack([matvec(e) for e in np.eye(d)])
        w, V = np.linalg.eigh((M + M.T) / 2.0)
        v = V[:, d - 1 if which == "LA" else int(np.argmax(np.abs(w)))]
    else:
        op = sla.LinearOperator((d, d), matvec=lambda u: matvec(np.ravel(u)), dtype=np.float64)
        try:
            V = sla.eigsh(op, k=1, which=which, tol=tol, ncv=min(d, _NCV), v0=rng.standard_normal(d))[1]
        except sla.ArpackNoConvergence as exc:  # keep the best Ritz pair: its residual is reported
            if exc.eigenvectors.shape[1] == 0:
                raise RuntimeError("Lanczos (ARPACK) found no Ritz pair; loosen tol") from exc
            V = exc.eigenvectors
        v = V[:, 0] / np.linalg.norm(V[:, 0])
    image = matvec(v)
    return _Eig(float(v @ image), v, image)


def _root_halfwidth(value: float, err: float) -> float:
    """The half-width of ``sqrt`` of ``[value − err, value + err]`` (an uncertainty on ``L²``
    expressed on ``L``): ``sqrt(value) − sqrt(max(value − err, 0))``."""
    value = max(value, 0.0)
    return math.sqrt(value) - math.sqrt(max(value - err, 0.0))


def smoothness(
    problem: Problem,
    method: SmoothnessMethod = "exact",
    *,
    seed: int | np.random.Generator | None = None,
    x: Any = None,
    radius: float | None = None,
    trajectory: Any = None,
    pairs: int | None = None,
    centers: int | None = None,
    hvp: HVP | None = None,
    fd_step: float | None = None,
    tol: float | None = None,
    per_worker: bool | None = None,
) -> Smoothness:
    """The smoothness constants ``L_−``, ``L_+``, ``L_±`` of a problem (it needs only ``n``,
    ``d``, ``x0``, ``grad`` and ``local_grads``; ``method="exact"`` also ``hessians()``).

    ``method="exact"`` (quadratics, Example "quadratic functions"): with ``A_i = ∇²f_i`` and
    ``H = (1/n) Σ A_i``, ``L_− = ‖H‖``, ``L_+² = λ_max((1/n) Σ A_i²)``,
    ``L_±² = λ_max((1/n) Σ A_i² − H²)``, ``L_i = ‖A_i‖`` (``per_worker=False`` skips them) and
    ``μ = λ_min(H)`` when positive (else None). Lanczos on operators built from matrix-vector
    products with the stacked ``A_i`` — ``(1/n) Σ A_i²`` is never formed — or dense
    eigendecompositions for ``d <= 32`` and dense ``H``; for sparse ``H``, ``μ`` comes from a
    sparse ``LDLᵀ`` (positive definiteness) and Lanczos on ``H⁻¹``. ``uncertainty``: the
    Lanczos residuals (or LAPACK's ``d·eps·‖H‖``). Options: ``tol`` (ARPACK, default 1e-12).

    ``method="pairs"`` (a *lower estimate* for any problem): the largest values over evaluated
    pairs ``(x, y)`` of the ratios defining the constants — ``‖∇f(x)−∇f(y)‖²/‖x−y‖²`` (``L_−²``),
    ``(1/n) Σ ‖∇f_i(x)−∇f_i(y)‖²/‖x−y‖²`` (``L_+²``, Assumption "L+"), their difference
    (``L_±²``, eq. (HV)) and ``‖∇f_i(x)−∇f_i(y)‖²/‖x−y‖²`` (``L_i²``). Every value is a true
    ratio, so each estimate is at most the true constant. Pairs are ``(c + r u, c − r u)``:
    around ``centers`` centres ``c`` (``x`` — default ``problem.x0`` — then uniform in the ball
    ``B(x, radius)``, ``radius`` default 1), or, with ``trajectory`` (a ``(T, d)`` array of
    iterates), its consecutive pairs ``(x_t, x_{t+1})`` first and then centres on it (default 4,
    ``r`` = half the median step unless ``radius`` is given). At each centre the directions
    ``u`` come from a block-Krylov search on the secant images ``(∇f_i(c+ru) − ∇f_i(c−ru))/2r``
    (Rayleigh–Ritz for the three ratios, expanded by the images of the best directions), which
    on quadratics reaches the exact values once the subspace holds the top eigenvectors.
    ``pairs`` (default 256) is the budget of pair evaluations (two ``local_grads`` calls each).
    ``uncertainty``: how much each estimate grew over the second half of the pairs (0 means the
    search stalled, not that the value is exact).

    ``method="power"`` (a *local estimate* at ``x``, default ``problem.x0``): the extreme
    eigenvalues of ``∇²f(x)``, ``(1/n) Σ ∇²f_i(x)²`` and ``(1/n) Σ ∇²f_i(x)² − ∇²f(x)²`` — the
    matrices of Theorem "second-order characterization" with ``x = y`` — by Lanczos on
    Hessian-vector products: the user's ``hvp(i, x, v)`` (``∇²f_i(x) v``; ``i=None`` for the
    ``(n, d)`` array of all workers) or central differences of the gradients with
    ``h‖v‖ = fd_step·(1 + ‖x‖)``, ``fd_step`` default ``eps^(1/3)``. An ``L_+``/``L_±``
    product costs one ``local_grads`` pair and ``n`` ``local_grad`` pairs (``local_grads`` when
    the problem has no ``local_grad``). ``uncertainty``: the Lanczos residual plus, for finite
    differences, the change of the Rayleigh quotient when the step is doubled (``tol``: ARPACK's,
    default 1e-9). The global
    constants are suprema over segments of the averaged Hessians (Theorem "second-order
    characterization"), and segments shrinking to ``x`` give these values: up to that error
    they are lower bounds too, exact for quadratics, and the constants that matter near ``x``.

    Every result satisfies Lemma (lem:08hhdf) ``L_+² − L_−² ≤ L_±² ≤ L_+²`` up to rounding.

    >>> import numpy as np
    >>> class Diagonal:  # f_i(x) = ½ Σ_j a_ij x_j²
    ...     a = np.array([[1.0, 2.0], [3.0, 2.0]])
    ...     n, d, x0 = 2, 2, np.zeros(2)
    ...     def hessians(self): return [np.diag(r) for r in self.a]
    ...     def local_grads(self, x): return self.a * x
    ...     def grad(self, x): return self.a.mean(0) * x
    ...     def loss(self, x): return float(0.5 * self.a.mean(0) @ x**2)
    >>> ex, lo = smoothness(Diagonal()), smoothness(Diagonal(), "pairs", seed=0, pairs=20)
    >>> round(ex.L_pm, 9), round(lo.L_pm, 9), lo.kind, round(smoothness(Diagonal(), "power").L_plus, 6)
    (1.0, 1.0, 'lower estimate', 2.236068)
    """
    return _smoothness(
        _Oracles(problem), method, seed=seed, x=x, radius=radius, trajectory=trajectory, pairs=pairs,
        centers=centers, hvp=hvp, fd_step=fd_step, tol=tol, per_worker=per_worker,
    )  # fmt: skip


_OPTIONS = {
    "exact": {"tol", "per_worker"},
    "pairs": {"x", "radius", "trajectory", "pairs", "centers"},
    "power": {"x", "hvp", "fd_step", "tol"},
}


def _smoothness(oracles: _Oracles, method: str, *, seed: int | np.random.Generator | None, **options: Any) -> Smoothness:
    if method not in _OPTIONS:
        raise ValueError(f"method must be 'exact', 'pairs' or 'power', got {method!r}")
    unused = sorted(k for k, v in options.items() if v is not None and k not in _OPTIONS[method])
    if unused:
        raise ValueError(f"method={method!r} does not use {', '.join(unused)}")
    rng = np.random.default_rng(seed)
    if method == "exact":
        per_worker = True if options["per_worker"] is None else bool(options["per_worker"])
        return _exact(oracles, _positive(options["tol"], "tol", _TOL["exact"]), per_worker, rng)
    x = oracles.x0() if options["x"] is None else _point(options["x"], oracles.d, "x")
    if method == "power":
        step = _positive(options["fd_step"], "fd_step", _FD_STEP)
        return _power(oracles, x, options["hvp"], step, _positive(options["tol"], "tol", _TOL["power"]), rng)
    budget = 256 if options["pairs"] is None else check_int(options["pairs"], "pairs", low=1)
    return _pairs(oracles, x, options["radius"], options["trajectory"], budget, options["centers"], rng)


def _positive(value: float | None, name: str, default: float) -> float:
    if value is None:
        return default
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value}")
    return v


def _exact(oracles: _Oracles, tol: float, per_worker: bool, rng: np.random.Generator) -> Smoothness:
    n, d = oracles.n, oracles.d
    m = _Matrices(oracles.hessians(), n, d)
    ops = _operators(m, n)
    plus = _extreme_eig(ops["L_plus"], d, "LA", tol, rng)
    pm = _extreme_eig(ops["L_pm"], d, "LA", tol, rng)
    unc = {"L_plus": _root_halfwidth(plus.value, plus.residual), "L_pm": _root_halfwidth(pm.value, pm.residual)}
    mu: float | None = None
    if m.sparse:
        h = _extreme_eig(ops["L_minus"], d, "LM", tol, rng)
        L_minus, unc["L_minus"] = abs(h.value), h.residual
        smallest = _smallest_eigenvalue_if_positive(m.H, tol, rng)
        if smallest is not None:
            mu, unc["mu"] = smallest
    else:
        w = np.linalg.eigvalsh(m.H)
        L_minus = float(np.abs(w).max())
        unc["L_minus"] = d * float(np.finfo(np.float64).eps) * L_minus
        if w[0] > 0:
            mu, unc["mu"] = float(w[0]), unc["L_minus"]
    L_i = _local_norms(m, tol, rng) if per_worker else None
    return Smoothness(
        L_minus=L_minus,
        L_plus=math.sqrt(max(plus.value, 0.0)),
        L_pm=math.sqrt(max(pm.value, 0.0)),
        method="exact",
        uncertainty=MappingProxyType(unc),
        L_i=L_i,
        mu=mu,
        evaluations=m.calls,
        note="exact: extreme eigenvalues of the Hessians (Example 'quadratic functions')",
    )


def _local_norms(m: _Matrices, tol: float, rng: np.random.Generator) -> tuple[float, ...]:
    """``L_i = ‖A_i‖``: batched dense eigenvalues, or Lanczos per sparse matrix."""
    if not m.sparse:
        return tuple(float(v) for v in np.abs(np.linalg.eigvalsh(m.J.reshape(m.n, m.d, m.d))).max(axis=1))
    return tuple(abs(_extreme_eig(partial(_matvec, A), m.d, "LM", tol, rng).value) for A in m.blocks)


def _matvec(A: Any, v: np.ndarray) -> np.ndarray:
    return np.asarray(A @ v)


def _smallest_eigenvalue_if_positive(H: Any, tol: float, rng: np.random.Generator) -> tuple[float, float] | None:
    """``(λ_min(H), its uncertainty)`` for a sparse positive definite ``H``, else None.

    Positive definiteness: symmetric elimination without pivoting (SuperLU with diagonal
    pivots) succeeds with positive pivots exactly when ``H ≻ 0`` (Sylvester's law of inertia);
    then ``λ_min = 1/λ_max(H⁻¹)``, whose Lanczos converges fast."""
    try:
        lu = sla.splu(sp.csc_matrix(H), diag_pivot_thresh=0.0, options={"SymmetricMode": True})
    except RuntimeError:  # exactly singular
        return None
    if not (np.array_equal(lu.perm_r, lu.perm_c) and (lu.U.diagonal() > 0).all()):
        return None
    inv = _extreme_eig(lu.solve, H.shape[0], "LA", tol, rng)
    mu = 1.0 / inv.value
    return mu, mu * mu * inv.residual


def _power(oracles: _Oracles, x: np.ndarray, hvp: HVP | None, step: float, tol: float, rng: np.random.Generator) -> Smoothness:
    n, d = oracles.n, oracles.d
    hess: _Hessians
    if hvp is None:
        hess = _FiniteDifferences(oracles, x, step)
        check: _FiniteDifferences | None = _FiniteDifferences(oracles, x, 2.0 * step)
        how = f"central differences of the gradients, h‖v‖ = {step:.3g}·(1 + ‖x‖)"
    else:
        if not callable(hvp):
            raise TypeError("hvp must be a callable hvp(i, x, v)")
        hess, check, how = _UserHVP(hvp, oracles, x), None, "the user's hvp"
    ops = _operators(hess, n)
    check_ops = _operators(check, n) if check is not None else None
    values: dict[str, float] = {}
    unc: dict[str, float] = {}
    for name, which in (("L_minus", "LM"), ("L_plus", "LA"), ("L_pm", "LA")):
        e = _extreme_eig(ops[name], d, which, tol, rng)
        err = e.residual
        if check_ops is not None:
            err += abs(float(e.vector @ check_ops[name](e.vector)) - e.value)
        if name == "L_minus":
            values[name], unc[name] = abs(e.value), err
        else:
            values[name], unc[name] = math.sqrt(max(e.value, 0.0)), _root_halfwidth(e.value, err)
    return Smoothness(
        L_minus=values["L_minus"],
        L_plus=values["L_plus"],
        L_pm=values["L_pm"],
        method="power",
        uncertainty=MappingProxyType(unc),
        evaluations=hess.calls + (check.calls if check is not None else 0),
        note=(
            "local estimate: extreme eigenvalues of ∇²f(x), (1/n)Σ∇²f_i(x)², (1/n)Σ∇²f_i(x)² − ∇²f(x)² "
            f"(Theorem 'second-order characterization' at x = y) by Lanczos on {how}"
        ),
    )


class _PairRecord:
    """Running maxima of the ratios of the definitions over evaluated pairs."""

    def __init__(self, oracles: _Oracles) -> None:
        self.o = oracles
        self.best = np.zeros(3)  # L_−², L_+², L_±²
        self.best_i = np.zeros(oracles.n)
        self.history: list[np.ndarray] = []

    @property
    def count(self) -> int:
        return len(self.history)

    def add(self, x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
        """Evaluate the pair; return the images ``(∇f_i(x) − ∇f_i(y))/‖x − y‖`` (rows)."""
        dist = float(np.linalg.norm(x - y))
        if dist == 0.0:
            return None
        Y = (self.o.local_grads(x) - self.o.local_grads(y)) / dist
        per = np.einsum("ij,ij->i", Y, Y)
        ybar = Y.mean(axis=0)
        plus, minus = float(per.mean()), float(ybar @ ybar)
        self.best = np.maximum(self.best, [minus, plus, max(plus - minus, 0.0)])
        self.best_i = np.maximum(self.best_i, per)
        self.history.append(self.best.copy())
        return Y


def _pairs(
    oracles: _Oracles, x: np.ndarray, radius: float | None, trajectory: Any, budget: int, centers: int | None, rng: np.random.Generator
) -> Smoothness:
    d = oracles.d
    rec = _PairRecord(oracles)
    if trajectory is None:
        r = _positive(radius, "radius", 1.0)
        k = 1 if centers is None else check_int(centers, "centers", low=1)
        directions = rng.standard_normal((k - 1, d))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        scales = r * rng.random(k - 1) ** (1.0 / d)
        points = np.vstack([x, x + scales[:, None] * directions])
        where = f"pairs (c ± {r:.3g}u) around {k} centre(s) in B(x, {r:.3g})"
    else:
        traj = as_float_array(trajectory, 2, "trajectory")
        if traj.shape[1] != d or traj.shape[0] < 2 or not np.isfinite(traj).all():
            raise ValueError(f"trajectory must be a finite (T, {d}) array with T >= 2, got shape {traj.shape}")
        steps = np.linalg.norm(np.diff(traj, axis=0), axis=1)
        if radius is None:
            if not (steps > 0).any():
                raise ValueError("trajectory has no two distinct consecutive points: pass radius")
            radius = 0.5 * float(np.median(steps[steps > 0]))
        r = _positive(radius, "radius", math.nan)
        for a, b in zip(traj[:-1], traj[1:]):
            if rec.count >= budget:
                break
            rec.add(a, b)
        k = min(len(traj), 4) if centers is None else check_int(centers, "centers", low=1)
        points = traj[np.unique(np.linspace(0, len(traj) - 1, k).round().astype(int))]
        where = f"{len(traj) - 1} consecutive pairs of the trajectory, then pairs (c ± {r:.3g}u) around {len(points)} of its points"
    for j, c in enumerate(points):  # what a centre leaves unspent goes to the next ones
        _krylov_pairs(rec, c, r, rec.count + (budget - rec.count) // (len(points) - j), rng)
    history = np.array(rec.history)
    half = history[len(history) // 2 - 1] if len(history) >= 2 else np.zeros(3)
    names = ("L_minus", "L_plus", "L_pm")
    return Smoothness(
        L_minus=math.sqrt(rec.best[0]),
        L_plus=math.sqrt(rec.best[1]),
        L_pm=math.sqrt(rec.best[2]),
        method="pairs",
        uncertainty=MappingProxyType({k: math.sqrt(b) - math.sqrt(h) for k, b, h in zip(names, rec.best, half)}),
        L_i=tuple(float(v) for v in np.sqrt(rec.best_i)),
        evaluations=rec.count,
        note=f"lower estimate: largest ratios of Assumption 'L+' and eq. (HV) over {rec.count} {where}",
    )


def _krylov_pairs(rec: _PairRecord, c: np.ndarray, r: float, stop: int, rng: np.random.Generator) -> None:
    """Block-Krylov search for the directions ``u`` maximising the three ratios at ``(c ± ru)``.

    An orthonormal basis ``D`` with the images ``Y`` of its directions (for a quadratic
    ``Y[a]_i = A_i D[a]``) gives the Gram matrices ``P = (1/n) Σ_i Y_iᵀY_i`` (ratio of ``L_+``)
    and ``Q = ȲᵀȲ`` (``L_−``); the top eigenvectors of ``Q``, ``P``, ``P − Q`` are evaluated as
    pairs, and their images — ``H u``, the top singular vectors of ``[A_i u]_i`` and of its
    deviations from the mean — expand the basis (restarted from the best directions when full).
    """
    o = rec.o
    n, d = o.n, o.d
    size = min(d, _MAX_BASIS)
    D, Y = np.zeros((size, d)), np.zeros((size, n, d))
    P, Q = np.zeros((size, size)), np.zeros((size, size))
    m = 0
    candidates: list[np.ndarray] = [rng.standard_normal(d)]
    while rec.count < stop:
        added = 0
        for cand in candidates:
            if rec.count >= stop or m == size:
                break
            u = cand - D[:m].T @ (D[:m] @ cand)
            u = u - D[:m].T @ (D[:m] @ u)  # twice is enough (Kahan–Parlett)
            norm = float(np.linalg.norm(u))
            if norm == 0.0 or norm <= 1e-10 * float(np.linalg.norm(cand)):
                continue  # already in the span
            u = u / norm
            y = rec.add(c + r * u, c - r * u)
            assert y is not None  # ‖2ru‖ > 0
            D[m], Y[m] = u, y
            P[m, : m + 1] = P[: m + 1, m] = np.einsum("anj,nj->a", Y[: m + 1], y) / n
            Q[m, : m + 1] = Q[: m + 1, m] = Y[: m + 1].mean(axis=1) @ y.mean(axis=0)
            m, added = m + 1, added + 1
        if rec.count >= stop or (added == 0 and m < size):
            return  # budget spent, or the subspace is invariant (nothing new to learn here)
        ritz = [np.linalg.eigh(S)[1][:, -1] @ D[:m] for S in (Q[:m, :m], P[:m, :m], P[:m, :m] - Q[:m, :m])]
        images = []
        for u in ritz:
            if rec.count >= stop:
                return
            images.append(rec.add(c + r * u, c - r * u))
        if m == d:
            return  # the basis spans R^d: the Ritz directions are the best there are
        y_minus, y_plus, y_pm = images
        assert y_minus is not None and y_plus is not None and y_pm is not None
        new = [y_minus.mean(axis=0)] + _top_directions(y_plus) + _top_directions(y_pm - y_pm.mean(axis=0))
        if m == size:  # full: restart from the best directions
            m, candidates = 0, ritz + new
        else:
            candidates = new


def _top_directions(Y: np.ndarray) -> list[np.ndarray]:
    """The top ``_BLOCK`` right singular vectors of the ``(n, d)`` images (non-zero ones)."""
    _, s, Vt = np.linalg.svd(Y, full_matrices=False)
    keep = s[:_BLOCK] > 1e-12 * s[0] if s.size and s[0] > 0 else np.zeros(0, dtype=bool)
    return list(Vt[: keep.size][keep])


# =============================================================================================
# Group Hessian variance
# =============================================================================================
@dataclass(frozen=True)
class GroupHessianVariance:
    """The constants of Appendix "Group Hessian Variance" for a partition of the workers.

    ``constants[k]`` holds ``L_−^{G_k}``, ``L_+^{G_k}``, ``L_±^{G_k}`` of group ``k`` (the
    constants of the functions ``f_i``, ``i ∈ G_k``), ``ab[k]`` the ``(A_{G_k}, B_{G_k})`` of its
    compressor on ``|G_k|`` workers, ``whole`` the constants of ``f`` itself, and
    ``L_hat_sq`` is
    ``L̂²_G = Σ_k (A_{G_k} − B_{G_k}) |G_k|²/n² (L_+^{G_k})² + Σ_k B_{G_k} |G_k|²/n² (L_±^{G_k})²``
    (Lemma "Group AB inequality" and the variance bound after it).
    """

    groups: tuple[tuple[int, ...], ...]
    constants: tuple[Smoothness, ...]
    ab: tuple[tuple[float, float], ...]
    whole: Smoothness
    L_hat_sq: float

    def stepsize(self, p: float, *, mu: float | None = None) -> float:
        """MARINA's step of Theorem (theorem:AB_group): ``1/(L_− + sqrt((1−p)/p · L̂²_G))``;
        with ``mu`` its PL twin ``min{1/(L_− + sqrt(2(1−p)/p · L̂²_G)), p/(2μ)}``.

        It is Theorem AB's step with ``(A − B)L_+² + B L_±²`` replaced by ``L̂²_G``."""
        return marina_stepsize(1.0, 0.0, self.whole.L_minus, math.sqrt(self.L_hat_sq), 0.0, p, mu=mu)


def group_hessian_variance(
    problem: Problem,
    groups: Sequence[Sequence[int]],
    compressor: Compressor | Sequence[Compressor],
    method: SmoothnessMethod = "exact",
    **options: Any,
) -> GroupHessianVariance:
    """Group constants and ``L̂²_G`` (Appendix "Group Hessian Variance").

    ``groups`` partitions ``range(n)``; the compressors of different groups are independent
    (Assumption "group AB") and group ``k`` runs ``compressor`` (or ``compressor[k]``) on its
    ``|G_k|`` workers, whose AB constants it states (``ab_constants(|G_k|, d)``). The
    constants come from :func:`smoothness` with ``method`` and ``options`` for every group and
    for the whole problem (its ``L_−`` enters the step).

    >>> import numpy as np, permk
    >>> class TwoGroups:  # workers 0, 1 hold A = diag(1, 3); workers 2, 3 hold B = diag(3, 1)
    ...     mats = [np.diag([1.0, 3.0])] * 2 + [np.diag([3.0, 1.0])] * 2
    ...     n, d, x0 = 4, 2, np.zeros(2)
    ...     def hessians(self): return self.mats
    ...     def local_grads(self, x): return np.stack([A @ x for A in self.mats])
    ...     def grad(self, x): return 2.0 * x
    ...     def loss(self, x): return float(x @ x)
    >>> g = group_hessian_variance(TwoGroups(), [[0, 1], [2, 3]], permk.PermK())
    >>> g.whole.L_pm, g.L_hat_sq, g.stepsize(0.5)  # L± = 1 overall, 0 inside each group
    (1.0, 0.0, 0.5)
    """
    whole_oracles = _Oracles(problem)
    n, d = whole_oracles.n, whole_oracles.d
    parts = tuple(tuple(check_int(i, "worker index", high=n) for i in g) for g in groups)
    flat = sorted(i for g in parts for i in g)
    if any(not g for g in parts) or flat != list(range(n)):
        raise ValueError(f"groups must be non-empty and partition range({n}), each worker in exactly one group")
    comps = [compressor] * len(parts) if isinstance(compressor, Compressor) else list(compressor)
    if len(comps) != len(parts) or not all(isinstance(c, Compressor) for c in comps):
        raise TypeError("compressor must be a Compressor or one Compressor per group")
    ab = []
    for g, c in zip(parts, comps):
        stated = c.ab_constants(len(g), d)
        if stated is None:
            raise ValueError(f"{c.name} states no AB constants (Assumption 'AB inequality'): it cannot be used here")
        ab.append((float(stated[0]), float(stated[1])))
    seed = options.pop("seed", 0)
    kwargs = _with_defaults(options)
    constants = tuple(_smoothness(_Oracles(problem, g), method, seed=seed, **kwargs) for g in parts)
    whole = _smoothness(whole_oracles, method, seed=seed, **kwargs)
    L_hat_sq = sum(
        len(g) ** 2 / n**2 * ((A - B) * s.L_plus**2 + B * s.L_pm**2) for g, (A, B), s in zip(parts, ab, constants)
    )
    return GroupHessianVariance(groups=parts, constants=constants, ab=tuple(ab), whole=whole, L_hat_sq=float(L_hat_sq))


def _with_defaults(options: Mapping[str, Any]) -> dict[str, Any]:
    allowed = set().union(*_OPTIONS.values())
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise TypeError(f"unknown smoothness option(s): {', '.join(unknown)}")
    return {k: options.get(k) for k in allowed}


# =============================================================================================
# AB constants, measured
# =============================================================================================
@dataclass(frozen=True)
class ABInput:
    """One input set ``a_1, …, a_n`` of :func:`estimate_ab`: ``S = (1/n) Σ ‖a_i‖²``,
    ``M = ‖ā‖²``, the Monte Carlo mean of ``‖(1/n) Σ C_i(a_i) − ā‖²`` and its confidence
    interval, and the right-hand side ``A·S − B·M`` of eq. (AB) with the stated constants."""

    name: str
    S: float
    M: float
    variance: float
    interval: tuple[float, float]
    stated_bound: float | None
    #: Whether the lower end of the interval is at most ``A·S − B·M`` (up to rounding): the
    #: data does not refute the stated constants. None when no constants are stated.
    consistent: bool | None


@dataclass(frozen=True)
class ABEstimate:
    """The AB constants a compressor shows on the inputs of :func:`estimate_ab` (estimates).

    Each input gives the linear constraint ``variance ≤ A·S − B·M`` on ``(A, B)``. ``A`` is the
    smallest ``A`` consistent with every input for ``B = stated B`` (0 if none is stated),
    ``B`` the largest ``B`` for ``A = stated A`` (the estimated ``A`` if none); the intervals
    come from the variance intervals, which hold simultaneously with probability about
    ``confidence`` (CLT, Bonferroni over the inputs). :meth:`min_A` and :meth:`max_B` trace the
    boundary of the feasible region for other values. Finitely many inputs can only show that
    constants are *at least* this large: they are estimates, not proofs.
    """

    compressor: str
    n: int
    d: int
    trials: int
    confidence: float
    seed: int
    inputs: tuple[ABInput, ...]
    stated: tuple[float, float] | None
    A: float
    A_interval: tuple[float, float]
    B: float
    B_interval: tuple[float, float]

    def min_A(self, B: float) -> tuple[float, float, float]:
        """``(estimate, low, high)`` of the smallest ``A`` with ``variance ≤ A·S − B·M`` on every input."""

        def at(v: Callable[[ABInput], float]) -> float:
            return max((v(i) + B * i.M) / i.S for i in self.inputs)

        return at(lambda i: i.variance), at(lambda i: i.interval[0]), at(lambda i: i.interval[1])

    def max_B(self, A: float) -> tuple[float, float, float]:
        """``(estimate, low, high)`` of the largest ``B`` with ``variance ≤ A·S − B·M`` on every
        input (``inf`` when no input has ``M > 0``)."""

        def at(v: Callable[[ABInput], float]) -> float:
            return min(((A * i.S - v(i)) / i.M for i in self.inputs if i.M > 0), default=math.inf)

        # a larger variance leaves room for a smaller B only
        return at(lambda i: i.variance), at(lambda i: i.interval[1]), at(lambda i: i.interval[0])

    @property
    def consistent(self) -> bool | None:
        """Whether every input is consistent with the stated constants (None if none stated)."""
        return None if self.stated is None else all(bool(i.consistent) for i in self.inputs)

    def summary(self) -> str:
        """A few lines for humans."""
        lines = [f"{self.compressor} on n={self.n}, d={self.d}: {self.trials} rounds per input, {self.confidence:.0%} intervals"]
        for i in self.inputs:
            ok = "" if i.consistent is None else ("  ok" if i.consistent else "  VIOLATES stated")
            low, high = i.interval
            lines.append(f"  {i.name:<11} S={i.S:.4g} M={i.M:.4g} E‖err‖²={i.variance:.4g} [{low:.4g}, {high:.4g}]{ok}")
        lines.append(f"  stated (A, B) = {self.stated}")
        (a0, a1), (b0, b1) = self.A_interval, self.B_interval
        B_ref, A_ref = (0.0, self.A) if self.stated is None else (self.stated[1], self.stated[0])
        lines.append(f"  smallest A at B = {B_ref:.4g}: {self.A:.4g} [{a0:.4g}, {a1:.4g}]")
        lines.append(f"  largest B at A = {A_ref:.4g}: {self.B:.4g} [{b0:.4g}, {b1:.4g}]")
        return "\n".join(lines)


def _adversarial_inputs(n: int, d: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Input sets that make common compressors reach their constants: equal inputs (variance
    ``(A − B)S``), disjoint supports (orthogonal, as far as ``n ≤ d`` allows), one active
    worker, i.i.d. Gaussian, and a common mean plus small noise."""
    a = rng.standard_normal(d)
    disjoint = np.zeros((n, d))
    k = np.arange(max(n, d))
    disjoint[k % n, k % d] = rng.standard_normal(k.size)
    single = np.zeros((n, d))
    single[0] = rng.standard_normal(d)
    return {
        "equal": np.tile(a, (n, 1)),
        "ones": np.ones((n, d)),
        "disjoint": disjoint,
        "single": single,
        "gaussian": rng.standard_normal((n, d)),
        "mean+noise": a + 0.1 * rng.standard_normal((n, d)),
    }


def estimate_ab(
    compressor: Compressor,
    *,
    n: int,
    d: int,
    inputs: Any = None,
    trials: int = 2000,
    seed: int | None = None,
    confidence: float = 0.95,
) -> ABEstimate:
    """Measure ``E‖(1/n) Σ C_i(a_i) − ā‖²`` (eq. (AB)) and the ``(A, B)`` it implies.

    ``inputs``: None or ``"adversarial"`` for a built-in set of inputs (equal, all-ones,
    disjoint supports, one active worker, Gaussian, mean + noise), an ``(n, d)`` array, or a
    sequence of them. For each input the squared error of ``compressor.aggregate(a, seed=seed,
    round=t)`` is averaged over ``t < trials`` (a normal-approximation interval at the
    Bonferroni level ``1 − (1 − confidence)/#inputs``). ``seed`` (random if None, reported)
    also draws the built-in inputs. See :class:`ABEstimate` for ``A``, ``B`` and their
    intervals; the AB inequality presumes an unbiased compressor.

    Any :class:`permk.Compressor` works, including one defined in Python — here independent
    Rand1 (each worker sends one random coordinate, scaled by ``d``: ``ω = d − 1``, so
    ``(A, B) = ((d − 1)/n, 0)`` by Lemma (lem:bg97fd890d)):

    >>> import numpy as np, permk
    >>> class Rand1(permk.Compressor):
    ...     def floats_per_worker(self, n, d): return 1
    ...     def ab_constants(self, n, d): return ((d - 1) / n, 0.0)
    ...     def compress(self, x, *, worker, n_workers, seed, round):
    ...         x = np.asarray(x, dtype=float)
    ...         j = np.random.default_rng((seed, round, worker)).integers(x.size)
    ...         return permk.Message(worker, n_workers, x.size, np.array([j]), np.array([x.size * x[j]]))
    >>> est = estimate_ab(Rand1(), n=4, d=6, trials=1000, seed=1)
    >>> est.stated, est.consistent, bool(est.A_interval[0] <= 1.25 <= est.A_interval[1])
    ((1.25, 0.0), True, True)
    >>> estimate_ab(permk.PermK(), n=4, d=8, trials=500, seed=1).consistent  # IV(1): A = B = 1
    True
    """
    if not isinstance(compressor, Compressor):
        raise TypeError(f"compressor must be a permk.Compressor, got {type(compressor).__name__}")
    n, d = check_int(n, "n", low=1), check_int(d, "d", low=1)
    compressor.check(n, d)
    trials = check_int(trials, "trials", low=2)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    seed = int(np.random.default_rng().integers(2**63)) if seed is None else check_seed(seed)
    sets = _input_sets(inputs, n, d, np.random.default_rng(seed))
    z = NormalDist().inv_cdf(1 - (1 - confidence) / (2 * len(sets)))
    stated_raw = compressor.ab_constants(n, d)
    stated = None if stated_raw is None else (float(stated_raw[0]), float(stated_raw[1]))
    results = []
    for name, a in sets.items():
        mean = a.mean(axis=0)
        rounds = [compressor.aggregate(a, seed=seed, round=t) for t in range(trials)]
        err = _finite(rounds, (trials, d), f"{compressor.name}.aggregate") - mean
        sq = np.einsum("tj,tj->t", err, err)
        half = z * float(sq.std(ddof=1)) / math.sqrt(trials)
        S, M = float(np.mean(np.einsum("ij,ij->i", a, a))), float(mean @ mean)
        low = max(float(sq.mean()) - half, 0.0)
        bound = None if stated is None else stated[0] * S - stated[1] * M
        results.append(
            ABInput(
                name=name, S=S, M=M, variance=float(sq.mean()), interval=(low, float(sq.mean()) + half), stated_bound=bound,
                consistent=None if stated is None else low <= bound + 1e-12 * (stated[0] * S + stated[1] * M),  # type: ignore[operator]
            )  # fmt: skip
        )
    est = ABEstimate(
        compressor=compressor.name, n=n, d=d, trials=trials, confidence=confidence, seed=seed, inputs=tuple(results),
        stated=stated, A=math.nan, A_interval=(math.nan, math.nan), B=math.nan, B_interval=(math.nan, math.nan),
    )  # fmt: skip
    A, A_lo, A_hi = est.min_A(0.0 if stated is None else stated[1])
    B, B_lo, B_hi = est.max_B(A if stated is None else stated[0])
    return dataclasses.replace(est, A=A, A_interval=(A_lo, A_hi), B=B, B_interval=(B_lo, B_hi))


def _input_sets(inputs: Any, n: int, d: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    if inputs is None or (isinstance(inputs, str) and inputs == "adversarial"):
        return _adversarial_inputs(n, d, rng)
    if isinstance(inputs, str):
        raise ValueError(f"inputs must be None, 'adversarial', an (n, d) array or a sequence of them, got {inputs!r}")
    items = [inputs] if np.ndim(inputs) == 2 else list(inputs)
    out = {}
    for k, a in enumerate(items):
        a = as_float_array(a, 2, f"inputs[{k}]").astype(np.float64)
        if a.shape != (n, d):
            raise ValueError(f"inputs[{k}] must have shape ({n}, {d}), got {a.shape}")
        if not np.isfinite(a).all():
            raise ValueError(f"inputs[{k}] must be finite")
        if not a.any():
            raise ValueError(f"inputs[{k}] is all zeros: it constrains nothing")
        out[f"input{k}"] = a
    if not out:
        raise ValueError("inputs must not be empty")
    return out


# =============================================================================================
# Communication complexity
# =============================================================================================
@dataclass(frozen=True)
class Complexity:
    """Predicted communication of a method to reach ``E‖∇f(x̂)‖² ≤ ε`` (nonconvex) or
    ``E[f(x^T) − f*] ≤ ε`` (PL, ``mu`` given).

    ``rounds`` is ``T``, ``floats_per_round`` the expected floats a worker sends per round
    (MARINA: ``p·d + (1 − p)ζ``; EF21: ``K``), ``floats = T · floats_per_round`` (the initial
    full gradient excluded, as in the paper's Tables). ``table`` is the closed form of the
    paper's Table for this method and compressor (a Θ-expression without constants; PL rows
    times ``log(Δ⁰/ε)``), ``table_ref`` names it, and ``ratio = floats / table``.
    """

    method: str
    compressor: str
    K: int | None
    p: float | None
    gamma: float
    rounds: int
    floats_per_round: float
    floats: float
    pl: bool
    A: float | None
    B: float | None
    alpha: float | None
    table: float | None
    table_ref: str | None

    @property
    def ratio(self) -> float | None:
        """``floats / table`` (None without a closed form)."""
        return None if not self.table else self.floats / self.table


def _rounds(gamma: float, eps: float, delta0: float, mu: float | None) -> float:
    """Theorem AB: ``2Δ⁰/(γε)``; Theorem AB-PL (``(1 − γμ)^T Δ⁰ ≤ ε``): ``log(Δ⁰/ε)/(γμ)``."""
    if mu is None:
        return 2.0 * delta0 / (gamma * eps)
    return max(math.log(delta0 / eps), 0.0) / (gamma * mu)


def _minimize_p(floats: Callable[[float], float], p_low: float) -> float:
    """The ``p ∈ [p_low, 1]`` minimising ``floats(p)``: a log-grid, then Brent on the bracket.
    Values within rounding (1e-12) of each other tie, and ties go to the largest ``p`` (the
    identity compressor, for which ``p`` does not matter, keeps ``p = 1``)."""
    grid = np.geomspace(1.0, p_low, 65)
    values = np.array([floats(float(p)) for p in grid])
    j = int(np.argmax(values <= values.min() * (1 + 1e-12)))
    lo, hi = math.log(grid[min(j + 1, grid.size - 1)]), math.log(grid[max(j - 1, 0)])
    res = minimize_scalar(lambda t: floats(math.exp(t)), bounds=(lo, hi), method="bounded", options={"xatol": 1e-9})
    p = min(math.exp(float(res.x)), 1.0)
    return p if floats(p) < values[j] * (1 - 1e-12) else float(grid[j])


def _argmin_int(fn: Callable[[int], float], lo: int, hi: int, points: int = 17) -> int:
    """An integer minimiser of ``fn`` on ``[lo, hi]`` by successive log-grid refinement around
    the best point (exhaustive once the bracket holds at most ``points`` integers)."""
    cache: dict[int, float] = {}

    def f(k: int) -> float:
        if k not in cache:
            cache[k] = fn(k)
        return cache[k]

    while hi - lo + 1 > points:
        grid = np.unique(np.geomspace(lo, hi, points).round().astype(int))
        j = int(np.argmin([f(int(k)) for k in grid]))
        lo, hi = int(grid[max(j - 1, 0)]), int(grid[min(j + 1, grid.size - 1)])
    return min(range(lo, hi + 1), key=f)


def _real(value: Any, name: str, *, positive: bool) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not (math.isfinite(v) and (v > 0 if positive else v >= 0)):
        raise ValueError(f"{name} must be a {'positive' if positive else 'non-negative'} finite number, got {value!r}")
    return v


def _check_constants(n: int, d: int, L_minus: float, L_plus: float, L_pm: float, eps: float, delta0: float, mu: float | None) -> None:
    check_int(n, "n", low=1)
    check_int(d, "d", low=1)
    for name, v in (("L_minus", L_minus), ("eps", eps), ("delta0", delta0)):
        _real(v, name, positive=True)
    for name, v in (("L_plus", L_plus), ("L_pm", L_pm)):
        _real(v, name, positive=False)
    if mu is not None and _real(mu, "mu", positive=True) > L_minus:
        raise ValueError(f"mu = {mu} exceeds L_minus = {L_minus}: impossible (Lemma 'relation between L and mu', PL appendix)")


def complexity(
    method: Literal["marina", "ef21"],
    compressor: Compressor | type[Compressor],
    n: int,
    d: int,
    L_minus: float,
    L_plus: float,
    L_pm: float,
    eps: float,
    delta0: float,
    mu: float | None = None,
) -> Complexity:
    """Rounds and floats per worker of MARINA or EF21 with the theory's step, optimised.

    ``method="marina"`` (unbiased ``compressor`` with AB constants): Theorem AB, step ``1/M``,
    ``M = L_− + sqrt((1−p)/p · ((A−B)L_+² + B L_±²))``, ``T = ⌈2Δ⁰M/ε⌉``; with ``mu``,
    Theorem AB-PL, ``γ = min{1/(L_− + sqrt(2(1−p)/p · (…))), p/(2μ)}``, ``T = ⌈log(Δ⁰/ε)/(γμ)⌉``.
    Each round a worker sends ``p·d + (1−p)ζ`` floats in expectation (``ζ`` =
    ``floats_per_worker``); ``p`` minimises ``T·(p·d + (1−p)ζ)`` numerically.

    ``method="ef21"`` (contractive ``compressor`` with ``α``, e.g. TopK: ``α = K/d``): step
    ``1/(L_− + L_+ sqrt(β/θ))``, ``θ = 1 − sqrt(1 − α)``, ``β = (1 − α)/(1 − sqrt(1 − α))``,
    ``T = ⌈2Δ⁰/(γε)⌉`` (``g_i⁰ = ∇f_i(x⁰)``, so ``G⁰ = 0``); PL: ``γ = min{1/(L_− + L_+
    sqrt(2β/θ)), θ/(2μ)}``, ``T = ⌈log(Δ⁰/ε)/(γμ)⌉``. A worker sends ``K`` floats per round.

    ``compressor`` may be a class: ``permk.RandK`` / ``permk.TopK`` mean "optimise ``K`` over
    ``1..d``" (integer log-grid refinement), other classes are instantiated without arguments;
    an instance keeps its parameters. The constants may be upper bounds (the theorems hold
    with them); ``mu > L_minus`` is rejected.

    >>> c = complexity("marina", RandK, n=100, d=10_000, L_minus=1.0, L_plus=1.0, L_pm=0.0, eps=1e-3, delta0=1.0)
    >>> c.K, c.table, round(c.ratio, 1)  # Table: Θ((Δ⁰/ε) min{d L_−, d L_+/√n}) = 10⁶ floats
    (1, 1000000.0, 4.0)
    """
    _check_constants(n, d, L_minus, L_plus, L_pm, eps, delta0, mu)
    if method == "marina":
        solve: Callable[[Compressor], Complexity] = lambda c: _marina(c, n, d, L_minus, L_plus, L_pm, eps, delta0, mu)  # noqa: E731
    elif method == "ef21":
        solve = lambda c: _ef21(c, n, d, L_minus, L_plus, eps, delta0, mu)  # noqa: E731
    else:
        raise ValueError(f"method must be 'marina' or 'ef21', got {method!r}")
    if isinstance(compressor, Compressor):
        best = solve(compressor)
    elif isinstance(compressor, type) and issubclass(compressor, Compressor):
        if dataclasses.is_dataclass(compressor) and "k" in {f.name for f in dataclasses.fields(compressor)}:
            cls: Any = compressor
            best = solve(cls(_argmin_int(lambda k: solve(cls(k)).floats, 1, d)))
        else:
            best = solve(compressor())
    else:
        raise TypeError(f"compressor must be a permk.Compressor or a Compressor class, got {compressor!r}")
    table = table_complexity(method, compressor, n, d, L_minus, L_plus, L_pm, eps, delta0, mu)
    return dataclasses.replace(best, table=None if table is None else table[0], table_ref=None if table is None else table[1])


def _marina(
    c: Compressor, n: int, d: int, L_minus: float, L_plus: float, L_pm: float, eps: float, delta0: float, mu: float | None
) -> Complexity:
    ab = c.ab_constants(n, d)
    if ab is None or not c.is_unbiased:
        raise ValueError(f"MARINA needs an unbiased compressor with AB constants (Theorem AB); {c.name} has none")
    A, B = float(ab[0]), float(ab[1])
    zeta = c.floats_per_worker(n, d)

    def per_round(p: float) -> float:
        return p * d + (1 - p) * zeta

    def rounds(p: float) -> float:
        return _rounds(marina_stepsize(A, B, L_minus, L_plus, L_pm, p, mu=mu), eps, delta0, mu)

    p = _minimize_p(lambda p: rounds(p) * per_round(p), 1e-3 * min(zeta / d, 1.0))
    T = math.ceil(rounds(p))
    return Complexity(
        method="marina", compressor=c.name, K=getattr(c, "k", None), p=p,
        gamma=marina_stepsize(A, B, L_minus, L_plus, L_pm, p, mu=mu), rounds=T, floats_per_round=per_round(p),
        floats=T * per_round(p), pl=mu is not None, A=A, B=B, alpha=None, table=None, table_ref=None,
    )  # fmt: skip


def _ef21(c: Compressor, n: int, d: int, L_minus: float, L_plus: float, eps: float, delta0: float, mu: float | None) -> Complexity:
    alpha = c.alpha(d)
    if alpha is None:
        raise ValueError(f"EF21 needs a contractive compressor with a known α (eq. (contractive)); {c.name} has none")
    gamma = ef21_stepsize(alpha, L_minus, L_plus, mu=mu)
    T = math.ceil(_rounds(gamma, eps, delta0, mu))
    zeta = float(c.floats_per_worker(n, d))
    return Complexity(
        method="ef21", compressor=c.name, K=getattr(c, "k", None), p=None, gamma=gamma, rounds=T,
        floats_per_round=zeta, floats=T * zeta, pl=mu is not None, A=None, B=None, alpha=float(alpha),
        table=None, table_ref=None,
    )  # fmt: skip


def table_complexity(
    method: str,
    compressor: Compressor | type[Compressor],
    n: int,
    d: int,
    L_minus: float,
    L_plus: float,
    L_pm: float,
    eps: float,
    delta0: float,
    mu: float | None = None,
) -> tuple[float, str] | None:
    """The paper's closed form for MARINA+PermK, MARINA+RandK or EF21+TopK, or None.

    Table (table:communication_complexity), from Lemmas (lemma:optimal_parameters_of_methods,
    lemma:optimal_parameters_of_methods_n_geq_d), optimised over ``p`` and ``K``:
    PermK ``(Δ⁰/ε) min{d L_−, (d/n) L_− + (d/√n) L_±}`` (``d ≥ n``; ``L_−`` for ``d/n`` when
    ``d ≤ n``), RandK ``(Δ⁰/ε) min{d L_−, (d/√n) L_+}`` (``d ≥ n``; ``L_− + (d/√n) L_+`` when
    ``d ≤ n``), TopK ``(Δ⁰/ε) d L_−``. With ``mu`` the PL Table
    (table:communication_complexity_pl): ``max{(1/μ) min{…}, d}`` (TopK ``d L_−/μ``) times
    ``log(Δ⁰/ε)``. These hold up to constant factors; returns ``(value, reference)``.

    >>> table_complexity("marina", PermK(), 10, 1000, 1.0, 1.0, 0.0, 1e-3, 1.0)
    (100000.0, "Table 'communication_complexity' (d ≥ n): MARINA + PermK")
    """
    kind = compressor if isinstance(compressor, type) else type(compressor)
    row = {("marina", PermK): "MARINA + PermK", ("marina", RandK): "MARINA + RandK", ("ef21", TopK): "EF21 + TopK"}.get((method, kind))
    if row is None:
        return None
    big = d >= n
    if kind is PermK:
        inner = min(d * L_minus, (d / n if big else 1.0) * L_minus + d / math.sqrt(n) * L_pm)
    elif kind is RandK:
        inner = min(d * L_minus, (0.0 if big else L_minus) + d / math.sqrt(n) * L_plus)
    else:
        inner = d * L_minus
    regime = "d ≥ n" if big else "d ≤ n"
    if mu is None:
        return delta0 / eps * inner, f"Table 'communication_complexity' ({regime}): {row}"
    value = inner / mu if kind is TopK else max(inner / mu, d)
    return max(math.log(delta0 / eps), 0.0) * value, f"Table 'communication_complexity_pl' ({regime}): {row}"


def complexity_table(
    n: int, d: int, L_minus: float, L_plus: float, L_pm: float, eps: float, delta0: float, mu: float | None = None
) -> tuple[Complexity, ...]:
    """MARINA+PermK, MARINA+RandK (optimal K), EF21+TopK (optimal K) and GD (MARINA with the
    identity compressor: ``g^{t+1} = ∇f(x^{t+1})``) for the same problem constants."""
    args = (n, d, L_minus, L_plus, L_pm, eps, delta0, mu)
    return (
        complexity("marina", PermK, *args),
        complexity("marina", RandK, *args),
        complexity("ef21", TopK, *args),
        complexity("marina", Identity, *args),
    )


def format_complexity_table(rows: Sequence[Complexity]) -> str:
    """A plain-text table of :class:`Complexity` rows."""
    head = f"{'method':<7} {'compressor':<13} {'p':>9} {'step γ':>10} {'rounds T':>11} {'floats/worker':>14} {'paper Θ':>11} {'ratio':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        p = "-" if r.p is None else f"{r.p:.3g}"
        table = "-" if r.table is None else f"{r.table:.4g}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        lines.append(
            f"{r.method.upper():<7} {r.compressor:<13} {p:>9} {r.gamma:>10.4g} {r.rounds:>11d} {r.floats:>14.4g} {table:>11} {ratio:>6}"
        )
    return "\n".join(lines)


def complexity_plot(
    n: int,
    d: int,
    L_minus: float,
    L_plus: float,
    eps: float,
    delta0: float,
    L_pm_grid: Sequence[float],
    out_path: str | Path,
    *,
    mu: float | None = None,
) -> Path:
    """Plot predicted floats per worker to reach ε against ``L_±`` for MARINA+PermK (optimal
    ``p``), MARINA+RandK and EF21+TopK (optimal ``K``; they do not depend on ``L_±``) at the
    given ``(n, d)``; values of ``L_±`` that Lemma (lem:08hhdf) excludes
    (``L_±² < L_+² − L_−²`` or ``L_± > L_+``) are shaded. Written with matplotlib's Agg canvas
    (no display needed); returns the path."""
    from matplotlib.figure import Figure

    grid = np.asarray(L_pm_grid, dtype=np.float64)
    if grid.ndim != 1 or grid.size == 0 or not np.isfinite(grid).all() or (grid < 0).any():
        raise ValueError("L_pm_grid must be a non-empty 1-D sequence of non-negative finite numbers")
    grid = np.unique(grid)
    args = (n, d, L_minus, L_plus)
    perm = [complexity("marina", PermK, *args, float(v), eps, delta0, mu).floats for v in grid]
    rand = complexity("marina", RandK, *args, L_plus, eps, delta0, mu)
    top = complexity("ef21", TopK, *args, L_plus, eps, delta0, mu)
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.add_subplot()
    ax.plot(grid, perm, "o-", label="MARINA + PermK (optimal p)")
    ax.plot(grid, np.full(grid.size, rand.floats), "--", label=f"MARINA + RandK (K={rand.K}, optimal p)")
    ax.plot(grid, np.full(grid.size, top.floats), ":", label=f"EF21 + TopK (K={top.K})")
    low = math.sqrt(max(L_plus**2 - L_minus**2, 0.0))
    if grid[0] < low:
        ax.axvspan(grid[0], low, color="0.88", label="excluded by Lemma: L±² ≥ L+² − L−²")
    if grid[-1] > L_plus:
        ax.axvspan(L_plus, grid[-1], color="0.75", label="excluded by Lemma: L± ≤ L+")
    positive = grid[grid > 0]
    if (grid == 0).any():
        ax.set_xscale("symlog", linthresh=float(positive[0]) if positive.size else 1.0)
    else:
        ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("L± (square root of the Hessian variance)")
    ax.set_ylabel("floats per worker to reach ε")
    regime = f"PL, μ={mu:g}" if mu is not None else "nonconvex"
    ax.set_title(f"n={n}, d={d}, L−={L_minus:g}, L+={L_plus:g}, ε={eps:g}, Δ⁰={delta0:g} ({regime})", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    out = Path(out_path)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    return out


_CLI_DESCRIPTION = (
    "Rounds and floats per worker to reach ε predicted by Theorems AB / AB-PL (MARINA) and the "
    "EF21 theorems, with optimal p and K, next to the closed forms of the paper's Tables."
)


def _add_complexity_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, required=True, help="number of workers")
    parser.add_argument("--d", type=int, required=True, help="dimension")
    parser.add_argument("--L-minus", dest="L_minus", type=float, required=True, help="L−: smoothness of f")
    parser.add_argument("--L-plus", dest="L_plus", type=float, required=True, help="L+ of Assumption 'L+'")
    parser.add_argument("--L-pm", dest="L_pm", type=float, required=True, help="L±: square root of the Hessian variance")
    parser.add_argument("--eps", type=float, required=True, help="target accuracy ε")
    parser.add_argument("--delta0", type=float, required=True, help="Δ⁰ = f(x⁰) − f^inf")
    parser.add_argument("--mu", type=float, default=None, help="PL constant (PL rates of Theorem AB-PL and EF21)")
    parser.add_argument("--plot", type=Path, default=None, metavar="OUT.png", help="also plot floats against L±")
    parser.add_argument(
        "--L-pm-grid", dest="L_pm_grid", type=float, nargs="+", default=None, metavar="L",
        help="L± values of the plot (default: 25 values that the Lemma allows, up to L+)",
    )  # fmt: skip


def _feasible_L_pm(L_minus: float, L_plus: float, points: int = 25) -> list[float]:
    """``L_±`` values that Lemma (lem:08hhdf) allows with these ``L_−``, ``L_+``:
    ``sqrt(max(L_+² − L_−², 0)) ≤ L_± ≤ L_+`` (from ``L_+/10⁴``, and 0, when the lower end is 0)."""
    low = math.sqrt(max(L_plus**2 - L_minus**2, 0.0))
    if low == 0.0:
        return [0.0, *np.geomspace(L_plus * 1e-4, L_plus, points - 1)]
    return list(np.geomspace(low, L_plus, points))


def add_complexity_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``complexity`` subcommand to an ``argparse`` subparsers object; its handler is
    :func:`complexity_command` (set as ``func``)."""
    parser = subparsers.add_parser(
        "complexity",
        help="predicted communication of MARINA+PermK/RandK, EF21+TopK and GD",
        description=_CLI_DESCRIPTION,
    )
    _add_complexity_arguments(parser)
    parser.set_defaults(func=complexity_command)
    return parser


def complexity_command(args: argparse.Namespace) -> int:
    """Print the table of :func:`complexity_table` (and write the plot with ``--plot``)."""
    rows = complexity_table(args.n, args.d, args.L_minus, args.L_plus, args.L_pm, args.eps, args.delta0, args.mu)
    regime = "nonconvex: E‖∇f(x̂)‖² ≤ ε" if args.mu is None else f"PL (μ = {args.mu:g}): E[f(x^T) − f*] ≤ ε"
    constants = f"L− = {args.L_minus:g}, L+ = {args.L_plus:g}, L± = {args.L_pm:g}, Δ⁰ = {args.delta0:g}"
    print(f"n = {args.n}, d = {args.d}, {constants}; {regime}")
    print(format_complexity_table(rows))
    if args.plot is not None:
        grid = args.L_pm_grid if args.L_pm_grid is not None else _feasible_L_pm(args.L_minus, args.L_plus)
        path = complexity_plot(args.n, args.d, args.L_minus, args.L_plus, args.eps, args.delta0, grid, args.plot, mu=args.mu)
        print(f"plot written to {path}")
    return 0


def complexity_cli(argv: Sequence[str] | None = None) -> int:
    """``permk complexity --n N --d D --L-minus … --L-plus … --L-pm … --eps … --delta0 …
    [--mu …] [--plot out.png]`` as a function (returns the exit code)."""
    parser = argparse.ArgumentParser(prog="permk complexity", description=_CLI_DESCRIPTION)
    _add_complexity_arguments(parser)
    return complexity_command(parser.parse_args(argv))
