"""Benchmark: the two-layer network on Fashion-MNIST as a permk problem (:mod:`permk.torch`).

1. **One ``local_grads`` call** of :func:`permk.torch.two_layer_network` (Linear(784 → 32),
   sigmoid, Linear(32 → 10), cross-entropy; float32; ``d`` = 25,450) for ``n`` workers over the
   first ``--samples`` images, against a plain per-worker loop (the module's parameters set from
   ``x``, then per worker ``zero_grad``, forward, ``backward``, the gradients flattened into row
   ``i``; what the authors' ``NeuralNetworkFunction.gradient`` does per node). Both are checked
   to agree (float32 rounding) before timing; interleaved repetitions, medians.
2. **A short training run** on ``n = --train-workers`` workers over the first
   ``--train-samples`` images: GD for ``--rounds`` rounds, MARINA with PermK for as many rounds
   and for as many bits (``n/2`` times the rounds: with ``p = 1/n`` its rounds send ``2d/n``
   floats per worker on average), each with the best step of ``--gammas`` (by the final loss);
   the final ``f(x)``, ``‖∇f(x)‖²``, the bits each worker sent (in units of a full gradient,
   32-bit floats as the paper) and the training accuracy.

Torch runs on ``--threads`` threads (default 1: the measurements are not disturbed by other
processes on a shared machine). Prints markdown tables.

    python benches/bench_torch_problem.py [--reps 5] [--samples 60000] [--workers 10 100] [--rounds 60]
    python benches/bench_torch_problem.py --smoke   # 400 images, n = 4, 3 rounds (CI); no table written

Both tables go to ``benches/results/bench_torch_problem.json`` (:mod:`record`; the plain
per-worker loop is the reference of the first). Without torch it says so and exits 0.
"""

from __future__ import annotations

import argparse
import platform
import time
from typing import Any

import numpy as np
import record

import permk

try:
    import torch

    from permk.torch import two_layer_network
except ImportError:  # the bench says so and exits 0
    torch = None  # type: ignore[assignment]


def plain_loop(p: Any, x: np.ndarray) -> np.ndarray:
    """Every worker's gradient by a plain autograd loop over the workers (the module modified)."""
    module = p._module
    torch.nn.utils.vector_to_parameters(torch.from_numpy(x.astype(p.dtype)), module.parameters())
    out = np.empty((p.n, p.d))
    for g in p._groups:
        for r, k in enumerate(g.held):
            module.zero_grad()
            torch.nn.functional.cross_entropy(module(g.X[r]), g.Y[r]).backward()
            out[k] = torch.nn.utils.parameters_to_vector([q.grad for q in module.parameters()]).numpy()
    return out


def time_grads(n: int, samples: int, reps: int) -> tuple[float, float]:
    p = two_layer_network(n, samples=samples, seed=0)
    rng = np.random.default_rng(0)
    xs = [p.x0 + 0.01 * rng.standard_normal(p.d) for _ in range(reps + 1)]
    ref, got = plain_loop(p, xs[0]), p.local_grads(xs[0])
    assert np.abs(ref - got).max() <= 1e-5 * np.abs(ref).max(), np.abs(ref - got).max()
    t_vmap, t_loop = [], []
    for x in xs[1:]:
        t0 = time.perf_counter()
        p.local_grads(x)
        t_vmap.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        plain_loop(p, x)
        t_loop.append(time.perf_counter() - t0)
    return float(np.median(t_vmap)), float(np.median(t_loop))


def accuracy(p: Any, x: np.ndarray) -> float:
    """The share of the training images the network at ``x`` classifies right."""
    module = p._module
    torch.nn.utils.vector_to_parameters(torch.from_numpy(x.astype(p.dtype)), module.parameters())
    with torch.no_grad():
        right = sum(int((module(g.X[r]).argmax(1) == g.Y[r]).sum()) for g in p._groups for r in range(len(g.held)))
    return right / int(p.sample_counts.sum())


