"""Communication complexity: rounds and floats per worker of a method to reach ``ε``, with its
own parameters (MARINA's ``p``) and the compressor's size (``K``) optimised, next to the closed
forms of the paper's Tables.

:func:`complexity` asks the method object (``permk.marina``, ``permk.ef21``, …) for its
parameters, and its theory (:class:`permk.theory.MethodTheory`) for its theorem's step, what it
optimises and the floats a worker sends per round: a new method is covered by declaring those.

>>> import permk
>>> c = complexity(permk.marina, permk.PermK, n=10, d=1000, L_minus=1.0, L_plus=1.0, L_pm=0.0, eps=1e-3, delta0=1.0)
>>> c.rounds, round(c.floats_per_round)  # L± = 0: GD's 2Δ⁰L−/ε rounds, ≈ d/n floats each
(2000, 100)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .._validate import check_int, check_items, check_real
from ..compressors import Compressor
from .steps import Constants, check_step

__all__ = ["Complexity", "TableRow", "MARINA_PERMK", "MARINA_RANDK", "EF21_TOPK", "complexity", "table_complexity", "format_complexity_table"]


@dataclass(frozen=True)
class Complexity:
    """Predicted communication of a method to reach ``E‖∇f(x̂)‖² ≤ ε`` (nonconvex) or
    ``E[f(x^T) − f*] ≤ ε`` (PL, ``mu`` given).

    ``rounds`` is ``T``, ``floats_per_round`` the expected floats a worker sends per round
    (MARINA: ``p·d + (1 − p)ζ``; EF21: ``K``), ``floats = T · floats_per_round`` (the initial
    full gradient excluded, as in the paper's Tables). ``table`` is the closed form of the
    paper's Table for this method and compressor (a Θ-expression without constants; PL rows
    times ``log(Δ⁰/ε)``), ``table_ref`` names it, and ``ratio = floats / table``.
    """

    method: str
    compressor: str
    K: int | None
    p: float | None
    gamma: float
    rounds: int
    floats_per_round: float
    floats: float
    pl: bool
    A: float | None
    B: float | None
    alpha: float | None
    table: float | None
    table_ref: str | None

    @property
    def ratio(self) -> float | None:
        """``floats / table`` (None without a closed form)."""
        return None if not self.table else self.floats / self.table


def _rounds(gamma: float, eps: float, delta0: float, mu: float | None) -> float:
    """Theorem AB: ``2Δ⁰/(γε)``; Theorem AB-PL (``(1 − γμ)^T Δ⁰ ≤ ε``): ``log(Δ⁰/ε)/(γμ)``
    (``inf`` where it is beyond float64, also when ``γε`` or ``γμ`` underflows to 0)."""
    if mu is None:
        top, bottom = 2.0 * delta0, gamma * eps
    else:
        top, bottom = max(math.log(delta0 / eps), 0.0), gamma * mu
    if bottom > 0:
        return top / bottom
    return math.inf if top > 0 else 0.0


def _minimize_log(floats: Callable[[float], float], low: float, high: float) -> float:
    """The ``v ∈ [low, high]`` minimising ``floats(v)``: a log-grid, then Brent on the bracket.
    Values within rounding (1e-12) of each other tie, and ties go to the largest ``v`` (the
    identity compressor, for which MARINA's ``p`` does not matter, keeps ``p = 1``)."""
    from scipy.optimize import minimize_scalar

    grid = np.geomspace(high, low, 65)
    values = np.array([floats(float(v)) for v in grid])
    j = int(np.argmax(values <= values.min() * (1 + 1e-12)))
    lo, hi = math.log(grid[min(j + 1, grid.size - 1)]), math.log(grid[max(j - 1, 0)])
    res = minimize_scalar(lambda t: floats(math.exp(t)), bounds=(lo, hi), method="bounded", options={"xatol": 1e-9})
    v = min(math.exp(float(res.x)), high)
    return v if floats(v) < values[j] * (1 - 1e-12) else float(grid[j])


def _argmin_int(fn: Callable[[int], float], lo: int, hi: int, points: int = 17) -> int:
    """An integer minimiser of ``fn`` on ``[lo, hi]`` by successive log-grid refinement around
    the best point (exhaustive once the bracket holds at most ``points`` integers)."""
    cache: dict[int, float] = {}

    def f(k: int) -> float:
        if k not in cache:
            cache[k] = fn(k)
        return cache[k]

    while hi - lo + 1 > points:
        grid = np.unique(np.geomspace(lo, hi, points).round().astype(int))
        j = int(np.argmin([f(int(k)) for k in grid]))
        lo, hi = int(grid[max(j - 1, 0)]), int(grid[min(j + 1, grid.size - 1)])
    return min(range(lo, hi + 1), key=f)


def _check_method(method: Any) -> None:
    if not all(hasattr(method, attr) for attr in ("name", "parameters", "theory")):
        raise TypeError(f"method must be a permk Method (permk.marina, permk.ef21, ...), got {method!r}")


def _solve(method: Any, c: Any, n: int, d: int, constants: Constants, eps: float, delta0: float) -> Complexity:
    """The best ``T × floats per round`` of ``method`` with the compressor ``c``, over the
    method's own tunable parameter (at most one, optimised on a log scale)."""

    theory = method.theory
    if theory is None:
        raise ValueError(f"{method!r} declares no theory (permk.theory.MethodTheory): its complexity is not known")

    def at(**tuned: float) -> tuple[Any, float, float, float]:
        """The parameters, step, (real) rounds and floats per round at the tuned values."""
        params = method.parameters(c, n, d, **tuned)
        gamma, source = theory.step(c, n, d, params, constants)
        gamma = check_step(gamma, f"{method.name}'s step ({source})", constants.record())
        return params, gamma, _rounds(gamma, eps, delta0, constants.mu), theory.floats_per_round(c, n, d, params)

    ranges = theory.tunable_range(c, n, d)
    if len(ranges) > 1:
        raise ValueError(f"{method!r} has several tunable parameters ({', '.join(ranges)}); complexity optimises one")
    tuned: dict[str, float] = {}
    for name, (low, high) in ranges.items():

        def continuous(v: float, name: str = name) -> float:
            _, _, rounds, per_round = at(**{name: v})
            return rounds * per_round

        tuned[name] = _minimize_log(continuous, low, high)
    params, gamma, rounds, per_round = at(**tuned)
    if not math.isfinite(rounds * per_round):
        raise ValueError(f"{method.name} with {c.name}: the predicted rounds T = {rounds:g} times {per_round:g} floats per "
                         f"round are beyond float64 (eps = {eps:g}, delta0 = {delta0:g}, step {gamma:g}): choose a larger "
                         "eps or a smaller delta0")
    T = math.ceil(rounds)
    size = c.capabilities.tunable
    return Complexity(
        method=method.name, compressor=c.name, K=getattr(c, size) if size else None, p=getattr(params, "p", None), gamma=gamma,
        rounds=T, floats_per_round=per_round, floats=T * per_round, pl=constants.mu is not None,
        A=getattr(params, "A", None), B=getattr(params, "B", None),
        alpha=None if getattr(params, "alpha", None) is None else float(params.alpha),
        table=None, table_ref=None,
    )  # fmt: skip


def complexity(
    method: Any,
    compressor: Any,
    *,
    n: int,
    d: int,
    L_minus: float,
    L_plus: float,
    L_pm: float,
    eps: float,
    delta0: float,
    mu: float | None = None,
) -> Complexity:
    """Rounds and floats per worker of ``method`` (``permk.marina``, ``permk.ef21``, …) with
    the theory's step, optimised.

    MARINA (unbiased ``compressor`` with AB constants): Theorem "AB", step ``1/M``,
    ``M = L_− + sqrt((1−p)/p · ((A−B)L_+² + B L_±²))``, ``T = ⌈2Δ⁰M/ε⌉``; with ``mu``,
    Theorem "AB-PL", ``γ = min{1/(L_− + sqrt(2(1−p)/p · (…))), p/(2μ)}``,
    ``T = ⌈log(Δ⁰/ε)/(γμ)⌉``. Each round a worker sends ``p·d + (1−p)ζ`` floats in expectation
    (``ζ`` = ``floats_per_worker``); ``p`` minimises ``T·(p·d + (1−p)ζ)`` numerically.

    EF21 (contractive ``compressor`` with ``α``, e.g. TopK: ``α = K/d``): step
    ``1/(L_− + L_+ sqrt(β/θ))``, ``θ = 1 − sqrt(1 − α)``, ``β = (1 − α)/(1 − sqrt(1 − α))``,
    ``T = ⌈2Δ⁰/(γε)⌉`` (``g_i⁰ = ∇f_i(x⁰)``, so ``G⁰ = 0``); PL: ``γ = min{1/(L_− + L_+
    sqrt(2β/θ)), θ/(2μ)}``, ``T = ⌈log(Δ⁰/ε)/(γμ)⌉``. A worker sends ``K`` floats per round.

    ``compressor`` may be a class: one with a tunable size (``permk.RandK`` / ``permk.TopK``:
    ``capabilities.tunable == "k"``) means "optimise ``K`` over ``1..d``" (integer log-grid
    refinement), other classes give their default at ``(n, d)`` (``Compressor.default``:
    ``BlockPermK(min(n, d))``, ...); an instance keeps its parameters. The constants may be upper bounds (the theorems hold with them);
    ``mu > L_minus`` is rejected.

    >>> import permk
    >>> c = complexity(permk.marina, permk.RandK, n=100, d=10_000, L_minus=1.0, L_plus=1.0, L_pm=0.0, eps=1e-3, delta0=1.0)
    >>> c.K, c.table, round(c.ratio, 1)  # Table: Θ((Δ⁰/ε) min{d L_−, d L_+/√n}) = 10⁶ floats
    (1, 1000000.0, 4.0)
    """
    n, d, constants, eps, delta0 = _checked(method, n, d, L_minus, L_plus, L_pm, eps, delta0, mu)
    if isinstance(compressor, Compressor):
        best = _solve(method, compressor, n, d, constants, eps, delta0)
    elif isinstance(compressor, type) and issubclass(compressor, Compressor):
        cls: Any = compressor
        size = cls.tunable
        if size is not None:
            k = _argmin_int(lambda k: _solve(method, cls(**{size: k}), n, d, constants, eps, delta0).floats, 1, d)
            best = _solve(method, cls(**{size: k}), n, d, constants, eps, delta0)
        else:
            best = _solve(method, cls.default(n, d), n, d, constants, eps, delta0)
    else:
        raise TypeError(f"compressor must be a permk.Compressor or a Compressor class, got {compressor!r}")
    table = _table(method, compressor, n, d, constants, eps, delta0)
    return dataclasses.replace(best, table=None if table is None else table[0], table_ref=None if table is None else table[1])


def _checked(method: Any, n: Any, d: Any, L_minus: Any, L_plus: Any, L_pm: Any, eps: Any, delta0: Any,
             mu: Any) -> tuple[int, int, Constants, float, float]:
    """The arguments :func:`complexity` and :func:`table_complexity` share, checked."""
    _check_method(method)
    n, d = check_int(n, "n", low=1), check_int(d, "d", low=1)
    eps = check_real(eps, "eps", low=0.0, strict=True)
    delta0 = check_real(delta0, "delta0", low=0.0, strict=True)
    check_real(L_minus, "L_minus", low=0.0, strict=True)
    constants = Constants(L_minus=L_minus, L_plus=L_plus, L_pm=L_pm, mu=mu)
    if constants.mu is not None and constants.mu > constants.L_minus:
        raise ValueError(f"mu = {mu} exceeds L_minus = {L_minus}: impossible (Lemma 'relation between L and mu', PL appendix)")
    return n, d, constants, eps, delta0


class TableRow(NamedTuple):
    """One row of the paper's communication-complexity Tables (nonconvex and PL), declared by
    its method's theory for a compressor class (``MethodTheory.table_rows``)."""

    label: str
    #: the inner ``min{…}`` of the closed form at ``(n, d, L−, L+, L±)``
    inner: Callable[[int, int, float, float, float], float]
    #: whether the PL Table's rounds are at least ``d`` (``max{(1/μ) min{…}, d}``; not EF21's)
    pl_at_least_d: bool = True


#: MARINA with PermK, with RandK (optimal ``K``) and EF21 with TopK (optimal ``K``).
MARINA_PERMK = TableRow("MARINA + PermK", lambda n, d, Lm, Lp, Lpm: min(
    d * Lm, (d / n if d >= n else 1.0) * Lm + d / math.sqrt(n) * Lpm))
MARINA_RANDK = TableRow("MARINA + RandK", lambda n, d, Lm, Lp, Lpm: min(
    d * Lm, (0.0 if d >= n else Lm) + d / math.sqrt(n) * Lp))
EF21_TOPK = TableRow("EF21 + TopK", lambda n, d, Lm, Lp, Lpm: d * Lm, pl_at_least_d=False)


def table_complexity(
    method: Any,
    compressor: Any,
    *,
    n: int,
    d: int,
    L_minus: float,
    L_plus: float,
    L_pm: float,
    eps: float,
    delta0: float,
    mu: float | None = None,
) -> tuple[float, str] | None:
    """The paper's closed form for the method with the compressor (its theory's ``table_rows``:
    MARINA+PermK, MARINA+RandK, EF21+TopK), or None.

    The paper's communication-complexity Table, from its Lemmas on the optimal parameters of the
    methods (``d ≥ n`` and ``n ≥ d``), optimised over ``p`` and ``K``:
    PermK ``(Δ⁰/ε) min{d L_−, (d/n) L_− + (d/√n) L_±}`` (``d ≥ n``; ``L_−`` for ``d/n`` when
    ``d ≤ n``), RandK ``(Δ⁰/ε) min{d L_−, (d/√n) L_+}`` (``d ≥ n``; ``L_− + (d/√n) L_+`` when
    ``d ≤ n``), TopK ``(Δ⁰/ε) d L_−``. With ``mu`` the PL Table: ``max{(1/μ) min{…}, d}`` (TopK ``d L_−/μ``) times
    ``log(Δ⁰/ε)``. These hold up to constant factors; returns ``(value, reference)``.

    >>> import permk
    >>> table_complexity(permk.marina, permk.PermK(), n=10, d=1000, L_minus=1.0, L_plus=1.0, L_pm=0.0, eps=1e-3, delta0=1.0)
    (100000.0, "Table 'communication_complexity' (d ≥ n): MARINA + PermK")
    """
    return _table(method, compressor, *_checked(method, n, d, L_minus, L_plus, L_pm, eps, delta0, mu))


def _table(method: Any, compressor: Any, n: int, d: int, c: Constants, eps: float, delta0: float) -> tuple[float, str] | None:
    kind = compressor if isinstance(compressor, type) else type(compressor)
    row = getattr(getattr(method, "theory", None), "table_rows", {}).get(kind)
    if row is None:
        return None
    inner = row.inner(n, d, c.L_minus, c.L_plus, c.L_pm)
    regime = "d ≥ n" if d >= n else "d ≤ n"
    if c.mu is None:
        return delta0 / eps * inner, f"Table 'communication_complexity' ({regime}): {row.label}"
    value = max(inner / c.mu, d) if row.pl_at_least_d else inner / c.mu
    return max(math.log(delta0 / eps), 0.0) * value, f"Table 'communication_complexity_pl' ({regime}): {row.label}"


def format_complexity_table(rows: Sequence[Complexity]) -> str:
    """A plain-text table of :class:`Complexity` rows (what :func:`complexity` returns); any other
    row, or ``rows`` that is not a sequence of them, is a TypeError naming it."""
    rows = check_items(rows, Complexity, "rows", "permk.theory.Complexity")
    head = f"{'method':<7} {'compressor':<13} {'p':>9} {'step γ':>10} {'rounds T':>11} {'floats/worker':>14} {'paper Θ':>11} {'ratio':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        p = "-" if r.p is None else f"{r.p:.3g}"
        table = "-" if r.table is None else f"{r.table:.4g}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        lines.append(
            f"{r.method.upper():<7} {r.compressor:<13} {p:>9} {r.gamma:>10.4g} {r.rounds:>11d} {r.floats:>14.4g} {table:>11} {ratio:>6}"
        )
    return "\n".join(lines)
