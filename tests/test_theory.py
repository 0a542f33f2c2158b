"""Tests of permk.theory: smoothness constants, group Hessian variance, measured AB constants
and the communication complexity calculator (paper: Lemma lem:08hhdf, Theorems AB / AB-PL,
Appendices "EF21 Analysis", "Analysis of Complexity Bounds", "Group Hessian Variance").

The problems here are plain numpy classes implementing the problem protocol (``n``, ``d``,
``x0``, ``loss``, ``grad``, ``local_grads``; ``hessians()`` for the exact method).
"""

from __future__ import annotations

import itertools
import math
import tracemalloc
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla

import permk
from permk import theory
from permk import marina_stepsize
from permk.theory import complexity, estimate_ab, group_hessian_variance, smoothness


# ---------------------------------------------------------------------------------------------
# problems
# ---------------------------------------------------------------------------------------------
class DenseQuadratic:
    """``f_i(x) = ½ xᵀA_i x − b_iᵀx`` with random symmetric (indefinite or SPD) ``A_i``."""

    def __init__(self, n: int, d: int, *, seed: int = 0, spd: bool = False, local_grad: bool = True) -> None:
        rng = np.random.default_rng(seed)
        E = rng.standard_normal((n, d, d))
        A = E + E.transpose(0, 2, 1)
        if spd:
            A = A @ A.transpose(0, 2, 1) / d + np.eye(d)
        self.A, self.b = A, rng.standard_normal((n, d))
        self.n, self.d, self.x0 = n, d, rng.standard_normal(d)
        if local_grad:
            self.local_grad = lambda i, x: self.A[i] @ x - self.b[i]

    def hessians(self) -> list[np.ndarray]:
        return list(self.A)

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        return self.A @ x - self.b

    def grad(self, x: np.ndarray) -> np.ndarray:
        return self.local_grads(x).mean(axis=0)

    def loss(self, x: np.ndarray) -> float:
        return float(np.mean(0.5 * np.einsum("j,ijk,k->i", x, self.A, x) - self.b @ x))


class SparseQuadratic:
    """Random symmetric banded sparse ``A_i`` (bandwidth 2)."""

    def __init__(self, n: int, d: int, *, seed: int = 0, shift: float = 0.0) -> None:
        rng = np.random.default_rng(seed)
        self.mats = []
        for _ in range(n):
            diags = [rng.standard_normal(d - abs(k)) for k in (-2, -1, 0, 1, 2)]
            diags[3], diags[4] = diags[1], diags[0]  # symmetric
            self.mats.append(sp.csr_array(sp.diags_array(diags, offsets=[-2, -1, 0, 1, 2]) + shift * sp.eye_array(d)))
        self.n, self.d, self.x0 = n, d, np.ones(d)

    def hessians(self) -> list[Any]:
        return self.mats

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        return np.stack([A @ x for A in self.mats])

    def grad(self, x: np.ndarray) -> np.ndarray:
        return self.local_grads(x).mean(axis=0)

    def loss(self, x: np.ndarray) -> float:
        return float(np.mean([0.5 * x @ (A @ x) for A in self.mats]))


