"""The MPI runs checked by tests/test_distributed.py, and their single-process references.

A case is a dict: ``method`` (a name of :func:`permk.methods.catalog`), problem size ``n, d``
and ``noise``, the compressor, ``rounds``, ``seed``, ``mode``, ``reduce`` and optional
``path``/``gamma``/``p``/``options`` (the method's own); ``full_with_compressed`` marks a method
whose coin's heads send full gradients besides the compressed message (RandDIANA),
``full_rounds`` one whose every round sends a full vector (SGD), ``coin_compressed`` one whose
coin changes what a worker computes, not what it sends (DASHA-PAGE), ``problem`` a problem other than
the synthetic quadratic (``"lsq"``: a user's LocalProblem; ``"sigmoid"``). The
MPI side (``run_cases.py``) and the test (the simulator) build the same problem from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

import permk
import permk.exchanges as ex

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
    # the three ways of computing a round's values (native kernel, coordinate oracle, dense
    # rows), with and without the plan of the next round computed ahead: the same bits
    "marina_permk_fused": dict(method="marina", n=8, d=20, comp=("PermK",), mode="p2p", reduce="ordered", path="fused"),
    "marina_permk_rust_no_prefetch": dict(method="marina", n=8, d=20, comp=("PermK",), mode="server", reduce="ordered", path="rust",
                                          prefetch=False),
    "marina_blockpermk_n_in_place_fused": dict(method="marina", n=4, d=13, comp=("BlockPermK", 4), mode="p2p", reduce="ordered",
                                               path="fused"),
    "ef21_topk": dict(method="ef21", n=4, d=20, comp=("TopK", 3), mode="p2p", reduce="ordered"),
    "ef21_topk_blocks_server": dict(method="ef21", n=8, d=10, comp=("TopK", 2), mode="server", reduce="ordered"),
    # EF21 started from compressed gradients (init="compressed", the authors' quadratic runs)
    "ef21_topk_compressed_init": dict(method="ef21", n=4, d=20, comp=("TopK", 3), mode="p2p", reduce="ordered", init="compressed"),
    "gd": dict(method="gd", n=4, d=10, comp=None, mode="p2p", reduce="ordered"),
    # a user's LocalProblem whose data only ever exists on the rank holding the worker
    "marina_permk_own_data": dict(method="marina", n=4, d=10, comp=("PermK",), mode="p2p", reduce="ordered", problem="lsq", gamma=0.05),
    # a compressor defined in Python outside the package (no Rust kernel, no shared plan): pairs
    "marina_python_compressor": dict(method="marina", n=4, d=12, comp=("Rand1",), mode="p2p", reduce="ordered"),
    "marina_python_compressor_server": dict(method="marina", n=8, d=6, comp=("Rand1",), mode="server", reduce="ordered"),
    # the permutation family of the appendix "More Examples" and the authors' code
    "marina_blockpermk_n_in_place": dict(method="marina", n=4, d=14, comp=("BlockPermK", 4), mode="p2p", reduce="ordered"),
    "marina_blockpermk_n_in_place_server": dict(method="marina", n=4, d=13, comp=("BlockPermK", 4), mode="server", reduce="ordered", path="dense"),
    "marina_blockpermk_n_blocks_per_rank": dict(method="marina", n=8, d=20, comp=("BlockPermK", 8), mode="p2p", reduce="ordered"),
    "marina_coordinate_sampling": dict(method="marina", n=4, d=12, comp=("CoordinateSampling",), mode="p2p", reduce="ordered", p=0.3),
    "marina_group_permk": dict(method="marina", n=8, d=16, comp=("GroupPermK", ((0, 2, 4, 6), (1, 3, 5, 7))), mode="p2p", reduce="ordered"),
    "marina_permutation_of_mappings": dict(method="marina", n=4, d=12, comp=("default", "PermutationOfMappings"), mode="p2p", reduce="ordered"),
    # dense compressors (every coordinate in order): only the values travel
    "marina_qsgd": dict(method="marina", n=4, d=12, comp=("QSGD", 4), mode="p2p", reduce="ordered"),
    "dcgd_natural_server": dict(method="dcgd", n=8, d=10, comp=("NaturalCompression",), mode="server", reduce="ordered", gamma=0.1),
    "ef21_identity": dict(method="ef21", n=4, d=10, comp=("Identity",), mode="p2p", reduce="ordered"),
    # DCGD, defined once (permk.methods) and run on both backends
    "dcgd_randk": dict(method="dcgd", n=4, d=20, comp=("RandK", 4), mode="p2p", reduce="ordered", gamma=0.2),
    "dcgd_permk_fused": dict(method="dcgd", n=8, d=20, comp=("PermK",), mode="p2p", reduce="ordered", gamma=0.2),
    # DIANA (the shifted exchange: values of a shared plan, in place, and (index, value) pairs),
    # RandDIANA (full gradients and a compressed message on a coin's heads) and shifted DCGD
    "diana_permk": dict(method="diana", n=4, d=12, comp=("PermK",), mode="p2p", reduce="ordered"),
    "diana_randk_server": dict(method="diana", n=4, d=20, comp=("RandK", 3), mode="server", reduce="ordered"),
    "diana_blockpermk_n_in_place": dict(method="diana", n=4, d=14, comp=("BlockPermK", 4), mode="p2p", reduce="ordered"),
    "diana_python_compressor": dict(method="diana", n=4, d=12, comp=("Rand1",), mode="p2p", reduce="ordered",
                                    options={"alpha": 1 / 12}, gamma=0.02),
    "rand_diana_permk": dict(method="rand_diana", n=4, d=12, comp=("PermK",), mode="p2p", reduce="ordered", p=0.3,
                             full_with_compressed=True),
    "rand_diana_randk_server": dict(method="rand_diana", n=4, d=20, comp=("RandK", 5), mode="server", reduce="ordered", p=0.3,
                                    full_with_compressed=True),
    "dcgd_shifted_permk": dict(method="dcgd", n=8, d=20, comp=("PermK",), mode="p2p", reduce="ordered", options={"shifts": "initial"}),
    # finite-sum methods on the nonconvex sigmoid loss: minibatches drawn by each rank for its
    # own workers (VR-MARINA: the rows of the same minibatch at two points, compressed); SGD
    # sends a full vector every round (full_rounds)
    "vr_marina_permk": dict(method="vr_marina", n=4, d=12, comp=("PermK",), mode="p2p", reduce="ordered", problem="sigmoid",
                            options={"batch_size": 3}),
    "vr_marina_randk_server": dict(method="vr_marina", n=4, d=12, comp=("RandK", 3), mode="server", reduce="ordered",
                                   problem="sigmoid", options={"batch_size": 3}),
    "marina_stochastic_permk": dict(method="marina_stochastic", n=4, d=12, comp=("PermK",), mode="p2p", reduce="ordered",
                                    problem="sigmoid", options={"batch_size": 3, "megabatch_size": 12}),
    "dasha_page_permk": dict(method="dasha_page", n=4, d=12, comp=("PermK",), mode="p2p", reduce="ordered", problem="sigmoid",
                             gamma=0.3, options={"batch_size": 3}, coin_compressed=True),
    "dasha_mvr_randk_server": dict(method="dasha_mvr", n=4, d=12, comp=("RandK", 3), mode="server", reduce="ordered",
                                   problem="sigmoid", gamma=0.3, options={"batch_size": 3, "momentum": 0.3}),
    "sgd_sigmoid": dict(method="sgd", n=4, d=12, comp=None, mode="p2p", reduce="ordered", problem="sigmoid",
                        options={"batch_size": 3}, full_rounds=True),
    # DASHA (the shifted exchange), DASHA-PP and MARINA with partial participation: s of n
    # workers per round from (seed, t), a non-participant sends nothing
    "dasha_permk": dict(method="dasha", n=4, d=12, comp=("PermK",), mode="p2p", reduce="ordered"),
    "dasha_randk_server": dict(method="dasha", n=4, d=20, comp=("RandK", 3), mode="server", reduce="ordered"),
    "dasha_permk_fused": dict(method="dasha", n=8, d=20, comp=("PermK",), mode="p2p", reduce="ordered", path="fused"),
    "dasha_natural_pairs": dict(method="dasha", n=4, d=12, comp=("NaturalCompression",), mode="p2p", reduce="ordered"),
    "dasha_pp_permk": dict(method="dasha", n=4, d=14, comp=("PermK",), mode="p2p", reduce="ordered", options={"participation": 2}),
    "dasha_pp_randk_blocks_server": dict(method="dasha", n=8, d=10, comp=("RandK", 2), mode="server", reduce="ordered",
                                         options={"participation": 5}),
    "marina_pp_permk": dict(method="marina", n=4, d=14, comp=("PermK",), mode="p2p", reduce="ordered", p=0.3, options={"participation": 2}),
    "marina_pp_randk_blocks_server": dict(method="marina", n=8, d=10, comp=("RandK", 2), mode="server", reduce="ordered",
                                          p=0.3, options={"participation": 5}),
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


@dataclass(frozen=True, eq=False)
class MomentumState(permk.State):
    """The state of :class:`LocalMomentum`: the iterate, the workers' momenta ``M`` (one row per
    held worker) and their mean ``m``."""

    x: np.ndarray
    m: np.ndarray
    M: np.ndarray
    round: int = 0
    seed: int = 0
    bits: float = 0.0

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "m": "shared", "M": "per_worker"}


@dataclass(frozen=True)
class MomentumParams(permk.MethodParams):
    """:class:`LocalMomentum`'s parameters: the momentum ``beta``."""

    beta: float


