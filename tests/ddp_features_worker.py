"""One rank of the DDP hook's feature tests (run by tests/test_torch_hook.py, one process per rank).

``python ddp_features_worker.py STORE_FILE RANK WORLD OUT_JSON``: joins a gloo group through the
FileStore ``STORE_FILE`` and runs five sections, writing one JSON object of records per section:

* ``dtypes`` — the plain hook on bfloat16 and float16 gradients: every exchange's output against
  a reference that applies the compressor's recipe with each operation rounded to the dtype
  (computed in float64 and rounded, independently of the hook), and its distance to
  ``compressor.aggregate`` of the same values in float64;
* ``shifted`` — the DIANA-shifted and EF21 hooks (float64): every exchange's mean, the estimate
  the hook returns, this rank's shift and the mirror, against ``permk.exchanges.shifted`` /
  ``error_feedback`` run by the simulator on all ranks' gradients, step after step;
* ``resume`` — a DIANA hook checkpointed after two steps (``state_dict`` and ``pickle``) and
  resumed in a new DDP model, against the run that went on;
* ``sharded`` — :class:`permk.torch.ShardedOptimizer`: each rank's shard of the mean against
  ``compressor.aggregate`` restricted to the shard, the bytes it sent, and the parameters of a
  training run against DDP with the unsharded hook, step by step;
* ``marina`` — :class:`permk.torch.Marina`: each compressed round's mean against
  ``compressor.aggregate`` of every rank's minibatch difference, the estimator's update, the coin.

``PERMK_TEST_DEVICE`` (default ``cpu``) and ``PERMK_TEST_BACKEND`` (default ``gloo``) say where
the models live and which backend moves the numbers (tests/gpu/gpu_checks.py sets ``cuda``).
"""

from __future__ import annotations

import functools
import io
import json
import os
import pickle
import sys
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import permk
import permk.exchanges as ex
import permk.torch as pt
from permk.torch.hook import bucket_seed
from permk.transport import Simulator

SIZES = (13, 8, 6, 21)
STEPS = 3
#: where the models live and which backend moves the numbers (tests/gpu/gpu_checks.py sets cuda)
DEVICE = torch.device(os.environ.get("PERMK_TEST_DEVICE", "cpu"))
BACKEND = os.environ.get("PERMK_TEST_BACKEND", "gloo")


def ddp(module: torch.nn.Module, **kw: Any) -> torch.nn.parallel.DistributedDataParallel:
    module = module.to(DEVICE)
    ids = [DEVICE.index or 0] if DEVICE.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids, **kw)


def host(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


class Model(torch.nn.Module):
    """Parameters whose gradients are the given vectors (one bucket each)."""

    def __init__(self, dtype: torch.dtype, sizes: tuple[int, ...] = SIZES) -> None:
        super().__init__()
        self.ps = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(s, dtype=dtype)) for s in sizes)

    def forward(self, gs: list[torch.Tensor]) -> torch.Tensor:
        return sum((p * g).sum() for p, g in zip(self.ps, gs))  # gradient of p: g


def grads(step: int, rank: int, dtype: torch.dtype, sizes: tuple[int, ...] = SIZES) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(s, generator=gen, dtype=torch.float64).mul_(3.7).to(dtype).to(DEVICE) for s in sizes]


