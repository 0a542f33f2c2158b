"""The GPU checks of permk's DDP hook (issue 36 item 2), run by ``tests/gpu/run_gpu_checks.sh``.

``python tests/gpu/gpu_checks.py [--device cuda] [--quick]`` from the repository root, with the
package importable (``PYTHONPATH=python`` and the built ``python/permk/_core.abi3.so``, or an
installed permk). Prints one line per check and a PASS/FAIL summary; writes
``$OUT/gpu_checks.json`` when ``OUT`` is set. Exit status 0 when every check passed or was
skipped with its reason (no CUDA device: every check skipped), 1 otherwise.

Checks, on ``--device`` (default ``cuda``):

1. ``in-process``: the DDP transport's exchanges on the device for ``n`` = 2, 4 and 8 ranks held
   by one process (:class:`FakeGroup` stands in for the collectives: it copies what
   ``all_gather_into_tensor`` and ``all_to_all_single`` would, so everything else is the real
   code path — plans computed ahead on a thread and uploaded from pinned memory on a side stream,
   packing, placement, levels): the plain exchange against ``compressor.aggregate`` (float32 and
   float64 bit for bit; bfloat16/float16 against the recipe with each operation rounded to the
   dtype, and within (n + 2)/2 ulps of the float64 aggregate), DIANA and EF21 (TopK on the device)
   against the simulator's ``permk.exchanges.shifted``/``error_feedback`` (float64, bit for bit),
   and the sharded exchange against ``aggregate`` restricted to each shard;
2. ``nccl-world-1``: a DistributedDataParallel model on the GPU with the hook (plain and DIANA)
   and a ShardedOptimizer in an NCCL group of one process (returns at once);
3. ``multi-process``: 2 processes on the one GPU: NCCL when it accepts two ranks on one device
   (it usually refuses: the reason is recorded), else gloo with CUDA tensors; the DDP hook
   against ``aggregate`` (tests/ddp_hook_worker.py) and the dtypes, shifts, checkpoint and
   sharded sections (tests/ddp_features_worker.py), on the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


# ---------------------------------------------------------------------------------------------
# n ranks in one process
# ---------------------------------------------------------------------------------------------
class _Work:
    def __init__(self) -> None:
        self.fut: torch.futures.Future[Any] = torch.futures.Future()

    def get_future(self) -> torch.futures.Future[Any]:
        return self.fut

    def wait(self) -> bool:
        self.fut.wait()
        return True


class FakeRank:
    """One rank of a :class:`FakeGroup` (what a transport holds as its process group)."""

    def __init__(self, group: FakeGroup, rank: int) -> None:
        self.group, self.rank = group, rank


class FakeGroup:
    """``n`` ranks held by one process, taking turns: each collective completes (its futures
    resolved, their callbacks run) when the last rank has called it, with what the real one
    would have written. It stands in for ``torch.distributed`` in :mod:`permk.transport.ddp`
    (:meth:`patch`)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.ranks = [FakeRank(self, r) for r in range(n)]
        self._calls: dict[tuple[str, int], dict[int, tuple[Any, ...]]] = {}
        self._count: dict[tuple[str, int], int] = {}

    def _join(self, kind: str, rank: int, args: tuple[Any, ...], finish: Callable[[list[tuple[Any, ...]]], None]) -> _Work:
        """A rank's ``k``-th call of ``kind`` joins the ``k``-th such collective."""
        seq = self._count.get((kind, rank), 0)
        self._count[(kind, rank)] = seq + 1
        calls = self._calls.setdefault((kind, seq), {})
        work = _Work()
        calls[rank] = (*args, work)
        if len(calls) == self.n:
            del self._calls[(kind, seq)]
            ordered = [calls[r] for r in range(self.n)]
            finish(ordered)
            for c in ordered:
                c[-1].fut.set_result(None)
        return work

    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor, group: FakeRank, async_op: bool = True) -> _Work:
        def finish(calls: list[tuple[Any, ...]]) -> None:
            whole = torch.cat([c[1].reshape(-1) for c in calls])
            for c in calls:
                c[0].copy_(whole)

        return self._join("all_gather", group.rank, (out, inp.clone()), finish)

    def all_to_all_single(self, out: torch.Tensor, inp: torch.Tensor, output_split_sizes: list[int], input_split_sizes: list[int],
                          group: FakeRank, async_op: bool = True) -> _Work:
        def finish(calls: list[tuple[Any, ...]]) -> None:
            parts = [list(torch.split(c[1], c[3])) for c in calls]  # parts[src][dst]
            for dst, c in enumerate(calls):
                got = [parts[src][dst] for src in range(self.n)]
                assert [g.numel() for g in got] == list(c[2]), "output_split_sizes disagree with the senders'"
                if got:
                    c[0].copy_(torch.cat(got))

        return self._join("all_to_all", group.rank, (out, inp.clone(), list(output_split_sizes), list(input_split_sizes)), finish)

    def all_reduce(self, t: torch.Tensor, group: FakeRank | None = None, **kw: Any) -> None:
        raise NotImplementedError("all_reduce is not used by the checked exchanges")

    def patch(self) -> Any:
        """Put this group in :mod:`permk.transport.ddp`'s place of ``torch.distributed`` (a
        context manager)."""
        import contextlib

        import permk.transport.ddp as tddp

        @contextlib.contextmanager
        def cm() -> Any:
            real = tddp.dist
            tddp.dist = self  # type: ignore[assignment]
            try:
                yield self
            finally:
                tddp.dist = real

        return cm()


