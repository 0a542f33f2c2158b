"""MARINA and its family: MARINA (with partial participation: PP-MARINA), gradient descent,
VR-MARINA and online stochastic MARINA."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .._core import coin
from .. import exchanges as ex
from .._validate import check_int, check_probability
from ..compressors import Compressor, Identity, PermK, RandK
from ..compressors.participation import check_participation
from ..theory.complexity import MARINA_PERMK, MARINA_RANDK
from ..theory.group import variance_bound
from ..theory.method import MethodTheory
from ..theory.steps import Constants, marina_variance_stepsize
from .base import Method, batch_size_option, participating, sample_counts, sample_smoothness_sq
from .contract import Bits, CountedState, MethodParams, RoundInfo, RunParams
from .driver import RunResult, run

__all__ = ["MarinaState", "MarinaParams", "VRMarinaParams", "StochasticMarinaParams", "MarinaTheory", "VRMarinaTheory",
           "Marina", "GD", "VRMarina", "StochasticMarina", "marina", "gd", "vr_marina", "marina_stochastic"]

Array = np.ndarray


@dataclass(frozen=True, eq=False)
class MarinaState(CountedState):
    """MARINA's state: ``x = x^t``, the estimator ``g = g^t``."""

    x: Array
    g: Array

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "g": "shared"}


@dataclass(frozen=True)
class MarinaParams(MethodParams):
    """MARINA's parameters: the coin's probability ``p``, the AB constants ``A``, ``B`` of the
    messages' compressor, and the participating workers ``participation`` (None: all ``n``)."""

    p: float
    A: float
    B: float
    participation: int | None = None


@dataclass(frozen=True)
class VRMarinaParams(MarinaParams):
    """VR-MARINA's parameters: MARINA's and the minibatch size ``batch_size``."""

    batch_size: int = field(kw_only=True)


@dataclass(frozen=True)
class StochasticMarinaParams(VRMarinaParams):
    """Online stochastic MARINA's: VR-MARINA's and the heads rounds' ``megabatch_size``."""

    megabatch_size: int = field(kw_only=True)


