"""A DistributedDataParallel communication hook that sends a compressor's messages, on the
bucket's device: the exchanges of :mod:`permk.exchanges` run over :class:`permk.transport.ddp.DDPTransport`.

``state, hook = comm_hook(PermK(), seed=0)`` then ``ddp_model.register_comm_hook(state, hook)``:
for each gradient bucket DDP hands over, every rank takes the round's plan (the coordinates each
worker sends, Definitions 1 and 2 for PermK; computed from ``(seed, round)`` one round ahead, on a
thread started once the bucket's exchange is done), sends only the values at its own coordinates, scaled as
the compressor defines (one ``all_gather_into_tensor``), and places the others' values: every rank
ends with the server's average ``(1/n) Σ_i C_i(g_i)`` of the ranks' bucket gradients ``g_i`` —
bit for bit ``compressor.aggregate(stack(g), seed=..., round=...)`` in float32 and float64 (the
exchange :data:`permk.exchanges.compressed_mean_rows`).

With ``shift="diana"`` each rank keeps a shift ``h_i`` per bucket and sends
``m_i = C_i(g_i − h_i)``, then ``h_i += α m_i``; the hook returns ``h̄ + (1/n) Σ_i m_i`` and
updates the mirror ``h̄ += α (1/n) Σ_i m_i`` (DIANA's estimator: :data:`permk.exchanges.shifted`).
With ``shift="ef21"`` (``α = 1``: :data:`permk.exchanges.error_feedback`) a contractive compressor
such as ``TopK(k)`` (sent as index–value pairs) or any shared-plan one gives EF21's estimator.

Rounds and seeds, the same on every rank and in every run:

* a bucket's round is the number of times that bucket (by ``GradBucket.index()``) was
  communicated before: 0, 1, 2 … (DDP communicates every bucket once per backward pass, so after
  ``t`` optimizer steps every bucket is at round ``t``);
* bucket ``b`` of a hook with ``seed`` uses the seed :func:`~permk.torch.hook.bucket_seed` ``(seed, b)``, a pure
  function of both, so different buckets draw independent plans.

The ranks are the workers in process-group rank order (``n`` = the group's size). Bucket sizes
differ from the first iteration to the next (DDP rebuilds its buckets once, in gradient order);
the plan takes each call's size ``d``, and a bucket's shift is reset (to zero, on every rank) when
its layout (size, dtype, parameter shapes) changes. The state pickles and has
``state_dict``/``load_state_dict``: a run resumed from a checkpoint continues at the right round
with its shifts.
"""

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from .. import exchanges as ex
from .._validate import check_real, check_seed
from ..compressors import Compressor
from ..transport.ddp import SUPPORTED_DTYPES, DDPTransport, Planner, run

__all__ = ["BucketCall", "BucketShift", "HookState", "bucket_seed", "comm_hook", "SHIFTS"]

#: How many of the latest exchanges ``HookState.calls`` keeps (the totals count them all).
CALLS_KEPT = 1024
#: The shifts a hook can keep (``comm_hook(..., shift=)``).
SHIFTS = ("diana", "ef21")
#: The version of :meth:`~permk.torch.hook.HookState.state_dict`'s format.
STATE_VERSION = 1


def bucket_seed(seed: int, index: int) -> int:
    """The seed of bucket ``index`` under a hook's ``seed``: a pure function of both (a
    ``numpy.random.SeedSequence`` of ``(seed, index, "ddp")``), in ``[0, 2**64)``."""
    state = np.random.SeedSequence([check_seed(seed), int(index), 0x646470]).generate_state(1, np.uint64)
    return int(state[0])


class BucketCall(NamedTuple):
    """One bucket's exchange as a rank saw it: the bucket's index (``bucket``) and size ``d``, its
    round and seed, and the bytes this rank sent: ``sent`` its own values (the compressor's
    message; for index–value pairs, 4-byte indices included), ``padded`` what the
    ``all_gather`` carried for it (every rank's slot has the round's largest message size)."""

    bucket: int
    round: int
    seed: int
    d: int
    sent: int
    padded: int


@dataclass
class BucketShift:
    """One bucket's shift on this rank: ``h`` (this rank's ``h_i``) and ``hbar`` (the mirror of
    their mean every rank keeps), in the bucket's dtype on its device, for the bucket ``layout``
    (size, dtype, parameter shapes); ``fresh`` while it was loaded and not used yet."""

    layout: tuple[Any, ...]
    h: torch.Tensor
    hbar: torch.Tensor
    fresh: bool = False


