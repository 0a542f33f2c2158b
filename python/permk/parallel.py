"""Threads per process: the Rust kernels' (rayon) and BLAS's.

When permk starts several processes of its own — ``--jobs k`` cells in a process pool, MPI ranks
on one machine — each process gets ``cores // processes`` threads (at least one), so that
processes × threads never exceed the cores: oversubscribed BLAS and rayon threads spin and can
make a run many times slower. By hand: ``permk … --threads N``, the environment variable
``PERMK_THREADS=N`` (read by every permk process), or :func:`limit_threads` in a script; the
usual ``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS`` and ``RAYON_NUM_THREADS`` work too when set
before Python starts. Results never depend on the number of threads.
"""

from __future__ import annotations

import os

from . import _core
from ._validate import check_int

__all__ = ["cores", "threads_per_process", "limit_threads", "env_threads", "busy_warning"]

#: The environment variable that fixes the threads of every permk process.
ENV = "PERMK_THREADS"


def cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def env_threads() -> int | None:
    """``PERMK_THREADS`` when set (a positive integer), else None."""
    raw = os.environ.get(ENV)
    if raw is None or not raw.strip():
        return None
    try:
        return check_int(int(raw), ENV, low=1)
    except (TypeError, ValueError):
        raise ValueError(f"{ENV} must be a positive integer, got {raw!r}") from None


def threads_per_process(processes: int) -> int:
    """``PERMK_THREADS`` if set, else ``cores() // processes`` (at least 1)."""
    fixed = env_threads()
    return fixed if fixed is not None else max(1, cores() // check_int(processes, "processes", low=1))


def limit_threads(threads: int) -> int:
    """Use ``threads`` threads in this process for the Rust kernels and for BLAS/OpenMP (through
    threadpoolctl); returns it."""
    threads = check_int(threads, "threads", low=1)
    _core.set_num_threads(threads)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads)
    return threads


def busy_warning(processes: int, threads_fixed: bool) -> str | None:
    """A one-line advice when other work already keeps the cores busy (1-minute load average
    of at least three quarters of the cores) and each of the ``processes`` permk starts would
    use several threads chosen by default (not ``threads_fixed`` by ``--threads`` or
    ``PERMK_THREADS``): spinning BLAS threads then make a run many times slower (measured:
    ``permk autoencoder --quick`` 300 s instead of 47 s with ``--threads 1`` next to two
    CPU-bound processes on 2 cores). None otherwise."""
    if threads_fixed or env_threads() is not None or threads_per_process(processes) <= 1:
        return None
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None
    if load < 0.75 * cores():
        return None
    return (f"permk: the machine is busy (load average {load:.1f} on {cores()} cores) and this run would use "
            f"{threads_per_process(processes)} threads per process, which spin against the other work: "
            "--threads 1 (or PERMK_THREADS=1) avoids that")
