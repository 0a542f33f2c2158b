"""torch.distributed as a transport: one gradient bucket on one rank, on the bucket's device.

:class:`DDPTransport` is what :mod:`permk.exchanges` asks of a transport, for one bucket of a
``DistributedDataParallel`` model (or any flat tensor every rank of a process group holds): the
rank is one held worker (``workers = range(rank, rank + 1)``), its row is the bucket
(``local_grads(x)`` is ``x``, the bucket as a ``(1, d)`` view), the round's plan is a
:class:`~permk.transport.ddp.DeviceRound` on the bucket's device, and the numbers move with ``torch.distributed``
collectives on device tensors (``all_gather_into_tensor``: NCCL-ready). The arithmetic is the
exchanges' (:data:`permk.exchanges.compressed_mean_rows`, :data:`~permk.exchanges.shifted`,
:data:`~permk.exchanges.error_feedback`), written once for the simulator, MPI and DDP;
:mod:`permk.torch.hook` runs them over this transport.

What differs from the numpy transports:

* **Asynchronous means.** :meth:`~permk.transport.ddp.DDPTransport.mean_values` and :meth:`~permk.transport.ddp.DDPTransport.mean_pairs`
  start the collective and return a ``torch.futures.Future`` of the mean (written into
  ``DDPTransport.target`` when set, else into a buffer of the transport); the exchanges pass
  it through untouched, and a DDP hook returns it.
* **Arrays are tensors.** The held rows, the plan's coordinates and the values are tensors of the
  bucket's dtype on its device (float32, float64, bfloat16, float16); :meth:`~permk.transport.ddp.DDPTransport.rows_of`,
  :meth:`~permk.transport.ddp.DDPTransport.add_at` and :meth:`~permk.transport.ddp.DDPTransport.all_finite` are the three array operations the exchanges ask of a
  transport whose arrays are not numpy's. No value is checked for NaN or inf (that would wait for
  the device every bucket): they reach the mean as with an all-reduce.
* **Buffers.** The send and receive buffers of a (bucket, size) are allocated once, on the
  bucket's device; each round's plan is computed ahead by a :class:`~permk.transport.ddp.Planner` on a thread
  (started when round ``r`` is taken, or — ``defer=True``, the hook's — when round ``r``'s
  exchange is done, so that it overlaps the rest of the step rather than the collective) and, on
  CUDA, copied to the device from pinned memory without blocking, on a side stream the bucket's
  work waits for.
* **Native placement on CPU.** A disjoint round whose coordinates are listed (PermK with
  ``d ≥ n``: the owner of every coordinate) on a float32/float64 CPU bucket keeps the native
  round itself (placement ``"native"``): a rank's values are packed by one native call
  (``Round.gather`` into the send slot) and the gathered slots placed by another
  (``Round.place`` into the bucket), both with the GIL released, straight into the tensors'
  memory (numpy views); no coordinate tensor is formed. The same values and copies as the
  torch path, so the same bits. Other devices and dtypes keep the torch path.

The values a rank sends (:meth:`~permk.transport.ddp.DeviceRound.gather`) are the compressor's: ``scale_i · g_j``
computed in float64 and rounded once to the bucket's dtype (:func:`permk.compressors.messages.scaled`),
computed in the bucket's dtype where that is the same number — wherever the scale is exactly a
number of the bucket's dtype (PermK's ``n``, BlockPermK's ``m``: then ``g_j · scale`` is exact in
float64 and a product in the dtype is rounded once to the same value; float16/bfloat16 products
are computed by torch in float32, exact for two such factors). A disjoint round (no coordinate
sent twice: PermK with ``d ≥ n``, BlockPermK(n)) sends ``(v + 0)/n``, the worker-order sum's one
term divided by ``n``, and the receivers only place the values (a scatter without duplicates:
deterministic on CUDA); other rounds are summed in worker order from zero, one scatter-add per
*level* (the ``j``-th worker sending a coordinate: no duplicates within a level), then divided by
``n``. Every operation is one IEEE operation in the bucket's dtype, so float32 and float64
averages are ``compressor.aggregate``'s bit for bit, and float16/bfloat16 averages are the same
recipe with each operation rounded to that dtype.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import Future as _Pending, ThreadPoolExecutor
from typing import Any, Callable, Iterator, NamedTuple, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from .._core import Round as NativeRound
from ..compressors import Compressor, Messages, Round

__all__ = ["DDPTransport", "DeviceRound", "Levels", "Planner", "SUPPORTED_DTYPES", "ShardRoutes", "device_round", "run", "scale_in_dtype",
           "topk_indices"]

#: The bucket dtypes the transport computes with (the compressors' kernels define float32 and
#: float64; float16 and bfloat16 follow the same recipe, each operation rounded to the dtype).
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
#: The CPU bucket dtypes the native round packs and places (numpy's float32 and float64).
NATIVE_DTYPES = (torch.float32, torch.float64)


@functools.lru_cache(maxsize=256)
def scale_in_dtype(scale: float, dtype: torch.dtype) -> bool:
    """Whether ``scale · g`` may be computed in ``dtype`` and be the compressor's value (the
    float64 product rounded once): ``scale`` is exactly a number of ``dtype`` (then the product
    of two numbers of the dtype is exact in float64, and torch's product — float32 arithmetic
    for float16/bfloat16, exact for two such factors — is rounded once to the same value)."""
    s = float(scale)
    return dtype == torch.float64 or float(torch.tensor(s, dtype=dtype)) == s


def _scale_(v: Tensor, scale: float) -> Tensor:
    """``v`` times ``scale`` in place, as the compressors compute it (see :func:`~permk.transport.ddp.scale_in_dtype`)."""
    if scale == 1.0:
        return v
    if scale_in_dtype(scale, v.dtype):
        return v.mul_(scale)
    return v.copy_(v.to(torch.float64).mul_(scale))


def _divide_(v: Tensor, divide: int) -> Tensor:
    """``(v + 0)/divide`` in place: the worker-order sum's one term divided by ``n`` (``+ 0``
    turns −0 into +0, as the sum from zero does)."""
    return v.add_(0.0).div_(divide)


def run(exchange: Any, transport: DDPTransport, *args: Any, **kwargs: Any) -> Any:
    """``exchange(transport, *args, **kwargs)``: one of :mod:`permk.exchanges` run over the DDP
    transport, whose arrays are tensors and whose means are futures (the exchanges are typed for
    the numpy transports; the arithmetic is theirs either way)."""
    return exchange(transport, *args, **kwargs)


class Levels(NamedTuple):
    """A non-disjoint round's worker-order sum: per level ``j`` (the ``j``-th worker, in worker
    order, to send a coordinate), the positions of those values in the padded receive buffer and
    their coordinates; ``blocks``: the same for equal aligned blocks (BlockPermK(m)), as block
    numbers of a ``(d / w, w)`` view."""

    positions: list[Tensor]
    coords: list[Tensor]
    blocks: bool


class ShardRoutes(NamedTuple):
    """A round on a sharded transport (rank ``s`` holds coordinates ``bounds[s]:bounds[s+1]``):
    this rank sends ``send_splits[s]`` values to rank ``s`` (its values listed by destination:
    ``DeviceRound.mine`` is in that order), and receives ``recv_splits[w]`` values from
    worker ``w``, in worker order, at the shard's local coordinates ``coords`` (``covers``: every
    coordinate of the shard is sent); ``levels`` sum them in worker order when the round is not
    disjoint."""

    send_splits: list[int]
    recv_splits: list[int]
    coords: Tensor
    covers: bool
    levels: Levels


class DeviceRound:
    """One round's shared plan on a device, as one rank uses it: the :class:`~permk.compressors.Round`
    protocol (``offsets``, ``scales``, ``coords``, ``rows``, ``ranges``, ``gather``, ``mean``,
    ``disjoint``) with tensors on ``device``, and what the transport's fast path needs: this
    rank's coordinates (``mine``, a slice for a round of ranges), the slot ``width`` of the
    ``all_gather`` (the round's largest message), and how the gathered values land
    (``placement``).

    Built by :func:`~permk.transport.ddp.device_round` from a computed round; ``ready()`` makes the current CUDA
    stream wait for its upload."""

    def __init__(self, *, n: int, d: int, rank: int, disjoint: bool, offsets: np.ndarray, scales: np.ndarray,
                 ranges: tuple[np.ndarray, np.ndarray, np.ndarray] | None, mine: Tensor | slice | None, coords: Tensor | None,
                 placement: str, place: Any, device: torch.device, event: Any = None, shard: Any = None) -> None:
        self.n, self.d, self.rank, self.disjoint, self.device = n, d, rank, disjoint, device
        self._offsets, self._scales, self._ranges = offsets, scales, ranges
        self.counts = np.diff(offsets)
        self.width = max(1, int(self.counts.max(initial=0)))
        self.mine, self._coords = mine, coords
        #: ``"native"`` (a CPU float32/float64 disjoint round of listed coordinates: the native
        #: round packs and places, ``place`` is that round), ``"blocks"`` (disjoint equal aligned
        #: blocks: one ``index_copy_`` of rows), ``"slices"``
        #: (disjoint ranges: one concatenation of the slots' values into the mean), ``"padded"``
        #: (disjoint, every worker sends: one ``index_copy_`` of the padded coordinates, each
        #: worker's pad repeating its last coordinate and value), ``"compact"`` (disjoint, some
        #: worker sends nothing), ``"levels"`` (a worker-order sum, ``Levels``)
        self.placement, self._place = placement, place
        self._event = event
        self.scale = float(scales[rank])
        #: for a sharded transport, how the values travel to the shards' ranks (``ShardRoutes``)
        self.shard: ShardRoutes | None = shard

    # -- the Round protocol ------------------------------------------------------------------
    def offsets(self) -> np.ndarray:
        return self._offsets

    def scales(self) -> np.ndarray:
        return self._scales

    def ranges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        return self._ranges

    def _all_coords(self) -> Tensor:
        if self._coords is None:  # the coordinates formed on request: a native round's, or a round of ranges'
            if self.placement == "native":
                self._coords = torch.from_numpy(self._place.coords(0, self.n))
            else:
                starts, stops, _ = self._ranges  # type: ignore[misc]
                self._coords = torch.cat([torch.arange(int(a), int(b), device=self.device) for a, b in zip(starts, stops)])
        return self._coords

    def _mine(self) -> Tensor | slice:
        """This rank's coordinates (a native round's formed on first request)."""
        if self.mine is None:
            self.mine = torch.from_numpy(self._place.coords(self.rank, self.rank + 1))
        return self.mine

    def coords(self, start: int, stop: int) -> Tensor:
        """The coordinates of workers ``start..stop`` in plan order (int64, on the device)."""
        if (start, stop) == (self.rank, self.rank + 1):
            mine = self._mine()
            if isinstance(mine, Tensor):
                return mine
            return torch.arange(mine.start, mine.stop, device=self.device)
        return self._all_coords()[int(self._offsets[start]) : int(self._offsets[stop])]

    def rows(self, start: int, stop: int) -> Tensor:
        """The worker of each of those entries (int64, on the device)."""
        c = self.coords(start, stop)
        if stop == start + 1:  # one worker: no counts to send to the device
            return torch.full((c.numel(),), start, dtype=torch.int64, device=c.device)
        counts = torch.as_tensor(self.counts[start:stop], device=c.device)
        return torch.repeat_interleave(torch.arange(start, stop, device=c.device), counts, output_size=c.numel())

    def gather(self, a: Tensor, start: int, *, divide: int | None = None, out: Tensor | None = None) -> Tensor:
        """The values of workers ``start .. start + m`` whose inputs are the rows of the ``(m, d)``
        tensor ``a``, in plan order: ``scale_i · a[i − start, j]`` as the compressor computes it
        (see the module docstring), each ``(v + 0)/divide`` when ``divide`` is given; written into
        ``out`` (a tensor of ``a``'s dtype and device with exactly that many elements) when given."""
        m = a.shape[0]
        if a.ndim != 2 or a.shape[1] != self.d or not 0 <= start <= start + m <= self.n:
            raise ValueError(f"a must be the (m, {self.d}) rows of workers start .. start + m of {self.n}, got shape "
                             f"{tuple(a.shape)} from {start}")
        if (start, m) == (self.rank, 1) and self.placement == "native" and a.dtype in NATIVE_DTYPES and a.device.type == "cpu":
            # one native pass over the owners, straight into the send slot's memory (GIL released)
            vals = torch.empty(int(self.counts[self.rank]), dtype=a.dtype) if out is None else out
            self._place.gather(a.detach().numpy(), start, divide=divide, out=vals.numpy())
            return vals
        if (start, m) == (self.rank, 1):
            x, mine = a[0], self._mine()
            if isinstance(mine, slice):
                src = x[mine]
                vals = src.clone() if out is None else out.copy_(src)
            else:
                vals = torch.index_select(x, 0, mine) if out is None else torch.index_select(x, 0, mine, out=out)
            _scale_(vals, self.scale)
        else:
            rows, cols = self.rows(start, start + m), self.coords(start, start + m)
            vals = a[rows - start, cols]
            scales = torch.as_tensor(self._scales, device=a.device)[rows]
            vals = (vals.to(torch.float64) * scales).to(a.dtype)
            if out is not None:
                vals = out.copy_(vals)
        if divide is not None:
            _divide_(vals, divide)
        return vals

    def mean(self, values: Tensor, *, out: Tensor | None = None) -> Tensor:
        """``(1/n) Σ_i C_i(a_i)`` from all workers' values concatenated in worker and plan order:
        summed in worker order from zero (a disjoint round: placed), then divided by ``n``."""
        N = int(self._offsets[-1])
        if values.shape != (N,):
            raise ValueError(f"values must hold the {N} values of the round, got shape {tuple(values.shape)}")
        acc = torch.zeros(self.d, dtype=values.dtype, device=values.device) if out is None else out.zero_()
        coords = self._all_coords().to(values.device)
        if self.disjoint:
            acc.index_copy_(0, coords, values + 0.0)
        else:
            for w in range(self.n):  # the protocol's generic form; the transport sums by levels
                a, b = int(self._offsets[w]), int(self._offsets[w + 1])
                acc.index_add_(0, coords[a:b], values[a:b])
        return acc.div_(self.n)

    # -- the transport's fast path -------------------------------------------------------------
    def ready(self) -> None:
        """Make the current CUDA stream wait for this round's upload (nothing on CPU)."""
        if self._event is not None:
            torch.cuda.current_stream().wait_event(self._event)
            for t in self._device_tensors():
                t.record_stream(torch.cuda.current_stream())
            self._event = None

    def _device_tensors(self) -> list[Tensor]:
        out = [t for t in (self.mine, self._coords) if isinstance(t, Tensor)]
        if self.shard is not None:
            out += [self.shard.coords, *self.shard.levels.positions, *self.shard.levels.coords]
        if self.placement == "levels":
            out += self._place.positions + self._place.coords
        elif isinstance(self._place, tuple):
            out += [t for t in self._place if isinstance(t, Tensor)]
        return out

    def place(self, recv: Tensor, out: Tensor) -> Tensor:
        """The mean from the gathered slots ``recv`` (``n × width`` values, worker ``w``'s in slot
        ``w``): placed (a disjoint round, whose values were divided by ``n`` by their senders) or
        summed in worker order by levels, then divided by ``n``."""
        n, w = self.n, self.width
        if self.placement == "native":  # CPU float32/float64 (device_round's condition); numpy views, no copy
            self._place.place(recv.detach().numpy(), w, out.detach().numpy())
            return out
        if self.placement == "blocks":
            (blocks,) = self._place
            out.view(-1, w).index_copy_(0, blocks, recv.view(n, w))
        elif self.placement == "slices":
            slices, tiles = self._place
            if tiles:  # the ranges tile [0, d): one concatenation in place
                torch.cat([recv[v * w : v * w + k] for v, _, k in slices], out=out)
            else:
                out.zero_()
                for v, a, k in slices:
                    out[a : a + k].copy_(recv[v * w : v * w + k])
        elif self.placement == "padded":
            (coords, covers) = self._place
            if not covers:
                out.zero_()
            out.index_copy_(0, coords, recv)
        elif self.placement == "compact":
            (positions, coords) = self._place
            out.zero_()
            out.index_copy_(0, coords, recv.index_select(0, positions))
        else:
            levels: Levels = self._place
            out.zero_()
            target = out.view(-1, w) if levels.blocks else out
            source = recv.view(n, w) if levels.blocks else recv
            for pos, coords in zip(levels.positions, levels.coords):
                target.index_add_(0, coords, source.index_select(0, pos))
            out.div_(n)
        return out

    def place_shard(self, recv: Tensor, out: Tensor) -> Tensor:
        """This rank's shard of the mean from the values the ``all_to_all`` brought (every worker's
        values in the shard, in worker order): placed (a disjoint round) or summed in worker order
        by levels, then divided by ``n``."""
        sh = self.shard
        assert sh is not None
        if self.disjoint:
            if not sh.covers:
                out.zero_()
            out.index_copy_(0, sh.coords, recv)
            return out
        out.zero_()
        for pos, coords in zip(sh.levels.positions, sh.levels.coords):
            out.index_add_(0, coords, recv.index_select(0, pos))
        return out.div_(self.n)


def device_round(r: Round, rank: int, device: torch.device, stream: Any = None, bounds: np.ndarray | None = None,
                 dtype: torch.dtype | None = None) -> DeviceRound:
    """``r`` (a native or Python round) as :class:`~permk.transport.ddp.DeviceRound` for ``rank`` on ``device``: the
    plan's arrays formed on the CPU (numpy) and, for a CUDA device, copied from pinned memory
    without blocking on ``stream`` (an event the transport's stream waits for). Cost: ``O(n)``
    for a round of equal aligned blocks (BlockPermK(n) with ``n | d``); otherwise the round's
    coordinates (``O(d)``), and for a summed round their levels (``O(values + d)``). ``bounds``
    (``n + 1`` increasing coordinates from 0 to ``d``): the shards of a sharded transport, whose
    routes are formed too (``ShardRoutes``, ``O(d)``). ``dtype``: the bucket's; a float32/float64
    CPU bucket with a disjoint native round of listed coordinates (PermK's owners) keeps that
    round and forms nothing (placement ``"native"``, ``O(n)``)."""
    n, d = r.n, r.d
    offsets, scales = np.asarray(r.offsets(), dtype=np.int64), np.asarray(r.scales(), dtype=np.float64)
    counts = np.diff(offsets)
    width = max(1, int(counts.max(initial=0)))
    disjoint = bool(r.disjoint)
    ranges = r.ranges()
    if ranges is not None:
        ranges = tuple(np.asarray(a) for a in ranges)  # type: ignore[assignment]
    if (ranges is None and disjoint and bounds is None and device.type == "cpu" and dtype in NATIVE_DTYPES
            and isinstance(r, NativeRound)):
        return DeviceRound(n=n, d=d, rank=rank, disjoint=True, offsets=offsets, scales=scales, ranges=None,
                           mine=None, coords=None, placement="native", place=r, device=device)
    host: dict[str, Any] = {}
    mine: Tensor | slice = slice(0, 0)
    coords_np: np.ndarray | None = None
    blocks_aligned = False
    if ranges is not None:
        starts, stops = ranges[0].astype(np.int64), ranges[1].astype(np.int64)
        mine = slice(int(starts[rank]), int(stops[rank]))
        blocks_aligned = bool((counts == width).all() and (starts % width == 0).all() and d % width == 0)
    if ranges is None:
        coords_np = np.asarray(r.coords(0, n), dtype=np.int64)
        host["mine"] = True
    elif bounds is not None or not (disjoint or blocks_aligned):
        coords_np = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(starts, stops)])
    placement: str
    if disjoint and blocks_aligned:
        placement = "blocks"
        host["blocks"] = (starts // width).astype(np.int64)
    elif disjoint and ranges is not None:
        placement = "slices"  # every worker's values are one contiguous range of the mean
        order = np.argsort(starts, kind="stable")
        order = order[counts[order] > 0]
        tiles = bool(starts[order[0]] == 0 and (stops[order[:-1]] == starts[order[1:]]).all() and stops[order[-1]] == d) \
            if order.size else False
        host["slices"] = ([(int(w), int(starts[w]), int(counts[w])) for w in order], tiles)
    elif disjoint and counts.size and int(counts.min()) >= 1:
        assert coords_np is not None
        placement = "padded"
        if (counts == width).all():
            host["padded"] = coords_np
        else:  # each worker's slot padded by repeating its last coordinate (its sender repeats its last value)
            padded = np.empty((n, width), dtype=np.int64)
            for w in range(n):
                a, b = offsets[w], offsets[w + 1]
                padded[w, : b - a] = coords_np[a:b]
                padded[w, b - a :] = coords_np[b - 1]
            host["padded"] = padded.reshape(-1)
        host["covers"] = int(offsets[-1]) == d
    elif disjoint:
        assert coords_np is not None
        placement = "compact"
        host["positions"] = _slot_positions(offsets, width)
        host["coords"] = coords_np
    else:
        placement = "levels"
        host["levels"] = _levels(offsets, width, coords_np, ranges, d)
    shard_host = None
    if bounds is not None:
        assert coords_np is not None
        coords_np, shard_host = _shard_routes(coords_np, offsets, rank, np.asarray(bounds, dtype=np.int64), disjoint)
        host["mine"] = True
    if coords_np is not None:
        host["all"] = coords_np

    event = None
    on_cuda = device.type == "cuda"

    def up(a: np.ndarray) -> Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a))
        if not on_cuda:
            return t if device.type == "cpu" else t.to(device)
        return t.pin_memory().to(device, non_blocking=True)

    ctx = torch.cuda.stream(stream) if (on_cuda and stream is not None) else _nullcontext()
    with ctx:
        all_t = up(host["all"]) if "all" in host else None
        mine_t = all_t[int(offsets[rank]) : int(offsets[rank + 1])] if "mine" in host and all_t is not None else mine
        if placement == "blocks":
            place: Any = (up(host["blocks"]),)
        elif placement == "slices":
            place = host["slices"]
        elif placement == "padded":
            place = (all_t if host["padded"] is host["all"] else up(host["padded"]), host["covers"])
        elif placement == "compact":
            place = (up(host["positions"]), all_t)
        else:
            pos, co, blocks = host["levels"]
            place = Levels([up(p) for p in pos], [up(c) for c in co], blocks)
        shard = None
        if shard_host is not None:
            send_splits, recv_splits, local, covers, (lpos, lco) = shard_host
            shard = ShardRoutes(send_splits, recv_splits, up(local), covers, Levels([up(p) for p in lpos], [up(c) for c in lco], False))
        if on_cuda:
            event = torch.cuda.Event()
            event.record(stream if stream is not None else torch.cuda.current_stream())
    return DeviceRound(n=n, d=d, rank=rank, disjoint=disjoint, offsets=offsets, scales=scales, ranges=ranges,  # type: ignore[arg-type]
                       mine=mine_t, coords=all_t, placement=placement, place=place, device=device, event=event, shard=shard)


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _shard_routes(coords: np.ndarray, offsets: np.ndarray, rank: int, bounds: np.ndarray,
                  disjoint: bool) -> tuple[np.ndarray, tuple[Any, ...]]:
    """A sharded round's routes (``ShardRoutes``, as numpy): the round's coordinates with this
    rank's listed by destination shard (a stable sort: plan order within a destination), what
    it sends to each rank, what it receives from each worker and at which local coordinates
    (worker order, each worker's in the order it lists them), and the levels of a summed round."""
    n = len(offsets) - 1
    lo, hi = int(offsets[rank]), int(offsets[rank + 1])
    mine = coords[lo:hi]
    dest = np.searchsorted(bounds[1:-1], mine, side="right")
    if dest.size > 1 and (np.diff(dest) < 0).any():  # not already grouped (sorted coordinates are)
        order = np.argsort(dest, kind="stable")
        coords = coords.copy()
        coords[lo:hi] = mine[order]
        dest = dest[order]
    send_splits = np.bincount(dest, minlength=n).astype(np.int64)
    a, b = int(bounds[rank]), int(bounds[rank + 1])
    # what every worker sends to this rank: its coordinates in the shard, in the order its sender lists them
    # (the sender's listing is grouped by destination with plan order kept, so this is plan order)
    inside = (coords >= a) & (coords < b)
    local = coords[inside] - a
    cum = np.concatenate([[0], np.cumsum(inside, dtype=np.int64)])
    recv_splits = cum[offsets[1:]] - cum[offsets[:-1]]
    covers = disjoint and int(local.size) == b - a
    levels: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    if not disjoint and local.size:
        roff = np.concatenate([[0], np.cumsum(recv_splits)])
        pos, co, _ = _levels(roff, 1, local, None, b - a, positions=np.arange(local.size, dtype=np.int64))
        levels = (pos, co)
    return coords, ([int(v) for v in send_splits], [int(v) for v in recv_splits], local, covers, levels)


