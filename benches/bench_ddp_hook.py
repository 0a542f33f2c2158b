"""Benchmark: a DistributedDataParallel training step with permk's hook, against the all-reduce step.

``--ranks`` gloo processes on this machine (loopback; one torch thread each) train the same MLP
(float32; ``--sizes`` parameters, about 1 M and 7 M) with SGD, one DDP model per method, all
initialised alike. Methods: DDP's own all-reduce (the reference), torch's fp16 compression hook,
and permk's hook with PermK, BlockPermK(n) and — to show what the plan costs — PermK with the plan
computed when the bucket arrives (``lookahead=False``) or started ahead as the bucket arrives
(overlapping the collective, rather than once the exchange is done) and — to show what the native placement
saves — PermK on the torch path (coordinate tensors, ``index_select``/``index_copy_``: the hook
before native placement, the same bits); optionally the DIANA-shifted PermK hook (``--shifted``). Two bucket layouts: one bucket for the whole model, and DDP buckets of a quarter
of the model (``bucket_cap_mb``) — several buckets.

A step is ``zero_grad``, forward, backward (DDP's buckets communicate inside it) and
``optimizer.step()``, after a barrier; its time is the slowest rank's. Steps are **interleaved**:
each repetition times one step of every method in turn (after ``--warmup`` steps each), so the
machine's load affects all methods alike; the table gives each method's median step and its ratio
to the all-reduce step's median measured in the same run.

    python benches/bench_ddp_hook.py [--ranks 4] [--sizes 1000000 7000000] [--reps 12] [--json PATH]
    python benches/bench_ddp_hook.py --smoke        # tiny sizes, seconds; no table unless --json

Writes ``benches/results/bench_ddp_hook.json`` (:mod:`record`) unless ``--smoke``.
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
from typing import Any

HERE = Path(__file__).resolve().parent


def hidden_for(d: int, din: int, dout: int) -> int:
    """The hidden width h of Linear(din, h), Linear(h, h), Linear(h, dout) with about d parameters."""
    a, b, c = 1.0, din + dout + 3.0, dout - d
    return max(4, int((-b + math.sqrt(b * b - 4 * a * c)) / 2))


def inner(spec: dict[str, Any], rank: int, store: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    import permk
    import permk.torch as pt

    torch.set_num_threads(1)
    world = spec["ranks"]
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    din, dout, batch = spec["din"], 10, spec["batch"]
    results = []
    for d_target in spec["sizes"]:
        h = hidden_for(d_target, din, dout)

        def model() -> torch.nn.Module:
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(din, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(),
                                       torch.nn.Linear(h, dout))

        d = sum(p.numel() for p in model().parameters())
        gen = torch.Generator().manual_seed(100 + rank)
        X, Y = torch.randn(batch, din, generator=gen), torch.randint(0, dout, (batch,), generator=gen)
        for layout in spec["layouts"]:
            cap = 4 * d / 2**20 * (1.1 if layout == "1 bucket" else 0.25)
            methods = {}
            for name in spec["methods"]:
                ddp = torch.nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=cap)
                state = None
                if name == "fp16":
                    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
                elif name != "all-reduce":
                    comp = {"PermK": permk.PermK(), "PermK (plan on arrival)": permk.PermK(), "DIANA-PermK": permk.PermK(),
                            "PermK (torch placement)": permk.PermK(), "PermK (ahead from arrival)": permk.PermK(),
                            f"BlockPermK({world})": permk.BlockPermK(world)}[name]
                    state, hook = pt.comm_hook(comp, seed=1, lookahead=name != "PermK (plan on arrival)",
                                               shift="diana" if name == "DIANA-PermK" else None)
                    state._native = name != "PermK (torch placement)"
                    state._defer = name != "PermK (ahead from arrival)"
                    ddp.register_comm_hook(state, hook)
                opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
                methods[name] = (ddp, opt, state)

            def step(name: str) -> float:
                ddp, opt, _ = methods[name]
                dist.barrier()
                t0 = time.perf_counter()
                opt.zero_grad()
                torch.nn.functional.cross_entropy(ddp(X), Y).backward()
                opt.step()
                dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                return float(dt)

            for name in methods:
                for _ in range(spec["warmup"]):
                    step(name)
            times: dict[str, list[float]] = {name: [] for name in methods}
            for _ in range(spec["reps"]):
                for name in methods:
                    times[name].append(step(name))
            buckets = {name: (len(st.rounds) if st is not None else None) for name, (_, _, st) in methods.items()}
            nb = next((b for b in buckets.values() if b), None)
            results.append({"d": d, "layout": layout, "buckets": nb, "times": times})
            methods.clear()  # the models and their hooks go before the next layout
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def phases(sizes: list[int], n: int, reps: int, threads: int) -> list[list[Any]]:
    """Where a PermK / BlockPermK(n) round's time goes on one rank (no communication): the native
    plan, its arrays for the device (coordinates, padding; none for a natively placed round), packing
    this rank's values and placing all ranks' values, as ratios to a copy of the d float32 values
    measured alongside (medians). PermK twice: natively placed (placement ``native``, the hook's
    path for float32/float64 CPU buckets) and on the torch path (``padded``)."""
    import torch

    import permk
    import permk.parallel
    from permk.transport.ddp import device_round

    torch.set_num_threads(1)
    permk.parallel.limit_threads(threads)  # a rank's permk threads in the DDP runs
    rows = []
    for d in sizes:
        x, y = torch.randn(d), torch.empty(d)
        # PermK natively placed (the hook's path for float32 CPU buckets) and on the torch path
        for comp, dtype in ((permk.PermK(), x.dtype), (permk.PermK(), None), (permk.BlockPermK(n), x.dtype)):
            t: dict[str, list[float]] = {k: [] for k in ("copy", "plan", "arrays", "pack", "place")}
            for rep in range(reps):
                t0 = time.perf_counter()
                y.copy_(x)
                t1 = time.perf_counter()
                rnd = comp.round(n, d, seed=1, round=rep)
                t2 = time.perf_counter()
                dr = device_round(rnd, 0, torch.device("cpu"), dtype=dtype)
                t3 = time.perf_counter()
                send, recv = torch.empty(dr.width), torch.randn(n * dr.width)
                t4 = time.perf_counter()
                dr.gather(x.view(1, -1), 0, divide=n, out=send[: int(dr.counts[0])])
                t5 = time.perf_counter()
                dr.place(recv, y)
                t6 = time.perf_counter()
                for k, v in zip(t, (t1 - t0, t2 - t1, t3 - t2, t5 - t4, t6 - t5)):
                    t[k].append(v)
            copy = statistics.median(t["copy"])
            for k in ("plan", "arrays", "pack", "place"):
                med = statistics.median(t[k])
                rows.append([d, comp.name, k, dr.placement, round(med * 1e3, 3), round(med / copy, 2)])
    return rows


def torch_version() -> str:
    import torch

    return str(torch.__version__)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 7_000_000])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--shifted", action="store_true", help="also time the DIANA-shifted PermK hook")
    ap.add_argument("--methods", nargs="+", help="only these methods (all-reduce always; default: all)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes and few steps (seconds); no table unless --json")
    ap.add_argument("--json", help="where to write the table (default benches/results/bench_ddp_hook.json)")
    ap.add_argument("--phases-only", action="store_true", help="only the table of where a round's time goes (one process)")
    ap.add_argument("--inner", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench_ddp_hook needs PyTorch (pip install 'permk[torch]'): skipped")
        return
    if args.inner:
        spec_path, rank, store = args.inner
        spec = json.loads(Path(spec_path).read_text())
        inner(spec, int(rank), store, spec["out"])
        return
    if args.smoke:
        args.ranks, args.sizes, args.reps, args.warmup, args.batch = 2, [20_000], 2, 1, 8
    n = args.ranks
    from permk.parallel import threads_per_process

    permk_threads = threads_per_process(n)
    phase_rows = phases(args.sizes, n, max(3, args.reps), permk_threads)
    print("| d | compressor | phase | placement | ms (median) | ratio to a copy of d float32 |\n|---|---|---|---|---|---|")
    for r in phase_rows:
        print("| " + " | ".join(f"{v:,}" if isinstance(v, int) else str(v) for v in r) + " |")
    if args.phases_only:
        return
    methods = (["all-reduce", "fp16", "PermK", f"BlockPermK({n})", "PermK (plan on arrival)", "PermK (ahead from arrival)",
                "PermK (torch placement)"]
               + (["DIANA-PermK"] if args.shifted else []))
    if args.methods:
        methods = ["all-reduce"] + [m for m in args.methods if m != "all-reduce"]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        spec = {"ranks": n, "sizes": args.sizes, "din": 1024, "batch": args.batch, "reps": args.reps, "warmup": args.warmup,
                "layouts": ["1 bucket", "4 buckets"], "methods": methods, "out": out}
        spec_path = os.path.join(tmp, "spec.json")
        Path(spec_path).write_text(json.dumps(spec))
        # one torch thread per rank, and permk's threads by its own rule (cores // ranks, at least 1)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PERMK_THREADS": str(permk_threads)}
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, __file__, "--inner", spec_path, str(r), os.path.join(tmp, "store")], env=env)
                 for r in range(n)]
        codes = [p.wait() for p in procs]
        if any(codes):
            sys.exit(f"a rank failed: exit codes {codes}")
        results = json.loads(Path(out).read_text())
        wall = time.perf_counter() - t0
    rows = []
    print("| d | buckets | method | step ms (median) | ratio to all-reduce |\n|---|---|---|---|---|")
    for res in results:
        ref = statistics.median(res["times"]["all-reduce"])
        for name in methods:
            med = statistics.median(res["times"][name])
            label = f"{res['layout']} ({res['buckets']})" if res["buckets"] else res["layout"]
            rows.append([res["d"], label, name, round(med * 1e3, 2), round(med / ref, 3)])
            print(f"| {res['d']:,} | {label} | {name} | {med * 1e3:.1f} | {med / ref:.2f} |")
    print(f"({wall:.0f} s, load {os.getloadavg()[0]:.1f})")
    if args.json or not args.smoke:
        sys.path.insert(0, str(HERE))
        from record import write_table

        path = write_table(
            "bench_ddp_hook",
            title="A DDP training step with permk's hook, against DDP's all-reduce step",
            columns=["d", "buckets", "method", "step_ms", "ratio"],
            rows=rows,
            reference="DDP's all-reduce step (no hook), median of interleaved steps in the same run",
            notes=(f"{n} gloo ranks on this machine (loopback), one torch thread and {permk_threads} permk thread(s) each; MLP "
                   f"Linear(1024,h)-ReLU-Linear(h,h)-ReLU-Linear(h,10), batch {args.batch} per rank, SGD; "
                   f"{args.reps} interleaved steps per method after {args.warmup} warm-up steps; a step's time is the "
                   "slowest rank's. 'plan on arrival': PermK's plan computed when the bucket arrives (lookahead=False); "
                   "'ahead from arrival': the next plan started when the bucket's round is taken (overlapping the "
                   "collective) instead of once its exchange is done; 'torch placement': PermK packed and placed with torch index ops on coordinate tensors (the hook before "
                   "native placement; the same bits); "
                   "'DIANA-PermK': the hook with shift='diana'. The buckets column: the layout asked for and, in "
                   f"parentheses, the bucket indices DDP used. torch {torch_version()}."),
            path=args.json,
            extra={"phases": {"columns": ["d", "compressor", "phase", "placement", "ms", "ratio_to_copy"], "rows": phase_rows,
                              "reference": "a copy of the d float32 values (torch, one thread), median alongside"},
                   "wall_seconds": round(wall, 1)},
        )
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
