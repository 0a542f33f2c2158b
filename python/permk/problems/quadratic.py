"""Quadratic problems ``f_i(x) = ½ xᵀA_i x − xᵀb_i``: the problems of the paper's quadratic
experiments.

:class:`Quadratic` holds them from user matrices (dense or ``scipy.sparse``), with each constant
computed when first read; :meth:`Quadratic.synthetic` is the paper's generator (Algorithm 1),
:class:`SyntheticQuadratic`, with its oracles in Rust (``kernel``, the ``"rust"`` paths of the
methods), its coordinate oracle ``local_grad_coords`` and its constants in closed form
(``exact_smoothness``, for :func:`permk.theory.smoothness`).
"""

from __future__ import annotations

import math
from functools import cached_property
from types import MappingProxyType
from typing import Any, Sequence

import numpy as np

from .._core import Tridiagonal
from .._validate import as_vector, check_alloc, check_group, check_int, check_real, check_seed, index_array, start_point
from ..theory.smoothness import ExactConstants, Smoothness

__all__ = ["Quadratic", "SyntheticQuadratic"]


class Quadratic:
    """``f_i(x) = ½ xᵀA_i x − xᵀb_i`` with symmetric ``A_i`` (the quadratics of Example
    "quadratic functions" and of the experiments).

    The smoothness constants (``L_minus``, ``L_plus``, ``L_pm``, ``L_i``, ``mu``) are exact,
    from eigenvalues (:class:`permk.theory.smoothness.ExactConstants`), each computed when first
    read and kept; ``f_star`` is one linear solve. Every Lanczos run starts from a seeded vector,
    so the constants are the same in every process.

    Parameters
    ----------
    matrices
        A sequence of n symmetric (d, d) arrays or scipy.sparse matrices ``A_i``.
    vectors
        The (n, d) array of the ``b_i``.
    x0
        The starting point (default: zeros).

    Examples
    --------
    >>> import numpy as np
    >>> q = Quadratic([np.eye(2), 3 * np.eye(2)], np.zeros((2, 2)), x0=np.ones(2))
    >>> q.loss(q.x0), round(q.L_pm, 12), round(q.L_minus, 12)
    (2.0, 1.0, 2.0)
    """

    def __init__(self, matrices: Sequence[Any], vectors: Any, x0: Any = None) -> None:
        import scipy.sparse as sp

        mats = list(matrices)
        if not mats:
            raise ValueError("matrices must hold at least one matrix")
        self.n = len(mats)
        shape: tuple[int, ...] = tuple(getattr(mats[0], "shape", ()))
        if len(shape) != 2 or shape[0] != shape[1] or shape[0] < 1:
            raise ValueError(f"matrices must be square (d, d), got {shape}")
        self.d = int(shape[0])
        self._A: list[Any] = []
        for i, A in enumerate(mats):
            kind = (A.dtype if sp.issparse(A) else np.asarray(A).dtype).kind
            if kind not in "biuf":
                raise TypeError(f"matrices[{i}] must hold real numbers, got dtype kind {kind!r}")
            A = sp.csr_array(A, dtype=np.float64) if sp.issparse(A) else np.asarray(A, dtype=np.float64)
            if A.shape != (self.d, self.d):
                raise ValueError(f"matrices[{i}] has shape {A.shape}, expected ({self.d}, {self.d})")
            values = A.data if sp.issparse(A) else A
            if not np.isfinite(values).all():
                raise ValueError(f"matrices[{i}] must be finite")
            asym = abs(A - A.T)
            if (asym.max() if asym.size else 0.0) > 1e-10 * (1.0 + abs(A).max()):
                raise ValueError(f"matrices[{i}] must be symmetric")
            self._A.append(A)
        b = np.asarray(vectors)
        if b.dtype.kind not in "biuf":
            raise TypeError(f"vectors must hold real numbers, got dtype {b.dtype}")
        b = b.astype(np.float64)
        if b.shape != (self.n, self.d):
            raise ValueError(f"vectors must have shape ({self.n}, {self.d}), got {b.shape}")
        if not np.isfinite(b).all():
            raise ValueError("vectors must be finite")
        self._b = b
        self._b_mean = b.mean(axis=0)
        self._H = sum(self._A[1:], self._A[0]) / self.n
        self._exact = ExactConstants(self._A)
        self.x0 = np.zeros(self.d) if x0 is None else start_point(x0, self.d)

    @staticmethod
    def synthetic(n: int, d: int, lam: float, noise_scale: float, seed: int = 0) -> SyntheticQuadratic:
        """The paper's synthetic quadratic (Algorithm 1): see :class:`SyntheticQuadratic` (which
        refuses ``lam`` and ``noise_scale`` values whose constants are not finite)."""
        return SyntheticQuadratic(n, d, lam, noise_scale, seed=seed)

    def hessians(self) -> list[Any]:
        """The matrices ``A_i`` (``∇²f_i``)."""
        return list(self._A)

    def loss(self, x: Any) -> float:
        x = as_vector(x, self.d)
        return float(0.5 * x @ (self._H @ x) - self._b_mean @ x)

    def grad(self, x: Any) -> np.ndarray:
        x = as_vector(x, self.d)
        return np.asarray(self._H @ x) - self._b_mean

    def local_grad(self, i: int, x: Any) -> np.ndarray:
        i = check_int(i, "i", high=self.n)
        return np.asarray(self._A[i] @ as_vector(x, self.d)) - self._b[i]

    def local_grads(self, x: Any) -> np.ndarray:
        x = as_vector(x, self.d)
        return np.stack([np.asarray(A @ x) for A in self._A]) - self._b

    @property
    def L_minus(self) -> float:
        """``L_−``: the smoothness constant of ``f`` (``‖(1/n) Σ A_i‖``)."""
        return float(self._exact.L_minus)

    @property
    def L_plus(self) -> float:
        """``L_+`` of Assumption "L+" (``λ_max((1/n) Σ A_i²)^{1/2}``)."""
        return float(self._exact.L_plus)

    @property
    def L_pm(self) -> float:
        """``L_±`` (Definition "Hessian variance"); ``L_pm**2 = λ_max((1/n)ΣA_i² − ((1/n)ΣA_i)²)``."""
        return float(self._exact.L_pm)

    @property
    def L_i(self) -> np.ndarray:
        """The smoothness constants ``L_i = ‖A_i‖`` of the ``f_i``."""
        return np.asarray(self._exact.L_i)

    @property
    def mu(self) -> float | None:
        """The PL constant ``λ_min((1/n) Σ A_i)`` when positive, else None."""
        return self._exact.mu

    @cached_property
    def f_star(self) -> float | None:
        """``min f = −½ b̄ᵀH⁻¹b̄`` when ``H = (1/n) Σ A_i`` is positive definite (one factorisation:
        Cholesky, or a sparse ``LDLᵀ`` with positive pivots), else None."""
        x_star = _solve_if_positive_definite(self._H, self._b_mean)
        return None if x_star is None else float(-0.5 * self._b_mean @ x_star)

    @property
    def L_sq_mean(self) -> float:
        """The paper's pessimistic bound ``(1/n) Σ L_i²`` on ``L_+²`` and ``L_±²``."""
        return float(np.mean(self.L_i**2))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, d={self.d})"


