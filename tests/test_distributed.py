"""permk.distributed: real MPI runs against the single-process simulator.

The MPI checks launch real ``mpiexec -n N python tests/mpi/...`` jobs (with time-outs, so a
hang fails instead of blocking) and compare what rank 0 saved with the simulator run in this
process; this process itself never initialises MPI. They are skipped, with the reason, only
when ``mpiexec`` or ``mpi4py`` is missing (``pip install 'permk[mpi]'`` provides both).

1. ``reduce="ordered"``: the MPI run equals the simulator (``path="dense"``, whose problem
   sums the local gradients in worker order) bit for bit: iterates, estimators, coins, recorded
   ``‖∇f‖²`` and ``f − f*``, bits, parameters; for MARINA+PermK (d ≥ n, d ≥ n with n ∤ d, n ≥ d,
   several workers per rank), RandK, BlockPermK, EF21+TopK, GD, DCGD (plain and shifted),
   DIANA, RandDIANA, a user's LocalProblem; in p2p and server modes; on 1, 2, 3 and 4 processes
   (the results do not depend on the layout); DIANA, RandDIANA and shifted DCGD resumed on 2 and
   4 processes from a simulator's state.
2. ``reduce="allreduce"`` (full gradients by Allreduce, vs the closed-form ``∇f``): the
   coins and bits agree exactly and the iterates within rounding (bound below).
3. Bytes handed to MPI: per worker per round equal to the theory (``8⌈d/n⌉`` on PermK
   tails, ``8d`` on full-gradient rounds, both on RandDIANA's heads, ``12k`` for TopK pairs), per rank equal to the
   sizes of its workers' blocks in the recomputed plans; server mode broadcasts ``8d``.
4. Failures: a rank raising mid-run or in the user's script aborts the job (non-zero exit, the
   error on stderr) within seconds; bad launches raise the same clear error on every rank.
5. Without MPI: the worker layout, LocalView, the worker-order summation the bit-equality
   relies on, and the module's doctests.
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import permk
import permk.distributed as pd
from conftest import MPI_DIR, MPIEXEC, final_grad_norms

sys.path.insert(0, str(MPI_DIR))
from mpi_cases import CASES, SEED, compressor, sent, simulate  # noqa: E402

#: a test that launches mpiexec (skipped, with the reason, without MPI: see conftest.py)
needs_mpi = pytest.mark.mpi


TIMEOUT = 240  # seconds for one mpiexec job (4 processes oversubscribe 2 cores here)
ORDERED = [k for k, c in CASES.items() if c["reduce"] == "ordered"]
ALLREDUCE = [k for k, c in CASES.items() if c["reduce"] == "allreduce"]
# on 3 ranks every case's workers split unevenly ((2, 1, 1) of 4, (3, 3, 2) of 8)
UNEVEN = ["marina_permk_d_ge_n_uneven", "marina_randk_server", "marina_blockpermk_n_in_place", "marina_blockpermk_n_blocks_per_rank",
          "marina_group_permk", "marina_coordinate_sampling", "ef21_topk_blocks_server", "marina_python_compressor", "gd",
          "diana_randk_server", "rand_diana_permk", "dcgd_shifted_permk",
          "dasha_permk", "dasha_pp_randk_blocks_server", "marina_pp_permk"]
SMALL = ["marina_permk_d_ge_n", "marina_permk_n_ge_d_blocks_server", "marina_randk", "ef21_topk", "marina_permk_own_data"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _launch(nprocs: int, script: str, *args: str, timeout: float = TIMEOUT,
            mpiexec_args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(MPI_DIR / script), *args]
    if nprocs > 0:
        cmd = [str(MPIEXEC), "-n", str(nprocs), *mpiexec_args, *cmd]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=MPI_DIR,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout} s (a hang): {e.stdout!r} {e.stderr!r}")


def _run_cases(tmp_path_factory: pytest.TempPathFactory, nprocs: int, names: list[str]) -> Path:
    out = tmp_path_factory.mktemp(f"mpi{nprocs}")
    proc = _launch(nprocs, "run_cases.py", str(out), *names)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.fixture(scope="module")
def runs4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case on ``mpiexec -n 4`` (one job)."""
    return _run_cases(tmp_path_factory, 4, list(CASES))


