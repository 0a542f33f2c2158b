"""Run the cases of autoencoder_cases.py on MPI, each rank holding only its own workers' images,
and save rank 0's results: ``mpiexec -n R python autoencoder_run.py OUT [NAME ...]``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import permk.distributed as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from autoencoder_cases import CASES, N_WORKERS, OPTIONS, compressor, method, problem  # noqa: E402


def main() -> None:
    comm = MPI.COMM_WORLD
    out = Path(sys.argv[1])
    for name in sys.argv[2:] or list(CASES):
        local = problem(name, workers=pd.workers_of(N_WORKERS, comm))
        res = pd.run(method(name), local, compressor(name), reduce=CASES[name][5], **OPTIONS)
        held = comm.gather([local.workers.start, local.workers.stop, int(local._AT.shape[1]),
                            int(sum(local.sizes[s] for s in local._held))], root=0)
        if comm.rank == 0:
            coins = {} if res.coins is None else {"coins": res.coins}
            np.savez(out / f"{name}.npz", x=res.x, grad_norm_sq=res.grad_norm_sq, f_gap=res.f_gap, bits=res.bits_per_worker,
                     meta=json.dumps({"held": held, "path": res.params.path}), **coins)


if __name__ == "__main__":
    main()
