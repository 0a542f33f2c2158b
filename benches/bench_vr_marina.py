"""Benchmark: one VR-MARINA+PermK round on a sparse finite sum, permk against numpy.

A random CSR dataset (``--samples`` 50,000 × ``--features`` 300, density 5 %, seeded, labels
±1) split over ``--workers`` 100 workers, :class:`permk.NonconvexSigmoid` (``d`` = 301 with the
bias), minibatches of ``b`` = 32. Timed per round:

* **permk**: one compressed (tails) round of ``permk.vr_marina`` with PermK
  (:meth:`permk.methods.VRMarina.update` on the simulator): every worker's minibatch gradients at
  ``x⁺`` and ``x`` (one batched sparse product each way for all workers), their differences,
  PermK, the mean;
* **numpy**: the obvious implementation, a loop over workers: worker ``i``'s minibatch rows
  (``X_i[idx]``, CSR), the sigmoid loss's gradient at both points, their difference, worker
  ``i``'s PermK coordinates of the round's permutation, scaled by ``n``, added to the mean.

Both draw the same minibatches (:func:`permk.problems.minibatch_indices`, timed in both);
the numpy round's uncompressed mean difference is checked against the problem's minibatch oracle
once before timing. The measurements are interleaved (one of each per repetition); the table
gives the medians. Prints a markdown table.

    python benches/bench_vr_marina.py [--reps 9] [--samples 50000] [--features 300] [--workers 100] [--batch 32]
    python benches/bench_vr_marina.py --smoke    # 2,000 × 50, n = 10, 3 repetitions (CI); no table written

The table goes to ``benches/results/bench_vr_marina.json`` (:mod:`record`; the numpy loop is the
reference).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any

import numpy as np
import record
import scipy.sparse as sp

import permk
from permk.transport import Simulator
from permk.problems import minibatch_indices
from permk.methods.driver import setup


def dataset(samples: int, features: int, seed: int = 0) -> tuple[Any, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = sp.random(samples, features, density=0.05, format="csr", random_state=rng, data_rvs=rng.standard_normal)
    y = np.where(rng.random(samples) < 0.5, -1, 1)
    return X, y


class NumpyVRMarina:
    """The obvious numpy round: per-worker CSR blocks (with the bias column), a loop over workers."""

    def __init__(self, p: permk.NonconvexSigmoid, X: Any, y: np.ndarray) -> None:
        self.n, self.d = p.n, p.d
        self.blocks = []
        for i in range(p.n):
            rows = p.shards[i]
            A = sp.hstack([X[rows], np.ones((len(rows), 1))], format="csr")
            self.blocks.append((A, y[rows].astype(np.float64)))
        self.counts = p.sample_counts

    @staticmethod
    def grad(A: Any, y: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The mean over the rows of ``∇(1 − σ(y aᵀx))²``."""
        t = y * (A @ x)
        s = 1.0 / (1.0 + np.exp(-t))
        dz = -2.0 * (1.0 - s) ** 2 * s * y
        return A.T @ dz / len(y)

    def differences(self, x_new: np.ndarray, x: np.ndarray, b: int, seed: int, round: int) -> np.ndarray:
        idx = minibatch_indices(self.counts, b, seed=seed, round=round, workers=range(self.n))
        out = np.empty((self.n, self.d))
        for i, (A, y) in enumerate(self.blocks):
            Ab, yb = A[idx[i]], y[idx[i]]
            out[i] = self.grad(Ab, yb, x_new) - self.grad(Ab, yb, x)
        return out

    def round(self, x_new: np.ndarray, x: np.ndarray, b: int, seed: int, round: int) -> np.ndarray:
        idx = minibatch_indices(self.counts, b, seed=seed, round=round, workers=range(self.n))
        perm = np.random.default_rng([seed, round]).permutation(self.d)
        parts = np.array_split(perm, self.n)
        mean = np.zeros(self.d)
        for i, (A, y) in enumerate(self.blocks):
            Ab, yb = A[idx[i]], y[idx[i]]
            diff = self.grad(Ab, yb, x_new) - self.grad(Ab, yb, x)
            mean[parts[i]] += self.n * diff[parts[i]]
        return mean / self.n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--samples", type=int, default=50_000)
    ap.add_argument("--features", type=int, default=300)
    ap.add_argument("--workers", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--smoke", action="store_true", help="2,000 × 50, n = 10, 3 repetitions: checks that the bench runs; no table written")
    ap.add_argument("--json", default=None, help="where to write the table (default benches/results/bench_vr_marina.json)")
    args = ap.parse_args()
    if args.smoke:
        args.samples, args.features, args.workers, args.reps = 2000, 50, 10, 3

    X, y = dataset(args.samples, args.features)
    p = permk.NonconvexSigmoid(X, y, n=args.workers, seed=0)
    ref = NumpyVRMarina(p, X, y)
    comp, b, seed = permk.PermK(), args.batch, 1
    method = permk.vr_marina
    backend = Simulator(p)
    params = setup(method, p, comp, n=p.n, d=p.d, rounds=1, seed=seed, gamma=0.1, batch_size=b, p=1e-12)
    rng = np.random.default_rng(2)
    x = 0.1 * rng.standard_normal(p.d)
    state = method.init(x, backend, comp, params, seed=seed)

    # the numpy loop's minibatch differences are the problem's (same samples, same loss)
    x_new = state.x - params.gamma * state.g
    gx, gy = p.minibatch_grads_pair(x_new, state.x, b, seed=seed, round=0)
    assert np.allclose(ref.differences(x_new, state.x, b, seed, 0), gx - gy, rtol=1e-9, atol=1e-12)

    t_permk, t_numpy = [], []
    for r in range(args.reps):
        s = permk.MarinaState(x=state.x, g=state.g, round=r, seed=seed)
        t = time.perf_counter()
        _, info = method.update(s, backend, comp, params)
        t_permk.append(time.perf_counter() - t)
        assert not info.coin
        x_new = s.x - params.gamma * s.g
        t = time.perf_counter()
        ref.round(x_new, s.x, b, seed, r)
        t_numpy.append(time.perf_counter() - t)
    tp, tn = float(np.median(t_permk)), float(np.median(t_numpy))
    print(f"VR-MARINA+PermK, one compressed round: {args.samples} × {args.features} CSR (5 % dense), n = {p.n}, "
          f"d = {p.d}, b = {b}; median of {args.reps}; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, numpy {np.__version__}")
    print()
    print("| implementation | ms per round | speed-up |")
    print("|---|---:|---:|")
    print(f"| numpy (loop over workers) | {1e3 * tn:.2f} | 1.0× |")
    print(f"| permk.vr_marina | {1e3 * tp:.2f} | {tn / tp:.1f}× |")
    if args.smoke and args.json is None:
        return
    path = record.write_table(
        "bench_vr_marina", title="One VR-MARINA+PermK compressed round on a sparse finite sum, permk against numpy",
        columns=["implementation", "samples", "features", "n", "d", "batch", "ms per round", "numpy / this"],
        rows=[["numpy (loop over workers)", args.samples, args.features, p.n, p.d, b, 1e3 * tn, 1.0],
              ["permk.vr_marina", args.samples, args.features, p.n, p.d, b, 1e3 * tp, tn / tp]],
        reference="the obvious numpy round (a loop over workers: minibatch rows, the loss's gradient at both points, PermK's "
                  "coordinates), same minibatches, checked against the problem's oracle, timed in the same run",
        notes=f"medians of {args.reps} interleaved repetitions", path=args.json)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