class MarinaTheory(MethodTheory[MarinaParams]):
    """MARINA's step ``γ = 1/M``, ``M = L− + sqrt((1−p)/p · L̂²)`` with the compressor's variance
    bound ``L̂²`` (Theorem "AB": ``(A−B)L+² + B·L±²``; ``GroupPermK``: Theorem "AB_group"); the
    PL step of Theorem "AB-PL" with ``mu``; a worker sends ``p·d + (1 − p)ζ`` floats per round."""

    table_rows = {PermK: MARINA_PERMK, RandK: MARINA_RANDK}

    def step(self, compressor: Compressor, n: int, d: int, params: MarinaParams, constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        bound = variance_bound(participating(compressor, params.participation), n, d, constants, problem=problem)
        gamma = marina_variance_stepsize(constants.L_minus, bound.L_hat_sq, params.p, mu=constants.mu)
        return gamma, bound.theorem if constants.mu is None else bound.pl_theorem

    def floats_per_round(self, compressor: Compressor, n: int, d: int, params: MarinaParams) -> float:
        sent = participating(compressor, params.participation)
        return float(params.p * d + (1 - params.p) * sent.expected_floats_per_worker(n, d))

    def tunable_range(self, compressor: Compressor, n: int, d: int) -> dict[str, tuple[float, float]]:
        return {"p": (1e-3 * min(compressor.expected_floats_per_worker(n, d) / d, 1.0), 1.0)}


class GDTheory(MarinaTheory):
    """Gradient descent's: MARINA's with ``p = 1`` (the step ``1/L−``), nothing to tune."""

    table_rows = {}

    def tunable_range(self, compressor: Compressor, n: int, d: int) -> dict[str, tuple[float, float]]:
        return {}


class VRMarinaTheory(MarinaTheory):
    """VR-MARINA's finite-sum step: MARINA's with ``L̂² + (A + 1/n) ℒ²/b`` (see :class:`~permk.methods.VRMarina`)."""

    table_rows = {}
    label = "VR-MARINA"
    theorem = ("VR-MARINA finite-sum theorem (Gorbunov et al. 2021) with {bound}'s variance and the minibatch term "
               "(A + 1/n)ℒ²/b; the authors' vr_marina step, algorithm.py:467-479")

    def tunable_range(self, compressor: Compressor, n: int, d: int) -> dict[str, tuple[float, float]]:
        return {}

    def step(self, compressor: Compressor, n: int, d: int, params: VRMarinaParams, constants: Constants,  # type: ignore[override]
             problem: Any = None) -> tuple[float, str]:
        if constants.mu is not None:
            raise ValueError(f"{self.label} has no PL step in permk: pass gamma= or pl=False")
        bound = variance_bound(compressor, n, d, constants, problem=problem)
        L_hat_sq = bound.L_hat_sq + (params.A + 1.0 / n) * sample_smoothness_sq(problem, n, self.label) / params.batch_size
        return marina_variance_stepsize(constants.L_minus, L_hat_sq, params.p), self.theorem.format(bound=bound.theorem)


class StochasticMarinaTheory(VRMarinaTheory):
    """Online stochastic MARINA's: VR-MARINA's step with ``b'`` in ``p``."""

    label = "stochastic MARINA"
    theorem = "stochastic MARINA online theorem (Gorbunov et al. 2021): VR-MARINA's step with b' in p"


class Marina(Method):
    """Algorithm "MARINA".

    ``x^{t+1} = x^t − γ g^t``; the shared coin ``θ_t ~ Be(p)`` is a pure function of
    ``(seed, t)``; on heads ``g^{t+1} = (1/n) Σ ∇f_i(x^{t+1})``, on tails
    ``g^{t+1} = g^t + (1/n) Σ C_i(∇f_i(x^{t+1}) − ∇f_i(x^t))``. Needs an unbiased compressor with
    AB constants. Defaults from theory: ``p = ζ/d`` (``ζ`` the expected message size: its bits
    over a full gradient's; MARINA's ``ζ_Q``) and
    ``γ = 1/M``, ``M = L− + sqrt((1−p)/p · L̂²)`` with ``L̂² = (A−B)L+² + B·L±²`` (Theorem "AB";
    with ``pl=True`` Theorem "AB-PL"'s ``min{1/M_PL, p/(2μ)}``), or the compressor's own
    variance bound (``GroupPermK``: Theorem "AB_group"). Options: ``p``; ``participation=s``:
    MARINA with partial participation (PP-MARINA of Gorbunov et al. 2021, the authors'
    ``marina_partial_participation``): the compressed rounds are those of ``s`` of the ``n``
    workers sampled uniformly from ``(seed, t)``, each message counting ``n/s`` times (the
    :class:`permk.Participation` family; the full-gradient rounds are every worker's); its
    ``A``, ``B`` give the step (Theorem "AB", which holds for any unbiased family with AB
    constants; its step is never below PP-MARINA's ``1/(L(1 + sqrt((1−p)(1+ω)/(ps))))``) and
    its expected size ``p``. Only the participants evaluate their gradients in a compressed
    round, at ``x^{t+1}`` and ``x^t`` (they kept nothing from the rounds they sat out: the
    round's ``oracle_calls`` count two full gradients; a full round one).

    >>> import permk
    >>> q = permk.Quadratic.synthetic(n=10, d=100, lam=1e-3, noise_scale=0.0, seed=0)
    >>> res = permk.marina(q, permk.PermK(), rounds=200, seed=1)
    >>> bool(res.grad_norm_sq[-1] < 1e-2 * res.grad_norm_sq[0]), res.params.own.p
    (True, 0.1)
    """

    name = "marina"
    label = "MARINA"
    state_type = MarinaState
    exchange: ClassVar[ex.Exchange] = ex.compressed_mean_diff
    has_coin = True
    theory = MarinaTheory()

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   p: Any = None, participation: Any = None) -> MarinaParams:
        s = None if participation is None else check_participation(participation, n)
        return self._parameters(compressor, n, d, float_bits, p, s)

    def _parameters(self, compressor: Compressor, n: int, d: int, float_bits: int, p: Any, s: int | None,
                    p_cap: float = 1.0, kind: type[MarinaParams] = MarinaParams, **own: Any) -> Any:
        """MARINA's parameters (as ``kind``, with the fields ``own``) for ``s`` participating
        workers, with ``p`` given or ``min(p_cap, ζ/d)``."""
        sent = participating(compressor, s)
        ab = sent.ab_constants(n, d)
        if ab is None or not sent.capabilities.unbiased:
            raise ValueError(f"{self.label} needs an unbiased compressor with AB constants; {sent.name} has none (use ef21 for TopK)")
        tail = float(sent.bits_per_worker(n, d, float_bits=float_bits))
        mean = float(sent.expected_bits_per_worker(n, d, float_bits=float_bits))
        full = float(d * float_bits)
        p = min(p_cap, mean / full) if p is None else check_probability(p)
        bits = Bits(compressed=tail, expected=p * full + (1 - p) * mean, full=full)
        return kind(bits=bits, p=p, A=float(ab[0]), B=float(ab[1]), participation=s, **own)

    def sent_compressor(self, compressor: Compressor, params: MarinaParams) -> Compressor:
        return participating(compressor, params.participation)

    def init(self, x0: Array, backend: Any, compressor: Compressor, params: RunParams[MarinaParams], *, seed: int) -> MarinaState:
        return MarinaState(x=x0, g=np.array(ex.mean_grad(backend, x0), dtype=np.float64), round=0, seed=seed)

    def update(self, state: MarinaState, backend: Any, compressor: Compressor,
               params: RunParams[MarinaParams]) -> tuple[MarinaState, RoundInfo]:
        x = state.x - params.gamma * state.g
        heads = bool(coin(state.seed, state.round, params.own.p))
        calls = None  # one full gradient: at x^{t+1} (∇f_i(x^t) was computed in the round before)
        if heads:
            g, bits = ex.mean_grad(backend, x), params.bits.full
        else:
            g = state.g + ex.compressed_mean_diff(backend, compressor, x, state.x, seed=state.seed, round=state.round)
            bits = params.bits.compressed
            s = params.own.participation
            if s is not None and s < backend.n:  # a participant kept nothing from the rounds it sat out
                calls = 2.0 * params.oracle_full
        return MarinaState(x=x, g=g, round=state.round + 1, seed=state.seed, bits=state.bits + bits), RoundInfo(bits, heads, calls)


