"""The ``permk`` command's OpenBLAS setting, made before numpy loads OpenBLAS.

After each call OpenBLAS's threads spin for up to 2^28 cycles (about 0.1 s) waiting for the next
one. permk's Rust kernels run on the core's own threads between BLAS products (the linear
autoencoder's rounds: a batched product, then a Rust pass, per block of splits), and spinning
BLAS threads hold the cores those kernels need: on 2 cores with 2 threads, an EF21+TopK round of
the full-scale autoencoder took 2.7× its BLAS floor with the default and 1.75× with the shortest
timeout (``benches/bench_autoencoder.py``, README "Benchmarks"). The shortest timeout costs code
that makes many small BLAS calls in a row (each call wakes the threads: the bench's per-split
numpy reference round took 1.5× as long). So the ``permk`` command, whose work is permk's own,
sets ``OPENBLAS_THREAD_TIMEOUT=4`` (the shortest OpenBLAS accepts) when it is unset; ``import
permk`` in a user's program changes nothing (set the variable before numpy is imported to get
the same). Processes the command starts (pool workers, MPI ranks) inherit it. Results never
depend on it.
"""

from __future__ import annotations

import os
import sys

__all__ = ["THREAD_TIMEOUT", "command_setting"]

#: The value the command sets (OpenBLAS waits ``2**value`` cycles; it clamps values to [4, 30]).
THREAD_TIMEOUT = "4"


def command_setting(argv0: str, numpy_loaded: bool) -> bool:
    """Whether this process is the ``permk`` command started before numpy was loaded."""
    return not numpy_loaded and os.path.basename(argv0) == "permk"


if command_setting(sys.argv[0] if sys.argv else "", "numpy" in sys.modules):
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", THREAD_TIMEOUT)
