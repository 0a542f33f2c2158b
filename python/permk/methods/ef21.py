"""EF21: error feedback with a contractive compressor (TopK)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .. import exchanges as ex
from .._validate import check_choice, check_flag
from ..compressors import Compressor, TopK
from ..theory.complexity import EF21_TOPK
from ..theory.method import MethodTheory
from ..theory.steps import Constants, ef21_stepsize
from .base import Method, shift_dtype_option
from .contract import CountedState, MethodParams, RoundInfo, RunParams, message_bits

__all__ = ["EF21State", "EF21Params", "EF21Theory", "EF21", "ef21"]

Array = np.ndarray


@dataclass(frozen=True, eq=False)
class EF21State(CountedState):
    """EF21's state: ``x = x^t``, ``g = g^t = (1/n) Σ g_i^t`` and the local estimators
    ``G = [g_i^t]`` of the workers this process holds (all ``n`` in simulation)."""

    x: Array
    g: Array
    G: Array

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "g": "shared", "G": "per_worker"}


@dataclass(frozen=True)
class EF21Params(MethodParams):
    """EF21's parameters: the compressor's contraction ``alpha``, the start ``init`` and the dtype
    of the estimators ``G`` (``shift_dtype``)."""

    alpha: float
    init: str
    shift_dtype: str = "float64"


class EF21Theory(MethodTheory[EF21Params]):
    """EF21's step ``1/(L− + L+ sqrt(β/θ))``, ``θ = 1 − sqrt(1 − α)``, ``β = (1 − α)/θ`` (the PL
    step with ``mu``); a worker sends its compressor's message every round."""

    table_rows = {TopK: EF21_TOPK}

    def step(self, compressor: Compressor, n: int, d: int, params: EF21Params, constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        gamma = ef21_stepsize(params.alpha, constants.L_minus, constants.L_plus, mu=constants.mu)
        return gamma, "EF21 theorem" if constants.mu is None else "EF21 PL theorem"

    def floats_per_round(self, compressor: Compressor, n: int, d: int, params: EF21Params) -> float:
        return float(compressor.floats_per_worker(n, d))


class EF21(Method):
    """EF21 (appendix "EF21 Analysis") with a contractive compressor (TopK).

    ``g_i⁰ = ∇f_i(x⁰)``; ``x^{t+1} = x^t − γ g^t``; worker ``i`` sends
    ``c_i = C(∇f_i(x^{t+1}) − g_i^t)`` and sets ``g_i^{t+1} = g_i^t + c_i``;
    ``g^{t+1} = g^t + (1/n) Σ c_i``. Step ``1/(L− + L+ sqrt(β/θ))``, ``θ = 1 − sqrt(1 − α)``,
    ``β = (1 − α)/θ`` (``pl=True``: the PL step). Options: ``count_indices`` (default True: the bits
    count ``⌈log2 d⌉`` per TopK index); ``init``: ``"full"`` (default, the appendix's
    ``g_i⁰ = ∇f_i(x⁰)``) or ``"compressed"`` (``g_i⁰ = C(∇f_i(x⁰))``, ``g⁰ = (1/n) Σ g_i⁰``: the
    start of the authors' quadratic runs, algorithm.py:1885-1893 of their code). The start's
    message is not counted in the bits, either way, as the paper does not count the initial
    step ("In all cases we do not consider the communication complexity of the initial step");
    a compressor with randomness draws it from the round index :attr:`EF21.INIT_ROUND`, which no
    round of a run uses. ``shift_dtype``: the estimators' dtype, by default the problem's
    (float32 for a float32 problem, as the authors' runs keep them; ``"float64"`` on request:
    :func:`~permk.methods.base.shift_dtype_option`).
    """

    name = "ef21"
    label = "EF21"
    state_type = EF21State
    exchange = ex.error_feedback
    theory = EF21Theory()

    #: The values of the ``init`` option (the start of the estimators).
    STARTS = ("full", "compressed")
    #: The round index of the compressed start's message (``init="compressed"``).
    INIT_ROUND = 2**64 - 1

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   count_indices: bool = True, init: str = "full", shift_dtype: Any = None) -> EF21Params:
        alpha = compressor.alpha(n, d)
        if alpha is None:
            raise ValueError(f"EF21 needs a contractive compressor (alpha); {compressor.name} has none")
        return EF21Params(bits=message_bits(compressor, n, d, float_bits, indices=check_flag(count_indices, "count_indices")),
                          alpha=alpha, init=check_choice(init, "init", self.STARTS), shift_dtype=shift_dtype_option(shift_dtype, problem))

    def init(self, x0: Array, backend: Any, compressor: Compressor, params: RunParams[EF21Params], *, seed: int) -> EF21State:
        dt = params.own.shift_dtype
        if params.own.init == "compressed":
            # C(∇f_i(x⁰) − 0): EF21's own exchange from zero estimators, on every backend
            zero = np.zeros((len(backend.workers), backend.d), dtype=dt)
            g, G = ex.error_feedback(backend, compressor, zero, x0, seed=seed, round=self.INIT_ROUND)
            return EF21State(x=x0, g=np.array(g, dtype=np.float64), G=G, round=0, seed=seed)
        G = np.array(ex.local_grads(backend, x0), dtype=dt)
        return EF21State(x=x0, g=ex.mean_rows(backend, G), G=G, round=0, seed=seed)

    def update(self, state: EF21State, backend: Any, compressor: Compressor,
               params: RunParams[EF21Params]) -> tuple[EF21State, RoundInfo]:
        x = state.x - params.gamma * state.g
        mean, G = ex.error_feedback(backend, compressor, state.G, x, seed=state.seed, round=state.round)
        bits = params.bits.compressed
        return EF21State(x=x, g=state.g + mean, G=G, round=state.round + 1, seed=state.seed, bits=state.bits + bits), RoundInfo(bits)


# The method definition (callable: it runs in the simulator).
ef21 = EF21()
