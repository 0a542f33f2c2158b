"""The finite-sum machinery shared by the classification problems: the minibatch sampling, the
data held as worker blocks, the oracles and constants of every ``f_ij(W) = h(Wᵀa_j, y_j) + r(W)``
(:class:`LinearFiniteSum`), and the part of a problem one MPI process holds (:class:`HeldShards`).

**Minibatches.** A finite-sum problem (:class:`permk.problems.FiniteSumProblem`: worker ``i``
holds ``m_i`` samples, ``f_i = (1/m_i) Σ_j f_ij``) draws worker ``i``'s minibatch ``B_i`` in
round ``t`` as ``b`` indices **uniformly with replacement** from ``0 … m_i − 1`` by
``numpy.random.default_rng([seed, t, i, MINIBATCH_TAG])`` (:func:`minibatch_indices`): a pure
function of ``(seed, t, i)``, so every backend, process and call order draws the same samples,
and no worker's samples depend on which other workers are asked. With replacement because that
is the sampling of the analyses of VR-MARINA (Gorbunov et al. 2021) and DASHA (Tyurin and
Richtárik 2022) — ``b`` i.i.d. uniform indices, so ``E ∇f_{iB}(x) = ∇f_i(x)`` and the variance
is ``1/b`` of one sample's, for any ``b`` (also ``b > m_i``) — and the authors' code
(``SamplingType.UNIFORM_WITH_REPLACEMENT``).

**The problems' form** (the authors' ``function.py`` of mysteryresearcher/sampling-in-optimal-sgd,
with their features: each sample ``a_j`` is the data row with a constant 1 appended, the bias,
``bias=False`` drops it; ``D`` is the length of ``a_j``). The parameter ``x`` holds the weights
``W ∈ R^{D×C}`` row-major (their ``np.reshape(point, [-1, C])``), ``z_j = Wᵀa_j``; a problem
(:mod:`permk.problems.classification`) defines its head ``h``, its regulariser ``r`` and their
curvature bounds.

**Smoothness constants in closed form.** Each ``f_ij(W) = h(Wᵀa_j, y_j) + r(W)``, so
``∇²f_ij = (a_j a_jᵀ) ⊗ ∇²_z h + ∇²r``. With ``−c I ⪯ ∇²_z h ⪯ c I`` for every ``z`` and
``|r''| ≤ ρ`` coordinatewise, and since ``a aᵀ ⊗ (cI ∓ ∇²_z h) ⪰ 0``:

* ``L_ij = c‖a_j‖² + ρ`` (``L_max = max L_ij``);
* ``L_i = c λ_max(A_iᵀA_i)/m_i + ρ`` (``A_i``: worker ``i``'s samples as rows), at most
  ``c · mean_j ‖a_j‖² + ρ``;
* ``L_−`` (of ``f``) ``= c λ_max(Σ_i A_iᵀA_i/(n m_i)) + ρ``;
* ``L_+`` and ``L_±`` are bounded by ``sqrt((1/n) Σ L_i²)`` (``L_±² ≤ L_+² ≤ (1/n)Σ L_i²``);
* VR-MARINA's mean-squared constant ``(1/m_i) Σ_j ‖∇f_ij(x) − ∇f_ij(y)‖² ≤ ℒ_i²‖x − y‖²``
  holds with ``ℒ_i² = mean_j L_ij²`` (``L_sample_rms``).

**Vectorised over workers.** Dense data are held as one ``(n, m_max, D)`` array (each shard
padded with zero rows, which carry zero weight): every oracle is a batched matrix product
(``numpy.matmul``, BLAS) over the workers. Sparse data (any scipy.sparse input) are one CSR
matrix of the stacked shards; the per-worker sums are one sparse product with an ``(n·C, M)``
assignment matrix. ``dtype=np.float32`` keeps the data and the products in float32 (as the
authors' PyTorch code did); the oracles return float64. The coordinate oracle
``local_grad_coords`` gives the entries of ``local_grads`` bit for bit (the fused and dense
paths of a method give the same iterates): on dense data it computes the workers' gradients as
``local_grads`` does (BLAS's batched products, whose sums no per-coordinate loop reproduces),
on sparse data one forward product and ``O(nnz)`` per coordinate's column, summed in the
sparse product's order; both keep the last three points (MARINA asks ``x^{t+1}`` then
``x^t``: one new point a round).
"""

from __future__ import annotations

import copy
import hashlib
import math
from functools import cached_property
from typing import Any, Sequence

import numpy as np

from .._validate import as_vector, check_int, check_seed, index_array, start_point
from .datasets import shard_indices

