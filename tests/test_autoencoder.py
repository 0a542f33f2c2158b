"""The linear autoencoder's oracles (permk.experiments.autoencoder): the coordinate oracle and
the split gradients against the direct formulas, finite differences and each other, in float64
and float32; the data splits and losses of the paper and of the authors' code; the problem
restricted to a block of workers (MPI)."""

from __future__ import annotations

from typing import Any

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import permk
import permk.distributed
import permk.exchanges
from permk import _core
from permk.problems import GroupedAutoencoder, LinearAutoencoder

from conftest import MPI_DIR, MPIEXEC, PyTopK, final_grad_norms  # noqa: E402

sys.path.insert(0, str(MPI_DIR))
from autoencoder_cases import CASES as MPI_CASES  # noqa: E402
from autoencoder_cases import N_WORKERS as MPI_WORKERS  # noqa: E402
from autoencoder_cases import OPTIONS, compressor, method, problem  # noqa: E402

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
    assert a.params.path == "fused" and b.params.path == "dense"
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


class _WholeGrads:
    """A problem's oracles without ``local_grad_blocks`` (EF21's exchange then takes whole rows)."""

    def __init__(self, p: object) -> None:
        self.p, self.n, self.d, self.x0 = p, p.n, p.d, p.x0  # type: ignore[attr-defined]
        self.f_star = p.f_star  # type: ignore[attr-defined]

    def loss(self, x: np.ndarray) -> float:
        return self.p.loss(x)  # type: ignore[attr-defined, no-any-return]

    def grad(self, x: np.ndarray) -> np.ndarray:
        return self.p.grad(x)  # type: ignore[attr-defined, no-any-return]

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        return self.p.local_grads(x)  # type: ignore[attr-defined, no-any-return]


class _GradBlocks(_WholeGrads):
    """A problem's oracles with ``local_grad_blocks`` but not ``local_message_blocks`` (the
    exchange then compresses the blocks of gradients itself)."""

    def local_grad_blocks(self, x: np.ndarray) -> Any:
        return self.p.local_grad_blocks(x)  # type: ignore[attr-defined]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("p_hat", [0.0, 0.6])
