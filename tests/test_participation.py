"""Tests of partial participation as a compressor (permk.compressors.participation) and of the DASHA /
DASHA-PP step rules (permk.theory.steps).

1. the sampling: ``s`` distinct workers, a pure function of ``(seed, round)``, uniform over the
   ``s``-subsets (chi-square);
2. the wrapped messages are the inner ones times ``n/s`` on the participants and nothing
   elsewhere, and every form (compress, compress_all, compress_rows, aggregate, the round's
   plan) agrees bit for bit;
3. the theory by exact enumeration of the sampled sets and of the inner compressor's outcomes on
   tiny cases (unbiasedness, ω, the AB equality), and by ``permk.theory.estimate_ab``;
4. bits, capabilities, bad input;
5. the step rules against hand computations and the authors' formula.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from scipy import stats

import permk
from permk.compressors.participation import Participation, participants, participation_mask
from permk.theory.steps import dasha_momentum, dasha_pp_stepsize, dasha_stepsize

INNERS = [
    permk.PermK(),
    permk.RandK(2),
    permk.BlockPermK(2),
    permk.Identity(),
    permk.NaturalCompression(),
    permk.Compose(permk.RandK(2), permk.QSGD(2)),
]


# ------------------------------------------------------------------------------------------
# 1. sampling
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,s", [(1, 1), (5, 1), (5, 3), (5, 5), (40, 7)])
def test_participants_are_s_distinct_workers_from_seed_and_round(n: int, s: int) -> None:
    for t in range(20):
        who = participants(n, s, seed=3, round=t)
        assert who.dtype == np.int64 and len(who) == s and len(set(who.tolist())) == s
        assert (np.diff(who) > 0).all() and who.min() >= 0 and who.max() < n
        np.testing.assert_array_equal(who, participants(n, s, seed=3, round=t))
        assert participation_mask(n, s, seed=3, round=t).sum() == s
    with pytest.raises(ValueError):
        participants(n, s, seed=3, round=0)[0] = 0  # read-only: the cached set is shared


def test_the_draw_is_numpys_default_rng_permutation() -> None:
    """The pinned stream: the sorted first s of numpy's default_rng([seed, round, tag])
    .permutation(n), which the core computes natively (numpy's SeedSequence, PCG64 and shuffle),
    on seeds and rounds of one and two 32-bit words, n from 1 to past 2**16 (the 32-bit and
    masked draws), every s."""
    from permk._core import numpy_permutation_head
    from permk.compressors.participation import _SAMPLING_TAG, _sample_numpy

    rng = np.random.default_rng(0)
    cases = [(n, s, seed, t) for n in (1, 2, 3, 10, 64, 65, 1000) for s in {1, n // 2 or 1, n}
             for seed in (0, 1, 2**32 - 1, 2**32, 2**63 + 5) for t in (0, 1, 17, 2**40)]
    cases += [(70_000, 3, 5, 9), (2**17 + 3, 2**16, 1, 2)]
    cases += [(int(rng.integers(1, 300)), 1, int(rng.integers(2**63)), int(rng.integers(2**63))) for _ in range(50)]
    for n, s, seed, t in cases:
        np.testing.assert_array_equal(numpy_permutation_head([seed, t, _SAMPLING_TAG], n, s), _sample_numpy(n, s, seed, t),
                                      err_msg=str((n, s, seed, t)))
        np.testing.assert_array_equal(participants(n, s, seed=seed, round=t), _sample_numpy(n, s, seed, t))
    order = np.random.default_rng([3, 4, 5]).permutation(20)  # the order itself, one head at a time
    for s in range(1, 21):
        np.testing.assert_array_equal(numpy_permutation_head([3, 4, 5], 20, s), np.sort(order[:s]))
    with pytest.raises(ValueError, match="s"):
        numpy_permutation_head([1], 3, 4)


def test_participants_differ_across_rounds_and_seeds() -> None:
    sets = {tuple(participants(10, 3, seed=seed, round=t)) for seed in (0, 1) for t in range(50)}
    assert len(sets) > 40


@pytest.mark.parametrize("n,s", [(4, 2), (5, 3), (6, 1)])
def test_participants_are_uniform_over_the_subsets(n: int, s: int) -> None:
    rounds = 6000
    counts = Counter(tuple(participants(n, s, seed=7, round=t).tolist()) for t in range(rounds))
    subsets = list(itertools.combinations(range(n), s))
    assert set(counts) <= set(subsets)
    observed = [counts.get(c, 0) for c in subsets]
    p = stats.chisquare(observed).pvalue
    assert p > 1e-4, (p, observed)


# ------------------------------------------------------------------------------------------
# 2. messages
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("inner", INNERS, ids=lambda c: c.name)
@pytest.mark.parametrize("n,d,s", [(4, 10, 2), (5, 3, 3), (3, 7, 3), (6, 6, 1)])
def test_messages_are_the_inner_ones_scaled_on_the_participants(inner: permk.Compressor, n: int, d: int, s: int) -> None:
    c = Participation(inner, s)
    A = np.random.default_rng(n * d + s).standard_normal((n, d))
    for t in range(5):
        mask = participation_mask(n, s, seed=9, round=t)
        want = np.where(mask[:, None], inner.compress_all(A, seed=9, round=t) * (n / s), 0.0)
        got = c.compress_all(A, seed=9, round=t)
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=0)
        for i in range(n):
            m = c.compress(A[i], worker=i, n_workers=n, seed=9, round=t)
            if not mask[i]:
                assert len(m.values) == 0 and len(m.indices) == 0


@pytest.mark.parametrize("inner", INNERS, ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n,d,s", [(4, 10, 2), (5, 3, 3), (7, 2, 4)])
def test_every_form_agrees_bit_for_bit(inner: permk.Compressor, dtype: type, n: int, d: int, s: int) -> None:
    c = Participation(inner, s)
    A = np.random.default_rng(5).standard_normal((n, d)).astype(dtype)
    for t in range(4):
        rows = c.compress_all(A, seed=2, round=t)
        per_worker = np.stack([c.compress(A[i], worker=i, n_workers=n, seed=2, round=t).to_dense() for i in range(n)])
        np.testing.assert_array_equal(rows, per_worker)
        block = c.compress_rows(A[1:3], start=1, n_workers=n, seed=2, round=t)
        np.testing.assert_array_equal(block.dense(d), rows[1:3])
        agg = c.aggregate(A, seed=2, round=t)
        np.testing.assert_array_equal(agg, permk.aggregate_messages(
            [c.compress(A[i], worker=i, n_workers=n, seed=2, round=t) for i in range(n)]))
        if c.capabilities.shared_plan:
            r = c.round(n, d, seed=2, round=t)
            values = r.gather(A, 0)
            if dtype == np.float64:  # a round's mean sums in float64
                np.testing.assert_array_equal(r.mean(values), agg)
            dense = np.zeros((n, d), dtype=dtype)
            dense[r.rows(0, n), r.coords(0, n)] = values
            np.testing.assert_array_equal(dense, rows)


def test_a_shared_inner_plan_stays_shared_and_is_restricted_to_the_participants() -> None:
    n, d, s = 5, 12, 2
    c = Participation(permk.PermK(), s)
    plan = c.plan(n, d, seed=4, round=1)
    assert c.capabilities.shared_plan and plan.disjoint and c.round(n, d, seed=4, round=1).disjoint
    inner = permk.PermK().plan(n, d, seed=4, round=1)
    who = participants(n, s, seed=4, round=1)
    sizes = np.diff(plan.offsets)
    assert (sizes[who] > 0).all() and sizes.sum() == sizes[who].sum()
    for i in who:
        np.testing.assert_array_equal(plan.worker(i), inner.worker(i))
    np.testing.assert_array_equal(plan.scales, inner.scales * (n / s))
    assert Participation(permk.NaturalCompression(), 2).plan(n, d, seed=4, round=1) is None


# ------------------------------------------------------------------------------------------
# 3. theory by exact enumeration
# ------------------------------------------------------------------------------------------
def _inner_outcomes(kind: str, n: int, d: int) -> list[np.ndarray]:
    """Every equally likely outcome of the inner family as matrices ``M`` (``C_i(a) = M[i] * a``)."""
    if kind == "identity":
        return [np.ones((n, d))]
    if kind == "permk":  # d = n: a uniform permutation gives worker i coordinate π_i, scaled by n
        assert d == n
        outs = []
        for pi in itertools.permutations(range(d)):
            M = np.zeros((n, d))
            M[np.arange(n), pi] = n
            outs.append(M)
        return outs
    if kind == "rand1":  # RandK(1): each worker one independent uniform coordinate, scaled by d
        outs = []
        for choice in itertools.product(range(d), repeat=n):
            M = np.zeros((n, d))
            M[np.arange(n), choice] = d
            outs.append(M)
        return outs
    raise AssertionError(kind)


_COMPRESSORS = {"identity": permk.Identity(), "permk": permk.PermK(), "rand1": permk.RandK(1)}


@pytest.mark.parametrize("kind,n,d", [("identity", 3, 2), ("identity", 4, 3), ("permk", 3, 3), ("permk", 4, 4),
                                      ("rand1", 3, 2), ("rand1", 2, 3)])
def test_unbiasedness_omega_and_ab_equality_by_enumeration(kind: str, n: int, d: int) -> None:
    """Over every ``s``-subset and every inner outcome: ``E Q_i(a_i) = a_i``,
    ``E‖Q_i(a) − a‖² = ω‖a‖²`` and ``E‖(1/n)Σ Q_i(a_i) − ā‖² = A(1/n)Σ‖a_i‖² − B‖ā‖²`` with the
    stated constants (equalities: the inner compressors are exact)."""
    rng = np.random.default_rng(n * 10 + d)
    A = rng.standard_normal((n, d)) + 0.5 * rng.standard_normal(d)
    abar = A.mean(axis=0)
    mean_sq = float((A**2).sum(axis=1).mean())
    inner_outcomes = _inner_outcomes(kind, n, d)
    for s in range(1, n + 1):
        c = Participation(_COMPRESSORS[kind], s)
        subsets = list(itertools.combinations(range(n), s))
        total = len(subsets) * len(inner_outcomes)
        mean_rows = np.zeros((n, d))
        var_mean = 0.0
        var_each = np.zeros(n)
        for S in subsets:
            mask = np.zeros(n)
            mask[list(S)] = n / s
            for M in inner_outcomes:
                Q = mask[:, None] * M * A
                mean_rows += Q / total
                var_mean += float(((Q.mean(axis=0) - abar) ** 2).sum()) / total
                var_each += ((Q - A) ** 2).sum(axis=1) / total
        np.testing.assert_allclose(mean_rows, A, rtol=1e-12, atol=1e-12)
        Ab, Bb = c.ab_constants(n, d)
        assert var_mean == pytest.approx(Ab * mean_sq - Bb * float((abar**2).sum()), rel=1e-10, abs=1e-12)
        np.testing.assert_allclose(var_each, c.omega(n, d) * (A**2).sum(axis=1), rtol=1e-10)


@pytest.mark.parametrize("inner,n,d,s", [(permk.PermK(), 4, 8, 2), (permk.RandK(2), 5, 6, 3), (permk.PermK(), 6, 3, 4),
                                        (permk.Compose(permk.PermK(), permk.NaturalCompression()), 4, 8, 3)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_stated_constants_survive_estimate_ab(inner: permk.Compressor, n: int, d: int, s: int) -> None:
    c = Participation(inner, s)
    est = permk.theory.estimate_ab(c, n=n, d=d, trials=1500, seed=11)
    assert est.stated == c.ab_constants(n, d)
    assert est.consistent, est


@pytest.mark.parametrize("n,d", [(5, 20), (10, 3), (1, 4)])
def test_closed_forms_of_the_constants(n: int, d: int) -> None:
    for s in range(1, n + 1):
        kappa = 0.0 if s == n else (n - s) / (s * (n - 1))
        k = max(1, d // 2)
        w = d / k - 1
        assert Participation(permk.RandK(k), s).ab_constants(n, d) == pytest.approx((w / s + kappa, kappa))
        assert Participation(permk.RandK(k), s).omega(n, d) == pytest.approx(n / s * (w + 1) - 1)
        if d >= n:
            assert Participation(permk.PermK(), s).ab_constants(n, d) == pytest.approx((n / s, 1.0))
    # every worker: the inner constants
    assert Participation(permk.RandK(1), n).ab_constants(n, d) == pytest.approx(permk.RandK(1).ab_constants(n, d))


# ------------------------------------------------------------------------------------------
# 4. bits, capabilities, bad input
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("inner", INNERS, ids=lambda c: c.name)
def test_bits_and_capabilities(inner: permk.Compressor) -> None:
    n, d, s = 6, 12, 4
    c = Participation(inner, s)
    assert c.bits_per_worker(n, d) == inner.bits_per_worker(n, d)
    assert c.floats_per_worker(n, d) == inner.floats_per_worker(n, d)
    assert c.expected_bits_per_worker(n, d, float_bits=64) == pytest.approx(s / n * inner.expected_bits_per_worker(n, d, float_bits=64))
    assert c.expected_floats_per_worker(n, d) == pytest.approx(s / n * inner.expected_floats_per_worker(n, d))
    caps = c.capabilities
    assert not caps.fixed_size and not caps.deterministic and caps.tunable is None
    assert caps.shared_plan == inner.capabilities.shared_plan and caps.unbiased
    assert caps.random_size == (not inner.capabilities.fixed_size or inner.capabilities.random_size)
    assert c.alpha(n, d) is None
    assert c.fingerprint() == Participation(inner, s).fingerprint() != Participation(inner, s - 1).fingerprint()


@pytest.mark.parametrize("build,exc,match", [
    (lambda: Participation(permk.PermK(), 0), ValueError, "participation"),
    (lambda: Participation(permk.PermK(), 1.5), TypeError, "participation"),
    (lambda: Participation(permk.TopK(2), 1), ValueError, "unbiased"),
    (lambda: Participation("permk", 1), TypeError, "inner"),
    (lambda: Participation(Participation(permk.PermK(), 1), 1), TypeError, "inner"),
    (lambda: Participation(permk.PermK(), 4).check(3, 5), ValueError, r"1\.\.n = 1\.\.3"),
    (lambda: participants(3, 4, seed=0, round=0), ValueError, "participation"),
    (lambda: participants(3, 1, seed=None, round=0), TypeError, "seed"),
])
def test_bad_input_raises_clear_errors(build: object, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        build()  # type: ignore[operator]


# ------------------------------------------------------------------------------------------
# 5. step rules
# ------------------------------------------------------------------------------------------
def test_dasha_momentum_and_step_by_hand() -> None:
    assert dasha_momentum(0.0) == 1.0 and dasha_momentum(2.0) == 0.2 and dasha_momentum(2.0, 0.5) == 0.1
    # ω = 1, A = 1/2 (RandK(k = d/2) on n = 2 workers): 1/(1 + 2·sqrt(5/2))
    assert dasha_stepsize(1.0, 0.5, 1.0, 2.0) == pytest.approx(1 / (1 + 2 * math.sqrt(2.5)), rel=1e-15)
    assert dasha_stepsize(0.0, 0.0, 4.0, 7.0) == 0.25  # no compression: GD's 1/L
    # PermK on n = 10 workers (ω = 9, A = 1): sqrt(37)
    assert dasha_stepsize(9.0, 1.0, 1.0, 1.0) == pytest.approx(1 / (1 + math.sqrt(37)), rel=1e-15)


@pytest.mark.parametrize("n,d,k", [(4, 12, 3), (10, 100, 10), (3, 5, 5), (7, 9, 1)])
def test_dasha_step_is_the_authors_for_independent_compressors(n: int, d: int, k: int) -> None:
    """``ZeroMarinaMasterAlgorithm._estimate_gamma``: ``1/(L̄ + L̃ sqrt(ω(4ω + 1)/n))`` with the
    mean ``L̄`` of the ``L_i`` and ``L̃ = sqrt(mean L_i²)``."""
    c = permk.RandK(k)
    L_i = np.random.default_rng(n).uniform(0.5, 3.0, n)
    L_bar, L_tilde = float(np.mean(L_i)), float(np.sqrt(np.mean(L_i**2)))
    w = c.omega(n, d)
    authors = 1 / (L_bar + L_tilde * np.sqrt((w * (4 * w + 1)) / n))
    assert dasha_stepsize(w, c.ab_constants(n, d)[0], L_bar, L_tilde) == pytest.approx(authors, rel=1e-14)


def test_dasha_pp_step_by_hand() -> None:
    # n = 4, s = 2: p_a = 1/2, p_aa = 2·1/(4·3) = 1/6, 1 − p_aa/p_a = 2/3; ω = 1, A = 1/4:
    # 48·(1/4)·3/(1/4) + 16·(2/3)/(4·(1/4)) = 144 + 32/3
    assert dasha_pp_stepsize(1.0, 0.25, 4, 2, 1.0, 2.0) == pytest.approx(1 / (1 + 2 * math.sqrt(144 + 32 / 3)), rel=1e-15)
    # every worker: only the compression term, 48A(2ω + 1)
    assert dasha_pp_stepsize(1.0, 0.25, 4, 4, 1.0, 1.0) == pytest.approx(1 / (1 + math.sqrt(36)), rel=1e-15)
    # no compression, one of n workers: 16(1 − 0)/(n/n²) = 16n
    assert dasha_pp_stepsize(0.0, 0.0, 9, 1, 1.0, 1.0) == pytest.approx(1 / (1 + 12), rel=1e-15)
    assert dasha_pp_stepsize(0.0, 0.0, 1, 1, 2.0, 1.0) == 0.5


def _dasha_pp_lyapunov_constant(omega: float, A: float, n: int, s: int) -> float:
    """The ``c²`` of a step ``1/(L_− + c L_+)`` under which DASHA-PP (gradient setting, the
    participants' updates of :class:`permk.methods.Dasha`) decreases
    ``Φ = f − f* + γ[‖ū‖²/a + κ₂ U + ‖ē‖²/b + κ₄ E]`` in expectation by ``(γ/2)‖∇f‖²``, with
    ``u_i = g_i − h_i``, ``e_i = h_i − ∇f_i``, ``U``, ``E`` their mean squares.

    Written out from the updates: ``E e_i⁺ = (1 − b) e_i`` and ``E u_i⁺ = (1 − a) u_i``, with
    zero-mean noises of variance ``((1 − p_a)/p_a)‖k_i‖²`` (participation) and
    ``a²((1 − p_a)/p_a)‖u_i‖² + (ω/p_a)‖w_i‖²`` (participation, compression), ``k_i = Δ_i − b e_i``,
    ``w_i = k_i − a u_i``; their means over the workers have variances at most
    ``q·(1/n)Σ‖k_i‖²``, ``a² q U`` (``q = (1 − p_aa/p_a)/(n p_a)``: sampling without replacement
    makes the cross terms non-positive) and ``(A/p_a)(1/n)Σ‖w_i‖²`` (the AB inequality of the
    vectors ``χ_i w_i/p_a``). With ``‖w‖² ≤ 2‖k‖² + 2a²‖u‖²``, ``‖k‖² ≤ 2‖Δ‖² + 2b²‖e‖²`` and
    ``(1/n)Σ‖Δ_i‖² ≤ L_+²‖x⁺ − x‖²``, the choice ``a = p_a/(2ω + 1)`` leaves ``U`` the margin
    ``a`` and ``b = p_a/(2 − p_a)`` leaves ``E`` the margin ``b``, which fix ``κ₂``, ``κ₄``; the
    ``‖x⁺ − x‖²`` terms then need ``1/γ − L_− ≥ γ c² L_+²``."""
    p = s / n
    p_aa = s * (s - 1) / (n * (n - 1)) if n > 1 else 1.0
    a, b = p / (2 * omega + 1), p / (2 - p)
    q = (1 - p_aa / p) / (n * p)
    k2 = q + 2 * A / p  # (κ₁ a² q + 2a² κ₁ A/p)/a with κ₁ = 1/a
    w_coef = A / (p * a) + omega / p * k2  # of (1/n)Σ‖w_i‖²
    k4 = 4 * b * w_coef + 2 * q  # 2b²(2·w_coef + q/b)/b
    k_coef = 2 * w_coef + q / b + k4 * (1 - p) / p  # of (1/n)Σ‖k_i‖²
    return 2 * 2 * k_coef  # ‖k‖² ≤ 2‖Δ‖² + …, and the descent lemma's (1/(2γ) − L/2)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 10, 100, 1000])
def test_dasha_pp_step_meets_the_lyapunov_conditions(n: int) -> None:
    """At :func:`dasha_pp_stepsize` the conditions of the analysis above hold, for independent
    compressors (``A = ω/n``), PermK (``ω = n − 1``, ``A = 1``), no compression, and any ``A``
    above ``ω/n``: the step's ``c²`` is at least the analysis's. It is within 0.1% of it with
    one participant and no compression (the analysis has power: a 1% smaller constant fails)."""
    ratios = []
    for s in sorted({1, max(1, n // 10), max(1, n // 2), max(1, n - 1), n}):
        for omega, A in [(0.0, 0.0), (0.1, 0.1 / n), (1.0, 1 / n), (9.0, 9 / n), (99.0, 99 / n), (999.0, 999 / n),
                         (n - 1.0, 1.0), (9.0, 45 / n), (0.0, 0.3)]:
            c_sq = (1 / dasha_pp_stepsize(omega, A, n, s, 1.0, 1.0) - 1) ** 2
            need = _dasha_pp_lyapunov_constant(omega, max(A, omega / n), n, s)
            ratios.append(need / c_sq if c_sq > 0 else float(need > 0))
    assert max(ratios) <= 1.0 + 1e-9
    if n >= 100:
        assert max(ratios) > 0.99


def test_dasha_pp_step_shrinks_as_fewer_workers_participate() -> None:
    steps = [dasha_pp_stepsize(3.0, 0.3, 10, s, 1.0, 1.0) for s in range(1, 11)]
    assert all(a < b for a, b in zip(steps, steps[1:]))


@pytest.mark.parametrize("call,exc,match", [
    (lambda: dasha_momentum(-1.0), ValueError, "omega"),
    (lambda: dasha_momentum(1.0, 0.0), ValueError, "p_a"),
    (lambda: dasha_stepsize(1.0, float("nan"), 1.0, 1.0), ValueError, "A"),
    (lambda: dasha_stepsize(0.0, 0.0, 0.0, 1.0), ValueError, "M = 0"),
    (lambda: dasha_pp_stepsize(1.0, 0.1, 4, 5, 1.0, 1.0), ValueError, "participation"),
    (lambda: dasha_pp_stepsize(1.0, 0.1, 4, 0, 1.0, 1.0), ValueError, "participation"),
    (lambda: dasha_pp_stepsize(1.0, 0.1, 4, 2.0, 1.0, 1.0), TypeError, "integers"),
])
def test_step_rules_reject_bad_input(call: object, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        call()  # type: ignore[operator]
