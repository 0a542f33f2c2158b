"""Threads per process: the Rust kernels' (rayon) and BLAS's.

When permk starts several processes of its own — ``--jobs k`` cells in a process pool, MPI ranks
on one machine — each process gets ``cores // processes`` threads (at least one), so that
processes × threads never exceed the cores: oversubscribed BLAS and rayon threads spin and can
make a run many times slower. On a machine other work already keeps busy, the experiments take
only the cores the load leaves free (:func:`busy_threads`). By hand: ``permk … --threads N``, the environment variable
``PERMK_THREADS=N`` (read by every permk process when it imports permk:
:func:`apply_env_threads`), or :func:`limit_threads` in a script; the usual
``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS`` and ``RAYON_NUM_THREADS`` work too when set before
Python starts. Results never depend on the number of threads.

A ``PERMK_THREADS`` that is not a positive integer is a ``RuntimeWarning`` when permk is
imported (the import goes on with the default threads: a wrong thread count can cost only
speed, and an import that failed would break every program that merely imports permk, the
command line's own error report included) and a ValueError naming the variable wherever permk
chooses threads from it: every ``permk`` command (exit 2), ``--jobs`` pools, MPI ranks.
"""

from __future__ import annotations

import math
import os
import warnings

from ._core import set_num_threads
from ._validate import check_int

__all__ = ["MAX_THREADS", "cores", "threads_per_process", "limit_threads", "env_threads", "apply_env_threads", "use_threads", "busy_threads"]

#: The environment variable that fixes the threads of every permk process.
ENV = "PERMK_THREADS"
#: The most threads a process can be given (the Rust pool's limit, ``threads.rs``).
MAX_THREADS = 1024


def cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def env_threads() -> int | None:
    """``PERMK_THREADS`` when set (a positive integer, at most :data:`MAX_THREADS`), else None;
    any other value is a ValueError naming the variable."""
    raw = os.environ.get(ENV)
    if raw is None or not raw.strip():
        return None
    try:
        return check_int(int(raw), ENV, low=1, high=MAX_THREADS + 1)
    except (TypeError, ValueError):
        raise ValueError(f"{ENV} must be a positive integer (at most {MAX_THREADS}), got {raw!r}") from None


def apply_env_threads() -> int | None:
    """What ``import permk`` does with ``PERMK_THREADS``: when it is a positive integer ``N``,
    :func:`limit_threads` ``(N)`` (the Rust pool and BLAS of this process) and returns ``N``;
    unset, nothing (None); any other value, a ``RuntimeWarning`` and nothing (see the module
    docstring for why not an error here)."""
    try:
        threads = env_threads()
    except ValueError as e:
        warnings.warn(f"{e}: this process keeps its default threads, and permk's commands, --jobs pools and MPI runs "
                      f"refuse the value", RuntimeWarning, stacklevel=2)
        return None
    return None if threads is None else limit_threads(threads)


def threads_per_process(processes: int) -> int:
    """``PERMK_THREADS`` if set, else ``cores() // processes`` (at least 1)."""
    fixed = env_threads()
    return fixed if fixed is not None else max(1, cores() // check_int(processes, "processes", low=1))


def limit_threads(threads: int) -> int:
    """Use ``threads`` threads in this process for the Rust kernels and for BLAS/OpenMP (through
    threadpoolctl); returns it."""
    threads = check_int(threads, "threads", low=1, high=MAX_THREADS + 1)
    set_num_threads(threads)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads)
    return threads


def use_threads(threads: int) -> int:
    """:func:`limit_threads` in this process and ``PERMK_THREADS`` for every process it starts
    (pool workers, MPI ranks); returns ``threads``."""
    threads = limit_threads(threads)
    os.environ[ENV] = str(threads)
    return threads


def busy_threads(processes: int, threads_fixed: bool) -> tuple[int, str] | None:
    """Fewer threads per process when other work already keeps the cores busy.

    When the 1-minute load average reaches three quarters of the cores and the threads were not
    fixed (``threads_fixed`` by ``--threads``, or ``PERMK_THREADS``), each of the ``processes``
    permk starts gets the cores the load leaves free, ``(cores − ⌊load⌋) // processes`` (at least
    1), if that is fewer than its default: spinning BLAS threads otherwise make a run many times
    slower (measured: ``permk autoencoder --quick`` 300 s with 2 threads instead of 47 s with 1,
    next to two CPU-bound processes on 2 cores; 1.2× slower with 1 thread on an idle machine).
    Returns the threads and a one-line note saying so, or None. Results never depend on it."""
    if threads_fixed or env_threads() is not None:
        return None
    default = threads_per_process(processes)
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None
    if default <= 1 or load < 0.75 * cores():
        return None
    threads = max(1, (cores() - math.floor(load)) // processes)
    if threads >= default:
        return None
    return threads, (f"permk: the machine is busy (load average {load:.1f} on {cores()} cores): {threads} thread(s) per process "
                     f"instead of {default}, so that they do not spin against the other work (--threads N to choose)")
