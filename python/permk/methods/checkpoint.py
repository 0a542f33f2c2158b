"""Checkpoints: a method's state written to and read from an ``.npz`` file, atomically."""

from __future__ import annotations

import dataclasses
import os
import zipfile
from typing import Any

import numpy as np

from .._files import atomic_write
from .._validate import check_int, check_real
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
    """Read a state written by :func:`save_state`, every field checked against the state's
    declaration before the state is built. Refused, with a ValueError naming the file and the
    field:

    * a file that is not an ``.npz``, or holds no ``__kind__`` naming a state class that a run
      saves (one whose dataclass fields include every array it lists: not ``CountedState``);
    * a missing field (a file without ``oracle_calls``, written before states counted oracle
      calls, reads it as 0), or one that cannot be read (a pickled object);
    * an array of :attr:`State.arrays` whose dtype is not real (complex, bool, string, object);
      a shared array not of the iterate's length ``d``, a per-worker array not a matrix of ``d``
      columns (one row per worker; :meth:`State.held_by` checks their count when a run resumes
      it). Non-finite entries are read as stored: the state of a run that diverged is saved and
      read back whole (a run resuming it is refused: its metrics at the starting point are not
      finite);
    * a field declared ``int`` (``round``, ``seed``) that is not one integer in ``[low, 2**64)``,
      or one declared ``float`` (``bits``, ``oracle_calls``) that is not one finite real number
      of at least ``low``: ``low`` is the field's ``metadata["low"]`` where it states one (0 for
      the counters of :class:`CountedState`), else 0 for an ``int`` and none for a ``float``.

    Fields declared otherwise are read as stored (a 0-d array as its Python value)."""
    try:
        z = np.load(path, allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise ValueError(f"{path} is not a permk state file (an .npz written by permk.save_state): {e}") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} is not a permk state file (an .npz written by permk.save_state)")
    with z:
        stored = _read(z, path, "__kind__") if "__kind__" in z.files else None
        cls = State.by_name(str(stored)) if stored is not None and stored.dtype.kind == "U" and stored.ndim == 0 else None
        if cls is None:
            named = "" if stored is None else f": its __kind__ {str(stored)!r} names no state class" if stored.ndim == 0 else \
                f": its __kind__ is an array of shape {stored.shape}"
            raise ValueError(f"{path} does not hold a permk state{named}")
        kind = str(stored)
        fields: dict[str, dataclasses.Field[Any]] = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        lacking = [name for name in cls.arrays if name not in fields]
        if lacking:
            raise ValueError(f"{path}: its __kind__ {kind!r} is not a state a run saves (it has no field {lacking[0]!r})")
        vals: dict[str, Any] = {}
        for name, f in fields.items():
            if name not in z.files and name == "oracle_calls":
                vals[name] = 0.0  # a file written before states counted oracle calls
                continue
            if name not in z.files:
                raise ValueError(f"{path}: the {kind} has no field {name!r}")
            vals[name] = _checked(cls, f, _read(z, path, name), f"{path}: the {kind}'s field {name!r}")
    d = vals["x"].shape[0] if vals["x"].ndim == 1 else None
    for name, array_kind in cls.arrays.items():
        shape = vals[name].shape
        if d is None or (shape != (d,) if array_kind == "shared" else (len(shape) != 2 or shape[1] != d)):
            want = "(d,)" if array_kind == "shared" else "(workers, d)"
            raise ValueError(f"{path}: the {kind}'s {array_kind} array {name!r} must have shape {want} with d the length of x, "
                             f"got {shape} (x: {vals['x'].shape})")
    return cls(**vals)


def _read(z: Any, path: Any, name: str) -> np.ndarray:
    """The array ``name`` of the open ``.npz`` ``z``; one that cannot be read (a pickled object
    array, a damaged member) is a ValueError naming it."""
    try:
        return np.asarray(z[name])
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise ValueError(f"{path}: the field {name!r} cannot be read: {e}") from None


def _checked(cls: type[State], f: dataclasses.Field[Any], v: np.ndarray, where: str) -> Any:
    """The value of field ``f`` of ``cls`` from its stored array ``v``, checked against the
    field's declaration (see :func:`load_state`); ``where`` names the file and the field."""
    if f.name in cls.arrays:
        if v.dtype.kind not in "iuf":
            raise ValueError(f"{where} must be an array of real numbers, got dtype {v.dtype}")
        return v.copy()
    declared = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", None)
    if declared not in ("int", "float"):
        return v.copy() if v.ndim else v.item()
    if v.ndim:
        raise ValueError(f"{where} must be a single {declared}, got an array of shape {v.shape}")
    low = f.metadata.get("low", 0 if declared == "int" else None)
    try:
        return check_int(v.item(), where, low=low) if declared == "int" else check_real(v.item(), where, low=low)
    except TypeError as e:
        raise ValueError(str(e)) from None
