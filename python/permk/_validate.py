"""Argument checks shared by every layer of the package: a clear ValueError/TypeError naming the
argument, and allocation guards that raise MemoryError before a huge array is built.

This module is the package's shared internals: it imports nothing from permk.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any

import numpy as np

_U64 = 2**64


def check_int(value: Any, name: str, *, low: int = 0, high: int | None = None) -> int:
    """``value`` as a Python int in ``[low, high)`` (``high=None``: below 2**64).

    Integers (Python or numpy) are accepted; bools, floats (even integral ones) and strings are a
    TypeError.
    """
    if type(value) is int:  # the common case, without the slower ABC checks below
        if low <= value < (_U64 if high is None else high):
            return value
    elif isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    v = int(value)
    hi = _U64 if high is None else high
    if not low <= v < hi:
        bound = "2**64" if high is None else str(high)
        raise ValueError(f"{name} must be in [{low}, {bound}), got {v}")
    return v


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number (Python or numpy; a bool is not one)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def real_float(value: Any) -> float:
    """A real number as a float: ``float(value)``, or ``±inf`` for one beyond float64 (an int or
    Fraction such as ``10**400``, whose ``float()`` raises OverflowError)."""
    try:
        return float(value)
    except OverflowError:
        return -math.inf if value < 0 else math.inf


def check_real(value: Any, name: str, *, low: float | None = None, strict: bool = False, high: float | None = None) -> float:
    """``value`` as a finite Python float, at least ``low`` (more than ``low`` with ``strict``)
    and at most ``high``. Numbers (Python or numpy) are accepted; bools and strings are a
    TypeError, NaN and infinities a ValueError naming the argument."""
    if not is_real(value):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = real_float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if low is not None and (v <= low if strict else v < low):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {low:g}, got {v:g}")
    if high is not None and v > high:
        raise ValueError(f"{name} must be <= {high:g}, got {v:g}")
    return v


def check_per_worker(values: Any, n: int, name: str) -> np.ndarray:
    """A problem's per-worker constants (``L_i``, ``L_sample_rms``) as ``n`` non-negative finite
    float64 numbers, one per worker; any other length, a negative, NaN or infinite entry, or
    something that is not numbers is a ValueError naming ``name``."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.shape != (n,) or not np.isfinite(arr).all() or (arr < 0).any():
        got = f"{type(values).__name__}" if arr is None else f"shape {arr.shape}: {arr.ravel()[:10].tolist()}"
        raise ValueError(f"{name} must be {n} non-negative finite numbers (one per worker), got {got}")
    return arr


def check_probability(value: Any, name: str = "p") -> float:
    """A probability in ``(0, 1]`` (MARINA's ``p``)."""
    if not is_real(value):
        raise TypeError(f"{name} must be a real number in (0, 1], got {type(value).__name__}")
    v = real_float(value)
    if not 0.0 < v <= 1.0:  # also rejects NaN
        raise ValueError(f"{name} must be in (0, 1], got {v:g}")
    return v


def check_seed(seed: Any) -> int:
    """A seed shared by all workers: a non-negative integer below 2**64."""
    if seed is None:
        raise TypeError(
            "seed is required: shared randomness must be a pure function of (seed, round); "
            "pass a non-negative integer"
        )
    return check_int(seed, "seed")


def check_group(workers: Any, n: int) -> np.ndarray:
    """A group of workers: distinct indices in ``range(n)``, at least one (TypeError for a
    non-integer index)."""
    ws = [check_int(i, "worker index", high=n) for i in workers]
    if not ws or len(set(ws)) != len(ws):
        raise ValueError(f"workers must be a non-empty set of distinct indices in range({n}), got {ws}")
    return np.asarray(ws, dtype=np.intp)


def check_partition(groups: Any, n: int | None = None, name: str = "groups") -> tuple[tuple[int, ...], ...]:
    """``groups`` as a tuple of non-empty tuples of worker indices that partition ``range(n)``
    (``n`` None: the number of indices given)."""
    if isinstance(groups, (str, bytes)) or not hasattr(groups, "__iter__"):
        raise TypeError(f"{name} must be a sequence of groups of worker indices, got {type(groups).__name__}")
    parts = []
    for k, g in enumerate(groups):
        if isinstance(g, (str, bytes)) or not hasattr(g, "__iter__"):
            raise TypeError(f"{name}[{k}] must be a sequence of worker indices, got {type(g).__name__}")
        parts.append(tuple(check_int(i, f"{name}[{k}] entry", high=n) for i in g))
    if n is None:
        n = sum(len(g) for g in parts)
    if not parts or any(not g for g in parts) or sorted(i for g in parts for i in g) != list(range(n)):
        raise ValueError(f"{name} must be non-empty and partition range({n}): every worker in exactly one group")
    return tuple(parts)


