"""The base types of the compressors: messages, plans and rounds, capabilities, and
:class:`Compressor`, what every compressor is.

A compressor MUST define :meth:`Compressor.floats_per_worker` and one of
:meth:`Compressor.compress` (what worker ``i`` sends) or :meth:`Compressor.plan` (the
coordinates every worker sends in a round, a pure function of ``(seed, round)``); it gets the
other calls from the one it defines. It MAY declare its theory (``ab_constants``, ``omega``,
``alpha``, ``variance_bound``), its :class:`Capabilities`, its message format (``value_bits``,
``overhead_bits``, ``expected_floats_per_worker``) and its standard instance (``default``).
The hooks only the package's generic tests use (instances to test, a magnitude bound, whether
the AB inequality is tight) are :class:`permk.testing.TestingHooks`, not members of
:class:`Compressor`.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import hashlib
import inspect
import math
import sys
import types
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol, Sequence, runtime_checkable

import numpy as np

from .._validate import all_finite, as_float_array, check_int, check_seed, index_array
from ..registry import Catalog


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
        vals = scaled(a[rows - start, self.coords(start, stop)], self.plan.scales[rows])
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


def ceil_log2(x: int) -> int:
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
    with ``d ≥ n``) and :meth:`Round.ranges` (one contiguous range per worker, in ``O(n)``:
    BlockPermK, PermK with ``n > d``).
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
    * ``dense`` — every message holds all ``d`` coordinates in order (Identity, the
      quantizers): the receiver knows the indices, so only the values travel on MPI.
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
    dense: bool = False
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
    """A plan whose workers send one contiguous range each (:meth:`Round.ranges`): worker ``i``
    sends coordinates ``starts[i]:stops[i]`` (none when equal), each value multiplied by
    ``scales[i]``."""

    starts: np.ndarray
    stops: np.ndarray
    scales: np.ndarray


def _is_compressor_class(obj: Any) -> bool:
    """A class of a compressor that can be instantiated: a Compressor subclass, not abstract,
    that defines ``compress`` or ``plan``."""
    return (isinstance(obj, type) and issubclass(obj, Compressor) and not inspect.isabstract(obj)
            and (obj.compress is not Compressor.compress or obj.plan is not Compressor.plan))


def _check_registrable(obj: Any) -> None:
    if not (isinstance(obj, type) and issubclass(obj, Compressor)):
        raise TypeError(f"register: a compressor is registered as its class, a subclass of permk.Compressor, got {obj!r}")
    if not _is_compressor_class(obj):
        raise TypeError(f"register: {obj.__qualname__} cannot be instantiated (abstract, or defines neither compress nor plan)")


def _package_compressors() -> dict[str, type[Compressor]]:
    """The package's compressor classes by lower-case name: those :mod:`permk.compressors`
    exports (read when a catalog is first asked for, when the package is loaded)."""
    package = sys.modules[__package__]
    return {name.lower(): obj for name in package.__all__ if _is_compressor_class(obj := getattr(package, name))}


#: The catalog of compressor classes (:func:`permk.compressors.catalog`, :func:`permk.register`).
COMPRESSORS = Catalog("compressor", key=lambda cls: cls.__name__.lower(), check=_check_registrable, builtins=_package_compressors)


class Compressor(abc.ABC):
    """A family of compressors ``{C_i}_{i=1}^n`` (possibly correlated across workers).

    A subclass MUST define :meth:`floats_per_worker` and one of :meth:`compress` (worker
    ``i``'s message) or :meth:`plan` (every worker's coordinates in a round, from
    ``(seed, round)``); instantiating one that defines neither is a TypeError. It gets the rest:
    :meth:`compress` from the plan, and :meth:`compress_all`, :meth:`compress_rows` and
    :meth:`aggregate` from its Rust :attr:`kernel` when it has one, else from its plan when it
    has a shared plan, else from :meth:`compress` worker by worker — so a compressor defined in
    Python works everywhere a built-in one does (simulator, MPI,
    :func:`permk.theory.estimate_ab`). Everything else it MAY declare: the theory (``None``,
    unknown, by default), its :attr:`capabilities` (by default: unbiased, with a shared plan
    exactly when it defines :meth:`plan`), its message format and its :meth:`default` instance.

    >>> import numpy as np, permk
    >>> class Halves(permk.Compressor):
    ...     '''Two workers: worker i sends half i of the coordinates, scaled by 2.'''
    ...     def floats_per_worker(self, n, d):
    ...         return -(-d // 2)
    ...     def plan(self, n, d, *, seed, round):
    ...         cut = d // 2
    ...         return permk.Plan(np.array([0, cut, d]), np.arange(d), np.array([2.0, 2.0]), disjoint=True)
    >>> c = Halves()
    >>> c.capabilities.shared_plan, c.compress(np.arange(4.0), worker=1, n_workers=2, seed=0, round=0).values
    (True, array([4., 6.]))
    >>> c.aggregate(np.ones((2, 4)), seed=0, round=0)
    array([1., 1., 1., 1.])
    """

    #: The constructor argument that sets the message size (see :class:`Capabilities`).
    tunable: ClassVar[str | None] = None
    #: Whether it is one of the paper's permutation-based compressors (PermK, BlockPermK, …):
    #: what :class:`GroupPermK` runs inside its groups.
    permutation_based: ClassVar[bool] = False
    #: The catalog a compressor class joins with :func:`permk.register`.
    catalog_kind: ClassVar[Catalog] = COMPRESSORS

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # the class attribute `tunable` is the one place a compressor says it: a subclass that
        # declares its capabilities as a class attribute gets it filled in
        caps = cls.__dict__.get("capabilities")
        if isinstance(caps, Capabilities) and caps.tunable != cls.tunable:
            setattr(cls, "capabilities", dataclasses.replace(caps, tunable=cls.tunable))

    def __new__(cls, *args: Any, **kwargs: Any) -> Compressor:
        if cls.compress is Compressor.compress and cls.plan is Compressor.plan:
            raise TypeError(f"Can't instantiate {cls.__qualname__}: a compressor defines compress (one worker's message) "
                            "or plan (every worker's coordinates in a round)")
        return super().__new__(cls)

    @property
    def capabilities(self) -> Capabilities:
        """What this compressor can do (see :class:`Capabilities`): by default unbiased, with a
        shared plan when the class defines :meth:`plan`."""
        return Capabilities(shared_plan=type(self).plan is not Compressor.plan, tunable=self.tunable)

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
        return ceil_log2(d) if (indices and self.capabilities.needs_indices and full < d) else 0

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
        ``(A − B)L_+² + B L_±²`` from :meth:`ab_constants`. A compressor may override it; the
        methods read it through :func:`permk.theory.variance_bound`, which bounds a compressor
        that declares groups of workers (``GroupPermK``) with the ``problem`` itself."""
        ab = self.ab_constants(n, d)
        if ab is None:
            raise ValueError(f"{self.name} states no AB constants (Assumption 'AB inequality')")
        A, B = ab
        value = max((A - B) * constants.L_plus**2 + B * constants.L_pm**2, 0.0)
        return VarianceBound(value, "Theorem AB", "Theorem AB-PL")

    # -- calls ------------------------------------------------------------------------------
    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> Message:
        """Worker ``worker``'s message ``C_worker(x)`` in round ``round``; by default the
        coordinates :meth:`plan` gives the worker, each value times the worker's scale."""
        x = as_float_array(x, 1, "x")
        n = check_int(n_workers, "n_workers", low=1)
        w = check_int(worker, "worker", high=n)
        plan = self.checked_plan(n, x.shape[0], seed=seed, round=round)
        idx = plan.worker(w)
        vals = scaled(x[idx], plan.scales[w])
        if not np.isfinite(vals).all():
            raise ValueError(f"non-finite value (NaN or inf) in the compressed output of worker {w}")
        return Message(worker=w, n_workers=n, d=x.shape[0], indices=idx, values=vals)

    def plan(self, n: int, d: int, *, seed: int, round: int) -> Plan | None:
        """The round's coordinates per worker when they depend only on ``(seed, round)``
        (``capabilities.shared_plan``: PermK, RandK, BlockPermK), else None."""
        return None

    def checked_plan(self, n: int, d: int, *, seed: int, round: int) -> Plan:
        """:meth:`plan`, its answer checked where it is used: a :class:`Plan` (TypeError
        otherwise) of ``n`` workers with integer coordinates in ``[0, d)`` and ``n`` finite
        scales (ValueError naming the compressor and the field otherwise)."""
        self.check(n, d)
        p = self.plan(n, d, seed=check_seed(seed), round=check_int(round, "round"))
        if p is None:
            raise ValueError(f"{self.name} has no shared plan (capabilities.shared_plan is False, or its plan() returned None)")
        if not isinstance(p, Plan):
            raise TypeError(f"{self.name}.plan must return a permk.Plan, got {type(p).__name__}")
        offsets, coords, scales = np.asarray(p.offsets), np.asarray(p.coords), np.asarray(p.scales, dtype=np.float64)
        if offsets.shape != (n + 1,) or offsets.dtype.kind not in "iu" or offsets[0] != 0 or (np.diff(offsets) < 0).any():
            raise ValueError(f"{self.name}.plan returned offsets that are not {n + 1} non-decreasing integers from 0: {offsets!r}")
        if coords.ndim != 1 or (coords.size and coords.dtype.kind not in "iu") or len(coords) != int(offsets[-1]):
            raise ValueError(f"{self.name}.plan returned coords that are not {int(offsets[-1])} integers (offsets[-1])")
        if coords.size and (int(coords.min()) < 0 or int(coords.max()) >= d):
            raise ValueError(f"{self.name}.plan returned coords outside [0, d) = [0, {d})")
        if scales.shape != (n,) or not np.isfinite(scales).all():
            raise ValueError(f"{self.name}.plan returned scales that are not {n} finite numbers: shape {scales.shape}")
        return Plan(offsets.astype(np.int64, copy=False), coords.astype(np.int64, copy=False), scales, bool(p.disjoint))

    def round(self, n: int, d: int, *, seed: int, round: int) -> Round:
        """The round's shared plan as a :class:`Round`, computed once for all the round's
        exchanges (the backends use it; ``capabilities.shared_plan`` required). By default a
        :class:`PlanRound` over :meth:`plan`; a Rust compressor returns the native round."""
        return PlanRound(self.checked_plan(n, d, seed=seed, round=round), d)

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

    def _planned(self, A: np.ndarray, start: int, n: int, seed: int, round: int) -> tuple[Plan, np.ndarray, np.ndarray]:
        """The plan, and the sent values of workers ``start …`` (the rows of ``A``) with their
        rows in ``A``, in worker order."""
        m, d = A.shape
        plan = self.checked_plan(n, d, seed=seed, round=round)
        lo, hi = int(plan.offsets[start]), int(plan.offsets[start + m])
        rows = np.repeat(np.arange(m), np.diff(plan.offsets[start : start + m + 1]))
        vals = scaled(A[rows, plan.coords[lo:hi]], plan.scales[start + rows])
        if not np.isfinite(vals).all():
            raise ValueError(f"non-finite value (NaN or inf) in the input or the compressed output (overflow) of {self.name}")
        return plan, rows, vals

    # The calls below run in the Rust kernel when the compressor has one (:attr:`kernel`), else
    # from its shared plan when it has one, else call :meth:`compress` worker by worker.
    def compress_all(self, A: Any, *, seed: int, round: int) -> np.ndarray:
        """The ``(n, d)`` array of compressed rows ``C_i(A[i])``."""
        A = as_float_array(A, 2, "A")
        if self.kernel is not None:
            return self.kernel.compress_all(A, check_seed(seed), check_int(round, "round"))  # type: ignore[no-any-return]
        n, d = A.shape
        if self.capabilities.shared_plan:
            plan, rows, vals = self._planned(A, 0, n, seed, round)
            out = np.zeros((n, d), dtype=A.dtype)
            out[rows, plan.coords] = vals
            return out
        return np.stack([self.checked_compress(A[i], worker=i, n_workers=n, seed=seed, round=round).to_dense() for i in range(n)])

    def compress_rows(self, A: Any, *, start: int, n_workers: int, seed: int, round: int) -> Messages:
        """The messages of workers ``start … start + m − 1`` whose inputs are the rows of ``A``
        (shape ``(m, d)``), as :class:`Messages` (what an MPI rank holding those workers sends)."""
        A = as_float_array(A, 2, "A")
        n = check_int(n_workers, "n_workers", low=1)
        start = check_int(start, "start", high=n)
        if self.kernel is not None:
            return Messages(*self.kernel.compress_rows(A, start, n, check_seed(seed), check_int(round, "round")))
        if start + A.shape[0] > n:
            raise ValueError(f"A holds {A.shape[0]} rows from worker {start}: more than the {n} workers")
        if self.capabilities.shared_plan:
            plan, _, vals = self._planned(A, start, n, seed, round)
            offsets = plan.offsets[start : start + A.shape[0] + 1]
            return Messages(offsets - offsets[0], plan.coords[offsets[0] : offsets[-1]].copy(), vals)
        msgs = [self.checked_compress(A[j], worker=start + j, n_workers=n, seed=seed, round=round) for j in range(A.shape[0])]
        offsets = np.concatenate([[0], np.cumsum([len(m.indices) for m in msgs])]).astype(np.int64)
        return Messages(offsets, np.concatenate([m.indices for m in msgs]).astype(np.int64),
                        np.concatenate([m.values for m in msgs]) if msgs else np.zeros(0, dtype=A.dtype))

    def compress_shifted_rows(self, G: np.ndarray, H: np.ndarray | None = None, *, beta: float = 1.0, start: int, n_workers: int,
                              seed: int, round: int, rows: Any = None) -> Messages | None:
        """The messages of workers ``start … start + m − 1`` whose inputs are ``G − β·H``
        (``G`` without ``H``; both ``(m, d)``, one float dtype: ``G − H`` when ``β = 1``, else
        ``G − H·β``), or None when an input is not finite (the exchanges' divergence): bit for
        bit :meth:`compress_rows` of that array. With a Rust kernel the inputs are formed,
        checked and compressed worker by worker on the core's threads, never as one array (the
        shifted exchanges of error feedback, DIANA and DASHA without a shared plan).

        ``rows`` (``m`` integer indices into ``G``'s rows): worker ``start + r``'s row of ``G``
        is ``G[rows[r]]``, ``H`` has one row per worker; bit for bit the call on ``G[rows]``,
        which a Rust kernel never forms (workers sharing a row of ``G``, such as the linear
        autoencoder's workers sharing a split, read it in place)."""
        n = check_int(n_workers, "n_workers", low=1)
        start = check_int(start, "start", high=n)
        if rows is not None:
            rows = index_array(rows, "rows")
            G = np.asarray(G)
            if G.ndim == 2 and rows.size and (int(rows.min()) < 0 or int(rows.max()) >= G.shape[0]):
                raise ValueError(f"rows must index the {G.shape[0]} rows of G, got values from {int(rows.min())} to {int(rows.max())}")
        if self.kernel is not None:
            out = self.kernel.compress_shifted_rows(G, H, float(beta), start, n, check_seed(seed), check_int(round, "round"), rows)
            return None if out is None else Messages(*out)
        if rows is not None:
            G = G[rows]
        with np.errstate(invalid="ignore", over="ignore"):
            V = G if H is None else G - (H if beta == 1.0 else H * beta)
        if not all_finite(V):
            return None
        return self.compress_rows(V, start=start, n_workers=n, seed=seed, round=round)

    def aggregate(self, A: Any, *, seed: int, round: int) -> np.ndarray:
        """``(1/n) Σ_i C_i(A[i])``, summed in worker order and divided by ``n`` (bit for bit the
        messages' :func:`aggregate_messages`)."""
        A = as_float_array(A, 2, "A")
        if self.kernel is not None:
            return self.kernel.aggregate(A, check_seed(seed), check_int(round, "round"))  # type: ignore[no-any-return]
        n, d = A.shape
        if self.capabilities.shared_plan:
            plan, _, vals = self._planned(A, 0, n, seed, round)
            if A.dtype == np.float32:  # sums in float32, in worker order, as aggregate_messages does
                acc32 = np.zeros(d, dtype=np.float32)
                for w in range(n):
                    sl = slice(plan.offsets[w], plan.offsets[w + 1])
                    acc32[plan.coords[sl]] += vals[sl]
                return acc32 / np.float32(n)
            return np.bincount(plan.coords, weights=vals.astype(np.float64), minlength=d) / n
        return aggregate_messages([self.checked_compress(A[i], worker=i, n_workers=n, seed=seed, round=round) for i in range(n)])

    def check(self, n: int, d: int) -> None:
        """Raise ValueError unless the compressor is defined for ``n`` workers in dimension ``d``."""
        check_int(n, "n_workers", low=1)
        check_int(d, "d", low=1)

    # -- identity, standard instance ----------------------------------------------------------
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



def scaled(x: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``scale · x`` computed in float64 and rounded once to ``x``'s dtype (as the Rust kernels do)."""
    return (x.astype(np.float64) * scales).astype(x.dtype)