__all__ = ["LinearFiniteSum", "HeldShards", "HELD_CONSTANTS", "CONSTANT_LIMIT", "minibatch_indices", "MINIBATCH_TAG", "row_sq_norms"]

#: The fourth word of every minibatch seed ``[seed, round, worker, MINIBATCH_TAG]`` ("mb"): keeps
#: the minibatch streams apart from any other stream seeded with ``(seed, round, worker)``.
MINIBATCH_TAG = 0x6D62


def minibatch_indices(sample_counts: Any, batch_size: int, *, seed: int, round: int, workers: Sequence[int]) -> np.ndarray:
    """The minibatches of ``workers`` in round ``round``: row ``k`` holds ``batch_size`` indices
    into worker ``workers[k]``'s samples, uniform with replacement, drawn by
    ``numpy.random.default_rng([seed, round, workers[k], MINIBATCH_TAG])``.

    >>> minibatch_indices([5, 3], 4, seed=0, round=1, workers=[1]).shape
    (1, 4)
    """
    counts = np.asarray(sample_counts)
    b = check_int(batch_size, "batch_size", low=1)
    seed, rnd = check_seed(seed), check_int(round, "round")
    out = np.empty((len(workers), b), dtype=np.int64)
    for k, w in enumerate(workers):
        out[k] = np.random.default_rng([seed, rnd, int(w), MINIBATCH_TAG]).integers(int(counts[w]), size=b)
    return out


#: The largest squared sample norm and smoothness constant a problem accepts (about 2.6e120):
#: the step sizes square the constants and multiply the squares by ``n``, ``d`` or ``ω``, which
#: must stay far from float64's largest number.
CONSTANT_LIMIT = 2.0**400


def row_sq_norms(X: Any) -> np.ndarray:
    """``‖x_j‖²`` of every row of ``X`` (dense or scipy.sparse), summed in float64, ``inf`` where
    it overflows; a dense ``X`` is converted a block of rows at a time."""
    import scipy.sparse as sp

    with np.errstate(over="ignore", invalid="ignore"):
        if sp.issparse(X):
            B = sp.csr_array(X, dtype=np.float64)
            return np.asarray(B.multiply(B).sum(axis=1), dtype=np.float64).ravel()
        X = np.asarray(X)
        out = np.empty(X.shape[0])
        for s in range(0, X.shape[0], 4096):
            B = X[s : s + 4096].astype(np.float64)
            out[s : s + 4096] = np.einsum("kj,kj->k", B, B)
        return out


