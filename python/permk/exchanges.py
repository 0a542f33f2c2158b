"""The exchanges a round is made of, each defined once over a backend's transport.

A method (:mod:`permk.methods`) never talks to workers: each round it calls one of these
exchange objects with its backend. The exchange owns the arithmetic and the choice of path;
the backend (:class:`permk.backends.Simulator`, :class:`permk.distributed.MPIBackend`) only
evaluates the held workers' oracles and moves numbers between them:

* :data:`mean_grad` ``(backend, x)`` — ``(1/n) Σ_i ∇f_i(x)``: every worker sends its gradient;
* :data:`compressed_mean` ``(backend, c, x)`` — ``(1/n) Σ_i C_i(∇f_i(x))``;
* :data:`compressed_mean_diff` ``(backend, c, x, y)`` — ``(1/n) Σ_i C_i(∇f_i(x) − ∇f_i(y))``
  (MARINA's compressed rounds);
* :data:`shifted` ``(backend, C, H, x, y=None, *, c=1, beta=1, alpha=1)`` — worker ``i``
  sends ``m_i = C_i(v_i − β h_i)`` with ``v_i = ∇f_i(x) − c·∇f_i(y)`` (``∇f_i(x)`` without
  ``y``) and keeps ``h_i + α m_i``; the server mirrors it: returns ``((1/n) Σ_i m_i, H + α M)``.
  EF21 is ``β = α = 1`` with a contractive compressor (:data:`error_feedback`, the same class
  restricted to that form), DIANA ``α ≤ 1/(ω+1)``, DASHA ``v_i = ∇f_i(x⁺) − (1−a)∇f_i(x)``,
  ``β = a``;
* :data:`compressed_mean_rows` ``(backend, c, rows)`` — ``(1/n) Σ_i C_i(v_i)`` of rows the
  method computed for the held workers (VR-MARINA's minibatch differences, from
  :func:`minibatch_grads_pair`): the dense path alone, as the inputs are given whole;
  :data:`shifted_rows` ``(backend, c, H, rows, *, beta, alpha)`` the same with the shifted
  exchange's ``h_i`` (DASHA-PAGE, DASHA-MVR);
* :func:`local_grads`, :func:`mean_rows` — the held workers' gradients and the mean of per-worker
  rows (the methods' initial exchanges, SGD's round);
* :func:`minibatch_grads`, :func:`minibatch_grads_pair` — the held workers' minibatch gradients
  from a finite-sum problem's oracle (:class:`permk.problems.FiniteSumProblem`): each process
  evaluates only the workers it holds.

``H`` holds the rows of the workers the backend holds (all ``n`` in the simulator). The new
``H`` is the given one updated in place when the backend handed it out itself (the last
round's), else a copy: a caller's array (a resumed state) is never modified.

Paths, fastest first (``path=`` of a run forces one; the path a run used is in
``params["path"]``):

* ``"rust"`` — the problem has a native kernel (``problem.kernel``) and the compressor one: the
  values, or EF21's whole worker step, are computed in Rust;
* ``"fused"`` — the compressor's coordinates are a pure function of ``(seed, round)``
  (``capabilities.shared_plan``) and the problem has the coordinate oracle
  ``local_grad_coords(x, rows, cols)``: only the sent coordinates are evaluated, ``O(d)`` per
  round instead of ``O(nd)``;
* ``"dense"`` — whole local gradients, then the compressor; without a shared plan (TopK) and
  without ``y``, in blocks of workers when the problem gives its gradients so
  (``local_grad_blocks``), each block handed to :meth:`Compressor.compress_shifted_rows`,
  which forms, checks and compresses each worker's input ``g_i − β h_i`` in turn (in Rust,
  on the core's threads, for the built-in compressors): the same messages as from the whole
  rows (each worker's depends on its own input only). A problem that can compress its own
  workers' inputs (``local_message_blocks``, e.g. the linear autoencoder: each gradient is
  finished and compressed in a worker's buffer, never written) gives the messages itself.

With a shared plan only the values travel: the backend gathers them in worker order and the
round sums them (:meth:`permk.compressors.Round.mean`); otherwise the messages travel as
``(index, value)`` pairs. Every path computes each value as ``scale_i · ((∇f_i(x)_j −
coef·∇f_i(y)_j) − β h_ij)`` and every sum in worker order from 0, so the paths and the backends
agree bit for bit. A non-finite input is never given to the compressor: the messages of zero
inputs are sent with NaN values, so every process sees the divergence in the same round.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, ClassVar, Iterator, Protocol, runtime_checkable

import numpy as np

from ._validate import all_finite
from .compressors import Compressor, Messages, Round

__all__ = [
    "PATHS",
    "Transport",
    "Exchange",
    "MeanGrad",
    "CompressedMean",
    "CompressedMeanDiff",
    "Shifted",
    "mean_grad",
    "compressed_mean",
    "compressed_mean_diff",
    "shifted",
    "error_feedback",
    "CompressedMeanRows",
    "compressed_mean_rows",
    "ShiftedRows",
    "shifted_rows",
    "local_grads",
    "minibatch_grads",
    "minibatch_grads_pair",
    "mean_rows",
    "choose_path",
]

Array = np.ndarray
#: Evaluation paths, fastest first.
PATHS = ("rust", "fused", "dense")
#: The dense path without a shared plan hands the compressor the gradients of at most this many
#: bytes of workers at a time (:meth:`Compressor.compress_shifted_rows`: a compressor without a
#: Rust kernel forms their inputs as one array).
CHUNK_BYTES = 1 << 24
#: ``fill(start, stop, divide, out)``: workers ``start..stop``'s values of a round in plan order
#: (each ``(v + 0)/divide`` when ``divide`` is given), written into ``out`` when given.
Fill = Callable[[int, int, "int | None", "Array | None"], Array]


@runtime_checkable
class Transport(Protocol):
    """What an exchange needs of a backend: the held workers' oracles, and moving numbers.

    ``n``, ``d``, ``workers`` (the held workers, a contiguous range), ``forced`` (the path a
    run forces, or ``"auto"``), ``local`` (True when nothing travels: one process holds every
    worker and counts no bytes), ``kernel`` (the problem's native kernel or None),
    ``has_coords`` (the problem has ``local_grad_coords``)."""

    n: int
    d: int
    workers: range
    forced: str
    local: bool

    @property
    def kernel(self) -> Any: ...
    @property
    def has_coords(self) -> bool: ...
    def path(self, exchange: Exchange, compressor: Compressor | None) -> str: ...
    def local_grads(self, x: Array) -> Array: ...
    def grad_blocks(self, x: Array) -> Iterator[tuple[int, int, Array]]: ...
    def message_blocks(self, compressor: Compressor, x: Array, H: Array | None, beta: float, seed: int,
                       round: int) -> Iterator[tuple[int, int, Messages | None]] | None: ...
    def coords(self, x: Array, rows: Array, cols: Array) -> Array: ...
    def mean_grad(self, x: Array) -> Array: ...
    def mean_rows(self, rows: Array) -> Array: ...
    def plan(self, compressor: Compressor, seed: int, round: int) -> Round: ...
    def mean_values(self, compressor: Compressor, r: Round, fill: Fill) -> Array: ...
    def mean_pairs(self, compressor: Compressor, msgs: Messages) -> Array: ...
    def own(self, H: Array) -> Array: ...


def choose_path(forced: str, available: dict[str, bool], what: str) -> str:
    """The fastest available path, or the forced one (ValueError naming what it needs)."""
    if forced == "auto":
        return next(p for p in PATHS if available.get(p, False))
    if not available.get(forced, False):
        needs = {
            "rust": "a problem with a native kernel (Quadratic.synthetic) and a compressor with a Rust kernel "
                    "(and a shared plan, except for error feedback)",
            "fused": "a compressor with a shared plan (capabilities.shared_plan: PermK, RandK, BlockPermK, ...) and a problem "
                     "with the coordinate oracle local_grad_coords(x, rows, cols)",
        }.get(forced, "")
        raise ValueError(f"path={forced!r} is not available for {what}: it needs {needs}")
    return forced


def _held_rows(a: Any, backend: Transport, what: str) -> Array:
    """``a`` as float64 rows of the held workers (the same array when it already is one), or a
    ValueError naming ``what`` and both shapes."""
    a = np.asarray(a, dtype=np.float64)
    if a.shape != (len(backend.workers), backend.d):
        raise ValueError(f"{what} must hold the {len(backend.workers)} held workers' rows of length {backend.d}, got shape {a.shape}")
    return a


def _combine(gx: Array, gy: Array | None, coef: float, h: Array | None, beta: float) -> Array:
    """``(gx − coef·gy) − β·h`` (the terms present), the one order every path uses."""
    with np.errstate(invalid="ignore", over="ignore"):
        v = gx
        if gy is not None:
            v = v - (gy if coef == 1.0 else coef * gy)
        if h is not None:
            v = v - (h if beta == 1.0 else beta * h)
        return v


def _compress_zeros(compressor: Compressor, backend: Transport, lo: int, hi: int, seed: int, round: int) -> Messages:
    """The messages of held workers ``lo … hi − 1`` with zero inputs (their indices are those
    of a diverged round)."""
    return compressor.compress_rows(np.zeros((hi - lo, backend.d)), start=backend.workers.start + lo, n_workers=backend.n,
                                    seed=seed, round=round)


def _concat_messages(pieces: list[Messages]) -> Messages:
    """Consecutive blocks' messages as one (the offsets shifted)."""
    if len(pieces) == 1:
        return pieces[0]
    ends = np.cumsum([0] + [int(m.offsets[-1]) for m in pieces[:-1]])
    offsets = np.concatenate([pieces[0].offsets[:1]] + [m.offsets[1:] + e for m, e in zip(pieces, ends)])
    return Messages(offsets, np.concatenate([m.indices for m in pieces]), np.concatenate([m.values for m in pieces]))


class Exchange(abc.ABC):
    """One kind of exchange (see the module docstring). ``name`` names it in errors."""

    name: ClassVar[str]

    def path(self, backend: Transport, compressor: Compressor | None = None) -> str:
        """The path this exchange takes on ``backend`` with ``compressor`` (cached by the backend)."""
        return backend.path(self, compressor)

    @abc.abstractmethod
    def available(self, backend: Transport, compressor: Compressor | None) -> dict[str, bool]:
        """The paths this exchange can take on ``backend`` with ``compressor``."""

    def __repr__(self) -> str:
        return f"permk.exchanges.{self.name}"


class MeanGrad(Exchange):
    """``(1/n) Σ_i ∇f_i(x)``: every worker sends its whole gradient (MARINA's full rounds, GD)."""

    name = "mean_grad"

    def available(self, backend: Transport, compressor: Compressor | None) -> dict[str, bool]:
        return {"dense": True}

    def path(self, backend: Transport, compressor: Compressor | None = None) -> str:
        return "dense"  # nothing to choose: whatever path a run forces, full gradients are dense

    def __call__(self, backend: Transport, x: Array) -> Array:
        return backend.mean_grad(x)


class _Compressed(Exchange):
    """The arithmetic of the compressed exchanges: worker ``i``'s input
    ``v_i = (∇f_i(x) − coef·∇f_i(y)) − β h_i`` (the terms present), compressed, averaged; with
    ``alpha`` the rows ``h_i + α m_i`` too."""

    def _rust(self, backend: Transport, compressor: Compressor) -> bool:
        """Whether the Rust path can compute this exchange with ``compressor``."""
        return compressor.capabilities.shared_plan

    def available(self, backend: Transport, compressor: Compressor | None) -> dict[str, bool]:
        assert compressor is not None
        shared = compressor.capabilities.shared_plan
        native = backend.kernel is not None and compressor.kernel is not None
        return {"dense": True, "fused": shared and backend.has_coords, "rust": native and self._rust(backend, compressor)}

    def _inputs(self, backend: Transport, x: Array, y: Array | None, coef: float, H: Array | None, beta: float) -> Array:
        """The held workers' inputs, whole (the dense path)."""
        gy = None if y is None else backend.local_grads(y)
        return _combine(backend.local_grads(x), gy, coef, H, beta)

    def _input_blocks(self, backend: Transport, x: Array, y: Array | None, coef: float,
                      H: Array | None) -> Iterator[tuple[int, int, Array, Array | None]]:
        """The held workers' inputs in blocks of consecutive workers ``(lo, hi, G, H_block)``
        (``lo`` counted from the first held worker; ``G`` valid until the next block is drawn):
        worker ``i``'s input is ``G_i − β h_i``, which the compressor forms
        (:meth:`Compressor.compress_shifted_rows`). Without ``y``, ``G`` are the backend's blocks
        of gradients (from the problem's ``local_grad_blocks`` when it has them: never the whole
        ``(workers, d)`` array) in blocks of at most :data:`CHUNK_BYTES`; with ``y`` one block,
        ``∇f_i(x) − c·∇f_i(y)`` (the backend keeps the last two points' gradients whole)."""
        if y is not None:
            yield 0, len(backend.workers), self._inputs(backend, x, y, coef, None, 1.0), H
            return
        rows = max(1, CHUNK_BYTES // (8 * backend.d))
        for lo, hi, G in backend.grad_blocks(x):
            for a in range(lo, hi, rows):
                b = min(hi, a + rows)
                yield a, b, G[a - lo : b - lo], None if H is None else H[a:b]

    def _own_messages(self, backend: Transport, compressor: Compressor, x: Array, y: Array | None, H: Array | None, beta: float,
                      seed: int, round: int) -> Iterator[tuple[int, int, Messages | None]] | None:
        """The problem's own messages on ``∇f_i(x) − β h_i`` (``backend.message_blocks``), or
        None: with ``y`` the inputs are differences of gradients, not gradients."""
        return None if y is not None else backend.message_blocks(compressor, x, H, beta, seed, round)

    def _message_blocks(self, backend: Transport, compressor: Compressor, x: Array, y: Array | None, coef: float,
                        H: Array | None, beta: float, seed: int, round: int) -> Iterator[tuple[int, int, Messages | None]]:
        """The held workers' messages on their inputs in blocks ``(lo, hi, messages)`` (None: an
        input of the block is not finite): the problem's own (``backend.message_blocks``, without
        ``y``) when it gives them, else :meth:`Compressor.compress_shifted_rows` on
        :meth:`_input_blocks`."""
        own = self._own_messages(backend, compressor, x, y, H, beta, seed, round)
        if own is not None:
            yield from own
            return
        for lo, hi, G, Hb in self._input_blocks(backend, x, y, coef, H):
            yield lo, hi, compressor.compress_shifted_rows(G, Hb, beta=beta, start=backend.workers.start + lo, n_workers=backend.n,
                                                           seed=seed, round=round)

    def _mean(self, backend: Transport, compressor: Compressor, x: Array, y: Array | None, coef: float,
              H: Array | None, beta: float, alpha: float | None, seed: int, round: int) -> tuple[Array, Array | None]:
        """``(1/n) Σ_i m_i`` and, with ``alpha``, the held rows ``H + α M`` (``H`` owned)."""
        path = self.path(backend, compressor)
        ws = backend.workers
        if alpha is not None:
            assert H is not None
            H = backend.own(H)
        if compressor.capabilities.shared_plan:
            r = backend.plan(compressor, seed, round)
            dense = self._inputs(backend, x, y, coef, H, beta) if path == "dense" else None
            dense_finite = dense is None or all_finite(dense)

            def fill(start: int, stop: int, divide: int | None, out: Array | None) -> Array:
                if path == "rust":  # no shift here: see Shifted._rust
                    return backend.kernel.round_values(r, x, y, start, stop, divide=divide, out=out)  # type: ignore[no-any-return]
                if path == "fused":
                    rows, cols = r.rows(start, stop), r.coords(start, stop)
                    gx = backend.coords(x, rows, cols)
                    gy = None if y is None else backend.coords(y, rows, cols)
                    h = None if H is None else H[rows - ws.start, cols]
                    with np.errstate(invalid="ignore", over="ignore"):
                        vals = _combine(gx, gy, coef, h, beta) * r.scales()[rows]
                elif not dense_finite:  # the whole inputs are known: any non-finite one is divergence
                    vals = np.full(int(r.offsets()[stop] - r.offsets()[start]), np.nan)
                else:
                    assert dense is not None
                    if alpha is None:
                        return r.gather(dense[start - ws.start : stop - ws.start], start, divide=divide, out=out)
                    vals = r.gather(dense[start - ws.start : stop - ws.start], start)
                if alpha is not None:  # h_i += α m_i at the worker's coordinates (distinct within a worker)
                    assert H is not None
                    rows, cols = r.rows(start, stop), r.coords(start, stop)
                    H[rows - ws.start, cols] += vals if alpha == 1.0 else alpha * vals
                if divide is not None:  # the worker-order sum's term 0 + v, divided by n
                    vals = vals + 0.0
                    vals /= divide
                if out is None:
                    return vals
                out[...] = vals
                return out

            return backend.mean_values(compressor, r, fill), H
        if path == "rust":  # EF21's worker step in one native call, H updated in place
            offsets, idx, vals, ok = backend.kernel.error_feedback(compressor.kernel, x, H, seed, round, ws.start)
            msgs = Messages(offsets, idx, vals if ok else np.full(len(vals), np.nan))
            return backend.mean_pairs(compressor, msgs), H
        # each worker's message depends on its own input only: the inputs are formed and
        # compressed one block of workers at a time (from the problem's blocks of gradients when
        # it gives them), never as one (workers, d) array
        pieces: list[tuple[int, int, Messages]] = []
        finite = True
        for lo, hi, got in self._message_blocks(backend, compressor, x, y, coef, H, beta, seed, round):
            if finite and got is None:  # divergence: every worker's message from a zero input, NaN values
                finite = False
                pieces = [(a, b, _compress_zeros(compressor, backend, a, b, seed, round)) for a, b, _ in pieces]
            pieces.append((lo, hi, got if finite and got is not None else _compress_zeros(compressor, backend, lo, hi, seed, round)))
        msgs = _concat_messages([m for _, _, m in pieces])
        if not finite:
            msgs = msgs._replace(values=np.full(len(msgs.values), np.nan))
        if alpha is not None:
            assert H is not None
            rows = np.repeat(np.arange(len(ws)), np.diff(msgs.offsets))
            vals = msgs.values if alpha == 1.0 else alpha * msgs.values
            np.add.at(H, (rows, msgs.indices), vals)
        return backend.mean_pairs(compressor, msgs), H


class CompressedMean(_Compressed):
    """``(1/n) Σ_i C_i(∇f_i(x))`` (DCGD)."""

    name = "compressed_mean"

    def __call__(self, backend: Transport, compressor: Compressor, x: Array, *, seed: int, round: int) -> Array:
        return self._mean(backend, compressor, x, None, 1.0, None, 1.0, None, seed, round)[0]


class CompressedMeanDiff(_Compressed):
    """``(1/n) Σ_i C_i(∇f_i(x) − ∇f_i(y))`` (MARINA's compressed rounds)."""

    name = "compressed_mean_diff"

    def __call__(self, backend: Transport, compressor: Compressor, x: Array, y: Array, *, seed: int, round: int) -> Array:
        if backend.local and self.path(backend, compressor) == "rust":
            # nothing travels: the plan, the values and their sum in one native call (the same bits)
            return backend.kernel.compressed_mean_diff(compressor.kernel, x, y, seed, round)  # type: ignore[no-any-return]
        return self._mean(backend, compressor, x, y, 1.0, None, 1.0, None, seed, round)[0]


class Shifted(_Compressed):
    """The shifted exchange: worker ``i`` sends ``m_i = C_i(v_i − β h_i)``,
    ``v_i = ∇f_i(x) − c·∇f_i(y)`` (``∇f_i(x)`` without ``y``), and keeps ``h_i + α m_i``;
    the server mirrors it. Returns ``((1/n) Σ_i m_i, H + α M)`` for the held rows ``H``.

    ``unit=True`` is EF21's form (``β = α = 1``, no ``y``), whose worker step has a native
    kernel for compressors without a shared plan (TopK): the ``"rust"`` path."""

    def __init__(self, *, unit: bool = False) -> None:
        self.unit = unit

    @property
    def name(self) -> str:  # type: ignore[override]
        return "error_feedback" if self.unit else "shifted"

    def _rust(self, backend: Transport, compressor: Compressor) -> bool:
        # shared plans take the fused path (values only travel); the native worker step is EF21's
        return self.unit and not compressor.capabilities.shared_plan

    def __call__(self, backend: Transport, compressor: Compressor, H: Array, x: Array, y: Array | None = None, *,
                 c: float = 1.0, beta: float = 1.0, alpha: float = 1.0, seed: int, round: int) -> tuple[Array, Array]:
        if self.unit and (y is not None or c != 1.0 or beta != 1.0 or alpha != 1.0):
            raise ValueError("error_feedback is the shifted exchange with beta = alpha = 1 and no y; use permk.exchanges.shifted")
        H = _held_rows(H, backend, "H")
        mean, new = self._mean(backend, compressor, x, y, float(c), H, float(beta), float(alpha), seed, round)
        assert new is not None
        return mean, new


class CompressedMeanRows(_Compressed):
    """``(1/n) Σ_i C_i(v_i)`` of the rows ``v_i`` the method computed for the held workers
    (VR-MARINA's ``∇f_{iB}(x⁺) − ∇f_{iB}(x)``). The inputs are given whole: the dense path."""

    name = "compressed_mean_rows"

    def available(self, backend: Transport, compressor: Compressor | None) -> dict[str, bool]:
        return {"dense": True}

    def _inputs(self, backend: Transport, x: Array, y: Array | None, coef: float, H: Array | None, beta: float) -> Array:
        return _combine(x, None, coef, H, beta)  # the given rows (see __call__), less β h_i when shifted

    def _input_blocks(self, backend: Transport, x: Array, y: Array | None, coef: float,
                      H: Array | None) -> Iterator[tuple[int, int, Array, Array | None]]:
        yield 0, len(backend.workers), x, H  # the given rows, less β h_i when shifted (by the compressor)

    def _own_messages(self, backend: Transport, compressor: Compressor, x: Array, y: Array | None, H: Array | None, beta: float,
                      seed: int, round: int) -> Iterator[tuple[int, int, Messages | None]] | None:
        return None  # the inputs are the given rows, not the problem's gradients at a point

    def __call__(self, backend: Transport, compressor: Compressor, rows: Array, *, seed: int, round: int) -> Array:
        return self._mean(backend, compressor, _held_rows(rows, backend, "rows"), None, 1.0, None, 1.0, None, seed, round)[0]


class ShiftedRows(CompressedMeanRows):
    """The shifted exchange of given rows: worker ``i`` sends ``m_i = C_i(v_i − β h_i)`` for the
    row ``v_i`` the method computed (DASHA-PAGE's and DASHA-MVR's ``h_i^{t+1} − (1 − a)h_i^t``)
    and keeps ``h_i + α m_i``; returns ``((1/n) Σ_i m_i, H + α M)``. The dense path."""

    name = "shifted_rows"

    def __call__(self, backend: Transport, compressor: Compressor, H: Array, rows: Array, *,  # type: ignore[override]
                 beta: float = 1.0, alpha: float = 1.0, seed: int, round: int) -> tuple[Array, Array]:
        H = _held_rows(H, backend, "H")
        mean, new = self._mean(backend, compressor, _held_rows(rows, backend, "rows"), None, 1.0, H, float(beta), float(alpha), seed, round)
        assert new is not None
        return mean, new


#: The exchange objects the methods call.
mean_grad = MeanGrad()
compressed_mean = CompressedMean()
compressed_mean_diff = CompressedMeanDiff()
shifted = Shifted()
error_feedback = Shifted(unit=True)
compressed_mean_rows = CompressedMeanRows()
shifted_rows = ShiftedRows()


def local_grads(backend: Transport, x: Array) -> Array:
    """The held workers' gradients at ``x`` (a method's initial exchange)."""
    return backend.local_grads(x)


def mean_rows(backend: Transport, rows: Array) -> Array:
    """``(1/n) Σ_i v_i`` over all workers from the held rows (a method's initial exchange)."""
    return backend.mean_rows(rows)


def _minibatch_oracle(backend: Transport, name: str) -> Callable[..., Any]:
    oracle = getattr(backend.problem, name, None)  # type: ignore[attr-defined]
    if oracle is None:
        raise TypeError(f"this method needs a finite-sum problem with a minibatch oracle ({name}: "
                        "see permk.classification.FiniteSumProblem)")
    return oracle  # type: ignore[no-any-return]


def minibatch_grads(backend: Transport, x: Array, batch_size: int, *, seed: int, round: int) -> Array:
    """The held workers' minibatch gradients ``∇f_{iB_i}(x)`` (``B_i`` drawn from ``(seed, round, i)``)."""
    g = _minibatch_oracle(backend, "minibatch_grads")(x, batch_size, seed=seed, round=round, workers=backend.workers)
    return _held_rows(g, backend, "problem.minibatch_grads(x, ...)")


def minibatch_grads_pair(backend: Transport, x: Array, y: Array, batch_size: int, *, seed: int, round: int) -> tuple[Array, Array]:
    """The held workers' ``(∇f_{iB_i}(x), ∇f_{iB_i}(y))`` with the same minibatch at both points."""
    gx, gy = _minibatch_oracle(backend, "minibatch_grads_pair")(x, y, batch_size, seed=seed, round=round, workers=backend.workers)
    what = "problem.minibatch_grads_pair(x, y, ...)"
    return _held_rows(gx, backend, what), _held_rows(gy, backend, what)
