"""What every compressor is: :class:`Compressor`, its :class:`Capabilities`, and the catalog
of compressor classes.

A compressor MUST define :meth:`Compressor.floats_per_worker` and one of
:meth:`Compressor.compress` (what worker ``i`` sends) or :meth:`Compressor.plan` (the
coordinates every worker sends in a round, a pure function of ``(seed, round)``); it gets the
other calls from the one it defines. It MAY declare its theory (``ab_constants``, ``omega``,
``alpha``, ``variance_bound``), its :class:`Capabilities`, its message format (``value_bits``,
``overhead_bits``, ``expected_floats_per_worker``) and its standard instance (``default``).
The hooks only the package's generic tests use (instances to test, a magnitude bound, whether
the AB inequality is tight) are :class:`permk.testing.TestingHooks`, not members of
:class:`Compressor`.

What a compressor sends is in :mod:`~permk.compressors.messages`; the kernels its bulk calls run
on in :mod:`~permk.compressors.kernels`; its launch-check digest in
:mod:`~permk.compressors.fingerprint`.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import inspect
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, NamedTuple

import numpy as np

from .._validate import as_float_array, check_flag, check_int, check_seed, index_array
from ..registry import Catalog
from .fingerprint import digest, encode
from .kernels import Kernel, PlanKernel, RustKernel, WorkerKernel
from .messages import Message, Messages, PendingRound, Plan, Round, check_message, check_plan, scaled

__all__ = ["Compressor", "Capabilities", "VarianceBound", "COMPRESSORS"]


def ceil_log2(x: int) -> int:
    """``⌈log2 x⌉``, at least 1 (the bits of an index below ``x``)."""
    return max(1, math.ceil(math.log2(x))) if x > 1 else 1


@dataclass(frozen=True)
class Capabilities:
    """What a compressor can do; every caller asks these instead of the compressor's class.

    * ``unbiased`` — ``E[C_i(x)] = x`` (Assumption "Unbiasedness"); MARINA needs it.
    * ``shared_plan`` — the coordinates worker ``i`` sends are a pure function of
      ``(seed, round, i)`` and its values are ``scale_i · x_j``: :meth:`Compressor.plan` exists,
      the receiver recomputes the coordinates (no indices travel), and the methods evaluate only
      the sent coordinates (``path="fused"``).
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

    Two properties depend on ``(n, d)`` and the round, and so come with the round instead:
    :attr:`Round.disjoint` (no coordinate sent by two workers: the aggregate is placed, not
    summed — PermK with ``d ≥ n``) and :meth:`Round.ranges` (one contiguous range per worker,
    in ``O(n)``: BlockPermK, PermK with ``n > d``).
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
    :meth:`compress` from the plan, and :meth:`compress_all`, :meth:`compress_rows`,
    :meth:`compress_shifted_rows`, :meth:`aggregate`, :meth:`round` and :meth:`round_ahead`
    from its :attr:`bulk_kernel` — its Rust :attr:`kernel` when it has one, else its plan when
    it has a shared plan, else :meth:`compress` worker by worker — so a compressor defined in
    Python works everywhere a built-in one does (simulator, MPI,
    :func:`permk.theory.estimate_ab`). Everything else it MAY declare: the theory (``None``,
    unknown, by default), its :attr:`capabilities` (by default: unbiased, with a shared plan
    exactly when it defines :meth:`plan`), its message format and its :meth:`default` instance.

    A compressor pickles and deep-copies at any time: what it caches (every
    :func:`functools.cached_property`: its kernels, lookup tables) stays behind and is
    recomputed by the copy.

    >>> import numpy as np, permk
    >>> class Halves(permk.Compressor):
    ...     '''Two workers: worker i sends half i of the coordinates, scaled by 2.'''
    ...     def floats_per_worker(self, n, d):
    ...         return -(-d // 2)
    ...     def plan(self, n, d, *, seed, round):
    ...         cut = d // 2
    ...         return permk.Plan(np.array([0, cut, d]), np.arange(d), np.array([2.0, 2.0]))
    >>> c = Halves()
    >>> c.capabilities.shared_plan, c.compress(np.arange(4.0), worker=1, n_workers=2, seed=0, round=0).values
    (True, array([4., 6.]))
    >>> c.aggregate(np.ones((2, 4)), seed=0, round=0), c.round(2, 4, seed=0, round=0).disjoint
    (array([1., 1., 1., 1.]), True)
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

    def __getstate__(self) -> dict[str, Any]:
        """The state that pickles and deep-copies: the instance's attributes without its caches
        (the values of its :func:`functools.cached_property` members, such as a native kernel,
        which cannot be pickled)."""
        caches = _cached_names(type(self))
        return {k: v for k, v in vars(self).items() if k not in caches}

    @property
    def capabilities(self) -> Capabilities:
        """What this compressor can do (see :class:`Capabilities`): by default unbiased, with a
        shared plan when the class defines :meth:`plan`."""
        return Capabilities(shared_plan=type(self).plan is not Compressor.plan, tunable=self.tunable)

    @property
    def kernel(self) -> RustKernel | None:
        """The native kernel of a built-in compressor (a
        :class:`~permk.compressors.kernels.RustKernel`), else None: the ``"rust"`` paths use it."""
        return None

    @functools.cached_property
    def bulk_kernel(self) -> Kernel:
        """The :class:`~permk.compressors.kernels.Kernel` the bulk calls run on, chosen once:
        the native :attr:`kernel`, else a ``PlanKernel`` over :meth:`checked_plan` (a shared
        plan), else a ``WorkerKernel`` over :meth:`checked_compress`."""
        if self.kernel is not None:
            return self.kernel
        if self.capabilities.shared_plan:
            return PlanKernel(self.checked_plan, self.name)
        return WorkerKernel(self.checked_compress, self.name)

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

    def variance_bound(self, n: int, d: int, constants: Any, problem: Any = None) -> VarianceBound:
        """MARINA's variance constant ``L̂²`` on a problem with ``constants`` (``L_plus``,
        ``L_pm``: a :class:`permk.theory.Constants`): Theorem "AB"'s ``(A − B)L_+² + B L_±²``
        from :meth:`ab_constants`. A compressor may override it; the methods read it through
        :func:`permk.theory.variance_bound`, which bounds a compressor that declares groups of
        workers (``GroupPermK``) with the ``problem`` itself."""
        ab = self.ab_constants(n, d)
        if ab is None:
            raise ValueError(f"{self.name} states no AB constants (Assumption 'AB inequality')")
        A, B = ab
        value = max((A - B) * constants.L_plus**2 + B * constants.L_pm**2, 0.0)
        return VarianceBound(value, "Theorem AB", "Theorem AB-PL")

    # -- message size ---------------------------------------------------------------------
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
        ``float_bits`` (bits per float) is a positive integer below 2**16 and ``indices`` True or
        False: anything else is refused (TypeError or ValueError naming it).
        """
        return self._bits(self.floats_per_worker, n, d, float_bits, indices)  # type: ignore[return-value]

    def expected_bits_per_worker(self, n: int, d: int, *, float_bits: int = 32, indices: bool = True) -> float:
        """The expected message size of a worker in bits (see :meth:`bits_per_worker`: the same
        arguments refused)."""
        return self._bits(self.expected_floats_per_worker, n, d, float_bits, indices)

    def _bits(self, size: Callable[[int, int], float], n: int, d: int, float_bits: int, indices: bool) -> float:
        """``size(n, d)`` values, each with its index where the receiver needs it, and the overhead
        (``float_bits`` and ``indices`` checked here, for every message-size call)."""
        float_bits = check_int(float_bits, "float_bits", low=1, high=2**16)
        indices = check_flag(indices, "indices")
        k, full = size(n, d), self.floats_per_worker(n, d)
        index = ceil_log2(d) if indices and self.capabilities.needs_indices and full < d else 0
        return k * (self.value_bits(float_bits) + index) + self.overhead_bits(float_bits)

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
        """:meth:`plan`, its answer checked where it is used (:func:`~permk.compressors.messages.check_plan`)."""
        self.check(n, d)
        return check_plan(self.plan(n, d, seed=check_seed(seed), round=check_int(round, "round")), n, d, self.name)

    def checked_compress(self, x: np.ndarray, *, worker: int, n_workers: int, seed: int, round: int) -> Message:
        """:meth:`compress`, its answer checked where it is used (:func:`~permk.compressors.messages.check_message`)."""
        m = self.compress(x, worker=worker, n_workers=n_workers, seed=seed, round=round)
        return check_message(m, worker, n_workers, int(np.shape(x)[-1]), self.name)

    def round(self, n: int, d: int, *, seed: int, round: int) -> Round:
        """The round's shared plan as a :class:`~permk.compressors.messages.Round`, computed
        once for all the round's exchanges (the backends use it; ``capabilities.shared_plan``
        required): the native round of a Rust compressor, else a ``PlanRound`` over :meth:`plan`."""
        self._check_shared_plan(n, d)
        return self.bulk_kernel.round(n, d, check_seed(seed), check_int(round, "round"))

    def round_ahead(self, n: int, d: int, *, seed: int, round: int) -> PendingRound:
        """:meth:`round`, started now and taken with ``wait()``: a Rust compressor computes it on
        a background thread (the MPI backend asks for round ``t + 1`` while round ``t``
        communicates); a Python one computes it at once."""
        self._check_shared_plan(n, d)
        return self.bulk_kernel.round_ahead(n, d, check_seed(seed), check_int(round, "round"))

    def _check_shared_plan(self, n: int, d: int) -> None:
        self.check(n, d)
        if not self.capabilities.shared_plan:
            raise ValueError(f"{self.name} has no shared plan (capabilities.shared_plan is False)")

    def compress_all(self, A: Any, *, seed: int, round: int) -> np.ndarray:
        """The ``(n, d)`` array of compressed rows ``C_i(A[i])``."""
        return self.bulk_kernel.compress_all(as_float_array(A, 2, "A"), check_seed(seed), check_int(round, "round"))

    def compress_rows(self, A: Any, *, start: int, n_workers: int, seed: int, round: int) -> Messages:
        """The messages of workers ``start … start + m − 1`` whose inputs are the rows of ``A``
        (shape ``(m, d)``), as :class:`~permk.compressors.messages.Messages` (what an MPI rank
        holding those workers sends)."""
        A, n = as_float_array(A, 2, "A"), check_int(n_workers, "n_workers", low=1)
        start = check_int(start, "start", high=n)
        return Messages(*self.bulk_kernel.compress_rows(A, start, n, check_seed(seed), check_int(round, "round")))

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
        out = self.bulk_kernel.compress_shifted_rows(G, H, float(beta), start, n, check_seed(seed), check_int(round, "round"), rows)
        return None if out is None else Messages(*out)

    def aggregate(self, A: Any, *, seed: int, round: int) -> np.ndarray:
        """``(1/n) Σ_i C_i(A[i])``, summed in worker order and divided by ``n`` (bit for bit the
        messages' :func:`~permk.compressors.messages.aggregate_messages`)."""
        return self.bulk_kernel.aggregate(as_float_array(A, 2, "A"), check_seed(seed), check_int(round, "round"))

    def check(self, n: int, d: int) -> None:
        """Raise ValueError unless the compressor is defined for ``n`` workers in dimension ``d``."""
        check_int(n, "n_workers", low=1)
        check_int(d, "d", low=1)

    # -- identity, standard instance ----------------------------------------------------------
    def fingerprint(self) -> str:
        """A digest of the compressor's type and parameters, equal in every process for equal
        compressors (the MPI launch check compares it): the type's qualified name and the
        dataclass fields (or, for other classes, the public instance attributes but its
        caches), arrays by value, functions by what they compute
        (:mod:`~permk.compressors.fingerprint`)."""
        return digest(self)

    @classmethod
    def default(cls, n: int, d: int) -> Compressor:
        """The compressor's standard instance for ``n`` workers in dimension ``d`` (the
        experiments' choice: ``K = ⌈d/n⌉`` for a tunable size). Subclasses with required
        arguments override it."""
        if cls.tunable is not None:
            return cls(**{cls.tunable: max(1, -(-d // n))})  # type: ignore[call-arg]
        return cls()


@functools.cache
def _cached_names(cls: type) -> frozenset[str]:
    """The names of ``cls``'s :func:`functools.cached_property` members (its caches)."""
    return frozenset(k for c in cls.__mro__ for k, v in vars(c).items() if isinstance(v, functools.cached_property))


@encode.register
def _encode_compressor(v: Compressor, h: Any, depth: int) -> None:
    """A compressor by its type and parameters: its dataclass fields, or its public attributes
    without its caches (see :func:`~permk.compressors.fingerprint.encode`)."""
    h.update(f"<{type(v).__module__}.{type(v).__qualname__}>".encode())
    if dataclasses.is_dataclass(v):
        items = [(f.name, getattr(v, f.name)) for f in dataclasses.fields(v)]
    else:
        caches = _cached_names(type(v))
        items = sorted((k, x) for k, x in vars(v).items() if not k.startswith("_") and k not in caches)
    for k, x in items:
        h.update(k.encode() + b"=")
        encode(x, h, depth)
