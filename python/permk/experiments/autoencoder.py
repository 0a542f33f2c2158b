"""The linear autoencoder experiment (Section "Training an autoencoder with MNIST", Appendix
"Experiment with MNIST: full description").

``f(D, E) = (1/n) Σ_i f_i``, ``f_i(D, E) = (1/|D̂_i|) Σ_{a ∈ D̂_i} ‖DEa − a‖² + (λ/2)‖DE − I‖_F²``
with ``D ∈ R^{d_f×d_e}``, ``E ∈ R^{d_e×d_f}`` (``d_f = 784``, ``d_e = 16``: ``d = 25088``). The
data are split at random into ``n + 1`` parts ``D_0 … D_n``; worker ``i`` takes ``D_0`` with
probability ``p̂`` and ``D_i`` otherwise (``p̂ = 1``: identical workers). Xavier-normal
initialisation. The parameter vector is ``x = (vec D, vec E)`` (row-major).

Workers that hold the same split have the same gradient, so :class:`LinearAutoencoder`
evaluates each *distinct* split once per point (batched matrix products over the stacked,
zero-padded splits) and serves ``local_grads``, ``local_grad_coords`` (MARINA's fused path:
only the sent coordinates are gathered) and ``grad`` from that. ``f`` depends on the data only
through the second moment ``Σ = Σ_s w_s A_sᵀA_s/m_s``, which gives ``grad``, ``loss`` and the
optimum in closed form: ``f* = Σ_{k > d_e} (σ_k(Σ) + λ/2)`` (PCA, Eckart–Young).

**Step sizes.** The smoothness constants are not known in closed form. Unless ``--gamma`` is
given, the base step of each method is the theory's (Theorem "AB" for MARINA, the EF21 theorem)
with the pessimistic choice ``L_+ = L_± = sqrt(mean L_i²)`` estimated at the start point and at
the PCA solution by power iteration on finite-difference Hessian-vector products: ``L_−`` from
``f``, ``L_i`` from a sample of splits (:func:`estimate_constants`). These are estimates, not
bounds, and are recorded with every run. The grid multiplies the base step by ``2^j`` as for the
quadratic; the figures' legends give the steps themselves, like the paper's.

**EF21** runs on the grouped problem (one virtual worker per distinct split, with
``f'_s = S·(c_s/n)·f_s`` so that ``(1/S) Σ_s f'_s = f``): TopK is positively homogeneous, so its
iterates are exactly those of ``n`` workers, at the memory of ``S`` (each worker still sends
``K = ⌈d/n⌉`` values).
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from .runner import METHODS, SearchOptions, Spec, protocol_options, run_grid, search_cell, step_exponents, theory_gamma

__all__ = ["LinearAutoencoder", "AutoencoderGrid", "PAPER_GRID", "QUICK_GRID", "estimate_constants", "run_autoencoder"]


class LinearAutoencoder:
    """The distributed linear autoencoder (a :class:`permk.Problem`).

    Parameters
    ----------
    X : (N, d_f) images (rows), e.g. :func:`permk.experiments.data.load_images`.
    n : number of workers; p_hat : probability that a worker takes the shared split D_0.
    lam : regularization λ; d_e : encoding size; seed : split, assignment and init.
    """

    def __init__(self, X: Any, n: int, p_hat: float, lam: float, *, d_e: int = 16, seed: int = 0, block: int = 1 << 23) -> None:
        X = np.ascontiguousarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[0] < 1:
            raise ValueError(f"X must be a non-empty (N, d_f) array, got shape {X.shape}")
        if not 0.0 <= p_hat <= 1.0:
            raise ValueError(f"p_hat must be in [0, 1], got {p_hat}")
        if lam < 0 or not math.isfinite(lam):
            raise ValueError(f"lam must be >= 0, got {lam}")
        N, d_f = X.shape
        if N < n + 1:
            raise ValueError(f"{N} images cannot be split into n + 1 = {n + 1} non-empty parts: use fewer workers or more images")
        self.n, self.d_f, self.d_e = int(n), int(d_f), int(d_e)
        self.d = 2 * self.d_f * self.d_e
        self.p_hat, self.lam, self.seed = float(p_hat), float(lam), int(seed)
        rng = np.random.default_rng(self.seed)
        parts = np.array_split(rng.permutation(N), self.n + 1)
        take_shared = rng.random(self.n) < self.p_hat
        split_of_worker = np.where(take_shared, 0, np.arange(1, self.n + 1))
        used, self.worker_split = np.unique(split_of_worker, return_inverse=True)
        self.splits = used  # ids (0 … n) of the distinct splits in use
        self.counts = np.bincount(self.worker_split, minlength=len(used)).astype(np.float64)
        self.weights = self.counts / self.n  # f = Σ_s weights[s] f_s
        sizes = np.array([len(parts[s]) for s in used])
        self.sizes = sizes.astype(np.float64)
        m = int(sizes.max())
        A = np.zeros((len(used), m, d_f))
        for k, s in enumerate(used):
            A[k, : sizes[k]] = X[parts[s]]
        self._A = A
        self._block = max(1, int(block) // max(1, m * d_f))
        # f's second moment Σ = Σ_s w_s A_sᵀ A_s / m_s
        self.sigma = np.einsum("s,smi,smj->ij", self.weights / self.sizes, A, A, optimize=True)
        std = math.sqrt(2.0 / (d_f + d_e))  # Xavier (Glorot) normal for both factors
        self.x0 = np.concatenate([rng.normal(0.0, std, d_f * d_e), rng.normal(0.0, std, d_e * d_f)])
        self._cache: list[tuple[bytes, np.ndarray]] = []
        self._fcache: tuple[bytes, np.ndarray, float] | None = None

    # -- shapes -------------------------------------------------------------------------------
    @property
    def n_splits(self) -> int:
        return len(self.splits)

    def factors(self, x: Any) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.d,):
            raise ValueError(f"x must have shape ({self.d},), got {x.shape}")
        k = self.d_f * self.d_e
        return x[:k].reshape(self.d_f, self.d_e), x[k:].reshape(self.d_e, self.d_f)

    # -- the closed forms through a second moment ---------------------------------------------
    def _cov_grad_loss(self, x: Any, S: np.ndarray) -> tuple[np.ndarray, float]:
        """Gradient and value of ``tr(M S Mᵀ) + (λ/2)‖M‖²``, ``M = DE − I`` (f for ``S = Σ``);
        one ``(d_f, d_f) × (d_f, 2 d_e)`` product, the rest is ``O(d_f d_e²)``."""
        D, E = self.factors(x)
        SB = S @ np.hstack([E.T, D])  # S Eᵀ and S D (S is symmetric)
        SEt, SD = SB[:, : self.d_e], SB[:, self.d_e :]
        ESEt = E @ SEt  # (d_e, d_e)
        DtD, EEt = D.T @ D, E @ E.T
        gD = 2.0 * (D @ ESEt - SEt) + self.lam * (D @ EEt - E.T)  # 2 M S Eᵀ + λ M Eᵀ
        gE = 2.0 * (DtD @ SEt.T - SD.T) + self.lam * (DtD @ E - D.T)  # 2 Dᵀ M S + λ Dᵀ M
        tr_MSMt = float(np.sum(DtD * ESEt) - 2.0 * np.sum(SEt * D) + np.trace(S))
        tr_MMt = float(np.sum(DtD * EEt) - 2.0 * np.sum(E.T * D) + self.d_f)
        return np.concatenate([gD.ravel(), gE.ravel()]), tr_MSMt + 0.5 * self.lam * tr_MMt

    def _f(self, x: Any) -> tuple[np.ndarray, float]:
        key = np.asarray(x, dtype=np.float64).tobytes()
        if self._fcache is None or self._fcache[0] != key:
            self._fcache = (key, *self._cov_grad_loss(x, self.sigma))
        return self._fcache[1], self._fcache[2]

    def loss(self, x: Any) -> float:
        return self._f(x)[1]

    def grad(self, x: Any) -> np.ndarray:
        return self._f(x)[0].copy()

    @functools.cached_property
    def f_star(self) -> float:
        """``min f = Σ_{k > d_e} (σ_k(Σ) + λ/2)`` (the PCA solution)."""
        ev = np.sort(np.linalg.eigvalsh(self.sigma))[::-1]
        return float(np.sum(ev[self.d_e :]) + 0.5 * self.lam * (self.d_f - self.d_e))

    def pca_point(self) -> np.ndarray:
        """A minimiser: ``D = U``, ``E = Uᵀ`` with ``U`` the top ``d_e`` eigenvectors of ``Σ``."""
        w, V = np.linalg.eigh(self.sigma)
        U = V[:, np.argsort(w)[::-1][: self.d_e]]
        return np.concatenate([U.ravel(), U.T.ravel()])

    # -- the data route: every distinct split at once -------------------------------------------
    def split_grads(self, x: Any) -> np.ndarray:
        """``(S, d)``: the gradient of each distinct split's ``f_s`` at ``x`` (batched BLAS)."""
        key = np.ascontiguousarray(x, dtype=np.float64).tobytes()
        for k, G in self._cache:
            if k == key:
                return G
        D, E = self.factors(x)
        S, m, d_f = self._A.shape
        out = np.empty((S, self.d))
        k1 = d_f * self.d_e
        M = D @ E - np.eye(d_f)
        regD = (self.lam * (M @ E.T)).ravel()
        regE = (self.lam * (D.T @ M)).ravel()
        for lo in range(0, S, self._block):
            A = self._A[lo : lo + self._block]
            b = A.shape[0]
            Z = (A.reshape(-1, d_f) @ E.T).reshape(b, m, self.d_e)
            R = (Z.reshape(-1, self.d_e) @ D.T).reshape(b, m, d_f)
            R -= A
            scale = (2.0 / self.sizes[lo : lo + b])[:, None, None]
            # contiguous (b, d_e, m) @ (b, m, d_f) stacks: one BLAS call per split
            gDt = np.matmul(np.ascontiguousarray(Z.transpose(0, 2, 1)), R) * scale  # (b, d_e, d_f) = gDᵀ
            RD = (R.reshape(-1, d_f) @ D).reshape(b, m, self.d_e)
            gE = np.matmul(np.ascontiguousarray(RD.transpose(0, 2, 1)), A) * scale  # (b, d_e, d_f)
            out[lo : lo + b, :k1] = gDt.transpose(0, 2, 1).reshape(b, -1) + regD
            out[lo : lo + b, k1:] = gE.reshape(b, -1) + regE
        self._cache = [(key, out)] + self._cache[:2]  # MARINA's round asks for x^{t+1}, then x^t
        return out

    def local_grads(self, x: Any) -> np.ndarray:
        """``(n, d)`` (memory ``n·d``; the methods use the cheaper routes below when they can)."""
        return self.split_grads(x)[self.worker_split]

    def local_grad(self, i: int, x: Any) -> np.ndarray:
        return self.split_grads(x)[self.worker_split[int(i)]].copy()

    def local_grad_coords(self, x: Any, rows: Any, cols: Any) -> np.ndarray:
        """``∇f_{rows[k]}(x)[cols[k]]``: gathered from the split gradients (MARINA's fused path)."""
        G = self.split_grads(x)
        return G[self.worker_split[np.asarray(rows, dtype=np.int64)], np.asarray(cols, dtype=np.int64)]

    def grouped(self) -> "GroupedAutoencoder":
        """The problem with one virtual worker per distinct split (for EF21, see the module docstring)."""
        return GroupedAutoencoder(self)

    def __repr__(self) -> str:
        return f"LinearAutoencoder(n={self.n}, d={self.d}, p_hat={self.p_hat}, lam={self.lam}, splits={self.n_splits})"


