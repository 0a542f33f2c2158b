"""MARINA, EF21 and GD with the paper's theoretical step sizes.

Each method is a pure ``init``/``update`` pair over an explicit, serialisable state (in the
spirit of optax): :func:`marina_update` takes the communication as two callables, so the
single-process simulator below and the MPI backend (:mod:`permk.distributed`) run the same
step. The drivers :func:`marina`, :func:`ef21` and :func:`gd` choose the theory's parameters,
run the rounds, record per-round metrics and return a :class:`RunResult`.

>>> import permk
>>> q = permk.Quadratic.synthetic(n=10, d=100, lam=1e-3, noise_scale=0.0, seed=0)
>>> res = permk.marina(q, permk.PermK(), rounds=200, seed=1)
>>> bool(res.grad_norm_sq[-1] < 1e-2 * res.grad_norm_sq[0])
True
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal

import numpy as np

from . import _core
from ._validate import check_int, check_seed
from .compressors import Compressor, Identity, TopK
from .problems import Problem, SyntheticQuadratic

__all__ = [
    "MarinaState",
    "EF21State",
    "RunResult",
    "marina_init",
    "marina_update",
    "ef21_init",
    "ef21_update",
    "marina_stepsize",
    "ef21_stepsize",
    "marina",
    "ef21",
    "gd",
    "save_state",
    "load_state",
]

Array = np.ndarray


# ---------------------------------------------------------------------------------------------
# states and steps
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MarinaState:
    """MARINA's state after ``round`` rounds: iterate ``x = x^t``, estimator ``g = g^t``, the
    shared ``seed``, and the bits one worker has sent so far (``bits``)."""

    x: Array
    g: Array
    round: int
    seed: int
    bits: float = 0.0


@dataclass(frozen=True)
class EF21State:
    """EF21's state: ``x = x^t``, ``g = g^t = (1/n) Σ g_i^t`` and the local estimators
    ``G = [g_i^t]`` held by this process (all ``n`` in simulation)."""

    x: Array
    g: Array
    G: Array
    round: int
    seed: int
    bits: float = 0.0


def save_state(state: MarinaState | EF21State, path: Any) -> None:
    """Write a state to an ``.npz`` file (see :func:`load_state`)."""
    fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    np.savez(path, __kind__=type(state).__name__, **fields)


def load_state(path: Any) -> MarinaState | EF21State:
    """Read a state written by :func:`save_state`."""
    with np.load(path, allow_pickle=False) as z:
        kind = str(z["__kind__"])
        cls = {"MarinaState": MarinaState, "EF21State": EF21State}.get(kind)
        if cls is None:
            raise ValueError(f"{path} does not hold a permk state")
        vals: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            v = z[f.name]
            vals[f.name] = v.copy() if v.ndim else v.item()
        return cls(**vals)


def marina_init(x0: Array, g0: Array, *, seed: int) -> MarinaState:
    """MARINA's initial state: ``x^0`` and ``g^0 = ∇f(x^0)`` (line 2 of Algorithm "MARINA")."""
    return MarinaState(x=np.array(x0, dtype=np.float64), g=np.array(g0, dtype=np.float64), round=0, seed=check_seed(seed))


def marina_update(
    state: MarinaState,
    *,
    gamma: float,
    p: float,
    full_mean: Callable[[Array], Array],
    compressed_mean: Callable[[Array, Array, int], Array],
) -> tuple[MarinaState, bool]:
    """One round of Algorithm "MARINA".

    ``x^{t+1} = x^t − γ g^t``; the shared coin ``θ_t ~ Be(p)`` is a pure function of
    ``(seed, t)``; on heads ``g^{t+1} = full_mean(x^{t+1}) = (1/n) Σ ∇f_i(x^{t+1})``, on tails
    ``g^{t+1} = g^t + compressed_mean(x^{t+1}, x^t, t) = g^t + (1/n) Σ C_i(∇f_i(x^{t+1}) − ∇f_i(x^t))``.
    Returns the new state and the coin (``bits`` is left to the caller).
    """
    x_new = state.x - gamma * state.g
    heads = bool(_core.coin(state.seed, state.round, p))
    g_new = full_mean(x_new) if heads else state.g + compressed_mean(x_new, state.x, state.round)
    return replace(state, x=x_new, g=g_new, round=state.round + 1), heads


