"""DASHA, DASHA-PP and MARINA with partial participation: the authors' algorithms written out
literally, convergence at the theory steps, bits, paths, resume and bad options.

1. each method equals a literal numpy transcription of the authors' code
   (``zero_marina``, ``zero_marina_partial_participation``, ``marina_partial_participation`` of
   mysteryresearcher/sampling-in-optimal-sgd, algorithm.py) on the same compressor outputs;
2. each converges on the synthetic quadratic at its theory step with the rate its theorem
   promises, ``E‖∇f(x̂^T)‖² ≤ 2Δ⁰/(γT)`` (x̂ uniform over the iterates, averaged over seeds);
3. bits as stated, paths bit for bit, resume equals an uninterrupted run, bad options raise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import permk
from permk import _core
from permk.compressors.participation import participants
from permk.theory.steps import Constants, dasha_pp_stepsize, dasha_stepsize


def synthetic(n: int = 10, d: int = 40, lam: float = 1e-3, s: float = 0.0, seed: int = 0) -> permk.SyntheticQuadratic:
    return permk.Quadratic.synthetic(n, d, lam, s, seed=seed)


# ------------------------------------------------------------------------------------------
# 1. the authors' algorithms, literally
# ------------------------------------------------------------------------------------------
def authors_dasha(q: permk.Quadratic, comp: permk.Compressor, *, rounds: int, seed: int, gamma: float, a: float) -> np.ndarray:
    """``ZeroMarinaNodeAlgorithm.step`` / ``BaseZeroMarinaMasterAlgorithm.step`` with
    ``init_with_gradients=True``: the iterates."""
    n = q.n
    x = q.x0.copy()
    G = q.local_grads(x)  # g_i⁰ = ∇f_i(x⁰)
    g = G.mean(axis=0)
    xs = [x]
    for t in range(rounds):
        x_new = x - gamma * g
        new, old = q.local_grads(x_new), q.local_grads(x)
        M = comp.compress_all(new - old - a * (G - old), seed=seed, round=t)
        G = G + M
        g = g + M.sum(axis=0) / n
        x = x_new
        xs.append(x)
    return np.array(xs)


def authors_dasha_pp(q: permk.Quadratic, inner: permk.Compressor, s: int, *, rounds: int, seed: int, gamma: float,
                     a: float) -> np.ndarray:
    """``BaseZeroMarinaPartialParticipationNodeAlgorithm.step`` (``ZeroMarinaPartialParticipation``
    node and master, ``init_with_gradients=True``), the participants drawn as permk draws them."""
    n = q.n
    p_a = s / n
    b = p_a / (2 - p_a)
    x = q.x0.copy()
    H = q.local_grads(x)
    G = H.copy()
    g = G.mean(axis=0)
    xs = [x]
    for t in range(rounds):
        x_new = x - gamma * g
        new, old = q.local_grads(x_new), q.local_grads(x)
        total = np.zeros(q.d)
        for i in participants(n, s, seed=seed, round=t):
            k = new[i] - old[i] - b * (H[i] - old[i])
            h_old = H[i].copy()
            H[i] = H[i] + k / p_a
            message = k - a * (G[i] - h_old)
            m = inner.compress(message / p_a, worker=int(i), n_workers=n, seed=seed, round=t).to_dense()
            G[i] = G[i] + m
            total += m
        g = g + total / n
        x = x_new
        xs.append(x)
    return np.array(xs)


def authors_marina_pp(q: permk.Quadratic, inner: permk.Compressor, s: int, *, rounds: int, seed: int, gamma: float,
                      p: float) -> np.ndarray:
    """``MarinaPartialParticipationMasterAlgorithm.step``: full gradients of every worker on
    heads, else the ``s`` sampled workers' compressed differences averaged over ``s``."""
    n = q.n
    x = q.x0.copy()
    g = q.grad(x)
    xs = [x]
    for t in range(rounds):
        x_new = x - gamma * g
        if _core.coin(seed, t, p):
            g = q.grad(x_new)
        else:
            new, old = q.local_grads(x_new), q.local_grads(x)
            total = np.zeros(q.d)
            for i in participants(n, s, seed=seed, round=t):
                total += inner.compress(new[i] - old[i], worker=int(i), n_workers=n, seed=seed, round=t).to_dense()
            g = g + total / s
        x = x_new
        xs.append(x)
    return np.array(xs)


