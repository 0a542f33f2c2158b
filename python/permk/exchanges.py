"""The exchanges a round is made of, each defined once over a transport.

A method (:mod:`permk.methods`) never talks to workers: each round it calls one of these
exchange objects with its backend. The exchange owns the arithmetic and the choice of path;
the transport (:class:`permk.transport.Simulator`, :class:`permk.transport.mpi.MPIBackend`) only
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
* :func:`local_grads`, :func:`local_grads_of`, :func:`mean_rows` — the held workers' gradients
  (all, or some: a round's participants) and the mean of per-worker rows (the methods' initial
  exchanges, SGD's round, DASHA-PP's estimators);
* :func:`minibatch_grads`, :func:`minibatch_grads_pair` — the held workers' minibatch gradients
  from a finite-sum problem's oracle (:class:`permk.FiniteSumProblem`): each process
  evaluates only the workers it holds.

``H`` holds the rows of the workers the backend holds (all ``n`` in the simulator). The new
``H`` is the given one updated in place when the backend handed it out itself (the last
round's), else a copy: a caller's array (a resumed state) is never modified.

Paths, fastest first (``path=`` of a run forces one; the path a run used is in
``params.path``), each a :class:`Path` whose availability is decided in one place
(:func:`available_paths`, from the capabilities of the problem and the compressor):

* ``"rust"`` — the problem has a native kernel (``problem.kernel``, a
  :class:`permk.transport.NativeKernel`) and the compressor's rounds are native
  (:func:`native_rounds`: a compressor with a Rust kernel and a shared plan, or partial
  participation around one): the values of any exchange of the problem's gradients — with
  ``y``, with a shift's term and its update ``h_i += α m_i`` in the same pass — are computed in
  Rust (in the simulator the whole round's mean in one call); without a shared plan, EF21's
  whole worker step;
* ``"fused"`` — the compressor's coordinates are a pure function of ``(seed, round)``
  (``capabilities.shared_plan``) and the problem has the coordinate oracle
  ``local_grad_coords(x, rows, cols)``: only the sent coordinates are evaluated, ``O(d)`` per
  round instead of ``O(nd)``;
* ``"dense"`` — whole local gradients, then the compressor — those of the workers that send in
  the round only (a round's participants, :class:`~permk.Participation`; PermK's
  workers with a block when ``n > d``); without a shared plan (TopK) and
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
from typing import Any, Callable, ClassVar, Iterator

import numpy as np

from ._validate import all_finite
from .compressors import Compressor, Messages, Round
from .transport.base import PATHS, Transport

__all__ = [
    "PATHS",
    "CHUNK_BYTES",
    "Exchange",
    "MeanGrad",
    "CompressedMean",
    "CompressedMeanDiff",
    "Shifted",
    "CompressedMeanRows",
    "ShiftedRows",
    "CompressedExchange",
    "Inputs",
    "Path",
    "Rust",
    "Fused",
    "Dense",
    "mean_grad",
    "compressed_mean",
    "compressed_mean_diff",
    "shifted",
    "error_feedback",
    "compressed_mean_rows",
    "shifted_rows",
    "local_grads",
    "local_grads_of",
    "local_grads_pair_of",
    "minibatch_grads",
    "minibatch_grads_pair",
    "mean_rows",
    "available_paths",
    "native_rounds",
    "choose_path",
]

Array = np.ndarray
#: The dense path without a shared plan hands the compressor the gradients of at most this many
#: bytes of workers at a time (:meth:`Compressor.compress_shifted_rows`: a compressor without a
#: Rust kernel forms their inputs as one array).
CHUNK_BYTES = 1 << 24


def _given_rows(a: Any, m: int, d: int) -> Array:
    """``a`` as float64 rows of ``m`` listed workers (an exchange's given rows), checked."""
    arr = np.asarray(a)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"rows must hold real numbers, got dtype {arr.dtype}")
    if arr.shape != (m, d):
        raise ValueError(f"rows must hold the {m} listed workers' rows of length {d}, got shape {arr.shape}")
    return np.asarray(arr, dtype=np.float64)


def _combine(gx: Array, gy: Array | None, coef: float, h: Array | None, beta: float) -> Array:
    """``(gx − coef·gy) − β·h`` (the terms present), the one order every path uses."""
    with np.errstate(invalid="ignore", over="ignore"):
        return _combine_raw(gx, gy, coef, h, beta)