def ef21_init(x0: Array, local_grads: Array, *, seed: int) -> EF21State:
    """EF21's initial state: ``g_i^0 = ∇f_i(x^0)`` (``local_grads``, the rows this process holds)."""
    G = np.array(local_grads, dtype=np.float64)
    return EF21State(x=np.array(x0, dtype=np.float64), g=G.mean(axis=0), G=G, round=0, seed=check_seed(seed))


def ef21_update(
    state: EF21State,
    *,
    gamma: float,
    local_grads: Callable[[Array], Array],
    compress_rows: Callable[[Array, int], Array],
    mean: Callable[[Array], Array],
) -> EF21State:
    """One round of EF21: ``x^{t+1} = x^t − γ g^t``; every worker sends
    ``c_i = C(∇f_i(x^{t+1}) − g_i^t)`` and sets ``g_i^{t+1} = g_i^t + c_i``;
    ``g^{t+1} = g^t + mean(c)``. ``compress_rows(D, t)`` compresses the held rows,
    ``mean(C)`` is ``(1/n) Σ_i c_i`` over all workers."""
    x_new = state.x - gamma * state.g
    C = compress_rows(local_grads(x_new) - state.G, state.round)
    return replace(state, x=x_new, g=state.g + mean(C), G=state.G + C, round=state.round + 1)


# ---------------------------------------------------------------------------------------------
# step sizes
# ---------------------------------------------------------------------------------------------
def marina_stepsize(
    A: float, B: float, L_minus: float, L_plus: float, L_pm: float, p: float, *, mu: float | None = None
) -> float:
    """The largest step of Theorem "AB": ``1/M``, ``M = L_− + sqrt((1−p)/p ((A−B)L_+² + B L_±²))``;
    with ``mu`` the step of Theorem "AB-PL": ``min{1/(L_− + sqrt(2(1−p)/p (…))), p/(2μ)}``.

    >>> marina_stepsize(1.0, 1.0, 1.0, 2.0, 0.0, 0.1)
    1.0
    """
    if not 0 < p <= 1:
        raise ValueError(f"p must be in (0, 1], got {p}")
    var = max((A - B) * L_plus**2 + B * L_pm**2, 0.0)
    factor = 2.0 if mu is not None else 1.0
    M = L_minus + math.sqrt(factor * (1 - p) / p * var)
    if M <= 0:
        raise ValueError("the smoothness constants give M = 0: f is constant")
    return min(1.0 / M, p / (2 * mu)) if mu is not None else 1.0 / M


def ef21_stepsize(alpha: float, L_minus: float, L_plus: float, *, mu: float | None = None) -> float:
    """EF21's step (Theorem in "EF21 Analysis"): ``1/(L_− + L_+ sqrt(β/θ))`` with
    ``θ = 1 − sqrt(1 − α)``, ``β = (1 − α)/(1 − sqrt(1 − α))``; with ``mu`` (PL):
    ``min{1/(L_− + L_+ sqrt(2β/θ)), θ/(2μ)}``.

    >>> round(ef21_stepsize(1.0, 2.0, 3.0), 12)
    0.5
    """
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    theta = 1 - math.sqrt(1 - alpha)
    beta = (1 - alpha) / theta
    factor = 2.0 if mu is not None else 1.0
    g = 1.0 / (L_minus + L_plus * math.sqrt(factor * beta / theta))
    return min(g, theta / (2 * mu)) if mu is not None else g


# ---------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
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
    coins : MARINA's coin of every round run (True = full gradients); None for EF21.
    x, x_hat : the last iterate and ``x̂^T``, drawn uniformly from ``x^0 … x^{T−1}`` (the point the
        theorems bound).
    params : the parameters used (step, p, A, B, constants and where they came from).
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
    coins: Array | None
    x: Array
    x_hat: Array
    params: dict[str, Any]
    wall_time: float
    diverged_at: int | None
    state: MarinaState | EF21State = field(repr=False)


