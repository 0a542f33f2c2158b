"""DIANA, RandDIANA and shifted DCGD: their step sizes on small cases computed by hand, and the
methods themselves (convergence at the theory step against the theorem's bound, bits per round,
paths bit for bit, resume, option errors)."""

from __future__ import annotations

import math

import pytest

from permk.theory.steps import diana_stepsize, rand_diana_stepsize, shift_step_class, shifted_dcgd_stepsize


# ---------------------------------------------------------------------------------------------
# step sizes
# ---------------------------------------------------------------------------------------------
def test_diana_step_by_hand() -> None:
    # α = 1/2, ω = 1, A = 1/2, L− = 1, L+ = 2: min{1/2, (1/2)/(2·2·sqrt(1/2 · 5/2))} = 1/(4√5)
    assert diana_stepsize(0.5, 1.0, 0.5, 1.0, 2.0) == pytest.approx(1 / (4 * math.sqrt(5)), rel=1e-15)
    # small variance: 1/(2L−) binds
    assert diana_stepsize(0.5, 1.0, 1e-6, 1.0, 2.0) == 0.5
    # no variance (Identity: A = 0) or L+ = 0: 1/(2L−)
    assert diana_stepsize(1.0, 0.0, 0.0, 4.0, 3.0) == 0.125
    assert diana_stepsize(0.1, 9.0, 0.9, 4.0, 0.0) == 0.125
    # L− = 0: the variance term alone: α = 1/10, A = 9/10, L+ = 1 → 0.1/(2 sqrt(0.9 · 2.1))
    assert diana_stepsize(0.1, 9.0, 0.9, 0.0, 1.0) == pytest.approx(0.1 / (2 * math.sqrt(0.9 * 2.1)), rel=1e-15)


def test_diana_step_errors() -> None:
    with pytest.raises(ValueError, match=r"alpha <= 1/\(omega \+ 1\)"):
        diana_stepsize(0.6, 1.0, 0.5, 1.0, 1.0)
    with pytest.raises(ValueError, match="alpha"):
        diana_stepsize(0.0, 1.0, 0.5, 1.0, 1.0)
    with pytest.raises(ValueError, match="alpha"):
        diana_stepsize(1.5, 0.0, 0.5, 1.0, 1.0)
    with pytest.raises(ValueError, match="constant"):
        diana_stepsize(0.5, 1.0, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="L_plus"):
        diana_stepsize(0.5, 1.0, 0.5, 1.0, -1.0)
    with pytest.raises(TypeError, match="A"):
        diana_stepsize(0.5, 1.0, "x", 1.0, 1.0)


def test_shift_step_class_from_ab_constants() -> None:
    assert shift_step_class(1.0, 1.0, 4) == "permutation"  # PermK, d ≥ n
    assert shift_step_class(0.4, 0.4, 4) == "permutation"  # PermK, n > d
    assert shift_step_class(0.0, 0.0, 4) == "permutation"  # Identity
    assert shift_step_class(0.75, 0.0, 4) == "independent"  # RandK with ω + 1 = n
    assert shift_step_class(0.5, 0.0, 4) == "independent"  # RandK with ω + 1 < n
    assert shift_step_class(0.76, 0.0, 4) is None  # RandK with ω + 1 > n
    assert shift_step_class(2.0, 2.0, 4) is None  # IV(2): not PermK's class
    assert shift_step_class(1.0, 0.5, 4) is None


def test_rand_diana_steps_by_hand() -> None:
    # permutation: min{1/(4(L + 4L_B)), √p/(2 L_var)}
    assert rand_diana_stepsize(0.25, 1.0, 2.0, 1.0, kind="permutation") == pytest.approx(1 / 36, rel=1e-15)
    assert rand_diana_stepsize(0.25, 1.0, 2.0, 10.0, kind="permutation") == pytest.approx(0.025, rel=1e-15)
    assert rand_diana_stepsize(0.25, 1.0, 2.0, 0.0, kind="permutation") == pytest.approx(1 / 36, rel=1e-15)
    # independent: min{1/(4(5L + 4L_B)), √p/(2 sqrt(L_var² + L²))}
    assert rand_diana_stepsize(0.25, 1.0, 1.0, math.sqrt(15), kind="independent") == pytest.approx(1 / 36, rel=1e-15)
    assert rand_diana_stepsize(0.01, 1.0, 0.0, math.sqrt(3), kind="independent") == pytest.approx(0.025, rel=1e-15)
    # strongly convex: permutation min{1/(L + 6L_B), p/(2μ)}, independent min{1/(7L + 6L_B), p/(2μ)}
    assert rand_diana_stepsize(0.5, 1.0, 1.0, 5.0, kind="permutation", mu=0.1) == pytest.approx(1 / 7, rel=1e-15)
    assert rand_diana_stepsize(0.5, 1.0, 1.0, 5.0, kind="independent", mu=0.1) == pytest.approx(1 / 13, rel=1e-15)
    assert rand_diana_stepsize(0.5, 1.0, 1.0, 5.0, kind="independent", mu=10.0) == pytest.approx(0.025, rel=1e-15)
    with pytest.raises(ValueError, match="kind"):
        rand_diana_stepsize(0.5, 1.0, 1.0, 1.0, kind="correlated")
    with pytest.raises(ValueError, match="p must be in"):
        rand_diana_stepsize(0.0, 1.0, 1.0, 1.0, kind="permutation")
    with pytest.raises(ValueError, match="constant"):
        rand_diana_stepsize(0.5, 0.0, 0.0, 1.0, kind="permutation")


def test_shifted_dcgd_step_by_hand() -> None:
    # 1/(((ω+1)/n) L + ((ω+1)/n + 1) L_B)
    assert shifted_dcgd_stepsize(3.0, 4, 2.0, 3.0) == pytest.approx(1 / 8, rel=1e-15)
    assert shifted_dcgd_stepsize(1.0, 4, 2.0, 3.0) == pytest.approx(2 / 11, rel=1e-15)
    assert shifted_dcgd_stepsize(0.0, 1, 1.0, 0.0) == 1.0
    with pytest.raises(ValueError, match="n must be"):
        shifted_dcgd_stepsize(1.0, 0, 1.0, 1.0)
    with pytest.raises(ValueError, match="constant"):
        shifted_dcgd_stepsize(1.0, 2, 0.0, 0.0)