class GD(Marina):
    """Gradient descent, the uncompressed baseline: MARINA with ``p = 1`` and no compression
    (every round is a full-gradient round), whose Theorem "AB" step is ``1/L−``. Called without
    a compressor: ``permk.gd(problem, rounds=…, seed=…)``."""

    name = "gd"
    label = "GD"
    exchange = ex.mean_grad
    takes_compressor = False
    theory = GDTheory()

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32,  # type: ignore[override]
                   problem: Any = None) -> MarinaParams:
        if not compressor.capabilities.lossless:
            raise ValueError(f"gd sends full gradients: its compressor must be None or Identity, got {compressor.name} "
                             "(use marina, dcgd or ef21 to compress)")
        return super().parameters(compressor, n, d, float_bits=float_bits, p=1.0)

    def __call__(self, problem: Any, compressor: Compressor | None = None, *, rounds: int, seed: int, **options: Any) -> RunResult:  # type: ignore[override]
        """Run gradient descent in the simulator (``compressor`` must be None or Identity)."""
        return run(self, problem, compressor if compressor is not None else Identity(), rounds=rounds, seed=seed, **options)


class VRMarina(Marina):
    """VR-MARINA, the finite-sum case (Gorbunov et al. 2021, "MARINA: faster non-convex
    distributed learning with compression"), on a finite-sum problem
    (:class:`permk.FiniteSumProblem`).

    ``x^{t+1} = x^t − γ g^t``; on heads of the shared coin ``θ_t ~ Be(p)`` (a pure function of
    ``(seed, t)``) ``g^{t+1} = ∇f(x^{t+1})`` (full gradients, ``m_i`` oracle calls); on tails
    worker ``i`` draws its minibatch ``B_i`` of ``b`` samples from ``(seed, t, i)`` and sends
    ``C_i(∇f_{iB_i}(x^{t+1}) − ∇f_{iB_i}(x^t))`` (the same samples at both points: ``2b`` calls),
    ``g^{t+1} = g^t + (1/n) Σ C_i(·)``. ``p`` defaults to ``min(b/(b + m), ζ/d)`` with ``m`` the
    largest ``m_i`` (the authors' ``_estimate_prob``, algorithm.py:459-465). The step is
    ``1/(L_− + sqrt((1−p)/p · (L̂² + (A + 1/n) ℒ²/b)))``: ``L̂²`` MARINA's variance bound of the
    compressor (Theorem "AB": ``(A − B)L_+² + B L_±²``), ``ℒ² = (1/n) Σ ℒ_i²`` the mean-squared
    sample smoothness (``problem.L_sample_rms``). The compressed minibatch difference ``Δ_B``
    has ``E‖(1/n) Σ C_i(Δ_{iB}) − Δ‖² ≤ A (1/n) Σ E‖Δ_{iB}‖² − B‖Δ‖² + (1/n²) Σ Var Δ_{iB}`` and
    ``Var Δ_{iB} ≤ ℒ_i² ‖x^{t+1} − x^t‖²/b``, hence the term ``(A + 1/n)ℒ²/b``; for independent
    compressors (``A = ω/n``, ``B = 0``, ``L_+ ≤ L̃``) it is the paper's finite-sum step, the
    authors' ``vr_marina`` step (algorithm.py:467-479, which takes ``L̃_max`` for ``ℒ``).
    Options: ``batch_size`` (required), ``p``.
    """

    name = "vr_marina"
    label = "VR-MARINA"
    exchange = ex.compressed_mean_rows
    needs_finite_sum = True
    theory = VRMarinaTheory()

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   batch_size: Any = None, p: Any = None) -> VRMarinaParams:
        b = batch_size_option(batch_size, self.label)
        m = float(sample_counts(problem, self.label, n).max())
        return self._parameters(compressor, n, d, float_bits, p, None, p_cap=b / (b + m), kind=VRMarinaParams, batch_size=b)

    def heads(self, backend: Any, x: Array, params: RunParams[Any], state: MarinaState) -> tuple[Array, float | None]:
        """The estimator on heads and its oracle calls (None: one full gradient)."""
        return ex.mean_grad(backend, x), None

    def update(self, state: MarinaState, backend: Any, compressor: Compressor,
               params: RunParams[VRMarinaParams]) -> tuple[MarinaState, RoundInfo]:  # type: ignore[override]
        x = state.x - params.gamma * state.g
        heads = bool(coin(state.seed, state.round, params.own.p))
        calls: float | None
        if heads:
            g, calls = self.heads(backend, x, params, state)
            bits = params.bits.full
        else:
            b = params.own.batch_size
            gx, gy = ex.minibatch_grads_pair(backend, x, state.x, b, seed=state.seed, round=state.round)
            with np.errstate(invalid="ignore", over="ignore"):
                diff = gx - gy
            g = state.g + ex.compressed_mean_rows(backend, compressor, diff, seed=state.seed, round=state.round)
            bits, calls = params.bits.compressed, 2.0 * b
        return (MarinaState(x=x, g=g, round=state.round + 1, seed=state.seed, bits=state.bits + bits),
                RoundInfo(bits, heads, calls))


