"""Distributed methods, each defined once: MARINA, EF21, GD and DCGD with the paper's step sizes,
DIANA (its nonconvex step), RandDIANA and shifted DCGD (the authors' steps), DASHA and DASHA-PP
(their theorems' steps), and on finite-sum problems VR-MARINA, online stochastic MARINA,
DASHA-PAGE, DASHA-MVR and minibatch SGD.

A method is a :class:`Method`: its theory (``parameters`` — validated, with the theory's
defaults such as MARINA's ``p = ζ/d`` —, the theorem's ``step``, the floats a worker sends per
round) and a pure ``init``/``update`` pair over an explicit state (in the spirit of optax). An
update takes the state, the communication backend, the compressor and the parameters, and
returns the new state and a :class:`RoundInfo` (the bits one worker sent, MARINA's coin):
every method's update has that same shape. It never talks to workers itself: it asks the
backend for one of the exchanges of :mod:`permk.backends`, so the same definition runs in the
single-process simulator (:class:`permk.backends.Simulator`) and on MPI
(:mod:`permk.distributed`), through the one driver loop :func:`drive`.

``permk.marina``, ``permk.ef21``, ``permk.gd``, ``permk.dcgd`` (``permk.dcgd_shifted``),
``permk.diana``, ``permk.rand_diana``, ``permk.dasha``, ``permk.vr_marina``,
``permk.marina_stochastic``, ``permk.dasha_page``, ``permk.dasha_mvr`` and ``permk.sgd`` are the
method objects themselves; calling one runs
it in the simulator::

    permk.marina(problem, permk.PermK(), rounds=1000, seed=1)

and ``permk.distributed.run(permk.marina, ...)`` runs it on MPI. ``docs/extending.md`` shows how
DCGD is defined in one place; a new method is one such class.

>>> import permk
>>> q = permk.Quadratic.synthetic(n=10, d=100, lam=1e-3, noise_scale=0.0, seed=0)
>>> res = permk.marina(q, permk.PermK(), rounds=200, seed=1)
>>> bool(res.grad_norm_sq[-1] < 1e-2 * res.grad_norm_sq[0])
True
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
import math
import os
import time
import zipfile
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Mapping, NamedTuple, cast

import numpy as np

from . import _core
from ._files import atomic_write
from ._validate import check_choice, check_int, check_probability, check_real, check_seed, start_point
from . import exchanges as ex
from .backends import Backend, Simulator, check_problem
from .compressors import Compressor, Identity, PermK, RandK, TopK
from .compressors.participation import Participation, check_participation, participation_mask
from .registry import Catalog
from .theory.complexity import EF21_TOPK, MARINA_PERMK, MARINA_RANDK, TableRow
from .theory.group import variance_bound
from .theory.steps import (
    Constants,
    dasha_momentum,
    dasha_mvr_stepsize,
    dasha_page_stepsize,
    dasha_pp_stepsize,
    dasha_stepsize,
    diana_stepsize,
    ef21_stepsize,
    marina_variance_stepsize,
    rand_diana_stepsize,
    shift_step_class,
    shifted_dcgd_stepsize,
    worker_constants,
)

__all__ = [
    "State",
    "CountedState",
    "MarinaState",
    "EF21State",
    "DCGDState",
    "ShiftedDCGDState",
    "DianaState",
    "RandDianaState",
    "DashaState",
    "DashaPPState",
    "DashaVRState",
    "RoundInfo",
    "RunResult",
    "Method",
    "marina",
    "ef21",
    "gd",
    "dcgd",
    "dcgd_shifted",
    "diana",
    "rand_diana",
    "dasha",
    "dasha_page",
    "dasha_mvr",
    "vr_marina",
    "marina_stochastic",
    "sgd",
    "run",
    "save_state",
    "load_state",
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
    of the shared arrays, and :func:`load_state` checks the shapes."""

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
        workers alone. The arrays are float64 copies, so the run never writes into the caller's."""
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
            new[name] = np.array(a, dtype=np.float64)
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
    bits: float = field(default=0.0, kw_only=True)
    oracle_calls: float = field(default=0.0, kw_only=True)


@dataclass(frozen=True, eq=False)
class MarinaState(CountedState):
    """MARINA's state: ``x = x^t``, the estimator ``g = g^t``."""

    x: Array
    g: Array

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "g": "shared"}


@dataclass(frozen=True, eq=False)
class EF21State(CountedState):
    """EF21's state: ``x = x^t``, ``g = g^t = (1/n) Σ g_i^t`` and the local estimators
    ``G = [g_i^t]`` of the workers this process holds (all ``n`` in simulation)."""

    x: Array
    g: Array
    G: Array

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "g": "shared", "G": "per_worker"}


@dataclass(frozen=True, eq=False)
class DCGDState(CountedState):
    """DCGD's state (and SGD's): the iterate ``x = x^t`` alone."""

    x: Array


@dataclass(frozen=True, eq=False)
class ShiftedDCGDState(DCGDState):
    """The state of DCGD with shifts (``shifts="initial"``): the iterate ``x = x^t``, the point
    ``y`` of the shifts ``h_i = ∇f_i(y)`` (``y = x^0``) and their mean ``h = ∇f(y)``."""

    y: Array = field(kw_only=True)
    h: Array = field(kw_only=True)

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "y": "shared", "h": "shared"}


@dataclass(frozen=True, eq=False)
class DianaState(CountedState):
    """DIANA's state: ``x = x^t``, ``g = g^t``, the shifts ``H = [h_i^{t+1}]`` of the workers this
    process holds (all ``n`` in simulation) and the server's mirror of their mean ``h``."""

    x: Array
    g: Array
    H: Array
    h: Array

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "g": "shared", "H": "per_worker", "h": "shared"}


@dataclass(frozen=True, eq=False)
class RandDianaState(CountedState):
    """RandDIANA's state: ``x = x^t``, ``g = g^t``, the point ``y`` of the shifts
    ``h_i = ∇f_i(y)`` (the last refresh) and their mean ``h = ∇f(y)``."""

    x: Array
    g: Array
    y: Array
    h: Array

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "g": "shared", "y": "shared", "h": "shared"}


@dataclass(frozen=True, eq=False)
class DashaState(CountedState):
    """DASHA's state: ``x = x^t``, ``g = g^t = (1/n) Σ g_i^t`` and the estimators
    ``G = [g_i^t]`` of the workers this process holds (all ``n`` in simulation); ``h_i^t`` is
    ``∇f_i(x^t)`` itself, nothing to keep (see :class:`Dasha`)."""

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "g": "shared", "G": "per_worker"}

    x: Array
    g: Array
    G: Array


@dataclass(frozen=True, eq=False)
class DashaPPState(DashaState):
    """DASHA-PP's state: DASHA's, with ``H = [h_i^t]`` of the held workers and the rows
    ``G = [g_i^t + w h_i^t]`` the round's shifted exchange starts from, ``w = h_weight =
    (b − a)/a`` (see :class:`Dasha`)."""

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "g": "shared", "G": "per_worker", "H": "per_worker"}

    H: Array = field(kw_only=True)
    h_weight: float = field(kw_only=True)


@dataclass(frozen=True, eq=False)
class DashaVRState(DashaState):
    """DASHA-PAGE's and DASHA-MVR's state: DASHA's, with the workers' gradient estimators
    ``H = [h_i^t]`` (the rows this process holds)."""

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "g": "shared", "G": "per_worker", "H": "per_worker"}

    H: Array = field(kw_only=True)


def save_state(state: State, path: Any) -> None:
    """Write a state to an ``.npz`` file (see :func:`load_state`); ``.npz`` is appended to a
    path without it, as :func:`numpy.savez` does.

    The write is atomic: the file is written beside ``path`` under a temporary name, fsynced
    and then renamed over it, so a process killed while it overwrites a checkpoint leaves the
    old checkpoint whole, never a cut-short one. (An open file object is written in place.)"""
    if not isinstance(state, State):
        raise TypeError(f"state must be a permk state (e.g. result.state), got {type(state).__name__}")
    arrays = {"__kind__": type(state).__name__, **{name: getattr(state, name) for name in state.field_names()}}
    if hasattr(path, "write"):
        np.savez(path, **arrays)
        return
    target = os.fspath(path)
    if not target.endswith(".npz"):
        target += ".npz"
    atomic_write(target, lambda fh: np.savez(fh, **arrays))


def load_state(path: Any) -> State:
    """Read a state written by :func:`save_state`, checking its arrays' shapes: every shared
    array of the iterate's length ``d``, every per-worker array a matrix of ``d`` columns (one
    row per worker; :meth:`State.held_by` checks their count when a run resumes it)."""
    try:
        z = np.load(path, allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise ValueError(f"{path} is not a permk state file (an .npz written by permk.save_state): {e}") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} is not a permk state file (an .npz written by permk.save_state)")
    with z:
        kind = str(z["__kind__"]) if "__kind__" in z.files else None
        cls = State._kinds.get(kind) if kind else None
        if cls is None:
            raise ValueError(f"{path} does not hold a permk state")
        vals: dict[str, Any] = {}
        for name in cls.field_names():
            if name not in z.files and name == "oracle_calls":
                vals[name] = 0.0  # a file written before states counted oracle calls
                continue
            if name not in z.files:
                raise ValueError(f"{path}: the {kind} has no field {name!r}")
            v = z[name]
            vals[name] = v.copy() if v.ndim or name in cls.arrays else v.item()
    d = vals["x"].shape[0] if vals["x"].ndim == 1 else None
    for name, array_kind in cls.arrays.items():
        shape = vals[name].shape
        if d is None or (shape != (d,) if array_kind == "shared" else (len(shape) != 2 or shape[1] != d)):
            want = "(d,)" if array_kind == "shared" else "(workers, d)"
            raise ValueError(f"{path}: the {kind}'s {array_kind} array {name!r} must have shape {want} with d the length of x, "
                             f"got {shape} (x: {vals['x'].shape})")
    return cls(**vals)


# ---------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------
class RoundInfo(NamedTuple):
    """What an update reports of its round: the bits one worker sent (its largest message),
    MARINA's coin (True: full gradients; None for methods without one), and the gradient-oracle
    calls of one worker (``oracle_calls``: sample gradients computed — ``b`` per minibatch
    gradient; the largest worker's count when the workers differ). ``None`` (the default, for
    full-gradient methods) is one full local gradient: ``params["oracle"]["full"]`` calls, i.e.
    ``max_i m_i`` on a finite-sum problem (``sample_counts``), else 1. A full-gradient method is
    counted one full gradient per round, at the new point: the gradients at earlier points
    (MARINA's ``∇f_i(x^t)``, the shifts' points) can be kept from the round that computed them."""

    bits: float
    coin: bool | None = None
    oracle_calls: float | None = None


