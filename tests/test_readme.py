"""The README's Python examples run (the MPI and DDP ones with a single process; the DDP one
skips without torch)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 3


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
