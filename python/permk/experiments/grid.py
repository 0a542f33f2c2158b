"""Running an experiment's grid of cells: :func:`run_grid` (the results directory, ``--resume``,
one writer), a process pool over cells (:func:`run_pool`) and MPI's world (:func:`mpi_comm`)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .results import hold_directory, read_json, write_json

__all__ = ["run_pool", "mpi_comm", "run_grid", "holds_results", "is_writer", "data_digest"]


def data_digest(*arrays: Any) -> str:
    """A digest of the data a grid reads (dense arrays or scipy.sparse matrices: their type,
    shape and values), stored in the grid's config so that ``--resume`` refuses a grid whose
    data changed since it started (:func:`run_grid`)."""
    import hashlib

    import numpy as np
    import scipy.sparse as sp

    h = hashlib.sha256()
    for a in arrays:
        parts = [a.data, a.indices, a.indptr] if sp.issparse(a) else [np.asarray(a)]
        h.update(f"{type(a).__name__} {a.shape}".encode())
        for part in parts:
            part = np.ascontiguousarray(part)
            h.update(f"{part.dtype} {part.shape}".encode())
            h.update(part.reshape(-1).view(np.uint8).data)
    return h.hexdigest()[:32]


def _config_differences(stored: Any, asked: dict[str, Any]) -> str:
    """The keys where a stored grid config and the one asked for differ, for the message."""
    if not isinstance(stored, dict):
        return "the stored config is not a grid's"
    keys = sorted(k for k in set(stored) | set(asked) if stored.get(k) != asked.get(k))
    what = []
    for k in keys:
        if k == "data_digest":
            what.append("the data (a digest of the samples it read) changed since the grid started" if k in stored else
                        "the stored grid has no digest of its data (written by an older permk)")
        else:
            what.append(f"{k}: {stored.get(k)!r} there, {asked.get(k)!r} now")
    return "; ".join(what)


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
    existing grid is continued only with ``resume`` and only if its config is the same (the
    experiments store a :func:`data_digest` of the data they read in it, so a changed data
    file is refused too; the message names what differs). Returns
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
            asked = json.loads(json.dumps(cfg))
            stored = read_json(cfg_path) if cfg_path.exists() else asked
            if stored != asked:
                raise ValueError(f"--resume: the grid in {cfg_path} differs from the one asked for ({_config_differences(stored, asked)}); "
                                 "use the same options and data, or another --out")
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
