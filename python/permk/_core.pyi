"""Type stub of the native module (Rust, PyO3). Private: use the ``permk`` API.

Errors: an invalid argument or non-finite data raises ``ValueError`` naming the argument, a
wrong type ``TypeError``, an array the machine cannot hold ``MemoryError`` (checked before
anything is allocated), a thread pool that cannot start ``RuntimeError``.
"""

from typing import Any, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "__version__",
    "Spec",
    "Round",
    "PendingRound",
    "Tridiagonal",
    "permk_plan_from_permutations",
    "block_plan_from_permutation",
    "coin",
    "permutation",
    "row_dots",
    "autoencoder_split_grads",
    "autoencoder_shifted_messages",
    "numpy_permutation_head",
    "set_num_threads",
    "get_num_threads",
]

__version__: str

_Plan = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]
_Ranges = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]
_Messages = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.floating]]

@final
class Spec:
    """A compressor: a sparsifier followed by an optional quantizer (``C_i ∘ Q_i``).

    ``sparsifier`` names a sparsifier of the core's registry, e.g. ``"identity"``, ``"permk"``
    (``sampler="rebalance"``, the default, or ``"shuffle"``: how a round's owners are drawn,
    the same distribution from different streams; see :class:`permk.PermK`), ``"randk"``
    (``k=``), ``"topk"`` (``k=``), ``"blockpermk"`` (``m=`` or ``labels=``),
    ``"coordinate_sampling"``; ``quantizer`` is ``"none"``, ``"natural"`` or ``"qsgd"``
    (``s=``). ``params`` are ints, floats, lists of ints or strings (``None`` is absent). An
    unknown name raises ValueError listing the known ones; an unknown or invalid parameter
    raises ValueError (TypeError for a wrong kind) naming it.
    """

    def __new__(
        cls, sparsifier: str, *, quantizer: str = "none", **params: int | float | list[int] | str | None
    ) -> Spec: ...
    @property
    def name(self) -> str:
        """The sparsifier's name (``"permk"``, ...)."""
    @property
    def shared_plan(self) -> bool:
        """True when every worker's coordinates are a pure function of ``(seed, round, worker)``
        and its values are ``scale_i * x_j``: no quantizer and not data-dependent (identity,
        permk, randk, blockpermk, coordinate_sampling without quantizer)."""
    def check(self, n: int, d: int) -> None:
        """Raise ValueError unless the spec is defined for ``n`` workers in dimension ``d``."""
    def aggregate(self, a: npt.NDArray[np.floating], seed: int, round: int) -> npt.NDArray[np.floating]:
        """``(1/n) Σ_i C_i(a[i])`` for the ``(n, d)`` float64/float32 array ``a``: summed in
        worker order into zeros, then divided by ``n``."""
    def compress_all(self, a: npt.NDArray[np.floating], seed: int, round: int) -> npt.NDArray[np.floating]:
        """The ``(n, d)`` array of compressed rows ``C_i(a[i])``."""
    def compress(
        self, x: npt.NDArray[np.floating], worker: int, n_workers: int, seed: int, round: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.floating]]:
        """Worker ``worker``'s message ``(indices, values)`` for input ``x`` (``n_workers``
        workers in all), in message order."""
    def compress_rows(self, a: npt.NDArray[np.floating], start: int, n_workers: int, seed: int, round: int) -> _Messages:
        """The messages of workers ``start .. start + m`` whose inputs are the rows of the
        ``(m, d)`` array ``a``, in one call: ``(offsets (m+1,), indices, values)``; worker
        ``start + r`` sends ``indices[offsets[r]:offsets[r+1]]`` with the same slice of
        ``values``. Bit for bit ``compress(a[r], start + r, n_workers, seed, round)``; values
        have ``a``'s dtype. Works for data-dependent compressors (TopK)."""
    def compress_shifted_rows(
        self,
        G: npt.NDArray[np.floating],
        H: npt.NDArray[np.floating] | None,
        beta: float,
        start: int,
        n_workers: int,
        seed: int,
        round: int,
        rows: npt.NDArray[np.int64] | None = None,
    ) -> _Messages | None:
        """The messages of workers ``start .. start + m`` whose inputs are ``G − beta·H`` (``G``
        without ``H``; both ``(m, d)``, one dtype — or ``G`` float64 and ``H`` float32, a float32
        problem's estimators, ``H·beta`` then rounded to float32 first as numpy does; ``G − H``
        when ``beta == 1``, else ``G − H·beta``, in ``G``'s dtype), each formed in a buffer, checked and compressed in one
        pass on the core's threads: bit for bit :meth:`compress_rows` of that array, which is
        never formed. None when an input (or a message) is not finite. With ``rows`` (int64,
        ``m`` values) worker ``r``'s row of ``G`` is ``G[rows[r]]`` (``H`` one row per worker):
        the messages of ``G[rows]``, which is not formed."""
    def plan(self, n: int, d: int, seed: int, round: int) -> _Plan:
        """The round's plan as CSR arrays ``(offsets, coords, scales)``: worker ``i`` sends
        ``coords[offsets[i]:offsets[i+1]]`` scaled by ``scales[i]``. ValueError for a
        data-dependent sparsifier (TopK)."""
    def plan_ranges(self, n: int, d: int, seed: int, round: int) -> _Plan | None:
        """``(starts, stops, scales)`` (int64, int64, float64, each ``(n,)``) when every worker's
        coordinates form one contiguous range ``starts[i]:stops[i]`` (idle workers:
        ``start == stop``), in the order of :meth:`plan`: identity, blockpermk with contiguous
        blocks, permk with ``n >= d`` or ``n = 1``, randk with ``k = 1``, coordinate_sampling
        with ``n = 1`` or ``d = 1``. None otherwise, and for specs without :attr:`shared_plan`.
        ``O(n)`` work."""
    def round(self, n: int, d: int, seed: int, round: int) -> Round:
        """The round's plan computed once, in the sparsifier's compact form (GIL released):
        the same coordinates, order and scales as :meth:`plan` of the same arguments, bit for
        bit. ValueError (naming ``spec``) unless :attr:`shared_plan`; MemoryError before
        allocating when it cannot fit."""
    def round_ahead(self, n: int, d: int, seed: int, round: int) -> PendingRound:
        """Starts computing :meth:`round` on a background thread and returns at once (the
        arguments and the memory are checked here, raising as :meth:`round` does); the plan of
        round ``t + 1`` can so be computed while round ``t`` communicates.
        ``round_ahead(...).wait()`` equals ``round(...)`` exactly."""

