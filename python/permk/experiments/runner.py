"""The machinery shared by the experiment grids: runs advanced in chunks, the per-cell search
over step-size multipliers with a bits budget, the best-run criterion, and a process pool over
cells.

A *cell* is one subplot of the paper's figures (one problem instance: ``(n, noise scale)`` for
the quadratic, ``(λ, p̂)`` for the autoencoder). In a cell every method (MARINA+PermK,
EF21+TopK, MARINA+RandK) runs with the step sizes ``2^j · γ_theory``.

**Bits budget.** All runs of a cell get the same budget of bits per worker,
``B = budget_factor × b*``, where ``b*`` is the fewest bits with which any run of the cell
reached ``‖∇f‖² ≤ tol · ‖∇f(x⁰)‖²`` (the target; ``tol = 1e-6`` for the quadratic). So the best
method always reaches the target, with ``budget_factor − 1`` times as many bits again to show
how the methods go on. Runs are advanced in chunks and stop at the budget known so far (it
only shrinks as runs finish, so every run covers the final ``B``), after ``max_rounds``
rounds, or when they diverge. The figures' x-axis is ``[0, B]``.

**Best step** of a method in a cell (the paper's "best convergence rate", made precise),
:func:`score`:

1. runs that diverge are dropped (a non-finite iterate, or ``‖∇f‖² > div_factor · ‖∇f(x⁰)‖²``),
   as the paper "omitted plots where algorithms diverged";
2. among the rest, the smallest ``‖∇f‖²`` at the end of the budget wins (the last value
   recorded with at most ``B`` bits sent).

**The authors' protocol** (their code: mysteryresearcher/sampling-in-optimal-sgd at bd3f2e6,
``code/distributed_optimization_library``) differs from the above; each difference is an option
of :class:`SearchOptions` (``--protocol authors`` sets them all, :data:`AUTHORS`):

* ``best="last90"``: the best run is the one with the smallest mean of ``log10 ‖∇f‖²`` over the
  last 90% of its recorded rounds, runs with a non-finite value dropped (their plot scripts,
  plots/permutation_compressor/quad_prog_plot.py:76-82);
* ``horizon="rounds"``: no bits budget; every run goes ``max_rounds`` rounds, error feedback
  (EF21) twice as many (config_quadratic.py:109,130; config_libsvm.py:134);
* ``steps="authors"``: the fixed range of multipliers ``2^i`` of the experiment's configs (not
  cut at the stability edge; :func:`step_exponents`);
* ``ef21_init="compressed"``: EF21 starts from ``g_i⁰ = C(∇f_i(x⁰))`` (algorithm.py:1885-1893,
  1915; :class:`permk.methods.EF21`).

The options are recorded with every run, so the figures (:func:`best_runs`, :func:`cell_budget`)
use the rule the grid ran with.

**Pruning** (by default, of the methods whose state keeps per-worker arrays: EF21):
multipliers are tried from the largest (the stability edge ``2^j γ_theory ≤ 2/L_−``) downwards;
such runs are the expensive ones (``O(nd)`` per round) and below the edge they only get
slower, so the scan of a method stops after ``patience`` consecutive non-diverged runs worse
than its best so far. ``--no-prune`` runs every multiplier.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

import numpy as np

from .protocols import protocol_of
from .results import append_record, from_json, hold_directory, read_json, read_records, thin_indices, to_jsonable, write_json

__all__ = [
    "METHODS",
    "Spec",
    "available_specs",
    "SearchOptions",
    "Run",
    "multiplier_exponents",
    "step_exponents",
    "AUTHORS",
    "protocol_options",
    "search_from_args",
    "options_from_args",
    "score",
    "search_cell",
    "best_runs",
    "cell_budget",
    "run_pool",
    "run_grid",
    "holds_results",
    "Estimate",
    "estimate_grid",
    "format_estimate",
    "projected_seconds",
    "format_duration",
    "is_writer",
    "mpi_comm",
]

#: The paper's methods, in the order they run within a cell (PermK first: it is cheap and sets
#: the budget). Any ``METHOD-COMPRESSOR`` of :func:`available_specs` can be asked for.
METHODS = ("marina-permk", "ef21-topk", "marina-randk")


@dataclass(frozen=True)
class Spec:
    """A method of the experiments, ``"METHOD-COMPRESSOR"`` (e.g. ``"marina-permk"``): a method
    object of :mod:`permk.methods` and a compressor class of :func:`permk.compressors.catalog`,
    instantiated for each cell with :meth:`~permk.Compressor.default` (``K = ⌈d/n⌉`` for a
    tunable size, the paper's choice in "Experiments setup")."""

    key: str
    method: Any
    compressor_class: Any

    @classmethod
    def parse(cls, key: str) -> Spec:
        """The spec ``METHOD-COMPRESSOR`` (ValueError listing the available ones otherwise)."""
        from permk.compressors import catalog
        from permk.methods import catalog as methods

        from permk.compressors import Identity

        name, _, comp = str(key).partition("-")
        method = methods().get(name)
        if method is not None and not method.takes_compressor and not comp:
            return cls(key=str(key), method=method, compressor_class=Identity)
        if method is None or not method.takes_compressor or comp not in catalog():
            raise ValueError(f"unknown method {key!r}; expected METHOD-COMPRESSOR (METHOD alone for a method that takes "
                             f"no compressor), one of {', '.join(available_specs())}")
        return cls(key=str(key), method=method, compressor_class=catalog()[comp])

    def compressor(self, n: int, d: int) -> Any:
        """The compressor of this spec for ``n`` workers in dimension ``d``."""
        return self.compressor_class.default(n, d)

    def identical_workers_collapse(self, compressor: Any) -> bool:
        """Whether workers that are the same function stay identical under this method with
        ``compressor``: a method whose protocol says so (``collapses_identical_workers``: EF21 keeps equal
        ``g_i``) with a deterministic compressor (TopK), so the iterates do not depend on how
        many such workers there are (the experiments then run as few as they can)."""
        return bool(protocol_of(self.method).collapses_identical_workers and compressor.capabilities.deterministic)

    @property
    def label(self) -> str:
        """The legend label, the method's ``label`` and the compressor's class:
        ``MARINA + PermK``, ``EF21 + TopK``; a spec that names no compressor (a method that
        takes none, ``sgd``), the method's label alone (``SGD``)."""
        if not self.key.partition("-")[2]:
            return str(self.method.label)
        return f"{self.method.label} + {self.compressor_class.__name__}"

    def check_problem(self, problem: Any) -> None:
        """Refuse (ValueError) a problem this spec cannot run on: a method that needs a finite-sum
        problem (``needs_finite_sum``: minibatch oracles) on one without ``minibatch_grads``."""
        if self.method.needs_finite_sum and not callable(getattr(problem, "minibatch_grads", None)):
            raise ValueError(f"{self.key} needs a finite-sum problem with minibatch oracles (permk classify), "
                             f"not {type(problem).__name__}")


def available_specs(n: int = 10, d: int = 100) -> list[str]:
    """Every ``METHOD-COMPRESSOR`` the experiments can run: the methods with a theory step
    (MARINA, EF21, DIANA, RandDIANA, VR-MARINA, …) and the compressors whose defaults suit them
    (checked at ``(n, d)`` on a synthetic quadratic, whose constants every step can read: ``L_i``
    too; a method that ``needs_finite_sum`` on a small :class:`permk.NonconvexSigmoid` with the
    experiments' ``batch_size``), then the methods that take no compressor by their name alone
    (``gd``, ``sgd``)."""
    from permk.problems import NonconvexSigmoid
    from permk.compressors import Identity, catalog
    from permk.methods import catalog as methods
    from permk.problems import Quadratic
    from permk.theory.steps import Constants

    quadratic = Quadratic.synthetic(n, d, lam=1e-3, noise_scale=0.1)
    rng = np.random.default_rng(0)
    finite_sum = NonconvexSigmoid(rng.standard_normal((4 * n, d - 1)), np.tile([-1.0, 1.0], 2 * n), n=n, seed=0)
    probes = {False: (quadratic, Constants.of(quadratic)), True: (finite_sum, Constants.of(finite_sum))}

    def suits(method: Any, c: Any) -> bool:
        probe, consts = probes[bool(method.needs_finite_sum)]
        if method.theory is None:
            return False
        try:
            params = method.parameters(c, n, d, problem=probe, **SearchOptions(batch_size=2).sample_options(method))
            method.theory.step(c, n, d, params, consts, problem=probe)
        except (TypeError, ValueError):
            return False
        return True

    compressors = {cname: _default_or_none(cls, n, d) for cname, cls in catalog().items()}
    out = []
    for mname, method in methods().items():
        if method.takes_compressor:
            out += [f"{mname}-{cname}" for cname, c in compressors.items() if c is not None and suits(method, c)]
    out += [mname for mname, method in methods().items() if not method.takes_compressor and suits(method, Identity())]
    return out


def _default_or_none(cls: Any, n: int, d: int) -> Any:
    """``cls.default(n, d)``, or None where the compressor does not fit ``(n, d)``."""
    try:
        return cls.default(n, d)
    except (TypeError, ValueError):
        return None


def theory_gamma(problem: Any, spec: Spec, opts: SearchOptions, *, constants: str | None = None) -> float:
    """The theory's step (multiplier 1) of ``spec`` on ``problem``, chosen exactly as a run of
    the method chooses it (:func:`permk.methods.driver.setup`: p = ζ/d, Theorem AB / AB-PL, the EF21
    theorem) from the problem's constants with ``opts.constants`` (``"pessimistic"``:
    ``L_+² = L_±² = (1/n) Σ L_i²``) unless ``constants`` overrides it."""
    from permk.methods.driver import setup

    spec.check_problem(problem)
    n, d = int(problem.n), int(problem.d)
    params = setup(spec.method, problem, spec.compressor(n, d), n=n, d=d, rounds=1, seed=opts.seed,
                   pl=opts.pl, constants=constants or opts.constants, float_bits=opts.float_bits, **opts.method_options(spec))
    return float(params.gamma)


def multiplier_exponents(gamma_theory: float, L_minus: float, *, max_count: int | None = None, cap: int = 16) -> list[int]:
    """The exponents ``j`` of the multipliers ``2^j``, from the largest with
    ``2^j γ_theory ≤ 2/L_−`` (beyond it even exact gradient descent diverges) down to ``0``
    (the theory's step), largest first; ``max_count`` keeps only the largest ones."""
    if not (gamma_theory > 0 and L_minus > 0):
        raise ValueError("gamma_theory and L_minus must be positive")
    top = int(math.floor(math.log2(2.0 / (L_minus * gamma_theory)) + 1e-12))
    top = max(0, min(top, cap))
    js = list(range(top, -1, -1))
    return js[:max_count] if max_count else js


def step_exponents(method: str, gamma_theory: float, L_minus: float | None, opts: SearchOptions,
                   authors: tuple[str, tuple[int, int]] | None, *, max_count: int | None = None) -> list[int]:
    """The exponents ``j`` of the multipliers ``2^j`` a method ``METHOD-COMPRESSOR`` runs with,
    largest first: with ``opts.steps == "edge"`` those of :func:`multiplier_exponents`; with
    ``"authors"`` the authors' range (``[low, high)``, the experiment's configs) of
    ``authors = (experiment, default range)``: the method's own in that experiment
    (:meth:`MethodProtocol.steps`), else the experiment's default, not cut at the stability edge
    (such runs diverge and are dropped). ``max_count`` keeps the largest ones."""
    if opts.steps == "authors":
        if authors is None:
            raise ValueError("steps='authors': this experiment has no authors' step ranges; use steps='edge'")
        low, high = protocol_of(Spec.parse(method).method).steps(*authors)
        js = list(range(high - 1, low - 1, -1))
        return js[:max_count] if max_count else js
    if L_minus is None:
        raise ValueError("steps='edge' needs L_minus (the stability edge 2/L_−)")
    return multiplier_exponents(gamma_theory, L_minus, max_count=max_count)


@dataclass(frozen=True)
class SearchOptions:
    """Options of the per-cell search (see the module docstring): permk's protocol by default;
    ``best``, ``horizon``, ``steps`` and ``ef21_init`` select the authors' rules instead."""

    seed: int = 0
    tol: float = 1e-6
    budget_factor: float = 20.0
    max_rounds: int = 20000
    div_factor: float = 1e2
    prune: tuple[str, ...] | None = None
    patience: int = 1
    pl: bool = False
    constants: str = "pessimistic"
    float_bits: int = 32
    chunk_seconds: float = 0.5
    best: str = "budget"
    horizon: str = "budget"
    steps: str = "edge"
    ef21_init: str = "full"
    batch_size: int = 1

    def __post_init__(self) -> None:
        from permk._validate import check_choice

        check_choice(self.best, "best", ("budget", "last90"))
        check_choice(self.horizon, "horizon", ("budget", "rounds"))
        check_choice(self.steps, "steps", ("edge", "authors"))
        check_choice(self.ef21_init, "ef21_init", ("full", "compressed"))

    def rounds_for(self, spec: Spec) -> int:
        """The most rounds of a run of ``spec``: ``max_rounds``; with ``horizon="rounds"``, times
        the method's protocol's ``rounds_factor`` (EF21: twice), as the authors' configs."""
        factor = protocol_of(spec.method).rounds_factor if self.horizon == "rounds" else 1
        return int(factor) * self.max_rounds

    def prunes(self, spec: Spec) -> bool:
        """Whether the multiplier scan of ``spec`` stops early (see *Pruning*): the specs listed
        in ``prune``; by default (None) those whose method keeps per-worker arrays in its state
        (:attr:`permk.State.arrays`: ``O(nd)`` per round, as EF21's estimators)."""
        if self.prune is None:
            return bool(spec.method.state_type.per_worker_arrays())
        return spec.key in self.prune

    def budget(self, bits_to_target: float) -> float:
        """The bits budget given the fewest bits to the target (infinite with ``horizon="rounds"``)."""
        return math.inf if self.horizon == "rounds" else self.budget_factor * bits_to_target

    def method_options(self, spec: Spec) -> dict[str, Any]:
        """The method's own options of a run of ``spec``: the start ``init`` of a method that
        has a choice of starts (its protocol's ``starts``: EF21's)."""
        start = {"init": self.ef21_init} if self.ef21_init in protocol_of(spec.method).starts else {}
        return {**start, **self.sample_options(spec.method)}

    def sample_options(self, method: Any) -> dict[str, Any]:
        """The sampling options of a method that runs on minibatches (``needs_finite_sum``): the
        ``batch_size``; a method that needs more (a megabatch) is not run by the experiments."""
        return {"batch_size": self.batch_size} if method.needs_finite_sum else {}


#: The authors' protocol, per experiment (the option values ``--protocol authors`` sets; see the
#: module docstring): the autoencoder's EF21 started from full gradients (their scripts.txt runs
#: it with --ef21_init_with_gradients) and 4,000 rounds (8,000 for EF21).
AUTHORS: dict[str, dict[str, Any]] = {
    "quadratic": {"best": "last90", "horizon": "rounds", "steps": "authors", "ef21_init": "compressed"},
    "autoencoder": {"best": "last90", "horizon": "rounds", "steps": "authors", "ef21_init": "full", "max_rounds": 4000},
    "classify": {"best": "last90", "horizon": "rounds"},
}


def protocol_options(args: Any, experiment: str) -> dict[str, Any]:
    """The :class:`SearchOptions` fields a command line sets through ``--protocol`` and the
    single options ``--best``, ``--horizon``, ``--steps``, ``--ef21-init`` (which override it);
    ``--rounds`` overrides the protocol's ``max_rounds``."""
    out = dict(AUTHORS[experiment]) if getattr(args, "protocol", None) == "authors" else {}
    for k in ("best", "horizon", "steps", "ef21_init"):
        if getattr(args, k, None) is not None:
            out[k] = getattr(args, k)
    if getattr(args, "rounds", None) is not None:
        out.pop("max_rounds", None)
    return out


#: An experiment's grid dataclass (it has ``max_multipliers`` and ``methods``).
GridT = TypeVar("GridT")


def search_from_args(grid: GridT, args: Any) -> GridT:
    """``grid`` (an experiment's grid dataclass) with the step search's command-line choices that
    every experiment shares: ``--max-multipliers`` (0: no cap) and ``--methods`` (in order,
    repeats dropped), where given."""
    from dataclasses import replace

    if args.max_multipliers is not None:
        grid = replace(grid, max_multipliers=args.max_multipliers or None)  # type: ignore[type-var]
    if args.methods:
        grid = replace(grid, methods=tuple(dict.fromkeys(args.methods)))  # type: ignore[type-var]
    return grid


def options_from_args(base: SearchOptions, args: Any, experiment: str) -> SearchOptions:
    """The :class:`SearchOptions` of an experiment's command line: ``base`` (its grid's) with the
    protocol (:func:`protocol_options`) and ``--seed``, ``--rounds``, ``--tol``,
    ``--budget-factor``, ``--no-prune`` where given."""
    from dataclasses import replace

    o = replace(base, **protocol_options(args, experiment))
    return replace(o, seed=args.seed if args.seed is not None else o.seed,
                   max_rounds=args.rounds if args.rounds is not None else o.max_rounds,
                   tol=args.tol if args.tol is not None else o.tol,
                   budget_factor=args.budget_factor if args.budget_factor is not None else o.budget_factor,
                   prune=() if args.no_prune else o.prune)


class Run:
    """One method with one step size, advanced in chunks through the library's drivers
    (:func:`permk.marina`, :func:`permk.ef21`) by resuming their state, so a chunked run gives
    exactly the iterates of one long run. Records every round.

    Where a run stops does not depend on the chunks (nor so on timing): :meth:`settle` cuts the
    record at the first round that diverged or that reached the budget in force at that round
    (``budget_factor × min(cell's best bits to target, the run's own)``)."""

    def __init__(self, problem: Any, spec: Spec, multiplier: float, opts: SearchOptions, *, gamma: float | None = None,
                 compressor: Any = None, mpi: bool = False) -> None:
        self.problem = problem
        self.mpi = mpi
        self.spec = spec
        self.multiplier = float(multiplier)
        self.opts = opts
        self.gamma_base = gamma
        self.compressor = compressor if compressor is not None else spec.compressor(int(problem.n), int(problem.d))
        self.state: Any = None
        self.params: dict[str, Any] = {}
        self.a: dict[str, np.ndarray] = {}
        self.g0: float | None = None
        self.diverged = False
        self.finished = False
        self._stopped_diverged = False
        self.hit_index: int | None = None
        self.expected_per_round = 0.0
        self.seconds = 0.0

    @property
    def round(self) -> int:
        return int(self.a["round"][-1]) if self.a else 0

    @property
    def total_bits(self) -> float:
        return float(self.a["bits"][-1]) if self.a else 0.0

    @property
    def hit_bits(self) -> float | None:
        return None if self.hit_index is None else float(self.a["bits"][self.hit_index])

    def advance(self, rounds: int) -> None:
        """Run ``rounds`` more rounds (fewer if the run diverges); call :meth:`settle` after."""
        t0 = time.perf_counter()
        kw: dict[str, Any] = dict(rounds=int(rounds), seed=self.opts.seed, gamma=self.gamma_base,
                                  gamma_multiplier=self.multiplier, pl=self.opts.pl, constants=self.opts.constants,
                                  float_bits=self.opts.float_bits, record_every=1, state=self.state,
                                  **self.opts.method_options(self.spec))
        res: Any
        if self.mpi:
            # one MPI rank per block of workers (permk.distributed): the same iterates, every rank
            # gets the same result, so every rank takes the same decisions
            import permk.distributed as pd

            res = pd.run(self.spec.method, self.problem, self.compressor, **kw)
        else:
            res = self.spec.method(self.problem, self.compressor, **kw)
        self.seconds += time.perf_counter() - t0
        first = self.state is None
        if first:
            self.params = res.params.record()
            self.g0 = float(res.grad_norm_sq[0])
            self.expected_per_round = float(res.expected_bits_per_worker[-1] - res.expected_bits_per_worker[0]) / max(1, int(res.rounds[-1] - res.rounds[0]))
        sl = slice(0, None) if first else slice(1, None)
        new = {"round": res.rounds[sl], "bits": res.bits_per_worker[sl], "grad_norm_sq": res.grad_norm_sq[sl],
               "oracle_calls": res.oracle_calls[sl]}
        if res.f_gap is not None:
            new["f_gap"] = res.f_gap[sl]
        self.a = new if first else {k: np.concatenate([self.a[k], v]) for k, v in new.items() if k in self.a}
        self.state = res.state
        if res.diverged_at is not None:
            self._stopped_diverged = True

    def settle(self, best_hit: float) -> None:
        """Find the target, divergence and the stop point in the record (see the class doc)."""
        g, b = self.a["grad_norm_sq"], self.a["bits"]
        g0 = self.g0 if self.g0 else 1.0
        bad = ~np.isfinite(g) | (g > self.opts.div_factor * g0)
        hit = np.nonzero(g <= self.opts.tol * g0)[0]
        h = int(hit[0]) if len(hit) else None
        cap = np.full(len(b), self.opts.budget(best_hit))
        if h is not None:
            cap[h:] = np.minimum(cap[h:], self.opts.budget(b[h]))
        over = np.nonzero(b >= cap)[0]
        div = np.nonzero(bad)[0]
        end = len(b) - 1
        if len(over):
            end = min(end, int(over[0]))
            self.finished = True
        if len(div) and div[0] <= end:
            end = int(div[0])
            self.finished = self.diverged = True
        if self._stopped_diverged:
            self.finished = self.diverged = True
        self.a = {k: v[: end + 1] for k, v in self.a.items()}
        self.hit_index = h if (h is not None and h <= end and not bad[: h + 1].any()) else None
        if self.round >= self.opts.rounds_for(self.spec):
            self.finished = True

    def seconds_per_round(self) -> float:
        return self.seconds / max(1, self.round)

    def arrays(self) -> dict[str, np.ndarray]:
        out = dict(self.a)
        out["expected_bits"] = out["round"] * self.expected_per_round
        return out

    def summary(self) -> dict[str, Any]:
        a = self.arrays()
        g = a["grad_norm_sq"]
        return {
            "rounds_run": self.round,
            "bits_sent": self.total_bits,
            "grad_norm_sq_0": self.g0,
            "final_grad_norm_sq": float(g[-1]),
            "min_grad_norm_sq": float(np.nanmin(g)) if np.isfinite(g).any() else float("nan"),
            "reached_target": self.hit_index is not None,
            "bits_to_target": self.hit_bits,
            "rounds_to_target": int(a["round"][self.hit_index]) if self.hit_index is not None else None,
            "diverged": self.diverged,
            "seconds": self.seconds,
            "simulated_workers": int(self.problem.n),
        }

    def curve(self) -> dict[str, Any]:
        a = self.arrays()
        keep = [self.hit_index] if self.hit_index is not None else []
        idx = thin_indices(len(a["round"]), keep=keep)
        return {k: v[idx] for k, v in a.items()}


def score(summary: dict[str, Any], curve: dict[str, Any], budget: float, best: str = "budget") -> tuple[float, float]:
    """The sort key of the best-step criterion (smaller is better), on the part of the run with
    ``bits ≤ budget``; diverged runs last. ``best="budget"``: the ``‖∇f‖²`` at the end of the
    budget (the last value recorded with ``bits ≤ budget``). ``best="last90"`` (the authors'
    plot scripts): the mean of ``log10 ‖∇f‖²`` over the last 90% of the rounds, a run with a
    non-finite value dropped (the recorded curve's points are evenly spaced in rounds, so their
    mean is that of every round's)."""
    if summary.get("diverged"):
        return (3.0, math.inf)
    bits = np.asarray(curve["bits"], dtype=float)
    g = np.asarray(curve["grad_norm_sq"], dtype=float)
    inside = np.nonzero(bits <= budget * (1 + 1e-12))[0]
    if best == "last90":
        g = g[: inside[-1] + 1] if len(inside) else g[:1]
        rounds = np.asarray(curve["round"], dtype=float)[: len(g)]
        if not np.isfinite(g).all():
            return (3.0, math.inf)
        with np.errstate(divide="ignore"):
            v = float(np.mean(np.log10(g[rounds >= rounds[0] + 0.1 * (rounds[-1] - rounds[0])])))
        return (0.0, v)
    v = float(g[inside[-1]]) if len(inside) else float(g[0])
    return (0.0, v) if math.isfinite(v) else (3.0, math.inf)


def _protocol(records: Sequence[dict[str, Any]], key: str, default: str) -> str:
    """An option of the search the records ran with (older records: permk's protocol)."""
    return str(records[0].get("options", {}).get(key, default)) if records else default


def cell_budget(records: Sequence[dict[str, Any]], budget_factor: float) -> float:
    """The bits range of a cell: ``budget_factor ×`` the fewest bits any run needed to reach the
    target; without such a run, or with ``horizon="rounds"`` (recorded in the runs), the most
    bits any run sent."""
    hits = [r["summary"]["bits_to_target"] for r in records if r["summary"].get("reached_target") and not r["summary"].get("diverged")]
    if hits and _protocol(records, "horizon", "budget") == "budget":
        return budget_factor * min(hits)
    return max((float(r["summary"]["bits_sent"]) for r in records), default=0.0)


def best_runs(records: Sequence[dict[str, Any]], budget_factor: float) -> dict[str, dict[str, Any]]:
    """The best run of each method of one cell (see :func:`score`, with the ``best`` rule the
    runs were made with); methods whose runs all diverged are left out."""
    budget = cell_budget(records, budget_factor)
    best = _protocol(records, "best", "budget")
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["summary"].get("diverged"):
            continue
        m = r["method"]
        if m not in out or score(r["summary"], r["curve"], budget, best) < score(out[m]["summary"], out[m]["curve"], budget, best):
            out[m] = r
    return out


def _chunk(run: Run, cap: float, max_rounds: int, chunk_seconds: float) -> int:
    left = max_rounds - run.round
    if run.round == 0:
        return max(1, min(left, 20))
    per = max(run.seconds_per_round(), 1e-7)
    n = int(chunk_seconds / per)
    if math.isfinite(cap) and run.expected_per_round > 0:
        n = min(n, int(math.ceil((cap - run.total_bits) / run.expected_per_round)) + 1)
    return max(1, min(left, n, 20000))


def search_cell(
    problem: Any,
    cell: dict[str, Any],
    exponents: dict[str, list[int]],
    opts: SearchOptions,
    path: str,
    *,
    gammas: Mapping[str, float | None] | None = None,
    base: dict[str, Any] | None = None,
    resume: bool = False,
    on_run: Callable[[dict[str, Any]], None] | None = None,
    problems: Mapping[str, Any] | None = None,
    compressors: Mapping[str, Any] | None = None,
    mpi: bool = False,
) -> list[dict[str, Any]]:
    """Run (or, with ``resume``, read back) every run of one cell, writing each finished run
    to ``path`` at once. ``exponents[method]`` lists the ``j`` of the multipliers ``2^j``
    (largest first); ``gammas[method]`` is the step the multipliers scale (None: the theory's
    step from the problem's constants). ``base`` is merged into every record. Returns the
    cell's run records (in run order). ``problems`` / ``compressors`` override, per method, the
    problem a method runs on and its compressor (the autoencoder's EF21 runs on a grouped view).
    With ``mpi`` every run is distributed over the MPI ranks (``permk.distributed``); all ranks
    must call this together; rank 0 alone writes, and its chunk sizes are used by all."""
    est = _ESTIMATE.get()
    if est is not None:  # estimate_grid: time the cell's runs, run nothing, write nothing
        est.time_cell(problem, cell, exponents, opts, gammas or {}, problems or {}, compressors or {})
        return []
    for method in exponents:
        Spec.parse(method).check_problem((problems or {}).get(method, problem))
    comm = mpi_comm() if mpi else None
    writer = comm is None or comm.Get_rank() == 0
    done: dict[str, dict[str, Any]] = {}
    if resume and os.path.exists(path):
        for r in read_records(path):
            if r.get("kind") == "run":
                done[r["key"]] = r
    records: list[dict[str, Any]] = []
    # the cell's fewest bits to the target so far, in run order: a resumed cell makes the same
    # decisions (budgets, pruning) as an uninterrupted one
    best_hit = math.inf
    for method in exponents:
        streak = 0
        best_score: tuple[float, float] | None = None
        for j in exponents[method]:
            key = f"{cell['id']}|{method}|j={j}|seed={opts.seed}"
            if key in done:
                rec = done[key]
            else:
                run = Run((problems or {}).get(method, problem), Spec.parse(method), 2.0**j, opts, gamma=(gammas or {}).get(method),
                          compressor=(compressors or {}).get(method), mpi=mpi)
                while not run.finished:
                    own = run.hit_bits if run.hit_bits is not None else math.inf
                    steps = _chunk(run, opts.budget(min(best_hit, own)), opts.rounds_for(run.spec), opts.chunk_seconds)
                    run.advance(steps if comm is None else comm.bcast(steps, root=0))
                    run.settle(best_hit)
                summ = run.summary()
                summ["stopped_by"] = "diverged" if run.diverged else ("budget" if run.total_bits >= opts.budget(min(best_hit, run.hit_bits or math.inf)) else "max_rounds")
                rec = {
                    "kind": "run",
                    "key": key,
                    **(base or {}),
                    "cell": cell,
                    "method": method,
                    "label": run.spec.label,
                    "compressor": run.compressor.name,
                    "j": j,
                    "multiplier": 2.0**j,
                    "options": {k: getattr(opts, k) for k in ("seed", "tol", "budget_factor", "max_rounds", "div_factor", "pl", "constants", "float_bits",
                                                              "best", "horizon", "steps", "ef21_init", "batch_size")},
                    "params": run.params,
                    "summary": summ,
                    "curve": run.curve(),
                }
                if writer:
                    append_record(path, rec)
                rec = read_back(rec)
            records.append(rec)
            s = rec["summary"]
            if s.get("reached_target") and not s.get("diverged"):
                best_hit = min(best_hit, float(s["bits_to_target"]))
            if on_run is not None:
                on_run(rec)
            if opts.prunes(Spec.parse(method)) and not s.get("diverged"):
                sc = score(s, rec["curve"], opts.budget(best_hit) if math.isfinite(best_hit) else math.inf, opts.best)
                if best_score is None or sc < best_score:
                    best_score, streak = sc, 0
                else:
                    streak += 1
                    if streak >= opts.patience:
                        break
    return records


def read_back(rec: dict[str, Any]) -> dict[str, Any]:
    """A record as it reads back from its file (arrays as lists, JSON types), so fresh and
    resumed cells are handled identically."""
    return from_json(json.loads(json.dumps(to_jsonable(rec))))  # type: ignore[no-any-return]


def _init_worker(threads: int, parent: int) -> None:
    from permk.parallel import limit_threads

    _end_with_parent(parent)
    limit_threads(threads)


def _end_with_parent(parent: int) -> None:
    """Make this pool process end when ``parent``, the process that started it, dies (Linux:
    ``PR_SET_PDEATHSIG``): a killed run leaves no process writing into its directory once its
    lock (:func:`.results.hold_directory`) is released."""
    if not sys.platform.startswith("linux"):  # pragma: no cover - Linux only
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM))
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