def _slot_positions(offsets: np.ndarray, width: int) -> np.ndarray:
    """The position of every value of the round (worker order) in the padded gather buffer."""
    counts = np.diff(offsets)
    rows = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    return rows * width + (np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], counts))


def _levels(offsets: np.ndarray, width: int, coords: np.ndarray | None, ranges: Any, d: int,
            positions: np.ndarray | None = None) -> tuple[list[np.ndarray], list[np.ndarray], bool]:
    """A summed round's levels (``Levels``, as numpy arrays): level ``j`` holds the
    ``j``-th sender of each coordinate in worker order. Equal aligned blocks (BlockPermK(m))
    in ``O(n)``: workers sharing a block are its levels; otherwise each entry's count of earlier
    senders of its coordinate (``O(values + d)``)."""
    n = len(offsets) - 1
    counts = np.diff(offsets)
    if ranges is not None:
        starts = np.asarray(ranges[0], dtype=np.int64)
        if (counts == width).all() and (starts % width == 0).all() and d % width == 0:
            taken: dict[int, int] = {}
            level = np.empty(n, dtype=np.int64)
            for w in range(n):
                level[w] = taken.get(int(starts[w]), 0)
                taken[int(starts[w])] = int(level[w]) + 1
            pos = [np.flatnonzero(level == j) for j in range(int(level.max(initial=-1)) + 1)]
            return pos, [starts[p] // width for p in pos], True
    assert coords is not None
    if positions is None:
        positions = _slot_positions(offsets, width)
    # each entry's level: how many earlier workers sent its coordinate (a worker's coordinates are
    # distinct, so one vectorised count per worker is exact), in O(values + d)
    seen = np.zeros(d, dtype=np.int16 if n < 2**15 else np.int64)
    occ = np.empty(coords.size, dtype=seen.dtype)
    for w in range(n):
        c = coords[offsets[w] : offsets[w + 1]]
        occ[offsets[w] : offsets[w + 1]] = seen[c]
        seen[c] += 1
    sizes = np.bincount(occ, minlength=1) if occ.size else np.zeros(0, dtype=np.int64)
    order = np.argsort(occ, kind="stable")  # by level, worker and plan order kept within one (a radix sort)
    sel = np.split(order, np.cumsum(sizes)[:-1]) if occ.size else []
    return [positions[s] for s in sel], [coords[s] for s in sel], False


class Planner:
    """The rounds of one bucket, computed ahead: :meth:`~permk.transport.ddp.Planner.take` returns
    round ``r`` (the one computed ahead when it is that round, else computed now) and starts round
    ``r + 1`` on the planner's thread (shared by every bucket of a hook, one job at a time, in order), so that the
    next round's plan — the native round (computed with the GIL released), its coordinates and,
    on CUDA, their upload from pinned memory on a side stream — is ready when the bucket next
    communicates."""

    def __init__(self, compressor: Compressor, n: int, rank: int, d: int, seed: int, device: torch.device,
                 executor: ThreadPoolExecutor | None, what: str, bounds: np.ndarray | None = None,
                 dtype: torch.dtype | None = None, defer: bool = False) -> None:
        self.compressor, self.n, self.rank, self.d, self.seed, self.bounds = compressor, n, rank, d, seed, bounds
        #: the bucket's dtype (float32/float64 on CPU: native placement where the round allows, see device_round)
        self.dtype = dtype
        self.device, self.executor, self.what = device, executor, what
        self._ahead: tuple[int, _Pending[DeviceRound]] | None = None
        #: a deferred planner starts round ``r + 1`` when its transport's exchange of round ``r``
        #: is done (:meth:`~permk.transport.ddp.Planner.start_next`), not when round ``r`` is taken
        self.defer = bool(defer)
        self._next: int | None = None
        self._lock = threading.Lock()
        self._stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None

    def _compute(self, r: int) -> DeviceRound:
        try:
            rnd = self.compressor.round(self.n, self.d, seed=self.seed, round=r)
        except ValueError as exc:
            raise ValueError(f"compressor: {self.compressor.name} does not fit the world size {self.n} and {self.what} of "
                             f"{self.d} values: {exc}") from exc
        if self._stream is not None:
            with torch.cuda.device(self.device):
                return device_round(rnd, self.rank, self.device, self._stream, self.bounds)
        return device_round(rnd, self.rank, self.device, bounds=self.bounds, dtype=self.dtype)

    def take(self, r: int) -> DeviceRound:
        """Round ``r`` on the device (the one computed ahead when it is that round, else computed
        now), ready for the current stream; round ``r + 1`` starts on the planner's thread."""
        with self._lock:
            ahead, self._ahead, self._next = self._ahead, None, None
        if ahead is not None and ahead[0] == r:
            out = ahead[1].result()
        else:
            if ahead is not None:
                ahead[1].cancel()
            out = self._compute(r)
        if self.executor is not None:
            if self.defer:
                self._next = r + 1
            else:
                self._ahead = (r + 1, self.executor.submit(self._compute, r + 1))
        out.ready()
        return out

    def start_next(self) -> None:
        """A deferred planner's lookahead: start the round after the last one taken on the
        planner's thread, once (nothing for a planner that is not deferred, or has no thread).
        Its transport calls it when the exchange is done, so that the plan's computation overlaps
        the rest of the step rather than the collective."""
        with self._lock:
            if self.executor is None or self._next is None:
                return
            nxt, self._next = self._next, None
            self._ahead = (nxt, self.executor.submit(self._compute, nxt))


class DDPTransport:
    """One bucket of ``d`` values of ``dtype`` on ``device``, on one rank of ``group`` (see the
    module docstring): the transport of :mod:`permk.exchanges` whose one held worker is this
    rank. ``planner`` gives the rounds (:class:`~permk.transport.ddp.Planner`); ``target`` is where the next mean
    is written (the bucket itself, for a DDP hook), else a buffer of the transport."""

    forced = "auto"
    local = False
    kernel = None
    has_coords = False
    where = " on torch.distributed"

    def __init__(self, group: Any, n: int, rank: int, d: int, dtype: torch.dtype, device: torch.device,
                 planner: Planner | None, *, floats: int | None = None, bounds: np.ndarray | None = None) -> None:
        if dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"gradient dtype {dtype} is not supported (float32, float64, bfloat16 or float16)")
        self.group, self.n, self.rank, self.d = group, n, rank, d
        self.dtype, self.device, self.planner = dtype, device, planner
        self.workers = range(rank, rank + 1)
        self.paths: dict[Any, Any] = {}
        self.target: Tensor | None = None
        width = max(1, int(floats if floats is not None else d))
        #: the send slot and the gathered slots, allocated once for the largest message
        self.send = torch.empty(width, dtype=dtype, device=device)
        self.recv = torch.empty(n * width, dtype=dtype, device=device)
        #: the shards (``n + 1`` bounds) of a sharded transport, whose means are this rank's shard
        #: of the mean (:meth:`~permk.transport.ddp.DDPTransport.mean_values`), else None
        self.bounds = None if bounds is None else np.asarray(bounds, dtype=np.int64)
        self._size = d if bounds is None else int(self.bounds[rank + 1] - self.bounds[rank])  # type: ignore[index]
        self._mean: Tensor | None = None  # allocated when a mean has no target (shifted exchanges)
        #: ``(sent, padded)`` bytes of the last exchange: this rank's values, and its slot
        self.last_bytes = (0, 0)
        #: the bytes of the last sharded exchange that left this rank (to the other ranks)
        self.last_wire = 0
        self._owned: list[int] = []

    # -- the held worker ------------------------------------------------------------------------
    def local_grads(self, x: Tensor) -> Tensor:
        """The held worker's row: the bucket ``x`` itself (a ``(1, d)`` tensor)."""
        return x

    def grad_blocks(self, x: Tensor) -> Iterator[tuple[int, int, Tensor]]:
        yield 0, 1, x

    def coords(self, x: Any, rows: Any, cols: Any) -> Any:
        raise TypeError("the DDP transport has no coordinate oracle (has_coords is False)")

    def message_blocks(self, compressor: Compressor, x: Tensor, H: Tensor | None, beta: float, seed: int,
                       round: int) -> Iterator[tuple[int, int, Messages | None]] | None:
        """The held worker's message on ``x − β h`` from a compressor without a shared plan,
        computed on the device: TopK (its ``k`` largest magnitudes, ties to the lower index,
        listed in increasing order: the core's TopK) and Identity."""
        v = x if H is None else (x - H if beta == 1.0 else x - beta * H)
        name = type(compressor).__name__
        if name == "TopK":
            idx = topk_indices(v[0], int(compressor.floats_per_worker(self.n, self.d)))
        elif name == "Identity":
            idx = torch.arange(self.d, device=v.device)
        else:
            raise TypeError(f"{compressor.name} has no shared plan and no device kernel in the DDP transport (TopK, Identity)")
        offsets = np.array([0, idx.numel()], dtype=np.int64)
        return iter([(0, 1, Messages(offsets, cast(np.ndarray, idx), cast(np.ndarray, v[0].index_select(0, idx))))])

    # -- the array operations the exchanges ask of a transport of tensors -----------------------
    def rows_of(self, a: Any, what: str) -> Tensor:
        """``a``: the held worker's ``(1, d)`` row, a floating tensor (TypeError or ValueError
        naming ``what`` otherwise)."""
        if not isinstance(a, Tensor) or not a.is_floating_point():
            raise TypeError(f"{what} must be a floating tensor on the DDP transport, got {type(a).__name__}")
        if tuple(a.shape) != (1, self.d):
            raise ValueError(f"{what} must be the held worker's row of length {self.d}, got shape {tuple(a.shape)}")
        return a

    def own(self, H: Tensor) -> Tensor:
        """``H`` when the caller handed it over to be updated in place (:meth:`~permk.transport.ddp.DDPTransport.hand_over`), else a copy."""
        return H if H.data_ptr() in self._owned else H.clone()

    def hand_over(self, H: Tensor) -> Tensor:
        """Mark ``H`` (a state tensor of the caller) as updated in place by the exchanges."""
        if H.data_ptr() not in self._owned:
            self._owned = [H.data_ptr(), *self._owned[:3]]
        return H

    @staticmethod
    def all_finite(a: Tensor) -> bool:
        """True, without looking: the DDP transport never waits for the device to check values
        (non-finite values reach the mean, as with all-reduce)."""
        return True

    def add_at(self, H: Tensor, rows: Any, cols: Tensor, vals: Tensor) -> None:
        """``H[rows, cols] += vals`` with distinct ``(row, col)`` pairs (the held worker's row)."""
        if H.shape[0] == 1:  # one held worker: its row, without sending the row numbers to the device
            H[0].index_put_((cols,), vals, accumulate=True)
        else:
            H.index_put_((torch.as_tensor(rows, device=H.device), cols), vals, accumulate=True)

    # -- moving numbers ---------------------------------------------------------------------------
    def plan(self, compressor: Compressor, seed: int, round: int) -> DeviceRound:
        """Round ``round``'s plan on the device (computed ahead by the planner)."""
        assert self.planner is not None and self.planner.compressor is compressor and self.planner.seed == seed
        return self.planner.take(round)

    def _out(self) -> Tensor:
        t, self.target = self.target, None
        if t is not None:
            return t
        if self._mean is None:
            self._mean = torch.empty(self._size, dtype=self.dtype, device=self.device)
        return self._mean

    def mean_values(self, compressor: Compressor, r: DeviceRound, fill: Callable[..., Tensor]) -> torch.futures.Future[Tensor]:
        """Start the exchange of a shared plan's round: this rank's values (``fill``, divided by
        ``n`` for a disjoint round) written into its slot, one ``all_gather_into_tensor``, and a
        future of the mean (:meth:`~permk.transport.ddp.DeviceRound.place`)."""
        k, w = int(r.counts[self.rank]), r.width
        out = self._out()
        if self.bounds is not None:
            return self._mean_shard(r, fill, k, out)
        send, recv = self.send[:w], self.recv[: self.n * w]
        if k:
            fill(self.rank, self.rank + 1, self.n if r.disjoint else None, send[:k])
            if k < w:  # the pad repeats the last value (its coordinate is repeated in the plan)
                send[k:].copy_(send[k - 1 : k].expand(w - k))
        else:
            send.zero_()
        item = send.element_size()
        self.last_bytes = (k * item, w * item)
        work = dist.all_gather_into_tensor(recv, send, group=self.group, async_op=True)
        assert work is not None
        planner = self.planner

        def done(_: Any) -> Tensor:
            mean = r.place(recv, out)
            if planner is not None:
                planner.start_next()  # a deferred planner's next round, now that the collective is done
            return mean

        return work.get_future().then(done)

    def _mean_shard(self, r: DeviceRound, fill: Callable[..., Tensor], k: int, out: Tensor) -> torch.futures.Future[Tensor]:
        """A sharded transport's exchange: this rank's values (listed by destination) go straight
        to the ranks holding their coordinates' shards in one ``all_to_all``, nothing summed on
        the way; a future of this rank's shard of the mean (:meth:`~permk.transport.ddp.DeviceRound.place_shard`)."""
        sh = r.shard
        assert sh is not None, "a sharded transport's planner forms the routes"
        send = self.send[:k]
        if k:
            fill(self.rank, self.rank + 1, self.n if r.disjoint else None, send)
        recv = self.recv[: sum(sh.recv_splits)]
        item = send.element_size()
        self.last_bytes = (k * item, k * item)
        self.last_wire = (k - sh.send_splits[self.rank]) * item  # what leaves this rank (its own shard's part stays)
        work = dist.all_to_all_single(recv, send, output_split_sizes=sh.recv_splits, input_split_sizes=sh.send_splits,
                                      group=self.group, async_op=True)
        assert work is not None
        return work.get_future().then(lambda _: r.place_shard(recv, out))

    def mean_pairs(self, compressor: Compressor, msgs: Messages) -> torch.futures.Future[Tensor]:
        """Start the exchange of messages sent as ``(index, value)`` pairs of a fixed size (TopK):
        both gathered, summed in worker order from zero (one scatter-add per worker), divided by
        ``n``; a future of the mean."""
        k = int(msgs.offsets[-1])
        wide = self.d >= 2**31
        idx = cast(Tensor, msgs.indices).reshape(-1).to(torch.int64 if wide else torch.int32)
        vals = cast(Tensor, msgs.values).reshape(-1).to(self.dtype)
        all_idx = torch.empty(self.n * k, dtype=idx.dtype, device=idx.device)
        all_vals = torch.empty(self.n * k, dtype=self.dtype, device=vals.device)
        self.last_bytes = (k * (vals.element_size() + idx.element_size()),) * 2  # type: ignore[assignment]
        w1 = dist.all_gather_into_tensor(all_idx, idx.contiguous(), group=self.group, async_op=True)
        w2 = dist.all_gather_into_tensor(all_vals, vals.contiguous(), group=self.group, async_op=True)
        assert w1 is not None and w2 is not None
        out = self._out()

        def done(_: Any) -> Tensor:
            w1.wait()
            out.zero_()
            coords = all_idx.to(torch.int64)
            for w in range(self.n):  # one scatter-add per worker: distinct coordinates within each
                out.index_add_(0, coords[w * k : (w + 1) * k], all_vals[w * k : (w + 1) * k])
            return out.div_(self.n)

        return w2.get_future().then(done)

    def mean_rows(self, rows: Tensor) -> Tensor:
        """``(1/n) Σ_i v_i`` of the workers' rows: an all-reduce of this rank's row, divided by ``n``."""
        out = rows.reshape(-1).clone()
        dist.all_reduce(out, group=self.group)
        return out.div_(self.n)

    def mean_grad(self, x: Tensor) -> Tensor:
        return self.mean_rows(x)


def topk_indices(v: Tensor, k: int) -> Tensor:
    """The ``k`` largest magnitudes of ``v`` (ties: the lower index), in increasing order: the
    core's TopK, on ``v``'s device and without waiting for it (no data-dependent shapes)."""
    d = v.numel()
    k = max(0, min(int(k), d))
    if k == 0:
        return torch.zeros(0, dtype=torch.int64, device=v.device)
    if k == d:
        return torch.arange(d, device=v.device)
    a = v.abs()
    thr = torch.topk(a, k, sorted=False).values.min()
    above = a > thr
    need = k - above.sum()
    tie = a == thr
    take = above | (tie & (torch.cumsum(tie, 0) <= need))
    return torch.nonzero_static(take, size=k).reshape(-1)

