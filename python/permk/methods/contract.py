"""The algorithm contract: what a method gives the driver, and what the driver gives it back.

* :class:`State` — a method's explicit state, a frozen dataclass that declares its arrays;
* :class:`RoundInfo` — what one round reports (bits sent, the coin, oracle calls);
* :class:`MethodParams` — what a method's ``parameters`` returns: the :class:`Bits` one worker
  sends per round, the fields every method fills, and the method's own parameters (a subclass);
* :class:`RunParams` — a run's parameters: the method's, plus the step, the seed, the path;
* :class:`Algorithm` — the contract itself: ``name``, ``state_type``, ``exchange``,
  ``parameters``, ``init``, ``update`` (:class:`permk.methods.Method` is its base class).

The driver (:mod:`permk.methods.driver`) reads nothing else of a method. Its theory (the
theorem's step, the floats per round) is a separate :class:`permk.theory.MethodTheory`, its
settings in the paper's experiments are the experiments' (:mod:`permk.experiments.protocols`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Mapping, NamedTuple, Protocol, TypeVar, runtime_checkable

import numpy as np

from ..compressors import Compressor

if TYPE_CHECKING:
    from ..exchanges import Exchange
    from ..transport import Backend

__all__ = [
    "ARRAY_KINDS",
    "State",
    "CountedState",
    "RoundInfo",
    "Bits",
    "MethodParams",
    "RunParams",
    "P",
    "Algorithm",
    "message_bits",
]

Array = np.ndarray


# ---------------------------------------------------------------------------------------------
# states
# ---------------------------------------------------------------------------------------------
#: The kinds of a state's arrays (:attr:`State.arrays`).
ARRAY_KINDS = ("shared", "per_worker")


class State:
    """A method's explicit state after ``round`` rounds: the iterate ``x``, the shared ``seed`` and
    the bits one worker has sent so far (``bits``), plus the method's own fields (each state is a
    frozen dataclass). The package's states also carry the gradient-oracle calls of one worker so
    far (``oracle_calls``, set by the driver: see :class:`RoundInfo`), so a resumed run continues
    that count; a state without the field counts from zero when it is resumed. States compare field by field (arrays by value) and can be saved with
    :func:`save_state`.

    A state lists its arrays in ``arrays``, each ``"shared"`` (a vector of length ``d``, the same
    on every process: the iterate, an aggregate) or ``"per_worker"`` (one row of length ``d`` per
    worker: all ``n`` in the simulator, the rows of the workers a process holds on MPI). The
    shared code reads that list, and nothing else of a method's state: the driver stops a run
    whose shared arrays are not finite (a per-worker array feeds a shared aggregate, and only
    shared arrays are the same on every process, so every MPI rank stops at the same round), a
    resumed state is checked and cut to the held rows (:meth:`held_by`), MPI ranks compare digests
    of the shared arrays, and :func:`load_state` checks the shapes. :func:`load_state` also
    checks each scalar field by its declared type: an ``int`` field one integer, at least its
    ``metadata["low"]`` (default 0), a ``float`` field one finite number, at least its
    ``metadata["low"]`` where the field states one."""

    x: Array
    round: int
    seed: int
    bits: float

    #: The state's arrays by field name: ``"shared"`` or ``"per_worker"``.
    arrays: ClassVar[dict[str, str]] = {"x": "shared"}

    _kinds: ClassVar[dict[str, type[State]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = {name for klass in cls.__mro__ for name in getattr(klass, "__annotations__", {})}
        for name, kind in cls.arrays.items():
            if kind not in ARRAY_KINDS:
                raise TypeError(f"{cls.__name__}.arrays[{name!r}] must be one of {ARRAY_KINDS}, got {kind!r}")
            if name not in declared:
                raise TypeError(f"{cls.__name__}.arrays names {name!r}, which is not a field of the state")
        if cls.arrays.get("x") != "shared":
            raise TypeError(f"{cls.__name__}.arrays must list the iterate: 'x': 'shared'")
        State._kinds[cls.__name__] = cls

    @classmethod
    def by_name(cls, name: str) -> type[State] | None:
        """The state class of that name (every State subclass defined so far), or None: what a
        checkpoint names its state by."""
        return State._kinds.get(name)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The state's fields (every State is a frozen dataclass)."""
        return tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]

    @classmethod
    def shared_arrays(cls) -> tuple[str, ...]:
        """The names of the state's shared arrays (``x`` first)."""
        return tuple(name for name, kind in cls.arrays.items() if kind == "shared")

    @classmethod
    def per_worker_arrays(cls) -> tuple[str, ...]:
        """The names of the state's per-worker arrays."""
        return tuple(name for name, kind in cls.arrays.items() if kind == "per_worker")

    def finite(self) -> bool:
        """Whether every shared array is finite (the driver's divergence check)."""
        return all(bool(np.isfinite(getattr(self, name)).all()) for name in self.shared_arrays())

    def held_by(self, backend: Backend) -> State:
        """This state to continue a run on ``backend``, checked: every shared array of shape
        ``(d,)``; every per-worker array with the rows of all ``backend.n`` workers (e.g. a
        simulator's state, then cut to the rows of ``backend.workers``) or those of the held
        workers alone. The arrays are copies, float64 (per-worker rows kept in float32 stay
        float32: a method's ``shift_dtype``), so the run never writes into the caller's."""
        n, d, ws = backend.n, backend.d, backend.workers
        held = len(ws)
        new: dict[str, Array] = {}
        for name, kind in self.arrays.items():
            a = np.asarray(getattr(self, name))
            if kind == "shared":
                if a.shape != (d,):
                    raise ValueError(f"state.{name} must have shape ({d},), got {a.shape}")
            elif a.shape == (n, d) and held != n:
                a = a[ws.start : ws.stop]
            elif a.shape != (held, d):
                raise ValueError(f"state.{name} must hold all {n} rows or this process's {held} (of length {d}), got shape {a.shape}")
            # per-worker rows kept in float32 stay float32 (a method's shift_dtype)
            keep32 = kind == "per_worker" and a.dtype == np.float32
            new[name] = np.array(a, dtype=np.float32 if keep32 else np.float64)
        return replace(self, **new)  # type: ignore[type-var]

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        for name in self.field_names():
            a, b = getattr(self, name), getattr(other, name)
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)):
                    return False
            elif a != b:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class CountedState(State):
    """The package's states' common part: the counters ``round``, ``seed``, ``bits`` and
    ``oracle_calls``, keyword-only (after each state's own fields in its constructor). A state of
    one's own may derive from it or declare the fields itself (see :class:`State`)."""

    round: int = field(default=0, kw_only=True)
    seed: int = field(default=0, kw_only=True)
    bits: float = field(default=0.0, kw_only=True, metadata={"low": 0.0})
    oracle_calls: float = field(default=0.0, kw_only=True, metadata={"low": 0.0})



