"""The distributed linear autoencoder of the paper's MNIST experiment (Section "Training an
autoencoder with MNIST", Appendix "Experiment with MNIST: full description"):
:class:`LinearAutoencoder`, its grouped form for EF21 (:class:`GroupedAutoencoder`) and estimates
of its smoothness constants (:func:`estimate_constants`).

``f(D, E) = (1/n) Σ_i f_i``, ``f_i(D, E) = (1/|D̂_i|) Σ_{a ∈ D̂_i} ‖DEa − a‖² + (λ/2)‖DE − I‖_F²``
with ``D ∈ R^{d_f×d_e}``, ``E ∈ R^{d_e×d_f}`` (``d_f = 784``, ``d_e = 16``: ``d = 25088``). The
data are split at random into ``n + 1`` parts ``D_0 … D_n``; worker ``i`` takes ``D_0`` with
probability ``p̂`` and ``D_i`` otherwise (``p̂ = 1``: identical workers). Xavier-normal
initialisation. The parameter vector is ``x = (vec D, vec E)`` (row-major).

**The authors' protocol** (their code, mysteryresearcher/sampling-in-optimal-sgd,
``code/distributed_optimization_library``), as options: ``split="per-sample"`` (dataset.py
``split_with_controling_homogeneity``: ``n + 1`` parts of the shuffled data, the first held out,
and each sample of worker ``i``'s part replaced by the held-out sample at the same position with
probability p̂; their runner calls it only for p̂ > 0) and ``loss="authors"`` (function.py
``AutoEncoderNeuralNetworkFunction``: PyTorch's ``MSELoss``, i.e. the data term divided by
``d_f``, plus ``λ‖DE − I‖²`` with λ not halved). The paper's text is the default.

**Oracles at the cost of two products.** Let ``A`` be the held splits' images (``N`` of them,
stored as the columns of ``Aᵀ``, each split padded to the largest), ``Z = A Eᵀ`` and ``P = A D``.
Per point ``x`` the only work proportional to ``N`` is the one product ``[E; DᵀM] Aᵀ``
(``M = DE − I``), i.e. ``Zᵀ`` and ``Wᵀ = (DᵀD) Zᵀ − Pᵀ = DᵀM Aᵀ`` (``W_s = R_s D`` with the
residual ``R_s = Z_s Dᵀ − A_s``, never formed), then the Gram matrices ``Z_sᵀZ_s`` (``O(N d_e²)``). The
last three points' products are kept (MARINA asks ``x^{t+1}``, then ``x^t``). With
``c = 1`` (``c = 1/d_f`` for the authors' loss) and ``M = DE − I``:

* one coordinate (MARINA's fused path, ``local_grad_coords``), ``O(m_s)`` each:
  ``∂f_s/∂D[j,k] = (2c/m_s)((D Z_sᵀZ_s)[j,k] − A_s[:,j]·Z_s[:,k]) + r (M Eᵀ)[j,k]`` and
  ``∂f_s/∂E[k,j] = (2c/m_s) W_s[:,k]·A_s[:,j] + r (Dᵀ M)[k,j]``, all requested coordinates at
  once as dot products of rows of ``Aᵀ``, ``Zᵀ``, ``Wᵀ`` and the Gram matrices, read in place
  (``permk._core.row_dots``: float64 sums, on the core's threads); no array of size ``n·d`` is
  formed;
* full split gradients (``split_grads``: EF21, the workers' gradients), two more products per
  split: ``∇_D f_s = (2c/m_s)(D Z_sᵀZ_s − A_sᵀZ_s) + r M Eᵀ`` and
  ``∇_E f_s = (2c/m_s) W_sᵀA_s + r Dᵀ M``, batched over blocks of splits (with several
  threads, each block's products and its pass on one Python thread: ``_run_blocks``);
* ``grad``, ``loss`` and the held workers' gradient sum (``local_grad_sum``: the MPI backend's full
  rounds) in closed form through the second moment (below).

Workers that hold the same split share its products (each distinct split is computed once).
``dtype=np.float32`` holds the images and computes the products in float32 (as the authors'
PyTorch code did); the gradients' error is then about 1e-7 of their largest entry (tested
bound 2e-6). ``f`` depends on the data only through the second moment
``Σ = c Σ_s w_s A_sᵀA_s/m_s``, which gives ``grad``, ``loss`` and the optimum in closed form:
``f* = Σ_{k > d_e} (σ_k(Σ) + r/2)`` (PCA, Eckart–Young), ``r = λ`` (``2λ`` for the authors'
loss).

**Smoothness constants.** They are not known in closed form: :func:`estimate_constants`
estimates ``L_−`` (of ``f``) and ``sqrt(mean L_i²)`` (over a sample of splits) at the start
point and at the PCA solution by power iteration on finite-difference Hessian-vector products.
These are estimates, not bounds.

**The grouped problem** (:meth:`LinearAutoencoder.grouped`): one virtual worker per distinct
split, with ``f'_s = S·(c_s/n)·f_s`` so that ``(1/S) Σ_s f'_s = f``. TopK is positively
homogeneous, so EF21+TopK's iterates on it are exactly those on the ``n`` workers, at the memory
of ``S`` (each worker still sends ``K = ⌈d/n⌉`` values).
"""

from __future__ import annotations

import functools
import math
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .._core import autoencoder_shifted_messages, autoencoder_split_grads, get_num_threads, row_dots
from .._validate import as_vector, check_choice, check_int, check_real, check_seed, index_array
from ..compressors import Compressor, Messages

__all__ = ["LinearAutoencoder", "GroupedAutoencoder", "estimate_constants", "SPLITS", "LOSSES"]


