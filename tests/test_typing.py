"""The native module's stub matches the runtime (mypy.stubtest), and the package is typed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import permk


@pytest.mark.slow
def test_stub_matches_native_module() -> None:
    out = subprocess.run([sys.executable, "-m", "mypy.stubtest", "permk._core"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_package_ships_py_typed() -> None:
    assert (Path(permk.__file__).parent / "py.typed").exists()
    assert (Path(permk.__file__).parent / "_core.pyi").exists()


@pytest.mark.slow
def test_package_type_checks() -> None:
    src = Path(__file__).resolve().parents[1] / "python" / "permk"
    out = subprocess.run([sys.executable, "-m", "mypy", str(src), "--ignore-missing-imports", "--no-incremental"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
