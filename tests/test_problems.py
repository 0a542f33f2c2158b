"""The synthetic quadratic (Algorithm 1) and general quadratics: oracles and exact constants."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

import permk


def algorithm_1(n: int, d: int, lam: float, s: float, seed: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Algorithm 1 of the paper, literally, with dense matrices."""
    rng = np.random.default_rng(seed)
    T = 2 * np.eye(d) - np.eye(d, k=1) - np.eye(d, k=-1)
    mats, bs = [], []
    for _ in range(n):
        xi_s, xi_b = rng.standard_normal(2)
        nu_s, nu_b = 1 + s * xi_s, s * xi_b
        b = np.zeros(d)
        b[0] = nu_s / 4 * (-1 + nu_b)
        bs.append(b)
        mats.append(nu_s / 4 * T)
    lam_min = np.linalg.eigvalsh(sum(mats) / n).min()
    mats = [A + (lam - lam_min) * np.eye(d) for A in mats]
    x0 = np.zeros(d)
    x0[0] = np.sqrt(d)
    return mats, np.array(bs), x0


@pytest.mark.parametrize("n,d,s", [(3, 5, 0.2), (7, 4, 0.8), (4, 1, 0.5), (2, 9, 0.0)])
def test_synthetic_matches_algorithm_1_and_brute_force_constants(n: int, d: int, s: float) -> None:
    lam = 1e-2
    q = permk.Quadratic.synthetic(n, d, lam, s, seed=11)
    mats, bs, x0 = algorithm_1(n, d, lam, s, seed=11)
    np.testing.assert_array_equal(q.x0, x0)
    for A, H in zip(mats, q.hessians()):
        np.testing.assert_allclose(H.toarray(), A, atol=1e-12)
    H = sum(mats) / n
    M2 = sum(A @ A for A in mats) / n
    ev = np.linalg.eigvalsh
    assert q.L_minus == pytest.approx(np.abs(ev(H)).max(), rel=1e-10)
    assert q.L_plus**2 == pytest.approx(ev(M2).max(), rel=1e-10)
    assert q.L_pm**2 == pytest.approx(max(ev(M2 - H @ H).max(), 0.0), rel=1e-8, abs=1e-12)
    np.testing.assert_allclose(q.L_i, [np.abs(ev(A)).max() for A in mats], rtol=1e-10)
    assert q.mu == pytest.approx(ev(H).min(), rel=1e-8)
    assert q.mu == pytest.approx(lam, rel=1e-8)
    x_star = np.linalg.solve(H, bs.mean(0))
    f_star = 0.5 * x_star @ H @ x_star - bs.mean(0) @ x_star
    assert q.f_star == pytest.approx(f_star, rel=1e-9, abs=1e-12)
    assert q.L_sq_mean == pytest.approx(np.mean(q.L_i**2))
    # Lemma: L+² − L−² ≤ L±² ≤ L+², L− ≤ L+
    assert q.L_plus**2 - q.L_minus**2 <= q.L_pm**2 + 1e-12 <= q.L_plus**2 + 2e-12


