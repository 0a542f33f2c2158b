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
implement :meth:`Compressor.compress` to define a new (possibly correlated) one in Python
(``docs/extending.md``).

Every compressor declares what it can do in :attr:`Compressor.capabilities` (a
:class:`Capabilities`): whether its coordinates are shared from ``(seed, round)`` (then the
methods evaluate only the sent coordinates and MPI sends values without indices), whether the
workers' coordinates are disjoint or contiguous, whether its messages have a fixed size, whether
the receiver needs indices, which argument sets its message size. Every caller — the methods,
the MPI backend, the theory tools, the experiments, the tests — asks these, never the class.

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
import dataclasses
import functools
import hashlib
import inspect
import math
import types
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, NamedTuple, Protocol, Sequence, runtime_checkable

import numpy as np

from . import _core
from ._validate import as_float_array, check_int, check_partition, check_seed

__all__ = [
    "Capabilities",
    "Message",
    "Messages",
    "Plan",
    "Round",
    "PlanRound",
    "PendingRound",
    "Ranges",
    "VarianceBound",
    "Compressor",
    "RustCompressor",
    "Sparsifier",
    "Quantizer",
    "PermK",
    "RandK",
    "TopK",
    "Identity",
    "BlockPermK",
    "CoordinateSampling",
    "GroupPermK",
    "PermutationOfMappings",
    "NaturalCompression",
    "QSGD",
    "Compose",
    "aggregate_messages",
]


@dataclass(frozen=True, eq=False)
class Message:
    """What one worker sends in one round: ``values`` at coordinates ``indices`` of ``R^d``.

    For PermK and RandK the indices are a function of ``(seed, round, worker)`` that the
    receiver recomputes, so they are not transmitted (see :meth:`Compressor.bits_per_worker`).
    Indices are checked: integers in ``[0, d)``, as many as values. Messages compare by value.
    """

    worker: int
    n_workers: int
    d: int
    indices: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        n = check_int(self.n_workers, "n_workers", low=1)
        check_int(self.worker, "worker", high=n)
        d = check_int(self.d, "d", low=1)
        idx = np.asarray(self.indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise TypeError(f"indices must be a 1-D integer array, got dtype {idx.dtype} and shape {idx.shape}")
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= d):
            raise ValueError(f"indices must lie in [0, d) = [0, {d}), got values in [{int(idx.min())}, {int(idx.max())}]")
        vals = np.asarray(self.values)
        if vals.shape != idx.shape:
            raise ValueError(f"values must have the shape of indices {idx.shape}, got {vals.shape}")
        object.__setattr__(self, "indices", idx.astype(np.int64, copy=False))
        object.__setattr__(self, "values", vals)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (self.worker, self.n_workers, self.d) == (other.worker, other.n_workers, other.d) and bool(
            np.array_equal(self.indices, other.indices) and np.array_equal(self.values, other.values)
        )

    __hash__ = None  # type: ignore[assignment]

    def to_dense(self) -> np.ndarray:
        """The message as a vector of ``R^d`` (``C_i(x)``)."""
        out = np.zeros(self.d, dtype=self.values.dtype)
        out[self.indices] = self.values
        return out


class Messages(NamedTuple):
    """The messages of a block of workers, in worker order (CSR): worker ``start + j`` sends
    ``values[offsets[j]:offsets[j+1]]`` at ``indices[offsets[j]:offsets[j+1]]``."""

    offsets: np.ndarray
    indices: np.ndarray
    values: np.ndarray

    def dense(self, d: int) -> np.ndarray:
        """The compressed rows as an ``(m, d)`` array."""
        m = len(self.offsets) - 1
        out = np.zeros((m, d), dtype=self.values.dtype if self.values.size else np.float64)
        rows = np.repeat(np.arange(m), np.diff(self.offsets))
        out[rows, self.indices] = self.values
        return out


class Plan(NamedTuple):
    """The coordinates every worker sends in one round (CSR): worker ``i`` sends
    ``coords[offsets[i]:offsets[i+1]]``, each value multiplied by ``scales[i]``; ``disjoint``:
    no coordinate is sent by two workers (the aggregate is placed, not summed)."""

    offsets: np.ndarray
    coords: np.ndarray
    scales: np.ndarray
    disjoint: bool = False

    def worker(self, i: int) -> np.ndarray:
        """The coordinates worker ``i`` sends."""
        return self.coords[self.offsets[i] : self.offsets[i + 1]]


