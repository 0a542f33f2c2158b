"""The native module ``permk._core`` directly: the generic ``Spec(name, **params)``, the new
kernels (``compress_rows``, ``plan_ranges``, ``permutation``, coordinate sampling, the
Tridiagonal EF21/MARINA steps, the thread pool), bit-for-bit agreement with the existing
paths, errors naming their argument, and allocations refused before they happen (in a
subprocess, where an abort would not take pytest down)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Callable

import numpy as np
import pytest

import permk
from permk import _core

from conftest import PyTopK

SPARSIFIERS: list[dict[str, Any]] = [
    {"sparsifier": "identity"},
    {"sparsifier": "permk"},
    {"sparsifier": "randk", "k": 2},
    {"sparsifier": "topk", "k": 2},
    {"sparsifier": "blockpermk", "m": 2},
    {"sparsifier": "blockpermk", "labels": [1, 0, 1, 1, 0, 0, 1]},
    {"sparsifier": "coordinate_sampling"},
]
SPECS = SPARSIFIERS + [
    {**s, "quantizer": q, **({"s": 3} if q == "qsgd" else {})}
    for s in ({"sparsifier": "permk"}, {"sparsifier": "topk", "k": 2}, {"sparsifier": "coordinate_sampling"})
    for q in ("natural", "qsgd")
]


def _id(kw: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in kw.items())


def _data(n: int, d: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d))


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool((a.view(np.uint8) == b.view(np.uint8)).all())


# ------------------------------------------------------------------------------------------
# Spec(name, **params)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", SPECS, ids=_id)
def test_spec_name_and_shared_plan(kw: dict[str, Any]) -> None:
    spec = _core.Spec(**kw)
    assert spec.name == kw["sparsifier"]
    shared = kw["sparsifier"] != "topk" and kw.get("quantizer", "none") == "none"
    assert spec.shared_plan is shared


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda: _core.Spec("bogus"), ValueError, "sparsifier.*bogus"),
        (lambda: _core.Spec("permk", quantizer="bogus"), ValueError, "quantizer"),
        (lambda: _core.Spec("permk", k=3), ValueError, r"^k: unknown parameter"),
        (lambda: _core.Spec("randk", k=2, foo=1), ValueError, r"^foo: unknown parameter"),
        (lambda: _core.Spec("randk"), ValueError, r"^k: randk needs k"),
        (lambda: _core.Spec("randk", k=0), ValueError, r"^k: must be at least 1"),
        (lambda: _core.Spec("randk", k=-3), ValueError, r"^k: "),
        (lambda: _core.Spec("randk", k=2.0), TypeError, r"^k: must be an integer"),
        (lambda: _core.Spec("randk", k=True), TypeError, r"^k: .*bool"),
        (lambda: _core.Spec("randk", k="2"), TypeError, r"^k: "),  # type: ignore[arg-type]
        (lambda: _core.Spec("randk", k=2**70), ValueError, r"^k: .*out of range"),
        (lambda: _core.Spec("blockpermk"), ValueError, r"^m: blockpermk needs m or labels"),
        (lambda: _core.Spec("blockpermk", labels=[0, -1]), ValueError, "partition"),
        (lambda: _core.Spec("blockpermk", labels=[0, 2]), ValueError, "partition"),
        (lambda: _core.Spec("blockpermk", labels=3), TypeError, r"^labels: must be a list"),
        (lambda: _core.Spec("blockpermk", labels=[0, 1], m=3), ValueError, r"^m: "),
        (lambda: _core.Spec("permk", quantizer="qsgd"), ValueError, r"^s: qsgd needs s"),
        (lambda: _core.Spec("permk", quantizer="qsgd", s=0), ValueError, r"^s: "),
        (lambda: _core.Spec("permk", s=2), ValueError, r"^s: unknown parameter"),
    ],
)
def test_spec_rejects_bad_names_and_params(call: Callable[[], Any], exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        call()


def test_spec_params_accept_numpy_scalars_and_none() -> None:
    a = _data(4, 10)
    ref = _core.Spec("randk", k=3).aggregate(a, 1, 2)
    assert _same_bits(_core.Spec("randk", k=np.int64(3)).aggregate(a, 1, 2), ref)  # type: ignore[arg-type]
    assert _same_bits(_core.Spec("randk", k=3, m=None).aggregate(a, 1, 2), ref)
    lab = np.array([1, 0, 1, 1, 0, 0, 1])
    b = _data(3, 7)
    from_array = _core.Spec("blockpermk", labels=lab).aggregate(b, 0, 0)  # type: ignore[arg-type]
    assert _same_bits(from_array, _core.Spec("blockpermk", labels=lab.tolist()).aggregate(b, 0, 0))


# ------------------------------------------------------------------------------------------
# compress_rows, plan_ranges, permutation, coordinate sampling
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", SPECS, ids=_id)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_compress_rows_is_compress_worker_by_worker(kw: dict[str, Any], dtype: type) -> None:
    spec = _core.Spec(**kw)
    n, d = 5, 7
    a: np.ndarray = _data(n, d).astype(dtype)
    for start, stop in [(0, n), (2, 4), (4, 5), (3, 3)]:
        offsets, indices, values = spec.compress_rows(a[start:stop], start, n, 9, 4)
        assert offsets.dtype == np.int64 and indices.dtype == np.int64 and values.dtype == dtype
        assert offsets.shape == (stop - start + 1,) and offsets[0] == 0 and offsets[-1] == len(indices) == len(values)
        for r in range(stop - start):
            idx, val = spec.compress(a[start + r], start + r, n, 9, 4)
            sl = slice(offsets[r], offsets[r + 1])
            assert _same_bits(indices[sl], idx)
            assert _same_bits(values[sl], val)
    # the messages of all workers make compress_all and aggregate
    offsets, indices, values = spec.compress_rows(a, 0, n, 9, 4)
    dense: np.ndarray = np.zeros((n, d), dtype=dtype)
    for i in range(n):
        dense[i, indices[offsets[i]:offsets[i + 1]]] = values[offsets[i]:offsets[i + 1]]
    assert _same_bits(dense, spec.compress_all(a, 9, 4))


@pytest.mark.parametrize("kw", SPECS, ids=_id)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_compress_shifted_rows_is_compress_rows_of_the_shifted_array(kw: dict[str, Any], dtype: type) -> None:
    """Spec.compress_shifted_rows(G, H, β, …) is compress_rows of numpy's G − H (β = 1) or
    G − H·β, bit for bit, without H it is compress_rows(G); large inputs (on the pool's threads)
    give the same messages on one thread; a non-finite input anywhere gives None."""
    spec = _core.Spec(**kw)
    n, d = 5, 7
    G, H = _data(n, d).astype(dtype), _data(n, d, seed=1).astype(dtype)
    for start, stop in [(0, n), (2, 4), (3, 3)]:
        g, h = G[start:stop], H[start:stop]
        for beta in (1.0, 0.3):
            want = spec.compress_rows(g - h if beta == 1.0 else g - h * beta, start, n, 9, 4)
            got = spec.compress_shifted_rows(g, h, beta, start, n, 9, 4)
            assert got is not None and all(_same_bits(a, b) for a, b in zip(got, want))
        got = spec.compress_shifted_rows(g, None, 1.0, start, n, 9, 4)
        assert got is not None and all(_same_bits(a, b) for a, b in zip(got, spec.compress_rows(g, start, n, 9, 4)))
    for bad in (np.nan, np.inf):
        H2 = H.copy()
        H2[3, 5] = bad
        assert spec.compress_shifted_rows(G, H2, 1.0, 0, n, 9, 4) is None
    D = 7 * 6000  # a multiple of the labelled partition's 7 coordinates
    big_g, big_h = _data(8, D).astype(dtype), _data(8, D, seed=2).astype(dtype)
    if "labels" in kw:
        spec = _core.Spec("blockpermk", labels=kw["labels"] * 6000)
    many = spec.compress_shifted_rows(big_g, big_h, 0.5, 0, 8, 1, 2)
    before = _core.get_num_threads()
    try:
        _core.set_num_threads(1)
        one = spec.compress_shifted_rows(big_g, big_h, 0.5, 0, 8, 1, 2)
    finally:
        _core.set_num_threads(before)
    assert many is not None and one is not None and all(_same_bits(a, b) for a, b in zip(many, one))


def test_compress_shifted_rows_rejects_bad_input_by_name() -> None:
    spec = _core.Spec("topk", k=2)
    G = _data(3, 6)
    with pytest.raises(ValueError, match=r"^H: "):
        spec.compress_shifted_rows(G, G[:2], 1.0, 0, 3, 0, 0)
    with pytest.raises(ValueError, match=r"^start: "):
        spec.compress_shifted_rows(G, None, 1.0, 1, 3, 0, 0)
    with pytest.raises(ValueError, match=r"^beta: "):
        spec.compress_shifted_rows(G, G, float("nan"), 0, 3, 0, 0)
    with pytest.raises(TypeError, match="same dtype"):  # float32 H with float64 G is allowed (a float32 problem's estimators)
        spec.compress_shifted_rows(G.astype(np.float32), G, 1.0, 0, 3, 0, 0)
    with pytest.raises(TypeError, match="G must be"):
        spec.compress_shifted_rows(G.astype(np.int64), None, 1.0, 0, 3, 0, 0)


def test_compress_rows_rejects_bad_rows() -> None:
    spec = _core.Spec("topk", k=1)
    with pytest.raises(ValueError, match=r"^start: "):
        spec.compress_rows(_data(3, 4), 2, 4, 0, 0)
    with pytest.raises(ValueError, match=r"^n_workers: "):
        spec.compress_rows(_data(3, 4), 0, 0, 0, 0)
    with pytest.raises(ValueError, match=r"^d: "):
        spec.compress_rows(np.zeros((2, 0)), 0, 2, 0, 0)
    with pytest.raises(TypeError, match=r"\bA\b"):
        spec.compress_rows(np.zeros((2, 3), dtype=complex), 0, 2, 0, 0)
    bad = _data(3, 4)
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="non-finite.*worker 6, coordinate 2"):
        spec.compress_rows(bad, 5, 8, 0, 0)


@pytest.mark.parametrize(
    "kw,n,d,contiguous",
    [
        ({"sparsifier": "identity"}, 3, 7, True),
        ({"sparsifier": "permk"}, 7, 3, True),
        ({"sparsifier": "permk"}, 5, 5, True),
        ({"sparsifier": "permk"}, 1, 9, True),
        ({"sparsifier": "permk"}, 4, 10, False),
        ({"sparsifier": "blockpermk", "m": 3}, 7, 10, True),
        ({"sparsifier": "blockpermk", "labels": [0, 0, 1, 1, 1, 2]}, 4, 6, True),
        ({"sparsifier": "blockpermk", "labels": [0, 1, 0, 1]}, 4, 4, False),
        ({"sparsifier": "randk", "k": 1}, 6, 9, True),
        ({"sparsifier": "randk", "k": 2}, 6, 9, False),
        ({"sparsifier": "coordinate_sampling"}, 1, 9, True),
        ({"sparsifier": "coordinate_sampling"}, 3, 9, False),
        ({"sparsifier": "topk", "k": 1}, 3, 9, False),
        ({"sparsifier": "permk", "quantizer": "natural"}, 7, 3, False),
    ],
    ids=lambda v: _id(v) if isinstance(v, dict) else str(v),
)
def test_plan_ranges_match_the_plan(kw: dict[str, Any], n: int, d: int, contiguous: bool) -> None:
    spec = _core.Spec(**kw)
    for rnd in range(3):
        r = spec.plan_ranges(n, d, 4, rnd)
        assert (r is not None) is contiguous
        if r is None:
            continue
        starts, stops, scales = r
        assert starts.dtype == stops.dtype == np.int64 and scales.dtype == np.float64
        assert starts.shape == stops.shape == scales.shape == (n,)
        offsets, coords, plan_scales = spec.plan(n, d, 4, rnd)
        for i in range(n):
            np.testing.assert_array_equal(np.arange(starts[i], stops[i]), coords[offsets[i]:offsets[i + 1]])
        assert _same_bits(scales, plan_scales)
        assert ((starts < stops) | (starts == 0)).all()


def test_plan_ranges_is_cheap_for_large_dimensions() -> None:
    # O(n): no O(d) arrays for d = 2^32 - 1
    r = _core.Spec("blockpermk", m=4).plan_ranges(6, 2**32 - 1, 0, 0)
    assert r is not None
    starts, stops, scales = r
    assert sorted(zip(starts[starts < stops].tolist(), stops[starts < stops].tolist())) == [
        (b * (2**32 - 1) // 4, (b + 1) * (2**32 - 1) // 4) for b in range(4)
    ]
    assert (scales == 6.0).all()
    s = _core.Spec("identity").plan_ranges(3, 2**32 - 1, 0, 0)
    assert s is not None and (s[1] == 2**32 - 1).all()


def test_permutation() -> None:
    p = _core.permutation(5, 7, 1000)
    assert p.dtype == np.int64
    np.testing.assert_array_equal(np.sort(p), np.arange(1000))
    assert _same_bits(p, _core.permutation(5, 7, 1000))
    assert not np.array_equal(p, _core.permutation(5, 8, 1000))
    assert not np.array_equal(p, _core.permutation(6, 7, 1000))
    assert _core.permutation(0, 0, 0).shape == (0,)
    counts = np.zeros((3, 3))
    for t in range(3000):
        perm = tuple(_core.permutation(1, t, 3).tolist())
        counts[perm[0], perm[1]] += 1
    # each of the 6 permutations about 500 times
    nonzero = counts[counts > 0]
    assert len(nonzero) == 6 and (abs(nonzero - 500) < 120).all()
    with pytest.raises(OverflowError, match="seed"):  # PyO3's conversion, like every seed of _core
        _core.permutation(-1, 0, 3)


def test_coordinate_sampling() -> None:
    n, d = 4, 10_000
    spec = _core.Spec("coordinate_sampling")
    offsets, coords, scales = spec.plan(n, d, 3, 1)
    np.testing.assert_array_equal(np.sort(coords), np.arange(d))  # one owner per coordinate
    assert (scales == n).all()
    sizes = np.diff(offsets)
    assert abs(sizes - d / n).max() < 5 * np.sqrt(d / n)
    a = _data(n, d)
    msgs = [spec.compress(a[i], i, n, 3, 1) for i in range(n)]
    total = np.zeros(d)
    for idx, val in msgs:
        total[idx] += val
    assert _same_bits(spec.aggregate(a, 3, 1), total / n)
    # unbiased on average over rounds
    b = np.arange(1.0, 7.0)[None, :].repeat(3, axis=0)
    mean = np.mean([spec.aggregate(b, 0, t) for t in range(3000)], axis=0)
    np.testing.assert_allclose(mean, b[0], rtol=0.12)
    # any n and d
    assert spec.aggregate(_data(9, 2), 0, 0).shape == (2,)
    assert _same_bits(spec.aggregate(a[:1], 0, 0), a[0])


def test_blockpermk_contiguous_kernel_is_the_generic_sum() -> None:
    n, d = 12, 50_000
    a = _data(n, d)
    for m in (1, 3, 12):
        spec = _core.Spec("blockpermk", m=m)
        for arr in (a, a.astype(np.float32), np.asfortranarray(a)):
            total = np.zeros(d, dtype=arr.dtype)
            for i in range(n):
                idx, val = spec.compress(arr[i], i, n, 2, 3)
                total[idx] += val
            assert _same_bits(spec.aggregate(arr, 2, 3), total / arr.dtype.type(n))


def test_thread_count_is_settable_and_never_changes_results() -> None:
    before = _core.get_num_threads()
    a = _data(16, 200_000)
    specs = [_core.Spec("permk"), _core.Spec("blockpermk", m=4), _core.Spec("randk", k=5000), _core.Spec("topk", k=3)]
    try:
        _core.set_num_threads(1)
        assert _core.get_num_threads() == 1
        one = [s.aggregate(a, 1, 2) for s in specs] + [specs[3].compress_rows(a, 0, 16, 1, 2)[2]]
        _core.set_num_threads(3)
        assert _core.get_num_threads() == 3
        three = [s.aggregate(a, 1, 2) for s in specs] + [specs[3].compress_rows(a, 0, 16, 1, 2)[2]]
        assert all(_same_bits(x, y) for x, y in zip(one, three))
        with pytest.raises(ValueError, match=r"^k: "):
            _core.set_num_threads(0)
        with pytest.raises(ValueError, match=r"^k: "):
            _core.set_num_threads(100_000)
    finally:
        _core.set_num_threads(before)


# ------------------------------------------------------------------------------------------
# Tridiagonal
# ------------------------------------------------------------------------------------------


def _problem(n: int) -> _core.Tridiagonal:
    rng = np.random.default_rng(n)
    return _core.Tridiagonal((rng.uniform(0.1, 0.5, n)).tolist(), 0.01, rng.uniform(-0.3, 0.3, n).tolist())


def test_local_grads_rows() -> None:
    q = _problem(6)
    x = np.random.default_rng(1).standard_normal(9)
    full = q.local_grads(x)
    assert full.shape == (6, 9)
    assert _same_bits(q.local_grads(x, 2, 5), full[2:5])
    assert _same_bits(q.local_grads(x, start=4), full[4:])
    assert q.local_grads(x, 3, 3).shape == (0, 9)
    with pytest.raises(ValueError, match=r"^stop: "):
        q.local_grads(x, 0, 7)
    with pytest.raises(ValueError, match=r"^start: "):
        q.local_grads(x, 5, 4)


@pytest.mark.parametrize(
    "kw",
    [{"sparsifier": "permk"}, {"sparsifier": "randk", "k": 3}, {"sparsifier": "identity"}, {"sparsifier": "blockpermk", "m": 2},
     {"sparsifier": "coordinate_sampling"}],
    ids=_id,
)
@pytest.mark.parametrize("n,d", [(4, 10), (9, 3)])
def test_compressed_mean_diff_is_the_aggregate_of_the_differences(kw: dict[str, Any], n: int, d: int) -> None:
    q = _problem(n)
    spec = _core.Spec(**kw)
    rng = np.random.default_rng(2)
    x0, g0 = rng.standard_normal(d), rng.standard_normal(d)
    for rnd in range(3):
        x = x0 - 0.1 * g0
        diff = q.compressed_mean_diff(spec, x, x0, 5, rnd)
        assert diff.shape == (d,) and diff.dtype == np.float64
        dense = spec.aggregate(q.local_grads(x) - q.local_grads(x0), 5, rnd)
        np.testing.assert_allclose(diff, dense, rtol=1e-9, atol=1e-12)


def test_marinas_compressed_round_on_the_rust_path_adds_the_kernels_difference() -> None:
    """The Python MARINA (the one definition of the method) on the native kernel: a compressed
    round's ``g`` is ``g + compressed_mean_diff`` of the kernel, and the dense path's bit for bit."""
    q = permk.Quadratic.synthetic(n=6, d=20, lam=1e-3, noise_scale=0.3, seed=0)
    first = permk.marina(q, permk.PermK(), rounds=1, seed=5, p=1e-9, path="rust", gamma=0.1)
    assert not first.coins[0]  # tails
    diff = q.kernel.compressed_mean_diff(_core.Spec("permk"), first.x, q.x0, 5, 0)
    assert _same_bits(first.state.g, q.grad(q.x0) + diff)
    dense = permk.marina(q, permk.PermK(), rounds=1, seed=5, p=1e-9, path="dense", gamma=0.1)
    assert _same_bits(dense.state.g, first.state.g)


@pytest.mark.parametrize("k", [1, 3])
def test_error_feedback_is_the_ef21_topk_step(k: int) -> None:
    """Each worker's message is TopK of its residual ``∇f_i(x) − G_i`` (largest magnitudes,
    ties: lower index) and ``G_i`` takes it in place, in one call or in worker ranges."""
    n, d = 7, 40
    q = _problem(n)
    rng = np.random.default_rng(3)
    x0, g0 = rng.standard_normal(d), rng.standard_normal(d)
    G0 = np.ascontiguousarray(q.local_grads(rng.standard_normal(d)))
    for _ in range(3):
        x = x0 - 0.2 * g0
        R = q.local_grads(x) - G0
        C = np.zeros((n, d))
        for i in range(n):
            top = sorted(range(d), key=lambda j: (-abs(R[i, j]), j))[:k]
            C[i, top] = R[i, top]
        G1 = G0 + C
        G2 = G0.copy()
        offsets, indices, values, finite = q.error_feedback(_core.Spec("topk", k=k), x, G2, 0, 0)
        assert finite and offsets.shape == (n + 1,) and offsets.dtype == indices.dtype == np.int64
        assert np.array_equal(np.diff(offsets), np.full(n, k))
        assert _same_bits(G2, G1)
        g1 = g0 + np.bincount(indices, values, minlength=d) / n
        np.testing.assert_allclose(g1, g0 + C.sum(0) / n, rtol=1e-12, atol=1e-15)
        # in pieces, worker ranges start .. start + m
        G3 = G0.copy()
        parts = [q.error_feedback(_core.Spec("topk", k=k), x, G3[s:e], 0, 0, s) for s, e in [(0, 3), (3, 7)]]
        assert _same_bits(G3, G1)
        assert _same_bits(np.concatenate([p[1] for p in parts]), indices)
        x0, g0, G0 = x, g1, G1


@pytest.mark.parametrize(
    "kw", [{"sparsifier": "permk"}, {"sparsifier": "randk", "k": 2}, {"sparsifier": "permk", "quantizer": "qsgd", "s": 3},
           {"sparsifier": "coordinate_sampling"}], ids=_id
)
def test_error_feedback_with_any_spec_compresses_the_residual(kw: dict[str, Any]) -> None:
    n, d = 5, 12
    q = _problem(n)
    spec = _core.Spec(**kw)
    rng = np.random.default_rng(4)
    x = rng.standard_normal(d)
    G = np.ascontiguousarray(q.local_grads(rng.standard_normal(d)))
    R = q.local_grads(x) - G
    G2 = G[1:].copy()
    offsets, indices, values, finite = q.error_feedback(spec, x, G2, 7, 8, 1)
    assert finite
    expect = G[1:].copy()
    for r in range(n - 1):
        idx, val = spec.compress(R[1 + r], 1 + r, n, 7, 8)
        assert _same_bits(indices[offsets[r]:offsets[r + 1]], idx)
        assert _same_bits(values[offsets[r]:offsets[r + 1]], val)
        expect[r, idx] += val
    assert _same_bits(G2, expect)


def test_non_finite_residuals_leave_G_unchanged() -> None:
    n, d = 4, 9
    q = _problem(n)
    x = np.ones(d)
    G = np.ascontiguousarray(q.local_grads(x))
    G[2, 5] = np.inf
    for spec in (_core.Spec("topk", k=1), _core.Spec("topk", k=2), _core.Spec("permk")):
        before = G.copy()
        offsets, indices, values, finite = q.error_feedback(spec, x, G, 0, 0)
        assert finite is False and len(indices) == len(values) == 0 and (offsets == 0).all()
        assert _same_bits(G, before)


def test_in_place_kernels_validate_before_writing() -> None:
    q = _problem(3)
    x0, g0 = np.arange(5.0), np.ones(5)
    x, g = x0.copy(), g0.copy()
    for call, exc, match in [
        (lambda: q.compressed_mean_diff(_core.Spec("topk", k=1), x, x, 0, 0), ValueError, "compressor"),
        (lambda: q.compressed_mean_diff(_core.Spec("randk", k=9), x, x, 0, 0), ValueError, r"^k: "),
        (lambda: q.compressed_mean_diff(_core.Spec("blockpermk", m=4), x, x, 0, 0), ValueError, r"^m: "),
        (lambda: q.error_feedback(_core.Spec("topk", k=1), x, np.ones((3, 10))[:, ::2], 0, 0), ValueError, r"^G: .*contiguous"),
        (lambda: q.error_feedback(_core.Spec("topk", k=6), x, np.ones((3, 5)), 0, 0), ValueError, r"^k: "),
        (lambda: q.error_feedback(_core.Spec("topk", k=1), x, np.ones((3, 5), dtype=np.float32), 0, 0), TypeError, "G"),
        (lambda: q.error_feedback(_core.Spec("topk", k=1), x, np.ones((2, 5)), 0, 0, 2), ValueError, r"^start: "),
        (lambda: q.error_feedback(_core.Spec("topk", k=1), x, np.ones((2, 4)), 0, 0), ValueError, r"^G: "),
        (lambda: q.error_feedback(_core.Spec("topk", k=1), x, np.ones((2, 10))[:, ::2], 0, 0), ValueError, r"^G: "),
        (lambda: q.error_feedback(_core.Spec("topk", k=1), np.zeros(0), np.ones((2, 0)), 0, 0), ValueError, r"^x: "),
        (lambda: q.compressed_mean_diff(_core.Spec("permk"), x, x[:4].copy(), 0, 0), ValueError, r"^x_old: "),
        (lambda: q.compressed_mean_diff(_core.Spec("permk", quantizer="natural"), x, x, 0, 0), ValueError, "compressor"),
    ]:
        with pytest.raises(exc, match=match):
            call()
        assert _same_bits(x, x0) and _same_bits(g, g0)


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda q: q.loss(np.zeros(0)), "x"),
        (lambda q: q.grad(np.zeros(0)), "x"),
        (lambda q: q.local_grads(np.zeros(0)), "x"),
        (lambda q: q.solve_mean([]), "rhs"),
        (lambda q: q.local_grad_coords(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64)), "x"),
        (lambda q: q.local_grad_coords(np.ones(3), np.zeros(2, np.int64), np.zeros(1, np.int64)), "rows"),
        (lambda q: q.local_grad_coords(np.ones(3), np.array([5]), np.array([0])), "rows"),
        (lambda q: q.local_grad_coords(np.ones(3), np.array([0]), np.array([3])), "cols"),
    ],
)
def test_empty_and_out_of_range_inputs_raise_value_errors(call: Callable[[Any], Any], name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}: "):
        call(_problem(3))


def test_solve_mean_solves_the_mean_system() -> None:
    q = _problem(5)
    rhs = np.random.default_rng(0).standard_normal(8)
    x = q.solve_mean(rhs.tolist())
    # (ā T + c I) x = rhs, with ā the mean of the a_i: checked through the mean gradient
    np.testing.assert_allclose(q.grad(x) - q.grad(np.zeros(8)), rhs, atol=1e-12)


# ------------------------------------------------------------------------------------------
# Round: one round's plan computed once, used natively
# ------------------------------------------------------------------------------------------

SHARED: list[dict[str, Any]] = [
    {"sparsifier": "identity"},
    {"sparsifier": "permk"},
    {"sparsifier": "randk", "k": 1},
    {"sparsifier": "randk", "k": 3},
    {"sparsifier": "blockpermk", "m": 2},
    {"sparsifier": "blockpermk", "m": 1},
    {"sparsifier": "blockpermk", "labels": [1, 0, 1, 1, 0, 0, 1]},
    {"sparsifier": "blockpermk", "labels": [0, 0, 1, 1, 1, 2, 2]},
    {"sparsifier": "coordinate_sampling"},
]
# n > d, n = d, n < d, n = 1, d not divisible by n, q > 1 workers per block, large blocks
SHAPES = [(4, 10), (10, 4), (5, 5), (1, 7), (3, 7), (20, 7), (6, 13), (2, 5000), (9, 100)]


def _defined(kw: dict[str, Any], n: int, d: int) -> bool:
    try:
        _core.Spec(**kw).check(n, d)
    except ValueError:
        return False
    return True


def _cases(shapes: list[tuple[int, int]]) -> Any:
    """The (spec, n, d) combinations for which the spec is defined."""
    return pytest.mark.parametrize(
        "kw,n,d",
        [(kw, n, d) for kw in SHARED for n, d in shapes if _defined(kw, n, d)],
        ids=lambda v: _id(v) if isinstance(v, dict) else str(v),
    )


def _round_and_plan(kw: dict[str, Any], n: int, d: int, seed: int = 3, rnd: int = 5) -> tuple[Any, Any]:
    spec = _core.Spec(**kw)
    return spec.round(n, d, seed, rnd), spec.plan(n, d, seed, rnd)


@_cases(SHAPES)
def test_round_is_the_plan(kw: dict[str, Any], n: int, d: int) -> None:
    spec = _core.Spec(**kw)
    r, (offsets, coords, scales) = _round_and_plan(kw, n, d)
    assert (r.n, r.d) == (n, d)
    assert _same_bits(r.offsets(), offsets)
    assert _same_bits(r.coords(0, n), coords)
    assert _same_bits(r.scales(), scales)
    sizes = np.diff(offsets)
    for a, b in [(0, n), (0, 0), (n // 2, n), (n - 1, n), (n // 3, 2 * n // 3)]:
        assert _same_bits(r.coords(a, b), coords[offsets[a]:offsets[b]])
        assert _same_bits(r.rows(a, b), np.repeat(np.arange(a, b, dtype=np.int64), sizes[a:b]))
    want = spec.plan_ranges(n, d, 3, 5)
    got = r.ranges()
    assert (got is None) == (want is None)
    if got is not None and want is not None:
        assert all(_same_bits(g, w) for g, w in zip(got, want))
    assert r.disjoint == bool(np.bincount(coords, minlength=d).max() <= 1)


@_cases(SHAPES)
def test_round_mean_and_gather_are_bincount_and_aggregate(kw: dict[str, Any], n: int, d: int) -> None:
    spec = _core.Spec(**kw)
    r, (offsets, coords, scales) = _round_and_plan(kw, n, d)
    rows = np.repeat(np.arange(n), np.diff(offsets))
    rng = np.random.default_rng(n * d)
    # any values, with signed zeros and subnormals: worker-order sums from 0, then / n
    values = rng.standard_normal(len(coords)) * 10.0 ** rng.integers(-3, 4, len(coords))
    values[::7] = -0.0
    values[3::11] = 1e-310
    assert _same_bits(r.mean(values), np.bincount(coords, weights=values, minlength=d) / n)
    if r.disjoint:  # placed, not summed: the same bits
        placed = np.zeros(d)
        placed[coords] = values + 0.0
        assert _same_bits(r.mean(values), placed / n)
    # a non-contiguous values array is fine
    twice = np.repeat(values, 2)[::2]
    assert _same_bits(r.mean(twice), r.mean(values))
    # gather: the plan's values, rounded once to A's dtype, for any slice of workers and strides
    A = rng.standard_normal((n, d))
    for dtype in (np.float64, np.float32):
        for a in (np.ascontiguousarray(A, dtype=dtype), np.asfortranarray(A, dtype=dtype)):
            want = (a[rows, coords] * scales[rows]).astype(dtype)
            assert _same_bits(r.gather(a, 0), want)
            for s, t in [(n // 2, n), (0, n // 2), (n - 1, n), (n // 3, 2 * n // 3)]:
                assert _same_bits(r.gather(a[s:t], s), want[offsets[s]:offsets[t]])
    # and over all workers its mean is Spec.aggregate
    assert _same_bits(r.mean(r.gather(A, 0)), spec.aggregate(A, 3, 5))


@_cases([(4, 10), (10, 4), (1, 7), (20, 7), (9, 100), (3, 5000)])
def test_round_values_are_the_numpy_fused_computation(kw: dict[str, Any], n: int, d: int) -> None:
    r, (offsets, coords, scales) = _round_and_plan(kw, n, d)
    q = _problem(n)
    rng = np.random.default_rng(d)
    x, y = rng.standard_normal(d), rng.standard_normal(d)
    for s, t in [(0, n), (n // 2, n), (0, n // 2), (n - 1, n)]:
        rows, cols = r.rows(s, t), r.coords(s, t)
        want = (q.local_grad_coords(x, rows, cols) - q.local_grad_coords(y, rows, cols)) * scales[rows]
        assert _same_bits(q.round_values(r, x, y, s, t), want)
        assert _same_bits(q.round_values(r, x, None, s, t), q.local_grad_coords(x, rows, cols) * scales[rows])
        # strided x and y
        assert _same_bits(q.round_values(r, np.repeat(x, 2)[::2], np.repeat(y, 2)[::2], s, t), want)
    # the full fused round: mean of all values is the numpy bincount of the simulator
    vals = q.round_values(r, x, y, 0, n)
    assert _same_bits(r.mean(vals), np.bincount(coords, weights=vals, minlength=d) / n)


@pytest.mark.parametrize("kw", SHARED, ids=_id)
def test_round_ahead_is_the_round(kw: dict[str, Any]) -> None:
    spec = _core.Spec(**kw)
    for n, d in [(4, 7), (20, 7), (3, 7)]:
        pending = spec.round_ahead(n, d, 8, 2)
        got, want = pending.wait(), spec.round(n, d, 8, 2)
        for a, b in [(got.offsets(), want.offsets()), (got.coords(0, n), want.coords(0, n)), (got.scales(), want.scales())]:
            assert _same_bits(a, b)
        with pytest.raises(ValueError, match=r"^wait: .*already"):
            pending.wait()
    # never waited: the thread finishes on its own (no crash, no hang)
    for rnd in range(4):
        spec.round_ahead(16, 7, 0, rnd)


def _python_ran_during(work: Callable[[], Callable[[], object]]) -> int:
    """How many steps the main thread's Python loop made while another thread ran ``work()()``.

    With a 30 s switch interval no thread is ever forced off the GIL within the test: the main
    loop can only run while the other thread has released the GIL of its own accord, so a call
    that holds the GIL gives exactly 0 (``sorted`` of a long list does), whatever the machine's
    speed; there is no timing threshold."""
    count, seen, stop = [0], {}, threading.Event()

    def other() -> None:
        call = work()
        seen["before"] = count[0]
        call()
        seen["after"] = count[0]
        stop.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        th = threading.Thread(target=other)
        th.start()
        while not stop.is_set():
            count[0] += 1
            time.sleep(0)  # hands the GIL back at once when the other thread wants it
        th.join()
    finally:
        sys.setswitchinterval(interval)
    return seen["after"] - seen["before"]


@pytest.mark.parametrize("kw", SPECS, ids=_id)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_compress_shifted_rows_reads_shared_rows_in_place(kw: dict[str, Any], dtype: type) -> None:
    """With rows, worker r's row of G is G[rows[r]] (workers sharing a row, as the autoencoder's
    workers share a split): the messages of G[rows] bit for bit, for a block of workers inside
    n, with and without H; a non-finite shared row makes it None; bad rows are refused by name."""
    spec = _core.Spec(**kw)
    n, d = 6, 7
    G, H = _data(3, d).astype(dtype), _data(n, d, seed=1).astype(dtype)
    rows = np.array([2, 0, 0, 1, 2, 2])
    for start, stop in [(0, n), (1, 4)]:
        r, h = rows[start:stop], H[start:stop]
        for hh, beta in ((h, 1.0), (h, 0.3), (None, 1.0)):
            want = spec.compress_shifted_rows(G[r], hh, beta, start, n, 9, 4)
            got = spec.compress_shifted_rows(G, hh, beta, start, n, 9, 4, r)
            assert got is not None and want is not None and all(_same_bits(a, b) for a, b in zip(got, want))
    G2 = G.copy()
    G2[1, 3] = np.nan
    assert spec.compress_shifted_rows(G2, H, 1.0, 0, n, 9, 4, rows) is None
    assert spec.compress_shifted_rows(G2, H[:1], 1.0, 0, n, 9, 4, rows[:1]) is not None  # worker 0 reads row 2 only
    with pytest.raises(ValueError, match=r"^rows: must index the 3 rows of G, got 3"):
        spec.compress_shifted_rows(G, H, 1.0, 0, n, 9, 4, np.array([0, 1, 2, 3, 0, 0]))
    with pytest.raises(ValueError, match=r"^rows: must be non-negative, got -1"):
        spec.compress_shifted_rows(G, H, 1.0, 0, n, 9, 4, np.array([0, 1, 2, -1, 0, 0]))
    with pytest.raises(ValueError, match=r"^H: must have one row per worker"):
        spec.compress_shifted_rows(G, H, 1.0, 0, n, 9, 4, rows[:4])


def test_compressor_compress_shifted_rows_takes_rows_for_every_compressor() -> None:
    """Compressor.compress_shifted_rows(G, H, rows=…) is the call on G[rows] bit for bit, for a
    Rust compressor and one written in Python (which gathers the rows itself); rows that are not
    integer indices of G's rows are refused before anything is computed."""

    G, H = _data(3, 9), _data(5, 9, seed=1)
    rows = [1, 1, 0, 2, 1]
    for comp in (permk.TopK(2), permk.RandK(3), PyTopK()):
        want = comp.compress_shifted_rows(G[rows], H, beta=0.5, start=2, n_workers=8, seed=1, round=2)
        got = comp.compress_shifted_rows(G, H, beta=0.5, start=2, n_workers=8, seed=1, round=2, rows=rows)
        assert got is not None and want is not None and all(_same_bits(a, b) for a, b in zip(got, want))
        for bad, exc, match in (([0, 1, 3, 0, 0], ValueError, "rows must index the 3 rows of G"), ([0, -1, 0, 0, 0], ValueError, "rows must index"),
                                ([0.0, 1.0, 0.0, 0.0, 0.0], TypeError, "rows must hold integer indices"), ([[0]], ValueError, "rows must be a 1-D"),
                                (np.array([0, 2**63 + 5, 0, 0, 0], dtype=np.uint64), ValueError, "rows holds 9223372036854775813, beyond any index")):
            with pytest.raises(exc, match=match):
                comp.compress_shifted_rows(G, H, start=0, n_workers=5, seed=0, round=0, rows=bad)