def test_message_blocks_are_the_compressed_gradient_blocks(monkeypatch: pytest.MonkeyPatch, dtype: type, p_hat: float) -> None:
    """local_message_blocks gives, block by block, compress_shifted_rows on the blocks of
    local_grad_blocks bit for bit (Rust TopK and RandK: the gradients finished and compressed
    in one pass; a Python compressor: on the written rows), for a block of workers inside n,
    β = 1, 0.3 and no H, H float64 or float32; None for a block whose input is not finite."""
    import permk.problems.autoencoder as mod

    monkeypatch.setattr(mod, "_BLOCK_BYTES", 8 * D_F * D_E * 2)  # two splits per block
    ae = _ae(p_hat, dtype)
    x = _point(ae)
    k = -(-ae.d // ae.n)
    for prob in (ae, ae.grouped()):
        rows = np.concatenate([G.copy() for _, _, G in prob.local_grad_blocks(x)])
        H = 0.5 * rows + np.random.default_rng(2).standard_normal(rows.shape)
        for comp in (permk.TopK(k), permk.RandK(k), PyTopK(k)):
            H32 = H.astype(np.float32)  # float32 estimators (a float32 problem's EF21 state): the same messages every way
            for Hb, beta in ((H, 1.0), (H, 0.3), (None, 1.0), (H32, 1.0), (H32, 0.3)):
                got = list(prob.local_message_blocks(x, comp, Hb, beta, start=3, n_workers=prob.n + 5, seed=1, round=4))
                want = [(lo, hi, comp.compress_shifted_rows(G, None if Hb is None else Hb[lo:hi], beta=beta, start=3 + lo,
                                                            n_workers=prob.n + 5, seed=1, round=4))
                        for lo, hi, G in prob.local_grad_blocks(x)]
                assert [g[:2] for g in got] == [w[:2] for w in want]
                for (_, _, g), (_, _, w) in zip(got, want):
                    assert g is not None and w is not None
                    for a, b in zip(g, w):
                        np.testing.assert_array_equal(a, b)
        Hn = H.copy()
        Hn[-1, 7] = np.nan
        got = list(prob.local_message_blocks(x, permk.TopK(k), Hn, 1.0, start=0, n_workers=prob.n, seed=0, round=0))
        assert got[-1][2] is None and all(m is not None for _, _, m in got[:-1])
    # bad arguments are refused by name, before anything is computed
    g = ae.grouped()
    for kw, exc, match in ((dict(compressor="topk"), TypeError, "compressor must be a permk.Compressor"),
                           (dict(seed=-1), ValueError, "seed"), (dict(round=1.5), TypeError, "round"),
                           (dict(start=g.n), ValueError, "start"), (dict(beta=float("nan")), ValueError, "beta"),
                           (dict(H=np.zeros((2, g.d))), ValueError, "^H: "), (dict(H=np.zeros((g.n, g.d), np.int64)), TypeError, "^H must be")):
        args: dict[str, Any] = dict(compressor=permk.TopK(k), H=None, beta=1.0, start=0, n_workers=g.n, seed=0, round=0) | kw
        with pytest.raises(exc, match=match):
            list(g.local_message_blocks(x, args.pop("compressor"), args.pop("H"), args.pop("beta"), **args))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("p_hat", [0.0, 0.6])
def test_gradient_blocks_are_the_whole_rows_and_ef21_runs_on_them_bit_for_bit(monkeypatch: pytest.MonkeyPatch, dtype: type,
                                                                             p_hat: float) -> None:
    """local_grad_blocks gives local_grads' rows bit for bit (several blocks: a small block size),
    and EF21+TopK on the problem's own messages (local_message_blocks) and on the blocks (never an
    (n, d) array) has the iterates and estimators of EF21 on whole rows, also when it diverges,
    with estimators in float64 or float32."""
    import permk.problems.autoencoder as mod

    monkeypatch.setattr(mod, "_BLOCK_BYTES", 8 * D_F * D_E * 2)  # two splits per block
    ae = _ae(p_hat, dtype)
    x = _point(ae)
    for prob in (ae, ae.grouped()):
        blocks = [(lo, hi, G.copy()) for lo, hi, G in prob.local_grad_blocks(x)]
        assert [b[0] for b in blocks] == [0] + [b[1] for b in blocks[:-1]] and blocks[-1][1] == prob.n
        assert len(blocks) > 1 or (prob is ae and p_hat > 0)  # shared splits: one block of local_grads
        np.testing.assert_array_equal(np.concatenate([b[2] for b in blocks]), prob.local_grads(x))
        k = -(-ae.d // ae.n)
        for gamma, shifts in ((1e-3, "float64"), (1e-3, "float32"), (5.0, "float64"), (5.0, "float32")):
            a = permk.ef21(prob, permk.TopK(k), rounds=25, seed=0, gamma=gamma, shift_dtype=shifts)  # local_message_blocks
            assert a.state.G.dtype == shifts
            for route in (_GradBlocks, _WholeGrads):
                b = permk.ef21(route(prob), permk.TopK(k), rounds=25, seed=0, gamma=gamma, shift_dtype=shifts)
                assert a.diverged_at == b.diverged_at and (gamma < 1 or a.diverged_at is not None)
                np.testing.assert_array_equal(a.x, b.x)
                np.testing.assert_array_equal(a.state.G, b.state.G)
                np.testing.assert_array_equal(a.grad_norm_sq, b.grad_norm_sq)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_ef21_has_the_same_bits_on_one_thread_and_on_several(monkeypatch: pytest.MonkeyPatch, dtype: type) -> None:
    """The blocks are smaller on one thread (one split here, two on several): EF21's iterates,
    estimators and records are the same bits."""
    import permk.problems.autoencoder as mod

    monkeypatch.setattr(mod, "_BLOCK_BYTES", 8 * D_F * D_E * 2)
    ae = _ae(0.0, dtype)
    g = ae.grouped()
    k = -(-ae.d // ae.n)
    before = _core.get_num_threads()
    runs = []
    try:
        for threads in (1, 3):
            _core.set_num_threads(threads)
            assert ae._block_splits() == (1 if threads == 1 else 2)
            runs.append(permk.ef21(g, permk.TopK(k), rounds=20, seed=0, gamma=1e-3))
    finally:
        _core.set_num_threads(before)
    a, b = runs
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.state.G, b.state.G)
    np.testing.assert_array_equal(a.grad_norm_sq, b.grad_norm_sq)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_blocks_on_threads_of_their_own_give_the_callers_bits(monkeypatch: pytest.MonkeyPatch, dtype: type) -> None:
    """With a pool of several threads the blocks run on Python threads of their own, each with
    its product (single-threaded BLAS) and its Rust pass (on that thread: on_caller); on one,
    on the caller. The workers' gradients, EF21's messages and whole EF21 runs (the problem
    and the grouped one) are the same bits; BLAS's thread limit is restored afterwards."""
    import threading

    from threadpoolctl import threadpool_info

    import permk.problems.autoencoder as mod

    monkeypatch.setattr(mod, "_BLOCK_BYTES", 8 * D_F * D_E * 2)
    ae = _ae(0.0, dtype)
    x = _point(ae)
    k = -(-ae.d // ae.n)
    H = np.random.default_rng(3).standard_normal((ae.n, ae.d))
    seen: list[tuple[str, bool]] = []
    for name in ("autoencoder_split_grads", "autoencoder_shifted_messages"):
        def spy(*a: Any, _f: Any = getattr(mod, name), **kw: Any) -> Any:
            seen.append((threading.current_thread().name, kw["on_caller"]))
            return _f(*a, **kw)
        monkeypatch.setattr(mod, name, spy)
    blas = [(i["user_api"], i["num_threads"]) for i in threadpool_info()]
    before = _core.get_num_threads()
    out = []
    try:
        for threads in (1, 3):
            _core.set_num_threads(threads)
            seen.clear()
            grads = ae.local_grads(ae.x0 + 1e-3 * threads).copy()  # a new point for each
            msgs = list(ae.local_message_blocks(x, permk.TopK(k), H, start=0, n_workers=ae.n, seed=0, round=3))
            runs = [permk.ef21(p, permk.TopK(k), rounds=15, seed=0, gamma=1e-3) for p in (ae, ae.grouped())]
            on_threads = {name.startswith("permk-blocks") and on_caller for name, on_caller in seen}
            assert on_threads == {threads > 1} and len(seen) > 4
            out.append((ae.local_grads(ae.x0 + 1e-3), msgs, runs, grads))
    finally:
        _core.set_num_threads(before)
    assert [(i["user_api"], i["num_threads"]) for i in threadpool_info()] == blas
    (g1, m1, r1, _), (g3, m3, r3, _) = out
    np.testing.assert_array_equal(g1, g3)
    assert len(m3) > 1 and m3[-1][1] == m1[-1][1] == ae.n  # blocks of two splits on 3 threads, one on one
    for field in ("indices", "values"):
        np.testing.assert_array_equal(*(np.concatenate([getattr(msg, field) for _, _, msg in m]) for m in (m1, m3)))
    for a, b in zip(r1, r3):
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.state.G, b.state.G)
        np.testing.assert_array_equal(a.grad_norm_sq, b.grad_norm_sq)


def test_block_threads_raise_the_first_error_in_block_order_and_stay_usable() -> None:
    """A block that raises: the first failing block's exception (in block order) once every
    started block has finished; the threads then run the next pass as usual."""
    import time

    from permk.problems.autoencoder import _BLOCK_THREADS

    done: list[int] = []

    def f(lo: int, hi: int) -> int:
        if lo in (2, 5):
            raise ValueError(f"block {lo}")
        time.sleep(0.01)
        done.append(lo)
        return lo

    bounds = [(lo, lo + 1) for lo in range(8)]
    with pytest.raises(ValueError, match="block 2"):
        _BLOCK_THREADS.map(2, f, bounds)
    finished = len(done)
    time.sleep(0.05)
    assert len(done) == finished  # nothing still running after the raise
    assert _BLOCK_THREADS.map(3, lambda lo, hi: hi - lo, bounds) == [1] * 8


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


def test_split_gradients_in_reused_buffers_stay_read_only_while_held() -> None:
    """split_grads (the error-feedback route of workers sharing a split) writes into the pooled
    buffers too: an array a caller holds (or a view of it) is never overwritten and stays
    read-only; a buffer nobody holds any more is reused, writeable for the next gradients."""
    ae = _ae(0.6)
    assert not ae._own_splits
    held = [ae.split_grads(_point(ae, k)) for k in range(4)]
    view = ae.split_grads(_point(ae, 10))[1:3]
    copies, view_copy = [h.copy() for h in held], view.copy()
    for k in range(4, 9):
        ae.split_grads(_point(ae, k))
        ae.local_grads(_point(ae, k + 50))
    for h, c in zip(held, copies):
        np.testing.assert_array_equal(h, c)
        assert not h.flags.writeable
    np.testing.assert_array_equal(view, view_copy)
    del held, copies, view
    got = [ae.split_grads(_point(ae, k)) for k in range(20, 26)]
    assert all(not g.flags.writeable for g in got)
    np.testing.assert_array_equal(ae.split_grads(_point(ae, 1)), ae._split_grads(ae._point(_point(ae, 1))))


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


# ---------------------------------------------------------------------------------------------
# the problem restricted to a block of workers, and MPI runs of it
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("split", ["per-worker", "per-sample"])
def test_a_block_of_workers_holds_their_images_only_and_answers_as_the_whole_problem(dtype: type, split: str) -> None:
    whole = _ae(0.5, dtype, split=split)
    x = _point(whole)
    G = whole.local_grads(x)
    tol = 1e-12 if dtype is np.float64 else F32_REL
    held = 0
    for ws in (range(0, 3), range(3, 6), range(6, 9)):
        part = _ae(0.5, dtype, split=split, workers=ws)
        assert isinstance(part, permk.distributed.LocalProblem) and part.workers == ws
        splits = np.unique(whole.worker_split[ws.start : ws.stop])
        assert part._AT.shape[1] == len(splits) * part._m  # only the splits of its workers
        held += len(splits)
        assert np.abs(part.local_grads(x) - G[ws.start : ws.stop]).max() <= tol * np.abs(G).max()
        rows = np.repeat(np.arange(ws.start, ws.stop), 7)
        cols = np.random.default_rng(ws.start).integers(0, whole.d, rows.size)
        assert np.abs(part.local_grad_coords(x, rows, cols) - G[rows, cols]).max() <= tol * np.abs(G).max()
        for i in ws:
            np.testing.assert_array_equal(part.local_grad(i, x), part.local_grads(x)[i - ws.start])
        # the global oracles of the record: the same second moment, from all images
        np.testing.assert_array_equal(part.grad(x), whole.grad(x))
        assert part.loss(x) == whole.loss(x) and part.f_star == whole.f_star
        np.testing.assert_array_equal(part.x0, whole.x0)
        with pytest.raises(ValueError, match="held by this problem"):
            part.local_grad_coords(x, [(ws.stop % 9)], [0])
    assert held >= whole.n_splits
    with pytest.raises(ValueError, match="cannot be grouped"):
        _ae(0.5, workers=range(0, 3)).grouped()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("split,loss", [("per-worker", "paper"), ("per-sample", "authors")])
@pytest.mark.parametrize("p_hat", [0.0, 0.5, 1.0])
def test_the_held_workers_gradient_sum_is_the_sum_of_their_gradients(dtype: type, split: str, loss: str, p_hat: float) -> None:
    """``local_grad_sum`` (the MPI backend's full rounds) in closed form equals the sum of the
    held workers' gradients by the direct formulas on the images as held (float64 arithmetic on
    either dtype's images), for the whole problem and for blocks of workers."""
    X = _X()
    whole = _ae(p_hat, dtype, split=split, loss=loss)
    x = _point(whole)
    direct = np.array([direct_split_grad(whole, X, s, x) for s in range(whole.n_splits)])[whole.worker_split]  # (n, d)
    scale = np.abs(direct).max() * whole.n
    assert np.abs(whole.local_grad_sum(x) - direct.sum(axis=0)).max() <= 1e-12 * scale
    assert np.abs(whole.local_grad_sum(x) - whole.n * whole.grad(x)).max() <= 1e-12 * scale
    parts = []
    for ws in (range(0, 2), range(2, 7), range(7, 9)):
        part = _ae(p_hat, dtype, split=split, loss=loss, workers=ws)
        got = part.local_grad_sum(x)
        assert got.shape == (whole.d,) and got.dtype == np.float64
        assert np.abs(got - direct[ws.start : ws.stop].sum(axis=0)).max() <= 1e-12 * scale
        parts.append(got)
    assert np.abs(np.sum(parts, axis=0) - whole.n * whole.grad(x)).max() <= 1e-12 * scale


def test_local_says_whether_the_problem_holds_a_block_of_workers() -> None:
    whole, part = _ae(0.5), _ae(0.5, workers=range(3, 6))
    assert not whole.local and whole.held_workers == range(whole.n) and "workers=" not in repr(whole)
    assert not isinstance(whole, permk.distributed.LocalProblem)  # run views it through LocalView
    assert isinstance(whole.grouped(), GroupedAutoencoder)
    assert part.local and part.held_workers == part.workers == range(3, 6) and "workers=range(3, 6)" in repr(part)
    assert part.local_grads(_point(part)).shape == (3, part.d)


def _mpi_runs(tmp_path_factory: pytest.TempPathFactory, nprocs: int) -> Path:
    out = tmp_path_factory.mktemp(f"ae_mpi{nprocs}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [str(MPIEXEC), "-n", str(nprocs), sys.executable, str(MPI_DIR / "autoencoder_run.py"), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=MPI_DIR, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.fixture(scope="module")
def ae_mpi2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _mpi_runs(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def ae_mpi4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _mpi_runs(tmp_path_factory, 4)


#: the MPI runs' iterates against the single process's, relative to the largest entry: the ranks'
#: products on their own images round differently from the whole problem's, and MARINA's full
#: rounds (and EF21's first) average the workers' gradients where the simulator uses the closed
#: form through the second moment; measured 2e-16 (float64; EF21: equal) and 1.3e-7 (float32) after 40 rounds
MPI_REL = {"float64": 1e-11, "float32": 1e-5}


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("name", list(MPI_CASES))
def test_mpi_runs_on_rank_local_images_equal_the_single_process_run(name: str, nprocs: int, ae_mpi2: Path, ae_mpi4: Path) -> None:
    import json

    with np.load((ae_mpi2 if nprocs == 2 else ae_mpi4) / f"{name}.npz") as z:
        got = {k: z[k] for k in z.files}
    meta = json.loads(str(got["meta"]))
    whole = problem(name)
    ref = method(name)(whole, compressor(name), **OPTIONS)
    if ref.coins is not None:
        np.testing.assert_array_equal(got["coins"], ref.coins)
    np.testing.assert_array_equal(got["bits"], ref.bits_per_worker)
    rel = MPI_REL[MPI_CASES[name][2]]
    assert np.abs(got["x"] - ref.x).max() <= rel * np.abs(ref.x).max()
    np.testing.assert_allclose(got["grad_norm_sq"], ref.grad_norm_sq, rtol=100 * rel)
    # every rank held the images of its own workers' splits only
    for r, (start, stop, columns, images) in enumerate(meta["held"]):
        ws = permk.distributed.workers_of(MPI_WORKERS, size=nprocs, rank=r)
        assert (start, stop) == (ws.start, ws.stop)
        splits = np.unique(whole.worker_split[start:stop])
        assert images == int(whole.sizes[splits].sum()) and columns == len(splits) * whole._m
    if method(name).exchange is permk.exchanges.compressed_mean_diff:  # values at the plan's coordinates only
        assert meta["path"] == "fused"


@pytest.mark.slow
@pytest.mark.mpi
def test_permk_autoencoder_cli_on_mpi_matches_single_process(tmp_path: Path) -> None:
    """`mpiexec -n 2 permk autoencoder --mpi`: every rank holds its block of workers' images,
    rank 0 writes, and the results are the single process's up to rounding (EF21 runs on the
    ranks' workers there, on the grouped problem in one process)."""
    import gzip
    import struct

    d = tmp_path / "data"
    d.mkdir()
    pixels = (np.random.default_rng(0).random((200, 8, 8)) * 255).astype(np.uint8)
    (d / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(bytes([0, 0, 8, 3]) + struct.pack(">3I", 200, 8, 8) + pixels.tobytes()))
    grid = ["autoencoder", "--workers", "10", "--p-hat", "0", "0.5", "--lam", "0.001", "--encoding", "3", "--rounds", "40",
            "--max-multipliers", "1", "--no-plot", "--no-progress", "--data", str(d)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cli = [sys.executable, "-m", "permk.cli"]
    mpi = subprocess.run([str(MPIEXEC), "-n", "2", *cli, *grid, "--mpi", "--out", str(tmp_path / "mpi")], capture_output=True,
                         text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert mpi.returncode == 0, mpi.stdout + mpi.stderr
    seq = subprocess.run([*cli, *grid, "--out", str(tmp_path / "seq")], capture_output=True, text=True, timeout=300, env=env,
                         stdin=subprocess.DEVNULL)
    assert seq.returncode == 0, seq.stdout + seq.stderr
    a, b = final_grad_norms(tmp_path / "mpi" / "autoencoder"), final_grad_norms(tmp_path / "seq" / "autoencoder")
    assert len(a) == 6 and a.keys() == b.keys()
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=1e-8), k


# ---------------------------------------------------------------------------------------------
# the authors' protocol: per-sample heterogeneity, their loss
# ---------------------------------------------------------------------------------------------
def authors_split(X: np.ndarray, n: int, p_hat: float, rng: np.random.Generator) -> list[np.ndarray]:
    """The authors' Dataset.shuffle + split_with_controling_homogeneity (dataset.py:69-80),
    transcribed: n + 1 parts of the shuffled data, the first held out; each sample of every
    other part replaced, with probability p̂, by the held-out sample at the same position."""
    data = X[rng.permutation(len(X))]
    datasets = [d.copy() for d in np.array_split(data, n + 1)]
    hold_out, datasets = datasets[0], datasets[1:]
    for d in datasets:
        idx = np.where(rng.random(size=(len(d),)) <= p_hat)[0]
        d[idx, :] = hold_out[idx, :]
    return datasets


@pytest.mark.parametrize("p_hat", [0.0, 0.3, 0.9, 1.0])
def test_per_sample_split_is_the_authors(p_hat: float) -> None:
    X = _X()
    ae = LinearAutoencoder(X, N_WORKERS, p_hat, 1e-2, d_e=D_E, seed=4, split="per-sample")
    theirs = authors_split(X, N_WORKERS, p_hat, np.random.default_rng(4))
    for i in range(N_WORKERS):
        np.testing.assert_array_equal(X[ae.split_index[ae.worker_split[i]]], theirs[i])
    if p_hat == 0.0:
        assert ae.n_splits == N_WORKERS
    if p_hat == 1.0:  # every worker holds the first m_i held-out samples: at most two distinct sets
        assert ae.n_splits <= 2 and ae.n_splits < N_WORKERS
    # the start point is drawn after the split, from the same stream
    assert ae.x0.shape == (ae.d,) and np.isfinite(ae.x0).all()


def test_per_worker_split_keeps_its_random_stream() -> None:
    """The paper's split (the default) is the one permk always drew: parts, then the coins."""
    X = _X()
    ae = LinearAutoencoder(X, N_WORKERS, 0.5, 1e-2, d_e=D_E, seed=4)
    rng = np.random.default_rng(4)
    parts = np.array_split(rng.permutation(len(X)), N_WORKERS + 1)
    shared = rng.random(N_WORKERS) < 0.5
    for i in range(N_WORKERS):
        np.testing.assert_array_equal(ae.split_index[ae.worker_split[i]], parts[0 if shared[i] else i + 1])


def test_authors_loss_is_the_papers_rescaled() -> None:
    """loss="authors" = (1/d_f) × data term + λ‖DE − I‖²: at λ = 0 exactly the paper's f / d_f."""
    X = _X()
    paper = LinearAutoencoder(X, N_WORKERS, 0.5, 0.0, d_e=D_E, seed=2)
    theirs = LinearAutoencoder(X, N_WORKERS, 0.5, 0.0, d_e=D_E, seed=2, loss="authors")
    x = _point(paper)
    assert math.isclose(theirs.loss(x), paper.loss(x) / D_F, rel_tol=1e-12)
    np.testing.assert_allclose(theirs.local_grads(x), paper.local_grads(x) / D_F, rtol=1e-10, atol=1e-14)
    assert math.isclose(theirs.f_star, paper.f_star / D_F, rel_tol=1e-9)


def test_the_grid_carries_split_loss_and_dtype_to_its_cells(tmp_path: Path) -> None:
    import argparse
    import json
    from dataclasses import replace

    import permk.experiments.autoencoder as mod
    from permk.experiments.autoencoder import QUICK_GRID, AutoencoderGrid, autoencoder_cell, grid_from_args
    from permk.experiments.results import read_records

    with pytest.raises(ValueError, match="split must be one of"):
        AutoencoderGrid(split="per-node")
    with pytest.raises(ValueError, match="loss must be one of"):
        AutoencoderGrid(loss="mse")
    with pytest.raises(ValueError, match="dtype must be one of"):
        AutoencoderGrid(dtype="float16")
    grid = replace(QUICK_GRID, workers=N_WORKERS, d_e=D_E, p_hats=(0.5,), split="per-sample", loss="authors", dtype="float32",
                   methods=("marina-permk",), gamma=1e-2, max_multipliers=1)
    cfg = grid.to_json()
    assert (cfg["split"], cfg["loss"], cfg["dtype"]) == ("per-sample", "authors", "float32")
    real = mod._images
    mod._images = lambda data, limit: (_X(), "test images")  # type: ignore[assignment]
    try:
        cell = grid.cells()[0]
        autoencoder_cell(cell, json.loads(json.dumps(cfg, default=list)), str(tmp_path / "c.jsonl"), False)
    finally:
        mod._images = real
    rec = read_records(tmp_path / "c.jsonl")[0]
    ref = LinearAutoencoder(_X(), N_WORKERS, 0.5, cell["lam"], d_e=D_E, seed=0, split="per-sample", loss="authors", dtype=np.float32)
    assert rec["constants"]["f_star"] == pytest.approx(ref.f_star, rel=1e-12)
    assert rec["constants"]["n_splits"] == ref.n_splits
    # the command line's --split / --loss / --dtype, where it has them
    args = argparse.Namespace(quick=True, seed=None, rounds=None, tol=None, budget_factor=None, no_prune=False, data=None, workers=None,
                              p_hat=None, lam=None, encoding=None, images=None, gamma=None, max_multipliers=None, methods=None,
                              split="per-sample", loss="authors", dtype="float32")
    g = grid_from_args(args)
    assert (g.split, g.loss, g.dtype) == ("per-sample", "authors", "float32")


def test_a_diverging_run_stops_without_numpy_warnings() -> None:
    import warnings

    ae = _ae(0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = permk.marina(ae, permk.PermK(), rounds=300, seed=0, gamma=5.0)
        e = permk.ef21(ae.grouped(), permk.TopK(4), rounds=300, seed=0, gamma=5.0)
    assert r.diverged_at is not None and e.diverged_at is not None