def _combine_raw(gx: Array, gy: Array | None, coef: float, h: Array | None, beta: float) -> Array:
    """:func:`_combine` under the caller's ``np.errstate``."""
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


# ---------------------------------------------------------------------------------------------
# one exchange's inputs, and the paths that compute its values
# ---------------------------------------------------------------------------------------------
class Inputs:
    """One compressed exchange's inputs: held worker ``i``'s is ``v_i − β h_i`` with
    ``v_i = ∇f_i(x) − coef·∇f_i(y)`` (the terms present) or, for an exchange of given rows
    (``given``), ``v_i = x_i``; ``H`` the held rows ``h_i`` (None: no shift), updated by
    ``h_i += α m_i`` when ``alpha`` is set (``update``). ``active``: the held workers (counted
    from the first held one, increasing) whose inputs the round reads — the others send nothing
    (partial participation, idle workers), so their gradients are never evaluated — or None
    for all; given rows then hold the active workers' rows only."""

    def __init__(self, backend: Transport, x: Array, y: Array | None, coef: float, H: Array | None, beta: float,
                 given: bool, alpha: float | None = None, active: Array | None = None) -> None:
        self.backend, self.x, self.y, self.coef, self.H, self.beta, self.given = backend, x, y, coef, H, beta, given
        self.alpha, self.active = alpha, active
        self._whole: Array | None = None

    @property
    def update(self) -> bool:
        """Whether the round updates the shift rows (``h_i += α m_i``)."""
        return self.alpha is not None and self.alpha != 0.0

    def whole(self) -> Array:
        """Every held worker's input as one ``(workers, d)`` array — the active workers' only,
        ``(len(active), d)``, when ``active`` is set — computed once."""
        if self._whole is None:
            b, act = self.backend, self.active
            H = None if self.H is None else (self.H if act is None else self.H[act])
            if self.given:
                self._whole = _combine(self.x, None, self.coef, H, self.beta)
            elif act is None:
                gy = None if self.y is None else b.local_grads(self.y)
                self._whole = _combine(b.local_grads(self.x), gy, self.coef, H, self.beta)
            elif self.y is None:
                self._whole = _combine(b.local_grads_rows(self.x, act), None, self.coef, H, self.beta)
            else:
                self._whole = _combine(*b.local_grads_rows_pair(self.x, self.y, act), self.coef, H, self.beta)
        return self._whole

    def blocks(self) -> Iterator[tuple[int, int, Array, Array | None]]:
        """The held workers' inputs in blocks of consecutive workers ``(lo, hi, G, H_block)``
        (``lo`` counted from the first held worker; ``G`` valid until the next block is drawn):
        worker ``i``'s input is ``G_i − β h_i``, which the compressor forms
        (:meth:`Compressor.compress_shifted_rows`). Given rows, one block; with ``y``, one block
        ``∇f_i(x) − c·∇f_i(y)`` (the transport keeps the last two points' gradients whole);
        with ``active``, one block whose inactive rows are zeros (their messages are empty);
        otherwise the transport's blocks of gradients (from the problem's
        ``local_grad_blocks`` when it has them: never the whole ``(workers, d)`` array) in
        blocks of at most :data:`CHUNK_BYTES`."""
        backend, H = self.backend, self.H
        m = len(backend.workers)
        if self.active is not None:
            G = np.zeros((m, backend.d))
            act = self.active
            if self.given:
                G[act] = self.x
            elif self.y is None:
                G[act] = backend.local_grads_rows(self.x, act)
            else:
                G[act] = _combine(*backend.local_grads_rows_pair(self.x, self.y, act), self.coef, None, 1.0)
            yield 0, m, G, H
            return
        if self.given:
            yield 0, m, self.x, H
            return
        if self.y is not None:
            yield 0, m, _combine(backend.local_grads(self.x), backend.local_grads(self.y), self.coef, None, 1.0), H
            return
        rows = max(1, CHUNK_BYTES // (8 * backend.d))
        for lo, hi, G in backend.grad_blocks(self.x):
            for a in range(lo, hi, rows):
                b = min(hi, a + rows)
                yield a, b, G[a - lo : b - lo], None if H is None else H[a:b]

    def own_messages(self, compressor: Compressor, seed: int, round: int) -> Iterator[tuple[int, int, Messages | None]] | None:
        """The problem's own messages on ``∇f_i(x) − β h_i`` (``backend.message_blocks``), or
        None: given rows, with ``y``, or with ``active``, the inputs are not the problem's
        gradients at a point for every held worker."""
        if self.given or self.y is not None or self.active is not None:
            return None
        return self.backend.message_blocks(compressor, self.x, self.H, self.beta, seed, round)


def _active_of(r: Round, backend: Transport) -> Array | None:
    """The held workers (counted from the first held one) with a message in round ``r``, or
    None when every held worker has one."""
    ws = backend.workers
    sizes = np.diff(np.asarray(r.offsets())[ws.start : ws.stop + 1])
    if sizes.all():
        return None
    return np.flatnonzero(sizes)


def _senders(compressor: Compressor, backend: Transport, seed: int, round: int) -> Array | None:
    """The held workers (counted from the first held one) that send in a round without a shared
    plan, for a compressor that names them (``participants(n, *, seed, round)``, as
    :class:`~permk.Participation` does), or None (all of them)."""
    who = getattr(compressor, "participants", None)
    if who is None:
        return None
    ws = backend.workers
    p = np.asarray(who(backend.n, seed=seed, round=round), dtype=np.int64)
    held = p[(p >= ws.start) & (p < ws.stop)] - ws.start
    return None if len(held) == len(ws) else held


class Path(abc.ABC):
    """One way to compute a compressed exchange: the values of a shared plan's round
    (:meth:`values`, and :meth:`direct` where the path can also update the shifts, divide and
    write them in the same pass), the messages of a round without a shared plan
    (:meth:`messages`), and whole rounds it computes at once (:meth:`whole`)."""

    name: ClassVar[str]

    def whole(self, inputs: Inputs, compressor: Compressor, seed: int, round: int) -> Array | None:
        """The round's mean at once, or None (the round then runs value by value)."""
        return None

    def direct(self, inputs: Inputs, r: Round, start: int, stop: int, divide: int | None, out: Array | None) -> Array | None:
        """Workers ``start..stop``'s values, the shift rows updated with them (``inputs.update``),
        each ``(v + 0)/divide`` when ``divide`` is given, written into ``out`` when given, in
        one pass; None where the path computes them with :meth:`values` only."""
        return None

    @abc.abstractmethod
    def values(self, inputs: Inputs, r: Round, start: int, stop: int) -> Array:
        """Workers ``start..stop``'s values of round ``r`` in plan order: ``scale_i`` times their
        inputs at their coordinates."""

    def messages(self, exchange: CompressedExchange, inputs: Inputs, compressor: Compressor, seed: int,
                 round: int) -> tuple[Messages, bool]:
        """The held workers' messages of a round without a shared plan, and whether ``H`` was
        updated with them already: the dense path's (see :class:`Dense`)."""
        return DENSE.messages(exchange, inputs, compressor, seed, round)


class Rust(Path):
    """The problem's native kernel computes the values (with the shift's term and its update,
    in one pass), MARINA's whole difference round in one process, or EF21's whole worker step
    (no shared plan)."""

    name = "rust"

    def whole(self, inputs: Inputs, compressor: Compressor, seed: int, round: int) -> Array | None:
        b = inputs.backend
        if not b.local:
            return None
        # nothing travels: the plan, the values (the shifts updated) and their sum in one or two
        # native calls (the same bits)
        if inputs.y is not None and inputs.coef == 1.0 and inputs.H is None and compressor.kernel is not None:
            return b.kernel.compressed_mean_diff(compressor.kernel, inputs.x, inputs.y, seed, round)  # type: ignore[union-attr]
        r = b.plan(compressor, seed, round)
        return b.kernel.round_mean(r, inputs.x, inputs.y, **self._shift(inputs))  # type: ignore[union-attr,no-any-return]

    @staticmethod
    def _shift(inputs: Inputs) -> dict[str, Any]:
        """The native kernel's shift arguments of ``inputs`` (none without ``H``)."""
        if inputs.H is None:
            return {}
        shift: dict[str, Any] = {"H": inputs.H, "row0": inputs.backend.workers.start, "beta": inputs.beta}
        if inputs.y is not None:
            shift["coef"] = inputs.coef
        if inputs.update:
            shift["alpha"] = inputs.alpha
        return shift

    def direct(self, inputs: Inputs, r: Round, start: int, stop: int, divide: int | None, out: Array | None) -> Array | None:
        return inputs.backend.kernel.round_values(r, inputs.x, inputs.y, start, stop, divide=divide, out=out,  # type: ignore[union-attr,no-any-return]
                                                  **self._shift(inputs))

    def values(self, inputs: Inputs, r: Round, start: int, stop: int) -> Array:
        if inputs.update:
            raise RuntimeError("the Rust path updates the shifts in direct(): values() would not")
        return inputs.backend.kernel.round_values(r, inputs.x, inputs.y, start, stop, **self._shift(inputs))  # type: ignore[union-attr,no-any-return]

    def messages(self, exchange: CompressedExchange, inputs: Inputs, compressor: Compressor, seed: int,
                 round: int) -> tuple[Messages, bool]:
        b = inputs.backend
        assert inputs.H is not None  # EF21's exchange: the estimators
        offsets, idx, vals, ok = b.kernel.error_feedback(compressor.kernel, inputs.x, inputs.H, seed, round, b.workers.start)  # type: ignore[union-attr]
        return Messages(offsets, idx, vals if ok else np.full(len(vals), np.nan)), True


class Fused(Path):
    """Only the sent coordinates are evaluated, by the problem's coordinate oracle."""

    name = "fused"

    def values(self, inputs: Inputs, r: Round, start: int, stop: int) -> Array:
        b = inputs.backend
        rows, cols = r.rows(start, stop), r.coords(start, stop)
        gx = b.coords(inputs.x, rows, cols)
        gy = None if inputs.y is None else b.coords(inputs.y, rows, cols)
        h = None if inputs.H is None else inputs.H[rows - b.workers.start, cols]
        with np.errstate(invalid="ignore", over="ignore"):
            return _combine_raw(gx, gy, inputs.coef, h, inputs.beta) * r.scales()[rows]


class Dense(Path):
    """Whole inputs, then the compressor (see the module docstring); with active workers
    (:class:`Inputs`), theirs only."""

    name = "dense"

    def _rows(self, inputs: Inputs, start: int, stop: int) -> Array | None:
        """Workers ``start..stop``'s whole inputs, or None when an input of the round is not
        finite (divergence: the values are NaN)."""
        whole = inputs.whole()
        if not inputs.backend.all_finite(whole):  # a transport may decide not to look
            return None
        ws = inputs.backend.workers
        return whole[start - ws.start : stop - ws.start]

    def direct(self, inputs: Inputs, r: Round, start: int, stop: int, divide: int | None, out: Array | None) -> Array | None:
        if inputs.update or inputs.active is not None:
            return None
        rows = self._rows(inputs, start, stop)
        return None if rows is None else r.gather(rows, start, divide=divide, out=out)

    def values(self, inputs: Inputs, r: Round, start: int, stop: int) -> Array:
        if inputs.active is not None:
            return self._active_values(inputs, r, start, stop)
        rows = self._rows(inputs, start, stop)
        if rows is None:
            return np.full(int(r.offsets()[stop] - r.offsets()[start]), np.nan)
        return r.gather(rows, start)

    @staticmethod
    def _active_values(inputs: Inputs, r: Round, start: int, stop: int) -> Array:
        """The values of workers ``start..stop`` from the active workers' whole gradients or
        given rows (the others have none), each formed at its coordinate only:
        ``scale_i · ((g_ij − coef·g'_ij) − β h_ij)``, the arithmetic of :meth:`Round.gather` on
        :meth:`Inputs.whole`; every value NaN when an active worker's gradient (given row) is
        not finite anywhere (divergence), a shift's non-finite entry reaching the values it is
        sent in (as on the coordinate paths)."""
        b, act = inputs.backend, inputs.active
        assert act is not None
        ws = b.workers
        rows, cols = r.rows(start, stop), r.coords(start, stop)
        if inputs.given:
            gx, gy = inputs.x, None
        elif inputs.y is None:
            gx, gy = b.local_grads_rows(inputs.x, act), None
        else:
            gx, gy = b.local_grads_rows_pair(inputs.x, inputs.y, act)
        if not (all_finite(gx) and (gy is None or all_finite(gy))):
            return np.full(len(rows), np.nan)
        at = np.full(len(ws), -1, dtype=np.int64)
        at[act] = np.arange(len(act))
        k = at[rows - ws.start]
        if (k < 0).any():
            raise ValueError("the round gives values to workers that were not given inputs (not among the active workers)")
        h = None if inputs.H is None else inputs.H[rows - ws.start, cols]
        with np.errstate(invalid="ignore", over="ignore"):
            return _combine_raw(gx[k, cols], None if gy is None else gy[k, cols], inputs.coef, h, inputs.beta) * r.scales()[rows]

    def messages(self, exchange: CompressedExchange, inputs: Inputs, compressor: Compressor, seed: int,
                 round: int) -> tuple[Messages, bool]:
        # each worker's message depends on its own input only: the inputs are formed and
        # compressed one block of workers at a time (from the problem's blocks of gradients when
        # it gives them), never as one (workers, d) array
        backend = inputs.backend
        own = inputs.own_messages(compressor, seed, round)
        blocks = own if own is not None else (
            (lo, hi, compressor.compress_shifted_rows(G, Hb, beta=inputs.beta, start=backend.workers.start + lo, n_workers=backend.n,
                                                      seed=seed, round=round))
            for lo, hi, G, Hb in inputs.blocks())
        pieces: list[tuple[int, int, Messages]] = []
        finite = True
        for lo, hi, got in blocks:
            if finite and got is None:  # divergence: every worker's message from a zero input, NaN values
                finite = False
                pieces = [(a, b, _compress_zeros(compressor, backend, a, b, seed, round)) for a, b, _ in pieces]
            pieces.append((lo, hi, got if finite and got is not None else _compress_zeros(compressor, backend, lo, hi, seed, round)))
        msgs = _concat_messages([m for _, _, m in pieces])
        if not finite:
            msgs = msgs._replace(values=np.full(len(msgs.values), np.nan))
        return msgs, False


RUST, FUSED, DENSE = Rust(), Fused(), Dense()
_BY_NAME: dict[str, Path] = {p.name: p for p in (RUST, FUSED, DENSE)}


def native_rounds(compressor: Compressor) -> bool:
    """Whether the compressor's rounds are the core's (``permk._core.Round``), which the Rust
    path's kernels read: a compressor with a native kernel and a shared plan, or one that says
    so (``native_rounds``: :class:`~permk.Participation` around such a compressor)."""
    return bool(compressor.capabilities.shared_plan and (compressor.kernel is not None or getattr(compressor, "native_rounds", False)))


def available_paths(exchange: Exchange, backend: Transport, compressor: Compressor | None,
                    rows_dtype: Any = None) -> dict[str, str | None]:
    """Every path of :data:`PATHS` for ``exchange`` on ``backend`` with ``compressor``: None where
    it is available, else why not. The one place the paths are decided, from capabilities: the
    dense path always; the fused path for a shared plan (``capabilities.shared_plan``) and a
    problem with the coordinate oracle; the Rust path for a problem with a native kernel and
    either a compressor whose rounds are native (:func:`native_rounds`: any exchange of the
    problem's gradients, shifted or not) or EF21's exchange with a compressor with a native
    kernel and no shared plan, when its rows ``h_i`` are float64 (``rows_dtype``: the dtype of
    a shifted exchange's rows, None for float64; the native kernels update float64 rows, so
    float32 shifts take the fused or dense path). An exchange whose inputs are given (not the
    problem's gradients), or that sends whole gradients, has the dense path alone."""
    if compressor is None or not exchange.reads_oracle:
        reason = "this exchange sends whole gradients" if compressor is None else "this exchange's inputs are given rows, not the problem's gradients"
        return {"rust": reason, "fused": reason, "dense": None}
    shared = compressor.capabilities.shared_plan
    why_rust = []
    if backend.kernel is None:
        why_rust.append("the problem has no native kernel (Quadratic.synthetic has one)")
    if shared and not native_rounds(compressor):
        why_rust.append(f"{compressor.name}'s rounds are not native (no Rust kernel)")
    if not shared and compressor.kernel is None:
        why_rust.append(f"{compressor.name} has no Rust kernel")
    if not shared and not exchange.unit:
        why_rust.append(f"without a shared plan the Rust path runs only EF21's exchange (error_feedback), not {exchange.name}")
    dt = _dtype_name(rows_dtype)
    if exchange.shifts and dt not in (None, "float64"):
        why_rust.append(f"the native kernels update float64 shifts, these are {dt} (shift_dtype)")
    why_fused = []
    if not shared:
        why_fused.append(f"{compressor.name} has no shared plan (capabilities.shared_plan)")
    if not backend.has_coords:
        why_fused.append("the problem has no coordinate oracle local_grad_coords(x, rows, cols)")
    return {"rust": "; ".join(why_rust) or None, "fused": "; ".join(why_fused) or None, "dense": None}


def _dtype_name(dtype: Any) -> str | None:
    """A dtype's name (numpy's, a name, or a tensor's ``torch.float32``: ``"float32"``), or None."""
    if dtype is None:
        return None
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype).rsplit(".", 1)[-1]


