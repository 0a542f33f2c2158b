"""MARINA, EF21 and GD: cross-checks against closed-form theory on quadratics."""

from __future__ import annotations

import math

import numpy as np
import pytest

import permk
from permk import marina_stepsize


def synthetic(n: int = 10, d: int = 50, lam: float = 1e-3, s: float = 0.0, seed: int = 0) -> permk.SyntheticQuadratic:
    return permk.Quadratic.synthetic(n, d, lam, s, seed=seed)


class DiagonalProblem:
    """A user problem in plain numpy with a coordinate oracle: f_i(x) = ½ Σ_j w_ij x_j² − c_i·x."""

    def __init__(self, n: int, d: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.n, self.d = n, d
        self.w = 1.0 + 0.3 * rng.random((n, d))
        self.c = rng.normal(size=(n, d))
        self.x0 = np.ones(d)

    def loss(self, x: np.ndarray) -> float:
        return float(np.mean(0.5 * (self.w * x**2).sum(1) - self.c @ x))

    def grad(self, x: np.ndarray) -> np.ndarray:
        return self.local_grads(x).mean(0)

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        return self.w * x - self.c

    def local_grad_coords(self, x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return self.w[rows, cols] * x[cols] - self.c[rows, cols]


COMPRESSORS = [permk.PermK(), permk.RandK(3), permk.BlockPermK(4)]


@pytest.mark.parametrize("n,d", [(8, 40), (40, 8), (7, 30)])
@pytest.mark.parametrize("comp", COMPRESSORS, ids=lambda c: c.name)
def test_rust_fused_and_dense_paths_agree(n: int, d: int, comp: permk.Compressor) -> None:
    q = synthetic(n, d, 1e-2, 0.3)
    runs = {path: permk.marina(q, comp, rounds=60, seed=5, p=0.2, path=path) for path in ("rust", "fused", "dense")}
    ref = runs["dense"]
    for path in ("rust", "fused"):
        r = runs[path]
        assert r.params.path == path
        np.testing.assert_array_equal(r.coins, ref.coins)
        np.testing.assert_allclose(r.x, ref.x, rtol=1e-9, atol=1e-12 * np.abs(ref.x).max())
        np.testing.assert_allclose(r.grad_norm_sq, ref.grad_norm_sq, rtol=1e-7)
        np.testing.assert_array_equal(r.bits_per_worker, ref.bits_per_worker)


def test_fused_path_for_a_user_problem() -> None:
    prob = DiagonalProblem(6, 20)
    kw = dict(rounds=40, seed=3, gamma=0.5, p=0.25)
    fused = permk.marina(prob, permk.PermK(), path="fused", **kw)
    dense = permk.marina(prob, permk.PermK(), path="dense", **kw)
    assert fused.params.path == "fused" and permk.marina(prob, permk.PermK(), **kw).params.path == "fused"
    np.testing.assert_allclose(fused.x, dense.x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("path", ["rust", "fused", "dense"])
def test_same_seed_is_bit_reproducible(path: str) -> None:
    q = synthetic(12, 30, 1e-3, 0.2)
    a = permk.marina(q, permk.PermK(), rounds=80, seed=9, path=path)
    b = permk.marina(q, permk.PermK(), rounds=80, seed=9, path=path)
    c = permk.marina(q, permk.PermK(), rounds=80, seed=10, path=path)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.grad_norm_sq, b.grad_norm_sq)
    np.testing.assert_array_equal(a.x_hat, b.x_hat)
    assert not np.array_equal(a.x, c.x)


@pytest.mark.parametrize("path", ["rust", "dense"])
def test_resume_equals_uninterrupted_run(path: str, tmp_path: pytest.TempPathFactory) -> None:
    q = synthetic(10, 30, 1e-3, 0.2)
    full = permk.marina(q, permk.PermK(), rounds=100, seed=4, path=path)
    first = permk.marina(q, permk.PermK(), rounds=37, seed=4, path=path)
    f = tmp_path / "state.npz"  # type: ignore[operator]
    permk.save_state(first.state, f)
    state = permk.load_state(f)
    assert isinstance(state, permk.MarinaState) and state.round == 37
    second = permk.marina(q, permk.PermK(), rounds=63, seed=4, path=path, state=state)
    np.testing.assert_array_equal(second.x, full.x)
    np.testing.assert_array_equal(np.concatenate([first.coins, second.coins]), full.coins)
    assert second.bits_per_worker[-1] == full.bits_per_worker[-1]
    assert second.rounds[-1] == 100
    with pytest.raises(ValueError, match="resumed state"):
        permk.marina(q, permk.PermK(), rounds=5, seed=5, path=path, state=state)


def test_ef21_resume() -> None:
    q = synthetic(5, 20, 1e-2, 0.5)
    full = permk.ef21(q, permk.TopK(2), rounds=50, seed=0, gamma_multiplier=8)
    first = permk.ef21(q, permk.TopK(2), rounds=20, seed=0, gamma_multiplier=8)
    second = permk.ef21(q, permk.TopK(2), rounds=30, seed=0, gamma_multiplier=8, state=first.state)
    np.testing.assert_array_equal(second.x, full.x)


@pytest.mark.parametrize("path", ["rust", "dense"])
def test_ef21_compressed_start_is_topk_of_the_local_gradients(path: str) -> None:
    """init="compressed" (the authors' quadratic runs): g_i⁰ = TopK(∇f_i(x⁰)), g⁰ their mean, no
    bits counted for the start (as for init="full"); the runs differ from the full start."""
    from permk.methods.driver import setup
    from permk.transport import Simulator

    q = synthetic(6, 40, 1e-3, 0.4)
    x0 = np.random.default_rng(3).standard_normal(q.d)  # a dense ∇f_i(x⁰): TopK(3) drops most of it
    top = permk.TopK(3)
    C = top.compress_all(q.local_grads(x0), seed=1, round=0)
    params = setup(permk.ef21, q, top, n=q.n, d=q.d, rounds=1, seed=1, gamma=0.1, init="compressed")
    st = permk.ef21.init(x0, Simulator(q, path=path), top, params, seed=1)
    np.testing.assert_array_equal(st.G, C)
    np.testing.assert_allclose(st.g, C.sum(axis=0) / q.n, rtol=0, atol=1e-15)
    assert st.round == 0 and st.bits == 0.0
    comp = permk.run(permk.ef21, q, top, rounds=20, seed=1, x0=x0, init="compressed", path=path)
    full = permk.run(permk.ef21, q, top, rounds=20, seed=1, x0=x0, path=path)
    assert comp.params.own.init == "compressed" and full.params.own.init == "full"
    np.testing.assert_array_equal(comp.bits_per_worker, full.bits_per_worker)
    assert comp.grad_norm_sq[0] == full.grad_norm_sq[0] and comp.grad_norm_sq[1] != full.grad_norm_sq[1]
    np.testing.assert_array_equal(comp.x, permk.run(permk.ef21, q, top, rounds=20, seed=1, x0=x0, init="compressed",
                                                    path="dense" if path == "rust" else "rust").x)


def test_ef21_init_is_checked() -> None:
    with pytest.raises(ValueError, match="init must be one of 'full', 'compressed'"):
        permk.ef21(synthetic(), permk.TopK(2), rounds=2, seed=0, init="topk")


def test_marina_with_permk_at_zero_hessian_variance_meets_theorem_ab() -> None:
    """L± = 0 and A = B: E‖∇f(x̂^T)‖² ≤ 2Δ⁰/(γT) (Theorem AB), averaged over seeds."""
    q = synthetic(10, 50, 1e-6, 0.0)
    assert q.L_pm == 0.0
    T = 200
    delta0 = q.loss(q.x0) - q.f_star
    vals = []
    for seed in range(8):
        r = permk.marina(q, permk.PermK(), rounds=T, seed=seed)
        # x̂ is uniform over x^0..x^{T-1}: its expectation over the draw is the mean over iterates
        vals.append(r.grad_norm_sq[:-1].mean())
        gamma = r.params.gamma
    # with L± = 0 and A = B, M = L−: the step is GD's 1/L−
    assert gamma == pytest.approx(1 / q.L_minus)
    bound = 2 * delta0 / (gamma * T)
    assert np.mean(vals) <= bound
    # ... and the bound is not vacuous: a 16× larger step breaks it
    blown = permk.marina(q, permk.PermK(), rounds=T, seed=0, gamma_multiplier=16)
    assert blown.diverged_at is not None or blown.grad_norm_sq[:-1].mean() > bound


def test_marina_pl_rate() -> None:
    """Theorem AB-PL: E[f(x^T) − f*] ≤ (1 − γμ)^T Δ⁰, averaged over seeds."""
    q = synthetic(10, 20, 0.05, 0.3)
    T = 150
    delta0 = q.loss(q.x0) - q.f_star
    gaps, gamma = [], None
    for seed in range(10):
        r = permk.marina(q, permk.PermK(), rounds=T, seed=seed, pl=True)
        gaps.append(r.f_gap[-1])
        gamma = r.params.gamma
        assert r.params.gamma_source == "Theorem AB-PL"
    assert gamma is not None
    p = r.params.own.p
    A, B = permk.PermK().ab_constants(10, 20)
    assert gamma == pytest.approx(marina_stepsize(A, B, q.L_minus, q.L_plus, q.L_pm, p, mu=q.mu))
    assert np.mean(gaps) <= (1 - gamma * q.mu) ** T * delta0


def test_gd_contracts_and_ef21_with_full_topk_is_gd() -> None:
    q = synthetic(6, 30, 0.05, 0.4)
    g = permk.gd(q, rounds=100, seed=0)
    assert g.params.gamma == pytest.approx(1 / q.L_minus)
    delta0 = q.loss(q.x0) - q.f_star
    # strongly convex quadratic with step 1/L: f(x^T) − f* ≤ (1 − μ/L)^T Δ⁰
    assert g.f_gap[-1] <= (1 - q.mu / q.L_minus) ** 100 * delta0
    assert g.coins.all() and g.bits_per_worker[-1] == 100 * 30 * 32
    e = permk.ef21(q, permk.TopK(30), rounds=100, seed=0)
    # α = 1: θ = 1, β = 0, the step is 1/L− and C = identity, so EF21 is GD
    assert e.params.gamma == pytest.approx(1 / q.L_minus)
    np.testing.assert_allclose(e.x, g.x, rtol=1e-10, atol=1e-12)


def test_result_contents_and_recording() -> None:
    q = synthetic(10, 40, 1e-3, 0.1)
    r = permk.marina(q, permk.PermK(), rounds=95, seed=1, record_every=10, float_bits=64)
    np.testing.assert_array_equal(r.rounds, [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95])
    assert r.grad_norm_sq.shape == r.f_gap.shape == r.bits_per_worker.shape == (11,)
    assert r.coins.shape == (95,)
    heads = int(r.coins.sum())
    assert r.bits_per_worker[-1] == heads * 40 * 64 + (95 - heads) * 4 * 64
    p = r.params.own.p
    assert p == pytest.approx(4 / 40)
    assert r.expected_bits_per_worker[-1] == pytest.approx(95 * (p * 40 * 64 + (1 - p) * 4 * 64))
    assert r.params.constants["constants"] == "exact" and r.params.constants["L_pm"] == q.L_pm
    assert r.f_gap.min() >= -1e-12 and r.wall_time > 0 and r.diverged_at is None
    assert r.x_hat.shape == (40,)
    pess = permk.marina(q, permk.PermK(), rounds=5, seed=1, constants="pessimistic")
    assert pess.params.constants["L_pm"] == pytest.approx(math.sqrt(q.L_sq_mean))
    assert pess.params.gamma < r.params.gamma


def test_paper_claim_permk_needs_fewer_bits_at_zero_hessian_variance() -> None:
    """With L± = 0 and n ≥ 100, MARINA+PermK reaches ‖∇f‖² ≤ 1e-3‖∇f(x⁰)‖² with fewer bits per
    worker than MARINA+RandK (K = d/n) and EF21+TopK (K = d/n), all with theory's parameters."""
    n, d = 100, 500
    q = synthetic(n, d, 1e-3, 0.0)
    k = d // n

    def bits_to_target(res: permk.RunResult) -> float:
        hit = np.nonzero(res.grad_norm_sq <= 1e-3 * res.grad_norm_sq[0])[0]
        return float(res.bits_per_worker[hit[0]]) if hit.size else math.inf

    perm = bits_to_target(permk.marina(q, permk.PermK(), rounds=3000, seed=0))
    rand = bits_to_target(permk.marina(q, permk.RandK(k), rounds=3000, seed=0))
    top = bits_to_target(permk.ef21(q, permk.TopK(k), rounds=3000, seed=0))
    assert perm < math.inf
    assert perm < rand and perm < top, (perm, rand, top)


def test_divergence_stops_and_reports_the_round() -> None:
    q = synthetic(10, 40, 1e-3, 0.5)
    r = permk.marina(q, permk.PermK(), rounds=5000, seed=0, gamma=1e3)
    assert r.diverged_at is not None and r.diverged_at < 5000
    assert np.isfinite(r.grad_norm_sq).all()
    assert r.rounds[-1] < r.diverged_at


def test_bad_parameters() -> None:
    q = synthetic(10, 40)
    with pytest.raises(ValueError, match="p must be"):
        permk.marina(q, permk.PermK(), rounds=5, seed=0, p=0.0)
    with pytest.raises(ValueError, match="p must be"):
        permk.marina(q, permk.PermK(), rounds=5, seed=0, p=1.5)
    with pytest.raises(ValueError, match="gamma"):
        permk.marina(q, permk.PermK(), rounds=5, seed=0, gamma=-1.0)
    with pytest.raises(ValueError, match="rounds"):
        permk.marina(q, permk.PermK(), rounds=0, seed=0)
    with pytest.raises(ValueError, match="does not fit"):
        permk.marina(q, permk.RandK(41), rounds=5, seed=0)
    with pytest.raises(ValueError, match="does not fit"):
        permk.marina(q, permk.BlockPermK(11), rounds=5, seed=0)
    with pytest.raises(ValueError, match="unbiased"):
        permk.marina(q, permk.TopK(3), rounds=5, seed=0)
    with pytest.raises(ValueError, match="contractive"):
        permk.ef21(q, permk.RandK(3), rounds=5, seed=0)
    with pytest.raises(ValueError, match="path"):
        permk.marina(q, permk.Compose(permk.PermK(), permk.QSGD(2)), rounds=5, seed=0, path="fused")
    with pytest.raises(ValueError, match="smoothness constants"):
        permk.marina(DiagonalProblem(4, 8), permk.PermK(), rounds=5, seed=0)
    with pytest.raises(TypeError, match="seed"):
        permk.marina(q, permk.PermK(), rounds=5, seed=None)  # type: ignore[arg-type]
    no_mu = DiagonalProblem(4, 8)
    no_mu.L_minus = no_mu.L_plus = no_mu.L_pm = 1.3  # type: ignore[attr-defined]
    assert permk.marina(no_mu, permk.PermK(), rounds=5, seed=0).params.gamma_source == "Theorem AB"
    with pytest.raises(ValueError, match="pl=True"):
        permk.marina(no_mu, permk.PermK(), rounds=5, seed=0, pl=True)


def test_quantized_composition_runs_on_the_dense_path() -> None:
    q = synthetic(8, 40, 1e-2, 0.1)
    comp = permk.Compose(permk.PermK(), permk.NaturalCompression())
    r = permk.marina(q, comp, rounds=300, seed=2)
    assert r.params.path == "dense"
    assert r.params.own.A == pytest.approx(1.125)
    assert r.grad_norm_sq[-1] < 1e-2 * r.grad_norm_sq[0]
    # 9 bits per value, no indices
    assert r.params.own.p == pytest.approx(5 * 9 / (40 * 32))


def test_progress_bar_runs(capsys: pytest.CaptureFixture[str]) -> None:
    q = synthetic(4, 8)
    r = permk.marina(q, permk.PermK(), rounds=10, seed=0, progress=True)
    assert r.state.round == 10
