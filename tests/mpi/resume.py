"""Runs resumed on MPI from a simulator's state equal the uninterrupted runs (``mpiexec -n N
python resume.py``): DIANA (its per-worker shifts cut to each rank's rows), RandDIANA, shifted
DCGD, DASHA and DASHA-PP (their rows G and H cut likewise) and MARINA with partial participation. Rank 0 prints one line ``name|same`` per method."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import permk
import permk.distributed as pd
from mpi_cases import WorkerOrderMean

CASES = {"diana": (permk.diana, {}), "rand_diana": (permk.rand_diana, {"p": 0.3}),
         "dcgd_shifted": (permk.dcgd, {"shifts": "initial"}), "dasha": (permk.dasha, {}),
         "dasha_pp": (permk.dasha, {"participation": 3}), "marina_pp": (permk.marina, {"participation": 3, "p": 0.3})}


def main() -> None:
    comm = MPI.COMM_WORLD
    q = WorkerOrderMean(permk.Quadratic.synthetic(n=8, d=20, lam=1e-3, noise_scale=0.3, seed=1))
    for name, (method, options) in CASES.items():
        whole = permk.run(method, q, permk.PermK(), rounds=30, seed=3, path="dense", **options)
        first = permk.run(method, q, permk.PermK(), rounds=12, seed=3, path="dense", **options)
        rest = pd.run(method, q, permk.PermK(), rounds=18, seed=3, state=first.state, reduce="ordered", comm=comm, **options)
        same = bool(np.array_equal(rest.x, whole.x) and np.array_equal(rest.grad_norm_sq, whole.grad_norm_sq[12:])
                    and np.array_equal(rest.bits_per_worker, whole.bits_per_worker[12:]))
        if comm.rank == 0:
            print(f"{name}|{same}", flush=True)


if __name__ == "__main__":
    main()
