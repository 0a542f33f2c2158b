"""Train a small network on Fashion-MNIST with DistributedDataParallel on localhost processes
(gloo), comparing how the gradients travel: the default all-reduce, torch's fp16 hook, and
permk's hook with PermK and BlockPermK(world size) (``permk.torch.comm_hook``).

    python examples/ddp_fashion_mnist.py                    # 4 ranks, 1000 steps per method (~2.5 min)
    python examples/ddp_fashion_mnist.py --quick            # 2 ranks, 60 steps, small data (a smoke test)

The network is the authors' two-layer one (Linear(784→32), sigmoid, Linear(32→10), cross-entropy;
d = 25,450 parameters, one DDP bucket). Each rank holds a disjoint shard of the 60,000 training
images and takes minibatches of ``--batch`` from it; every method starts from the same weights and
sees the same minibatches, and the methods take their steps in turn (so a change in the machine's
load slows them alike; the step time is each method's median). The optimizer is plain SGD with the same step ``--lr`` for every
method: PermK's average is unbiased but has variance (ω = n − 1, "PermK" theorem's A = B = 1), so
at equal steps it trails the exact average; its messages are n times smaller.

"Bytes sent per rank" is each rank's own message per step (the paper's worker→server count):
4d for the all-reduce of float32 gradients, 2d for fp16, and for permk's hook the bytes its state
measured (4⌈d/n⌉ at most). On the wire a ring all-reduce moves 2(n−1)/n of its vector per rank, an
all-gather (n−1) slots; the table gives both. Writes a figure (``--figure``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import permk
from permk.problems.datasets import DEBIAN_FASHION_MNIST, DataNotFoundError, load_fashion_mnist, read_idx

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("all-reduce", "fp16", "PermK", "BlockPermK")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4, help="localhost processes (default 4)")
    ap.add_argument("--steps", type=int, default=1000, help="SGD steps per method (default 1000)")
    ap.add_argument("--batch", type=int, default=32, help="minibatch per rank (default 32)")
    ap.add_argument("--lr", type=float, default=0.5, help="SGD step, the same for every method (default 0.5)")
    ap.add_argument("--eval-every", type=int, default=50, help="steps between evaluations (default 50)")
    ap.add_argument("--train-limit", type=int, default=None, help="use the first N training images (default all)")
    ap.add_argument("--test-limit", type=int, default=None, help="use the first N test images (default all 10,000)")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=None, help="directory of the Fashion-MNIST IDX files (default: $PERMK_DATA, else Debian's)")
    ap.add_argument("--figure", default=str(ROOT / "docs" / "figures" / "ddp_fashion_mnist.png"))
    ap.add_argument("--json", default=None, help="also write the measurements here")
    ap.add_argument("--quick", action="store_true", help="2 ranks, 60 steps on 6,000 training and 2,000 test images")
    args = ap.parse_args(argv)
    if args.quick:
        args.ranks, args.steps, args.eval_every, args.train_limit, args.test_limit = 2, 60, 20, 6000, 2000
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in args.methods if m not in METHODS]
    if bad:
        ap.error(f"--methods: unknown {bad}; choose from {METHODS}")
    for name in ("ranks", "steps", "batch", "eval_every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def load(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Training and test images (float32 rows in [0, 1]) and labels."""
    train = load_fashion_mnist(args.data, limit=args.train_limit, dtype=np.float32)
    root = Path(args.data or os.environ.get("PERMK_DATA") or DEBIAN_FASHION_MNIST)
    test_files = [next((p for p in (root / s, root / (s + ".gz")) if p.exists()), None)
                  for s in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")]
    if None in test_files:
        raise DataNotFoundError(f"{root}: no t10k-images-idx3-ubyte[.gz] / t10k-labels-idx1-ubyte[.gz] (the test set)")
    Xt = read_idx(test_files[0], expect_ndim=3)[: args.test_limit]
    yt = read_idx(test_files[1], expect_ndim=1)[: args.test_limit].astype(np.int64)
    return train.X, np.asarray(train.y, dtype=np.int64), (Xt.reshape(len(Xt), -1) / np.float32(255.0)).astype(np.float32), yt


def net() -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(784, 32), torch.nn.Sigmoid(), torch.nn.Linear(32, 10))


