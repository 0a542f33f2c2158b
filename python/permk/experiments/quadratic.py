"""The synthetic quadratic experiment (Section "Experiments", Appendix "Extra Experiments").

Grid: ``n ∈ {10, 1000, 10000}`` workers, ``d = 1000``, ``λ = 1e-6`` (``λ = 1e-4`` and the PL
step sizes with ``pl=True``), noise scales ``s ∈ {0, 0.05, 0.1, 0.2, 0.8}`` of Algorithm 1
(:meth:`permk.Quadratic.synthetic`). Methods: MARINA+PermK, MARINA+RandK(K = ⌈d/n⌉) and
EF21+TopK(K = ⌈d/n⌉) with the theory's parameters computed from the paper's pessimistic
constants ``L_+² = L_±² = (1/n) Σ L_i²`` ("Experiments setup") and the step-size multipliers
``2^j`` (see :mod:`permk.experiments.search` for the search, the bits budget and the best-run
criterion). Every run is written to ``OUT/quadratic[-pl]/runs/n{n}_s{s}.jsonl`` when it
finishes; figures go to ``OUT/quadratic[-pl]/figures``.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .._validate import check_alloc
from .grid import mpi_comm, run_grid
from .protocols import SearchOptions, options_from_args, search_from_args
from .search import Search, search_cell
from .specs import METHODS, Spec, step_exponents, theory_gamma

__all__ = ["QuadraticGrid", "PAPER_GRID", "QUICK_GRID", "theory_gamma", "run_quadratic", "quadratic_cell"]


@dataclass(frozen=True)
class QuadraticGrid:
    """A grid of the quadratic experiment (the paper's by default)."""

    ns: tuple[int, ...] = (10, 1000, 10000)
    noise_scales: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.8)
    d: int = 1000
    lam: float | None = None  # default: 1e-6, or 1e-4 with pl
    methods: tuple[str, ...] = METHODS
    max_multipliers: int | None = None  # None: every 2^j from the stability edge down to 2^0
    problem_seed: int = 0
    options: SearchOptions = field(default_factory=SearchOptions)
    skip: tuple[str, ...] = ()  # ids of cells (``n10000_s0.8``) left out of the grid

    @property
    def lam_value(self) -> float:
        if self.lam is not None:
            return float(self.lam)
        return 1e-4 if self.options.pl else 1e-6

    @property
    def name(self) -> str:
        return "quadratic-pl" if self.options.pl else "quadratic"

    def cells(self) -> list[dict[str, Any]]:
        """The cells, heaviest first (large n), so a process pool stays busy."""
        out = []
        for n in sorted(self.ns, reverse=True):
            for s in self.noise_scales:
                if f"n{n}_s{s:g}" in self.skip:
                    continue
                out.append({"id": f"n{n}_s{s:g}", "n": int(n), "d": self.d, "noise_scale": float(s), "lam": self.lam_value,
                            "row": sorted(self.ns).index(n), "col": list(self.noise_scales).index(s)})
        return out

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["lam"] = self.lam_value
        d["name"] = self.name
        return d


PAPER_GRID = QuadraticGrid()
#: The multipliers ``2^i`` of the authors' quadratic runs, ``[low, high)``: ``--step_size_range 0
#: 20`` for every compressor in their scripts.txt (config_quadratic.py:95; EF21+TopK's
#: ``--top_k_factor 3`` is EF21's protocol: :mod:`permk.experiments.protocols`); used with
#: ``steps="authors"``.
AUTHORS_STEPS = ("quadratic", (0, 20))
#: The ``--quick`` grid: the same n (the claims need n = 1000 and 10000), L± = 0 and the most
#: heterogeneous noise scale, the three largest multipliers, a budget of 10× the bits the best
#: run needs to reach the target (20× in the full grid), without the cell n = 10000, s = 0.8:
#: there EF21's rounds (every worker's residual, 10⁷ values a round at the memory-bandwidth
#: floor) took 70% of the grid's time (32 of 44 s of CPU), for what n = 1000, s = 0.8 shows
#: too (EF21 ahead in a heterogeneous cell).
QUICK_GRID = QuadraticGrid(noise_scales=(0.0, 0.8), max_multipliers=3, options=SearchOptions(max_rounds=4000, budget_factor=10.0),
                           skip=("n10000_s0.8",))


def _constants(q: Any) -> dict[str, float]:
    return {
        "L_minus": float(q.L_minus),
        "L_plus": float(q.L_plus),
        "L_pm": float(q.L_pm),
        "L_i_rms": math.sqrt(float(np.mean(np.asarray(q.L_i) ** 2))),
        "mu": float(q.mu),
        "f_star": float(q.f_star),
    }