@pytest.mark.parametrize("kernel", ["round_ahead.wait", "round", "aggregate", "compress_shifted_rows"])
def test_long_kernels_release_the_gil(kernel: str) -> None:
    spec = _core.Spec("permk")
    a = np.ones((8, 1_000_000))
    topk = _core.Spec("topk", k=3)
    work: dict[str, Callable[[], Callable[[], object]]] = {
        "round_ahead.wait": lambda: spec.round_ahead(4, 4_000_000, 0, 1).wait,
        "round": lambda: lambda: spec.round(4, 4_000_000, 0, 1),
        "aggregate": lambda: lambda: spec.aggregate(a, 0, 0),
        "compress_shifted_rows": lambda: lambda: topk.compress_shifted_rows(a, a, 0.5, 0, 8, 0, 0),
    }
    assert _python_ran_during(work[kernel]) > 0


def test_the_gil_probe_sees_a_call_that_holds_the_gil() -> None:
    big = list(np.random.default_rng(0).random(2_000_000))
    assert _python_ran_during(lambda: lambda: sorted(big)) == 0


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda: _core.Spec("topk", k=1).round(3, 5, 0, 0), ValueError, r"^spec: .*shared plan.*TopK"),
        (lambda: _core.Spec("permk", quantizer="natural").round(3, 5, 0, 0), ValueError, r"^spec: .*shared plan.*natural"),
        (lambda: _core.Spec("topk", k=1).round_ahead(3, 5, 0, 0), ValueError, r"^spec: "),
        (lambda: _core.Spec("permk").round(0, 5, 0, 0), ValueError, r"^n_workers: "),
        (lambda: _core.Spec("randk", k=6).round(3, 5, 0, 0), ValueError, r"^k: "),
        (lambda: _core.Spec("permk").round(3, 5, 0, 0).coords(2, 1), ValueError, r"^start: "),
        (lambda: _core.Spec("permk").round(3, 5, 0, 0).rows(0, 4), ValueError, r"^stop: "),
        (lambda: _core.Spec("permk").round(3, 5, 0, 0).mean(np.zeros(4)), ValueError, r"^values: .*5 values"),
        (lambda: _core.Spec("permk").round(3, 5, 0, 0).mean(np.zeros(5, np.float32)), TypeError, "values"),
        (lambda: _core.Spec("permk").round(3, 5, 0, 0).mean(np.zeros((5, 1))), TypeError, "values"),
        (lambda: _core.Spec("permk").round(3, 5, 0, 0).gather(np.zeros((3, 4)), 0), ValueError, r"^a: .*columns"),
        (lambda: _core.Spec("permk").round(3, 5, 0, 0).gather(np.zeros((3, 5)), 1), ValueError, r"^a: .*rows"),
        (lambda: _core.Spec("permk").round(3, 5, 0, 0).gather(np.zeros((3, 5), np.int64), 0), TypeError, r"^a must be"),
        (lambda: _problem(3).round_values(_core.Spec("permk").round(3, 5, 0, 0), np.zeros(4), None, 0, 3), ValueError, r"^x: "),
        (lambda: _problem(3).round_values(_core.Spec("permk").round(3, 5, 0, 0), np.zeros(5), np.zeros(6), 0, 3), ValueError, r"^y: "),
        (lambda: _problem(3).round_values(_core.Spec("permk").round(3, 5, 0, 0), np.zeros(5), None, 2, 1), ValueError, r"^start: "),
        (lambda: _problem(3).round_values(_core.Spec("permk").round(3, 5, 0, 0), np.zeros(5), None, 0, 4), ValueError, r"^stop: "),
        (lambda: _problem(4).round_values(_core.Spec("permk").round(3, 5, 0, 0), np.zeros(5), None, 0, 3), ValueError, r"^round: "),
    ],
)
def test_round_rejects_bad_input(call: Callable[[], Any], exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        call()


def test_round_non_finite_values_propagate() -> None:
    r = _core.Spec("blockpermk", m=2).round(4, 6, 0, 0)
    v = np.ones(r.offsets()[-1])
    v[0] = np.nan
    v[-1] = np.inf
    m = r.mean(v)
    assert np.isnan(m).any() and np.isinf(m).any()
    A = np.ones((4, 6))
    A[1, 2] = np.nan
    assert np.isnan(r.gather(A, 0)).sum() == (1 if 2 in r.coords(1, 2) else 0)


# ------------------------------------------------------------------------------------------
# Round options: divide= and out= (one pass, into a reused buffer)
# ------------------------------------------------------------------------------------------


def _awkward(n: int, d: int, seed: int = 0) -> np.ndarray:
    """Values with signed zeros (-0.0 among them), subnormals and large ones."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, d)) * 10.0 ** rng.integers(-3, 4, (n, d))
    a.flat[::5] = -0.0
    a.flat[1::7] = 0.0
    a.flat[2::11] = -3e-310
    return a


def _divided(g: np.ndarray, k: int) -> np.ndarray:
    """numpy's ``(g + 0.0) / k`` (in ``g``'s dtype)."""
    return (g + 0.0) / k


def _neg_zero(v: np.ndarray) -> np.ndarray:
    return (v == 0) & np.signbit(v)


@_cases(SHAPES)
def test_round_gather_divide_and_out_are_the_numpy_composition(kw: dict[str, Any], n: int, d: int) -> None:
    r, (offsets, _, _) = _round_and_plan(kw, n, d)
    A = _awkward(n, d, n * d)
    for dtype in (np.float64, np.float32):
        for a in (np.ascontiguousarray(A, dtype=dtype), np.asfortranarray(A, dtype=dtype)):
            for s, t in [(0, n), (n // 2, n), (n - 1, n), (0, 0)]:
                g = r.gather(a[s:t], s)
                assert _same_bits(r.gather(a[s:t], s, divide=None, out=None), g)
                for k in (1, 2, 3, 4, 7, n, np.int64(5), 2**53):
                    want = _divided(g, int(k))
                    assert want.dtype == dtype
                    assert _same_bits(r.gather(a[s:t], s, divide=k), want), (dtype, s, t, k)
                    buf = np.full(offsets[t] - offsets[s], np.nan, dtype=dtype)
                    got = r.gather(a[s:t], s, divide=k, out=buf)
                    assert got is buf and _same_bits(buf, want), (dtype, s, t, k)
                    # -0.0 values become +0.0, as in the worker-order sum from zero
                    assert not _neg_zero(buf[_neg_zero(g)]).any()
                buf = np.full(offsets[t] - offsets[s], np.nan, dtype=dtype)
                assert r.gather(a[s:t], s, out=buf) is buf and _same_bits(buf, g)
    # the mean into a buffer: the same bits, for any values (signed zeros, subnormals, NaN)
    values = _awkward(1, int(offsets[-1]), 7)[0]
    if values.size:
        values[values.size // 2] = np.nan
    for fill in (np.nan, -0.0, 1.0):
        buf = np.full(d, fill)
        assert r.mean(values, out=buf) is buf
        assert _same_bits(buf, r.mean(values))
    buf = np.empty(d)
    assert _same_bits(r.mean(np.repeat(values, 2)[::2], out=buf), r.mean(values))
    # a disjoint round: the divided values placed at their coordinates are the mean
    if r.disjoint:
        placed = np.zeros(d)
        placed[r.coords(0, n)] = r.gather(A, 0, divide=n)
        assert _same_bits(placed, r.mean(r.gather(A, 0)))


@_cases(SHAPES + [(4, 300_001)])
def test_round_place_is_the_disjoint_mean(kw: dict[str, Any], n: int, d: int) -> None:
    """Round.place: a disjoint round's values (gather(..., divide=n)) received in padded slots
    (pads never read) and placed are mean's average bit for bit, float64 and float32; a round
    that is not disjoint is refused."""
    if d > 10_000 and kw["sparsifier"] != "permk":
        return
    r, (offsets, _, _) = _round_and_plan(kw, n, d)
    w = r.max_count
    assert w == int(np.diff(offsets).max())
    A = _awkward(n, d, 11)
    for dtype in (np.float64, np.float32):
        a = A.astype(dtype)
        vals = r.gather(a, 0, divide=n)
        for width in (max(w, 1), w + 2):
            recv = np.full(n * width, np.nan, dtype=dtype)
            for i in range(n):
                recv[i * width : i * width + offsets[i + 1] - offsets[i]] = vals[offsets[i] : offsets[i + 1]]
            out = np.full(d, 7.0, dtype=dtype)
            if not r.disjoint:
                with pytest.raises(ValueError, match=r"^round: .*disjoint"):
                    r.place(recv, width, out)
                assert (out == 7.0).all()
                return
            assert r.place(recv, width, out) is out
            want = np.zeros(d, dtype=dtype)
            want[r.coords(0, n)] = vals
            assert _same_bits(out, want), (dtype, width)
            if dtype == np.float64:
                assert _same_bits(out, r.mean(r.gather(A, 0)))


def test_round_place_checks_before_writing() -> None:
    """Round.place's hostile inputs: each a ValueError or TypeError naming the argument, and
    ``out`` untouched."""
    r = _core.Spec("permk").round(4, 10, 0, 0)  # counts 3, 3, 2, 2
    assert r.max_count == 3
    ok = np.ones(12)
    cases: list[tuple[Any, int, Any, type[Exception], str]] = [
        (np.ones(8), 2, np.zeros(10), ValueError, r"^width: "),  # a slot narrower than a message
        (np.ones(11), 3, np.zeros(10), ValueError, r"^recv: "),  # not n * width values
        (np.ones(0), 2**63, np.zeros(10), ValueError, r"^width: "),  # n * width overflows
        (ok, 3, np.zeros(9), ValueError, r"^out: "),
        (ok, 3, np.zeros(10, np.float32), ValueError, r"^out: must have dtype"),
        (ok, 3, np.zeros((2, 5)), ValueError, r"^out: "),
        (ok, 3, np.zeros(20)[::2], ValueError, r"^out: must be C-contiguous"),
        (ok, 3, [0.0] * 10, TypeError, r"^out: must be a numpy array"),
        (ok.astype(np.int64), 3, np.zeros(10), TypeError, r"^recv must be"),
        (np.ones(24)[::2], 3, np.zeros(10), ValueError, r"^recv: must be C-contiguous"),
    ]
    for recv, width, out, exc, match in cases:
        before = np.array(out, copy=True)
        with pytest.raises(exc, match=match):
            r.place(recv, width, out)
        assert np.array_equal(np.asarray(out), before)
    ro = np.zeros(10)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"^out: must be writeable"):
        r.place(ok, 3, ro)
    with pytest.raises(OverflowError):
        r.place(ok, -1, np.zeros(10))
    shared = np.zeros(22)
    with pytest.raises(ValueError, match=r"^out: must not share memory with recv"):
        r.place(shared[:12], 3, shared[11:21])
    with pytest.raises(ValueError, match=r"^out: must not share memory with recv"):
        r.place(shared[:12], 3, shared[2:12])


def test_round_gather_minus_zero_is_plus_zero() -> None:
    r = _core.Spec("blockpermk", m=2).round(2, 8, 0, 0)
    a = np.full((2, 8), -0.0)
    assert np.signbit(r.gather(a, 0)).all()  # the values themselves are passed on
    for k in (1, 2, 3):
        v = r.gather(a, 0, divide=k)
        assert not np.signbit(v).any() and (v == 0).all()
        assert _same_bits(v, _divided(r.gather(a, 0), k))
    assert _same_bits(r.gather(a.astype(np.float32), 0, divide=3), np.zeros(8, np.float32))


@_cases([(4, 10), (10, 4), (1, 7), (20, 7), (9, 100), (3, 5000)])
def test_round_values_divide_and_out_are_the_numpy_composition(kw: dict[str, Any], n: int, d: int) -> None:
    r, (offsets, _, _) = _round_and_plan(kw, n, d)
    q = _problem(n)
    rng = np.random.default_rng(d)
    x, y = rng.standard_normal(d), rng.standard_normal(d)
    x[::3] = y[::3]  # some differences are exactly zero (and -0.0 after the scale)
    for s, t in [(0, n), (n // 2, n), (n - 1, n)]:
        for yy in (y, None):
            v = q.round_values(r, x, yy, s, t)
            for k in (1, 2, 3, n, 2**53):
                want = _divided(v, k)
                assert _same_bits(q.round_values(r, x, yy, s, t, divide=k), want)
                buf = np.full(offsets[t] - offsets[s], np.nan)
                assert q.round_values(r, x, yy, s, t, divide=k, out=buf) is buf
                assert _same_bits(buf, want)
            buf = np.full(offsets[t] - offsets[s], np.nan)
            assert q.round_values(r, x, yy, s, t, out=buf) is buf and _same_bits(buf, v)
            # strided x, y
            buf2 = np.empty_like(buf)
            y2 = None if yy is None else np.repeat(yy, 2)[::2]
            assert _same_bits(q.round_values(r, np.repeat(x, 2)[::2], y2, s, t, divide=n, out=buf2), _divided(v, n))


_BadCase = tuple[str, Callable[[np.ndarray], Any], Callable[[], np.ndarray], type[Exception], str]


def _with_divide(call: Callable[..., Any], k: Any) -> Callable[[np.ndarray], Any]:
    return lambda b: call(b, divide=k)


def _bad_out_cases() -> list[_BadCase]:
    """(id, call with the buffer, buffer factory, exception, message) for every bad divide/out."""
    r = _core.Spec("permk").round(3, 5, 0, 0)  # 5 values in all, d = 5
    blk = _core.Spec("blockpermk", m=2).round(2, 10, 0, 0)  # 5 values per worker
    q = _problem(3)
    a = np.arange(15.0).reshape(3, 5)
    a32 = a.astype(np.float32)
    x, y = np.ones(5), np.zeros(5)
    v = np.ones(5)
    def f64(m: int = 5) -> np.ndarray:
        return np.full(m, 7.0)

    def f32() -> np.ndarray:
        return np.full(5, 7.0, np.float32)

    cases: list[_BadCase] = []
    # each call with the buffer it is handed (the one checked untouched afterwards)
    calls: list[tuple[str, Callable[..., Any], Callable[[], np.ndarray]]] = [
        ("gather", lambda b, **kw: r.gather(a, 0, out=b, **kw), f64),
        ("gather32", lambda b, **kw: r.gather(a32, 0, out=b, **kw), f32),
        ("round_values", lambda b, **kw: q.round_values(r, x, y, 0, 3, out=b, **kw), f64),
    ]
    divisors: list[tuple[Any, type[Exception], str]] = [
            (0, ValueError, r"^divide: must be an integer in \[1, 2\*\*53\], got 0"),
            (-2, ValueError, r"^divide: .*got -2"),
            (2**53 + 1, ValueError, r"^divide: "),
            (2**64, ValueError, r"^divide: "),
            (2.0, TypeError, r"^divide: must be an int"),
            (np.float64(2), TypeError, r"^divide: must be an int"),
            (True, TypeError, r"^divide: must be an int"),
        ("2", TypeError, r"^divide: must be an int"),
    ]
    for name, call, make in calls:
        for k, exc, msg in divisors:
            cases.append((f"{name}-divide={k!r}", _with_divide(call, k), make, exc, msg))
    bad_outs: list[tuple[str, Callable[[], np.ndarray], type[Exception], str]] = [
        ("short", lambda: f64(4), ValueError, r"^out: must have the 5 values of workers 0\.\.3"),
        ("long", lambda: f64(6), ValueError, r"^out: must have the 5 values"),
        ("empty", lambda: f64(0), ValueError, r"^out: must have the 5 values"),
        ("float32", lambda: f64().astype(np.float32), ValueError, r"^out: must have dtype float64"),
        ("int64", lambda: np.full(5, 7, np.int64), ValueError, r"^out: must have dtype float64"),
        ("2-D", lambda: np.full((1, 5), 7.0), ValueError, r"^out: must be a 1-D array"),
        ("strided", lambda: f64(10)[::2], ValueError, r"^out: must be C-contiguous"),
        ("reversed", lambda: f64()[::-1], ValueError, r"^out: must be C-contiguous"),
        ("read-only", lambda: _readonly(f64()), ValueError, r"^out: must be writeable"),
        ("big-endian", lambda: f64().astype(">f8"), ValueError, r"^out: must have dtype float64"),
    ]
    for bid, make, bad, msg in bad_outs:
        cases.append((f"gather-out-{bid}", lambda b: r.gather(a, 0, divide=3, out=b), make, bad, msg))
        cases.append((f"round_values-out-{bid}", lambda b: q.round_values(r, x, y, 0, 3, divide=3, out=b), make, bad, msg))
        cases.append((f"mean-out-{bid}", lambda b: r.mean(v, out=b), make, bad, _mean_msg(msg)))
    cases += [
        ("gather32-out-float64", lambda b: r.gather(a32, 0, out=b), f64, ValueError, r"^out: must have dtype float32 \(a's dtype\), got float64"),
        ("gather-out-list", lambda b: r.gather(a, 0, out=_as_list(b)), f64, TypeError, r"^out: must be a numpy array"),
        ("mean-out-list", lambda b: r.mean(v, out=_as_list(b)), f64, TypeError, r"^out: must be a numpy array"),
        ("round_values-out-list", lambda b: q.round_values(r, x, y, 0, 3, out=_as_list(b)), f64, TypeError, r"^out: must be a numpy array"),
        # the other arguments are checked too before writing
        ("gather-bad-a", lambda b: r.gather(np.zeros((3, 4)), 0, divide=2, out=b), f64, ValueError, r"^a: "),
        ("gather-bad-start", lambda b: blk.gather(np.zeros((2, 10)), 1, divide=2, out=b), f64, ValueError, r"^a: .*rows"),
        ("mean-bad-values", lambda b: r.mean(np.ones(4), out=b), f64, ValueError, r"^values: "),
        ("round_values-bad-x", lambda b: q.round_values(r, np.ones(4), None, 0, 3, out=b), f64, ValueError, r"^x: "),
        ("round_values-bad-stop", lambda b: q.round_values(r, x, None, 0, 4, out=b), f64, ValueError, r"^stop: "),
    ]
    return cases


def _as_list(b: np.ndarray) -> Any:
    """``b`` as a list (not an array: a wrong type for ``out``)."""
    return list(b)


def _mean_msg(msg: str) -> str:
    """The message of a bad ``out`` of ``mean`` (whose length is ``d``)."""
    return r"^out: must have the round's d = 5 coordinates" if "the 5 values" in msg else msg


def _readonly(b: np.ndarray) -> np.ndarray:
    b.flags.writeable = False
    return b


_BAD_OUT = _bad_out_cases()


@pytest.mark.parametrize("call,make,exc,match", [c[1:] for c in _BAD_OUT], ids=[c[0] for c in _BAD_OUT])
def test_round_bad_divide_or_out_raise_before_writing(call: Callable[[np.ndarray], Any], make: Callable[[], np.ndarray], exc: type, match: str) -> None:
    buf = make()
    root = buf if buf.base is None else buf.base  # all of a view's memory
    before = np.array(root, copy=True)
    with pytest.raises(exc, match=match):
        call(buf)
    assert _same_bits(root, before)  # untouched


def test_round_out_must_not_share_memory_with_the_inputs() -> None:
    r = _core.Spec("identity").round(2, 6, 0, 0)  # 6 values per worker
    q = _problem(2)
    a = np.arange(12.0).reshape(2, 6)
    base = np.arange(24.0)
    for out, inp in [
        (a[1], a),  # a row of a itself
        (base[3:9], base[:12].reshape(2, 6)),  # a partial overlap
        # within a strided a's bounds but on no element of it: refused too, as by
        # np.may_share_memory (bounds), though np.shares_memory would say no
        (base[13:19], base.reshape(2, 12)[:, ::2]),
    ]:
        assert np.may_share_memory(out, inp[1:])
        before = out.copy()
        with pytest.raises(ValueError, match=r"^out: must not share memory with a"):
            r.gather(inp[1:], 1, out=out)
        with pytest.raises(ValueError, match=r"^out: must not share memory with a"):
            r.gather(inp[1:], 1, divide=2, out=out)
        assert _same_bits(out, before)
    # a Fortran-ordered a: its memory spans both rows
    f = np.asfortranarray(np.arange(12.0).reshape(2, 6))
    with pytest.raises(ValueError, match=r"^out: must not share memory with a"):
        r.gather(f[1:], 1, out=f.reshape(-1, order="A")[3:9])
    # disjoint parts of one buffer are fine
    ok = base[12:18]
    assert r.gather(base[:6].reshape(1, 6), 1, divide=2, out=ok) is ok
    assert _same_bits(ok, _divided(base[:6], 2))
    # round_values: not x, not y
    p = _core.Spec("permk").round(2, 6, 0, 0)  # 6 values in all, d = 6
    x, y = np.arange(6.0), np.ones(6)
    for out, name in [(x, "x"), (y, "y")]:
        before = out.copy()
        with pytest.raises(ValueError, match=rf"^out: must not share memory with {name}"):
            q.round_values(p, x, y, 0, 2, divide=2, out=out)
        assert _same_bits(out, before)
    # mean: not values
    vals = np.arange(6.0)
    with pytest.raises(ValueError, match=r"^out: must not share memory with values"):
        p.mean(vals, out=vals)
    with pytest.raises(ValueError, match=r"^out: must not share memory with values"):
        p.mean(base[:12:2], out=base[6:12])
    assert _same_bits(vals, np.arange(6.0))


def test_round_options_do_not_depend_on_the_thread_count() -> None:
    before = _core.get_num_threads()
    n, d = 3, 400_000
    A = _awkward(n, d, 1)
    q = _problem(n)
    x, y = A[0].copy(), A[1].copy()
    rounds = [
        _core.Spec("blockpermk", m=2).round(2, 2 * d, 1, 2),  # one worker: one block of 400 000 values
        _core.Spec("identity").round(n, d, 1, 2),
        _core.Spec("randk", k=300_000).round(n, d, 1, 2),
        _core.Spec("permk").round(n, d, 1, 2),
    ]
    probs = [_problem(2), q, q, q]
    data = [np.concatenate([A[:2], A[1::-1]], axis=1), A, A, A]
    xs = [(np.tile(x, 2), np.tile(y, 2)), (x, y), (x, y), (x, y)]

    def run() -> list[np.ndarray]:
        out = []
        for r, p, a, (xx, yy) in zip(rounds, probs, data, xs):
            off = r.offsets()
            b = np.full(off[1], np.nan)
            out.append(r.gather(a[:1], 0, divide=r.n, out=b).copy())
            b = np.full(off[-1], np.nan)
            out.append(r.gather(a[: r.n], 0, divide=3, out=b).copy())
            out.append(r.gather(a[: r.n], 0))
            b = np.full(off[1], np.nan)
            out.append(p.round_values(r, xx, yy, 0, 1, divide=r.n, out=b).copy())
            m = np.full(r.d, np.nan)
            out.append(r.mean(np.asarray(r.gather(a[: r.n], 0), dtype=np.float64), out=m).copy())
        return out

    try:
        results = []
        for k in (1, 2, 3):
            _core.set_num_threads(k)
            results.append(run())
        for other in results[1:]:
            assert all(_same_bits(u, v) for u, v in zip(results[0], other))
        # and they are the numpy compositions
        r, a = rounds[0], data[0]
        assert _same_bits(results[0][0], _divided(r.gather(a[:1], 0), 2))
        assert _same_bits(results[0][3], _divided(probs[0].round_values(r, xs[0][0], xs[0][1], 0, 1), 2))
    finally:
        _core.set_num_threads(before)


# ------------------------------------------------------------------------------------------
# Allocations the machine cannot hold are refused before they happen
# ------------------------------------------------------------------------------------------

_REFUSALS = {
    "permk_plan_from_permutations": ("_core.permk_plan_from_permutations(1, 10**12, [0], [0])", "ValueError", "pi_d: must be a permutation"),
    "randk plan": ('_core.Spec("randk", k=1).plan(2**32 - 1, 10, 0, 0)', "MemoryError", "Unable to allocate"),
    "permk compress_all broadcast": (
        '_core.Spec("permk").compress_all(np.broadcast_to(np.ones((1, 1)), (10**5, 10**6)), 0, 0)',
        "MemoryError",
        "Unable to allocate 745 GiB for the compressed rows with shape (100000, 1000000) and data type float64",
    ),
    "permk plan": ('_core.Spec("permk").plan(2**31, 2**32 - 1, 0, 0)', "MemoryError", "Unable to allocate"),
    "local_grads": (
        "_core.Tridiagonal([0.25] * 10**5, 0.1, [0.0] * 10**5).local_grads(np.zeros(10**6))",
        "MemoryError",
        "Unable to allocate 745 GiB for the local gradients with shape (100000, 1000000) and data type float64",
    ),
    "loss of empty x": ("_core.Tridiagonal([0.25], 0.1, [0.0]).loss(np.zeros(0))", "ValueError", "x: must have at least one"),
    "grad of empty x": ("_core.Tridiagonal([0.25], 0.1, [0.0]).grad(np.zeros(0))", "ValueError", "x: must have at least one"),
    "local_grads of empty x": ("_core.Tridiagonal([0.25], 0.1, [0.0]).local_grads(np.zeros(0))", "ValueError", "x: must have at least one"),
    "solve_mean([])": ("_core.Tridiagonal([0.25], 0.1, [0.0]).solve_mean([])", "ValueError", "rhs: must have at least one"),
    "identity plan": ('_core.Spec("identity").plan(2**32 - 1, 2**32 - 1, 0, 0)', "MemoryError", "Unable to allocate"),
    "compress_rows broadcast": (
        '_core.Spec("identity").compress_rows(np.broadcast_to(np.ones((1, 1)), (10**5, 10**6)), 0, 10**5, 0, 0)',
        "MemoryError",
        "Unable to allocate",
    ),
    "permutation": ("_core.permutation(0, 0, 2**60)", "MemoryError", "Unable to allocate 8 EiB for the permutation"),
    "round": ('_core.Spec("permk").round(2**31, 2**32 - 1, 0, 0)', "MemoryError", "Unable to allocate"),
    "round_ahead": ('_core.Spec("identity").round_ahead(2**32 - 1, 2**32 - 1, 0, 0)', "MemoryError", "Unable to allocate 32 GiB for the round's offsets"),
    "round coords": (
        '_core.Spec("identity").round(10**5, 10**6, 0, 0).coords(0, 10**5)',
        "MemoryError",
        "Unable to allocate 745 GiB for the round's coordinates with shape (100000000000,) and data type int64",
    ),
    "round gather": (
        '_core.Spec("identity").round(10**5, 10**6, 0, 0).gather(np.broadcast_to(np.ones((1, 1)), (10**5, 10**6)), 0)',
        "MemoryError",
        "Unable to allocate 745 GiB for the gathered values",
    ),
    "round_values": (
        '_core.Tridiagonal([0.25] * 10**5, 0.1, [0.0] * 10**5).round_values(_core.Spec("identity").round(10**5, 10**6, 0, 0), np.zeros(10**6), None, 0, 10**5)',
        "MemoryError",
        "Unable to allocate 745 GiB for the round's values",
    ),
}


@pytest.mark.parametrize("name", list(_REFUSALS))
def test_oversized_or_empty_calls_raise_instead_of_aborting(name: str) -> None:
    """Each call runs in a subprocess (an abort or a panic would kill it, not pytest) whose
    address space is capped at 8 GiB: the refusals must come before any large allocation, in
    well under the timeout."""
    expr, exc, message = _REFUSALS[name]
    script = textwrap.dedent(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
        import numpy as np
        from permk import _core
        try:
            {expr}
        except Exception as e:
            print(type(e).__name__ + ": " + str(e))
            sys.exit(0)
        print("no exception")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stdout}{proc.stderr}"
    assert proc.stdout.startswith(f"{exc}: "), proc.stdout + proc.stderr
    assert message in proc.stdout, proc.stdout


def _split_grads_numpy(zwa: np.ndarray, gram: np.ndarray, dec: np.ndarray, reg_d: np.ndarray, reg_e: np.ndarray, cs: np.ndarray,
                       rs: np.ndarray) -> np.ndarray:
    """The split gradients of rust/src/autoencoder.rs by numpy, in float64 (products and Gram
    matrices converted first; D·Z_sᵀZ_s summed over l in order, one rounding per operation)."""
    b, two, d_f = zwa.shape
    d_e = two // 2
    a, g = zwa.astype(np.float64), gram.astype(np.float64)
    dg = np.zeros((b, d_f, d_e))
    for l in range(d_e):
        dg = dg + dec[None, :, l, None] * g[:, None, l, :]
    c, r = cs[:, None, None], rs[:, None, None]
    out = np.empty((b, 2 * d_f * d_e))
    out[:, : d_f * d_e] = (c * (dg - a[:, :d_e].transpose(0, 2, 1)) + r * reg_d).reshape(b, -1)
    out[:, d_f * d_e :] = (c * a[:, d_e:] + r * reg_e).reshape(b, -1)
    return out


def _autoencoder_block(dtype: type, b: int, d_f: int, d_e: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    return (rng.standard_normal((b, 2 * d_e, d_f)).astype(dtype), rng.standard_normal((b, d_e, d_e)).astype(dtype),
            rng.standard_normal((d_f, d_e)) * np.logspace(-3, 3, d_e), rng.standard_normal((d_f, d_e)), rng.standard_normal((d_e, d_f)),
            rng.uniform(0.1, 2.0, b), rng.uniform(0.5, 3.0, b))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(1, 3, 2), (7, 37, 5), (30, 64, 16)], ids=str)
def test_autoencoder_split_grads_are_the_formulas(dtype: type, shape: tuple[int, int, int]) -> None:
    """_core.autoencoder_split_grads writes the bits of the formulas computed by numpy in
    float64, into rows of a larger array too, the same on one thread; bad shapes and dtypes
    are refused by name before anything is written."""
    b, d_f, d_e = shape
    zwa, gram, dec, reg_d, reg_e, cs, rs = args = _autoencoder_block(dtype, b, d_f, d_e)
    want = _split_grads_numpy(*args)
    big = np.full((b + 2, 2 * d_f * d_e), np.nan)
    _core.autoencoder_split_grads(*args, big[1 : b + 1])
    assert _same_bits(big[1 : b + 1], want)
    assert np.isnan(big[[0, -1]]).all()
    before = _core.get_num_threads()
    try:
        _core.set_num_threads(1)
        one = np.empty_like(want)
        _core.autoencoder_split_grads(*args, one)
    finally:
        _core.set_num_threads(before)
    assert _same_bits(one, want)
    out = np.zeros((b, 2 * d_f * d_e))
    other = np.float64 if dtype is np.float32 else np.float32
    for bad, exc, match in (
        ((zwa, gram[:, :, :-1], dec, reg_d, reg_e, cs, rs), ValueError, "^gram: "),
        ((zwa, gram, dec[:-1], reg_d, reg_e, cs, rs), ValueError, "^dec: "),
        ((zwa, gram, dec, reg_d, reg_e.T.copy() if d_e != d_f else reg_e[:, :-1], cs, rs), ValueError, "^reg_e: "),
        ((zwa, gram, dec, reg_d[:-1], reg_e, cs, rs), ValueError, "^reg_d: "),
        ((zwa, gram, dec, reg_d, reg_e, np.ones(b + 1), rs), ValueError, "^cs: "),
        ((zwa, gram, dec, reg_d, reg_e, cs, rs[:-1]), ValueError, "^rs: "),
        ((zwa, gram.astype(other), dec, reg_d, reg_e, cs, rs), TypeError, "both float64 or both float32"),
        ((zwa, gram, dec.astype(np.float32), reg_d, reg_e, cs, rs), TypeError, "^dec must be a 2-D float64"),
        ((zwa, gram, dec, reg_d.astype(np.float32), reg_e, cs, rs), TypeError, "^reg_d must be a 2-D float64"),
        ((zwa, gram, dec, reg_d, reg_e, cs.astype(np.float32), rs), TypeError, "^cs must be a 1-D float64"),
        ((zwa, np.asfortranarray(gram), dec, reg_d, reg_e, cs, rs), ValueError, "^gram: .*contiguous"),
    ):
        with pytest.raises(exc, match=match):
            _core.autoencoder_split_grads(*bad, out)  # type: ignore[arg-type]
        assert not out.any()
    read_only = np.zeros_like(out)
    read_only.flags.writeable = False
    for bad_out in (out.astype(np.float32), read_only):
        with pytest.raises(TypeError, match="^out must be a writeable 2-D float64"):
            _core.autoencoder_split_grads(*args, bad_out)
    with pytest.raises(ValueError, match="^out: "):
        _core.autoencoder_split_grads(*args, np.zeros((b, 2 * d_f * d_e + 1)))
    with pytest.raises(ValueError, match="^out: .*contiguous"):
        _core.autoencoder_split_grads(*args, np.zeros((b, 4 * d_f * d_e))[:, ::2])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(3, 7, 2), (30, 64, 16)], ids=str)
def test_autoencoder_shifted_messages_are_the_compressed_shifted_rows(dtype: type, shape: tuple[int, int, int]) -> None:
    """_core.autoencoder_shifted_messages gives Spec.compress_shifted_rows' messages on the
    rows autoencoder_split_grads writes, bit for bit (TopK, RandK, TopK + natural; β = 1, 0.3,
    no H; a block of workers inside n), None for a non-finite input, and refuses bad H."""
    b, d_f, d_e = shape
    args = _autoencoder_block(dtype, b, d_f, d_e)
    G = np.empty((b, 2 * d_f * d_e))
    _core.autoencoder_split_grads(*args, G)
    H = 0.5 * G + np.random.default_rng(1).standard_normal(G.shape)
    for spec in (_core.Spec("topk", k=5), _core.Spec("randk", k=9), _core.Spec("topk", quantizer="natural", k=3)):
        for start, n in ((0, b), (4, b + 9)):
            for Hb, beta in ((H, 1.0), (H, 0.3), (None, 1.0)):
                want = spec.compress_shifted_rows(G, Hb, beta, start, n, 3, 2)
                got = _core.autoencoder_shifted_messages(spec, *args, Hb, beta, start, n, 3, 2)
                assert want is not None and got is not None
                for w, g in zip(want, got):
                    assert _same_bits(g, w)
    spec = _core.Spec("topk", k=2)
    Hn = H.copy()
    Hn[b - 1, 5] = np.nan
    assert _core.autoencoder_shifted_messages(spec, *args, Hn, 1.0, 0, b, 0, 0) is None
    for bad, exc, match in ((H.astype(np.int64), TypeError, "^H must be a 2-D float64"), (H[:-1], ValueError, "^H: "),
                            (np.asfortranarray(H) if b > 1 else H[:, ::2], ValueError, "^H: ")):
        with pytest.raises(exc, match=match):
            _core.autoencoder_shifted_messages(spec, *args, bad, 1.0, 0, b, 0, 0)
    with pytest.raises(ValueError, match="^beta: "):
        _core.autoencoder_shifted_messages(spec, *args, H, float("inf"), 0, b, 0, 0)
    with pytest.raises(ValueError, match="^start: "):
        _core.autoencoder_shifted_messages(spec, *args, H, 1.0, 1, b, 0, 0)


def test_row_dots_are_the_rows_dot_products_in_float64() -> None:
    """_core.row_dots(x, ix, y, iy)[i] = x[ix[i]] · y[iy[i]] with float64 sums (float32 rows
    too), the same for any thread count; bad indices and mixed dtypes are refused by name."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((40, 61)), rng.standard_normal((9, 61))
    ix, iy = rng.integers(0, 40, 10_000), rng.integers(0, 9, 10_000)
    want = np.einsum("ia,ia->i", x[ix], y[iy])
    got = _core.row_dots(x, ix, y, iy)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    x32, y32 = x.astype(np.float32), y.astype(np.float32)
    np.testing.assert_allclose(_core.row_dots(x32, ix, y32, iy), np.einsum("ia,ia->i", x32[ix].astype(np.float64), y32[iy]), rtol=1e-13,
                               atol=1e-13)
    before = _core.get_num_threads()
    try:
        _core.set_num_threads(1)
        np.testing.assert_array_equal(_core.row_dots(x, ix, y, iy), got)
    finally:
        _core.set_num_threads(before)
    with pytest.raises(ValueError, match="ix"):
        _core.row_dots(x, np.array([40]), y, np.array([0]))
    with pytest.raises(ValueError, match="iy"):
        _core.row_dots(x, np.array([0, 1]), y, np.array([0]))
    with pytest.raises(TypeError, match="same dtype"):
        _core.row_dots(x, ix, y32, iy)


