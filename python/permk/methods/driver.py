"""The one driver every method and every backend runs through.

:func:`run` runs a method in the single-process simulator; :mod:`permk.distributed` runs the same
method through the same pieces on MPI:

* :func:`prepare` validates a run (the compressor, the options, the method's own parameters) and
  :meth:`Prepared.with_step` then chooses its step — the user's ``gamma`` or the method's
  theorem's (:class:`permk.theory.MethodTheory`) — giving the run's :class:`RunParams`;
* :func:`check_start` and :func:`start` give the first state (a resumed one, or ``init``);
* :func:`drive` loops: update, record, stop on divergence.
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from .._validate import check_choice, check_flag, check_int, check_real, check_sample_counts, check_seed, start_point
from ..compressors import Compressor
from ..theory.steps import Constants, check_step
from ..transport import Backend, Simulator, check_problem
from .contract import Algorithm, MethodParams, RoundInfo, RunParams, State

__all__ = ["RunResult", "Prepared", "prepare", "setup", "resolve", "check_start", "start", "drive", "run",
           "full_gradient_calls", "RUN_OPTIONS"]

Array = np.ndarray

#: The options of a run, besides the method's own: what :func:`run` and
#: :func:`permk.distributed.run` take (the method's ``parameters`` takes the rest).
RUN_OPTIONS = ("gamma", "gamma_multiplier", "pl", "constants", "float_bits", "record_every", "progress", "path", "state", "x0")


@dataclass(frozen=True, eq=False)
class RunResult:
    """What a run returns. Per-round arrays are recorded at the rounds in ``rounds`` (every
    ``record_every`` rounds, plus the first and the last).

    Attributes
    ----------
    grad_norm_sq
        ``‖∇f(x^t)‖²``.
    f_gap
        ``f(x^t) − f*`` where the problem knows ``f_star``, else None.
    bits_per_worker
        The bits one worker has sent after round t, cumulative and actual (the largest message of
        each round); the initial exchange of ``∇f_i(x^0)`` is not counted, as in the paper.
    expected_bits_per_worker
        The same in expectation over the coins.
    oracle_calls
        The gradient-oracle calls (sample gradients) after round t: each round's count for its
        busiest worker, summed (cumulative; :class:`~permk.methods.RoundInfo` defines a round's
        count: a full local gradient is ``max_i m_i`` calls, a minibatch gradient ``b``, a
        gradient kept from an earlier round is not counted again; the start's gradients are not
        counted).
    coins
        MARINA's coin of every round run (True: full gradients); None for methods without one.
    x
        The last iterate.
    x_hat
        ``x̂^T``, drawn uniformly from ``x^0 … x^{T−1}`` (the point the theorems bound).
    params
        The run's :class:`~permk.methods.RunParams` (the step and where it came from, the method's
        own parameters in ``params.own``, the constants, the path); ``params.record()`` as a dict.
    diverged_at
        The round at which the iterate became non-finite (the run stopped there), else None.
    state
        The final state, to resume with ``state=``.
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
    params: RunParams[Any]
    wall_time: float
    diverged_at: int | None
    state: State = field(repr=False)


def full_gradient_calls(problem: Any) -> float:
    """The oracle calls of one full local gradient (:class:`RoundInfo`): the largest ``m_i`` of a
    finite-sum problem (``sample_counts``), else 1."""
    counts = getattr(problem, "sample_counts", None)
    return 1.0 if counts is None else float(np.max(check_sample_counts(counts, int(problem.n))))


def _check_method(method: Any) -> None:
    if not isinstance(method, Algorithm):
        raise TypeError(f"method must be a permk Method (permk.marina, permk.ef21, ...), got {type(method).__name__}")


