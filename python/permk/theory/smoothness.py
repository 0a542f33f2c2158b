"""Smoothness constants and Hessian variance of a distributed problem (Assumption "L+",
Definition "Hessian variance", eq. (HV)).

* :func:`smoothness` — ``L_−``, ``L_+``, ``L_±`` of any problem, or of a group of its workers:
  exact from the Hessians of a quadratic (Example "quadratic functions"), a *lower estimate* from
  pairs of points, or a *local estimate* from Lanczos on the matrices of Theorem "second-order
  characterization" at a point.
* :class:`ExactConstants` — the exact constants of a quadratic from its Hessians, each computed on
  first use: what :class:`permk.Quadratic` reads (one constant at a time, every Lanczos run from its
  own seeded start vector, so the values are the same in every process).

>>> import numpy as np
>>> class TwoQuadratics:  # f_i(x) = ½ xᵀA_i x with A_1 = I, A_2 = 3I: any numpy object will do
...     n, d, x0 = 2, 3, np.ones(3)
...     def hessians(self): return [np.eye(3), 3 * np.eye(3)]
...     def local_grads(self, x): return np.stack([x, 3 * x])
...     def grad(self, x): return 2 * x
...     def loss(self, x): return float(x @ x)
>>> s = smoothness(TwoQuadratics())
>>> round(s.L_minus, 12), round(s.L_plus**2, 12), round(s.L_pm**2, 12), s.kind
(2.0, 5.0, 1.0, 'exact')
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, partial
from types import MappingProxyType
from typing import Any, Callable, Literal, Mapping, Sequence, Union

import numpy as np

from .._validate import as_float_array, check_alloc, check_group, check_int, check_output, check_real

__all__ = ["Smoothness", "ExactConstants", "smoothness", "SMOOTHNESS_OPTIONS"]

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
#: The seed of the exact method's Lanczos start vectors when none is given: the exact constants
#: are a deterministic function of the matrices.
_EXACT_SEED = 0


def _issparse(A: Any) -> bool:
    import scipy.sparse as sp

    return bool(sp.issparse(A))


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

    def __init__(self, problem: Any, workers: Sequence[int] | None = None) -> None:
        missing = [a for a in ("n", "d", "x0", "grad", "local_grads") if not hasattr(problem, a)]
        if missing:
            raise TypeError(f"problem must implement the Problem protocol (permk.problems); it has no {', '.join(missing)}")
        self.problem = problem
        self.n_all = check_int(problem.n, "problem.n", low=1)
        self.d = check_int(problem.d, "problem.d", low=1)
        self.whole = workers is None
        self.workers = np.arange(self.n_all) if workers is None else check_group(workers, self.n_all)
        self.n = len(self.workers)

    def x0(self) -> np.ndarray:
        return _point(self.problem.x0, self.d, "problem.x0")

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        check_alloc((self.n_all, self.d), "the local gradients problem.local_grads(x)")
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
    return check_output(value, shape, name, finite=True)


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
        self.sparse = any(_issparse(A) for A in matrices)
        if not self.sparse:
            check_alloc((n, d, d), "the stacked Hessians")
        blocks = [_symmetric_matrix(A, i, d, self.sparse) for i, A in enumerate(matrices)]
        self.blocks = blocks
        self.n, self.d = n, d
        self.H: Any = sum(blocks[1:], blocks[0]) / n
        self.calls = 0

    @cached_property
    def J(self) -> Any:
        """``[A_1; …; A_n]``, built on first use (only ``L_+`` and ``L_±`` need it)."""
        if self.sparse:
            import scipy.sparse as sp

            return sp.vstack(self.blocks, format="csr")
        return np.concatenate(self.blocks)

    @cached_property
    def JT(self) -> Any:
        return self.J.T.tocsr() if self.sparse else self.J.T

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
    import scipy.sparse as sp

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
        import scipy.sparse.linalg as sla

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
    problem: Any,
    method: SmoothnessMethod = "exact",
    *,
    workers: Sequence[int] | None = None,
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
    ``d``, ``x0``, ``grad`` and ``local_grads``; ``method="exact"`` also ``hessians()``), or of
    the group ``workers`` of its workers (the constants of ``(1/|G|) Σ_{i ∈ G} f_i``, appendix
    "Group Hessian Variance").

    ``method="exact"`` (quadratics, Example "quadratic functions"): with ``A_i = ∇²f_i`` and
    ``H = (1/n) Σ A_i``, ``L_− = ‖H‖``, ``L_+² = λ_max((1/n) Σ A_i²)``,
    ``L_±² = λ_max((1/n) Σ A_i² − H²)``, ``L_i = ‖A_i‖`` (``per_worker=False`` skips them) and
    ``μ = λ_min(H)`` when positive (else None). Lanczos on operators built from matrix-vector
    products with the stacked ``A_i`` — ``(1/n) Σ A_i²`` is never formed — or dense
    eigendecompositions for ``d <= 32`` and dense ``H``; for sparse ``H``, ``μ`` comes from a
    sparse ``LDLᵀ`` (positive definiteness) and Lanczos on ``H⁻¹``. ``uncertainty``: the
    Lanczos residuals (or LAPACK's ``d·eps·‖H‖``). Options: ``tol`` (ARPACK, default 1e-12).
    The start vectors come from ``seed`` (default 0), so the exact constants are the same in
    every process. A problem that knows its exact constants in closed form provides
    ``exact_smoothness(workers)`` (returning a :class:`Smoothness`), which is used instead
    (:meth:`permk.Quadratic.synthetic`).

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

    Every result satisfies the paper's lemma bounding the Hessian variance, ``L_+² − L_−² ≤ L_±² ≤ L_+²``,
    up to rounding.

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
    options = {"x": x, "radius": radius, "trajectory": trajectory, "pairs": pairs, "centers": centers, "hvp": hvp,
               "fd_step": fd_step, "tol": tol, "per_worker": per_worker}
    if method not in SMOOTHNESS_OPTIONS:
        raise ValueError(f"method must be 'exact', 'pairs' or 'power', got {method!r}")
    unused = sorted(k for k, v in options.items() if v is not None and k not in SMOOTHNESS_OPTIONS[method])
    if unused:
        raise ValueError(f"method={method!r} does not use {', '.join(unused)}")
    if method == "exact":
        closed_form = getattr(problem, "exact_smoothness", None)
        if closed_form is not None:
            return closed_form(None if workers is None else list(workers))  # type: ignore[no-any-return]
        oracles = _Oracles(problem, workers)
        per = True if per_worker is None else bool(per_worker)
        exact = ExactConstants(oracles.hessians(), tol=_positive(tol, "tol", _TOL["exact"]),
                               seed=_EXACT_SEED if seed is None else seed)
        return exact.smoothness(per_worker=per)
    oracles = _Oracles(problem, workers)
    rng = np.random.default_rng(seed)
    point = oracles.x0() if x is None else _point(x, oracles.d, "x")
    if method == "power":
        step = _positive(fd_step, "fd_step", _FD_STEP)
        return _power(oracles, point, hvp, step, _positive(tol, "tol", _TOL["power"]), rng)
    budget = 256 if pairs is None else check_int(pairs, "pairs", low=1)
    return _pairs(oracles, point, radius, trajectory, budget, centers, rng)


#: The options each method of :func:`smoothness` takes.
SMOOTHNESS_OPTIONS: Mapping[str, frozenset[str]] = MappingProxyType({
    "exact": frozenset({"tol", "per_worker"}),
    "pairs": frozenset({"x", "radius", "trajectory", "pairs", "centers"}),
    "power": frozenset({"x", "hvp", "fd_step", "tol"}),
})


def _positive(value: float | None, name: str, default: float) -> float:
    return default if value is None else check_real(value, name, low=0.0, strict=True)


class ExactConstants:
    """The exact constants of a quadratic ``f_i(x) = ½ xᵀA_i x − b_iᵀx`` from its Hessians
    ``A_i`` (Example "quadratic functions"), each computed on first use and kept.

    With ``H = (1/n) Σ A_i``: ``L_− = ‖H‖``, ``L_+² = λ_max((1/n) Σ A_i²)``,
    ``L_±² = λ_max((1/n) Σ A_i² − H²)``, ``L_i = ‖A_i‖`` and ``μ = λ_min(H)`` when positive (else
    None). Lanczos on operators built from matrix-vector products with the stacked ``A_i`` —
    ``(1/n) Σ A_i²`` is never formed — or dense eigendecompositions for ``d <= 32`` and dense
    ``H``; for sparse ``H``, ``μ`` comes from a sparse ``LDLᵀ`` (positive definiteness) and
    Lanczos on ``H⁻¹``. Every Lanczos run starts from its own vector drawn from ``(seed, which
    constant)``: the values do not depend on which constants were asked for first, nor on the
    process.

    >>> import numpy as np
    >>> c = ExactConstants([np.eye(2), 3 * np.eye(2)])
    >>> c.L_minus, round(c.L_pm, 12)
    (2.0, 1.0)
    """

    def __init__(self, matrices: Sequence[Any], *, tol: float = _TOL["exact"], seed: int | np.random.Generator = _EXACT_SEED) -> None:
        mats = list(matrices)
        if not mats:
            raise ValueError("matrices must hold at least one matrix")
        shape: tuple[int, ...] = tuple(getattr(mats[0], "shape", ()))
        if len(shape) != 2 or shape[0] != shape[1] or shape[0] < 1:
            raise ValueError(f"the Hessians must be square (d, d) matrices, got shape {shape}")
        self.n, self.d = len(mats), int(shape[0])
        self.m = _Matrices(mats, self.n, self.d)
        self.tol = tol
        self._seed = seed

    def _rng(self, which: int) -> np.random.Generator:
        if isinstance(self._seed, np.random.Generator):
            return self._seed
        return np.random.default_rng([check_int(self._seed, "seed"), which])

    @cached_property
    def _plus(self) -> _Eig:
        return _extreme_eig(_operators(self.m, self.n)["L_plus"], self.d, "LA", self.tol, self._rng(1))

    @cached_property
    def _pm(self) -> _Eig:
        return _extreme_eig(_operators(self.m, self.n)["L_pm"], self.d, "LA", self.tol, self._rng(2))

    @cached_property
    def _minus(self) -> tuple[float, float, float | None, float | None]:
        """``(L_−, its uncertainty, μ or None, its uncertainty)``."""
        m, d = self.m, self.d
        if m.sparse:
            h = _extreme_eig(_operators(m, self.n)["L_minus"], d, "LM", self.tol, self._rng(3))
            smallest = _smallest_eigenvalue_if_positive(m.H, self.tol, self._rng(4))
            mu, mu_unc = smallest if smallest is not None else (None, None)
            return abs(h.value), h.residual, mu, mu_unc
        w = np.linalg.eigvalsh(m.H)
        L_minus = float(np.abs(w).max())
        unc = d * float(np.finfo(np.float64).eps) * L_minus
        return L_minus, unc, (float(w[0]) if w[0] > 0 else None), (unc if w[0] > 0 else None)

    @property
    def L_minus(self) -> float:
        """``L_− = ‖(1/n) Σ A_i‖``."""
        return self._minus[0]

    @property
    def L_plus(self) -> float:
        """``L_+ = λ_max((1/n) Σ A_i²)^{1/2}`` (Assumption "L+")."""
        return math.sqrt(max(self._plus.value, 0.0))

    @property
    def L_pm(self) -> float:
        """``L_±`` (Definition "Hessian variance")."""
        return math.sqrt(max(self._pm.value, 0.0))

    @property
    def mu(self) -> float | None:
        """``λ_min((1/n) Σ A_i)`` when positive, else None."""
        return self._minus[2]

    @cached_property
    def L_i(self) -> tuple[float, ...]:
        """``L_i = ‖A_i‖``: batched dense eigenvalues, or Lanczos per sparse matrix."""
        m = self.m
        if not m.sparse:
            return tuple(float(v) for v in np.abs(np.linalg.eigvalsh(np.stack(m.blocks))).max(axis=1))
        rng = self._rng(5)
        return tuple(abs(_extreme_eig(partial(_matvec, A), m.d, "LM", self.tol, rng).value) for A in m.blocks)

    def smoothness(self, *, per_worker: bool = True) -> Smoothness:
        """All the constants as a :class:`Smoothness` (``per_worker=False`` leaves out ``L_i``)."""
        unc = {"L_minus": self._minus[1], "L_plus": _root_halfwidth(self._plus.value, self._plus.residual),
               "L_pm": _root_halfwidth(self._pm.value, self._pm.residual)}
        if self._minus[3] is not None:
            unc["mu"] = self._minus[3]
        return Smoothness(
            L_minus=self.L_minus, L_plus=self.L_plus, L_pm=self.L_pm, method="exact", uncertainty=MappingProxyType(unc),
            L_i=self.L_i if per_worker else None, mu=self.mu, evaluations=self.m.calls,
            note="exact: extreme eigenvalues of the Hessians (Example 'quadratic functions')",
        )  # fmt: skip


def _matvec(A: Any, v: np.ndarray) -> np.ndarray:
    return np.asarray(A @ v)


def _smallest_eigenvalue_if_positive(H: Any, tol: float, rng: np.random.Generator) -> tuple[float, float] | None:
    """``(λ_min(H), its uncertainty)`` for a sparse positive definite ``H``, else None.

    Positive definiteness: symmetric elimination without pivoting (SuperLU with diagonal
    pivots) succeeds with positive pivots exactly when ``H ≻ 0`` (Sylvester's law of inertia);
    then ``λ_min = 1/λ_max(H⁻¹)``, whose Lanczos converges fast."""
    import scipy.sparse as sp
    import scipy.sparse.linalg as sla

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
    # every product of the L+ and L± operators holds (n, d) arrays of local gradients: refuse
    # before any Lanczos run when they cannot fit
    check_alloc((oracles.n_all, d), "the local gradients of the power method", count=4)
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
    check_alloc((min(d, _MAX_BASIS) + 2, oracles.n_all, d), "the local gradients of the pairs' search subspace")
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


