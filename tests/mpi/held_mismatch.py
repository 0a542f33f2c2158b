"""Issue 33, item 7: ``mpiexec -n 2 python held_mismatch.py`` prints ``ok`` on rank 0 when every
launch whose ranks built their problem from different data raises :class:`LaunchError` on every
rank (held shards with the constants sent from rank 0, as ``permk classify --mpi`` builds them,
and whole problems), and the launches from the same data run."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from mpi4py import MPI

import permk
import permk.distributed as pd


def main() -> None:
    comm = MPI.COMM_WORLD
    other = comm.rank == 1  # rank 1 builds the variant
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((40, 5)), np.tile([-1.0, 1.0], 20)
    variants = {
        "labels -y": lambda: permk.NonconvexSigmoid(X, -y if other else y, n=4, seed=0),
        "shard seed": lambda: permk.NonconvexSigmoid(X, y, n=4, seed=1 if other else 0),
        "scaled X": lambda: permk.NonconvexSigmoid(2 * X if other else X, y, n=4, seed=0),
        "one sample": lambda: permk.NonconvexSigmoid(np.where(np.arange(40)[:, None] == 7, 0.5, 1.0) * X if other else X, y, n=4, seed=0),
        "sparse, labels -y": lambda: permk.NonconvexSigmoid(sp.csr_array(X), -y if other else y, n=4, seed=0),
        "lam": lambda: permk.NonconvexMultiClass(X, (y > 0).astype(int), n=4, seed=0, lam=2e-4 if other else 1e-4),
        "float32": lambda: permk.NonconvexSigmoid(X, y, n=4, seed=0, dtype=np.float32 if other else np.float64),
    }
    failures = []
    for name, build in variants.items():
        problem = build()
        smooth = comm.bcast(problem.smoothness() if comm.rank == 0 else None, root=0)
        for what, local in (("held", problem.held(pd.workers_of(problem.n, comm), constants=smooth)), ("whole", problem)):
            try:
                pd.diana(local, permk.PermK(), rounds=5, seed=1)
            except pd.LaunchError as e:
                if "disagree" not in str(e):
                    failures.append(f"{name} ({what}): {e}")
            else:
                failures.append(f"{name} ({what}): ran to the end")
    # the same data on every rank: the run goes on, held or whole, and equals the simulator
    p = permk.NonconvexSigmoid(sp.csr_array(X), y, n=4, seed=0)
    smooth = comm.bcast(p.smoothness() if comm.rank == 0 else None, root=0)
    sim = permk.diana(p, permk.PermK(), rounds=20, seed=1)
    for local in (p.held(pd.workers_of(p.n, comm), constants=smooth), p):
        got = pd.diana(local, permk.PermK(), rounds=20, seed=1)
        if not np.allclose(got.x, sim.x, rtol=1e-12, atol=1e-14):
            failures.append(f"same data: {np.abs(got.x - sim.x).max()}")
    every = comm.gather(failures, root=0)
    if comm.rank == 0:
        bad = [f"rank {r}: {f}" for r, fs in enumerate(every) for f in fs]
        print("\n".join(bad) if bad else "ok")


if __name__ == "__main__":
    main()