# ---------------------------------------------------------------------------------------------
# the simulator
# ---------------------------------------------------------------------------------------------
Path = Literal["auto", "rust", "fused", "dense"]


def _check_compressor(problem: Problem, compressor: Compressor) -> tuple[int, int]:
    n, d = int(problem.n), int(problem.d)
    if not isinstance(compressor, Compressor):
        raise TypeError(f"compressor must be a permk.Compressor, got {type(compressor).__name__}")
    try:
        compressor.check(n, d)
    except ValueError as e:
        raise ValueError(f"the compressor does not fit the problem (n={n}, d={d}): {e}") from None
    return n, d


def _constants(problem: Problem, constants: str) -> dict[str, float]:
    """``L_−, L_+, L_±`` (and ``μ`` when known) from the problem: ``exact`` or the paper's
    ``pessimistic`` choice ``L_+² = L_±² = (1/n) Σ L_i²`` (appendix "Experiments setup")."""
    if constants not in ("exact", "pessimistic"):
        raise ValueError(f"constants must be 'exact' or 'pessimistic', got {constants!r}")
    try:
        c = {"L_minus": float(problem.L_minus), "L_plus": float(problem.L_plus), "L_pm": float(problem.L_pm)}  # type: ignore[attr-defined]
        if constants == "pessimistic":
            bound = math.sqrt(float(np.mean(np.asarray(problem.L_i, dtype=np.float64) ** 2)))  # type: ignore[attr-defined]
            c["L_plus"] = c["L_pm"] = bound
    except AttributeError:
        raise ValueError(
            "the problem does not provide its smoothness constants (L_minus, L_plus, L_pm"
            + (", L_i" if constants == "pessimistic" else "")
            + "): pass gamma= explicitly, or estimate them with permk.theory.smoothness"
        ) from None
    mu = getattr(problem, "mu", None)
    if mu is not None:
        c["mu"] = float(mu)
    return c


def _check_run_args(rounds: int, record_every: int, gamma: float | None, gamma_multiplier: float) -> None:
    check_int(rounds, "rounds", low=1)
    check_int(record_every, "record_every", low=1)
    if gamma is not None and not (math.isfinite(gamma) and gamma > 0):
        raise ValueError(f"gamma must be positive and finite, got {gamma}")
    if not (math.isfinite(gamma_multiplier) and gamma_multiplier > 0):
        raise ValueError(f"gamma_multiplier must be positive and finite, got {gamma_multiplier}")


def _record_rounds(start: int, rounds: int, every: int) -> set[int]:
    return set(range(start, start + rounds + 1, every)) | {start + rounds}