class GroupedAutoencoder:
    """``S`` virtual workers ``f'_s = S·(c_s/n)·f_s`` (``c_s`` workers hold split ``s``), whose
    mean is ``f``; EF21+TopK on it has exactly the iterates of EF21+TopK on the ``n`` workers."""

    def __init__(self, ae: LinearAutoencoder) -> None:
        self.ae = ae
        self.n = ae.n_splits
        self.d = ae.d
        self.x0 = ae.x0
        self._scale = (ae.n_splits * ae.weights)[:, None]

    @property
    def f_star(self) -> float:
        return self.ae.f_star

    def loss(self, x: Any) -> float:
        return self.ae.loss(x)

    def grad(self, x: Any) -> np.ndarray:
        return self.ae.grad(x)

    def local_grads(self, x: Any) -> np.ndarray:
        return self.ae.split_grads(x) * self._scale


def _power(hvp: Any, d: int, rng: np.random.Generator, iters: int = 30) -> float:
    v = rng.standard_normal(d)
    v /= np.linalg.norm(v)
    lam = 0.0
    for _ in range(iters):
        w = hvp(v)
        nw = float(np.linalg.norm(w))
        if nw == 0:
            return 0.0
        lam = nw
        v = w / nw
    return lam


def estimate_constants(ae: LinearAutoencoder, *, seed: int = 0, sample_splits: int = 4, iters: int = 30) -> dict[str, Any]:
    """Estimates of ``L_−`` (of ``f``) and ``sqrt(mean L_i²)`` (over a sample of splits): the
    largest Hessian eigenvalue (in magnitude) at ``x⁰`` and at the PCA solution, by power
    iteration on central finite differences of gradients (the gradients are cubic polynomials,
    so the step 1e-4 is accurate to about 1e-8 relative). Estimates, not bounds."""
    rng = np.random.default_rng(seed)
    points = {"x0": ae.x0, "pca": ae.pca_point()}
    eps = 1e-4

    def hvp_for(S: np.ndarray, x: np.ndarray) -> Any:
        return lambda v: (ae._cov_grad_loss(x + eps * v, S)[0] - ae._cov_grad_loss(x - eps * v, S)[0]) / (2 * eps)

    L_f = max(_power(hvp_for(ae.sigma, x), ae.d, rng, iters) for x in points.values())
    picks = rng.choice(ae.n_splits, size=min(sample_splits, ae.n_splits), replace=False, p=ae.weights)
    L_i = []
    for s in picks:
        A = ae._A[s, : int(ae.sizes[s])]
        Ss = A.T @ A / ae.sizes[s]
        L_i.append(max(_power(hvp_for(Ss, x), ae.d, rng, iters) for x in points.values()))
    rms = math.sqrt(float(np.mean(np.square(L_i)))) if L_i else L_f
    return {"L_minus": L_f, "L_plus": max(rms, L_f), "L_pm": max(rms, L_f), "L_i_sample": L_i,
            "how": "power iteration on finite-difference Hessian-vector products at x0 and at the PCA solution (estimates)"}


