"""Regression tests of the public API's edge cases (issue 20, causes 3–11): huge ``rounds``,
non-finite oracle answers, user compressors' outputs, pickling, identity of callables,
``estimate_ab``'s bias, ``gd``'s compressor, and that every path gives the same iterates."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import permk
from permk import Identity, PermK, Quadratic, RandK, TopK


def small(n: int = 4, d: int = 8, seed: int = 0) -> permk.problems.SyntheticQuadratic:
    return Quadratic.synthetic(n=n, d=d, lam=1e-3, noise_scale=0.1, seed=seed)


# -- cause 3: the record costs memory in what is recorded, not in rounds ------------------------
@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
def test_huge_rounds_cost_no_memory_before_the_first_round() -> None:
    q = small()
    tracemalloc.start()
    try:
        # a step of 1e6 diverges within a few rounds: the run stops long before 10**12
        res = permk.marina(q, PermK(), rounds=10**12, seed=1, record_every=10**6, gamma=1e6)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert res.diverged_at is not None and res.diverged_at < 10**4
    assert peak < 4 * 2**20  # a set of the 10**6 recorded rounds alone is ~ 40 MiB


def test_recorded_rounds_are_every_record_every_and_the_last() -> None:
    res = permk.marina(small(), PermK(), rounds=23, seed=1, record_every=5)
    assert res.rounds.tolist() == [0, 5, 10, 15, 20, 23]
    again = permk.marina(small(), PermK(), rounds=7, seed=1, record_every=5, state=res.state)
    assert again.rounds.tolist() == [23, 28, 30]


# -- cause 11: gd sends full gradients --------------------------------------------------------
@pytest.mark.parametrize("c", [RandK(3), PermK(), TopK(2)])
def test_gd_refuses_a_compressor(c: permk.Compressor) -> None:
    with pytest.raises(ValueError, match="gd sends full gradients.*None or Identity"):
        permk.gd(small(), c, rounds=3, seed=1)


def test_gd_takes_none_or_identity_alike() -> None:
    a = permk.gd(small(), rounds=5, seed=1)
    b = permk.gd(small(), Identity(), rounds=5, seed=1)
    assert np.array_equal(a.x, b.x)


# -- cause 7: a non-finite oracle answer mid-run is divergence, on every path -----------------
class NaNAfter:
    """A synthetic quadratic whose oracles start answering NaN at worker 0 after ``bad`` calls."""

    def __init__(self, bad: int, kernel: bool = False) -> None:
        self.q = small()
        self.n, self.d, self.x0 = self.q.n, self.q.d, self.q.x0
        self.calls, self.bad = 0, bad

    def _tick(self, v: np.ndarray) -> np.ndarray:
        self.calls += 1
        v = np.array(v)
        if self.calls > self.bad:
            v.flat[0] = np.nan
        return v

    def loss(self, x: np.ndarray) -> float:
        return self.q.loss(x)

    def grad(self, x: np.ndarray) -> np.ndarray:
        return self.q.grad(x)

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        return self._tick(self.q.local_grads(x))

    def local_grad_coords(self, x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return self._tick(self.q.local_grad_coords(x, rows, cols))


@pytest.mark.parametrize("path", ["dense", "fused"])
@pytest.mark.parametrize("method, compressor, options", [
    (permk.marina, PermK(), {"p": 0.01}),
    (permk.marina, RandK(2), {"p": 0.01}),
    (permk.marina, permk.NaturalCompression(), {"p": 0.01}),
    (permk.dcgd, RandK(2), {}),
    (permk.dcgd, permk.QSGD(4), {}),
    (permk.ef21, TopK(2), {}),
])
def test_a_nan_oracle_stops_the_run_with_diverged_at(path: str, method: permk.Method, compressor: permk.Compressor,
                                                      options: dict) -> None:
    if path == "fused" and (method is permk.ef21 or not compressor.capabilities.shared_plan):
        pytest.skip("no fused path")
    res = method(NaNAfter(4), compressor, rounds=50, seed=1, path=path, gamma=0.05, **options)
    assert res.diverged_at is not None and res.diverged_at <= 5
    assert res.rounds[-1] < res.diverged_at


def test_non_finite_user_input_is_still_refused() -> None:
    x0 = small().x0.copy()
    x0[1] = np.nan
    with pytest.raises(ValueError, match="x0 must be finite"):
        permk.marina(small(), PermK(), rounds=3, seed=1, x0=x0)
    with pytest.raises(ValueError, match="non-finite"):
        PermK().aggregate(np.full((4, 8), np.nan), seed=1, round=0)