@dataclass(frozen=True, eq=False)
class RunResult:
    """What a run returns. Per-round arrays are recorded at the rounds in ``rounds`` (every
    ``record_every`` rounds, plus the first and the last).

    Attributes
    ----------
    grad_norm_sq : ``‖∇f(x^t)‖²``.
    f_gap : ``f(x^t) − f*`` where the problem knows ``f_star``, else None.
    bits_per_worker : bits one worker has sent after round t (cumulative, actual: the largest
        message of the round; the initial exchange of ``∇f_i(x^0)`` is not counted, as in the paper).
    expected_bits_per_worker : the same in expectation over the coins.
    oracle_calls : gradient-oracle calls (sample gradients) one worker has made after round t
        (cumulative, as :class:`RoundInfo` counts them; the start's gradients are not counted).
    coins : MARINA's coin of every round run (True = full gradients); None for methods without one.
    x, x_hat : the last iterate and ``x̂^T``, drawn uniformly from ``x^0 … x^{T−1}`` (the point the
        theorems bound).
    params : the parameters used (step, p, A, B, constants and where they came from, the path).
    diverged_at : the round at which the iterate became non-finite (the run stopped there), else None.
    state : the final state, to resume with ``state=``.
    """

    method: str
    compressor: str
    rounds: Array
    grad_norm_sq: Array
    f_gap: Array | None
    bits_per_worker: Array
    expected_bits_per_worker: Array
    oracle_calls: Array
    coins: Array | None
    x: Array
    x_hat: Array
    params: dict[str, Any]
    wall_time: float
    diverged_at: int | None
    state: State = field(repr=False)


# ---------------------------------------------------------------------------------------------
# the method definition
# ---------------------------------------------------------------------------------------------
def _check_registrable(obj: Any) -> None:
    if not isinstance(obj, Method):
        raise TypeError(f"register: a method is registered as its object, an instance of a permk.Method subclass, got {obj!r}")


def _package_methods() -> dict[str, Method]:
    """The method objects this module defines, by name."""
    return {m.name: m for m in globals().values() if isinstance(m, Method)}


#: The catalog of method objects (:func:`catalog`, :func:`permk.register`).
METHODS = Catalog("method", key=lambda m: m.name, check=_check_registrable, builtins=_package_methods)


class Method(abc.ABC):
    """One distributed method, defined once (see the module docstring).

    A subclass sets ``name``, ``state_type`` (its :class:`State`), ``exchange`` (the exchange
    object of :mod:`permk.exchanges` its compressed rounds are made of, e.g.
    ``exchanges.compressed_mean_diff``; its path is the run's ``params["path"]``),
    ``has_coin``, ``label`` (its name in legends and tables: ``"MARINA"``), and the attributes
    below where it differs from their defaults; and implements:

    * ``parameters(compressor, n, d, *, float_bits, **options)`` — validate that the compressor
      suits the method and choose the method's own parameters (theory defaults), including
      ``params["bits"]``: ``{"compressed": …, "expected": …}`` (and ``"full"``) bits per round;
    * ``step(compressor, n, d, params, constants, problem=None)`` — the theorem's step size
      ``(gamma, "the theorem's name")`` from :class:`permk.theory.steps.Constants`;
    * ``floats_per_round(compressor, n, d, params)`` — expected floats a worker sends per round
      (:func:`permk.theory.complexity` minimises rounds × this);
    * ``init(x0, backend, compressor, params, *, seed)`` and ``update(state, backend,
      compressor, params) -> (state, RoundInfo)``.

    Calling the method object runs it in the simulator (:func:`run`).

    What the experiments, the theory and the generic tests read of a method, rather than its name:

    * ``takes_compressor`` — False for a method whose rounds send full gradients (GD): it runs
      with the identity and is called without a compressor (``permk.gd(problem, …)``,
      ``permk.distributed.gd``), and the experiments pair it with no compressor;
    * ``starts`` — the values of the method's ``init`` option (EF21's ``"full"`` and
      ``"compressed"`` start), which the experiments' ``ef21_init`` sets;
    * ``collapses_identical_workers`` — with a deterministic compressor
      (``capabilities.deterministic``) workers that are the same function stay identical and the
      iterates depend on their mean alone (no per-worker randomness), so the experiments may run
      a group of identical workers as one weighted worker;
    * ``authors_rounds_factor`` — how many times the base number of rounds the authors' configs
      run the method (EF21: twice; ``horizon="rounds"``);
    * ``table_rows`` — the rows of the paper's communication-complexity Tables for this method,
      by compressor class (:func:`permk.theory.table_complexity`);
    * ``parameters_read_problem`` — ``parameters`` also takes ``problem=`` (VR-MARINA's ``p``
      reads the sample counts);
    * ``needs_finite_sum`` — the method runs only on a finite-sum problem with minibatch oracles
      (:class:`permk.classification.FiniteSumProblem`), and ``example_options`` — the options the
      generic tests run it with (``batch_size``).
    """

    name: ClassVar[str]
    label: ClassVar[str]
    state_type: ClassVar[type[State]]
    exchange: ClassVar[ex.Exchange]
    has_coin: ClassVar[bool] = False
    takes_compressor: ClassVar[bool] = True
    starts: ClassVar[tuple[str, ...]] = ()
    collapses_identical_workers: ClassVar[bool] = False
    authors_rounds_factor: ClassVar[int] = 1
    table_rows: ClassVar[Mapping[type[Compressor], TableRow]] = {}
    parameters_read_problem: ClassVar[bool] = False
    needs_finite_sum: ClassVar[bool] = False
    example_options: ClassVar[Mapping[str, Any]] = {}
    #: The catalog a method object joins with :func:`permk.register`.
    catalog_kind: ClassVar[Catalog] = METHODS

    @abc.abstractmethod
    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, **options: Any) -> dict[str, Any]:
        """The method's own validated parameters (see the class docstring)."""

    @abc.abstractmethod
    def step(self, compressor: Compressor, n: int, d: int, params: dict[str, Any], constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        """``(γ, theorem)``: the theory's step size from the smoothness constants."""

    @abc.abstractmethod
    def floats_per_round(self, compressor: Compressor, n: int, d: int, params: dict[str, Any]) -> float:
        """The expected number of floats one worker sends in a round."""

    def tunable_range(self, compressor: Compressor, n: int, d: int) -> dict[str, tuple[float, float]]:
        """The method's own continuous parameters that :func:`permk.theory.complexity`
        optimises, with their ranges (MARINA: ``p``)."""
        return {}

    @abc.abstractmethod
    def init(self, x0: Array, backend: Backend, compressor: Compressor, params: dict[str, Any], *, seed: int) -> State:
        """The state before the first round (its exchanges are not counted as communication)."""

    @abc.abstractmethod
    def update(self, state: Any, backend: Backend, compressor: Compressor, params: dict[str, Any]) -> tuple[State, RoundInfo]:
        """One round: the new state and what was sent."""

    def sent_compressor(self, compressor: Compressor, params: dict[str, Any]) -> Compressor:
        """The compressor whose messages the run's exchanges carry, built once per run: the
        run's own, or with ``params["participation"] = s`` (the option of MARINA and DASHA) the
        :class:`permk.Participation` of ``s`` workers per round around it."""
        s = params.get("participation")
        return compressor if s is None else Participation(compressor, s)

    def state_shape(self, n: int, d: int) -> tuple[int, ...]:
        """The shape of the largest array of the state for ``n`` workers (held by one process) in
        dimension ``d`` (from :attr:`State.arrays`): what a grid checks against the memory
        before it starts."""
        return (n, d) if self.state_type.per_worker_arrays() else (d,)

    def resolve(self, options: dict[str, Any]) -> tuple[Method, dict[str, Any]]:
        """The method a run with these options is, and the options it passes on: the method
        itself, or the variant an option selects (DASHA's ``estimator``). :func:`run` and
        :func:`permk.distributed.run` call it first."""
        return self, options

    def __call__(self, problem: Any, compressor: Compressor, *, rounds: int, seed: int, **options: Any) -> RunResult:
        """Run the method in the single-process simulator: see :func:`run`."""
        return run(self, problem, compressor, rounds=rounds, seed=seed, **options)

    def __repr__(self) -> str:
        return f"permk.{self.name}"


def message_bits(compressor: Compressor, n: int, d: int, float_bits: int, *, indices: bool = True) -> dict[str, float]:
    """``params["bits"]`` of a method whose every round sends one compressed message per worker:
    its largest size and its expected size, in bits."""
    return {"compressed": float(compressor.bits_per_worker(n, d, float_bits=float_bits, indices=indices)),
            "expected": float(compressor.expected_bits_per_worker(n, d, float_bits=float_bits, indices=indices))}


class Marina(Method):
    """Algorithm "MARINA".

    ``x^{t+1} = x^t − γ g^t``; the shared coin ``θ_t ~ Be(p)`` is a pure function of
    ``(seed, t)``; on heads ``g^{t+1} = (1/n) Σ ∇f_i(x^{t+1})``, on tails
    ``g^{t+1} = g^t + (1/n) Σ C_i(∇f_i(x^{t+1}) − ∇f_i(x^t))``. Needs an unbiased compressor with
    AB constants. Defaults from theory: ``p = ζ/d`` (``ζ`` the expected message size: its bits
    over a full gradient's; MARINA's ``ζ_Q``) and
    ``γ = 1/M``, ``M = L− + sqrt((1−p)/p · L̂²)`` with ``L̂² = (A−B)L+² + B·L±²`` (Theorem "AB";
    with ``pl=True`` Theorem "AB-PL"'s ``min{1/M_PL, p/(2μ)}``), or the compressor's own
    variance bound (``GroupPermK``: Theorem "AB_group"). Options: ``p``; ``participation=s``:
    MARINA with partial participation (PP-MARINA of Gorbunov et al. 2021, the authors'
    ``marina_partial_participation``): the compressed rounds are those of ``s`` of the ``n``
    workers sampled uniformly from ``(seed, t)``, each message counting ``n/s`` times (the
    :class:`permk.Participation` family; the full-gradient rounds are every worker's); its
    ``A``, ``B`` give the step (Theorem "AB", which holds for any unbiased family with AB
    constants; its step is never below PP-MARINA's ``1/(L(1 + sqrt((1−p)(1+ω)/(ps))))``) and
    its expected size ``p``.
    """

    name = "marina"
    label = "MARINA"
    state_type = MarinaState
    exchange: ClassVar[ex.Exchange] = ex.compressed_mean_diff
    has_coin = True
    table_rows = {PermK: MARINA_PERMK, RandK: MARINA_RANDK}

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, p: Any = None,  # type: ignore[override]
                   participation: Any = None) -> dict[str, Any]:
        own = {} if participation is None else {"participation": check_participation(participation, n)}
        return self._parameters(compressor, n, d, float_bits, p, own)

    def _parameters(self, compressor: Compressor, n: int, d: int, float_bits: int, p: Any, own: dict[str, Any],
                    p_cap: float = 1.0) -> dict[str, Any]:
        """MARINA's parameters (``own``: the participation option) with ``p`` given, or ``min(p_cap, ζ/d)``."""
        compressor = self.sent_compressor(compressor, own)
        ab = compressor.ab_constants(n, d)
        if ab is None or not compressor.capabilities.unbiased:
            raise ValueError(f"{self.label} needs an unbiased compressor with AB constants; {compressor.name} has none (use ef21 for TopK)")
        A, B = float(ab[0]), float(ab[1])
        tail = float(compressor.bits_per_worker(n, d, float_bits=float_bits))
        mean = float(compressor.expected_bits_per_worker(n, d, float_bits=float_bits))
        full = float(d * float_bits)
        p = min(p_cap, mean / full) if p is None else check_probability(p)
        expected = p * full + (1 - p) * mean
        return {"p": p, "A": A, "B": B, **own, "bits": {"full": full, "compressed": tail, "expected": expected}}

    def step(self, compressor: Compressor, n: int, d: int, params: dict[str, Any], constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        bound = variance_bound(self.sent_compressor(compressor, params), n, d, constants, problem=problem)
        gamma = marina_variance_stepsize(constants.L_minus, bound.L_hat_sq, params["p"], mu=constants.mu)
        return gamma, bound.theorem if constants.mu is None else bound.pl_theorem

    def floats_per_round(self, compressor: Compressor, n: int, d: int, params: dict[str, Any]) -> float:
        p = params["p"]
        return float(p * d + (1 - p) * self.sent_compressor(compressor, params).expected_floats_per_worker(n, d))

    def tunable_range(self, compressor: Compressor, n: int, d: int) -> dict[str, tuple[float, float]]:
        return {"p": (1e-3 * min(compressor.expected_floats_per_worker(n, d) / d, 1.0), 1.0)}

    def init(self, x0: Array, backend: Backend, compressor: Compressor, params: dict[str, Any], *, seed: int) -> MarinaState:
        return MarinaState(x=x0, g=np.array(ex.mean_grad(backend, x0), dtype=np.float64), round=0, seed=seed)

    def update(self, state: MarinaState, backend: Backend, compressor: Compressor, params: dict[str, Any]) -> tuple[MarinaState, RoundInfo]:
        x = state.x - params["gamma"] * state.g
        heads = bool(_core.coin(state.seed, state.round, params["p"]))
        if heads:
            g, bits = ex.mean_grad(backend, x), params["bits"]["full"]
        else:
            g = state.g + ex.compressed_mean_diff(backend, compressor, x, state.x, seed=state.seed, round=state.round)
            bits = params["bits"]["compressed"]
        return MarinaState(x=x, g=g, round=state.round + 1, seed=state.seed, bits=state.bits + bits), RoundInfo(bits, heads)


class GD(Marina):
    """Gradient descent, the uncompressed baseline: MARINA with ``p = 1`` and no compression
    (every round is a full-gradient round), whose Theorem "AB" step is ``1/L−``. Called without
    a compressor: ``permk.gd(problem, rounds=…, seed=…)``."""

    name = "gd"
    label = "GD"
    exchange = ex.mean_grad
    takes_compressor = False
    table_rows = {}

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32) -> dict[str, Any]:  # type: ignore[override]
        if not compressor.capabilities.lossless:
            raise ValueError(f"gd sends full gradients: its compressor must be None or Identity, got {compressor.name} "
                             "(use marina, dcgd or ef21 to compress)")
        return super().parameters(compressor, n, d, float_bits=float_bits, p=1.0)

    def tunable_range(self, compressor: Compressor, n: int, d: int) -> dict[str, tuple[float, float]]:
        return {}

    def __call__(self, problem: Any, compressor: Compressor | None = None, *, rounds: int, seed: int, **options: Any) -> RunResult:  # type: ignore[override]
        """Run gradient descent in the simulator (``compressor`` must be None or Identity)."""
        return run(self, problem, compressor if compressor is not None else Identity(), rounds=rounds, seed=seed, **options)


