"""The compressors of the paper, each a small frozen object carrying its theory.

Every compressor is a *family* ``{C_i}`` for ``n`` workers (Assumptions 1-2 of the paper):

* ``compress(x, worker=i, n_workers=n, seed=s, round=t)`` is what worker ``i`` runs: a compact
  :class:`Message` (indices, values) of exactly the size the theory says;
* ``aggregate(A, seed=s, round=t)`` returns ``(1/n) Σ_i C_i(A[i])`` for the ``(n, d)`` array of
  worker inputs (summed in worker order, then divided by ``n``), and ``compress_all`` the rows
  ``C_i(A[i])``; both agree bit for bit with ``compress`` called worker by worker.

All randomness workers share in round ``t`` (PermK's permutations) is a pure function of
``(seed, t)``; per-worker randomness (RandK, quantizers) is a pure function of
``(seed, t, worker)``. The built-in compressors run in Rust; subclass :class:`Compressor` and
implement :meth:`Compressor.compress` to define a new (possibly correlated) one in Python.

>>> import numpy as np, permk
>>> A = np.arange(12.0).reshape(3, 4)
>>> c = permk.PermK()
>>> c.ab_constants(3, 4)
(1.0, 1.0)
>>> msg = c.compress(A[0], worker=0, n_workers=3, seed=1, round=0)
>>> len(msg.values) <= 2
True
>>> np.allclose(np.mean([c.aggregate(A, seed=1, round=t) for t in range(4000)], axis=0), A.mean(0), atol=0.3)
True
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple, Sequence

import numpy as np

from . import _core
from ._validate import as_float_array, check_int, check_seed

__all__ = [
    "Message",
    "Plan",
    "Compressor",
    "PermK",
    "RandK",
    "TopK",
    "Identity",
    "BlockPermK",
    "NaturalCompression",
    "QSGD",
    "Compose",
    "aggregate_messages",
]


@dataclass(frozen=True)
class Message:
    """What one worker sends in one round: ``values`` at coordinates ``indices`` of ``R^d``.

    For PermK and RandK the indices are a function of ``(seed, round, worker)`` that the
    receiver recomputes, so they are not transmitted (see :meth:`Compressor.bits_per_worker`).
    """

    worker: int
    n_workers: int
    d: int
    indices: np.ndarray
    values: np.ndarray

    def to_dense(self) -> np.ndarray:
        """The message as a vector of ``R^d`` (``C_i(x)``)."""
        out = np.zeros(self.d, dtype=self.values.dtype)
        out[self.indices] = self.values
        return out


class Plan(NamedTuple):
    """The coordinates every worker sends in one round (CSR): worker ``i`` sends
    ``coords[offsets[i]:offsets[i+1]]``, each value multiplied by ``scales[i]``."""

    offsets: np.ndarray
    coords: np.ndarray
    scales: np.ndarray

    def worker(self, i: int) -> np.ndarray:
        """The coordinates worker ``i`` sends."""
        return self.coords[self.offsets[i] : self.offsets[i + 1]]


def aggregate_messages(messages: Sequence[Message]) -> np.ndarray:
    """The server's average ``(1/n) Σ_i C_i(a_i)`` from all ``n`` workers' messages.

    Summed in worker order, then divided by ``n``: bit for bit what
    :meth:`Compressor.aggregate` returns.
    """
    if not messages:
        raise ValueError("messages must not be empty")
    n, d = messages[0].n_workers, messages[0].d
    ordered = sorted(messages, key=lambda m: m.worker)
    if [m.worker for m in ordered] != list(range(n)) or any(m.d != d or m.n_workers != n for m in ordered):
        raise ValueError(f"need exactly one message from each of the {n} workers, all with the same d")
    acc = np.zeros(d, dtype=np.result_type(*[m.values.dtype for m in ordered]))
    for m in ordered:
        acc += m.to_dense()
    return acc / acc.dtype.type(n)


def _ceil_log2(x: int) -> int:
    return max(1, math.ceil(math.log2(x))) if x > 1 else 1


class Compressor(abc.ABC):
    """A family of compressors ``{C_i}_{i=1}^n`` (possibly correlated across workers).

    Subclasses implement :meth:`compress`; the theory methods default to "unknown" (``None``).
    The defaults of :meth:`compress_all` and :meth:`aggregate` call :meth:`compress` worker by
    worker, so a Python-defined compressor works everywhere a built-in one does.
    """

    #: Unbiased: ``E[C_i(x)] = x`` (Assumption "Unbiasedness").
    is_unbiased: bool = True
    #: Whether the receiver needs the transmitted indices (TopK) or recomputes them from the seed.
    needs_indices: bool = False
    #: Whether every worker's coordinates are a function of ``(seed, round)`` alone, so that
    #: :meth:`plan` exists (the sparsifiers PermK, RandK, BlockPermK without quantizer).
    shares_coordinates: bool = False

    @property
    def name(self) -> str:
        """A short label for legends."""
        return type(self).__name__

    # -- theory ---------------------------------------------------------------------------
    def ab_constants(self, n: int, d: int) -> tuple[float, float] | None:
        """``(A, B)`` of the AB inequality (Assumption "AB inequality", eq. (AB)), or None."""
        return None

    def omega(self, d: int, n_workers: int | None = None) -> float | None:
        """``ω`` with ``C_i ∈ U(ω)`` (each ``C_i`` alone), or None if not unbiased/known."""
        return None

    def alpha(self, d: int) -> float | None:
        """``α`` with ``C ∈ C(α)`` (contractive compressors, eq. (contractive)), or None."""
        return None

    @abc.abstractmethod
    def floats_per_worker(self, n: int, d: int) -> int:
        """The largest number of values one worker sends in a round (``ζ`` of MARINA)."""

    def expected_floats_per_worker(self, n: int, d: int) -> float:
        """The number of values a worker sends, averaged over workers and randomness."""
        return float(self.floats_per_worker(n, d))

    def value_bits(self, float_bits: int = 32) -> int:
        """Bits per transmitted value."""
        return float_bits

    def overhead_bits(self, float_bits: int = 32) -> int:
        """Bits per message besides the values and indices (e.g. QSGD's norm)."""
        return 0

    def bits_per_worker(self, n: int, d: int, *, float_bits: int = 32, indices: bool = True) -> int:
        """The largest message of one worker in bits.

        With ``indices=True`` it includes ``⌈log2 d⌉`` bits per value for compressors whose
        receiver needs the indices (TopK); PermK and shared-seed RandK never send indices.
        """
        k = self.floats_per_worker(n, d)
        idx = _ceil_log2(d) if (indices and self.needs_indices and k < d) else 0
        return k * (self.value_bits(float_bits) + idx) + self.overhead_bits(float_bits)

    def expected_bits_per_worker(self, n: int, d: int, *, float_bits: int = 32, indices: bool = True) -> float:
        """The expected message size of a worker in bits (see :meth:`bits_per_worker`)."""
        k = self.expected_floats_per_worker(n, d)
        full = self.floats_per_worker(n, d)
        idx = _ceil_log2(d) if (indices and self.needs_indices and full < d) else 0
        return k * (self.value_bits(float_bits) + idx) + self.overhead_bits(float_bits)

    # -- calls ------------------------------------------------------------------------------
    @abc.abstractmethod
    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> Message:
        """Worker ``worker``'s message ``C_worker(x)`` in round ``round``."""

    def decompress(self, msg: Message, d: int | None = None) -> np.ndarray:
        """``C_i(x)`` as a vector of ``R^d`` from worker ``i``'s message."""
        if d is not None and d != msg.d:
            raise ValueError(f"d = {d} does not match the message's d = {msg.d}")
        return msg.to_dense()

    def plan(self, n: int, d: int, *, seed: int, round: int) -> Plan | None:
        """The round's coordinates per worker when they depend only on ``(seed, round)``
        (``shares_coordinates``: PermK, RandK, BlockPermK), else None."""
        return None

    def compress_all(self, A: Any, *, seed: int, round: int) -> np.ndarray:
        """The ``(n, d)`` array of compressed rows ``C_i(A[i])``."""
        A = as_float_array(A, 2, "A")
        n, d = A.shape
        return np.stack([self.compress(A[i], worker=i, n_workers=n, seed=seed, round=round).to_dense() for i in range(n)])

    def aggregate(self, A: Any, *, seed: int, round: int) -> np.ndarray:
        """``(1/n) Σ_i C_i(A[i])``, summed in worker order and divided by ``n``."""
        A = as_float_array(A, 2, "A")
        n = A.shape[0]
        return aggregate_messages([self.compress(A[i], worker=i, n_workers=n, seed=seed, round=round) for i in range(n)])

    def check(self, n: int, d: int) -> None:
        """Raise ValueError unless the compressor is defined for ``n`` workers in dimension ``d``."""
        check_int(n, "n_workers", low=1)
        check_int(d, "d", low=1)


@dataclass(frozen=True)
class _RustCompressor(Compressor):
    """A compressor whose kernels are the Rust core's (``permk._core.Spec``)."""

    @abc.abstractmethod
    def _spec_args(self) -> dict[str, Any]: ...

    @cached_property
    def _spec(self) -> _core.Spec:
        return _core.Spec(**self._spec_args())

    def check(self, n: int, d: int) -> None:
        super().check(n, d)
        self._spec.check(n, d)

    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> Message:
        x = as_float_array(x, 1, "x")
        n = check_int(n_workers, "n_workers", low=1)
        w = check_int(worker, "worker", high=n)
        idx, val = self._spec.compress(x, w, n, check_seed(seed), check_int(round, "round"))
        return Message(worker=w, n_workers=n, d=x.shape[0], indices=idx, values=val)

    def compress_all(self, A: Any, *, seed: int, round: int) -> np.ndarray:
        return self._spec.compress_all(as_float_array(A, 2, "A"), check_seed(seed), check_int(round, "round"))

    def aggregate(self, A: Any, *, seed: int, round: int) -> np.ndarray:
        return self._spec.aggregate(as_float_array(A, 2, "A"), check_seed(seed), check_int(round, "round"))

    def plan(self, n: int, d: int, *, seed: int, round: int) -> Plan | None:
        if not self.shares_coordinates:
            return None
        self.check(n, d)
        return Plan(*self._spec.plan(n, d, check_seed(seed), check_int(round, "round")))


def _iv_constant(n: int, q: int) -> float:
    """``1 - n(q-1)/((n-1)q) = (n-q)/((n-1)q)``: the IV constant of the block/permutation
    compressors with ``q`` workers per block (0 when every worker sends everything)."""
    return 0.0 if n == q else (n - q) / ((n - 1) * q)


@dataclass(frozen=True)
class PermK(_RustCompressor):
    """PermK (Definitions 1 and 2, and their general forms in "General Examples of PermK").

    For ``d >= n`` (``d = kn + r``) one shared permutation of the coordinates gives worker ``i``
    the block ``π[ik:(i+1)k]``; a second permutation of the workers hands the ``r`` leftover
    coordinates to ``r`` of them; values are scaled by ``n``. Theorem "PermK" (d ≥ n): ``IV(1)``,
    ``A = B = 1``. For ``n > d`` (``n = qd + r``) each coordinate goes to ``q`` workers chosen by
    a shared permutation of the workers, ``r`` workers stay idle, values are scaled by ``n/q``:
    ``A = B = 1 - n(q-1)/((n-1)q)`` (Theorem "PermK" (n ≥ d): ``1 - (n-d)/(n-1)`` when ``d | n``).
    No indices are sent: every worker recomputes the permutations from ``(seed, round)``.

    >>> PermK().ab_constants(10, 100), PermK().ab_constants(10, 5)
    ((1.0, 1.0), (0.4444444444444444, 0.4444444444444444))
    """

    shares_coordinates = True

    def _spec_args(self) -> dict[str, Any]:
        return {"sparsifier": "permk"}

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        self.check(n, d)
        a = 1.0 if d >= n else _iv_constant(n, n // d)
        return (a, a)

    def omega(self, d: int, n_workers: int | None = None) -> float:
        if n_workers is None:
            raise ValueError("PermK's ω depends on the number of workers: pass n_workers")
        n = n_workers
        self.check(n, d)
        return float(n - 1) if d >= n else n / (n // d) - 1.0

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return -(-d // n) if d >= n else 1

    def expected_floats_per_worker(self, n: int, d: int) -> float:
        self.check(n, d)
        return d / n if d >= n else (n // d) * d / n


@dataclass(frozen=True)
class RandK(_RustCompressor):
    """Independent RandK: each worker sends ``k`` uniformly random coordinates scaled by ``d/k``.

    ``C_i ∈ U(ω)`` with ``ω = d/k - 1``; independence gives ``(A, B) = (ω/n, 0)`` (Lemma 1).
    Worker ``i``'s coordinates are a pure function of ``(seed, round, i)``, so the receiver
    recomputes them ("shared-seed RandK"): no indices are sent.

    >>> RandK(10).ab_constants(n=10, d=100)
    (0.9, 0.0)
    """

    k: int
    shares_coordinates = True

    def __post_init__(self) -> None:
        check_int(self.k, "k", low=1)

    @property
    def name(self) -> str:
        return f"RandK(k={self.k})"

    def _spec_args(self) -> dict[str, Any]:
        return {"sparsifier": "randk", "k": self.k}

    def omega(self, d: int, n_workers: int | None = None) -> float:
        self.check(n_workers or 1, d)
        return d / self.k - 1.0

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        return (self.omega(d, n) / n, 0.0)

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return self.k


@dataclass(frozen=True)
class TopK(_RustCompressor):
    """TopK: the ``k`` largest-magnitude coordinates (ties: lower index), unscaled.

    Deterministic and biased; contractive with ``α = k/d`` (eq. (contractive)). The receiver
    needs the indices, which :meth:`bits_per_worker` counts. Used with EF21.

    >>> TopK(5).alpha(100), TopK(5).ab_constants(3, 100) is None
    (0.05, True)
    """

    k: int
    is_unbiased = False
    needs_indices = True

    def __post_init__(self) -> None:
        check_int(self.k, "k", low=1)

    @property
    def name(self) -> str:
        return f"TopK(k={self.k})"

    def _spec_args(self) -> dict[str, Any]:
        return {"sparsifier": "topk", "k": self.k}

    def alpha(self, d: int) -> float:
        self.check(1, d)
        return self.k / d

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return self.k


@dataclass(frozen=True)
class Identity(_RustCompressor):
    """No compression: every worker sends its whole vector (GD / uncompressed MARINA).

    >>> Identity().ab_constants(4, 10), Identity().omega(10)
    ((0.0, 0.0), 0.0)
    """

    def _spec_args(self) -> dict[str, Any]:
        return {"sparsifier": "identity"}

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        self.check(n, d)
        return (0.0, 0.0)

    def omega(self, d: int, n_workers: int | None = None) -> float:
        return 0.0

    def alpha(self, d: int) -> float:
        return 1.0

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return d


@dataclass(frozen=True)
class BlockPermK(_RustCompressor):
    """The block permutation compressor ("More Examples", Definition "block permutation").

    The coordinates are partitioned into ``m <= n`` non-empty blocks (``m`` contiguous blocks
    by default, or ``partition[j]`` = block of coordinate ``j``); with ``n = mq + r`` a shared
    permutation of the workers gives ``q`` workers each block (scaled by ``n/q``) and leaves
    ``r`` idle. ``IV(1 - n(q-1)/((n-1)q))``, i.e. ``A = B`` equal to that constant.

    >>> BlockPermK(2).ab_constants(n=4, d=10)
    (0.3333333333333333, 0.3333333333333333)
    """

    m: int
    partition: tuple[int, ...] | None = field(default=None, compare=True)
    shares_coordinates = True

    def __post_init__(self) -> None:
        check_int(self.m, "m", low=1)
        if self.partition is not None:
            labels = tuple(int(v) for v in np.asarray(self.partition).ravel())
            if any(v < 0 for v in labels) or set(labels) != set(range(self.m)):
                raise ValueError(f"partition must label every coordinate with a block in range({self.m}), each block non-empty")
            object.__setattr__(self, "partition", labels)

    @property
    def name(self) -> str:
        return f"BlockPermK(m={self.m})"

    def _spec_args(self) -> dict[str, Any]:
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

    def omega(self, d: int, n_workers: int | None = None) -> float:
        if n_workers is None:
            raise ValueError("BlockPermK's ω depends on the number of workers: pass n_workers")
        self.check(n_workers, d)
        return n_workers / (n_workers // self.m) - 1.0

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return int(self._block_sizes(d).max())

    def expected_floats_per_worker(self, n: int, d: int) -> float:
        self.check(n, d)
        return (n // self.m) * d / n


@dataclass(frozen=True)
class _Quantizer(_RustCompressor):
    """An unbiased quantizer ``Q ∈ U(ω)``: used alone (independently by every worker, so
    ``(A, B) = (ω/n, 0)``) or inside :class:`Compose`."""

    @abc.abstractmethod
    def _quantizer_args(self) -> dict[str, Any]: ...

    def _spec_args(self) -> dict[str, Any]:
        return {"sparsifier": "identity", **self._quantizer_args()}

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        self.check(n, d)
        return (self.omega(d) / n, 0.0)

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return d

    @abc.abstractmethod
    def omega(self, d: int, n_workers: int | None = None) -> float: ...


@dataclass(frozen=True)
class NaturalCompression(_Quantizer):
    """Natural compression: ``x`` is rounded at random to one of the two nearest powers of two
    (unbiasedly); ``ω = 1/8``. A value is sent as sign + exponent: 9 bits for 32-bit floats,
    12 for 64-bit ones.

    >>> NaturalCompression().omega(100)
    0.125
    """

    @property
    def name(self) -> str:
        return "Natural"

    def _quantizer_args(self) -> dict[str, Any]:
        return {"quantizer": "natural"}

    def omega(self, d: int, n_workers: int | None = None) -> float:
        return 0.125

    def value_bits(self, float_bits: int = 32) -> int:
        return 9 if float_bits <= 32 else 12


@dataclass(frozen=True)
class QSGD(_Quantizer):
    """QSGD with ``s`` levels: ``Q(x)_j = ‖x‖ sign(x_j) ξ_j / s`` with ``ξ_j`` the random
    rounding of ``s|x_j|/‖x‖``; ``ω = min(d/s², √d/s)``. A message is the norm (one float) and
    per value a sign and a level (``1 + ⌈log2(s+1)⌉`` bits).

    >>> QSGD(4).omega(16)
    1.0
    """

    s: int

    def __post_init__(self) -> None:
        check_int(self.s, "s", low=1, high=2**32)

    @property
    def name(self) -> str:
        return f"QSGD(s={self.s})"

    def _quantizer_args(self) -> dict[str, Any]:
        return {"quantizer": "qsgd", "s": self.s}

    def omega(self, d: int, n_workers: int | None = None) -> float:
        check_int(d, "d", low=1)
        return min(d / self.s**2, math.sqrt(d) / self.s)

    def value_bits(self, float_bits: int = 32) -> int:
        return 1 + _ceil_log2(self.s + 1)

    def overhead_bits(self, float_bits: int = 32) -> int:
        return float_bits


@dataclass(frozen=True)
class Compose(_RustCompressor):
    """``C_i ∘ Q_i``: quantize, then sparsify (Lemma "Composition").

    If ``{C_i} ∈ U(A, B)`` and ``Q_i ∈ U(ω)`` are independent of the ``C_i``, the paper's Lemma
    "Composition" states ``{C_i ∘ Q_i} ∈ U((ω+1)A, B)``. Its proof bounds the deviation from the
    *quantized* mean ``(1/n) Σ Q_i(a_i)``; the deviation of that mean from ``ā`` adds
    ``(1 − B) E‖(1/n) Σ Q_i(a_i) − ā‖² ≤ (1 − B)(ω/n)(1/n) Σ‖a_i‖²`` (the ``Q_i`` are independent
    across workers here). So ``ab_constants`` returns ``((ω+1)A + (1−B)ω/n, B)``: the paper's
    constants when ``B = 1`` (PermK, ``d ≥ n``), and e.g. ``(((ω+1)(ω_C+1) − 1)/n, 0)`` for
    independent RandK (``A = ω_C/n, B = 0``). (For PermK with ``n = 2, d = 1``, ``A = B = 0``
    and the paper's constants would claim zero variance.) Only the sent coordinates are
    quantized (QSGD uses the norm of the worker's whole input, as ``Q_i`` acts on it first).

    >>> Compose(PermK(), NaturalCompression()).ab_constants(4, 40)
    (1.125, 1.0)
    """

    sparsifier: PermK | RandK | TopK | Identity | BlockPermK
    quantizer: NaturalCompression | QSGD

    def __post_init__(self) -> None:
        if not isinstance(self.sparsifier, (PermK, RandK, TopK, Identity, BlockPermK)):
            raise TypeError("Compose's sparsifier must be PermK, RandK, TopK, Identity or BlockPermK")
        if not isinstance(self.quantizer, (NaturalCompression, QSGD)):
            raise TypeError("Compose's quantizer must be NaturalCompression or QSGD")
        object.__setattr__(self, "is_unbiased", self.sparsifier.is_unbiased)
        object.__setattr__(self, "needs_indices", self.sparsifier.needs_indices)

    @property
    def name(self) -> str:
        return f"{self.sparsifier.name}∘{self.quantizer.name}"

    def _spec_args(self) -> dict[str, Any]:
        return {**self.sparsifier._spec_args(), **self.quantizer._quantizer_args()}

    def ab_constants(self, n: int, d: int) -> tuple[float, float] | None:
        ab = self.sparsifier.ab_constants(n, d)
        if ab is None:
            return None
        a, b = ab
        w = self.quantizer.omega(d)
        return ((w + 1.0) * a + max(0.0, 1.0 - b) * w / n, b)

    def omega(self, d: int, n_workers: int | None = None) -> float | None:
        w = self.sparsifier.omega(d, n_workers)
        if w is None:
            return None
        return (w + 1.0) * (self.quantizer.omega(d) + 1.0) - 1.0

    def floats_per_worker(self, n: int, d: int) -> int:
        return self.sparsifier.floats_per_worker(n, d)

    def expected_floats_per_worker(self, n: int, d: int) -> float:
        return self.sparsifier.expected_floats_per_worker(n, d)

    def value_bits(self, float_bits: int = 32) -> int:
        return self.quantizer.value_bits(float_bits)

    def overhead_bits(self, float_bits: int = 32) -> int:
        return self.quantizer.overhead_bits(float_bits)

