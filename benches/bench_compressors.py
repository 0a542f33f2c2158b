"""Microbenchmark: the Rust aggregation kernels against plain-numpy references.

Times, in one run, ``c.aggregate(A, seed=s, round=t)`` (the server's average
``(1/n) Σ_i C_i(A[i])`` through the public Python API) against numpy written the obvious way:

* PermK: ``rng.permutation`` + fancy indexing (vectorised: the owner of every coordinate, then
  one gather ``A[owner, arange(d)]``; for ``n > d`` the active workers' coordinates, a gather
  and ``np.bincount``);
* RandK: a per-worker ``rng.choice(d, k, replace=False)`` loop;
* TopK: ``np.argpartition`` on ``|A|`` row-wise (vectorised on the matrix), a gather and
  ``np.bincount``;

plus, for PermK, two "random gather of d elements" baselines (indices precomputed, not timed):
``x[idx]`` with ``x`` a float64 vector of length ``d`` and ``idx`` a random permutation of
``range(d)``, and ``A.ravel()[idx]`` with ``idx`` d random positions of the ``(n, d)`` input —
the scattered reads PermK's aggregate cannot avoid (one value per coordinate, from a random
worker's row). RandK and TopK use ``k = max(1, d // n)`` (the
same number of values per worker as PermK). Every time is the best of several repetitions
(``time.perf_counter``); short calls are looped so one measurement lasts >= ~20 ms.

BlockPermK(n) (``m = min(n, d)`` contiguous blocks handed out by a random permutation of the
workers: PermK's constants with O(n) randomness) against numpy (``rng.permutation(n)`` and one
slice copy per block) and against the floor of any aggregate, a copy of ``d`` floats
(``x.copy()``); CoordinateSampling (one uniformly random owner per coordinate) against numpy
(``rng.integers`` + one gather).

Targets: PermK >= 4x numpy at (100, 10^6) and within 2x of the gather; RandK >= 20x;
TopK >= 10x; BlockPermK(n) within 2x of the copy and >= 10x faster than PermK at (100, 10^6).
Run::

    python benches/bench_compressors.py           # all five (n, d); about 40 s on 2 cores, ~1 GB of RAM
    python benches/bench_compressors.py --quick   # a small subset, a few seconds
    python benches/bench_compressors.py --smoke   # one tiny (n, d), one repetition (CI); no table written

The table goes to ``benches/results/bench_compressors.json`` (:mod:`record`).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Callable

import numpy as np
import record

import permk

FULL = [(10, 10**3), (10**3, 10**3), (10**3, 10**5), (100, 10**6), (10**4, 10**3)]
QUICK = [(10, 10**3), (10**3, 10**3), (100, 10**5)]
SMOKE = [(10, 10**3)]


def best_time(fn: Callable[[int], object], repeat: int, min_time: float = 0.02) -> float:
    """Best per-call time of ``fn(t)`` over ``repeat`` measurements (``t`` varies the round)."""
    t0 = time.perf_counter()
    fn(0)
    first = time.perf_counter() - t0
    number = max(1, int(min_time / max(first, 1e-9)))
    best = float("inf")
    t = 1
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn(t)
            t += 1
        best = min(best, (time.perf_counter() - start) / number)
    return best


# -- numpy references ---------------------------------------------------------------------


def permk_numpy(A: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    n, d = A.shape
    if d >= n:
        k, r = divmod(d, n)
        pi = rng.permutation(d)
        owner = np.empty(d, dtype=np.intp)
        owner[pi[: k * n]] = np.arange(k * n) // k
        if r:
            owner[pi[k * n :]] = rng.permutation(n)[:r]
        return A[owner, np.arange(d)] * float(n) / n  # (1/n) Σ_i n·A[i, coords_i]
    q = n // d
    pi = rng.permutation(n)
    active = np.flatnonzero(pi < q * d)
    coord = pi[active] // q
    return np.bincount(coord, weights=A[active, coord], minlength=d) * (n / q) / n


def randk_numpy(A: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    n, d = A.shape
    out = np.zeros(d)
    for i in range(n):
        idx = rng.choice(d, k, replace=False)
        out[idx] += (d / k) * A[i, idx]
    return out / n


def blockpermk_numpy(A: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """BlockPermK(m = min(n, d)) with ``n = mq + r``: block ``b`` (contiguous) goes to the ``q``
    workers ``pi[bq:(b+1)q]``, scaled by ``n/q``."""
    n, d = A.shape
    m = min(n, d)
    q = n // m
    pi = rng.permutation(n)
    bounds = np.arange(m + 1) * d // m
    out = np.empty(d)
    for b in range(m):
        lo, hi = bounds[b], bounds[b + 1]
        out[lo:hi] = A[pi[b * q : (b + 1) * q], lo:hi].sum(axis=0) if q > 1 else A[pi[b], lo:hi]
    return out * (n / q) / n


def coordinate_sampling_numpy(A: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    n, d = A.shape
    owner = rng.integers(0, n, d)
    return A[owner, np.arange(d)] * float(n) / n


def topk_numpy(A: np.ndarray, k: int) -> np.ndarray:
    n, d = A.shape
    idx = np.argpartition(np.abs(A), d - k, axis=1)[:, d - k :]
    vals = np.take_along_axis(A, idx, axis=1)
    return np.bincount(idx.ravel(), weights=vals.ravel(), minlength=d) / n


# -- the run ------------------------------------------------------------------------------


def run_case(n: int, d: int, rng: np.random.Generator, repeat: int) -> list[tuple]:
    """The timings of one (n, d): (n, d, name, Rust s, numpy s, floors) per compressor, the
    floors a dict of baseline name -> seconds."""
    A = rng.standard_normal((n, d))
    k = max(1, d // n)
    x = rng.standard_normal(d)
    idx = rng.permutation(d)
    gather = best_time(lambda t: x[idx], repeat)
    flat, fidx = A.ravel(), rng.integers(0, n * d, d)
    gather_a = best_time(lambda t: flat[fidx], repeat)
    copy = best_time(lambda t: x.copy(), repeat)
    rows = []
    for name, c, ref, floors in (
        ("PermK", permk.PermK(), lambda t: permk_numpy(A, rng), {"x[idx]": gather, "A.flat[idx]": gather_a}),
        (f"RandK(k={k})", permk.RandK(k), lambda t: randk_numpy(A, k, rng), {}),
        (f"TopK(k={k})", permk.TopK(k), lambda t: topk_numpy(A, k), {}),
        (f"BlockPermK(m={min(n, d)})", permk.BlockPermK(min(n, d)), lambda t: blockpermk_numpy(A, rng), {"copy": copy}),
        ("CoordinateSampling", permk.CoordinateSampling(), lambda t: coordinate_sampling_numpy(A, rng), {"A.flat[idx]": gather_a}),
    ):
        t_rust = best_time(lambda t: c.aggregate(A, seed=1, round=t), repeat)
        t_np = best_time(ref, repeat)
        rows.append((n, d, name, t_rust, t_np, floors))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small subset of (n, d)")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions per timing (best is kept)")
    ap.add_argument("--smoke", action="store_true", help="one tiny (n, d), one repetition: checks that the bench runs; no table written")
    ap.add_argument("--json", default=None, help="where to write the table (default benches/results/bench_compressors.json)")
    args = ap.parse_args()
    cases = SMOKE if args.smoke else QUICK if args.quick else FULL
    repeat = args.repeat or (1 if args.smoke else 3 if args.quick else 5)
    rng = np.random.default_rng(0)

    rows = []
    for n, d in cases:
        rows += run_case(n, d, rng, repeat)

    load = " / ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {load}; numpy {np.__version__}; "
          f"permk {permk.__version__}; best of {repeat}")
    print()
    print("| n | d | compressor | Rust aggregate (ms) | numpy (ms) | speed-up | floor (ms) | Rust / floor |")
    print("|---:|---:|---|---:|---:|---:|---|---:|")
    permk_time = {}
    for n, d, name, t_rust, t_np, floors in rows:
        if name == "PermK":
            permk_time[(n, d)] = t_rust
        floor = " · ".join(f"{k} {v * 1e3:.3f}" for k, v in floors.items())
        ratio = " · ".join(f"{t_rust / v:.2f}" for v in floors.values())
        print(f"| {n} | {d} | {name} | {t_rust * 1e3:.3f} | {t_np * 1e3:.3f} | {t_np / t_rust:.1f}x | {floor} | {ratio} |")
    print()
    print("| n | d | PermK (ms) | BlockPermK(min(n, d)) (ms) | BlockPermK speed-up over PermK |")
    print("|---:|---:|---:|---:|---:|")
    for n, d, name, t_rust, _, _ in rows:
        if name.startswith("BlockPermK"):
            print(f"| {n} | {d} | {permk_time[(n, d)] * 1e3:.3f} | {t_rust * 1e3:.3f} | {permk_time[(n, d)] / t_rust:.1f}x |")
    if args.smoke and args.json is None:
        return
    table = []
    for n, d, name, t_rust, t_np, floors in rows:
        fl = list(floors.items()) + [(None, None)] * (2 - len(floors))
        table.append([n, d, name, t_rust, t_np, t_np / t_rust,
                      *(v for f, t in fl[:2] for v in (f, t, None if t is None else t_rust / t))])
    path = record.write_table(
        "bench_compressors", title="Compressor.aggregate (Rust) against plain numpy and the floor of a gather or a copy",
        columns=["n", "d", "compressor", "Rust s", "numpy s", "numpy / Rust", "floor", "floor s", "Rust / floor",
                 "second floor", "second floor s", "Rust / second floor"], rows=table,
        reference="plain-numpy aggregates written the obvious way, and the floor of the scattered reads (a random gather of d "
                  f"values, x[idx]) or of a d-float copy, all in the same run; best of {repeat}",
        notes="RandK and TopK use k = max(1, d // n).", path=args.json)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