_NON_FINITE = [float("nan"), float("inf"), float("-inf")]


@pytest.mark.parametrize("v", _NON_FINITE)
@pytest.mark.parametrize("arg", ["coef", "beta", "alpha"])
@pytest.mark.parametrize("into_out", [False, True])
def test_round_values_refuses_non_finite_coefficients_before_writing(arg: str, v: float, into_out: bool) -> None:
    """round_values/round_mean with a shift: a non-finite coef, beta or alpha is a ValueError
    naming it, and neither H nor out is written (alpha=nan used to put NaN into H)."""
    q = _core.Tridiagonal([1.0, 2.0, 3.0], 0.1, [1.0, 2.0, 3.0])
    r = _core.Spec("permk").round(3, 5, 0, 0)
    x, y = np.ones(5), np.zeros(5)
    kw: dict[str, Any] = {"coef": 1.0, "beta": 1.0, "alpha": 0.5, arg: v}
    H = np.ones((3, 5))
    out = np.full(len(r.coords(0, 3)), 7.0) if into_out else None
    with pytest.raises(ValueError, match=f"^{arg}: must be finite"):
        q.round_values(r, x, y, 0, 3, H=H, out=out, **kw)
    with pytest.raises(ValueError, match=f"^{arg}: must be finite"):
        q.round_mean(r, x, y, H=H, **kw)
    if arg != "alpha":  # the read-only shift, without alpha
        kw.pop("alpha")
        with pytest.raises(ValueError, match=f"^{arg}: must be finite"):
            q.round_values(r, x, y, 0, 3, H=H, out=out, **kw)
        with pytest.raises(ValueError, match=f"^{arg}: must be finite"):
            q.round_mean(r, x, y, H=H, **kw)
    np.testing.assert_array_equal(H, np.ones((3, 5)))
    if out is not None:
        np.testing.assert_array_equal(out, 7.0)


