"""The MPI runs checked by tests/test_distributed.py, and their single-process references.

A case is a dict: ``method`` (marina/ef21/gd), problem size ``n, d`` and ``noise``, the
compressor, ``rounds``, ``seed``, ``mode``, ``reduce`` and optional ``path``/``gamma``. The
MPI side (``run_cases.py``) and the test (the simulator) build the same problem from it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import permk

CASES: dict[str, dict[str, Any]] = {
    # bit for bit (reduce="ordered": every sum of the run in worker order)
    "marina_permk_d_ge_n": dict(method="marina", n=4, d=12, comp=("PermK",), mode="p2p", reduce="ordered"),
    "marina_permk_d_ge_n_uneven": dict(method="marina", n=4, d=14, comp=("PermK",), mode="p2p", reduce="ordered"),
    "marina_permk_n_ge_d": dict(method="marina", n=4, d=2, comp=("PermK",), mode="p2p", reduce="ordered"),
    "marina_permk_n_ge_d_blocks_server": dict(method="marina", n=8, d=3, comp=("PermK",), mode="server", reduce="ordered"),
    "marina_permk_blocks_dense": dict(method="marina", n=8, d=20, comp=("PermK",), mode="p2p", reduce="ordered", path="dense"),
    "marina_randk": dict(method="marina", n=4, d=20, comp=("RandK", 3), mode="p2p", reduce="ordered"),
    "marina_randk_server": dict(method="marina", n=4, d=20, comp=("RandK", 3), mode="server", reduce="ordered"),
    "marina_blockpermk": dict(method="marina", n=4, d=9, comp=("BlockPermK", 2), mode="p2p", reduce="ordered"),
    "ef21_topk": dict(method="ef21", n=4, d=20, comp=("TopK", 3), mode="p2p", reduce="ordered"),
    "ef21_topk_blocks_server": dict(method="ef21", n=8, d=10, comp=("TopK", 2), mode="server", reduce="ordered"),
    "gd": dict(method="gd", n=4, d=10, comp=None, mode="p2p", reduce="ordered"),
    # a user's LocalProblem whose data only ever exists on the rank holding the worker
    "marina_permk_own_data": dict(method="marina", n=4, d=10, comp=("PermK",), mode="p2p", reduce="ordered", problem="lsq", gamma=0.05),
    # rounding differences bounded (full gradients by Allreduce vs the closed-form ∇f)
    "marina_permk_allreduce": dict(method="marina", n=4, d=12, comp=("PermK",), mode="p2p", reduce="allreduce"),
    "marina_permk_allreduce_server": dict(method="marina", n=4, d=12, comp=("PermK",), mode="server", reduce="allreduce"),
    "ef21_topk_allreduce": dict(method="ef21", n=4, d=20, comp=("TopK", 3), mode="p2p", reduce="allreduce"),
}
ROUNDS = 60
SEED = 7
NOISE = 0.3


class LeastSquaresShard:
    """A user's :class:`permk.distributed.LocalProblem`: worker ``i`` has ``f_i(x) = ‖A_i x − b_i‖²/(2m)``
    with data drawn from the seed ``1000 + i``, generated only for the held workers."""

    def __init__(self, n: int, d: int, workers: list[int] | range, m: int = 6) -> None:
        self.n, self.d, self.workers = n, d, workers
        self.x0 = np.ones(d)
        self.data = {}
        for i in workers:
            rng = np.random.default_rng(1000 + i)
            self.data[i] = (rng.standard_normal((m, d)), rng.standard_normal(m))

    def local_grad(self, i: int, x: np.ndarray) -> np.ndarray:
        A, b = self.data[i]
        return A.T @ (A @ x - b) / len(b)

    def local_loss(self, i: int, x: np.ndarray) -> float:
        A, b = self.data[i]
        r = A @ x - b
        return float(r @ r) / (2 * len(b))


class LeastSquaresGlobal(LeastSquaresShard):
    """The same problem with every worker on one process, for the simulator."""

    def __init__(self, n: int, d: int) -> None:
        super().__init__(n, d, range(n))

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        return np.stack([self.local_grad(i, x) for i in range(self.n)])

    def grad(self, x: np.ndarray) -> np.ndarray:
        acc = np.zeros(self.d)
        for row in self.local_grads(x):
            acc += row
        return acc / self.n

    def loss(self, x: np.ndarray) -> float:
        acc = 0.0
        for i in range(self.n):
            acc += self.local_loss(i, x)
        return acc / self.n


def compressor(case: dict[str, Any]) -> permk.Compressor | None:
    if case["comp"] is None:
        return None
    name, *args = case["comp"]
    return getattr(permk, name)(*args)


def problem(case: dict[str, Any]) -> permk.SyntheticQuadratic:
    return permk.Quadratic.synthetic(n=case["n"], d=case["d"], lam=1e-3, noise_scale=NOISE, seed=1)


def run_kwargs(case: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = dict(rounds=case.get("rounds", ROUNDS), seed=SEED, record_every=case.get("record_every", 1))
    if "gamma" in case:
        kw["gamma"] = case["gamma"]
    elif case["method"] == "marina":
        kw["gamma_multiplier"] = 0.9
    return kw


class WorkerOrderMean:
    """A synthetic quadratic whose ``∇f`` and ``f`` are the worker-order means of the local
    gradients and losses (what ``reduce="ordered"`` computes), for the simulator."""

    def __init__(self, q: permk.SyntheticQuadratic) -> None:
        from permk.distributed import LocalView

        self.q = q
        self.view = LocalView(q, workers=range(q.n))
        self.n, self.d, self.x0 = q.n, q.d, q.x0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.q, name)

    def grad(self, x: np.ndarray) -> np.ndarray:
        acc = np.zeros(self.d)
        for row in self.q.local_grads(x):
            acc += row
        return acc / self.n

    def loss(self, x: np.ndarray) -> float:
        acc = 0.0
        for i in range(self.n):
            acc += float(self.view.local_loss(i, x))
        return acc / self.n


def simulate(case: dict[str, Any]) -> permk.RunResult:
    """The single-process reference run (path="dense": messages summed in worker order)."""
    prob: Any
    if case.get("problem") == "lsq":
        prob = LeastSquaresGlobal(case["n"], case["d"])
    else:
        q = problem(case)
        prob = WorkerOrderMean(q) if case["reduce"] == "ordered" else q
    kw = run_kwargs(case)
    if case["method"] == "marina":
        return permk.marina(prob, compressor(case), path="dense", **kw)
    if case["method"] == "ef21":
        return permk.ef21(prob, compressor(case), **kw)
    return permk.gd(prob, **kw)


def run_mpi(case: dict[str, Any], comm: Any = None) -> Any:
    """The same run on MPI (each rank builds the view of its own workers)."""
    import permk.distributed as pd

    if case.get("problem") == "lsq":
        # a plain list of the held workers is fine too
        local: Any = LeastSquaresShard(case["n"], case["d"], list(pd.workers_of(case["n"], comm)))
    else:
        local = pd.LocalView(problem(case), comm=comm)
    kw = dict(run_kwargs(case), comm=comm, mode=case["mode"], reduce=case["reduce"])
    if case["method"] == "marina":
        return pd.marina(local, compressor(case), path=case.get("path", "auto"), **kw)
    if case["method"] == "ef21":
        return pd.ef21(local, compressor(case), **kw)
    return pd.gd(local, **kw)
