"""Result files of the experiment grids: one JSON object per line (JSON lines).

Every finished run is appended to its cell's file and flushed to disk at once, so an
interrupted grid loses nothing: ``--resume`` reads the files back and skips the runs they hold.
A line cut short by a kill is ignored (and reported) when reading.

A record is a flat JSON object: ``kind`` (``"run"``), ``experiment`` (``"quadratic"``,
``"autoencoder"``), ``key`` (the run's identity), the cell's parameters and constants, the
method's parameters (step, p, A, B, …), a ``summary`` (bits to the target, final values,
status) and ``curve``: per-round arrays thinned to at most ``MAX_POINTS`` points (``round``,
``bits``, ``expected_bits``, ``grad_norm_sq``, ``f_gap``), always keeping the first point, the
point where the target was reached and the last point.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

__all__ = ["MAX_POINTS", "append_record", "read_records", "iter_result_files", "thin_indices", "to_jsonable"]

#: Per-run curves are thinned to at most this many points before they are written.
MAX_POINTS = 800


def to_jsonable(v: Any) -> Any:
    """numpy scalars/arrays and tuples to plain JSON values; non-finite floats become the strings
    ``"nan"``, ``"inf"``, ``"-inf"`` (strict JSON), which :func:`read_records` turns back into floats."""
    if isinstance(v, dict):
        return {str(k): to_jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return [to_jsonable(x) for x in v.tolist()]
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if math.isfinite(f):
            return f
        return "nan" if math.isnan(f) else ("inf" if f > 0 else "-inf")
    return v


def _from_json(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _from_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_from_json(x) for x in v]
    if v in ("nan", "inf", "-inf"):
        return float(v)
    return v


def append_record(path: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Append one record as a JSON line and flush it to disk (``fsync``) before returning."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(to_jsonable(record), separators=(",", ":"), allow_nan=False)
    with open(p, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of one file; a truncated or corrupt line (an interrupted write) is skipped
    with a warning."""
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(_from_json(json.loads(line)))
            except json.JSONDecodeError:
                warnings.warn(f"{path}:{lineno}: skipping an incomplete record (interrupted write?)", RuntimeWarning, stacklevel=2)
    return out


def iter_result_files(root: str | os.PathLike[str]) -> Iterator[Path]:
    """The ``*.jsonl`` result files under ``root`` (sorted)."""
    yield from sorted(Path(root).rglob("*.jsonl"))


def thin_indices(length: int, keep: Iterable[int] = (), max_points: int = MAX_POINTS) -> np.ndarray:
    """At most about ``max_points`` indices of ``range(length)``, evenly spaced, always with
    the first, the last and ``keep``."""
    if length <= max_points:
        return np.arange(length)
    idx = np.unique(np.round(np.linspace(0, length - 1, max_points)).astype(np.int64))
    extra = np.array([k for k in keep if 0 <= k < length], dtype=np.int64)
    return np.unique(np.concatenate([idx, extra]))
