"""Type stub of the native module (Rust, PyO3). Private: use the ``permk`` API."""

import numpy as np
import numpy.typing as npt

__version__: str

_Plan = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]

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
