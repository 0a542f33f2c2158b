"""Failures are clear errors, runs are reproducible, and nothing is lost: the reproductions of
the reliability issue, each kept as a regression test (a crash-prone call runs in a subprocess,
so that an abort fails the test instead of killing pytest).

1. no abort, no unbounded allocation (MemoryError before allocating, no panic);
2. no silent wrong answer from a user's problem (every oracle's output checked);
3. reproducible constants (the same in every process);
4. step sizes and constants validated;
5. the command line refuses nonsense;
9. smaller coercions that must be errors;
10. only what is asked is computed.
(Resume and records: tests/test_experiments.py; MPI aborts: tests/test_distributed.py.)
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import permk
import permk.distributed as pd
from conftest import CLI


def _in_subprocess(code: str, timeout: float = 120) -> str:
    """Run ``code`` in a fresh interpreter; it must exit normally (no abort, no kill) and print
    the outcome, which is returned."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"the interpreter died (code {proc.returncode}): {proc.stderr[-2000:]}"
    return proc.stdout.strip()


# ---------------------------------------------------------------------------------------------
# 1. no abort, no unbounded allocation
# ---------------------------------------------------------------------------------------------
HUGE = "permk.Quadratic.synthetic(n=10**5, d=10**6, lam=1e-6, noise_scale=0.1)"
ALLOCATIONS = {
    "compress_all 800 GB": "permk.PermK().compress_all(np.broadcast_to(np.ones((1, 1)), (10**5, 10**6)), seed=0, round=0)",
    "RandK plan of 2**32-1 workers": "permk.RandK(1).plan(2**32 - 1, 10, seed=0, round=0)",
    "PermK plan of 2**31 workers": "permk.PermK().plan(2**31, 2**32 - 1, seed=0, round=0)",
    "EF21 on the README's large quadratic": f"permk.ef21({HUGE}, permk.TopK(10), rounds=1, seed=0)",
    "its local gradients": f"q = {HUGE}; q.local_grads(q.x0)",
    "MARINA's dense path on it": f"permk.marina({HUGE}, permk.PermK(), rounds=1, seed=0, path='dense')",
    "the power method on it": f"permk.theory.smoothness({HUGE}, 'power', seed=0)",
    "the native local gradients": "_core.Tridiagonal([0.25] * 10**5, 0.0, [0.0] * 10**5).local_grads(np.zeros(10**6))",
}


@pytest.mark.parametrize("call", list(ALLOCATIONS.values()), ids=list(ALLOCATIONS))
def test_a_huge_request_is_a_memory_error_not_a_crash(call: str) -> None:
    out = _in_subprocess(f"""
        import numpy as np, permk
        from permk import _core
        try:
            {call}
            print("no error")
        except MemoryError as e:
            print("MemoryError", e)
    """)
    assert out.startswith("MemoryError") and "Unable to allocate" in out, out


def test_the_exact_constants_of_a_huge_synthetic_quadratic_are_closed_forms() -> None:
    q = eval(HUGE, {"permk": permk})
    s = permk.theory.smoothness(q)
    assert (s.L_minus, s.L_plus, s.L_pm) == (q.L_minus, q.L_plus, q.L_pm)


NATIVE_BAD = {
    "loss of an empty x": ("_core.Tridiagonal([1.0], 0.1, [0.0]).loss(np.zeros(0))", "ValueError"),
    "grad of an empty x": ("_core.Tridiagonal([1.0], 0.1, [0.0]).grad(np.zeros(0))", "ValueError"),
    "local_grads of an empty x": ("_core.Tridiagonal([1.0], 0.1, [0.0]).local_grads(np.zeros(0))", "ValueError"),
    "solve_mean of nothing": ("_core.Tridiagonal([1.0], 0.1, [0.0]).solve_mean([])", "ValueError"),
    "a permutation of 10**12 entries": ("_core.permk_plan_from_permutations(1, 10**12, [0], [0])", "ValueError"),
}


