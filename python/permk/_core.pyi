"""Type stub of the native module (Rust, PyO3). Private: use the ``permk`` API."""

from typing import final

import numpy as np
import numpy.typing as npt

__all__ = ["__version__", "Spec", "Tridiagonal", "permk_plan_from_permutations", "block_plan_from_permutation", "coin"]

__version__: str

_Plan = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]

@final
class Spec:
    def __new__(
        cls,
        sparsifier: str,
        *,
        k: int | None = None,
        m: int | None = None,
        labels: list[int] | None = None,
        quantizer: str = "none",
        s: int | None = None,
    ) -> Spec: ...
    def check(self, n: int, d: int) -> None: ...
    def aggregate(self, a: npt.NDArray[np.floating], seed: int, round: int) -> npt.NDArray[np.floating]: ...
    def compress_all(self, a: npt.NDArray[np.floating], seed: int, round: int) -> npt.NDArray[np.floating]: ...
    def compress(
        self, x: npt.NDArray[np.floating], worker: int, n_workers: int, seed: int, round: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.floating]]: ...
    def plan(self, n: int, d: int, seed: int, round: int) -> _Plan: ...

def permk_plan_from_permutations(n: int, d: int, pi_d: list[int], pi_n: list[int]) -> _Plan: ...
def block_plan_from_permutation(labels: list[int], pi: list[int]) -> _Plan: ...
def coin(seed: int, round: int, p: float) -> bool: ...

@final
class Tridiagonal:
    def __new__(cls, a: list[float], c: float, beta: list[float]) -> Tridiagonal: ...
    def loss(self, x: npt.NDArray[np.float64]) -> float: ...
    def grad(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]: ...
    def local_grads(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]: ...
    def local_grad_coords(
        self, x: npt.NDArray[np.float64], rows: npt.NDArray[np.int64], cols: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float64]: ...
    def marina_round(
        self,
        spec: Spec,
        x: npt.NDArray[np.float64],
        g: npt.NDArray[np.float64],
        gamma: float,
        p: float,
        seed: int,
        round: int,
    ) -> bool: ...
    def ef21_topk_round(
        self,
        x: npt.NDArray[np.float64],
        g: npt.NDArray[np.float64],
        gmat: npt.NDArray[np.float64],
        gamma: float,
        k: int,
    ) -> None: ...
    def solve_mean(self, rhs: list[float]) -> npt.NDArray[np.float64]: ...
