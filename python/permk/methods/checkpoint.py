"""Checkpoints: a method's state written to and read from an ``.npz`` file, atomically."""

from __future__ import annotations

import os
import zipfile
from typing import Any

import numpy as np

from .._files import atomic_write
from .contract import State

__all__ = ["save_state", "load_state"]


def save_state(state: State, path: Any) -> None:
    """Write a state to an ``.npz`` file (see :func:`load_state`); ``.npz`` is appended to a
    path without it, as :func:`numpy.savez` does.

    The write is atomic: the file is written beside ``path`` under a temporary name, fsynced
    and then renamed over it, so a process killed while it overwrites a checkpoint leaves the
    old checkpoint whole, never a cut-short one. (An open file object is written in place.)"""
    if not isinstance(state, State):
        raise TypeError(f"state must be a permk state (e.g. result.state), got {type(state).__name__}")
    arrays = {"__kind__": type(state).__name__, **{name: getattr(state, name) for name in state.field_names()}}
    if hasattr(path, "write"):
        np.savez(path, **arrays)
        return
    target = os.fspath(path)
    if not target.endswith(".npz"):
        target += ".npz"
    atomic_write(target, lambda fh: np.savez(fh, **arrays))


def load_state(path: Any) -> State:
    """Read a state written by :func:`save_state`, checking its arrays' shapes: every shared
    array of the iterate's length ``d``, every per-worker array a matrix of ``d`` columns (one
    row per worker; :meth:`State.held_by` checks their count when a run resumes it)."""
    try:
        z = np.load(path, allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise ValueError(f"{path} is not a permk state file (an .npz written by permk.save_state): {e}") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} is not a permk state file (an .npz written by permk.save_state)")
    with z:
        kind = str(z["__kind__"]) if "__kind__" in z.files else None
        cls = State.by_name(kind) if kind else None
        if cls is None:
            raise ValueError(f"{path} does not hold a permk state")
        vals: dict[str, Any] = {}
        for name in cls.field_names():
            if name not in z.files and name == "oracle_calls":
                vals[name] = 0.0  # a file written before states counted oracle calls
                continue
            if name not in z.files:
                raise ValueError(f"{path}: the {kind} has no field {name!r}")
            v = z[name]
            vals[name] = v.copy() if v.ndim or name in cls.arrays else v.item()
    d = vals["x"].shape[0] if vals["x"].ndim == 1 else None
    for name, array_kind in cls.arrays.items():
        shape = vals[name].shape
        if d is None or (shape != (d,) if array_kind == "shared" else (len(shape) != 2 or shape[1] != d)):
            want = "(d,)" if array_kind == "shared" else "(workers, d)"
            raise ValueError(f"{path}: the {kind}'s {array_kind} array {name!r} must have shape {want} with d the length of x, "
                             f"got {shape} (x: {vals['x'].shape})")
    return cls(**vals)