def choose_path(forced: str, available: dict[str, str | None], what: str) -> str:
    """The fastest available path, or the forced one (a ValueError saying why it is not
    available for ``what``)."""
    if forced == "auto":
        return next(p for p in PATHS if available.get(p, "") is None)
    why = available.get(forced, "unknown path")
    if why is not None:
        raise ValueError(f"path={forced!r} is not available for {what}: {why}")
    return forced


class Exchange(abc.ABC):
    """One kind of exchange (see the module docstring). ``name`` names it in errors;
    ``reads_oracle`` (its inputs are the problem's gradients), ``shifts`` (it keeps rows ``h_i``)
    and ``unit`` (EF21's form) are what :func:`available_paths` reads of it."""

    name: ClassVar[str]
    reads_oracle: ClassVar[bool] = True
    shifts: ClassVar[bool] = False
    unit: ClassVar[bool] = False

    def path(self, backend: Transport, compressor: Compressor | None = None, rows_dtype: Any = None) -> str:
        """The path this exchange takes on ``backend`` with ``compressor`` (and shift rows of
        ``rows_dtype``: :func:`available_paths`), chosen once per (exchange, compressor, rows'
        dtype) and kept by the backend."""
        key = (self.name, id(compressor), rows_dtype)  # the dtype as given (named only on a miss: every round asks)
        hit = backend.paths.get(key)
        if hit is None or hit[0] is not compressor:
            what = self.name if compressor is None else f"{self.name} with {compressor.name}"
            hit = backend.paths[key] = (compressor, choose_path(backend.forced, available_paths(self, backend, compressor, rows_dtype), what + backend.where))
        return hit[1]  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"permk.exchanges.{self.name}"


