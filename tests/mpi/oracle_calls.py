"""Every method's rounds on MPI, their oracle calls counted by worker and point (tests/counting.py):
``mpiexec -n K python oracle_calls.py``. Each rank checks its held workers' evaluations against
the algorithm's round; rank 0 prints ``oracle-calls|OK|<cases>`` or the failures (and exits 1)."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import numpy as np  # noqa: E402

import permk  # noqa: E402
from counting import CountingProblem, check_round, counted_rounds  # noqa: E402
from permk.distributed import LocalView  # noqa: E402
from permk.transport.mpi import MPIBackend  # noqa: E402

SEED = 3
CASES = [
    ("gd", None, {}), ("marina", permk.PermK(), {"p": 0.3}), ("marina", permk.PermK(), {"p": 0.3, "participation": 3}),
    ("marina", permk.RandK(2), {"p": 0.2, "participation": 5}), ("ef21", permk.TopK(3), {}), ("dcgd_shifted", permk.PermK(), {}),
    ("diana", permk.PermK(), {}), ("rand_diana", permk.PermK(), {"p": 0.3}), ("dasha", permk.PermK(), {}),
    ("dasha", permk.PermK(), {"participation": 3}),
]


def main() -> None:
    comm = MPI.COMM_WORLD
    failures = []
    ran = 0
    for n, d in [(6, 20), (8, 5)]:
        for name, comp, opts in CASES:
            for path in ("rust", "fused", "dense"):
                q = CountingProblem(permk.Quadratic.synthetic(n, d, 1e-3, 0.5, seed=0))
                backend = MPIBackend(LocalView(q, comm=comm), comm, reduce="ordered", path=path)
                c = permk.Identity() if comp is None else comp
                try:
                    params, rounds = counted_rounds(getattr(permk, name), q, c, backend, rounds=15, seed=SEED, gamma=0.05, **opts)
                except ValueError as e:
                    if "path" not in str(e) or path == "dense":
                        failures.append(f"{name} {opts} {path} n={n} d={d}: {e}")
                    continue
                sent = getattr(permk, name).resolve(dict(opts))[0].sent_compressor(c, params.own)
                sizes = None
                if sent.capabilities.shared_plan:
                    sizes = lambda t, s=sent: np.diff(np.asarray(s.round(n, d, seed=SEED, round=t).offsets()))  # noqa: E731
                try:
                    for prev, rnd in zip([None, *rounds], rounds):
                        check_round(name, opts, params.path, rnd, n=n, seed=SEED, held=backend.workers,
                                    oracle_full=params.oracle_full, message_sizes=sizes, prev=prev)
                    ran += 1
                except AssertionError:
                    failures.append(f"rank {comm.rank}: " + traceback.format_exc(limit=1))
    every = comm.gather(failures, root=0)
    counts = comm.gather(ran, root=0)
    if comm.rank == 0:
        bad = [f for fs in every for f in fs]
        if bad:
            print("oracle-calls|FAILED|" + "\n".join(bad))
            sys.exit(1)
        print(f"oracle-calls|OK|{min(counts)}")


if __name__ == "__main__":
    main()
