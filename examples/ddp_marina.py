"""MARINA with PermK for a torch model on torch.distributed, next to plain SGD with an all-reduce.

Starts ``--ranks`` gloo processes on this machine (or runs under ``torchrun``: one rank per
process). Every rank holds its own shard of a synthetic regression task (its own inputs, one
shared teacher network) and trains the same small MLP twice from the same start: with
:class:`permk.torch.Marina` (PermK on the rounds of tails, an all-reduce on the coin's rounds;
SGD as the step) and with SGD on all-reduced gradients. Prints the losses and the bytes each rank
sent, per method.

    python examples/ddp_marina.py [--ranks 2] [--steps 300] [--lr 0.05]
    torchrun --nproc-per-node 4 examples/ddp_marina.py --steps 300
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import permk
import permk.torch as pt


def data(rank: int, samples: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shard: its own inputs, labelled by one teacher network every rank shares."""
    torch.manual_seed(1234)
    teacher = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    X = torch.randn(samples, 20, generator=torch.Generator().manual_seed(rank))
    with torch.no_grad():
        return X, teacher(X) + 0.05 * torch.randn(samples, 1, generator=torch.Generator().manual_seed(100 + rank))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))


def train(rank: int, world: int, steps: int, lr: float, batch: int) -> None:
    X, Y = data(rank)
    results = {}
    for method in ("SGD + all-reduce", "MARINA + PermK"):
        net = model()
        sgd = torch.optim.SGD(net.parameters(), lr=lr)
        helper = pt.Marina(net.parameters(), permk.PermK(), sgd, seed=7) if method.startswith("MARINA") else None
        sent, losses = 0, []
        for t in range(steps):
            idx = torch.randint(0, len(X), (batch,), generator=torch.Generator().manual_seed(10_000 * t + rank))

            def closure() -> torch.Tensor:
                loss = torch.nn.functional.mse_loss(net(X[idx]), Y[idx])
                loss.backward()
                return loss

            if helper is not None:
                helper.step(closure)
            else:
                sgd.zero_grad()
                closure()
                for q in net.parameters():
                    dist.all_reduce(q.grad)
                    q.grad.div_(world)
                    sent += q.grad.numel() * q.grad.element_size()
                sgd.step()
            if t % max(1, steps // 5) == 0 or t == steps - 1:
                with torch.no_grad():
                    full = torch.nn.functional.mse_loss(net(X), Y).reshape(1)
                dist.all_reduce(full)
                losses.append((t, float(full) / world))
        results[method] = (losses, helper.bytes_sent if helper is not None else sent, helper.heads if helper else None)
    if rank == 0:
        d = sum(q.numel() for q in model().parameters())
        print(f"{world} ranks, d = {d}, {steps} steps, lr {lr}, batch {batch} per rank")
        for method, (losses, sent, heads) in results.items():
            extra = f", {heads} rounds of the coin (all-reduce)" if heads is not None else ""
            print(f"{method}: loss " + " -> ".join(f"{v:.4f} (step {t})" for t, v in losses)
                  + f"; {sent / 1e6:.2f} MB sent by rank 0{extra}")


def spawned(rank: int, world: int, store: str, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        train(rank, world, args.steps, args.lr, args.batch)
    finally:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group("gloo")
        try:
            train(dist.get_rank(), dist.get_world_size(), args.steps, args.lr, args.batch)
        finally:
            dist.destroy_process_group()
        return
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(spawned, args=(args.ranks, os.path.join(tmp, "store"), args), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    sys.exit(main())