def _drive(
    *,
    method: str,
    problem: Problem,
    compressor: Compressor,
    state: Any,
    step: Callable[[Any], tuple[Any, bool | None]],
    round_bits: Callable[[bool | None], float],
    expected_round_bits: float,
    rounds: int,
    record_every: int,
    progress: bool,
    params: dict[str, Any],
) -> RunResult:
    """The loop shared by every method: step, count bits, record, stop on divergence."""
    t_start = time.perf_counter()
    start = state.round
    record_at = _record_rounds(start, rounds, record_every)
    f_star = getattr(problem, "f_star", None)
    rec_t: list[int] = []
    rec_g: list[float] = []
    rec_f: list[float] = []
    rec_b: list[float] = []
    rec_e: list[float] = []
    coins: list[bool] = []
    hat_at = start + int(np.random.default_rng([state.seed, start, 0x78686174]).integers(rounds))
    x_hat = state.x
    expected0 = state.bits

    def record(s: Any) -> bool:
        """Append the metrics of ``s``; False (nothing appended) if they are not finite."""
        with np.errstate(over="ignore", invalid="ignore"):
            gr = np.asarray(problem.grad(s.x))
            gn = float(gr @ gr)
            gap = float(problem.loss(s.x)) - f_star if f_star is not None else 0.0
        if not (math.isfinite(gn) and math.isfinite(gap)):
            return False
        rec_t.append(s.round)
        rec_g.append(gn)
        if f_star is not None:
            rec_f.append(gap)
        rec_b.append(s.bits)
        rec_e.append(expected0 + (s.round - start) * expected_round_bits)
        return True

    if not record(state):
        raise ValueError("the metrics at the starting point are not finite")
    diverged_at = None
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=rounds, desc=f"{method}+{compressor.name}", leave=False)
    for _ in range(rounds):
        if state.round == hat_at:
            x_hat = state.x
        state, coin = step(state)
        state = replace(state, bits=state.bits + round_bits(coin))
        if coin is not None:
            coins.append(coin)
        finite = bool(np.isfinite(state.x).all() and np.isfinite(state.g).all())
        if not finite or (state.round in record_at and not record(state)):
            diverged_at = state.round
            break
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return RunResult(
        method=method,
        compressor=compressor.name,
        rounds=np.array(rec_t, dtype=np.int64),
        grad_norm_sq=np.array(rec_g),
        f_gap=np.array(rec_f) if f_star is not None else None,
        bits_per_worker=np.array(rec_b),
        expected_bits_per_worker=np.array(rec_e),
        coins=np.array(coins, dtype=bool) if method != "ef21" else None,
        x=state.x,
        x_hat=x_hat,
        params=params,
        wall_time=time.perf_counter() - t_start,
        diverged_at=diverged_at,
        state=state,
    )


def _simulated_marina_step(
    problem: Problem, compressor: Compressor, *, gamma: float, p: float, path: Path, seed: int
) -> tuple[Callable[[MarinaState], tuple[MarinaState, bool]], str]:
    """The single-process MARINA round for ``path``, and the path actually used."""
    n, d = int(problem.n), int(problem.d)
    plan_ok = compressor.shares_coordinates
    if path == "auto":
        if plan_ok and isinstance(problem, SyntheticQuadratic):
            path = "rust"
        elif plan_ok and hasattr(problem, "local_grad_coords"):
            path = "fused"
        else:
            path = "dense"
    if path in ("rust", "fused") and not plan_ok:
        raise ValueError(f"path={path!r} needs a sparsifier whose coordinates are shared (PermK, RandK, BlockPermK), got {compressor.name}")
    if path == "rust":
        if not isinstance(problem, SyntheticQuadratic):
            raise ValueError("path='rust' is only available for Quadratic.synthetic problems")
        spec = compressor._spec  # type: ignore[attr-defined]

        def rust_step(s: MarinaState) -> tuple[MarinaState, bool]:
            x, g = s.x.copy(), s.g.copy()
            heads = problem.marina_round(spec, x, g, gamma, p, s.seed, s.round)
            return replace(s, x=x, g=g, round=s.round + 1), heads

        return rust_step, path

    if path == "fused":
        if not hasattr(problem, "local_grad_coords"):
            raise ValueError("path='fused' needs a problem with local_grad_coords(x, rows, cols)")
        coords = problem.local_grad_coords  # type: ignore[attr-defined]

        def compressed_mean(x_new: Array, x_old: Array, t: int) -> Array:
            plan = compressor.plan(n, d, seed=seed, round=t)
            assert plan is not None
            rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(plan.offsets))
            vals = (np.asarray(coords(x_new, rows, plan.coords)) - np.asarray(coords(x_old, rows, plan.coords))) * plan.scales[rows]
            return np.bincount(plan.coords, weights=vals, minlength=d) / n

    elif path == "dense":
        cache: dict[str, Any] = {}

        def local(x: Array) -> Array:
            if cache.get("x") is x:
                return cache["grads"]
            return np.asarray(problem.local_grads(x), dtype=np.float64)

        def compressed_mean(x_new: Array, x_old: Array, t: int) -> Array:
            new = local(x_new)
            diff = new - local(x_old)
            cache.update(x=x_new, grads=new)
            return compressor.aggregate(diff, seed=seed, round=t)

    else:
        raise ValueError(f"path must be 'auto', 'rust', 'fused' or 'dense', got {path!r}")

    def step(s: MarinaState) -> tuple[MarinaState, bool]:
        return marina_update(s, gamma=gamma, p=p, full_mean=lambda x: np.asarray(problem.grad(x), dtype=np.float64), compressed_mean=compressed_mean)

    return step, path


