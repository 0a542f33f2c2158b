"""Minibatch SGD, the uncompressed stochastic baseline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import exchanges as ex
from ..compressors import Compressor, Identity
from ..theory.method import MethodTheory
from ..theory.steps import Constants
from .base import Method, batch_size_option, sample_counts
from .contract import Bits, MethodParams, RoundInfo, RunParams
from .dcgd import DCGDState
from .driver import RunResult, run

__all__ = ["SGDParams", "SGDTheory", "SGD", "sgd"]

Array = np.ndarray


@dataclass(frozen=True)
class SGDParams(MethodParams):
    """SGD's parameters: the minibatch size ``batch_size``."""

    batch_size: int


class SGDTheory(MethodTheory[SGDParams]):
    """SGD's step ``1/L_−`` (the smoothness step); a worker sends its whole minibatch gradient."""

    def step(self, compressor: Compressor, n: int, d: int, params: SGDParams, constants: Constants,
             problem: Any = None) -> tuple[float, str]:
        if constants.mu is not None:
            raise ValueError("SGD has no PL step in permk: pass gamma= or pl=False")
        if not constants.L_minus > 0:
            raise ValueError("the smoothness constants give no bound on the step (L_minus = 0): f is constant")
        return 1.0 / constants.L_minus, "1/L− (the smoothness step of SGD)"

    def floats_per_round(self, compressor: Compressor, n: int, d: int, params: SGDParams) -> float:
        return float(d)


class SGD(Method):
    """Minibatch SGD, the uncompressed stochastic baseline: worker ``i`` sends its minibatch
    gradient ``∇f_{iB_i}(x^t)`` (``b`` samples from ``(seed, t, i)``, ``b`` oracle calls) and
    ``x^{t+1} = x^t − γ (1/n) Σ ∇f_{iB_i}(x^t)``. Step ``1/L_−`` (the smoothness step) or the
    user's ``gamma``. Called without a compressor: ``permk.sgd(problem, rounds=…, seed=…,
    batch_size=b)``. Option: ``batch_size`` (required)."""

    name = "sgd"
    label = "SGD"
    state_type = DCGDState
    exchange = ex.mean_grad
    takes_compressor = False
    needs_finite_sum = True
    theory = SGDTheory()

    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,  # type: ignore[override]
                   batch_size: Any = None) -> SGDParams:
        if not compressor.capabilities.lossless:
            raise ValueError(f"sgd sends whole minibatch gradients: its compressor must be None or Identity, got {compressor.name}")
        sample_counts(problem, self.label, n)
        full = float(d * float_bits)
        return SGDParams(bits=Bits(compressed=full, expected=full, full=full), batch_size=batch_size_option(batch_size, self.label))

    def init(self, x0: Array, backend: Any, compressor: Compressor, params: RunParams[SGDParams], *, seed: int) -> DCGDState:
        return DCGDState(x=x0, round=0, seed=seed)

    def update(self, state: DCGDState, backend: Any, compressor: Compressor,
               params: RunParams[SGDParams]) -> tuple[DCGDState, RoundInfo]:
        b = params.own.batch_size
        g = ex.mean_rows(backend, ex.minibatch_grads(backend, state.x, b, seed=state.seed, round=state.round))
        bits = params.bits.full
        return (DCGDState(x=state.x - params.gamma * g, round=state.round + 1, seed=state.seed, bits=state.bits + bits),
                RoundInfo(bits, None, float(b)))

    def __call__(self, problem: Any, compressor: Compressor | None = None, *, rounds: int, seed: int, **options: Any) -> RunResult:  # type: ignore[override]
        """Run minibatch SGD in the simulator (``compressor`` must be None or Identity)."""
        return run(self, problem, compressor if compressor is not None else Identity(), rounds=rounds, seed=seed, **options)


# The method definition (callable: it runs in the simulator).
sgd = SGD()