class MeanGrad(Exchange):
    """``(1/n) Σ_i ∇f_i(x)``: every worker sends its whole gradient (MARINA's full rounds, GD)."""

    name = "mean_grad"

    def path(self, backend: Transport, compressor: Compressor | None = None, rows_dtype: Any = None) -> str:
        return "dense"  # nothing to choose: whatever path a run forces, full gradients are dense

    def __call__(self, backend: Transport, x: Array) -> Array:
        return backend.mean_grad(x)


class CompressedExchange(Exchange):
    """The arithmetic of the compressed exchanges: worker ``i``'s input
    ``v_i = (∇f_i(x) − coef·∇f_i(y)) − β h_i`` (the terms present; given rows ``v_i`` for an
    exchange of rows), compressed, averaged; with ``alpha`` (not 0) the rows ``h_i + α m_i``
    too."""

    def _mean(self, backend: Transport, compressor: Compressor, x: Array, y: Array | None, coef: float,
              H: Array | None, beta: float, alpha: float | None, seed: int, round: int,
              active: Array | None = None) -> tuple[Array, Array | None]:
        """``(1/n) Σ_i m_i`` and the held rows: ``H + α M`` (``H`` owned) when ``alpha`` is set
        and not 0, else ``H`` as given. ``active``: the held workers whose (given) rows ``x``
        holds (see :class:`Inputs`)."""
        path = _BY_NAME[self.path(backend, compressor, None if H is None else H.dtype)]
        inputs = Inputs(backend, x, y, coef, H, beta, given=not self.reads_oracle, alpha=alpha, active=active)
        if inputs.update:
            assert H is not None
            H = inputs.H = backend.own(H)
        if compressor.capabilities.shared_plan:
            whole = path.whole(inputs, compressor, seed, round)
            if whole is not None:
                return whole, H
            r = backend.plan(compressor, seed, round)
            ws = backend.workers
            if path is DENSE and active is None and not inputs.given:
                inputs.active = _active_of(r, backend)  # evaluate only the workers that send

            def fill(start: int, stop: int, divide: int | None, out: Array | None) -> Array:
                done = path.direct(inputs, r, start, stop, divide, out)
                if done is not None:
                    return done
                vals = path.values(inputs, r, start, stop)
                if inputs.update:  # h_i += α m_i at the worker's coordinates (distinct within a worker)
                    assert H is not None
                    rows, cols = r.rows(start, stop), r.coords(start, stop)
                    with np.errstate(over="ignore", invalid="ignore"):  # float32 rows of a diverging run
                        H[rows - ws.start, cols] += vals if alpha == 1.0 else alpha * vals
                if divide is not None:  # the worker-order sum's term 0 + v, divided by n
                    vals = vals + 0.0
                    vals /= divide
                if out is None:
                    return vals
                out[...] = vals
                return out

            return backend.mean_values(compressor, r, fill), H
        if active is None and not inputs.given:
            inputs.active = _senders(compressor, backend, seed, round)
        msgs, updated = path.messages(self, inputs, compressor, seed, round)
        if inputs.update and not updated:
            assert H is not None
            rows = np.repeat(np.arange(len(backend.workers)), np.diff(msgs.offsets))
            vals = msgs.values if alpha == 1.0 else alpha * msgs.values
            with np.errstate(over="ignore", invalid="ignore"):  # float32 rows of a diverging run
                backend.add_at(H, rows, msgs.indices, vals)
        return backend.mean_pairs(compressor, msgs), H


