"""DIANA and RandDIANA: compressed gradient differences against learned or refreshed shifts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .._core import coin
from .. import exchanges as ex
from .._validate import check_probability, check_real
from ..compressors import Compressor
from ..theory.method import MethodTheory
from ..theory.steps import Constants, diana_stepsize, rand_diana_stepsize, shift_step_class, worker_constants
from .base import Method, shift_dtype_option
from .contract import CountedState, MethodParams, RoundInfo, RunParams, message_bits

__all__ = ["DianaState", "RandDianaState", "DianaParams", "RandDianaParams", "DianaTheory", "RandDianaTheory",
           "Diana", "RandDiana", "diana", "rand_diana"]

Array = np.ndarray


@dataclass(frozen=True, eq=False)
class DianaState(CountedState):
    """DIANA's state: ``x = x^t``, ``g = g^t``, the shifts ``H = [h_i^{t+1}]`` of the workers this
    process holds (all ``n`` in simulation) and the server's mirror of their mean ``h``."""

    x: Array
    g: Array
    H: Array
    h: Array

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "g": "shared", "H": "per_worker", "h": "shared"}


@dataclass(frozen=True, eq=False)
class RandDianaState(CountedState):
    """RandDIANA's state: ``x = x^t``, ``g = g^t``, the shifts ``H = [h_i]`` of the workers this
    process holds (all ``n`` in simulation), ``h_i = ∇f_i(y)`` at the last refresh's point
    ``y``, stored as the workers store them, and their mean ``h = (1/n) Σ_i h_i``."""

    x: Array
    g: Array
    H: Array
    h: Array

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "g": "shared", "H": "per_worker", "h": "shared"}


@dataclass(frozen=True)
class DianaParams(MethodParams):
    """DIANA's parameters: the shifts' learning rate ``alpha``, the compressor's ``omega`` and
    AB constants ``A``, ``B`` (None where it states none)."""

    alpha: float
    omega: float | None
    A: float | None
    B: float | None
    shift_dtype: str = "float64"


@dataclass(frozen=True)
class RandDianaParams(MethodParams):
    """RandDIANA's parameters: the probability ``p`` of a refresh of the shifts, their dtype."""

    p: float
    shift_dtype: str = "float64"