@pytest.fixture(scope="module")
def runs2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run_cases(tmp_path_factory, 2, ORDERED)


@pytest.fixture(scope="module")
def runs3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run_cases(tmp_path_factory, 3, UNEVEN)


@pytest.fixture(scope="module")
def runs1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process, without mpiexec (MPI singleton)."""
    return _run_cases(tmp_path_factory, 0, SMALL)


@pytest.fixture(scope="module")
def simulated() -> dict[str, permk.RunResult]:
    return {name: simulate(case) for name, case in CASES.items()}


def _load(d: Path, name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    with np.load(d / f"{name}.npz") as z:
        arrays = {k: z[k] for k in z.files if k != "meta"}
        meta = json.loads(str(z["meta"]))
    return arrays, meta


MPI_ONLY_PARAMS = {"backend", "mode", "reduce", "n_procs", "path"}


def _same_params(meta: dict[str, Any], sim: permk.RunResult) -> None:
    mine = {k: v for k, v in meta["params"].items() if k not in MPI_ONLY_PARAMS}
    ref = {k: v for k, v in sim.params.record().items() if k not in MPI_ONLY_PARAMS}
    assert mine == ref


def _assert_bit_equal(arrays: dict[str, np.ndarray], sim: permk.RunResult) -> None:
    # array_equal: bit for bit up to the sign of zero (numpy's 0.0 == -0.0)
    assert np.array_equal(arrays["x"], sim.x), np.abs(arrays["x"] - sim.x).max()
    for name in sim.state.shared_arrays():
        assert np.array_equal(arrays[f"state.{name}"], getattr(sim.state, name)), name
    assert np.array_equal(arrays["x_hat"], sim.x_hat)
    assert np.array_equal(arrays["rounds"], sim.rounds)
    assert np.array_equal(arrays["grad_norm_sq"], sim.grad_norm_sq)
    if sim.f_gap is not None:
        assert np.array_equal(arrays["f_gap"], sim.f_gap)
    if sim.coins is not None:
        assert np.array_equal(arrays["coins"], sim.coins)
    assert np.array_equal(arrays["bits_per_worker"], sim.bits_per_worker)
    assert np.array_equal(arrays["expected_bits_per_worker"], sim.expected_bits_per_worker)
    assert np.array_equal(arrays["oracle_calls"], sim.oracle_calls)


# ---------------------------------------------------------------------------------------------
# 1. bit for bit
# ---------------------------------------------------------------------------------------------
@needs_mpi
@pytest.mark.parametrize("name", ORDERED)
def test_mpi_run_equals_simulator_bit_for_bit(runs4: Path, simulated: dict[str, permk.RunResult], name: str) -> None:
    arrays, meta = _load(runs4, name)
    sim = simulated[name]
    assert meta["same_on_every_rank"] and meta["n_procs"] == 4
    assert meta["diverged_at"] is None and sim.diverged_at is None
    _assert_bit_equal(arrays, sim)
    _same_params(meta, sim)
    assert sim.grad_norm_sq[-1] < 0.5 * sim.grad_norm_sq[0]  # the runs do converge
    if sim.coins is not None and sim.params.own.p < 1:
        assert 0 < sim.coins.sum() < len(sim.coins)  # both kinds of rounds happen


@needs_mpi
@pytest.mark.parametrize("name", ORDERED)
def test_two_processes_give_the_same_bits(runs2: Path, runs4: Path, name: str) -> None:
    two, meta = _load(runs2, name)
    four, _ = _load(runs4, name)
    assert meta["same_on_every_rank"] and meta["n_procs"] == 2
    for k in ("x", "grad_norm_sq", "bits_per_worker", "bytes_per_worker", "theory_bytes_per_worker", *(k for k in two if k.startswith("state."))):
        assert np.array_equal(two[k], four[k]), k
    # the ranks' bytes follow the layout, their total does not (but for the 8-byte message
    # lengths each rank sends on compressed rounds when the sizes vary)
    comp = sent(CASES[name])
    varying = comp is not None and not comp.capabilities.shared_plan and not comp.capabilities.fixed_size
    coins = two["coins"] if "coins" in two else np.zeros(two["bytes_sent"].shape[1], dtype=bool)
    lengths = np.where(coins, 0, 8) if varying else 0
    assert np.array_equal(two["bytes_sent"].sum(axis=0) - 2 * lengths, four["bytes_sent"].sum(axis=0) - 4 * lengths)


@needs_mpi
@pytest.mark.parametrize("name", UNEVEN)
def test_ranks_holding_unequal_numbers_of_workers_give_the_simulators_bits(runs3: Path, simulated: dict[str, permk.RunResult],
                                                                          name: str) -> None:
    arrays, meta = _load(runs3, name)
    assert meta["same_on_every_rank"] and meta["n_procs"] == 3
    _assert_bit_equal(arrays, simulated[name])


@needs_mpi
@pytest.mark.parametrize("name", SMALL)
def test_one_process_without_mpiexec(runs1: Path, simulated: dict[str, permk.RunResult], name: str) -> None:
    arrays, meta = _load(runs1, name)
    assert meta["n_procs"] == 1
    if CASES[name]["reduce"] == "ordered":
        _assert_bit_equal(arrays, simulated[name])


# ---------------------------------------------------------------------------------------------
# 2. Allreduce: rounding only
# ---------------------------------------------------------------------------------------------
@needs_mpi
@pytest.mark.parametrize("name", ALLREDUCE)
def test_allreduce_differs_from_simulator_by_rounding_only(runs4: Path, simulated: dict[str, permk.RunResult], name: str) -> None:
    """Full gradients summed by MPI_Allreduce (tree order) and the simulator's closed-form
    ``∇f`` differ per coordinate by at most ``(n + 1) u (1/n) Σ_i |∇f_i(x)_j|`` per full-gradient
    round (``u = 2^-53``); carried by ``γ`` through ``T`` rounds, the iterates stay within
    ``T γ (n + 1) u max_i ‖∇f_i‖_∞``-ish of each other: observed ≤ 1e-15, allowed 1e-12."""
    arrays, meta = _load(runs4, name)
    sim = simulated[name]
    assert meta["same_on_every_rank"]
    _same_params(meta, sim)
    if sim.coins is not None:
        assert np.array_equal(arrays["coins"], sim.coins)  # the coins are a function of (seed, t) only
    assert np.array_equal(arrays["bits_per_worker"], sim.bits_per_worker)
    scale = max(1.0, float(np.abs(sim.x).max()), float(np.sqrt(CASES[name]["d"])))
    assert np.abs(arrays["x"] - sim.x).max() <= 1e-12 * scale
    assert np.allclose(arrays["grad_norm_sq"], sim.grad_norm_sq, rtol=1e-9, atol=1e-24)
    if sim.f_gap is not None:
        assert np.allclose(arrays["f_gap"], sim.f_gap, rtol=1e-6, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# 3. bytes
# ---------------------------------------------------------------------------------------------
def _expected_rank_bytes(case: dict[str, Any], t: int, heads: bool, rank: int, size: int) -> int:
    n, d = case["n"], case["d"]
    block = pd.workers_of(n, size=size, rank=rank)
    full = 8 * d * (len(block) if case["reduce"] == "ordered" else 1) if heads else 0
    if heads and not case.get("full_with_compressed", False):
        return full
    return full + _compressed_rank_bytes(case, t, block)


def _compressed_rank_bytes(case: dict[str, Any], t: int, block: range) -> int:
    n, d = case["n"], case["d"]
    comp = sent(case)
    assert comp is not None
    plan = comp.plan(n, d, seed=SEED, round=t)
    if comp.capabilities.dense:  # every coordinate in order (Identity, the quantizers): values only
        return len(block) * d * 8
    if plan is None:  # TopK, Rand1: k (uint32 index, float64 value) pairs per worker
        lengths = 0 if comp.capabilities.fixed_size else 8  # messages of a varying size: the length first
        return len(block) * comp.floats_per_worker(n, d) * 12 + lengths
    return 8 * int(plan.offsets[block.stop] - plan.offsets[block.start])


@needs_mpi
@pytest.mark.parametrize("name", list(CASES))
def test_measured_bytes_equal_theory(runs4: Path, name: str) -> None:
    case = CASES[name]
    arrays, meta = _load(runs4, name)
    n, d = case["n"], case["d"]
    rounds = len(arrays["bytes_per_worker"])
    assert rounds == len(arrays["rounds"]) - 1 or case.get("record_every", 1) != 1
    heads = arrays["coins"] if "coins" in arrays else np.full(rounds, case.get("full_rounds", False))
    if case.get("coin_compressed", False):  # DASHA-PAGE: the coin picks the estimator, the message stays compressed
        heads = np.zeros(rounds, dtype=bool)
    comp = sent(case)
    if comp is not None and comp.capabilities.random_size:  # the theory's size is a bound
        assert (arrays["bytes_per_worker"] <= arrays["theory_bytes_per_worker"]).all()
        assert (arrays["bytes_per_worker"][~heads] < arrays["theory_bytes_per_worker"][~heads]).any()
    else:
        assert np.array_equal(arrays["bytes_per_worker"], arrays["theory_bytes_per_worker"])
    for t in range(rounds):
        full = 8 * d if heads[t] else 0  # RandDIANA's heads: full gradients and the compressed message
        compressed = arrays["theory_bytes_per_worker"][t] - full
        if heads[t] and not case.get("full_with_compressed", False):
            assert compressed == 0
        elif isinstance(compressor(case), permk.PermK):
            assert compressed == (8 * -(-d // n) if d >= n else 8)
        elif isinstance(compressor(case), permk.RandK):
            assert compressed == 8 * compressor(case).k
        elif comp is not None and comp.capabilities.dense:  # QSGD, Identity: d values, no indices
            assert compressed == 8 * d
        elif comp is not None and comp.plan(n, d, seed=0, round=0) is None:  # TopK, Rand1: pairs
            assert compressed == 12 * comp.floats_per_worker(n, d)
        for r in range(4):
            assert arrays["bytes_sent"][r, t] == _expected_rank_bytes(case, t, bool(heads[t]), r, 4), (t, r)
    if case["mode"] == "server":  # the aggregate of each exchange of the round
        exchanges = 1 + (heads & case.get("full_with_compressed", False))
        assert (arrays["bytes_broadcast"] == 8 * d * exchanges).all()
    else:
        assert (arrays["bytes_broadcast"] == 0).all()
    # the theory's bits (float_bits=32 as in the paper) are the 64-bit bytes halved, for plans
    if comp is not None and comp.plan(n, d, seed=0, round=0) is not None:
        bits = np.diff(arrays["bits_per_worker"])
        assert np.array_equal(bits, arrays["theory_bytes_per_worker"] * 4.0)


# ---------------------------------------------------------------------------------------------
# 4. failures
# ---------------------------------------------------------------------------------------------
@needs_mpi
@pytest.mark.parametrize(
    ("kind", "message", "origin"),
    [
        ("raise_in_round", "FloatingPointError: worker 2's data is corrupt", "rank 2/4 failed; aborting the job"),
        ("excepthook", "KeyError: 'rank 1 could not load its shard", "rank 1/4: uncaught exception"),
    ],
)
def test_a_failing_rank_aborts_the_job(kind: str, message: str, origin: str, tmp_path: Path) -> None:
    proc = _launch(4, "fail.py", kind, timeout=120, mpiexec_args=("-errfile-pattern", str(tmp_path / "err.%r")))
    assert proc.returncode != 0
    errs = {rank: f.read_text() for rank in range(4) if (f := tmp_path / f"err.{rank}").exists()}
    assert any(message in e and origin in e for e in errs.values()), errs
    assert "finished (unexpected)" not in proc.stdout


@needs_mpi
@pytest.mark.parametrize("nprocs", [0, 3])
def test_the_reused_aggregate_buffer_is_never_one_the_caller_holds(nprocs: int) -> None:
    proc = _launch(nprocs, "buffers.py")
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


@needs_mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_the_shared_memory_window_and_the_allgatherv_give_the_aggregate(nprocs: int) -> None:
    proc = _launch(nprocs, "window.py", timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


@needs_mpi
def test_a_user_method_with_a_per_worker_state_runs_and_resumes_on_mpi(tmp_path: Path) -> None:
    """``mpi_cases.LocalMomentum``, defined outside the package, whose state keeps a per-worker
    array: each rank holds its workers' rows, the ranks agree on the digest of its shared arrays,
    resumed runs (from an MPI state or from the simulator's all-rows state, cut to the held rows)
    equal the simulator's run bit for bit, a state of the wrong rows is refused on every rank, and
    every rank stops a diverging run at the simulator's round."""
    proc = _launch(2, "user_method.py", str(tmp_path / "out.json"), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = json.loads((tmp_path / "out.json").read_text())["ranks"]
    assert [r["workers"] for r in ranks] == [[0, 2], [2, 4]] and all(r["rows"] == 2 for r in ranks)
    for r in ranks:
        assert r["equal_to_simulator"] and r["from_simulator"] and r["held_rows_of_simulator"]
        assert "state.M must hold all 4 rows or this process's 2" in r["bad_rows"]
        assert r["diverged_at"] is not None and r["diverged_at"] == r["simulator_diverged_at"]


@needs_mpi
def test_a_rank_raising_outside_the_drivers_ends_a_plain_launch(tmp_path: Path) -> None:
    """``mpiexec -n 3 python script.py`` (no ``-m mpi4py``, no explicit hook) where rank 1 raises
    in the user's own code before the run: importing permk.distributed under mpiexec installed
    the abort hook, so the job ends with the error instead of leaving ranks 0 and 2 waiting."""
    cmd = [str(MPIEXEC), "-n", "3", "-errfile-pattern", str(tmp_path / "err.%r"), sys.executable, str(MPI_DIR / "plain_raise.py")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env(), cwd=MPI_DIR, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail("a plain mpiexec launch hung after a rank raised outside the drivers")
    assert proc.returncode != 0
    err = (tmp_path / "err.1").read_text()
    assert "KeyError: 'rank 1 could not load its shard" in err and "rank 1/3: uncaught exception" in err, err
    assert "finished (unexpected)" not in proc.stdout


@needs_mpi
@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("bad_workers", "bad launch: rank 0 holds workers range(0, 1) but n=8 workers on 4 processes put range(0, 2) there"),
        ("too_few_workers", "n=3 workers cannot be spread over 4 processes"),
        ("disagree", "the ranks disagree on params['seed']: rank 0 has 0, rank 1 has 1"),
        ("disagree_compressor", "the ranks disagree on compressor: rank 0 has 'RandK "),
        ("disagree_data", "the ranks disagree on problem: rank 0 has '"),
        ("disagree_mappings", "the ranks disagree on compressor: rank 0 has 'PermutationOfMappings "),
    ],
)
def test_a_bad_launch_is_a_clear_error_on_every_rank(kind: str, message: str, tmp_path: Path) -> None:
    # each rank's stderr goes to its own file: on a shared pipe the ranks' tracebacks interleave
    proc = _launch(4, "fail.py", kind, timeout=120, mpiexec_args=("-errfile-pattern", str(tmp_path / "err.%r")))
    assert proc.returncode != 0
    for rank in range(4):
        err = (tmp_path / f"err.{rank}").read_text()
        errors = [line for line in err.splitlines() if re.match(r"permk\.distributed(\.local)?\.LaunchError:", line)]
        assert len(errors) == 1 and message in errors[0], f"rank {rank}: {err}"


@needs_mpi
def test_argument_errors_and_resume_on_one_process() -> None:
    proc = _launch(0, "errors.py", timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = {name: (kind, msg) for name, kind, msg in (line.split("|", 2) for line in proc.stdout.splitlines())}
    expect = {
        "global_problem": ("no error", ""),  # a global problem is viewed from this rank by the driver
        "global_problem_same": ("True", ""),
        "not_a_problem": ("TypeError", "LocalView wraps a global problem"),
        "mode": ("ValueError", "mode must be one of 'p2p', 'server'"),
        "reduce": ("ValueError", "reduce must be one of 'allreduce', 'ordered'"),
        "path": ("ValueError", "path='rust' is not available for compressed_mean_diff with GroupPermK"),
        "topk_marina": ("ValueError", "MARINA needs an unbiased compressor"),
        "permk_ef21": ("ValueError", "EF21 needs a contractive compressor"),
        "rounds": ("ValueError", "rounds must be in"),
        "seed": ("TypeError", "seed is required"),
        "no_constants": ("ValueError", "pass gamma= explicitly"),
        "state": ("TypeError", "state must be a MarinaState"),
        "x0": ("ValueError", "x0 must have shape (6,)"),
        "ef21_state_rows": ("ValueError", "state.G must hold all 2 rows"),
        "resume_seed": ("ValueError", "seed=1 differs from the resumed state's seed 2"),
        "participation": ("ValueError", "participation must be in 1..n = 1..2, got 3"),
        "not_held": ("ValueError", "worker 0 is not held by this process"),
        "not_contiguous": ("ValueError", "contiguous range"),
        "grad_sum_shape": ("ValueError", "problem.local_grad_sum(x) returned shape (3,), expected (4,)"),
        "grad_sum_used": ("True", ""),
        "resume": ("True", ""),
        "ef21_resume_from_simulator": ("True", ""),
        "dasha_pp_resume_from_simulator": ("True", ""),
    }
    assert set(got) == set(expect)
    for name, (kind, fragment) in expect.items():
        assert got[name][0] == kind and fragment in got[name][1], (name, got[name])


# ---------------------------------------------------------------------------------------------
# 5. without MPI
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "size"), [(4, 4), (8, 4), (10, 4), (7, 3), (5, 1), (100, 7)])
def test_workers_of_tiles_the_workers_in_contiguous_balanced_blocks(n: int, size: int) -> None:
    blocks = [pd.workers_of(n, size=size, rank=r) for r in range(size)]
    assert [i for b in blocks for i in b] == list(range(n))
    assert max(map(len, blocks)) - min(map(len, blocks)) <= 1 and min(map(len, blocks)) >= 1


