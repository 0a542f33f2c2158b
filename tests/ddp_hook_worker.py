"""One rank of the DDP hook's equality test (run by tests/test_torch_hook.py, one process per rank).

``python ddp_hook_worker.py STORE_FILE RANK WORLD OUT_JSON``: joins a gloo group through the
FileStore ``STORE_FILE`` and, for every case (compressor × dtype), trains a model of several
parameters (one bucket each: sizes divisible and not divisible by the world size) for a few steps
with the permk hook. Each exchange's input (this rank's bucket) and output are recorded; the
inputs of all ranks are gathered and every output is compared bit for bit with
``compressor.aggregate`` of the stacked inputs at the exchange's seed and round, and with the
gradients DDP left in the bucket's parameters. Writes one JSON record per exchange.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import permk
import permk.torch as pt

SIZES = (13, 8, 6, 21)  # buckets of sizes divisible and not divisible by 2 and 4
STEPS = 3
#: where the model lives and which backend moves the numbers (tests/gpu/gpu_checks.py sets cuda)
DEVICE = torch.device(os.environ.get("PERMK_TEST_DEVICE", "cpu"))
BACKEND = os.environ.get("PERMK_TEST_BACKEND", "gloo")


def ddp(module: torch.nn.Module, **kw: object) -> torch.nn.parallel.DistributedDataParallel:
    module = module.to(DEVICE)
    ids = [DEVICE.index or 0] if DEVICE.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids, **kw)  # type: ignore[arg-type]


class Model(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.ps = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(s, dtype=dtype)) for s in SIZES)

    def forward(self, gs: list[torch.Tensor]) -> torch.Tensor:
        return sum((p * g).sum() for p, g in zip(self.ps, gs))  # gradient of p: g


def cases(n: int) -> list[tuple[str, permk.compressors.base.Compressor]]:
    """PermK, BlockPermK(n), shared-seed RandK; with 4 ranks also BlockPermK(2) (two ranks per block)."""
    out = [("PermK", permk.PermK()), (f"BlockPermK({n})", permk.BlockPermK(n)), ("RandK(3)", permk.RandK(3))]
    return out + ([("BlockPermK(2)", permk.BlockPermK(2))] if n == 4 else [])


def main() -> None:
    store_file, rank, world, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if DEVICE.type == "cuda":
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(BACKEND, store=dist.FileStore(store_file, world), rank=rank, world_size=world)
    records = []
    for name, comp in cases(world):
        for dtype in (torch.float32, torch.float64):
            torch.manual_seed(0)
            model = ddp(Model(dtype), bucket_cap_mb=1e-6)
            state, hook = pt.comm_hook(comp, seed=11)
            seen = []

            def recording(st, bucket):  # type: ignore[no-untyped-def]
                local = bucket.buffer().clone()
                params = list(bucket.parameters())

                fut = hook(st, bucket)
                call = st.calls[-1]  # this exchange's record, made when the hook ran

                def keep(done: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
                    res = done.value()
                    seen.append((call, local, res.clone(), params))
                    return res

                return fut.then(keep)

            model.register_comm_hook(state, recording)
            for step in range(STEPS):
                gen = torch.Generator().manual_seed(1000 * step + rank)
                gs = [torch.randn(s, generator=gen, dtype=torch.float64).mul_(3.7).to(dtype).to(DEVICE) for s in SIZES]
                model.zero_grad()
                model(gs).backward()
                for call, local, res, params in sorted(seen, key=lambda s: s[0].bucket):
                    everyone = [torch.empty_like(local) for _ in range(world)]
                    dist.all_gather(everyone, local)
                    stacked = np.stack([t.cpu().numpy() for t in everyone])
                    res = res.cpu()
                    want = comp.aggregate(stacked, seed=call.seed, round=call.round)
                    other = comp.aggregate(stacked, seed=call.seed, round=call.round + 1)
                    grads = torch.cat([p.grad.reshape(-1) for p in params])
                    records.append({
                        "case": name, "dtype": str(dtype), "index": call.bucket, "round": call.round, "step": step,
                        "d": call.d, "sent": call.sent, "padded": call.padded, "itemsize": local.element_size(),
                        "floats_per_worker": comp.floats_per_worker(world, call.d),
                        "plan_count": int(np.diff(comp.plan(world, call.d, seed=call.seed, round=call.round).offsets)[rank]),
                        # every coordinate sent by exactly one rank in every round (PermK with d ≥ n, BlockPermK(n))
                        "disjoint": (name == "PermK" and call.d >= world) or name == f"BlockPermK({world})",
                        "seed_ok": call.seed == pt.hook.bucket_seed(11, call.bucket),
                        "equal": res.numpy().dtype == want.dtype and bool(np.array_equal(res.numpy(), want)),
                        "grads_equal": bool(torch.equal(grads.cpu(), res)),
                        "other_round_differs": not np.array_equal(res.numpy(), other),
                    })
                seen.clear()
    with open(out, "w", encoding="utf-8") as f:
        json.dump(records, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
