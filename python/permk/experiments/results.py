"""Result files of the experiment grids: one JSON object per line (JSON lines).

Every finished run is appended to its cell's file as one whole line, flushed and fsynced
before the run counts as done, so an interrupted grid loses nothing: ``--resume`` reads the
files back and skips the runs they hold. A line cut short by a kill (a file that does not end
with a newline) is set aside — moved to ``<file>.partial`` by the next append, skipped with a
warning by the reader — so the re-run record never lands on it. Any other unreadable line, or a
run record missing a field or holding one of another type (:data:`RUN_SCHEMA`), is an error
naming the file and the line.

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
import socket
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from .._files import atomic_write

__all__ = ["MAX_POINTS", "RUN_FIELDS", "RUN_SCHEMA", "LOCK_FILE", "DirectoryInUseError", "hold_directory", "append_record",
           "read_records", "iter_result_files", "thin_indices", "to_jsonable", "from_json", "write_json", "read_json"]

#: Per-run curves are thinned to at most this many points before they are written.
MAX_POINTS = 800
#: The fields every run record has.
RUN_FIELDS = ("kind", "key", "experiment", "cell", "method", "label", "compressor", "j", "multiplier", "options", "params",
              "summary", "curve")
#: What :func:`read_records` checks of a run record's fields, by path (``summary.bits_sent``):
#: the type, and whether the field must be there (the others are checked where they are). Every
#: entry of ``curve`` is moreover a list of numbers, all of one length, at least one point.
RUN_SCHEMA: dict[str, tuple[str, bool]] = {
    **{f: ("text", True) for f in ("kind", "key", "experiment", "method", "label", "compressor")},
    "j": ("an integer", True), "multiplier": ("a number", True),
    **{f: ("an object", True) for f in ("cell", "options", "params", "summary", "curve")},
    "cell.id": ("text", True), "cell.n": ("an integer", True), "cell.row": ("an integer", True), "cell.col": ("an integer", True),
    "options.tol": ("a number", True), "options.budget_factor": ("a number", True), "params.gamma": ("a number", True),
    "summary.bits_sent": ("a number", True), "summary.rounds_run": ("an integer", False),
    "summary.reached_target": ("true or false", False), "summary.diverged": ("true or false", False),
    "summary.bits_to_target": ("a number or null", False), "summary.rounds_to_target": ("an integer or null", False),
    "summary.grad_norm_sq_0": ("a number or null", False), "summary.final_grad_norm_sq": ("a number", False),
    "summary.min_grad_norm_sq": ("a number", False), "summary.stopped_by": ("text", False),
    "curve.bits": ("a list of numbers", True), "curve.grad_norm_sq": ("a list of numbers", True),
}
_NUMBER = (int, float)  # JSON's numbers as read (a bool is not one: its type is bool)
_TYPES: dict[str, Callable[[Any], bool]] = {
    "text": lambda v: type(v) is str,
    "an integer": lambda v: type(v) is int,
    "a number": lambda v: type(v) in _NUMBER,
    "true or false": lambda v: type(v) is bool,
    "an object": lambda v: type(v) is dict,
    "a number or null": lambda v: v is None or type(v) in _NUMBER,
    "an integer or null": lambda v: v is None or type(v) is int,
    "a list of numbers": lambda v: type(v) is list and all(type(x) in _NUMBER for x in v),
}


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


def from_json(v: Any) -> Any:
    """The inverse of :func:`to_jsonable` (``"nan"``, ``"inf"``, ``"-inf"`` back to floats)."""
    if isinstance(v, dict):
        return {k: from_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [from_json(x) for x in v]
    if v in ("nan", "inf", "-inf"):
        return float(v)
    return v


#: The lock file of an experiment directory (:func:`hold_directory`).
LOCK_FILE = "permk.lock"


class DirectoryInUseError(OSError):
    """The experiment directory is held by another process (:func:`hold_directory`)."""


@contextmanager
def hold_directory(root: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold the experiment directory ``root`` (created if need be) for this process while the
    ``with`` block runs, so that no second run writes into it at the same time (two runs would
    both append every record: duplicates). A second holder is refused at once with
    :class:`DirectoryInUseError` naming the process that holds it.

    The lock is an advisory ``flock`` on ``root/permk.lock`` (which says who holds it). The
    kernel releases it when the holder's file closes, also when the process is killed, so a
    killed run never leaves a stale lock; the file itself stays (removing it would let two
    processes lock two different files). Child processes (``--jobs``) do not inherit it: they
    write while their parent holds the directory. Yields the lock file's path."""
    import fcntl

    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise type(e)(e.errno, f"cannot create the experiment directory {root} ({e.filename}: {e.strerror})") from None
    path = root / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
            raise DirectoryInUseError(f"{root} is in use by {holder}; wait until it ends or choose another --out") from None
        started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())
        who = f"process {os.getpid()} (started {started} on {socket.gethostname()})".encode()
        os.pwrite(fd, who, 0)
        os.ftruncate(fd, len(who))
        yield path
    finally:
        os.close(fd)