def test_workers_of_rejects_fewer_workers_than_processes() -> None:
    with pytest.raises(pd.LaunchError, match="n=3 workers cannot be spread over 4 processes"):
        pd.workers_of(3, size=4, rank=0)


def test_local_view_calls_only_its_workers_and_matches_the_problem() -> None:
    q = permk.Quadratic.synthetic(n=6, d=9, lam=1e-3, noise_scale=0.2, seed=3)
    v = pd.LocalView(q, workers=range(2, 4))
    x = np.linspace(-1, 1, 9)
    G = q.local_grads(x)
    assert np.array_equal(v.local_grads(x), G[2:4])
    for i in v.workers:
        assert np.array_equal(v.local_grad(i, x), G[i])
        cols = np.array([8, 0, 3])
        assert np.array_equal(v.local_grad_coords(x, np.full(3, i), cols), G[i][cols])
    with pytest.raises(ValueError, match="not held"):
        v.local_grad(0, x)
    with pytest.raises(ValueError, match="held by this process"):
        v.local_grad_coords(x, [0], [1])
    assert (v.L_minus, v.L_plus, v.L_pm, v.mu, v.f_star) == (q.L_minus, q.L_plus, q.L_pm, q.mu, q.f_star)
    full = pd.LocalView(q, workers=range(6))
    assert np.isclose(sum(full.local_loss(i, x) for i in range(6)) / 6, q.loss(x), rtol=1e-12)