def run_hook(state: Any, hook: Any, dtype: torch.dtype, world: int, rank: int, steps: range, model: Any = None,
             sizes: tuple[int, ...] = SIZES) -> tuple[Any, list[dict[str, Any]]]:
    """Train ``Model`` with the hook for ``steps``; every exchange's bucket, input and output."""
    model = model or ddp(Model(dtype), bucket_cap_mb=1e-6)
    seen: list[dict[str, Any]] = []

    def recording(st, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations against the classes
        local = bucket.buffer().clone()
        fut = hook(st, bucket)
        call = st.calls[-1]
        b = st._buckets[call.bucket]

        def keep(done: Any) -> Any:
            res = done.value()
            rec = {"call": call, "local": local, "out": res.clone()}
            if st.shift is not None:
                sh = next(iter(st.shifts[call.bucket].values()))
                rec.update(mean=b.transport._mean.clone(), h=sh.h.clone(), hbar=sh.hbar.clone())
            seen.append(rec)
            return res

        return fut.then(keep)

    model.register_comm_hook(state, recording)
    out = []
    for step in steps:
        model.zero_grad()
        model(grads(step, rank, dtype, sizes)).backward()
        for rec in sorted(seen, key=lambda s: s["call"].bucket):
            rec["step"] = step
            out.append(rec)
        seen.clear()
    return model, out


def gathered(t: torch.Tensor, world: int) -> np.ndarray:
    everyone = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(everyone, t.contiguous())
    return host(torch.stack(everyone).to(torch.float64))


def rounded(a: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(a)).to(dtype).to(torch.float64).numpy()


def reference(comp: Any, X: np.ndarray, seed: int, rnd: int, dtype: torch.dtype) -> np.ndarray:
    """The compressor's recipe, each operation rounded to ``dtype``: values ``scale·x`` (the float64
    product rounded once), a disjoint round's ``(v + 0)/n`` placed, else summed in worker order
    from zero, then divided by ``n``."""
    n, d = X.shape
    plan = comp.plan(n, d, seed=seed, round=rnd)
    disjoint = plan.disjoint
    acc = np.zeros(d)
    for w in range(n):
        c = plan.worker(w)
        v = rounded(X[w, c] * plan.scales[w], dtype)
        acc[c] = rounded((v + 0.0) / n, dtype) if disjoint else rounded(acc[c] + v, dtype)
    return acc if disjoint else rounded(acc / n, dtype)


def section_dtypes(world: int, rank: int) -> list[dict[str, Any]]:
    records = []
    for name, comp in (("PermK", permk.PermK()), (f"BlockPermK({world})", permk.BlockPermK(world)), ("RandK(3)", permk.RandK(3))):
        for dtype in (torch.bfloat16, torch.float16):
            state, hook = pt.comm_hook(comp, seed=11)
            _, recs = run_hook(state, hook, dtype, world, rank, range(STEPS))
            for rec in recs:
                call = rec["call"]
                X = gathered(rec["local"], world)
                want = reference(comp, X, call.seed, call.round, dtype)
                got = host(rec["out"].to(torch.float64))
                agg = comp.aggregate(X, seed=call.seed, round=call.round)
                eps = float(torch.finfo(dtype).eps)  # each of at most n + 2 roundings errs by eps/2 of the magnitudes summed
                scale = comp.aggregate(np.abs(X), seed=call.seed, round=call.round)
                records.append({"case": name, "dtype": str(dtype), "equal": bool(np.array_equal(got, want)),
                                "close": bool(np.all(np.abs(got - agg) <= (world + 2) * eps / 2 * scale)),
                                "padded": call.padded, "itemsize": rec["local"].element_size()})
    return records


class Stub:
    """A problem whose workers' gradients are the rows given (the simulator's side of the test)."""

    def __init__(self, G: np.ndarray) -> None:
        self.G = G
        self.n, self.d = G.shape
        self.x0 = np.zeros(self.d)

    def loss(self, x: np.ndarray) -> float:
        return 0.0

    def grad(self, x: np.ndarray) -> np.ndarray:
        return self.G.mean(axis=0)

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        return self.G


def section_shifted(world: int, rank: int) -> list[dict[str, Any]]:
    records = []
    cases = [("diana", "PermK", permk.PermK(), None), ("diana", "RandK(3)", permk.RandK(3), 0.3),
             ("ef21", "TopK(3)", permk.TopK(3), None), ("ef21", "PermK", permk.PermK(), None)]
    for shift, name, comp, alpha in cases:
        state, hook = pt.comm_hook(comp, seed=7, shift=shift, alpha=alpha)
        _, recs = run_hook(state, hook, torch.float64, world, rank, range(STEPS))
        sims: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for rec in recs:
            call = rec["call"]
            G = gathered(rec["local"], world)
            H, hbar = sims.get(call.bucket, (np.zeros((world, call.d)), np.zeros(call.d)))
            if hbar.shape != (call.d,):  # DDP rebuilt its buckets: the hook's shift starts again from zero
                H, hbar = np.zeros((world, call.d)), np.zeros(call.d)
            sim = Simulator(Stub(G))
            a = state._alpha(call.d)
            if shift == "ef21":
                mean, H = ex.error_feedback(sim, comp, H, sim.problem.x0, seed=call.seed, round=call.round)
            else:
                mean, H = ex.shifted(sim, comp, H, sim.problem.x0, alpha=a, seed=call.seed, round=call.round)
            est = hbar + mean
            hbar = hbar + a * mean
            sims[call.bucket] = (H, hbar)
            records.append({
                "case": f"{shift} {name}", "bucket": call.bucket, "round": call.round,
                "mean": bool(np.array_equal(host(rec["mean"]), mean)),
                "estimate": bool(np.array_equal(host(rec["out"]), est)),
                "h": bool(np.array_equal(host(rec["h"]), H[rank])),
                "hbar": bool(np.array_equal(host(rec["hbar"]), hbar)),
                "nonzero": bool(np.any(mean != 0)),
            })
        records.append({"case": f"{shift} {name}", "resets": state.resets, "buckets": len(state.rounds)})
    return records


def section_resume(world: int, rank: int) -> list[dict[str, Any]]:
    """One bucket whose layout DDP keeps when it rebuilds (one parameter), so that a resumed run
    meets the layout it saved at once."""
    comp = permk.PermK()

    def model() -> Any:
        return ddp(Model(torch.float64, (48,)))

    def steps(st: Any, hk: Any, rng: range) -> list[dict[str, Any]]:
        m = model()
        return run_hook(st, hk, torch.float64, world, rank, rng, model=m, sizes=(48,))[1]

    state, hook = pt.comm_hook(comp, seed=3, shift="diana")
    straight = steps(state, hook, range(4))
    state, hook = pt.comm_hook(comp, seed=3, shift="diana")
    first = steps(state, hook, range(2))
    buf = io.BytesIO()
    torch.save(state.state_dict(), buf)
    pickled = pickle.dumps(state)
    records = []
    for how in ("state_dict", "pickle"):
        if how == "state_dict":
            resumed, hook = pt.comm_hook(comp, seed=3, shift="diana")
            buf.seek(0)
            resumed.load_state_dict(torch.load(buf, weights_only=True))
        else:
            resumed = pickle.loads(pickled)
        rounds = dict(resumed.rounds)
        rest = steps(resumed, hook, range(2, 4))
        records.append({
            "how": how, "rounds": rounds == state.rounds == {0: 2}, "resets": (state.resets, resumed.resets),
            "outputs": [bool(torch.equal(a["out"], b["out"])) for a, b in zip(straight, first + rest)],
            "same_calls": [(a["call"].bucket, a["call"].round) == (b["call"].bucket, b["call"].round) for a, b in zip(straight, first + rest)],
            "count": (len(straight), len(first + rest)),
        })
    return records


def section_sharded(world: int, rank: int) -> list[dict[str, Any]]:
    records = []
    d = 1001
    for name, comp in (("PermK", permk.PermK()), (f"BlockPermK({world})", permk.BlockPermK(world)), ("RandK(40)", permk.RandK(40))):
        for dtype in (torch.float32, torch.float64):
            p = torch.nn.Parameter(torch.zeros(d, dtype=dtype, device=DEVICE))
            opt = pt.ShardedOptimizer([p], comp, functools.partial(torch.optim.SGD, lr=0.1), seed=5)
            lo, hi = int(opt.bounds[rank]), int(opt.bounds[rank + 1])
            for step in range(STEPS):
                g = torch.randn(d, generator=torch.Generator().manual_seed(10 * step + rank), dtype=torch.float64).to(dtype).to(DEVICE)
                p.grad = g.clone()
                r = opt.round
                got = opt.shard_mean()
                agg = comp.aggregate(gathered(g, world).astype(np.float32 if dtype == torch.float32 else np.float64),
                                     seed=bucket_seed(5, 0), round=r)
                records.append({"case": name, "dtype": str(dtype), "kind": "shard",
                                "equal": bool(np.array_equal(host(got), agg[lo:hi])) and got.dtype == dtype})
            records.append({"case": name, "dtype": str(dtype), "kind": "bytes", "exchanged": opt.bytes_exchanged,
                            "reduce_scatter": opt.reduce_scatter_bytes() * STEPS, "d": d, "itemsize": p.element_size()})
    # the trajectory: DDP with the unsharded hook against the sharded optimizer (SGD with momentum)
    for name, comp in (("PermK", permk.PermK()), ("RandK(40)", permk.RandK(40))):
        torch.manual_seed(0)
        init = torch.randn(d, dtype=torch.float64).to(DEVICE)
        X = torch.randn(8, d, generator=torch.Generator().manual_seed(rank), dtype=torch.float64).to(DEVICE)

        def loss(w: torch.Tensor) -> torch.Tensor:
            return ((X @ w).tanh() ** 2).sum()

        a = torch.nn.Linear(d, 1, bias=False, dtype=torch.float64, device=DEVICE)
        with torch.no_grad():
            a.weight.copy_(init.view(1, -1))
        model = ddp(a)
        state, hook = pt.comm_hook(comp, seed=5)
        model.register_comm_hook(state, hook)
        sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        w = torch.nn.Parameter(init.clone())
        sharded = pt.ShardedOptimizer([w], comp, functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9), seed=5)
        same = []
        for _ in range(4):
            sgd.zero_grad()
            (model(X).tanh() ** 2).sum().backward()  # loss(weight), through DDP's forward
            sgd.step()
            sharded.zero_grad()
            loss(w).backward()
            sharded.step()
            same.append(bool(torch.equal(model.module.weight.detach().view(-1), w.detach())))
        records.append({"case": name, "kind": "trajectory", "same": same, "moved": bool(not torch.equal(w.detach(), init))})
    return records


