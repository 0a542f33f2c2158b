"""A ``torch.nn.Module``, a loss and one data shard per worker as a permk problem.

Worker ``i`` holds the shard ``(X_i, Y_i)`` and ``f_i(x) = loss(module_x(X_i), Y_i)``, where
``module_x`` is the module with its parameters set to the flat vector ``x``;
``f = (1/n) Σ_i f_i`` (eq. (1) of the paper). :class:`ModuleProblem` implements the
:class:`permk.problems.Problem` protocol and the finite-sum protocol of
:class:`permk.problems.FiniteSumProblem`, so every permk method (MARINA, EF21, GD, DASHA,
VR-MARINA, SGD, …) and backend (the simulator, MPI) trains the network.

**The parameter vector.** ``x`` is the concatenation of the flattened (row-major) parameters in
the order of ``module.parameters()``; ``d`` is their total size. The default starting point
``x0`` is the module's parameters when the problem is built. Buffers (e.g. running statistics)
are copied then and held constant.

**The oracles.** Gradients are functional (``torch.func``): ``torch.func.grad`` of
``x ↦ loss(functional_call(module, x, X_i), Y_i)``, vmapped over the workers. Shards of equal
size are stacked and evaluated in one vmapped call; ragged shards are grouped by size (one
vmapped call per distinct size: the shards of :func:`permk.problems.datasets.shard_indices` have at most
two sizes). Arithmetic is in the parameters' dtype (``torch.float32`` or ``torch.float64``);
every oracle returns float64 numpy arrays. The local gradients of the last two points are kept
(MARINA asks ``x^{t+1}`` and ``x^t``). ``grad`` and ``loss`` are the worker-order means of the
local gradients and losses (``acc += row`` from worker 0, then ``/ n``: the sum an MPI run
with ``reduce="ordered"`` forms).

**Reproducibility.** A run is bit-reproducible (same problem, seed and backend; torch's CPU
results do not depend on its number of threads). A worker's gradient can differ in the last
bits with the set of workers it is evaluated with (torch chooses its batched kernels by the
batch's size), so an MPI run, whose processes evaluate their own workers, agrees with the
simulator to rounding, not bit for bit.

**Minibatches.** ``minibatch_grads(x, b, seed=, round=, workers=)`` draws worker ``i``'s ``b``
samples with :func:`permk.problems.minibatch_indices` (uniform with replacement, a pure
function of ``(seed, round, i)``) and returns ``∇ loss(module_x(X_i[B_i]), Y_i[B_i])``. This is
the minibatch gradient ``(1/b) Σ_{j ∈ B_i} ∇f_ij`` of the finite-sum protocol when ``loss`` is
the mean of per-sample losses (``reduction="mean"``) and the module treats the samples of a
batch independently (no batch normalisation in training mode).

**MPI.** A :class:`ModuleProblem` holds every shard; on MPI it is wrapped in
:class:`permk.distributed.LocalView`, which asks each held worker's gradient in turn
(``local_grad``). :class:`LocalModuleProblem` holds only one process's workers (the shards of
``permk.distributed.workers_of(n)``): its data never has to exist on one process, and its held
workers' gradients are vmapped together. Both have a ``fingerprint()`` for the launch check.

The module must be deterministic (no dropout: ``torch.func.vmap`` refuses random operations)
and its forward must be ``torch.func``-transformable (no in-place updates of buffers).
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from .._validate import as_vector, check_int, check_seed, index_array, start_point
from ..problems.finite_sum import minibatch_indices

__all__ = ["ModuleProblem", "LocalModuleProblem", "two_layer_network", "TWO_LAYER_HIDDEN"]

Array = np.ndarray
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: The parameters' dtypes the problems accept, and the numpy dtype of each.
_DTYPES: dict[torch.dtype, np.dtype[Any]] = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}

#: The hidden width of the authors' two-layer network (``TwoLayerNeuralNet``: Linear(p → 32)).
TWO_LAYER_HIDDEN = 32


def _as_tensor(value: Any, what: str, float_dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``value`` (a tensor or an array) as a tensor on ``device`` holding at least one sample:
    floating values in ``float_dtype``, integer and boolean values as they are."""
    try:
        t = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"{what} must be a tensor or a numeric array, got {type(value).__name__} ({e})") from None
    if t.is_complex():
        raise TypeError(f"{what} must hold real numbers, got {t.dtype}")
    if t.ndim < 1 or t.shape[0] < 1:
        raise ValueError(f"{what} must hold at least one sample along its first axis, got shape {tuple(t.shape)}")
    if t.is_floating_point():
        t = t.to(float_dtype)
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{what} must be finite")
    return t.to(device)


