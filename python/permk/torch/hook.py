"""A DistributedDataParallel communication hook that sends a shared-plan compressor's messages.

``state, hook = comm_hook(PermK(), seed=0)`` then ``ddp_model.register_comm_hook(state, hook)``:
for each gradient bucket DDP hands over, every rank computes the round's plan (the coordinates
each worker sends, Definitions 1 and 2 for PermK) from ``(seed, round)``, sends only the values at
its own coordinates, scaled as the compressor defines (one ``all_gather``), and forms the server's
average ``(1/n) Σ_i C_i(g_i)`` of the ranks' bucket gradients ``g_i``: bit for bit
``compressor.aggregate(stack(g), seed=..., round=...)``.

Rounds and seeds, the same on every rank and in every run:

* a bucket's round is the number of times that bucket (by :meth:`GradBucket.index`) was
  communicated before: 0, 1, 2 … (DDP communicates every bucket once per backward pass, so after
  ``t`` optimizer steps every bucket is at round ``t``);
* bucket ``b`` of a hook with ``seed`` uses the seed :func:`bucket_seed` ``(seed, b)``, a pure
  function of both, so different buckets draw independent plans.

The ranks are the workers in process-group rank order (``n`` = the group's size). Bucket sizes
differ from the first iteration to the next (DDP rebuilds its buckets once, in gradient order);
the plan takes each call's size ``d``.
"""

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from .._validate import check_seed
from ..compressors import Compressor, PendingRound, Round

__all__ = ["BucketCall", "HookState", "bucket_seed", "comm_hook"]

#: The dtypes whose values the compressors define exactly (their kernels take float32 and float64).
SUPPORTED_DTYPES = (torch.float32, torch.float64)
#: How many of the latest exchanges :attr:`HookState.calls` keeps (the totals count them all).
CALLS_KEPT = 1024


def bucket_seed(seed: int, index: int) -> int:
    """The seed of bucket ``index`` under a hook's ``seed``: a pure function of both (a
    ``numpy.random.SeedSequence`` of ``(seed, index, "ddp")``), in ``[0, 2**64)``."""
    state = np.random.SeedSequence([check_seed(seed), int(index), 0x646470]).generate_state(1, np.uint64)
    return int(state[0])


class BucketCall(NamedTuple):
    """One bucket's exchange as a rank saw it: the bucket's index (``bucket``) and size ``d``, its
    round and seed, and the bytes this rank sent: ``sent`` its own values (the compressor's
    message), ``padded`` what the ``all_gather`` carried for it (every rank's slot has the round's
    largest message size)."""

    bucket: int
    round: int
    seed: int
    d: int
    sent: int
    padded: int


@dataclass
class HookState:
    """The hook's state on one rank: the compressor, the seed, the process group (``None``: the
    default group) and its size ``n`` and this rank's ``rank``, the next round of every bucket
    (``rounds``), and the bytes this rank sent: running totals per bucket, and ``calls``, the last
    ``CALLS_KEPT`` exchanges (one :class:`BucketCall` each, in order; a long training keeps no
    record per step)."""

    compressor: Compressor
    seed: int
    process_group: Any
    n: int
    rank: int
    rounds: dict[int, int] = field(default_factory=dict)
    calls: deque[BucketCall] = field(default_factory=lambda: deque(maxlen=CALLS_KEPT))
    #: per bucket index, ``[sent, padded]`` bytes over all its exchanges
    totals: dict[int, list[int]] = field(default_factory=dict)
    #: per bucket, ``(d, round, pending)``: the bucket's next round, computed ahead
    ahead: dict[int, tuple[int, int, PendingRound]] = field(default_factory=dict, repr=False)

    def bucket_seed(self, index: int) -> int:
        """The seed bucket ``index`` uses (:func:`bucket_seed`)."""
        return bucket_seed(self.seed, index)

    @property
    def bytes_sent(self) -> int:
        """The bytes of this rank's own values over all exchanges (the compressor's messages)."""
        return sum(t[0] for t in self.totals.values())

    @property
    def bytes_padded(self) -> int:
        """The bytes the ``all_gather`` carried for this rank over all exchanges (its values
        padded to each round's largest message)."""
        return sum(t[1] for t in self.totals.values())

    def bytes_sent_per_bucket(self) -> dict[int, int]:
        """This rank's sent bytes per bucket index, over all exchanges."""
        return {index: t[0] for index, t in self.totals.items()}

    def record(self, call: BucketCall) -> None:
        """Count one exchange: its totals, and the call among the last ``CALLS_KEPT``."""
        self.calls.append(call)
        t = self.totals.setdefault(call.bucket, [0, 0])
        t[0] += call.sent
        t[1] += call.padded


Hook = Callable[[HookState, dist.GradBucket], torch.futures.Future[torch.Tensor]]