# ---------------------------------------------------------------------------------------------
# what a round reports
# ---------------------------------------------------------------------------------------------
class RoundInfo(NamedTuple):
    """What an update reports of its round: the bits one worker sent (its largest message),
    MARINA's coin (True: full gradients; None for methods without one), and the round's
    gradient-oracle calls (``oracle_calls``), the algorithm's count for its busiest worker:

    * a full local gradient counts ``params.oracle_full`` calls (``max_i m_i`` on a finite-sum
      problem, ``sample_counts``; else 1), whether a path evaluates it whole or only at the
      coordinates a worker sends; a minibatch gradient counts its ``b`` samples;
    * a gradient the algorithm kept from an earlier round is not counted again: a full-gradient
      method keeps ``∇f_i(x^t)`` for its next round's difference (MARINA, DASHA, a RandDIANA
      refresh at ``x^t``, as the authors' code does), stores its shifts (DIANA, RandDIANA, shifted
      DCGD); a transport that did not keep it (a resumed run, a coordinate path) recomputes it
      uncounted;
    * under partial participation a participant computes ``∇f_i`` at both points, as the
      authors' nodes do (it kept nothing from the rounds it sat out: 2 full gradients; a
      transport that still holds ``∇f_i(x^t)`` from the round before reuses it), a
      non-participant nothing.

    ``None`` (the default) is one full local gradient. The counting problem wrapper of the
    tests (tests/counting.py) checks every method's rounds against these counts, on every path
    and on MPI: each worker evaluates only the points its update reads (the sent coordinates
    alone on the coordinate paths)."""

    bits: float
    coin: bool | None = None
    oracle_calls: float | None = None


# ---------------------------------------------------------------------------------------------
# parameters
# ---------------------------------------------------------------------------------------------
class Bits(NamedTuple):
    """The bits one worker sends in a round: its largest compressed message (``compressed``), a
    full-gradient message (``full``: ``d`` floats) and the expected bits of a round over the
    method's coins (``expected``; the record's ``expected_bits_per_worker`` grows by it)."""

    compressed: float
    expected: float
    full: float