class DianaTheory(MethodTheory[DianaParams]):
    """DIANA's nonconvex step :func:`~permk.theory.steps.diana_stepsize`
    ``min{1/(2L_−), α/(2L_+ sqrt(A(2 + α)))}`` (permk's Lyapunov derivation)."""

    def step(self, compressor: Compressor, n: int, d: int, params: DianaParams, constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        if constants.mu is not None:
            raise ValueError("DIANA has no PL step in permk: pass gamma= or pl=False")
        if params.A is None or params.omega is None:
            raise ValueError(f"DIANA's step needs the compressor's ω and AB constants; {compressor.name} states none: pass gamma=")
        gamma = diana_stepsize(params.alpha, params.omega, params.A, constants.L_minus, constants.L_plus)
        return gamma, "DIANA nonconvex theorem (permk's Lyapunov derivation after Horváth et al. 2019, with the AB inequality)"

    def floats_per_round(self, compressor: Compressor, n: int, d: int, params: DianaParams) -> float:
        return float(compressor.expected_floats_per_worker(n, d))


class RandDianaTheory(MethodTheory[RandDianaParams]):
    """The authors' RandDIANA steps (:func:`~permk.theory.steps.rand_diana_stepsize`)."""

    def step(self, compressor: Compressor, n: int, d: int, params: RandDianaParams, constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        ab = compressor.ab_constants(n, d)
        kind = None if ab is None else shift_step_class(ab[0], ab[1], n)
        if kind is None:
            raise ValueError(f"the authors' RandDIANA steps are for AB constants A = B <= 1 (permutation) or A <= (n-1)/n "
                             f"(independent); {compressor.name} has neither: pass gamma=")
        L_mean, L_max = worker_constants(problem, n)
        gamma = rand_diana_stepsize(params.p, L_mean, L_max, constants.L_pm, kind=kind, mu=constants.mu)
        lines = {"permutation": "1762-1775", "independent": "1692-1706"}[kind]
        regime = "" if constants.mu is None else " (strongly convex)"
        return gamma, f"authors' {'rand_diana_permutation' if kind == 'permutation' else 'rand_diana'} step{regime} (algorithm.py:{lines})"

    def floats_per_round(self, compressor: Compressor, n: int, d: int, params: RandDianaParams) -> float:
        return float(compressor.expected_floats_per_worker(n, d) + params.p * d)


class Diana(Method):
    """DIANA (Mishchenko et al., "Distributed learning with compressed gradient differences";
    nonconvex theory: Horváth et al., "Stochastic distributed learning with gradient quantization
    and double-variance reduction").

    ``h_i^0 = ∇f_i(x^0)`` and ``g^0 = ∇f(x^0)`` (the start's exchange is not counted);
    ``x^{t+1} = x^t − γ g^t``; worker ``i`` sends ``m_i = C_i(∇f_i(x^{t+1}) − h_i)``;
    ``g^{t+1} = h̄ + (1/n) Σ m_i`` with ``h̄ = (1/n) Σ h_i``; then ``h_i ← h_i + α m_i`` and the
    server mirrors ``h̄ ← h̄ + α (1/n) Σ m_i``. Needs an unbiased compressor; ``alpha`` defaults
    to ``1/(ω + 1)`` and lies in ``(0, 1]``; ``shift_dtype``: the shifts' dtype (by default the
    problem's: :func:`~permk.methods.base.shift_dtype_option`). The step (:func:`~permk.theory.steps.diana_stepsize`)
    ``min{1/(2L_−), α/(2L_+ sqrt(A(2 + α)))}`` gives
    ``(1/T) Σ_{t<T} E‖∇f(x^t)‖² ≤ 2(f(x^0) − f*)/(γT)`` for ``α ≤ 1/(ω + 1)``.

    >>> import permk
    >>> q = permk.Quadratic.synthetic(n=10, d=100, lam=1e-3, noise_scale=0.0, seed=0)
    >>> res = permk.diana(q, permk.PermK(), rounds=300, seed=1)
    >>> res.params.own.alpha, bool(res.grad_norm_sq[-1] < 1e-2 * res.grad_norm_sq[0])
    (0.1, True)
    """

    name = "diana"
    label = "DIANA"
    state_type = DianaState
    exchange = ex.shifted
    theory = DianaTheory()

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   alpha: Any = None, shift_dtype: Any = None) -> DianaParams:
        if not compressor.capabilities.unbiased:
            raise ValueError(f"DIANA needs an unbiased compressor; {compressor.name} is biased (use ef21 for TopK)")
        omega = compressor.omega(n, d)
        if alpha is None:
            if omega is None:
                raise ValueError(f"{compressor.name} states no ω: pass DIANA's alpha= (in (0, 1])")
            alpha = 1.0 / (omega + 1.0)
        else:
            alpha = check_real(alpha, "alpha", low=0.0, strict=True, high=1.0)
        ab = compressor.ab_constants(n, d)
        return DianaParams(bits=message_bits(compressor, n, d, float_bits), alpha=alpha, omega=omega,
                           A=None if ab is None else float(ab[0]), B=None if ab is None else float(ab[1]),
                           shift_dtype=shift_dtype_option(shift_dtype, problem))

    def init(self, x0: Array, backend: Any, compressor: Compressor, params: RunParams[DianaParams], *, seed: int) -> DianaState:
        H = np.array(ex.local_grads(backend, x0), dtype=params.own.shift_dtype)
        h = np.array(ex.mean_rows(backend, H), dtype=np.float64)
        return DianaState(x=x0, g=h.copy(), H=H, h=h, round=0, seed=seed)

    def update(self, state: DianaState, backend: Any, compressor: Compressor,
               params: RunParams[DianaParams]) -> tuple[DianaState, RoundInfo]:
        alpha = params.own.alpha
        x = state.x - params.gamma * state.g
        mean, H = ex.shifted(backend, compressor, state.H, x, alpha=alpha, seed=state.seed, round=state.round)
        bits = params.bits.compressed
        return DianaState(x=x, g=state.h + mean, H=H, h=state.h + alpha * mean, round=state.round + 1,
                          seed=state.seed, bits=state.bits + bits), RoundInfo(bits)


class RandDiana(Method):
    """RandDIANA: DIANA whose shifts are refreshed, not learned: ``h_i = ∇f_i(y)`` with ``y``
    set to the iterate by a shared coin ``θ_t ~ Be(p)`` (a pure function of ``(seed, t)``).

    ``y = x^0``, ``g^0 = ∇f(x^0)`` (not counted); ``x^{t+1} = x^t − γ g^t``; on heads the workers
    send their full gradients at ``x^t`` and ``y ← x^t``, ``h̄ ← ∇f(x^t)``; every round
    ``g^{t+1} = h̄ + (1/n) Σ C_i(∇f_i(x^{t+1}) − h_i)`` (the order of the authors'
    ``rand_diana``: the message at ``x^{t+1}`` uses the refreshed shifts). Each worker stores its
    shift ``h_i`` (the authors' ``_local_shift``), and ``h̄`` is their mean, so a round evaluates
    one gradient per worker, at ``x^{t+1}`` (the sent coordinates only, where the problem has a
    coordinate oracle); a refresh takes ``∇f_i(x^t)``, which the worker computed in the round
    before (kept: the round's ``oracle_calls`` count one gradient). Needs an unbiased compressor;
    ``p`` defaults to ``ζ/d`` (the expected message over a full gradient, the authors'
    ``_estimate_prob``). The step is the authors' (:func:`~permk.theory.steps.rand_diana_stepsize`):
    their ``rand_diana_permutation`` step for compressors in PermK's class (AB constants
    ``A = B ≤ 1``), their ``rand_diana`` step for ``A ≤ (n − 1)/n`` (independent compressors with
    ``ω + 1 ≤ n``); ``pl=True`` takes their strongly convex step. It reads the workers' ``L_i``.
    """

    name = "rand_diana"
    label = "RandDIANA"
    state_type = RandDianaState
    exchange = ex.shifted
    has_coin = True
    theory = RandDianaTheory()

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   p: Any = None, shift_dtype: Any = None) -> RandDianaParams:
        if not compressor.capabilities.unbiased:
            raise ValueError(f"RandDIANA needs an unbiased compressor; {compressor.name} is biased (use ef21 for TopK)")
        sizes = message_bits(compressor, n, d, float_bits)
        p = min(1.0, sizes.expected / sizes.full) if p is None else check_probability(p)
        return RandDianaParams(bits=sizes._replace(expected=sizes.expected + p * sizes.full), p=p,
                               shift_dtype=shift_dtype_option(shift_dtype, problem))

    @staticmethod
    def shifts(backend: Any, y: Array, dtype: str) -> tuple[Array, Array]:
        """The held workers' shifts ``h_i = ∇f_i(y)`` (stored: a copy in ``dtype``) and their mean
        over all workers."""
        H = np.array(ex.local_grads(backend, y), dtype=dtype)
        return H, np.array(ex.mean_rows(backend, H), dtype=np.float64)

    def init(self, x0: Array, backend: Any, compressor: Compressor, params: RunParams[RandDianaParams], *,
             seed: int) -> RandDianaState:
        H, h = self.shifts(backend, x0, params.own.shift_dtype)
        return RandDianaState(x=x0, g=h.copy(), H=H, h=h, round=0, seed=seed)

    def update(self, state: RandDianaState, backend: Any, compressor: Compressor,
               params: RunParams[RandDianaParams]) -> tuple[RandDianaState, RoundInfo]:
        x = state.x - params.gamma * state.g
        heads = bool(coin(state.seed, state.round, params.own.p))
        bits = params.bits.compressed
        H, h = state.H, state.h
        if heads:
            H, h = self.shifts(backend, state.x, params.own.shift_dtype)
            bits += params.bits.full
        mean, _ = ex.shifted(backend, compressor, H, x, alpha=0.0, seed=state.seed, round=state.round)
        return RandDianaState(x=x, g=h + mean, H=H, h=h, round=state.round + 1, seed=state.seed,
                              bits=state.bits + bits), RoundInfo(bits, heads)


# The method definitions (callable: they run in the simulator).
diana = Diana()
rand_diana = RandDiana()
