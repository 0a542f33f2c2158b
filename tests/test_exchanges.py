"""The exchanges of permk.exchanges against their definitions, on every path.

Each exchange is checked bit for bit against the definition written with the compressor's own
``compress_all`` on whole local gradients, and the paths (rust, fused, dense) against each other.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import permk
from permk import exchanges as ex
from permk.transport import Simulator

from conftest import PyTopK

N, D = 5, 17
COMPRESSORS = [permk.PermK(), permk.RandK(3), permk.BlockPermK(2), permk.TopK(2), permk.QSGD(4), permk.Identity()]


def _problem() -> permk.SyntheticQuadratic:
    return permk.Quadratic.synthetic(n=N, d=D, lam=1e-2, noise_scale=0.4, seed=3)


def _paths(q: Any, c: permk.Compressor, exchange: ex.Exchange) -> list[str]:
    out = []
    for path in ex.PATHS:
        try:
            exchange.path(Simulator(q, path=path), c)
        except ValueError:
            continue
        out.append(path)
    return out


def _points(q: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    return q.x0 + rng.standard_normal(D), q.x0 + rng.standard_normal(D), rng.standard_normal((N, D))


@pytest.mark.parametrize("c", COMPRESSORS, ids=lambda c: c.name)
@pytest.mark.parametrize("form", [dict(), dict(alpha=0.25), dict(c=0.75, beta=0.5, alpha=1.0), dict(c=1.0, beta=0.3, alpha=0.6)],
                         ids=["ef21", "diana", "dasha", "general"])
def test_shifted_is_its_definition_on_every_path(c: permk.Compressor, form: dict[str, float]) -> None:
    q = _problem()
    x, y, H = _points(q)
    with_y = "c" in form
    V = q.local_grads(x) - (form.get("c", 1.0) * q.local_grads(y) if with_y else 0.0)
    R = V - form.get("beta", 1.0) * H
    M = c.compress_all(R, seed=4, round=9)
    want_mean, want_H = M.sum(axis=0) / N, H + form.get("alpha", 1.0) * M
    paths = _paths(q, c, ex.shifted)
    assert "dense" in paths and (("fused" in paths) == c.capabilities.shared_plan)
    for path in paths:
        backend = Simulator(q, path=path)
        H_in = H.copy()
        mean, H_new = ex.shifted(backend, c, H_in, x, y if with_y else None, seed=4, round=9, **form)
        np.testing.assert_array_equal(mean, want_mean, err_msg=path)
        np.testing.assert_array_equal(H_new, want_H, err_msg=path)
        assert np.array_equal(H_in, H), "the caller's H was modified"
    if len(paths) > 1:  # the paths agree bit for bit
        results = [ex.shifted(Simulator(q, path=p), c, H.copy(), x, y if with_y else None, seed=4, round=9, **form) for p in paths]
        for m, h in results[1:]:
            assert np.array_equal(m, results[0][0]) and np.array_equal(h, results[0][1])


@pytest.mark.parametrize("c", COMPRESSORS, ids=lambda c: c.name)
def test_error_feedback_is_the_unit_shifted_exchange(c: permk.Compressor) -> None:
    q = _problem()
    x, _, H = _points(q)
    got = {p: ex.error_feedback(Simulator(q, path=p), c, H.copy(), x, seed=2, round=3) for p in _paths(q, c, ex.error_feedback)}
    want = ex.shifted(Simulator(q, path="dense"), c, H.copy(), x, seed=2, round=3)
    for path, (m, h) in got.items():
        assert np.array_equal(m, want[0]) and np.array_equal(h, want[1]), path
    # the native kernel serves both: EF21's worker step without a shared plan, the shifted values with one
    assert "rust" in got


@pytest.mark.parametrize("c", COMPRESSORS[:3] + COMPRESSORS[4:5], ids=lambda c: c.name)
def test_compressed_means_are_their_definitions_on_every_path(c: permk.Compressor) -> None:
    q = _problem()
    x, y, _ = _points(q)
    want_mean = c.aggregate(q.local_grads(x), seed=1, round=2)
    want_diff = c.aggregate(q.local_grads(x) - q.local_grads(y), seed=1, round=2)
    for path in _paths(q, c, ex.compressed_mean):
        assert np.array_equal(ex.compressed_mean(Simulator(q, path=path), c, x, seed=1, round=2), want_mean), path
    for path in _paths(q, c, ex.compressed_mean_diff):
        assert np.array_equal(ex.compressed_mean_diff(Simulator(q, path=path), c, x, y, seed=1, round=2), want_diff), path


def test_rows_are_updated_in_place_only_when_the_backend_owns_them() -> None:
    q = _problem()
    x, _, H = _points(q)
    for c in (permk.PermK(), permk.TopK(2)):
        backend = Simulator(q)
        given = H.copy()
        _, first = ex.shifted(backend, c, given, x, alpha=0.5, seed=0, round=0)
        assert first is not given and np.array_equal(given, H)
        _, second = ex.shifted(backend, c, first, x, alpha=0.5, seed=0, round=1)
        assert second is first, "the backend's own rows are updated in place"
        other = Simulator(q)
        _, third = ex.shifted(other, c, second, x, alpha=0.5, seed=0, round=2)
        assert third is not second, "another backend copies them"


def test_shifted_arguments_are_checked() -> None:
    q = _problem()
    x, y, H = _points(q)
    backend = Simulator(q)
    with pytest.raises(ValueError, match="error_feedback is the shifted exchange with beta = alpha = 1"):
        ex.error_feedback(backend, permk.TopK(2), H, x, alpha=0.5, seed=0, round=0)
    with pytest.raises(ValueError, match="error_feedback is the shifted exchange"):
        ex.error_feedback(backend, permk.TopK(2), H, x, y, seed=0, round=0)
    with pytest.raises(ValueError, match=r"H must hold the 5 held workers' rows of length 17, got shape \(4, 17\)"):
        ex.shifted(backend, permk.PermK(), H[:4], x, seed=0, round=0)


@pytest.mark.parametrize("c", [permk.PermK(), permk.RandK(3), permk.TopK(2)], ids=lambda c: c.name)
def test_a_non_finite_input_gives_a_non_finite_mean_on_every_path(c: permk.Compressor) -> None:
    q = _problem()
    x, _, H = _points(q)
    H[2, :] = np.nan  # worker 2's shift: every coordinate it may send
    for path in _paths(q, c, ex.shifted):
        mean, _ = ex.shifted(Simulator(q, path=path), c, H.copy(), x, alpha=0.5, seed=0, round=0)
        assert not np.isfinite(mean).all(), path


def test_a_forced_path_that_is_not_available_names_what_it_needs() -> None:
    q = _problem()
    with pytest.raises(ValueError, match="path='fused' is not available for shifted with TopK"):
        ex.shifted.path(Simulator(q, path="fused"), permk.TopK(2))
    with pytest.raises(ValueError, match="path=.rust. is not available for shifted with QSGD.*runs only EF21.s exchange"):
        ex.shifted.path(Simulator(q, path="rust"), permk.QSGD(4))
    assert ex.shifted.path(Simulator(q, path="rust"), permk.PermK()) == "rust"  # the shifted values, natively
    with pytest.raises(ValueError, match="path='rust' is not available for shifted_rows with PermK: this exchange's inputs are given rows"):
        ex.shifted_rows.path(Simulator(q, path="rust"), permk.PermK())
    assert ex.mean_grad.path(Simulator(q, path="fused")) == "dense"


class _Whole:
    """The quadratic without its native kernel: whole local gradients (the dense path)."""

    def __init__(self, q: Any) -> None:
        self.q, self.n, self.d, self.x0 = q, q.n, q.d, q.x0

    def loss(self, x: np.ndarray) -> float:
        return float(self.q.loss(x))

    def grad(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.q.grad(x))

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.q.local_grads(x))


class _Blocked(_Whole):
    """The same with ``local_grad_blocks``: the gradients in the given blocks of workers, each
    handed out in one buffer that the next block overwrites."""

    def __init__(self, q: Any, bounds: list[int]) -> None:
        super().__init__(q)
        self.bounds = bounds

    def local_grad_blocks(self, x: np.ndarray) -> Any:
        G = self.local_grads(x)
        buf = np.empty_like(G)
        for lo, hi in zip(self.bounds, self.bounds[1:]):
            buf[: hi - lo] = G[lo:hi]
            yield lo, hi, buf[: hi - lo]


@pytest.mark.parametrize("c", [permk.TopK(2), permk.QSGD(4)], ids=lambda c: c.name)
@pytest.mark.parametrize("bad", [None, 0, 3], ids=["finite", "first-block-nan", "last-block-nan"])
@pytest.mark.parametrize("chunk", [1, 2, 4, 100], ids=lambda r: f"chunk{r}")
def test_error_feedback_in_blocks_of_workers_equals_the_whole_rows(monkeypatch: pytest.MonkeyPatch, c: permk.Compressor,
                                                                  bad: int | None, chunk: int) -> None:
    """A problem giving its gradients in blocks (local_grad_blocks) gets the same messages, mean
    and rows bit for bit as with whole gradients, whatever the chunks of workers the exchange
    compresses at a time (across the blocks' bounds); a non-finite input in any chunk gives every
    worker the zero input's indices and NaN values, as the whole rows do."""
    monkeypatch.setattr(ex, "CHUNK_BYTES", 8 * D * chunk)
    q = _problem()
    x, _, H = _points(q)
    if bad is not None:
        H[bad, 1] = np.nan
    for form in (dict(), dict(alpha=0.5, beta=0.5)):
        want = ex.shifted(Simulator(_Whole(q)), c, H.copy(), x, seed=2, round=3, **form)
        got = ex.shifted(Simulator(_Blocked(q, [0, 2, 3, 5])), c, H.copy(), x, seed=2, round=3, **form)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        assert np.isfinite(got[0]).all() == (bad is None)
        if bad is None:  # and the definition, from the compressor's own compress_all
            M = c.compress_all(q.local_grads(x) - form.get("beta", 1.0) * H, seed=2, round=3)
            np.testing.assert_array_equal(got[0], M.sum(axis=0) / N)
            np.testing.assert_array_equal(got[1], H + form.get("alpha", 1.0) * M)


class _OwnMessages(_Blocked):
    """The same with ``local_message_blocks``: the problem compresses its workers' inputs
    itself, block by block (here with the compressor, as a problem with a faster route must
    match); ``spoil`` corrupts one block's messages."""

    def __init__(self, q: Any, bounds: list[int], spoil: Any = None) -> None:
        super().__init__(q, bounds)
        self.spoil = spoil

    def local_message_blocks(self, x: np.ndarray, compressor: permk.Compressor, H: Any, beta: float, *, start: int, n_workers: int,
                             seed: int, round: int) -> Any:
        for lo, hi, G in self.local_grad_blocks(x):
            m = compressor.compress_shifted_rows(G, None if H is None else H[lo:hi], beta=beta, start=start + lo, n_workers=n_workers,
                                                 seed=seed, round=round)
            yield (lo, hi, m) if self.spoil is None or m is None else self.spoil(lo, hi, m)


@pytest.mark.parametrize("bad", [None, 0, 3], ids=["finite", "first-block-nan", "last-block-nan"])
def test_a_problem_giving_its_own_messages_equals_the_whole_rows(bad: int | None) -> None:
    """local_message_blocks replaces the exchange's compression of the gradient blocks: the same
    mean and rows bit for bit, and the same divergence (any block None: every worker's zero
    input, NaN values)."""
    q = _problem()
    x, _, H = _points(q)
    if bad is not None:
        H[bad, 1] = np.nan
    for form in (dict(), dict(alpha=0.5, beta=0.5)):
        want = ex.shifted(Simulator(_Whole(q)), permk.TopK(2), H.copy(), x, seed=2, round=3, **form)
        got = ex.shifted(Simulator(_OwnMessages(q, [0, 2, 3, 5])), permk.TopK(2), H.copy(), x, seed=2, round=3, **form)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_the_rows_exchanges_do_not_ask_the_problem_for_its_messages() -> None:
    """compressed_mean_rows and shifted_rows compress the rows the method gives (VR-MARINA's and
    DASHA's), not the problem's gradients: a problem with local_message_blocks gets the same
    results as one without."""
    q = _problem()
    _, _, H = _points(q)
    rows = np.random.default_rng(5).standard_normal((N, D))
    for c in (permk.TopK(2), permk.QSGD(4)):
        own, whole = Simulator(_OwnMessages(q, [0, 2, 5])), Simulator(_Whole(q))
        np.testing.assert_array_equal(ex.compressed_mean_rows(own, c, rows, seed=2, round=3),
                                      ex.compressed_mean_rows(whole, c, rows, seed=2, round=3))
        got = ex.shifted_rows(own, c, H.copy(), rows, beta=0.5, alpha=0.5, seed=2, round=3)
        want = ex.shifted_rows(whole, c, H.copy(), rows, beta=0.5, alpha=0.5, seed=2, round=3)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("bounds", "spoil", "match"),
    [
        ([0, 2, 4], None, "gave the messages of 4 of the 5 held workers"),
        ([1, 3, 5], None, r"got \(1, 3\) after 0"),
        ([0, 2, 5], lambda lo, hi, m: (lo, hi, m._replace(offsets=m.offsets[:-1])), "malformed messages for workers 0 … 1"),
        ([0, 2, 5], lambda lo, hi, m: (lo, hi, m._replace(indices=m.indices + D)), r"coordinates in range\(17\)"),
        ([0, 2, 5], lambda lo, hi, m: (lo, hi, m._replace(values=m.values[:-1])), "malformed messages"),
    ],
)
def test_a_problems_own_messages_are_checked(bounds: list[int], spoil: Any, match: str) -> None:
    q = _problem()
    x, _, H = _points(q)
    with pytest.raises(ValueError, match=f"problem.local_message_blocks.*{match}"):
        ex.error_feedback(Simulator(_OwnMessages(q, bounds, spoil)), permk.TopK(2), H.copy(), x, seed=0, round=0)


