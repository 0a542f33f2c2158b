"""permk: permutation compressors for communication-compressed distributed nonconvex optimization.

Reference implementation of Szlendak, Tyurin and Richtárik, *Permutation Compressors for
Provably Faster Distributed Nonconvex Optimization* (ICLR 2022).
"""

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

__all__ = [
    "__version__",
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
]
