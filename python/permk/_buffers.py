"""A buffer reused while nobody else holds it: :class:`Reusable`.

A fresh array of ``d`` floats costs page faults on first touch (~1 ms per 8 MB), as much as
a large exchange. A transport that hands its caller a new aggregate every round can hand back
the last one instead, when the caller has let go of it (``g + Δ`` made a new array): what
``sys.getrefcount`` tells, measured against an object held by one attribute alone (the count
differs between CPython versions).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["Reusable"]


class _Holder:
    slot: Any = None


def _only_held_here() -> int:
    h = _Holder()
    h.slot = object()
    buf = h.slot
    return sys.getrefcount(buf)


_ONLY_HELD_HERE = _only_held_here()


class Reusable:
    """One array of a fixed shape and dtype: :meth:`get` returns the last one handed out when
    nothing but this object holds it any more, else a new one (``np.empty``: its contents are
    whatever was there)."""

    def __init__(self, shape: int | tuple[int, ...], dtype: Any = np.float64) -> None:
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.slot: np.ndarray | None = None

    def get(self) -> np.ndarray:
        buf = self.slot
        if buf is None or sys.getrefcount(buf) > _ONLY_HELD_HERE:
            buf = self.slot = np.empty(self.shape, dtype=self.dtype)
        return buf