def test_local_view_of_a_user_quadratic_has_local_losses() -> None:
    rng = np.random.default_rng(0)
    mats = [(lambda m: m @ m.T)(rng.standard_normal((4, 4))) for _ in range(3)]
    b = rng.standard_normal((3, 4))
    q = permk.Quadratic(mats, b)
    v = pd.LocalView(q, workers=range(3))
    x = rng.standard_normal(4)
    for i in range(3):
        assert np.isclose(v.local_loss(i, x), 0.5 * x @ mats[i] @ x - b[i] @ x, rtol=1e-12)
    assert not hasattr(pd.LocalView(NoLoss(), workers=range(2)), "local_loss")


class NoLoss:
    n, d = 2, 3
    x0 = np.zeros(3)

    def local_grad(self, i: int, x: np.ndarray) -> np.ndarray:
        return x


def test_local_problem_protocol() -> None:
    from mpi_cases import LeastSquaresShard

    assert isinstance(LeastSquaresShard(4, 3, range(1, 2)), pd.LocalProblem)
    assert isinstance(pd.LocalView(permk.Quadratic.synthetic(2, 3, 1e-3, 0.0), workers=range(1)), pd.LocalProblem)


@pytest.mark.parametrize(("n", "d"), [(4, 12), (8, 3), (2, 1), (16, 5), (3, 1000)])
def test_worker_order_sums_agree(n: int, d: int) -> None:
    """What the bit-equality rests on: numpy's axis-0 sum (EF21's simulator), the Rust
    ``aggregate`` and ``np.bincount`` (MPI) all add the workers' vectors one after the other
    in worker order (shapes with d ≥ 2, or n < 8; numpy sums a contiguous axis pairwise)."""
    rng = np.random.default_rng(n * 1000 + d)
    C = rng.standard_normal((n, d)) * 10.0 ** rng.integers(-8, 8, (n, d))
    fold = np.zeros(d)
    for row in C:
        fold += row
    assert np.array_equal(np.bincount(np.tile(np.arange(d), n), weights=C.ravel(), minlength=d), fold)
    assert np.array_equal(C.sum(axis=0), fold)
    assert np.array_equal(permk.Identity().aggregate(C, seed=0, round=0), fold / n)


