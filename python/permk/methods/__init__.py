"""Distributed methods, each defined once: MARINA, EF21, GD and DCGD with the paper's step sizes,
DIANA (its nonconvex step), RandDIANA and shifted DCGD (the authors' steps), DASHA and DASHA-PP
(their theorems' steps), and on finite-sum problems VR-MARINA, online stochastic MARINA,
DASHA-PAGE, DASHA-MVR and minibatch SGD.

A method is an algorithm (:class:`Method`, the contract of :class:`Algorithm`): its validated
parameters (:meth:`Method.parameters`, a typed :class:`MethodParams` with the theory's defaults
such as MARINA's ``p = ζ/d``) and a pure ``init``/``update`` pair over an explicit state (in the
spirit of optax). An update takes the state, the backend, the compressor and the run's
:class:`RunParams`, and returns the new state and a :class:`RoundInfo` (the bits one worker
sent, MARINA's coin): every method's update has that same shape. It never talks to workers
itself: it asks the backend for one of the exchanges of :mod:`permk.exchanges`, so the same
definition runs in the single-process simulator (:class:`permk.transport.Simulator`) and on MPI
(:mod:`permk.distributed`), through the one driver loop (:mod:`permk.methods.driver`). What the
theorems say of a method — its step size, the floats it sends — is its ``theory``, a
:class:`permk.theory.MethodTheory` beside it.

The modules: :mod:`~permk.methods.contract` (states, parameters, the contract),
:mod:`~permk.methods.base` (:class:`Method`, the catalog), :mod:`~permk.methods.driver` (the
driver), :mod:`~permk.methods.checkpoint` (states on disk), and one module per family:
:mod:`~permk.methods.marina` (MARINA, GD, VR-MARINA, stochastic MARINA),
:mod:`~permk.methods.ef21`, :mod:`~permk.methods.dcgd`, :mod:`~permk.methods.diana` (DIANA,
RandDIANA), :mod:`~permk.methods.dasha` (DASHA, DASHA-PAGE, DASHA-MVR), :mod:`~permk.methods.sgd`.

``permk.marina``, ``permk.ef21``, ``permk.gd``, ``permk.dcgd`` (``permk.dcgd_shifted``),
``permk.diana``, ``permk.rand_diana``, ``permk.dasha``, ``permk.vr_marina``,
``permk.marina_stochastic``, ``permk.dasha_page``, ``permk.dasha_mvr`` and ``permk.sgd`` are the
method objects themselves; calling one runs it in the simulator::

    permk.marina(problem, permk.PermK(), rounds=1000, seed=1)

and ``permk.distributed.run(permk.marina, ...)`` runs it on MPI. ``docs/extending.md`` shows how
a method is defined outside the package: one class (and its theory) in one file.

>>> import permk
>>> q = permk.Quadratic.synthetic(n=10, d=100, lam=1e-3, noise_scale=0.0, seed=0)
>>> res = permk.marina(q, permk.PermK(), rounds=200, seed=1)
>>> bool(res.grad_norm_sq[-1] < 1e-2 * res.grad_norm_sq[0])
True
"""

from __future__ import annotations

from .base import METHODS, Method
from .checkpoint import load_state, save_state
from .contract import Algorithm, Bits, CountedState, MethodParams, RoundInfo, RunParams, State, message_bits
from .dasha import (
    Dasha,
    DashaMVR,
    DashaMVRParams,
    DashaPage,
    DashaPageParams,
    DashaParams,
    DashaPPState,
    DashaState,
    DashaVRState,
    dasha,
    dasha_mvr,
    dasha_page,
)
from .dcgd import DCGD, DCGDParams, DCGDState, ShiftedDCGD, ShiftedDCGDState, dcgd, dcgd_shifted
from .diana import Diana, DianaParams, DianaState, RandDiana, RandDianaParams, RandDianaState, diana, rand_diana
from .driver import RunResult, run
from .ef21 import EF21, EF21Params, EF21State, ef21
from .marina import (
    GD,
    Marina,
    MarinaParams,
    MarinaState,
    StochasticMarina,
    StochasticMarinaParams,
    VRMarina,
    VRMarinaParams,
    gd,
    marina,
    marina_stochastic,
    vr_marina,
)
from .sgd import SGD, SGDParams, sgd

__all__ = [
    "State",
    "CountedState",
    "MarinaState",
    "EF21State",
    "DCGDState",
    "ShiftedDCGDState",
    "DianaState",
    "RandDianaState",
    "DashaState",
    "DashaPPState",
    "DashaVRState",
    "RoundInfo",
    "Bits",
    "MethodParams",
    "MarinaParams",
    "VRMarinaParams",
    "StochasticMarinaParams",
    "EF21Params",
    "DCGDParams",
    "DianaParams",
    "RandDianaParams",
    "DashaParams",
    "DashaPageParams",
    "DashaMVRParams",
    "SGDParams",
    "RunParams",
    "RunResult",
    "Algorithm",
    "Method",
    "Marina",
    "GD",
    "VRMarina",
    "StochasticMarina",
    "EF21",
    "DCGD",
    "ShiftedDCGD",
    "Diana",
    "RandDiana",
    "Dasha",
    "DashaPage",
    "DashaMVR",
    "SGD",
    "marina",
    "ef21",
    "gd",
    "dcgd",
    "dcgd_shifted",
    "diana",
    "rand_diana",
    "dasha",
    "dasha_page",
    "dasha_mvr",
    "vr_marina",
    "marina_stochastic",
    "sgd",
    "catalog",
    "run",
    "save_state",
    "load_state",
    "message_bits",
]


def catalog() -> dict[str, Method]:
    """The method objects by name (``"marina"``, ``"ef21"``, …): the package's, then those
    registered from outside it (:func:`permk.register`, the ``permk.plugins`` entry points).
    What the experiments' ``--methods METHOD-COMPRESSOR`` resolves."""
    return METHODS.all()