_EXECUTOR: Any = None  # one planner thread for every check, as a hook has


def transports(group: FakeGroup, comp: Any, d: int, seed: int, dtype: torch.dtype, device: torch.device,
               bounds: Any = None) -> list[Any]:
    """One DDP transport per rank of ``group`` (planners computing one round ahead on a thread)."""
    from permk.transport.ddp import DDPTransport, Planner

    global _EXECUTOR
    if _EXECUTOR is None:
        from concurrent.futures import ThreadPoolExecutor

        _EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="permk-plan")
    ex = _EXECUTOR
    out = []
    for r in range(group.n):
        planner = Planner(comp, group.n, r, d, seed, device, ex, "the check's bucket", bounds=bounds)
        floats = comp.floats_per_worker(group.n, d) if comp.capabilities.shared_plan else d
        if bounds is not None:
            floats = max(floats, int(bounds[1]))
        out.append(DDPTransport(group.ranks[r], group.n, r, d, dtype, device, planner, floats=floats, bounds=bounds))
    return out


def rounded(a: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(a)).to(dtype).to(torch.float64).numpy()


def recipe(comp: Any, X: np.ndarray, seed: int, rnd: int, dtype: torch.dtype) -> np.ndarray:
    """The compressor's average with each operation rounded to ``dtype`` (see ddp_features_worker)."""
    n, d = X.shape
    plan = comp.plan(n, d, seed=seed, round=rnd)
    acc = np.zeros(d)
    for w in range(n):
        c = plan.worker(w)
        v = rounded(X[w, c] * plan.scales[w], dtype)
        acc[c] = rounded((v + 0.0) / n, dtype) if plan.disjoint else rounded(acc[c] + v, dtype)
    return acc if plan.disjoint else rounded(acc / n, dtype)


