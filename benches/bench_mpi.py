"""Localhost MPI benchmark: PermK's Allgatherv of blocks against a dense Allreduce.

One compressed MARINA round moves, per rank, its PermK block (``⌈d/n⌉`` float64 values, the
coordinates recomputed from the shared seed) with ``Allgatherv``; each rank then scatters the
blocks into ``R^d`` (:meth:`permk.distributed` p2p mode). The uncompressed baseline is an
``Allreduce`` of the same ``d``-vector. For d in {1e5, 1e6, 1e7} on 2 and 4 processes this
prints the time per round (the slowest rank's, median over repetitions) and the bytes per rank:
handed to MPI (what the paper counts) and on the wire for ring algorithms
(``Allgatherv``: ``(n−1)/n · 8d``; ``Allreduce``: ``2(n−1)/n · 8d``).

    python benches/bench_mpi.py                 # launches mpiexec -n 2 and -n 4 itself
    python benches/bench_mpi.py --procs 4 --dims 100000
    mpiexec -n 4 python benches/bench_mpi.py --inner --dims 1000000   # one configuration
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import numpy as np


def _reps(d: int) -> int:
    return 30 if d <= 100_000 else 10 if d <= 1_000_000 else 5


def inner(dims: list[int]) -> None:
    from mpi4py import MPI

    import permk
    from permk.distributed import LocalView, _Comm

    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    comp = permk.PermK()
    for d in dims:
        # only n and d matter to the collectives; the view's problem is never evaluated here
        view = LocalView(permk.Quadratic.synthetic(n=n, d=d, lam=1.0, noise_scale=0.0), workers=range(rank, rank + 1))
        c = _Comm(comm, view, "p2p", "allreduce")
        x = np.random.default_rng(rank).standard_normal(d)
        out, recv = np.empty(d), np.empty(d)
        # plan: the round's permutation (Rust, every rank); permk: pack the block, Allgatherv,
        # place the blocks (permk.distributed's p2p path); allgatherv: the collective alone
        rows: dict[str, list[float]] = {"plan": [], "permk": [], "allgatherv": [], "allreduce": []}
        sent = {"permk": 0, "allreduce": 0}
        for t in range(_reps(d) + 1):  # the first repetition warms up
            comm.Barrier()
            t0 = time.perf_counter()
            plan = comp.plan(n, d, seed=1, round=t)
            t_plan = time.perf_counter() - t0
            comm.Barrier()
            t1 = time.perf_counter()
            vals = x[plan.worker(rank)] * plan.scales[rank]
            c.take()
            mean = c.mean_plan(plan, vals, unique=True)
            t2 = time.perf_counter()
            sent["permk"] = c.take()[0]
            counts = [int(plan.offsets[r + 1] - plan.offsets[r]) for r in range(n)]
            displs = [int(v) for v in plan.offsets[:-1]]
            comm.Barrier()
            t3 = time.perf_counter()
            comm.Allgatherv(vals, [recv, counts, displs, MPI.DOUBLE])
            t4 = time.perf_counter()
            comm.Barrier()
            t5 = time.perf_counter()
            comm.Allreduce(x, out, op=MPI.SUM)
            dense = out / n
            t6 = time.perf_counter()
            sent["allreduce"] = x.nbytes
            if t == 0:
                assert np.isfinite(mean).all() and np.isfinite(dense).all()
                continue
            local = np.array([t_plan, t2 - t1, t4 - t3, t6 - t5])
            slowest = np.empty(4)
            comm.Allreduce(local, slowest, op=MPI.MAX)
            for k, v in zip(rows, slowest):
                rows[k].append(float(v))
        if rank == 0:
            res: dict[str, Any] = {"n": n, "d": d, "reps": _reps(d)}
            res.update({f"t_{k}": float(np.median(v)) for k, v in rows.items()})
            res.update(bytes_permk=sent["permk"], bytes_allreduce=sent["allreduce"],
                       wire_permk=(n - 1) * 8 * d / n, wire_allreduce=2 * (n - 1) * 8 * d / n)
            print("RESULT " + json.dumps(res), flush=True)
        del c, view, x, out


def _fmt_t(s: float) -> str:
    return f"{s * 1e3:8.2f} ms" if s >= 1e-3 else f"{s * 1e6:8.1f} us"


def _fmt_b(b: float) -> str:
    for unit, f in (("MB", 1e6), ("kB", 1e3)):
        if b >= f:
            return f"{b / f:7.2f} {unit}"
    return f"{b:7.0f} B "


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inner", action="store_true", help="run the measurement (under mpiexec)")
    ap.add_argument("--dims", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="set for the MPI processes, e.g. MPIR_CVAR_ALLGATHERV_INTRA_ALGORITHM=brucks (MPICH)")
    args = ap.parse_args()
    if args.inner:
        inner(args.dims)
        return
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = beside if os.path.exists(beside) else shutil.which("mpiexec")
    if mpiexec is None:
        sys.exit("mpiexec not found: pip install 'permk[mpi]'")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.update(kv.split("=", 1) for kv in args.env)
    results = []
    for n in args.procs:
        cmd = [mpiexec, "-n", str(n), sys.executable, __file__, "--inner", "--dims", *map(str, args.dims)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
        results += [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    tuned = " ".join(f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(("MPIR_CVAR_", "OMPI_MCA_")))
    print(f"localhost, {os.cpu_count()} cores; time per round = slowest rank, median of the repetitions; "
          f"MPI settings: {tuned or 'defaults'}")
    head = (f"{'n':>2} {'d':>9} | {'plan':>11} {'PermK':>11} {'Allgatherv':>11} | {'Allreduce':>11} | "
            f"{'t ratio':>8} {'t ratio':>8} | {'PermK':>9} {'Allreduce':>9} {'ratio':>5} | {'PermK':>9} {'Allreduce':>9} {'ratio':>5}")
    print(head)
    print(f"{'':>12} | {'(Rust)':>11} {'exchange':>11} {'alone':>11} | {'(dense)':>11} | "
          f"{'AR/PermK':>8} {'AR/AGv':>8} | {'bytes handed to MPI / rank':>25} | {'bytes on the wire / rank':>25}")
    print("-" * len(head))
    for r in results:
        print(f"{r['n']:>2} {r['d']:>9.0e} | {_fmt_t(r['t_plan']):>11} {_fmt_t(r['t_permk']):>11} {_fmt_t(r['t_allgatherv']):>11} | "
              f"{_fmt_t(r['t_allreduce']):>11} | {r['t_allreduce'] / r['t_permk']:8.2f} {r['t_allreduce'] / r['t_allgatherv']:8.2f} | "
              f"{_fmt_b(r['bytes_permk']):>9} {_fmt_b(r['bytes_allreduce']):>9} {r['bytes_allreduce'] / r['bytes_permk']:5.1f} | "
              f"{_fmt_b(r['wire_permk']):>9} {_fmt_b(r['wire_allreduce']):>9} {r['wire_allreduce'] / r['wire_permk']:5.1f}")
    print("PermK exchange = pack the block + Allgatherv of the values + place them (permk.distributed, p2p); "
          "plan = recomputing the round's permutation from (seed, t) on every rank.")

if __name__ == "__main__":
    main()
