"""One format for every bench's table: what the docs' benchmarks page renders.

A bench measures its rows *and* the reference they are read against (a plain-numpy twin, a
memcpy, the unavoidable BLAS products, a bare collective) in the same run, then calls
:func:`write_table`, which writes ``benches/results/<bench>.json`` (or the ``--json`` path a
bench was given) atomically::

    {"bench": "bench_marina", "title": "...", "command": "python benches/bench_marina.py",
     "machine": {"cpu": "...", "cores": 2, "memory_gib": 23.4, "python": "3.11.7", ...},
     "date": "2026-11-27T09:10:00+00:00", "load": [1.02, 0.88, 0.75],
     "reference": "what the ratios are measured against",
     "columns": ["case", "seconds", "ratio"], "rows": [["n=10", 0.12, 1.4], ...],
     "notes": "what the table shows, in a sentence or two"}

``machine``, ``date`` and ``load`` are read here, so every table says where and when it was
measured. Smoke runs (``--smoke``) do not write a table unless asked to.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """The machine a table was measured on: CPU model, cores, memory, Python and numpy."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    import numpy as np

    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem, "system": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__}


def load() -> list[float] | None:
    """The 1, 5 and 15-minute load averages at the time of writing (None where unknown)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def write_table(bench: str, *, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], reference: str,
                notes: str = "", command: str | None = None, path: str | os.PathLike[str] | None = None,
                extra: dict[str, Any] | None = None) -> Path:
    """Write one bench's table (see the module docstring); returns the path written."""
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"{bench}: a row has {len(row)} cells for {len(columns)} columns: {row!r}")
    record = {
        "bench": bench,
        "title": title,
        "command": command if command is not None else " ".join(["python", *[os.path.relpath(sys.argv[0])], *sys.argv[1:]]),
        "machine": machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load": load(),
        "reference": reference,
        "columns": list(columns),
        "rows": [list(r) for r in rows],
        "notes": notes,
        **(extra or {}),
    }
    target = Path(path) if path is not None else RESULTS / f"{bench}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
    return target