def check_in_process(device: torch.device, quick: bool) -> dict[str, Any]:
    """Check 1 (see the module docstring): counts of exchanges compared, and the failures."""
    import permk
    import permk.exchanges as ex
    from permk.torch.sharded import shard_bounds
    from permk.transport import Simulator

    class Stub:
        def __init__(self, G: np.ndarray) -> None:
            self.G, (self.n, self.d) = G, G.shape
            self.x0 = np.zeros(self.d)

        def loss(self, x: Any) -> float:
            return 0.0

        def grad(self, x: Any) -> np.ndarray:
            return self.G.mean(axis=0)

        def local_grads(self, x: Any) -> np.ndarray:
            return self.G

    failures: list[str] = []
    compared = 0
    rng = np.random.default_rng(0)
    sizes = (13, 1000) if quick else (13, 1000, 4099, 100_003)
    for n in (2, 4, 8):
        comps = [("PermK", permk.PermK()), (f"BlockPermK({n})", permk.BlockPermK(n)), ("RandK(3)", permk.RandK(3))]
        comps += [("BlockPermK(2)", permk.BlockPermK(2))] if n >= 4 else []
        group = FakeGroup(n)
        with group.patch():
            for d in sizes:
                for name, comp in comps:
                    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
                        ts = transports(group, comp, d, 5, dtype, device)
                        for rnd in range(2):  # round 1 comes from the planner's thread
                            X = rng.standard_normal((n, d)) * 3.7
                            rows = [torch.tensor(X[r], dtype=dtype, device=device).view(1, -1) for r in range(n)]
                            futs = [ex.compressed_mean_rows(ts[r], comp, rows[r], seed=5, round=rnd) for r in range(n)]
                            outs = [f.wait().to(torch.float64).cpu().numpy() for f in futs]
                            Xd = torch.stack([r[0] for r in rows]).to(torch.float64).cpu().numpy()
                            if dtype in (torch.float32, torch.float64):
                                want = comp.aggregate(Xd.astype(np.float32 if dtype == torch.float32 else np.float64), seed=5, round=rnd)
                            else:
                                want = recipe(comp, Xd, 5, rnd, dtype)
                            compared += 1
                            if not all(np.array_equal(o, want) for o in outs):
                                failures.append(f"plain {name} n={n} d={d} {dtype} round {rnd}")
            # shifts (float64) against the simulator
            for shift, name, comp in (("diana", "PermK", permk.PermK()), ("diana", "RandK(3)", permk.RandK(3)),
                                      ("ef21", "TopK(3)", permk.TopK(3)), ("ef21", "PermK", permk.PermK())):
                d = 1000
                ts = transports(group, comp, d, 9, torch.float64, device)
                H = [torch.zeros(1, d, dtype=torch.float64, device=device) for _ in range(n)]
                Hs = np.zeros((n, d))
                alpha = 1.0 if shift == "ef21" else 1.0 / (comp.omega(n, d) + 1.0)
                for rnd in range(3):
                    G = rng.standard_normal((n, d))
                    futs = []
                    for r in range(n):
                        row = torch.tensor(G[r], device=device).view(1, -1)
                        h = ts[r].hand_over(H[r])
                        if shift == "ef21":
                            fut, _ = ex.error_feedback(ts[r], comp, h, row, seed=9, round=rnd)
                        else:
                            fut, _ = ex.shifted(ts[r], comp, h, row, alpha=alpha, seed=9, round=rnd)
                        futs.append(fut)
                    means = [f.wait().cpu().numpy() for f in futs]
                    sim = Simulator(Stub(G))
                    if shift == "ef21":
                        mean, Hs = ex.error_feedback(sim, comp, Hs, sim.problem.x0, seed=9, round=rnd)
                    else:
                        mean, Hs = ex.shifted(sim, comp, Hs, sim.problem.x0, alpha=alpha, seed=9, round=rnd)
                    compared += 1
                    ok = all(np.array_equal(m, mean) for m in means)
                    ok &= all(np.array_equal(H[r][0].cpu().numpy(), Hs[r]) for r in range(n))
                    if not ok:
                        failures.append(f"{shift} {name} n={n} round {rnd}")
            # the sharded exchange against aggregate restricted to each shard
            for name, comp in (("PermK", permk.PermK()), (f"BlockPermK({n})", permk.BlockPermK(n)), ("RandK(40)", permk.RandK(40))):
                for dtype in (torch.float32, torch.float64):
                    d = 1001
                    bounds = shard_bounds(d, n)
                    ts = transports(group, comp, d, 3, dtype, device, bounds=bounds)
                    for rnd in range(2):
                        X = rng.standard_normal((n, d))
                        rows = [torch.tensor(X[r], dtype=dtype, device=device).view(1, -1) for r in range(n)]
                        futs = [ex.compressed_mean_rows(ts[r], comp, rows[r], seed=3, round=rnd) for r in range(n)]
                        agg = comp.aggregate(torch.stack([r[0] for r in rows]).cpu().numpy(), seed=3, round=rnd)
                        compared += 1
                        if not all(np.array_equal(f.wait().cpu().numpy(), agg[bounds[r]:bounds[r + 1]]) for r, f in enumerate(futs)):
                            failures.append(f"sharded {name} n={n} {dtype} round {rnd}")
    # TopK on the device against the core's
    from permk.transport.ddp import topk_indices

    for d, k in ((1000, 7), (1000, 1000), (37, 0)):
        v = rng.standard_normal(d)
        v[::5] = 1.5  # ties
        got = topk_indices(torch.tensor(v, device=device), k).cpu().numpy()
        want = permk.TopK(max(k, 1)).compress(v, worker=0, n_workers=1, seed=0, round=0).indices if k else np.zeros(0)
        compared += 1
        if not np.array_equal(got, want):
            failures.append(f"topk d={d} k={k}")
    return {"compared": compared, "failures": failures}