@final
class Round:
    """One round's plan of a :class:`Spec` with a shared plan, computed once
    (:meth:`Spec.round` / :meth:`Spec.round_ahead`). It holds the compact form (owner labels,
    block plans, ranges) and the ``n + 1`` offsets, not the CSR arrays; those are built on
    request (:meth:`coords`). Worker ``i``'s values are ``offsets()[i]:offsets()[i+1]`` of the
    round's values concatenated in worker order, at its coordinates in plan order.
    Every method releases the GIL; ``start``/``stop`` must satisfy ``start <= stop <= n``
    (ValueError naming them)."""

    @property
    def n(self) -> int:
        """The number of workers."""
    @property
    def d(self) -> int:
        """The dimension."""
    @property
    def disjoint(self) -> bool:
        """Every coordinate is sent by at most one worker this round (owners: PermK with
        ``d >= n``, coordinate_sampling; block plans with one worker per block; one worker;
        a randk round whose samples happen to be distinct). The aggregate is then placed,
        not summed (:meth:`mean` gives the same bits either way)."""
    def offsets(self) -> npt.NDArray[np.int64]:
        """The ``(n+1,)`` CSR offsets of :meth:`Spec.plan`. ``O(n)`` (``O(d)`` once at
        construction for owners)."""
    def scales(self) -> npt.NDArray[np.float64]:
        """The ``(n,)`` scales of :meth:`Spec.plan`."""
    def coords(self, start: int, stop: int) -> npt.NDArray[np.int64]:
        """The coordinates of workers ``start..stop`` in plan order:
        ``coords[offsets[start]:offsets[stop]]`` of :meth:`Spec.plan`."""
    def rows(self, start: int, stop: int) -> npt.NDArray[np.int64]:
        """The worker of each of those entries: ``np.repeat(np.arange(start, stop),
        np.diff(offsets[start:stop+1]))``."""
    def ranges(self) -> _Ranges | None:
        """``(starts, stops, scales)`` when every worker's coordinates form one contiguous
        range, by the rule of :meth:`Spec.plan_ranges` (whose result this equals), else
        None. ``O(n)``."""
    def gather(
        self, a: npt.NDArray[np.floating], start: int, *, divide: int | None = None, out: npt.NDArray[np.floating] | None = None
    ) -> npt.NDArray[np.floating]:
        """The values of workers ``start .. start + m`` whose inputs are the rows of the
        ``(m, d)`` float64/float32 array ``a`` (any strides), in plan order:
        ``scale_i * a[i - start, j]`` rounded once to ``a``'s dtype, exactly the values every
        aggregation path sums. Non-finite values are passed on, not reported. ValueError
        naming ``a`` for a wrong shape or rows beyond ``n``.

        ``divide=k`` (an int, ``1 <= k <= 2**53``; TypeError for a float or a bool,
        ValueError naming ``divide`` out of range): each value ``v`` becomes ``(v + 0.0) / k``,
        two IEEE operations in ``a``'s dtype in the same pass (no fused multiply-add): bit for
        bit numpy's ``(gather(a, start) + 0.0) / k`` (``+ 0.0`` turns ``-0.0`` into ``+0.0``,
        as the worker-order sum from zero does; a power of two multiplies by its exact
        reciprocal, the same bits). With ``k = n`` these are the terms of :meth:`mean`'s
        average, so a disjoint round's values can be placed straight into the aggregate.

        ``out``: a writeable C-contiguous 1-D array of ``a``'s dtype (float64, or float32 for
        a float32 ``a``) with exactly ``offsets()[start + m] - offsets()[start]`` elements,
        sharing no memory with ``a`` (``np.may_share_memory``'s bounds test): the values are
        written there (every element overwritten, one pass, no allocation) and ``out`` itself
        is returned. TypeError naming ``out`` when it is not a numpy array, ValueError naming
        it for any other mismatch; every argument is checked before anything is written. Large
        outputs are computed on the core's threads (when more than one), chunk by chunk; the
        result never depends on the number of threads."""
    def restricted(self, workers: npt.NDArray[np.int64], factor: float) -> Round:
        """This round restricted to ``workers`` (strictly increasing, each in ``range(n)``;
        ValueError naming ``workers`` otherwise): they keep their coordinates in plan order,
        their scales multiplied by ``factor`` (rounded once), every other worker sends nothing.
        ``factor`` must be positive and finite, and so must each scale it makes (ValueError
        naming ``factor``: NaN, inf, ``<= 0``, or a product that overflows, e.g. ``1e308``
        times a scale of 3). Partial participation's round
        (:class:`permk.compressors.Participation`, ``factor = n/s``): the same plan as its
        ``plan``, ``O(n + values)``."""
    @property
    def max_count(self) -> int:
        """The largest number of values one worker sends this round (``max(diff(offsets()))``,
        ``O(n)``): the slot width of a padded gather (:meth:`place`)."""
    def place(self, recv: npt.NDArray[np.floating], width: int, out: npt.NDArray[np.floating]) -> npt.NDArray[np.floating]:
        """A **disjoint** round's values received in padded slots, placed: worker ``i``'s
        values in plan order are ``recv[i*width : i*width + count_i]`` (the rest of its slot is
        not read) and each is copied to its coordinate in ``out``; coordinates nobody sends
        become 0. Copies only: with values from :meth:`gather` ``(…, divide=n)`` this is
        :meth:`mean` bit for bit (float64) and its float32 counterpart. ``recv``: a
        C-contiguous 1-D float32/float64 array of exactly ``n * width`` values; ``out``: a
        writeable C-contiguous 1-D array of ``recv``'s dtype with ``d`` elements sharing no
        memory with ``recv`` (every element written; ``out`` is returned). ValueError naming
        ``round`` (not disjoint), ``width`` (below :attr:`max_count`, or overflowing), ``recv``
        or ``out``; TypeError for arrays of another kind; all checked before anything is
        written. ``O(d)``, one pass for owners (PermK with ``d >= n``); the GIL released."""
    def mean(self, values: npt.NDArray[np.float64], *, out: npt.NDArray[np.float64] | None = None) -> npt.NDArray[np.float64]:
        """``(1/n) Σ_i C_i(a_i)`` from the values of all ``n`` workers concatenated in worker
        and plan order (``offsets()[n]`` of them, ValueError naming ``values`` otherwise):
        summed in worker order into a zeroed float64 output, then divided by ``n``; bit for
        bit ``np.bincount(coords, weights=values, minlength=d) / n`` (for a disjoint round,
        ``values + 0.0`` placed at the coordinates, then divided by ``n``), and
        :meth:`Spec.aggregate` of ``a`` when ``values = gather(a, 0)`` (float64). Non-finite
        values propagate. ``O(d + values)``; large rounds on the core's threads.

        ``out``: a writeable C-contiguous 1-D float64 array of length ``d`` sharing no memory
        with ``values``: the average is written there (every element overwritten, the same
        bits) and ``out`` itself is returned, without allocating (no page faults of a fresh
        ``(d,)`` array). TypeError naming ``out`` when it is not a numpy array, ValueError
        naming it otherwise, checked before anything is written."""