class _Group:
    """The shards of one size ``m``, stacked: inputs ``(k, m, …)``, targets ``(k, m, …)``; ``held``
    lists their positions among the held workers."""

    def __init__(self, held: list[int], X: torch.Tensor, Y: torch.Tensor) -> None:
        self.held, self.X, self.Y = held, X, Y


class _ModuleOracles:
    """What :class:`ModuleProblem` and :class:`LocalModuleProblem` share: the module as a
    function of the flat parameter vector, the held workers' shards grouped by size, and the
    vmapped oracles of the held workers (``first`` is the first held worker's index)."""

    n: int
    sample_counts: Array

    def __init__(self, module: nn.Module, loss: Loss, shards: Sequence[tuple[Any, Any]], *, first: int, x0: Any) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if not callable(loss):
            raise TypeError(f"loss must be a callable loss(outputs, targets), got {type(loss).__name__}")
        named = list(module.named_parameters())
        if not named:
            raise ValueError("module has no parameters")
        dtypes = sorted({str(p.dtype) for _, p in named})
        if len(dtypes) != 1 or named[0][1].dtype not in _DTYPES:
            raise TypeError(f"module's parameters must all be torch.float32 or all torch.float64, got {', '.join(dtypes)}")
        self._tdtype = named[0][1].dtype
        #: The numpy dtype of the arithmetic (the parameters' dtype); the oracles return float64.
        self.dtype = _DTYPES[self._tdtype]
        self._device = named[0][1].device
        self._names = [k for k, _ in named]
        self._shapes = [tuple(p.shape) for _, p in named]
        self._sizes = [p.numel() for _, p in named]
        self.d = int(sum(self._sizes))
        self._buffers = {k: b.detach().clone() for k, b in module.named_buffers()}
        self._module = module
        self._loss = loss
        self._first = first
        held = self._check_shards(shards)
        self._held = len(held)
        self._counts = np.array([X.shape[0] for X, _ in held], dtype=np.int64)
        self._groups: list[_Group] = []
        self._where: list[tuple[int, int]] = [(0, 0)] * self._held  # held position -> (group, row)
        for m in sorted(set(self._counts.tolist())):
            members = [k for k in range(self._held) if self._counts[k] == m]
            for row, k in enumerate(members):
                self._where[k] = (len(self._groups), row)
            self._groups.append(_Group(members, torch.stack([held[k][0] for k in members]), torch.stack([held[k][1] for k in members])))
        flat = torch.cat([p.detach().reshape(-1) for _, p in named]).to(torch.float64).cpu().numpy()
        self.x0 = flat if x0 is None else start_point(x0, self.d)
        self._grads = vmap(grad(self._worker_loss), in_dims=(None, 0, 0))
        self._losses = vmap(self._worker_loss, in_dims=(None, 0, 0))
        self._points: list[tuple[bytes, Array]] = []
        value = self._worker_loss(self._params(self.x0), held[0][0], held[0][1])
        if not isinstance(value, torch.Tensor) or value.ndim != 0 or not value.is_floating_point():
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"loss(outputs, targets) must return a scalar floating tensor (e.g. reduction='mean'), got {shape}")

    def _check_shards(self, shards: Sequence[tuple[Any, Any]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The shards as tensors, each ``(inputs, targets)`` with as many targets as inputs and
        the same trailing shapes and dtypes in every shard."""
        if isinstance(shards, (str, bytes)) or not hasattr(shards, "__len__"):
            raise TypeError(f"shards must be a sequence of (inputs, targets) pairs, one per worker, got {type(shards).__name__}")
        out: list[tuple[torch.Tensor, torch.Tensor]] = []
        for k, shard in enumerate(shards):
            where = f"shards[{k}]"
            if not (isinstance(shard, (tuple, list)) and len(shard) == 2):
                raise TypeError(f"{where} must be an (inputs, targets) pair, got {type(shard).__name__}")
            X = _as_tensor(shard[0], f"{where} inputs", self._tdtype, self._device)
            Y = _as_tensor(shard[1], f"{where} targets", self._tdtype, self._device)
            if X.shape[0] != Y.shape[0]:
                raise ValueError(f"{where} holds {X.shape[0]} inputs but {Y.shape[0]} targets")
            if out:
                X0, Y0 = out[0]
                for t, t0, name in ((X, X0, "inputs"), (Y, Y0, "targets")):
                    if t.shape[1:] != t0.shape[1:] or t.dtype != t0.dtype:
                        raise ValueError(f"{where} {name} have per-sample shape {tuple(t.shape[1:])} and dtype {t.dtype}, "
                                         f"but shards[0]'s have {tuple(t0.shape[1:])} and {t0.dtype}")
            out.append((X, Y))
        if not out:
            raise ValueError("shards must hold at least one (inputs, targets) pair")
        return out

    # -- the module as a function of x ---------------------------------------------------------
    def _params(self, x: Array) -> torch.Tensor:
        return torch.from_numpy(np.asarray(x, dtype=self.dtype)).to(self._device)

    def _worker_loss(self, flat: torch.Tensor, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        """``loss(module_flat(X), Y)``: one worker's loss at the flat parameters."""
        params = {k: v.view(s) for k, v, s in zip(self._names, torch.split(flat, self._sizes), self._shapes)}
        return self._loss(functional_call(self._module, (params, self._buffers), (X,)), Y)

    # -- the held workers' oracles ---------------------------------------------------------------
    def _positions(self, workers: Sequence[int] | None) -> Array:
        """Held positions of the global worker indices ``workers`` (default: every held worker)."""
        if workers is None:
            return np.arange(self._held)
        w = index_array(workers, "workers")
        if w.size and (w.min() < self._first or w.max() >= self._first + self._held):
            raise ValueError(f"workers must be in range({self._first}, {self._first + self._held}), got {w.tolist()[:10]}")
        return w - self._first

    def _evaluate(self, fn: Callable[..., torch.Tensor], x: Array, positions: Array, width: int) -> Array:
        """``fn(x, X_k, Y_k)`` for the held workers at ``positions``, one vmapped call per group of
        equal-size shards, as float64 rows in the order of ``positions``."""
        flat = self._params(x)
        out = np.empty((positions.size, width))
        wanted = {int(k): j for j, k in enumerate(positions)}
        with torch.no_grad():
            for g in self._groups:
                rows = [r for r, k in enumerate(g.held) if k in wanted]
                if not rows:
                    continue
                whole = len(rows) == len(g.held)
                X, Y = (g.X, g.Y) if whole else (g.X[rows], g.Y[rows])
                vals = fn(flat, X, Y).reshape(len(rows), width).cpu().numpy()
                for r, v in zip(rows, vals):
                    out[wanted[g.held[r]]] = v
        return out

    def _held_grads(self, x: Array) -> Array:
        """Every held worker's gradient at ``x`` (the last two points' kept)."""
        key = x.tobytes()
        for k, rows in self._points:
            if k == key:
                return rows
        rows = self._evaluate(self._grads, x, np.arange(self._held), self.d)
        rows.flags.writeable = False
        self._points = [(key, rows)] + self._points[:1]
        return rows

    def local_grads(self, x: Any, *, workers: Sequence[int] | None = None) -> Array:
        """``[∇f_i(x)]`` for the workers ``i`` in ``workers`` (default: every held worker), shape
        ``(len(workers), d)``, float64."""
        rows = self._held_grads(as_vector(x, self.d))
        return np.array(rows if workers is None else rows[self._positions(workers)])

    def _minibatch_at(self, points: Sequence[Array], batch_size: int, seed: int, round: int,
                      workers: Sequence[int] | None) -> list[Array]:
        """The minibatch gradients of ``workers`` (default: every held worker) at each of
        ``points``, with the same minibatches (stacked ``(k, b, …)``, one vmapped call per point)."""
        pos = self._positions(workers)
        idx = minibatch_indices(self.sample_counts, batch_size, seed=seed, round=round, workers=(pos + self._first).tolist())
        if pos.size == 0:
            return [np.empty((0, self.d)) for _ in points]
        Xs, Ys = [], []
        for k, take in zip(pos, idx):
            g, r = self._where[int(k)]
            t = torch.from_numpy(take).to(self._device)
            Xs.append(self._groups[g].X[r, t])
            Ys.append(self._groups[g].Y[r, t])
        X, Y = torch.stack(Xs), torch.stack(Ys)
        with torch.no_grad():
            return [np.array(self._grads(self._params(x), X, Y).cpu().numpy(), dtype=np.float64) for x in points]

    def minibatch_grads(self, x: Any, batch_size: int, *, seed: int, round: int, workers: Sequence[int] | None = None) -> Array:
        """``∇ loss(module_x(X_i[B_i]), Y_i[B_i])`` of each worker ``i`` in ``workers`` (default:
        every held worker), ``B_i`` from :func:`permk.problems.minibatch_indices`; shape
        ``(len(workers), d)``."""
        return self._minibatch_at([as_vector(x, self.d)], batch_size, seed, round, workers)[0]

    def minibatch_grads_pair(self, x: Any, y: Any, batch_size: int, *, seed: int, round: int,
                             workers: Sequence[int] | None = None) -> tuple[Array, Array]:
        """The minibatch gradients at ``x`` and at ``y`` with the same minibatches."""
        gx, gy = self._minibatch_at([as_vector(x, self.d), as_vector(y, self.d, "y")], batch_size, seed, round, workers)
        return gx, gy

    # -- the launch check ------------------------------------------------------------------------
    def _digest(self, *data: torch.Tensor) -> str:
        """A digest of the architecture, the loss's name, ``n``, the shard sizes, the buffers and
        ``data`` (the launch check compares the starting points itself)."""
        h = hashlib.blake2b(digest_size=12)
        loss_name = getattr(self._loss, "__qualname__", type(self._loss).__qualname__)
        h.update(repr((self._names, self._shapes, str(self._tdtype), loss_name, self.n, self.sample_counts.tolist())).encode())
        for t in (*self._buffers.values(), *data):
            h.update(str((t.dtype, tuple(t.shape))).encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()


class ModuleProblem(_ModuleOracles):
    """``f = (1/n) Σ_i f_i`` with ``f_i(x) = loss(module_x(X_i), Y_i)`` over the ``n`` shards
    ``shards[i] = (X_i, Y_i)`` (module docstring).

    The module itself is never modified. ``sample_counts`` holds the shard sizes.

    Parameters
    ----------
    module
        A ``torch.nn.Module`` whose parameters are all ``torch.float32`` or all
        ``torch.float64`` (the dtype of the arithmetic); ``x`` holds them flattened in the order
        of ``module.parameters()``.
    loss
        ``loss(outputs, targets)`` returning a scalar tensor, e.g.
        ``torch.nn.functional.cross_entropy``.
    shards
        ``n`` pairs ``(inputs, targets)`` (tensors or numpy arrays; floating values are
        converted to the parameters' dtype), with as many targets as inputs and the same
        per-sample shapes and dtypes in every shard.
    x0
        The starting point (default: the module's parameters).

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Linear(3, 2, dtype=torch.float64)
    >>> X, y = torch.ones(4, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0])
    >>> p = ModuleProblem(net, torch.nn.functional.cross_entropy, [(X[:2], y[:2]), (X[2:], y[2:])])
    >>> p.n, p.d, p.local_grads(p.x0).shape
    (2, 8, (2, 8))
    """

    def __init__(self, module: nn.Module, loss: Loss, shards: Sequence[tuple[Any, Any]], *, x0: Any = None) -> None:
        super().__init__(module, loss, shards, first=0, x0=x0)
        self.n = self._held
        self.sample_counts = self._counts

    def local_grad(self, i: int, x: Any) -> Array:
        """``∇f_i(x)`` (one worker's shard only)."""
        i = check_int(i, "i", high=self.n)
        x = as_vector(x, self.d)
        for k, rows in self._points:
            if k == x.tobytes():
                return np.array(rows[i])
        return self._evaluate(self._grads, x, np.array([i]), self.d)[0]

    def local_losses(self, x: Any) -> Array:
        """``[f_1(x), …, f_n(x)]``, float64."""
        return self._evaluate(self._losses, as_vector(x, self.d), np.arange(self.n), 1)[:, 0]

    def local_loss(self, i: int, x: Any) -> float:
        """``f_i(x)``."""
        i = check_int(i, "i", high=self.n)
        return float(self._evaluate(self._losses, as_vector(x, self.d), np.array([i]), 1)[0, 0])

    def loss(self, x: Any) -> float:
        """``f(x)``: the worker-order mean of the local losses."""
        return float(_ordered_mean(self.local_losses(x)))

    def grad(self, x: Any) -> Array:
        """``∇f(x)``: the worker-order mean of the local gradients."""
        return _ordered_mean(self._held_grads(as_vector(x, self.d)))

    @cached_property
    def _data_digest(self) -> str:
        return self._digest(*(t for g in self._groups for t in (g.X, g.Y)))

    def fingerprint(self) -> str:
        """A digest of everything the problem is a function of (architecture, loss name, shards,
        buffers): equal on the ranks of an MPI job that built the same problem."""
        return self._data_digest

    def __repr__(self) -> str:
        return f"ModuleProblem(n={self.n}, d={self.d}, samples={int(self.sample_counts.sum())}, {self.dtype.name})"


class LocalModuleProblem(_ModuleOracles):
    """The workers ``workers`` of a :class:`ModuleProblem` of ``n`` workers, as one MPI process
    holds them (a :class:`permk.distributed.LocalProblem`): ``shards`` holds only their shards,
    ``sample_counts`` every worker's shard size (the finite-sum methods read them all, and the
    launch check compares them across ranks). ``local_grads(x)`` is the held workers' gradients,
    vmapped together; there is no global ``grad`` or ``loss`` (the MPI record sums ``‖∇f‖²`` over
    the ranks). The other parameters are :class:`ModuleProblem`'s; ``x0`` must be the same on
    every rank (the default, the module's parameters, is when every rank builds the module from
    the same seed).
    """

    def __init__(self, module: nn.Module, loss: Loss, shards: Sequence[tuple[Any, Any]], *, n: int, workers: range,
                 sample_counts: Any, x0: Any = None) -> None:
        n = check_int(n, "n", low=1)
        if not isinstance(workers, range) or workers.step != 1 or len(workers) < 1 or workers.start < 0 or workers.stop > n:
            raise ValueError(f"workers must be a non-empty range of worker indices in range({n}) (permk.distributed.workers_of(n)), got {workers!r}")
        counts = np.asarray(sample_counts)
        if counts.shape != (n,) or counts.dtype.kind not in "iu" or (counts < 1).any():
            raise ValueError(f"sample_counts must be the n = {n} positive shard sizes, got {np.asarray(sample_counts).tolist()[:10]}")
        if len(shards) != len(workers):
            raise ValueError(f"shards must hold the {len(workers)} shards of workers {workers}, got {len(shards)}")
        self.n = n
        self.workers = workers
        self.sample_counts = counts.astype(np.int64)
        super().__init__(module, loss, shards, first=workers.start, x0=x0)
        held = self.sample_counts[workers.start : workers.stop]
        if not np.array_equal(self._counts, held):
            raise ValueError(f"the shards hold {self._counts.tolist()[:10]} samples but sample_counts says {held.tolist()[:10]}")

    def fingerprint(self) -> str:
        """A digest of what every rank shares (architecture, loss name, ``n``, every shard's size,
        buffers); each rank's data is its own."""
        return self._digest()

    def __repr__(self) -> str:
        return f"LocalModuleProblem(n={self.n}, d={self.d}, workers={self.workers}, {self.dtype.name})"


def _ordered_mean(rows: Array) -> Array:
    """``(1/n) Σ_i rows[i]``, summed in worker order from 0."""
    acc = np.zeros(rows.shape[1:])
    for row in rows:
        acc += row
    return acc / rows.shape[0]


def two_layer_network(n: int, *, seed: int = 0, samples: int | None = None, p_hat: float | None = None,
                      dtype: Any = np.float32, data_dir: Any = None, workers: range | None = None) -> ModuleProblem | LocalModuleProblem:
    """The authors' two-layer network task on Fashion-MNIST (``NeuralNetworkFunction`` with
    ``TwoLayerNeuralNet('two_layer_neural_net')`` of their ``function.py``):
    ``Linear(784 → 32)``, sigmoid, ``Linear(32 → 10)``, mean cross-entropy per worker;
    ``d = 784·32 + 32 + 32·10 + 10 = 25,450`` (their ``dim`` for MNIST).

    The images are :func:`permk.problems.datasets.load_fashion_mnist`'s (pixels / 255, as the authors'
    MNIST; the first ``samples`` when given), split into ``n`` shards by
    :func:`permk.problems.datasets.shard_indices` (equal shuffled shards from ``seed``, or the authors'
    heterogeneity ``p_hat``). The initial point is the module's default initialisation, as
    theirs (``get_current_point()`` of a fresh network: PyTorch's ``nn.Linear`` init, weights and
    biases uniform in ``±1/sqrt(fan_in)``); they left torch's generator unseeded, here it is
    seeded with ``seed`` (inside ``torch.random.fork_rng``: the global generator is untouched).
    ``dtype`` is the arithmetic's (float32 as theirs; float64 for exact checks). With
    ``workers`` (``permk.distributed.workers_of(n)``) only those workers' shards are kept: a
    :class:`LocalModuleProblem` for one MPI process.

    >>> p = two_layer_network(4, samples=40)  # doctest: +SKIP
    >>> p.d, p.sample_counts.tolist()  # doctest: +SKIP
    (25450, [10, 10, 10, 10])
    """
    from ..problems.datasets import FASHION_MNIST_CLASSES, load_fashion_mnist, shard_indices

    n = check_int(n, "n", low=1)
    seed = check_seed(seed)
    tdtype = {v: k for k, v in _DTYPES.items()}.get(np.dtype(dtype))
    if tdtype is None:
        raise ValueError(f"dtype must be np.float32 or np.float64, got {dtype!r}")
    data = load_fashion_mnist(data_dir, limit=samples, dtype=dtype)
    parts = shard_indices(data.y.size, n, seed=seed, p_hat=p_hat)
    classes = len(FASHION_MNIST_CLASSES)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(data.X.shape[1], TWO_LAYER_HIDDEN, dtype=tdtype), nn.Sigmoid(),
                            nn.Linear(TWO_LAYER_HIDDEN, classes, dtype=tdtype))
    loss = nn.functional.cross_entropy
    if workers is None:
        return ModuleProblem(net, loss, [(data.X[s], data.y[s]) for s in parts])
    counts = [s.size for s in parts]
    return LocalModuleProblem(net, loss, [(data.X[parts[i]], data.y[parts[i]]) for i in workers], n=n, workers=workers,
                              sample_counts=counts)