#: ``split=``: how a worker's data is drawn (the paper's text, or the authors' code).
SPLITS = ("per-worker", "per-sample")
#: ``loss=``: the paper's ``f_i`` or the authors' (data term / d_f, λ not halved).
LOSSES = ("paper", "authors")
# the split gradients are computed in blocks of splits whose rows take about twice this many bytes (float64
# products: 1.5 times as many) on a pool of several threads, a quarter of that on one (see _block_splits)
_BLOCK_BYTES = 1 << 21


def _only_in_pool() -> int:
    """What ``sys.getrefcount`` says of a buffer that only the pool holds, measured as
    :meth:`LinearAutoencoder._out_buffer` measures it (the count differs between CPython versions)."""
    pool = [np.empty(1)]
    for buf in pool:
        return sys.getrefcount(buf)
    raise AssertionError  # pragma: no cover


_ONLY_IN_POOL = _only_in_pool()


class _BlockThreads:
    """The Python threads :meth:`LinearAutoencoder._run_blocks` runs blocks on: started on first
    use and kept (idle, they wait without using a core; a process forked from this one starts
    its own), each with its product buffer in ``local``; while they run, BLAS is limited to one
    thread (through threadpoolctl; it is process-wide, so one pass runs at a time)."""

    def __init__(self) -> None:
        self.local = threading.local()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._key: tuple[int, int] = (0, 0)  # (process, threads) of the pool
        self._blas: Any = None

    def map(self, threads: int, f: Callable[[int, int], Any], bounds: Sequence[tuple[int, int]]) -> list[Any]:
        """``[f(lo, hi) for lo, hi in bounds]``, on ``threads`` threads; the first exception in
        block order is raised once every started block has finished, the others cancelled."""
        with self._lock:
            if self._pool is None or self._key != (os.getpid(), threads):
                if self._pool is not None and self._key[0] == os.getpid():
                    self._pool.shutdown(wait=False)
                self._pool = ThreadPoolExecutor(threads, thread_name_prefix="permk-blocks")
                self._key = (os.getpid(), threads)
            if self._blas is None:
                from threadpoolctl import ThreadpoolController

                self._blas = ThreadpoolController()
            with self._blas.limit(limits=1, user_api="blas"):
                futures = [self._pool.submit(f, lo, hi) for lo, hi in bounds]
                try:
                    return [fut.result() for fut in futures]
                finally:
                    for fut in futures:
                        fut.cancel()
                    wait(futures)


_BLOCK_THREADS = _BlockThreads()
#: A block's products and coefficients, the arguments of ``permk._core``'s autoencoder kernels
#: (``zwa``, ``gram``, ``dec``, ``reg_d``, ``reg_e``, ``cs``, ``rs``).
_Products = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass
class _Point:
    """What the oracles use at one point ``x``: ``D``, ``E``; ``ZW`` (``2 d_e × columns``, in the
    problem's dtype), whose rows ``0 … d_e − 1`` are ``Zᵀ = E Aᵀ`` and the others
    ``Wᵀ = (DᵀD) Zᵀ − Pᵀ = DᵀM Aᵀ`` (``P = A D``, ``M = DE − I``; ``W_s = R_s D`` without forming
    the residual ``R_s``), both from one product,
    over the held images; the regulariser's gradient; the Gram matrices ``Z_sᵀZ_s`` (made when
    first needed)."""

    key: bytes
    D: np.ndarray
    E: np.ndarray
    Dc: np.ndarray
    ZW: np.ndarray
    regD: np.ndarray
    regE: np.ndarray
    gram: np.ndarray | None = None


@dataclass
class _CoordPlan:
    """A coordinate request's point-independent part: its D- and E-coordinates (positions
    ``iD``/``iE``), and the rows of the arrays their dot products read (``aD``/``aE``: the
    images ``A_s[:, j]``, rows of ``Aᵀ`` viewed as ``(d_f·splits, m)``)."""

    key: bytes
    size: int
    iD: np.ndarray
    iE: np.ndarray
    jD: np.ndarray
    regD: np.ndarray
    regE: np.ndarray
    zD: np.ndarray
    gD: np.ndarray
    wE: np.ndarray
    scaleD: np.ndarray
    scaleE: np.ndarray
    aD: np.ndarray
    aE: np.ndarray