class _Bucket(NamedTuple):
    """What a (bucket, size, dtype, device) keeps between rounds: its transport and planner."""

    key: tuple[Any, ...]
    transport: DDPTransport
    planner: Planner


@dataclass
class HookState:
    """The hook's state on one rank: the compressor, the seed, the process group (``None``: the
    default group) and its size ``n`` and this rank's ``rank``, the shift (None, ``"diana"`` or
    ``"ef21"``) and its ``alpha`` (None: ``1/(ω + 1)`` of the compressor at each bucket's size;
    1 for EF21), the next round of every bucket (``rounds``), each bucket's shift (``shifts``:
    :class:`~permk.torch.hook.BucketShift`) and how many times a shift was reset (``resets``), and the bytes this
    rank sent: running totals per bucket, and ``calls``, the last ``CALLS_KEPT`` exchanges (one
    :class:`~permk.torch.hook.BucketCall` each, in order).

    It pickles (without the process group, which an unpickled state takes as the default group,
    and without its buffers) and has :meth:`~permk.torch.hook.HookState.state_dict`/:meth:`~permk.torch.hook.HookState.load_state_dict`."""

    compressor: Compressor
    seed: int
    process_group: Any
    n: int
    rank: int
    shift: str | None = None
    alpha: float | None = None
    lookahead: bool = True
    rounds: dict[int, int] = field(default_factory=dict)
    calls: deque[BucketCall] = field(default_factory=lambda: deque(maxlen=CALLS_KEPT))
    #: per bucket index, ``[sent, padded]`` bytes over all its exchanges
    totals: dict[int, list[int]] = field(default_factory=dict)
    #: per bucket index, its shifts by layout (at most one in use; see ``_shift_of``)
    shifts: dict[int, dict[tuple[Any, ...], BucketShift]] = field(default_factory=dict)
    resets: int = 0
    _buckets: dict[int, _Bucket] = field(default_factory=dict, repr=False, init=False, compare=False)
    _executor: ThreadPoolExecutor | None = field(default=None, repr=False, init=False, compare=False)
    #: False: CPU buckets take the torch path instead of the native round's packing and placement
    #: (the same bits; for the benchmark's comparison)
    _native: bool = field(default=True, repr=False, init=False, compare=False)
    #: True: a bucket's next plan starts when its exchange is done, False: when its round is taken
    _defer: bool = field(default=True, repr=False, init=False, compare=False)

    def bucket_seed(self, index: int) -> int:
        """The seed bucket ``index`` uses (:func:`~permk.torch.hook.bucket_seed`)."""
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

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (CPU tensors, plain numbers): the compressor's fingerprint, the
        seed, ``n``, the shift and ``alpha``, every bucket's next round, the byte totals, and the
        shifts in use."""
        return {
            "version": STATE_VERSION,
            "compressor": self.compressor.fingerprint(),
            "seed": self.seed,
            "n": self.n,
            "shift": self.shift,
            "alpha": self.alpha,
            "rounds": dict(self.rounds),
            "totals": {k: list(v) for k, v in self.totals.items()},
            "shifts": {b: [(s.layout, s.h.detach().cpu(), s.hbar.detach().cpu()) for s in per.values()]
                       for b, per in self.shifts.items()},
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Resume from :meth:`~permk.torch.hook.HookState.state_dict`: the same compressor, seed, world size and shift
        (ValueError naming the field otherwise). The shifts are moved to each bucket's device when
        it is next communicated; the first bucket layout after a restart may differ from the
        saved one (DDP builds its buckets anew, then rebuilds them after the first iteration): a
        saved shift waits, unused, for its layout."""
        if sd.get("version") != STATE_VERSION:
            raise ValueError(f"state_dict: version {sd.get('version')!r}, expected {STATE_VERSION}")
        for name, mine in (("compressor", self.compressor.fingerprint()), ("seed", self.seed), ("n", self.n),
                           ("shift", self.shift), ("alpha", self.alpha)):
            if sd[name] != mine:
                raise ValueError(f"state_dict: {name} {sd[name]!r} differs from this hook's {mine!r}")
        self.rounds = {int(k): int(v) for k, v in sd["rounds"].items()}
        self.totals = {int(k): [int(a), int(b)] for k, (a, b) in sd["totals"].items()}
        self.shifts = {int(b): {tuple(layout): BucketShift(tuple(layout), h.clone(), hbar.clone(), fresh=True)
                                for layout, h, hbar in per} for b, per in sd["shifts"].items()}

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in vars(self).items() if k not in ("process_group", "_buckets", "_executor")}
        state["shifts"] = {b: {k: BucketShift(s.layout, s.h.detach().cpu(), s.hbar.detach().cpu(), s.fresh) for k, s in per.items()}
                           for b, per in self.shifts.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self.process_group, self._buckets, self._executor = None, {}, None

    # -- per bucket ------------------------------------------------------------------------------
    def _bucket(self, index: int, buf: torch.Tensor) -> _Bucket:
        """The transport and planner of bucket ``index`` at this size, dtype and device (new ones
        when they change)."""
        d = buf.numel()
        key = (d, buf.dtype, buf.device)
        got = self._buckets.get(index)
        if got is None or got.key != key:
            try:
                self.compressor.check(self.n, d)
            except ValueError as exc:
                raise ValueError(f"compressor: {self.compressor.name} does not fit the world size {self.n} and bucket "
                                 f"{index} of {d} values: {exc}") from exc
            if self.lookahead and self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="permk-plan")
            planner = Planner(self.compressor, self.n, self.rank, d, self.bucket_seed(index), buf.device,
                              self._executor if self.lookahead else None, f"bucket {index}", dtype=buf.dtype if self._native else None,
                              defer=self._defer)
            floats = self.compressor.floats_per_worker(self.n, d) if self.compressor.capabilities.shared_plan else d
            got = self._buckets[index] = _Bucket(key, DDPTransport(self.process_group, self.n, self.rank, d, buf.dtype,
                                                                   buf.device, planner, floats=floats), planner)
        return got

    def _shift_of(self, index: int, layout: tuple[Any, ...], buf: torch.Tensor) -> BucketShift:
        """Bucket ``index``'s shift for ``layout``: the one kept (moved to the bucket's device),
        else zeros (a reset, counted in ``resets``). Shifts of other layouts are dropped, but for
        one loaded from a checkpoint and not used yet."""
        per = self.shifts.setdefault(index, {})
        got = per.get(layout)
        if got is None:
            got = per[layout] = BucketShift(layout, torch.zeros_like(buf), torch.zeros_like(buf))
            self.resets += 1
        elif got.h.device != buf.device or got.h.dtype != buf.dtype:
            got.h, got.hbar = got.h.to(buf.device, buf.dtype), got.hbar.to(buf.device, buf.dtype)
        got.fresh = False
        for k in [k for k, s in per.items() if k != layout and not s.fresh]:
            del per[k]
        return got

    def _alpha(self, d: int) -> float:
        if self.shift == "ef21":
            return 1.0
        if self.alpha is not None:
            return self.alpha
        omega = self.compressor.omega(self.n, d)
        if omega is None:
            raise ValueError(f"shift='diana': {self.compressor.name} states no ω; pass alpha= (in (0, 1])")
        return 1.0 / (omega + 1.0)