def section_marina(world: int, rank: int) -> list[dict[str, Any]]:
    """permk.torch.Marina: on tails the compressed mean of the minibatch differences is
    compressor.aggregate of every rank's ∇f_B(x^{t+1}) − ∇f_B(x^t) (recomputed here), and
    g^{t+1} = g^t + that mean; on heads the average gradient; the coin is MARINA's."""
    from permk._core import coin

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).to(torch.float64).to(DEVICE)
    gen = torch.Generator().manual_seed(rank)
    X, Y = torch.randn(40, 6, generator=gen, dtype=torch.float64).to(DEVICE), torch.randn(40, 2, generator=gen, dtype=torch.float64).to(DEVICE)
    comp = permk.PermK()
    helper = pt.Marina(net.parameters(), comp, torch.optim.SGD(net.parameters(), lr=0.1), seed=4, p=0.3)
    records = []
    batch = {"i": 0}

    def closure() -> torch.Tensor:
        i = batch["i"]
        loss = ((net(X[i : i + 8]) - Y[i : i + 8]) ** 2).mean()
        loss.backward()
        return loss

    def flat_grad_at(x: torch.Tensor) -> torch.Tensor:
        torch.nn.utils.vector_to_parameters(x, net.parameters())
        net.zero_grad()
        closure()
        return torch.nn.utils.parameters_to_vector([q.grad for q in net.parameters()])

    losses = []
    for t in range(8):
        batch["i"] = 8 * (t % 4)
        g_before = None if helper.g is None else helper.g.clone()
        x_prev = torch.nn.utils.parameters_to_vector(net.parameters()).detach().clone()
        losses.append(float(helper.step(closure).detach()))
        x_new = torch.nn.utils.parameters_to_vector(net.parameters()).detach().clone()
        heads = bool(coin(4, t, 0.3))
        rec = {"round": t, "heads": heads, "coin_count": helper.heads}
        if not heads:
            diff = flat_grad_at(x_new) - flat_grad_at(x_prev)
            torch.nn.utils.vector_to_parameters(x_new, net.parameters())
            agg = comp.aggregate(gathered(diff, world), seed=4, round=t)
            rec["mean"] = bool(np.array_equal(host(helper.last_mean), agg))
            if g_before is not None:  # (at round 0 g^0 is formed inside the step)
                rec["g"] = bool(torch.equal(helper.g, g_before + helper.last_mean))
        records.append(rec)
    records.append({"losses": losses, "round": helper.round, "p": helper.p})
    return records


def main() -> None:
    store_file, rank, world, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if DEVICE.type == "cuda":
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(BACKEND, store=dist.FileStore(store_file, world), rank=rank, world_size=world)
    result = {name: fn(world, rank) for name, fn in (("dtypes", section_dtypes), ("shifted", section_shifted),
                                                     ("resume", section_resume), ("sharded", section_sharded),
                                                     ("marina", section_marina))}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