class LinearAutoencoder:
    """The distributed linear autoencoder (a :class:`permk.Problem`; with ``workers=``, a
    :class:`permk.distributed.LocalProblem` holding only those workers' images).

    Parameters
    ----------
    X
        The (N, d_f) images (rows), e.g. :func:`permk.problems.datasets.load_images`.
    n
        The number of workers.
    p_hat
        The homogeneity p̂ (see ``split``).
    lam
        The regularization λ.
    d_e
        The encoding size.
    seed
        The seed of the split, the assignment and the starting point.
    dtype
        ``np.float64`` (default) or ``np.float32`` (as the authors ran it): the images and
        the per-point products are held and computed in this type; ``grad``, ``loss`` and
        ``f_star`` (through the second moment) and the returned gradients are float64.
    split
        ``"per-worker"`` (the paper: worker ``i`` takes the shared part ``D_0`` with
        probability p̂, else its own ``D_i``) or ``"per-sample"`` (the authors' code,
        ``dataset.py`` ``split_with_controling_homogeneity``: each sample of ``D_i`` is replaced
        by the sample at the same position of ``D_0`` with probability p̂).
    loss
        ``"paper"`` (``f_i`` as in the paper) or ``"authors"`` (the authors' ``function.py``:
        ``MSELoss``, i.e. the data term divided by ``d_f``, plus ``λ‖DE − I‖²``, λ not halved).
    workers
        None (every worker: a global problem), or a contiguous ``range`` of workers: the
        problem then keeps only the images of the splits those workers hold (the assignment is
        computed from ``seed`` for all workers, identically on every rank), and has the
        :class:`~permk.distributed.LocalProblem` oracles for them; ``grad``, ``loss`` and
        ``f_star`` stay global (the second moment is computed from all of ``X`` once).

    Attributes
    ----------
    local
        Whether the problem holds only the workers given by ``workers=`` (a local problem,
        whose ``workers`` attribute :func:`permk.distributed.run` reads; a global problem has none).
    held_workers
        The workers whose images the problem holds (``range(n)`` when not local).
    """

    def __init__(self, X: Any, n: int, p_hat: float, lam: float, *, d_e: int = 16, seed: int = 0, dtype: Any = np.float64,
                 split: str = "per-worker", loss: str = "paper", workers: Sequence[int] | None = None) -> None:
        X = np.asarray(X)
        if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] < 1 or X.dtype.kind not in "biuf":
            raise ValueError(f"X must be a non-empty real (N, d_f) array, got shape {X.shape} and dtype {X.dtype}")
        n, d_e, seed = check_int(n, "n", low=1), check_int(d_e, "d_e", low=1), check_int(seed, "seed")
        p_hat = check_real(p_hat, "p_hat", low=0.0, high=1.0)
        lam = check_real(lam, "lam", low=0.0)
        # the step sizes square the smoothness constants, which grow with λ and ‖a‖²
        from .finite_sum import CONSTANT_LIMIT, row_sq_norms

        if lam > CONSTANT_LIMIT:
            raise ValueError(f"lam = {lam:.3g} is too large for the smoothness constants (beyond 2**400: the step sizes square "
                             "the constants); choose a smaller lam")
        top = float(row_sq_norms(X).max())
        if not np.isfinite(top) and not np.isfinite(X).all():
            raise ValueError("X must be finite")
        if not top <= CONSTANT_LIMIT:
            raise ValueError(f"X's images are too large for the smoothness constants: the largest squared norm of an image is "
                             f"{top:.3g}, beyond 2**400 (the step sizes square the constants); rescale the pixels")
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
            raise ValueError(f"dtype must be np.float64 or np.float32, got {dtype!r}")
        self.split, self.loss_kind = check_choice(split, "split", SPLITS), check_choice(loss, "loss", LOSSES)
        N, d_f = X.shape
        if N < n + 1:
            raise ValueError(f"{N} images cannot be split into n + 1 = {n + 1} non-empty parts: use fewer workers or more images")
        self.n, self.d_f, self.d_e = n, int(d_f), d_e
        self.d = 2 * self.d_f * self.d_e
        self.p_hat, self.lam, self.seed = p_hat, lam, seed
        # f_s = c (1/m_s) Σ_a ‖DEa − a‖² + (r/2)‖DE − I‖²
        self._c = 1.0 if loss == "paper" else 1.0 / self.d_f
        self._r = lam if loss == "paper" else 2.0 * lam
        rng = np.random.default_rng(seed)
        parts = np.array_split(rng.permutation(N), n + 1)
        if split == "per-worker":
            take_shared = rng.random(n) < p_hat
            split_of_worker = np.where(take_shared, 0, np.arange(1, n + 1))
            used, self.worker_split = np.unique(split_of_worker, return_inverse=True)
            self.splits = used  # ids (0 … n) of the parts in use
            self.split_index = [parts[s] for s in used]
        else:
            hold = parts[0]
            seen: dict[bytes, int] = {}
            index: list[np.ndarray] = []
            first: list[int] = []
            ws = np.empty(n, dtype=np.int64)
            for i in range(n):
                own = parts[i + 1].copy()
                take = np.flatnonzero(rng.random(len(own)) <= p_hat)
                own[take] = hold[take]
                k = seen.setdefault(own.tobytes(), len(index))
                if k == len(index):
                    index.append(own)
                    first.append(i + 1)
                ws[i] = k
            self.worker_split, self.splits, self.split_index = ws, np.array(first), index
        S = len(self.split_index)
        self.counts = np.bincount(self.worker_split, minlength=S).astype(np.float64)
        self.weights = self.counts / n  # f = Σ_s weights[s] f_s
        self.sizes = np.array([len(ix) for ix in self.split_index], dtype=np.float64)
        std = math.sqrt(2.0 / (d_f + d_e))  # Xavier (Glorot) normal for both factors
        self.x0 = np.concatenate([rng.normal(0.0, std, d_f * d_e), rng.normal(0.0, std, d_e * d_f)])
        # f's second moment (of the data term): c Σ_s w_s A_sᵀA_s / m_s, over the images as held
        per_image = np.zeros(N)
        for s, ix in enumerate(self.split_index):
            np.add.at(per_image, ix, self.weights[s] / self.sizes[s])
        rows = np.flatnonzero(per_image)
        Y = X[rows].astype(self.dtype).astype(np.float64) * np.sqrt(self._c * per_image[rows])[:, None]
        self.sigma = Y.T @ Y
        del Y
        # the held splits' images, one column per image, each split padded to m columns
        self.local = workers is not None
        if workers is None:
            self.held_workers = range(n)
            held = np.arange(S)
        else:
            ws_ = [check_int(i, "worker", high=n) for i in workers]
            if not ws_ or ws_ != list(range(ws_[0], ws_[0] + len(ws_))):
                raise ValueError(f"workers must be a non-empty contiguous range of worker indices in range({n}), got {ws_}")
            self.workers = self.held_workers = range(ws_[0], ws_[0] + len(ws_))
            held = np.unique(self.worker_split[self.held_workers.start : self.held_workers.stop])
        self._held = held
        self._slot = np.full(S, -1, dtype=np.int64)
        self._slot[held] = np.arange(len(held))
        self._m = m = int(self.sizes.max())
        AT = np.zeros((self.d_f, len(held) * m), dtype=self.dtype)
        cols = np.concatenate([k * m + np.arange(len(self.split_index[s])) for k, s in enumerate(held)])
        AT[:, cols] = X[np.concatenate([self.split_index[s] for s in held])].T
        self._AT = AT
        self._scale = 2.0 * self._c / self.sizes[held]  # per held split
        self._points: list[_Point] = []
        self._plan: _CoordPlan | None = None
        self._pool: list[np.ndarray] = []
        self._fcache: tuple[bytes, np.ndarray, float] | None = None
        self._full: tuple[bytes, np.ndarray] | None = None

    # -- shapes -------------------------------------------------------------------------------
    @property
    def n_splits(self) -> int:
        """The number of distinct splits (workers holding the same images share one)."""
        return len(self.split_index)

    def factors(self, x: Any) -> tuple[np.ndarray, np.ndarray]:
        x = as_vector(x, self.d)
        k = self.d_f * self.d_e
        return x[:k].reshape(self.d_f, self.d_e), x[k:].reshape(self.d_e, self.d_f)

    def split_images(self, s: int) -> np.ndarray:
        """The images of distinct split ``s`` (held by this problem), ``(m_s, d_f)`` float64."""
        k = int(self._slot[check_int(s, "s", high=self.n_splits)])
        if k < 0:
            raise ValueError(f"split {s} is not held by this problem (it holds the splits of workers {self.held_workers})")
        return self._AT[:, k * self._m : k * self._m + int(self.sizes[s])].T.astype(np.float64)

    # -- the closed forms through a second moment ---------------------------------------------
    def _cov_grad_loss(self, x: Any, S: np.ndarray) -> tuple[np.ndarray, float]:
        """Gradient and value of ``tr(M S Mᵀ) + (r/2)‖M‖²``, ``M = DE − I`` (f for ``S = sigma``;
        ``r = λ``, or ``2λ`` with the authors' loss); one ``(d_f, d_f) × (d_f, 2 d_e)`` product,
        the rest is ``O(d_f d_e²)``."""
        D, E = self.factors(x)
        SB = S @ np.hstack([E.T, D])  # S Eᵀ and S D (S is symmetric)
        SEt, SD = SB[:, : self.d_e], SB[:, self.d_e :]
        ESEt = E @ SEt  # (d_e, d_e)
        DtD, EEt = D.T @ D, E @ E.T
        r = self._r
        gD = 2.0 * (D @ ESEt - SEt) + r * (D @ EEt - E.T)  # 2 M S Eᵀ + r M Eᵀ
        gE = 2.0 * (DtD @ SEt.T - SD.T) + r * (DtD @ E - D.T)  # 2 Dᵀ M S + r Dᵀ M
        tr_MSMt = float(np.sum(DtD * ESEt) - 2.0 * np.sum(SEt * D) + np.trace(S))
        tr_MMt = float(np.sum(DtD * EEt) - 2.0 * np.sum(E.T * D) + self.d_f)
        return np.concatenate([gD.ravel(), gE.ravel()]), tr_MSMt + 0.5 * r * tr_MMt

    def _f(self, x: Any) -> tuple[np.ndarray, float]:
        key = as_vector(x, self.d).tobytes()
        if self._fcache is None or self._fcache[0] != key:
            self._fcache = (key, *self._cov_grad_loss(x, self.sigma))
        return self._fcache[1], self._fcache[2]

    def loss(self, x: Any) -> float:
        """``f(x)``, the mean of the workers' ``f_i`` (float64, in closed form from the images'
        second moment)."""
        return self._f(x)[1]

    def grad(self, x: Any) -> np.ndarray:
        """``∇f(x)``, ``(d,)`` float64, in closed form from the images' second moment (no pass
        over the images)."""
        return self._f(x)[0].copy()

    @functools.cached_property
    def f_star(self) -> float:
        """``min f = Σ_{k > d_e} σ_k(sigma) + (r/2)(d_f − d_e)`` (the PCA solution)."""
        ev = np.sort(np.linalg.eigvalsh(self.sigma))[::-1]
        return float(np.sum(ev[self.d_e :]) + 0.5 * self._r * (self.d_f - self.d_e))

    def pca_point(self) -> np.ndarray:
        """A minimiser: ``D = U``, ``E = Uᵀ`` with ``U`` the top ``d_e`` eigenvectors of ``Σ``."""
        w, V = np.linalg.eigh(self.sigma)
        U = V[:, np.argsort(w)[::-1][: self.d_e]]
        return np.concatenate([U.ravel(), U.T.ravel()])

    # -- the data route: the two products per point, then per split --------------------------
    def _point(self, x: Any) -> _Point:
        """The products at ``x``, kept for the last three points computed (MARINA asks ``x^{t+1}``,
        then ``x^t``; its first round asks ``x¹`` before ``x⁰``, so two would evict ``x¹`` then)."""
        x = np.array(as_vector(x, self.d))
        key = x.tobytes()
        for p in self._points:
            if p.key == key:
                return p
        with np.errstate(over="ignore", invalid="ignore"):
            return self._new_point(x, key)

    def _new_point(self, x: np.ndarray, key: bytes) -> _Point:
        D, E = self.factors(x)
        old = self._points[2] if len(self._points) == 3 else None  # its buffer is reused (no page faults)
        # the only O(N) work, one product: Zᵀ = E Aᵀ and Wᵀ = (DᵀD) Zᵀ − Pᵀ = (DᵀD E − Dᵀ) Aᵀ
        DtM = D.T @ D @ E - D.T  # Dᵀ M, also the regulariser's ∇_E / r
        ZW = np.matmul(np.concatenate([E, DtM]).astype(self.dtype), self._AT, out=None if old is None else old.ZW)
        r = self._r
        p = _Point(key=key, D=D, E=E, Dc=D.astype(self.dtype), ZW=ZW, regD=r * (D @ (E @ E.T) - E.T), regE=r * DtM)
        self._points = [p] + self._points[:2]
        return p

    def _views(self, a: np.ndarray) -> np.ndarray:
        """A ``(rows, held columns)`` array as ``(rows, held splits, m)``."""
        return a.reshape(a.shape[0], len(self._held), self._m)

    def _gram(self, p: _Point) -> np.ndarray:
        """``(splits, d_e, d_e)``: ``Z_sᵀZ_s`` of every held split (symmetric)."""
        if p.gram is None:
            Z3 = self._views(p.ZW[: self.d_e]).transpose(1, 0, 2)  # (splits, d_e, m)
            p.gram = np.matmul(Z3, Z3.transpose(0, 2, 1))
        return p.gram

    def _coord_plan(self, rows: Any, cols: Any) -> _CoordPlan:
        """The index arithmetic of a ``(rows, cols)`` request, which does not depend on the point
        (MARINA asks the same coordinates at ``x^{t+1}`` and ``x^t``: it is done once)."""
        k_of = self._held_slots(rows)
        c = index_array(cols, "cols")
        key = k_of.tobytes() + b"|" + c.tobytes()
        if self._plan is not None and self._plan.key == key:
            return self._plan
        if c.shape != k_of.shape:
            raise ValueError(f"rows and cols must have the same length, got {k_of.size} and {c.size}")
        if c.size and (int(c.min()) < 0 or int(c.max()) >= self.d):
            raise ValueError(f"cols must be coordinates in range({self.d})")
        S, k1, d_e = len(self._held), self.d_f * self.d_e, self.d_e
        iD, iE = np.flatnonzero(c < k1), np.flatnonzero(c >= k1)
        jD, kD = np.divmod(c[iD], d_e)
        kE, jE = np.divmod(c[iE] - k1, self.d_f)
        sD, sE = k_of[iD], k_of[iE]
        self._plan = _CoordPlan(key=key, size=c.size, iD=iD, iE=iE, jD=jD, regD=jD * d_e + kD, regE=kE * self.d_f + jE,
                                zD=kD * S + sD, gD=sD * d_e + kD, wE=kE * S + sE, scaleD=self._scale[sD], scaleE=self._scale[sE],
                                aD=jD * S + sD, aE=jE * S + sE)
        return self._plan

    def _held_slots(self, rows: Any) -> np.ndarray:
        r = index_array(rows, "rows")
        if r.size and (int(r.min()) < 0 or int(r.max()) >= self.n):
            raise ValueError(f"rows must be worker indices in range({self.n})")
        ws = self.held_workers
        if self.local and r.size and (int(r.min()) < ws.start or int(r.max()) >= ws.stop):
            raise ValueError(f"rows must be workers held by this problem ({ws})")
        return self._slot[self.worker_split[r]]

    def local_grad_coords(self, x: Any, rows: Any, cols: Any) -> np.ndarray:
        """``∇f_{rows[k]}(x)[cols[k]]`` (MARINA's fused path): each from the point's two products
        and the split's images, ``O(m_s)`` per coordinate (see the module docstring)."""
        with np.errstate(over="ignore", invalid="ignore"):  # a diverging run: the driver sees the non-finite values
            return self._coords(self._coord_plan(rows, cols), x)

    def _coords(self, q: _CoordPlan, x: Any) -> np.ndarray:
        p = self._point(x)
        out = np.empty(q.size)
        S, m, d_e = len(self._held), self._m, self.d_e
        ATf = self._AT.reshape(self.d_f * S, m)  # row j·S + s: A_s[:, j]
        # each dot product reads its two rows in place (permk._core.row_dots: float64 sums, on the core's threads)
        if q.iD.size:  # ∂/∂D[j,k] = (2c/m_s)((D Z_sᵀZ_s)[j,k] − A_s[:,j]·Z_s[:,k]) + r (M Eᵀ)[j,k]
            G = self._gram(p).reshape(S * d_e, d_e)  # row s·d_e + k: (Z_sᵀZ_s)[:, k] (symmetric)
            t = row_dots(p.Dc, q.jD, G, q.gD) - row_dots(ATf, q.aD, p.ZW[:d_e].reshape(d_e * S, m), q.zD)
            out[q.iD] = q.scaleD * t + p.regD.ravel()[q.regD]
        if q.iE.size:  # ∂/∂E[k,j] = (2c/m_s) (Z_s DᵀD − P_s)[:,k]·A_s[:,j] + r (Dᵀ M)[k,j]
            out[q.iE] = q.scaleE * row_dots(p.ZW[d_e:].reshape(d_e * S, m), q.wE, ATf, q.aE) + p.regE.ravel()[q.regE]
        return out

    def _out_buffer(self) -> np.ndarray:
        """A ``(held splits, d)`` float64 array for split gradients: one of the last three handed
        out when nothing else holds it any more, else a new one (a fresh 200 MB array costs
        more in page faults than the products that fill it; a backend keeps the last two)."""
        for buf in self._pool:
            if sys.getrefcount(buf) <= _ONLY_IN_POOL:
                buf.flags.writeable = True  # it may have been handed out read-only (split_grads)
                return buf
        buf = np.empty((len(self._held), self.d))
        self._pool = [buf] + self._pool[:2]
        return buf

    def _split_grads(self, p: _Point, mult: np.ndarray | None = None, *, pooled: bool = False) -> np.ndarray:
        """``(held splits, d)`` float64: ``mult_s ∇f_s`` at the point, written block by block
        (:meth:`_run_blocks`)."""
        out = self._out_buffer() if pooled else np.empty((len(self._held), self.d))
        self._run_blocks(p, mult, lambda lo, hi, args, on_caller: autoencoder_split_grads(*args, out[lo:hi], on_caller=on_caller))
        return out

    def _block_splits(self) -> int:
        """The splits of a block of :meth:`_bounds` (gradient rows of about twice
        :data:`_BLOCK_BYTES` bytes, at most every held split). With one thread the
        Rust pass runs on the caller, right after BLAS wrote the block's products on the same
        core: blocks a quarter that size let it read them largely from that core's L2 cache (at
        full scale EF21's rounds took about 1.4× their BLAS floor instead of 1.55× on one thread;
        with two, when the pool's threads shared a block, the larger size was as fast or faster).
        :meth:`_run_blocks` gives each of several threads whole blocks of the larger size
        (blocks of 5 or 40 splits were not measurably faster there). The values do not depend
        on the size (tested)."""
        size = _BLOCK_BYTES if get_num_threads() > 1 else _BLOCK_BYTES // 4
        return min(len(self._held), max(1, size // (8 * self.d_f * self.d_e)))

    def _block_products(self, p: _Point, mult: np.ndarray | None) -> Callable[[int, int, np.ndarray], _Products]:
        """``products(lo, hi, zwa)``: the products and coefficients of held splits ``lo … hi − 1``,
        the arguments of ``permk._core``'s ``autoencoder_split_grads`` and
        ``autoencoder_shifted_messages`` (gradients ``mult_s ∇f_s``): one batched product
        ``[Z_s W_s]ᵀ A_s`` (the two products beyond the point's, in the layout BLAS writes
        fastest) in the problem's dtype, into the buffer ``zwa`` (at least ``hi − lo`` blocks of
        ``(2 d_e, d_f)``), and the splits' Gram matrices ``Z_sᵀZ_s``; the kernels form
        ``D·Z_sᵀZ_s`` themselves and apply the coefficients ``2c/m_s·mult_s`` and ``mult_s``, in
        float64 (see rust/src/autoencoder.rs)."""
        S = len(self._held)
        cs = self._scale if mult is None else self._scale * mult
        rs = np.ones(S) if mult is None else np.ascontiguousarray(mult, dtype=np.float64)
        AT3, ZW3 = self._views(self._AT), self._views(p.ZW)
        gram = self._gram(p)
        dec = np.ascontiguousarray(p.D, dtype=np.float64)
        regD, regE = np.ascontiguousarray(p.regD, dtype=np.float64), np.ascontiguousarray(p.regE, dtype=np.float64)

        def products(lo: int, hi: int, zwa: np.ndarray) -> _Products:
            ZWA = zwa[: hi - lo]
            with np.errstate(over="ignore", invalid="ignore"):  # a diverging run: the caller sees the non-finite values
                np.matmul(ZW3[:, lo:hi].transpose(1, 0, 2), AT3[:, lo:hi].transpose(1, 2, 0), out=ZWA)
            return ZWA, gram[lo:hi], dec, regD, regE, cs[lo:hi], rs[lo:hi]

        return products

    def _bounds(self) -> list[tuple[int, int]]:
        """The blocks ``(lo, hi)`` of :meth:`_block_splits` splits over the held splits."""
        S, b = len(self._held), self._block_splits()
        return [(lo, min(S, lo + b)) for lo in range(0, S, b)]

    def _zwa(self) -> np.ndarray:
        return np.empty((self._block_splits(), 2 * self.d_e, self.d_f), dtype=self.dtype)

    def _run_blocks(self, p: _Point, mult: np.ndarray | None, work: Callable[[int, int, _Products, bool], Any]) -> list[Any]:
        """``[work(lo, hi, args, on_caller)]`` over the blocks of held splits in order, ``args``
        the block's products (:meth:`_block_products`). With a pool of several threads
        (``permk._core.get_num_threads()``) and several blocks, as many Python threads each run
        whole blocks: the block's product with single-threaded BLAS, then ``work`` on the same
        thread (``on_caller=True``: the Rust pass on that core, reading the product from its
        cache). Each core then multiplies and finishes its own blocks, where a threaded BLAS
        call per block's small products and the pool's pass would take turns on all cores (at
        full scale EF21's rounds took about two thirds as long on 2 threads; README "Benchmarks").
        Otherwise one block at a time on the caller (BLAS and the pass on their own threads).
        The values are the same either way (each value's sums have one order)."""
        products, bounds = self._block_products(p, mult), self._bounds()
        threads = get_num_threads()
        if threads < 2 or len(bounds) < 2:
            zwa = self._zwa()
            return [work(lo, hi, products(lo, hi, zwa), False) for lo, hi in bounds]
        local, shape = _BLOCK_THREADS.local, (self._block_splits(), 2 * self.d_e, self.d_f)

        def block(lo: int, hi: int) -> Any:
            zwa = getattr(local, "zwa", None)  # the thread's buffer, kept for its next blocks
            if zwa is None or zwa.shape != shape or zwa.dtype != self.dtype:
                zwa = local.zwa = self._zwa()
            return work(lo, hi, products(lo, hi, zwa), True)

        return _BLOCK_THREADS.map(threads, block, bounds)

    def _split_grad_blocks(self, p: _Point, mult: np.ndarray | None = None) -> Iterator[tuple[int, int, np.ndarray]]:
        """``(lo, hi, G)`` for consecutive blocks of held splits: ``G`` holds ``mult_s ∇f_s``
        (float64) of splits ``lo … hi − 1``, written by one pass on the core's threads
        (``permk._core.autoencoder_split_grads``) into a block buffer the next block
        overwrites; one block at a time on the caller. The values are those of
        :meth:`_split_grads`."""
        products, buf, zwa = self._block_products(p, mult), np.empty((self._block_splits(), self.d)), self._zwa()
        for lo, hi in self._bounds():
            G = buf[: hi - lo]
            autoencoder_split_grads(*products(lo, hi, zwa), G)
            yield lo, hi, G

    def _message_blocks(self, p: _Point, mult: np.ndarray | None, compressor: Any, H: np.ndarray | None, beta: float, *,
                        start: int, n_workers: int, seed: int, round: int) -> Iterator[tuple[int, int, Messages | None]]:
        """The messages of :meth:`local_message_blocks` for the held splits as workers (the
        inputs ``mult_s ∇f_s − β h_s``), block by block: with a Rust compressor each row is
        finished, shifted and compressed in a worker's buffer
        (``permk.autoencoder_shifted_messages``), the gradients never written; otherwise
        the block's rows are written and handed to :meth:`Compressor.compress_shifted_rows`."""
        if not isinstance(compressor, Compressor):
            raise TypeError(f"compressor must be a permk.Compressor, got {type(compressor).__name__}")
        n_workers, seed, round = check_int(n_workers, "n_workers", low=1), check_seed(seed), check_int(round, "round")
        start, beta = check_int(start, "start", high=n_workers), check_real(beta, "beta")
        spec = compressor.kernel
        if spec is None:
            for lo, hi, G in self._split_grad_blocks(p, mult):
                yield lo, hi, compressor.compress_shifted_rows(G, None if H is None else H[lo:hi], beta=beta, start=start + lo,
                                                                n_workers=n_workers, seed=seed, round=round)
            return

        def messages(lo: int, hi: int, args: _Products, on_caller: bool) -> tuple[int, int, Messages | None]:
            out = autoencoder_shifted_messages(spec, *args, None if H is None else H[lo:hi], beta, start + lo, n_workers, seed, round,
                                                     on_caller=on_caller)
            return lo, hi, None if out is None else Messages(*out)

        yield from self._run_blocks(p, mult, messages)

    def split_grads(self, x: Any) -> np.ndarray:
        """``(S, d)``: the gradient of each held distinct split's ``f_s`` at ``x`` (all ``S``
        splits for a global problem; read-only, kept for the last point)."""
        p = self._point(x)
        if self._full is None or self._full[0] != p.key:
            with np.errstate(over="ignore", invalid="ignore"):
                G = self._split_grads(p, pooled=True)
            G.flags.writeable = False
            self._full = (p.key, G)
        return self._full[1]

    def _worker_rows(self) -> np.ndarray:
        ws = self.held_workers
        return self._slot[self.worker_split[ws.start : ws.stop]]

    @functools.cached_property
    def _own_splits(self) -> bool:
        """Whether every held worker holds its own split, in worker order (e.g. p̂ = 0): the
        workers' gradients are then the split gradients themselves."""
        rows = self._worker_rows()
        return rows.size == len(self._held) and bool(np.array_equal(rows, np.arange(rows.size)))

    def local_grads(self, x: Any) -> np.ndarray:
        """``(n, d)`` (a local problem: ``(len(workers), d)``), memory ``n·d``; the methods use
        the cheaper routes above when they can. When every held worker has its own split (e.g.
        p̂ = 0) the rows are the split gradients themselves, in a reused buffer."""
        if self._own_splits:
            with np.errstate(over="ignore", invalid="ignore"):
                return self._split_grads(self._point(x), pooled=True)
        return self.split_grads(x)[self._worker_rows()]

    def local_grad_blocks(self, x: Any) -> Iterator[tuple[int, int, np.ndarray]]:
        """The held workers' gradients at ``x`` as ``(lo, hi, G)``: ``G`` the rows of workers
        ``lo … hi − 1`` (counted from the first held worker), valid until the next block is
        asked, equal bit for bit to those rows of :meth:`local_grads` (the error-feedback
        exchange's route: no ``(n, d)`` array). When every held worker has its own split, blocks
        of a few splits (a few MB); otherwise one block, :meth:`local_grads`."""
        if self._own_splits:
            yield from self._split_grad_blocks(self._point(x))
        else:
            yield 0, len(self.held_workers), self.local_grads(x)

    def local_message_blocks(self, x: Any, compressor: Any, H: np.ndarray | None = None, beta: float = 1.0, *, start: int,
                             n_workers: int, seed: int, round: int) -> Iterator[tuple[int, int, Messages | None]]:
        """The held workers' messages on the inputs ``∇f_i(x) − β h_i`` (``h_i`` the rows of
        ``H``, from the first held worker; ``∇f_i(x)`` without ``H``) in blocks of consecutive
        workers ``(lo, hi, messages)``, ``messages`` None when an input of the block is not
        finite: bit for bit ``compressor.compress_shifted_rows`` on the blocks of
        :meth:`local_grad_blocks` (the error-feedback exchange's route, for a compressor without
        a shared plan; ``start`` is the first held worker's index). When every held worker has
        its own split, each worker's gradient is finished, shifted and compressed in one pass
        on the core's threads and never written (a Rust compressor); otherwise (workers sharing
        a split) the held splits' gradients are computed once (:meth:`split_grads`) and each
        worker's input is formed from its split's row, read in place (``rows=``: no
        ``(workers, d)`` array of gradients)."""
        if self._own_splits:
            yield from self._message_blocks(self._point(x), None, compressor, H, beta, start=start, n_workers=n_workers, seed=seed, round=round)
        else:
            yield 0, len(self.held_workers), compressor.compress_shifted_rows(self.split_grads(x), H, beta=beta, start=start, n_workers=n_workers,
                                                                              seed=seed, round=round, rows=self._worker_rows())

    def local_grad(self, i: int, x: Any) -> np.ndarray:
        k = self._held_slots(np.array([check_int(i, "i", high=self.n)]))[0]
        return self.split_grads(x)[k].copy()

    def local_grad_sum(self, x: Any) -> np.ndarray:
        """``Σ_i ∇f_i(x)`` over the held workers, ``(d,)`` float64 (the MPI backend's full
        rounds: a rank sends the sum of its workers' gradients). In closed form, as :meth:`grad`:
        the held workers' ``f_i`` sum to ``tr(M S Mᵀ) + (k r/2)‖M‖²`` with ``k`` held workers
        and ``S = c Σ_i A_{s(i)}ᵀA_{s(i)}/m_{s(i)}`` (their splits' second moment, computed from
        the held images on the first call), so a full round costs one ``(d_f × d_f)·(d_f × 2d_e)``
        product, not the workers' gradients."""
        with np.errstate(over="ignore", invalid="ignore"):
            k = len(self.held_workers)
            return k * self._cov_grad_loss(x, self._held_moment)[0]

    @functools.cached_property
    def _held_moment(self) -> np.ndarray:
        """``S/k`` of :meth:`local_grad_sum` (``sigma`` itself for a global problem): from the
        held images as they are held (in the problem's dtype), in float64, a few splits at a time."""
        if not self.local:
            return self.sigma
        ws = self.held_workers
        counts = np.bincount(self.worker_split[ws.start : ws.stop], minlength=self.n_splits)[self._held]
        w = np.sqrt(self._c * counts / (len(ws) * self.sizes[self._held]))  # per held split
        AT3 = self._views(self._AT)
        S = np.zeros((self.d_f, self.d_f))
        step = max(1, (1 << 22) // (8 * self.d_f * self._m))  # about 4 MB of float64 images at a time
        for lo in range(0, len(self._held), step):
            Y = (AT3[:, lo : lo + step] * w[lo : lo + step, None]).reshape(self.d_f, -1)  # padding columns are zero
            S += Y @ Y.T
        return S

    def grouped(self) -> "GroupedAutoencoder":
        """The problem with one virtual worker per distinct split (for EF21, see the module docstring)."""
        if self.local:
            raise ValueError("a local problem (workers=...) cannot be grouped: group the global problem, or run EF21 on the workers")
        return GroupedAutoencoder(self)

    def __repr__(self) -> str:
        where = f", workers={self.held_workers}" if self.local else ""
        return (f"LinearAutoencoder(n={self.n}, d={self.d}, p_hat={self.p_hat}, lam={self.lam}, splits={self.n_splits}, "
                f"split={self.split!r}, loss={self.loss_kind!r}, dtype={self.dtype.name}{where})")


class GroupedAutoencoder:
    """``S`` virtual workers ``f'_s = S·(c_s/n)·f_s`` (``c_s`` workers hold split ``s``), whose
    mean is ``f``; EF21+TopK on it has exactly the iterates of EF21+TopK on the ``n`` workers."""

    def __init__(self, ae: LinearAutoencoder) -> None:
        self.ae = ae
        self.n = ae.n_splits
        self.d = ae.d
        self.x0 = ae.x0
        #: The autoencoder's dtype (the methods keep their estimators in it: ``shift_dtype``).
        self.dtype = ae.dtype
        self._mult = ae.n_splits * ae.weights

    @property
    def f_star(self) -> float:
        return self.ae.f_star

    def loss(self, x: Any) -> float:
        return self.ae.loss(x)

    def grad(self, x: Any) -> np.ndarray:
        return self.ae.grad(x)

    def local_grads(self, x: Any) -> np.ndarray:
        """The ``S`` virtual workers' gradients ``∇f'_s(x)``, ``(S, d)`` float64, in a reused
        buffer (see :meth:`LinearAutoencoder.local_grads`)."""
        with np.errstate(over="ignore", invalid="ignore"):
            return self.ae._split_grads(self.ae._point(x), self._mult, pooled=True)

    def local_grad_blocks(self, x: Any) -> Iterator[tuple[int, int, np.ndarray]]:
        """:meth:`local_grads` in blocks of a few virtual workers (see
        :meth:`LinearAutoencoder.local_grad_blocks`), the same bits."""
        return self.ae._split_grad_blocks(self.ae._point(x), self._mult)

    def local_message_blocks(self, x: Any, compressor: Any, H: np.ndarray | None = None, beta: float = 1.0, *, start: int,
                             n_workers: int, seed: int, round: int) -> Iterator[tuple[int, int, Messages | None]]:
        """The virtual workers' messages on ``∇f'_s(x) − β h_s`` in blocks (see
        :meth:`LinearAutoencoder.local_message_blocks`), the same bits as compressing
        :meth:`local_grad_blocks`."""
        return self.ae._message_blocks(self.ae._point(x), self._mult, compressor, H, beta, start=start, n_workers=n_workers,
                                       seed=seed, round=round)


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


def estimate_constants(ae: LinearAutoencoder, *, seed: int = 0, sample_splits: int = 4, iters: int = 30,
                       images: Any = None) -> dict[str, Any]:
    """Estimates of ``L_−`` (of ``f``) and ``sqrt(mean L_i²)`` (over a sample of splits): the
    largest Hessian eigenvalue (in magnitude) at ``x⁰`` and at the PCA solution, by power
    iteration on central finite differences of gradients (the gradients are cubic polynomials,
    so the step 1e-4 is accurate to about 1e-8 relative). Estimates, not bounds. ``images``: the
    ``X`` the problem was built from (needed for a local problem, which holds only its own
    splits; every rank then gets the same estimates)."""
    rng = np.random.default_rng(seed)
    points = {"x0": ae.x0, "pca": ae.pca_point()}
    eps = 1e-4

    def hvp_for(S: np.ndarray, x: np.ndarray) -> Any:
        return lambda v: (ae._cov_grad_loss(x + eps * v, S)[0] - ae._cov_grad_loss(x - eps * v, S)[0]) / (2 * eps)

    L_f = max(_power(hvp_for(ae.sigma, x), ae.d, rng, iters) for x in points.values())
    picks = rng.choice(ae.n_splits, size=min(sample_splits, ae.n_splits), replace=False, p=ae.weights)
    L_i = []
    for s in picks:
        if images is None:
            A = ae.split_images(s)
        else:  # a local problem holds only its own splits: the sampled ones come from the images
            A = np.asarray(images)[ae.split_index[s]].astype(ae.dtype).astype(np.float64)
        Ss = ae._c * (A.T @ A) / ae.sizes[s]
        L_i.append(max(_power(hvp_for(Ss, x), ae.d, rng, iters) for x in points.values()))
    rms = math.sqrt(float(np.mean(np.square(L_i)))) if L_i else L_f
    return {"L_minus": L_f, "L_plus": max(rms, L_f), "L_pm": max(rms, L_f), "L_i_sample": L_i,
            "how": "power iteration on finite-difference Hessian-vector products at x0 and at the PCA solution (estimates)"}
