"""docs/extending.md is executed: the block that starts with ``# NAME.py`` is written as that
module, the other Python blocks run in order in one namespace, every ``$`` command of its console
blocks runs in a shell beside the module, and the blocks up to the last one marked
``# mpiexec -n 2`` run under mpiexec."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path
from typing import Iterator

import pytest

from permk.compressors import COMPRESSORS
from permk.methods import METHODS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
TEXT = DOC.read_text(encoding="utf-8")
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
COMMANDS = [line[2:] for block in re.findall(r"```console\n(.*?)```", TEXT, flags=re.S) for line in block.splitlines() if line.startswith("$ ")]
MPI_MARK = "# mpiexec -n 2 python this_script.py"
MODULE = re.compile(r"# (\w+)\.py\n")

MODULES = {m.group(1): b for b in BLOCKS if (m := MODULE.match(b))}
CODE = [b for b in BLOCKS if not MODULE.match(b)]


def test_the_guide_has_its_examples() -> None:
    assert set(MODULES) == {"randomblock"} and len(CODE) >= 6 and sum(MPI_MARK in b for b in CODE) == 2
    assert any(c.startswith("permk --plugin randomblock quadratic") for c in COMMANDS)
    assert any(c.startswith("PERMK_PLUGINS=randomblock python -m pytest") for c in COMMANDS)


@pytest.fixture
def guide_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory holding the guide's modules, on ``sys.path`` while the test runs; what the
    guide registers is unregistered after it."""
    for name, code in MODULES.items():
        (tmp_path / f"{name}.py").write_text(code)
    before = {cat: list(cat.registered().values()) for cat in (COMPRESSORS, METHODS)}
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in MODULES:
            sys.modules.pop(name, None)
        for cat, held in before.items():
            for obj in cat.registered().values():
                if all(obj is not h for h in held):
                    cat.remove(obj)


def _env(where: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": os.pathsep.join([str(where), os.environ.get("PYTHONPATH", "")])}


def test_the_guide_runs(guide_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python blocks in order, in one module's namespace, as a script would run them."""
    guide = types.ModuleType("__guide__")
    monkeypatch.setitem(sys.modules, "__guide__", guide)
    for k, code in enumerate(CODE):
        exec(compile(code, f"{DOC}:block{k}", "exec", dont_inherit=True), guide.__dict__)


@pytest.mark.slow
def test_the_guides_commands_run(guide_dir: Path) -> None:
    """The guide's shell commands (the CLI with ``--plugin``, the generic tests with
    ``PERMK_PLUGINS``) beside its module; ``permk`` is this interpreter's, ``tests`` the
    package's."""
    (guide_dir / "tests").symlink_to(ROOT / "tests")
    (guide_dir / "pyproject.toml").symlink_to(ROOT / "pyproject.toml")
    for command in COMMANDS:
        words = shlex.split(command)
        env = _env(guide_dir)
        while "=" in words[0]:
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if words[0] == "permk":
            words = [sys.executable, "-m", "permk.cli", *words[1:]]
        elif words[0] == "python":
            words[0] = sys.executable
        proc = subprocess.run(words, cwd=guide_dir, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, f"$ {command}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        if words[:3] == [sys.executable, "-m", "pytest"]:
            assert re.search(r"\b(\d{2,}) passed\b", proc.stdout), proc.stdout[-2000:]
    assert any((guide_dir / "guide-out" / "quadratic" / "runs").glob("*.jsonl"))


@pytest.mark.mpi
def test_the_guides_mpi_blocks_run(guide_dir: Path) -> None:
    """The guide's blocks up to its last MPI block under mpiexec (the outside compressor in
    MARINA, then the outside method): each MPI run equals the simulator's bit for bit with only
    values on the wire (the blocks' own assertions)."""
    from conftest import MPIEXEC

    last = max(k for k, b in enumerate(CODE) if MPI_MARK in b)
    script = guide_dir / "guide.py"
    script.write_text("\n".join(CODE[: last + 1]) + "\nprint('guide ok', flush=True)\n")
    env = _env(guide_dir)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240, env=env, stdin=subprocess.DEVNULL, cwd=guide_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("guide ok") == 2