@pytest.mark.parametrize("v", _NON_FINITE)
@pytest.mark.parametrize("arg", ["coef", "beta", "b", "p", "w"])
def test_dasha_pp_values_refuses_non_finite_scalars_before_writing(arg: str, v: float) -> None:
    """dasha_pp_values: coef, beta, b, w must be finite and p in (0, 1]; a ValueError naming
    the argument, H and G unchanged (b=nan or w=inf used to make them non-finite)."""
    q = _core.Tridiagonal([1.0, 2.0, 3.0], 0.1, [1.0, 2.0, 3.0])
    r = _core.Spec("permk").round(3, 5, 0, 0)
    H, G = np.ones((3, 5)), np.zeros((3, 5))
    kw: dict[str, Any] = {"coef": 1.0, "beta": 1.0, "b": 0.5, "p": 0.5, "w": 1.0, arg: v}
    with pytest.raises(ValueError, match=f"^{arg}: must "):
        q.dasha_pp_values(r, np.ones(5), np.zeros(5), 0, 3, H=H, G=G, rows=np.array([0, 1, 2]), **kw)
    np.testing.assert_array_equal(H, np.ones((3, 5)))
    np.testing.assert_array_equal(G, np.zeros((3, 5)))


@pytest.mark.parametrize("factor", [*_NON_FINITE, 0.0, -1.0, 1e308])
def test_restricted_refuses_a_factor_that_is_not_a_positive_finite_scale(factor: float) -> None:
    """Round.restricted: the factor must be positive and finite and keep every scale finite
    (1e308 times PermK's scale 3 overflows; nan and inf used to give nan/inf scales)."""
    r = _core.Spec("permk").round(3, 5, 0, 0)
    with pytest.raises(ValueError, match="^factor: "):
        r.restricted(np.array([0, 1]), factor)
    np.testing.assert_array_equal(r.restricted(np.array([0, 1]), 1.5).scales(), r.scales() * 1.5)