class Logistic:
    """``f_i(x) = (1/m) Σ_j log(1 + exp(−y_ij z_ijᵀx)) + (λ/2)‖x‖²``: not quadratic, with
    analytic Hessians ``Z_iᵀ diag(σ(t)(1 − σ(t))) Z_i / m + λI`` (``t = y ∘ Z_i x``)."""

    def __init__(self, n: int, d: int, m: int = 20, lam: float = 0.1, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.Z = rng.standard_normal((n, m, d)) * (1.0 + np.arange(n))[:, None, None] / n
        self.y = rng.choice([-1.0, 1.0], size=(n, m))
        self.n, self.d, self.m, self.lam = n, d, m, lam
        self.x0 = rng.standard_normal(d)

    def _t(self, x: np.ndarray) -> np.ndarray:
        return self.y * (self.Z @ x)

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        s = 1.0 / (1.0 + np.exp(self._t(x)))  # σ(−t)
        return -np.einsum("imd,im->id", self.Z, self.y * s) / self.m + self.lam * x

    def local_grad(self, i: int, x: np.ndarray) -> np.ndarray:
        t = self.y[i] * (self.Z[i] @ x)
        return -self.Z[i].T @ (self.y[i] / (1.0 + np.exp(t))) / self.m + self.lam * x

    def grad(self, x: np.ndarray) -> np.ndarray:
        return self.local_grads(x).mean(axis=0)

    def loss(self, x: np.ndarray) -> float:
        return float(np.mean(np.logaddexp(0.0, -self._t(x))) + 0.5 * self.lam * x @ x)

    def hessian(self, i: int, x: np.ndarray) -> np.ndarray:
        sig = 1.0 / (1.0 + np.exp(-self.y[i] * (self.Z[i] @ x)))
        return self.Z[i].T @ ((sig * (1 - sig))[:, None] * self.Z[i]) / self.m + self.lam * np.eye(self.d)

    def hvp(self, i: int | None, x: np.ndarray, v: np.ndarray) -> np.ndarray:
        if i is None:
            return np.stack([self.hessian(j, x) @ v for j in range(self.n)])
        return self.hessian(i, x) @ v

    def upper_hessians(self) -> np.ndarray:
        """``Z_iᵀZ_i/(4m) + λI ⪰ ∇²f_i(x)`` for every ``x``."""
        return np.einsum("imd,ime->ide", self.Z, self.Z) / (4 * self.m) + self.lam * np.eye(self.d)


def brute_force(A: np.ndarray) -> dict[str, Any]:
    """The constants of Example "quadratic functions" by dense linear algebra."""
    H = A.mean(axis=0)
    P = np.mean(A @ A, axis=0)
    w = np.linalg.eigvalsh(H)
    return {
        "L_minus": np.abs(w).max(),
        "L_plus": math.sqrt(np.linalg.eigvalsh(P)[-1]),
        "L_pm": math.sqrt(max(np.linalg.eigvalsh(P - H @ H)[-1], 0.0)),
        "L_i": np.abs(np.linalg.eigvalsh(A)).max(axis=1),
        "mu": w[0] if w[0] > 0 else None,
    }


def local_constants(mats: np.ndarray) -> dict[str, float]:
    """Lemma-level local constants from explicit Hessian matrices at one point."""
    H = mats.mean(axis=0)
    P = np.mean(mats @ mats, axis=0)
    return {
        "L_minus": float(np.abs(np.linalg.eigvalsh(H)).max()),
        "L_plus": math.sqrt(np.linalg.eigvalsh(P)[-1]),
        "L_pm": math.sqrt(max(np.linalg.eigvalsh(P - H @ H)[-1], 0.0)),
    }


CONSTANTS = ("L_minus", "L_plus", "L_pm")


def _kw(n: int, d: int, L_minus: float, L_plus: float, L_pm: float, eps: float, delta0: float, mu: float | None = None) -> dict[str, Any]:
    """The keyword arguments of complexity()/table_complexity() in the paper's order."""
    return dict(n=n, d=d, L_minus=L_minus, L_plus=L_plus, L_pm=L_pm, eps=eps, delta0=delta0, mu=mu)


def stated_ab(c: permk.Compressor, n: int, d: int) -> tuple[float, float]:
    ab = c.ab_constants(n, d)
    assert ab is not None
    return ab


def assert_lemma(s: theory.Smoothness, rtol: float = 1e-9) -> None:
    """Lemma (lem:08hhdf): ``L_+² − L_−² ≤ L_±² ≤ L_+²`` (and ``L_− ≤ L_+``)."""
    tol = rtol * s.L_plus**2
    assert s.L_plus**2 - s.L_minus**2 <= s.L_pm**2 + tol
    assert s.L_pm**2 <= s.L_plus**2 + tol
    assert s.L_minus**2 <= s.L_plus**2 + tol


# ---------------------------------------------------------------------------------------------
# exact
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, d", [(5, 7), (6, 45), (1, 3)])
@pytest.mark.parametrize("spd", [False, True])
def test_exact_matches_dense_linear_algebra(n: int, d: int, spd: bool) -> None:
    q = DenseQuadratic(n, d, seed=n * d, spd=spd)
    s, ref = smoothness(q), brute_force(q.A)
    for k in CONSTANTS:
        assert getattr(s, k) == pytest.approx(ref[k], rel=1e-10, abs=1e-12 * ref["L_plus"])
        assert s.uncertainty[k] <= 1e-8 * ref["L_plus"]
    np.testing.assert_allclose(np.array(s.L_i), ref["L_i"], rtol=1e-10)
    assert (s.mu is None) == (ref["mu"] is None)
    if spd:
        assert s.mu == pytest.approx(ref["mu"], rel=1e-10)
    assert s.kind == "exact" and s.method == "exact"
    assert_lemma(s)


def test_exact_sparse_never_forms_dense_products() -> None:
    q = SparseQuadratic(4, 3000, seed=1, shift=6.0)
    tracemalloc.start()
    s = smoothness(q, per_worker=False, seed=0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 3000**2 * 8 / 8  # an eighth of one dense d×d matrix (72 MB)
    # independent formulas: L+² = σ_max(J)²/n, L±² = σ_max([A_i − H]_i)²/n with J = [A_1; …; A_n]
    H = sum(q.mats) / q.n
    J = sp.vstack(q.mats).tocsr()
    D = sp.vstack([A - H for A in q.mats]).tocsr()
    v0 = np.ones(q.d)
    assert s.L_plus == pytest.approx(sla.svds(J, k=1, v0=v0, return_singular_vectors=False)[0] / math.sqrt(q.n), rel=1e-9)
    assert s.L_pm == pytest.approx(sla.svds(D, k=1, v0=v0, return_singular_vectors=False)[0] / math.sqrt(q.n), rel=1e-9)
    top, bottom = (sla.eigsh(H, k=1, which=w, v0=v0, tol=1e-14, return_eigenvectors=False)[0] for w in ("LA", "SA"))
    assert s.L_minus == pytest.approx(max(top, -bottom), rel=1e-10)
    assert bottom > 0 and s.mu == pytest.approx(bottom, rel=1e-9)
    assert s.L_i is None
    assert_lemma(s)


def test_exact_sparse_indefinite_has_no_mu_and_small_dims() -> None:
    q = SparseQuadratic(3, 40, seed=2)  # indefinite
    s = smoothness(q)
    ref = brute_force(np.stack([A.toarray() for A in q.mats]))
    assert ref["mu"] is None and s.mu is None
    for k in CONSTANTS:
        assert getattr(s, k) == pytest.approx(ref[k], rel=1e-9)
    np.testing.assert_allclose(np.array(s.L_i), ref["L_i"], rtol=1e-9)


class _HessiansOnly:
    """A problem seen only through its protocol and Hessians (no closed-form constants)."""

    def __init__(self, q: Any) -> None:
        self.q, self.n, self.d, self.x0 = q, q.n, q.d, q.x0

    def hessians(self) -> list[Any]:
        return self.q.hessians()  # type: ignore[no-any-return]

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        return self.q.local_grads(x)  # type: ignore[no-any-return]

    def grad(self, x: np.ndarray) -> np.ndarray:
        return self.q.grad(x)  # type: ignore[no-any-return]

    def loss(self, x: np.ndarray) -> float:
        return float(self.q.loss(x))


def test_exact_on_the_paper_synthetic_quadratic() -> None:
    """Lanczos on the Hessians agrees with the closed forms, which smoothness() uses for it
    (capability exact_smoothness), for the whole problem and for a group of workers."""
    q = permk.Quadratic.synthetic(6, 150, lam=1e-3, noise_scale=0.3, seed=4)
    s = smoothness(_HessiansOnly(q))
    assert "closed form" not in s.note
    closed = smoothness(q)
    assert "closed form" in closed.note and closed.kind == "exact"
    for k in (*CONSTANTS, "mu"):
        assert getattr(s, k) == pytest.approx(getattr(q, k), rel=1e-9)
        assert getattr(closed, k) == getattr(q, k)
    np.testing.assert_allclose(np.array(s.L_i), q.L_i, rtol=1e-9)
    group = [1, 4, 5]
    sg, cg = smoothness(_HessiansOnly(q), workers=group), smoothness(q, workers=group)
    for k in CONSTANTS:
        assert getattr(sg, k) == pytest.approx(getattr(cg, k), rel=1e-9)
    # a huge synthetic quadratic: closed forms, no Hessian formed, no memory
    big = permk.Quadratic.synthetic(n=10**5, d=10**6, lam=1e-6, noise_scale=0.1)
    assert smoothness(big).L_pm == big.L_pm


def test_exact_rejects_what_it_cannot_do() -> None:
    with pytest.raises(TypeError, match="hessians"):
        smoothness(Logistic(3, 4))
    q = DenseQuadratic(2, 3)
    q.A[0, 0, 1] += 1.0  # no longer symmetric
    with pytest.raises(ValueError, match="symmetric"):
        smoothness(q)
    with pytest.raises(ValueError, match="method"):
        smoothness(DenseQuadratic(2, 3), "newton")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not use radius"):
        smoothness(DenseQuadratic(2, 3), "exact", radius=1.0)
    with pytest.raises(ValueError, match="tol"):
        smoothness(DenseQuadratic(2, 3), tol=-1.0)


def test_bad_problems_raise_clear_errors() -> None:
    class NaNGradients(DenseQuadratic):
        def local_grads(self, x: np.ndarray) -> np.ndarray:
            return np.full((self.n, self.d), np.nan)

    for method in ("pairs", "power"):
        with pytest.raises(ValueError, match="non-finite"):
            smoothness(NaNGradients(2, 3), method)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Problem protocol"):
        smoothness(object())  # type: ignore[arg-type]
    q = DenseQuadratic(2, 3)
    with pytest.raises(ValueError, match="shape"):
        smoothness(q, "power", hvp=lambda i, x, v: np.zeros((2, 2)))
    for bad in ({"pairs": 0}, {"radius": -1.0}, {"centers": 0}, {"x": [np.nan] * 3}):
        with pytest.raises(ValueError):
            smoothness(q, "pairs", **bad)


# ---------------------------------------------------------------------------------------------
# pairs (lower estimates)
# ---------------------------------------------------------------------------------------------
def test_pairs_are_lower_estimates_that_reach_the_exact_values() -> None:
    q = DenseQuadratic(5, 12, seed=3)
    ex = smoothness(q)
    previous = np.zeros(3)
    for budget in (1, 4, 16, 64):
        lo = smoothness(q, "pairs", pairs=budget, seed=7)
        values = np.array([getattr(lo, k) for k in CONSTANTS])
        exact = np.array([getattr(ex, k) for k in CONSTANTS])
        assert (values <= exact * (1 + 1e-9)).all()
        assert (values >= previous).all()  # the same search, longer
        assert (np.array(lo.L_i) <= np.array(ex.L_i) * (1 + 1e-9)).all()
        assert lo.kind == "lower estimate" and lo.evaluations <= budget
        assert_lemma(lo, rtol=1e-12)
        previous = values
    np.testing.assert_allclose(values, exact, rtol=1e-9)  # the subspace spans R^12: Ritz = exact
    assert lo.evaluations < 64  # and the search stops there
    assert values[1] > 1.01 * smoothness(q, "pairs", pairs=1, seed=7).L_plus  # the search matters


def test_pairs_in_higher_dimension_get_close() -> None:
    q = DenseQuadratic(4, 80, seed=5)  # larger than the search subspace: restarts
    ex, lo = smoothness(q), smoothness(q, "pairs", pairs=300, seed=1)
    for k in CONSTANTS:
        assert getattr(ex, k) * 0.97 <= getattr(lo, k) <= getattr(ex, k) * (1 + 1e-9)
    assert all(v >= 0 for v in lo.uncertainty.values())


def test_pairs_along_a_trajectory_use_the_definitions() -> None:
    q = DenseQuadratic(4, 6, seed=8, spd=True)
    traj = [q.x0]
    for _ in range(9):
        traj.append(traj[-1] - 0.05 * q.grad(traj[-1]))
    traj.append(traj[-1])  # a repeated point is skipped
    traj_arr = np.array(traj)
    lo = smoothness(q, "pairs", trajectory=traj_arr, pairs=9)
    assert lo.evaluations == 9  # only the consecutive pairs fit in the budget
    ratios = []
    for x, y in zip(traj_arr[:-2], traj_arr[1:-1]):
        D = q.local_grads(x) - q.local_grads(y)
        s2 = float((x - y) @ (x - y))
        plus, minus = float(np.mean((D**2).sum(1))) / s2, float(D.mean(0) @ D.mean(0)) / s2
        ratios.append((minus, plus, plus - minus))
    np.testing.assert_allclose([lo.L_minus**2, lo.L_plus**2, lo.L_pm**2], np.max(ratios, axis=0), rtol=1e-12)
    longer = smoothness(q, "pairs", trajectory=traj_arr, pairs=80, seed=0)
    ex = smoothness(q)
    for k in CONSTANTS:
        assert getattr(lo, k) <= getattr(longer, k) <= getattr(ex, k) * (1 + 1e-9)
    with pytest.raises(ValueError, match="trajectory"):
        smoothness(q, "pairs", trajectory=traj_arr[:1])
    with pytest.raises(ValueError, match="distinct"):
        smoothness(q, "pairs", trajectory=np.zeros((3, 6)))


def test_pairs_on_a_nonquadratic_respect_its_known_upper_bounds() -> None:
    p = Logistic(5, 6, seed=2)
    U = p.upper_hessians()  # ∇²f_i(x) ⪯ U_i and ∇²f_i(x) ⪰ λI ≻ 0 everywhere
    L_i_max = np.linalg.eigvalsh(U)[:, -1]
    lo = smoothness(p, "pairs", pairs=200, centers=3, radius=2.0, seed=3)
    assert (np.array(lo.L_i) <= L_i_max * (1 + 1e-9)).all()
    assert lo.L_minus <= np.linalg.eigvalsh(U.mean(0))[-1] * (1 + 1e-9)
    assert lo.L_plus <= math.sqrt(np.mean(L_i_max**2)) * (1 + 1e-9)  # Lemma: L+² ≤ (1/n)Σ L_i²
    assert lo.L_minus >= p.lam  # every pair ratio is at least λ² (strong convexity)
    assert_lemma(lo, rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# power (local estimates)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, d, local_grad", [(5, 7, True), (4, 40, True), (3, 36, False)])
def test_power_matches_exact_on_quadratics(n: int, d: int, local_grad: bool) -> None:
    q = DenseQuadratic(n, d, seed=d, local_grad=local_grad)
    ex = smoothness(q)
    fd = smoothness(q, "power", seed=0)
    user = smoothness(q, "power", hvp=lambda i, x, v: q.A @ v if i is None else q.A[i] @ v, seed=0)
    for k in CONSTANTS:
        assert getattr(fd, k) == pytest.approx(getattr(ex, k), rel=1e-6)
        assert abs(getattr(fd, k) - getattr(ex, k)) <= fd.uncertainty[k] + 1e-12 * ex.L_plus
        assert getattr(user, k) == pytest.approx(getattr(ex, k), rel=1e-9)
    assert fd.kind == "local estimate" and fd.evaluations > 0 and "central differences" in fd.note
    assert_lemma(fd, rtol=1e-8)
    assert_lemma(user, rtol=1e-8)


def test_power_on_a_nonquadratic_is_the_local_hessian_constant() -> None:
    p = Logistic(4, 35, seed=6)  # d > 32: Lanczos
    x = p.x0 + 0.3
    ref = local_constants(np.stack([p.hessian(i, x) for i in range(p.n)]))
    fd = smoothness(p, "power", x=x, seed=1)
    user = smoothness(p, "power", x=x, hvp=p.hvp, seed=1)
    for k in CONSTANTS:
        assert getattr(fd, k) == pytest.approx(ref[k], rel=1e-6)
        assert abs(getattr(fd, k) - ref[k]) <= 2 * fd.uncertainty[k] + 1e-10 * ref["L_plus"]
        assert getattr(user, k) == pytest.approx(ref[k], rel=1e-9)
    assert_lemma(fd, rtol=1e-8)
    with pytest.raises(ValueError, match="shape"):
        smoothness(p, "power", hvp=lambda i, x, v: np.zeros(3))
    with pytest.raises(ValueError, match="shape"):
        smoothness(p, "power", x=np.zeros(3))


# ---------------------------------------------------------------------------------------------
# group Hessian variance
# ---------------------------------------------------------------------------------------------
class TwoGroups:
    """Workers 0..2 hold ``A``, workers 3..5 hold ``B`` (Appendix example: ``L_±^G = 0``)."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        A, B = (M + M.T for M in rng.standard_normal((2, 5, 5)))
        self.mats = [A] * 3 + [B] * 3
        self.n, self.d, self.x0 = 6, 5, np.ones(5)

    def hessians(self) -> list[np.ndarray]:
        return self.mats

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        return np.stack([M @ x for M in self.mats])

    def grad(self, x: np.ndarray) -> np.ndarray:
        return self.local_grads(x).mean(axis=0)

    def loss(self, x: np.ndarray) -> float:
        return float(np.mean([0.5 * x @ M @ x for M in self.mats]))


def test_group_hessian_variance_zero_inside_groups() -> None:
    g = group_hessian_variance(TwoGroups(), [[0, 1, 2], [3, 4, 5]], permk.PermK())
    assert g.whole.L_pm > 1.0
    assert all(c.L_pm <= 1e-7 * c.L_plus for c in g.constants)
    assert g.L_hat_sq == pytest.approx(0.0, abs=1e-12 * g.whole.L_plus**2)
    assert g.stepsize(0.1) == pytest.approx(1 / g.whole.L_minus, rel=1e-6)  # like GD (L̂² is rounding)
    # Theorem AB on the whole problem cannot see it: (A − B)L+² + B L±² = L±² > 0
    assert marina_stepsize(1.0, 1.0, g.whole.L_minus, g.whole.L_plus, g.whole.L_pm, 0.1) < 0.5 * g.stepsize(0.1)


def test_group_constant_matches_its_definition() -> None:
    q = DenseQuadratic(6, 8, seed=9)
    groups = [[4, 0], [1, 2, 5], [3]]
    comps = [permk.RandK(2), permk.PermK(), permk.RandK(3)]
    g = group_hessian_variance(q, groups, comps)
    total = 0.0
    for idx, c in zip(groups, comps):
        ref = brute_force(q.A[idx])
        A, B = stated_ab(c, len(idx), q.d)
        total += len(idx) ** 2 / q.n**2 * ((A - B) * ref["L_plus"] ** 2 + B * ref["L_pm"] ** 2)
    assert g.L_hat_sq == pytest.approx(total, rel=1e-9)
    assert g.whole.L_minus == pytest.approx(brute_force(q.A)["L_minus"], rel=1e-10)
    # one group is Theorem AB itself
    one = group_hessian_variance(q, [range(6)], permk.RandK(2))
    A, B = stated_ab(permk.RandK(2), 6, 8)
    w = one.whole
    assert one.L_hat_sq == pytest.approx((A - B) * w.L_plus**2 + B * w.L_pm**2, rel=1e-12)
    for p, mu in ((0.3, None), (0.3, 0.01)):
        assert one.stepsize(p, mu=mu) == pytest.approx(marina_stepsize(A, B, w.L_minus, w.L_plus, w.L_pm, p, mu=mu), rel=1e-12)
    # the other methods run per group too
    pairs = group_hessian_variance(q, groups, comps, method="pairs", pairs=40, seed=0)
    assert pairs.L_hat_sq <= g.L_hat_sq * (1 + 1e-9)


def test_group_ab_inequality_holds_on_data() -> None:
    groups = [[0, 1], [2, 3, 4]]
    c = permk.GroupPermK(groups)  # PermK run independently inside each group (Assumption "group AB")
    n, d = 5, 6
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((n, d)), np.tile(rng.standard_normal(d), (n, 1))]
    est = estimate_ab(c, n=n, d=d, inputs=inputs, trials=1500, seed=2)
    for a, res in zip(inputs, est.inputs):  # eq. (group_ab_inequality) with A = B = 1 per group
        rhs = sum(len(g) ** 2 / n**2 * (np.mean((a[g] ** 2).sum(1)) - a[g].mean(0) @ a[g].mean(0)) for g in groups)
        assert res.interval[0] <= rhs * (1 + 1e-12) + 1e-15
        assert res.variance == pytest.approx(rhs, rel=0.1, abs=1e-12)  # and it is tight for PermK


def test_group_arguments_are_checked() -> None:
    q = DenseQuadratic(4, 3)
    for bad in ([[0, 1], [1, 2, 3]], [[0, 1], [2]], [[0, 1, 2, 3], []]):
        with pytest.raises(ValueError, match="partition"):
            group_hessian_variance(q, bad, permk.PermK())
    with pytest.raises(ValueError):
        group_hessian_variance(q, [[0, 1, 2, 9]], permk.PermK())
    with pytest.raises(TypeError, match="one Compressor per group"):
        group_hessian_variance(q, [[0, 1], [2, 3]], [permk.PermK()])
    with pytest.raises(ValueError, match="AB constants"):
        group_hessian_variance(q, [[0, 1], [2, 3]], permk.TopK(1))
    with pytest.raises(TypeError, match="unknown smoothness option"):
        group_hessian_variance(q, [[0, 1], [2, 3]], permk.PermK(), radius_typo=1.0)


def test_every_output_satisfies_the_lemma() -> None:
    cases: list[theory.Smoothness] = []
    for prob in (DenseQuadratic(3, 9, seed=1), SparseQuadratic(3, 50, seed=3), TwoGroups()):
        cases += [smoothness(prob), smoothness(prob, "pairs", pairs=30, seed=0), smoothness(prob, "power", seed=0)]
    p = Logistic(3, 5)
    cases += [smoothness(p, "pairs", pairs=30, seed=0), smoothness(p, "power", seed=0)]
    cases += list(group_hessian_variance(TwoGroups(), [[0, 3], [1, 2, 4, 5]], permk.PermK()).constants)
    for s in cases:
        assert_lemma(s, rtol=1e-8)


# ---------------------------------------------------------------------------------------------
# AB constants, measured
# ---------------------------------------------------------------------------------------------
def test_estimate_ab_recovers_randk_and_permk() -> None:
    r = estimate_ab(permk.RandK(2), n=3, d=6, trials=3000, seed=0)
    A, B = permk.RandK(2).ab_constants(3, 6)
    assert r.consistent and r.stated == (A, B)
    assert r.A_interval[0] <= A <= r.A_interval[1]  # RandK is tight on every input: var = (ω/n)S
    assert r.B_interval[0] <= 0.0 <= r.B_interval[1]
    assert r.A_interval[1] - r.A_interval[0] < 0.15 * A
    p = estimate_ab(permk.PermK(), n=4, d=8, trials=3000, seed=0)
    assert p.consistent and p.stated == (1.0, 1.0)
    tight = 1 + 1e-12  # A = B = 1 exactly on every input: only rounding separates the ends
    assert p.A_interval[0] <= tight and 1.0 <= p.A_interval[1] * tight
    assert p.B_interval[0] <= tight and 1.0 <= p.B_interval[1] * tight
    equal = next(i for i in p.inputs if i.name == "equal")
    assert equal.variance <= 1e-20 * equal.S  # PermK is exact on equal inputs (IV)
    low, high = p.min_A(0.0)[1:], p.max_B(0.5)
    assert low[0] <= low[1] and high[1] <= high[0] <= high[2]
    assert "PermK" in p.summary()


def test_estimate_ab_n_greater_than_d() -> None:
    est = estimate_ab(permk.PermK(), n=6, d=3, trials=2000, seed=3)
    a = 1 - (6 - 3) / (6 - 1)  # Theorem "PermK" (n ≥ d)
    assert est.stated == pytest.approx((a, a)) and est.consistent
    assert est.A_interval[0] <= a * (1 + 1e-12)


class ClaimingPermK(permk.Compressor):
    """PermK claiming better constants than it has (A = B = 1/2)."""

    def floats_per_worker(self, n: int, d: int) -> int:
        return permk.PermK().floats_per_worker(n, d)

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        return (0.5, 0.5)

    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> permk.Message:
        return permk.PermK().compress(x, worker=worker, n_workers=n_workers, seed=seed, round=round)


class SharedRand1(permk.Compressor):
    """Rand1 where all workers pick the *same* coordinate: not independent, so Lemma
    (lem:bg97fd890d) only gives ``A = ω = d − 1`` — yet it claims ``ω/n``."""

    def floats_per_worker(self, n: int, d: int) -> int:
        return 1

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        return ((d - 1) / n, 0.0)

    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> permk.Message:
        x = np.asarray(x, dtype=float)
        j = np.random.default_rng((seed, round)).integers(x.size)
        return permk.Message(worker, n_workers, x.size, np.array([j]), np.array([x.size * x[j]]))


def test_estimate_ab_refutes_wrong_claims() -> None:
    wrong = estimate_ab(ClaimingPermK(), n=4, d=8, trials=1000, seed=1)
    assert wrong.consistent is False
    assert wrong.A_interval[0] > 0.5
    shared = estimate_ab(SharedRand1(), n=4, d=5, trials=2000, seed=1)
    assert shared.consistent is False
    equal = next(i for i in shared.inputs if i.name == "equal")
    assert equal.interval[0] <= (5 - 1) * equal.S <= equal.interval[1]  # A − B = ω on equal inputs


def test_estimate_ab_user_inputs_and_errors() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4))
    one = estimate_ab(permk.RandK(1), n=3, d=4, inputs=a, trials=200, seed=5)
    two = estimate_ab(permk.RandK(1), n=3, d=4, inputs=[a, 2 * a], trials=200, seed=5)
    assert [i.name for i in one.inputs] == ["input0"] and len(two.inputs) == 2
    assert two.inputs[1].variance == pytest.approx(4 * two.inputs[0].variance)  # same rounds, scaled input
    assert estimate_ab(permk.RandK(1), n=3, d=4, inputs=a.tolist(), trials=200, seed=5) == one
    no_ab = estimate_ab(permk.TopK(2), n=3, d=4, inputs=a, trials=10, seed=0)
    assert no_ab.stated is None and no_ab.consistent is None and no_ab.inputs[0].consistent is None
    drawn = estimate_ab(permk.RandK(1), n=3, d=4, trials=20)
    assert estimate_ab(permk.RandK(1), n=3, d=4, trials=20, seed=drawn.seed) == drawn
    with pytest.raises(ValueError, match="shape"):
        estimate_ab(permk.RandK(1), n=3, d=4, inputs=np.ones((2, 4)))
    with pytest.raises(ValueError, match="all zeros"):
        estimate_ab(permk.RandK(1), n=3, d=4, inputs=np.zeros((3, 4)))
    with pytest.raises(ValueError, match="inputs"):
        estimate_ab(permk.RandK(1), n=3, d=4, inputs="worst")
    with pytest.raises(ValueError):
        estimate_ab(permk.RandK(9), n=3, d=4)
    with pytest.raises(ValueError, match="trials"):
        estimate_ab(permk.RandK(1), n=3, d=4, trials=1)
    with pytest.raises(ValueError, match="confidence"):
        estimate_ab(permk.RandK(1), n=3, d=4, confidence=1.0)
    with pytest.raises(TypeError, match="Compressor"):
        estimate_ab("PermK", n=3, d=4)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# communication complexity
# ---------------------------------------------------------------------------------------------
def test_marina_rounds_and_floats_follow_the_theorems() -> None:
    n, d, Lm, Lp, Lpm, eps, delta0 = 10, 100, 1.0, 2.0, 0.5, 1e-3, 3.0
    for comp in (permk.PermK(), permk.RandK(4), permk.Compose(permk.PermK(), permk.NaturalCompression())):
        A, B = stated_ab(comp, n, d)
        zeta = comp.expected_floats_per_worker(n, d)
        c = complexity(permk.marina, comp, **_kw(n, d, Lm, Lp, Lpm, eps, delta0))
        assert c.p is not None
        M = Lm + math.sqrt((1 - c.p) / c.p * ((A - B) * Lp**2 + B * Lpm**2))
        assert c.gamma == pytest.approx(1 / M, rel=1e-12)
        assert c.rounds == math.ceil(2 * delta0 * M / eps)
        assert c.floats_per_round == pytest.approx(c.p * d + (1 - c.p) * zeta, rel=1e-12)
        assert c.floats == pytest.approx(c.rounds * c.floats_per_round, rel=1e-12)
        mu = 0.05
        c = complexity(permk.marina, comp, **_kw(n, d, Lm, Lp, Lpm, eps, delta0, mu))
        assert c.p is not None
        gamma = min(1 / (Lm + math.sqrt(2 * (1 - c.p) / c.p * ((A - B) * Lp**2 + B * Lpm**2))), c.p / (2 * mu))
        assert c.gamma == pytest.approx(gamma, rel=1e-12) and c.pl
        assert c.rounds == math.ceil(math.log(delta0 / eps) / (gamma * mu))


def test_ef21_rounds_follow_its_theorems() -> None:
    n, d, Lm, Lp, eps, delta0 = 5, 50, 1.0, 3.0, 1e-2, 2.0
    for k in (1, 10, 50):
        alpha = k / d
        theta = 1 - math.sqrt(1 - alpha)
        beta = (1 - alpha) / (1 - math.sqrt(1 - alpha))
        c = complexity(permk.ef21, permk.TopK(k), **_kw(n, d, Lm, Lp, 0.0, eps, delta0))
        assert c.gamma == pytest.approx(1 / (Lm + Lp * math.sqrt(beta / theta)), rel=1e-12)
        assert c.rounds == math.ceil(2 * delta0 / (c.gamma * eps)) and c.floats == c.rounds * k
        c = complexity(permk.ef21, permk.TopK(k), **_kw(n, d, Lm, Lp, 0.0, eps, delta0, 0.1))
        gamma = min(1 / (Lm + Lp * math.sqrt(2 * beta / theta)), theta / (2 * 0.1))
        assert c.gamma == pytest.approx(gamma, rel=1e-12)
        assert c.rounds == math.ceil(math.log(delta0 / eps) / (gamma * 0.1))
    # Lemma (optimal parameters), part 3: EF21 + TopK is best with K = d
    assert complexity(permk.ef21, permk.TopK, **_kw(n, d, Lm, Lp, 0.0, eps, delta0)).K == d


def _continuous_floats(comp: permk.Compressor, p: float, n: int, d: int, L: tuple[float, float, float], mu: float | None) -> float:
    A, B = stated_ab(comp, n, d)
    gamma = marina_stepsize(A, B, *L, p, mu=mu)
    T = 2.0 / (gamma * 1e-3) if mu is None else math.log(1e3) / (gamma * mu)
    return T * (p * d + (1 - p) * comp.expected_floats_per_worker(n, d))


@pytest.mark.parametrize("mu", [None, 0.01])
def test_optimal_p_and_k_are_optimal(mu: float | None) -> None:
    n, d, L = 6, 40, (1.0, 1.5, 0.3)
    ps = np.geomspace(1e-5, 1.0, 4000)
    for comp in (permk.PermK(), permk.RandK(3)):
        c = complexity(permk.marina, comp, **_kw(n, d, *L, 1e-3, 1.0, mu))
        assert c.p is not None
        best_grid = min(_continuous_floats(comp, float(p), n, d, L, mu) for p in ps)
        assert _continuous_floats(comp, c.p, n, d, L, mu) <= best_grid * (1 + 1e-7)
    best = complexity(permk.marina, permk.RandK, **_kw(n, d, *L, 1e-3, 1.0, mu))
    every_k = min(complexity(permk.marina, permk.RandK(k), **_kw(n, d, *L, 1e-3, 1.0, mu)).floats for k in range(1, d + 1))
    assert best.floats == every_k


@pytest.mark.slow
def test_numeric_optimum_matches_the_tables_in_every_regime() -> None:
    """The numeric optimum is within the documented factor c = 8 of the closed forms of the
    Tables (nonconvex and PL; d ≥ n and d ≤ n); it is at least the closed form (nonconvex)
    or half of it (PL), as the lower bounds of the Lemmas (with T = 2Δ⁰M/ε) say."""
    configs = [(4, 64), (16, 1000), (10, 25), (100, 100), (50, 10), (1000, 20), (7, 7), (2, 3)]
    regimes = set()
    mus: list[float | None] = [None, 1e-3, 0.5]
    for (n, d), Lpm, top, mu in itertools.product(configs, [0.0, 1e-3, 0.1, 1.0, 10.0], [False, True], mus):
        Lp = math.sqrt(1.0 + Lpm**2) if top else max(1.0, Lpm)  # both ends allowed by the Lemma
        rows: tuple[tuple[permk.Method, type[permk.Compressor]], ...] = (
            (permk.marina, permk.PermK), (permk.marina, permk.RandK), (permk.ef21, permk.TopK),
        )  # fmt: skip
        for method, comp in rows:
            c = complexity(method, comp, **_kw(n, d, 1.0, Lp, Lpm, 1e-4, 1.0, mu))
            assert c.ratio is not None and (1.0 if mu is None else 0.5) * (1 - 1e-9) <= c.ratio <= 8.0, (n, d, Lpm, Lp, mu, c)
            regimes.add(c.table_ref)
    assert len(regimes) == 12  # 3 rows × {nonconvex, PL} × {d ≥ n, d ≤ n}


def test_technical_lemma_of_the_complexity_bounds() -> None:
    """Lemma (lemma:technical:complexity_bounds): f(x, y) ≥ ½ min{a, a·y_min + b}."""
    xs = np.concatenate([np.geomspace(1e-6, 1.0, 60), [0.5]])
    for y_min, a, b in itertools.product([1e-4, 0.01, 0.3, 0.5], [0.0, 0.1, 1.0, 100.0], [0.0, 0.1, 1.0, 100.0]):
        ys = np.concatenate([np.geomspace(y_min, 1.0, 60), [0.5]])
        x, y = np.meshgrid(xs, ys)
        f = (x + (1 - x) * y) * (a + b * np.sqrt((1 / x - 1) * (1 / y - 1)))
        assert f.min() >= 0.5 * min(a, a * y_min + b) * (1 - 1e-12)


def test_table_closed_forms() -> None:
    row = theory.table_complexity(permk.marina, permk.RandK(3), **_kw(100, 10, 1.0, 2.0, 0.5, 1e-2, 1.0, 0.1))
    assert row is not None
    v, ref = row
    assert ref == "Table 'communication_complexity_pl' (d ≤ n): MARINA + RandK"
    assert v == pytest.approx(math.log(100) * max(min(10.0, 1.0 + 10 / 10 * 2.0) / 0.1, 10))
    assert theory.table_complexity(permk.marina, permk.Identity(), **_kw(4, 8, 1, 1, 0, 1e-2, 1.0)) is None
    assert theory.table_complexity(permk.ef21, permk.TopK, **_kw(4, 8, 2.0, 3.0, 0.0, 1e-2, 1.0)) == (
        pytest.approx(100 * 8 * 2.0),
        "Table 'communication_complexity' (d ≥ n): EF21 + TopK",
    )


def test_table_complexity_checks_its_arguments_as_complexity_does() -> None:
    args = _kw(4, 8, 1.0, 1.0, 0.0, 1e-3, 1.0)
    for bad, match in (({"n": 0}, "n"), ({"eps": -1.0}, "eps"), ({"delta0": 0.0}, "delta0"), ({"L_minus": float("nan")}, "L_minus"),
                       ({"mu": 2.0}, "mu")):
        for f in (theory.table_complexity, complexity):
            with pytest.raises(ValueError, match=match):
                f(permk.marina, permk.PermK, **{**args, **bad})
    # EF21's PL row is (L_−/μ)·d, not raised to d rounds as MARINA's are
    v, _ = theory.table_complexity(permk.ef21, permk.TopK, **_kw(4, 8, 2.0, 3.0, 0.0, 1e-2, 1.0, 1.0))  # type: ignore[misc]
    assert v == pytest.approx(math.log(100) * 8 * 2.0)


def test_complexity_errors() -> None:
    args = _kw(4, 8, 1.0, 1.0, 0.0, 1e-3, 1.0)
    with pytest.raises(TypeError, match="method"):
        complexity("marina", permk.PermK, **args)  # a method object, not a name
    with pytest.raises(ValueError, match="AB constants"):
        complexity(permk.marina, permk.TopK(2), **args)
    with pytest.raises(ValueError, match="contractive"):
        complexity(permk.ef21, permk.RandK, **args)
    with pytest.raises(ValueError, match="mu"):
        complexity(permk.marina, permk.PermK, **{**args, "mu": 2.0})
    with pytest.raises(ValueError, match="eps"):
        complexity(permk.marina, permk.PermK, **{**args, "eps": 0.0})
    with pytest.raises(TypeError, match="real"):
        complexity(permk.marina, permk.PermK, **{**args, "L_minus": "1"})
    # a class without a tunable size stands for its default at (n, d): BlockPermK(min(n, d))
    assert complexity(permk.marina, permk.BlockPermK, **args).floats == complexity(permk.marina, permk.BlockPermK(4), **args).floats
    with pytest.raises(TypeError, match="Compressor"):
        complexity(permk.marina, "PermK", **args)
    with pytest.raises(TypeError):
        complexity(permk.marina, permk.PermK, 4, 8, 1.0, 1.0, 0.0, 1e-3, 1.0)  # type: ignore[misc]  # keyword-only


def test_complexity_cli_and_plot(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from permk.cli import add_complexity_parser, main
    from permk.experiments.plotting import complexity_plot

    argv = ["--n", "10", "--d", "1000", "--L-minus", "1", "--L-plus", "1.2", "--L-pm", "0.05", "--eps", "1e-3", "--delta0", "1"]
    assert main(["complexity", *argv]) == 0
    out = capsys.readouterr().out
    for name in ("PermK", "RandK(k=", "TopK(k=", "Identity", "paper Θ"):
        assert name in out
    png = tmp_path / "c.png"
    assert main(["complexity", *argv, "--mu", "0.01", "--plot", str(png), "--L-pm-grid", "0", "0.01", "0.1", "1", "2"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "PL (μ = 0.01)" in capsys.readouterr().out
    import argparse

    parser = argparse.ArgumentParser(prog="permk")
    add_complexity_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["complexity", *argv])
    assert args.func(args) == 0
    with pytest.raises(SystemExit):
        main(["complexity", "--n", "10"])
    with pytest.raises(ValueError, match="L_pm_grid"):
        complexity_plot(10, 100, 1.0, 1.0, 1e-3, 1.0, [-1.0], tmp_path / "x.png")


# ---------------------------------------------------------------------------------------------
# hostile constants: steps beyond float64, wrong argument types, wrong kinds and lengths
# ---------------------------------------------------------------------------------------------
class StatedConstants:
    """The synthetic quadratic on 3 workers with the constants it states replaced by ``constants``."""

    n, d = 3, 5

    def __init__(self, **constants: Any) -> None:
        self.q = permk.Quadratic.synthetic(3, 5, lam=1e-3, noise_scale=0.05)
        self.x0 = self.q.x0
        self.__dict__.update(constants)

    def loss(self, x: Any) -> float:
        return self.q.loss(x)

    def grad(self, x: Any) -> np.ndarray:
        return self.q.grad(x)

    def local_grads(self, x: Any) -> np.ndarray:
        return self.q.local_grads(x)


TINY, HUGE = 1e-320, 1e308

#: (call, the constant its message must name): each step would be inf or 0, or its formula
#: raised OverflowError or ZeroDivisionError
BEYOND_FLOAT64 = [
    (lambda: theory.marina_stepsize(1.0, 1.0, TINY, TINY, TINY, 0.5), "L_minus = 9.99989e-321"),
    (lambda: theory.marina_stepsize(1.0, 1.0, HUGE, HUGE, HUGE, 0.5), "L_plus = 1e\\+308"),
    (lambda: theory.marina_stepsize(1.0, 1.0, TINY, TINY, TINY, 0.5, mu=TINY), "mu = "),
    (lambda: theory.marina_variance_stepsize(TINY, 0.0, 1.0), "L_minus = "),
    (lambda: theory.ef21_stepsize(0.5, TINY, TINY), "L_plus = "),
    (lambda: theory.ef21_stepsize(TINY, 1.0, 1.0), "alpha = "),
    (lambda: theory.diana_stepsize(0.5, 1.0, 0.5, TINY, TINY), "L_minus = "),
    (lambda: theory.rand_diana_stepsize(0.5, TINY, TINY, TINY, kind="permutation"), "L_max = "),
    (lambda: theory.shifted_dcgd_stepsize(1.0, 4, TINY, TINY), "L_mean = "),
    (lambda: theory.dasha_stepsize(1.0, 0.5, TINY, TINY), "L_plus = "),
    (lambda: theory.dasha_pp_stepsize(1.0, 0.5, 4, 2, TINY, TINY), "L_minus = "),
    (lambda: theory.dasha_page_stepsize(0.0, 0.0, 1.0, TINY, TINY, TINY, 2, 1, 1.0), "L_sample_sq = "),
    (lambda: theory.dasha_mvr_stepsize(0.0, 0.0, 1.0, TINY, TINY, TINY, 2, 1, 1.0), "L_minus = "),
]


@pytest.mark.parametrize("call, names", BEYOND_FLOAT64)
def test_steps_beyond_float64_are_a_value_error_naming_the_constants(call: Any, names: str) -> None:
    with pytest.raises(ValueError, match=f"stepsize: the constants .*{names}.*(not a finite positive number|overflow)"):
        call()


def test_a_constant_beyond_float64_as_an_int_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="L_minus must be finite"):
        theory.marina_stepsize(1.0, 1.0, 10**400, 1.0, 1.0, 0.5)  # float() raised OverflowError
    with pytest.raises(ValueError, match=r"p must be in \(0, 1\], got inf"):
        theory.marina_stepsize(1.0, 1.0, 1.0, 1.0, 1.0, 10**400)  # check_probability's float() raised OverflowError too


def test_runs_refuse_a_step_beyond_float64() -> None:
    tiny = StatedConstants(L_minus=TINY, L_plus=TINY, L_pm=TINY)
    with pytest.raises(ValueError, match="L_minus = 9.99989e-321"):  # gamma was inf, and the run diverged
        permk.marina(tiny, permk.PermK(), rounds=2, seed=0)
    with pytest.raises(ValueError, match="L_minus = 9.99989e-321"):
        permk.ef21(tiny, permk.TopK(1), rounds=2, seed=0)
    huge = StatedConstants(L_minus=1.0, L_plus=HUGE, L_pm=HUGE)
    with pytest.raises(ValueError, match="L_plus = 1e\\+308"):  # OverflowError in the variance bound
        permk.marina(huge, permk.PermK(), rounds=2, seed=0)
    with pytest.raises(ValueError, match="gamma = 1e\\+300, gamma_multiplier = 1e\\+10"):
        permk.marina(tiny, permk.PermK(), rounds=2, seed=0, gamma=1e300, gamma_multiplier=1e10)
    ok = permk.marina(StatedConstants(L_minus=1.0, L_plus=1.0, L_pm=1.0), permk.PermK(), rounds=2, seed=0)
    assert ok.params.gamma == theory.marina_stepsize(1.0, 1.0, 1.0, 1.0, 1.0, ok.params.own.p)


def test_complexity_refuses_rounds_beyond_float64() -> None:
    args = dict(n=3, d=5, L_minus=1.0, L_plus=1.0, L_pm=1.0)
    with pytest.raises(ValueError, match="rounds .* beyond float64 .*eps = 9.99989e-321, delta0 = 1e\\+308"):
        complexity(permk.marina, permk.PermK(), **args, eps=TINY, delta0=HUGE)  # OverflowError in math.ceil(inf)
    with pytest.raises(ValueError, match="L_plus = 1e\\+308"):
        complexity(permk.marina, permk.PermK(), n=3, d=5, L_minus=HUGE, L_plus=HUGE, L_pm=HUGE, eps=1.0, delta0=1.0)
    with pytest.raises(ValueError, match="L_minus = 9.99989e-321"):  # step inf and 0 rounds
        complexity(permk.ef21, permk.TopK(1), n=3, d=5, L_minus=TINY, L_plus=TINY, L_pm=TINY, eps=1.0, delta0=1.0)


def test_variance_bound_and_the_table_refuse_wrong_types() -> None:
    c = theory.Constants(1.0, 1.0, 1.0)
    with pytest.raises(TypeError, match="constants must be a permk.theory.Constants .*got NoneType"):
        theory.variance_bound(permk.PermK(), 3, 5, None)
    with pytest.raises(TypeError, match="compressor must be a permk.Compressor, got str"):
        theory.variance_bound("PermK", 3, 5, c)  # type: ignore[arg-type]
    assert theory.variance_bound(permk.PermK(), 3, 5, c).theorem == "Theorem AB"
    with pytest.raises(TypeError, match=r"rows\[0\] must be a permk.theory.Complexity, got int"):
        theory.format_complexity_table([1, 2])  # type: ignore[list-item]
    row = complexity(permk.marina, permk.PermK(), n=3, d=5, L_minus=1.0, L_plus=1.0, L_pm=1.0, eps=1e-3, delta0=1.0)
    with pytest.raises(TypeError, match="rows must be a sequence of permk.theory.Complexity, got Complexity"):
        theory.format_complexity_table(row)  # type: ignore[arg-type]
    assert "PermK" in theory.format_complexity_table((row,))


def test_constants_refuse_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="kind must be one of 'exact', 'pessimistic', 'given', got 'bogus'"):
        theory.Constants(1.0, 1.0, 1.0, kind="bogus")
    assert [theory.Constants(1.0, 1.0, 1.0, kind=k).kind for k in ("exact", "pessimistic", "given")] == ["exact", "pessimistic", "given"]


def test_pessimistic_constants_refuse_L_i_of_the_wrong_length() -> None:
    short = StatedConstants(L_minus=1.0, L_i=np.array([1.0, 2.0]))  # n = 3
    with pytest.raises(ValueError, match=r"L_i must be 3 non-negative finite numbers .*got shape \(2,\)"):
        theory.Constants.of(short, "pessimistic")
    with pytest.raises(ValueError, match=r"L_i must be 3 non-negative finite numbers"):
        permk.marina(short, permk.PermK(), rounds=2, seed=0, constants="pessimistic")
    with pytest.raises(ValueError, match=r"L_i must be 3 non-negative finite numbers"):  # the same check as L_sample_rms
        permk.rand_diana(StatedConstants(L_minus=1.0, L_plus=1.0, L_pm=1.0, L_i=[1.0, 2.0]), permk.PermK(), rounds=2, seed=0)
    good = StatedConstants(L_minus=1.0, L_i=np.array([1.0, 2.0, 2.0]))
    assert theory.Constants.of(good, "pessimistic").L_plus == pytest.approx(math.sqrt(3.0))