class CompressedMean(CompressedExchange):
    """``(1/n) Σ_i C_i(∇f_i(x))`` (DCGD)."""

    name = "compressed_mean"

    def __call__(self, backend: Transport, compressor: Compressor, x: Array, *, seed: int, round: int) -> Array:
        return self._mean(backend, compressor, x, None, 1.0, None, 1.0, None, seed, round)[0]


class CompressedMeanDiff(CompressedExchange):
    """``(1/n) Σ_i C_i(∇f_i(x) − ∇f_i(y))`` (MARINA's compressed rounds)."""

    name = "compressed_mean_diff"

    def __call__(self, backend: Transport, compressor: Compressor, x: Array, y: Array, *, seed: int, round: int) -> Array:
        return self._mean(backend, compressor, x, y, 1.0, None, 1.0, None, seed, round)[0]


class Shifted(CompressedExchange):
    """The shifted exchange: worker ``i`` sends ``m_i = C_i(v_i − β h_i)``,
    ``v_i = ∇f_i(x) − c·∇f_i(y)`` (``∇f_i(x)`` without ``y``), and keeps ``h_i + α m_i``;
    the server mirrors it. Returns ``((1/n) Σ_i m_i, H + α M)`` for the held rows ``H``.
    ``alpha=0``: fixed shifts (shifted DCGD, RandDIANA between refreshes), ``H`` returned as
    given, never written.

    :data:`error_feedback` is EF21's form (``β = α = 1``, no ``y``), whose worker step has a
    native kernel for compressors without a shared plan (TopK): the ``"rust"`` path."""

    name = "shifted"
    shifts = True

    def __call__(self, backend: Transport, compressor: Compressor, H: Array, x: Array, y: Array | None = None, *,
                 c: float = 1.0, beta: float = 1.0, alpha: float = 1.0, seed: int, round: int) -> tuple[Array, Array]:
        H = backend.rows_of(H, "H")
        mean, new = self._mean(backend, compressor, x, y, float(c), H, float(beta), float(alpha), seed, round)
        assert new is not None
        return mean, new