class VRMarina(Marina):
    """VR-MARINA, the finite-sum case (Gorbunov et al. 2021, "MARINA: faster non-convex
    distributed learning with compression"), on a finite-sum problem
    (:class:`permk.classification.FiniteSumProblem`).

    ``x^{t+1} = x^t − γ g^t``; on heads of the shared coin ``θ_t ~ Be(p)`` (a pure function of
    ``(seed, t)``) ``g^{t+1} = ∇f(x^{t+1})`` (full gradients, ``m_i`` oracle calls); on tails
    worker ``i`` draws its minibatch ``B_i`` of ``b`` samples from ``(seed, t, i)`` and sends
    ``C_i(∇f_{iB_i}(x^{t+1}) − ∇f_{iB_i}(x^t))`` (the same samples at both points: ``2b`` calls),
    ``g^{t+1} = g^t + (1/n) Σ C_i(·)``. ``p`` defaults to ``min(b/(b + m), ζ/d)`` with ``m`` the
    largest ``m_i`` (the authors' ``_estimate_prob``, algorithm.py:459-465). The step is
    ``1/(L_− + sqrt((1−p)/p · (L̂² + (A + 1/n) ℒ²/b)))``: ``L̂²`` MARINA's variance bound of the
    compressor (Theorem "AB": ``(A − B)L_+² + B L_±²``), ``ℒ² = (1/n) Σ ℒ_i²`` the mean-squared
    sample smoothness (``problem.L_sample_rms``). The compressed minibatch difference ``Δ_B``
    has ``E‖(1/n) Σ C_i(Δ_{iB}) − Δ‖² ≤ A (1/n) Σ E‖Δ_{iB}‖² − B‖Δ‖² + (1/n²) Σ Var Δ_{iB}`` and
    ``Var Δ_{iB} ≤ ℒ_i² ‖x^{t+1} − x^t‖²/b``, hence the term ``(A + 1/n)ℒ²/b``; for independent
    compressors (``A = ω/n``, ``B = 0``, ``L_+ ≤ L̃``) it is the paper's finite-sum step, the
    authors' ``vr_marina`` step (algorithm.py:467-479, which takes ``L̃_max`` for ``ℒ``).
    Options: ``batch_size`` (required), ``p``.
    """

    name = "vr_marina"
    label = "VR-MARINA"
    exchange = ex.compressed_mean_rows
    table_rows = {}
    parameters_read_problem = True
    needs_finite_sum = True
    example_options = {"batch_size": 2}

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   batch_size: Any = None, p: Any = None) -> dict[str, Any]:
        b = _batch_size(batch_size, self)
        counts = _sample_counts(problem, self, n)
        m = float(counts.max())
        params = self._parameters(compressor, n, d, float_bits, p, {}, p_cap=b / (b + m))
        return {**params, "batch_size": b}

    def tunable_range(self, compressor: Compressor, n: int, d: int) -> dict[str, tuple[float, float]]:
        return {}

    def step(self, compressor: Compressor, n: int, d: int, params: dict[str, Any], constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        if constants.mu is not None:
            raise ValueError(f"{self.label} has no PL step in permk: pass gamma= or pl=False")
        bound = variance_bound(compressor, n, d, constants, problem=problem)
        L_hat_sq = bound.L_hat_sq + (params["A"] + 1.0 / n) * _sample_smoothness_sq(problem, n, self) / params["batch_size"]
        gamma = marina_variance_stepsize(constants.L_minus, L_hat_sq, params["p"])
        return gamma, (f"{self.label} finite-sum theorem (Gorbunov et al. 2021) with {bound.theorem}'s variance and the "
                       "minibatch term (A + 1/n)ℒ²/b; the authors' vr_marina step, algorithm.py:467-479")

    def heads(self, backend: Backend, x: Array, params: dict[str, Any], state: MarinaState) -> tuple[Array, float | None]:
        """The estimator on heads and its oracle calls (None: one full gradient)."""
        return ex.mean_grad(backend, x), None

    def update(self, state: MarinaState, backend: Backend, compressor: Compressor, params: dict[str, Any]) -> tuple[MarinaState, RoundInfo]:
        x = state.x - params["gamma"] * state.g
        heads = bool(_core.coin(state.seed, state.round, params["p"]))
        calls: float | None
        if heads:
            g, calls = self.heads(backend, x, params, state)
            bits = params["bits"]["full"]
        else:
            b = params["batch_size"]
            gx, gy = ex.minibatch_grads_pair(backend, x, state.x, b, seed=state.seed, round=state.round)
            with np.errstate(invalid="ignore", over="ignore"):
                diff = gx - gy
            g = state.g + ex.compressed_mean_rows(backend, compressor, diff, seed=state.seed, round=state.round)
            bits, calls = params["bits"]["compressed"], 2.0 * b
        return (MarinaState(x=x, g=g, round=state.round + 1, seed=state.seed, bits=state.bits + bits),
                RoundInfo(bits, heads, calls))


class StochasticMarina(VRMarina):
    """Online stochastic MARINA (Gorbunov et al. 2021, "MARINA: faster non-convex distributed
    learning with compression", the online case): :class:`VRMarina` whose heads rounds send a
    megabatch gradient ``(1/n) Σ ∇f_{iB'_i}(x^{t+1})`` of ``b'`` samples (``megabatch_size``,
    ``b'`` oracle calls) instead of the full gradient. The samples are drawn uniformly with
    replacement from the finite sum (the stochastic oracle). ``p`` defaults to
    ``min(b/(b + b'), ζ/d)``; the step is VR-MARINA's (the paper's online step has the same
    ``(1−p)/(pn) (ω L² + (1 + ω)ℒ²/b)`` term; the authors' ``marina_stochastic``,
    algorithm.py:540-560, takes a given step). The run converges to a neighbourhood of size
    ``O(σ²/(n b'))``. Options: ``batch_size``, ``megabatch_size`` (both required), ``p``.
    """

    name = "marina_stochastic"
    label = "stochastic MARINA"
    example_options = {"batch_size": 2, "megabatch_size": 8}

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   batch_size: Any = None, megabatch_size: Any = None, p: Any = None) -> dict[str, Any]:
        b = _batch_size(batch_size, self)
        if megabatch_size is None:
            raise TypeError(f"{self.label} needs megabatch_size= (the samples of its heads rounds)")
        big = check_int(megabatch_size, "megabatch_size", low=1)
        _sample_counts(problem, self, n)
        params = self._parameters(compressor, n, d, float_bits, p, {}, p_cap=b / (b + big))
        return {**params, "batch_size": b, "megabatch_size": big}

    def step(self, compressor: Compressor, n: int, d: int, params: dict[str, Any], constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        gamma, _ = super().step(compressor, n, d, params, constants, problem)
        return gamma, f"{self.label} online theorem (Gorbunov et al. 2021): VR-MARINA's step with b' in p"

    def heads(self, backend: Backend, x: Array, params: dict[str, Any], state: MarinaState) -> tuple[Array, float | None]:
        big = params["megabatch_size"]
        rows = ex.minibatch_grads(backend, x, big, seed=state.seed, round=state.round)
        return ex.mean_rows(backend, rows), float(big)


class SGD(Method):
    """Minibatch SGD, the uncompressed stochastic baseline: worker ``i`` sends its minibatch
    gradient ``∇f_{iB_i}(x^t)`` (``b`` samples from ``(seed, t, i)``, ``b`` oracle calls) and
    ``x^{t+1} = x^t − γ (1/n) Σ ∇f_{iB_i}(x^t)``. Step ``1/L_−`` (the smoothness step) or the
    user's ``gamma``. Called without a compressor: ``permk.sgd(problem, rounds=…, seed=…,
    batch_size=b)``. Option: ``batch_size`` (required)."""

    name = "sgd"
    label = "SGD"
    state_type = DCGDState
    exchange = ex.mean_grad
    takes_compressor = False
    needs_finite_sum = True
    parameters_read_problem = True
    example_options = {"batch_size": 2}

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   batch_size: Any = None) -> dict[str, Any]:
        if not compressor.capabilities.lossless:
            raise ValueError(f"sgd sends whole minibatch gradients: its compressor must be None or Identity, got {compressor.name}")
        _sample_counts(problem, self, n)
        full = float(d * float_bits)
        return {"batch_size": _batch_size(batch_size, self), "bits": {"full": full, "compressed": full, "expected": full}}

    def step(self, compressor: Compressor, n: int, d: int, params: dict[str, Any], constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        if constants.mu is not None:
            raise ValueError("SGD has no PL step in permk: pass gamma= or pl=False")
        return 1.0 / constants.L_minus, "1/L− (the smoothness step of SGD)"

    def floats_per_round(self, compressor: Compressor, n: int, d: int, params: dict[str, Any]) -> float:
        return float(d)

    def init(self, x0: Array, backend: Backend, compressor: Compressor, params: dict[str, Any], *, seed: int) -> DCGDState:
        return DCGDState(x=x0, round=0, seed=seed)

    def update(self, state: DCGDState, backend: Backend, compressor: Compressor, params: dict[str, Any]) -> tuple[DCGDState, RoundInfo]:
        b = params["batch_size"]
        g = ex.mean_rows(backend, ex.minibatch_grads(backend, state.x, b, seed=state.seed, round=state.round))
        bits = params["bits"]["full"]
        return (DCGDState(x=state.x - params["gamma"] * g, round=state.round + 1, seed=state.seed, bits=state.bits + bits),
                RoundInfo(bits, None, float(b)))

    def __call__(self, problem: Any, compressor: Compressor | None = None, *, rounds: int, seed: int, **options: Any) -> RunResult:  # type: ignore[override]
        """Run minibatch SGD in the simulator (``compressor`` must be None or Identity)."""
        return run(self, problem, compressor if compressor is not None else Identity(), rounds=rounds, seed=seed, **options)


def _batch_size(batch_size: Any, method: Method) -> int:
    if batch_size is None:
        raise TypeError(f"{method.label} needs batch_size= (the samples of a worker's minibatch)")
    return check_int(batch_size, "batch_size", low=1)


def _sample_smoothness_sq(problem: Any, n: int, method: Method) -> float:
    """``ℒ² = (1/n) Σ ℒ_i²``, the mean-squared sample smoothness (``problem.L_sample_rms``)."""
    rms = getattr(problem, "L_sample_rms", None)
    if rms is None:
        raise ValueError(f"{method.label}'s step reads the mean-squared sample smoothness L_sample_rms; the problem states none: pass gamma=")
    rms = np.asarray(rms, dtype=np.float64)
    if rms.shape != (n,) or not np.isfinite(rms).all() or (rms < 0).any():
        raise ValueError(f"the problem's L_sample_rms must be {n} non-negative finite numbers, got shape {rms.shape}")
    return float(np.mean(rms**2))


def _sample_counts(problem: Any, method: Method, n: int) -> Array:
    counts = getattr(problem, "sample_counts", None)
    if counts is None or not hasattr(problem, "minibatch_grads_pair"):
        raise TypeError(f"{method.label} needs a finite-sum problem with minibatch oracles (permk.classification.FiniteSumProblem)")
    counts = np.asarray(counts)
    if counts.shape != (n,) or (counts < 1).any():
        raise ValueError(f"problem.sample_counts must be {n} positive counts, got {counts!r}")
    return counts


class EF21(Method):
    """EF21 (appendix "EF21 Analysis") with a contractive compressor (TopK).

    ``g_i⁰ = ∇f_i(x⁰)``; ``x^{t+1} = x^t − γ g^t``; worker ``i`` sends
    ``c_i = C(∇f_i(x^{t+1}) − g_i^t)`` and sets ``g_i^{t+1} = g_i^t + c_i``;
    ``g^{t+1} = g^t + (1/n) Σ c_i``. Step ``1/(L− + L+ sqrt(β/θ))``, ``θ = 1 − sqrt(1 − α)``,
    ``β = (1 − α)/θ`` (``pl=True``: the PL step). Options: ``count_indices`` (default True: the bits
    count ``⌈log2 d⌉`` per TopK index); ``init``: ``"full"`` (default, the appendix's
    ``g_i⁰ = ∇f_i(x⁰)``) or ``"compressed"`` (``g_i⁰ = C(∇f_i(x⁰))``, ``g⁰ = (1/n) Σ g_i⁰``: the
    start of the authors' quadratic runs, algorithm.py:1885-1893 of their code). The start's
    message is not counted in the bits, either way, as the paper does not count the initial
    step ("In all cases we do not consider the communication complexity of the initial step");
    a compressor with randomness draws it from the round index :attr:`EF21.INIT_ROUND`, which no
    round of a run uses.
    """

    name = "ef21"
    label = "EF21"
    state_type = EF21State
    exchange = ex.error_feedback
    starts = ("full", "compressed")
    collapses_identical_workers = True
    authors_rounds_factor = 2
    table_rows = {TopK: EF21_TOPK}

    #: The round index of the compressed start's message (``init="compressed"``).
    INIT_ROUND = 2**64 - 1

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, count_indices: bool = True,  # type: ignore[override]
                   init: str = "full") -> dict[str, Any]:
        alpha = compressor.alpha(n, d)
        if alpha is None:
            raise ValueError(f"EF21 needs a contractive compressor (alpha); {compressor.name} has none")
        return {"alpha": alpha, "bits": message_bits(compressor, n, d, float_bits, indices=_flag(count_indices, "count_indices")),
                "init": check_choice(init, "init", self.starts)}

    def step(self, compressor: Compressor, n: int, d: int, params: dict[str, Any], constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        gamma = ef21_stepsize(params["alpha"], constants.L_minus, constants.L_plus, mu=constants.mu)
        return gamma, "EF21 theorem" if constants.mu is None else "EF21 PL theorem"

    def floats_per_round(self, compressor: Compressor, n: int, d: int, params: dict[str, Any]) -> float:
        return float(compressor.floats_per_worker(n, d))

    def init(self, x0: Array, backend: Backend, compressor: Compressor, params: dict[str, Any], *, seed: int) -> EF21State:
        if params.get("init", "full") == "compressed":
            # C(∇f_i(x⁰) − 0): EF21's own exchange from zero estimators, on every backend
            zero = np.zeros((len(backend.workers), backend.d))
            g, G = ex.error_feedback(backend, compressor, zero, x0, seed=seed, round=self.INIT_ROUND)
            return EF21State(x=x0, g=np.array(g, dtype=np.float64), G=G, round=0, seed=seed)
        G = np.array(ex.local_grads(backend, x0), dtype=np.float64)
        return EF21State(x=x0, g=ex.mean_rows(backend, G), G=G, round=0, seed=seed)

    def update(self, state: EF21State, backend: Backend, compressor: Compressor, params: dict[str, Any]) -> tuple[EF21State, RoundInfo]:
        x = state.x - params["gamma"] * state.g
        mean, G = ex.error_feedback(backend, compressor, state.G, x, seed=state.seed, round=state.round)
        bits = params["bits"]["compressed"]
        return EF21State(x=x, g=state.g + mean, G=G, round=state.round + 1, seed=state.seed, bits=state.bits + bits), RoundInfo(bits)


class DCGD(Method):
    """Distributed compressed gradient descent with an unbiased compressor.

    ``shifts=None`` (default): ``x^{t+1} = x^t − γ (1/n) Σ_i C_i(∇f_i(x^t))`` with the user's
    ``gamma`` (no theory step). ``shifts="initial"``: the shifts ``h_i = ∇f_i(x^0)`` stay fixed
    (the authors' ``dcgd_permutation``), worker ``i`` sends ``C_i(∇f_i(x^t) − h_i)`` and
    ``x^{t+1} = x^t − γ (h̄ + (1/n) Σ_i C_i(∇f_i(x^t) − h_i))``, ``h̄ = ∇f(x^0)`` (the start's
    exchange is not counted); a worker recomputes its ``h_i`` where it sends a value instead of
    storing it (``C_i(∇f_i(x) − ∇f_i(x^0))``: the exchange of MARINA's differences). Its step is the
    authors' (:func:`~permk.theory.steps.shifted_dcgd_stepsize`) for compressors in the class of
    PermK (AB constants ``A = B ≤ 1``); other compressors need ``gamma``."""

    name = "dcgd"
    label = "DCGD"
    state_type = DCGDState
    exchange = ex.compressed_mean

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32,  # type: ignore[override]
                   shifts: str | None = None) -> dict[str, Any]:
        if not compressor.capabilities.unbiased:
            raise ValueError(f"DCGD needs an unbiased compressor; {compressor.name} is biased")
        if shifts not in (None, "initial"):
            raise ValueError(f"shifts must be None or 'initial', got {shifts!r}")
        return {"shifts": shifts, "bits": message_bits(compressor, n, d, float_bits)}

    def step(self, compressor: Compressor, n: int, d: int, params: dict[str, Any], constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        ab, omega = compressor.ab_constants(n, d), compressor.omega(n, d)
        if params["shifts"] is None or constants.mu is not None:
            raise ValueError("DCGD has a theory step only with shifts='initial' and pl=False: pass gamma=")
        if ab is None or omega is None or shift_step_class(ab[0], ab[1], n) != "permutation":
            raise ValueError(f"the authors' shifted-DCGD step is for compressors in PermK's class (AB constants "
                             f"A = B <= 1, and ω); {compressor.name} is not: pass gamma=")
        L_mean, L_max = worker_constants(problem, n)
        return shifted_dcgd_stepsize(omega, n, L_mean, L_max), "authors' dcgd_permutation step (algorithm.py:1867-1874)"

    def floats_per_round(self, compressor: Compressor, n: int, d: int, params: dict[str, Any]) -> float:
        return float(compressor.floats_per_worker(n, d))

    def init(self, x0: Array, backend: Backend, compressor: Compressor, params: dict[str, Any], *, seed: int) -> DCGDState:
        if params["shifts"] == "initial":
            return ShiftedDCGDState(x=x0, y=x0, h=np.array(ex.mean_grad(backend, x0), dtype=np.float64), round=0, seed=seed)
        return DCGDState(x=x0, round=0, seed=seed)

    def update(self, state: DCGDState, backend: Backend, compressor: Compressor, params: dict[str, Any]) -> tuple[DCGDState, RoundInfo]:
        if params["shifts"] == "initial":
            if not isinstance(state, ShiftedDCGDState):
                raise TypeError(f"a run with shifts='initial' continues a ShiftedDCGDState, got a {type(state).__name__}")
            diff = ex.compressed_mean_diff(backend, compressor, state.x, state.y, seed=state.seed, round=state.round)
            step = state.h + diff
        else:
            step = ex.compressed_mean(backend, compressor, state.x, seed=state.seed, round=state.round)
        bits = params["bits"]["compressed"]
        x = state.x - params["gamma"] * step
        return replace(state, x=x, round=state.round + 1, bits=state.bits + bits), RoundInfo(bits)


class ShiftedDCGD(DCGD):
    """:class:`DCGD` with ``shifts="initial"`` by default, under its own name: the experiments'
    ``METHOD-COMPRESSOR`` (``dcgd_shifted-permk``) selects it. ``permk.dcgd_shifted(...)`` is
    ``permk.dcgd(..., shifts="initial")`` (the same iterates and state), named ``dcgd_shifted``."""

    name = "dcgd_shifted"
    label = "shifted DCGD"

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32) -> dict[str, Any]:  # type: ignore[override]
        return super().parameters(compressor, n, d, float_bits=float_bits, shifts="initial")