def check_flag(value: Any, name: str) -> bool:
    """A boolean option: True or False (numpy's too); anything else is a TypeError naming it."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_items(values: Any, cls: type, name: str, what: str) -> list[Any]:
    """``values`` (any iterable but a string or a single ``cls``) as a list whose every entry is
    a ``cls``, else a TypeError naming ``name`` or the entry ``name[k]`` and ``what`` it must be."""
    if isinstance(values, (str, bytes, cls)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of {what}, got {type(values).__name__}")
    items = list(values)
    for k, v in enumerate(items):
        if not isinstance(v, cls):
            raise TypeError(f"{name}[{k}] must be a {what}, got {type(v).__name__}")
    return items


def check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    """One of the strings ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def as_float_array(a: Any, ndim: int, name: str, *, allow_empty: bool = False) -> np.ndarray:
    """``a`` as a float64/float32 array of ``ndim`` dimensions, without copying when possible
    (non-empty unless ``allow_empty``).

    Integer and boolean arrays are converted to float64; complex, object and string arrays raise
    TypeError (complex input would silently lose its imaginary part).
    """
    arr = np.asarray(a)
    if arr.dtype not in (np.float64, np.float32):
        if arr.dtype.kind in "biu":
            arr = arr.astype(np.float64)
        else:
            raise TypeError(f"{name} must be a real float32 or float64 array, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        shape = "(n_workers, d)" if ndim == 2 else "(d,)"
        raise ValueError(f"{name} must have shape {shape}, got shape {arr.shape}")
    if arr.size == 0 and not allow_empty:
        raise ValueError(f"{name} must be non-empty, got shape {arr.shape}")
    return arr


def as_vector(x: Any, d: int, name: str = "x") -> np.ndarray:
    """``x`` as a C-contiguous float64 vector of shape ``(d,)`` (integer input converted; complex,
    object and string input a TypeError)."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a real vector, got dtype {arr.dtype}")
    v = np.ascontiguousarray(arr, dtype=np.float64)
    if v.shape != (d,):
        raise ValueError(f"{name} must have shape ({d},), got {v.shape}")
    return v


def start_point(x0: Any, d: int, name: str = "x0") -> np.ndarray:
    """A starting point: a finite real vector of shape ``(d,)`` (a fresh copy)."""
    v = np.array(as_vector(x0, d, name), dtype=np.float64)
    if not np.isfinite(v).all():
        raise ValueError(f"{name} must be finite")
    return v


def check_output(value: Any, shape: tuple[int, ...], name: str, *, finite: bool = False) -> np.ndarray:
    """A user oracle's answer as a float64 array of exactly ``shape``; ``name`` names the
    oracle (``"problem.grad(x)"``). Non-real dtypes are a TypeError; with ``finite`` a NaN or
    infinity is a ValueError (the drivers treat it as divergence instead)."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} returned dtype {arr.dtype}, expected real numbers")
    if arr.shape != shape:
        raise ValueError(f"{name} returned shape {arr.shape}, expected {shape}")
    out = np.asarray(arr, dtype=np.float64)
    if finite and not np.isfinite(out).all():
        raise ValueError(f"{name} returned non-finite values")
    return out


def all_finite(a: np.ndarray) -> bool:
    """Whether every entry is finite: a finite sum says so in one pass without a temporary (a
    NaN or infinity makes the sum non-finite); otherwise (an overflow, or a non-finite entry)
    each entry is checked."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(a.sum())) or bool(np.isfinite(a).all())


def physical_memory() -> int | None:
    """The machine's physical memory in bytes, or None when unknown."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
        return None


def _human(nbytes: float) -> str:
    for unit, f in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= f:
            return f"{nbytes / f:.3g} {unit}"
    return f"{int(nbytes)} bytes"


def check_alloc(shape: tuple[int, ...], what: str, *, itemsize: int = 8, count: int = 1) -> None:
    """Raise MemoryError (numpy's wording) when ``count`` arrays of ``shape`` would exceed the
    machine's physical memory: refuse before allocating instead of being OOM-killed later."""
    nbytes = float(itemsize) * float(count)
    for s in shape:
        nbytes *= float(s)
    limit = physical_memory()
    if limit is not None and nbytes > limit:
        total = f"{count} arrays of " if count > 1 else ""
        raise MemoryError(
            f"Unable to allocate {_human(nbytes)} for {total}{what} with shape {tuple(shape)} "
            f"(the machine has {_human(limit)})"
        )


def index_array(v: Any, name: str) -> np.ndarray:
    """``v`` as a 1-D C-contiguous int64 array of indices: integer input only (a float such as
    1.7 or a bool is a TypeError, not silently truncated)."""
    arr = np.asarray(v)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of indices, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer indices, got dtype {arr.dtype}")
    if arr.size and arr.dtype.kind == "u" and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} holds {int(arr.max())}, beyond any index (int64)")  # not wrapped to a negative one
    return np.ascontiguousarray(arr, dtype=np.int64)


def check_sample_counts(counts: Any, n: int) -> np.ndarray:
    """A problem's ``sample_counts`` as ``n`` int64 counts ``m_i``: whole numbers from 1 to
    2**62 (an integral float such as 10.0 is accepted; 10.5, NaN, bools and strings are a
    ValueError naming ``problem.sample_counts``)."""
    arr = np.asarray(counts)
    ok = arr.shape == (n,) and arr.dtype.kind in "iuf"
    if ok and arr.size:
        with np.errstate(invalid="ignore"):
            ok = bool(np.isfinite(arr).all() and (np.floor(arr) == arr).all() and arr.min() >= 1 and arr.max() <= 2**62)
    if not ok:
        shown = arr.ravel()[:10].tolist() if arr.ndim else arr.tolist()
        raise ValueError(f"problem.sample_counts must be {n} whole numbers from 1 to 2**62 (each worker's samples), "
                         f"got shape {arr.shape}, dtype {arr.dtype}: {shown}")
    return arr.astype(np.int64)
