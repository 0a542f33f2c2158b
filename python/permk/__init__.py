"""permk: permutation compressors for communication-compressed distributed nonconvex optimization.

Reference implementation of Szlendak, Tyurin and Richtárik, *Permutation Compressors for
Provably Faster Distributed Nonconvex Optimization* (ICLR 2022).

The layers, bottom up: the Rust core (``permk._core``); :mod:`permk.compressors` and
:mod:`permk.problems`; :mod:`permk.theory` (step sizes, constants, complexity, a method's
theory); :mod:`permk.transport` (where the workers run and how their numbers move: the
simulator, MPI) and :mod:`permk.exchanges` (the arithmetic of each exchange, once for every
transport); :mod:`permk.methods` (MARINA, EF21, GD, DCGD, DIANA, DASHA, … each defined once, and
the one driver); :mod:`permk.distributed` (running methods on MPI) and :mod:`permk.experiments`.
:func:`permk.register` adds a compressor or a method defined outside the package to the
catalogs (:mod:`permk.registry`).
``import permk`` loads neither scipy.optimize, scipy.sparse.linalg, matplotlib nor mpi4py.
"""

from . import _clock as _clock  # first: the zero of the CLI's time line
from . import _blas as _blas  # the permk command: OpenBLAS's idle threads sleep at once (before numpy loads it)
from . import theory as theory
from ._core import __version__ as __version__
from .parallel import apply_env_threads as _apply_env_threads

_apply_env_threads()  # PERMK_THREADS=N: this process's Rust pool and BLAS (permk.parallel)
from .compressors import *  # noqa: F403 - every compressor (compressors.__all__): a new one needs no line here
from .compressors import __all__ as _compressors

# the catalog of compressors stays permk.compressors.catalog (permk.methods.catalog is the methods')
del catalog  # noqa: F821
_compressors = [name for name in _compressors if name != "catalog"]
from .methods import (
    CountedState as CountedState,
    DashaPPState as DashaPPState,
    DashaState as DashaState,
    DashaVRState as DashaVRState,
    DCGDState as DCGDState,
    DianaState as DianaState,
    EF21State as EF21State,
    MarinaState as MarinaState,
    Method as Method,
    MethodParams as MethodParams,
    RandDianaState as RandDianaState,
    RoundInfo as RoundInfo,
    RunParams as RunParams,
    RunResult as RunResult,
    ShiftedDCGDState as ShiftedDCGDState,
    State as State,
    dasha as dasha,
    dasha_mvr as dasha_mvr,
    dasha_page as dasha_page,
    dcgd as dcgd,
    dcgd_shifted as dcgd_shifted,
    diana as diana,
    ef21 as ef21,
    gd as gd,
    load_state as load_state,
    marina as marina,
    marina_stochastic as marina_stochastic,
    message_bits as message_bits,
    rand_diana as rand_diana,
    run as run,
    save_state as save_state,
    sgd as sgd,
    vr_marina as vr_marina,
)
from .compressors.participation import Participation as Participation
from .problems import Problem as Problem, Quadratic as Quadratic, SyntheticQuadratic as SyntheticQuadratic
from .problems import FiniteSumProblem as FiniteSumProblem, NonconvexLogistic as NonconvexLogistic, NonconvexMultiClass as NonconvexMultiClass, NonconvexSigmoid as NonconvexSigmoid
from .registry import register as register
from .theory.steps import ef21_stepsize as ef21_stepsize, marina_stepsize as marina_stepsize

__all__ = [
    "__version__",
    "theory",
    *_compressors,
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
    "MethodParams",
    "RunParams",
    "RunResult",
    "Method",
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
    "run",
    "save_state",
    "load_state",
    "message_bits",
    "Participation",
    "Problem",
    "Quadratic",
    "SyntheticQuadratic",
    "FiniteSumProblem",
    "NonconvexSigmoid",
    "NonconvexMultiClass",
    "NonconvexLogistic",
    "register",
    "marina_stepsize",
    "ef21_stepsize",
]
