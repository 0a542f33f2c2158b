"""Oracle calls as the algorithms need them: every method's rounds, on every path, evaluate only
the gradients their update reads — the participants' alone under partial participation, the
shifts stored rather than recomputed, both points of a difference on the same workers, the sent
coordinates only on the coordinate paths — and report the algorithm's count.

A counting problem wrapper (tests/counting.py) logs every oracle call by worker and point; each
round is checked against the method's round as the algorithm states it (``counting.algorithm``).
The same checks run on MPI in tests/test_distributed.py (tests/mpi/oracle_calls.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import permk
from conftest import MPI_DIR, MPIEXEC
from counting import CountingProblem, check_round, counted_rounds
from permk.transport import Simulator

SEED = 3

#: (method, compressor, options): every method, with and without partial participation
CASES = [
    ("gd", None, {}),
    ("marina", permk.PermK(), {"p": 0.3}),
    ("marina", permk.RandK(3), {"p": 0.3}),
    ("marina", permk.PermK(), {"p": 0.3, "participation": 3}),
    ("marina", permk.RandK(2), {"p": 0.2, "participation": 5}),
    ("ef21", permk.TopK(3), {}),
    ("dcgd", permk.PermK(), {}),
    ("dcgd_shifted", permk.PermK(), {}),
    ("diana", permk.PermK(), {}),
    ("diana", permk.RandK(3), {}),
    ("rand_diana", permk.PermK(), {"p": 0.3}),
    ("dasha", permk.PermK(), {}),
    ("dasha", permk.PermK(), {"participation": 3}),
    ("dasha", permk.RandK(2), {"participation": 6}),
]


def _sizes(comp: permk.Compressor, n: int, d: int):  # type: ignore[no-untyped-def]
    """Each worker's message size in round ``t`` (shared plans)."""
    return lambda t: np.diff(np.asarray(comp.round(n, d, seed=SEED, round=t).offsets()))


@pytest.mark.parametrize("name,comp,opts", CASES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("path", ["rust", "fused", "dense"])
@pytest.mark.parametrize("n,d", [(6, 20), (8, 5)])
def test_rounds_evaluate_what_the_algorithm_reads(name: str, comp: permk.Compressor | None, opts: dict, path: str, n: int,
                                                  d: int) -> None:
    if opts.get("participation", 0) > n:
        pytest.skip("more participants than workers")
    q = CountingProblem(permk.Quadratic.synthetic(n, d, 1e-3, 0.5, seed=0))
    backend = Simulator(q, path=path)
    method = getattr(permk, name)
    comp = permk.Identity() if comp is None else comp
    try:
        params, rounds = counted_rounds(method, q, comp, backend, rounds=25, seed=SEED, gamma=0.05, **opts)
    except ValueError as e:  # a path the exchange does not have (stated)
        assert "path" in str(e) and path != "dense"
        return
    sent = method.resolve(dict(opts))[0].sent_compressor(comp, params.own)
    sizes = _sizes(sent, n, d) if sent.capabilities.shared_plan else None
    for prev, rnd in zip([None, *rounds], rounds):
        check_round(name, opts, params.path, rnd, n=n, seed=SEED, held=range(n), oracle_full=params.oracle_full, message_sizes=sizes,
                    prev=prev)


def _sigmoid(n: int = 4, m: int = 12, features: int = 6) -> permk.NonconvexSigmoid:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n * m, features))
    y = (X @ rng.standard_normal(features) > 0).astype(int)
    return permk.NonconvexSigmoid(X, y, n=n, seed=0)


FINITE_SUM = [
    ("vr_marina", permk.PermK(), {"batch_size": 3, "p": 0.3}),
    ("marina_stochastic", permk.PermK(), {"batch_size": 3, "megabatch_size": 7, "p": 0.3}),
    ("dasha_page", permk.PermK(), {"batch_size": 3, "p": 0.3}),
    ("dasha_mvr", permk.RandK(2), {"batch_size": 3, "momentum": 0.5}),
    ("sgd", None, {"batch_size": 4}),
    ("marina", permk.PermK(), {"p": 0.3, "participation": 2}),
    ("dasha", permk.PermK(), {"participation": 3}),
]


@pytest.mark.parametrize("name,comp,opts", FINITE_SUM, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("path", ["fused", "dense"])
def test_finite_sum_rounds_evaluate_what_the_algorithm_reads(name: str, comp: permk.Compressor | None, opts: dict, path: str) -> None:
    p = CountingProblem(_sigmoid())
    backend = Simulator(p, path=path)
    method = getattr(permk, name)
    comp = permk.Identity() if comp is None else comp
    try:
        params, rounds = counted_rounds(method, p, comp, backend, rounds=20, seed=SEED, gamma=0.1, **opts)
    except ValueError as e:
        assert "path" in str(e) and path != "dense"
        return
    assert params.oracle_full == 12.0
    for prev, rnd in zip([None, *rounds], rounds):
        check_round(name, opts, params.path, rnd, n=p.n, seed=SEED, held=range(p.n), oracle_full=params.oracle_full, prev=prev)


def test_the_counts_are_the_results_and_partial_participation_counts_two_gradients() -> None:
    """The reported counts are what the results and the state carry: a resumed run continues
    them; PP-MARINA counts two full gradients on its compressed rounds, one on its full ones."""
    q = permk.Quadratic.synthetic(8, 20, 1e-3, 0.5, seed=0)
    res = permk.marina(q, permk.PermK(), rounds=30, seed=1, participation=4, p=0.3)
    steps = np.diff(res.oracle_calls)
    assert np.array_equal(steps, np.where(res.coins, 1.0, 2.0))
    assert np.array_equal(np.diff(permk.dasha(q, permk.PermK(), rounds=5, seed=1, participation=4).oracle_calls), [2.0] * 5)
    assert np.array_equal(np.diff(permk.dasha(q, permk.PermK(), rounds=5, seed=1, participation=8).oracle_calls), [1.0] * 5)
    for m in (permk.rand_diana, permk.dcgd_shifted, permk.diana, permk.dasha):
        assert np.array_equal(np.diff(m(q, permk.PermK(), rounds=6, seed=1, gamma=0.01).oracle_calls), [1.0] * 6), m


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_rounds_on_mpi_evaluate_what_the_algorithm_reads(nprocs: int) -> None:
    """The same checks on MPI (each rank its held workers; tests/mpi/oracle_calls.py): every
    method, every path, ``reduce="ordered"``, the workers spread evenly or not."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [str(MPIEXEC), "-n", str(nprocs), sys.executable, str(MPI_DIR / "oracle_calls.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=MPI_DIR, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and "oracle-calls|OK|56" in proc.stdout, proc.stdout + proc.stderr


def test_every_catalog_method_has_an_oracle_call_check() -> None:
    """Every method of the catalog is checked above (a method added later must join a case)."""
    from permk.methods.base import METHODS

    checked = {name for name, _, _ in CASES + FINITE_SUM}
    assert set(METHODS.all()) <= checked, sorted(set(METHODS.all()) - checked)
