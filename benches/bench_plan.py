"""PermK's round plan alone: the ``"shuffle"`` sampler against the ``"rebalance"`` one, as ratios
to a memcpy of ``d`` float64 values measured in the same run (the floor: a plan reads nothing and
writes ``d`` owner labels, so a pass over ``d`` values is what any plan in coordinate order costs).

A plan is ``permk.PermK(sampler=...).round(n, d, seed=, round=)``: the owners of the ``d``
coordinates and the workers' offsets, what every exchange of a round starts from (the MPI
backend computes it on every rank, or ahead on a background thread). Each configuration times
the memcpy (``np.copyto`` into a warmed buffer, one thread), then both samplers, interleaved
repetition by repetition, each on a fresh round; medians and ranges over the repetitions, on
``1`` and ``2`` threads of the core's pool (``permk.parallel.limit_threads``).

    python benches/bench_plan.py                      # the full table (d up to 1e7; about 15 s on 2 cores)
    python benches/bench_plan.py --smoke              # tiny sizes, a few seconds; exits non-zero on failure
    python benches/bench_plan.py --json plan.json     # and the table as JSON (machine, date, load)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Any

import numpy as np

import permk
from permk.parallel import limit_threads

SAMPLERS = ("shuffle", "rebalance")


def _reps(d: int) -> int:
    return 40 if d <= 100_000 else 15 if d <= 1_000_000 else 7


def measure(n: int, d: int, threads: int, reps: int) -> dict[str, Any]:
    limit_threads(threads)
    src, dst = np.random.default_rng(0).standard_normal(d), np.empty(d)
    np.copyto(dst, src)
    comps = {s: permk.PermK(sampler=s) for s in SAMPLERS}
    times: dict[str, list[float]] = {"memcpy": [], **{s: [] for s in SAMPLERS}}
    for t in range(reps + 1):  # the first repetition warms up
        t0 = time.perf_counter()
        np.copyto(dst, src)
        t1 = time.perf_counter()
        if t:
            times["memcpy"].append(t1 - t0)
        for s, c in comps.items():
            t0 = time.perf_counter()
            r = c.round(n, d, seed=1, round=t)
            t1 = time.perf_counter()
            if t:
                times[s].append(t1 - t0)
            del r
    out: dict[str, Any] = {"n": n, "d": d, "threads": threads, "reps": reps}
    for k, v in times.items():
        a = np.asarray(v)
        out[k] = {"median": float(np.median(a)), "min": float(a.min()), "max": float(a.max())}
    return out


def check(n: int, d: int) -> None:
    """The two samplers' rounds are balanced plans of the same shape (the smoke mode's check)."""
    for s in SAMPLERS:
        r = permk.PermK(sampler=s).round(n, d, seed=3, round=1)
        sizes = np.diff(r.offsets())
        assert sizes.sum() == d and sizes.min() >= d // n and sizes.max() <= -(-d // n), (s, sizes)
        assert np.array_equal(np.sort(r.coords(0, n)), np.arange(d)), s


def _fmt(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} µs"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| d | n | threads | memcpy (floor) | shuffle | rebalance | shuffle / memcpy | rebalance / memcpy | shuffle / rebalance |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m, s, b = r["memcpy"], r["shuffle"], r["rebalance"]

        def cell(x: dict[str, float]) -> str:
            return f"{_fmt(x['median'])} ({_fmt(x['min'])}–{_fmt(x['max'])})"

        lines.append(f"| {r['d']:.3g} | {r['n']} | {r['threads']} | {cell(m)} | {cell(s)} | {cell(b)} "
                     f"| {s['median'] / m['median']:.2f} | {b['median'] / m['median']:.2f} | {s['median'] / b['median']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", type=float, nargs="+", default=[1e5, 1e6, 6.55e6, 1e7])
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4, 16, 1000])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=None, help="repetitions per configuration (default: by d)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds; exits non-zero if anything fails")
    ap.add_argument("--json", metavar="PATH", help="where to write the table (default benches/results/bench_plan.json; a smoke run writes none unless given)")
    args = ap.parse_args()
    if args.smoke:
        args.dims, args.workers, args.threads, args.reps = [1000, 70_000], [2, 5], [1, 2], 3
        for n, d in ((2, 9), (3, 3), (5, 70_001), (300, 1000)):
            check(n, d)
    load_before = os.getloadavg()
    rows = []
    for d in map(int, args.dims):
        for n in args.workers:
            for threads in args.threads:
                rows.append(measure(n, d, threads, args.reps or _reps(d)))
    load_after = os.getloadavg()
    load = "/".join(f"{v:.1f}" for v in load_after)
    print(f"{platform.node()}: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, load average {load} "
          f"(1/5/15 min, at the end); medians (ranges) over the repetitions; memcpy: np.copyto of d float64, one thread")
    print(table(rows))
    if args.json or not args.smoke:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from record import write_table

        columns = ["d", "n", "threads", "memcpy ms", "shuffle ms", "rebalance ms", "shuffle / memcpy", "rebalance / memcpy"]
        table_rows = [[r["d"], r["n"], r["threads"], round(1e3 * r["memcpy"]["median"], 4), round(1e3 * r["shuffle"]["median"], 4),
                       round(1e3 * r["rebalance"]["median"], 4), round(r["shuffle"]["median"] / r["memcpy"]["median"], 2),
                       round(r["rebalance"]["median"] / r["memcpy"]["median"], 2)] for r in rows]
        write_table("bench_plan", title="PermK's round plan alone: the shuffle against the balanced assignment (rebalance)",
                    columns=columns, rows=table_rows, path=args.json,
                    reference="memcpy: np.copyto of d float64 values (one thread), measured in the same run, interleaved; medians",
                    notes=f"load before {load_before}, after {load_after}", extra={"rows_detail": rows})

if __name__ == "__main__":
    main()