class LocalMomentum(permk.Method):
    """A user's method with a per-worker state, defined outside the package: worker ``i`` keeps
    the momentum ``M_i ← β M_i + ∇f_i(x)`` and the iterate steps along their mean,
    ``x ← x − γ (1/n) Σ_i M_i`` (full vectors: no compressor; pass ``gamma``). Only its state's
    ``arrays`` tell the driver, the resume checks, ``load_state`` and the MPI digests what it holds."""

    name = "local_momentum"
    label = "Local momentum"
    state_type = MomentumState
    exchange = permk.exchanges.mean_grad
    takes_compressor = False

    def parameters(self, compressor: permk.Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   beta: float = 0.5) -> MomentumParams:
        if not compressor.capabilities.lossless:
            raise ValueError(f"local momentum sends full vectors: its compressor must be Identity, got {compressor.name}")
        bits = float(d * float_bits)
        return MomentumParams(bits=permk.methods.Bits(compressed=bits, expected=bits, full=bits), beta=float(beta))

    def init(self, x0: np.ndarray, backend: Any, compressor: permk.Compressor, params: Any, *, seed: int) -> MomentumState:
        M = np.array(ex.local_grads(backend, x0), dtype=np.float64)
        return MomentumState(x=x0, m=ex.mean_rows(backend, M), M=M, seed=seed)

    def update(self, state: MomentumState, backend: Any, compressor: permk.Compressor,
               params: Any) -> tuple[MomentumState, permk.RoundInfo]:
        x = state.x - params.gamma * state.m
        M = params.own.beta * state.M + ex.local_grads(backend, x)
        bits = params.bits.compressed
        return (MomentumState(x=x, m=ex.mean_rows(backend, M), M=M, round=state.round + 1, seed=state.seed, bits=state.bits + bits),
                permk.RoundInfo(bits))