def train(n: int, samples: int, rounds: int, gammas: list[float]) -> list[tuple[str, int, float, float, float, float, float]]:
    """GD for ``rounds`` rounds; MARINA+PermK for as many rounds, and for as many bits (``n/2``
    times the rounds: its rounds send ``2d/n`` floats on average). Each with its best step."""
    p = two_layer_network(n, samples=samples, seed=0)
    long = rounds * max(1, n // 2)
    runs = (("GD", rounds, lambda g, T: permk.gd(p, rounds=T, seed=1, gamma=g)),
            ("MARINA+PermK", rounds, lambda g, T: permk.marina(p, permk.PermK(), rounds=T, seed=1, gamma=g)),
            ("MARINA+PermK", long, lambda g, T: permk.marina(p, permk.PermK(), rounds=T, seed=1, gamma=g)))
    rows = []
    for name, T, run in runs:
        best: tuple[float, float, Any] | None = None
        for g in gammas:
            res = run(g, T)
            loss = p.loss(res.x) if res.diverged_at is None else np.inf
            if best is None or loss < best[1]:
                best = (g, loss, res)
        assert best is not None
        g, loss, res = best
        rows.append((name, T, g, loss, float(res.grad_norm_sq[-1]), float(res.bits_per_worker[-1]) / (32 * p.d), accuracy(p, res.x)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--samples", type=int, default=60000)
    ap.add_argument("--workers", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--train-workers", type=int, default=10)
    ap.add_argument("--train-samples", type=int, default=10000)
    ap.add_argument("--gammas", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    ap.add_argument("--smoke", action="store_true", help="400 images, n = 4, 3 rounds: checks that the bench runs; no table written")
    ap.add_argument("--json", default=None, help="where to write the tables (default benches/results/bench_torch_problem.json)")
    args = ap.parse_args()
    if torch is None:
        print("bench_torch_problem: skipped: torch is not installed (pip install 'permk[torch]')")
        return
    if args.smoke:
        args.reps, args.samples, args.workers, args.rounds = 1, 400, [4], 3
        args.train_workers, args.train_samples, args.gammas = 4, 200, [1.0]
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {platform.processor() or platform.machine()}\n")
    print(f"One local_grads call, two-layer network on Fashion-MNIST ({args.samples} images, float32, d = 25,450), medians of {args.reps}:\n")
    print("| n | vmapped local_grads | plain per-worker loop | speed-up |")
    print("|---:|---:|---:|---:|")
    grads = []
    for n in args.workers:
        tv, tl = time_grads(n, args.samples, args.reps)
        grads.append([n, args.samples, tv, tl, tl / tv])
        print(f"| {n} | {tv * 1e3:.1f} ms | {tl * 1e3:.1f} ms | {tl / tv:.1f}× |")
    print(f"\nTraining: n = {args.train_workers}, {args.train_samples} images, each run with its best step of {args.gammas}:\n")
    print("| method | rounds | γ | f(x) | ‖∇f(x)‖² | bits per worker (full gradients) | training accuracy |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    trained = train(args.train_workers, args.train_samples, args.rounds, args.gammas)
    for name, T, g, loss, gn, full, acc in trained:
        print(f"| {name} | {T} | {g:g} | {loss:.4f} | {gn:.3g} | {full:.1f} | {acc:.3f} |")
    if args.smoke and args.json is None:
        return
    path = record.write_table(
        "bench_torch_problem", title="The two-layer network on Fashion-MNIST as a permk problem: one local_grads call",
        columns=["n", "images", "vmapped local_grads s", "plain per-worker loop s", "loop / vmapped"], rows=grads,
        reference="a plain autograd loop over the workers (zero_grad, forward, backward, flatten per worker), checked to agree "
                  "(float32 rounding), timed in the same run",
        notes=f"torch {torch.__version__}, {args.threads} thread(s); medians of {args.reps} interleaved repetitions",
        path=args.json,
        extra={"training": {"columns": ["method", "rounds", "gamma", "f(x)", "grad_sq", "bits per worker (full gradients)",
                                        "training accuracy"],
                            "rows": [list(r) for r in trained],
                            "setting": f"n = {args.train_workers}, {args.train_samples} images, best step of {args.gammas}"}})
    print(f"wrote {path}")

if __name__ == "__main__":
    main()
