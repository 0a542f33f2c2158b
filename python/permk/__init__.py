"""permk: permutation compressors for communication-compressed distributed nonconvex optimization.

Reference implementation of Szlendak, Tyurin and Richtárik, *Permutation Compressors for
Provably Faster Distributed Nonconvex Optimization* (ICLR 2022).

The layers, bottom up: the Rust core (``permk._core``); :mod:`permk.compressors` and
:mod:`permk.problems`; :mod:`permk.theory` (step sizes, constants, complexity);
:mod:`permk.backends` (how workers exchange messages) and :mod:`permk.methods` (MARINA, EF21,
GD, DCGD, DASHA, each defined once; partial participation in :mod:`permk.participation`); :mod:`permk.distributed` (MPI) and :mod:`permk.experiments`.
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
from .methods import *  # noqa: F403 - every method and its state (methods.__all__)
from .methods import __all__ as _methods
from .compressors.participation import Participation as Participation
from .problems import Problem as Problem, Quadratic as Quadratic, SyntheticQuadratic as SyntheticQuadratic
from .problems import FiniteSumProblem as FiniteSumProblem, NonconvexLogistic as NonconvexLogistic, NonconvexMultiClass as NonconvexMultiClass, NonconvexSigmoid as NonconvexSigmoid
from .registry import register as register
from .theory.steps import ef21_stepsize as ef21_stepsize, marina_stepsize as marina_stepsize

__all__ = [
    "__version__",
    "theory",
    *_compressors,
    *_methods,
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
