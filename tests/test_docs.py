"""docs/extending.md is executed: its Python blocks run in order in one namespace, the MPI block
also under ``mpiexec -n 2``; the DCGD it shows is the package's, verbatim."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import permk.methods

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
MPI_MARK = "# mpiexec -n 2 python this_script.py"


def test_the_guide_has_its_examples() -> None:
    assert len(BLOCKS) >= 6 and sum(MPI_MARK in b for b in BLOCKS) == 1


def test_the_guide_runs(tmp_path: Path) -> None:
    namespace: dict[str, object] = {"__name__": "__guide__"}
    for k, code in enumerate(BLOCKS):
        exec(compile(code, f"{DOC}:block{k}", "exec"), namespace)


def test_the_guides_dcgd_is_the_packages() -> None:
    shown = next(b for b in BLOCKS if "class DCGD(Method):" in b)
    cls = shown[shown.index("class DCGD(Method):"):].rstrip()
    assert cls == inspect.getsource(permk.methods.DCGD).rstrip()


@pytest.mark.mpi
def test_the_guides_python_compressor_runs_on_mpi(tmp_path: Path) -> None:
    """The user compressor of the guide under mpiexec: the MPI run equals the simulator's bit for
    bit (the block's own assertions), with only values on the wire."""
    from conftest import MPIEXEC
    from test_distributed import _env  # the same environment as the MPI tests

    upto = next(k for k, b in enumerate(BLOCKS) if MPI_MARK in b)
    script = tmp_path / "guide.py"
    script.write_text("\n".join(BLOCKS[: upto + 1]) + "\nprint('guide ok', flush=True)\n")
    proc = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240, env=_env(), stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("guide ok") == 2
