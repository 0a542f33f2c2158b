"""The permutation family (Definitions 1 and 2 and the appendix "More Examples of
Permutation-Based Compressors"): PermK, the block permutation compressor, coordinate sampling,
independent copies inside groups of workers, and the permutation of mappings. Their workers'
messages are correlated through one shared permutation (or draw) of ``(seed, round)``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Sequence

import numpy as np

from .._core import permutation as shared_permutation
from .._validate import as_float_array, check_int, check_partition, check_seed
from ..testing import magnitude_bound
from .base import Capabilities, Compressor
from .messages import Message, Plan
from .rust import Sparsifier

__all__ = ["PermK", "BlockPermK", "CoordinateSampling", "GroupPermK", "PermutationOfMappings"]


def _iv_constant(n: int, q: int) -> float:
    """``1 - n(q-1)/((n-1)q) = (n-q)/((n-1)q)``: the IV constant of the block/permutation
    compressors with ``q`` workers per block (0 when every worker sends everything)."""
    return 0.0 if n == q else (n - q) / ((n - 1) * q)


#: PermK's samplers (:class:`PermK`'s ``sampler``): the same distribution, different streams.
PERMK_SAMPLERS = ("rebalance", "shuffle")


@dataclass(frozen=True)
class PermK(Sparsifier):
    """PermK (Definitions 1 and 2, and their general forms in "General Examples of PermK").

    For ``d >= n`` (``d = kn + r``) one shared permutation of the coordinates gives worker ``i``
    the block ``π[ik:(i+1)k]``; a second permutation of the workers hands the ``r`` leftover
    coordinates to ``r`` of them; values are scaled by ``n``. Theorem "PermK" (d ≥ n): ``IV(1)``,
    ``A = B = 1``. For ``n > d`` (``n = qd + r``) each coordinate goes to ``q`` workers chosen by
    a shared permutation of the workers, ``r`` workers stay idle, values are scaled by ``n/q``:
    ``A = B = 1 - n(q-1)/((n-1)q)`` (Theorem "PermK" (n ≥ d): ``1 - (n-d)/(n-1)`` when ``d | n``).
    No indices are sent: every worker recomputes the round's assignment from ``(seed, round)``.

    A message depends only on *which* coordinates a worker owns, not on their order in the
    permutation's block, and the definition makes the assignment uniformly random among those
    in which ``r`` workers (uniform) own ``k + 1`` coordinates and the others ``k``. ``sampler``
    says how a round draws it (``d >= n``; both draw this distribution, from different streams):

    * ``"rebalance"`` (default): every coordinate's owner drawn independently and uniformly, in
      fixed chunks of coordinates from their own streams (about ``log2 n`` random bits per
      coordinate, streaming memory access, on the core's threads), then rebalanced — each worker
      over its count releases a uniformly random subset of its surplus and the released
      coordinates take a uniform arrangement of the missing owners (about ``0.4·sqrt(nd)`` of
      them). The result is exactly uniform over the balanced assignments (every step commutes
      with relabelling the coordinates; the tests check it by exact enumeration) and a pure
      function of ``(seed, round, n, d)``, whatever the number of threads;
    * ``"shuffle"``: the definition's permutations themselves, a Fisher–Yates shuffle of the
      ``d`` owner labels (random access over ``d`` labels), PermK's only sampler before
      ``"rebalance"`` became the default: ``PermK(sampler="shuffle")`` reproduces the runs
      recorded with it, bit for bit.

    For ``n > d`` both are the same (a permutation of the ``n`` workers). Every worker's
    coordinates are listed in increasing order.

    The variance depends only on every coordinate having exactly one owner, uniform over the
    workers, so :class:`BlockPermK` with ``m = n`` (fixed contiguous blocks handed out by a random
    permutation of the workers) has the same ``(A, B) = (1, 1)`` with O(n) shared randomness per
    round instead of O(d), and contiguous messages; ``PermK()`` moves every coordinate to a fresh
    random owner every round (e.g. when the large entries of an adversarially ordered gradient
    share a block).

    >>> PermK().ab_constants(10, 100), PermK().ab_constants(10, 5)
    ((1.0, 1.0), (0.4444444444444444, 0.4444444444444444))
    >>> PermK(sampler="shuffle").name
    "PermK(sampler='shuffle')"
    """

    sampler: str = "rebalance"
    capabilities = Capabilities(shared_plan=True)
    ab_exact = True
    permutation_based = True

    def __post_init__(self) -> None:
        if not isinstance(self.sampler, str):
            raise TypeError(f"sampler must be one of {', '.join(map(repr, PERMK_SAMPLERS))}, got {self.sampler!r}")
        if self.sampler not in PERMK_SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(map(repr, PERMK_SAMPLERS))}, got {self.sampler!r}")

    @property
    def name(self) -> str:
        return "PermK" if self.sampler == "rebalance" else f"PermK(sampler={self.sampler!r})"

    @classmethod
    def examples(cls, n: int, d: int, rng: np.random.Generator | None = None) -> list[Compressor]:
        """Both samplers."""
        return [cls(sampler=s) for s in PERMK_SAMPLERS]

    def kernel_args(self) -> dict[str, Any]:
        return {"sparsifier": "permk", "sampler": self.sampler}

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray:
        n, d = np.shape(A)
        return (float(n) if d >= n else n / (n // d)) * np.abs(A)

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        self.check(n, d)
        a = 1.0 if d >= n else _iv_constant(n, n // d)
        return (a, a)

    def omega(self, n: int, d: int) -> float:
        self.check(n, d)
        return float(n - 1) if d >= n else n / (n // d) - 1.0

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return -(-d // n) if d >= n else 1

    def expected_floats_per_worker(self, n: int, d: int) -> float:
        self.check(n, d)
        return d / n if d >= n else (n // d) * d / n


@dataclass(frozen=True)
class BlockPermK(Sparsifier):
    """The block permutation compressor ("More Examples", Definition "block permutation").

    The coordinates are partitioned into ``m <= n`` non-empty blocks (``m`` contiguous blocks
    by default, or ``partition[j]`` = block of coordinate ``j``); with ``n = mq + r`` a shared
    permutation of the workers gives ``q`` workers each block (scaled by ``n/q``) and leaves
    ``r`` idle. ``IV(1 - n(q-1)/((n-1)q))``, i.e. ``A = B`` equal to that constant.

    ``BlockPermK(n)`` (``m = n``, the authors' ``permutation_fixed_blocks``) has PermK's
    constants ``(A, B) = (1, 1)`` for every ``d ≥ n`` — each coordinate is owned by exactly one
    uniformly random worker, which is all the variance depends on — while a round needs only a
    permutation of the ``n`` workers (O(n) randomness, not O(d)) and every message is one
    contiguous block: the aggregate is ``n`` contiguous copies, and on MPI the blocks land in the
    aggregate buffer through one ``Allgatherv``. The two converge alike per bit (same second
    moments; see the README's experiment), and which round is cheaper depends on ``n``, ``d``
    and the transport (the README's benchmarks). Unlike PermK, the block of a coordinate never
    changes.

    >>> BlockPermK(2).ab_constants(n=4, d=10)
    (0.3333333333333333, 0.3333333333333333)
    """

    m: int
    partition: tuple[int, ...] | None = field(default=None, compare=True)
    capabilities = Capabilities(shared_plan=True)
    ab_exact = True
    permutation_based = True

    def __post_init__(self) -> None:
        check_int(self.m, "m", low=1)
        if self.partition is not None:
            raw = np.asarray(self.partition)
            if raw.ndim != 1 or (raw.size and raw.dtype.kind not in "iu"):
                raise TypeError(f"partition must be a 1-D sequence of integer block labels, got dtype {raw.dtype} and shape {raw.shape}")
            labels = tuple(int(v) for v in raw)
            if any(v < 0 for v in labels) or set(labels) != set(range(self.m)):
                raise ValueError(f"partition must label every coordinate with a block in range({self.m}), each block non-empty")
            object.__setattr__(self, "partition", labels)

    @property
    def name(self) -> str:
        return f"BlockPermK(m={self.m})"

    @classmethod
    def default(cls, n: int, d: int) -> BlockPermK:
        """``BlockPermK(min(n, d))``: with ``n ≤ d`` that is ``BlockPermK(n)``, PermK's constants."""
        return cls(min(n, d))

    @classmethod
    def examples(cls, n: int, d: int, rng: np.random.Generator | None = None) -> list[Compressor]:
        """Contiguous blocks, and a shuffled partition into the same number of blocks."""
        if rng is None:
            m, labels = min(n, d, 3), np.random.default_rng(d).permutation(np.arange(d) % min(n, d, 3))
        else:
            m = int(rng.integers(1, min(n, d) + 1))
            labels = rng.permutation(np.arange(d) % m)
        return [cls(m), cls(m, partition=tuple(int(v) for v in labels))]

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray:
        n = np.shape(A)[0]
        return n / (n // self.m) * np.abs(A)

    def kernel_args(self) -> dict[str, Any]:
        if self.partition is not None:
            return {"sparsifier": "blockpermk", "labels": list(self.partition)}
        return {"sparsifier": "blockpermk", "m": self.m}

    def _block_sizes(self, d: int) -> np.ndarray:
        if self.partition is not None:
            return np.bincount(np.asarray(self.partition), minlength=self.m)
        return np.diff(np.arange(self.m + 1) * d // self.m)

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        self.check(n, d)
        a = _iv_constant(n, n // self.m)
        return (a, a)

    def omega(self, n: int, d: int) -> float:
        self.check(n, d)
        return n / (n // self.m) - 1.0

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return int(self._block_sizes(d).max())

    def expected_floats_per_worker(self, n: int, d: int) -> float:
        self.check(n, d)
        return (n // self.m) * d / n


@dataclass(frozen=True)
class CoordinateSampling(Sparsifier):
    """Coordinate sampling (the authors' ``coordinate_sampling``): every coordinate is sent by
    one worker drawn independently and uniformly from the ``n`` workers — one draw per
    coordinate from the shared stream of ``(seed, round)`` — and scaled by ``n``.

    Each coordinate has exactly one owner, uniform over the workers, which is all PermK's
    variance depends on: ``(A, B) = (1, 1)``, with equality, and ``ω = n − 1``. Unlike PermK the
    message size is random (binomial): ``expected_floats_per_worker = d/n``, and
    ``floats_per_worker = d`` is the bound. No indices travel (they are recomputed).

    >>> CoordinateSampling().ab_constants(4, 10), CoordinateSampling().expected_floats_per_worker(4, 10)
    ((1.0, 1.0), 2.5)
    """

    capabilities = Capabilities(shared_plan=True, random_size=True)
    ab_exact = True
    permutation_based = True

    def kernel_args(self) -> dict[str, Any]:
        return {"sparsifier": "coordinate_sampling"}

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        self.check(n, d)
        return (1.0, 1.0)

    def omega(self, n: int, d: int) -> float:
        self.check(n, d)
        return float(n - 1)

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return d

    def expected_floats_per_worker(self, n: int, d: int) -> float:
        self.check(n, d)
        return d / n

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray:
        return float(np.shape(A)[0]) * np.abs(A)


def _derived_seed(seed: int, group: int) -> int:
    """An independent seed for group ``group`` of a run with ``seed``: a pure function of both."""
    return int(np.random.SeedSequence([seed, group, 0x67726F7570]).generate_state(1, np.uint64)[0])


@dataclass(frozen=True)
class GroupPermK(Compressor):
    """Independent copies of a permutation compressor inside groups of workers (appendix "Group
    Hessian Variance", Assumption "group AB").

    ``groups`` partitions the workers ``0 … n−1``; the workers of group ``k`` run ``inner``
    (``PermK()`` by default, or ``BlockPermK``) among themselves, with its own stream: a seed
    derived from ``(seed, k)``, so the groups' compressors are independent. Inside a group the
    AB inequality holds with ``inner``'s constants on ``|G_k|`` workers; across groups the
    variances add (Lemma "Group AB inequality"). MARINA's step is then Theorem "AB_group"'s, with
    ``L̂²_G`` from :func:`permk.theory.group_hessian_variance` on the problem
    (:func:`permk.theory.variance_bound` reads :attr:`groups` and :attr:`inner`;
    ``params["gamma_source"]`` says so). As one family on all ``n`` workers it also satisfies
    the plain AB inequality with ``A = max_k |G_k| A_k / n`` and ``B = 1/Σ_k (1/B_k)`` (0 if
    some ``B_k`` is), which the complexity calculator uses.

    >>> g = GroupPermK(((0, 1), (2, 3)))
    >>> g.ab_constants(4, 8), g.floats_per_worker(4, 8)
    ((0.5, 0.5), 4)
    """

    #: The groups of workers, a partition of ``0 … n−1`` (each group a tuple of workers).
    groups: tuple[tuple[int, ...], ...]
    #: The permutation compressor each group runs among its workers (PermK or BlockPermK).
    inner: Compressor = field(default_factory=lambda: PermK())
    capabilities = Capabilities(shared_plan=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", check_partition(self.groups))
        if not isinstance(self.inner, Compressor) or not getattr(self.inner, "permutation_based", False) \
                or not self.inner.capabilities.shared_plan:
            raise TypeError(f"inner must be a permutation compressor with a shared plan (PermK, BlockPermK), got {self.inner!r}")

    @property
    def name(self) -> str:
        return f"GroupPermK(groups={len(self.groups)}, {self.inner.name})"

    @classmethod
    def default(cls, n: int, d: int) -> GroupPermK:
        """Two halves of the workers (one group when ``n = 1``), PermK in each."""
        cut = n // 2
        return cls((tuple(range(cut)), tuple(range(cut, n))) if cut else (tuple(range(n)),))

    @classmethod
    def examples(cls, n: int, d: int, rng: np.random.Generator | None = None) -> list[Compressor]:
        """Halves with PermK; up to three interleaved groups of at least two workers with BlockPermK."""
        k = max(1, min(3, n // 2))
        labels = np.arange(n) % k if rng is None else rng.permutation(np.arange(n) % k)
        interleaved = tuple(tuple(int(i) for i in np.flatnonzero(labels == g)) for g in range(k))
        m = max(1, min(d, min(len(g) for g in interleaved), 2))
        return [cls.default(n, d), cls(interleaved, BlockPermK(m))]

    @property
    def n(self) -> int:
        return sum(len(g) for g in self.groups)

    @cached_property
    def _group_of(self) -> tuple[np.ndarray, np.ndarray]:
        """``(group, index within its group)`` of every worker (computed once)."""
        group, local = np.empty(self.n, dtype=np.int64), np.empty(self.n, dtype=np.int64)
        for k, g in enumerate(self.groups):
            group[list(g)], local[list(g)] = k, np.arange(len(g))
        return group, local

    def check(self, n: int, d: int) -> None:
        super().check(n, d)
        if n != self.n:
            raise ValueError(f"n_workers = {n} does not match the groups, which hold {self.n} workers")
        for g in self.groups:
            self.inner.check(len(g), d)

    # -- theory
    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        self.check(n, d)
        ab = [self.inner.ab_constants(len(g), d) for g in self.groups]
        if any(x is None for x in ab):
            raise ValueError(f"{self.inner.name} states no AB constants")
        A = max(len(g) * float(x[0]) / n for g, x in zip(self.groups, ab))  # type: ignore[index]
        Bs = [float(x[1]) for x in ab]  # type: ignore[index]
        B = 0.0 if min(Bs) <= 0.0 else 1.0 / sum(1.0 / b for b in Bs)
        return (A, B)

    def omega(self, n: int, d: int) -> float | None:
        self.check(n, d)
        ws = [self.inner.omega(len(g), d) for g in self.groups]
        return None if any(w is None for w in ws) else max(ws)  # type: ignore[type-var]

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return max(self.inner.floats_per_worker(len(g), d) for g in self.groups)

    def expected_floats_per_worker(self, n: int, d: int) -> float:
        self.check(n, d)
        return sum(len(g) / n * self.inner.expected_floats_per_worker(len(g), d) for g in self.groups)

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray | None:
        out = np.zeros(np.shape(A))
        for g in self.groups:
            b = magnitude_bound(self.inner, np.asarray(A)[list(g)])
            if b is None:
                return None
            out[list(g)] = b
        return out

    # -- calls: the groups' plans, placed at the global workers
    def plan(self, n: int, d: int, *, seed: int, round: int) -> Plan:
        self.check(n, d)
        seed, round = check_seed(seed), check_int(round, "round")
        parts: list[tuple[int, np.ndarray, float]] = []
        for k, g in enumerate(self.groups):
            p = self.inner.plan(len(g), d, seed=_derived_seed(seed, k), round=round)
            assert p is not None
            parts += [(w, p.worker(j), float(p.scales[j])) for j, w in enumerate(g)]
        parts.sort(key=lambda t: t[0])
        offsets = np.concatenate([[0], np.cumsum([len(c) for _, c, _ in parts])]).astype(np.int64)
        coords = np.concatenate([c for _, c, _ in parts]).astype(np.int64)
        return Plan(offsets, coords, np.array([s for _, _, s in parts]))

    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> Message:
        x = as_float_array(x, 1, "x")
        n = check_int(n_workers, "n_workers", low=1)
        w = check_int(worker, "worker", high=n)
        self.check(n, x.shape[0])
        group, local = self._group_of
        k = int(group[w])
        m = self.inner.checked_compress(x, worker=int(local[w]), n_workers=len(self.groups[k]), seed=_derived_seed(check_seed(seed), k), round=round)
        return Message(worker=w, n_workers=n, d=m.d, indices=m.indices, values=m.values)


@dataclass(frozen=True, eq=False)
class PermutationOfMappings(Compressor):
    """Permutation of mappings (appendix "More Examples of Permutation-Based Compressors",
    Definition and Lemma): ``n`` deterministic linear maps ``Q_1 … Q_n`` of ``R^d``; worker
    ``i`` applies ``Q_{π_i}`` with ``π`` a random permutation of the workers shared from
    ``(seed, round)``.

    ``maps`` are ``(d, d)`` arrays (``Q_i x = maps[i] @ x``), or callables ``Q_i(x)`` with the
    declared ``theta`` and ``omega``. For arrays the conditions are checked to ``tol`` (relative
    to the maps' largest entry): condition 3 ``(1/n) Σ Q_i = I`` and condition 2
    ``Σ Q_iᵀQ_i = θI`` (ValueError naming the failed one), ``θ = tr(Σ Q_iᵀQ_i)/d``, and ``ω``
    from condition 1: ``λ_max((1/n) Σ Q_iᵀQ_i) − 1``. The Lemma gives
    ``A = (ω+1)/n − (1 − θ/n²)/(n−1)`` and ``B = 1 − n(1 − θ/n²)/(n−1)`` (``n > 1``); with
    condition 2 exact, condition 1 is tight (``ω + 1 = θ/n``) and the AB inequality an equality.
    A message is ``Q_{π_i} x`` on the rows where ``Q_{π_i}`` is not zero (arrays; all ``d``
    for callables): the receiver knows the maps and recomputes ``π``, so no indices travel.

    >>> import numpy as np
    >>> R = 0.5 * np.array([[0.0, 1.0], [-1.0, 0.0]])  # a scaled rotation: Q = I ± R
    >>> c = PermutationOfMappings([np.eye(2) + R, np.eye(2) - R])
    >>> c.theta, c.omega(2, 2), c.ab_constants(2, 2)
    (2.5, 0.25, (0.25, 0.25))
    """

    maps: tuple[Any, ...]
    theta: float | None = None
    omega_: float | None = field(default=None, metadata={"doc": "ω of callables"})
    tol: float = 1e-9
    capabilities = Capabilities()
    permutation_based = True

    def __init__(self, maps: Sequence[Any], *, theta: float | None = None, omega: float | None = None, tol: float = 1e-9) -> None:
        if isinstance(maps, (str, bytes)) or not hasattr(maps, "__iter__"):
            raise TypeError(f"maps must be a sequence of (d, d) arrays or of callables, got {type(maps).__name__}")
        items = list(maps)
        if len(items) < 2:
            raise ValueError(f"maps must hold n > 1 maps (the Definition needs n > 1), got {len(items)}")
        tol = float(tol)
        if not (math.isfinite(tol) and tol > 0):
            raise ValueError(f"tol must be a positive finite number, got {tol}")
        if all(callable(q) and not isinstance(q, np.ndarray) for q in items):
            if theta is None or omega is None:
                raise ValueError("maps given as callables need their declared theta and omega")
            th = float(theta)
            om = float(omega)
            if not (math.isfinite(th) and th >= 0 and math.isfinite(om) and om >= 0):
                raise ValueError(f"theta and omega must be non-negative finite numbers, got {theta}, {omega}")
            object.__setattr__(self, "maps", tuple(items))
        else:
            if theta is not None or omega is not None:
                raise ValueError("theta and omega are computed from array maps: pass them only with callables")
            arrs = []
            for i, q in enumerate(items):
                a = np.asarray(q)
                if a.dtype.kind not in "biuf":
                    raise TypeError(f"maps[{i}] must be a real (d, d) array or a callable, got dtype {a.dtype}")
                arrs.append(a.astype(np.float64))
            d = arrs[0].shape[0] if arrs[0].ndim == 2 else -1
            for i, a in enumerate(arrs):
                if a.ndim != 2 or a.shape != (d, d) or d < 1:
                    raise ValueError(f"maps[{i}] must be a (d, d) array with the d of maps[0], got shape {a.shape}")
                if not np.isfinite(a).all():
                    raise ValueError(f"maps[{i}] must be finite")
            Q = np.stack(arrs)
            for a in arrs:
                a.setflags(write=False)
            n = len(arrs)
            scale = 1.0 + float(np.abs(Q).max())
            dev3 = float(np.abs(Q.mean(axis=0) - np.eye(d)).max())
            if dev3 > tol * scale:
                raise ValueError(f"maps fail condition 3 ((1/n) Σ Q_i = I): the largest deviation is {dev3:.3g} > tol·{scale:.3g}")
            QtQ = np.einsum("nki,nkj->ij", Q, Q)
            th = float(np.trace(QtQ)) / d
            dev2 = float(np.abs(QtQ - th * np.eye(d)).max())
            if dev2 > tol * scale**2 * n:
                raise ValueError(f"maps fail condition 2 (Σ Q_iᵀQ_i = θI): the largest deviation from θI (θ = {th:.6g}) is {dev2:.3g}")
            om = max(float(np.linalg.eigvalsh(QtQ / n)[-1]) - 1.0, 0.0)
            object.__setattr__(self, "maps", tuple(arrs))
        object.__setattr__(self, "theta", th)
        object.__setattr__(self, "omega_", om)
        object.__setattr__(self, "tol", tol)

    @property
    def ab_exact(self) -> bool:  # type: ignore[override]
        """Whether the AB inequality holds with equality (condition 1 tight, ``ω + 1 = θ/n``)."""
        assert self.theta is not None and self.omega_ is not None
        return bool(abs(self.omega_ + 1.0 - self.theta / len(self.maps)) <= 1e-12 * (1.0 + self.omega_))

    @property
    def _arrays(self) -> bool:
        return isinstance(self.maps[0], np.ndarray)

    @property
    def name(self) -> str:
        return f"PermutationOfMappings(n={len(self.maps)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PermutationOfMappings) and self.fingerprint() == other.fingerprint()

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    @classmethod
    def default(cls, n: int, d: int) -> PermutationOfMappings:
        """PermK's maps as arrays, ``Q_i = n · Diag(block i)`` of ``n`` contiguous blocks (needs
        ``1 < n ≤ d``): PermK itself written as a permutation of mappings (``θ = n²``, ``A = B = 1``)."""
        if not 1 < n <= d:
            raise ValueError(f"PermutationOfMappings.default needs 1 < n <= d, got n={n}, d={d}")
        bounds = np.arange(n + 1) * d // n
        maps = []
        for i in range(n):
            q = np.zeros((d, d))
            idx = np.arange(bounds[i], bounds[i + 1])
            q[idx, idx] = float(n)
            maps.append(q)
        return cls(maps)

    @classmethod
    def examples(cls, n: int, d: int, rng: np.random.Generator | None = None) -> list[Compressor]:
        """For ``n = 2``: ``Q = I ± R`` with ``R`` a scaled random orthogonal matrix (condition 1
        tight); for ``1 < n ≤ d``: PermK's maps; else none."""
        if n == 2:
            r = np.random.default_rng(d) if rng is None else rng
            O, _ = np.linalg.qr(r.standard_normal((d, d)))
            R = (0.5 if rng is None else float(rng.uniform(0.1, 2.0))) * O
            return [cls([np.eye(d) + R, np.eye(d) - R])]
        return [cls.default(n, d)] if 1 < n <= d else []

    def _apply(self, u: int, x: np.ndarray) -> np.ndarray:
        q = self.maps[u]
        y = q @ x if self._arrays else np.asarray(q(x))
        if y.dtype.kind not in "biuf":
            raise TypeError(f"maps[{u}](x) returned dtype {y.dtype}, expected real numbers (a complex map is not a map of R^d)")
        if y.shape != x.shape:
            raise ValueError(f"maps[{u}](x) returned shape {y.shape}, expected {x.shape}")
        return np.asarray(y, dtype=x.dtype)

    @cached_property
    def _supports(self) -> tuple[np.ndarray, ...] | None:
        """The rows where each array map is not zero (its messages' coordinates)."""
        if not self._arrays:
            return None
        return tuple(np.flatnonzero(np.abs(q).sum(axis=1) > 0) for q in self.maps)

    def check(self, n: int, d: int) -> None:
        super().check(n, d)
        if n != len(self.maps):
            raise ValueError(f"n_workers = {n} does not match the {len(self.maps)} maps")
        if self._arrays and d != self.maps[0].shape[0]:
            raise ValueError(f"d = {d} does not match the maps' dimension {self.maps[0].shape[0]}")

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        self.check(n, d)
        assert self.theta is not None and self.omega_ is not None
        c = 1.0 - self.theta / n**2
        return ((self.omega_ + 1.0) / n - c / (n - 1), 1.0 - n * c / (n - 1))

    def omega(self, n: int, d: int) -> float:
        self.check(n, d)
        assert self.omega_ is not None
        return self.omega_

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        sup = self._supports
        return d if sup is None else max(len(s) for s in sup)

    def expected_floats_per_worker(self, n: int, d: int) -> float:
        self.check(n, d)
        sup = self._supports
        return float(d) if sup is None else float(np.mean([len(s) for s in sup]))

    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> Message:
        x = as_float_array(x, 1, "x")
        n = check_int(n_workers, "n_workers", low=1)
        w = check_int(worker, "worker", high=n)
        self.check(n, x.shape[0])
        u = int(shared_permutation(check_seed(seed), check_int(round, "round"), n)[w])
        y = self._apply(u, x)
        sup = self._supports
        idx = np.arange(x.shape[0]) if sup is None else sup[u]
        vals = y[idx]
        if not np.isfinite(vals).all():
            raise ValueError(f"non-finite value (NaN or inf) in the compressed output of worker {w}")
        return Message(worker=w, n_workers=n, d=x.shape[0], indices=idx, values=vals)


