"""The machinery shared by the experiment grids: runs advanced in chunks, the per-cell search
over step-size multipliers with a bits budget, the best-run criterion, and a process pool over
cells.

A *cell* is one subplot of the paper's figures (one problem instance: ``(n, noise scale)`` for
the quadratic, ``(λ, p̂)`` for the autoencoder). In a cell every method (MARINA+PermK,
EF21+TopK, MARINA+RandK) runs with the step sizes ``2^j · γ_theory``.

**Bits budget.** All runs of a cell get the same budget of bits per worker,
``B = budget_factor × b*``, where ``b*`` is the fewest bits with which any run of the cell
reached ``‖∇f‖² ≤ tol · ‖∇f(x⁰)‖²`` (the target; ``tol = 1e-6`` for the quadratic). So the best
method always reaches the target, with ``budget_factor − 1`` times as many bits again to show
how the methods go on. Runs are advanced in chunks and stop at the budget known so far (it
only shrinks as runs finish, so every run covers the final ``B``), after ``max_rounds``
rounds, or when they diverge. The figures' x-axis is ``[0, B]``.

**Best step** of a method in a cell (the paper's "best convergence rate", made precise),
:func:`score`:

1. runs that diverge are dropped (a non-finite iterate, or ``‖∇f‖² > div_factor · ‖∇f(x⁰)‖²``),
   as the paper "omitted plots where algorithms diverged";
2. among the rest, the smallest ``‖∇f‖²`` at the end of the budget wins (the last value
   recorded with at most ``B`` bits sent).

**Pruning** (EF21 only, by default): multipliers are tried from the largest (the stability
edge ``2^j γ_theory ≤ 2/L_−``) downwards; EF21 runs are the expensive ones (``O(nd)`` per round)
and below the edge they only get slower, so the scan of a method stops after ``patience``
consecutive non-diverged runs worse than its best so far. ``--no-prune`` runs every multiplier.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from .results import append_record, from_json, hold_directory, read_json, read_records, thin_indices, to_jsonable, write_json

__all__ = [
    "METHODS",
    "Spec",
    "available_specs",
    "SearchOptions",
    "Run",
    "multiplier_exponents",
    "score",
    "search_cell",
    "best_runs",
    "cell_budget",
    "run_pool",
    "run_grid",
    "is_writer",
    "mpi_comm",
]

#: The paper's methods, in the order they run within a cell (PermK first: it is cheap and sets
#: the budget). Any ``METHOD-COMPRESSOR`` of :func:`available_specs` can be asked for.
METHODS = ("marina-permk", "ef21-topk", "marina-randk")


@dataclass(frozen=True)
class Spec:
    """A method of the experiments, ``"METHOD-COMPRESSOR"`` (e.g. ``"marina-permk"``): a method
    object of :mod:`permk.methods` and a compressor class of :func:`permk.compressors.catalog`,
    instantiated for each cell with :meth:`~permk.Compressor.default` (``K = ⌈d/n⌉`` for a
    tunable size, the paper's choice in "Experiments setup")."""

    key: str
    method: Any
    compressor_class: Any

    @classmethod
    def parse(cls, key: str) -> Spec:
        """The spec ``METHOD-COMPRESSOR`` (ValueError listing the available ones otherwise)."""
        from permk.compressors import catalog
        from permk.methods import catalog as methods

        name, _, comp = str(key).partition("-")
        if name not in methods() or comp not in catalog():
            raise ValueError(f"unknown method {key!r}; expected METHOD-COMPRESSOR, one of {', '.join(available_specs())}")
        return cls(key=str(key), method=methods()[name], compressor_class=catalog()[comp])

    def compressor(self, n: int, d: int) -> Any:
        """The compressor of this spec for ``n`` workers in dimension ``d``."""
        return self.compressor_class.default(n, d)

    def identical_workers_collapse(self, compressor: Any) -> bool:
        """Whether workers that are the same function stay identical under this method with
        ``compressor``: error feedback with a deterministic compressor (TopK) keeps equal ``g_i``,
        so the iterates do not depend on how many such workers there are (the experiments then
        run as few as they can)."""
        return bool(self.method.exchange == "error_feedback" and compressor.capabilities.deterministic)

    @property
    def label(self) -> str:
        """The legend label (the paper's: ``PermK``, ``RandK``, ``EF21: TopK``)."""
        comp = self.compressor_class.__name__
        return comp if self.method.name == "marina" else f"{self.method.name.upper()}: {comp}"

    @property
    def short(self) -> str:
        """The compressor's part of the key (figure names: ``quadratic_randk_permk``)."""
        return self.key.partition("-")[2]


def available_specs(n: int = 10, d: int = 100) -> list[str]:
    """Every ``METHOD-COMPRESSOR`` the experiments can run: the methods with a theory step
    (MARINA, EF21) and the compressors whose defaults suit them (checked at ``(n, d)``)."""
    from permk.compressors import catalog
    from permk.methods import catalog as methods
    from permk.theory.steps import Constants

    out = []
    consts = Constants(L_minus=1.0, L_plus=1.0, L_pm=1.0)
    for mname, method in methods().items():
        if method.exchange == "mean_grad":
            continue  # GD: no compressor (it is MARINA with the identity)
        for cname, cls in catalog().items():
            try:
                c = cls.default(n, d)
                params = method.parameters(c, n, d)
                method.step(c, n, d, params, consts)
            except (TypeError, ValueError):
                continue
            out.append(f"{mname}-{cname}")
    return out


def theory_gamma(problem: Any, spec: Spec, opts: SearchOptions, *, constants: str | None = None) -> float:
    """The theory's step (multiplier 1) of ``spec`` on ``problem``, chosen exactly as a run of
    the method chooses it (:func:`permk.methods.setup`: p = ζ/d, Theorem AB / AB-PL, the EF21
    theorem) from the problem's constants with ``opts.constants`` (``"pessimistic"``:
    ``L_+² = L_±² = (1/n) Σ L_i²``) unless ``constants`` overrides it."""
    from permk.methods import setup

    n, d = int(problem.n), int(problem.d)
    params = setup(spec.method, problem, spec.compressor(n, d), n=n, d=d, rounds=1, seed=opts.seed,
                   pl=opts.pl, constants=constants or opts.constants, float_bits=opts.float_bits)
    return float(params["gamma"])


def multiplier_exponents(gamma_theory: float, L_minus: float, *, max_count: int | None = None, cap: int = 16) -> list[int]:
    """The exponents ``j`` of the multipliers ``2^j``, from the largest with
    ``2^j γ_theory ≤ 2/L_−`` (beyond it even exact gradient descent diverges) down to ``0``
    (the theory's step), largest first; ``max_count`` keeps only the largest ones."""
    if not (gamma_theory > 0 and L_minus > 0):
        raise ValueError("gamma_theory and L_minus must be positive")
    top = int(math.floor(math.log2(2.0 / (L_minus * gamma_theory)) + 1e-12))
    top = max(0, min(top, cap))
    js = list(range(top, -1, -1))
    return js[:max_count] if max_count else js


@dataclass(frozen=True)
class SearchOptions:
    """Options of the per-cell search (see the module docstring)."""

    seed: int = 0
    tol: float = 1e-6
    budget_factor: float = 20.0
    max_rounds: int = 20000
    div_factor: float = 1e2
    prune: tuple[str, ...] = ("ef21-topk",)
    patience: int = 1
    pl: bool = False
    constants: str = "pessimistic"
    float_bits: int = 32
    chunk_seconds: float = 0.5


class Run:
    """One method with one step size, advanced in chunks through the library's drivers
    (:func:`permk.marina`, :func:`permk.ef21`) by resuming their state, so a chunked run gives
    exactly the iterates of one long run. Records every round.

    Where a run stops does not depend on the chunks (nor so on timing): :meth:`settle` cuts the
    record at the first round that diverged or that reached the budget in force at that round
    (``budget_factor × min(cell's best bits to target, the run's own)``)."""

    def __init__(self, problem: Any, spec: Spec, multiplier: float, opts: SearchOptions, *, gamma: float | None = None,
                 compressor: Any = None, mpi: bool = False) -> None:
        self.problem = problem
        self.mpi = mpi
        self.spec = spec
        self.multiplier = float(multiplier)
        self.opts = opts
        self.gamma_base = gamma
        self.compressor = compressor if compressor is not None else spec.compressor(int(problem.n), int(problem.d))
        self.state: Any = None
        self.params: dict[str, Any] = {}
        self.a: dict[str, np.ndarray] = {}
        self.g0: float | None = None
        self.diverged = False
        self.finished = False
        self._stopped_diverged = False
        self.hit_index: int | None = None
        self.expected_per_round = 0.0
        self.seconds = 0.0

    @property
    def round(self) -> int:
        return int(self.a["round"][-1]) if self.a else 0

    @property
    def total_bits(self) -> float:
        return float(self.a["bits"][-1]) if self.a else 0.0

    @property
    def hit_bits(self) -> float | None:
        return None if self.hit_index is None else float(self.a["bits"][self.hit_index])

    def advance(self, rounds: int) -> None:
        """Run ``rounds`` more rounds (fewer if the run diverges); call :meth:`settle` after."""
        t0 = time.perf_counter()
        kw: dict[str, Any] = dict(rounds=int(rounds), seed=self.opts.seed, gamma=self.gamma_base,
                                  gamma_multiplier=self.multiplier, pl=self.opts.pl, constants=self.opts.constants,
                                  float_bits=self.opts.float_bits, record_every=1, state=self.state)
        res: Any
        if self.mpi:
            # one MPI rank per block of workers (permk.distributed): the same iterates, every rank
            # gets the same result, so every rank takes the same decisions
            import permk.distributed as pd

            res = pd.run(self.spec.method, self.problem, self.compressor, **kw)
        else:
            res = self.spec.method(self.problem, self.compressor, **kw)
        self.seconds += time.perf_counter() - t0
        first = self.state is None
        if first:
            self.params = dict(res.params)
            self.g0 = float(res.grad_norm_sq[0])
            self.expected_per_round = float(res.expected_bits_per_worker[-1] - res.expected_bits_per_worker[0]) / max(1, int(res.rounds[-1] - res.rounds[0]))
        sl = slice(0, None) if first else slice(1, None)
        new = {"round": res.rounds[sl], "bits": res.bits_per_worker[sl], "grad_norm_sq": res.grad_norm_sq[sl]}
        if res.f_gap is not None:
            new["f_gap"] = res.f_gap[sl]
        self.a = new if first else {k: np.concatenate([self.a[k], v]) for k, v in new.items() if k in self.a}
        self.state = res.state
        if res.diverged_at is not None:
            self._stopped_diverged = True

    def settle(self, best_hit: float) -> None:
        """Find the target, divergence and the stop point in the record (see the class doc)."""
        g, b = self.a["grad_norm_sq"], self.a["bits"]
        g0 = self.g0 if self.g0 else 1.0
        bad = ~np.isfinite(g) | (g > self.opts.div_factor * g0)
        hit = np.nonzero(g <= self.opts.tol * g0)[0]
        h = int(hit[0]) if len(hit) else None
        cap = np.full(len(b), self.opts.budget_factor * best_hit)
        if h is not None:
            cap[h:] = np.minimum(cap[h:], self.opts.budget_factor * b[h])
        over = np.nonzero(b >= cap)[0]
        div = np.nonzero(bad)[0]
        end = len(b) - 1
        if len(over):
            end = min(end, int(over[0]))
            self.finished = True
        if len(div) and div[0] <= end:
            end = int(div[0])
            self.finished = self.diverged = True
        if self._stopped_diverged:
            self.finished = self.diverged = True
        self.a = {k: v[: end + 1] for k, v in self.a.items()}
        self.hit_index = h if (h is not None and h <= end and not bad[: h + 1].any()) else None
        if self.round >= self.opts.max_rounds:
            self.finished = True

    def seconds_per_round(self) -> float:
        return self.seconds / max(1, self.round)

    def arrays(self) -> dict[str, np.ndarray]:
        out = dict(self.a)
        out["expected_bits"] = out["round"] * self.expected_per_round
        return out

    def summary(self) -> dict[str, Any]:
        a = self.arrays()
        g = a["grad_norm_sq"]
        return {
            "rounds_run": self.round,
            "bits_sent": self.total_bits,
            "grad_norm_sq_0": self.g0,
            "final_grad_norm_sq": float(g[-1]),
            "min_grad_norm_sq": float(np.nanmin(g)) if np.isfinite(g).any() else float("nan"),
            "reached_target": self.hit_index is not None,
            "bits_to_target": self.hit_bits,
            "rounds_to_target": int(a["round"][self.hit_index]) if self.hit_index is not None else None,
            "diverged": self.diverged,
            "seconds": self.seconds,
            "simulated_workers": int(self.problem.n),
        }

    def curve(self) -> dict[str, Any]:
        a = self.arrays()
        keep = [self.hit_index] if self.hit_index is not None else []
        idx = thin_indices(len(a["round"]), keep=keep)
        return {k: v[idx] for k, v in a.items()}


def score(summary: dict[str, Any], curve: dict[str, Any], budget: float) -> tuple[float, float]:
    """The sort key of the best-step criterion (smaller is better): diverged runs last, then
    the ``‖∇f‖²`` at the end of the budget (the last value recorded with ``bits ≤ budget``)."""
    if summary.get("diverged"):
        return (3.0, math.inf)
    bits = np.asarray(curve["bits"], dtype=float)
    g = np.asarray(curve["grad_norm_sq"], dtype=float)
    inside = np.nonzero(bits <= budget * (1 + 1e-12))[0]
    v = float(g[inside[-1]]) if len(inside) else float(g[0])
    return (0.0, v) if math.isfinite(v) else (3.0, math.inf)


def cell_budget(records: Sequence[dict[str, Any]], budget_factor: float) -> float:
    """The bits range of a cell: ``budget_factor ×`` the fewest bits any run needed to reach the
    target; without such a run, the most bits any run sent."""
    hits = [r["summary"]["bits_to_target"] for r in records if r["summary"].get("reached_target") and not r["summary"].get("diverged")]
    if hits:
        return budget_factor * min(hits)
    return max((float(r["summary"]["bits_sent"]) for r in records), default=0.0)


def best_runs(records: Sequence[dict[str, Any]], budget_factor: float) -> dict[str, dict[str, Any]]:
    """The best run of each method of one cell (see :func:`score`); methods whose runs all
    diverged are left out."""
    budget = cell_budget(records, budget_factor)
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["summary"].get("diverged"):
            continue
        m = r["method"]
        if m not in out or score(r["summary"], r["curve"], budget) < score(out[m]["summary"], out[m]["curve"], budget):
            out[m] = r
    return out


def _chunk(run: Run, cap: float, max_rounds: int, chunk_seconds: float) -> int:
    left = max_rounds - run.round
    if run.round == 0:
        return max(1, min(left, 20))
    per = max(run.seconds_per_round(), 1e-7)
    n = int(chunk_seconds / per)
    if math.isfinite(cap) and run.expected_per_round > 0:
        n = min(n, int(math.ceil((cap - run.total_bits) / run.expected_per_round)) + 1)
    return max(1, min(left, n, 20000))


def search_cell(
    problem: Any,
    cell: dict[str, Any],
    exponents: dict[str, list[int]],
    opts: SearchOptions,
    path: str,
    *,
    gammas: Mapping[str, float | None] | None = None,
    base: dict[str, Any] | None = None,
    resume: bool = False,
    on_run: Callable[[dict[str, Any]], None] | None = None,
    problems: Mapping[str, Any] | None = None,
    compressors: Mapping[str, Any] | None = None,
    mpi: bool = False,
) -> list[dict[str, Any]]:
    """Run (or, with ``resume``, read back) every run of one cell, writing each finished run
    to ``path`` at once. ``exponents[method]`` lists the ``j`` of the multipliers ``2^j``
    (largest first); ``gammas[method]`` is the step the multipliers scale (None: the theory's
    step from the problem's constants). ``base`` is merged into every record. Returns the
    cell's run records (in run order). ``problems`` / ``compressors`` override, per method, the
    problem a method runs on and its compressor (the autoencoder's EF21 runs on a grouped view).
    With ``mpi`` every run is distributed over the MPI ranks (``permk.distributed``); all ranks
    must call this together; rank 0 alone writes, and its chunk sizes are used by all."""
    comm = mpi_comm() if mpi else None
    writer = comm is None or comm.Get_rank() == 0
    done: dict[str, dict[str, Any]] = {}
    if resume and os.path.exists(path):
        for r in read_records(path):
            if r.get("kind") == "run":
                done[r["key"]] = r
    records: list[dict[str, Any]] = []
    # the cell's fewest bits to the target so far, in run order: a resumed cell makes the same
    # decisions (budgets, pruning) as an uninterrupted one
    best_hit = math.inf
    for method in exponents:
        streak = 0
        best_score: tuple[float, float] | None = None
        for j in exponents[method]:
            key = f"{cell['id']}|{method}|j={j}|seed={opts.seed}"
            if key in done:
                rec = done[key]
            else:
                run = Run((problems or {}).get(method, problem), Spec.parse(method), 2.0**j, opts, gamma=(gammas or {}).get(method),
                          compressor=(compressors or {}).get(method), mpi=mpi)
                while not run.finished:
                    own = run.hit_bits if run.hit_bits is not None else math.inf
                    steps = _chunk(run, opts.budget_factor * min(best_hit, own), opts.max_rounds, opts.chunk_seconds)
                    run.advance(steps if comm is None else comm.bcast(steps, root=0))
                    run.settle(best_hit)
                summ = run.summary()
                summ["stopped_by"] = "diverged" if run.diverged else ("budget" if run.total_bits >= opts.budget_factor * min(best_hit, run.hit_bits or math.inf) else "max_rounds")
                rec = {
                    "kind": "run",
                    "key": key,
                    **(base or {}),
                    "cell": cell,
                    "method": method,
                    "label": run.spec.label,
                    "compressor": run.compressor.name,
                    "j": j,
                    "multiplier": 2.0**j,
                    "options": {k: getattr(opts, k) for k in ("seed", "tol", "budget_factor", "max_rounds", "div_factor", "pl", "constants", "float_bits")},
                    "params": run.params,
                    "summary": summ,
                    "curve": run.curve(),
                }
                if writer:
                    append_record(path, rec)
                rec = read_back(rec)
            records.append(rec)
            s = rec["summary"]
            if s.get("reached_target") and not s.get("diverged"):
                best_hit = min(best_hit, float(s["bits_to_target"]))
            if on_run is not None:
                on_run(rec)
            if method in opts.prune and not s.get("diverged"):
                sc = score(s, rec["curve"], opts.budget_factor * best_hit if math.isfinite(best_hit) else math.inf)
                if best_score is None or sc < best_score:
                    best_score, streak = sc, 0
                else:
                    streak += 1
                    if streak >= opts.patience:
                        break
    return records


def read_back(rec: dict[str, Any]) -> dict[str, Any]:
    """A record as it reads back from its file (arrays as lists, JSON types), so fresh and
    resumed cells are handled identically."""
    return from_json(json.loads(json.dumps(to_jsonable(rec))))  # type: ignore[no-any-return]


def _init_worker(threads: int, parent: int) -> None:
    from permk.parallel import limit_threads

    _end_with_parent(parent)
    limit_threads(threads)


def _end_with_parent(parent: int) -> None:
    """Make this pool process end when ``parent``, the process that started it, dies (Linux:
    ``PR_SET_PDEATHSIG``): a killed run leaves no process writing into its directory once its
    lock (:func:`.results.hold_directory`) is released."""
    if not sys.platform.startswith("linux"):  # pragma: no cover - Linux only
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM))
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