@pytest.mark.parametrize("call,kind", list(NATIVE_BAD.values()), ids=list(NATIVE_BAD))
def test_private_entry_points_raise_instead_of_panicking(call: str, kind: str) -> None:
    out = _in_subprocess(f"""
        import numpy as np
        from permk import _core
        try:
            {call}
            print("no error")
        except BaseException as e:
            print(type(e).__name__, e)
    """)
    assert out.startswith(kind), out


def test_in_place_kernels_validate_before_they_write() -> None:
    q = permk.Quadratic.synthetic(4, 6, 1e-2, 0.3, seed=0)
    x = np.linspace(-1, 1, 6)
    G = np.zeros((4, 6))
    before = G.copy()
    with pytest.raises(ValueError):
        q.kernel.error_feedback(permk.TopK(7).kernel, x, G, 0, 0, 0)  # k > d
    with pytest.raises(ValueError):
        q.kernel.error_feedback(permk.TopK(2).kernel, x, G[:, :5].copy(), 0, 0, 0)  # G of the wrong width
    np.testing.assert_array_equal(G, before)
    *_, finite = q.kernel.error_feedback(permk.TopK(2).kernel, np.full(6, np.nan), G, 0, 0, 0)
    assert finite is False
    np.testing.assert_array_equal(G, before)  # a non-finite residual leaves G as it was