def run_pool(
    fn: Callable[..., Any],
    tasks: Iterable[tuple[Any, ...]],
    *,
    jobs: int,
    desc: str,
    total: int,
    progress: bool = True,
) -> list[Any]:
    """``fn(*task)`` for every task, in ``jobs`` processes (``spawn``; each process gets
    ``cores // jobs`` threads for the Rust kernels and BLAS: :mod:`permk.parallel`), with a tqdm
    bar over tasks."""
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    tasks = list(tasks)
    bar = tqdm(total=total, desc=desc, disable=not progress, unit="cell")
    out: list[Any] = []
    try:
        if jobs <= 1:
            for t in tasks:
                out.append(fn(*t))
                bar.update(1)
            return out
        import concurrent.futures as cf
        import multiprocessing as mp

        from permk.parallel import threads_per_process

        threads = threads_per_process(jobs)
        # set before the workers start, so that BLAS starts with that many threads too
        saved = {k: os.environ.get(k) for k in ("RAYON_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        for k in saved:
            os.environ[k] = str(threads)
        try:
            with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=_init_worker, initargs=(threads, os.getpid())) as ex:
                futs = [ex.submit(fn, *t) for t in tasks]
                for f in cf.as_completed(futs):
                    f.result()
                    bar.update(1)
                out = [f.result() for f in futs]
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return out
    finally:
        bar.close()


def mpi_comm() -> Any:
    """``MPI.COMM_WORLD`` (``permk[mpi]`` needed)."""
    try:
        from mpi4py import MPI
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise ImportError("--mpi needs mpi4py: pip install 'permk[mpi]'") from e
    return MPI.COMM_WORLD


def run_grid(
    name: str,
    cfg: dict[str, Any],
    cell_fn: Callable[..., Any],
    cells: Sequence[dict[str, Any]],
    out: str | os.PathLike[str],
    *,
    jobs: int,
    resume: bool,
    progress: bool,
    extra: tuple[Any, ...] = (),
    mpi: bool = False,
) -> Path:
    """Run ``cell_fn(cell, cfg, runs_file, resume, *extra)`` for every cell into ``out/<name>/``:
    ``config.json`` (the grid), ``runs/<cell>.jsonl`` (each finished run, appended at once) and
    ``timing.json`` (the figures are the caller's: :mod:`.plotting` reads this module). An
    existing grid is continued only with ``resume`` and only if its config is the same. Returns
    the experiment directory. The writer holds that directory while the grid runs
    (:func:`.results.hold_directory`): a second run into it at the same time is refused with
    :class:`.results.DirectoryInUseError`. With ``mpi`` (launched by ``mpiexec``) every rank
    runs every cell together (``jobs`` must be 1) and rank 0 writes (:func:`is_writer`)."""
    comm = mpi_comm() if mpi else None
    if comm is not None and jobs != 1:
        raise ValueError("--mpi runs the cells one after another on all ranks: use --jobs 1")
    writer = comm is None or comm.Get_rank() == 0
    root = Path(out) / name
    runs = root / "runs"
    cfg_path = root / "config.json"
    with contextlib.ExitStack() as held:
        # the writer holds the directory for the whole grid (results.hold_directory); a refusal,
        # or a directory it cannot create, is the same error on every MPI rank
        error: OSError | None = None
        if writer:
            try:
                held.enter_context(hold_directory(root))
            except OSError as e:
                error = e
        if comm is not None:
            error = comm.bcast(error, root=0)
        if error is not None:
            raise error
        if holds_results(out, name):
            if not resume:
                raise FileExistsError(f"{runs} already holds results: pass --resume to continue that grid, or choose another --out")
            if cfg_path.exists() and read_json(cfg_path) != json.loads(json.dumps(cfg)):
                raise ValueError(f"--resume: the grid in {cfg_path} differs from the one asked for; use the same options or another --out")
        if writer:
            runs.mkdir(parents=True, exist_ok=True)
            write_json(cfg_path, cfg)
        if comm is not None:
            comm.Barrier()
        tasks = [(c, cfg, str(runs / f"{c['id']}.jsonl"), resume, *extra) for c in cells]
        t0 = time.perf_counter()
        run_pool(cell_fn, tasks, jobs=jobs, desc=name, total=len(tasks), progress=progress and writer)
        if not writer:
            return root
        timing = {"seconds": time.perf_counter() - t0, "jobs": jobs, "resumed": resume, "mpi_ranks": comm.Get_size() if comm else None}
        write_json(root / "timing.json", timing)
    return root


def holds_results(out: str | os.PathLike[str], name: str) -> bool:
    """Whether ``out/<name>`` already holds run records (:func:`run_grid` continues it only with
    ``resume``)."""
    return any((Path(out) / name / "runs").glob("*.jsonl"))


def is_writer(mpi: bool) -> bool:
    """Whether this process writes results and figures (always, but for MPI ranks other than 0)."""
    return not mpi or mpi_comm().Get_rank() == 0


# ---------------------------------------------------------------------------------------------
# the projected time of a grid (``--estimate``)
# ---------------------------------------------------------------------------------------------
@dataclass
class Estimate:
    """The projected time of a grid, from timed rounds (:func:`estimate_grid`).

    In each cell, each method's multipliers are probed from the largest down: a run that
    diverges within its probe costs what it cost (the large steps of ``steps="authors"`` die in
    a few rounds); the first run that survives is timed for ``timed_seconds`` (at least
    ``min_rounds`` rounds, after ``warmup`` rounds), and it and every smaller multiplier are
    projected at that time per round for

    * the **upper bound**: ``max_rounds`` rounds each (twice for EF21 with ``horizon="rounds"``);
    * the **expected** count: with ``horizon="rounds"`` the same; with the bits budget, the rounds
      in which the method sends (in expectation) ``budget_factor × b*`` bits, ``b*`` being the
      fewest bits with which a *pilot* reached the target: each method's timed run is continued
      (``pilot_seconds`` shared among them) and, being the grid's run at that step, bounds the
      budget of the runs after it (this method's and the next methods'); without a hit, the
      upper bound.

    Not modelled: EF21's pruning (it only removes runs) and runs that diverge after their probe
    (they stop early): both make the real grid faster than projected."""

    warmup: int = 2
    min_rounds: int = 5
    timed_seconds: float = 0.3
    pilot_seconds: float = 5.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    cells: list[dict[str, Any]] = field(default_factory=list)

    def _probe(self, run: Run) -> float | None:
        """Seconds per round of ``run`` after the warm-up, or None if it diverged."""
        run.advance(self.warmup)
        run.settle(math.inf)
        t0, r0, k = run.seconds, run.round, self.min_rounds
        most = run.opts.rounds_for(run.spec) - run.round  # enough rounds to see MARINA's rare full-gradient rounds
        while not run.diverged and run.round - r0 < most and (run.round - r0 < self.min_rounds or run.seconds - t0 < self.timed_seconds):
            run.advance(min(k, most - (run.round - r0)))
            run.settle(math.inf)
            k *= 2
        return None if run.diverged else (run.seconds - t0) / max(1, run.round - r0)

    def _pilot(self, run: Run, seconds: float) -> float | None:
        """Continue ``run`` for at most ``seconds``: the bits with which it reached the target, or None."""
        t_end = time.perf_counter() + seconds
        while not run.finished and run.hit_bits is None and time.perf_counter() < t_end:
            run.advance(_chunk(run, math.inf, run.opts.rounds_for(run.spec), min(run.opts.chunk_seconds, seconds / 10)))
            run.settle(math.inf)
        return run.hit_bits

    def time_cell(self, problem: Any, cell: dict[str, Any], exponents: Mapping[str, list[int]], opts: SearchOptions,
                  gammas: Mapping[str, float | None], problems: Mapping[str, Any], compressors: Mapping[str, Any]) -> None:
        """Time every method of one cell (called by :func:`search_cell` under :func:`estimate_grid`)."""
        t0 = time.perf_counter()
        pilot = opts.horizon == "budget" and self.pilot_seconds > 0
        hits: list[float] = []
        for method, js in exponents.items():
            spec = Spec.parse(method)
            lost, diverged, per, bits = 0.0, 0, math.nan, math.nan
            for j in js:
                run = Run(problems.get(method, problem), spec, 2.0**j, opts, gamma=gammas.get(method), compressor=compressors.get(method))
                per_j = self._probe(run)
                if per_j is None:
                    lost += run.seconds
                    diverged += 1
                    continue
                per, bits = per_j, run.expected_per_round
                hit = self._pilot(run, self.pilot_seconds / len(exponents)) if pilot else None
                if hit is not None:
                    hits.append(hit)
                break
            # the grid's runs of this method stop at the budget of the fewest bits to the target
            # known when they run: the pilots so far are runs of the grid that run before them
            b_star = min(hits) if hits else None
            upper = opts.rounds_for(spec)
            budget = opts.budget(b_star) if b_star is not None else math.inf
            expected = min(upper, int(math.ceil(budget / bits))) if math.isfinite(budget) and bits > 0 else upper
            runs = len(js) - diverged
            self.rows.append({"cell": cell["id"], "method": method, "runs": runs, "diverged_in_probe": diverged,
                              "seconds_per_round": per, "bits_per_round": bits, "budget_bits": budget,
                              "max_rounds": upper, "expected_rounds": expected,
                              "seconds_max": lost + (runs * upper * per if runs else 0.0),
                              "seconds_expected": lost + (runs * expected * per if runs else 0.0)})
        self.cells.append({"cell": cell["id"], "timing_seconds": time.perf_counter() - t0, "bits_to_target": min(hits) if hits else None})


_ESTIMATE: contextvars.ContextVar[Estimate | None] = contextvars.ContextVar("permk_estimate", default=None)


@contextlib.contextmanager
def _estimating(est: Estimate) -> Any:
    token = _ESTIMATE.set(est)
    try:
        yield est
    finally:
        _ESTIMATE.reset(token)


def estimate_grid(cell_fn: Callable[..., Any], grid_json: dict[str, Any], cells: Sequence[dict[str, Any]], est: Estimate,
                  *, progress: bool = False) -> Estimate:
    """Project the time of a grid: each cell's function runs as in :func:`run_grid` (the same
    problem, steps and methods) but its :func:`search_cell` only times the runs
    (:class:`Estimate`); nothing is written. A cell's set-up (problem, constants) is measured
    and counted once per cell. Returns ``est`` with one row per cell and method."""
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    with _estimating(est):
        for cell in tqdm(cells, desc="estimate", unit="cell", disable=not progress):
            t0 = time.perf_counter()
            cell_fn(cell, grid_json, os.devnull, False)
            info = est.cells[-1]
            info["setup_seconds"] = max(0.0, time.perf_counter() - t0 - info["timing_seconds"])
    return est


def format_duration(s: float) -> str:
    """Seconds as ``"4.2 s"``, ``"12 min"`` or ``"3.5 h"`` (``"?"`` if not finite)."""
    if not math.isfinite(s):
        return "?"
    if s < 90:
        return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _cell_seconds(est: Estimate, cell: dict[str, Any]) -> tuple[float, float]:
    """One cell's (upper bound, expected) seconds in ``est``, its set-up included."""
    rows = [r for r in est.rows if r["cell"] == cell["cell"]]
    setup = cell.get("setup_seconds", 0.0)
    return setup + sum(r["seconds_max"] for r in rows), setup + sum(r["seconds_expected"] for r in rows)


def projected_seconds(est: Estimate) -> tuple[float, float]:
    """The total (upper bound, expected) seconds of the cells in ``est`` (set-ups included)."""
    per_cell = [_cell_seconds(est, c) for c in est.cells]
    return sum(m for m, _ in per_cell), sum(e for _, e in per_cell)


def format_estimate(est: Estimate, opts: SearchOptions, *, jobs: int = 1) -> str:
    """The table of :func:`estimate_grid`: per cell and method the runs, seconds per round,
    rounds per run and seconds per run (upper bound / expected), per cell and in total."""
    lines = [f"{'cell':<16} {'method':<16} {'runs':>4} {'s/round':>9} {'rounds/run max/exp':>19} "
             f"{'per run max/exp':>17} {'in all max/exp':>17}"]
    for c in est.cells:
        for r in (r for r in est.rows if r["cell"] == c["cell"]):
            per = r["seconds_per_round"]
            lines.append(f"{r['cell']:<16} {r['method']:<16} {r['runs']:>4} {per:>9.2e} "
                         f"{r['max_rounds']:>9} / {r['expected_rounds']:<7} "
                         f"{format_duration(r['max_rounds'] * per):>7} / {format_duration(r['expected_rounds'] * per):<7} "
                         f"{format_duration(r['seconds_max']):>7} / {format_duration(r['seconds_expected']):<7}")
        cmax, cexp = _cell_seconds(est, c)
        lines.append(f"{c['cell']:<16} cell: set-up {format_duration(c.get('setup_seconds', 0.0))}, at most {format_duration(cmax)}, "
                     f"expected {format_duration(cexp)}")
    tot_max, tot_exp = projected_seconds(est)
    par = f", about 1/{jobs} of it with --jobs {jobs}" if jobs > 1 else ""
    lines.append(f"grid: at most {format_duration(tot_max)}, expected {format_duration(tot_exp)} in one process{par}")
    if opts.horizon == "rounds":
        lines.append("assumed: every run goes its fixed rounds (EF21 twice --rounds); runs that diverged in their probe count as measured")
    else:
        lines.append(f"assumed: at most --rounds ({opts.max_rounds}) per run; expected: runs stop at the cell's bits budget, "
                     f"{opts.budget_factor:g} × the fewest bits a pilot run (each method's timed run, continued) needed to reach the target "
                     "(no hit: the maximum); EF21's pruning not counted")
    return "\n".join(lines)
