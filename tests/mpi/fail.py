"""Failure modes of an MPI run: ``mpiexec -n 4 python fail.py KIND``.

* ``raise_in_round``: rank 2's local gradient raises in round 3 of a MARINA run;
* ``excepthook``: rank 1's own script raises before the run, with install_excepthook();
* ``bad_workers``: every rank holds one worker of n=8 (the blocks must be 2 per rank);
* ``too_few_workers``: n=3 workers on 4 processes;
* ``disagree``: the ranks pass different seeds;
* ``disagree_compressor``: the ranks pass RandK with different k;
* ``disagree_data``: the ranks pass synthetic quadratics of different seeds (same n, d, x0);
* ``disagree_mappings``: the ranks pass PermutationOfMappings of the same lambdas in different orders;
* ``plain_raise``: rank 1's script raises before any MPI call or driver, without
  install_excepthook() (importing permk.distributed installs it under mpiexec).

Each must end the job with a non-zero exit and the error on stderr, never hang.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import permk
import permk.distributed as pd


class Flaky(pd.LocalView):
    """A local view whose gradients raise on rank 2 after a few calls."""

    calls = 0

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        self.calls += 1
        if MPI.COMM_WORLD.rank == 2 and self.calls > 4:
            raise FloatingPointError("worker 2's data is corrupt (injected failure)")
        return super().local_grads(x)


def main(kind: str) -> None:
    comm = MPI.COMM_WORLD
    q = permk.Quadratic.synthetic(n=8 if kind == "bad_workers" else 4, d=16, lam=1e-3, noise_scale=0.1, seed=0)
    if kind == "raise_in_round":
        pd.marina(Flaky(q), permk.PermK(), rounds=50, seed=1, path="dense")
    elif kind == "excepthook":
        pd.install_excepthook()
        if comm.rank == 1:
            raise KeyError("rank 1 could not load its shard (injected failure)")
        pd.marina(pd.LocalView(q), permk.PermK(), rounds=5, seed=1)
    elif kind == "bad_workers":
        pd.marina(pd.LocalView(q, workers=[comm.rank]), permk.PermK(), rounds=5, seed=1)
    elif kind == "too_few_workers":
        q3 = permk.Quadratic.synthetic(n=3, d=16, lam=1e-3, noise_scale=0.1, seed=0)
        pd.marina(pd.LocalView(q3), permk.PermK(), rounds=5, seed=1)
    elif kind == "disagree":
        pd.marina(pd.LocalView(q), permk.PermK(), rounds=5, seed=comm.rank)
    elif kind == "disagree_compressor":
        pd.marina(q, permk.RandK(1 + comm.rank), rounds=5, seed=1)
    elif kind == "disagree_data":
        pd.marina(permk.Quadratic.synthetic(n=4, d=16, lam=1e-3, noise_scale=0.1, seed=comm.rank), permk.PermK(), rounds=5, seed=1)
    elif kind == "disagree_mappings":
        maps = [lambda x: 2 * x, lambda x: 0 * x, lambda x: 2 * x + 0, lambda x: 0 * x + 0]
        k = comm.rank
        c = permk.PermutationOfMappings(maps[k:] + maps[:k], theta=8.0, omega=1.0)
        pd.marina(q, c, rounds=5, seed=1, gamma=0.1)
    else:
        raise SystemExit(f"unknown kind {kind}")
    print(f"rank {comm.rank}: finished (unexpected)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
