"""Sharded data parallelism where PermK's disjoint messages pay: each rank receives only the
compressed average of the coordinates whose optimizer state it holds.

With sharded optimizer state (ZeRO stages 1–2, ``ZeroRedundancyOptimizer``, FSDP-style sharding)
rank ``s`` holds the optimizer state of one shard of the parameters and needs only that shard of
the averaged gradient: a reduce-scatter sends ``(n − 1)/n · d`` values per rank. With PermK the
average on a shard is, coordinate by coordinate, the one value sent by the worker that owns that
coordinate in the round's plan, so every worker sends each of its ``d/n`` values straight to the
rank holding that coordinate's shard: one ``all_to_all`` in which each rank sends about
``(n − 1)/n · d/n`` values to the others and receives as many, nothing summed on the way — about
``n`` times fewer bytes than the reduce-scatter, with the paper's unbiasedness and variance.

:class:`~permk.torch.sharded.ShardedOptimizer` does it for a module trained without DDP: after ``loss.backward()``,
:meth:`~permk.torch.sharded.ShardedOptimizer.step` flattens the gradients, runs the exchange
(:data:`permk.exchanges.compressed_mean_rows` over a sharded :class:`permk.transport.ddp.DDPTransport`,
whose mean is this rank's shard of the mean), steps this rank's shard with its own optimizer
(whose state covers the shard only) and all-gathers the parameters, as a sharded optimizer does.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable

import numpy as np
import torch
import torch.distributed as dist

from .. import exchanges as ex
from .._validate import check_seed
from ..compressors import Compressor
from ..transport.ddp import DDPTransport, Planner, run
from .hook import bucket_seed

__all__ = ["ShardedOptimizer", "shard_bounds"]


def shard_bounds(d: int, n: int) -> np.ndarray:
    """The ``n + 1`` bounds of the shards of ``d`` coordinates: ``⌈d/n⌉`` each but the last ones,
    so that the all-gathered shards are the flat parameters followed by padding.

    >>> shard_bounds(10, 4).tolist()
    [0, 3, 6, 9, 10]
    """
    w = -(-d // n)
    return np.minimum(np.arange(n + 1, dtype=np.int64) * w, d)


class ShardedOptimizer:
    """Sharded optimizer state with PermK's all-to-all (see the module docstring).

    ``params``: the module's parameters (one dtype and device; those with ``requires_grad``), in
    the order their gradients are flattened; ``optimizer``: builds this rank's optimizer from a
    list of one tensor, its shard (e.g. ``functools.partial(torch.optim.SGD, lr=0.1)``);
    ``compressor``: a shared-plan compressor (PermK, BlockPermK(n), RandK; its plan over all
    ``d`` parameters); ``seed`` (the round's seed is :func:`permk.torch.hook.bucket_seed`
    ``(seed, 0)``, so a module of one parameter tensor gets the plans of
    :func:`permk.torch.comm_hook`'s bucket 0 and the same trajectory).

    Rank ``s`` holds coordinates ``bounds[s]:bounds[s+1]`` (:func:`~permk.torch.sharded.shard_bounds`). Every call of
    :meth:`step` is one round. ``bytes_exchanged`` counts the bytes of gradient values that
    left this rank (to the other ranks), ``bytes_gathered`` those the parameters' all-gather
    sent; :meth:`~permk.torch.sharded.ShardedOptimizer.reduce_scatter_bytes` is what a reduce-scatter would have sent.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], compressor: Compressor,
                 optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer], *, seed: int,
                 process_group: Any = None, lookahead: bool = True) -> None:
        if not isinstance(compressor, Compressor):
            raise TypeError(f"compressor: must be a permk Compressor, got {type(compressor).__name__}")
        if not compressor.capabilities.shared_plan:
            raise ValueError(f"compressor: {compressor.name} has no shared plan (the shards' routes are the plan's)")
        if not dist.is_initialized():
            raise RuntimeError("ShardedOptimizer: torch.distributed is not initialised (call dist.init_process_group first)")
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("params: no parameter requires a gradient")
        dtypes, devices = {p.dtype for p in self.params}, {p.device for p in self.params}
        if len(dtypes) != 1 or len(devices) != 1:
            raise ValueError(f"params: one dtype and one device, got {sorted(map(str, dtypes))} on {sorted(map(str, devices))}")
        self.compressor, self.seed, self.group = compressor, check_seed(seed), process_group
        g = process_group if process_group is not None else dist.group.WORLD
        self.n, self.rank = dist.get_world_size(g), dist.get_rank(g)
        self.dtype, self.device = dtypes.pop(), devices.pop()
        self.d = sum(p.numel() for p in self.params)
        compressor.check(self.n, self.d)
        self.bounds = shard_bounds(self.d, self.n)
        lo, hi = int(self.bounds[self.rank]), int(self.bounds[self.rank + 1])
        self.width = int(self.bounds[1])
        self._flat = torch.empty(self.d, dtype=self.dtype, device=self.device)
        self._full = torch.empty(self.n * self.width, dtype=self.dtype, device=self.device)
        self._piece = torch.zeros(self.width, dtype=self.dtype, device=self.device)
        self._flatten(grads=False)
        #: this rank's shard of the parameters, the one tensor its optimizer steps
        self.shard = self._flat[lo:hi].clone().requires_grad_(True)
        self.optimizer = optimizer([self.shard])
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="permk-plan") if lookahead else None
        self._planner = Planner(compressor, self.n, self.rank, self.d, bucket_seed(self.seed, 0), self.device, self._executor,
                                "the parameters", bounds=self.bounds)
        floats = max(compressor.floats_per_worker(self.n, self.d), self.width)
        self.transport = DDPTransport(process_group, self.n, self.rank, self.d, self.dtype, self.device, self._planner,
                                      floats=floats, bounds=self.bounds)
        self.round = 0
        self.bytes_exchanged = 0
        self.bytes_gathered = 0

    def _flatten(self, grads: bool) -> torch.Tensor:
        at = 0
        for p in self.params:
            k = p.numel()
            src = p.grad if grads else p.detach()
            if src is None:
                self._flat[at : at + k].zero_()
            else:
                self._flat[at : at + k].copy_(src.reshape(-1))
            at += k
        return self._flat

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The module's gradients set to None (or zero)."""
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def shard_mean(self) -> torch.Tensor:
        """This round's exchange: the shard of ``(1/n) Σ_i C_i(g_i)`` this rank holds, from the
        module's gradients (one ``all_to_all``); counts the round."""
        g = self._flatten(grads=True)
        grad = torch.empty_like(self.shard) if self.shard.grad is None else self.shard.grad
        self.transport.target = grad
        fut = run(ex.compressed_mean_rows, self.transport, self.compressor, g.view(1, -1), seed=self._planner.seed, round=self.round)
        self.round += 1
        self.bytes_exchanged += self.transport.last_wire
        out = fut.wait()
        self.shard.grad = out
        return out

    def step(self) -> None:
        """One round: :meth:`~permk.torch.sharded.ShardedOptimizer.shard_mean`, this rank's optimizer step on its shard, and the
        parameters all-gathered into the module."""
        self.shard_mean()
        self.optimizer.step()
        piece = self._piece
        piece[: self.shard.numel()] = self.shard.detach()
        dist.all_gather_into_tensor(self._full, piece, group=self.group)
        self.bytes_gathered += self.width * piece.element_size()
        at = 0
        with torch.no_grad():
            for p in self.params:
                k = p.numel()
                p.copy_(self._full[at : at + k].view_as(p))
                at += k

    def reduce_scatter_bytes(self) -> int:
        """What one reduce-scatter of the gradient sends per rank (ring): ``(n − 1)/n · d`` values."""
        return (self.n - 1) * self.width * self._flat.element_size()

    def state_dict(self) -> dict[str, Any]:
        """The round, the shard and its optimizer's state (this rank's)."""
        return {"round": self.round, "shard": self.shard.detach().cpu(), "optimizer": self.optimizer.state_dict(),
                "compressor": self.compressor.fingerprint(), "seed": self.seed, "n": self.n, "rank": self.rank}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Resume from :meth:`~permk.torch.sharded.ShardedOptimizer.state_dict` on the same rank of
        the same world (ValueError naming the field otherwise)."""
        for name, mine in (("compressor", self.compressor.fingerprint()), ("seed", self.seed), ("n", self.n), ("rank", self.rank)):
            if sd[name] != mine:
                raise ValueError(f"state_dict: {name} {sd[name]!r} differs from this optimizer's {mine!r}")
        self.round = int(sd["round"])
        with torch.no_grad():
            self.shard.copy_(sd["shard"])
        self.optimizer.load_state_dict(sd["optimizer"])
