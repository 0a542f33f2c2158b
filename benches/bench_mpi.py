"""Localhost MPI benchmark: one compressed round of the MPI backend against the bare collectives.

Every rank holds one worker (``n`` = number of processes). A round is what
:class:`permk.distributed.MPIBackend` does in MARINA's compressed exchange
(``compressed_mean``): compute the round's plan from ``(seed, t)``, take the worker's values at
its coordinates, exchange them and form the aggregate in ``R^d`` on every rank (p2p). Rows:

* ``plan``: the round's plan alone (:meth:`permk.Compressor.round`, every rank);
* ``PermK``: a random-permutation PermK round (values gathered, ``Allgatherv``, placed), without
  and with the next round's plan computed ahead on a background thread (``prefetch``);
* ``BlockPermK(n)``: a block round (``m = n`` contiguous blocks, a random permutation of the
  workers): the values land in the aggregate buffer through one ``Allgatherv`` whose
  displacements are the round's block starts;
* ``Allgatherv``: the bare collective of the same blocks into place (the floor of a
  BlockPermK(n) round);
* ``Allreduce``: the uncompressed baseline, an ``Allreduce`` of the ``d``-vector.

Each rank uses ``cores // ranks`` threads for the Rust kernels, as the MPI drivers do.

Time per round = the slowest rank's median over the repetitions. Bytes per rank: handed to MPI
(what the paper counts: the compressor's ``floats_per_worker``, against ``8d`` dense).

    python benches/bench_mpi.py                   # launches mpiexec -n 2 and -n 4 itself
    python benches/bench_mpi.py --procs 4 --dims 1000000
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
from typing import Any, Callable

import numpy as np

ROWS = ("plan_permk", "plan_block", "permk", "permk_prefetch", "block", "allgatherv", "allreduce")


def _reps(d: int) -> int:
    return 60 if d <= 100_000 else 25 if d <= 1_000_000 else 10


class OneRow:
    """A local problem of one worker per rank whose gradient is a fixed vector (the benchmark
    times the exchange, not an oracle)."""

    def __init__(self, n: int, d: int, rank: int) -> None:
        self.n, self.d, self.workers = n, d, range(rank, rank + 1)
        self.x0 = np.zeros(d)
        self.rows = np.random.default_rng(rank).standard_normal((1, d))

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        return self.rows


def inner(dims: list[int]) -> None:
    from mpi4py import MPI

    import permk
    from permk.distributed import MPIBackend
    from permk.parallel import limit_threads, threads_per_process

    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    limit_threads(threads_per_process(n))  # as permk.distributed's drivers do: ranks × threads ≤ cores
    permk_c, block_c = permk.PermK(), permk.BlockPermK(n)
    for d in dims:
        prob = OneRow(n, d, rank)
        backends = {p: MPIBackend(prob, comm, path="dense", prefetch=p) for p in (False, True)}
        x = prob.rows[0]
        out = np.empty(d)
        agg = np.empty(d)

        # the floor: the same blocks' Allgatherv alone (their layout computed before the timing)
        reps = _reps(d)
        layouts = []
        for t in range(reps + 1):
            s, e, _ = block_c.round(n, d, seed=1, round=t).ranges()  # type: ignore[misc]
            layouts.append((int(s[rank]), int(e[rank]), (e - s).tolist(), s.tolist()))

        def bare_allgatherv(t: int) -> None:
            lo, hi, counts, displs = layouts[t]
            comm.Allgatherv(x[lo:hi], [agg, counts, displs, MPI.DOUBLE])

        ops: dict[str, Callable[[int], Any]] = {
            "plan_permk": lambda t: permk_c.round(n, d, seed=1, round=t),
            "plan_block": lambda t: block_c.round(n, d, seed=1, round=t),
            "permk": lambda t: backends[False].compressed_mean(permk_c, x, seed=1, round=t),
            "block": lambda t: backends[False].compressed_mean(block_c, x, seed=1, round=t),
            "allgatherv": bare_allgatherv,
            "allreduce": lambda t: comm.Allreduce(x, out, op=MPI.SUM),
        }
        times: dict[str, list[float]] = {k: [] for k in ROWS}

        def timed(name: str, op: Callable[[int], Any], t: int) -> None:
            comm.Barrier()
            t0 = time.perf_counter()
            op(t)
            if t:  # the first repetition warms up
                times[name].append(time.perf_counter() - t0)

        # interleaved (every operation once per repetition), so that a drift of the machine's
        # speed moves all of them alike
        for t in range(reps + 1):
            for name, op in ops.items():
                timed(name, op, t)
        # prefetch: consecutive rounds and nothing else, each round's plan computed on a
        # background thread while the previous round communicates
        pf = backends[True]
        for t in range(reps + 1):
            timed("permk_prefetch", lambda t: pf.compressed_mean(permk_c, x, seed=1, round=t), t)
        # the aggregates are the compressors' own: the same with and without prefetch, and
        # BlockPermK(n)'s blocks placed by the Allgatherv are Compressor.aggregate's bits
        A = np.empty((n, d))
        comm.Allgather(x, A)
        for c, be in ((permk_c, backends[False]), (permk_c, pf), (block_c, backends[False])):
            got = be.compressed_mean(c, x, seed=1, round=reps + 1)
            assert got.tobytes() == c.aggregate(A, seed=1, round=reps + 1).tobytes(), c.name
        local = np.array([np.median(times[k]) for k in ROWS])
        slowest = np.empty_like(local)
        comm.Allreduce(local, slowest, op=MPI.MAX)
        if rank == 0:
            res: dict[str, Any] = {"n": n, "d": d, "reps": reps}
            res.update({f"t_{k}": float(v) for k, v in zip(ROWS, slowest)})
            res.update(bytes_permk=8 * permk_c.floats_per_worker(n, d), bytes_allreduce=8 * d)
            print("RESULT " + json.dumps(res), flush=True)


def _fmt_t(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} µs"


def _fmt_b(b: float) -> str:
    for unit, f in (("MB", 1e6), ("kB", 1e3)):
        if b >= f:
            return f"{b / f:.2f} {unit}"
    return f"{b:.0f} B"


def table(results: list[dict[str, Any]]) -> str:
    """The results as the README's markdown table."""
    lines = [
        "| ranks | d | plan PermK | plan BlockPermK(n) | PermK round | PermK round, prefetch | BlockPermK(n) round "
        "| bare Allgatherv | dense Allreduce | BlockPermK / Allgatherv | BlockPermK / Allreduce | PermK / Allreduce "
        "| PermK prefetch / Allreduce | bytes to MPI / rank: compressed vs dense |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        ar = r["t_allreduce"]
        lines.append(
            f"| {r['n']} | {r['d']:.0e} | {_fmt_t(r['t_plan_permk'])} | {_fmt_t(r['t_plan_block'])} | {_fmt_t(r['t_permk'])} "
            f"| {_fmt_t(r['t_permk_prefetch'])} | {_fmt_t(r['t_block'])} | {_fmt_t(r['t_allgatherv'])} | {_fmt_t(ar)} "
            f"| {r['t_block'] / r['t_allgatherv']:.2f} | {r['t_block'] / ar:.2f} | {r['t_permk'] / ar:.2f} "
            f"| {r['t_permk_prefetch'] / ar:.2f} | {_fmt_b(r['bytes_permk'])} vs {_fmt_b(r['bytes_allreduce'])} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inner", action="store_true", help="run the measurement (under mpiexec)")
    ap.add_argument("--dims", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--timeout", type=float, default=600)
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
    print(f"localhost, {os.cpu_count()} cores; time per round = the slowest rank's median; MPI settings: {tuned or 'defaults'}")
    print(table(results))


if __name__ == "__main__":
    main()