def test_synthetic_oracles_match_dense_matrices() -> None:
    n, d = 5, 7
    q = permk.Quadratic.synthetic(n, d, 1e-3, 0.3, seed=2)
    mats, bs, _ = algorithm_1(n, d, 1e-3, 0.3, seed=2)
    x = np.random.default_rng(0).normal(size=d)
    lg = np.stack([A @ x - b for A, b in zip(mats, bs)])
    np.testing.assert_allclose(q.local_grads(x), lg, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(q.grad(x), lg.mean(0), rtol=1e-12, atol=1e-12)
    f = np.mean([0.5 * x @ A @ x - b @ x for A, b in zip(mats, bs)])
    assert q.loss(x) == pytest.approx(f, rel=1e-12)
    rows = np.array([0, 4, 2, 2])
    cols = np.array([0, 6, 3, 0])
    np.testing.assert_array_equal(q.local_grad_coords(x, rows, cols), q.local_grads(x)[rows, cols])
    np.testing.assert_array_equal(q.local_grad(3, x), q.local_grads(x)[3])
    # non-contiguous input
    xx = np.zeros(2 * d)
    xx[::2] = x
    np.testing.assert_array_equal(q.grad(xx[::2]), q.grad(x))


def test_synthetic_bad_input() -> None:
    with pytest.raises(ValueError, match="lam"):
        permk.Quadratic.synthetic(3, 4, 0.0, 0.1)
    with pytest.raises(ValueError, match="noise_scale"):
        permk.Quadratic.synthetic(3, 4, 1e-3, -1.0)
    with pytest.raises(ValueError, match="n must be"):
        permk.Quadratic.synthetic(0, 4, 1e-3, 0.1)
    q = permk.Quadratic.synthetic(3, 4, 1e-3, 0.1)
    with pytest.raises(ValueError, match="shape"):
        q.grad(np.zeros(5))
    with pytest.raises(ValueError, match="outside"):
        q.local_grad_coords(np.zeros(4), [3], [0])
    with pytest.raises(ValueError, match="outside"):
        q.local_grad_coords(np.zeros(4), [0], [4])


def test_synthetic_memory_is_o_of_n_plus_d() -> None:
    n, d = 100_000, 1_000_000
    tracemalloc.start()
    q = permk.Quadratic.synthetic(n, d, 1e-6, 0.1, seed=0)
    res = permk.marina(q, permk.PermK(), rounds=2, seed=0, record_every=2)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert res.state.round == 2
    # an (n, d) float64 array would be 800 GB; O(n + d) is a few tens of MB
    assert peak < 300e6, peak
    assert q.L_pm > 0 and q.f_star < 0


def test_general_quadratic_dense_and_sparse() -> None:
    rng = np.random.default_rng(3)
    n, d = 4, 6
    mats = []
    for _ in range(n):
        M = rng.normal(size=(d, d))
        mats.append(M @ M.T / d + 0.1 * np.eye(d))
    b = rng.normal(size=(n, d))
    dense = permk.Quadratic(mats, b)
    sparse = permk.Quadratic([sp.csr_array(A) for A in mats], b)
    x = rng.normal(size=d)
    for q in (dense, sparse):
        np.testing.assert_allclose(q.local_grads(x), np.stack([A @ x for A in mats]) - b)
        np.testing.assert_allclose(q.grad(x), np.mean([A @ x for A in mats], axis=0) - b.mean(0))
    H = sum(mats) / n
    assert dense.L_minus == pytest.approx(np.linalg.eigvalsh(H).max(), rel=1e-9)
    assert sparse.L_pm == pytest.approx(dense.L_pm, rel=1e-6)
    x_star = np.linalg.solve(H, b.mean(0))
    assert dense.f_star == pytest.approx(dense.loss(x_star), rel=1e-9)
    with pytest.raises(ValueError, match="symmetric"):
        permk.Quadratic([rng.normal(size=(3, 3))], np.zeros((1, 3)))
    with pytest.raises(ValueError, match="vectors"):
        permk.Quadratic(mats, np.zeros((n, d + 1)))


@pytest.mark.parametrize("lam, noise_scale", [(1e308, 0.05), (1e200, 0.0), (1e-3, 1e160), (1e-3, 1e308)])
def test_synthetic_refuses_constants_beyond_float64(lam: float, noise_scale: float) -> None:
    """``lam`` (or ``noise_scale``) so large that ``L_+`` is inf: refused by the constructor, naming
    them, without a RuntimeWarning (the error used to come only inside a run)."""
    import re
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=re.escape(f"lam = {lam:g} and noise_scale = {noise_scale:g} give smoothness constants beyond float64")):
            permk.Quadratic.synthetic(3, 5, lam=lam, noise_scale=noise_scale)
    q = permk.Quadratic.synthetic(3, 5, lam=1e100, noise_scale=0.05)
    assert all(math.isfinite(v) for v in (q.L_minus, q.L_plus, q.L_pm, q.mu))