def theory_gammas(ae: LinearAutoencoder, consts: dict[str, Any], methods: tuple[str, ...], opts: SearchOptions) -> dict[str, float]:
    """The theory's step of each method from the estimated constants (already the pessimistic
    choice), as :func:`permk.marina` / :func:`permk.ef21` would choose it (no PL step)."""
    est = SimpleNamespace(n=ae.n, d=ae.d, L_minus=consts["L_minus"], L_plus=consts["L_plus"], L_pm=consts["L_pm"])
    return {m: theory_gamma(est, Spec.parse(m), replace(opts, pl=False), constants="exact") for m in methods}


@dataclass(frozen=True)
class AutoencoderGrid:
    """A grid of the autoencoder experiment (the paper's by default)."""

    workers: int = 1000
    p_hats: tuple[float, ...] = (0.0, 0.5, 0.75, 0.9, 1.0)
    lams: tuple[float, ...] = (0.0, 1e-5, 1e-3)
    d_e: int = 16
    images: int | None = None
    data: str | None = None
    gamma: float | None = None
    methods: tuple[str, ...] = METHODS
    max_multipliers: int | None = None
    problem_seed: int = 0
    options: SearchOptions = field(default_factory=lambda: SearchOptions(max_rounds=3000, tol=1e-3))
    split: str = "per-worker"  # "per-sample": the authors' heterogeneity (LinearAutoencoder's split)
    loss: str = "paper"  # "authors": the authors' scaling of the data term and λ (LinearAutoencoder's loss)

    name = "autoencoder"

    def cells(self) -> list[dict[str, Any]]:
        out = []
        for r, lam in enumerate(self.lams):
            for c, ph in enumerate(self.p_hats):
                out.append({"id": f"lam{lam:g}_p{ph:g}", "lam": float(lam), "p_hat": float(ph), "n": self.workers, "row": r, "col": c})
        return out

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["name"] = self.name
        return d


