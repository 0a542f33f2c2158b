"""Run the cases of mpi_cases.py on MPI and save rank 0's results: ``mpiexec -n 4 python run_cases.py OUT [NAME ...]``.

Every rank checks that it got the same result as rank 0 (the digests of all its arrays).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mpi_cases import CASES, run_mpi  # noqa: E402

ARRAYS = ("rounds", "grad_norm_sq", "f_gap", "bits_per_worker", "expected_bits_per_worker", "oracle_calls", "coins", "x", "x_hat",
          "bytes_sent", "bytes_broadcast", "bytes_per_worker", "theory_bytes_per_worker")


def main() -> None:
    comm = MPI.COMM_WORLD
    out = Path(sys.argv[1])
    names = sys.argv[2:] or list(CASES)
    for name in names:
        res = run_mpi(CASES[name], comm)
        arrays = {k: np.asarray(getattr(res, k)) for k in ARRAYS if getattr(res, k) is not None}
        arrays.update({f"state.{k}": getattr(res.state, k) for k in res.state.shared_arrays()})
        h = hashlib.sha256()
        for k in sorted(arrays):
            h.update(k.encode() + np.ascontiguousarray(arrays[k]).tobytes())
        digests = comm.allgather(h.hexdigest())
        if comm.rank == 0:
            meta = {"params": res.params.record(), "same_on_every_rank": len(set(digests)) == 1, "n_procs": res.n_procs,
                    "workers_rank0": [res.workers.start, res.workers.stop], "diverged_at": res.diverged_at,
                    "method": res.method, "compressor": res.compressor}
            np.savez(out / f"{name}.npz", meta=json.dumps(meta), **arrays)


if __name__ == "__main__":
    main()
