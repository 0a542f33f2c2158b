"""The per-cell search shared by the experiment grids: runs advanced in chunks (:class:`Run`),
the search over step-size multipliers with a bits budget (:func:`search_cell`), and the best-run
criterion (:func:`score`, :func:`best_runs`).

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
of :class:`~permk.experiments.protocols.SearchOptions` (``--protocol authors`` sets them all,
:data:`~permk.experiments.protocols.AUTHORS`):

* ``best="last90"``: the best run is the one with the smallest mean of ``log10 ‖∇f‖²`` over the
  last 90% of its recorded rounds, runs with a non-finite value dropped (their plot scripts,
  plots/permutation_compressor/quad_prog_plot.py:76-82);
* ``horizon="rounds"``: no bits budget; every run goes ``max_rounds`` rounds, error feedback
  (EF21) twice as many (config_quadratic.py:109,130; config_libsvm.py:134);
* ``steps="authors"``: the fixed range of multipliers ``2^i`` of the experiment's configs (not
  cut at the stability edge; :func:`~permk.experiments.specs.step_exponents`);
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

import json
import math
import os
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .grid import mpi_comm
from .protocols import SearchOptions
from .results import append_record, from_json, read_records, thin_indices, to_jsonable
from .specs import Spec, plugin_code

__all__ = ["Run", "score", "cell_budget", "best_runs", "chunk_rounds", "search_cell", "read_back", "Search"]

#: A cell's search: :func:`search_cell`'s signature (what an experiment's cell function calls;
#: :meth:`permk.experiments.estimate.Estimate.search_cell` times the runs instead).
Search = Callable[..., list[dict[str, Any]]]


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
        with plugin_code(f"the run of {self.spec.key}", *self.spec.parts):  # a plugin's exception named
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


def chunk_rounds(run: Run, cap: float, max_rounds: int, chunk_seconds: float) -> int:
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
                    steps = chunk_rounds(run, opts.budget(min(best_hit, own)), opts.rounds_for(run.spec), opts.chunk_seconds)
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