local_momentum = LocalMomentum()


class Rand1(permk.Compressor):
    """A user's compressor, written in Python outside the package: each worker sends one
    coordinate drawn from its own stream, scaled by d (independent Rand1: ω = d − 1). It has no
    custom ``__repr__``: the MPI launch check compares its fingerprint (type and parameters)."""

    def floats_per_worker(self, n: int, d: int) -> int:
        return 1

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        return ((d - 1) / n, 0.0)

    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> permk.Message:
        x = np.asarray(x, dtype=np.float64)
        j = int(np.random.default_rng([seed, round, worker]).integers(x.size))
        return permk.Message(worker, n_workers, x.size, np.array([j]), np.array([x.size * x[j]]))


def compressor(case: dict[str, Any]) -> permk.Compressor | None:
    if case["comp"] is None:
        return None
    name, *args = case["comp"]
    if name == "Rand1":
        return Rand1()
    if name == "default":
        return getattr(permk, args[0]).default(case["n"], case["d"])  # type: ignore[no-any-return]
    return getattr(permk, name)(*args)  # type: ignore[no-any-return]


def sigmoid_problem(n: int, d: int) -> permk.NonconvexSigmoid:
    """The nonconvex sigmoid loss on seeded Gaussian data: ``d − 1`` features and the bias, 10
    samples per worker."""
    rng = np.random.default_rng(5)
    return permk.NonconvexSigmoid(rng.standard_normal((10 * n, d - 1)), rng.integers(0, 2, 10 * n), n=n, seed=0)


def sent(case: dict[str, Any]) -> permk.Compressor | None:
    """The compressor whose messages travel: the case's, or its participation family."""
    comp, s = compressor(case), case.get("options", {}).get("participation")
    return comp if comp is None or s is None else permk.Participation(comp, s)


def problem(case: dict[str, Any]) -> Any:
    """The case's global problem: the synthetic quadratic (or, with ``problem="sigmoid"``,
    :func:`sigmoid_problem`), with the worker-order ``∇f`` and ``f`` of :class:`WorkerOrderMean`
    where every sum must be the worker-order one."""
    q: Any
    if case.get("problem") == "sigmoid":
        q = sigmoid_problem(case["n"], case["d"])
    else:
        q = permk.Quadratic.synthetic(n=case["n"], d=case["d"], lam=1e-3, noise_scale=NOISE, seed=1)
    return WorkerOrderMean(q) if case["reduce"] == "ordered" else q