def comm_hook(compressor: Compressor, *, seed: int, process_group: Any = None) -> tuple[HookState, Hook]:
    """``(state, hook)`` for ``ddp_model.register_comm_hook(state, hook)``: each rank sends only the
    values its coordinates hold in the round's shared plan of ``compressor`` and every rank gets
    the compressed average ``compressor.aggregate`` of the ranks' bucket gradients.

    ``compressor`` must have a shared plan (``capabilities.shared_plan``: PermK, BlockPermK,
    shared-seed RandK, CoordinateSampling, GroupPermK) and be defined for the group's size and
    the buckets' sizes (for ``BlockPermK(m)``: ``m`` at most the world size;
    ``BlockPermK(world_size)`` gives every rank one block, with PermK's constants in Theorem
    "PermK"), which the first bucket checks (ValueError naming the compressor and the world size,
    on every rank). ``seed``: the run's shared seed (see the module's note on rounds and seeds).
    ``process_group``: the group of the ranks (``None``: the default group, which must
    be initialised). The gradients must be float32 or float64 (TypeError otherwise, at the first
    bucket); they are not checked for NaN or inf, which reach the average as with all-reduce. ``state`` records the rounds and the bytes each exchange sent (:class:`HookState`).
    """
    if not isinstance(compressor, Compressor):
        raise TypeError(f"compressor: must be a permk Compressor, got {type(compressor).__name__}")
    if not compressor.capabilities.shared_plan:
        raise ValueError(
            f"compressor: {compressor.name} has no shared plan (capabilities.shared_plan is False): the "
            "hook sends values only, at coordinates every rank recomputes from (seed, round); use PermK, "
            "BlockPermK(world_size) or RandK"
        )
    seed = check_seed(seed)
    if not dist.is_initialized():
        raise RuntimeError("comm_hook: torch.distributed is not initialised (call dist.init_process_group first)")
    group = process_group if process_group is not None else dist.group.WORLD
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    return HookState(compressor, seed, process_group, n, rank), _hook


def _hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """One bucket's exchange (see :func:`comm_hook`). DDP checks the annotations of ``bucket`` and
    of the result against the classes themselves, so this module does not postpone annotations."""
    buf = bucket.buffer()
    if buf.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"gradient dtype {buf.dtype} is not supported by the permk hook (float32 or float64)")
    n, rank, d, index = state.n, state.rank, buf.numel(), bucket.index()
    r, seed = state.rounds.get(index, 0), state.bucket_seed(index)
    rnd = _take_round(state, index, d, r, seed)
    state.rounds[index] = r + 1
    offsets, scales = rnd.offsets(), rnd.scales()
    coords = torch.from_numpy(rnd.coords(0, n))
    width = int(np.diff(offsets).max())
    lo, hi = int(offsets[rank]), int(offsets[rank + 1])
    flat = buf.reshape(-1)
    send = torch.zeros(width, dtype=buf.dtype)
    # scale · g in float64, rounded once to the gradient's dtype (the compressors' `scaled`)
    send[: hi - lo] = (flat[coords[lo:hi]].to(torch.float64) * float(scales[rank])).to(buf.dtype)
    gathered = torch.empty(n * width, dtype=buf.dtype)
    state.record(BucketCall(index, r, seed, d, (hi - lo) * buf.element_size(), width * buf.element_size()))
    work = dist.all_gather_into_tensor(gathered, send, group=state.process_group, async_op=True)
    assert work is not None  # what async_op=True returns
    # the bucket's next round, computed while this one communicates (used if its size stays d)
    state.ahead[index] = (d, r + 1, state.compressor.round_ahead(n, d, seed=seed, round=r + 1))

    def average(_: torch.futures.Future[Any]) -> torch.Tensor:
        # the sum of the messages in worker order into zeros, then divided by n (Compressor.aggregate)
        acc = torch.zeros(d, dtype=buf.dtype)
        rows = gathered.view(n, width)
        for w in range(n):
            a, b = int(offsets[w]), int(offsets[w + 1])
            acc.index_add_(0, coords[a:b], rows[w, : b - a])
        acc.div_(torch.tensor(n, dtype=buf.dtype))
        flat.copy_(acc)
        return buf

    return work.get_future().then(average)


def _take_round(state: HookState, index: int, d: int, r: int, seed: int) -> Round:
    """Round ``r`` of bucket ``index`` of size ``d``: the one computed ahead if it is that round,
    else computed now (ValueError naming the compressor when it does not fit ``(n, d)``)."""
    ahead = state.ahead.pop(index, None)
    if ahead is not None and ahead[:2] == (d, r):
        return ahead[2].wait()
    try:
        return state.compressor.round(state.n, d, seed=seed, round=r)
    except ValueError as exc:
        raise ValueError(f"compressor: {state.compressor.name} does not fit the world size {state.n} "
                         f"and bucket {index} of {d} values: {exc}") from exc
