"""A method defined outside the package, with a per-worker state (``mpi_cases.LocalMomentum``),
on MPI: ``mpiexec -n 2 python user_method.py OUT.json``. Rank 0 writes what it saw; every rank
checks the same things (a rank whose digests differed would raise in the driver)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mpi_cases import WorkerOrderMean, local_momentum  # noqa: E402

import permk  # noqa: E402
import permk.distributed as pd  # noqa: E402


def main() -> None:
    comm = MPI.COMM_WORLD
    q = WorkerOrderMean(permk.Quadratic.synthetic(n=4, d=10, lam=1e-3, noise_scale=0.3, seed=1))
    kw = dict(seed=5, gamma=0.2, reduce="ordered")
    sim = permk.run(local_momentum, q, permk.Identity(), rounds=12, seed=5, gamma=0.2, path="dense")
    first = pd.run(local_momentum, q, permk.Identity(), rounds=7, **kw)
    # resumed from the MPI state (this rank's rows) and from the simulator's (all n rows, cut)
    rest = pd.run(local_momentum, q, permk.Identity(), rounds=5, state=first.state, **kw)
    half = permk.run(local_momentum, q, permk.Identity(), rounds=7, seed=5, gamma=0.2, path="dense")
    from_sim = pd.run(local_momentum, q, permk.Identity(), rounds=5, state=half.state, **kw)
    try:
        pd.run(local_momentum, q, permk.Identity(), rounds=1, state=type(half.state)(
            x=half.state.x, m=half.state.m, M=half.state.M[:3], round=7, seed=5), **kw)
        error = ""
    except ValueError as e:
        error = str(e)
    diverged = pd.run(local_momentum, q, permk.Identity(), rounds=400, seed=5, gamma=50.0, reduce="ordered")
    out = {
        "rows": int(first.state.M.shape[0]),
        "workers": [first.workers.start, first.workers.stop],
        "equal_to_simulator": bool(np.array_equal(rest.x, sim.x) and np.array_equal(rest.state.m, sim.state.m)),
        "from_simulator": bool(np.array_equal(from_sim.x, sim.x)),
        "held_rows_of_simulator": bool(np.array_equal(from_sim.state.M, sim.state.M[first.workers.start : first.workers.stop])),
        "bad_rows": error,
        "diverged_at": diverged.diverged_at,
        "simulator_diverged_at": permk.run(local_momentum, q, permk.Identity(), rounds=400, seed=5, gamma=50.0, path="dense").diverged_at,
    }
    everyone = comm.allgather(out)
    if comm.Get_rank() == 0:
        Path(sys.argv[1]).write_text(json.dumps({"ranks": everyone}))


if __name__ == "__main__":
    main()
