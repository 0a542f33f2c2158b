"""When ``import permk`` began: the zero of the CLI's closing time line.

Imported first by ``permk/__init__.py``, so the line's "imports and set-up" counts numpy, the
Rust core and the rest of permk's own imports (the interpreter's start-up before them, about
20 ms, is not counted). A clock of the interpreter's process (``/proc/self/stat``) would be
wrong when a shell execs ``permk`` in place of itself (``bash -c "pip install . && permk …"``
counts the install).
"""

from __future__ import annotations

import time

__all__ = ["STARTED", "seconds_since_start"]

STARTED = time.perf_counter()


def seconds_since_start() -> float:
    """Wall seconds since ``import permk`` began."""
    return time.perf_counter() - STARTED
