"""permk: permutation compressors for communication-compressed distributed nonconvex optimization.

Reference implementation of Szlendak, Tyurin and Richtárik, *Permutation Compressors for
Provably Faster Distributed Nonconvex Optimization* (ICLR 2022).
"""

from . import theory as theory
from ._core import __version__ as __version__
from .compressors import (
    QSGD as QSGD,
    BlockPermK as BlockPermK,
    Compose as Compose,
    Compressor as Compressor,
    Identity as Identity,
    Message as Message,
    NaturalCompression as NaturalCompression,
    PermK as PermK,
    Plan as Plan,
    RandK as RandK,
    TopK as TopK,
    aggregate_messages as aggregate_messages,
)
from .methods import (
    EF21State as EF21State,
    MarinaState as MarinaState,
    RunResult as RunResult,
    ef21 as ef21,
    ef21_init as ef21_init,
    ef21_stepsize as ef21_stepsize,
    ef21_update as ef21_update,
    gd as gd,
    load_state as load_state,
    marina as marina,
    marina_init as marina_init,
    marina_stepsize as marina_stepsize,
    marina_update as marina_update,
    save_state as save_state,
)
from .problems import Problem as Problem, Quadratic as Quadratic, SyntheticQuadratic as SyntheticQuadratic

__all__ = [
    "__version__",
    "theory",
    "Compressor",
    "Message",
    "Plan",
    "PermK",
    "RandK",
    "TopK",
    "Identity",
    "BlockPermK",
    "NaturalCompression",
    "QSGD",
    "Compose",
    "aggregate_messages",
    "Problem",
    "Quadratic",
    "SyntheticQuadratic",
    "marina",
    "ef21",
    "gd",
    "marina_init",
    "marina_update",
    "marina_stepsize",
    "ef21_init",
    "ef21_update",
    "ef21_stepsize",
    "MarinaState",
    "EF21State",
    "RunResult",
    "save_state",
    "load_state",
]