@dataclass(frozen=True)
class Prepared:
    """A validated run before its step is chosen (:func:`prepare`): the method, its own
    parameters, the user's compressor and the one its messages are made with (``sent``), and the
    run's settings."""

    method: Algorithm
    own: MethodParams
    compressor: Compressor
    sent: Compressor
    n: int
    d: int
    seed: int
    float_bits: int
    oracle_full: float
    gamma: float | None
    gamma_multiplier: float
    pl: bool
    constants: str

    def record(self) -> dict[str, Any]:
        """What the run is, as plain values, without its step (the user's ``gamma`` or None):
        what every MPI rank must agree on."""
        return {"method": self.method.name, "compressor": self.compressor.name, "n": self.n, "d": self.d, "seed": self.seed,
                "oracle": {"full": self.oracle_full}, **self.own.record(), "gamma": self.gamma,
                "gamma_multiplier": self.gamma_multiplier, "pl": self.pl, "constants": self.constants, "float_bits": self.float_bits}

    def with_step(self, problem: Any) -> RunParams[Any]:
        """The run's parameters with its step: the user's ``gamma``, or the method's theorem's
        from the problem's constants (:class:`~permk.theory.steps.Constants`, read only then),
        times ``gamma_multiplier``. A step that is not a finite positive number (constants too
        small or too large for float64, or a product that overflows) is a ValueError naming what
        it came from (``permk.theory.steps.check_step``)."""
        if self.gamma is not None:
            source, record = "user", {}
            gamma = check_step(self.gamma * self.gamma_multiplier, "gamma times gamma_multiplier",
                               {"gamma": self.gamma, "gamma_multiplier": self.gamma_multiplier},
                               "choose gamma and gamma_multiplier whose product is a finite positive float64")
        else:
            theory = self.method.theory
            if theory is None:
                raise ValueError(f"{self.method.label} has no theory step in permk: pass gamma=")
            c = Constants.of(problem, self.constants, pl=self.pl, n=self.n)
            g, source = theory.step(self.compressor, self.n, self.d, self.own, c, problem=problem)
            record = c.record()
            gamma = check_step(self.gamma_multiplier * g, f"{self.method.label}'s step ({source}) times gamma_multiplier",
                               {**record, "step": g, "gamma_multiplier": self.gamma_multiplier})
        return RunParams(method=self.method.name, compressor=self.compressor.name, n=self.n, d=self.d, seed=self.seed,
                         float_bits=self.float_bits, oracle_full=self.oracle_full, gamma=gamma, gamma_source=source,
                         gamma_multiplier=self.gamma_multiplier, pl=self.pl, own=self.own, constants=record)


def prepare(method: Algorithm, problem: Any, compressor: Compressor, *, n: int, d: int, rounds: int, seed: int,
            gamma: Any = None, gamma_multiplier: Any = 1.0, pl: Any = False, constants: str = "exact",
            float_bits: Any = 32, record_every: Any = 1, **options: Any) -> Prepared:
    """Validate a run and choose the method's own parameters (:meth:`~permk.methods.Method.parameters`, which
    receives ``options`` and the ``problem``): every argument is checked before anything runs, and
    an option the method does not take is a TypeError naming it."""
    _check_method(method)
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
    pl = check_flag(pl, "pl")
    check_choice(constants, "constants", ("exact", "pessimistic"))
    signature = inspect.signature(method.parameters)
    try:  # an option the method does not have (its own checks of a value raise as they are)
        signature.bind(compressor, n, d, float_bits=float_bits, problem=problem, **options)
    except TypeError as e:
        unknown = [k for k in options if k not in signature.parameters] or list(options)
        raise TypeError(f"{method!r} does not take these options ({', '.join(unknown)}): {e} "
                        f"(a run's own options: {', '.join(RUN_OPTIONS)})") from None
    own = method.parameters(compressor, n, d, float_bits=float_bits, problem=problem, **options)
    if not isinstance(own, MethodParams):
        raise TypeError(f"{type(method).__name__}.parameters must return a permk.methods.MethodParams (with the bits a "
                        f"worker sends per round), got {type(own).__name__}")
    return Prepared(method=method, own=own, compressor=compressor, sent=method.sent_compressor(compressor, own), n=n, d=d, seed=seed,
                    float_bits=float_bits, oracle_full=full_gradient_calls(problem), gamma=gamma,
                    gamma_multiplier=gamma_multiplier, pl=pl, constants=constants)


def setup(method: Algorithm, problem: Any, compressor: Compressor, **kwargs: Any) -> RunParams[Any]:
    """:func:`prepare` then :meth:`Prepared.with_step`: the parameters of a run (the arguments of
    :func:`prepare`)."""
    return prepare(method, problem, compressor, **kwargs).with_step(problem)


def resolve(method: Algorithm, options: dict[str, Any]) -> tuple[Algorithm, dict[str, Any]]:
    """The method a run of ``method`` with ``options`` is, and its remaining options
    (:meth:`~permk.methods.Method.resolve`: DASHA's ``estimator``)."""
    _check_method(method)
    return method.resolve(options)


#: The last round a run can reach: its record holds the rounds as int64.
_LAST_ROUND = 2**63 - 1