def _solve_if_positive_definite(H: Any, rhs: np.ndarray) -> np.ndarray | None:
    """``H⁻¹ rhs`` when the symmetric ``H`` is positive definite, else None."""
    import scipy.sparse as sp

    if not sp.issparse(H):
        try:
            L = np.linalg.cholesky(H)
        except np.linalg.LinAlgError:
            return None
        return np.asarray(np.linalg.solve(L.T, np.linalg.solve(L, rhs)))
    import scipy.sparse.linalg as sla

    try:  # symmetric elimination with diagonal pivots: positive pivots iff H ≻ 0 (Sylvester)
        lu = sla.splu(sp.csc_matrix(H), diag_pivot_thresh=0.0, options={"SymmetricMode": True})
    except RuntimeError:
        return None
    if not (np.array_equal(lu.perm_r, lu.perm_c) and (lu.U.diagonal() > 0).all()):
        return None
    return np.asarray(lu.solve(rhs))


def _tridiagonal_extremes(d: int) -> tuple[float, float]:
    """Smallest and largest eigenvalue of ``T = tridiag(−1, 2, −1) ∈ R^{d×d}``."""
    h = math.pi / (2 * (d + 1))
    return 4.0 * math.sin(h) ** 2, 4.0 * math.cos(h) ** 2


