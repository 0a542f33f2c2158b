"""Shared test configuration: hypothesis profiles, and where MPI is.

``ci`` (the default) is fast and derandomized, so a CI run is reproducible; ``thorough`` runs
many more random examples::

    HYPOTHESIS_PROFILE=thorough python -m pytest tests
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import permk

settings.register_profile(
    "ci",
    max_examples=12,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=300,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


#: The scripts the MPI tests launch under mpiexec.
MPI_DIR = Path(__file__).resolve().parent / "mpi"


def _find_mpiexec() -> str | None:
    """The mpiexec of this Python's environment (the mpich wheel installs it beside the
    interpreter, where a fresh pyenv may not have a shim yet), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


MPIEXEC = _find_mpiexec()
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None
_NO_MPI = None if MPIEXEC is not None and HAVE_MPI4PY else (
    "needs mpiexec and mpi4py (pip install 'permk[mpi]'): " + ("mpiexec not found" if MPIEXEC is None else "mpi4py not installed"))


def pytest_collection_modifyitems(config: Any, items: list[pytest.Item]) -> None:
    """Every test marked ``mpi`` is skipped, with the reason, where MPI is missing."""
    if _NO_MPI is not None:
        for item in items:
            if item.get_closest_marker("mpi") is not None:
                item.add_marker(pytest.mark.skip(reason=_NO_MPI))


#: The ``permk`` command, run with this interpreter.
CLI = [sys.executable, "-m", "permk.cli"]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``permk *args`` in a subprocess (warnings silenced, output captured)."""
    e = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=e)


def final_grad_norms(experiment: Path) -> dict[str, float]:
    """The final ``‖∇f‖²`` of every run recorded in an experiment directory (``OUT/quadratic``,
    ``OUT/autoencoder``), by run key."""
    from permk.experiments.results import read_records

    return {rec["key"]: rec["summary"]["final_grad_norm_sq"] for f in sorted((experiment / "runs").glob("*.jsonl"))
            for rec in read_records(f) if rec.get("kind") == "run"}


class PyTopK(permk.Compressor):
    """TopK(k) written in Python (no Rust kernel): the routes that gather, shift and compress in
    numpy, checked against the Rust ones."""

    def __init__(self, k: int = 2) -> None:
        self.k = k

    def floats_per_worker(self, n: int, d: int) -> int:
        return self.k

    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> permk.Message:
        x = np.asarray(x)
        idx = np.sort(np.argsort(-np.abs(x), kind="stable")[: self.k])
        return permk.Message(worker, n_workers, x.size, idx, x[idx])
