"""The classification experiment: the authors' nonconvex tasks on labelled data.

Problems (:mod:`permk.problems.classification`): :class:`~permk.NonconvexSigmoid` on a binary task (by
default Fashion-MNIST's T-shirt/top against Shirt, :func:`permk.problems.datasets.load_fashion_mnist`
with ``classes=(0, 6)``, from Debian's ``dataset-fashion-mnist``), or
:class:`~permk.NonconvexMultiClass` on the ten classes (``task="multiclass"``, ``d = 7,850``);
``data`` may instead name a LibSVM/svmlight file (:func:`permk.problems.datasets.read_libsvm`), or be
``"heart_scale"``, LIBSVM's small example set from Debian's ``liblinear-tools``
(:func:`permk.problems.datasets.load_heart_scale`). The
samples are split over ``n`` workers, equally or with the authors' heterogeneity ``p̂``
(:func:`permk.problems.datasets.shard_indices`); one cell per ``p̂``.

Methods (default): MARINA+PermK, MARINA+RandK, EF21+TopK (full gradients), VR-MARINA+PermK
(minibatches of ``batch_size`` samples and, with probability ``p``, a full gradient) and
minibatch SGD, each with its theory step times ``2^j`` (:mod:`permk.experiments.search`: the
search, the bits budget, the best-run criterion). Every run records the bits and the
gradient-oracle calls (sample gradients) per worker, and the figures plot ``‖∇f‖²`` against
both. Results go to ``OUT/classify/runs/<cell>.jsonl``, figures to ``OUT/classify/figures``.

With ``mpi`` (``mpiexec -n R permk classify --mpi``) every run is distributed over the ranks
(:mod:`permk.distributed`): each rank reads the data, rank 0 computes the smoothness constants
and sends them to all, and each rank keeps only its block of workers' samples
(:class:`permk.problems.HeldShards`); rank 0 writes. The iterates are the single process's
up to the order of the sums over workers (the recorded ``‖∇f‖²`` sums the workers' gradients).
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .grid import data_digest, mpi_comm, run_grid
from .protocols import SearchOptions, options_from_args, search_from_args
from .search import Search, search_cell
from .specs import Spec, step_exponents, theory_gamma

__all__ = ["ClassifyGrid", "PAPER_GRID", "QUICK_GRID", "run_classify", "classify_cell", "grid_from_args", "load_task"]

#: The methods of the experiment, in the order they run in a cell (PermK first: it is cheap and
#: sets the budget).
METHODS = ("marina-permk", "marina-randk", "ef21-topk", "vr_marina-permk", "sgd")
FASHION_MNIST = "fashion-mnist"
#: ``--data heart_scale``: LIBSVM's example set from Debian's liblinear-tools
#: (:func:`permk.problems.datasets.load_heart_scale`).
HEART_SCALE = "heart_scale"
TASKS = ("binary", "multiclass")


@dataclass(frozen=True)
class ClassifyGrid:
    """A grid of the classification experiment: one data set and task, ``n`` workers, one cell
    per heterogeneity ``p̂`` (None: equal shuffled shards)."""

    data: str = FASHION_MNIST
    task: str = "binary"
    classes: tuple[int, int] = (0, 6)
    samples: int | None = None  # the first N samples only
    n: int = 100
    p_hats: tuple[float | None, ...] = (None,)
    methods: tuple[str, ...] = METHODS
    max_multipliers: int | None = None
    problem_seed: int = 0
    options: SearchOptions = field(default_factory=lambda: SearchOptions(tol=1e-3, max_rounds=5000, batch_size=32))

    name = "classify"

    def cells(self) -> list[dict[str, Any]]:
        return [{"id": "equal" if p is None else f"phat{p:g}", "n": self.n, "p_hat": p, "row": 0, "col": k}
                for k, p in enumerate(self.p_hats)]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["name"] = self.name
        return d


PAPER_GRID = ClassifyGrid()
#: ``--quick``: 3,000 samples of the binary task over 10 workers, the three largest multipliers,
#: 300 rounds, the target ``‖∇f‖² ≤ 3e-3·‖∇f(x⁰)‖²`` (the best runs reach it in ~200 rounds).
QUICK_GRID = ClassifyGrid(samples=3000, n=10, max_multipliers=3,
                          options=SearchOptions(tol=3e-3, max_rounds=300, budget_factor=10.0, batch_size=16))


@functools.lru_cache(maxsize=4)
def load_task(data: str, task: str, classes: tuple[int, int], samples: int | None) -> tuple[Any, np.ndarray, str]:
    """The samples ``X``, labels ``y`` and a description of the data of a task (cached: the
    command line checks them before a grid starts and its cells read them again). The labels
    must suit the task (two values for the binary task, at least two for the multi-class one)
    and the samples' squared norms must be at most
    :data:`permk.problems.finite_sum.CONSTANT_LIMIT`: a ValueError naming the data otherwise."""
    from permk.problems.datasets import binary_labels, class_labels, load_fashion_mnist, load_heart_scale, read_libsvm
    from permk.problems.finite_sum import CONSTANT_LIMIT, row_sq_norms

    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    if data == FASHION_MNIST:
        d = load_fashion_mnist(classes=classes if task == "binary" else None, limit=samples)
        X, y, source, name = d.X, d.y, d.source, d.source
    else:
        d = load_heart_scale() if data == HEART_SCALE else read_libsvm(data)
        X, y, source, name = d.X, d.y, f"{d.source} ({task})", d.source
        if samples is not None:
            X, y = X[:samples], y[:samples]
    values = class_labels(y)[1]
    if task == "binary":
        try:
            y = binary_labels(y)
        except ValueError as e:
            hint = " (--task multiclass for more classes)" if values.size > 2 else ""
            raise ValueError(f"{name}: {e}{hint}") from None
    elif values.size < 2:
        raise ValueError(f"{name}: the multi-class task needs at least two label values, got {values.size}: {values.tolist()}")
    top = float(row_sq_norms(X).max())
    if not top <= CONSTANT_LIMIT:
        raise ValueError(f"{name}: the samples are too large for the smoothness constants: the largest squared norm of a "
                         f"sample is {top:.3g}, beyond 2**400 (the step sizes square the constants); rescale the features")
    return X, y, source


def make_problem(grid_json: dict[str, Any], p_hat: float | None) -> tuple[Any, str]:
    """The cell's problem and the data's description."""
    from permk.problems.classification import NonconvexMultiClass, NonconvexSigmoid

    X, y, source = load_task(grid_json["data"], grid_json["task"], tuple(grid_json["classes"]), grid_json["samples"])
    n = int(grid_json["n"])
    if n > X.shape[0]:
        raise ValueError(f"--n {n} is larger than the {X.shape[0]:,} samples of {source}")
    cls = NonconvexSigmoid if grid_json["task"] == "binary" else NonconvexMultiClass
    return cls(X, y, n=n, seed=grid_json["problem_seed"], p_hat=p_hat), source


def _describe(problem: Any, source: str, grid_json: dict[str, Any], cell: dict[str, Any], L_minus: float) -> dict[str, Any]:
    """What the figures write of a cell (:mod:`.plotting`): the problem line of the title, the
    panel's title and how to read the panels."""
    loss = "nonconvex sigmoid loss (1 − σ(y aᵀx))²" if grid_json["task"] == "binary" else \
        f"multi-class nonconvex loss (1 − softmax(Wᵀa)_y)² + (λ/2)‖W‖², λ = {problem.lam:g}"
    path, _, what = source.partition(" (")  # "FILE (what the loader kept)"
    data = f"Fashion-MNIST, {what[:-1]}" if grid_json["data"] == FASHION_MNIST else Path(path).name
    split = "equal shards" if cell["p_hat"] is None else f"p̂ = {cell['p_hat']:g}"
    return {
        "problem": (f"{loss} on {data}: {int(problem.sample_counts.sum()):,} samples, n = {problem.n:,} workers, "
                    f"d = {problem.d:,}, minibatch b = {grid_json['options']['batch_size']}"),
        "panel": f"n = {problem.n:,} workers, {split}, L− = {L_minus:.3g}",
        "how": ("γ: step size, a multiple of the method's theory step (from the data's smoothness constants). "
                "Stochastic methods (VR-MARINA, SGD) compute b sample gradients a round, full-gradient ones every "
                "sample of their shard; p̂: probability that a sample is replaced by a shared one."),
        "oracle_axis": True,
    }