def _set_gamma(
    params: dict[str, Any],
    problem: Problem,
    gamma: float | None,
    gamma_multiplier: float,
    pl: bool,
    constants: str,
    source: str,
    theory: Callable[[dict[str, float], float | None], float],
) -> None:
    """``params["gamma"]``: the user's ``gamma`` or the theory's step from the problem's
    constants (``theory(constants, mu)``, ``mu`` only with ``pl``), times ``gamma_multiplier``."""
    if gamma is not None:
        params.update(gamma_source="user", gamma=gamma * gamma_multiplier)
        return
    c = _constants(problem, constants)
    mu = c.get("mu") if pl else None
    if pl and mu is None:
        raise ValueError("pl=True needs the problem's PL constant mu")
    params.update(c, constants=constants, gamma_source=source, gamma=gamma_multiplier * theory(c, mu))


def _check_resume(state: Any, cls: type[MarinaState] | type[EF21State], seed: int) -> None:
    """A state to resume must be of the method's kind and carry the run's seed."""
    if not isinstance(state, cls):
        raise TypeError(f"state must be a {cls.__name__} (e.g. result.state of an earlier run of the same method)")
    if state.seed != check_seed(seed):
        raise ValueError(f"seed={seed} differs from the resumed state's seed {state.seed}")


def _marina_params(
    problem: Problem,
    compressor: Compressor,
    *,
    rounds: int,
    seed: int,
    gamma: float | None,
    p: float | None,
    gamma_multiplier: float,
    pl: bool,
    constants: str,
    float_bits: int,
    record_every: int,
    method: str,
) -> dict[str, Any]:
    """Validate a MARINA run and choose its parameters (p = ζ/d, the step of Theorem AB or
    AB-PL); shared by the simulator and the MPI backend."""
    n, d = _check_compressor(problem, compressor)
    _check_run_args(rounds, record_every, gamma, gamma_multiplier)
    check_int(float_bits, "float_bits", low=1)
    check_seed(seed)
    ab = compressor.ab_constants(n, d)
    if ab is None or not compressor.is_unbiased:
        raise ValueError(f"MARINA needs an unbiased compressor with AB constants; {compressor.name} has none (use ef21 for TopK)")
    A, B = ab
    if p is None:
        p = min(1.0, compressor.bits_per_worker(n, d, float_bits=float_bits) / (d * float_bits))
    if not (isinstance(p, (int, float)) and 0 < p <= 1):
        raise ValueError(f"p must be in (0, 1], got {p}")
    p = float(p)
    params: dict[str, Any] = {"method": method, "compressor": compressor.name, "n": n, "d": d, "p": p, "A": A, "B": B,
                              "gamma_multiplier": gamma_multiplier, "pl": pl, "float_bits": float_bits, "seed": seed}
    _set_gamma(params, problem, gamma, gamma_multiplier, pl, constants, "Theorem AB-PL" if pl else "Theorem AB",
               lambda c, mu: marina_stepsize(A, B, c["L_minus"], c["L_plus"], c["L_pm"], p, mu=mu))
    return params


def _ef21_params(
    problem: Problem,
    compressor: Compressor,
    *,
    rounds: int,
    seed: int,
    gamma: float | None,
    gamma_multiplier: float,
    pl: bool,
    constants: str,
    float_bits: int,
    record_every: int,
) -> dict[str, Any]:
    """Validate an EF21 run and choose its step; shared by the simulator and the MPI backend."""
    n, d = _check_compressor(problem, compressor)
    _check_run_args(rounds, record_every, gamma, gamma_multiplier)
    check_int(float_bits, "float_bits", low=1)
    check_seed(seed)
    alpha = compressor.alpha(d)
    if alpha is None:
        raise ValueError(f"EF21 needs a contractive compressor (alpha); {compressor.name} has none")
    params: dict[str, Any] = {"method": "ef21", "compressor": compressor.name, "n": n, "d": d, "alpha": alpha,
                              "gamma_multiplier": gamma_multiplier, "pl": pl, "float_bits": float_bits, "seed": seed}
    _set_gamma(params, problem, gamma, gamma_multiplier, pl, constants, "EF21 PL theorem" if pl else "EF21 theorem",
               lambda c, mu: ef21_stepsize(alpha, c["L_minus"], c["L_plus"], mu=mu))
    return params