class Diana(Method):
    """DIANA (Mishchenko et al., "Distributed learning with compressed gradient differences";
    nonconvex theory: Horváth et al., "Stochastic distributed learning with gradient quantization
    and double-variance reduction").

    ``h_i^0 = ∇f_i(x^0)`` and ``g^0 = ∇f(x^0)`` (the start's exchange is not counted);
    ``x^{t+1} = x^t − γ g^t``; worker ``i`` sends ``m_i = C_i(∇f_i(x^{t+1}) − h_i)``;
    ``g^{t+1} = h̄ + (1/n) Σ m_i`` with ``h̄ = (1/n) Σ h_i``; then ``h_i ← h_i + α m_i`` and the
    server mirrors ``h̄ ← h̄ + α (1/n) Σ m_i``. Needs an unbiased compressor; ``alpha`` defaults
    to ``1/(ω + 1)`` and lies in ``(0, 1]``. The step (:func:`~permk.theory.steps.diana_stepsize`)
    ``min{1/(2L_−), α/(2L_+ sqrt(A(2 + α)))}`` gives
    ``(1/T) Σ_{t<T} E‖∇f(x^t)‖² ≤ 2(f(x^0) − f*)/(γT)`` for ``α ≤ 1/(ω + 1)``.

    >>> import permk
    >>> q = permk.Quadratic.synthetic(n=10, d=100, lam=1e-3, noise_scale=0.0, seed=0)
    >>> res = permk.diana(q, permk.PermK(), rounds=300, seed=1)
    >>> res.params["alpha"], bool(res.grad_norm_sq[-1] < 1e-2 * res.grad_norm_sq[0])
    (0.1, True)
    """

    name = "diana"
    label = "DIANA"
    state_type = DianaState
    exchange = ex.shifted

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32,  # type: ignore[override]
                   alpha: Any = None) -> dict[str, Any]:
        if not compressor.capabilities.unbiased:
            raise ValueError(f"DIANA needs an unbiased compressor; {compressor.name} is biased (use ef21 for TopK)")
        omega = compressor.omega(n, d)
        if alpha is None:
            if omega is None:
                raise ValueError(f"{compressor.name} states no ω: pass DIANA's alpha= (in (0, 1])")
            alpha = 1.0 / (omega + 1.0)
        else:
            alpha = check_real(alpha, "alpha", low=0.0, strict=True, high=1.0)
        ab = compressor.ab_constants(n, d)
        return {"alpha": alpha, "omega": omega, "A": None if ab is None else float(ab[0]),
                "B": None if ab is None else float(ab[1]), "bits": message_bits(compressor, n, d, float_bits)}

    def step(self, compressor: Compressor, n: int, d: int, params: dict[str, Any], constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        if constants.mu is not None:
            raise ValueError("DIANA has no PL step in permk: pass gamma= or pl=False")
        if params["A"] is None or params["omega"] is None:
            raise ValueError(f"DIANA's step needs the compressor's ω and AB constants; {compressor.name} states none: pass gamma=")
        gamma = diana_stepsize(params["alpha"], params["omega"], params["A"], constants.L_minus, constants.L_plus)
        return gamma, "DIANA nonconvex theorem (permk's Lyapunov derivation after Horváth et al. 2019, with the AB inequality)"

    def floats_per_round(self, compressor: Compressor, n: int, d: int, params: dict[str, Any]) -> float:
        return float(compressor.expected_floats_per_worker(n, d))

    def init(self, x0: Array, backend: Backend, compressor: Compressor, params: dict[str, Any], *, seed: int) -> DianaState:
        H = np.array(ex.local_grads(backend, x0), dtype=np.float64)
        h = np.array(ex.mean_rows(backend, H), dtype=np.float64)
        return DianaState(x=x0, g=h.copy(), H=H, h=h, round=0, seed=seed)

    def update(self, state: DianaState, backend: Backend, compressor: Compressor, params: dict[str, Any]) -> tuple[DianaState, RoundInfo]:
        x = state.x - params["gamma"] * state.g
        mean, H = ex.shifted(backend, compressor, state.H, x, alpha=params["alpha"], seed=state.seed, round=state.round)
        bits = params["bits"]["compressed"]
        return DianaState(x=x, g=state.h + mean, H=H, h=state.h + params["alpha"] * mean, round=state.round + 1,
                          seed=state.seed, bits=state.bits + bits), RoundInfo(bits)

    def state_shape(self, n: int, d: int) -> tuple[int, ...]:
        return (n, d)  # the workers' shifts H


class RandDiana(Method):
    """RandDIANA: DIANA whose shifts are refreshed, not learned: ``h_i = ∇f_i(y)`` with ``y``
    set to the iterate by a shared coin ``θ_t ~ Be(p)`` (a pure function of ``(seed, t)``).

    ``y = x^0``, ``g^0 = ∇f(x^0)`` (not counted); ``x^{t+1} = x^t − γ g^t``; on heads the workers
    send their full gradients at ``x^t`` and ``y ← x^t``, ``h̄ ← ∇f(x^t)``; every round
    ``g^{t+1} = h̄ + (1/n) Σ C_i(∇f_i(x^{t+1}) − h_i)`` (the order of the authors'
    ``rand_diana``: the message at ``x^{t+1}`` uses the refreshed shifts). A worker recomputes
    ``h_i = ∇f_i(y)`` where it sends a value instead of storing it. Needs an unbiased compressor;
    ``p`` defaults to ``ζ/d`` (the expected message over a full gradient, the authors'
    ``_estimate_prob``). The step is the authors' (:func:`~permk.theory.steps.rand_diana_stepsize`):
    their ``rand_diana_permutation`` step for compressors in PermK's class (AB constants
    ``A = B ≤ 1``), their ``rand_diana`` step for ``A ≤ (n − 1)/n`` (independent compressors with
    ``ω + 1 ≤ n``); ``pl=True`` takes their strongly convex step. It reads the workers' ``L_i``.
    """

    name = "rand_diana"
    label = "RandDIANA"
    state_type = RandDianaState
    exchange = ex.compressed_mean_diff
    has_coin = True

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32,  # type: ignore[override]
                   p: Any = None) -> dict[str, Any]:
        if not compressor.capabilities.unbiased:
            raise ValueError(f"RandDIANA needs an unbiased compressor; {compressor.name} is biased (use ef21 for TopK)")
        sizes = message_bits(compressor, n, d, float_bits)
        full = float(d * float_bits)
        p = min(1.0, sizes["expected"] / full) if p is None else check_probability(p)
        return {"p": p, "bits": {"full": full, "compressed": sizes["compressed"],
                                 "expected": sizes["expected"] + p * full}}

    def step(self, compressor: Compressor, n: int, d: int, params: dict[str, Any], constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        ab = compressor.ab_constants(n, d)
        kind = None if ab is None else shift_step_class(ab[0], ab[1], n)
        if kind is None:
            raise ValueError(f"the authors' RandDIANA steps are for AB constants A = B <= 1 (permutation) or A <= (n-1)/n "
                             f"(independent); {compressor.name} has neither: pass gamma=")
        L_mean, L_max = worker_constants(problem, n)
        gamma = rand_diana_stepsize(params["p"], L_mean, L_max, constants.L_pm, kind=kind, mu=constants.mu)
        lines = {"permutation": "1762-1775", "independent": "1692-1706"}[kind]
        regime = "" if constants.mu is None else " (strongly convex)"
        return gamma, f"authors' {'rand_diana_permutation' if kind == 'permutation' else 'rand_diana'} step{regime} (algorithm.py:{lines})"

    def floats_per_round(self, compressor: Compressor, n: int, d: int, params: dict[str, Any]) -> float:
        return float(compressor.expected_floats_per_worker(n, d) + params["p"] * d)

    def init(self, x0: Array, backend: Backend, compressor: Compressor, params: dict[str, Any], *, seed: int) -> RandDianaState:
        h = np.array(ex.mean_grad(backend, x0), dtype=np.float64)
        return RandDianaState(x=x0, g=h.copy(), y=x0, h=h, round=0, seed=seed)

    def update(self, state: RandDianaState, backend: Backend, compressor: Compressor, params: dict[str, Any]) -> tuple[RandDianaState, RoundInfo]:
        x = state.x - params["gamma"] * state.g
        heads = bool(_core.coin(state.seed, state.round, params["p"]))
        bits = params["bits"]["compressed"]
        y, h = state.y, state.h
        if heads:
            y, h = state.x, ex.mean_grad(backend, state.x)
            bits += params["bits"]["full"]
        g = h + ex.compressed_mean_diff(backend, compressor, x, y, seed=state.seed, round=state.round)
        return RandDianaState(x=x, g=g, y=y, h=h, round=state.round + 1, seed=state.seed,
                              bits=state.bits + bits), RoundInfo(bits, heads)


class Dasha(Method):
    """DASHA (Tyurin & Richtárik 2022, "DASHA: Distributed nonconvex optimization with
    communication compression, optimal oracle complexity, and no client synchronization") in the
    gradient setting, and with ``participation=s`` its partial-participation form DASHA-PP
    (Tyurin & Richtárik 2022, "A computation and communication efficient method for distributed
    nonconvex problems in the partial participation setting").

    DASHA (the authors' ``zero_marina``): ``g_i⁰ = ∇f_i(x⁰)``, ``g⁰ = (1/n) Σ g_i⁰``;
    ``x^{t+1} = x^t − γ g^t``; worker ``i`` sends
    ``m_i = C_i(∇f_i(x^{t+1}) − ∇f_i(x^t) − a(g_i^t − ∇f_i(x^t)))`` and keeps
    ``g_i^{t+1} = g_i^t + m_i``; ``g^{t+1} = g^t + (1/n) Σ m_i``: the shifted exchange with
    ``v_i = ∇f_i(x^{t+1}) − (1 − a)∇f_i(x^t)`` and ``β = a``. Defaults ``a = 1/(2ω + 1)`` and the
    step of :func:`~permk.theory.steps.dasha_stepsize` (``params["gamma_source"]``:
    ``"DASHA theorem"``); it needs an unbiased compressor with ``ω`` and AB constants.

    DASHA-PP (the authors' ``zero_marina_partial_participation``): ``s`` of the ``n`` workers,
    sampled uniformly from ``(seed, t)`` (:func:`permk.compressors.participation.participants`),
    participate; ``p_a = s/n``, ``a = p_a/(2ω + 1)``, ``b = p_a/(2 − p_a)``, ``h_i⁰ = g_i⁰ =
    ∇f_i(x⁰)``. A participant computes ``k_i = ∇f_i(x^{t+1}) − ∇f_i(x^t) − b(h_i^t −
    ∇f_i(x^t))``, sends ``m_i = (1/p_a) C_i(k_i − a(g_i^t − h_i^t))`` and keeps
    ``h_i^{t+1} = h_i^t + k_i/p_a``, ``g_i^{t+1} = g_i^t + m_i``; the others send nothing and
    keep ``h_i``, ``g_i``; ``g^{t+1} = g^t + (1/n) Σ m_i``. (The authors compress
    ``(1/p_a)(k_i − …)``: the same for the positively homogeneous sparsifiers.) The message is
    the :class:`permk.Participation` family's shifted exchange with
    ``v_i = ∇f_i(x^{t+1}) − (1 − b)∇f_i(x^t)`` and ``β = a`` from the rows
    ``G_i = g_i + ((b − a)/a) h_i``, whose ``a G_i = a g_i + (b − a) h_i`` is the whole shift;
    ``G`` then follows ``g_i`` and ``h_i``. Step: :func:`~permk.theory.steps.dasha_pp_stepsize`
    (``"DASHA-PP theorem"``).

    Options: ``a`` (in ``(0, 1]``; the steps are the theorems' for their default ``a``) and
    ``participation`` (``s`` in ``1..n``). The start's full gradients are not counted in the bits.

    ``estimator="page"`` or ``"mvr"`` (with ``batch_size=b`` and their options) runs
    :class:`DashaPage` or :class:`DashaMVR`, the same run as ``permk.dasha_page`` or
    ``permk.dasha_mvr``; ``"gradient"`` (the default) is DASHA itself (:meth:`resolve`).
    """

    name = "dasha"
    label = "DASHA"
    state_type: ClassVar[type[State]] = DashaState
    exchange: ClassVar[ex.Exchange] = ex.shifted
    #: The ``estimator`` option's values: the method each runs, by its catalog name (DASHA's
    #: workers' gradients: full, PAGE or momentum estimators).
    estimator_methods: ClassVar[Mapping[str, str]] = {"gradient": "dasha", "page": "dasha_page", "mvr": "dasha_mvr"}

    def resolve(self, options: dict[str, Any]) -> tuple[Method, dict[str, Any]]:
        if not self.estimator_methods:
            return super().resolve(options)
        rest = dict(options)
        estimator = rest.pop("estimator", "gradient")
        name = self.estimator_methods.get(estimator) if isinstance(estimator, str) else None
        if name is None:
            raise ValueError(f"estimator must be one of {', '.join(map(repr, self.estimator_methods))}, got {estimator!r}")
        method = _package_methods()[name]
        if "batch_size" in rest and not method.needs_finite_sum:
            raise ValueError(f"batch_size is an option of the stochastic estimators: pass estimator='page' or 'mvr' "
                             f"with it (estimator={estimator!r} computes full gradients)")
        return method, rest

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, a: Any = None,  # type: ignore[override]
                   participation: Any = None) -> dict[str, Any]:
        s = None if participation is None else check_participation(participation, n)
        if not compressor.capabilities.unbiased:
            raise ValueError(f"DASHA needs an unbiased compressor; {compressor.name} is biased (use ef21 for TopK)")
        omega, ab = compressor.omega(n, d), compressor.ab_constants(n, d)
        if omega is None or ab is None:
            raise ValueError(f"DASHA needs a compressor with omega and AB constants; {compressor.name} states none")
        p_a = 1.0 if s is None else s / n
        if a is None:
            a = dasha_momentum(omega, p_a)
        else:
            a = check_real(a, "a")
            if not 0.0 < a <= 1.0:
                raise ValueError(f"a must be in (0, 1], got {a}")
        own: dict[str, Any] = {"omega": float(omega), "A": float(ab[0]), "a": a}
        if s is not None:
            own.update(participation=s, b=p_a / (2 - p_a))
        return {**own, "bits": message_bits(self.sent_compressor(compressor, own), n, d, float_bits)}

    def step(self, compressor: Compressor, n: int, d: int, params: dict[str, Any], constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        if constants.mu is not None:
            raise ValueError("DASHA has no PL step in permk: pass gamma= (or leave pl=False)")
        s = params.get("participation")
        if s is None:
            return dasha_stepsize(params["omega"], params["A"], constants.L_minus, constants.L_plus), "DASHA theorem"
        return dasha_pp_stepsize(params["omega"], params["A"], n, s, constants.L_minus, constants.L_plus), "DASHA-PP theorem"

    def floats_per_round(self, compressor: Compressor, n: int, d: int, params: dict[str, Any]) -> float:
        return float(self.sent_compressor(compressor, params).expected_floats_per_worker(n, d))

    def init(self, x0: Array, backend: Backend, compressor: Compressor, params: dict[str, Any], *, seed: int) -> DashaState:
        grads = np.array(ex.local_grads(backend, x0), dtype=np.float64)
        g = np.array(ex.mean_rows(backend, grads), dtype=np.float64)
        if params.get("participation") is None:
            return DashaState(x=x0, g=g, G=grads, round=0, seed=seed)
        w = self._h_weight(params)
        return DashaPPState(x=x0, g=g, G=grads + w * grads, H=grads, h_weight=w, round=0, seed=seed)

    @staticmethod
    def _h_weight(params: dict[str, Any]) -> float:
        """``(b − a)/a``: the weight of ``h_i`` in DASHA-PP's rows ``G``."""
        return (params["b"] - params["a"]) / params["a"]

    def update(self, state: DashaState, backend: Backend, compressor: Compressor, params: dict[str, Any]) -> tuple[DashaState, RoundInfo]:
        s, a, t = params.get("participation"), params["a"], state.round
        pp = isinstance(state, DashaPPState)
        if pp != (s is not None) or (pp and cast(DashaPPState, state).h_weight != self._h_weight(params)):
            raise ValueError("the state does not fit the run: a DashaState continues a run without participation, "
                             "a DashaPPState one with the same participation and a")
        x = state.x - params["gamma"] * state.g
        bits = params["bits"]["compressed"]
        if s is None:
            mean, G = ex.shifted(backend, compressor, state.G, x, state.x, c=1 - a, beta=a, seed=state.seed, round=t)
            return DashaState(x=x, g=state.g + mean, G=G, round=t + 1, seed=state.seed, bits=state.bits + bits), RoundInfo(bits)
        prev = cast(DashaPPState, state)
        b, n, ws, w = params["b"], backend.n, backend.workers, prev.h_weight
        mean, G = ex.shifted(backend, compressor, prev.G, x, prev.x, c=1 - b, beta=a, seed=prev.seed, round=t)
        new, old = ex.local_grads(backend, x), ex.local_grads(backend, prev.x)
        held = participation_mask(n, s, seed=prev.seed, round=t)[ws.start : ws.stop, None]
        with np.errstate(invalid="ignore", over="ignore"):
            dh = np.where(held, (new - old - b * (prev.H - old)) / (s / n), 0.0)
            H = prev.H + dh
            G += w * dh
        return DashaPPState(x=x, g=state.g + mean, G=G, H=H, h_weight=w, round=t + 1, seed=state.seed,
                            bits=state.bits + bits), RoundInfo(bits)


class DashaPage(Dasha):
    """DASHA-PAGE (Tyurin & Richtárik 2022, "DASHA: Distributed nonconvex optimization with
    communication compression, optimal oracle complexity, and no client synchronization"; the
    authors' ``zero_marina_page``) on a finite-sum problem: DASHA whose workers' gradients are
    PAGE estimators ``h_i``. ``h_i⁰ = g_i⁰ = ∇f_i(x⁰)``; ``x^{t+1} = x^t − γ g^t``; on heads of a
    shared coin ``Be(p)`` of ``(seed, t)`` (the authors' default, one coin for all workers)
    ``h_i^{t+1} = ∇f_i(x^{t+1})`` (``m_i`` oracle calls), else ``h_i^{t+1} = h_i^t +
    ∇f_{iB}(x^{t+1}) − ∇f_{iB}(x^t)`` (``b`` samples from ``(seed, t, i)``, ``2b`` calls); worker
    ``i`` sends ``m_i = C_i(h_i^{t+1} − h_i^t − a(g_i^t − h_i^t))``, keeps ``g_i + m_i``;
    ``g^{t+1} = g^t + (1/n) Σ m_i``. Defaults: ``a = 1/(2ω + 1)`` (the authors'
    ``_estimate_momentum``, algorithm.py:864-865) and ``p = b/(b + m)`` (their ``_estimate_prob``,
    algorithm.py:1066-1068; ``m`` the largest ``m_i``). The step is permk's derivation
    (docs/dasha_steps.md, :func:`~permk.theory.steps.dasha_page_stepsize`): ``1/(L_− + sqrt K)``,
    ``K = 4AW(1 + p)L_+² + 12AW(1 − p)ℒ²/b + 2(1 − p)ℒ²/(p n b)``, ``W = 1/a + 2ω``, ``A`` the
    compressor's AB constant and ``ℒ²`` the mean-squared sample smoothness
    (``problem.L_sample_rms``), for ``a ≤ 1/(2ω + 1)``; it gives
    ``(1/T) Σ_{t<T} E‖∇f(x^t)‖² ≤ 2(f(x⁰) − f*)/(γT)``. (The authors' code takes the step as
    given: ``zero_marina_page_master``, algorithm.py:1030-1075 at bd3f2e6, and
    mysteryresearcher/dasha's algorithm.py:918-957; ``gamma=`` overrides.) Options:
    ``batch_size`` (required), ``p``, ``a``. Every round sends one compressed message.
    ``permk.dasha(…, estimator="page")`` is the same run.
    """

    name = "dasha_page"
    label = "DASHA-PAGE"
    estimator_methods = {}
    state_type = DashaVRState
    exchange = ex.shifted_rows
    has_coin = True
    needs_finite_sum = True
    parameters_read_problem = True
    example_options = {"batch_size": 2}

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   batch_size: Any = None, a: Any = None, p: Any = None) -> dict[str, Any]:
        b = _batch_size(batch_size, self)
        m = float(_sample_counts(problem, self, n).max())
        own = super().parameters(compressor, n, d, float_bits=float_bits, a=a)
        return {**own, "batch_size": b, "p": b / (b + m) if p is None else check_probability(p)}

    def step(self, compressor: Compressor, n: int, d: int, params: dict[str, Any], constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        if constants.mu is not None:
            raise ValueError(f"{self.label} has no PL step in permk: pass gamma= (or leave pl=False)")
        if params["a"] > 1.0 / (2.0 * params["omega"] + 1.0) * (1 + 1e-12):
            raise ValueError(f"{self.label}'s step is derived for a <= 1/(2ω + 1) = {1 / (2 * params['omega'] + 1):g}, "
                             f"got a = {params['a']:g}: pass gamma=")
        gamma = self.stepsize(params, n, constants, _sample_smoothness_sq(problem, n, self))
        return gamma, "permk's derivation (docs/dasha_steps.md)"

    def stepsize(self, params: dict[str, Any], n: int, constants: Constants, L_sample_sq: float) -> float:
        """The derived step from the run's parameters, ``L_−``, ``L_+`` and ``ℒ²``."""
        return dasha_page_stepsize(params["omega"], params["A"], params["a"], constants.L_minus, constants.L_plus,
                                   L_sample_sq, n, params["batch_size"], params["p"])

    def init(self, x0: Array, backend: Backend, compressor: Compressor, params: dict[str, Any], *, seed: int) -> DashaVRState:
        grads = np.array(ex.local_grads(backend, x0), dtype=np.float64)
        g = np.array(ex.mean_rows(backend, grads), dtype=np.float64)
        return DashaVRState(x=x0, g=g, G=grads, H=grads.copy(), round=0, seed=seed)

    def estimators(self, state: DashaVRState, x: Array, backend: Backend, params: dict[str, Any]) -> tuple[Array, bool | None, float | None]:
        """``h_i^{t+1}`` of the held workers, the round's coin and its oracle calls (None: one full gradient)."""
        if _core.coin(state.seed, state.round, params["p"]):
            return ex.local_grads(backend, x), True, None
        b = params["batch_size"]
        gx, gy = ex.minibatch_grads_pair(backend, x, state.x, b, seed=state.seed, round=state.round)
        with np.errstate(invalid="ignore", over="ignore"):
            return state.H + (gx - gy), False, 2.0 * b

    def update(self, state: DashaVRState, backend: Backend, compressor: Compressor, params: dict[str, Any]) -> tuple[DashaVRState, RoundInfo]:  # type: ignore[override]
        if not isinstance(state, DashaVRState):
            raise TypeError(f"{self.label} continues a DashaVRState, got a {type(state).__name__}")
        a = params["a"]
        x = state.x - params["gamma"] * state.g
        H, coin, calls = self.estimators(state, x, backend, params)
        with np.errstate(invalid="ignore", over="ignore"):
            v = H - (1 - a) * state.H
        mean, G = ex.shifted_rows(backend, compressor, state.G, v, beta=a, seed=state.seed, round=state.round)
        bits = params["bits"]["compressed"]
        return (DashaVRState(x=x, g=state.g + mean, G=G, H=np.asarray(H, dtype=np.float64), round=state.round + 1, seed=state.seed,
                             bits=state.bits + bits), RoundInfo(bits, coin, calls))


class DashaMVR(DashaPage):
    """DASHA-MVR (Tyurin & Richtárik 2022, "DASHA: Distributed nonconvex optimization with
    communication compression, optimal oracle complexity, and no client synchronization"; the
    authors' ``zero_marina_stochastic``): DASHA whose workers' gradients are momentum
    (MVR/STORM) estimators, ``h_i^{t+1} = ∇f_{iB}(x^{t+1}) + (1 − β)(h_i^t − ∇f_{iB}(x^t))``
    (the same ``b`` samples from ``(seed, t, i)`` at both points, ``2b`` calls), with
    ``h_i⁰ = g_i⁰ = ∇f_i(x⁰)`` (the authors start from a megabatch; the start is not counted);
    the message and ``a = 1/(2ω + 1)`` as in :class:`DashaPage`. ``momentum`` (``β`` in
    ``(0, 1]``, the authors' ``noise_momentum``) is required, as in their code (their LibSVM
    experiments set ``min(1/B, 1/(ω sqrt(B)))`` from a megabatch size ``B``,
    mysteryresearcher/dasha's experiments/zero_marina/config_libsvm_zero_marina.py:81). The
    step is permk's derivation (docs/dasha_steps.md,
    :func:`~permk.theory.steps.dasha_mvr_stepsize`): ``1/(L_− + sqrt K)``,
    ``K = 8AW L_+² + 8AW(1 + 2β)(1 − β)²ℒ²/b + 4(1 − β)²ℒ²/(β n b)`` with :class:`DashaPage`'s
    ``W``, ``A`` and ``ℒ²``; it gives ``(1/T) Σ_{t<T} E‖∇f(x^t)‖² ≤ 2(f(x⁰) − f*)/(γT) + 2N``,
    ``N = 4AW(1 + 2β)β²σ²/b + 2βσ²/(n b)`` (:func:`~permk.theory.steps.dasha_mvr_noise`; ``σ²``
    the mean over workers of a sample gradient's variance, which the problems do not state).
    (The authors' ``zero_marina_stochastic_master``, algorithm.py:978-1000 at bd3f2e6, and
    mysteryresearcher/dasha's algorithm.py:866-888, take ``gamma`` as given; ``gamma=``
    overrides.) Options: ``batch_size``, ``momentum`` (required), ``a``. ``permk.dasha(…,
    estimator="mvr")`` is the same run.
    """

    name = "dasha_mvr"
    label = "DASHA-MVR"
    has_coin = False
    example_options = {"batch_size": 2, "momentum": 0.5}

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   batch_size: Any = None, a: Any = None, momentum: Any = None) -> dict[str, Any]:
        if momentum is None:
            raise TypeError(f"{self.label} needs momentum= (β in (0, 1]: h_i ← ∇f_iB(x⁺) + (1 − β)(h_i − ∇f_iB(x)))")
        beta = check_real(momentum, "momentum", low=0.0, strict=True, high=1.0)
        own = super().parameters(compressor, n, d, float_bits=float_bits, problem=problem, batch_size=batch_size, a=a, p=1.0)
        del own["p"]
        return {**own, "momentum": beta}

    def estimators(self, state: DashaVRState, x: Array, backend: Backend, params: dict[str, Any]) -> tuple[Array, bool | None, float | None]:
        b = params["batch_size"]
        gx, gy = ex.minibatch_grads_pair(backend, x, state.x, b, seed=state.seed, round=state.round)
        with np.errstate(invalid="ignore", over="ignore"):
            return gx + (1 - params["momentum"]) * (state.H - gy), None, 2.0 * b

    def stepsize(self, params: dict[str, Any], n: int, constants: Constants, L_sample_sq: float) -> float:
        return dasha_mvr_stepsize(params["omega"], params["A"], params["a"], constants.L_minus, constants.L_plus,
                                  L_sample_sq, n, params["batch_size"], params["momentum"])


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


