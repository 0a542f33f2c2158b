"""The finite-sum classification problems (permk.problems.classification): gradients against finite
differences, the closed-form smoothness constants against finite-difference Hessians, the
minibatch oracle (determinism, exact unbiasedness, the pair), sparse against dense, float32
against float64, and the full-gradient methods running on them unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

import permk
from permk.problems import (
    MULTICLASS_CURVATURE,
    SIGMOID_CURVATURE,
    FiniteSumProblem,
    HeldShards,
    NonconvexLogistic,
    NonconvexMultiClass,
    NonconvexSigmoid,
    minibatch_indices,
)

PROBLEMS = {
    "sigmoid": (NonconvexSigmoid, {}, 2),
    "multiclass": (NonconvexMultiClass, {"lam": 0.05}, 3),
    "logistic": (NonconvexLogistic, {"lam": 0.2}, 3),
}


def _data(N: int = 40, f: int = 5, classes: int = 2, seed: int = 0, density: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, f)) * (rng.random((N, f)) < density)
    return X, rng.integers(0, classes, N)


def _make(name: str, n: int = 3, sparse: bool = False, **kw: object) -> permk.problems.Problem:
    cls, extra, C = PROBLEMS[name]
    X, y = _data(classes=C)
    return cls(sp.csr_array(X) if sparse else X, y, n=n, seed=1, **{**extra, **kw})


def _fd_grad(fun, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    e = np.eye(x.size)
    return np.array([(fun(x + h * e[k]) - fun(x - h * e[k])) / (2 * h) for k in range(x.size)])


def _fd_hessian(grad, x: np.ndarray, h: float = 1e-5) -> np.ndarray:
    e = np.eye(x.size)
    H = np.array([(grad(x + h * e[k]) - grad(x - h * e[k])) / (2 * h) for k in range(x.size)])
    return 0.5 * (H + H.T)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_gradients_match_finite_differences(name: str, sparse: bool) -> None:
    p = _make(name, sparse=sparse)
    assert isinstance(p, FiniteSumProblem)
    rng = np.random.default_rng(2)
    for _ in range(3):
        x = rng.standard_normal(p.d)
        g = p.grad(x)
        np.testing.assert_allclose(g, _fd_grad(p.loss, x), atol=1e-8)
        G = p.local_grads(x)
        np.testing.assert_allclose(G.mean(axis=0), g, atol=1e-14)
        for i in range(p.n):
            np.testing.assert_allclose(G[i], _fd_grad(lambda z: p.local_losses(z)[i], x), atol=1e-8)
            np.testing.assert_array_equal(p.local_grad(i, x), G[i])
        assert p.local_losses(x).mean() == pytest.approx(p.loss(x), rel=1e-13)
        assert p.local_loss(1, x) == pytest.approx(p.local_losses(x)[1], rel=1e-13)


def test_losses_are_the_authors_definitions() -> None:
    X, y = _data(N=12, f=3, classes=3)
    A = np.hstack([X, np.ones((12, 1))])  # their features: a column of ones appended
    rng = np.random.default_rng(0)
    # one worker holding everything: f is the plain mean over samples
    x = rng.standard_normal(4)
    yb = np.where(y == 0, -1.0, 1.0)
    s = NonconvexSigmoid(X, np.where(y == 0, 0, 1), n=1)
    assert s.loss(x) == pytest.approx(np.mean((1 - 1 / (1 + np.exp(-yb * (A @ x)))) ** 2), rel=1e-13)
    W = rng.standard_normal((4, 3))
    P = np.exp(A @ W) / np.exp(A @ W).sum(axis=1, keepdims=True)
    py = P[np.arange(12), y]
    m = NonconvexMultiClass(X, y, n=1, lam=0.3)
    assert m.loss(W.ravel()) == pytest.approx(np.mean((1 - py) ** 2) + 0.15 * np.sum(W**2), rel=1e-13)
    lg = NonconvexLogistic(X, y, n=1, lam=0.3)
    assert lg.loss(W.ravel()) == pytest.approx(np.mean(-np.log(py)) + 0.3 * np.sum(W**2 / (1 + W**2)), rel=1e-13)
    assert m.d == lg.d == 12 and s.d == 4


def test_curvature_constants_are_the_suprema() -> None:
    # sigmoid: φ'' = −2s(1−s)²(1−3s) on a fine grid of s = σ(t); the bound is attained
    s = np.linspace(1e-6, 1 - 1e-6, 1_000_001)
    phi2 = -2 * s * (1 - s) ** 2 * (1 - 3 * s)
    assert phi2.max() == pytest.approx(SIGMOID_CURVATURE, rel=1e-9) and -phi2.min() < SIGMOID_CURVATURE
    assert SIGMOID_CURVATURE == pytest.approx(0.15406, abs=1e-5)  # the authors' constant
    # multi-class: the exact Hessian of h(z) = (1 − softmax(z)_y)² at random z stays below c
    rng = np.random.default_rng(0)
    worst = 0.0
    for C in (2, 3, 10):
        for scale in (0.3, 1.0, 3.0, 10.0):
            for _ in range(300):
                z = rng.standard_normal(C) * scale
                p = np.exp(z - z.max())
                p /= p.sum()
                q = p[0]
                v = -p.copy()
                v[0] += 1
                H = 2 * q * (2 * q - 1) * np.outer(v, v) + 2 * q * (1 - q) * (np.diag(p) - np.outer(p, p))
                worst = max(worst, float(np.abs(np.linalg.eigvalsh(H)).max()))
    assert worst <= MULTICLASS_CURVATURE
    assert worst > 0.5 * MULTICLASS_CURVATURE  # the bound is within a factor 2 of what is seen


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_smoothness_bounds_hold_at_random_points(name: str) -> None:
    cls, extra, C = PROBLEMS[name]
    X, y = _data(N=12, f=3, classes=C)
    p = cls(X, y, n=3, seed=0, **extra)
    ones = cls(X, y, n=12, seed=0, **extra)  # one sample per worker: L_i = L_ij
    np.testing.assert_allclose(ones.L_i, ones.L_ij, rtol=1e-10)
    assert p.L_max == pytest.approx(ones.L_max)
    rng = np.random.default_rng(3)
    seen = {"L_i": 0.0, "L_minus": 0.0}
    for _ in range(15):
        x = rng.standard_normal(p.d) * rng.choice([0.3, 1.0, 3.0])
        for i in range(p.n):
            H = _fd_hessian(lambda z: p.local_grad(i, z), x)
            r = np.abs(np.linalg.eigvalsh(H)).max() / p.L_i[i]
            assert r <= 1 + 1e-6, (i, r)
            seen["L_i"] = max(seen["L_i"], r)
        H = _fd_hessian(p.grad, x)
        r = np.abs(np.linalg.eigvalsh(H)).max() / p.L_minus
        assert r <= 1 + 1e-6
        seen["L_minus"] = max(seen["L_minus"], r)
        for j in range(4):
            H = _fd_hessian(lambda z: ones.local_grad(j, z), x)
            assert np.abs(np.linalg.eigvalsh(H)).max() <= ones.L_i[j] * (1 + 1e-6)
    assert min(seen.values()) > 0.05  # not vacuous
    # the chain of bounds
    mean_sq = np.add.reduceat(p.sample_sq_norms, p.offsets[:-1]) / p.sample_counts
    assert (p.L_i <= p._c * mean_sq + p._rho + 1e-12).all()
    assert (p.L_i <= p.L_sample_rms + 1e-12).all() and (p.L_sample_rms <= p.L_max + 1e-12).all()
    assert p.L_pm == p.L_plus == pytest.approx(math.sqrt(np.mean(p.L_i**2)))
    assert p.L_minus <= p.L_plus + 1e-12


def test_sigmoid_bound_is_attained() -> None:
    """At ``y aᵀx = logit(s₊)`` the Hessian of a one-sample sigmoid loss is ``c a aᵀ``: its norm
    equals ``L_ij``, so the constant cannot be lowered (a second sample ``0`` without bias, of
    the other label, adds no curvature: ``L_i = c‖a‖²/2``)."""
    a = np.array([[0.6, -1.2], [0.0, 0.0]])
    p = NonconvexSigmoid(a, [1, -1], n=1, bias=False)
    s_plus = (9 + math.sqrt(33)) / 24
    A = np.array([0.6, -1.2])
    x = A / (A @ A) * math.log(s_plus / (1 - s_plus))
    H = _fd_hessian(p.grad, x, h=1e-5)
    assert np.abs(np.linalg.eigvalsh(H)).max() == pytest.approx(p.L_i[0], rel=1e-6)
    assert p.L_i[0] == pytest.approx(SIGMOID_CURVATURE * (A @ A) / 2, rel=1e-12)


def test_minibatch_indices_are_a_function_of_seed_round_worker() -> None:
    counts = np.array([7, 5, 9, 3])
    a = minibatch_indices(counts, 6, seed=4, round=10, workers=[0, 1, 2, 3])
    b = minibatch_indices(counts, 6, seed=4, round=10, workers=[3, 1])
    np.testing.assert_array_equal(b, a[[3, 1]])
    assert (a < counts[:, None]).all() and (a >= 0).all()
    assert not np.array_equal(a, minibatch_indices(counts, 6, seed=4, round=11, workers=[0, 1, 2, 3]))
    assert not np.array_equal(a, minibatch_indices(counts, 6, seed=5, round=10, workers=[0, 1, 2, 3]))
    # uniform with replacement: repeats happen when b > m, and the frequencies are flat
    big = minibatch_indices(counts, 9000, seed=0, round=0, workers=[3])[0]
    freq = np.bincount(big, minlength=3) / 9000
    assert np.abs(freq - 1 / 3).max() < 0.02


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_minibatch_oracle(name: str, sparse: bool) -> None:
    p = _make(name, n=4, sparse=sparse)
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal(p.d), rng.standard_normal(p.d)
    g = p.minibatch_grads(x, 3, seed=7, round=2)
    assert g.shape == (4, p.d)
    # any call order and subset: the same rows
    np.testing.assert_array_equal(p.minibatch_grads(x, 3, seed=7, round=2, workers=[2, 0]), g[[2, 0]])
    np.testing.assert_array_equal(p.minibatch_grads(x, 3, seed=7, round=2), g)
    assert not np.allclose(p.minibatch_grads(x, 3, seed=7, round=3), g)
    # the pair: the same samples at both points
    gx, gy = p.minibatch_grads_pair(x, y, 3, seed=7, round=2)
    np.testing.assert_allclose(gx, g, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(gy, p.minibatch_grads(y, 3, seed=7, round=2), rtol=1e-12, atol=1e-15)
    # b = 1: each draw is one sample's gradient; enumerating every sample of every worker over
    # the rounds, the mean of the single-sample gradients is exactly the local gradient
    single: dict[tuple[int, int], np.ndarray] = {}
    for t in range(400):
        idx = minibatch_indices(p.sample_counts, 1, seed=1, round=t, workers=range(p.n))[:, 0]
        gt = p.minibatch_grads(x, 1, seed=1, round=t)
        for i in range(p.n):
            if (i, idx[i]) in single:
                np.testing.assert_allclose(single[i, idx[i]], gt[i], rtol=1e-12, atol=1e-15)
            single[i, int(idx[i])] = gt[i]
    assert len(single) == p.sample_counts.sum()
    full = p.local_grads(x)
    for i in range(p.n):
        mean = np.mean([single[i, j] for j in range(p.sample_counts[i])], axis=0)
        np.testing.assert_allclose(mean, full[i], rtol=1e-12, atol=1e-14)
    # a minibatch of b is the mean of its b single-sample gradients (repeats counted)
    idx = minibatch_indices(p.sample_counts, 5, seed=9, round=0, workers=range(p.n))
    g5 = p.minibatch_grads(x, 5, seed=9, round=0)
    for i in range(p.n):
        np.testing.assert_allclose(g5[i], np.mean([single[i, j] for j in idx[i]], axis=0), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_sparse_equals_dense(name: str) -> None:
    cls, extra, C = PROBLEMS[name]
    X, y = _data(N=30, f=8, classes=C, density=0.3)
    dense = cls(X, y, n=4, seed=2, **extra)
    sparse = cls(sp.csr_array(X), y, n=4, seed=2, **extra)
    assert "sparse" in repr(sparse) and "dense" in repr(dense)
    x = np.random.default_rng(0).standard_normal(dense.d)
    assert sparse.loss(x) == pytest.approx(dense.loss(x), rel=1e-13)
    np.testing.assert_allclose(sparse.grad(x), dense.grad(x), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(sparse.local_grads(x), dense.local_grads(x), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(sparse.local_grads(x, workers=[3, 1]), dense.local_grads(x)[[3, 1]], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(sparse.minibatch_grads(x, 4, seed=0, round=1), dense.minibatch_grads(x, 4, seed=0, round=1),
                               rtol=1e-12, atol=1e-15)
    for attr in ("L_i", "L_minus", "L_max", "L_sample_rms"):
        np.testing.assert_allclose(getattr(sparse, attr), getattr(dense, attr), rtol=1e-10)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_coordinate_oracle(name: str, sparse: bool) -> None:
    cls, extra, C = PROBLEMS[name]
    X, y = _data(N=30, f=8, classes=C, density=0.4)
    p = cls(sp.csr_array(X) if sparse else X, y, n=4, seed=2, **extra)
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.standard_normal(p.d)
        G = p.local_grads(x)
        rows, cols = rng.integers(0, p.n, 200), rng.integers(0, p.d, 200)
        np.testing.assert_allclose(p.local_grad_coords(x, rows, cols), G[rows, cols], rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="rows"):
        p.local_grad_coords(x, [p.n], [0])
    with pytest.raises(TypeError, match="cols"):
        p.local_grad_coords(x, [0], [0.5])


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_float32_agrees_with_float64(name: str, sparse: bool) -> None:
    """float32 data and products: the gradients are within 2e-6 of the largest float64 entry
    (float32's eps is 6e-8; the sums run over at most 10 samples and 9 features here)."""
    cls, extra, C = PROBLEMS[name]
    X, y = _data(N=30, f=8, classes=C, density=0.5)
    X = sp.csr_array(X) if sparse else X
    p64, p32 = cls(X, y, n=3, seed=0, **extra), cls(X, y, n=3, seed=0, dtype=np.float32, **extra)
    x = np.random.default_rng(0).standard_normal(p64.d)
    for f in ("grad", "local_grads"):
        a, b = getattr(p64, f)(x), getattr(p32, f)(x)
        assert b.dtype == np.float64
        assert np.abs(a - b).max() <= 2e-6 * np.abs(a).max()
    a, b = p64.minibatch_grads(x, 4, seed=0, round=0), p32.minibatch_grads(x, 4, seed=0, round=0)
    assert np.abs(a - b).max() <= 2e-6 * np.abs(a).max()
    assert p32.loss(x) == pytest.approx(p64.loss(x), rel=1e-6)


def test_heterogeneity_p_hat() -> None:
    X, y = _data(N=50)
    same = NonconvexSigmoid(X, y, n=4, seed=0, p_hat=1.0)
    x = np.random.default_rng(0).standard_normal(same.d)
    G = same.local_grads(x)
    np.testing.assert_allclose(G, np.broadcast_to(G[0], G.shape), rtol=1e-13)  # p̂ = 1: identical workers
    apart = NonconvexSigmoid(X, y, n=4, seed=0, p_hat=0.0)
    assert not np.allclose(apart.local_grads(x)[0], apart.local_grads(x)[1])
    assert apart.sample_counts.sum() < 50  # one part of the n + 1 is held out


@pytest.mark.parametrize("method", ["marina", "ef21", "gd"])
def test_full_gradient_methods_run_unchanged(method: str) -> None:
    X, y = _data(N=80, f=6)
    p = NonconvexSigmoid(X, y, n=4, seed=0)
    comp = permk.PermK() if method == "marina" else (permk.TopK(2) if method == "ef21" else permk.Identity())
    run = getattr(permk, method)
    res = run(p, comp, rounds=400, seed=3)
    assert np.isfinite(res.grad_norm_sq).all()
    assert res.grad_norm_sq[-1] < 0.2 * res.grad_norm_sq[0]
    assert res.params.constants["L_minus"] == pytest.approx(p.L_minus)


@pytest.mark.parametrize("sparse", [False, True])
def test_marina_fused_path_equals_dense_path(sparse: bool) -> None:
    X, y = _data(N=60, f=7)
    p = NonconvexSigmoid(sp.csr_array(X) if sparse else X, y, n=4, seed=0)
    fused = permk.marina(p, permk.PermK(), rounds=120, seed=2)
    dense = permk.marina(p, permk.PermK(), rounds=120, seed=2, path="dense")
    assert fused.params.path == "fused"
    assert fused.x.tobytes() == dense.x.tobytes()  # bit for bit (issue 33, item 9)


_FUSED_METHODS = {
    "marina": (permk.marina, {"p": 0.2}),
    "diana": (permk.diana, {}),
    "dasha": (permk.dasha, {}),
    "pp-marina": (permk.marina, {"p": 0.2, "participation": 3}),
}


@pytest.mark.parametrize("method", sorted(_FUSED_METHODS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_fused_and_dense_paths_give_the_same_iterates_bit_for_bit(name: str, sparse: bool, dtype: type, method: str) -> None:
    """Issue 33, item 9: the coordinate oracle's values are the entries of local_grads bit for
    bit (dense data: read from the same batched products; sparse data: summed in the sparse
    product's order, in the data's dtype), so the fused path's iterates are the dense path's."""
    run, options = _FUSED_METHODS[method]
    p = _make(name, n=5, sparse=sparse, dtype=dtype)
    comp = permk.PermK() if "participation" not in options else permk.RandK(2)
    fused = run(p, comp, rounds=40, seed=2, path="fused", gamma=0.05, **options)
    dense = run(p, comp, rounds=40, seed=2, path="dense", gamma=0.05, **options)
    assert fused.params.path == "fused" and fused.x.tobytes() == dense.x.tobytes(), np.abs(fused.x - dense.x).max()
    assert fused.grad_norm_sq.tobytes() == dense.grad_norm_sq.tobytes()


def test_dasha_pp_has_one_path_and_says_why() -> None:
    """DASHA-PP keeps every participant's whole gradient (its h_i), so it evaluates the
    participants' whole rows (issue 35, item 1) and has no coordinate (fused) path: a forced
    ``path="fused"`` is refused with the reason, and ``auto`` runs the dense path."""
    p = _make("logistic", n=5, sparse=False, dtype=np.float64)
    with pytest.raises(ValueError, match="path='fused' is not available .* given rows"):
        permk.dasha(p, permk.RandK(2), rounds=2, seed=2, path="fused", gamma=0.05, participation=3)
    assert permk.dasha(p, permk.RandK(2), rounds=2, seed=2, gamma=0.05, participation=3).params.path == "dense"


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_local_grad_coords_are_the_entries_of_local_grads(name: str, sparse: bool) -> None:
    p = _make(name, n=4, sparse=sparse, dtype=np.float32)
    rng = np.random.default_rng(1)
    for x in (rng.standard_normal(p.d), rng.standard_normal(p.d), p.x0):
        rows, cols = rng.integers(0, p.n, 50), rng.integers(0, p.d, 50)
        assert p.local_grad_coords(x, rows, cols).tobytes() == p.local_grads(x)[rows, cols].tobytes()
        held = p.held(range(1, 3))
        r = rng.integers(1, 3, 20)
        assert held.local_grad_coords(x, r, cols[:20]).tobytes() == held.local_grads(x)[r - 1, cols[:20]].tobytes()


def test_bad_input() -> None:
    X, y = _data(N=10)
    with pytest.raises(ValueError, match="y must have shape"):
        NonconvexSigmoid(X, y[:-1], n=2)
    with pytest.raises(ValueError, match="needs two label values, got 10"):
        NonconvexSigmoid(X, np.arange(10), n=2)
    with pytest.raises(ValueError, match="dtype"):
        NonconvexSigmoid(X, y, n=2, dtype=np.int64)
    bad = X.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        NonconvexSigmoid(bad, y, n=2)
    with pytest.raises(ValueError, match="non-empty shards"):
        NonconvexSigmoid(X, y, n=11)
    with pytest.raises(ValueError, match="classes=5"):
        NonconvexMultiClass(X, np.arange(10) % 7, n=2, classes=5)
    p = NonconvexMultiClass(X, np.array([0, 2] * 5), n=2, classes=4)  # a class without samples
    assert p.d == 4 * 6
    with pytest.raises(ValueError, match="workers"):
        p.minibatch_grads(p.x0, 2, seed=0, round=0, workers=[2])
    with pytest.raises(ValueError, match="batch_size"):
        p.minibatch_grads(p.x0, 0, seed=0, round=0)
    with pytest.raises(ValueError, match="lam"):
        NonconvexLogistic(X, y, n=2, lam=-1.0)


@pytest.mark.mpi
def test_on_mpi_the_methods_match_the_simulator_and_every_rank_draws_the_same_minibatches() -> None:
    import subprocess
    import sys

    from conftest import MPI_DIR, MPIEXEC

    out = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(MPI_DIR / "classification_run.py")],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("cls", [NonconvexSigmoid, NonconvexMultiClass])
def test_held_shards_are_the_problems_oracles_for_the_held_workers(sparse: bool, cls: type) -> None:
    """:class:`HeldShards` keeps one block of workers' samples: its oracles equal the whole
    problem's rows for them, bit for bit, and it carries the whole problem's constants."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((90, 5))
    y = rng.integers(0, 2 if cls is NonconvexSigmoid else 3, 90)
    p = cls(sp.csr_array(X) if sparse else X, y, n=6, seed=1, p_hat=0.4)
    h = p.held(range(2, 5))
    assert h._held._data.k == 3 and h.workers == range(2, 5)
    x, z = rng.standard_normal(p.d), rng.standard_normal(p.d)
    np.testing.assert_array_equal(h.local_grads(x), p.local_grads(x)[2:5])
    np.testing.assert_array_equal(h.local_grad(4, x), p.local_grad(4, x))
    np.testing.assert_array_equal(h.local_grad_coords(x, [2, 4, 4], [0, 3, 1]), p.local_grad_coords(x, [2, 4, 4], [0, 3, 1]))
    np.testing.assert_array_equal(h.minibatch_grads(x, 7, seed=2, round=5, workers=[3, 4]),
                                  p.minibatch_grads(x, 7, seed=2, round=5)[3:5])
    for a, b in zip(h.minibatch_grads_pair(x, z, 7, seed=2, round=5, workers=range(2, 5)),
                    p.minibatch_grads_pair(x, z, 7, seed=2, round=5, workers=[2, 3, 4])):
        np.testing.assert_array_equal(a, b)
    smooth = p.smoothness()
    assert (h.L_minus, h.L_plus, h.L_pm, h.L_max) == (smooth["L_minus"], smooth["L_plus"], smooth["L_pm"], smooth["L_max"])
    np.testing.assert_array_equal(h.L_i, p.L_i)
    np.testing.assert_array_equal(h.L_sample_rms, p.L_sample_rms)
    np.testing.assert_array_equal(h.sample_counts, p.sample_counts)
    assert not hasattr(h, "grad") and not hasattr(h, "loss")  # the MPI backend sums the workers' gradients
    assert h.fingerprint() == p.held(range(0, 2)).fingerprint() != cls(X, y, n=6, seed=2).held(range(0, 2)).fingerprint()
    with pytest.raises(ValueError, match="held here"):
        h.minibatch_grads(x, 2, seed=0, round=0, workers=[1])
    with pytest.raises(ValueError, match="contiguous"):
        p.held([1, 3])
    with pytest.raises(ValueError, match="missing L_sample_rms"):
        p.held(range(2), constants={k: v for k, v in smooth.items() if k != "L_sample_rms"})
    with pytest.raises(TypeError, match="classification problem"):
        HeldShards(permk.Quadratic.synthetic(2, 3, 1e-3, 0.0, seed=0), range(1))


@pytest.mark.parametrize("sparse", [False, True])
def test_constants_by_lanczos_equal_the_direct_ones(sparse: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above ``_DIRECT`` features the constants come from the weighted rows (the smaller Gram
    matrix, or Lanczos when both sides are large): the same numbers."""
    import permk.problems.finite_sum as pc

    X, y = _data(N=60, f=9, density=0.6)
    X = sp.csr_array(X) if sparse else X
    direct = NonconvexSigmoid(X, y, n=3, seed=0)
    ref = (direct.L_i.copy(), direct.L_minus)
    for limit in (12, 4):  # 12: the rows' smaller Gram matrix; 4: Lanczos
        monkeypatch.setattr(pc, "_DIRECT", limit)
        p = NonconvexSigmoid(X, y, n=3, seed=0)
        np.testing.assert_allclose(p.L_i, ref[0], rtol=1e-9)
        assert p.L_minus == pytest.approx(ref[1], rel=1e-9)