@pytest.mark.parametrize("p", [*_NON_FINITE, 2.0, 1.0 + 2**-52, -0.5])
def test_coin_refuses_what_is_not_a_probability(p: float) -> None:
    with pytest.raises(ValueError, match=r"^p: must be a probability in \[0, 1\]"):
        _core.coin(0, 0, p)
    assert _core.coin(0, 0, 1.0) is True
    assert _core.coin(0, 0, 0.0) is False


def test_tridiagonal_names_its_non_finite_coefficient_and_solve_mean_refuses_a_singular_system() -> None:
    for args, name in ((([1.0, np.nan], 0.1, [0.0, 0.0]), "a"), (([1.0, 2.0], np.inf, [0.0, 0.0]), "c"),
                       (([1.0, 2.0], 0.1, [0.0, -np.inf]), "beta")):
        with pytest.raises(ValueError, match=f"^{name}: must be finite"):
            _core.Tridiagonal(*args)
    # ā = c = 0: the mean matrix is zero (solve_mean used to return [nan nan nan])
    with pytest.raises(ValueError, match="singular"):
        _core.Tridiagonal([1.0, -1.0], 0.0, [1.0, 2.0]).solve_mean([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="^rhs: must be finite"):
        _core.Tridiagonal([0.25], 0.1, [0.0]).solve_mean([1.0, float("nan")])