def run_pool(
    fn: Callable[..., Any],
    tasks: Iterable[tuple[Any, ...]],
    *,
    jobs: int,
    desc: str,
    total: int,
    progress: bool = True,
) -> list[Any]:
    """``fn(*task)`` for every task, in ``jobs`` processes (``spawn``; each process gets
    ``cores // jobs`` threads for the Rust kernels and BLAS: :mod:`permk.parallel`), with a tqdm
    bar over tasks."""
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    tasks = list(tasks)
    bar = tqdm(total=total, desc=desc, disable=not progress, unit="cell")
    out: list[Any] = []
    try:
        if jobs <= 1:
            for t in tasks:
                out.append(fn(*t))
                bar.update(1)
            return out
        import concurrent.futures as cf
        import multiprocessing as mp

        from permk.parallel import threads_per_process

        threads = threads_per_process(jobs)
        # set before the workers start, so that BLAS starts with that many threads too
        saved = {k: os.environ.get(k) for k in ("RAYON_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        for k in saved:
            os.environ[k] = str(threads)
        try:
            with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=_init_worker, initargs=(threads, os.getpid())) as ex:
                futs = [ex.submit(fn, *t) for t in tasks]
                for f in cf.as_completed(futs):
                    f.result()
                    bar.update(1)
                out = [f.result() for f in futs]
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return out
    finally:
        bar.close()


def mpi_comm() -> Any:
    """``MPI.COMM_WORLD`` (``permk[mpi]`` needed)."""
    try:
        from mpi4py import MPI
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise ImportError("--mpi needs mpi4py: pip install 'permk[mpi]'") from e
    return MPI.COMM_WORLD


def run_grid(
    name: str,
    cfg: dict[str, Any],
    cell_fn: Callable[..., Any],
    cells: Sequence[dict[str, Any]],
    out: str | os.PathLike[str],
    *,
    jobs: int,
    resume: bool,
    progress: bool,
    extra: tuple[Any, ...] = (),
    mpi: bool = False,
) -> Path:
    """Run ``cell_fn(cell, cfg, runs_file, resume, *extra)`` for every cell into ``out/<name>/``:
    ``config.json`` (the grid), ``runs/<cell>.jsonl`` (each finished run, appended at once) and
    ``timing.json`` (the figures are the caller's: :mod:`.plotting` reads this module). An
    existing grid is continued only with ``resume`` and only if its config is the same. Returns
    the experiment directory. The writer holds that directory while the grid runs
    (:func:`.results.hold_directory`): a second run into it at the same time is refused with
    :class:`.results.DirectoryInUseError`. With ``mpi`` (launched by ``mpiexec``) every rank
    runs every cell together (``jobs`` must be 1) and rank 0 writes (:func:`is_writer`)."""
    comm = mpi_comm() if mpi else None
    if comm is not None and jobs != 1:
        raise ValueError("--mpi runs the cells one after another on all ranks: use --jobs 1")
    writer = comm is None or comm.Get_rank() == 0
    root = Path(out) / name
    runs = root / "runs"
    cfg_path = root / "config.json"
    with contextlib.ExitStack() as held:
        # the writer holds the directory for the whole grid (results.hold_directory); a refusal,
        # or a directory it cannot create, is the same error on every MPI rank
        error: OSError | None = None
        if writer:
            try:
                held.enter_context(hold_directory(root))
            except OSError as e:
                error = e
        if comm is not None:
            error = comm.bcast(error, root=0)
        if error is not None:
            raise error
        if runs.exists() and any(runs.glob("*.jsonl")):
            if not resume:
                raise FileExistsError(f"{runs} already holds results: pass --resume to continue that grid, or choose another --out")
            if cfg_path.exists() and read_json(cfg_path) != json.loads(json.dumps(cfg)):
                raise ValueError(f"--resume: the grid in {cfg_path} differs from the one asked for; use the same options or another --out")
        if writer:
            runs.mkdir(parents=True, exist_ok=True)
            write_json(cfg_path, cfg)
        if comm is not None:
            comm.Barrier()
        tasks = [(c, cfg, str(runs / f"{c['id']}.jsonl"), resume, *extra) for c in cells]
        t0 = time.perf_counter()
        run_pool(cell_fn, tasks, jobs=jobs, desc=name, total=len(tasks), progress=progress and writer)
        if not writer:
            return root
        timing = {"seconds": time.perf_counter() - t0, "jobs": jobs, "resumed": resume, "mpi_ranks": comm.Get_size() if comm else None}
        write_json(root / "timing.json", timing)
    return root


def is_writer(mpi: bool) -> bool:
    """Whether this process writes results and figures (always, but for MPI ranks other than 0)."""
    return not mpi or mpi_comm().Get_rank() == 0
