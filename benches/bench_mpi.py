"""Localhost MPI benchmark: one compressed round on the MPI backend against the bare collectives.

Every rank holds one worker (``n`` = number of processes). A round is what the exchange
:data:`permk.exchanges.compressed_mean` does on a :class:`permk.distributed.MPIBackend` (the
``"dense"`` path: each rank's gradient is a fixed vector): compute the round's plan from
``(seed, t)``, take the worker's values at its coordinates, exchange them and form the aggregate
in ``R^d`` on every rank (p2p). Rows:

* ``plan``: the round's plan alone (:meth:`permk.Compressor.round`, every rank): PermK with its
  default sampler (``"rebalance"``), with ``sampler="shuffle"``, and ``BlockPermK(n)``;
* ``PermK round``: a PermK round (random assignment, default sampler) as the backend does it by
  default on one node (the values through a shared-memory window), without and with the next
  round's plan computed ahead on a background thread (``prefetch``); ``PermK round,
  Allgatherv``: the same through an ``Allgatherv`` (``MPIBackend(window=False)``, the transport
  across nodes); ``PermK(shuffle) round``: the default transport with the shuffle sampler;
* the Allgatherv round's phases, timed one by one on the same round: ``gather`` (the worker's
  values at its coordinates, :meth:`Round.gather`), ``Allgatherv`` (of those values, bare),
  ``place`` (the aggregate from all values, :meth:`Round.mean`);
* ``BlockPermK(n) round``: a block round (``m = n`` contiguous blocks, a random permutation of
  the workers): the values land in the aggregate buffer through one in-place ``Allgatherv``;
  ``Allgatherv (blocks)``: that bare collective (the floor of a BlockPermK(n) round);
* ``Allreduce``: the uncompressed baseline, an ``Allreduce`` of the ``d``-vector (the reference
  every ratio divides by, measured in the same run).

Each rank uses ``cores // ranks`` threads for the Rust kernels, as the MPI drivers do. Every
operation runs once per repetition, interleaved, after a barrier; a repetition's time is the
slowest rank's; the table gives the median and the range over the repetitions. The aggregates
are checked against :meth:`permk.Compressor.aggregate` (bit for bit).

    python benches/bench_mpi.py                     # mpiexec -n 2 and -n 4, d = 1e5, 1e6, 1e7
    python benches/bench_mpi.py --procs 4 --dims 1000000 --json mpi.json
    python benches/bench_mpi.py --smoke             # tiny sizes, a few seconds; non-zero exit on failure
    mpiexec -n 4 python benches/bench_mpi.py --inner --dims 1000000   # one configuration
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np

ROWS = ("plan", "plan_shuffle", "plan_block", "permk", "permk_prefetch", "permk_allgatherv", "permk_shuffle", "gather",
        "allgatherv", "place", "block", "allgatherv_block", "allreduce")
TITLES = {
    "plan": "plan PermK", "plan_shuffle": "plan PermK(shuffle)", "plan_block": "plan BlockPermK(n)", "permk": "PermK round",
    "permk_prefetch": "PermK round, prefetch", "permk_allgatherv": "PermK round, Allgatherv", "permk_shuffle": "PermK(shuffle) round",
    "gather": "PermK: gather",
    "allgatherv": "PermK: Allgatherv", "place": "PermK: place", "block": "BlockPermK(n) round",
    "allgatherv_block": "Allgatherv (blocks)", "allreduce": "Allreduce",
}


def _reps(d: int) -> int:
    return 40 if d <= 100_000 else 20 if d <= 1_000_000 else 10


class OneRow:
    """A local problem of one worker per rank whose gradient is a fixed vector (the benchmark
    times the exchange, not an oracle)."""

    def __init__(self, n: int, d: int, rank: int) -> None:
        self.n, self.d, self.workers = n, d, range(rank, rank + 1)
        self.x0 = np.zeros(d)
        self.rows = np.random.default_rng(rank).standard_normal((1, d))

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        return self.rows


def inner(dims: list[int], reps_fixed: int | None) -> None:
    from mpi4py import MPI

    import permk
    from permk.distributed import MPIBackend
    from permk.exchanges import compressed_mean
    from permk.parallel import limit_threads, threads_per_process

    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    threads = limit_threads(threads_per_process(n))  # as permk.distributed's drivers do: ranks × threads ≤ cores
    permk_c, shuffle_c, block_c = permk.PermK(), permk.PermK(sampler="shuffle"), permk.BlockPermK(n)
    for d in dims:
        prob = OneRow(n, d, rank)
        backends = {p: MPIBackend(prob, comm, path="dense", prefetch=p) for p in (False, True)}
        gatherv = MPIBackend(prob, comm, path="dense", prefetch=False, window=False)
        x = prob.x0
        row = prob.rows
        out = np.empty(d)
        agg = np.empty(d)
        reps = reps_fixed or _reps(d)

        # the bare collectives' layouts, computed before the timing
        blocks, plans = [], []
        for t in range(reps + 1):
            s, e, _ = block_c.round(n, d, seed=1, round=t).ranges()  # type: ignore[misc]
            blocks.append(((e - s).tolist(), s.tolist()))
            off = permk_c.round(n, d, seed=1, round=t).offsets()
            plans.append(np.diff(off).tolist())

        def timed(op: Callable[[], Any]) -> float:
            t0 = time.perf_counter()
            op()
            return time.perf_counter() - t0

        def bare_allgatherv_block(t: int) -> float:
            counts, displs = blocks[t]
            lo, hi = displs[rank], displs[rank] + counts[rank]
            return timed(lambda: comm.Allgatherv(row[0, lo:hi], [agg, counts, displs, MPI.DOUBLE]))

        send, recv = np.zeros(-(-d // n)), np.zeros(d)  # kept across rounds, as MPIBackend's buffers

        def phases(t: int) -> tuple[float, float, float]:
            """A PermK round step by step, as MPIBackend does it: (gather, Allgatherv, place)."""
            r = permk_c.round(n, d, seed=1, round=t)
            counts = plans[t]
            vals = send[: counts[rank]]
            t0 = time.perf_counter()
            r.gather(row, rank, out=vals)
            t1 = time.perf_counter()
            comm.Barrier()
            t2 = time.perf_counter()
            comm.Allgatherv(vals, [recv, counts, np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist(), MPI.DOUBLE])
            t3 = time.perf_counter()
            comm.Barrier()
            t4 = time.perf_counter()
            r.mean(recv, out=agg)
            t5 = time.perf_counter()
            return t1 - t0, t3 - t2, t5 - t4

        ops: dict[str, Callable[[int], float]] = {
            "plan": lambda t: timed(lambda: permk_c.round(n, d, seed=1, round=t)),
            "plan_shuffle": lambda t: timed(lambda: shuffle_c.round(n, d, seed=1, round=t)),
            "plan_block": lambda t: timed(lambda: block_c.round(n, d, seed=1, round=t)),
            "permk": lambda t: timed(lambda: compressed_mean(backends[False], permk_c, x, seed=1, round=t)),
            "permk_allgatherv": lambda t: timed(lambda: compressed_mean(gatherv, permk_c, x, seed=1, round=t)),
            "permk_shuffle": lambda t: timed(lambda: compressed_mean(backends[False], shuffle_c, x, seed=1, round=t)),
            "block": lambda t: timed(lambda: compressed_mean(backends[False], block_c, x, seed=1, round=t)),
            "allgatherv_block": bare_allgatherv_block,
            "allreduce": lambda t: timed(lambda: comm.Allreduce(row[0], out, op=MPI.SUM)),
        }
        times: dict[str, list[float]] = {k: [] for k in ROWS}

        # interleaved (every operation once per repetition), so that a drift of the machine's
        # speed moves all of them alike; the first repetition warms up
        for t in range(reps + 1):
            for name, op in ops.items():
                comm.Barrier()
                s = op(t)
                if t:
                    times[name].append(s)
            comm.Barrier()
            g, a, p = phases(t)
            if t:
                times["gather"].append(g)
                times["allgatherv"].append(a)
                times["place"].append(p)
        # prefetch: consecutive rounds and nothing else, each round's plan computed on a
        # background thread while the previous round communicates
        pf = backends[True]
        for t in range(reps + 1):
            comm.Barrier()
            s = timed(lambda: compressed_mean(pf, permk_c, x, seed=1, round=t))
            if t:
                times["permk_prefetch"].append(s)
        # the aggregates are the compressors' own, bit for bit, with and without prefetch
        A = np.empty((n, d))
        comm.Allgather(row[0], A)
        for c, be in ((permk_c, backends[False]), (permk_c, pf), (permk_c, gatherv), (shuffle_c, backends[False]), (block_c, backends[False])):
            got = compressed_mean(be, c, x, seed=1, round=reps + 1)
            if got.tobytes() != c.aggregate(A, seed=1, round=reps + 1).tobytes():
                raise AssertionError(f"{c.name}: the MPI round's aggregate is not Compressor.aggregate's")
        for be in (*backends.values(), gatherv):
            be.close()
        # a repetition's time is the slowest rank's
        local = np.array([times[k] for k in ROWS])
        slowest = np.empty_like(local)
        comm.Allreduce(local, slowest, op=MPI.MAX)
        if rank == 0:
            res: dict[str, Any] = {"n": n, "d": d, "reps": reps, "threads_per_rank": threads}
            for k, v in zip(ROWS, slowest):
                res[k] = {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max())}
            res.update(bytes_permk=8 * permk_c.floats_per_worker(n, d), bytes_allreduce=8 * d)
            print("RESULT " + json.dumps(res), flush=True)


def _fmt_t(s: float) -> str:
    return f"{s * 1e3:.2f}" if s >= 1e-3 else f"{s * 1e3:.3f}"


def _cell(x: dict[str, float]) -> str:
    return f"{_fmt_t(x['median'])} ({_fmt_t(x['min'])}–{_fmt_t(x['max'])})"


def table(results: list[dict[str, Any]]) -> str:
    """The results as a markdown table: milliseconds, median (range), and ratios of medians to the
    Allreduce measured in the same run."""
    head = ["ranks", "d"] + [TITLES[k] + " ms" for k in ROWS] + [
        "PermK / Allreduce", "PermK prefetch / Allreduce", "PermK Allgatherv / Allreduce", "PermK(shuffle) / Allreduce",
        "BlockPermK / Allreduce"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for r in results:
        ar = r["allreduce"]["median"]
        cells = [str(r["n"]), f"{r['d']:.0e}"] + [_cell(r[k]) for k in ROWS] + [
            f"{r[k]['median'] / ar:.2f}" for k in ("permk", "permk_prefetch", "permk_allgatherv", "permk_shuffle", "block")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inner", action="store_true", help="run the measurement (under mpiexec)")
    ap.add_argument("--dims", type=float, nargs="+", default=[1e5, 1e6, 1e7])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default: by d)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds; exits non-zero if anything fails")
    ap.add_argument("--json", metavar="PATH", help="where to write the table (default benches/results/bench_mpi.json; a smoke run writes none unless given)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="set for the MPI processes, e.g. MPIR_CVAR_ALLGATHERV_INTRA_ALGORITHM=brucks (MPICH)")
    args = ap.parse_args()
    dims = [int(v) for v in args.dims]
    if args.inner:
        inner(dims, args.reps)
        return
    if args.smoke:
        args.procs, dims, args.reps = [2], [1000, 70_001], 3
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = beside if os.path.exists(beside) else shutil.which("mpiexec")
    if mpiexec is None:
        sys.exit("mpiexec not found: pip install 'permk[mpi]'")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.update(kv.split("=", 1) for kv in args.env)
    load_before = _uptime()
    results = []
    for n in args.procs:
        cmd = [mpiexec, "-n", str(n), sys.executable, __file__, "--inner", "--dims", *map(str, dims)]
        if args.reps:
            cmd += ["--reps", str(args.reps)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
        results += [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if len(results) != len(args.procs) * len(dims):
        sys.exit(f"expected {len(args.procs) * len(dims)} results, got {len(results)}")
    load_after = _uptime()
    tuned = " ".join(f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(("MPIR_CVAR_", "OMPI_MCA_")))
    print(f"localhost, {os.cpu_count()} cores ({platform.processor() or platform.machine()}); MPI settings: {tuned or 'defaults'}")
    print(f"load before: {load_before}\nload after:  {load_after}")
    print("milliseconds per round: median (range) over the repetitions of the slowest rank's time; ratios of medians")
    print(table(results))
    if args.json or not args.smoke:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from record import write_table

        ratios = ("permk", "permk_prefetch", "permk_allgatherv", "permk_shuffle", "block")
        columns = ["ranks", "d"] + [TITLES[k] + " ms (median)" for k in ROWS] + [TITLES[k] + " / Allreduce" for k in ratios]
        rows = [[r["n"], r["d"]] + [round(1e3 * r[k]["median"], 4) for k in ROWS]
                + [round(r[k]["median"] / r["allreduce"]["median"], 3) for k in ratios] for r in results]
        write_table("bench_mpi", title="A compressed MPI round (p2p, one worker per rank, localhost) against a dense Allreduce",
                    columns=columns, rows=rows, path=args.json,
                    reference="Allreduce: an MPI Allreduce of the d float64 vector, measured in the same run, interleaved; "
                              "times are the slowest rank's, medians over the repetitions",
                    notes=f"MPI settings: {tuned or 'defaults'}; every rank shares this machine's cores. Load before: "
                          f"{load_before}; after: {load_after}.",
                    extra={"results": results})

if __name__ == "__main__":
    main()
