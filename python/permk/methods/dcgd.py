"""Distributed compressed gradient descent: DCGD, with or without fixed shifts, and minibatch
SGD's state (the iterate alone)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from .. import exchanges as ex
from ..compressors import Compressor
from ..theory.method import MethodTheory
from ..theory.steps import Constants, shift_step_class, shifted_dcgd_stepsize, worker_constants
from .base import Method, shift_dtype_option
from .contract import CountedState, MethodParams, RoundInfo, RunParams, message_bits

__all__ = ["DCGDState", "ShiftedDCGDState", "DCGDParams", "DCGDTheory", "DCGD", "ShiftedDCGD", "dcgd", "dcgd_shifted"]

Array = np.ndarray


@dataclass(frozen=True, eq=False)
class DCGDState(CountedState):
    """DCGD's state (and SGD's): the iterate ``x = x^t`` alone."""

    x: Array


@dataclass(frozen=True, eq=False)
class ShiftedDCGDState(DCGDState):
    """The state of DCGD with shifts (``shifts="initial"``): the iterate ``x = x^t``, the shifts
    ``H = [h_i]``, ``h_i = ∇f_i(x^0)``, of the workers this process holds (all ``n`` in
    simulation), stored as the workers store them, and their mean ``h = (1/n) Σ_i h_i``."""

    H: Array = field(kw_only=True)
    h: Array = field(kw_only=True)

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "H": "per_worker", "h": "shared"}


@dataclass(frozen=True)
class DCGDParams(MethodParams):
    """DCGD's parameters: its ``shifts`` (None, or ``"initial"``: ``h_i = ∇f_i(x^0)``)."""

    shifts: str | None
    shift_dtype: str = "float64"


class DCGDTheory(MethodTheory[DCGDParams]):
    """The authors' shifted-DCGD step (:func:`~permk.theory.steps.shifted_dcgd_stepsize`) for
    compressors in PermK's class (AB constants ``A = B ≤ 1``); DCGD without shifts has none."""

    def step(self, compressor: Compressor, n: int, d: int, params: DCGDParams, constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        ab, omega = compressor.ab_constants(n, d), compressor.omega(n, d)
        if params.shifts is None or constants.mu is not None:
            raise ValueError("DCGD has a theory step only with shifts='initial' and pl=False: pass gamma=")
        if ab is None or omega is None or shift_step_class(ab[0], ab[1], n) != "permutation":
            raise ValueError(f"the authors' shifted-DCGD step is for compressors in PermK's class (AB constants "
                             f"A = B <= 1, and ω); {compressor.name} is not: pass gamma=")
        L_mean, L_max = worker_constants(problem, n)
        return shifted_dcgd_stepsize(omega, n, L_mean, L_max), "authors' dcgd_permutation step (algorithm.py:1867-1874)"

    def floats_per_round(self, compressor: Compressor, n: int, d: int, params: DCGDParams) -> float:
        return float(compressor.floats_per_worker(n, d))


class DCGD(Method):
    """Distributed compressed gradient descent with an unbiased compressor.

    ``shifts=None`` (default): ``x^{t+1} = x^t − γ (1/n) Σ_i C_i(∇f_i(x^t))`` with the user's
    ``gamma`` (no theory step). ``shifts="initial"``: the shifts ``h_i = ∇f_i(x^0)`` stay fixed
    (the authors' ``dcgd_permutation``), worker ``i`` sends ``C_i(∇f_i(x^t) − h_i)`` and
    ``x^{t+1} = x^t − γ (h̄ + (1/n) Σ_i C_i(∇f_i(x^t) − h_i))``, ``h̄ = (1/n) Σ_i h_i`` (the
    start's exchange is not counted); each worker stores its ``h_i`` (the shifted exchange with
    fixed shifts), so a round evaluates one gradient per worker, at ``x^t`` (the sent
    coordinates only, where the problem has a coordinate oracle). Its step is the
    authors' (:func:`~permk.theory.steps.shifted_dcgd_stepsize`) for compressors in the class of
    PermK (AB constants ``A = B ≤ 1``); other compressors need ``gamma``."""

    name = "dcgd"
    label = "DCGD"
    state_type = DCGDState
    exchange: ClassVar[ex.Exchange] = ex.compressed_mean
    theory = DCGDTheory()

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   shifts: str | None = None, shift_dtype: Any = None) -> DCGDParams:
        if not compressor.capabilities.unbiased:
            raise ValueError(f"DCGD needs an unbiased compressor; {compressor.name} is biased")
        if shifts not in (None, "initial"):
            raise ValueError(f"shifts must be None or 'initial', got {shifts!r}")
        return DCGDParams(bits=message_bits(compressor, n, d, float_bits), shifts=shifts, shift_dtype=shift_dtype_option(shift_dtype, problem))

    def init(self, x0: Array, backend: Any, compressor: Compressor, params: RunParams[DCGDParams], *, seed: int) -> DCGDState:
        if params.own.shifts == "initial":
            H = np.array(ex.local_grads(backend, x0), dtype=params.own.shift_dtype)
            return ShiftedDCGDState(x=x0, H=H, h=np.array(ex.mean_rows(backend, H), dtype=np.float64), round=0, seed=seed)
        return DCGDState(x=x0, round=0, seed=seed)

    def update(self, state: DCGDState, backend: Any, compressor: Compressor,
               params: RunParams[DCGDParams]) -> tuple[DCGDState, RoundInfo]:
        if params.own.shifts == "initial":
            if not isinstance(state, ShiftedDCGDState):
                raise TypeError(f"a run with shifts='initial' continues a ShiftedDCGDState, got a {type(state).__name__}")
            mean, _ = ex.shifted(backend, compressor, state.H, state.x, alpha=0.0, seed=state.seed, round=state.round)
            step = state.h + mean
        else:
            step = ex.compressed_mean(backend, compressor, state.x, seed=state.seed, round=state.round)
        bits = params.bits.compressed
        x = state.x - params.gamma * step
        return replace(state, x=x, round=state.round + 1, bits=state.bits + bits), RoundInfo(bits)


class ShiftedDCGD(DCGD):
    """:class:`~permk.methods.DCGD` with ``shifts="initial"`` by default, under its own name: the experiments'
    ``METHOD-COMPRESSOR`` (``dcgd_shifted-permk``) selects it. ``permk.dcgd_shifted(...)`` is
    ``permk.dcgd(..., shifts="initial")`` (the same iterates and state), named ``dcgd_shifted``."""

    name = "dcgd_shifted"
    label = "shifted DCGD"
    exchange = ex.shifted

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32,  # type: ignore[override]
                   problem: Any = None, shift_dtype: Any = None) -> DCGDParams:
        return super().parameters(compressor, n, d, float_bits=float_bits, problem=problem, shifts="initial", shift_dtype=shift_dtype)


# The method definitions (callable: they run in the simulator).
dcgd = DCGD()
dcgd_shifted = ShiftedDCGD()
