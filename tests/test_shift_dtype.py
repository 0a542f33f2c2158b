"""The methods' per-worker rows (EF21's estimators, DIANA's and RandDIANA's shifts, DASHA's rows)
in the problem's dtype: float32 for a float32 problem, as the authors' runs keep them, float64 on
request (``shift_dtype``); the float32 rows are the float64 arithmetic's results rounded once
where they are stored; runs with them resume bit for bit; the accuracy they cost is within that
of the float32 problem itself."""

from __future__ import annotations

import numpy as np
import pytest

import permk
from permk.problems import LinearAutoencoder

D_F, D_E, N_IMG, N_WORKERS = 20, 3, 150, 9


def _ae(dtype: type = np.float32, p_hat: float = 0.5) -> LinearAutoencoder:
    X = np.random.default_rng(0).random((N_IMG, D_F))
    return LinearAutoencoder(X, N_WORKERS, p_hat, 1e-2, d_e=D_E, seed=2, dtype=dtype)


K = -(-2 * D_F * D_E // N_WORKERS)
#: (method, compressor, options, the state's per-worker arrays)
CASES = [
    (permk.ef21, permk.TopK(K), {}, ("G",)),
    (permk.ef21, permk.TopK(K), {"init": "compressed"}, ("G",)),
    (permk.diana, permk.PermK(), {}, ("H",)),
    (permk.rand_diana, permk.PermK(), {"p": 0.3}, ("H",)),
    (permk.dcgd_shifted, permk.PermK(), {}, ("H",)),
    (permk.dasha, permk.PermK(), {}, ("G",)),
    (permk.dasha, permk.PermK(), {"participation": 4}, ("G", "H")),
]


@pytest.mark.parametrize("method,comp,opts,rows", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_per_worker_rows_follow_the_problem_and_resume_bit_for_bit(method: permk.Method, comp: permk.Compressor, opts: dict,
                                                                  rows: tuple[str, ...], tmp_path: object) -> None:
    ae32 = _ae(np.float32)
    kw = dict(rounds=12, seed=1, gamma=1e-3, **opts)
    r = method(ae32, comp, **kw)
    assert r.params.own.shift_dtype == "float32"
    for name in rows:
        assert getattr(r.state, name).dtype == np.float32, name
    for name in r.state.shared_arrays():
        assert getattr(r.state, name).dtype == np.float64, name
    # float64 on request, and for a float64 problem
    assert all(getattr(method(ae32, comp, shift_dtype="float64", **kw).state, n).dtype == np.float64 for n in rows)
    assert all(getattr(method(_ae(np.float64), comp, **kw).state, n).dtype == np.float64 for n in rows)
    # resumed from a file: the same run, bit for bit
    first = method(ae32, comp, **{**kw, "rounds": 5})
    path = f"{tmp_path}/state.npz"
    permk.save_state(first.state, path)
    rest = method(ae32, comp, **{**kw, "rounds": 7}, state=permk.load_state(path))
    np.testing.assert_array_equal(rest.x, r.x)
    assert rest.state == r.state
    # a float64 state does not silently continue as float32
    other = method(ae32, comp, shift_dtype="float64", **{**kw, "rounds": 5}).state
    with pytest.raises(ValueError, match="shift_dtype='float64'"):
        method(ae32, comp, **{**kw, "rounds": 2}, state=other)
    assert method(ae32, comp, shift_dtype="float64", **{**kw, "rounds": 2}, state=other).state.round == 7


def test_float32_estimators_are_the_float64_arithmetic_rounded_when_stored() -> None:
    """One EF21 round from float32 estimators: each worker compresses ``∇f_i(x) − g_i`` in float64
    (``g_i`` read as float64) and stores ``float32(g_i + c_i)``; ``g`` follows in float64."""
    ae = _ae(np.float32)
    start = permk.ef21(ae, permk.TopK(K), rounds=3, seed=1, gamma=1e-3)
    G = start.state.G
    nxt = permk.ef21(ae, permk.TopK(K), rounds=1, seed=1, gamma=1e-3, state=start.state)
    x = start.state.x - start.params.gamma * start.state.g
    R = ae.local_grads(x) - G.astype(np.float64)
    C = permk.TopK(K).compress_all(R, seed=1, round=3)
    np.testing.assert_array_equal(nxt.state.G, (G.astype(np.float64) + C).astype(np.float32))
    np.testing.assert_array_equal(nxt.state.g, start.state.g + C.mean(axis=0))


def test_bad_shift_dtype_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="shift_dtype must be 'float64' or 'float32'"):
        permk.ef21(_ae(), permk.TopK(K), rounds=1, seed=0, gamma=1e-3, shift_dtype="float16")
    with pytest.raises(ValueError, match="shift_dtype must be"):
        permk.diana(_ae(), permk.PermK(), rounds=1, seed=0, gamma=1e-3, shift_dtype="bf16")


def test_float32_rows_cost_about_the_accuracy_of_the_float32_problem() -> None:
    """EF21+TopK and DIANA+PermK over 200 rounds (‖∇f‖² down to a third): the ‖∇f‖² curve with
    float32 rows stays within 1e-6 (relative) of the curve with float64 rows on the same float32
    problem — measured 2.7e-8 (EF21) and 1.6e-8 (DIANA), of the order of the float32 problem's
    own distance to the float64 problem's (2.3e-8 and 2.1e-8, with float64 rows)."""
    ae32, ae64 = _ae(np.float32, 0.0), _ae(np.float64, 0.0)
    for method, comp in ((permk.ef21, permk.TopK(K)), (permk.diana, permk.PermK())):
        kw = dict(rounds=200, seed=3, gamma=2e-3)
        rows32, rows64 = method(ae32, comp, **kw), method(ae32, comp, shift_dtype="float64", **kw)
        ref = method(ae64, comp, **kw)
        by_rows = np.max(np.abs(rows32.grad_norm_sq - rows64.grad_norm_sq) / rows64.grad_norm_sq)
        by_problem = np.max(np.abs(rows64.grad_norm_sq - ref.grad_norm_sq) / ref.grad_norm_sq)
        assert by_rows <= 1e-6 and by_problem <= 1e-6, (method, by_rows, by_problem)


@pytest.mark.parametrize("method,comp,opts,rows", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_float32_rows_on_the_native_quadratic_take_a_numpy_path(method: permk.Method, comp: permk.Compressor, opts: dict,
                                                                rows: tuple[str, ...]) -> None:
    """The native kernels update float64 rows: float32 rows (``shift_dtype="float32"`` on the
    synthetic quadratic) take the fastest other path, which agrees with the dense path bit for
    bit, and a forced ``path="rust"`` is refused with the reason (it once raised a TypeError
    from inside the kernel's glue)."""
    q = permk.Quadratic.synthetic(6, 30, 1e-3, 0.5, seed=0)
    kw = dict(rounds=15, seed=1, gamma=1e-3, shift_dtype="float32", **{k: v for k, v in opts.items() if k != "init"})
    if isinstance(comp, permk.TopK):
        comp = permk.TopK(3)
    auto = method(q, comp, **kw)
    assert auto.params.path != "rust"
    for name in rows:
        assert getattr(auto.state, name).dtype == np.float32, name
    dense = method(q, comp, path="dense", **kw)
    assert auto.x.tobytes() == dense.x.tobytes() and auto.state == dense.state
    with pytest.raises(ValueError, match="float64 shifts, these are float32"):
        method(q, comp, path="rust", **kw)
    assert method(q, comp, **{**kw, "shift_dtype": "float64"}).params.path == "rust"