def marina_round_bits(compressor: Compressor, n: int, d: int, p: float, float_bits: int) -> tuple[float, float, float]:
    """Bits one worker sends in a MARINA round: ``(full round, compressed round, expected)``,
    the expectation being ``p·d·float_bits + (1 − p)·E[message bits]``."""
    full = float(d * float_bits)
    expected = p * full + (1 - p) * compressor.expected_bits_per_worker(n, d, float_bits=float_bits)
    return full, float(compressor.bits_per_worker(n, d, float_bits=float_bits)), expected


def _simulated_ef21_step(
    problem: Problem, compressor: Compressor, *, gamma: float
) -> tuple[Callable[[EF21State], tuple[EF21State, None]], str]:
    """The single-process EF21 round and its path: on the synthetic quadratic with TopK one Rust
    call (local gradients row by row, ``G`` updated in place: the same iterates bit for bit),
    otherwise :func:`ef21_update` on all local gradients."""
    n = int(problem.n)
    if isinstance(problem, SyntheticQuadratic) and type(compressor) is TopK:
        own: dict[str, Array] = {}  # G is copied once per run, so the caller's state is never mutated

        def rust_step(s: EF21State) -> tuple[EF21State, None]:
            if own.get("G") is not s.G:
                own["G"] = np.array(s.G, dtype=np.float64, order="C")
            x, g = s.x.copy(), s.g.copy()
            problem._kernel.ef21_topk_round(x, g, own["G"], gamma, compressor.k)
            return replace(s, x=x, g=g, G=own["G"], round=s.round + 1), None

        return rust_step, "rust"

    def step(s: EF21State) -> tuple[EF21State, None]:
        new = ef21_update(s, gamma=gamma, local_grads=problem.local_grads,
                          compress_rows=lambda D, t: compressor.compress_all(D, seed=s.seed, round=t),
                          mean=lambda C: C.sum(axis=0) / n)
        return new, None

    return step, "dense"


def marina(
    problem: Problem,
    compressor: Compressor,
    *,
    rounds: int,
    seed: int,
    gamma: float | None = None,
    p: float | None = None,
    gamma_multiplier: float = 1.0,
    pl: bool = False,
    constants: str = "exact",
    float_bits: int = 32,
    record_every: int = 1,
    progress: bool = False,
    path: Path = "auto",
    state: MarinaState | None = None,
    x0: Array | None = None,
    _method: str = "marina",
) -> RunResult:
    """Run Algorithm "MARINA" for ``rounds`` rounds.

    Parameters
    ----------
    problem, compressor : the problem (see :class:`permk.problems.Problem`) and an unbiased
        compressor with AB constants (PermK, RandK, BlockPermK, quantizers, compositions, Identity).
    rounds : number of rounds ``T``; seed : the shared seed (coins, permutations).
    p : probability of a full-gradient round; default ``ζ/d`` with ``ζ`` the message size.
    gamma : step; default ``gamma_multiplier / M`` of Theorem "AB" (``pl=True``: Theorem "AB-PL").
    constants : ``"exact"`` (the problem's ``L_minus, L_plus, L_pm``) or ``"pessimistic"``
        (``L_+² = L_±² = (1/n) Σ L_i²``, the paper's experiments).
    float_bits : bits per float for the communication count (32 as in the paper, or 64).
    path : ``"rust"`` (synthetic quadratic: one Rust call per round), ``"fused"`` (only the sent
        coordinates are evaluated via ``local_grad_coords``: ``O(d)`` per round), ``"dense"``
        (all local gradients, then ``compressor.aggregate``) or ``"auto"`` (the fastest available).
    state : resume from a state (e.g. ``result.state``); the run continues its rounds exactly.
    """
    params = _marina_params(problem, compressor, rounds=rounds, seed=seed, gamma=gamma, p=p, gamma_multiplier=gamma_multiplier,
                            pl=pl, constants=constants, float_bits=float_bits, record_every=record_every, method=_method)
    n, d, gamma, p = params["n"], params["d"], params["gamma"], params["p"]
    if state is None:
        x_init = problem.x0 if x0 is None else x0
        state = marina_init(x_init, problem.grad(np.asarray(x_init, dtype=np.float64)), seed=seed)
    else:
        _check_resume(state, MarinaState, seed)
    step, used = _simulated_marina_step(problem, compressor, gamma=gamma, p=p, path=path, seed=state.seed)
    params["path"] = used
    full_bits, tail_bits, expected = marina_round_bits(compressor, n, d, p, float_bits)
    return _drive(method=_method, problem=problem, compressor=compressor, state=state, step=step,
                  round_bits=lambda heads: full_bits if heads else tail_bits, expected_round_bits=expected,
                  rounds=rounds, record_every=record_every, progress=progress, params=params)