@dataclass(frozen=True)
class MethodParams:
    """What a method's ``parameters`` returns: the fields every method fills — ``bits``, what one
    worker sends per round — and, in a subclass, the method's own parameters (MARINA's ``p``, ``A``,
    ``B``; DIANA's ``alpha``; …), each a field, so a method's parameters are known from its type.

    >>> import permk
    >>> permk.marina.parameters(permk.PermK(), 4, 8).p
    0.25
    """

    bits: Bits

    def record(self) -> dict[str, Any]:
        """The parameters as plain values (``bits`` as a dict), for a run's record."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["bits"] = self.bits._asdict()
        return out


#: A method's own parameters (a :class:`MethodParams` subclass).
P = TypeVar("P", bound=MethodParams)


@dataclass(frozen=True)
class RunParams(Generic[P]):
    """A run's parameters: the method's own (``own``, what its ``parameters`` returned), the step
    ``gamma`` and where it came from (``gamma_source``: ``"user"`` or the theorem), the shared
    ``seed``, the problem's size, the bits per float, the oracle calls of one full local
    gradient (``oracle_full``), the constants the step was computed from (``constants``: empty
    when the user gave ``gamma``), the path of the run's exchanges (``path``) and the
    transport's own settings (``transport``: MPI's ``mode``, ``reduce``, ``n_procs``).

    ``record()`` is the flat dict a :class:`~permk.methods.RunResult` and the experiments'
    records hold."""

    method: str
    compressor: str
    n: int
    d: int
    seed: int
    float_bits: int
    oracle_full: float
    gamma: float
    gamma_source: str
    gamma_multiplier: float
    pl: bool
    own: P
    constants: Mapping[str, Any] = field(default_factory=dict)
    path: str = "dense"
    transport: Mapping[str, Any] = field(default_factory=dict)

    @property
    def bits(self) -> Bits:
        """The bits one worker sends per round (the method's ``own.bits``)."""
        return self.own.bits

    def record(self) -> dict[str, Any]:
        """The parameters as one flat dict of plain values: the method's own, then the run's."""
        return {"method": self.method, "compressor": self.compressor, "n": self.n, "d": self.d,
                "oracle": {"full": self.oracle_full}, **self.own.record(), "gamma_multiplier": self.gamma_multiplier,
                "pl": self.pl, "float_bits": self.float_bits, "seed": self.seed, **dict(self.constants),
                "gamma_source": self.gamma_source, "gamma": self.gamma, "path": self.path, **dict(self.transport)}


def message_bits(compressor: Any, n: int, d: int, float_bits: int, *, indices: bool = True) -> Bits:
    """The :class:`Bits` of a method whose every round sends one compressed message per worker:
    its largest size, its expected size, and a full gradient's ``d · float_bits``. A
    ``compressor`` that is not a :class:`permk.Compressor` is a TypeError naming it (and
    ``float_bits``, ``indices`` are checked as :meth:`~permk.Compressor.bits_per_worker` does)."""
    if not isinstance(compressor, Compressor):
        raise TypeError(f"compressor must be a permk.Compressor, got {type(compressor).__name__}")
    compressed = float(compressor.bits_per_worker(n, d, float_bits=float_bits, indices=indices))
    expected = float(compressor.expected_bits_per_worker(n, d, float_bits=float_bits, indices=indices))
    return Bits(compressed=compressed, expected=expected, full=float(d * float_bits))


# ---------------------------------------------------------------------------------------------
# the contract
# ---------------------------------------------------------------------------------------------
@runtime_checkable
class Algorithm(Protocol):
    """What the driver reads of a method (:class:`permk.methods.Method` implements it):

    * ``name``, ``label`` (legends, tables), ``state_type`` (its :class:`State`);
    * ``exchange`` — the exchange its compressed rounds are made of; ``path(backend,
      compressor, own)`` — the path its rounds take (the run's ``params.path``: the exchange's,
      for the rows of its own parameters); ``has_coin`` — whether its rounds report a coin;
    * ``parameters(compressor, n, d, *, float_bits, problem, **options)`` — validate the options
      and the compressor and choose the method's own parameters (a :class:`MethodParams`);
    * ``sent_compressor(compressor, params)`` — the compressor the run's messages are made with;
    * ``resolve(options)`` — the method a run with these options is (DASHA's ``estimator``);
    * ``init(x0, backend, compressor, params, *, seed)`` and ``update(state, backend, compressor,
      params) -> (state, RoundInfo)`` — pure functions of their arguments.
    * ``theory`` — a :class:`permk.theory.MethodTheory`, or None (the run needs ``gamma=``).
    """

    @property
    def name(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def state_type(self) -> type[State]: ...
    @property
    def exchange(self) -> Exchange: ...
    @property
    def has_coin(self) -> bool: ...
    @property
    def theory(self) -> Any: ...

    # ``parameters(compressor, n, d, *, float_bits=32, problem=None, **own_options)``: each method
    # names its own options, so the protocol takes any arguments
    def parameters(self, *args: Any, **kwargs: Any) -> MethodParams: ...
    def sent_compressor(self, compressor: Any, params: Any) -> Any: ...
    def path(self, backend: Any, compressor: Any, own: Any) -> str: ...
    def resolve(self, options: dict[str, Any]) -> tuple[Algorithm, dict[str, Any]]: ...
    def init(self, x0: Array, backend: Backend, compressor: Any, params: RunParams[Any], *, seed: int) -> State: ...
    def update(self, state: Any, backend: Backend, compressor: Any, params: RunParams[Any]) -> tuple[State, RoundInfo]: ...