# ---------------------------------------------------------------------------------------------
# running a method
# ---------------------------------------------------------------------------------------------
def full_gradient_calls(problem: Any) -> float:
    """The oracle calls of one full local gradient (:class:`RoundInfo`): the largest ``m_i`` of a
    finite-sum problem (``sample_counts``), else 1."""
    counts = getattr(problem, "sample_counts", None)
    return 1.0 if counts is None else float(np.max(counts))


def setup(method: Method, problem: Any, compressor: Compressor, *, n: int, d: int, rounds: int, seed: int,
          gamma: Any = None, gamma_multiplier: Any = 1.0, pl: Any = False, constants: str = "exact",
          float_bits: Any = 32, record_every: Any = 1, step: bool = True, **options: Any) -> dict[str, Any]:
    """Validate a run and choose its parameters: the method's own (:meth:`Method.parameters`),
    then the step: the user's ``gamma`` or the theorem's from the problem's constants
    (:class:`~permk.theory.steps.Constants`, read only then), times ``gamma_multiplier``.
    ``step=False`` skips the theory step (an MPI rank that receives rank 0's)."""
    if not isinstance(method, Method):
        raise TypeError(f"method must be a permk Method (permk.marina, permk.ef21, ...), got {type(method).__name__}")
    if not isinstance(compressor, Compressor):
        raise TypeError(f"compressor must be a permk.Compressor, got {type(compressor).__name__}")
    try:
        compressor.check(n, d)
    except ValueError as e:
        raise ValueError(f"the compressor does not fit the problem (n={n}, d={d}): {e}") from None
    check_int(rounds, "rounds", low=1)
    check_int(record_every, "record_every", low=1)
    float_bits = check_int(float_bits, "float_bits", low=1, high=2**16)
    seed = check_seed(seed)
    gamma_multiplier = check_real(gamma_multiplier, "gamma_multiplier", low=0.0, strict=True)
    if gamma is not None:
        gamma = check_real(gamma, "gamma", low=0.0, strict=True)
    pl = _flag(pl, "pl")
    check_choice(constants, "constants", ("exact", "pessimistic"))
    given = {**options, "problem": problem} if method.parameters_read_problem else options
    try:  # an option the method does not have (its own checks of a value raise as they are)
        inspect.signature(method.parameters).bind(compressor, n, d, float_bits=float_bits, **given)
    except TypeError as e:
        raise TypeError(f"{method!r} does not take these options ({', '.join(options)}): {e}") from None
    own = method.parameters(compressor, n, d, float_bits=float_bits, **given)
    params: dict[str, Any] = {"method": method.name, "compressor": compressor.name, "n": n, "d": d,
                              "oracle": {"full": full_gradient_calls(problem)}, **own,
                              "gamma_multiplier": gamma_multiplier, "pl": pl, "float_bits": float_bits, "seed": seed}
    if gamma is not None:
        params.update(gamma_source="user", gamma=gamma * gamma_multiplier)
    elif step:
        c = Constants.of(problem, constants, pl=pl)
        g, source = method.step(compressor, n, d, params, c, problem=problem)
        params.update(c.record(), gamma_source=source, gamma=gamma_multiplier * g)
    return params