PAPER_GRID = AutoencoderGrid()
#: The multipliers ``2^i`` of the authors' autoencoder runs, ``[low, high)``: ``--step_size_range
#: -5 4`` for every compressor in their scripts.txt; used with ``steps="authors"``.
AUTHORS_STEPS = {"marina": (-5, 4)}
#: ``--quick``: 20 workers on the first 1,000 images, heterogeneous and homogeneous splits,
#: λ = 1e-3, the two largest multipliers, 300 rounds: under a minute on 2 cores (``--jobs 2``).
QUICK_GRID = AutoencoderGrid(workers=20, p_hats=(0.0, 1.0), lams=(1e-3,), images=1000, max_multipliers=2,
                             options=SearchOptions(max_rounds=300, tol=1e-3))


@functools.lru_cache(maxsize=2)
def _images(data: str | None, limit: int | None) -> tuple[np.ndarray, str]:
    from .data import load_images

    im = load_images(data, limit=limit)
    return im.X, im.source


def autoencoder_cell(cell: dict[str, Any], grid_json: dict[str, Any], path: str, resume: bool, progress: bool = False) -> dict[str, Any]:
    """Run one cell of the autoencoder grid (a process-pool task)."""
    t0 = time.perf_counter()
    opts = SearchOptions(**grid_json["options"])
    X, source = _images(grid_json["data"], grid_json["images"])
    # the protocol's problem options, passed when they are not the paper's (LinearAutoencoder's split=, loss=)
    variant = {k: grid_json[k] for k, paper in (("split", "per-worker"), ("loss", "paper")) if grid_json.get(k, paper) != paper}
    ae = LinearAutoencoder(X, grid_json["workers"], cell["p_hat"], cell["lam"], d_e=grid_json["d_e"], seed=grid_json["problem_seed"],
                           **variant)
    methods = tuple(grid_json["methods"])
    if grid_json["gamma"] is not None:
        consts: dict[str, Any] = {"how": "user --gamma"}
        gth = {m: float(grid_json["gamma"]) for m in methods}
        L_minus = None
    else:
        consts = estimate_constants(ae, seed=grid_json["problem_seed"])
        gth = theory_gammas(ae, consts, methods, opts)
        L_minus = consts["L_minus"]
    consts = {**consts, "f_star": ae.f_star, "n_splits": ae.n_splits, "data": source, "n_images": int(X.shape[0])}
    exps = {}
    for m in methods:
        if L_minus is not None or opts.steps == "authors":
            exps[m] = step_exponents(m, gth[m], L_minus, opts, AUTHORS_STEPS, max_count=grid_json["max_multipliers"])
        else:
            exps[m] = list(range(0, -(grid_json["max_multipliers"] or 6), -1))
    base = {"experiment": "autoencoder", "constants": consts, "gamma_theory_by_method": gth, "problem_seed": grid_json["problem_seed"]}
    specs = {m: Spec.parse(m) for m in methods}
    compressors = {m: s.compressor(ae.n, ae.d) for m, s in specs.items()}
    # error feedback with a deterministic compressor (TopK) runs on the grouped problem (one
    # virtual worker per distinct split: the same iterates, see the module docstring)
    problems = {m: (ae.grouped() if s.identical_workers_collapse(compressors[m]) else ae) for m, s in specs.items()}
    recs = search_cell(ae, cell, exps, opts, path, gammas=gth, base=base, resume=resume, problems=problems, compressors=compressors)
    return {"cell": cell["id"], "runs": len(recs), "seconds": time.perf_counter() - t0}


