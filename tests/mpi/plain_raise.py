"""A user's MPI script in which rank 1 raises before any permk driver or MPI call:
``mpiexec -n 3 python plain_raise.py``. Importing permk.distributed under mpiexec installs the
abort-on-uncaught-exception hook, so the job must end (non-zero) instead of hanging the ranks
that go on into the run."""

from __future__ import annotations

import os

import permk
import permk.distributed as pd

rank = int(os.environ.get("PMI_RANK", "0"))
if rank == 1:
    raise KeyError("rank 1 could not load its shard (injected failure, outside the drivers)")
q = permk.Quadratic.synthetic(n=3, d=12, lam=1e-3, noise_scale=0.1, seed=0)
pd.marina(q, permk.PermK(), rounds=5, seed=1)
print(f"rank {rank}: finished (unexpected)", flush=True)
