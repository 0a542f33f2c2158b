"""The bytes a worker hands to MPI per round, measured, against the theory's: every method of
the catalog with every compressor it accepts on the synthetic quadratic (the pairs a method refuses
there, e.g. a method that needs a minibatch oracle, are listed under the table with the reason).

Each method runs a few rounds of :func:`permk.distributed.run` on ``mpiexec -n PROCS`` (the
synthetic quadratic, ``n`` workers in blocks over the ranks); the bytes of each compressed round
are measured on the buffers handed to MPI (``bytes_per_worker``: the largest message of one
worker). The theory's message, at 64-bit values: ``8 · floats_per_worker(n, d)`` bytes for a
compressor with a shared plan (the receiver recomputes the coordinates: only values travel),
plus a 32-bit index per value where the receiver needs the indices (TopK). Quantized values
travel as float64 (the quantizers' own code is counted in ``bits_per_worker``, not on MPI).
Full-gradient rounds (MARINA's coin, GD) send ``8d`` and are left out.

    python benches/bench_mpi_bytes.py                 # launches mpiexec -n 4 itself
    python benches/bench_mpi_bytes.py --procs 2 --n 8 --d 1000
    mpiexec -n 4 python benches/bench_mpi_bytes.py --inner
    python benches/bench_mpi_bytes.py --smoke         # 2 ranks, n = 4, d = 100, 3 rounds (CI); no table written

Prints a markdown table (one row per method × compressor) and writes it to
``benches/results/bench_mpi_bytes.json`` (:mod:`record`; the reference is the theory's message).
Exits 1 if a measured size differs from the theory's for a shared-plan compressor or TopK.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from typing import Any

import numpy as np


def compressors(n: int, d: int) -> list[Any]:
    import permk

    k = max(1, d // n)
    return [permk.PermK(), permk.RandK(k), permk.BlockPermK(n), permk.TopK(k), permk.QSGD(4), permk.Identity()]


def theory_bytes(c: Any, n: int, d: int) -> int:
    """The message of the theory at 64-bit values: its values, and a 32-bit index per value
    where the receiver needs the indices (TopK: data-dependent coordinates)."""
    k = int(c.floats_per_worker(n, d))
    return k * (12 if c.capabilities.needs_indices else 8)


def claimed(c: Any) -> bool:
    """Whether permk claims the theory's bytes on MPI for ``c``: shared-plan compressors and
    dense ones (every coordinate in order: Identity, the quantizers) send values only, TopK sends
    (index, value) pairs. The others (an independent compressor without a plan, a composition)
    travel as (index, float64 value) pairs."""
    return bool(c.capabilities.shared_plan or c.capabilities.dense or c.capabilities.needs_indices)


def inner(args: argparse.Namespace) -> int:
    import permk
    import permk.distributed as pd
    from permk.methods import catalog

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    q = permk.Quadratic.synthetic(n=args.n, d=args.d, lam=1e-3, noise_scale=0.3, seed=0)
    rows: list[tuple[str, str, str, int, bool]] = []
    refused: dict[str, tuple[list[str], str]] = {}  # method -> (compressors, the first one's reason)
    bad = 0
    for name, method in sorted(catalog().items()):
        for c in compressors(args.n, args.d):
            try:
                res = pd.run(method, q, c, rounds=args.rounds, seed=1, gamma=1e-4)
            except (ValueError, TypeError) as e:  # the method does not run with this compressor here: say why
                refused.setdefault(name, ([], str(e).splitlines()[0]))[0].append(c.name)
                continue
            heads = res.coins if res.coins is not None else np.zeros(len(res.bytes_per_worker), dtype=bool)
            compressed = res.bytes_per_worker[~heads]
            if compressed.size == 0:
                continue  # full gradients only (GD)
            want = theory_bytes(c, args.n, args.d)
            sizes = sorted({int(b) for b in compressed})
            ok = sizes == [want] or (c.capabilities.random_size and max(sizes) <= want)
            bad += claimed(c) and not ok
            rows.append((name, c.name, "/".join(map(str, sizes)), want, ok))
    if rank == 0:
        setting = (f"mpiexec -n {comm.Get_size()}, n = {args.n} workers, d = {args.d}, {args.rounds} rounds each "
                   "(compressed rounds only; bytes per worker per round, 64-bit values, 32-bit indices)")
        left_out = "; ".join(f"{name} with {', '.join(cs)} ({why})" for name, (cs, why) in refused.items())
        setting += f". Left out (refused on this problem): {left_out}" if left_out else ""
        print(setting + "\n")
        print("| method | compressor | measured | theory | equal |")
        print("|---|---|---:|---:|:---:|")
        for name, cname, measured, want, ok in rows:
            print(f"| {name} | {cname} | {measured} | {want} | {'yes' if ok else 'no (index, float64 value) pairs'} |")
        if not args.smoke or args.json is not None:
            import record

            path = record.write_table(
                "bench_mpi_bytes", title="Bytes per worker per compressed round handed to MPI, against the theory's message",
                columns=["method", "compressor", "measured bytes", "theory bytes", "equal"],
                rows=[[name, cname, measured, want, ok] for name, cname, measured, want, ok in rows],
                reference="the theory's message at 64-bit values: 8·floats_per_worker(n, d) bytes, plus a 32-bit index per value "
                          "where the receiver needs the indices (TopK)",
                notes=setting, path=args.json, command=args.command)
            print(f"wrote {path}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--d", type=int, default=800)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="2 ranks, n = 4, d = 100, 3 rounds: checks that the bench runs; no table written")
    ap.add_argument("--json", default=None, help="where to write the table (default benches/results/bench_mpi_bytes.json)")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--command", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return inner(args)
    command = " ".join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])
    if args.smoke:
        args.procs, args.n, args.d, args.rounds = 2, 4, 100, 3
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = beside if os.path.exists(beside) else shutil.which("mpiexec")
    if mpiexec is None:
        print("mpiexec not found: pip install 'permk[mpi]'", file=sys.stderr)
        return 2
    cmd = [mpiexec, "-n", str(args.procs), sys.executable, os.path.abspath(__file__), "--inner",
           "--n", str(args.n), "--d", str(args.d), "--rounds", str(args.rounds), "--command", command]
    if args.smoke:
        cmd.append("--smoke")
    if args.json is not None:
        cmd += ["--json", os.path.abspath(args.json)]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