class ErrorFeedback(Shifted):
    """EF21's exchange: the shifted exchange with ``β = α = 1`` and no ``y``: worker ``i`` sends
    ``c_i = C_i(∇f_i(x) − g_i)`` and keeps ``g_i + c_i``. Returns ``((1/n) Σ_i c_i, G + C)``."""

    name = "error_feedback"
    unit = True

    def __call__(self, backend: Transport, compressor: Compressor, H: Array, x: Array, y: Array | None = None, *,
                 c: float = 1.0, beta: float = 1.0, alpha: float = 1.0, seed: int, round: int) -> tuple[Array, Array]:
        if y is not None or c != 1.0 or beta != 1.0 or alpha != 1.0:
            raise ValueError("error_feedback is the shifted exchange with beta = alpha = 1 and no y; use permk.exchanges.shifted")
        return super().__call__(backend, compressor, H, x, seed=seed, round=round)


class CompressedMeanRows(CompressedExchange):
    """``(1/n) Σ_i C_i(v_i)`` of the rows ``v_i`` the method computed for the held workers
    (VR-MARINA's ``∇f_{iB}(x⁺) − ∇f_{iB}(x)``). The inputs are given whole: the dense path."""

    name = "compressed_mean_rows"
    reads_oracle = False

    def __call__(self, backend: Transport, compressor: Compressor, rows: Array, *, seed: int, round: int) -> Array:
        return self._mean(backend, compressor, backend.rows_of(rows, "rows"), None, 1.0, None, 1.0, None, seed, round)[0]


