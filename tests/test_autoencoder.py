"""The linear autoencoder's oracles (permk.experiments.autoencoder): the coordinate oracle and
the split gradients against the direct formulas, finite differences and each other, in float64
and float32; the data splits and losses of the paper and of the authors' code; the problem
restricted to a block of workers (MPI)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import permk
from permk.experiments.autoencoder import LinearAutoencoder

D_F, D_E, N_IMG, N_WORKERS = 20, 3, 150, 9


def _X(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((N_IMG, D_F))


def _ae(p_hat: float = 0.5, dtype: type = np.float64, **kw: object) -> LinearAutoencoder:
    return LinearAutoencoder(_X(), N_WORKERS, p_hat, 1e-2, d_e=D_E, seed=2, dtype=dtype, **kw)  # type: ignore[arg-type]


def _point(ae: LinearAutoencoder, seed: int = 1) -> np.ndarray:
    return ae.x0 + 0.3 * np.random.default_rng(seed).standard_normal(ae.d)


def direct_split_grad(ae: LinearAutoencoder, X: np.ndarray, s: int, x: np.ndarray) -> np.ndarray:
    """∇f_s by the residual formulas (float64): R = A Eᵀ Dᵀ − A, ∇_D = c(2/m) Rᵀ(A Eᵀ) + r M Eᵀ,
    ∇_E = c(2/m) Dᵀ Rᵀ A + r Dᵀ M, on the split's images as the problem holds them."""
    D, E = ae.factors(x)
    A = X[ae.split_index[s]].astype(ae.dtype).astype(np.float64)
    m = len(A)
    c, r = (1.0, ae.lam) if ae.loss_kind == "paper" else (1.0 / ae.d_f, 2 * ae.lam)
    Z = A @ E.T
    R = Z @ D.T - A
    M = D @ E - np.eye(ae.d_f)
    gD = c * 2 / m * R.T @ Z + r * M @ E.T
    gE = c * 2 / m * D.T @ R.T @ A + r * D.T @ M
    return np.concatenate([gD.ravel(), gE.ravel()])


def direct_loss(ae: LinearAutoencoder, X: np.ndarray, s: int, x: np.ndarray) -> float:
    """f_s from its definition: the paper's, or the authors' MSELoss + λ‖DE − I‖²."""
    D, E = ae.factors(x)
    A = X[ae.split_index[s]]
    err = A @ E.T @ D.T - A
    reg = float(np.sum((D @ E - np.eye(ae.d_f)) ** 2))
    if ae.loss_kind == "paper":
        return float(np.mean(np.sum(err**2, axis=1))) + ae.lam / 2 * reg
    return float(np.mean(err**2)) + ae.lam * reg