def classify_cell(cell: dict[str, Any], grid_json: dict[str, Any], path: str, resume: bool, progress: bool = False,
                  mpi: bool = False, *, search: Search = search_cell) -> dict[str, Any]:
    """Run one cell (a process-pool task; with ``mpi``, every rank calls it and keeps only its
    own workers' samples, see the module docstring): build the problem, run the search, return
    a summary."""
    opts = SearchOptions(**grid_json["options"])
    t0 = time.perf_counter()
    problem, source = make_problem(grid_json, cell["p_hat"])
    if mpi:
        from ..distributed import workers_of

        comm = mpi_comm()
        smooth = comm.bcast(problem.smoothness() if comm.Get_rank() == 0 else None, root=0)
        figure = _describe(problem, source, grid_json, cell, smooth["L_minus"])
        problem = problem.held(workers_of(problem.n, comm), constants=smooth)
        load_task.cache_clear()  # the rank keeps its own workers' samples only
    else:
        figure = _describe(problem, source, grid_json, cell, float(problem.L_minus))
    consts = {"L_minus": float(problem.L_minus), "L_plus": float(problem.L_plus), "L_pm": float(problem.L_pm),
              "L_max": float(problem.L_max), "data": source, "samples": int(problem.sample_counts.sum())}
    exps: dict[str, list[int]] = {}
    gth: dict[str, float] = {}
    for m in grid_json["methods"]:
        spec = Spec.parse(m)
        gth[m] = theory_gamma(problem, spec, opts)
        exps[m] = step_exponents(m, gth[m], float(problem.L_minus), opts, None, max_count=grid_json["max_multipliers"])
    base = {"experiment": grid_json["name"], "constants": consts, "gamma_theory_by_method": gth,
            "problem_seed": grid_json["problem_seed"], "figure": figure}
    bar = None
    if progress:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        bar = tqdm(total=sum(len(v) for v in exps.values()), desc=cell["id"], leave=False, unit="run")
    recs = search(problem, cell, exps, opts, path, base=base, resume=resume, on_run=(lambda r: bar.update(1)) if bar else None,
                       mpi=mpi)
    if bar is not None:
        bar.close()
    return {"cell": cell["id"], "runs": len(recs), "seconds": time.perf_counter() - t0}


