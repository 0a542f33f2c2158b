"""Timings of the in-place round options (``divide=``, ``out=``) against their numpy compositions.

One rank's side of a disjoint BlockPermK(n) round (``Spec("blockpermk", m=n)``, worker 0's
block of ``d/n`` values): ``gather(a, 0)`` then ``vals += 0.0; vals /= n`` (what
``MPIBackend._mean_in_place`` did) against ``gather(a, 0, divide=n, out=buf)`` into a reused
buffer; the same for ``Tridiagonal.round_values``; and PermK's ``Round.mean(values)`` against
``mean(values, out=buf)``. Medians of interleaved repetitions (the machine may be shared), every case in a fresh
process::

    python benches/bench_round_out.py [--reps 41] [--threads 1 2]
    python benches/bench_round_out.py --smoke     # d = 10^4, 3 repetitions, 1 thread (CI); no table written

The table goes to ``benches/results/bench_round_out.json`` (:mod:`record`; each in-place option
against its numpy composition, measured in the same process).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Callable

import numpy as np

import record

from permk import _core


def median_ms(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Every function ``reps`` times, interleaved (after one warm-up call each); medians in ms."""
    for f in fns.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: 1e3 * float(np.median(v)) for k, v in times.items()}


def gather_cases(d: int, n: int, reps: int) -> dict[str, float]:
    r = _core.Spec("blockpermk", m=n).round(n, d, 0, 0)
    a = np.random.default_rng(0).standard_normal((1, d))
    buf = np.empty(int(r.offsets()[1]))
    q = _core.Tridiagonal([0.5 + i for i in range(n)], 0.1, [1.0] * n)
    x, y = np.random.default_rng(1).standard_normal(d), np.random.default_rng(2).standard_normal(d)

    def gather_numpy() -> object:
        v = r.gather(a, 0)
        v += 0.0
        v /= n
        return v

    def values_numpy() -> object:
        v = q.round_values(r, x, y, 0, 1)
        v += 0.0
        v /= n
        return v

    return median_ms(
        {
            "gather": lambda: r.gather(a, 0),
            "gather + 2 numpy passes": gather_numpy,
            "gather(divide, out)": lambda: r.gather(a, 0, divide=n, out=buf),
            "round_values + 2 numpy passes": values_numpy,
            "round_values(divide, out)": lambda: q.round_values(r, x, y, 0, 1, divide=n, out=buf),
        },
        reps,
    )


def mean_cases(d: int, n: int, reps: int) -> dict[str, float]:
    r = _core.Spec("permk").round(n, d, 0, 0)
    values = np.asarray(r.gather(np.random.default_rng(0).standard_normal((n, d)), 0), dtype=np.float64)
    buf = np.empty(d)
    return median_ms({"mean(values)": lambda: r.mean(values), "mean(values, out)": lambda: r.mean(values, out=buf)}, reps)


def case(kind: str, d: int, n: int, threads: int, reps: int) -> dict[str, float]:
    """One case in this process, with ``threads`` threads in the core's pool."""
    _core.set_num_threads(threads)
    return gather_cases(d, n, reps) if kind == "gather" else mean_cases(d, n, reps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=41)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--case", nargs=3, metavar=("KIND", "D", "N"), help="run one case here and print it as JSON (internal)")
    p.add_argument("--smoke", action="store_true", help="d = 10^4, 3 repetitions, 1 thread: checks that the bench runs; no table written")
    p.add_argument("--json", default=None, help="where to write the table (default benches/results/bench_round_out.json)")
    args = p.parse_args()
    if args.case:
        kind, d, n = args.case[0], int(args.case[1]), int(args.case[2])
        print(json.dumps(case(kind, d, n, args.threads[0], args.reps)))
        return
    dims: tuple[int, ...] = (10**7, 10**6)
    mean_d = 10**7
    if args.smoke:
        args.reps, args.threads = 3, [1]
        dims, mean_d = (10**4,), 10**4
    # every case in a fresh process: no pool threads or heap state left over from another case
    cases = [("gather", d, n) for d in dims for n in (2, 4)] + [("mean", mean_d, 2)]
    # each row: its numpy composition (the reference) where it has one
    against = {"gather(divide, out)": "gather + 2 numpy passes", "round_values(divide, out)": "round_values + 2 numpy passes",
               "mean(values, out)": "mean(values)"}
    rows = []
    for k in args.threads:
        print(f"== {k} thread(s)")
        for kind, d, n in cases:
            cmd = [sys.executable, __file__, "--case", kind, str(d), str(n), "--threads", str(k), "--reps", str(args.reps)]
            res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            name = "blockpermk" if kind == "gather" else "permk"
            print(f"{name} d={d:.0e} n={n}: " + ", ".join(f"{key} {ms:.3f} ms" for key, ms in res.items()))
            for key, ms in res.items():
                ref = against.get(key)
                rows.append([k, name, d, n, key, ms, ref, None if ref is None else ms / res[ref]])
    if args.smoke and args.json is None:
        return
    path = record.write_table(
        "bench_round_out", title="In-place round options (divide=, out=) against their numpy compositions",
        columns=["threads", "plan", "d", "n", "case", "median ms", "reference case", "ms / reference"], rows=rows,
        reference="the numpy composition each option replaces (the call, then `+= 0.0; /= n` in numpy; or a fresh output "
                  "array), measured in the same process",
        notes=f"medians of {args.reps} interleaved repetitions, every case in a fresh process", path=args.json)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