def test_blocks_of_workers_must_cover_the_held_workers_in_order() -> None:
    q = _problem()
    x, _, H = _points(q)
    for bounds, match in (([0, 2, 4], "gave the rows of 4 of the 5 held workers"), ([1, 3, 5], r"got \(1, 3\) after 0")):
        with pytest.raises(ValueError, match=match):
            ex.error_feedback(Simulator(_Blocked(q, bounds)), permk.TopK(2), H.copy(), x, seed=0, round=0)


@pytest.mark.parametrize("c", [permk.TopK(2), permk.QSGD(4), PyTopK()], ids=lambda c: type(c).__name__)
@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_compress_shifted_rows_is_compress_rows_of_the_shifted_inputs(c: permk.Compressor, beta: float) -> None:
    """Compressor.compress_shifted_rows(G, H, β) is compress_rows(G − H) (β = 1) or
    compress_rows(G − H·β) bit for bit, with the Rust kernel and without one; a non-finite
    input gives None."""
    rng = np.random.default_rng(3)
    G, H = rng.standard_normal((4, D)), rng.standard_normal((4, D))
    want = c.compress_rows(G - H if beta == 1.0 else G - H * beta, start=1, n_workers=N, seed=2, round=3)
    got = c.compress_shifted_rows(G, H, beta=beta, start=1, n_workers=N, seed=2, round=3)
    assert got is not None
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    H[2, 3] = np.nan
    assert c.compress_shifted_rows(G, H, beta=beta, start=1, n_workers=N, seed=2, round=3) is None
    with pytest.raises(ValueError, match="start"):
        c.compress_shifted_rows(G, None, start=N + 1, n_workers=N, seed=2, round=3)