class _DenseBlock:
    """Samples of ``k`` workers as a zero-padded ``(k, m, D)`` array, their labels ``(k, m)`` and
    weights ``(k, m)`` (``1/m_i`` on a worker's samples, 0 on padding)."""

    kind = "dense"

    def __init__(self, A: np.ndarray, Y: np.ndarray, wt: np.ndarray) -> None:
        self.A, self.Y, self.wt = A, Y, wt
        self.k = A.shape[0]

    def scaled_rows(self, rows: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """The samples ``rows`` (in stacked order, padding skipped) times ``scale``, float64."""
        valid = np.flatnonzero(self.wt.ravel() > 0)
        return self.A.reshape(-1, self.A.shape[2])[valid[rows]].astype(np.float64) * scale[:, None]

    def weighted_gram(self, workers: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """``Σ_k weights[k] A_kᵀA_k`` over the block's workers ``workers`` (float64, ``D × D``)."""
        D = self.A.shape[2]
        gram = np.zeros((D, D))
        for i, w in zip(workers, weights):
            Ai = self.A[i, self.wt[i] > 0].astype(np.float64)
            gram += w * (Ai.T @ Ai)
        return gram

    def take(self, workers: np.ndarray) -> _DenseBlock:
        return _DenseBlock(self.A[workers], self.Y[workers], self.wt[workers])

    def sample(self, workers: np.ndarray, idx: np.ndarray) -> _DenseBlock:
        w = workers[:, None]
        return _DenseBlock(self.A[w, idx], self.Y[w, idx], np.full(idx.shape, 1.0 / idx.shape[1]))

    def forward(self, W: np.ndarray) -> np.ndarray:
        return np.matmul(self.A, W)  # (k, m, C): one batched product

    def backward(self, G: np.ndarray) -> np.ndarray:
        return np.matmul(self.A.transpose(0, 2, 1), G)  # (k, D, C)

    def backward_sum(self, G: np.ndarray) -> np.ndarray:
        k, m, D = self.A.shape
        return self.A.reshape(k * m, D).T @ G.reshape(k * m, -1)  # (D, C)

    def per_worker(self, v: np.ndarray) -> np.ndarray:
        return v.sum(axis=1)


class _SparseBlock:
    """Samples of ``k`` workers as one CSR matrix ``(M, D)`` of the stacked shards (worker ``g``'s
    rows ``offsets[g] … offsets[g+1] − 1``), their labels and weights ``(M,)``."""

    kind = "sparse"

    def __init__(self, A: Any, Y: np.ndarray, wt: np.ndarray, offsets: np.ndarray) -> None:
        self.A, self.Y, self.wt, self.offsets = A, Y, wt, offsets
        self.k = offsets.size - 1
        self.group = np.repeat(np.arange(self.k), np.diff(offsets))
        self._csc: tuple[Any, np.ndarray] | None = None

    def scaled_rows(self, rows: np.ndarray, scale: np.ndarray) -> Any:
        """The samples ``rows`` times ``scale``, a float64 CSR matrix."""
        import scipy.sparse as sp

        return sp.csr_array(sp.csr_array(self.A[rows], dtype=np.float64).multiply(scale[:, None]))

    def _rows(self, rows: np.ndarray, offsets: np.ndarray, wt: np.ndarray) -> _SparseBlock:
        return _SparseBlock(self.A[rows], self.Y[rows], wt, offsets)

    def weighted_gram(self, workers: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """``Σ_k weights[k] A_kᵀA_k`` over the block's workers ``workers`` (float64, ``D × D``)."""
        rows = np.concatenate([np.arange(self.offsets[i], self.offsets[i + 1]) for i in workers])
        B = self.scaled_rows(rows, np.sqrt(np.repeat(weights, np.diff(self.offsets)[workers])))
        return np.asarray((B.T @ B).toarray())

    def take(self, workers: np.ndarray) -> _SparseBlock:
        lens = np.diff(self.offsets)[workers]
        rows = np.concatenate([np.arange(self.offsets[w], self.offsets[w + 1]) for w in workers])
        return self._rows(rows, np.concatenate([[0], np.cumsum(lens)]), self.wt[rows])

    def sample(self, workers: np.ndarray, idx: np.ndarray) -> _SparseBlock:
        k, b = idx.shape
        rows = (self.offsets[workers][:, None] + idx).ravel()
        return self._rows(rows, np.arange(k + 1) * b, np.full(k * b, 1.0 / b))

    def forward(self, W: np.ndarray) -> np.ndarray:
        return np.asarray(self.A @ W)  # (M, C)

    def backward(self, G: np.ndarray) -> np.ndarray:
        import scipy.sparse as sp

        M, C = G.shape
        rows = (self.group[:, None] * C + np.arange(C)).ravel()
        P = sp.csr_array((G.ravel(), (rows, np.repeat(np.arange(M), C))), shape=(self.k * C, M))
        return np.asarray((P @ self.A).toarray()).reshape(self.k, C, -1).transpose(0, 2, 1)  # (k, D, C)

    def backward_sum(self, G: np.ndarray) -> np.ndarray:
        return np.asarray(self.A.T @ G)

    def per_worker(self, v: np.ndarray) -> np.ndarray:
        return np.bincount(self.group, weights=v, minlength=self.k)

    def coords(self, w: np.ndarray, f: np.ndarray, c: np.ndarray, G: np.ndarray) -> np.ndarray:
        """``Σ_j G[j, c[k]]·A[j, f[k]]`` over worker ``w[k]``'s samples, for every ``k``, float64:
        each product and sum as :meth:`backward` computes it (in ``G``'s dtype, the data's,
        summed from 0 in the order of the samples: scipy's sparse product), so bit for bit its
        entries, at ``O(nnz)`` of the coordinates' columns."""
        if self._csc is None:
            csc = self.A.tocsc()
            csc.sort_indices()
            M = self.A.shape[0]
            keys = np.repeat(np.arange(csc.shape[1], dtype=np.int64), np.diff(csc.indptr)) * M + csc.indices
            self._csc = (csc, keys)
        csc, keys = self._csc
        M = self.A.shape[0]
        lo = np.searchsorted(keys, f * M + self.offsets[w])
        hi = np.searchsorted(keys, f * M + self.offsets[w + 1])
        lens = hi - lo
        seg = np.repeat(np.arange(w.size), lens)
        pos = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens) + np.repeat(lo, lens)
        vals = G[csc.indices[pos], c[seg]] * csc.data[pos]
        if vals.dtype == np.float64:
            return np.bincount(seg, weights=vals, minlength=w.size)
        out = np.zeros(w.size, dtype=vals.dtype)
        np.add.at(out, seg, vals)  # in order, in the data's dtype (float32)
        return out.astype(np.float64)


class LinearFiniteSum:
    """The shared machinery of the problems ``f_ij(W) = h(Wᵀa_j, y_j) + r(W)``: the data split
    into shards, the oracles and the constants. A problem defines ``_encode`` (its labels),
    ``_head`` (``h`` and ``∂h/∂z`` per sample), ``_reg`` (``r`` and ``∇r``) and the curvature
    bounds ``_c`` and ``_rho`` (module docstring; the problems of
    :mod:`permk.problems.classification`)."""

    _c: float
    _rho: float

    def __init__(self, X: Any, y: Any, *, n: int, classes: int, seed: int = 0, p_hat: float | None = None,
                 shuffle: bool = True, dtype: Any = np.float64, bias: bool = True, x0: Any = None) -> None:
        import scipy.sparse as sp

        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
            raise ValueError(f"dtype must be np.float64 or np.float32, got {dtype!r}")
        sparse = sp.issparse(X)
        if sparse:
            X = sp.csr_array(X)
            values = X.data
        else:
            X = np.asarray(X)
            values = X
        if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] < 1 or values.dtype.kind not in "biuf":
            raise ValueError(f"X must be a non-empty real (N, features) matrix, got shape {X.shape} and dtype {values.dtype}")
        if not np.isfinite(values).all():
            raise ValueError("X must be finite")
        if self.dtype == np.float32 and values.size and float(np.abs(values).max()) > float(np.finfo(np.float32).max):
            raise ValueError(f"X has values beyond float32 (largest |x| = {float(np.abs(values).max()):.3g}): "
                             "use dtype=np.float64, or rescale the features")
        N = X.shape[0]
        labels = np.asarray(y)
        if labels.shape != (N,):
            raise ValueError(f"y must have shape ({N},) (one label per row of X), got {labels.shape}")
        self.n = check_int(n, "n", low=1)
        self.seed = check_seed(seed)
        self.classes = check_int(classes, "classes", low=1)
        Y = self._encode(labels)
        if bias:
            X = sp.hstack([X, np.ones((N, 1))], format="csr") if sparse else np.hstack([X, np.ones((N, 1), dtype=X.dtype)])
        self.D = int(X.shape[1])
        self.d = self.D * self._columns
        self.shards = shard_indices(N, self.n, seed=self.seed, p_hat=p_hat, shuffle=shuffle)
        self.sample_counts = np.array([s.size for s in self.shards], dtype=np.int64)
        if (self.sample_counts == 0).any():
            raise ValueError("every worker needs at least one sample")
        rows = np.concatenate(self.shards)
        self.offsets = np.concatenate([[0], np.cumsum(self.sample_counts)])
        wt = np.repeat(1.0 / self.sample_counts, self.sample_counts)
        if sparse:
            A = sp.csr_array(X[rows], dtype=self.dtype)
            A.sort_indices()
            self._data: _DenseBlock | _SparseBlock = _SparseBlock(A, Y[rows], wt, self.offsets)
            sq = row_sq_norms(A)
        else:
            m = int(self.sample_counts.max())
            A3 = np.zeros((self.n, m, self.D), dtype=self.dtype)
            Y3 = np.zeros((self.n, m), dtype=Y.dtype)
            W3 = np.zeros((self.n, m))
            for i, s in enumerate(self.shards):
                A3[i, : s.size], Y3[i, : s.size], W3[i, : s.size] = X[s], Y[s], 1.0 / s.size
            self._data = _DenseBlock(A3, Y3, W3)
            sq = row_sq_norms(A3.reshape(-1, self.D)).reshape(self.n, m)
            sq = np.concatenate([sq[i, : c] for i, c in enumerate(self.sample_counts)])
        top = float(sq.max())
        if not top <= CONSTANT_LIMIT:
            raise ValueError(f"X's samples are too large for the smoothness constants: the largest squared norm of a sample "
                             f"(with its bias) is {top:.3g}, beyond 2**400 (the step sizes square the constants); rescale the features")
        with np.errstate(over="ignore"):
            L_top = self._c * top + self._rho
        if not L_top <= CONSTANT_LIMIT:
            raise ValueError(f"the regulariser's curvature {self._rho:.3g} is too large for the smoothness constants "
                             "(beyond 2**400: the step sizes square the constants); choose a smaller lam")
        #: ``‖a_j‖²`` of every held sample, shard by shard (worker ``i``'s at ``offsets[i] …``).
        self.sample_sq_norms = sq
        self.x0 = np.zeros(self.d) if x0 is None else start_point(x0, self.d)
        self._points: list[tuple[bytes, np.ndarray]] = []

    # -- per-problem definitions -----------------------------------------------------------------
    @property
    def _columns(self) -> int:
        return self.classes

    def _encode(self, labels: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _head(self, Z: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _reg(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        return 0.0, np.zeros_like(x)

    # -- the oracles ----------------------------------------------------------------------------
    def _weights(self, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.reshape(self.D, self._columns), dtype=self.dtype)

    def _workers(self, workers: Sequence[int] | None) -> np.ndarray | None:
        if workers is None:
            return None
        w = index_array(workers, "workers")
        if w.size and (w.min() < 0 or w.max() >= self.n):
            raise ValueError(f"workers must be worker indices in range({self.n}), got {w.tolist()[:10]}")
        return w

    def _block(self, workers: np.ndarray | None) -> _DenseBlock | _SparseBlock:
        return self._data if workers is None else self._data.take(workers)

    def _dz(self, block: _DenseBlock | _SparseBlock, Z: np.ndarray) -> np.ndarray:
        """``wt_j ∂h/∂z`` per sample (the backward product's input)."""
        return self._head(Z, block.Y)[1] * block.wt[..., None]

    def _grads(self, block: _DenseBlock | _SparseBlock, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Each point's per-worker gradients on ``block``: one forward and one backward product
        for all the points (their weights side by side)."""
        C = self._columns
        Z = block.forward(np.hstack([self._weights(x) for x in xs]))
        G = np.concatenate([self._dz(block, Z[..., k * C : (k + 1) * C]) for k in range(len(xs))], axis=-1)
        out = block.backward(G.astype(self.dtype, copy=False)).astype(np.float64)
        return [out[..., k * C : (k + 1) * C].reshape(block.k, self.d) + self._reg(x)[1] for k, x in enumerate(xs)]

    def loss(self, x: Any) -> float:
        x = as_vector(x, self.d)
        h = self._head(self._data.forward(self._weights(x)), self._data.Y)[0]
        return float(np.sum(h * self._data.wt) / self.n + self._reg(x)[0])

    def local_loss(self, i: int, x: Any) -> float:
        """``f_i(x)``."""
        x = as_vector(x, self.d)
        block = self._data.take(np.array([check_int(i, "i", high=self.n)]))
        return float(np.sum(self._head(block.forward(self._weights(x)), block.Y)[0] * block.wt) + self._reg(x)[0])

    def local_losses(self, x: Any) -> np.ndarray:
        """``[f_1(x), …, f_n(x)]``."""
        x = as_vector(x, self.d)
        h = self._head(self._data.forward(self._weights(x)), self._data.Y)[0]
        return self._data.per_worker(h * self._data.wt) + self._reg(x)[0]

    def grad(self, x: Any) -> np.ndarray:
        x = as_vector(x, self.d)
        G = self._dz(self._data, self._data.forward(self._weights(x))) / self.n
        return self._data.backward_sum(G.astype(self.dtype, copy=False)).astype(np.float64).reshape(self.d) + self._reg(x)[1]

    def local_grads(self, x: Any, *, workers: Sequence[int] | None = None) -> np.ndarray:
        """``[∇f_i(x)]`` for ``i`` in ``workers`` (default all), shape ``(len(workers), d)``."""
        return self._grads(self._block(self._workers(workers)), [as_vector(x, self.d)])[0]

    def local_grad(self, i: int, x: Any) -> np.ndarray:
        return self.local_grads(x, workers=[check_int(i, "i", high=self.n)])[0]

    def _sampled(self, batch_size: int, seed: int, round: int, workers: Sequence[int] | None) -> _DenseBlock | _SparseBlock:
        w = self._workers(workers)
        w = np.arange(self.n) if w is None else w
        idx = minibatch_indices(self.sample_counts, batch_size, seed=seed, round=round, workers=w.tolist())
        return self._data.sample(w, idx)

    def minibatch_grads(self, x: Any, batch_size: int, *, seed: int, round: int, workers: Sequence[int] | None = None) -> np.ndarray:
        """``∇f_{iB_i}(x)`` of each worker in ``workers`` (default all), shape ``(len(workers), d)``;
        ``B_i`` from :func:`minibatch_indices` (module docstring)."""
        return self._grads(self._sampled(batch_size, seed, round, workers), [as_vector(x, self.d)])[0]

    def minibatch_grads_pair(self, x: Any, y: Any, batch_size: int, *, seed: int, round: int,
                             workers: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(∇f_{iB_i}(x), ∇f_{iB_i}(y))`` with the same ``B_i`` at both points (one product each
        way for both)."""
        gx, gy = self._grads(self._sampled(batch_size, seed, round, workers), [as_vector(x, self.d), as_vector(y, self.d, "y")])
        return gx, gy

    def local_grad_coords(self, x: Any, rows: Any, cols: Any) -> np.ndarray:
        """``∇f_{rows[k]}(x)[cols[k]]`` for every ``k``, bit for bit the entries of
        :meth:`local_grads` (so the fused and dense paths give the same iterates): dense data
        compute every worker's gradient as :meth:`local_grads` does (one batched product each
        way) and read the coordinates; sparse data one forward product and ``O(nnz)`` of each
        coordinate's column, summed in the sparse product's order. The products are kept for the
        last three points: MARINA asks ``x^{t+1}`` then ``x^t`` in round ``t``, and ``x^t`` was
        the first of the previous round's two, so each round computes one point."""
        x = as_vector(x, self.d)
        r, c = index_array(rows, "rows"), index_array(cols, "cols")
        if r.shape != c.shape:
            raise ValueError(f"rows and cols must have the same length, got {r.size} and {c.size}")
        if r.size and (r.min() < 0 or r.max() >= self.n or c.min() < 0 or c.max() >= self.d):
            raise ValueError(f"rows must be in range({self.n}) and cols in range({self.d})")
        key = x.tobytes()
        kept = next((g for k, g in self._points if k == key), None)
        if kept is None:
            if isinstance(self._data, _DenseBlock):
                kept = self._grads(self._data, [x])[0]  # (n, d), as local_grads(x)
            else:
                kept = self._dz(self._data, self._data.forward(self._weights(x))).astype(self.dtype, copy=False)
            self._points = [(key, kept)] + self._points[:2]
        if isinstance(self._data, _DenseBlock):
            return kept[r, c]
        C = self._columns
        return self._data.coords(r, c // C, c % C, kept) + self._reg(x)[1][c]

    # -- the smoothness constants (module docstring) -----------------------------------------------
    def smoothness(self) -> dict[str, Any]:
        """The constants the methods' steps read (:data:`HELD_CONSTANTS`), computed from all the
        samples: what :class:`HeldShards` keeps of them."""
        return {"L_minus": float(self.L_minus), "L_plus": float(self.L_plus), "L_pm": float(self.L_pm),
                "L_max": self.L_max, "L_i": self.L_i.copy(), "L_sample_rms": self.L_sample_rms}

    def held(self, workers: Sequence[int], *, constants: dict[str, Any] | None = None) -> HeldShards:
        """The part of the problem one MPI process holds: :class:`HeldShards`."""
        return HeldShards(self, workers, constants=constants)

    def _gram_max(self, workers: np.ndarray, weights: np.ndarray) -> float:
        """``λ_max(Σ_{i ∈ workers} weights_i A_iᵀA_i)`` in float64: the ``D × D`` Gram matrix
        accumulated worker by worker when ``D ≤ 2000``, else from the weighted rows
        (:func:`_lambda_max_gram`)."""
        if self.D <= _DIRECT:
            return float(np.linalg.eigvalsh(self._data.weighted_gram(workers, weights))[-1])
        rows = np.concatenate([np.arange(self.offsets[i], self.offsets[i + 1]) for i in workers])
        return _lambda_max_gram(self._data.scaled_rows(rows, np.sqrt(np.repeat(weights, self.sample_counts[workers]))))

    @property
    def L_ij(self) -> np.ndarray:
        """``c‖a_j‖² + ρ`` of every held sample, shard by shard (``offsets``)."""
        return self._c * self.sample_sq_norms + self._rho

    @property
    def L_max(self) -> float:
        """``max_ij L_ij``."""
        return float(self.L_ij.max())

    @property
    def L_sample_rms(self) -> np.ndarray:
        """``ℒ_i = sqrt(mean_j L_ij²)`` per worker (VR-MARINA's mean-squared smoothness)."""
        return np.sqrt(np.add.reduceat(self.L_ij**2, self.offsets[:-1]) / self.sample_counts)

    @cached_property
    def L_i(self) -> np.ndarray:
        """``c λ_max(A_iᵀA_i)/m_i + ρ`` per worker (computed when first read)."""
        return np.array([self._c * self._gram_max(np.array([i]), 1.0 / self.sample_counts[[i]]) + self._rho for i in range(self.n)])

    @cached_property
    def L_minus(self) -> float:
        """A bound on ``L_−``: ``c λ_max(Σ_i A_iᵀA_i/(n m_i)) + ρ`` (computed when first read)."""
        return self._c * self._gram_max(np.arange(self.n), 1.0 / (self.n * self.sample_counts)) + self._rho

    @property
    def L_sq_mean(self) -> float:
        """``(1/n) Σ L_i²``."""
        return float(np.mean(self.L_i**2))

    @property
    def L_plus(self) -> float:
        """A bound on ``L_+`` of Assumption "L+": ``sqrt((1/n) Σ L_i²)``."""
        return math.sqrt(self.L_sq_mean)

    @property
    def L_pm(self) -> float:
        """A bound on ``L_±`` (Definition "Hessian variance"): ``L_± ≤ L_+ ≤ sqrt((1/n) Σ L_i²)``."""
        return self.L_plus

    def _data_digest(self) -> str:
        """A digest of the samples and labels as the workers hold them (the shards, in order),
        the problem's kind and curvature bounds (computed once: the data do not change)."""
        got = self.__dict__.get("_digest")
        if got is None:
            h = hashlib.sha256()  # hashes the data buffers in place (several hundred MB/s)
            h.update(f"{type(self).__qualname__} {self.n} {self.d} {self.D} {self.classes} {self.dtype.name} "
                     f"{float(self._c).hex()} {float(self._rho).hex()} {self._data.kind}".encode())
            data = self._data
            parts = ([data.A.data, data.A.indices, data.A.indptr, data.offsets] if isinstance(data, _SparseBlock) else [data.A])
            for a in (*parts, data.Y, data.wt, self.sample_counts):
                h.update(str(a.dtype).encode() + str(a.shape).encode())
                h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)
            got = self.__dict__["_digest"] = h.hexdigest()[:32]
        return got

    def fingerprint(self) -> str:
        """What every process running this problem must share (the launch check of
        :func:`permk.distributed.run` compares it): the kind, sizes and curvature bounds, the
        samples and labels of every worker's shard (a digest of the data, computed once) and the
        start ``x0``."""
        h = hashlib.blake2b(digest_size=12)
        h.update(self._data_digest().encode())
        h.update(np.ascontiguousarray(self.x0, dtype=np.float64).tobytes())
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, d={self.d}, samples={int(self.offsets[-1])}, {self._data.kind}, {self.dtype.name})"


#: The smoothness constants a :class:`HeldShards` carries from the whole problem.
HELD_CONSTANTS = ("L_minus", "L_plus", "L_pm", "L_max", "L_i", "L_sample_rms")


class HeldShards:
    """The part of a finite-sum problem one MPI process holds, a
    :class:`permk.distributed.LocalProblem`: the samples of a contiguous block of workers only
    (the rest of the data can be dropped), the whole problem's ``n``, ``d``, ``x0``,
    ``sample_counts`` and smoothness constants (:meth:`LinearFiniteSum.smoothness`, computed
    from all the samples: pass ``constants`` computed on one process to give every process the
    same numbers), and the held workers' oracles ``local_grads``, ``local_grad``,
    ``local_grad_coords``, ``minibatch_grads`` and ``minibatch_grads_pair``, which compute what
    the whole problem's compute for those workers (minibatches drawn from ``(seed, round, i)``
    with the global worker index ``i``). It has no global ``grad`` or ``loss``: the MPI backend
    records ``‖∇f‖²`` from the workers' gradients.

    >>> import numpy as np
    >>> from permk.problems import NonconvexSigmoid
    >>> p = NonconvexSigmoid(np.eye(6), [1, -1, 1, -1, 1, 1], n=3, seed=0)
    >>> h = p.held(range(1, 3))
    >>> bool(np.array_equal(h.local_grads(p.x0), p.local_grads(p.x0, workers=[1, 2])))
    True
    """

    def __init__(self, problem: LinearFiniteSum, workers: Sequence[int], *, constants: dict[str, Any] | None = None) -> None:
        if not isinstance(problem, LinearFiniteSum):
            raise TypeError(f"problem must be a permk classification problem (NonconvexSigmoid, ...), got {type(problem).__name__}")
        ws = [check_int(i, "worker", high=problem.n) for i in workers]
        if not ws or ws != list(range(ws[0], ws[0] + len(ws))):
            raise ValueError(f"workers must be a non-empty contiguous range of worker indices, got {ws[:10]}")
        c = problem.smoothness() if constants is None else constants
        missing = [k for k in HELD_CONSTANTS if k not in c]
        if missing:
            raise ValueError(f"constants must hold {', '.join(HELD_CONSTANTS)} (problem.smoothness()); missing {', '.join(missing)}")
        self.n, self.d, self.x0, self.dtype = problem.n, problem.d, problem.x0.copy(), problem.dtype
        self.workers = range(ws[0], ws[0] + len(ws))
        self.sample_counts = problem.sample_counts.copy()
        self.L_minus, self.L_plus, self.L_pm, self.L_max = (float(c[k]) for k in ("L_minus", "L_plus", "L_pm", "L_max"))
        self.L_i = np.array(c["L_i"], dtype=np.float64)
        self.L_sample_rms = np.array(c["L_sample_rms"], dtype=np.float64)
        self._kind = type(problem).__name__
        #: the whole problem's data (every worker's samples): ranks built from other data differ
        self._data_digest = problem._data_digest()
        held = copy.copy(problem)
        for cached in ("L_i", "L_minus", "_digest"):
            held.__dict__.pop(cached, None)
        held._data = problem._data.take(np.arange(self.workers.start, self.workers.stop))
        held._points = []
        self._held = held

    def _rows(self, workers: Any, name: str = "workers") -> np.ndarray:
        """Held workers' global indices as rows of the held block."""
        w = index_array(workers, name)
        if w.size and (int(w.min()) < self.workers.start or int(w.max()) >= self.workers.stop):
            raise ValueError(f"{name} must be workers held here ({self.workers}), got {w.tolist()[:10]}")
        return w - self.workers.start

    def local_grads(self, x: Any) -> np.ndarray:
        """``[∇f_i(x)]`` of the held workers, shape ``(len(workers), d)``."""
        return self._held._grads(self._held._data, [as_vector(x, self.d)])[0]

    def local_grad(self, i: int, x: Any) -> np.ndarray:
        """``∇f_i(x)`` of a held worker ``i``."""
        return self._held._grads(self._held._data.take(self._rows([i], "i")), [as_vector(x, self.d)])[0][0]

    def local_grad_coords(self, x: Any, rows: Any, cols: Any) -> np.ndarray:
        """``∇f_{rows[k]}(x)[cols[k]]`` for held workers ``rows``."""
        return self._held.local_grad_coords(x, self._rows(rows, "rows"), cols)

    def _sampled(self, batch_size: int, seed: int, round: int, workers: Any) -> _DenseBlock | _SparseBlock:
        r = self._rows(workers)
        idx = minibatch_indices(self.sample_counts, batch_size, seed=seed, round=round, workers=(r + self.workers.start).tolist())
        return self._held._data.sample(r, idx)

    def minibatch_grads(self, x: Any, batch_size: int, *, seed: int, round: int, workers: Sequence[int]) -> np.ndarray:
        """``∇f_{iB_i}(x)`` of the held ``workers`` (:func:`minibatch_indices`)."""
        return self._held._grads(self._sampled(batch_size, seed, round, workers), [as_vector(x, self.d)])[0]

    def minibatch_grads_pair(self, x: Any, y: Any, batch_size: int, *, seed: int, round: int,
                             workers: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``(∇f_{iB_i}(x), ∇f_{iB_i}(y))`` of the held ``workers``, the same ``B_i`` at both points."""
        gx, gy = self._held._grads(self._sampled(batch_size, seed, round, workers), [as_vector(x, self.d), as_vector(y, self.d, "y")])
        return gx, gy

    def fingerprint(self) -> str:
        """What every process's part shares: the problem's kind, sizes, start, sample counts and
        constants, and a digest of the whole problem's data it was built from (every worker's
        samples and labels, the shards, the curvature bounds: taken before the other workers'
        samples were dropped), so that processes that read other data, split it with another
        seed or scaled it differ (the launch check of :func:`permk.distributed.run` compares
        it)."""
        h = hashlib.blake2b(digest_size=12)
        h.update(f"{self._kind} {self.n} {self.d} {self.dtype.name} {self._data_digest}".encode())
        for a in (self.x0, self.sample_counts.astype(np.float64), self.L_i, self.L_sample_rms,
                  np.array([self.L_minus, self.L_plus, self.L_pm, self.L_max])):
            h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"HeldShards({self._kind}, n={self.n}, d={self.d}, workers={self.workers})"


#: The largest Gram matrix side whose eigenvalues are computed directly (else Lanczos).
_DIRECT = 2000


def _lambda_max_gram(B: Any) -> float:
    """``λ_max(BᵀB)`` (float64): from the smaller Gram matrix when one side is at most
    ``_DIRECT``, else by Lanczos (``eigsh``, tolerance 1e-10, seeded start)."""
    import scipy.sparse as sp

    if min(B.shape) > _DIRECT:
        import scipy.sparse.linalg as sla

        op = sla.LinearOperator((B.shape[1],) * 2, matvec=lambda v: B.T @ (B @ v), dtype=np.float64)
        v0 = np.random.default_rng(0).standard_normal(B.shape[1])
        return float(sla.eigsh(op, k=1, which="LA", v0=v0, tol=1e-10, return_eigenvectors=False)[0])
    if sp.issparse(B):
        B = B.toarray()
    gram = B @ B.T if B.shape[0] <= B.shape[1] else B.T @ B
    return float(np.linalg.eigvalsh(gram)[-1])
