"""The authors' nonconvex classification problems on labelled data: finite sums
``f_i = (1/m_i) Σ_j f_ij`` (:class:`permk.problems.FiniteSumProblem`, built on
:class:`permk.problems.finite_sum.LinearFiniteSum`, whose docstring gives the features, the
minibatches and the constants in terms of the bounds below).

**The problems** (the authors' ``function.py`` of mysteryresearcher/sampling-in-optimal-sgd;
``a_j`` the sample with its bias, ``W ∈ R^{D×C}`` row-major, ``z_j = Wᵀa_j``):

* :class:`NonconvexSigmoid` (``NonConvexLossFunction``), ``C = 1``, labels ``±1``:
  ``f_ij(x) = (1 − σ(y_j a_jᵀx))²``;
* :class:`NonconvexMultiClass` (``NonConvexLossMultiClassFunction``), labels ``0 … C−1``:
  ``f_ij(W) = (1 − softmax(Wᵀa_j)_{y_j})² + (λ/2)‖W‖²`` (their default λ = 1e-4);
* :class:`NonconvexLogistic` (``LogisticRegressionFunction`` with ``nonconvex_regularizer``):
  ``f_ij(W) = −log softmax(Wᵀa_j)_{y_j} + λ Σ_k w_k²/(1 + w_k²)`` (cross-entropy over ``C``
  classes; their binary tasks use ``C = 2``).

**The curvature bounds** ``c`` (``−c I ⪯ ∇²_z h ⪯ c I``) and ``ρ`` (``|r''| ≤ ρ``), which give
``L_ij = c‖a_j‖² + ρ``, ``L_i``, ``L_−`` and the bounds on ``L_+``, ``L_±``
(:mod:`permk.problems.finite_sum`):

* sigmoid loss, ``φ(t) = (1 − σ(t))²`` at ``t = y aᵀx`` (``y² = 1``): with ``s = σ(t)``,
  ``φ'' = −2s(1 − s)²(1 − 3s)``, whose extremes over ``s ∈ (0, 1)`` are at the roots of
  ``12s² − 9s + 1``, ``s± = (9 ± √33)/24``: ``max φ'' = 0.1540586`` (at ``s₊``, the authors'
  0.15406) and ``min φ'' = −0.1202044``; ``c = max φ''``, ``ρ = 0``;
* multi-class loss, ``h = (1 − q)²`` with ``q = p_y``, ``p = softmax(z)``, ``v = e_y − p``:
  ``∇²h = 2q(2q − 1) v vᵀ + 2q(1 − q)(diag p − p pᵀ)``; ``‖v‖² ≤ 2(1 − q)²`` and
  ``‖diag p − p pᵀ‖ ≤ 1/2`` (Gershgorin: row ``k`` sums to ``2p_k(1 − p_k)``), so
  ``c = max_q 4q|2q − 1|(1 − q)² + q(1 − q) = 0.4717068`` for every ``C`` (the authors' 12C is
  looser); ``ρ = λ``;
* cross-entropy, ``∇²h = diag p − p pᵀ ∈ [0, 1/2]``: ``c = 1/2`` (the authors' 0.25 holds for a
  single weight vector, not for their ``C = 2`` columns); the regulariser ``λ w²/(1 + w²)`` has
  ``r'' = λ(2 − 6w²)/(1 + w²)³ ∈ [−λ/2, 2λ]``: ``ρ = 2λ``.

The tests check every constant against finite-difference Hessians at random points.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._validate import check_int, check_real
from .datasets import binary_labels, class_labels
from .finite_sum import LinearFiniteSum

__all__ = ["NonconvexSigmoid", "NonconvexMultiClass", "NonconvexLogistic", "SIGMOID_CURVATURE", "MULTICLASS_CURVATURE"]


def _sigmoid_curvature() -> tuple[float, float]:
    """``(max φ'', −min φ'')`` of ``φ(t) = (1 − σ(t))²``: ``φ'' = −2s(1 − s)²(1 − 3s)`` at the
    roots ``s = (9 ± √33)/24`` of its derivative in ``s``."""

    def phi2(s: float) -> float:
        return -2.0 * s * (1.0 - s) ** 2 * (1.0 - 3.0 * s)

    return phi2((9.0 + math.sqrt(33.0)) / 24.0), -phi2((9.0 - math.sqrt(33.0)) / 24.0)


def _multiclass_curvature() -> float:
    """``max_{q ∈ [0,1]} 4q|2q − 1|(1 − q)² + q(1 − q)``: on each side of ``q = 1/2`` a
    polynomial, maximised at the real roots of its derivative in the interval."""
    best = 0.0
    for sign, lo, hi in ((-1.0, 0.0, 0.5), (1.0, 0.5, 1.0)):
        # 4q·sign(2q − 1)(1 − q)² + q(1 − q)
        poly = np.polynomial.Polynomial([0, 4]) * np.polynomial.Polynomial([-sign, 2 * sign]) * np.polynomial.Polynomial([1, -1]) ** 2
        poly = poly + np.polynomial.Polynomial([0, 1, -1])
        roots = [complex(r) for r in poly.deriv().roots()]
        cands = [lo, hi] + [r.real for r in roots if abs(r.imag) < 1e-12 and lo <= r.real <= hi]
        best = max(best, max(float(poly(q)) for q in cands))
    return best


#: ``max φ''`` of the sigmoid loss ``φ(t) = (1 − σ(t))²`` (``−min φ''`` is smaller, 0.1202044).
SIGMOID_CURVATURE = _sigmoid_curvature()[0]
#: The bound ``c`` on ``‖∇²_z (1 − softmax(z)_y)²‖`` for any number of classes.
MULTICLASS_CURVATURE = _multiclass_curvature()


def _softmax(Z: np.ndarray) -> np.ndarray:
    E = np.exp(Z - Z.max(axis=-1, keepdims=True))
    return E / E.sum(axis=-1, keepdims=True)


class NonconvexSigmoid(LinearFiniteSum):
    """The nonconvex sigmoid loss ``f_ij(x) = (1 − σ(y_j a_jᵀx))²`` of a binary task (the authors'
    ``NonConvexLossFunction``), ``d = features + 1`` (the bias).

    Constants (module docstring): ``L_ij = c‖a_j‖²``, ``L_i = c λ_max(A_iᵀA_i)/m_i`` with
    ``c = max φ'' = 0.1540586``.

    Parameters
    ----------
    X
        The (N, features) data: a dense array or a scipy.sparse matrix.
    y
        The N labels, two values (``±1``, ``0/1`` or any two:
        :func:`permk.problems.datasets.binary_labels`).
    n
        The number of workers.
    seed
        The seed of the shards' shuffle.
    p_hat
        The authors' heterogeneity (None: equal shards, :func:`permk.problems.datasets.shard_indices`).
    shuffle
        False for contiguous shards.
    dtype
        ``np.float64`` or ``np.float32``: the type of the data and the products.
    bias
        Append the constant 1 to every sample.
    x0
        The starting point (default: zeros).

    Examples
    --------
    >>> import numpy as np
    >>> p = NonconvexSigmoid(np.eye(4), [1, -1, 1, -1], n=2, seed=0)
    >>> p.d, p.sample_counts.tolist(), p.loss(p.x0)
    (5, [2, 2], 0.25)
    """

    _rho = 0.0
    _c = SIGMOID_CURVATURE

    def __init__(self, X: Any, y: Any, *, n: int, seed: int = 0, p_hat: float | None = None, shuffle: bool = True,
                 dtype: Any = np.float64, bias: bool = True, x0: Any = None) -> None:
        super().__init__(X, y, n=n, classes=1, seed=seed, p_hat=p_hat, shuffle=shuffle, dtype=dtype, bias=bias, x0=x0)

    def _encode(self, labels: np.ndarray) -> np.ndarray:
        return binary_labels(labels).astype(self.dtype)

    def _head(self, Z: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from scipy.special import expit

        t = Z[..., 0] * Y
        s, r = expit(t), expit(-t)  # σ(t) and 1 − σ(t), each accurate
        return r * r, (-2.0 * s * r * r * Y)[..., None]


class NonconvexMultiClass(LinearFiniteSum):
    """The multi-class nonconvex loss ``f_ij(W) = (1 − softmax(Wᵀa_j)_{y_j})² + (λ/2)‖W‖²``
    (the authors' ``NonConvexLossMultiClassFunction``, their default ``λ = 1e-4``), ``W ∈
    R^{D×C}`` row-major: ``d = (features + 1)·C`` (7,850 for Fashion-MNIST's 10 classes).

    ``y`` holds the class labels (any ``C`` distinct values, encoded ``0 … C−1`` in sorted order
    by :func:`permk.problems.datasets.class_labels`; ``classes`` fixes ``C`` when some class has no
    sample, then the labels must be ``0 … classes−1``). The other parameters are
    :class:`NonconvexSigmoid`'s. Constants: ``c = 0.4717068`` for every ``C``, ``ρ = λ``.

    >>> import numpy as np
    >>> p = NonconvexMultiClass(np.eye(3), [0, 1, 2], n=3, seed=0)
    >>> p.d, round(p.loss(p.x0), 12)  # (1 − 1/3)²
    (12, 0.444444444444)
    """

    _c = MULTICLASS_CURVATURE

    def __init__(self, X: Any, y: Any, *, n: int, lam: float = 1e-4, classes: int | None = None, seed: int = 0,
                 p_hat: float | None = None, shuffle: bool = True, dtype: Any = np.float64, bias: bool = True, x0: Any = None) -> None:
        self.lam = check_real(lam, "lam", low=0.0)
        self._rho = self.lam
        C = _class_count(y, classes)
        super().__init__(X, y, n=n, classes=C, seed=seed, p_hat=p_hat, shuffle=shuffle, dtype=dtype, bias=bias, x0=x0)

    def _encode(self, labels: np.ndarray) -> np.ndarray:
        return _class_codes(labels, self.classes)

    def _head(self, Z: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        P = _softmax(Z)
        q = np.take_along_axis(P, Y[..., None], axis=-1)  # p_y, shape (..., 1)
        V = -P
        np.put_along_axis(V, Y[..., None], 1.0 - q, axis=-1)  # e_y − p
        return ((1.0 - q) ** 2)[..., 0], -2.0 * (1.0 - q) * q * V

    def _reg(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        return 0.5 * self.lam * float(x @ x), self.lam * x


class NonconvexLogistic(LinearFiniteSum):
    """Logistic (softmax cross-entropy) regression with the nonconvex regulariser,
    ``f_ij(W) = −log softmax(Wᵀa_j)_{y_j} + λ Σ_k w_k²/(1 + w_k²)`` (the authors'
    ``LogisticRegressionFunction`` with ``nonconvex_regularizer=True``; ``C = 2`` columns for a
    binary task, as theirs), ``d = (features + 1)·C``. Labels and parameters as
    :class:`NonconvexMultiClass`. Constants: ``c = 1/2``, ``ρ = 2λ``.

    >>> import numpy as np
    >>> p = NonconvexLogistic(np.eye(2), [0, 1], n=1, lam=0.1)
    >>> p.d, round(p.loss(p.x0), 12)  # log 2
    (6, 0.69314718056)
    """

    _c = 0.5

    def __init__(self, X: Any, y: Any, *, n: int, lam: float = 1e-3, classes: int | None = None, seed: int = 0,
                 p_hat: float | None = None, shuffle: bool = True, dtype: Any = np.float64, bias: bool = True, x0: Any = None) -> None:
        self.lam = check_real(lam, "lam", low=0.0)
        self._rho = 2.0 * self.lam
        C = _class_count(y, classes)
        super().__init__(X, y, n=n, classes=C, seed=seed, p_hat=p_hat, shuffle=shuffle, dtype=dtype, bias=bias, x0=x0)

    def _encode(self, labels: np.ndarray) -> np.ndarray:
        return _class_codes(labels, self.classes)

    def _head(self, Z: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        zmax = Z.max(axis=-1, keepdims=True)
        lse = (zmax + np.log(np.exp(Z - zmax).sum(axis=-1, keepdims=True)))[..., 0]
        P = _softmax(Z)
        zy = np.take_along_axis(Z, Y[..., None], axis=-1)[..., 0]
        dZ = P.copy()
        np.put_along_axis(dZ, Y[..., None], np.take_along_axis(P, Y[..., None], axis=-1) - 1.0, axis=-1)
        return lse - zy, dZ

    def _reg(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        sq = x * x
        return self.lam * float(np.sum(sq / (1.0 + sq))), 2.0 * self.lam * x / (1.0 + sq) ** 2


def _class_count(y: Any, classes: int | None) -> int:
    """``classes``, else the number of distinct labels of ``y`` (finite reals; at least two:
    one class is no classification task)."""
    if classes is not None:
        return check_int(classes, "classes", low=1)
    values = class_labels(y)[1]
    if values.size < 2:
        raise ValueError(f"a classification task needs at least two label values, got {values.size}: {values.tolist()} "
                         "(pass classes= for classes without samples)")
    return int(values.size)


def _class_codes(labels: np.ndarray, classes: int) -> np.ndarray:
    """Labels as codes ``0 … classes−1``: the sorted distinct values when there are ``classes``
    of them, else labels already in ``0 … classes−1``."""
    codes, values = class_labels(labels)
    if values.size == classes:
        return codes
    if values.size > classes or not (np.equal(np.mod(values, 1), 0).all() and values.min() >= 0 and values.max() < classes):
        raise ValueError(f"y has {values.size} distinct labels {values[:10].tolist()}: with classes={classes} they must be integers in range({classes})")
    return labels.astype(np.int64)