def _iterates(method: permk.Method, q: permk.Quadratic, comp: permk.Compressor, rounds: int, **kw: object) -> np.ndarray:
    """The iterates x^0 … x^T of a permk run (one round at a time, resumed)."""
    first = method(q, comp, rounds=1, **kw)
    xs = [q.x0, first.x]
    state = first.state
    for _ in range(rounds - 1):
        r = method(q, comp, rounds=1, state=state, **kw)
        xs.append(r.x)
        state = r.state
    return np.array(xs)


@pytest.mark.parametrize("comp", [permk.PermK(), permk.RandK(3), permk.BlockPermK(4), permk.NaturalCompression()],
                         ids=lambda c: c.name)
@pytest.mark.parametrize("n,d", [(6, 20), (8, 5)])
def test_dasha_is_the_authors_zero_marina(comp: permk.Compressor, n: int, d: int) -> None:
    q = synthetic(n, d, 1e-3, 0.5)
    res = permk.dasha(q, comp, rounds=30, seed=3)
    a, gamma = res.params.own.a, res.params.gamma
    assert a == 1 / (2 * comp.omega(n, d) + 1)
    ref = authors_dasha(q, comp, rounds=30, seed=3, gamma=gamma, a=a)
    np.testing.assert_allclose(res.x, ref[-1], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(_iterates(permk.dasha, q, comp, 30, seed=3), ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("inner", [permk.PermK(), permk.RandK(3), permk.BlockPermK(4)], ids=lambda c: c.name)
@pytest.mark.parametrize("n,d,s", [(6, 20, 2), (8, 5, 5), (5, 12, 5)])
def test_dasha_pp_is_the_authors_zero_marina_partial_participation(inner: permk.Compressor, n: int, d: int, s: int) -> None:
    q = synthetic(n, d, 1e-3, 0.5)
    res = permk.dasha(q, inner, rounds=30, seed=4, participation=s)
    a, gamma = res.params.own.a, res.params.gamma
    assert a == (s / n) / (2 * inner.omega(n, d) + 1) and res.params.own.b == (s / n) / (2 - s / n)
    ref = authors_dasha_pp(q, inner, s, rounds=30, seed=4, gamma=gamma, a=a)
    np.testing.assert_allclose(_iterates(permk.dasha, q, inner, 30, seed=4, participation=s), ref, rtol=1e-8, atol=1e-11)


@pytest.mark.parametrize("inner", [permk.PermK(), permk.RandK(3)], ids=lambda c: c.name)
@pytest.mark.parametrize("n,d,s", [(6, 20, 2), (8, 5, 7)])
def test_marina_pp_is_the_authors_marina_partial_participation(inner: permk.Compressor, n: int, d: int, s: int) -> None:
    q = synthetic(n, d, 1e-3, 0.5)
    res = permk.marina(q, inner, rounds=40, seed=5, participation=s, p=0.3)
    ref = authors_marina_pp(q, inner, s, rounds=40, seed=5, gamma=res.params.gamma, p=0.3)
    np.testing.assert_allclose(_iterates(permk.marina, q, inner, 40, seed=5, participation=s, p=0.3), ref,
                               rtol=1e-9, atol=1e-12)
    assert res.coins is not None and 0 < res.coins.sum() < 40


# ------------------------------------------------------------------------------------------
# 2. the rates the theorems promise, at the theory steps
# ------------------------------------------------------------------------------------------
def _mean_over_iterates(method: permk.Method, q: permk.Quadratic, comp: permk.Compressor, T: int, seeds: int,
                        **kw: object) -> tuple[float, float, str]:
    """``E‖∇f(x̂^T)‖²`` (x̂ uniform over x^0 … x^{T−1}: the mean over the iterates, averaged
    over seeds), the step and its source."""
    vals, gamma, source = [], 0.0, ""
    for seed in range(seeds):
        r = method(q, comp, rounds=T, seed=seed, **kw)
        assert r.diverged_at is None
        vals.append(float(r.grad_norm_sq[:-1].mean()))
        gamma, source = r.params.gamma, r.params.gamma_source
    return float(np.mean(vals)), gamma, source


@pytest.mark.parametrize("comp", [permk.RandK(4), permk.PermK()], ids=lambda c: c.name)
def test_dasha_meets_its_theorem_at_its_step(comp: permk.Compressor) -> None:
    """DASHA's theorem with ``g_i⁰ = h_i⁰ = ∇f_i(x⁰)``: ``E‖∇f(x̂^T)‖² ≤ 2Δ⁰/(γT)``; the step
    is the authors' (RandK: ``A = ω/n``) or its AB form (PermK: ``A = 1``)."""
    q = synthetic(10, 40, 1e-3, 0.5)
    T = 300
    delta0 = q.loss(q.x0) - q.f_star
    mean, gamma, source = _mean_over_iterates(permk.dasha, q, comp, T, 6)
    w, (A, _) = comp.omega(10, 40), comp.ab_constants(10, 40)
    assert gamma == pytest.approx(dasha_stepsize(w, A, q.L_minus, q.L_plus), rel=1e-14)
    assert source == "DASHA theorem"
    assert mean <= 2 * delta0 / (gamma * T)
    # ... and the bound is not vacuous: a 16× larger step breaks it
    blown = permk.dasha(q, comp, rounds=T, seed=0, gamma_multiplier=16)
    assert blown.diverged_at is not None or blown.grad_norm_sq[:-1].mean() > 2 * delta0 / (gamma * T)
    last = permk.dasha(q, comp, rounds=3000, seed=0)
    assert last.grad_norm_sq[-1] < 1e-3 * last.grad_norm_sq[0]


def test_dasha_with_a_participation_compressor_is_dasha_with_its_constants() -> None:
    """Passing ``permk.Participation(C, s)`` runs plain DASHA with that family's ``ω`` and ``A``
    (not DASHA-PP, which ``participation=s`` selects)."""
    q = synthetic(10, 40, 1e-3, 0.5)
    wrapped = permk.Participation(permk.RandK(8), 5)
    r = permk.dasha(q, wrapped, rounds=200, seed=1)
    w, (A, _) = wrapped.omega(10, 40), wrapped.ab_constants(10, 40)
    assert r.params.own.a == 1 / (2 * w + 1) and r.params.own.participation is None
    assert r.params.gamma == pytest.approx(dasha_stepsize(w, A, q.L_minus, q.L_plus), rel=1e-14)
    ref = authors_dasha(q, wrapped, rounds=200, seed=1, gamma=r.params.gamma, a=r.params.own.a)
    np.testing.assert_allclose(r.x, ref[-1], rtol=1e-9, atol=1e-12)
    assert r.grad_norm_sq[-1] < 0.1 * r.grad_norm_sq[0]


@pytest.mark.parametrize("comp,s", [(permk.RandK(4), 3), (permk.PermK(), 5), (permk.RandK(8), 10)], ids=str)
def test_dasha_pp_meets_its_theorem_at_its_step(comp: permk.Compressor, s: int) -> None:
    q = synthetic(10, 40, 1e-3, 0.5)
    T = 300
    delta0 = q.loss(q.x0) - q.f_star
    mean, gamma, source = _mean_over_iterates(permk.dasha, q, comp, T, 6, participation=s)
    w, (A, _) = comp.omega(10, 40), comp.ab_constants(10, 40)
    assert gamma == pytest.approx(dasha_pp_stepsize(w, A, 10, s, q.L_minus, q.L_plus), rel=1e-14)
    assert source == "DASHA-PP theorem"
    assert mean <= 2 * delta0 / (gamma * T)
    last = permk.dasha(q, comp, rounds=4000, seed=0, participation=s)
    assert last.grad_norm_sq[-1] < 1e-2 * last.grad_norm_sq[0]


@pytest.mark.parametrize("comp,s", [(permk.PermK(), 4), (permk.RandK(4), 7)], ids=str)
def test_marina_pp_meets_theorem_ab_with_the_participation_constants(comp: permk.Compressor, s: int) -> None:
    """Theorem AB with the participation family's (A, B): ``E‖∇f(x̂^T)‖² ≤ 2Δ⁰/(γT)``; the step
    is never below PP-MARINA's ``1/(L(1 + sqrt((1 − p)(1 + ω)/(p s))))`` (L the larger of L−, L+)."""
    q = synthetic(10, 40, 1e-3, 0.5)
    T = 300
    delta0 = q.loss(q.x0) - q.f_star
    mean, gamma, source = _mean_over_iterates(permk.marina, q, comp, T, 6, participation=s)
    wrapped = permk.Participation(comp, s)
    p = permk.marina(q, comp, rounds=1, seed=0, participation=s).params.own.p
    assert p == pytest.approx(wrapped.expected_bits_per_worker(10, 40) / (40 * 32))
    A, B = wrapped.ab_constants(10, 40)
    assert gamma == pytest.approx(permk.marina_stepsize(A, B, q.L_minus, q.L_plus, q.L_pm, p), rel=1e-14)
    assert source == "Theorem AB (partial participation)"
    L = max(q.L_minus, q.L_plus)
    assert gamma >= 1 / (L * (1 + math.sqrt((1 - p) * (1 + comp.omega(10, 40)) / (p * s)))) * (1 - 1e-12)
    assert mean <= 2 * delta0 / (gamma * T)


# ------------------------------------------------------------------------------------------
# 3. bits, paths, resume, options
# ------------------------------------------------------------------------------------------
def test_bits_as_stated() -> None:
    q = synthetic(10, 40)
    r = permk.dasha(q, permk.PermK(), rounds=7, seed=0)
    assert r.bits_per_worker[-1] == 7 * 4 * 32 and r.bits_per_worker[0] == 0  # ⌈40/10⌉ floats a round, no start
    np.testing.assert_allclose(r.expected_bits_per_worker, r.bits_per_worker)
    pp = permk.dasha(q, permk.RandK(4), rounds=7, seed=0, participation=3, float_bits=64)
    assert pp.bits_per_worker[-1] == 7 * 4 * 64  # the largest message: a participant's
    assert pp.expected_bits_per_worker[-1] == pytest.approx(7 * 0.3 * 4 * 64)
    m = permk.marina(q, permk.PermK(), rounds=50, seed=1, participation=5, p=0.25)
    heads = int(m.coins.sum())
    assert m.bits_per_worker[-1] == heads * 40 * 32 + (50 - heads) * 4 * 32
    assert m.expected_bits_per_worker[-1] == pytest.approx(50 * (0.25 * 40 * 32 + 0.75 * 0.5 * 4 * 32))
    assert permk.dasha.theory.floats_per_round(permk.PermK(), 10, 40, r.params.own) == 4
    assert permk.dasha.theory.floats_per_round(permk.RandK(4), 10, 40, pp.params.own) == pytest.approx(0.3 * 4)


PATH_CASES = [
    ("dasha", permk.PermK(), {}), ("dasha", permk.RandK(3), {}), ("dasha", permk.BlockPermK(3), {}),
    ("dasha", permk.PermK(), {"participation": 3}), ("dasha", permk.RandK(3), {"participation": 5}),
    ("marina", permk.PermK(), {"participation": 3, "p": 0.3}), ("marina", permk.RandK(2), {"participation": 6, "p": 0.3}),
]


@pytest.mark.parametrize("name,comp,opts", PATH_CASES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("n,d", [(6, 20), (8, 5)])
def test_paths_agree_bit_for_bit(name: str, comp: permk.Compressor, opts: dict, n: int, d: int) -> None:
    q = synthetic(n, d, 1e-3, 0.5)
    method = getattr(permk, name)
    if opts.get("participation", 0) > n:
        return
    runs = {}
    for path in ("rust", "fused", "dense"):
        try:
            runs[path] = method(q, comp, rounds=40, seed=2, path=path, **opts)
        except ValueError as e:
            assert "path" in str(e)
    if name == "dasha" and "participation" in opts:
        # DASHA-PP's participants need their whole gradients (their estimators h_i): no
        # coordinate (fused) path; the dense path forms the messages from them, the Rust path
        # (the quadratic's kernel has the estimator step, and the compressor's rounds are native)
        # from the sent coordinates, the estimators in one native pass: the same bits
        assert "fused" not in runs and runs["dense"].params.path == "dense"
        assert ("rust" in runs) == permk.exchanges.native_rounds(comp), set(runs)
        if "rust" not in runs:
            return
    assert "dense" in runs and len(runs) >= 2
    ref = runs.pop("dense")
    for path, r in runs.items():
        np.testing.assert_array_equal(r.x, ref.x, err_msg=path)
        np.testing.assert_array_equal(r.grad_norm_sq, ref.grad_norm_sq, err_msg=path)
        assert r.state == ref.state, path


@pytest.mark.parametrize("name,comp,opts", PATH_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_resume_equals_an_uninterrupted_run(name: str, comp: permk.Compressor, opts: dict, tmp_path: object) -> None:
    q = synthetic(8, 24, 1e-3, 0.5)
    method = getattr(permk, name)
    full = method(q, comp, rounds=50, seed=6, **opts)
    first = method(q, comp, rounds=21, seed=6, **opts)
    path = f"{tmp_path}/state.npz"
    permk.save_state(first.state, path)
    second = method(q, comp, rounds=29, seed=6, state=permk.load_state(path), **opts)
    np.testing.assert_array_equal(second.x, full.x)
    assert second.state == full.state
    np.testing.assert_array_equal(second.grad_norm_sq, full.grad_norm_sq[21:])


@pytest.mark.parametrize("call,exc,match", [
    (lambda q: permk.dasha(q, permk.PermK(), rounds=2, seed=0, participation=0), ValueError, r"participation must be in 1\.\.n = 1\.\.10"),
    (lambda q: permk.dasha(q, permk.PermK(), rounds=2, seed=0, participation=11), ValueError, r"participation must be in 1\.\.n"),
    (lambda q: permk.dasha(q, permk.PermK(), rounds=2, seed=0, participation=2.5), TypeError, "participation"),
    (lambda q: permk.marina(q, permk.PermK(), rounds=2, seed=0, participation=11), ValueError, r"participation must be in 1\.\.n"),
    (lambda q: permk.marina(q, permk.PermK(), rounds=2, seed=0, participation=True), TypeError, "participation"),
    (lambda q: permk.dasha(q, permk.PermK(), rounds=2, seed=0, a=0.0), ValueError, r"a must be in \(0, 1\]"),
    (lambda q: permk.dasha(q, permk.PermK(), rounds=2, seed=0, a=1.5), ValueError, r"a must be in \(0, 1\]"),
    (lambda q: permk.dasha(q, permk.PermK(), rounds=2, seed=0, a=float("nan")), ValueError, "a"),
    (lambda q: permk.dasha(q, permk.TopK(3), rounds=2, seed=0), ValueError, "unbiased"),
    (lambda q: permk.dasha(q, permk.PermK(), rounds=2, seed=0, pl=True), ValueError, "PL"),
    (lambda q: permk.dasha(q, permk.PermK(), rounds=2, seed=0, p=0.5), TypeError, "options"),
])
def test_bad_options_raise_clear_errors(call: object, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        call(synthetic())  # type: ignore[operator]


def test_a_given_is_used_and_the_state_is_checked_on_resume() -> None:
    q = synthetic(6, 12)
    r = permk.dasha(q, permk.RandK(3), rounds=5, seed=0, a=0.5)
    assert r.params.own.a == 0.5
    with pytest.raises(TypeError, match="DashaState"):
        permk.dasha(q, permk.RandK(3), rounds=5, seed=0, state=permk.marina(q, permk.RandK(3), rounds=1, seed=0).state)
    pp = permk.dasha(q, permk.RandK(3), rounds=5, seed=0, participation=2)
    with pytest.raises(ValueError, match="participation"):  # a DASHA state cannot continue as DASHA-PP
        permk.dasha(q, permk.RandK(3), rounds=5, seed=0, participation=2, state=r.state)
    with pytest.raises(ValueError, match="participation"):
        permk.dasha(q, permk.RandK(3), rounds=5, seed=0, state=pp.state)
    with pytest.raises(ValueError, match="participation and a"):  # its rows G weigh h_i by (b − a)/a
        permk.dasha(q, permk.RandK(3), rounds=5, seed=0, participation=3, state=pp.state)
    with pytest.raises(ValueError, match="participation and a"):
        permk.dasha(q, permk.RandK(3), rounds=5, seed=0, participation=2, a=0.01, state=pp.state)
    assert permk.dasha(q, permk.RandK(3), rounds=5, seed=0, participation=2, state=pp.state).state.round == 10
    assert permk.dasha(q, permk.RandK(3), rounds=5, seed=0, a=0.2, state=r.state).state.round == 10  # G = [g_i]: any a


def test_selectable_in_the_experiments_and_the_complexity_calculator() -> None:
    from permk.experiments.specs import Spec, available_specs

    assert {"dasha-permk", "dasha-randk"} <= set(available_specs())
    assert Spec.parse("dasha-permk").method is permk.dasha
    from permk.cli import build_parser

    args = build_parser().parse_args(["quadratic", "--methods", "dasha-permk", "dasha-randk"])
    assert args.methods == ["dasha-permk", "dasha-randk"]
    c = permk.theory.complexity(permk.dasha, permk.RandK, n=10, d=100, L_minus=1.0, L_plus=1.0, L_pm=1.0, eps=1e-3, delta0=1.0)
    consts = Constants(L_minus=1.0, L_plus=1.0, L_pm=1.0)
    comp = permk.RandK(c.K)
    gamma = dasha_stepsize(comp.omega(10, 100), comp.ab_constants(10, 100)[0], consts.L_minus, consts.L_plus)
    assert c.gamma == pytest.approx(gamma) and c.rounds == math.ceil(2 / (gamma * 1e-3))


def test_pessimistic_constants_are_the_authors_mean_square_smoothness() -> None:
    """``constants="pessimistic"``: ``L_+ = sqrt((1/n)Σ L_i²)``, the authors' ``L̃``; ``L_−`` stays
    the smoothness of ``f`` (at most their ``L̄ = (1/n)Σ L_i``, so the step is at least theirs)."""
    q = synthetic(10, 40, 1e-3, 0.5)
    comp = permk.RandK(4)
    r = permk.dasha(q, comp, rounds=1, seed=0, constants="pessimistic")
    L_tilde = float(np.sqrt(np.mean(q.L_i**2)))
    w, n = comp.omega(10, 40), 10
    assert r.params.constants["L_plus"] == pytest.approx(L_tilde, rel=1e-15)
    assert r.params.gamma == pytest.approx(dasha_stepsize(w, w / n, q.L_minus, L_tilde), rel=1e-14)
    authors = 1 / (float(np.mean(q.L_i)) + L_tilde * np.sqrt(w * (4 * w + 1) / n))
    assert q.L_minus <= np.mean(q.L_i) and r.params.gamma >= authors


def test_the_native_dasha_pp_round_refuses_bad_arguments_by_name_and_writes_nothing() -> None:
    """``Tridiagonal.dasha_pp_values`` (DASHA-PP's Rust path) checks every argument before it
    writes ``H`` or ``G``: each bad one is a ValueError or TypeError naming it."""
    n, d, s = 6, 10, 3
    q = synthetic(n, d, 1e-3, 0.5)
    r = permk.Participation(permk.PermK(), s).round(n, d, seed=0, round=1)
    P = np.asarray(participants(n, s, seed=0, round=1), dtype=np.int64)
    x, y = np.ones(d), np.zeros(d)
    H, G = np.zeros((n, d)), np.zeros((n, d))
    kw = dict(coef=0.5, beta=0.1, b=0.5, p=0.5, w=1.0)
    L = int(np.asarray(r.offsets())[-1])
    bad = [
        (TypeError, "G:.*not shared", dict(H=H, G=H, rows=P)),  # the same array twice
        (TypeError, "H:", dict(H=H.astype(np.float32), G=G, rows=P)),
        (TypeError, "G:", dict(H=H, G=np.broadcast_to(G, G.shape), rows=P)),  # read-only
        (ValueError, "C-contiguous", dict(H=np.asfortranarray(H), G=G, rows=P)),
        (ValueError, "rows:", dict(H=H, G=G, rows=np.array([-1, 2]))),
        (ValueError, "rows:", dict(H=H, G=G, rows=np.array([0, 2, 10**12]))),
        (ValueError, "not a participant", dict(H=H, G=G, rows=P[:1])),
        (TypeError, "rows:", dict(H=H, G=G, rows=P.reshape(1, -1))),
        (ValueError, "H:", dict(H=np.zeros((n - 1, d)), G=G, rows=P)),
        (ValueError, "p:", dict(H=H, G=G, rows=P, p=0.0)),
        (ValueError, "p:", dict(H=H, G=G, rows=P, p=float("nan"))),
        (ValueError, "out:", dict(H=H, G=G, rows=P, out=np.empty(L - 1))),
        (ValueError, "share memory with G", dict(H=H, G=G, rows=P, out=G.ravel()[:L])),
    ]
    for exc, match, args in bad:
        with pytest.raises(exc, match=match):
            q.kernel.dasha_pp_values(r, x, y, 0, n, **{**kw, **args})
    with pytest.raises(ValueError, match="x_new"):
        q.kernel.dasha_pp_values(r, np.ones(d + 1), y, 0, n, H=H, G=G, rows=P, **kw)
    with pytest.raises(ValueError, match="stop"):
        q.kernel.dasha_pp_values(r, x, y, 0, n + 1, H=H, G=G, rows=P, **kw)
    assert not H.any() and not G.any()
    v = q.kernel.dasha_pp_values(r, x, y, 0, n, H=H, G=G, rows=P, **kw)
    assert v.shape == (L,) and H[P].any() and not np.delete(H, P, axis=0).any()