def resolve(method: Method, options: dict[str, Any]) -> tuple[Method, dict[str, Any]]:
    """The method a run of ``method`` with ``options`` is, and its remaining options
    (:meth:`Method.resolve`: DASHA's ``estimator``)."""
    if not isinstance(method, Method):
        raise TypeError(f"method must be a permk Method (permk.marina, permk.ef21, ...), got {type(method).__name__}")
    return method.resolve(options)


def check_start(method: Method, problem: Any, backend: Backend, state: Any, x0: Any, seed: int) -> State | Array:
    """What a run starts from, checked before any exchange: the starting point ``x0`` (default
    ``problem.x0``), or the given ``state`` to resume (of the method's kind, with the run's seed)
    as the backend holds it (:meth:`State.held_by`)."""
    seed = check_seed(seed)
    if state is None:
        return start_point(problem.x0 if x0 is None else x0, backend.d, "problem.x0" if x0 is None else "x0")
    if not isinstance(state, method.state_type):
        raise TypeError(f"state must be a {method.state_type.__name__} (e.g. result.state of an earlier run of the same method)")
    if state.seed != seed:
        raise ValueError(f"seed={seed} differs from the resumed state's seed {state.seed}")
    return state.held_by(backend)


def start(method: Method, backend: Backend, compressor: Compressor, params: dict[str, Any], begin: State | Array, seed: int) -> State:
    """The run's first state from what :func:`check_start` returned: the resumed state, or
    ``method.init`` at the starting point (its exchanges)."""
    if isinstance(begin, State):
        return begin
    return method.init(begin, backend, compressor, params, seed=check_seed(seed))


