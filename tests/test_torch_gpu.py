"""The DDP transport's exchanges with n ranks held by one process (tests/gpu/gpu_checks.py's
FakeGroup standing in for the collectives): on the CPU here, on a CUDA device where there is one
(marker ``gpu``, skipped with its reason otherwise; tests/gpu/run_gpu_checks.sh runs every GPU
check, multi-process ones included, on a GPU machine)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="permk.torch needs PyTorch (pip install 'permk[torch]')")

GPU = Path(__file__).with_name("gpu")


def gpu_checks() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_checks", GPU / "gpu_checks.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_checks"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_in_process_exchanges_cpu() -> None:
    """Plain (float32/64 = aggregate, bf16/fp16 = the recipe rounded), DIANA, EF21 with TopK and
    the sharded exchange for n = 2, 4, 8 ranks in one process, on the CPU."""
    got = gpu_checks().check_in_process(torch.device("cpu"), quick=True)
    assert not got["failures"] and got["compared"] > 200, got


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)")


@pytest.mark.gpu
@needs_cuda
def test_in_process_exchanges_cuda() -> None:
    got = gpu_checks().check_in_process(torch.device("cuda"), quick=False)
    assert not got["failures"], got


@pytest.mark.gpu
@needs_cuda
def test_gpu_script() -> None:
    """tests/gpu/run_gpu_checks.sh end to end (NCCL world of one, two processes on the GPU)."""
    proc = subprocess.run(["bash", str(GPU / "run_gpu_checks.sh")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "permk GPU checks: PASS" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]
