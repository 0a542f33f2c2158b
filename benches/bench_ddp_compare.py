"""permk's DDP hooks compared with all-reduce, fp16/bf16 and PowerSGD: training loss against steps,
bytes per rank and wall-clock seconds on a bandwidth-limited network (the page ``ddp-comparison``).

``--ranks`` gloo processes (default 4) train the same network with torch DDP, one model per
method, all from the same initial point and the same minibatches (common random numbers), steps
interleaved method by method:

* ``all-reduce`` (DDP's own), ``fp16`` and ``bf16`` (torch's ``default_hooks``), ``PowerSGD r1``
  and ``PowerSGD r4`` (torch's ``powerSGD_hook``, error feedback and warm start on, compression
  from step 2);
* ``PermK`` (``permk.torch.comm_hook(PermK())``), ``PermK + DIANA`` (``shift="diana"``,
  ``α = 1/(ω+1)``), ``PermK sharded`` (:class:`permk.torch.ShardedOptimizer`: each rank steps
  its shard of SGD and the parameters are all-gathered), ``RandK + DIANA`` (shared-seed RandK with
  ``k = ⌈d/n⌉``, the DIANA shift: EF21's α = 1 needs a contractive compressor, and RandK scaled by
  d/k is not) and ``TopK + EF21`` (``shift="ef21"``, ``k = ⌈d/(2n)⌉``: as index–value pairs its
  message has PermK's bytes), and ``BlockPermK`` (``comm_hook(BlockPermK(n))``: each rank one
  contiguous block of the bucket, drawn at random each round; PermK's constants, an O(n) plan).

Two networks on Fashion-MNIST (60,000 training images, the 10,000 test images for accuracy):
the authors' two-layer network (784 → 32, sigmoid, → 10; 25,450 parameters) and an MLP
784 → 512 → 256 → 10 with ReLU (535,818 parameters). Shards: ``iid`` (a random equal split)
and ``skew`` (the images sorted by label and cut into equal contiguous shards: each rank holds
two or three classes). Plain SGD, batch ``--batch`` per rank, two learning rates per network,
``--seeds`` seeds (default 3; the initial point, the minibatches and the compressors' seeds). Every
``--eval-every`` steps: the training loss on a fixed subset of the training set (the objective of
all ranks together), the test loss and test accuracy. A method whose training loss is not finite
or above ten times the start's stops (``diverged at``). The tables' final values are each seed's
mean over its last three evaluations (steps 250-300 by default), averaged over the seeds.

**Bytes per rank** are what a rank hands to the collectives, counted by wrapping
``torch.distributed``'s functions, priced as bandwidth-optimal algorithms send them: an all-reduce
of ``b`` bytes ``2(n−1)/n · b`` (ring), an all-gather of ``b`` bytes per rank ``(n−1) · b``, an
all-to-all the bytes that leave the rank. DDP's own all-reduce (in C++) is priced the same way.

**Wall-clock seconds**: a second stage starts the ranks inside a network namespace whose loopback
is rate-limited by a token bucket (``--rates``, default 100 Mbit/s and 1 Gbit/s; :mod:`netns`,
shared with ``bench_network.py``): all methods of a network are built and their steps timed
interleaved (a barrier, the step, the slowest rank's seconds; the median over ``--time-reps``
after two warm-up steps). The seconds axis of the figures is ``step × that median`` (the
training curves are the same on any network). It needs root and ``tc``; otherwise it says so and
the wall-clock stage is skipped.

Writes ``benches/results/bench_ddp_compare.json`` (:mod:`record`: machine, date, load, seeds; the
curves and timings under ``curves`` and ``timings``) and ``docs/figures/ddp_compare_*.png``.

    python benches/bench_ddp_compare.py                       # the grid (~45 min on 2 cores, 3 seeds)
    python benches/bench_ddp_compare.py --stage report        # the table and figures from the work files
    python benches/bench_ddp_compare.py --smoke               # seconds; no namespace, no files
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import netns  # noqa: E402

FIGURES = HERE.parent / "docs" / "figures"
WORK = HERE / "results" / "ddp_compare_work"

METHODS = ["all-reduce", "fp16", "bf16", "PowerSGD r1", "PowerSGD r4", "PermK", "PermK + DIANA", "PermK sharded",
           "RandK + DIANA", "TopK + EF21", "BlockPermK"]
MODELS = {"two-layer": "two-layer network (784-32-10, sigmoid; 25,450 parameters)",
          "mlp": "MLP 784-512-256-10 (ReLU; 535,818 parameters)"}
#: two learning rates per network (plain SGD): a moderate one and a large one
LRS = {"two-layer": [0.5, 2.0], "mlp": [0.05, 0.2]}
SPLITS = ["iid", "skew"]


# ---------------------------------------------------------------------------------------------
# one rank
# ---------------------------------------------------------------------------------------------
def build_model(name: str) -> Any:
    import torch.nn as nn

    if name == "two-layer":
        return nn.Sequential(nn.Linear(784, 32), nn.Sigmoid(), nn.Linear(32, 10))
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
    raise ValueError(f"model {name!r}")


def load_data(data_dir: str | None, samples: int | None) -> dict[str, Any]:
    """Fashion-MNIST as float32 tensors in [0, 1]: the training set (the first ``samples``) and
    the test set (``t10k`` files beside it)."""
    import torch

    from permk.problems.datasets import DEBIAN_FASHION_MNIST, load_fashion_mnist, read_idx

    train = load_fashion_mnist(data_dir, limit=samples, dtype=np.float32)
    root = Path(data_dir or os.environ.get("PERMK_DATA") or DEBIAN_FASHION_MNIST)

    def idx(stem: str) -> np.ndarray:
        for cand in (root / stem, root / f"{stem}.gz"):
            if cand.exists():
                return read_idx(cand)
        raise FileNotFoundError(f"{root}: no {stem}[.gz]")

    Xt = idx("t10k-images-idx3-ubyte").reshape(-1, 784).astype(np.float32) / 255.0
    yt = idx("t10k-labels-idx1-ubyte").astype(np.int64)
    return {"X": torch.from_numpy(np.ascontiguousarray(train.X)), "y": torch.from_numpy(train.y.astype(np.int64)),
            "Xt": torch.from_numpy(Xt), "yt": torch.from_numpy(yt)}


def shard_of(y: np.ndarray, n: int, rank: int, split: str, seed: int) -> np.ndarray:
    """This rank's sample indices: ``iid``, a random equal split (``seed``); ``skew``, the samples
    sorted by label (stable) and cut into ``n`` equal contiguous shards."""
    if split == "iid":
        order = np.random.default_rng([seed, 0x5EED]).permutation(y.size)
    elif split == "skew":
        order = np.argsort(y, kind="stable")
    else:
        raise ValueError(f"split {split!r}")
    return np.array_split(order, n)[rank]


class Counter:
    """Bytes per rank handed to the collectives, by method, priced as bandwidth-optimal
    algorithms send them (see the module docstring); ``current`` names the method stepping."""

    def __init__(self, n: int, rank: int) -> None:
        self.n, self.rank = n, rank
        self.current: str | None = None
        self.bytes: dict[str, float] = {}
        self.by_op: dict[str, dict[str, float]] = {}

    def add(self, op: str, b: float) -> None:
        if self.current is not None:
            self.bytes[self.current] = self.bytes.get(self.current, 0.0) + b
            ops = self.by_op.setdefault(self.current, {})
            ops[op] = ops.get(op, 0.0) + b

    def install(self) -> dict[str, Callable[..., Any]]:
        """Wrap ``torch.distributed``'s collectives (the hooks call them through the module);
        returns the originals (for traffic that is not a method's, such as the evaluation)."""
        import torch.distributed as dist

        n, rank = self.n, self.rank
        orig = {k: getattr(dist, k) for k in ("all_reduce", "all_gather_into_tensor", "all_to_all_single", "all_gather")}

        def nbytes(t: Any) -> int:
            return int(t.numel() * t.element_size())

        def all_reduce(tensor: Any, *a: Any, **k: Any) -> Any:
            self.add("all_reduce", 2 * (n - 1) / n * nbytes(tensor))
            return orig["all_reduce"](tensor, *a, **k)

        def all_gather_into_tensor(output: Any, input: Any, *a: Any, **k: Any) -> Any:
            self.add("all_gather", (n - 1) * nbytes(input))
            return orig["all_gather_into_tensor"](output, input, *a, **k)

        def all_gather(tensor_list: Any, tensor: Any, *a: Any, **k: Any) -> Any:
            self.add("all_gather", (n - 1) * nbytes(tensor))
            return orig["all_gather"](tensor_list, tensor, *a, **k)

        def all_to_all_single(output: Any, input: Any, output_split_sizes: Any = None, input_split_sizes: Any = None,
                              *a: Any, **k: Any) -> Any:
            per = input.element_size() * (input[0].numel() if input.dim() > 1 else 1)
            if input_split_sizes is None:
                away = (n - 1) * input.shape[0] // n
            else:
                away = sum(input_split_sizes) - input_split_sizes[rank]
            self.add("all_to_all", away * per)
            return orig["all_to_all_single"](output, input, output_split_sizes, input_split_sizes, *a, **k)

        dist.all_reduce, dist.all_gather_into_tensor = all_reduce, all_gather_into_tensor  # type: ignore[assignment]
        dist.all_gather, dist.all_to_all_single = all_gather, all_to_all_single  # type: ignore[assignment]
        return orig


class Method:
    """One method's model, optimizer and hook state on this rank."""

    def __init__(self, name: str, model: str, lr: float, seed: int, n: int) -> None:
        import functools

        import torch
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
        from torch.nn.parallel import DistributedDataParallel as DDP

        import permk
        import permk.torch as pt

        self.name = name
        torch.manual_seed(seed)
        self.net = build_model(model)
        d = self.d = sum(p.numel() for p in self.net.parameters())
        self.ddp: Any = None
        self.state: Any = None
        self.sharded = name == "PermK sharded"
        if self.sharded:
            self.opt: Any = pt.ShardedOptimizer(self.net.parameters(), permk.PermK(), functools.partial(torch.optim.SGD, lr=lr),
                                                seed=seed)
            return
        # one bucket for the whole model (a sparsifier's k is set for the model's d)
        self.ddp = DDP(self.net, bucket_cap_mb=4 * d / 2**20 * 1.1 + 0.01)
        if name == "fp16":
            self.ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif name == "bf16":
            self.ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        elif name.startswith("PowerSGD"):
            self.state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=int(name[-1]),
                                                     start_powerSGD_iter=2, random_seed=seed)
            self.ddp.register_comm_hook(self.state, powerSGD_hook.powerSGD_hook)
        elif name != "all-reduce":
            comp, shift = {"PermK": (permk.PermK(), None), "PermK + DIANA": (permk.PermK(), "diana"),
                           "BlockPermK": (permk.BlockPermK(n), None),
                           "RandK + DIANA": (permk.RandK(-(-d // n)), "diana"),
                           "TopK + EF21": (permk.TopK(-(-d // (2 * n))), "ef21")}[name]
            self.state, hook = pt.comm_hook(comp, seed=seed, shift=shift)
            self.ddp.register_comm_hook(self.state, hook)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=lr)

    def step(self, xb: Any, yb: Any) -> None:
        import torch.nn.functional as F

        if self.sharded:
            self.opt.zero_grad()
            F.cross_entropy(self.net(xb), yb).backward()
            self.opt.step()
        else:
            self.opt.zero_grad()
            F.cross_entropy(self.ddp(xb), yb).backward()
            self.opt.step()

    def buckets(self) -> int | None:
        rounds = getattr(self.state, "rounds", None)
        return len(rounds) if isinstance(rounds, dict) else None


def evaluate(net: Any, data: dict[str, Any], ev: dict[str, Any], rank: int, n: int, all_reduce: Callable[..., Any]) -> list[float]:
    """[training loss on the fixed training subset, test loss, test accuracy]: each rank its
    part of both sets, summed by an all-reduce (not counted as a method's bytes)."""
    import torch
    import torch.nn.functional as F

    out = torch.zeros(4, dtype=torch.float64)
    with torch.no_grad():
        for which, (X, y) in enumerate(((data["X"], data["y"]), (data["Xt"], data["yt"]))):
            sel = ev["train" if which == 0 else "test"]
            part = np.array_split(sel, n)[rank]
            xb, yb = X[part], y[part]
            logits = net(xb)
            out[2 * which] = float(F.cross_entropy(logits, yb, reduction="sum"))
            out[2 * which + 1] = float((logits.argmax(1) == yb).sum())
    all_reduce(out)
    ntr, nte = len(ev["train"]), len(ev["test"])
    return [float(out[0]) / ntr, float(out[2]) / nte, float(out[3]) / nte]


def inner(spec: dict[str, Any], rank: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    n = spec["ranks"]
    dist.init_process_group("gloo", store=dist.FileStore(spec["store"], n), rank=rank, world_size=n)
    counter = Counter(n, rank)
    orig = counter.install()
    data = load_data(spec.get("data"), spec.get("samples"))
    y = data["y"].numpy()
    ev_rng = np.random.default_rng(12345)
    ev = {"train": np.sort(ev_rng.choice(y.size, min(spec["eval_samples"], y.size), replace=False)),
          "test": np.arange(min(spec["eval_samples"], data["yt"].numel()))}
    out = Path(spec["out"])
    try:
        for job in spec["jobs"]:
            if job["kind"] == "train":
                res = train_cell(job, data, ev, rank, n, counter, orig)
            else:
                res = time_cell(job, data, rank, n, counter, orig)
            if rank == 0:
                with out.open("a") as fh:
                    fh.write(json.dumps(res) + "\n")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def batches(y: np.ndarray, n: int, rank: int, split: str, seed: int, steps: int, batch: int) -> np.ndarray:
    """This rank's minibatch indices for ``steps`` steps (the same for every method): epochs of
    its shard in random orders drawn from ``(seed, rank)``."""
    shard = shard_of(y, n, rank, split, seed)
    rng = np.random.default_rng([seed, rank, 0xBA7C])
    need = steps * batch
    parts, have = [], 0
    while have < need:
        parts.append(shard[rng.permutation(shard.size)])
        have += shard.size
    return np.concatenate(parts)[:need].reshape(steps, batch)


def train_cell(job: dict[str, Any], data: dict[str, Any], ev: dict[str, Any], rank: int, n: int, counter: Counter,
               orig: dict[str, Callable[..., Any]]) -> dict[str, Any]:
    import torch

    model, split, lr, seed, steps = job["model"], job["split"], job["lr"], job["seed"], job["steps"]
    t_cell = time.perf_counter()
    methods = {m: Method(m, model, lr, seed, n) for m in job["methods"]}
    d = next(iter(methods.values())).d
    idx = batches(data["y"].numpy(), n, rank, split, seed, steps, job["batch"])
    X, Y = data["X"], data["y"]
    curves: dict[str, dict[str, Any]] = {m: {"step": [], "train_loss": [], "test_loss": [], "test_acc": [], "bytes": [],
                                             "diverged_at": None, "step_seconds": []} for m in methods}
    counter.bytes.clear()
    counter.by_op.clear()
    live = set(methods)
    start_loss = None
    for t in range(steps + 1):
        if t % job["eval_every"] == 0 or t == steps:
            for m in [m for m in methods if m in live]:  # the same order on every rank (not a set's)
                loss, tloss, acc = evaluate(methods[m].net, data, ev, rank, n, orig["all_reduce"])
                b = counter.bytes.get(m, 0.0) + (2 * (n - 1) / n * 4 * d * t if m == "all-reduce" else 0.0)
                bt = torch.tensor([b], dtype=torch.float64)
                orig["all_reduce"](bt)
                c = curves[m]
                c["step"].append(t)
                c["train_loss"].append(loss)
                c["test_loss"].append(tloss)
                c["test_acc"].append(acc)
                c["bytes"].append(float(bt) / n)  # the ranks' mean
                if start_loss is None:
                    start_loss = loss
                if not math.isfinite(loss) or loss > 10 * start_loss:
                    c["diverged_at"] = t
                    live.discard(m)
        if t == steps:
            break
        xb, yb = X[idx[t]], Y[idx[t]]
        for m in methods:
            if m not in live:
                continue
            counter.current = m
            t0 = time.perf_counter()
            methods[m].step(xb, yb)
            curves[m]["step_seconds"].append(time.perf_counter() - t0)
            counter.current = None
    for m, meth in methods.items():
        c = curves[m]
        c["loopback_step_seconds_median"] = statistics.median(c.pop("step_seconds")) if c["step"][-1] > 0 else None
        c["buckets"] = meth.buckets()
        c["bytes_by_op"] = counter.by_op.get(m, {})
    if rank == 0:
        best = {m: curves[m]["train_loss"][-1] for m in methods}
        print(f"[{time.strftime('%H:%M:%S')}] {model} {split} lr={lr} seed={seed}: {time.perf_counter() - t_cell:.0f} s, "
              f"load {os.getloadavg()[0]:.1f}; final training loss "
              + ", ".join(f"{m} {v:.3f}" + ("" if curves[m]["diverged_at"] is None else " (diverged)") for m, v in best.items()),
              flush=True)
    return {"kind": "train", "model": model, "split": split, "lr": lr, "seed": seed, "d": d, "steps": steps,
            "batch": job["batch"], "ranks": n, "curves": curves, "seconds": time.perf_counter() - t_cell,
            "load_after": list(os.getloadavg())}


def time_cell(job: dict[str, Any], data: dict[str, Any], rank: int, n: int, counter: Counter,
              orig: dict[str, Callable[..., Any]]) -> dict[str, Any]:
    """Seconds per step of every method (interleaved; the slowest rank's; median over reps)."""
    import torch
    import torch.distributed as dist

    model, seed = job["model"], 0
    load_before = list(os.getloadavg())
    methods = {m: Method(m, model, job["lr"], seed, n) for m in job["methods"]}
    d = next(iter(methods.values())).d
    reps, warmup = job["reps"], job["warmup"]
    idx = batches(data["y"].numpy(), n, rank, "iid", seed, reps + warmup, job["batch"])
    X, Y = data["X"], data["y"]
    times: dict[str, list[float]] = {m: [] for m in methods}
    for r in range(reps + warmup):
        if r == warmup:
            counter.bytes.clear()  # the bytes of the timed steps (PowerSGD's first steps are all-reduces)
        xb, yb = X[idx[r]], Y[idx[r]]
        for m in methods:
            dist.barrier()
            counter.current = m
            t0 = time.perf_counter()
            methods[m].step(xb, yb)
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            counter.current = None
            orig["all_reduce"](dt, op=dist.ReduceOp.MAX)
            if r >= warmup:
                times[m].append(float(dt))
    if rank == 0:
        print(f"[{time.strftime('%H:%M:%S')}] {job['rate_label']} {model}: "
              + ", ".join(f"{m} {statistics.median(v):.3f} s" for m, v in times.items()), flush=True)
    steps = reps
    return {"kind": "time", "model": model, "rate": job["rate"], "rate_label": job["rate_label"], "d": d, "ranks": n,
            "reps": reps, "warmup": warmup, "batch": job["batch"], "times": times,
            "median": {m: statistics.median(v) for m, v in times.items()},
            "bytes_per_step": {m: (counter.bytes.get(m, 0.0) + (2 * (n - 1) / n * 4 * d * steps if m == "all-reduce" else 0.0)) / steps
                               for m in methods},
            "load_before": load_before, "load_after": list(os.getloadavg())}


# ---------------------------------------------------------------------------------------------
# the outer process
# ---------------------------------------------------------------------------------------------
def launch(spec: dict[str, Any], *, prefix: list[str] | None = None, timeout: float = 3600) -> None:
    """Start the ranks (inside ``prefix``'s namespace, if given) and wait; rank 0's output is shown."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = {**spec, "store": os.path.join(tmp, "store")}
        path = os.path.join(tmp, "spec.json")
        Path(path).write_text(json.dumps(spec))
        env = {**os.environ, **netns.THREAD_ENV, "GLOO_SOCKET_IFNAME": "lo"}
        procs = []
        for r in range(spec["ranks"]):
            procs.append(subprocess.Popen([*(prefix or []), sys.executable, __file__, "--inner", path, str(r)], env=env,
                                          stdout=None if r == 0 else subprocess.DEVNULL, start_new_session=True))
        try:
            deadline = time.monotonic() + timeout
            codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
        finally:
            netns.kill_groups(procs)
        if any(codes):
            raise RuntimeError(f"a rank failed: exit codes {codes}")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stage_train(args: argparse.Namespace, work: Path) -> None:
    have: dict[tuple[Any, ...], set[str]] = {}  # the methods run so far per (model, split, lr, seed)
    for r in read_jsonl(work / "train.jsonl"):
        have.setdefault((r["model"], r["split"], r["lr"], r["seed"]), set()).update(r["curves"])
    for model in args.models:
        for split in args.splits:
            jobs = [{"kind": "train", "model": model, "split": split, "lr": lr, "seed": seed, "steps": args.steps[model],
                     "batch": args.batch, "eval_every": args.eval_every,
                     "methods": [m for m in args.methods if m not in have.get((model, split, lr, seed), set())]}
                    for lr in args.lrs[model] for seed in args.seeds]
            jobs = [j for j in jobs if j["methods"]]
            if jobs:
                launch({"ranks": args.ranks, "jobs": jobs, "out": str(work / "train.jsonl"), "samples": args.samples,
                        "data": args.data, "eval_samples": args.eval_samples})


def stage_time(args: argparse.Namespace, work: Path) -> None:
    why = netns.unavailable()
    if why is not None:
        print(f"bench_ddp_compare: the wall-clock stage is skipped: {why}")
        return
    done = {(r["model"], r["rate"]) for r in read_jsonl(work / "time.jsonl")}
    netns.install_signal_handlers()
    try:
        for rate in args.rates:
            jobs = [{"kind": "time", "model": model, "rate": rate, "rate_label": netns.rate_label(rate), "lr": args.lrs[model][0],
                     "reps": args.time_reps, "warmup": 2, "batch": args.batch, "methods": args.methods}
                    for model in args.models if (model, rate) not in done]
            if not jobs:
                continue
            with netns.LimitedLoopback(rate) as ns:
                launch({"ranks": args.ranks, "jobs": jobs, "out": str(work / "time.jsonl"), "samples": args.samples,
                        "data": args.data, "eval_samples": args.eval_samples}, prefix=ns.prefix)
    finally:
        netns.remove_live_namespaces()


# ---------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------
def aggregate(cells: list[dict[str, Any]]) -> dict[tuple[str, str, float], dict[str, Any]]:
    """Per (model, split, lr) and method: the seeds' curves (mean where every seed is alive)."""
    out: dict[tuple[str, str, float], dict[str, Any]] = {}
    for c in cells:
        key = (c["model"], c["split"], c["lr"])
        entry = out.setdefault(key, {"d": c["d"], "steps": c["steps"], "seeds": [], "methods": {}})
        if c["seed"] not in entry["seeds"]:  # a later run may add methods to a (cell, seed)
            entry["seeds"].append(c["seed"])
        for m, cur in c["curves"].items():
            entry["methods"].setdefault(m, []).append(cur)
    return out


#: the final values are the mean of the last LAST evaluations (steps 250, 275, 300 by default): one
#: evaluation of an SGD trajectory at a large step is noisy
LAST = 3


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One method's seeds: the final values (each seed's mean over its last ``LAST`` evaluations;
    mean, min, max over the seeds that did not diverge), how many diverged, bytes per step."""
    ok = [r for r in runs if r["diverged_at"] is None]
    fin = [float(np.mean(r["train_loss"][-LAST:])) for r in ok]
    acc = [float(np.mean(r["test_acc"][-LAST:])) for r in ok]
    last = runs[0]
    per_step = last["bytes"][-1] / last["step"][-1] if last["step"][-1] else float("nan")
    return {"seeds": len(runs), "diverged": len(runs) - len(ok), "loss": float(np.mean(fin)) if fin else float("nan"),
            "loss_min": min(fin) if fin else float("nan"), "loss_max": max(fin) if fin else float("nan"),
            "acc": float(np.mean(acc)) if acc else float("nan"), "bytes_per_step": per_step}


def best_lr(agg: dict[tuple[str, str, float], dict[str, Any]], model: str, split: str, method: str) -> float | None:
    """The learning rate (of the two) with the lowest mean final training loss and no divergence."""
    best: tuple[float, float] | None = None
    for (mo, sp, lr), e in agg.items():
        if mo != model or sp != split or method not in e["methods"]:
            continue
        s = summary(e["methods"][method])
        if s["diverged"] == 0 and (best is None or s["loss"] < best[0]):
            best = (s["loss"], lr)
    return None if best is None else best[1]


def mean_curve(runs: list[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps, bytes and the mean of ``key`` over the seeds, up to the shortest run."""
    k = min(len(r["step"]) for r in runs)
    steps = np.array(runs[0]["step"][:k], dtype=float)
    b = np.mean([r["bytes"][:k] for r in runs], axis=0)
    v = np.mean([r[key][:k] for r in runs], axis=0)
    return steps, b, v


STYLE = {"all-reduce": ("black", "-", "s"), "fp16": ("0.45", "--", None), "bf16": ("0.65", ":", None),
         "PowerSGD r1": ("tab:cyan", "-", None), "PowerSGD r4": ("tab:blue", "-", None),
         "PermK": ("tab:red", "-", "o"), "PermK + DIANA": ("tab:orange", "--", "o"), "PermK sharded": ("darkred", ":", "o"),
         "RandK + DIANA": ("tab:green", "-", "^"), "TopK + EF21": ("tab:purple", "-", "D"),
         "BlockPermK": ("tab:brown", "-.", "v")}


def plot_lines(ax: Any, xs: np.ndarray, ys: np.ndarray, m: str, **kw: Any) -> None:
    color, ls, marker = STYLE[m]
    ax.plot(xs, ys, color=color, linestyle=ls, marker=marker, markevery=max(1, len(xs) // 6), markersize=4, label=m, lw=1.4, **kw)


def plain_ticks(ax: Any, *, x_log: bool) -> None:
    """Log axes labelled with plain numbers (0.5, 1, 2; 10, 100), not powers of ten."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    if x_log:
        ax.xaxis.set_major_formatter(plain)
        lo, hi = ax.get_xlim()
        # minor labels (2 and 5 of each decade) only where the axis spans less than two decades
        few = FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.1e}"[0] in "25" else "")
        ax.xaxis.set_minor_formatter(few if hi / max(lo, 1e-12) < 100 else NullFormatter())
        ax.tick_params(axis="x", which="minor", labelsize=7)


def figures(agg: dict[tuple[str, str, float], dict[str, Any]], timings: list[dict[str, Any]], methods: list[str],
            models: list[str], splits: list[str], out: Path, lrs: dict[str, list[float]]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    seeds = sorted({s for e in agg.values() for s in e["seeds"]})
    # loss against bytes and against steps: rows = networks, columns = shards
    for xkind in ("bytes", "steps"):
        fig, axes = plt.subplots(len(models), len(splits), figsize=(max(12.0, 6.2 * len(splits)), 4.4 * len(models) + 1.4),
                                 squeeze=False)
        for i, model in enumerate(models):
            for j, split in enumerate(splits):
                ax = axes[i][j]
                for m in methods:
                    lr = best_lr(agg, model, split, m)
                    if lr is None:
                        continue
                    st, b, v = mean_curve(agg[(model, split, lr)]["methods"][m], "train_loss")
                    xs = b / 1e6 if xkind == "bytes" else st
                    if xkind == "bytes":
                        xs, v = xs[1:], v[1:]
                    plot_lines(ax, xs, v, m)
                ax.set_xscale("log" if xkind == "bytes" else "linear")
                ax.set_yscale("log")
                plain_ticks(ax, x_log=xkind == "bytes")
                ax.set_xlabel("MB sent per rank (cumulative, log scale)" if xkind == "bytes" else "optimizer steps")
                ax.set_ylabel("training loss (log scale)")
                ax.set_title(f"{MODELS[model]}\n{split} shards" + (" (each rank: 2-3 classes)" if split == "skew" else "")
                             + f"; lr (SGD) the better of {', '.join(f'{v:g}' for v in lrs[model])}", fontsize=9.5)
                ax.grid(True, which="both", alpha=0.3)
        handles, names = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, names, loc="lower center", ncol=5, fontsize=9, frameon=False)
        what = "bytes each rank sends" if xkind == "bytes" else "optimizer steps"
        fig.suptitle(f"Training loss against {what} (4 DDP ranks, Fashion-MNIST; each method at its better learning rate "
                     f"of two;\nmean of {len(seeds)} seeds; lower and further left is better)", fontsize=10.5)
        fig.tight_layout(rect=(0, 0.08, 1, 0.94))
        path = out / f"ddp_compare_loss_vs_{xkind}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    # loss against seconds: rows = networks, columns = rates (iid shards)
    rates = []
    for t in timings:
        if t["rate_label"] not in rates:
            rates.append(t["rate_label"])
    if rates:
        fig, axes = plt.subplots(len(models), len(rates), figsize=(max(12.0, 6.2 * len(rates)), 4.4 * len(models) + 1.4),
                                 squeeze=False)
        for i, model in enumerate(models):
            for j, rate in enumerate(rates):
                ax = axes[i][j]
                t = next((t for t in timings if t["model"] == model and t["rate_label"] == rate), None)
                if t is None:
                    ax.set_visible(False)
                    continue
                for m in methods:
                    lr = best_lr(agg, model, "iid", m)
                    if lr is None or m not in t["median"]:
                        continue
                    st, _, v = mean_curve(agg[(model, "iid", lr)]["methods"][m], "train_loss")
                    plot_lines(ax, st[1:] * t["median"][m], v[1:], m)
                ax.set_xscale("log")
                ax.set_yscale("log")
                plain_ticks(ax, x_log=True)
                ax.set_xlabel("wall-clock seconds (log scale) = step × median step time at this bandwidth")
                ax.set_ylabel("training loss (log scale)")
                step_bytes = max(t["bytes_per_step"].values()) * t["ranks"]  # all ranks' bytes in the largest step
                burst = (f"\n(a step moves at most {step_bytes / 1e6:.1f} MB, near the token bucket's 0.5 MB burst: "
                         "partly not rate-limited)") if t["rate"] == "100mbit" and step_bytes < 4 * 512e3 else ""
                ax.set_title(f"{MODELS[model]}\niid shards; the 4 ranks share one {rate} link{burst}", fontsize=9.5)
                ax.grid(True, which="both", alpha=0.3)
        handles, names = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, names, loc="lower center", ncol=5, fontsize=9, frameon=False)
        fig.suptitle("Training loss against wall-clock seconds on a rate-limited network (4 gloo ranks on a 2-core machine;\n"
                     f"each method at its better learning rate of two; mean of {len(seeds)} seeds; lower and further left is better)",
                     fontsize=10.5)
        fig.tight_layout(rect=(0, 0.08, 1, 0.94))
        path = out / "ddp_compare_loss_vs_seconds.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


COLUMNS = ["network", "shards", "lr", "method", "seeds", "diverged", "final training loss (mean over seeds)", "min", "max",
           "final test accuracy (mean)", "MB per rank per step", "bytes / all-reduce bytes",
           "steps to all-reduce's final loss (seeds' mean curve)", "MB per rank to all-reduce's final loss"]
TIME_COLUMNS = ["network", "bandwidth", "method", "s per step (median)", "step / all-reduce step", "MB per rank per step",
                "s to all-reduce's final loss (iid, better lr)", "load before / after"]


def reach(runs: list[dict[str, Any]], target: float) -> tuple[float | None, float | None]:
    """The first evaluated step (and bytes) at which the seeds' mean training loss is ≤ target."""
    st, b, v = mean_curve(runs, "train_loss")
    hit = np.flatnonzero(v <= target)
    if not hit.size or any(r["diverged_at"] is not None for r in runs):
        return None, None
    return float(st[hit[0]]), float(b[hit[0]])


def tables(agg: dict[tuple[str, str, float], dict[str, Any]], timings: list[dict[str, Any]], methods: list[str]) -> tuple[list[list[Any]], list[list[Any]]]:
    rows = []
    for (model, split, lr), e in sorted(agg.items(), key=lambda kv: (list(MODELS).index(kv[0][0]), kv[0][1], kv[0][2])):
        ref = summary(e["methods"]["all-reduce"]) if "all-reduce" in e["methods"] else None
        for m in methods:
            if m not in e["methods"]:
                continue
            s = summary(e["methods"][m])
            steps_to = mb_to = None
            if ref is not None and ref["diverged"] == 0:
                steps_to, b_to = reach(e["methods"][m], ref["loss"])
                mb_to = None if b_to is None else round(b_to / 1e6, 3)
            rows.append([model, split, lr, m, s["seeds"], s["diverged"], round(s["loss"], 4), round(s["loss_min"], 4),
                         round(s["loss_max"], 4), round(s["acc"], 4), round(s["bytes_per_step"] / 1e6, 4),
                         round(s["bytes_per_step"] / ref["bytes_per_step"], 3) if ref else None, steps_to, mb_to])
    trows = []
    for t in timings:
        model = t["model"]
        lr_ref = best_lr(agg, model, "iid", "all-reduce")
        target = None
        if lr_ref is not None:
            target = summary(agg[(model, "iid", lr_ref)]["methods"]["all-reduce"])["loss"]
        for m in methods:
            if m not in t["median"]:
                continue
            secs = None
            lr = best_lr(agg, model, "iid", m)
            if lr is not None and target is not None:
                st, _ = reach(agg[(model, "iid", lr)]["methods"][m], target)
                secs = None if st is None else round(st * t["median"][m], 2)
            trows.append([model, t["rate_label"], m, round(t["median"][m], 4), round(t["median"][m] / t["median"]["all-reduce"], 3),
                          round(t["bytes_per_step"][m] / 1e6, 4), secs,
                          f"{t['load_before'][0]:.1f} / {t['load_after'][0]:.1f}"])
    return rows, trows


def summary_table(agg: dict[tuple[str, str, float], dict[str, Any]], timings: list[dict[str, Any]],
                  methods: list[str]) -> tuple[list[str], list[list[Any]]]:
    """One row per method: its bytes per step against all-reduce's, its final training loss and
    test accuracy (mean over seeds) at its better learning rate in every (network, shards) cell,
    and the step time at each bandwidth as a ratio to all-reduce's."""
    cells = sorted({(k[0], k[1]) for k in agg}, key=lambda c: (list(MODELS).index(c[0]), SPLITS.index(c[1])))
    rates = []
    for t in timings:
        if t["rate_label"] not in rates:
            rates.append(t["rate_label"])
    cols = ["method", "bytes per step / all-reduce's"]
    cols += [f"{mo} {sp}: loss (acc) at lr" for mo, sp in cells]
    cols += [f"{mo} step / all-reduce's at {r}" for mo in MODELS for r in rates
             if any(t["model"] == mo and t["rate_label"] == r for t in timings)]
    rows = []
    for m in methods:
        ratio = None
        row: list[Any] = [m]
        for mo, sp in cells:
            lr = best_lr(agg, mo, sp, m)
            if ratio is None and lr is not None:
                e = agg[(mo, sp, lr)]["methods"]
                ratio = summary(e[m])["bytes_per_step"] / summary(e["all-reduce"])["bytes_per_step"]
            if lr is None:
                row.append("diverged at both lrs")
                continue
            s = summary(agg[(mo, sp, lr)]["methods"][m])
            other = [k for k in agg if k[0] == mo and k[1] == sp and k[2] != lr]
            bad = any(summary(agg[k]["methods"][m])["diverged"] for k in other if m in agg[k]["methods"])
            row.append(f"{s['loss']:.3f} ({100 * s['acc']:.1f}%) at {lr:g}" + (" [diverged at the other lr]" if bad else ""))
        row.insert(1, None if ratio is None else round(ratio, 3))
        for mo in MODELS:
            for r in rates:
                t = next((t for t in timings if t["model"] == mo and t["rate_label"] == r), None)
                if t is not None:
                    row.append(round(t["median"][m] / t["median"]["all-reduce"], 2) if m in t["median"] else None)
        rows.append(row)
    return cols, rows


def markdown(columns: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))

    return "\n".join(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
                     + ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows])


def rounded(obj: Any, digits: int = 5) -> Any:
    """``obj`` with every float rounded to ``digits`` significant digits (a smaller results file)."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}") if math.isfinite(obj) else obj
    if isinstance(obj, list):
        return [rounded(v, digits) for v in obj]
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    return obj


def stage_report(args: argparse.Namespace, work: Path, *, write: bool) -> None:
    cells = read_jsonl(work / "train.jsonl")
    timings = read_jsonl(work / "time.jsonl")
    if not cells:
        raise SystemExit(f"no training results in {work}")
    agg = aggregate(cells)
    rows, trows = tables(agg, timings, args.methods)
    scols, srows = summary_table(agg, timings, args.methods)
    print(markdown(COLUMNS, rows))
    if trows:
        print(markdown(TIME_COLUMNS, trows))
    print(markdown(scols, srows))
    models = [m for m in MODELS if any(k[0] == m for k in agg)]
    splits = [s for s in SPLITS if any(k[1] == s for k in agg)]
    for c in cells:
        for m, cur in c["curves"].items():
            if cur["diverged_at"] is None and not all(math.isfinite(v) for v in cur["train_loss"]):
                raise SystemExit(f"{m}: a non-finite loss was not marked as diverged")
    if not write:
        return
    seeds = sorted({c["seed"] for c in cells})
    import torch

    path = HERE.parent / "benches" / "results" / "bench_ddp_compare.json" if args.json is None else Path(args.json)
    sys.path.insert(0, str(HERE))
    import record

    loads = [c["load_after"][0] for c in cells]
    record.write_table(
        "bench_ddp_compare",
        title="DDP compression hooks compared: training loss and accuracy against steps, bytes per rank and wall-clock seconds "
              "on a rate-limited network",
        columns=COLUMNS, rows=rows,
        reference="DDP's all-reduce trained from the same initial point on the same minibatches (its final loss and bytes)",
        notes=(f"{cells[0]['ranks']} gloo ranks on a {os.cpu_count()}-core machine, one torch thread each; Fashion-MNIST; plain SGD, "
               f"batch {cells[0]['batch']} per rank; seeds {seeds}; steps {sorted({c['steps'] for c in cells})}. Bytes per rank: "
               "what a rank hands to the collectives, priced as ring algorithms send them (all-reduce 2(n-1)/n·b, all-gather "
               "(n-1)·b, all-to-all what leaves the rank). 'PermK sharded' counts its all-to-all and its parameters' all-gather. "
               f"Load (1-min) after each cell: {min(loads):.1f}-{max(loads):.1f}. torch {torch.__version__}."),
        path=path,
        extra={"seeds": seeds, "lrs": {m: args.lrs[m] for m in models}, "methods": args.methods, "models": MODELS,
               "timing": {"columns": TIME_COLUMNS, "rows": trows,
                          "notes": "ranks in a network namespace whose loopback is limited by tc tbf (all ranks share the "
                                   f"limit); every method's step interleaved, slowest rank, median of {args.time_reps} after 2 "
                                   "warm-up steps; seconds to the target = the first evaluated step whose mean loss reaches "
                                   "all-reduce's final loss (iid shards, each method's better lr) × the median step time."},
               "summary": {"columns": scols, "rows": srows}, "curves": rounded(cells), "timings": rounded(timings),
               # earlier runs of the wall-clock stage kept beside this one (time-*.jsonl), for their spread
               "timings_earlier": {p.stem: read_jsonl(p) for p in sorted(work.glob("time-*.jsonl"))}},
    )
    print(f"wrote {path}")
    Path(args.figures).mkdir(parents=True, exist_ok=True)
    for p in figures(agg, timings, args.methods, models, splits, Path(args.figures), args.lrs):
        print(f"wrote {p}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="a tiny run (seconds): 2 ranks, few steps, no namespace, no files")
    ap.add_argument("--stage", choices=["all", "train", "time", "report"], default="all")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--splits", nargs="+", default=SPLITS, choices=SPLITS)
    ap.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, nargs=2, default=[300, 300], metavar=("TWO_LAYER", "MLP"))
    ap.add_argument("--batch", type=int, default=32, help="minibatch per rank (default 32)")
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-samples", type=int, default=2048, help="training and test samples evaluated (default 2048 each)")
    ap.add_argument("--samples", type=int, default=None, help="use the first SAMPLES training images (default all 60,000)")
    ap.add_argument("--data", default=None, help="MNIST-format directory (default: Debian's Fashion-MNIST)")
    ap.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"], help="loopback rates, tc's syntax")
    ap.add_argument("--time-reps", type=int, default=7)
    ap.add_argument("--work", default=str(WORK), help=f"where the stages' raw results go (default {WORK.relative_to(HERE.parent)})")
    ap.add_argument("--json", default=None)
    ap.add_argument("--figures", default=str(FIGURES))
    ap.add_argument("--inner", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench_ddp_compare needs PyTorch (pip install 'permk[torch]'): skipped")
        return 0
    if args.inner:
        inner(json.loads(Path(args.inner[0]).read_text()), int(args.inner[1]))
        return 0
    try:
        load_data(args.data, 10)
    except (OSError, ValueError) as exc:  # DataNotFoundError is an OSError
        print(f"bench_ddp_compare needs Fashion-MNIST (Debian's dataset-fashion-mnist, or --data DIR): skipped ({exc})")
        return 0
    args.lrs = dict(LRS)
    args.steps = {"two-layer": args.steps[0], "mlp": args.steps[1]}
    if args.smoke:
        args.ranks, args.models, args.seeds, args.batch, args.eval_every = 2, ["two-layer"], [0], 8, 3
        args.steps, args.samples, args.eval_samples, args.lrs = {"two-layer": 6}, 2000, 256, {"two-layer": [0.5]}
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            stage_train(args, Path(tmp))
            stage_report(args, Path(tmp), write=False)
            cells = read_jsonl(Path(tmp) / "train.jsonl")
            got = {m for c in cells for m in c["curves"]}
            if got != set(args.methods) or len(cells) != len(args.splits):
                print(f"smoke: expected every method in every cell, got {sorted(got)} in {len(cells)} cells", file=sys.stderr)
                return 1
            for c in cells:
                for m, cur in c["curves"].items():
                    if cur["diverged_at"] is not None or cur["bytes"][-1] <= 0:
                        print(f"smoke: {m} ({c['split']}) diverged or sent nothing", file=sys.stderr)
                        return 1
            print(f"smoke run passed in {time.perf_counter() - t0:.0f} s")
        return 0
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.stage in ("all", "train"):
        stage_train(args, work)
    if args.stage in ("all", "time"):
        stage_time(args, work)
    if args.stage in ("all", "report"):
        stage_report(args, work, write=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
