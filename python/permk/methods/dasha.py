"""DASHA and its family: DASHA (with partial participation: DASHA-PP), DASHA-PAGE and
DASHA-MVR."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, cast

import numpy as np

from .._core import coin
from .. import exchanges as ex
from .._validate import check_probability, check_real
from ..compressors import Compressor
from ..compressors.participation import check_participation, participants
from ..theory.method import MethodTheory
from ..theory.steps import (
    Constants,
    dasha_momentum,
    dasha_mvr_stepsize,
    dasha_page_stepsize,
    dasha_pp_stepsize,
    dasha_stepsize,
)
from .base import METHODS, Method, batch_size_option, participating, sample_counts, sample_smoothness_sq, shift_dtype_option
from .contract import CountedState, MethodParams, RoundInfo, RunParams, State, message_bits

__all__ = ["DashaState", "DashaPPState", "DashaVRState", "DashaParams", "DashaPageParams", "DashaMVRParams",
           "DashaTheory", "DashaPageTheory", "DashaMVRTheory", "Dasha", "DashaPage", "DashaMVR", "dasha", "dasha_page",
           "dasha_mvr"]

Array = np.ndarray


@dataclass(frozen=True, eq=False)
class DashaState(CountedState):
    """DASHA's state: ``x = x^t``, ``g = g^t = (1/n) Σ g_i^t`` and the estimators
    ``G = [g_i^t]`` of the workers this process holds (all ``n`` in simulation); ``h_i^t`` is
    ``∇f_i(x^t)`` itself, nothing to keep (see :class:`Dasha`)."""

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "g": "shared", "G": "per_worker"}

    x: Array
    g: Array
    G: Array


@dataclass(frozen=True, eq=False)
class DashaPPState(DashaState):
    """DASHA-PP's state: DASHA's, with ``H = [h_i^t]`` of the held workers and the rows
    ``G = [g_i^t + w h_i^t]`` the round's shifted exchange starts from, ``w = h_weight =
    (b − a)/a`` (see :class:`Dasha`)."""

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "g": "shared", "G": "per_worker", "H": "per_worker"}

    H: Array = field(kw_only=True)
    h_weight: float = field(kw_only=True)


@dataclass(frozen=True, eq=False)
class DashaVRState(DashaState):
    """DASHA-PAGE's and DASHA-MVR's state: DASHA's, with the workers' gradient estimators
    ``H = [h_i^t]`` (the rows this process holds)."""

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "g": "shared", "G": "per_worker", "H": "per_worker"}

    H: Array = field(kw_only=True)


@dataclass(frozen=True)
class DashaParams(MethodParams):
    """DASHA's parameters: the compressor's ``omega`` and AB constant ``A``, the momentum ``a``;
    with partial participation the participating workers ``participation`` and DASHA-PP's ``b``."""

    omega: float
    A: float
    a: float
    participation: int | None = None
    b: float | None = None
    shift_dtype: str = "float64"

    @property
    def h_weight(self) -> float:
        """``(b − a)/a``: the weight of ``h_i`` in DASHA-PP's rows ``G``."""
        assert self.b is not None
        return (self.b - self.a) / self.a


@dataclass(frozen=True)
class DashaPageParams(DashaParams):
    """DASHA-PAGE's parameters: DASHA's, the minibatch size ``batch_size`` and the coin's ``p``."""

    batch_size: int = field(kw_only=True)
    p: float = field(kw_only=True)


@dataclass(frozen=True)
class DashaMVRParams(DashaParams):
    """DASHA-MVR's parameters: DASHA's, the minibatch size ``batch_size`` and the ``momentum`` β."""

    batch_size: int = field(kw_only=True)
    momentum: float = field(kw_only=True)