def run_classify(grid: ClassifyGrid, out: str | os.PathLike[str], *, jobs: int = 1, resume: bool = False,
                 progress: bool = True, plot: bool = True, mpi: bool = False) -> Path:
    """Run a grid into ``out/classify/`` (see the module docstring) and draw its figures.
    Returns the experiment directory. With ``mpi`` (launched by ``mpiexec``) every run is
    distributed over the ranks, each holding its block of workers' samples; rank 0 writes. The
    grid's ``config.json`` holds a digest of the samples and labels read
    (:func:`.grid.data_digest`): ``resume`` refuses data that changed."""
    X, y, _ = load_task(grid.data, grid.task, grid.classes, grid.samples)
    cfg = {**grid.to_json(), "data_digest": data_digest(X, y)}  # --resume refuses changed data
    del X, y
    root = run_grid(grid.name, cfg, classify_cell, grid.cells(), out, jobs=jobs, resume=resume, progress=progress,
                    extra=(False, mpi), mpi=mpi)
    from .plotting import plot_grid

    return plot_grid(root, plot=plot, mpi=mpi)


def grid_from_args(args: Any) -> ClassifyGrid:
    """The grid a ``permk classify`` command line asks for; its data are read and checked here
    (a bad file, labels that do not suit the task, more workers than samples), before anything
    runs or is written."""
    g = QUICK_GRID if args.quick else PAPER_GRID
    o = options_from_args(g.options, args, "classify")
    if o.steps == "authors":
        raise ValueError("--steps authors: the classification experiment has no authors' step ranges; use --steps edge")
    if args.batch_size is not None:
        o = replace(o, batch_size=args.batch_size)
    g = replace(g, options=o, problem_seed=args.seed if args.seed is not None else g.problem_seed, task=args.task,
                data=args.data if args.data == HEART_SCALE else FASHION_MNIST if args.data in (None, FASHION_MNIST) else os.path.abspath(args.data))
    if args.n is not None:
        g = replace(g, n=args.n)
    if args.p_hat:
        g = replace(g, p_hats=tuple(args.p_hat))
    if args.samples is not None:
        g = replace(g, samples=args.samples)
    g = search_from_args(g, args)
    X, _, source = load_task(g.data, g.task, g.classes, g.samples)
    if g.n > X.shape[0]:
        raise ValueError(f"--n {g.n} is larger than the {X.shape[0]:,} samples of {source}")
    return g