def _set_aside_partial_tail(fd: int, path: Path) -> None:
    """If the file does not end with a newline, move its last, cut-short line to
    ``<path>.partial`` and truncate the file after its last complete line."""
    size = os.fstat(fd).st_size
    if size == 0:
        return
    with open(path, "rb") as fh:
        fh.seek(max(0, size - 1))
        if fh.read(1) == b"\n":
            return
        block, start = 1 << 16, size
        while start > 0:  # find the last newline
            start = max(0, start - block)
            fh.seek(start)
            chunk = fh.read(min(block, size - start))
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                start += cut + 1
                break
        fh.seek(start)
        tail = fh.read()
    with open(str(path) + ".partial", "ab") as side:
        side.write(tail + b"\n")
        side.flush()
        os.fsync(side.fileno())
    os.ftruncate(fd, start)
    warnings.warn(f"{path}: its last line was cut short ({len(tail)} bytes, an interrupted write); "
                  f"it is set aside in {path}.partial", RuntimeWarning, stacklevel=3)


def append_record(path: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Append one record as one whole JSON line, flushed to disk (``fsync``) before returning.

    A cut-short last line left by an earlier kill is first set aside (``<path>.partial``), so
    the new record always starts on a line of its own."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(to_jsonable(record), separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        _set_aside_partial_tail(fd, p)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _json_type(v: Any) -> str:
    """The JSON name of a value's type (what a record holds instead of the expected one); a list
    with an entry that is not a number says which."""
    if type(v) is list:
        bad = next((k for k, x in enumerate(v) if type(x) not in _NUMBER), None)
        return "list" if bad is None else f"a list whose entry {bad} is {_json_type(v[bad])}"
    for name, t in (("null", type(None)), ("true or false", bool), ("text", str), ("integer", int), ("number", float), ("object", dict)):
        if type(v) is t:
            return name
    return type(v).__name__


def _check_run_record(rec: dict[str, Any], where: str) -> None:
    """Check a run record as read back (:func:`from_json` applied): every field of
    :data:`RUN_FIELDS`, each field of :data:`RUN_SCHEMA` of its type, and a ``curve`` of lists of
    numbers of one length (at least one point). Anything else is a ValueError starting with
    ``where`` (the file and line) and naming the field."""
    missing = [f for f in RUN_FIELDS if f not in rec]
    if missing:
        raise ValueError(f"{where}: the run record has no {', '.join(missing)}")
    for name, (kind, required) in RUN_SCHEMA.items():
        head, _, leaf = name.rpartition(".")
        parent = rec[head] if head else rec  # the parent is an object: checked before its fields
        if leaf not in parent:
            if required:
                raise ValueError(f"{where}: the run record has no {name}")
            continue
        if not _TYPES[kind](parent[leaf]):
            raise ValueError(f"{where}: the run record's {name} must be {kind}, got {_json_type(parent[leaf])}")
    lengths: dict[str, int] = {}
    for k, v in rec["curve"].items():
        if not _TYPES["a list of numbers"](v):
            raise ValueError(f"{where}: the run record's curve.{k} must be a list of numbers, got {_json_type(v)}")
        lengths[k] = len(v)
    if len(set(lengths.values())) != 1 or not min(lengths.values()):
        raise ValueError(f"{where}: the run record's curve lists must all have the same length, at least 1, got "
                         + ", ".join(f"{k}: {n}" for k, n in lengths.items()))


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of one file. A cut-short last line (an interrupted write: the file does not
    end with a newline) is skipped with a warning; any other line that is not a JSON object, and
    a run record missing a field of :data:`RUN_FIELDS` (or a required one of :data:`RUN_SCHEMA`),
    holding one of another type than :data:`RUN_SCHEMA` says, or a ``curve`` whose entries are not
    lists of numbers of one length (at least one point), raise ValueError naming the file, the
    line and the field."""
    raw = Path(path).read_bytes()
    lines = raw.split(b"\n")
    out: list[dict[str, Any]] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if lineno == len(lines):  # no newline after it: the write was cut short (even if it parses)
            warnings.warn(f"{path}:{lineno}: skipping a cut-short last record (an interrupted write)", RuntimeWarning, stacklevel=2)
            continue
        try:
            rec = json.loads(line.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}:{lineno}: not a valid record (JSON): {e}") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{path}:{lineno}: a record must be a JSON object, got {type(rec).__name__}")
        rec = from_json(rec)
        if rec.get("kind") == "run":
            _check_run_record(rec, f"{path}:{lineno}")
        out.append(rec)
    return out


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write a JSON file atomically: a temporary file in the same directory, fsynced, then
    renamed (a reader never sees half a file)."""
    data = json.dumps(obj, indent=1).encode("utf-8")
    atomic_write(path, lambda fh: fh.write(data))


def read_json(path: str | os.PathLike[str]) -> Any:
    """A JSON file's content; a corrupt file is a ValueError naming it (and the line)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); delete it or use another --out") from None


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
