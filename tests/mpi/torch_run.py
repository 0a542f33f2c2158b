"""MPI checks of torch models as permk problems: ``mpiexec -n R python torch_run.py`` prints one
line ``ok DEV`` on rank 0 when MARINA+PermK, EF21+TopK and VR-MARINA+PermK on MPI — with the
global :class:`permk.torch.ModuleProblem` (each rank's workers through ``LocalView``) and with
each rank's :class:`permk.torch.LocalModuleProblem` (only its shards) — end within ``BOUND``
(relative) of the simulator's iterate; ``DEV`` is the largest relative difference seen."""

from __future__ import annotations

import sys

import numpy as np
import torch
from mpi4py import MPI

import permk
import permk.distributed as pd
from permk.torch import LocalModuleProblem, ModuleProblem

#: Largest ``max|x_mpi − x_sim| / max|x_sim|`` accepted after ``ROUNDS`` rounds in float64: the
#: ranks evaluate their own workers, whose gradients can differ from the simulator's batch of all
#: workers in the last bits (a few 1e-17 per gradient), carried on by the iteration.
BOUND = 1e-11
ROUNDS = 30
N = 4


def net() -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(12, 8, dtype=torch.float64), torch.nn.Sigmoid(),
                                   torch.nn.Linear(8, 3, dtype=torch.float64))


def main() -> None:
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(0)
    sizes = [11, 11, 10, 10]  # ragged: two groups of equal-size shards
    shards = [(rng.standard_normal((m, 12)), rng.integers(0, 3, m)) for m in sizes]
    loss = torch.nn.functional.cross_entropy
    full = ModuleProblem(net(), loss, shards)
    mine = pd.workers_of(N, comm)
    local = LocalModuleProblem(net(), loss, [shards[i] for i in mine], n=N, workers=mine, sample_counts=sizes)
    cases = [
        (pd.marina, permk.marina, permk.PermK(), {"gamma": 0.5}),
        (pd.ef21, permk.ef21, permk.TopK(50), {"gamma": 0.2}),
        (pd.vr_marina, permk.vr_marina, permk.PermK(), {"gamma": 0.3, "batch_size": 3}),
    ]
    worst = 0.0
    for mpi_run, sim_run, comp, opts in cases:
        sim = sim_run(full, comp, rounds=ROUNDS, seed=1, **opts)
        for problem in (full, local):
            res = mpi_run(problem, comp, rounds=ROUNDS, seed=1, reduce="ordered", **opts)
            dev = float(np.abs(res.x - sim.x).max() / np.abs(sim.x).max())
            worst = max(worst, dev)
            if not dev <= BOUND:
                print(f"{sim.method} on {type(problem).__name__}: relative difference {dev:.3g} > {BOUND}", file=sys.stderr)
                comm.Abort(1)
            if not np.array_equal(res.oracle_calls, sim.oracle_calls):
                print(f"{sim.method}: oracle calls differ", file=sys.stderr)
                comm.Abort(1)
    worst = comm.allreduce(worst, op=MPI.MAX)
    if comm.rank == 0:
        print(f"ok {worst:.3g}")


if __name__ == "__main__":
    main()