@pytest.mark.slow
@needs_mpi
def test_permk_quadratic_cli_on_mpi_matches_single_process(tmp_path: Path) -> None:
    """`mpiexec -n 2 permk quadratic --mpi` runs the grid's methods on 2 ranks (rank 0 writes)
    and reaches the single-process results up to the rounding of the full-gradient sums."""
    grid = ["--quick", "--rounds", "40", "--max-multipliers", "1", "--n", "10", "1000", "--noise-scales", "0", "0.8",
            "--no-plot", "--no-progress"]
    cli = [sys.executable, "-m", "permk.cli", "quadratic"]
    mpi = subprocess.run([str(MPIEXEC), "-n", "2", *cli, "--mpi", *grid, "--out", str(tmp_path / "mpi")],
                         capture_output=True, text=True, timeout=TIMEOUT, env=_env(), stdin=subprocess.DEVNULL)
    assert mpi.returncode == 0, mpi.stdout + mpi.stderr
    seq = subprocess.run([*cli, *grid, "--out", str(tmp_path / "seq")], capture_output=True, text=True, timeout=TIMEOUT,
                         env=_env(), stdin=subprocess.DEVNULL)
    assert seq.returncode == 0, seq.stdout + seq.stderr
    a, b = final_grad_norms(tmp_path / "mpi" / "quadratic"), final_grad_norms(tmp_path / "seq" / "quadratic")
    assert len(a) == 12 and a.keys() == b.keys()
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=1e-8), k
    timing = json.loads((tmp_path / "mpi" / "quadratic" / "timing.json").read_text())
    assert timing["mpi_ranks"] == 2


@needs_mpi
@pytest.mark.parametrize("nprocs", [2, 4])
def test_shifted_methods_resume_on_mpi_from_a_simulator_state(nprocs: int) -> None:
    """DIANA's per-worker shifts (all n rows in the simulator's state) are cut to each rank's
    rows; RandDIANA and shifted DCGD resume their shift point: the run continues bit for bit."""
    proc = _launch(nprocs, "resume.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["diana|True", "rand_diana|True", "dcgd_shifted|True", "dasha|True", "dasha_pp|True",
                                   "marina_pp|True"]
