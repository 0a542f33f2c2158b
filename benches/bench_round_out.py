"""Timings of the in-place round options (``divide=``, ``out=``) against their numpy compositions.

One rank's side of a disjoint BlockPermK(n) round (``Spec("blockpermk", m=n)``, worker 0's
block of ``d/n`` values): ``gather(a, 0)`` then ``vals += 0.0; vals /= n`` (what
``MPIBackend._mean_in_place`` did) against ``gather(a, 0, divide=n, out=buf)`` into a reused
buffer; the same for ``Tridiagonal.round_values``; and PermK's ``Round.mean(values)`` against
``mean(values, out=buf)``. Medians of interleaved repetitions (the machine may be shared), every case in a fresh
process::

    python benches/bench_round_out.py [--reps 41] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Callable

import numpy as np

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
    args = p.parse_args()
    if args.case:
        kind, d, n = args.case[0], int(args.case[1]), int(args.case[2])
        print(json.dumps(case(kind, d, n, args.threads[0], args.reps)))
        return
    # every case in a fresh process: no pool threads or heap state left over from another case
    cases = [("gather", d, n) for d in (10**7, 10**6) for n in (2, 4)] + [("mean", 10**7, 2)]
    for k in args.threads:
        print(f"== {k} thread(s)")
        for kind, d, n in cases:
            cmd = [sys.executable, __file__, "--case", kind, str(d), str(n), "--threads", str(k), "--reps", str(args.reps)]
            res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            name = "blockpermk" if kind == "gather" else "permk"
            print(f"{name} d={d:.0e} n={n}: " + ", ".join(f"{key} {ms:.3f} ms" for key, ms in res.items()))


if __name__ == "__main__":
    main()