def gd(
    problem: Problem,
    *,
    rounds: int,
    seed: int = 0,
    gamma: float | None = None,
    gamma_multiplier: float = 1.0,
    pl: bool = False,
    float_bits: int = 32,
    record_every: int = 1,
    progress: bool = False,
    state: MarinaState | None = None,
    x0: Array | None = None,
) -> RunResult:
    """Gradient descent, the uncompressed baseline: MARINA with ``p = 1`` and no compression,
    whose Theorem "AB" step is ``1/L_−`` (times ``gamma_multiplier``)."""
    return marina(problem, Identity(), rounds=rounds, seed=seed, gamma=gamma, p=1.0, gamma_multiplier=gamma_multiplier,
                  pl=pl, float_bits=float_bits, record_every=record_every, progress=progress, path="dense",
                  state=state, x0=x0, _method="gd")


def ef21(
    problem: Problem,
    compressor: Compressor,
    *,
    rounds: int,
    seed: int = 0,
    gamma: float | None = None,
    gamma_multiplier: float = 1.0,
    pl: bool = False,
    constants: str = "exact",
    float_bits: int = 32,
    count_indices: bool = True,
    record_every: int = 1,
    progress: bool = False,
    state: EF21State | None = None,
    x0: Array | None = None,
) -> RunResult:
    """Run EF21 (appendix "EF21 Analysis") with a contractive compressor (TopK).

    ``g_i^0 = ∇f_i(x^0)``; step ``1/(L_− + L_+ sqrt(β/θ))`` (``pl=True``: the PL step), see
    :func:`ef21_stepsize`. Bits count the TopK indices (``⌈log2 d⌉`` each) unless
    ``count_indices=False``.
    """
    params = _ef21_params(problem, compressor, rounds=rounds, seed=seed, gamma=gamma, gamma_multiplier=gamma_multiplier,
                          pl=pl, constants=constants, float_bits=float_bits, record_every=record_every)
    n, d, gamma = params["n"], params["d"], params["gamma"]
    if state is None:
        x_init = np.asarray(problem.x0 if x0 is None else x0, dtype=np.float64)
        state = ef21_init(x_init, problem.local_grads(x_init), seed=seed)
    else:
        _check_resume(state, EF21State, seed)

    step, params["path"] = _simulated_ef21_step(problem, compressor, gamma=gamma)

    bits = float(compressor.bits_per_worker(n, d, float_bits=float_bits, indices=count_indices))
    expected = compressor.expected_bits_per_worker(n, d, float_bits=float_bits, indices=count_indices)
    return _drive(method="ef21", problem=problem, compressor=compressor, state=state, step=step,
                  round_bits=lambda _: bits, expected_round_bits=expected, rounds=rounds,
                  record_every=record_every, progress=progress, params=params)