class ShiftedRows(CompressedExchange):
    """The shifted exchange of given rows: worker ``i`` sends ``m_i = C_i(v_i − β h_i)`` for the
    row ``v_i`` the method computed (DASHA-PAGE's and DASHA-MVR's ``h_i^{t+1} − (1 − a)h_i^t``)
    and keeps ``h_i + α m_i``; returns ``((1/n) Σ_i m_i, H + α M)``. The dense path. With
    ``workers`` (increasing indices of held workers, from the first held one), ``rows`` holds
    those workers' rows only, and every other held worker must send nothing this round
    (DASHA-PP's participants: the others' rows are never formed)."""

    name = "shifted_rows"
    reads_oracle = False
    shifts = True

    def __call__(self, backend: Transport, compressor: Compressor, H: Array, rows: Array, *,
                 beta: float = 1.0, alpha: float = 1.0, seed: int, round: int, workers: Array | None = None) -> tuple[Array, Array]:
        H = backend.rows_of(H, "H")
        active = None
        if workers is not None:
            active = np.asarray(workers, dtype=np.int64)
            m = len(backend.workers)
            if active.ndim != 1 or (active.size and (active.min() < 0 or active.max() >= m or (np.diff(active) <= 0).any())):
                raise ValueError(f"workers must be increasing indices of the {m} held workers (from the first held one), got {workers!r}")
            rows = _given_rows(rows, len(active), backend.d)
        else:
            rows = backend.rows_of(rows, "rows")
        mean, new = self._mean(backend, compressor, rows, None, 1.0, H, float(beta), float(alpha), seed, round, active=active)
        assert new is not None
        return mean, new