#: float32 images and products: the gradients' error relative to their largest entry (measured
#: about 1e-7 here, 2e-7 at full scale); the bound leaves a factor 10.
F32_REL = 2e-6


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("p_hat", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("split", ["per-worker", "per-sample"])
def test_split_gradients_and_coordinates_equal_the_direct_formulas(dtype: type, p_hat: float, split: str) -> None:
    ae = _ae(p_hat, dtype, split=split)
    x = _point(ae)
    G = ae.split_grads(x)
    ref = np.stack([direct_split_grad(ae, _X(), s, x) for s in range(ae.n_splits)])
    tol = 1e-12 if dtype is np.float64 else F32_REL
    assert np.abs(G - ref).max() <= tol * np.abs(ref).max()
    # every coordinate of every worker through the coordinate oracle, in one call
    rows, cols = np.repeat(np.arange(ae.n), ae.d), np.tile(np.arange(ae.d), ae.n)
    V = ae.local_grad_coords(x, rows, cols).reshape(ae.n, ae.d)
    assert np.abs(V - ref[ae.worker_split]).max() <= tol * np.abs(ref).max()
    np.testing.assert_array_equal(ae.local_grads(x), G[ae.worker_split])


@pytest.mark.parametrize("loss", ["paper", "authors"])
@pytest.mark.parametrize("split", ["per-worker", "per-sample"])
def test_gradients_are_those_of_the_losses(loss: str, split: str) -> None:
    """Finite differences of f_s from its definition, the closed-form f and ∇f (the mean of the
    workers'), and f* at the PCA point."""
    ae = _ae(0.5, split=split, loss=loss)
    x = _point(ae)
    G = ae.local_grads(x)
    np.testing.assert_allclose(G.mean(axis=0), ae.grad(x), rtol=1e-10, atol=1e-12)
    f = np.mean([direct_loss(ae, _X(), ae.worker_split[i], x) for i in range(ae.n)])
    assert math.isclose(ae.loss(x), f, rel_tol=1e-10)
    for i in (0, 4, 8):
        s = ae.worker_split[i]
        v = np.random.default_rng(i).standard_normal(ae.d)
        h = 1e-6
        fd = (direct_loss(ae, _X(), s, x + h * v) - direct_loss(ae, _X(), s, x - h * v)) / (2 * h)
        assert math.isclose(fd, float(G[i] @ v), rel_tol=1e-6)
    assert math.isclose(ae.loss(ae.pca_point()), ae.f_star, rel_tol=1e-9)
    assert ae.loss(x) > ae.f_star


def test_the_products_are_kept_for_the_last_points() -> None:
    """MARINA's rounds ask x^{t+1} then x^t: only a new point's products are computed."""
    ae = _ae(0.0)
    computed = []
    orig = ae._point

    def counting(x: np.ndarray) -> object:
        if all(p.key != np.asarray(x, dtype=np.float64).tobytes() for p in ae._points):
            computed.append(1)
        return orig(x)

    ae._point = counting  # type: ignore[method-assign]
    permk.marina(ae, permk.PermK(), rounds=20, seed=0, gamma=1e-3, p=1e-9, path="fused")
    assert len(computed) == 21  # x⁰ … x²⁰, each once


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("p_hat", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("compressor", [permk.PermK(), permk.RandK(4), permk.BlockPermK(3)], ids=["permk", "randk", "blockpermk"])
def test_marina_fused_equals_dense(dtype: type, p_hat: float, compressor: permk.Compressor) -> None:
    ae = _ae(p_hat, dtype)
    a = permk.marina(ae, compressor, rounds=40, seed=3, gamma=1e-3, path="fused")
    b = permk.marina(_ae(p_hat, dtype), compressor, rounds=40, seed=3, gamma=1e-3, path="dense")
    assert a.params["path"] == "fused" and b.params["path"] == "dense"
    np.testing.assert_array_equal(a.coins, b.coins)
    tol = 1e-11 if dtype is np.float64 else 1e-5
    np.testing.assert_allclose(a.x, b.x, rtol=tol, atol=tol * np.abs(b.x).max())


def test_float32_follows_float64() -> None:
    """The iterates of a float32 run stay within 1e-5 (relative) of the float64 run's."""
    runs = [permk.marina(_ae(0.5, dt), permk.PermK(), rounds=100, seed=0, gamma=1e-2) for dt in (np.float64, np.float32)]
    assert np.abs(runs[1].x - runs[0].x).max() <= 1e-5 * np.abs(runs[0].x).max()
    np.testing.assert_allclose(runs[1].grad_norm_sq, runs[0].grad_norm_sq, rtol=1e-4)


def test_grouped_ef21_equals_all_workers_in_float32() -> None:
    ae = _ae(0.6, np.float32)
    k = -(-ae.d // ae.n)
    full = permk.ef21(ae, permk.TopK(k), rounds=30, seed=0, gamma=1e-3)
    grouped = permk.ef21(ae.grouped(), permk.TopK(k), rounds=30, seed=0, gamma=1e-3)
    np.testing.assert_allclose(grouped.x, full.x, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(
    ("kw", "err", "match"),
    [
        (dict(dtype=np.int32), ValueError, "dtype must be np.float64 or np.float32"),
        (dict(split="per-node"), ValueError, "split must be one of 'per-worker', 'per-sample'"),
        (dict(loss="mse"), ValueError, "loss must be one of 'paper', 'authors'"),
        (dict(workers=range(3, 3)), ValueError, "workers must be a non-empty contiguous range"),
        (dict(workers=[0, 2]), ValueError, "workers must be a non-empty contiguous range"),
        (dict(workers=range(5, 12)), ValueError, "worker must be"),
        (dict(p_hat=1.5), ValueError, "p_hat"),
        (dict(d_e=0), ValueError, "d_e"),
    ],
)
def test_bad_arguments_are_refused_by_name(kw: dict[str, object], err: type, match: str) -> None:
    args: dict[str, object] = dict(p_hat=0.5, d_e=D_E)
    args.update(kw)
    p_hat = args.pop("p_hat")
    with pytest.raises(err, match=match):
        LinearAutoencoder(_X(), N_WORKERS, p_hat, 1e-2, **args)  # type: ignore[arg-type]


def test_coordinate_requests_are_checked() -> None:
    ae = _ae()
    x = ae.x0
    with pytest.raises(ValueError, match="cols must be coordinates"):
        ae.local_grad_coords(x, [0], [ae.d])
    with pytest.raises(ValueError, match="rows must be worker indices"):
        ae.local_grad_coords(x, [ae.n], [0])
    with pytest.raises(ValueError, match="same length"):
        ae.local_grad_coords(x, [0, 1], [0])
    with pytest.raises(TypeError, match="integer indices"):
        ae.local_grad_coords(x, [0.5], [0])


def test_a_reused_gradient_buffer_is_never_one_a_caller_holds() -> None:
    """local_grads hands out pooled buffers (no page faults on 200 MB arrays): a buffer still
    held by a caller is never overwritten."""
    ae = _ae(0.0)
    held = [ae.local_grads(_point(ae, k)) for k in range(5)]
    copies = [h.copy() for h in held]
    for k in range(5, 9):
        ae.local_grads(_point(ae, k))
    for h, c in zip(held, copies):
        np.testing.assert_array_equal(h, c)
    a = ae.local_grads(_point(ae, 20))
    ref = a.copy()
    del a
    b = ae.local_grads(_point(ae, 21))  # may reuse a's buffer: a is gone
    np.testing.assert_array_equal(ae.local_grads(_point(ae, 20)), ref)
    assert not np.array_equal(b, ref)
    g = ae.grouped()
    first = g.local_grads(_point(ae, 30))
    keep = first.copy()
    for k in range(31, 36):
        g.local_grads(_point(ae, k))
    np.testing.assert_array_equal(first, keep)
