"""The threads of each rank after a distributed run (``mpiexec -n K python threads.py``): rank 0
prints one line ``rank rust_threads blas_threads...`` per rank — the Rust pool's and BLAS's,
which must both be ``cores // (ranks on this machine)`` (at least 1), or ``PERMK_THREADS``."""

from __future__ import annotations

from mpi4py import MPI
from threadpoolctl import threadpool_info

import permk
import permk.distributed as pd
from permk import _core

q = permk.Quadratic.synthetic(n=MPI.COMM_WORLD.Get_size(), d=8, lam=1e-3, noise_scale=0.1, seed=0)
pd.marina(q, permk.PermK(), rounds=2, seed=0)
blas = {int(p["num_threads"]) for p in threadpool_info() if p["user_api"] == "blas"}
rows = MPI.COMM_WORLD.gather([MPI.COMM_WORLD.Get_rank(), _core.get_num_threads(), *sorted(blas)], root=0)
if rows is not None:
    for row in rows:
        print(*row, flush=True)
