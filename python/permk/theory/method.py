"""A method's theory, declared beside its algorithm: :class:`MethodTheory`.

A method of :mod:`permk.methods` is an algorithm (its parameters, ``init`` and ``update``); what
its theorems say about it is a separate object, the method's ``theory``: the theorem's step
size from the problem's constants (which a run takes when no ``gamma`` is given), the floats a
worker sends per round and the parameters the method may tune (which
:func:`permk.theory.complexity` optimises), and the rows of the paper's communication-complexity
Tables it has a closed form for. A method without a theory runs with a given ``gamma``.

>>> import permk
>>> t = permk.marina.theory
>>> params = permk.marina.parameters(permk.PermK(), 10, 100)
>>> round(t.floats_per_round(permk.PermK(), 10, 100, params), 6)  # p·d + (1 − p)·d/n with p = ζ/d
19.0
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar, Generic, Mapping, TypeVar

from .complexity import TableRow
from .steps import Constants

__all__ = ["MethodTheory", "P"]

#: A method's own parameters (:class:`permk.methods.MethodParams`).
P = TypeVar("P")


class MethodTheory(abc.ABC, Generic[P]):
    """What a method's theorems say about it. ``compressor`` and ``params`` are what the method's
    ``parameters`` was given and returned: the user's compressor (a method with partial
    participation reads its messages' compressor from both, as its ``sent_compressor`` does) and
    the method's own parameters."""

    #: The rows of the paper's communication-complexity Tables for this method, by compressor
    #: class (:func:`permk.theory.table_complexity`).
    table_rows: ClassVar[Mapping[type, TableRow]] = {}

    @abc.abstractmethod
    def step(self, compressor: Any, n: int, d: int, params: P, constants: Constants, problem: Any = None) -> tuple[float, str]:
        """``(γ, theorem)``: the theory's step size from the smoothness constants (``constants.mu``
        set: the PL theorem's; a ValueError saying to pass ``gamma=`` where there is none)."""

    @abc.abstractmethod
    def floats_per_round(self, compressor: Any, n: int, d: int, params: P) -> float:
        """The expected number of floats one worker sends in a round."""

    def tunable_range(self, compressor: Any, n: int, d: int) -> dict[str, tuple[float, float]]:
        """The method's own continuous parameters :func:`permk.theory.complexity` optimises, with
        their ranges (MARINA: ``p``); none by default."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