class DashaTheory(MethodTheory[DashaParams]):
    """DASHA's step (:func:`~permk.theory.steps.dasha_stepsize`, "DASHA theorem") and DASHA-PP's
    (:func:`~permk.theory.steps.dasha_pp_stepsize`); a worker sends one compressed message a
    round (with partial participation, ``s/n`` of one on average)."""

    def step(self, compressor: Compressor, n: int, d: int, params: DashaParams, constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        if constants.mu is not None:
            raise ValueError("DASHA has no PL step in permk: pass gamma= (or leave pl=False)")
        s = params.participation
        if s is None:
            return dasha_stepsize(params.omega, params.A, constants.L_minus, constants.L_plus), "DASHA theorem"
        return dasha_pp_stepsize(params.omega, params.A, n, s, constants.L_minus, constants.L_plus), "DASHA-PP theorem"

    def floats_per_round(self, compressor: Compressor, n: int, d: int, params: DashaParams) -> float:
        return float(participating(compressor, params.participation).expected_floats_per_worker(n, d))


class DashaPageTheory(DashaTheory):
    """permk's derivation of DASHA-PAGE's step (docs/dasha_steps.md,
    :func:`~permk.theory.steps.dasha_page_stepsize`), for ``a ≤ 1/(2ω + 1)``."""

    label = "DASHA-PAGE"

    def step(self, compressor: Compressor, n: int, d: int, params: DashaParams, constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        if constants.mu is not None:
            raise ValueError(f"{self.label} has no PL step in permk: pass gamma= (or leave pl=False)")
        if params.a > 1.0 / (2.0 * params.omega + 1.0) * (1 + 1e-12):
            raise ValueError(f"{self.label}'s step is derived for a <= 1/(2ω + 1) = {1 / (2 * params.omega + 1):g}, "
                             f"got a = {params.a:g}: pass gamma=")
        gamma = self.stepsize(params, n, constants, sample_smoothness_sq(problem, n, self.label))
        return gamma, "permk's derivation (docs/dasha_steps.md)"

    def stepsize(self, params: Any, n: int, constants: Constants, L_sample_sq: float) -> float:
        """The derived step from the run's parameters, ``L_−``, ``L_+`` and ``ℒ²``."""
        return dasha_page_stepsize(params.omega, params.A, params.a, constants.L_minus, constants.L_plus,
                                   L_sample_sq, n, params.batch_size, params.p)


class DashaMVRTheory(DashaPageTheory):
    """permk's derivation of DASHA-MVR's step (:func:`~permk.theory.steps.dasha_mvr_stepsize`)."""

    label = "DASHA-MVR"

    def stepsize(self, params: Any, n: int, constants: Constants, L_sample_sq: float) -> float:
        return dasha_mvr_stepsize(params.omega, params.A, params.a, constants.L_minus, constants.L_plus,
                                  L_sample_sq, n, params.batch_size, params.momentum)


class Dasha(Method):
    """DASHA (Tyurin & Richtárik 2022, "DASHA: Distributed nonconvex optimization with
    communication compression, optimal oracle complexity, and no client synchronization") in the
    gradient setting, and with ``participation=s`` its partial-participation form DASHA-PP
    (Tyurin & Richtárik 2022, "A computation and communication efficient method for distributed
    nonconvex problems in the partial participation setting").

    DASHA (the authors' ``zero_marina``): ``g_i⁰ = ∇f_i(x⁰)``, ``g⁰ = (1/n) Σ g_i⁰``;
    ``x^{t+1} = x^t − γ g^t``; worker ``i`` sends
    ``m_i = C_i(∇f_i(x^{t+1}) − ∇f_i(x^t) − a(g_i^t − ∇f_i(x^t)))`` and keeps
    ``g_i^{t+1} = g_i^t + m_i``; ``g^{t+1} = g^t + (1/n) Σ m_i``: the shifted exchange with
    ``v_i = ∇f_i(x^{t+1}) − (1 − a)∇f_i(x^t)`` and ``β = a``. Defaults ``a = 1/(2ω + 1)`` and the
    step of :func:`~permk.theory.steps.dasha_stepsize` (``params.gamma_source``:
    ``"DASHA theorem"``); it needs an unbiased compressor with ``ω`` and AB constants.

    DASHA-PP (the authors' ``zero_marina_partial_participation``): ``s`` of the ``n`` workers,
    sampled uniformly from ``(seed, t)`` (:func:`permk.compressors.participation.participants`),
    participate; ``p_a = s/n``, ``a = p_a/(2ω + 1)``, ``b = p_a/(2 − p_a)``, ``h_i⁰ = g_i⁰ =
    ∇f_i(x⁰)``. A participant computes ``k_i = ∇f_i(x^{t+1}) − ∇f_i(x^t) − b(h_i^t −
    ∇f_i(x^t))``, sends ``m_i = (1/p_a) C_i(k_i − a(g_i^t − h_i^t))`` and keeps
    ``h_i^{t+1} = h_i^t + k_i/p_a``, ``g_i^{t+1} = g_i^t + m_i``; the others send nothing and
    keep ``h_i``, ``g_i``; ``g^{t+1} = g^t + (1/n) Σ m_i``. (The authors compress
    ``(1/p_a)(k_i − …)``: the same for the positively homogeneous sparsifiers.) The message is
    the :class:`permk.Participation` family's shifted exchange with
    ``v_i = ∇f_i(x^{t+1}) − (1 − b)∇f_i(x^t)`` and ``β = a`` from the rows
    ``G_i = g_i + ((b − a)/a) h_i``, whose ``a G_i = a g_i + (b − a) h_i`` is the whole shift;
    ``G`` then follows ``g_i`` and ``h_i``. Step: :func:`~permk.theory.steps.dasha_pp_stepsize`
    (``"DASHA-PP theorem"``).

    Options: ``a`` (in ``(0, 1]``; the steps are the theorems' for their default ``a``),
    ``participation`` (``s`` in ``1..n``) and ``shift_dtype`` (the per-worker rows' dtype, by
    default the problem's: :func:`~permk.methods.base.shift_dtype_option`). The start's full gradients are not counted in the bits.

    ``estimator="page"`` or ``"mvr"`` (with ``batch_size=b`` and their options) runs
    :class:`~permk.methods.DashaPage` or :class:`~permk.methods.DashaMVR`, the same run as
    ``permk.dasha_page`` or ``permk.dasha_mvr``; ``"gradient"`` (the default) is DASHA itself
    (:meth:`~permk.methods.Dasha.resolve`).
    """

    name = "dasha"
    label = "DASHA"
    state_type: ClassVar[type[State]] = DashaState
    exchange: ClassVar[ex.Exchange] = ex.shifted
    theory = DashaTheory()
    #: The ``estimator`` option's values besides ``"gradient"`` (DASHA itself): the method each
    #: runs, by its catalog name (DASHA's workers' gradients as PAGE or momentum estimators).
    estimator_methods: ClassVar[Mapping[str, str]] = {"page": "dasha_page", "mvr": "dasha_mvr"}

    def resolve(self, options: dict[str, Any]) -> tuple[Method, dict[str, Any]]:
        if not self.estimator_methods:
            return super().resolve(options)
        rest = dict(options)
        estimator = rest.pop("estimator", "gradient")
        if estimator == "gradient" and rest.get("participation") is not None and type(self) is Dasha:
            method: Method = dasha_pp  # DASHA-PP's round (the same method, its own update)
        elif estimator == "gradient":
            method = self  # this object, whatever its class: a subclass runs its own overrides
        elif isinstance(estimator, str) and estimator in self.estimator_methods:
            method = METHODS.builtins()[self.estimator_methods[estimator]]
        else:
            choices = ", ".join(map(repr, ["gradient", *self.estimator_methods]))
            raise ValueError(f"estimator must be one of {choices}, got {estimator!r}")
        if "batch_size" in rest and not method.needs_finite_sum:
            raise ValueError(f"batch_size is an option of the stochastic estimators: pass estimator='page' or 'mvr' "
                             f"with it (estimator={estimator!r} computes full gradients)")
        return method, rest

    def _own(self, compressor: Compressor, n: int, d: int, a: Any, s: int | None, shift_dtype: Any = None,
             problem: Any = None) -> dict[str, Any]:
        """DASHA's own fields (``omega``, ``A``, ``a``; with ``s`` participants ``participation`` and ``b``)."""
        if not compressor.capabilities.unbiased:
            raise ValueError(f"DASHA needs an unbiased compressor; {compressor.name} is biased (use ef21 for TopK)")
        omega, ab = compressor.omega(n, d), compressor.ab_constants(n, d)
        if omega is None or ab is None:
            raise ValueError(f"DASHA needs a compressor with omega and AB constants; {compressor.name} states none")
        p_a = 1.0 if s is None else s / n
        if a is None:
            a = dasha_momentum(omega, p_a)
        else:
            a = check_real(a, "a")
            if not 0.0 < a <= 1.0:
                raise ValueError(f"a must be in (0, 1], got {a}")
        return {"omega": float(omega), "A": float(ab[0]), "a": a, "participation": s, "b": None if s is None else p_a / (2 - p_a),
                "shift_dtype": shift_dtype_option(shift_dtype, problem)}

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   a: Any = None, participation: Any = None, shift_dtype: Any = None) -> DashaParams:
        s = None if participation is None else check_participation(participation, n)
        own = self._own(compressor, n, d, a, s, shift_dtype, problem)
        return DashaParams(bits=message_bits(participating(compressor, s), n, d, float_bits), **own)

    def sent_compressor(self, compressor: Compressor, params: DashaParams) -> Compressor:
        return participating(compressor, params.participation)

    def init(self, x0: Array, backend: Any, compressor: Compressor, params: RunParams[DashaParams], *, seed: int) -> DashaState:
        grads = np.array(ex.local_grads(backend, x0), dtype=params.own.shift_dtype)
        g = np.array(ex.mean_rows(backend, grads), dtype=np.float64)
        if params.own.participation is None:
            return DashaState(x=x0, g=g, G=grads, round=0, seed=seed)
        w = params.own.h_weight
        return DashaPPState(x=x0, g=g, G=grads + w * grads, H=grads, h_weight=w, round=0, seed=seed)

    def _check_state(self, state: DashaState, params: RunParams[DashaParams]) -> None:
        pp = isinstance(state, DashaPPState)
        if pp != (params.own.participation is not None) or (pp and cast(DashaPPState, state).h_weight != params.own.h_weight):
            raise ValueError("the state does not fit the run: a DashaState continues a run without participation, "
                             "a DashaPPState one with the same participation and a")

    def update(self, state: DashaState, backend: Any, compressor: Compressor,
               params: RunParams[DashaParams]) -> tuple[DashaState, RoundInfo]:
        if params.own.participation is not None:
            return dasha_pp.update(state, backend, compressor, params)
        self._check_state(state, params)
        a, t = params.own.a, state.round
        x = state.x - params.gamma * state.g
        bits = params.bits.compressed
        mean, G = ex.shifted(backend, compressor, state.G, x, state.x, c=1 - a, beta=a, seed=state.seed, round=t)
        return DashaState(x=x, g=state.g + mean, G=G, round=t + 1, seed=state.seed, bits=state.bits + bits), RoundInfo(bits)


class DashaPP(Dasha):
    """DASHA-PP's round (:class:`Dasha` with ``participation=s``; ``permk.dasha(…,
    participation=s)`` runs it): only the round's participants evaluate their gradients, whole,
    at ``x^{t+1}`` and ``x^t`` (their estimators ``h_i`` need both; a participant kept nothing
    from the rounds it sat out: two full gradients, the round's ``oracle_calls``), form their
    messages from them (the shifted exchange of given rows, the dense path: the rows are
    whole anyway) and update ``h_i`` and the rows ``G``; the others compute nothing. The
    participants' rows are processed in chunks of :attr:`CHUNK_BYTES` per array, which stay in
    cache (the same values).

    On a problem whose native kernel has DASHA-PP's round (``kernel.dasha_pp_values``: the
    synthetic quadratic's, :class:`permk._core.Tridiagonal`), with a compressor whose rounds are
    native, the round takes the ``"rust"`` path: one native call gives the participants'
    values of the round's plan (the shifted exchange's kernel,
    ``v_i = ∇f_i(x^{t+1}) − (1 − b)∇f_i(x^t)``, ``β = a``) to the transport's aggregation
    (``backend.mean_values``, as every shared-plan exchange does), then updates each
    participant's ``h_i`` and ``G_i`` in one pass that forms its two gradients where it reads
    them (from ``T x`` and ``c x`` at both points, shared by all participants): the same bits,
    no per-participant arrays formed, the round's work the ``O(sd)`` the estimators' update
    needs."""

    exchange = ex.shifted_rows
    #: The bytes of one array's chunk of participants' rows.
    CHUNK_BYTES = 1 << 18

    def path(self, backend: Any, compressor: Compressor, own: Any) -> str:
        """``"rust"`` where the problem's kernel has the estimator step and the shifted exchange
        takes the Rust path (float64 rows), else the given rows' path (``"dense"``); a forced
        path that is neither is refused with the reason."""
        if hasattr(backend.kernel, "dasha_pp_values") and backend.forced in ("auto", "rust"):
            if ex.shifted.path(backend, compressor, own.shift_dtype) == "rust":
                return "rust"
        return super().path(backend, compressor, own)

    def update(self, state: DashaState, backend: Any, compressor: Compressor,
               params: RunParams[DashaParams]) -> tuple[DashaState, RoundInfo]:
        self._check_state(state, params)
        prev = cast(DashaPPState, state)
        s, t, n, ws = cast(int, params.own.participation), prev.round, backend.n, backend.workers
        x = prev.x - params.gamma * prev.g
        bits = params.bits.compressed
        who = participants(n, s, seed=prev.seed, round=t)
        P = who[(who >= ws.start) & (who < ws.stop)] - ws.start  # the held participants, from the first held worker
        step = (params.own.a, cast(float, params.own.b), s / n, prev.h_weight)
        round_of = self._native_round if params.path == "rust" else self._dense_round
        with np.errstate(invalid="ignore", over="ignore"):
            mean, G, H = round_of(prev, x, P, backend, compressor, *step)
        calls = 2.0 * params.oracle_full if s < n else None  # with s = n every worker kept ∇f_i(x^t)
        return DashaPPState(x=x, g=prev.g + mean, G=G, H=H, h_weight=prev.h_weight, round=t + 1, seed=prev.seed,
                            bits=prev.bits + bits), RoundInfo(bits, None, calls)

    @staticmethod
    def _native_round(prev: DashaPPState, x: Array, P: Array, backend: Any, compressor: Compressor,
                      a: float, b: float, p: float, w: float) -> tuple[Array, Array, Array]:
        """The round's mean and the new ``G``, ``H`` on the ``"rust"`` path: the steps of
        :meth:`_dense_round`, in their order, bit for bit, in one native call (the participants'
        values with ``G_i += m_i``, then one pass per participant, its two gradients formed where
        they are read: ``h_i += dh`` and ``G_i += w dh``)."""
        r = backend.plan(compressor, prev.seed, prev.round)
        G, H, kernel, row0 = backend.own(prev.G), backend.own(prev.H), backend.kernel, backend.workers.start

        def fill(start: int, stop: int, divide: int | None, out: Array | None) -> Array:
            return kernel.dasha_pp_values(r, x, prev.x, start, stop, H=H, G=G, rows=P, row0=row0, coef=1 - b,  # type: ignore[no-any-return]
                                          beta=a, b=b, p=p, w=w, divide=divide, out=out)

        return backend.mean_values(compressor, r, fill), G, H

    def _dense_round(self, prev: DashaPPState, x: Array, P: Array, backend: Any, compressor: Compressor,
                     a: float, b: float, p: float, w: float) -> tuple[Array, Array, Array]:
        """The round's mean and the new ``G``, ``H`` from the participants' whole gradients.

        The participants in chunks of rows that stay in cache: their two gradients, the message
        rows ``v = ∇f_i(x⁺) − (1 − b)∇f_i(x)``, and ``h_i += dh`` with
        ``dh = ((∇f_i(x⁺) − ∇f_i(x)) − b(h_i − ∇f_i(x))) / p`` (``dh`` kept for ``G``, which the
        exchange reads first)."""
        H = backend.own(prev.H)
        v, dH = np.empty((len(P), backend.d)), np.empty((len(P), backend.d))
        step = max(1, self.CHUNK_BYTES // (8 * backend.d))
        for lo in range(0, len(P), step):
            Pc = P[lo : lo + step]
            new, old = ex.local_grads_pair_of(backend, x, prev.x, Pc)
            np.subtract(new, (1 - b) * old, out=v[lo : lo + len(Pc)])
            hp = H[Pc]
            bh = hp - old
            bh *= b
            dh = dH[lo : lo + len(Pc)]
            np.subtract(new, old, out=dh)  # (new may be the transport's kept array: not written)
            dh -= bh
            dh /= p
            hp += dh
            H[Pc] = hp
        mean, G = ex.shifted_rows(backend, compressor, prev.G, v, workers=P, beta=a, seed=prev.seed, round=prev.round)
        for lo in range(0, len(P), step):
            Pc = P[lo : lo + step]
            dh = dH[lo : lo + len(Pc)]
            dh *= w
            gp = G[Pc]
            gp += dh
            G[Pc] = gp
        return mean, G, H


class DashaPage(Dasha):
    """DASHA-PAGE (Tyurin & Richtárik 2022, "DASHA: Distributed nonconvex optimization with
    communication compression, optimal oracle complexity, and no client synchronization"; the
    authors' ``zero_marina_page``) on a finite-sum problem: DASHA whose workers' gradients are
    PAGE estimators ``h_i``. ``h_i⁰ = g_i⁰ = ∇f_i(x⁰)``; ``x^{t+1} = x^t − γ g^t``; on heads of a
    shared coin ``Be(p)`` of ``(seed, t)`` (the authors' default, one coin for all workers)
    ``h_i^{t+1} = ∇f_i(x^{t+1})`` (``m_i`` oracle calls), else ``h_i^{t+1} = h_i^t +
    ∇f_{iB}(x^{t+1}) − ∇f_{iB}(x^t)`` (``b`` samples from ``(seed, t, i)``, ``2b`` calls); worker
    ``i`` sends ``m_i = C_i(h_i^{t+1} − h_i^t − a(g_i^t − h_i^t))``, keeps ``g_i + m_i``;
    ``g^{t+1} = g^t + (1/n) Σ m_i``. Defaults: ``a = 1/(2ω + 1)`` (the authors'
    ``_estimate_momentum``, algorithm.py:864-865) and ``p = b/(b + m)`` (their ``_estimate_prob``,
    algorithm.py:1066-1068; ``m`` the largest ``m_i``). The step is permk's derivation
    (docs/dasha_steps.md, :func:`~permk.theory.steps.dasha_page_stepsize`): ``1/(L_− + sqrt K)``,
    ``K = 4AW(1 + p)L_+² + 12AW(1 − p)ℒ²/b + 2(1 − p)ℒ²/(p n b)``, ``W = 1/a + 2ω``, ``A`` the
    compressor's AB constant and ``ℒ²`` the mean-squared sample smoothness
    (``problem.L_sample_rms``), for ``a ≤ 1/(2ω + 1)``; it gives
    ``(1/T) Σ_{t<T} E‖∇f(x^t)‖² ≤ 2(f(x⁰) − f*)/(γT)``. (The authors' code takes the step as
    given: ``zero_marina_page_master``, algorithm.py:1030-1075 at bd3f2e6, and
    mysteryresearcher/dasha's algorithm.py:918-957; ``gamma=`` overrides.) Options:
    ``batch_size`` (required), ``p``, ``a``. Every round sends one compressed message.
    ``permk.dasha(…, estimator="page")`` is the same run.
    """

    name = "dasha_page"
    label = "DASHA-PAGE"
    estimator_methods = {}
    state_type = DashaVRState
    exchange = ex.shifted_rows
    has_coin = True
    needs_finite_sum = True
    theory = DashaPageTheory()

    def _sampling(self, problem: Any, batch_size: Any, n: int) -> tuple[int, float]:
        """The minibatch size ``b`` and the largest sample count ``m`` (checked)."""
        b = batch_size_option(batch_size, self.label)
        return b, float(sample_counts(problem, self.label, n).max())

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   batch_size: Any = None, a: Any = None, p: Any = None, shift_dtype: Any = None) -> DashaPageParams:
        b, m = self._sampling(problem, batch_size, n)
        own = self._own(compressor, n, d, a, None, shift_dtype, problem)
        return DashaPageParams(bits=message_bits(compressor, n, d, float_bits), **own, batch_size=b,
                               p=b / (b + m) if p is None else check_probability(p))

    def init(self, x0: Array, backend: Any, compressor: Compressor, params: RunParams[Any], *, seed: int) -> DashaVRState:
        grads = np.array(ex.local_grads(backend, x0), dtype=params.own.shift_dtype)
        g = np.array(ex.mean_rows(backend, grads), dtype=np.float64)
        return DashaVRState(x=x0, g=g, G=grads, H=grads.copy(), round=0, seed=seed)

    def estimators(self, state: DashaVRState, x: Array, backend: Any, params: RunParams[Any]) -> tuple[Array, bool | None, float | None]:
        """``h_i^{t+1}`` of the held workers, the round's coin and its oracle calls (None: one full gradient)."""
        if coin(state.seed, state.round, params.own.p):
            return ex.local_grads(backend, x), True, None
        b = params.own.batch_size
        gx, gy = ex.minibatch_grads_pair(backend, x, state.x, b, seed=state.seed, round=state.round)
        with np.errstate(invalid="ignore", over="ignore"):
            return state.H + (gx - gy), False, 2.0 * b

    def update(self, state: DashaVRState, backend: Any, compressor: Compressor,  # type: ignore[override]
               params: RunParams[Any]) -> tuple[DashaVRState, RoundInfo]:
        if not isinstance(state, DashaVRState):
            raise TypeError(f"{self.label} continues a DashaVRState, got a {type(state).__name__}")
        a = params.own.a
        x = state.x - params.gamma * state.g
        H, coin, calls = self.estimators(state, x, backend, params)
        H = np.asarray(H, dtype=params.own.shift_dtype)  # as the worker keeps it
        with np.errstate(invalid="ignore", over="ignore"):
            v = H - (1 - a) * state.H
        mean, G = ex.shifted_rows(backend, compressor, state.G, v, beta=a, seed=state.seed, round=state.round)
        bits = params.bits.compressed
        return (DashaVRState(x=x, g=state.g + mean, G=G, H=H, round=state.round + 1, seed=state.seed,
                             bits=state.bits + bits), RoundInfo(bits, coin, calls))


class DashaMVR(DashaPage):
    """DASHA-MVR (Tyurin & Richtárik 2022, "DASHA: Distributed nonconvex optimization with
    communication compression, optimal oracle complexity, and no client synchronization"; the
    authors' ``zero_marina_stochastic``): DASHA whose workers' gradients are momentum
    (MVR/STORM) estimators, ``h_i^{t+1} = ∇f_{iB}(x^{t+1}) + (1 − β)(h_i^t − ∇f_{iB}(x^t))``
    (the same ``b`` samples from ``(seed, t, i)`` at both points, ``2b`` calls), with
    ``h_i⁰ = g_i⁰ = ∇f_i(x⁰)`` (the authors start from a megabatch; the start is not counted);
    the message and ``a = 1/(2ω + 1)`` as in :class:`~permk.methods.DashaPage`. ``momentum`` (``β`` in
    ``(0, 1]``, the authors' ``noise_momentum``) is required, as in their code (their LibSVM
    experiments set ``min(1/B, 1/(ω sqrt(B)))`` from a megabatch size ``B``,
    mysteryresearcher/dasha's experiments/zero_marina/config_libsvm_zero_marina.py:81). The
    step is permk's derivation (docs/dasha_steps.md,
    :func:`~permk.theory.steps.dasha_mvr_stepsize`): ``1/(L_− + sqrt K)``,
    ``K = 8AW L_+² + 8AW(1 + 2β)(1 − β)²ℒ²/b + 4(1 − β)²ℒ²/(β n b)`` with :class:`~permk.methods.DashaPage`'s
    ``W``, ``A`` and ``ℒ²``; it gives ``(1/T) Σ_{t<T} E‖∇f(x^t)‖² ≤ 2(f(x⁰) − f*)/(γT) + 2N``,
    ``N = 4AW(1 + 2β)β²σ²/b + 2βσ²/(n b)`` (:func:`~permk.theory.steps.dasha_mvr_noise`; ``σ²``
    the mean over workers of a sample gradient's variance, which the problems do not state).
    (The authors' ``zero_marina_stochastic_master``, algorithm.py:978-1000 at bd3f2e6, and
    mysteryresearcher/dasha's algorithm.py:866-888, take ``gamma`` as given; ``gamma=``
    overrides.) Options: ``batch_size``, ``momentum`` (required), ``a``. ``permk.dasha(…,
    estimator="mvr")`` is the same run.
    """

    name = "dasha_mvr"
    label = "DASHA-MVR"
    has_coin = False
    theory = DashaMVRTheory()

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   batch_size: Any = None, a: Any = None, momentum: Any = None, shift_dtype: Any = None) -> DashaMVRParams:  # type: ignore[override]
        if momentum is None:
            raise TypeError(f"{self.label} needs momentum= (β in (0, 1]: h_i ← ∇f_iB(x⁺) + (1 − β)(h_i − ∇f_iB(x)))")
        beta = check_real(momentum, "momentum", low=0.0, strict=True, high=1.0)
        b, _ = self._sampling(problem, batch_size, n)
        own = self._own(compressor, n, d, a, None, shift_dtype, problem)
        return DashaMVRParams(bits=message_bits(compressor, n, d, float_bits), **own, batch_size=b, momentum=beta)

    def estimators(self, state: DashaVRState, x: Array, backend: Any, params: RunParams[Any]) -> tuple[Array, bool | None, float | None]:
        b = params.own.batch_size
        gx, gy = ex.minibatch_grads_pair(backend, x, state.x, b, seed=state.seed, round=state.round)
        with np.errstate(invalid="ignore", over="ignore"):
            return gx + (1 - params.own.momentum) * (state.H - gy), None, 2.0 * b


# The method definitions (callable: they run in the simulator).
dasha = Dasha()
#: DASHA-PP's round: what ``dasha`` resolves to with ``participation`` (not in the catalog:
#: the run is ``dasha``'s).
dasha_pp = DashaPP()
dasha_page = DashaPage()
dasha_mvr = DashaMVR()