def drive(method: Method, backend: Backend, compressor: Compressor, params: dict[str, Any], state: State, *,
          rounds: int, record_every: int, progress: bool = False, on_round: Callable[[RoundInfo], None] | None = None) -> RunResult:
    """The loop shared by every method and backend: update, record, stop on divergence.

    Metrics are recorded every ``record_every`` rounds (and at the end); a state whose shared arrays are
    not finite (:meth:`State.finite`: the same on every process) stops the run at once and is reported in ``diverged_at``. ``on_round`` sees every
    round's :class:`RoundInfo` (the MPI backend counts its bytes there). Whether a round is
    recorded is computed from its number, so the record costs memory in the points recorded,
    not in ``rounds``."""
    t_start = time.perf_counter()
    start_round = state.round
    last_round = start_round + rounds

    def recorded(t: int) -> bool:
        return (t - start_round) % record_every == 0 or t == last_round
    expected_round = params["bits"]["expected"]
    rec_t: list[int] = []
    rec_g: list[float] = []
    rec_f: list[float] = []
    rec_b: list[float] = []
    rec_e: list[float] = []
    rec_o: list[float] = []
    coins: list[bool] = []
    carries = "oracle_calls" in state.field_names()
    calls = float(state.oracle_calls) if carries else 0.0  # type: ignore[attr-defined]
    full_calls = params["oracle"]["full"]
    hat_at = start_round + int(np.random.default_rng([state.seed, start_round, 0x78686174]).integers(rounds))
    x_hat = state.x
    expected0 = state.bits

    def record(s: State) -> bool:
        """Append the metrics of ``s``; False (nothing appended) if they are not finite."""
        gn, gap = backend.metrics(s.x)
        if not (math.isfinite(gn) and (gap is None or math.isfinite(gap))):
            return False
        rec_t.append(s.round)
        rec_g.append(gn)
        if gap is not None:
            rec_f.append(gap)
        rec_b.append(s.bits)
        rec_e.append(expected0 + (s.round - start_round) * expected_round)
        rec_o.append(calls)
        return True

    if not record(state):
        raise ValueError("the metrics at the starting point are not finite")
    has_gap = bool(rec_f)
    diverged_at = None
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=rounds, desc=f"{method.name}+{compressor.name}", leave=False)
    for _ in range(rounds):
        if state.round == hat_at:
            x_hat = state.x
        state, info = method.update(state, backend, compressor, params)
        calls += full_calls if info.oracle_calls is None else float(info.oracle_calls)
        if carries:
            state = replace(state, oracle_calls=calls)  # type: ignore[type-var]
        if method.has_coin:
            coins.append(bool(info.coin))
        if on_round is not None:
            on_round(info)
        if not state.finite() or (recorded(state.round) and not record(state)):
            diverged_at = state.round
            break
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return RunResult(
        method=method.name,
        compressor=compressor.name,
        rounds=np.array(rec_t, dtype=np.int64),
        grad_norm_sq=np.array(rec_g),
        f_gap=np.array(rec_f) if has_gap else None,
        bits_per_worker=np.array(rec_b),
        expected_bits_per_worker=np.array(rec_e),
        oracle_calls=np.array(rec_o),
        coins=np.array(coins, dtype=bool) if method.has_coin else None,
        x=state.x,
        x_hat=x_hat,
        params=params,
        wall_time=time.perf_counter() - t_start,
        diverged_at=diverged_at,
        state=state,
    )