@runtime_checkable
class Round(Protocol):
    """One round's shared plan, computed once and used by every exchange of the round
    (:meth:`Compressor.round`): what the native ``permk._core.Round`` is, and what
    :class:`PlanRound` gives a Python compressor from its :meth:`Compressor.plan`.

    Worker ``i``'s values are entries ``offsets()[i]:offsets()[i+1]`` of the round's values
    concatenated in worker order, at its coordinates in plan order, each multiplied by
    ``scales()[i]``."""

    @property
    def n(self) -> int: ...
    @property
    def d(self) -> int: ...
    @property
    def disjoint(self) -> bool: ...
    def offsets(self) -> np.ndarray: ...
    def scales(self) -> np.ndarray: ...
    def coords(self, start: int, stop: int) -> np.ndarray: ...
    def rows(self, start: int, stop: int) -> np.ndarray: ...
    def ranges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None: ...
    def gather(self, a: np.ndarray, start: int, *, divide: int | None = None, out: np.ndarray | None = None) -> np.ndarray: ...
    def mean(self, values: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray: ...


class PendingRound(Protocol):
    """A round being computed ahead (:meth:`Compressor.round_ahead`); ``wait()`` returns it."""

    def wait(self) -> Round: ...


class PlanRound:
    """:class:`Round` over an explicit :class:`Plan` (the plan of a Python compressor), with
    the native round's arithmetic: values ``scale_i * a_ij`` rounded once, summed in worker
    order into zeros (a disjoint plan: placed), then divided by ``n``."""

    def __init__(self, plan: Plan, d: int) -> None:
        self.plan, self.n, self.d = plan, len(plan.offsets) - 1, int(d)
        self.disjoint = bool(plan.disjoint)

    def _span(self, start: int, stop: int) -> tuple[int, int]:
        start, stop = check_int(start, "start", low=0, high=self.n + 1), check_int(stop, "stop", low=0, high=self.n + 1)
        if start > stop:
            raise ValueError(f"start ({start}) must not exceed stop ({stop})")
        return start, stop

    def offsets(self) -> np.ndarray:
        return self.plan.offsets

    def scales(self) -> np.ndarray:
        return self.plan.scales

    def coords(self, start: int, stop: int) -> np.ndarray:
        start, stop = self._span(start, stop)
        return self.plan.coords[self.plan.offsets[start] : self.plan.offsets[stop]]

    def rows(self, start: int, stop: int) -> np.ndarray:
        start, stop = self._span(start, stop)
        return np.repeat(np.arange(start, stop, dtype=np.int64), np.diff(self.plan.offsets[start : stop + 1]))

    def ranges(self) -> None:
        return None

    @staticmethod
    def _check_out(out: np.ndarray, size: int, dtype: np.dtype[Any], *inputs: np.ndarray) -> None:
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out: must be a numpy array, got {type(out).__name__}")
        if out.shape != (size,) or out.dtype != dtype or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"out: must be a writeable C-contiguous {dtype} array of shape ({size},), got {out.dtype} {out.shape}")
        if any(np.may_share_memory(out, a) for a in inputs):
            raise ValueError("out: must not share memory with the inputs")

    def gather(self, a: np.ndarray, start: int, *, divide: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
        a = as_float_array(a, 2, "a", allow_empty=True)
        m = a.shape[0]
        start, stop = self._span(start, start + m)
        if a.shape[1] != self.d:
            raise ValueError(f"a must have {self.d} columns, got shape {a.shape}")
        if divide is not None:
            divide = check_int(divide, "divide", low=1, high=2**53 + 1)
        rows = self.rows(start, stop)
        if out is not None:
            self._check_out(out, len(rows), a.dtype, a)
        vals = _scaled(a[rows - start, self.coords(start, stop)], self.plan.scales[rows])
        if divide is not None:  # the worker-order sum's term 0 + v, divided by n
            vals += 0.0
            vals /= a.dtype.type(divide)
        if out is None:
            return vals
        out[...] = vals
        return out

    def mean(self, values: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (int(self.plan.offsets[-1]),):
            raise ValueError(f"values must hold the {int(self.plan.offsets[-1])} values of the round, got shape {values.shape}")
        if out is not None:
            self._check_out(out, self.d, np.dtype(np.float64), values)
        if self.disjoint:  # one term per coordinate: 0.0 + v, as the worker-order sum computes it
            agg = np.zeros(self.d) if out is None else out
            agg.fill(0.0)
            agg[self.plan.coords] = values + 0.0
            agg /= self.n
            return agg
        total = np.bincount(self.plan.coords, weights=values, minlength=self.d)
        if out is None:
            return total / self.n
        np.divide(total, self.n, out=out)
        return out


class _Ready:
    """A round computed at once (the :class:`PendingRound` of a Python compressor)."""

    def __init__(self, r: Round) -> None:
        self._round: Round | None = r

    def wait(self) -> Round:
        if self._round is None:
            raise ValueError("wait: this round was already taken")
        r, self._round = self._round, None
        return r


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


@dataclass(frozen=True)
class Capabilities:
    """What a compressor can do; every caller asks these instead of the compressor's class.

    * ``unbiased`` — ``E[C_i(x)] = x`` (Assumption "Unbiasedness"); MARINA needs it.
    * ``shared_plan`` — the coordinates worker ``i`` sends are a pure function of
      ``(seed, round, i)`` and its values are ``scale_i · x_j``: :meth:`Compressor.plan` exists,
      the receiver recomputes the coordinates (no indices travel), and the methods evaluate only
      the sent coordinates (``path="fused"``).

    Two properties depend on ``(n, d)`` and so come with the plan instead: ``Plan.disjoint``
    (every coordinate sent by at most one worker: the aggregate is placed, not summed — PermK
    with ``d ≥ n``) and :meth:`Compressor.plan_ranges` (one contiguous range per worker, in
    ``O(n)``: BlockPermK, PermK with ``n > d``).
    * ``fixed_size`` — every message has exactly ``floats_per_worker(n, d)`` values (TopK,
      RandK): the MPI backend exchanges no lengths.
    * ``random_size`` — the number of values a worker sends is random (CoordinateSampling):
      ``floats_per_worker`` is a bound that a round's largest message may not reach; the bits a
      run counts use that bound (``expected_bits`` the mean).
    * ``needs_indices`` — the receiver needs the transmitted indices (data-dependent TopK); they
      count in :meth:`Compressor.bits_per_worker`.
    * ``deterministic`` — ``C_i(x) = C(x)``, one deterministic, positively homogeneous map for
      every worker, seed and round (TopK, Identity): workers with equal inputs send equal
      messages, whatever ``n`` (the experiments use it to simulate identical workers once).
    * ``lossless`` — ``C_i(x) = x``: every worker sends its vector whole (Identity); a method
      whose rounds send full gradients (``permk.gd``) takes only such a compressor.
    * ``tunable`` — the constructor argument that sets the message size (``"k"``), which
      :func:`permk.theory.complexity` optimises and the experiments set to ``⌈d/n⌉``.
    """

    unbiased: bool = True
    shared_plan: bool = False
    fixed_size: bool = False
    random_size: bool = False
    needs_indices: bool = False
    deterministic: bool = False
    lossless: bool = False
    tunable: str | None = None


class VarianceBound(NamedTuple):
    """What MARINA's step needs of a compressor on a problem: ``L̂²`` (the constant in front of
    ``‖x^{t+1} − x^t‖²`` in the variance of the gradient estimator) and the theorems that use it
    (nonconvex, PL)."""

    L_hat_sq: float
    theorem: str
    pl_theorem: str


class Ranges(NamedTuple):
    """A plan whose workers send one contiguous range each: worker ``i`` sends coordinates
    ``starts[i]:stops[i]`` (none when equal), each value multiplied by ``scales[i]``."""

    starts: np.ndarray
    stops: np.ndarray
    scales: np.ndarray


class Compressor(abc.ABC):
    """A family of compressors ``{C_i}_{i=1}^n`` (possibly correlated across workers).

    Subclasses implement :meth:`compress` and :meth:`floats_per_worker`; the theory methods
    default to "unknown" (``None``) and :attr:`capabilities` to an unbiased compressor without a
    shared plan. The defaults of :meth:`compress_all`, :meth:`compress_rows` and
    :meth:`aggregate` run in the compressor's Rust :attr:`kernel` when it has one, else call
    :meth:`compress` worker by worker, so a Python-defined compressor works
    everywhere a built-in one does (simulator, MPI, :func:`permk.theory.estimate_ab`).
    """

    #: The constructor argument that sets the message size (see :class:`Capabilities`).
    tunable: ClassVar[str | None] = None
    #: Whether the stated AB inequality holds with equality for every input (the permutation
    #: compressors, RandK, Identity: their variance is exactly ``A·(1/n)Σ‖a_i‖² − B‖ā‖²``).
    ab_exact: ClassVar[bool] = False
    #: Whether it is one of the paper's permutation-based compressors (PermK, BlockPermK, …):
    #: what :class:`GroupPermK` runs inside its groups.
    permutation_based: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # the class attribute `tunable` is the one place a compressor says it: a subclass that
        # declares its capabilities as a class attribute gets it filled in
        caps = cls.__dict__.get("capabilities")
        if isinstance(caps, Capabilities) and caps.tunable != cls.tunable:
            setattr(cls, "capabilities", dataclasses.replace(caps, tunable=cls.tunable))

    @property
    def capabilities(self) -> Capabilities:
        """What this compressor can do (see :class:`Capabilities`)."""
        return Capabilities(tunable=self.tunable)

    @property
    def kernel(self) -> Any:
        """The Rust kernel (``permk._core.Spec``) of a built-in compressor, else None: the
        ``"rust"`` paths use it."""
        return None

    @property
    def name(self) -> str:
        """A short label for legends."""
        return type(self).__name__

    # -- theory ---------------------------------------------------------------------------
    def ab_constants(self, n: int, d: int) -> tuple[float, float] | None:
        """``(A, B)`` of the AB inequality (Assumption "AB inequality", eq. (AB)), or None."""
        return None

    def omega(self, n: int, d: int) -> float | None:
        """``ω`` with ``C_i ∈ U(ω)`` (each ``C_i`` alone) for ``n`` workers in dimension ``d``,
        or None if not unbiased/known."""
        return None

    def alpha(self, n: int, d: int) -> float | None:
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

    def _index_bits(self, n: int, d: int, indices: bool) -> int:
        full = self.floats_per_worker(n, d)
        return _ceil_log2(d) if (indices and self.capabilities.needs_indices and full < d) else 0

    def bits_per_worker(self, n: int, d: int, *, float_bits: int = 32, indices: bool = True) -> int:
        """The largest message of one worker in bits.

        With ``indices=True`` it includes ``⌈log2 d⌉`` bits per value for compressors whose
        receiver needs the indices (TopK); PermK and shared-seed RandK never send indices.
        ``float_bits`` (bits per float) is a positive integer.
        """
        float_bits = check_int(float_bits, "float_bits", low=1, high=2**16)
        k = self.floats_per_worker(n, d)
        return k * (self.value_bits(float_bits) + self._index_bits(n, d, indices)) + self.overhead_bits(float_bits)

    def expected_bits_per_worker(self, n: int, d: int, *, float_bits: int = 32, indices: bool = True) -> float:
        """The expected message size of a worker in bits (see :meth:`bits_per_worker`)."""
        float_bits = check_int(float_bits, "float_bits", low=1, high=2**16)
        k = self.expected_floats_per_worker(n, d)
        return k * (self.value_bits(float_bits) + self._index_bits(n, d, indices)) + self.overhead_bits(float_bits)

    def variance_bound(self, n: int, d: int, constants: Any, problem: Any = None) -> VarianceBound:
        """MARINA's variance constant ``L̂²`` on a problem with ``constants`` (``L_plus``,
        ``L_pm``: a :class:`permk.theory.steps.Constants`): Theorem "AB"'s
        ``(A − B)L_+² + B L_±²`` from :meth:`ab_constants` (compressors with more structure,
        such as ``GroupPermK``, bound it with the ``problem`` itself)."""
        ab = self.ab_constants(n, d)
        if ab is None:
            raise ValueError(f"{self.name} states no AB constants (Assumption 'AB inequality')")
        A, B = ab
        value = max((A - B) * constants.L_plus**2 + B * constants.L_pm**2, 0.0)
        return VarianceBound(value, "Theorem AB", "Theorem AB-PL")

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray | None:
        """An a-priori bound on ``|C_i(a_i)_j|`` for the inputs ``A`` (shape ``(n, d)``), or None
        when unknown (used by the statistical tests to account for rare outcomes)."""
        return None

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
        (``capabilities.shared_plan``: PermK, RandK, BlockPermK), else None."""
        return None

    def plan_ranges(self, n: int, d: int, *, seed: int, round: int) -> Ranges | None:
        """The round's plan as one contiguous range per worker, computed in ``O(n)``, when the
        compressor's plan at ``(n, d)`` has that form (BlockPermK, PermK with ``n > d``), else None."""
        return None

    def round(self, n: int, d: int, *, seed: int, round: int) -> Round:
        """The round's shared plan as a :class:`Round`, computed once for all the round's
        exchanges (the backends use it; ``capabilities.shared_plan`` required). By default a
        :class:`PlanRound` over :meth:`plan`; a Rust compressor returns the native round."""
        plan = self.plan(n, d, seed=seed, round=round)
        if plan is None:
            raise ValueError(f"{self.name} has no shared plan (capabilities.shared_plan is False, or its plan() returned None)")
        return PlanRound(plan, d)

    def round_ahead(self, n: int, d: int, *, seed: int, round: int) -> PendingRound:
        """:meth:`round`, started now and taken with ``wait()``: a Rust compressor computes it on
        a background thread (the MPI backend asks for round ``t + 1`` while round ``t``
        communicates); by default it is computed at once."""
        return _Ready(self.round(n, d, seed=seed, round=round))

    def disjoint(self, n: int, d: int) -> bool:
        """Whether, with a shared plan, every coordinate is sent by at most one worker in every
        round at ``(n, d)`` (PermK with ``d ≥ n``, BlockPermK with ``m = n``): the aggregate is
        then placed, not summed (and on MPI each worker's values land in place)."""
        return False

    def checked_compress(self, x: np.ndarray, *, worker: int, n_workers: int, seed: int, round: int) -> Message:
        """:meth:`compress`, its answer checked where it is used: a :class:`Message` (TypeError
        otherwise) from ``worker`` of ``n_workers`` in the dimension of ``x`` with real values
        (ValueError naming the compressor and the field otherwise; the indices are checked by
        :class:`Message` itself)."""
        m = self.compress(x, worker=worker, n_workers=n_workers, seed=seed, round=round)
        if not isinstance(m, Message):
            raise TypeError(f"{self.name}.compress must return a permk.Message, got {type(m).__name__}")
        d = int(np.shape(x)[-1])
        for field_, got, want in (("worker", m.worker, worker), ("n_workers", m.n_workers, n_workers), ("d", m.d, d)):
            if got != want:
                raise ValueError(f"{self.name}.compress returned a Message with {field_}={got!r}, expected {want!r}")
        if m.values.dtype.kind not in "biuf":
            raise TypeError(f"{self.name}.compress returned a Message whose values have dtype {m.values.dtype}, expected real numbers")
        return m

    # The calls below run in the Rust kernel when the compressor has one (:attr:`kernel`), else
    # call :meth:`compress` worker by worker (:meth:`checked_compress`).
    def compress_all(self, A: Any, *, seed: int, round: int) -> np.ndarray:
        """The ``(n, d)`` array of compressed rows ``C_i(A[i])``."""
        A = as_float_array(A, 2, "A")
        if self.kernel is not None:
            return self.kernel.compress_all(A, check_seed(seed), check_int(round, "round"))  # type: ignore[no-any-return]
        n, d = A.shape
        return np.stack([self.checked_compress(A[i], worker=i, n_workers=n, seed=seed, round=round).to_dense() for i in range(n)])

    def compress_rows(self, A: Any, *, start: int, n_workers: int, seed: int, round: int) -> Messages:
        """The messages of workers ``start … start + m − 1`` whose inputs are the rows of ``A``
        (shape ``(m, d)``), as :class:`Messages` (what an MPI rank holding those workers sends)."""
        A = as_float_array(A, 2, "A")
        if self.kernel is not None:
            n = check_int(n_workers, "n_workers", low=1)
            start = check_int(start, "start", high=n)
            return Messages(*self.kernel.compress_rows(A, start, n, check_seed(seed), check_int(round, "round")))
        msgs = [self.checked_compress(A[j], worker=start + j, n_workers=n_workers, seed=seed, round=round) for j in range(A.shape[0])]
        offsets = np.concatenate([[0], np.cumsum([len(m.indices) for m in msgs])]).astype(np.int64)
        return Messages(offsets, np.concatenate([m.indices for m in msgs]).astype(np.int64),
                        np.concatenate([m.values for m in msgs]) if msgs else np.zeros(0, dtype=A.dtype))

    def aggregate(self, A: Any, *, seed: int, round: int) -> np.ndarray:
        """``(1/n) Σ_i C_i(A[i])``, summed in worker order and divided by ``n``."""
        A = as_float_array(A, 2, "A")
        if self.kernel is not None:
            return self.kernel.aggregate(A, check_seed(seed), check_int(round, "round"))  # type: ignore[no-any-return]
        n = A.shape[0]
        return aggregate_messages([self.checked_compress(A[i], worker=i, n_workers=n, seed=seed, round=round) for i in range(n)])

    def check(self, n: int, d: int) -> None:
        """Raise ValueError unless the compressor is defined for ``n`` workers in dimension ``d``."""
        check_int(n, "n_workers", low=1)
        check_int(d, "d", low=1)

    # -- identity, examples -------------------------------------------------------------------
    def fingerprint(self) -> str:
        """A digest of the compressor's type and parameters, equal in every process for equal
        compressors (the MPI launch check compares it): the type's qualified name and the
        dataclass fields (or, for other classes, the instance attributes), arrays by value."""
        h = hashlib.blake2b(digest_size=16)
        _feed(h, self)
        return h.hexdigest()

    @classmethod
    def default(cls, n: int, d: int) -> Compressor:
        """The compressor's standard instance for ``n`` workers in dimension ``d`` (the
        experiments' choice: ``K = ⌈d/n⌉`` for a tunable size). Subclasses with required
        arguments override it."""
        if cls.tunable is not None:
            return cls(**{cls.tunable: max(1, -(-d // n))})  # type: ignore[call-arg]
        return cls()

    @classmethod
    def examples(cls, n: int, d: int, rng: np.random.Generator | None = None) -> list[Compressor]:
        """Instances for ``n`` workers in dimension ``d`` that the package's generic tests run
        (with ``rng``: parameters drawn at random). The default is :meth:`default`."""
        return [cls.default(n, d)]


def _feed(h: Any, v: Any, depth: int = 0) -> None:
    """Feed a canonical encoding of ``v`` to the hash ``h`` (see :meth:`Compressor.fingerprint`).
    A Python function is encoded by what it computes (its bytecode, constants, defaults, closure
    values and the globals it names, followed ``depth`` levels deep), not by its name: two
    families of the same lambdas in a different order differ."""
    if isinstance(v, Compressor):
        h.update(f"<{type(v).__module__}.{type(v).__qualname__}>".encode())
        if dataclasses.is_dataclass(v):
            items = [(f.name, getattr(v, f.name)) for f in dataclasses.fields(v)]
        else:
            items = sorted((k, x) for k, x in vars(v).items() if not k.startswith("_"))
        for k, x in items:
            h.update(k.encode() + b"=")
            _feed(h, x, depth)
    elif isinstance(v, np.ndarray):
        h.update(f"array{v.dtype.str}{v.shape}".encode())
        h.update(np.ascontiguousarray(v).tobytes())
    elif isinstance(v, (list, tuple)):
        h.update(f"{type(v).__name__}[{len(v)}]".encode())
        for x in v:
            _feed(h, x, depth)
    elif isinstance(v, dict):
        h.update(f"dict[{len(v)}]".encode())
        for k in sorted(v, key=repr):
            _feed(h, k, depth)
            _feed(h, v[k], depth)
    elif v is None or isinstance(v, (bool, int, float, complex, str, bytes, np.generic)):
        h.update(repr(v).encode())
    elif isinstance(v, types.CodeType):
        h.update(b"code")
        h.update(v.co_code)
        for x in (v.co_names, v.co_varnames, v.co_consts):
            _feed(h, x)
    elif isinstance(v, types.ModuleType):
        h.update(f"module {v.__name__}".encode())
    elif isinstance(v, types.FunctionType) and depth < _CALLABLE_DEPTH:
        # what the function computes: its code, defaults, closure values and the values of the
        # globals it names (so two lambdas, or one lambda over different data, differ)
        code = v.__code__
        h.update(f"function {v.__module__}.{v.__qualname__}".encode())
        _feed(h, code)
        _feed(h, v.__defaults__, depth + 1)
        _feed(h, v.__kwdefaults__, depth + 1)
        for cell in v.__closure__ or ():
            try:
                _feed(h, cell.cell_contents, depth + 1)
            except ValueError:  # an empty cell
                h.update(b"empty cell")
        names = {n for c in _code_objects(code) for n in c.co_names}
        for name in sorted(names & v.__globals__.keys()):
            h.update(name.encode() + b"=")
            _feed(h, v.__globals__[name], depth + 1)
    elif isinstance(v, functools.partial):
        h.update(b"partial")
        _feed(h, v.func, depth + 1)
        _feed(h, v.args, depth + 1)
        _feed(h, v.keywords, depth + 1)
    elif isinstance(v, types.MethodType):
        h.update(b"method")
        _feed(h, v.__func__, depth + 1)
        _feed(h, v.__self__, depth + 1)
    elif hasattr(v, "__dict__") and not isinstance(v, type) and depth < _CALLABLE_DEPTH:
        # an instance (e.g. a callable object): its class and attributes
        h.update(f"object {type(v).__module__}.{type(v).__qualname__}".encode())
        for k, x in sorted(vars(v).items()):
            h.update(k.encode() + b"=")
            _feed(h, x, depth + 1)
    else:
        h.update(f"object {type(v).__module__}.{getattr(v, '__qualname__', type(v).__qualname__)}".encode())


#: How deep :func:`_feed` follows functions' closures, globals and objects' attributes.
_CALLABLE_DEPTH = 4


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    """``code`` and the code objects nested in it (inner functions, comprehensions)."""
    out = [code]
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out += _code_objects(c)
    return out


@dataclass(frozen=True)
class RustCompressor(Compressor):
    """A compressor whose kernels are the Rust core's (``permk._core.Spec``): a subclass names
    its kernel and parameters in :meth:`kernel_args` (``docs/extending.md``)."""

    @abc.abstractmethod
    def kernel_args(self) -> dict[str, Any]:
        """The arguments of ``permk._core.Spec``: ``{"sparsifier": name, **params}`` (and
        ``"quantizer"``)."""

    @cached_property
    def kernel(self) -> _core.Spec:  # type: ignore[override]
        return _core.Spec(**self.kernel_args())

    def check(self, n: int, d: int) -> None:
        super().check(n, d)
        self.kernel.check(n, d)

    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> Message:
        x = as_float_array(x, 1, "x")
        n = check_int(n_workers, "n_workers", low=1)
        w = check_int(worker, "worker", high=n)
        idx, val = self.kernel.compress(x, w, n, check_seed(seed), check_int(round, "round"))
        return Message(worker=w, n_workers=n, d=x.shape[0], indices=idx, values=val)

    def plan(self, n: int, d: int, *, seed: int, round: int) -> Plan | None:
        if not self.capabilities.shared_plan:
            return None
        self.check(n, d)
        return Plan(*self.kernel.plan(n, d, check_seed(seed), check_int(round, "round")), disjoint=self.disjoint(n, d))

    def plan_ranges(self, n: int, d: int, *, seed: int, round: int) -> Ranges | None:
        if not self.capabilities.shared_plan:
            return None
        self.check(n, d)
        out = self.kernel.plan_ranges(n, d, check_seed(seed), check_int(round, "round"))
        return None if out is None else Ranges(*out)

    def round(self, n: int, d: int, *, seed: int, round: int) -> Round:
        self.check(n, d)
        if not self.capabilities.shared_plan:
            raise ValueError(f"{self.name} has no shared plan (capabilities.shared_plan is False)")
        return self.kernel.round(n, d, check_seed(seed), check_int(round, "round"))  # type: ignore[no-any-return]

    def round_ahead(self, n: int, d: int, *, seed: int, round: int) -> PendingRound:
        self.check(n, d)
        if not self.capabilities.shared_plan:
            raise ValueError(f"{self.name} has no shared plan (capabilities.shared_plan is False)")
        return self.kernel.round_ahead(n, d, check_seed(seed), check_int(round, "round"))  # type: ignore[no-any-return]


def _iv_constant(n: int, q: int) -> float:
    """``1 - n(q-1)/((n-1)q) = (n-q)/((n-1)q)``: the IV constant of the block/permutation
    compressors with ``q`` workers per block (0 when every worker sends everything)."""
    return 0.0 if n == q else (n - q) / ((n - 1) * q)


@dataclass(frozen=True)
class Sparsifier(RustCompressor):
    """A Rust-kernel compressor that selects and scales coordinates (PermK, RandK, TopK,
    Identity, BlockPermK, CoordinateSampling): the part of :class:`Compose` that follows a
    quantizer in the same Rust kernel."""


@dataclass(frozen=True)
class PermK(Sparsifier):
    """PermK (Definitions 1 and 2, and their general forms in "General Examples of PermK").

    For ``d >= n`` (``d = kn + r``) one shared permutation of the coordinates gives worker ``i``
    the block ``π[ik:(i+1)k]``; a second permutation of the workers hands the ``r`` leftover
    coordinates to ``r`` of them; values are scaled by ``n``. Theorem "PermK" (d ≥ n): ``IV(1)``,
    ``A = B = 1``. For ``n > d`` (``n = qd + r``) each coordinate goes to ``q`` workers chosen by
    a shared permutation of the workers, ``r`` workers stay idle, values are scaled by ``n/q``:
    ``A = B = 1 - n(q-1)/((n-1)q)`` (Theorem "PermK" (n ≥ d): ``1 - (n-d)/(n-1)`` when ``d | n``).
    No indices are sent: every worker recomputes the permutations from ``(seed, round)``.

    The variance depends only on every coordinate having exactly one owner, uniform over the
    workers, so :class:`BlockPermK` with ``m = n`` (fixed contiguous blocks handed out by a random
    permutation of the workers) has the same ``(A, B) = (1, 1)`` with O(n) shared randomness per
    round instead of O(d), and contiguous messages: prefer ``BlockPermK(n)`` when ``d`` is large
    (the permutation of ``d`` coordinates is then the cost of a round, above all on MPI) and
    ``PermK()`` when the coordinates of a block should not stay together from round to round
    (e.g. an adversarially ordered gradient whose large entries share a block).

    >>> PermK().ab_constants(10, 100), PermK().ab_constants(10, 5)
    ((1.0, 1.0), (0.4444444444444444, 0.4444444444444444))
    """

    capabilities = Capabilities(shared_plan=True)
    ab_exact = True
    permutation_based = True

    def kernel_args(self) -> dict[str, Any]:
        return {"sparsifier": "permk"}

    def disjoint(self, n: int, d: int) -> bool:
        return d >= n

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
class RandK(Sparsifier):
    """Independent RandK: each worker sends ``k`` uniformly random coordinates scaled by ``d/k``.

    ``C_i ∈ U(ω)`` with ``ω = d/k - 1``; independence gives ``(A, B) = (ω/n, 0)`` (Lemma 1).
    Worker ``i``'s coordinates are a pure function of ``(seed, round, i)``, so the receiver
    recomputes them ("shared-seed RandK"): no indices are sent.

    >>> RandK(10).ab_constants(n=10, d=100)
    (0.9, 0.0)
    """

    k: int
    tunable = "k"
    capabilities = Capabilities(shared_plan=True, fixed_size=True)
    ab_exact = True

    def __post_init__(self) -> None:
        check_int(self.k, "k", low=1)

    @property
    def name(self) -> str:
        return f"RandK(k={self.k})"

    @classmethod
    def examples(cls, n: int, d: int, rng: np.random.Generator | None = None) -> list[Compressor]:
        return [cls(max(1, d // 3) if rng is None else int(rng.integers(1, d + 1)))]

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray:
        return np.shape(A)[1] / self.k * np.abs(A)

    def kernel_args(self) -> dict[str, Any]:
        return {"sparsifier": "randk", "k": self.k}

    def omega(self, n: int, d: int) -> float:
        self.check(n, d)
        return d / self.k - 1.0

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        return (self.omega(n, d) / n, 0.0)

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return self.k


@dataclass(frozen=True)
class TopK(Sparsifier):
    """TopK: the ``k`` largest-magnitude coordinates (ties: lower index), unscaled.

    Deterministic and biased; contractive with ``α = k/d`` (eq. (contractive)). The receiver
    needs the indices, which :meth:`bits_per_worker` counts. Used with EF21.

    >>> TopK(5).alpha(3, 100), TopK(5).ab_constants(3, 100) is None
    (0.05, True)
    """

    k: int
    tunable = "k"
    capabilities = Capabilities(unbiased=False, fixed_size=True, needs_indices=True, deterministic=True)

    def __post_init__(self) -> None:
        check_int(self.k, "k", low=1)

    @property
    def name(self) -> str:
        return f"TopK(k={self.k})"

    @classmethod
    def examples(cls, n: int, d: int, rng: np.random.Generator | None = None) -> list[Compressor]:
        return [cls(max(1, d // 3) if rng is None else int(rng.integers(1, d + 1)))]

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray:
        return np.abs(A)

    def kernel_args(self) -> dict[str, Any]:
        return {"sparsifier": "topk", "k": self.k}

    def alpha(self, n: int, d: int) -> float:
        self.check(n, d)
        return self.k / d

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return self.k


@dataclass(frozen=True)
class Identity(Sparsifier):
    """No compression: every worker sends its whole vector (GD / uncompressed MARINA).

    >>> Identity().ab_constants(4, 10), Identity().omega(4, 10)
    ((0.0, 0.0), 0.0)
    """

    capabilities = Capabilities(fixed_size=True, deterministic=True, lossless=True)
    ab_exact = True

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray:
        return np.abs(A)

    def kernel_args(self) -> dict[str, Any]:
        return {"sparsifier": "identity"}

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        self.check(n, d)
        return (0.0, 0.0)

    def omega(self, n: int, d: int) -> float:
        self.check(n, d)
        return 0.0

    def alpha(self, n: int, d: int) -> float:
        self.check(n, d)
        return 1.0

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return d


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
    aggregate buffer through one ``Allgatherv``. Prefer it to :class:`PermK` when ``d`` is large
    or the run is distributed; the two converge alike per bit (same second moments; see the
    README's experiment). Unlike PermK, the block of a coordinate never changes.

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

    def disjoint(self, n: int, d: int) -> bool:
        return n // self.m == 1

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

    def disjoint(self, n: int, d: int) -> bool:
        return True

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
    (:meth:`variance_bound`; ``params["gamma_source"]`` says so). As one family on all ``n``
    workers it also satisfies the plain AB inequality with ``A = max_k |G_k| A_k / n`` and
    ``B = 1/Σ_k (1/B_k)`` (0 if some ``B_k`` is), which the complexity calculator uses.

    >>> g = GroupPermK(((0, 1), (2, 3)))
    >>> g.ab_constants(4, 8), g.floats_per_worker(4, 8)
    ((0.5, 0.5), 4)
    """

    groups: tuple[tuple[int, ...], ...]
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

    def disjoint(self, n: int, d: int) -> bool:
        return len(self.groups) == 1 and self.inner.disjoint(n, d)

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

    def variance_bound(self, n: int, d: int, constants: Any, problem: Any = None) -> VarianceBound:
        """Theorem "AB_group"'s ``L̂²_G`` from the problem's group constants
        (:func:`permk.theory.group_hessian_variance`, exact for quadratics); without a problem,
        Theorem "AB" with :meth:`ab_constants`."""
        if problem is None:
            return super().variance_bound(n, d, constants)
        from .theory.group import group_hessian_variance

        self.check(n, d)
        ghv = group_hessian_variance(problem, self.groups, self.inner)
        return VarianceBound(ghv.L_hat_sq, "Theorem AB_group", "Theorem AB_group (PL)")

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
            b = self.inner.magnitude_bound(np.asarray(A)[list(g)])
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
        return Plan(offsets, coords, np.array([s for _, _, s in parts]), disjoint=self.disjoint(n, d))

    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> Message:
        x = as_float_array(x, 1, "x")
        n = check_int(n_workers, "n_workers", low=1)
        w = check_int(worker, "worker", high=n)
        self.check(n, x.shape[0])
        group, local = self._group_of
        k = int(group[w])
        m = self.inner.checked_compress(x, worker=int(local[w]), n_workers=len(self.groups[k]), seed=_derived_seed(check_seed(seed), k), round=round)
        return Message(worker=w, n_workers=n, d=m.d, indices=m.indices, values=m.values)

    def compress_all(self, A: Any, *, seed: int, round: int) -> np.ndarray:
        A = as_float_array(A, 2, "A")
        n, d = A.shape
        plan = self.plan(n, d, seed=seed, round=round)
        rows = np.repeat(np.arange(n), np.diff(plan.offsets))
        out = np.zeros((n, d), dtype=A.dtype)
        out[rows, plan.coords] = _scaled(A[rows, plan.coords], plan.scales[rows])
        return out

    def aggregate(self, A: Any, *, seed: int, round: int) -> np.ndarray:
        """``(1/n) Σ_i C_i(A[i])``: the plan's values added in worker order, then divided by ``n``
        (bit for bit the messages' :func:`aggregate_messages`)."""
        A = as_float_array(A, 2, "A")
        n, d = A.shape
        plan = self.plan(n, d, seed=seed, round=round)
        rows = np.repeat(np.arange(n), np.diff(plan.offsets))
        vals = _scaled(A[rows, plan.coords], plan.scales[rows])
        if not np.isfinite(vals).all():
            raise ValueError(f"non-finite value (NaN or inf) in the input or the compressed output (overflow) of {self.name}")
        acc = np.bincount(plan.coords, weights=vals.astype(np.float64), minlength=d)
        if A.dtype == np.float32:  # sums in float32, in worker order, as aggregate_messages does
            acc32 = np.zeros(d, dtype=np.float32)
            for w in range(n):
                sl = slice(plan.offsets[w], plan.offsets[w + 1])
                acc32[plan.coords[sl]] += vals[sl]
            return acc32 / np.float32(n)
        return acc / n


def _scaled(x: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``scale · x`` computed in float64 and rounded once to ``x``'s dtype (as the Rust kernels do)."""
    return (x.astype(np.float64) * scales).astype(x.dtype)


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
        """Equality in the AB inequality: condition 1 tight, ``ω + 1 = θ/n``."""
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
        u = int(_core.permutation(check_seed(seed), check_int(round, "round"), n)[w])
        y = self._apply(u, x)
        sup = self._supports
        idx = np.arange(x.shape[0]) if sup is None else sup[u]
        vals = y[idx]
        if not np.isfinite(vals).all():
            raise ValueError(f"non-finite value (NaN or inf) in the compressed output of worker {w}")
        return Message(worker=w, n_workers=n, d=x.shape[0], indices=idx, values=vals)


@dataclass(frozen=True)
class Quantizer(RustCompressor):
    """An unbiased quantizer ``Q ∈ U(ω)``: used alone (independently by every worker, so
    ``(A, B) = (ω/n, 0)``) or inside :class:`Compose`; a subclass names its kernel in
    :meth:`quantizer_args`."""

    capabilities = Capabilities(fixed_size=True)

    @abc.abstractmethod
    def quantizer_args(self) -> dict[str, Any]:
        """``{"quantizer": name, **params}`` of ``permk._core.Spec``."""

    def kernel_args(self) -> dict[str, Any]:
        return {"sparsifier": "identity", **self.quantizer_args()}

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        return (self.omega(n, d) / n, 0.0)

    def floats_per_worker(self, n: int, d: int) -> int:
        self.check(n, d)
        return d

    @abc.abstractmethod
    def omega(self, n: int, d: int) -> float: ...


@dataclass(frozen=True)
class NaturalCompression(Quantizer):
    """Natural compression: ``x`` is rounded at random to one of the two nearest powers of two
    (unbiasedly); ``ω = 1/8``. A value is sent as sign + exponent: 9 bits for 32-bit floats,
    12 for 64-bit ones.

    >>> NaturalCompression().omega(1, 100)
    0.125
    """

    @property
    def name(self) -> str:
        return "Natural"

    def quantizer_args(self) -> dict[str, Any]:
        return {"quantizer": "natural"}

    def omega(self, n: int, d: int) -> float:
        self.check(n, d)
        return 0.125

    def value_bits(self, float_bits: int = 32) -> int:
        return 9 if float_bits <= 32 else 12

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray:
        return 2.0 * np.abs(A)


@dataclass(frozen=True)
class QSGD(Quantizer):
    """QSGD with ``s`` levels: ``Q(x)_j = ‖x‖ sign(x_j) ξ_j / s`` with ``ξ_j`` the random
    rounding of ``s|x_j|/‖x‖``; ``ω = min(d/s², √d/s)``. A message is the norm (one float) and
    per value a sign and a level (``1 + ⌈log2(s+1)⌉`` bits).

    >>> QSGD(4).omega(1, 16)
    1.0
    """

    s: int

    def __post_init__(self) -> None:
        check_int(self.s, "s", low=1, high=2**32)

    @property
    def name(self) -> str:
        return f"QSGD(s={self.s})"

    @classmethod
    def default(cls, n: int, d: int) -> QSGD:
        """``QSGD(⌈√d⌉)``: ``ω = 1`` (at most one ``‖x‖`` of variance per value)."""
        return cls(max(1, math.isqrt(d - 1) + 1))

    @classmethod
    def examples(cls, n: int, d: int, rng: np.random.Generator | None = None) -> list[Compressor]:
        return [cls(3 if rng is None else int(rng.integers(1, 7)))]

    def quantizer_args(self) -> dict[str, Any]:
        return {"quantizer": "qsgd", "s": self.s}

    def omega(self, n: int, d: int) -> float:
        self.check(n, d)
        return min(d / self.s**2, math.sqrt(d) / self.s)

    def value_bits(self, float_bits: int = 32) -> int:
        return 1 + _ceil_log2(self.s + 1)

    def overhead_bits(self, float_bits: int = 32) -> int:
        return float_bits

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray:
        return np.broadcast_to(np.linalg.norm(A, axis=1, keepdims=True), np.shape(A))


@dataclass(frozen=True)
class Compose(Compressor):
    """``C_i ∘ Q_i``: quantize, then sparsify (Lemma "Composition").

    If ``{C_i} ∈ U(A, B)`` and ``Q_i ∈ U(ω)`` are independent of the ``C_i``, the paper's Lemma
    "Composition" states ``{C_i ∘ Q_i} ∈ U((ω+1)A, B)``. Its proof bounds the deviation from the
    *quantized* mean ``(1/n) Σ Q_i(a_i)``; the deviation of that mean from ``ā`` adds
    ``(1 − B) E‖(1/n) Σ Q_i(a_i) − ā‖² ≤ (1 − B)(ω/n)(1/n) Σ‖a_i‖²`` (the ``Q_i`` are independent
    across workers here). So ``ab_constants`` returns ``((ω+1)A + (1−B)ω/n, B)``: the paper's
    constants when ``B = 1`` (PermK, ``d ≥ n``), and e.g. ``(((ω+1)(ω_C+1) − 1)/n, 0)`` for
    independent RandK (``A = ω_C/n, B = 0``). (For PermK with ``n = 2, d = 1``, ``A = B = 0``
    and the paper's constants would claim zero variance.)

    With a :class:`Sparsifier` both run in one Rust kernel and only the sent coordinates are
    quantized (QSGD uses the norm of the worker's whole input, as ``Q_i`` acts on it first);
    any other compressor (defined in Python, ``GroupPermK``, ``PermutationOfMappings``) is
    applied to the quantized vector ``Q_i(x)``.

    >>> Compose(PermK(), NaturalCompression()).ab_constants(4, 40)
    (1.125, 1.0)
    """

    sparsifier: Compressor
    quantizer: Quantizer

    def __post_init__(self) -> None:
        if not isinstance(self.quantizer, Quantizer):
            raise TypeError(f"Compose's quantizer must be a Quantizer (NaturalCompression, QSGD), got {type(self.quantizer).__name__}")
        if not isinstance(self.sparsifier, Compressor) or isinstance(self.sparsifier, (Quantizer, Compose)):
            raise TypeError(f"Compose's sparsifier must be a compressor that is not itself quantized, got {type(self.sparsifier).__name__}")

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        # the quantizer's own randomness: no shared plan, not deterministic; its size is not tunable here
        return dataclasses.replace(self.sparsifier.capabilities, shared_plan=False, deterministic=False, tunable=None)

    @cached_property
    def kernel(self) -> _core.Spec | None:  # type: ignore[override]
        if isinstance(self.sparsifier, Sparsifier):
            return _core.Spec(**self.sparsifier.kernel_args(), **self.quantizer.quantizer_args())
        return None

    @property
    def name(self) -> str:
        return f"{self.sparsifier.name}∘{self.quantizer.name}"

    @classmethod
    def default(cls, n: int, d: int) -> Compose:
        return cls(PermK(), NaturalCompression())

    @classmethod
    def examples(cls, n: int, d: int, rng: np.random.Generator | None = None) -> list[Compressor]:
        if rng is None:
            return [cls(PermK(), NaturalCompression()), cls(RandK(max(1, d // 2)), QSGD(2)),
                    cls(BlockPermK(min(n, d, 2)), QSGD(5)), cls(TopK(max(1, d // 2)), NaturalCompression())]
        return [cls(PermK(), NaturalCompression()),
                cls(RandK(int(rng.integers(1, d + 1))), QSGD(int(rng.integers(1, 5))))]

    def check(self, n: int, d: int) -> None:
        if self.kernel is not None:
            super().check(n, d)
            self.kernel.check(n, d)
        else:
            self.sparsifier.check(n, d)

    def ab_constants(self, n: int, d: int) -> tuple[float, float] | None:
        ab = self.sparsifier.ab_constants(n, d)
        if ab is None:
            return None
        a, b = ab
        w = self.quantizer.omega(n, d)
        return ((w + 1.0) * a + max(0.0, 1.0 - b) * w / n, b)

    def omega(self, n: int, d: int) -> float | None:
        w = self.sparsifier.omega(n, d)
        if w is None:
            return None
        return (w + 1.0) * (self.quantizer.omega(n, d) + 1.0) - 1.0

    def floats_per_worker(self, n: int, d: int) -> int:
        return self.sparsifier.floats_per_worker(n, d)

    def expected_floats_per_worker(self, n: int, d: int) -> float:
        return self.sparsifier.expected_floats_per_worker(n, d)

    def value_bits(self, float_bits: int = 32) -> int:
        return self.quantizer.value_bits(float_bits)

    def overhead_bits(self, float_bits: int = 32) -> int:
        return self.quantizer.overhead_bits(float_bits)

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray | None:
        quantized = self.quantizer.magnitude_bound(A)
        return None if quantized is None else self.sparsifier.magnitude_bound(quantized)

    # the calls: one Rust kernel for a Sparsifier, else the sparsifier on Q_i(x)
    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> Message:
        if self.kernel is not None:
            return RustCompressor.compress(self, x, worker=worker, n_workers=n_workers, seed=seed, round=round)  # type: ignore[arg-type]
        q = self.quantizer.checked_compress(x, worker=worker, n_workers=n_workers, seed=seed, round=round)
        return self.sparsifier.checked_compress(q.to_dense(), worker=worker, n_workers=n_workers, seed=seed, round=round)


def catalog() -> dict[str, type[Compressor]]:
    """The package's compressor classes by lower-case name (``"permk"``, ``"randk"``, …): what
    the experiments' ``--methods METHOD-COMPRESSOR`` and the generic tests enumerate."""
    import sys

    module = sys.modules[__name__]
    out: dict[str, type[Compressor]] = {}
    for name in __all__:
        obj = getattr(module, name)
        if isinstance(obj, type) and issubclass(obj, Compressor) and not inspect.isabstract(obj):
            out[name.lower()] = obj
    return out