def run_autoencoder(grid: AutoencoderGrid, out: str | os.PathLike[str], *, jobs: int = 1, resume: bool = False,
                    progress: bool = True, plot: bool = True) -> Path:
    """Run a grid into ``out/autoencoder/`` and draw its figures; returns that directory."""
    from .data import load_images

    load_images(grid.data, limit=grid.images)  # fail early, with the message on how to provide data
    root = run_grid(grid.name, grid.to_json(), autoencoder_cell, grid.cells(), out, jobs=jobs, resume=resume, progress=progress)
    if plot:
        from .plotting import plot_experiment

        plot_experiment(root)
    return root


def grid_from_args(args: Any) -> AutoencoderGrid:
    """The grid a ``permk autoencoder`` command line asks for."""
    g = QUICK_GRID if args.quick else PAPER_GRID
    o = replace(g.options, **protocol_options(args, "autoencoder"))
    o = replace(o, seed=args.seed if args.seed is not None else o.seed,
                max_rounds=args.rounds if args.rounds is not None else o.max_rounds,
                tol=args.tol if args.tol is not None else o.tol,
                budget_factor=args.budget_factor if args.budget_factor is not None else o.budget_factor,
                prune=() if args.no_prune else o.prune)
    g = replace(g, options=o, problem_seed=args.seed if args.seed is not None else g.problem_seed,
                data=os.path.abspath(args.data) if args.data else (os.environ.get("PERMK_DATA") or None))
    if args.workers is not None:
        g = replace(g, workers=args.workers)
    if args.p_hat:
        g = replace(g, p_hats=tuple(args.p_hat))
    if args.lam:
        g = replace(g, lams=tuple(args.lam))
    if args.encoding is not None:
        g = replace(g, d_e=args.encoding)
    if args.images is not None:
        g = replace(g, images=args.images)
    if args.gamma is not None:
        g = replace(g, gamma=args.gamma)
    if args.max_multipliers is not None:
        g = replace(g, max_multipliers=args.max_multipliers or None)
    if args.methods:
        g = replace(g, methods=tuple(dict.fromkeys(args.methods)))
    authors = getattr(args, "protocol", None) == "authors"
    split = args.split or ("per-sample" if authors else None)
    loss = args.loss or ("authors" if authors else None)
    if split is not None or loss is not None:
        g = replace(g, split=split or g.split, loss=loss or g.loss)
    return g