def _identical_workers(cell: dict[str, Any], spec: Spec, compressor: Any, mpi: bool) -> int | None:
    """L± = 0: all workers are the same function, so when they stay identical under the method
    (:meth:`Spec.identical_workers_collapse`: EF21 with TopK) the iterates do not depend on n;
    the method then runs with as few workers as it can (same iterates up to rounding of the mean,
    O(d) instead of O(nd) per round), each still sending K = ⌈d/n⌉ values of the cell's n: one in
    a single process, one per rank on MPI. Returns that number of workers, or None."""
    if not (cell["noise_scale"] == 0 and spec.identical_workers_collapse(compressor)):
        return None
    few = mpi_comm().Get_size() if mpi else 1
    return few if few < cell["n"] else None


def check_memory(grid: QuadraticGrid, mpi: bool = False) -> None:
    """Refuse a grid whose methods' states cannot fit (MemoryError naming the method and the cell)
    before any of its runs starts."""
    for cell in grid.cells():
        for m in grid.methods:
            spec = Spec.parse(m)
            n = _identical_workers(cell, spec, spec.compressor(cell["n"], cell["d"]), mpi) or cell["n"]
            check_alloc((n, cell["d"]) if spec.method.state_type.per_worker_arrays() else (cell["d"],), f"the state of {m} in cell {cell['id']}", count=2)


def quadratic_cell(cell: dict[str, Any], grid_json: dict[str, Any], path: str, resume: bool, progress: bool = False,
                   mpi: bool = False, *, search: Search = search_cell) -> dict[str, Any]:
    """Run one cell (a process-pool task): build the instance, run the search, return a summary."""
    import permk

    opts = SearchOptions(**grid_json["options"])
    t0 = time.perf_counter()
    q = permk.Quadratic.synthetic(cell["n"], cell["d"], cell["lam"], cell["noise_scale"], seed=grid_json["problem_seed"])
    consts = _constants(q)
    exps: dict[str, list[int]] = {}
    gth: dict[str, float] = {}
    problems: dict[str, Any] = {}
    compressors: dict[str, Any] = {}
    for m in grid_json["methods"]:
        spec = Spec.parse(m)
        gth[m] = theory_gamma(q, spec, opts)
        exps[m] = step_exponents(m, gth[m], consts["L_minus"], opts, AUTHORS_STEPS, max_count=grid_json["max_multipliers"])
        compressor = spec.compressor(cell["n"], cell["d"])
        few = _identical_workers(cell, spec, compressor, mpi)
        if few is not None:
            problems[m] = permk.Quadratic.synthetic(few, cell["d"], cell["lam"], 0.0, seed=grid_json["problem_seed"])
            compressors[m] = compressor
    base = {"experiment": grid_json["name"], "constants": consts, "gamma_theory_by_method": gth, "problem_seed": grid_json["problem_seed"]}
    bar = None
    if progress:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        bar = tqdm(total=sum(len(v) for v in exps.values()), desc=cell["id"], leave=False, unit="run")
    recs = search(q, cell, exps, opts, path, base=base, resume=resume, on_run=(lambda r: bar.update(1)) if bar else None,
                       problems=problems, compressors=compressors, mpi=mpi)
    if bar is not None:
        bar.close()
    return {"cell": cell["id"], "runs": len(recs), "seconds": time.perf_counter() - t0}


def _nested_bars(progress: bool, jobs: int, mpi: bool) -> bool:
    """Whether each cell shows its own bar of runs under the grid's bar: in one process and on a
    terminal only (a nested bar redraws by moving the cursor up, ``ESC [A``, which a log file
    would keep as hundreds of lines)."""
    return progress and jobs <= 1 and not mpi and sys.stderr.isatty()


def run_quadratic(grid: QuadraticGrid, out: str | os.PathLike[str], *, jobs: int = 1, resume: bool = False,
                  progress: bool = True, plot: bool = True, mpi: bool = False) -> Path:
    """Run a grid into ``out/<grid.name>/`` (see the module docstring) and draw its figures.
    Returns the experiment directory."""
    check_memory(grid, mpi)
    root = run_grid(grid.name, grid.to_json(), quadratic_cell, grid.cells(), out, jobs=jobs, resume=resume,
                    progress=progress, extra=(_nested_bars(progress, jobs, mpi), mpi), mpi=mpi)
    from .plotting import plot_grid

    return plot_grid(root, plot=plot, mpi=mpi)


def grid_from_args(args: Any) -> QuadraticGrid:
    """The grid a ``permk quadratic`` command line asks for."""
    g = QUICK_GRID if args.quick else PAPER_GRID
    o = replace(options_from_args(g.options, args, "quadratic"), pl=bool(args.pl))
    g = replace(g, options=o, problem_seed=args.seed if args.seed is not None else g.problem_seed)
    if args.n:
        g = replace(g, ns=tuple(args.n))
    if args.noise_scales:
        g = replace(g, noise_scales=tuple(args.noise_scales))
    g = search_from_args(g, args)
    if args.d is not None:
        g = replace(g, d=args.d)
    return g