Hook = Callable[[HookState, dist.GradBucket], torch.futures.Future[torch.Tensor]]


def comm_hook(compressor: Compressor, *, seed: int, process_group: Any = None, shift: str | None = None,
              alpha: float | None = None, lookahead: bool = True) -> tuple[HookState, Hook]:
    """``(state, hook)`` for ``ddp_model.register_comm_hook(state, hook)``: each rank sends only the
    values its coordinates hold in the round's shared plan of ``compressor`` and every rank gets
    the compressed average ``compressor.aggregate`` of the ranks' bucket gradients (see the
    module docstring; ``shift`` adds a shift per bucket).

    ``compressor``: without a shift, one with a shared plan (``capabilities.shared_plan``: PermK,
    BlockPermK, shared-seed RandK, CoordinateSampling, GroupPermK) defined for the group's size
    and the buckets' sizes (for ``BlockPermK(m)``: ``m`` at most the world size;
    ``BlockPermK(world_size)`` gives every rank one contiguous block, with PermK's constants in
    Theorem "PermK", and costs ``O(n)`` per round instead of PermK's ``O(d)`` plan), which the
    first bucket checks (ValueError naming the compressor and the world size, on every rank).
    ``shift="diana"`` (unbiased compressors; ``alpha`` defaults to ``1/(ω + 1)``) or ``"ef21"``
    (also TopK, whose messages travel as index–value pairs). ``seed``: the run's shared seed.
    ``process_group``: the group of the ranks (``None``: the default group, which must be
    initialised). ``lookahead=False`` computes every plan when its bucket arrives instead of one
    round ahead on a thread.

    The gradients may be float32, float64, bfloat16 or float16 (TypeError otherwise, at the first
    bucket), on any device the group's backend takes (gloo: CPU tensors; NCCL: CUDA tensors);
    they are not checked for NaN or inf, which reach the average as with all-reduce. A world of
    one rank returns each bucket as it is (nothing travels, nothing is compressed). ``state``
    records the rounds and the bytes each exchange sent (:class:`~permk.torch.hook.HookState`).

    >>> import torch.distributed as dist, permk, permk.torch
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> state, hook = permk.torch.comm_hook(permk.PermK(), seed=0)
    >>> state.n, state.shift
    (1, None)
    >>> dist.destroy_process_group()
    """
    if not isinstance(compressor, Compressor):
        raise TypeError(f"compressor: must be a permk Compressor, got {type(compressor).__name__}")
    if shift is not None and shift not in SHIFTS:
        raise ValueError(f"shift: must be None or one of {', '.join(map(repr, SHIFTS))}, got {shift!r}")
    if shift != "ef21" and not compressor.capabilities.shared_plan:
        raise ValueError(
            f"compressor: {compressor.name} has no shared plan (capabilities.shared_plan is False): the "
            "hook sends values only, at coordinates every rank recomputes from (seed, round); use PermK, "
            "BlockPermK(world_size) or RandK, or shift='ef21' for a contractive compressor such as TopK"
        )
    if shift == "diana" and not compressor.capabilities.unbiased:
        raise ValueError(f"shift='diana' needs an unbiased compressor; {compressor.name} is not (use shift='ef21')")
    if alpha is not None:
        if shift != "diana":
            raise ValueError("alpha: only shift='diana' takes a learning rate for its shifts (EF21's is 1)")
        alpha = check_real(alpha, "alpha", low=0.0, strict=True, high=1.0)
    seed = check_seed(seed)
    if not dist.is_initialized():
        raise RuntimeError("comm_hook: torch.distributed is not initialised (call dist.init_process_group first)")
    group = process_group if process_group is not None else dist.group.WORLD
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    return HookState(compressor, seed, process_group, n, rank, shift=shift, alpha=alpha, lookahead=bool(lookahead)), _hook