@pytest.mark.slow
def test_the_command_line_refuses_a_huge_grid(tmp_path: Path) -> None:
    r = subprocess.run([*CLI, "quadratic", "--quick", "--n", "100000", "--d", "1000000", "--methods", "ef21-topk",
                        "--no-plot", "--no-progress", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "permk quadratic: error: Unable to allocate" in r.stderr, r.stderr[-2000:]


# ---------------------------------------------------------------------------------------------
# 2. no silent wrong answer from a user's problem
# ---------------------------------------------------------------------------------------------
class UserProblem:
    """A well-formed plain numpy problem, and its broken variants."""

    n, d = 2, 3

    def __init__(self) -> None:
        self.x0 = np.ones(3)
        self.L_minus = self.L_plus = self.L_pm = 1.0

    def loss(self, x: np.ndarray) -> float:
        return float(x @ x) / 2

    def grad(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=float)

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        return np.stack([x, x])

    def local_grad_coords(self, x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return np.asarray(x)[cols]


class ShortGrad(UserProblem):
    def grad(self, x: np.ndarray) -> np.ndarray:
        return np.zeros(1)


class FourRows(UserProblem):
    def local_grads(self, x: np.ndarray) -> np.ndarray:
        return np.stack([x] * 4)


class ShortCoords(UserProblem):
    def local_grad_coords(self, x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return np.asarray(x)[cols][:-1]


class ComplexGrad(UserProblem):
    def grad(self, x: np.ndarray) -> np.ndarray:
        return x + 1j


@pytest.mark.parametrize(
    ("problem", "run", "message"),
    [
        (ShortGrad(), lambda p: permk.marina(p, permk.PermK(), rounds=3, seed=0), r"problem\.grad\(x\) returned shape \(1,\), expected \(3,\)"),
        (FourRows(), lambda p: permk.marina(p, permk.PermK(), rounds=3, seed=0, path="dense", p=0.5),
         r"problem\.local_grads\(x\) returned shape \(4, 3\), expected \(2, 3\)"),
        (FourRows(), lambda p: permk.ef21(p, permk.TopK(1), rounds=3, seed=0), r"problem\.local_grads\(x\) returned shape \(4, 3\)"),
        (ShortCoords(), lambda p: permk.marina(p, permk.PermK(), rounds=3, seed=0, p=0.5),
         r"problem\.local_grad_coords\(x, rows, cols\) returned shape"),
        (ComplexGrad(), lambda p: permk.gd(p, rounds=3, seed=0), r"problem\.grad\(x\) returned dtype complex"),
    ],
    ids=["grad", "local_grads-marina", "local_grads-ef21", "local_grad_coords", "complex"],
)
def test_every_oracle_output_is_checked(problem: Any, run: Callable[[Any], Any], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        run(problem)


def test_a_well_formed_user_problem_runs() -> None:
    res = permk.marina(UserProblem(), permk.PermK(), rounds=3, seed=0)
    assert res.params.path == "fused" and np.isfinite(res.grad_norm_sq).all()


def test_p_accepts_numpy_numbers_and_rejects_strings() -> None:
    q = permk.Quadratic.synthetic(4, 8, 1e-2, 0.1)
    assert permk.marina(q, permk.PermK(), rounds=2, seed=0, p=np.float32(0.5)).params.own.p == 0.5
    with pytest.raises(ValueError, match=r"p must be in \(0, 1\], got 1.5"):
        permk.marina(q, permk.PermK(), rounds=2, seed=0, p=np.float32(1.5))
    with pytest.raises(TypeError, match="^p must be a real number"):  # not "does not take these options"
        permk.marina(q, permk.PermK(), rounds=2, seed=0, p="0.5")
    with pytest.raises(TypeError, match=r"does not take these options \(q\)"):
        permk.marina(q, permk.PermK(), rounds=2, seed=0, q=0.5)
    with pytest.raises(ValueError, match="p must be in"):
        permk.marina(q, permk.PermK(), rounds=2, seed=0, p=float("nan"))


# ---------------------------------------------------------------------------------------------
# 3. reproducible constants
# ---------------------------------------------------------------------------------------------
_REPRO = """
import numpy as np, permk
rng = np.random.default_rng(3)
mats = [(lambda m: m @ m.T / 40 + 0.1 * np.eye(40))(rng.standard_normal((40, 40))) for _ in range(5)]
q = permk.Quadratic(mats, rng.standard_normal((5, 40)))
res = permk.marina(q, permk.PermK(), rounds=50, seed=1)
print(q.L_plus.hex(), q.L_pm.hex(), q.L_minus.hex(), res.x.tobytes().hex()[:4000])
"""


@pytest.mark.slow
def test_constants_and_runs_are_the_same_in_every_process() -> None:
    """Lanczos starts from seeded vectors: the same constants, to the last bit, and so the same
    iterates in every process (three fresh interpreters here)."""
    outs = {_in_subprocess(_REPRO) for _ in range(3)}
    assert len(outs) == 1


def test_the_exact_constants_do_not_depend_on_which_is_read_first() -> None:
    rng = np.random.default_rng(3)
    mats = [(lambda m: m @ m.T / 40)(rng.standard_normal((40, 40))) for _ in range(4)]
    a, b = permk.Quadratic(mats, np.zeros((4, 40))), permk.Quadratic(mats, np.zeros((4, 40)))
    first = (a.L_plus, a.L_pm, a.L_minus)
    second = (b.L_minus, b.L_pm, b.L_plus)[::-1]
    assert first == second


# ---------------------------------------------------------------------------------------------
# 4. step sizes and constants validated
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "exc", "name"),
    [
        (lambda: permk.marina_stepsize(1, 1, 1, 1, 0.1, 0.5, mu=-1), ValueError, "mu"),
        (lambda: permk.marina_stepsize(1, 1, 1, 1, 0.1, 0.5, mu=0), ValueError, "mu"),
        (lambda: permk.marina_stepsize(1, 1, float("nan"), 1, 0.1, 0.5), ValueError, "L_minus"),
        (lambda: permk.marina_stepsize(1, 1, 1, float("inf"), 0.1, 0.5), ValueError, "L_plus"),
        (lambda: permk.marina_stepsize(1, 1, -1, 1, 0.1, 0.5), ValueError, "L_minus"),
        (lambda: permk.marina_stepsize(-1, 1, 1, 1, 0.1, 0.5), ValueError, r"\bA\b"),
        (lambda: permk.marina_stepsize(1, 1, 1, 1, -0.1, 0.5), ValueError, "L_pm"),
        (lambda: permk.marina_stepsize(1, 1, 1, 1, 0.1, "0.5"), TypeError, r"\bp\b"),
        (lambda: permk.ef21_stepsize(0.5, -1.0, 1.0), ValueError, "L_minus"),
        (lambda: permk.ef21_stepsize(0.5, 1.0, -1.0), ValueError, "L_plus"),
        (lambda: permk.ef21_stepsize(0.0, 1.0, 1.0), ValueError, "alpha"),
        (lambda: permk.ef21_stepsize(0.5, 1.0, 1.0, mu=float("nan")), ValueError, "mu"),
        (lambda: permk.marina_stepsize(1, 1, 0, 0, 0, 0.5), ValueError, "M = 0"),
    ],
)
def test_invalid_constants_are_named(call: Callable[[], Any], exc: type, name: str) -> None:
    with pytest.raises(exc, match=name):
        call()


@pytest.mark.parametrize(("value", "exc"), [(-1.0, ValueError), (float("nan"), ValueError), ("1", TypeError)])
def test_a_problem_with_a_bad_constant_is_named(value: Any, exc: type) -> None:
    p = UserProblem()
    p.L_minus = value
    with pytest.raises(exc, match="L_minus"):
        permk.marina(p, permk.PermK(), rounds=2, seed=0)


# ---------------------------------------------------------------------------------------------
# 5. the command line refuses nonsense
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [["--rounds", "0"], ["--rounds", "-5"], ["--tol", "0"], ["--tol", "nan"], ["--tol", "-1e-3"], ["--budget-factor", "0"],
     ["--budget-factor", "-2"], ["--jobs", "0"], ["--max-multipliers", "-1"], ["--seed", "-1"], ["--noise-scales", "-0.1"],
     ["--methods", "marina-topk"], ["--threads", "0"]],
    ids=lambda a: " ".join(a),
)
def test_nonsense_options_are_usage_errors(args: list[str], tmp_path: Path) -> None:
    r = subprocess.run([*CLI, "quadratic", *args, "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "permk quadratic: error:" in r.stderr, r.stderr
    assert not any(tmp_path.iterdir())  # nothing was run


def test_out_must_not_be_a_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    for cmd in ("quadratic", "autoencoder"):
        r = subprocess.run([*CLI, cmd, "--quick", "--out", str(f)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and f"permk {cmd}: error: --out {f} is a file" in r.stderr, r.stderr


def test_complexity_options_are_checked() -> None:
    base = ["complexity", "--n", "10", "--d", "100", "--L-minus", "1", "--L-plus", "1", "--L-pm", "0.1", "--eps", "1e-3", "--delta0", "1"]
    for bad in (["--eps", "0"], ["--L-minus", "-1"], ["--mu", "nan"], ["--n", "0"]):
        r = subprocess.run([*CLI, *base, *bad], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "permk complexity: error:" in r.stderr, (bad, r.stderr)


# ---------------------------------------------------------------------------------------------
# 9. smaller coercions that are errors
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: permk.BlockPermK(2, partition=[0, 1.7, 1]), TypeError, "partition"),
        (lambda: permk.BlockPermK(2, partition=[True, False]), TypeError, "partition"),
        (lambda: permk.Quadratic.synthetic(3, 4, 1e-2, 0.1).local_grad_coords(np.zeros(4), [1.7], [0]), TypeError, "rows"),
        (lambda: permk.Quadratic.synthetic(3, 4, 1e-2, 0.1).local_grad_coords(np.zeros(4), [True], [0]), TypeError, "rows"),
        (lambda: permk.Message(0, 2, 4, np.array([-1]), np.array([1.0])), ValueError, "indices"),
        (lambda: permk.Message(0, 2, 4, np.array([4]), np.array([1.0])), ValueError, "indices"),
        (lambda: permk.Message(0, 2, 4, np.array([0.5]), np.array([1.0])), TypeError, "indices"),
        (lambda: permk.PermK().bits_per_worker(4, 8, float_bits=0), ValueError, "float_bits"),
        (lambda: permk.PermK().bits_per_worker(4, 8, float_bits=-32), ValueError, "float_bits"),
        (lambda: permk.TopK(2).expected_bits_per_worker(4, 8, float_bits=2.5), TypeError, "float_bits"),
        (lambda: pd.workers_of(10, size=4, rank=7), ValueError, "rank"),
        (lambda: pd.workers_of(10, size=4, rank=-1), ValueError, "rank"),
        (lambda: permk.Quadratic.synthetic(3, 4, 1e-2, 0.1).grad(np.zeros(4) + 1j), TypeError, r"\bx\b"),
        (lambda: permk.Quadratic.synthetic(3, 4, 1e-2, 0.1).loss(np.array(["a"] * 4)), TypeError, r"\bx\b"),
        (lambda: permk.Quadratic([np.eye(2) * (1 + 1j)], np.zeros((1, 2))), TypeError, "matrices"),
    ],
    ids=["float-label", "bool-label", "float-row", "bool-row", "negative-index", "index-d", "float-index", "float_bits-0",
         "float_bits-negative", "float_bits-float", "rank-7-of-4", "rank-negative", "complex-x", "string-x", "complex-matrix"],
)
def test_coercions_that_must_be_errors(call: Callable[[], Any], exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        call()


def test_a_problem_with_a_fractional_n_is_refused() -> None:
    p = UserProblem()
    p.n = 2.5  # type: ignore[assignment]
    with pytest.raises(TypeError, match=r"problem\.n must be an integer"):
        permk.marina(p, permk.PermK(), rounds=2, seed=0)


def test_load_state_of_a_file_that_is_not_a_state(tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    with pytest.raises(ValueError, match="is not a permk state file"):
        permk.load_state(f)
    np.savez(tmp_path / "other.npz", a=np.ones(2))
    with pytest.raises(ValueError, match="does not hold a permk state"):
        permk.load_state(tmp_path / "other.npz")


def test_huge_idx_dimensions_do_not_overflow_the_message(tmp_path: Path) -> None:
    from permk.problems import datasets as data

    f = tmp_path / "huge.idx"
    f.write_bytes(bytes([0, 0, 8, 3]) + (2**31).to_bytes(4, "big") * 3)
    with pytest.raises(data.IdxError, match=str(16 + 2**93)):
        data.read_idx(f)


# ---------------------------------------------------------------------------------------------
# 10. compute only what is asked
# ---------------------------------------------------------------------------------------------
def test_a_run_with_gamma_and_p_given_computes_no_constant() -> None:
    """With ``gamma`` and ``p`` given, a run on a Quadratic of dense matrices reads only ``f*``
    (one factorisation), never the Lanczos constants."""
    rng = np.random.default_rng(0)
    mats = [(lambda m: m @ m.T / 60 + np.eye(60))(rng.standard_normal((60, 60))) for _ in range(30)]
    q = permk.Quadratic(mats, rng.standard_normal((30, 60)))
    res = permk.marina(q, permk.PermK(), rounds=20, seed=0, gamma=0.01, p=0.1)
    assert res.f_gap is not None
    computed = set(vars(q._exact)) & {"_plus", "_pm", "_minus", "L_i"}
    assert computed == set(), computed
    # asking for the theory's step computes exactly what it needs
    permk.marina(q, permk.PermK(), rounds=2, seed=0)
    assert set(vars(q._exact)) & {"_plus", "_pm", "_minus", "L_i"} == {"_plus", "_pm", "_minus"}
    assert math.isclose(q.f_star, float(-0.5 * q._b_mean @ np.linalg.solve(q._H, q._b_mean)), rel_tol=1e-10)



# ---------------------------------------------------------------------------------------------
# 11. corrupted checkpoints and wrong argument types are named at once
# ---------------------------------------------------------------------------------------------
CORRUPT_FIELDS = {
    "seed as an array": (dict(seed=[0, 1]), "field 'seed' must be a single int"),
    "fractional round": (dict(round=2.5), "field 'round' must be an integer, got float"),
    "negative round": (dict(round=-5), r"field 'round' must be in \[0, 2\*\*64\)"),
    "round as text": (dict(round="abc"), "field 'round' must be an integer, got str"),
    "bits as text": (dict(bits="x"), "field 'bits' must be a real number, got str"),
    "NaN bits": (dict(bits=np.nan), "field 'bits' must be finite"),
    "negative bits": (dict(bits=-1.0), "field 'bits' must be >= 0"),
    "oracle calls as an array": (dict(oracle_calls=[1.0, 2.0]), "field 'oracle_calls' must be a single float"),
    "complex iterate": (dict(x=np.ones(10, dtype=complex)), "field 'x' must be an array of real numbers, got dtype complex128"),
    "string iterate": (dict(x=np.array(["a"] * 10)), "field 'x' must be an array of real numbers"),
    "a kind without the iterate": (dict(__kind__="CountedState"), "'CountedState' is not a state a run saves .*no field 'x'"),
    "an unknown kind": (dict(__kind__="NoSuchState"), "'NoSuchState' names no state class"),
}


def _marina_checkpoint(tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    q = permk.Quadratic.synthetic(4, 10, 1e-3, 0.1, seed=0)
    permk.save_state(permk.marina(q, permk.PermK(), rounds=2, seed=0).state, tmp_path / "good.npz")
    with np.load(tmp_path / "good.npz") as z:
        return q, dict(z)


@pytest.mark.parametrize("bad, match", list(CORRUPT_FIELDS.values()), ids=list(CORRUPT_FIELDS))
def test_load_state_names_the_file_and_the_corrupt_field(tmp_path: Path, bad: dict[str, Any], match: str) -> None:
    q, fields = _marina_checkpoint(tmp_path)
    np.savez(tmp_path / "bad.npz", **{**fields, **bad})
    with pytest.raises(ValueError, match=r"bad\.npz(: | does not hold).*" + match):
        permk.load_state(tmp_path / "bad.npz")
    # the good file still loads and resumes
    assert permk.marina(q, permk.PermK(), rounds=3, seed=0, state=permk.load_state(tmp_path / "good.npz")).state.round == 5


def test_a_resumed_round_past_the_records_int64_is_refused(tmp_path: Path) -> None:
    q, fields = _marina_checkpoint(tmp_path)
    np.savez(tmp_path / "late.npz", **{**fields, "round": 2**63 - 1})
    state = permk.load_state(tmp_path / "late.npz")  # a round a state can hold ...
    with pytest.raises(ValueError, match=r"at round 9223372036854775807: 3 more rounds would pass round 2\*\*63 - 1"):
        permk.marina(q, permk.PermK(), rounds=3, seed=0, state=state)  # ... but no run can go past it


def test_message_helpers_name_an_argument_of_the_wrong_type() -> None:
    with pytest.raises(TypeError, match=r"messages\[0\] must be a permk\.Message, got int"):
        permk.aggregate_messages([1, 2])
    with pytest.raises(TypeError, match="messages must be a sequence of permk.Message"):
        permk.aggregate_messages(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="compressor must be a permk.Compressor, got str"):
        permk.message_bits("x", 3, 5, 32)
    msgs = [permk.PermK().compress(np.arange(5.0), worker=i, n_workers=3, seed=0, round=0) for i in range(3)]
    assert permk.aggregate_messages(iter(msgs)).shape == (5,)


@pytest.mark.parametrize("compressor", [permk.PermK(), permk.TopK(2), permk.Participation(permk.RandK(2), 2)],
                         ids=["PermK", "TopK", "Participation"])
def test_indices_of_the_message_sizes_must_be_a_flag(compressor: Any) -> None:
    for call in (compressor.bits_per_worker, compressor.expected_bits_per_worker):
        with pytest.raises(TypeError, match="indices must be True or False, got 'no'"):
            call(3, 5, indices="no")
        assert call(3, 5, indices=np.bool_(False)) == call(3, 5, indices=False)


def test_a_diverged_runs_state_is_saved_and_read_back_whole(tmp_path: Path) -> None:
    q, fields = _marina_checkpoint(tmp_path)
    np.savez(tmp_path / "diverged.npz", **{**fields, "x": np.full(10, np.nan), "g": np.full(10, np.inf)})
    state = permk.load_state(tmp_path / "diverged.npz")
    assert np.isnan(state.x).all() and np.isinf(state.g).all()
    with pytest.raises(ValueError, match="the metrics at the starting point are not finite"):
        permk.marina(q, permk.PermK(), rounds=3, seed=0, state=state)
