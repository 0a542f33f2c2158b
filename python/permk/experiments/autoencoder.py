"""The linear autoencoder experiment (Section "Training an autoencoder with MNIST", Appendix
"Experiment with MNIST: full description"): the grid, its cells, the step sizes and the command
line's options. The problem, its authors' options (``split=``, ``loss=``) and its oracles are
:class:`permk.problems.LinearAutoencoder` (:mod:`permk.problems.autoencoder`); the images come
from :func:`permk.problems.datasets.load_images`.

**Step sizes.** The smoothness constants are not known in closed form. Unless ``--gamma`` is
given, the base step of each method is the theory's (Theorem "AB" for MARINA, the EF21 theorem)
with the pessimistic choice ``L_+ = L_± = sqrt(mean L_i²)`` estimated at the start point and at
the PCA solution by power iteration on finite-difference Hessian-vector products: ``L_−`` from
``f``, ``L_i`` from a sample of splits (:func:`permk.problems.autoencoder.estimate_constants`).
These are estimates, not bounds, and are recorded with every run. The grid multiplies the base
step by ``2^j`` as for the quadratic; the figures' legends give the steps themselves, like the
paper's.

**EF21** runs on the grouped problem (one virtual worker per distinct split,
:meth:`permk.problems.LinearAutoencoder.grouped`): TopK is positively homogeneous, so its
iterates are exactly those of ``n`` workers, at the memory of ``S`` (each worker still sends
``K = ⌈d/n⌉`` values).
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from .._validate import check_choice
from ..problems.autoencoder import LOSSES, SPLITS, LinearAutoencoder, estimate_constants
from ..problems.datasets import load_images
from .grid import data_digest, mpi_comm, run_grid
from .protocols import SearchOptions, options_from_args, search_from_args
from .search import Search, search_cell
from .specs import METHODS, Spec, step_exponents, theory_gamma

__all__ = ["AutoencoderGrid", "PAPER_GRID", "QUICK_GRID", "run_autoencoder"]


def theory_gammas(ae: LinearAutoencoder, consts: dict[str, Any], methods: tuple[str, ...], opts: SearchOptions) -> dict[str, float]:
    """The theory's step of each method from the estimated constants (already the pessimistic
    choice), as :func:`permk.marina` / :func:`permk.ef21` would choose it (no PL step)."""
    est = SimpleNamespace(n=ae.n, d=ae.d, L_minus=consts["L_minus"], L_plus=consts["L_plus"], L_pm=consts["L_pm"])
    return {m: theory_gamma(est, Spec.parse(m), replace(opts, pl=False), constants="exact") for m in methods}


@dataclass(frozen=True)
class AutoencoderGrid:
    """A grid of the autoencoder experiment (the paper's by default)."""

    workers: int = 1000
    p_hats: tuple[float, ...] = (0.0, 0.5, 0.75, 0.9, 1.0)
    lams: tuple[float, ...] = (0.0, 1e-5, 1e-3)
    d_e: int = 16
    images: int | None = None
    data: str | None = None
    gamma: float | None = None
    methods: tuple[str, ...] = METHODS
    max_multipliers: int | None = None
    problem_seed: int = 0
    options: SearchOptions = field(default_factory=lambda: SearchOptions(max_rounds=3000, tol=1e-3))
    #: How the images are split over the workers, as in the paper's text (``"per-worker"``, the
    #: default) or in the authors' code (``"per-sample"``); see :class:`~permk.problems.LinearAutoencoder`.
    split: str = "per-worker"
    #: The loss, the paper's (``"paper"``, the default) or the authors' code's (``"authors"``).
    loss: str = "paper"
    #: The type of the images and of the products, ``"float64"`` or ``"float32"``.
    dtype: str = "float64"

    name = "autoencoder"

    def __post_init__(self) -> None:
        check_choice(self.split, "split", SPLITS)
        check_choice(self.loss, "loss", LOSSES)
        check_choice(self.dtype, "dtype", ("float64", "float32"))

    def cells(self) -> list[dict[str, Any]]:
        out = []
        for r, lam in enumerate(self.lams):
            for c, ph in enumerate(self.p_hats):
                out.append({"id": f"lam{lam:g}_p{ph:g}", "lam": float(lam), "p_hat": float(ph), "n": self.workers, "row": r, "col": c})
        return out

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["name"] = self.name
        return d


PAPER_GRID = AutoencoderGrid()
#: The multipliers ``2^i`` of the authors' autoencoder runs, ``[low, high)``: ``--step_size_range
#: -5 4`` for every compressor in their scripts.txt; used with ``steps="authors"``.
AUTHORS_STEPS = ("autoencoder", (-5, 4))
#: ``--quick``: 20 workers on the first 1,000 images, heterogeneous and homogeneous splits,
#: λ = 1e-3, the two largest multipliers below the stability edge ``2/L_−`` (MARINA's 4× and 8×
#: its theory step, EF21's 32× and 64×), at most 300 rounds; the target is
#: ``‖∇f‖² ≤ 1e-2·‖∇f(x⁰)‖²`` and the budget 5× the fewest bits that reach it. Every method
#: reaches that target, in 50–120 rounds: each step is a descent step (``γ L_− < 2``), and after
#: the saddle the iterates pass in their first rounds (gradient descent at its theory step
#: ``1/L_−`` rises there too) ``‖∇f‖²`` falls steadily. The paper's ``1e-3`` takes gradient
#: descent itself about 600 rounds at ``1/L_−`` (300 at ``2/L_−``), too long for a quick look.
QUICK_GRID = AutoencoderGrid(workers=20, p_hats=(0.0, 1.0), lams=(1e-3,), images=1000, max_multipliers=2,
                             options=SearchOptions(max_rounds=300, tol=1e-2, budget_factor=5.0))


@functools.lru_cache(maxsize=2)
def _images(data: str | None, limit: int | None) -> tuple[np.ndarray, str]:
    im = load_images(data, limit=limit)
    return im.X, im.source


def autoencoder_cell(cell: dict[str, Any], grid_json: dict[str, Any], path: str, resume: bool, progress: bool = False,
                     mpi: bool = False, *, search: Search = search_cell) -> dict[str, Any]:
    """Run one cell of the autoencoder grid (a process-pool task; with ``mpi``, every rank calls
    it and holds only its own workers' images: the file is read, the rank's images kept, the
    rest dropped)."""
    t0 = time.perf_counter()
    opts = SearchOptions(**grid_json["options"])
    if mpi:
        from ..distributed import workers_of

        im = load_images(grid_json["data"], limit=grid_json["images"])
        X, source, workers = im.X, im.source, workers_of(grid_json["workers"], mpi_comm())
    else:
        X, source = _images(grid_json["data"], grid_json["images"])
        workers = None
    ae = LinearAutoencoder(X, grid_json["workers"], cell["p_hat"], cell["lam"], d_e=grid_json["d_e"], seed=grid_json["problem_seed"],
                           dtype=np.dtype(grid_json.get("dtype", "float64")), split=grid_json.get("split", "per-worker"),
                           loss=grid_json.get("loss", "paper"), workers=workers)
    methods = tuple(grid_json["methods"])
    if grid_json["gamma"] is not None:
        consts: dict[str, Any] = {"how": "user --gamma"}
        gth = {m: float(grid_json["gamma"]) for m in methods}
        L_minus = None
    else:
        consts = estimate_constants(ae, seed=grid_json["problem_seed"], images=X if mpi else None)
        if mpi:  # every rank runs with rank 0's estimates (they could differ in the last bits)
            consts = mpi_comm().bcast(consts, root=0)
        gth = theory_gammas(ae, consts, methods, opts)
        L_minus = consts["L_minus"]
    consts = {**consts, "f_star": ae.f_star, "n_splits": ae.n_splits, "data": source, "n_images": int(X.shape[0])}
    del X  # with mpi, the only reference: the rank keeps its own images only
    exps = {}
    for m in methods:
        if L_minus is not None or opts.steps == "authors":
            exps[m] = step_exponents(m, gth[m], L_minus, opts, AUTHORS_STEPS, max_count=grid_json["max_multipliers"])
        else:
            exps[m] = list(range(0, -(grid_json["max_multipliers"] or 6), -1))
    base = {"experiment": "autoencoder", "constants": consts, "gamma_theory_by_method": gth, "problem_seed": grid_json["problem_seed"]}
    specs = {m: Spec.parse(m) for m in methods}
    compressors = {m: s.compressor(ae.n, ae.d) for m, s in specs.items()}
    # error feedback with a deterministic compressor (TopK) runs on the grouped problem (one
    # virtual worker per distinct split: the same iterates, see the module docstring); on MPI
    # every method runs on the rank's workers
    problems = {m: (ae.grouped() if s.identical_workers_collapse(compressors[m]) and not mpi else ae) for m, s in specs.items()}
    recs = search(ae, cell, exps, opts, path, gammas=gth, base=base, resume=resume, problems=problems, compressors=compressors,
                       mpi=mpi)
    return {"cell": cell["id"], "runs": len(recs), "seconds": time.perf_counter() - t0}


def run_autoencoder(grid: AutoencoderGrid, out: str | os.PathLike[str], *, jobs: int = 1, resume: bool = False,
                    progress: bool = True, plot: bool = True, mpi: bool = False) -> Path:
    """Run a grid into ``out/autoencoder/`` and draw its figures; returns that directory. With
    ``mpi`` (launched by ``mpiexec``) every run is distributed over the ranks, each holding its
    block of workers' images (:class:`LinearAutoencoder` with ``workers=``); rank 0 writes. The
    grid's ``config.json`` holds a digest of the images (:func:`.grid.data_digest`): ``resume``
    refuses images that changed."""
    im = load_images(grid.data, limit=grid.images)  # fail early, with the message on how to provide data
    cfg = {**grid.to_json(), "data_digest": data_digest(im.X)}  # --resume refuses changed images
    del im
    root = run_grid(grid.name, cfg, autoencoder_cell, grid.cells(), out, jobs=jobs, resume=resume, progress=progress,
                    extra=(False, mpi), mpi=mpi)
    from .plotting import plot_grid

    return plot_grid(root, plot=plot, mpi=mpi)


def grid_from_args(args: Any) -> AutoencoderGrid:
    """The grid a ``permk autoencoder`` command line asks for."""
    g = QUICK_GRID if args.quick else PAPER_GRID
    o = options_from_args(g.options, args, "autoencoder")
    g = replace(g, options=o, problem_seed=args.seed if args.seed is not None else g.problem_seed,
                data=os.path.abspath(args.data) if args.data else (os.environ.get("PERMK_DATA") or None))
    if args.workers is not None:
        g = replace(g, workers=args.workers)
    if args.p_hat:
        g = replace(g, p_hats=tuple(args.p_hat))
    if args.lam:
        g = replace(g, lams=tuple(args.lam))
    if args.encoding is not None:
        g = replace(g, d_e=args.encoding)
    if args.images is not None:
        g = replace(g, images=args.images)
    if args.gamma is not None:
        g = replace(g, gamma=args.gamma)
    g = search_from_args(g, args)
    authors = getattr(args, "protocol", None) == "authors"
    if authors:  # the authors' problem options; explicit --split/--loss below override them
        g = replace(g, split="per-sample", loss="authors")
    for opt in ("split", "loss", "dtype"):  # --split, --loss, --dtype where the command line has them
        if getattr(args, opt, None) is not None:
            g = replace(g, **{opt: getattr(args, opt)})
    return g