@final
class PendingRound:
    """A round being computed on a background thread (:meth:`Spec.round_ahead`). Dropped
    without :meth:`wait`, the thread is detached and ends with its computation."""

    def wait(self) -> Round:
        """Joins the computation (GIL released while waiting) and returns its :class:`Round`.
        An error of the computation raises here (RuntimeError for an internal failure, never a
        crash); a second ``wait()`` raises ValueError."""

def permk_plan_from_permutations(n: int, d: int, pi_d: list[int], pi_n: list[int]) -> _Plan:
    """PermK's plan (``d >= n``, general form) from explicit permutations ``pi_d`` of
    ``range(d)`` and ``pi_n`` of ``range(n)`` (exact enumeration)."""

def block_plan_from_permutation(labels: list[int], pi: list[int]) -> _Plan:
    """The block permutation plan from an explicit permutation ``pi`` of the workers;
    ``labels[j]`` is the block of coordinate ``j`` (PermK for ``n > d``: ``range(d)``)."""

def row_dots(x: npt.NDArray[Any], ix: npt.NDArray[np.int64], y: npt.NDArray[Any], iy: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """``out[i] = Σ_t x[ix[i], t] · y[iy[i], t]`` (float64 products and sums, in a fixed order,
    on the core's threads) for two float64 or two float32 C-contiguous matrices with rows of one
    length: the selected rows are read in place."""

def autoencoder_split_grads(
    zwa: npt.NDArray[Any],
    gram: npt.NDArray[Any],
    dec: npt.NDArray[np.float64],
    reg_d: npt.NDArray[np.float64],
    reg_e: npt.NDArray[np.float64],
    cs: npt.NDArray[np.float64],
    rs: npt.NDArray[np.float64],
    out: npt.NDArray[np.float64],
    *,
    on_caller: bool = False,
) -> None:
    """The linear autoencoder's split gradients of a block of ``b`` splits, written into the
    C-contiguous float64 rows ``out`` (``(b, 2 d_f d_e)``): ``out[s, j·d_e + k] = cs[s]·(Σ_l
    dec[j, l]·gram[s, l, k] − zwa[s, k, j]) + rs[s]·reg_d[j, k]`` (the sum over ``l = 0, 1, …``
    in that order) and ``out[s, d_f d_e + k·d_f + j] = cs[s]·zwa[s, d_e + k, j] +
    rs[s]·reg_e[k, j]``, in float64 (float32 inputs converted first), on the core's threads
    (``on_caller``: on the calling thread only, for a caller that runs blocks on threads of its
    own; the same values). ``zwa`` (``(b, 2 d_e, d_f)``: ``[Z_s W_s]ᵀA_s``) and ``gram`` (``(b, d_e, d_e)``:
    ``Z_sᵀZ_s``) are C-contiguous, both float64 or both float32; ``dec`` (``D``, ``(d_f,
    d_e)``), ``reg_d`` (``(d_f, d_e)``), ``reg_e`` (``(d_e, d_f)``), ``cs`` and ``rs`` (``b``
    values) C-contiguous float64."""

def autoencoder_shifted_messages(
    spec: Spec,
    zwa: npt.NDArray[Any],
    gram: npt.NDArray[Any],
    dec: npt.NDArray[np.float64],
    reg_d: npt.NDArray[np.float64],
    reg_e: npt.NDArray[np.float64],
    cs: npt.NDArray[np.float64],
    rs: npt.NDArray[np.float64],
    H: npt.NDArray[np.floating] | None,
    beta: float,
    start: int,
    n_workers: int,
    seed: int,
    round: int,
    *,
    on_caller: bool = False,
) -> _Messages | None:
    """The messages of workers ``start … start + b − 1`` (of ``n_workers``) of ``spec`` on
    the inputs ``g_s − β·h_s``: ``g_s`` the rows :func:`autoencoder_split_grads` writes from
    the same arguments, ``h_s`` the rows of ``H`` (``(b, d)`` float64 or float32 — a float32
    problem's estimators, read as float64, ``h·β`` rounded to float32 first —, rows contiguous; without
    ``H``, ``g_s``). Bit for bit ``spec.compress_shifted_rows`` on those rows, which are never
    written: each is finished, shifted, checked and compressed in a worker's buffer, on the
    core's threads (``on_caller`` as for :func:`autoencoder_split_grads`). None when an input
    is not finite."""

def coin(seed: int, round: int, p: float) -> bool:
    """MARINA's shared Bernoulli(``p``) coin of round ``round``; ``0 <= p <= 1`` (ValueError
    naming ``p`` otherwise, NaN included)."""

def permutation(seed: int, round: int, n: int) -> npt.NDArray[np.int64]:
    """A uniformly random permutation of ``range(n)`` shared by all workers: a pure function
    of ``(seed, round)`` (its own random stream; for the permutation of mappings)."""

def numpy_permutation_head(entropy: list[int], n: int, s: int) -> npt.NDArray[np.int64]:
    """The sorted first ``s`` of ``numpy.random.default_rng(entropy).permutation(n)``, computed
    natively and bit for bit (numpy's SeedSequence, PCG64 and shuffle): partial participation's
    draw of a round's participants. ``s <= n`` (ValueError naming ``s``)."""
def set_num_threads(k: int) -> None:
    """Use ``k`` threads (``1 <= k <= 1024``) for the core's parallel kernels. Results never
    depend on the number of threads."""

def get_num_threads() -> int:
    """The number of threads of the core's parallel kernels."""

@final
class Tridiagonal:
    """The synthetic quadratic's oracles (Algorithm 1): ``f_i(x) = ½ xᵀA_i x − xᵀb_i`` with
    ``A_i = a_i T + c I``, ``T = tridiag(−1, 2, −1)``, ``b_i = beta_i e_1``."""

    def __new__(cls, a: list[float], c: float, beta: list[float]) -> Tridiagonal:
        """``a`` and ``beta`` non-empty, of one length ``n``; ``a``, ``c`` and ``beta``
        finite (ValueError naming the one that is not)."""
    def loss(self, x: npt.NDArray[np.float64]) -> float:
        """``f(x)``."""
    def grad(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """``∇f(x)``."""
    def local_grads(self, x: npt.NDArray[np.float64], start: int = 0, stop: int | None = None) -> npt.NDArray[np.float64]:
        """Rows ``start:stop`` (default all ``n``) of the local gradients ``∇f_i(x)``."""
    def local_grad_coords(
        self, x: npt.NDArray[np.float64], rows: npt.NDArray[np.int64], cols: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float64]:
        """``∇f_{rows[k]}(x)[cols[k]]`` for every ``k``."""
    def compressed_mean_diff(
        self, spec: Spec, x_new: npt.NDArray[np.float64], x_old: npt.NDArray[np.float64], seed: int, round: int
    ) -> npt.NDArray[np.float64]:
        """``(1/n) Σ_i C_i(∇f_i(x_new) − ∇f_i(x_old))`` with the round's plan for the kernel's
        ``n`` workers (``spec`` must have :attr:`Spec.shared_plan`), bit for bit the aggregate
        of the local gradient differences in worker order. ``(d,)``."""
    def error_feedback(
        self,
        spec: Spec,
        x: npt.NDArray[np.float64],
        G: npt.NDArray[np.float64],
        seed: int,
        round: int,
        start: int = 0,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64], bool]:
        """EF21's worker step for workers ``start .. start + m``: ``G`` (C-contiguous writeable
        float64 ``(m, d)``) holds their estimators ``g_i``. Worker ``i`` computes
        ``r_i = ∇f_i(x) − G_i`` row by row, sends ``c_i = C_i(r_i)`` (the spec's plan for the
        kernel's ``n`` workers) and sets ``G_i += c_i`` in place. Returns the messages
        ``(offsets (m+1,), indices, values)`` in worker order and ``finite``; when a residual
        is not finite, ``finite`` is False, the messages are empty and ``G`` is unchanged."""
    def dasha_pp_values(
        self,
        round: Round,
        x_new: npt.NDArray[np.float64],
        x_old: npt.NDArray[np.float64],
        start: int,
        stop: int,
        *,
        H: npt.NDArray[np.float64],
        G: npt.NDArray[np.float64],
        rows: npt.NDArray[np.int64],
        row0: int = 0,
        coef: float,
        beta: float,
        b: float,
        p: float,
        w: float,
        divide: int | None = None,
        out: npt.NDArray[np.float64] | None = None,
    ) -> npt.NDArray[np.float64]:
        """DASHA-PP's round for workers ``start..stop`` (:func:`permk.dasha` with ``participation``): each
        participant (``rows``: strictly increasing indices of the held rows of ``H`` and ``G``,
        worker ``row0 + r``) reads ``new = ∇f_i(x_new)`` and ``old = ∇f_i(x_old)`` (each
        coordinate formed where it is read, from ``T x`` and ``c x`` at both points), sends its
        values of ``round``, ``((new_j − coef·old_j) − beta·G_ij)·scale_i`` with ``G_ij +=`` each
        (:meth:`round_values` with ``alpha=1``), then updates its
        estimators: ``dh = ((new − old) − (H_r − old)·b)/p``, ``H_r += dh``, ``G_r += w·dh``
        (``H``, ``G``: distinct writeable C-contiguous float64 ``(m, d)`` arrays, in place).
        ``p`` in ``(0, 1]``; ``coef``, ``beta``, ``b`` and ``w`` finite (ValueError naming
        each).
        Bit for bit the dense path's steps on :meth:`local_grads_rows`; every worker of
        ``start..stop`` with values must be a participant; every argument is checked before
        anything is written. ``divide`` and ``out`` as in :meth:`round_values`."""
    def local_grads_rows(self, x: npt.NDArray[np.float64], rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """The local gradients of the workers ``rows`` (each in ``range(n)``), one row each in
        that order: those rows of :meth:`local_grads`, bit for bit."""
    def round_values(
        self,
        round: Round,
        x: npt.NDArray[np.float64],
        y: npt.NDArray[np.float64] | None,
        start: int,
        stop: int,
        *,
        coef: float = 1.0,
        H: npt.NDArray[np.float64] | None = None,
        row0: int = 0,
        beta: float = 1.0,
        alpha: float | None = None,
        divide: int | None = None,
        out: npt.NDArray[np.float64] | None = None,
    ) -> npt.NDArray[np.float64]:
        """The values of workers ``start..stop`` of ``round`` (whose ``n`` must be the
        problem's) in plan order: ``scale_i * (∇f_i(x)_j − ∇f_i(y)_j)``, each gradient
        coordinate computed exactly as :meth:`local_grad_coords`, the difference first, then
        one multiplication by the scale: bit for bit ``(local_grad_coords(x, rows, cols) −
        local_grad_coords(y, rows, cols)) * scales[rows]`` with ``rows, cols =
        round.rows(start, stop), round.coords(start, stop)``. ``y`` None:
        ``scale_i * ∇f_i(x)_j``. ``x`` and ``y`` have length ``round.d`` (ValueError naming
        them).

        With a shift ``H`` (float64 ``(m, d)``: the rows of workers ``row0 .. row0 + m``,
        which must hold ``start..stop``; ValueError naming ``H`` otherwise): ``scale_i ·
        ((∇f_i(x)_j − coef·∇f_i(y)_j) − beta·H[i − row0, j])``, each operation in that order
        (the shifted exchange's, :mod:`permk.exchanges`); ``coef``, ``beta``, ``row0`` and
        ``alpha`` need ``H`` (ValueError); ``coef``, ``beta`` and ``alpha`` must be finite
        (ValueError naming each, before ``H`` or ``out`` is written). ``alpha``: then ``H[i − row0, j] += alpha·v`` for
        every value ``v`` (before ``divide``), in place (``H`` writeable and C-ordered or not),
        in one sequential pass; each worker's coordinates are distinct, so every entry is
        updated at most once.

        ``divide`` and ``out`` as in :meth:`Round.gather` (float64 only; ``out`` must not
        share memory with ``x``, ``y`` or ``H``): one pass computes, scales, optionally takes
        ``(v + 0.0) / k`` and writes; bit for bit ``(round_values(...) + 0.0) / k``."""
    def round_mean(
        self,
        round: Round,
        x: npt.NDArray[np.float64],
        y: npt.NDArray[np.float64] | None,
        *,
        coef: float = 1.0,
        H: npt.NDArray[np.float64] | None = None,
        row0: int = 0,
        beta: float = 1.0,
        alpha: float | None = None,
    ) -> npt.NDArray[np.float64]:
        """``round.mean(round_values(round, x, y, 0, n, ...))`` in one call (the shift's
        options as there; with ``alpha`` ``H`` is updated in place): the whole round's
        average in the simulator, the same bits. ``(d,)``."""
    def solve_mean(self, rhs: list[float]) -> npt.NDArray[np.float64]:
        """Solves ``((1/n) Σ A_i) x = rhs`` in ``O(d)`` (Thomas algorithm, no pivoting).
        ValueError naming ``rhs`` when it is empty or not finite; ValueError when the mean
        matrix ``ā T + c I`` has a zero pivot (it is singular, e.g. ``ā = c = 0``, or
        indefinite with a singular leading block) or the solution overflows."""