# ---------------------------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------------------------
def run_ranks(script: Path, world: int, env: dict[str, str], tmp: Path, timeout: float, args: list[str] | None = None
              ) -> tuple[list[Any] | None, str]:
    """Run ``script`` on ``world`` processes (STORE RANK WORLD OUT); their JSON outputs, or None
    and the log when a rank failed."""
    store = tmp / f"store-{script.stem}-{time.monotonic_ns()}"
    outs = [tmp / f"{script.stem}-{world}-{r}.json" for r in range(world)]
    procs = [subprocess.Popen([sys.executable, str(script), str(store), str(r), str(world), str(outs[r]), *(args or [])],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return None, f"timed out after {timeout:.0f} s"
    if any(p.returncode for p in procs):
        return None, "\n".join(log[-3000:] for log in logs)
    return [json.loads(o.read_text()) for o in outs], ""


PROBE = r'''
import sys, torch, torch.distributed as dist
store, rank, world, out, backend = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
torch.cuda.set_device(0)
dist.init_process_group(backend, store=dist.FileStore(store, world), rank=rank, world_size=world)
x = torch.full((4,), float(rank), device="cuda")
y = torch.empty(4 * world, device="cuda")
dist.all_gather_into_tensor(y, x)
s = torch.arange(world, dtype=torch.float32, device="cuda") + 10 * rank
r = torch.empty(world, device="cuda")
dist.all_to_all_single(r, s)
torch.cuda.synchronize()
ok = y.cpu().tolist() == [float(i) for i in range(world) for _ in range(4)] and r.cpu().tolist() == [10.0 * i + rank for i in range(world)]
open(out, "w").write("true" if ok else "false")
dist.destroy_process_group()
'''

WORLD_ONE = r'''
import functools, json, sys, torch, torch.distributed as dist
import permk, permk.torch as pt
store, rank, world, out = sys.argv[1:5]
torch.cuda.set_device(0)
dist.init_process_group("nccl", store=dist.FileStore(store, 1), rank=0, world_size=1)
res = {}
for shift in (None, "diana"):
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8).cuda(), device_ids=[0])
    state, hook = pt.comm_hook(permk.PermK(), seed=0, shift=shift)
    model.register_comm_hook(state, hook)
    x = torch.randn(16, 64, device="cuda")
    model(x).square().sum().backward()
    ref = torch.nn.Linear(64, 8).cuda()
    ref.load_state_dict(model.module.state_dict())
    ref(x).square().sum().backward()
    res[str(shift)] = all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), ref.parameters())) and state.bytes_sent == 0
w = torch.nn.Parameter(torch.randn(101, device="cuda"))
opt = pt.ShardedOptimizer([w], permk.PermK(), functools.partial(torch.optim.SGD, lr=0.5), seed=0)
w.grad = torch.ones(101, device="cuda")
before = w.detach().clone()
opt.step()
res["sharded"] = bool(torch.equal(w.detach(), before - 0.5))
json.dump(res, open(out, "w"))
dist.destroy_process_group()
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="fewer sizes in the in-process check")
    ap.add_argument("--skip-processes", action="store_true", help="only the in-process check")
    ap.add_argument("--budget", type=float, default=220.0, help="seconds for all checks: a check that would start with "
                    "too little left is skipped, a running one is stopped (default 220)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    deadline = t_start + args.budget

    def left(want: float, need: float = 15.0) -> float | None:
        """The timeout for a check that wants ``want`` seconds: what is left of the budget, or None
        (too little: skipped) when under ``need``."""
        rest = deadline - time.perf_counter()
        return None if rest < need else min(want, rest)
    results: list[dict[str, Any]] = []

    def record(name: str, status: str, detail: Any = "", seconds: float = 0.0) -> None:
        results.append({"check": name, "status": status, "detail": detail, "seconds": round(seconds, 1)})
        print(f"[{status}] {name} ({seconds:.1f} s){': ' + str(detail)[:2000] if detail else ''}", flush=True)

    device = torch.device(args.device)
    env_info = {"torch": torch.__version__, "python": sys.version.split()[0], "cuda_available": torch.cuda.is_available()}
    if device.type == "cuda" and not torch.cuda.is_available():
        record("all", "SKIP", "no CUDA device (torch.cuda.is_available() is False): nothing to check here")
        return finish(results, env_info, t_start)
    if device.type == "cuda":
        env_info.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda, nccl=".".join(map(str, torch.cuda.nccl.version())),
                        gpus=torch.cuda.device_count())
    print(json.dumps(env_info), flush=True)

    t0 = time.perf_counter()
    try:
        got = check_in_process(device, args.quick)
        record("in-process exchanges (plain, bf16/fp16, DIANA, EF21+TopK, sharded; n = 2, 4, 8)",
               "PASS" if not got["failures"] else "FAIL", got if got["failures"] else f"{got['compared']} exchanges compared",
               time.perf_counter() - t0)
    except Exception:
        record("in-process exchanges", "FAIL", traceback.format_exc(), time.perf_counter() - t0)

    if device.type != "cuda" or args.skip_processes:
        return finish(results, env_info, t_start)
    base_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "python"), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        script = tmp / "world_one.py"
        script.write_text(WORLD_ONE)
        t0 = time.perf_counter()
        out, log = run_ranks(script, 1, base_env, tmp, left(60) or 1)
        if out is None:
            record("nccl-world-1 (DDP hook plain and DIANA, ShardedOptimizer)", "FAIL", log, time.perf_counter() - t0)
        else:
            record("nccl-world-1 (DDP hook plain and DIANA, ShardedOptimizer)", "PASS" if all(out[0].values()) else "FAIL", out[0],
                   time.perf_counter() - t0)

        probe = tmp / "probe.py"
        probe.write_text(PROBE)
        backend = None
        for cand in ("nccl", "gloo"):
            t0 = time.perf_counter()
            budget = left(45)
            if budget is None:
                record(f"probe: 2 ranks on one GPU with {cand}", "SKIP", "out of time")
                continue
            out, log = run_ranks(probe, 2, base_env, tmp, budget, [cand])
            if out is not None and all(out):
                record(f"probe: 2 ranks on one GPU with {cand} (all_gather_into_tensor, all_to_all_single on CUDA tensors)", "PASS",
                       "", time.perf_counter() - t0)
                backend = cand
                break
            why = log.strip().splitlines()[-1] if log.strip() else "wrong values"
            record(f"probe: 2 ranks on one GPU with {cand}", "INFO", f"refused: {why}", time.perf_counter() - t0)
        if backend is None:
            record("multi-process on one GPU", "FAIL", "neither NCCL nor gloo ran 2 ranks on one GPU")
            return finish(results, env_info, t_start)
        env = {**base_env, "PERMK_TEST_DEVICE": "cuda:0", "PERMK_TEST_BACKEND": backend}
        t0 = time.perf_counter()
        budget = left(90, 30)
        out, log = run_ranks(TESTS / "ddp_hook_worker.py", 2, env, tmp, budget) if budget else (None, "skipped: out of time")
        if out is None:
            record(f"multi-process DDP hook = aggregate ({backend}, 2 ranks, CUDA)", "FAIL", log, time.perf_counter() - t0)
        else:
            recs = [r for per in out for r in per]
            bad = [r for r in recs if not (r["equal"] and r["grads_equal"])]
            record(f"multi-process DDP hook = aggregate ({backend}, 2 ranks, CUDA)", "FAIL" if bad or not recs else "PASS",
                   bad[:3] if bad else f"{len(recs)} exchanges", time.perf_counter() - t0)
        t0 = time.perf_counter()
        budget = left(150, 40)
        out, log = run_ranks(TESTS / "ddp_features_worker.py", 2, env, tmp, budget) if budget else (None, "skipped: out of time")
        if out is None:
            record(f"multi-process features ({backend}, 2 ranks, CUDA)", "FAIL", log, time.perf_counter() - t0)
        else:
            bad = []
            for per in out:
                bad += [("dtypes", r) for r in per["dtypes"] if not (r["equal"] and r["close"])]
                bad += [("shifted", r) for r in per["shifted"] if "mean" in r and not (r["mean"] and r["estimate"] and r["h"] and r["hbar"])]
                bad += [("resume", r) for r in per["resume"] if not (r["rounds"] and all(r["outputs"]))]
                bad += [("sharded", r) for r in per["sharded"] if (r["kind"] == "shard" and not r["equal"])
                        or (r["kind"] == "trajectory" and not all(r["same"]))]
            record(f"multi-process features: bf16/fp16, DIANA/EF21 = simulator, checkpoint, sharded ({backend}, 2 ranks, CUDA)",
                   "FAIL" if bad else "PASS", bad[:4] if bad else "", time.perf_counter() - t0)
    return finish(results, env_info, t_start)


def finish(results: list[dict[str, Any]], env_info: dict[str, Any], t_start: float) -> int:
    failed = [r for r in results if r["status"] == "FAIL"]
    passed = [r for r in results if r["status"] == "PASS"]
    verdict = "FAIL" if failed else ("PASS" if passed else "SKIP")
    wall = time.perf_counter() - t_start
    print(f"\n== permk GPU checks: {verdict} — {len(passed)} passed, {len(failed)} failed, "
          f"{sum(r['status'] == 'SKIP' for r in results)} skipped ({wall:.0f} s) ==", flush=True)
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        Path(out_dir, "gpu_checks.json").write_text(json.dumps({"verdict": verdict, "seconds": round(wall, 1), "environment": env_info,
                                                                "checks": results}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
