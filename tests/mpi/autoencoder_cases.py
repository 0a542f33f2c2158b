"""The autoencoder runs checked on MPI by tests/test_autoencoder.py, and their single-process
references: the same images, problem and run on both sides (``autoencoder_run.py`` builds a
:class:`LinearAutoencoder` holding only the rank's workers, the test the whole problem)."""

from __future__ import annotations

from typing import Any

import numpy as np

import permk
from permk.problems import LinearAutoencoder

N_WORKERS, D_F, D_E, N_IMAGES, ROUNDS = 8, 16, 3, 200, 40

#: name: (method, compressor, dtype, p̂, split, reduce)
CASES: dict[str, tuple[str, Any, str, float, str, str]] = {
    "marina_permk": ("marina", ("PermK",), "float64", 0.5, "per-worker", "ordered"),
    "marina_randk_f32": ("marina", ("RandK", 4), "float32", 0.0, "per-worker", "ordered"),
    "marina_blockpermk_per_sample": ("marina", ("BlockPermK", 4), "float64", 0.5, "per-sample", "allreduce"),
    "marina_permk_f32_allreduce": ("marina", ("PermK",), "float32", 0.5, "per-worker", "allreduce"),
    "ef21_topk": ("ef21", ("TopK", 4), "float64", 0.75, "per-worker", "ordered"),
}


def images() -> np.ndarray:
    return np.random.default_rng(5).random((N_IMAGES, D_F))


def problem(name: str, workers: Any = None) -> LinearAutoencoder:
    _, _, dtype, p_hat, split, _ = CASES[name]
    return LinearAutoencoder(images(), N_WORKERS, p_hat, 1e-2, d_e=D_E, seed=3, dtype=np.dtype(dtype), split=split, workers=workers)


def compressor(name: str) -> permk.Compressor:
    kind, *args = CASES[name][1]
    return getattr(permk, kind)(*args)  # type: ignore[no-any-return]


def method(name: str) -> Any:
    return permk.methods.catalog()[CASES[name][0]]


OPTIONS = dict(rounds=ROUNDS, seed=11, gamma=2e-3)