class StochasticMarina(VRMarina):
    """Online stochastic MARINA (Gorbunov et al. 2021, "MARINA: faster non-convex distributed
    learning with compression", the online case): :class:`~permk.methods.VRMarina` whose heads rounds send a
    megabatch gradient ``(1/n) Σ ∇f_{iB'_i}(x^{t+1})`` of ``b'`` samples (``megabatch_size``,
    ``b'`` oracle calls) instead of the full gradient. The samples are drawn uniformly with
    replacement from the finite sum (the stochastic oracle). ``p`` defaults to
    ``min(b/(b + b'), ζ/d)``; the step is VR-MARINA's (the paper's online step has the same
    ``(1−p)/(pn) (ω L² + (1 + ω)ℒ²/b)`` term; the authors' ``marina_stochastic``,
    algorithm.py:540-560, takes a given step). The run converges to a neighbourhood of size
    ``O(σ²/(n b'))``. Options: ``batch_size``, ``megabatch_size`` (both required), ``p``.
    """

    name = "marina_stochastic"
    label = "stochastic MARINA"
    theory = StochasticMarinaTheory()

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   batch_size: Any = None, megabatch_size: Any = None, p: Any = None) -> StochasticMarinaParams:
        b = batch_size_option(batch_size, self.label)
        if megabatch_size is None:
            raise TypeError(f"{self.label} needs megabatch_size= (the samples of its heads rounds)")
        big = check_int(megabatch_size, "megabatch_size", low=1)
        sample_counts(problem, self.label, n)
        return self._parameters(compressor, n, d, float_bits, p, None, p_cap=b / (b + big), kind=StochasticMarinaParams,
                                batch_size=b, megabatch_size=big)

    def heads(self, backend: Any, x: Array, params: RunParams[Any], state: MarinaState) -> tuple[Array, float | None]:
        big = params.own.megabatch_size
        rows = ex.minibatch_grads(backend, x, big, seed=state.seed, round=state.round)
        return ex.mean_rows(backend, rows), float(big)


# The method definitions (callable: they run in the simulator).
marina = Marina()
gd = GD()
vr_marina = VRMarina()
marina_stochastic = StochasticMarina()