class SyntheticQuadratic(Quadratic):
    """The synthetic quadratic of Algorithm 1 ("Quadratic optimization task generation").

    For each worker ``ν_i^s = 1 + s ξ_i^s``, ``ν_i^b = s ξ_i^b`` (``ξ ~ N(0, 1)`` i.i.d., drawn
    with ``numpy.random.default_rng(seed)`` as an ``(n, 2)`` array), ``b_i = (ν_i^s/4)(−1 + ν_i^b) e_1``
    and ``A_i = (ν_i^s/4) T + (λ − λ_min(mean A)) I`` with ``T = tridiag(−1, 2, −1)``;
    ``x^0 = (√d, 0, …, 0)``. ``lam`` must be positive and ``noise_scale`` non-negative, finite, and
    small enough that the constants are finite numbers (``lam`` near 1e308 makes ``L_+² = inf``):
    anything else is a ValueError naming them. Only ``O(n + d)`` numbers are stored; the oracles are Rust kernels
    (``kernel``, ``O(1)`` per coordinate) and every constant is exact and in closed form, since
    all ``A_i`` are polynomials in ``T`` (eigenvalues ``t_k = 4 sin²(kπ/(2(d+1)))``):
    ``L_±² = Var(ν^s/4) · t_max²``, ``L_+² = max_{t ∈ {t_min, t_max}} (1/n) Σ (a_i t + c)²``, …,
    for the whole problem or any group of its workers (:meth:`exact_smoothness`).

    >>> q = Quadratic.synthetic(10, 100, lam=1e-6, noise_scale=0.0, seed=0)
    >>> q.L_pm, round(q.mu, 12)
    (0.0, 1e-06)
    """

    def __init__(self, n: int, d: int, lam: float, noise_scale: float, seed: int = 0) -> None:
        self.n = check_int(n, "n", low=1, high=2**32)
        self.d = check_int(d, "d", low=1, high=2**32)
        self.lam = check_real(lam, "lam", low=0.0, strict=True)
        self.noise_scale = check_real(noise_scale, "noise_scale", low=0.0)
        self.seed = check_seed(seed)
        xi = np.random.default_rng(self.seed).standard_normal((self.n, 2))
        with np.errstate(over="ignore", invalid="ignore"):  # checked below: finite constants, or a ValueError
            nu_s = 1.0 + self.noise_scale * xi[:, 0]
            nu_b = self.noise_scale * xi[:, 1]
            self.a = nu_s / 4.0
            self.beta = nu_s / 4.0 * (-1.0 + nu_b)
            t_min, t_max = _tridiagonal_extremes(self.d)
            a_mean = float(self.a.mean())
            lam_min_mean = min(a_mean * t_min, a_mean * t_max)
            self.shift = self.lam - lam_min_mean
            self._t = (t_min, t_max)
            constants = self._constants_of(self.a)
        if not (all(v is None or math.isfinite(v) for v in constants) and np.isfinite(self.beta).all()):
            shown = ", ".join(f"{k} = {v:g}" for k, v in zip(("L_minus", "L_plus", "L_pm"), constants))
            raise ValueError(f"lam = {self.lam:g} and noise_scale = {self.noise_scale:g} give smoothness constants beyond "
                             f"float64 ({shown}): choose a smaller lam (or noise_scale)")
        self.__dict__["_constants"] = constants  # the cached property's value, computed for the check
        #: The native oracles (``permk._core.Tridiagonal``): the ``"rust"`` paths use them.
        self.kernel = Tridiagonal(self.a.tolist(), self.shift, self.beta.tolist())
        self.x0 = np.zeros(self.d)
        self.x0[0] = math.sqrt(self.d)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (and deep-copied) as its constructor's arguments: the problem is a pure function
        of them, and its native kernel is rebuilt from them (a spawn pool can take it)."""
        return (type(self), (self.n, self.d, self.lam, self.noise_scale, self.seed))

    def hessians(self) -> list[Any]:
        """The ``A_i`` as ``scipy.sparse`` tridiagonal matrices (``O(nd)`` memory: small n only)."""
        import scipy.sparse as sp

        check_alloc((self.n, 3 * self.d), "the tridiagonal Hessians", itemsize=16)
        T = sp.diags_array([-np.ones(self.d - 1), 2 * np.ones(self.d), -np.ones(self.d - 1)], offsets=[-1, 0, 1])
        eye = sp.eye_array(self.d)
        return [sp.csr_array(a * T + self.shift * eye) for a in self.a]

    def loss(self, x: Any) -> float:
        return float(self.kernel.loss(as_vector(x, self.d)))

    def grad(self, x: Any) -> np.ndarray:
        return self.kernel.grad(as_vector(x, self.d))  # type: ignore[no-any-return]

    def local_grad(self, i: int, x: Any) -> np.ndarray:
        i = check_int(i, "i", high=self.n)
        return self.kernel.local_grads(as_vector(x, self.d), i, i + 1)[0]  # type: ignore[no-any-return]

    def local_grads(self, x: Any) -> np.ndarray:
        check_alloc((self.n, self.d), "the local gradients")
        return self.kernel.local_grads(as_vector(x, self.d))  # type: ignore[no-any-return]

    def local_grad_coords(self, x: Any, rows: Any, cols: Any) -> np.ndarray:
        """``∇f_{rows[k]}(x)[cols[k]]`` for every ``k`` (``O(1)`` each)."""
        r, c = index_array(rows, "rows"), index_array(cols, "cols")
        return self.kernel.local_grad_coords(as_vector(x, self.d), r, c)  # type: ignore[no-any-return]

    # -- exact constants in closed form --------------------------------------------------------
    def _eig_extremes(self, a: np.ndarray) -> np.ndarray:
        """Eigenvalues of ``a T + c I`` at ``t_min`` and ``t_max`` (its extremes), shape (len(a), 2)."""
        t = np.array(self._t)
        return np.multiply.outer(a, t) + self.shift

    def exact_smoothness(self, workers: Sequence[int] | None = None) -> Smoothness:
        """The exact constants in closed form, of ``f`` or of ``(1/|G|) Σ_{i ∈ G} f_i`` for the
        group ``workers`` (appendix "Group Hessian Variance"); what
        :func:`permk.theory.smoothness` returns for this problem (no Hessian is formed)."""
        a = self.a if workers is None else self.a[check_group(workers, self.n)]
        L_minus, L_plus, L_pm, mu = self._constants_of(a)
        return Smoothness(
            L_minus=L_minus, L_plus=L_plus, L_pm=L_pm, method="exact",
            uncertainty=MappingProxyType({"L_minus": 0.0, "L_plus": 0.0, "L_pm": 0.0}),
            L_i=tuple(float(v) for v in np.abs(self._eig_extremes(a)).max(axis=1)), mu=mu,
            note="exact: closed form (Algorithm 1: A_i = a_i T + cI, eigenvalues of T in closed form)",
        )  # fmt: skip

    def _constants_of(self, a: np.ndarray) -> tuple[float, float, float, float | None]:
        mean = self._eig_extremes(np.array([a.mean()]))
        L_minus = float(np.abs(mean).max())
        L_plus = float(math.sqrt(np.max(np.mean(self._eig_extremes(a) ** 2, axis=0))))
        L_pm = math.sqrt(float(np.mean((a - a.mean()) ** 2))) * self._t[1]
        low = float(mean.min())
        return L_minus, L_plus, L_pm, (low if low > 0 else None)

    @cached_property
    def _constants(self) -> tuple[float, float, float, float | None]:
        return self._constants_of(self.a)

    @property
    def L_minus(self) -> float:
        return self._constants[0]

    @property
    def L_plus(self) -> float:
        return self._constants[1]

    @property
    def L_pm(self) -> float:
        return self._constants[2]

    @property
    def L_i(self) -> np.ndarray:
        return np.abs(self._eig_extremes(self.a)).max(axis=1)

    @property
    def mu(self) -> float:
        return float(self._eig_extremes(np.array([self.a.mean()])).min())

    @cached_property
    def f_star(self) -> float:
        rhs = np.zeros(self.d)
        rhs[0] = self.beta.mean()
        x_star = self.kernel.solve_mean(rhs.tolist())
        return float(-0.5 * rhs[0] * x_star[0])

    def __repr__(self) -> str:
        return f"Quadratic.synthetic(n={self.n}, d={self.d}, lam={self.lam}, noise_scale={self.noise_scale}, seed={self.seed})"