class Run:
    """One method's model, optimizer and minibatch stream on this rank, with its evaluations
    (rank 0) and step times."""

    def __init__(self, method: str, args: argparse.Namespace, n_train: int, rank: int, n: int) -> None:
        import torch
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel

        import permk.torch as pt

        torch.manual_seed(args.seed)  # the same initial weights for every method
        self.method, self.rank = method, rank
        self.model = DistributedDataParallel(net())
        self.d = sum(p.numel() for p in self.model.parameters())
        self.state = None
        if method == "fp16":
            self.model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif method in ("PermK", "BlockPermK"):
            comp = permk.PermK() if method == "PermK" else permk.BlockPermK(n)
            self.state, hook = pt.comm_hook(comp, seed=args.seed)
            self.model.register_comm_hook(self.state, hook)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=args.lr)
        self.shard = np.array_split(np.random.default_rng(args.seed).permutation(n_train), n)[rank]
        self.draws = np.random.default_rng([args.seed, rank])  # the same minibatches for every method
        self.payload = {"all-reduce": 4 * self.d, "fp16": 2 * self.d}.get(method, 0)
        self.rows: list[dict[str, float]] = []
        self.times: list[float] = []

    def step(self, data: tuple[Any, ...], batch: int) -> None:
        import torch

        X, y = data[0], data[1]
        idx = torch.from_numpy(self.shard[self.draws.integers(0, len(self.shard), batch)])
        t0 = time.perf_counter()
        self.opt.zero_grad()
        torch.nn.functional.cross_entropy(self.model(X[idx]), y[idx]).backward()
        self.opt.step()
        self.times.append(time.perf_counter() - t0)

    def evaluate(self, step: int, data: tuple[Any, ...]) -> None:
        import torch

        if self.rank != 0:
            return
        X, y, Xt, yt = data
        with torch.no_grad():
            module = self.model.module
            loss = float(torch.nn.functional.cross_entropy(module(X[:10_000]), y[:10_000]))
            acc = float((module(Xt).argmax(1) == yt).float().mean())
        sent = self.state.bytes_sent if self.state is not None else self.payload * step
        self.rows.append({"step": step, "train_loss": loss, "test_acc": acc, "bytes_sent": sent})

    def result(self, steps: int) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "d": self.d, "rows": self.rows, "step_ms": 1e3 * float(np.median(self.times))}
        if self.state is not None:
            out["padded_per_step"] = self.state.bytes_padded / steps
        return out


def worker(rank: int, args: argparse.Namespace, store: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    n = args.ranks
    dist.init_process_group("gloo", store=dist.FileStore(store, n), rank=rank, world_size=n)
    X, y, Xt, yt = load(args)
    data = tuple(torch.from_numpy(a) for a in (X, y, Xt, yt))
    # the methods take their steps in turn, so a change in the machine's load slows them alike
    runs = [Run(m, args, len(X), rank, n) for m in args.methods]
    for step in range(args.steps + 1):
        if step:
            for run in runs:
                run.step(data, args.batch)
        if step % args.eval_every == 0 or step == args.steps:
            for run in runs:
                run.evaluate(step, data)
            dist.barrier()
    results = [run.result(args.steps) for run in runs]
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def table(results: list[dict[str, Any]], n: int, steps: int) -> str:
    lines = ["| method | bytes sent per rank per step | on the wire per rank per step (ring) | median step time | final train loss | final test accuracy |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        d, last = r["d"], r["rows"][-1]
        per_step = last["bytes_sent"] / steps
        wire = r["padded_per_step"] * (n - 1) if "padded_per_step" in r else 2 * (n - 1) / n * per_step
        lines.append(f"| {r['method']} | {per_step:,.0f} B ({per_step / (4 * d):.2f}·4d) | {wire:,.0f} B | "
                     f"{r['step_ms']:.2f} ms | {last['train_loss']:.3f} | {last['test_acc']:.3f} |")
    return "\n".join(lines)


def figure(results: list[dict[str, Any]], args: argparse.Namespace, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharey="row")
    style = {"all-reduce": ("k", "-"), "fp16": ("tab:orange", "--"), "PermK": ("tab:blue", "-"), "BlockPermK": ("tab:green", ":")}
    labels = {"BlockPermK": f"BlockPermK({args.ranks})"}
    for r in results:
        steps = [row["step"] for row in r["rows"]]
        mb = [row["bytes_sent"] / 1e6 for row in r["rows"]]
        color, ls = style[r["method"]]
        kw = {"color": color, "ls": ls, "label": labels.get(r["method"], r["method"]), "lw": 1.8}
        for row, key in enumerate(("train_loss", "test_acc")):
            vals = [v[key] for v in r["rows"]]
            axes[row, 0].plot(steps, vals, **kw)
            axes[row, 1].plot(mb, vals, **kw)
    for col, xlabel in enumerate(("SGD steps", "bytes sent per rank (MB, the rank's own messages)")):
        axes[1, col].set_xlabel(xlabel)
        axes[0, col].set_xlabel(xlabel)
    axes[0, 0].set_ylabel("training loss (cross-entropy,\nfirst 10,000 training images)")
    axes[1, 0].set_ylabel("test accuracy (10,000 test images)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"DDP on Fashion-MNIST, {args.ranks} gloo processes: Linear(784→32)·sigmoid·Linear(32→10), "
                 f"SGD lr={args.lr}, batch {args.batch} per rank", fontsize=11)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        load(argparse.Namespace(**{**vars(args), "train_limit": 1, "test_limit": 1}))
    except DataNotFoundError as exc:
        print(f"ddp_fashion_mnist: {exc}", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "results.json")
        t0 = time.perf_counter()
        mp.spawn(worker, args=(args, store, out), nprocs=args.ranks, join=True)
        results = json.loads(Path(out).read_text())
    print(f"{args.ranks} ranks, {args.steps} steps per method, batch {args.batch} per rank, SGD lr {args.lr}, "
          f"d = {results[0]['d']:,}; {time.perf_counter() - t0:.0f} s in all")
    print(table(results, args.ranks, args.steps))
    figure(results, args, args.figure)
    print(f"figure: {args.figure}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items()}, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