def check_start(method: Algorithm, problem: Any, backend: Backend, state: Any, x0: Any, seed: int,
                rounds: int | None = None) -> State | Array:
    """What a run starts from, checked before any exchange: the starting point ``x0`` (default
    ``problem.x0``), or the given ``state`` to resume (of the method's kind, with the run's seed)
    as the backend holds it (:meth:`State.held_by`). Refused: a state whose ``round`` is not a
    non-negative integer, or from which ``rounds`` more rounds would pass round ``2**63 - 1``
    (the last a run's record holds: int64), naming it (TypeError for a non-integer round)."""
    seed = check_seed(seed)
    if state is None:
        return start_point(problem.x0 if x0 is None else x0, backend.d, "problem.x0" if x0 is None else "x0")
    if not isinstance(state, method.state_type):
        raise TypeError(f"state must be a {method.state_type.__name__} (e.g. result.state of an earlier run of the same method)")
    if state.seed != seed:
        raise ValueError(f"seed={seed} differs from the resumed state's seed {state.seed}")
    if rounds is not None and check_int(state.round, "state.round") + rounds > _LAST_ROUND:
        raise ValueError(f"the resumed state is at round {state.round}: {rounds} more rounds would pass round 2**63 - 1, "
                         "the last a run's record holds")
    return state.held_by(backend)


def start(method: Algorithm, backend: Backend, compressor: Compressor, params: RunParams[Any], begin: State | Array,
          seed: int) -> State:
    """The run's first state from what :func:`check_start` returned: the resumed state (whose
    per-worker rows must be in the run's ``shift_dtype``, where the method has one), or
    ``method.init`` at the starting point (its exchanges)."""
    if isinstance(begin, State):
        want = getattr(params.own, "shift_dtype", None)
        for name in begin.per_worker_arrays() if want is not None else ():
            got = np.asarray(getattr(begin, name)).dtype
            if got != np.dtype(want):
                raise ValueError(f"the resumed state's {name} is {got} and this run keeps its per-worker rows in {want}: "
                                 f"pass shift_dtype={got.name!r} to continue it")
        return begin
    return method.init(begin, backend, compressor, params, seed=check_seed(seed))


def drive(method: Algorithm, backend: Backend, compressor: Compressor, params: RunParams[Any], state: State, *,
          rounds: int, record_every: int, progress: bool = False,
          on_round: Callable[[RoundInfo], None] | None = None) -> RunResult:
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
    expected_round = params.bits.expected
    rec_t: list[int] = []
    rec_g: list[float] = []
    rec_f: list[float] = []
    rec_b: list[float] = []
    rec_e: list[float] = []
    rec_o: list[float] = []
    coins: list[bool] = []
    carries = "oracle_calls" in state.field_names()
    calls = float(state.oracle_calls) if carries else 0.0  # type: ignore[attr-defined]
    full_calls = params.oracle_full
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


def run(method: Algorithm, problem: Any, compressor: Compressor, *, rounds: int, seed: int, record_every: int = 1,
        progress: bool = False, path: str = "auto", state: State | None = None, x0: Any = None, **options: Any) -> RunResult:
    """Run ``method`` for ``rounds`` rounds in the single-process simulator.

    Parameters
    ----------
    method
        A method object (``permk.marina``, ``permk.ef21``, ...).
    problem
        The problem (see :class:`permk.problems.Problem`).
    compressor
        The compressor (see :class:`permk.compressors.Compressor`); ``permk.Identity()`` for
        uncompressed messages.
    rounds
        The number of rounds ``T``.
    seed
        The shared seed (coins, permutations), required.
    gamma
        The step; default ``gamma_multiplier ×`` the theorem's step (``pl=True``: the PL
        theorem's).
    constants
        ``"exact"`` (the problem's ``L_minus, L_plus, L_pm``) or ``"pessimistic"``
        (``L_+² = L_±² = (1/n) Σ L_i²``, the paper's experiments).
    float_bits
        Bits per float for the communication count: 32 as in the paper, or 64.
    record_every
        Record the metrics every this many rounds.
    progress
        Show a tqdm bar.
    path
        ``"auto"`` (the fastest the problem and compressor allow), ``"rust"``, ``"fused"`` or
        ``"dense"`` (see :mod:`permk.exchanges`).
    state
        Resume from a state (e.g. ``result.state``): the run continues its rounds exactly.
    x0
        The starting point (default ``problem.x0``).
    options
        The method's own (MARINA: ``p``; EF21: ``count_indices``); any other keyword is a
        TypeError naming it.
    """
    method, options = resolve(method, options)
    backend = Simulator(problem, path=path)
    n, d = check_problem(problem)
    prepared = prepare(method, problem, compressor, n=n, d=d, rounds=rounds, seed=seed, record_every=record_every, **options)
    params = replace(prepared.with_step(problem), path=method.path(backend, prepared.sent, prepared.own))
    first = start(method, backend, prepared.sent, params, check_start(method, problem, backend, state, x0, seed, rounds), seed)
    return drive(method, backend, prepared.sent, params, first, rounds=rounds, record_every=record_every, progress=progress)