def _done(buf: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut


def _hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """One bucket's exchange (see :func:`~permk.torch.hook.comm_hook`). DDP checks the annotations of ``bucket`` and
    of the result against the classes themselves, so this module does not postpone annotations."""
    buf = bucket.buffer()
    if buf.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"gradient dtype {buf.dtype} is not supported by the permk hook (float32, float64, bfloat16 or float16)")
    index, d = bucket.index(), buf.numel()
    if state.process_group is None and dist.get_world_size() != state.n:
        raise ValueError(f"this hook's state is for {state.n} ranks, the default group has {dist.get_world_size()}")
    b = state._bucket(index, buf)
    r, seed = state.rounds.get(index, 0), state.bucket_seed(index)
    state.rounds[index] = r + 1
    if state.n == 1:  # nothing travels: the average of one gradient
        state.record(BucketCall(index, r, seed, d, 0, 0))
        return _done(buf)
    t, c, row = b.transport, state.compressor, buf.view(1, -1)
    if state.shift is None:
        t.target = buf
        fut = run(ex.compressed_mean_rows, t, c, row, seed=seed, round=r)
    else:
        layout = (d, str(buf.dtype), tuple(tuple(p.shape) for p in bucket.parameters()))
        sh = state._shift_of(index, layout, buf)
        alpha = state._alpha(d)
        H = t.hand_over(sh.h).view(1, -1)
        if state.shift == "ef21":
            mean, _ = run(ex.error_feedback, t, c, H, row, seed=seed, round=r)
        else:
            mean, _ = run(ex.shifted, t, c, H, row, alpha=alpha, seed=seed, round=r)

        def estimate(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            m = f.value()
            torch.add(sh.hbar, m, out=buf)  # h̄ + (1/n) Σ m_i
            sh.hbar.add_(m if alpha == 1.0 else m * alpha)  # h̄ + α (1/n) Σ m_i (no fused multiply-add)
            return buf

        fut = mean.then(estimate)
    state.record(BucketCall(index, r, seed, d, *t.last_bytes))
    return fut