def run(method: Method, problem: Any, compressor: Compressor, *, rounds: int, seed: int, record_every: int = 1,
        progress: bool = False, path: str = "auto", state: State | None = None, x0: Any = None, **options: Any) -> RunResult:
    """Run ``method`` for ``rounds`` rounds in the single-process simulator.

    Parameters
    ----------
    problem, compressor : the problem (see :class:`permk.problems.Problem`) and the compressor.
    rounds : number of rounds ``T``; seed : the shared seed (coins, permutations), required.
    gamma : step; default ``gamma_multiplier ×`` the theorem's step (``pl=True``: the PL theorem's).
    constants : ``"exact"`` (the problem's ``L_minus, L_plus, L_pm``) or ``"pessimistic"``
        (``L_+² = L_±² = (1/n) Σ L_i²``, the paper's experiments).
    float_bits : bits per float for the communication count (32 as in the paper, or 64).
    record_every : record the metrics every this many rounds; progress : a tqdm bar.
    path : ``"auto"`` (the fastest the problem and compressor allow), ``"rust"``, ``"fused"`` or
        ``"dense"`` (see :mod:`permk.backends`).
    state : resume from a state (e.g. ``result.state``): the run continues its rounds exactly.
    x0 : the starting point (default ``problem.x0``).
    options : the method's own (MARINA: ``p``; EF21: ``count_indices``).
    """
    method, options = resolve(method, options)
    backend = Simulator(problem, path=path)
    n, d = check_problem(problem)
    params = setup(method, problem, compressor, n=n, d=d, rounds=rounds, seed=seed, record_every=record_every, **options)
    compressor = method.sent_compressor(compressor, params)
    params["path"] = method.exchange.path(backend, compressor)
    first = start(method, backend, compressor, params, check_start(method, problem, backend, state, x0, seed), seed)
    return drive(method, backend, compressor, params, first, rounds=rounds, record_every=record_every, progress=progress)


#: The method definitions (callable: they run in the simulator).
marina = Marina()
ef21 = EF21()
gd = GD()
dcgd = DCGD()
dcgd_shifted = ShiftedDCGD()
diana = Diana()
rand_diana = RandDiana()
dasha = Dasha()
dasha_page = DashaPage()
dasha_mvr = DashaMVR()
vr_marina = VRMarina()
marina_stochastic = StochasticMarina()
sgd = SGD()


def catalog() -> dict[str, Method]:
    """The method objects by name (``"marina"``, ``"ef21"``, …): the package's, then those
    registered from outside it (:func:`permk.register`, the ``permk.plugins`` entry points).
    What the experiments' ``--methods METHOD-COMPRESSOR`` resolves."""
    return METHODS.all()
