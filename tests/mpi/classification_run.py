"""MPI checks of the classification problems: ``mpiexec -n R python classification_run.py``
prints ``ok`` on rank 0 when MARINA, EF21, VR-MARINA and SGD on MPI match the simulator (dense
and sparse data), and when every rank's
minibatch gradients of its own workers are rows of the single-process call."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from mpi4py import MPI

import permk
import permk.distributed as pd


def main() -> None:
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((80, 6)), rng.integers(0, 2, 80)
    for data in (X, sp.csr_array(X)):
        p = permk.NonconvexSigmoid(data, y, n=4, seed=0)
        for run, sim_run, comp in ((pd.marina, permk.marina, permk.PermK()), (pd.ef21, permk.ef21, permk.TopK(2))):
            mpi = run(p, comp, rounds=60, seed=1)
            sim = sim_run(p, comp, rounds=60, seed=1)
            assert np.allclose(mpi.x, sim.x, rtol=1e-12, atol=1e-14), (type(comp).__name__, np.abs(mpi.x - sim.x).max())
        # the finite-sum methods: each rank draws its own workers' minibatches
        for run, sim_run, comp in ((pd.vr_marina, permk.vr_marina, permk.PermK()), (pd.sgd, permk.sgd, None)):
            mpi = run(p, comp, rounds=60, seed=1, batch_size=4) if comp else run(p, rounds=60, seed=1, batch_size=4)
            sim = sim_run(p, comp, rounds=60, seed=1, batch_size=4)
            assert np.allclose(mpi.x, sim.x, rtol=1e-12, atol=1e-14), (sim.method, np.abs(mpi.x - sim.x).max())
            assert np.array_equal(mpi.oracle_calls, sim.oracle_calls)
        # DASHA's estimator option on MPI: the run of DASHA-PAGE
        mpi = pd.dasha(p, permk.PermK(), rounds=40, seed=1, gamma=0.3, estimator="page", batch_size=4)
        sim = permk.dasha_page(p, permk.PermK(), rounds=40, seed=1, gamma=0.3, batch_size=4)
        assert mpi.method == "dasha_page" and np.allclose(mpi.x, sim.x, rtol=1e-12, atol=1e-14), np.abs(mpi.x - sim.x).max()
        # each rank holding only its workers' samples (HeldShards): the same runs
        held = p.held(pd.workers_of(p.n, comm))
        assert held._held._data.k == len(held.workers)
        for run, sim_run, comp, opts in ((pd.marina, permk.marina, permk.PermK(), {}), (pd.ef21, permk.ef21, permk.TopK(2), {}),
                                         (pd.vr_marina, permk.vr_marina, permk.PermK(), {"batch_size": 4})):
            mpi = run(held, comp, rounds=60, seed=1, **opts)
            sim = sim_run(p, comp, rounds=60, seed=1, **opts)
            assert mpi.params.gamma == sim.params.gamma, sim.method
            assert np.allclose(mpi.x, sim.x, rtol=1e-12, atol=1e-14), (sim.method, np.abs(mpi.x - sim.x).max())
            assert np.allclose(mpi.grad_norm_sq, sim.grad_norm_sq, rtol=1e-10, atol=0), sim.method
            assert np.array_equal(mpi.bits_per_worker, sim.bits_per_worker) and np.array_equal(mpi.oracle_calls, sim.oracle_calls)
        mine = list(pd.workers_of(p.n, comm))
        x = rng.standard_normal(p.d)
        local = p.minibatch_grads(x, 5, seed=3, round=7, workers=mine)
        rows = comm.gather((mine, local), root=0)
        if comm.rank == 0:
            full = p.minibatch_grads(x, 5, seed=3, round=7)
            for ws, g in rows:
                assert np.array_equal(g, full[ws])
    if comm.rank == 0:
        print("ok")


if __name__ == "__main__":
    main()
