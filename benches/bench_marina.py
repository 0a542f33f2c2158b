"""End-to-end benchmark: MARINA+PermK rounds per second on the synthetic quadratic.

Compares, in one run, ``permk.marina`` (fused Rust round: ``O(d)`` work per round) with a plain
numpy MARINA that builds the ``(n, d)`` matrix of local gradients every round and compresses it
with ``rng.permutation`` + fancy indexing. Prints a markdown table of rounds/s and ratios and
writes it to ``benches/results/bench_marina.json`` (:mod:`record`; the numpy MARINA is the
reference).

    python benches/bench_marina.py [--quick]
    python benches/bench_marina.py --smoke     # tiny sizes, seconds (CI); no table written
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import record

import permk


def numpy_marina(q: permk.SyntheticQuadratic, rounds: int, gamma: float, p: float, seed: int) -> np.ndarray:
    """MARINA + PermK (d divisible by n) written the obvious way in numpy."""
    rng = np.random.default_rng(seed)
    n, d = q.n, q.d
    a, beta, c = q.a, q.beta, q.shift

    def local_grads(x: np.ndarray) -> np.ndarray:
        tx = 2 * x
        tx[1:] -= x[:-1]
        tx[:-1] -= x[1:]
        G = a[:, None] * tx[None, :] + c * x[None, :]
        G[:, 0] -= beta
        return G

    x = q.x0.copy()
    G_old = local_grads(x)
    g = G_old.mean(axis=0)
    k = d // n
    for _ in range(rounds):
        x = x - gamma * g
        G_new = local_grads(x)
        if rng.random() < p:
            g = G_new.mean(axis=0)
        else:
            diff = G_new - G_old
            idx = rng.permutation(d)[: k * n].reshape(n, k)
            out = np.zeros(d)
            out[idx] = n * diff[np.arange(n)[:, None], idx]
            g = g + out / n
        G_old = G_new
    return x


def best_of(f, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds): checks that the bench runs; no table written")
    ap.add_argument("--json", default=None, help="where to write the table (default benches/results/bench_marina.json)")
    args = ap.parse_args()
    d = 1000
    rows = []
    for n in (10,) if args.smoke else (10, 1000, 10000):
        q = permk.Quadratic.synthetic(n, d, 1e-6, 0.1, seed=0)
        rust_rounds = 50 if args.smoke else 2000 if args.quick else 20000
        np_rounds = 3 if args.smoke else max(3, (200 if args.quick else 2000) // max(1, n // 10))
        repeat = 1 if args.smoke else 3
        ref = permk.marina(q, permk.PermK(), rounds=1, seed=0)
        gamma, p = ref.params.gamma, ref.params.own.p
        t_rust = best_of(lambda: permk.marina(q, permk.PermK(), rounds=rust_rounds, seed=0, record_every=rust_rounds), repeat)
        t_rec = best_of(lambda: permk.marina(q, permk.PermK(), rounds=rust_rounds, seed=0, record_every=1), 1)
        t_np = best_of(lambda: numpy_marina(q, np_rounds, gamma, p, 0), min(repeat, 2))
        r_rust, r_rec, r_np = rust_rounds / t_rust, rust_rounds / t_rec, np_rounds / t_np
        rows.append((n, r_np, r_rust, r_rec, r_rust / r_np, r_rec / r_np))
    print(f"MARINA+PermK on Quadratic.synthetic(n, d={d}, 1e-6, 0.1): rounds per second")
    print("| n | numpy (n×d gradients) | permk | permk, recording every round | ratio | ratio (recording) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, a, b, c, r1, r2 in rows:
        print(f"| {n} | {a:,.0f} | {b:,.0f} | {c:,.0f} | {r1:,.0f}× | {r2:,.0f}× |")
    if args.smoke and args.json is None:
        return
    path = record.write_table(
        "bench_marina", title=f"MARINA+PermK rounds per second on Quadratic.synthetic(n, d={d}, 1e-6, 0.1)",
        columns=["n", "numpy rounds/s", "permk rounds/s", "permk rounds/s, recording every round", "permk / numpy",
                 "permk recording / numpy"],
        rows=[list(r) for r in rows], path=args.json,
        reference="a plain numpy MARINA+PermK (the (n, d) matrix of local gradients every round, rng.permutation + fancy "
                  "indexing), timed in the same run",
        notes="permk's fused Rust round does O(d) work per round; the numpy round O(nd).")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
