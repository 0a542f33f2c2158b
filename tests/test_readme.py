"""The README's Python examples run (an MPI or DDP one with a single process; a DDP one skips
without torch). The README is short: its one example is the first five minutes of the API; the
guide's examples run when the documentation is built (docs/build.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 1 and all(len(b.splitlines()) <= 15 for b in BLOCKS)


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code: str) -> None:
    if "permk.distributed" in code:
        pytest.importorskip("mpi4py")
    if "permk.torch" in code:
        pytest.importorskip("torch", reason="the permk.torch examples need PyTorch: pip install 'permk[torch]'")
    if "two_layer_network" in code:
        from permk.problems import DEBIAN_FASHION_MNIST

        if not DEBIAN_FASHION_MNIST.is_dir():
            pytest.skip("Debian's dataset-fashion-mnist is not installed")
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
