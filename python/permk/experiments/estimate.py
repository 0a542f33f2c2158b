"""The projected time of a grid (``--estimate``): :class:`Estimate` times a few rounds of each
method in each cell and projects the grid's time, an upper bound and the expected time."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .protocols import SearchOptions
from .search import Run, chunk_rounds
from .specs import Spec

__all__ = ["Estimate", "estimate_grid", "format_duration", "projected_seconds", "format_estimate"]


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
      (``pilot_seconds`` per cell, what a method leaves unused going to the next) and, being the
      grid's run at that step, bounds the budget of the runs after it (this method's and the
      next methods'); without a hit, the upper bound. A pilot that diverges is counted as a
      diverged run (its measured cost) and the next step is timed and piloted in its place.

    Not modelled: EF21's pruning (it only removes runs) and runs that diverge after their probe
    and pilot (they stop early): both make the real grid faster than projected. The seconds are
    wall-clock seconds measured while the estimate ran: on a machine that other jobs keep busy
    they vary with that load, as the grid's own time does."""

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
            run.advance(chunk_rounds(run, math.inf, run.opts.rounds_for(run.spec), min(run.opts.chunk_seconds, seconds / 10)))
            run.settle(math.inf)
        return run.hit_bits

    def search_cell(self, problem: Any, cell: dict[str, Any], exponents: Mapping[str, list[int]], opts: SearchOptions,
                    path: str, *, gammas: Mapping[str, float | None] | None = None, problems: Mapping[str, Any] | None = None,
                    compressors: Mapping[str, Any] | None = None, **ignored: Any) -> list[dict[str, Any]]:
        """A cell's search (:data:`~permk.experiments.search.Search`) that times the cell's runs
        (:meth:`time_cell`) and runs, writes and returns nothing: what :func:`estimate_grid`
        hands an experiment's cell function."""
        self.time_cell(problem, cell, exponents, opts, gammas or {}, problems or {}, compressors or {})
        return []

    def time_cell(self, problem: Any, cell: dict[str, Any], exponents: Mapping[str, list[int]], opts: SearchOptions,
                  gammas: Mapping[str, float | None], problems: Mapping[str, Any], compressors: Mapping[str, Any]) -> None:
        """Time every method of one cell (:meth:`search_cell`)."""
        t0 = time.perf_counter()
        pilot = opts.horizon == "budget" and self.pilot_seconds > 0
        hits: list[float] = []
        pilot_left = self.pilot_seconds
        for k, (method, js) in enumerate(exponents.items()):
            spec = Spec.parse(method)
            lost, diverged, per, bits = 0.0, 0, math.nan, math.nan
            share = pilot_left / (len(exponents) - k)  # what the methods before left, shared by the rest
            for j in js:
                run = Run(problems.get(method, problem), spec, 2.0**j, opts, gamma=gammas.get(method), compressor=compressors.get(method))
                per_j = self._probe(run)
                if per_j is None:
                    lost += run.seconds
                    diverged += 1
                    continue
                if math.isnan(per):
                    per, bits = per_j, run.expected_per_round
                if not pilot:
                    break
                t_pilot = time.perf_counter()
                hit = self._pilot(run, max(0.0, share))
                share -= time.perf_counter() - t_pilot
                pilot_left -= time.perf_counter() - t_pilot
                if run.diverged:  # diverged in its pilot: the grid's run stops there too; the next step is timed
                    lost += run.seconds
                    diverged += 1
                    continue
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


def estimate_grid(cell_fn: Callable[..., Any], grid_json: dict[str, Any], cells: Sequence[dict[str, Any]], est: Estimate,
                  *, progress: bool = False) -> Estimate:
    """Project the time of a grid: each cell's function runs as in
    :func:`~permk.experiments.grid.run_grid` (the same problem, steps and methods) with
    :meth:`Estimate.search_cell` as its search, which only times the runs; nothing is written. A cell's set-up (problem, constants) is measured
    and counted once per cell. Returns ``est`` with one row per cell and method."""
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    for cell in tqdm(cells, desc="estimate", unit="cell", disable=not progress):
        t0 = time.perf_counter()
        cell_fn(cell, grid_json, os.devnull, False, search=est.search_cell)
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
    lines.append(f"grid: expected {format_duration(tot_exp)}, at most {format_duration(tot_max)} in one process{par}")
    if opts.horizon == "rounds":
        lines.append("assumed: every run goes its fixed rounds (EF21 twice --rounds); runs that diverged in their probe count as measured")
    else:
        lines.append(f"assumed: at most --rounds ({opts.max_rounds}) per run; expected: runs stop at the cell's bits budget, "
                     f"{opts.budget_factor:g} × the fewest bits a pilot run (each method's timed run, continued) needed to reach the target "
                     "(no hit: the maximum); EF21's pruning not counted")
    return "\n".join(lines)