#: The exchange objects the methods call.
mean_grad = MeanGrad()
compressed_mean = CompressedMean()
compressed_mean_diff = CompressedMeanDiff()
shifted = Shifted()
error_feedback = ErrorFeedback()
compressed_mean_rows = CompressedMeanRows()
shifted_rows = ShiftedRows()


def local_grads(backend: Transport, x: Array) -> Array:
    """The held workers' gradients at ``x`` (a method's initial exchange)."""
    return backend.local_grads(x)


def local_grads_of(backend: Transport, x: Array, rows: Array) -> Array:
    """The gradients at ``x`` of the held workers ``rows`` (counted from the first held one,
    increasing), theirs only (a round's participants)."""
    return backend.local_grads_rows(x, rows)


def local_grads_pair_of(backend: Transport, x: Array, y: Array, rows: Array) -> tuple[Array, Array]:
    """:func:`local_grads_of` at ``x`` and ``y`` (the two points of a difference), each worker's
    two gradients one after the other."""
    return backend.local_grads_rows_pair(x, y, rows)


def mean_rows(backend: Transport, rows: Array) -> Array:
    """``(1/n) Σ_i v_i`` over all workers from the held rows (a method's initial exchange)."""
    return backend.mean_rows(rows)


def _minibatch_oracle(backend: Transport, name: str) -> Callable[..., Any]:
    oracle = getattr(getattr(backend, "problem", None), name, None)
    if oracle is None:
        raise TypeError(f"this method needs a finite-sum problem with a minibatch oracle ({name}: "
                        "see permk.FiniteSumProblem)")
    return oracle  # type: ignore[no-any-return]


def minibatch_grads(backend: Transport, x: Array, batch_size: int, *, seed: int, round: int) -> Array:
    """The held workers' minibatch gradients ``∇f_{iB_i}(x)`` (``B_i`` drawn from ``(seed, round, i)``),
    checked as every oracle's answer is (real numbers, one row per held worker)."""
    g = _minibatch_oracle(backend, "minibatch_grads")(x, batch_size, seed=seed, round=round, workers=backend.workers)
    return backend.rows_of(g, "problem.minibatch_grads(x, ...)")


def minibatch_grads_pair(backend: Transport, x: Array, y: Array, batch_size: int, *, seed: int, round: int) -> tuple[Array, Array]:
    """The held workers' ``(∇f_{iB_i}(x), ∇f_{iB_i}(y))`` with the same minibatch at both points,
    checked: a pair of arrays of real numbers, one row per held worker each."""
    what = "problem.minibatch_grads_pair(x, y, ...)"
    got = _minibatch_oracle(backend, "minibatch_grads_pair")(x, y, batch_size, seed=seed, round=round, workers=backend.workers)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise TypeError(f"{what} must return a pair (gradients at x, gradients at y), got {type(got).__name__}"
                        + (f" of {len(got)}" if isinstance(got, (tuple, list)) else ""))
    return backend.rows_of(got[0], what + "[0]"), backend.rows_of(got[1], what + "[1]")