def run_kwargs(case: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = dict(rounds=case.get("rounds", ROUNDS), seed=SEED, record_every=case.get("record_every", 1))
    if "gamma" in case:
        kw["gamma"] = case["gamma"]
    elif METHODS[case["method"]].has_coin:
        kw["gamma_multiplier"] = 0.9  # MARINA: below the theory's step
    if "p" in case:
        kw["p"] = case["p"]
    if "init" in case:
        kw["init"] = case["init"]
    kw.update(case.get("options", {}))
    return kw


#: Every method of the package's catalog, by name (a case's ``method``).
METHODS = permk.methods.catalog()


def example_problem(method: permk.Method, n: int, d: int) -> Any:
    """A problem ``method`` runs on with ``n`` workers in dimension ``d``: a small
    :class:`permk.NonconvexSigmoid` (``d − 1`` features and the bias, 8 samples per worker) for
    a method that needs a finite-sum problem (``needs_finite_sum``), else the synthetic quadratic."""
    if method.needs_finite_sum:
        rng = np.random.default_rng(0)
        return permk.NonconvexSigmoid(rng.standard_normal((8 * n, d - 1)), rng.integers(0, 2, 8 * n), n=n, seed=0)
    return permk.Quadratic.synthetic(n, d, lam=1e-2, noise_scale=0.2, seed=0)


#: The options the generic tests run the package's methods with: their required minibatch options.
EXAMPLE_OPTIONS: dict[type, dict[str, Any]] = {
    permk.methods.VRMarina: {"batch_size": 2},
    permk.methods.StochasticMarina: {"batch_size": 2, "megabatch_size": 8},
    permk.methods.SGD: {"batch_size": 2},
    permk.methods.DashaPage: {"batch_size": 2},
    permk.methods.DashaMVR: {"batch_size": 2, "momentum": 0.5},
}


def run_options(method: permk.Method) -> dict[str, Any]:
    """The options the generic tests run ``method`` with: the package's (:data:`EXAMPLE_OPTIONS`,
    by the nearest class), else an outside method's own ``example_options`` (a test hook it may
    declare), else none."""
    for cls in type(method).__mro__:
        if cls in EXAMPLE_OPTIONS:
            return dict(EXAMPLE_OPTIONS[cls])
    return dict(getattr(method, "example_options", {}))


def example_options(method: permk.Method, problem: Any) -> dict[str, Any]:
    """The options of ``method.parameters`` in the generic tests: :func:`run_options` and the problem."""
    return {**run_options(method), "problem": problem}


def example_compressor(method: permk.Method, n: int, d: int) -> permk.Compressor:
    """A compressor that suits ``method`` at ``(n, d)``, chosen by the method's and the
    compressors' attributes: the identity for a method that takes no compressor
    (``takes_compressor``), else the first compressor of the catalog that compresses (not
    ``capabilities.lossless``) whose default the method's ``parameters`` accept."""
    from permk.compressors import catalog

    if not method.takes_compressor:
        return permk.Identity()
    options = example_options(method, example_problem(method, n, d))
    for cls in catalog().values():
        try:
            c = cls.default(n, d)
            method.parameters(c, n, d, **options)
        except (TypeError, ValueError):
            continue
        if not c.capabilities.lossless:
            return c
    raise ValueError(f"no compressor of the catalog suits {method!r} at n={n}, d={d}")


class WorkerOrderMean:
    """A synthetic quadratic whose ``∇f`` and ``f`` are the worker-order means of the local
    gradients and losses (what ``reduce="ordered"`` computes), for the simulator."""

    def __init__(self, q: Any) -> None:
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
    """The single-process reference run (path="dense": messages summed in worker order, bit for
    bit what the MPI runs' rust and fused paths compute)."""
    prob = LeastSquaresGlobal(case["n"], case["d"]) if case.get("problem") == "lsq" else problem(case)
    comp = compressor(case) or permk.Identity()
    return permk.run(METHODS[case["method"]], prob, comp, path="dense", **run_kwargs(case))


def run_mpi(case: dict[str, Any], comm: Any = None) -> Any:
    """The same run on MPI: each rank builds the view of its own workers (the global problem is
    handed to the driver as it is, which views it from each rank)."""
    import permk.distributed as pd

    local: Any
    if case.get("problem") == "lsq":
        # a plain list of the held workers is fine too
        local = LeastSquaresShard(case["n"], case["d"], list(pd.workers_of(case["n"], comm)))
    else:
        local = problem(case)
    kw = dict(run_kwargs(case), comm=comm, mode=case["mode"], reduce=case["reduce"], path=case.get("path", "auto"),
              prefetch=case.get("prefetch", True))
    return pd.run(METHODS[case["method"]], local, compressor(case) or permk.Identity(), **kw)
