"""How the paper's experiments run each method: :class:`MethodProtocol`, declared per method
class beside the experiments (not inside the method, whose contract is the algorithm alone).

A method without a declared protocol runs with the defaults: the base number of rounds, no
choice of start, workers never collapsed, and each experiment's default step range under the
authors' rules. A method defined outside the package declares its own with :func:`declare`;
a subclass inherits its base class's.

>>> import permk
>>> from permk.experiments.protocols import protocol_of
>>> protocol_of(permk.ef21).rounds_factor, protocol_of(permk.marina).rounds_factor
(2, 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..methods import EF21

__all__ = ["MethodProtocol", "declare", "protocol_of", "undeclare"]


@dataclass(frozen=True)
class MethodProtocol:
    """How the experiments run a method.

    * ``rounds_factor`` — how many times the base number of rounds the authors' configs run it
      (``horizon="rounds"``; EF21: twice);
    * ``starts`` — the values of the method's ``init`` option that the experiments' start option
      (``ef21_init``) may set (EF21's ``"full"`` and ``"compressed"``);
    * ``collapses_identical_workers`` — with a deterministic compressor
      (``capabilities.deterministic``) workers that are the same function stay identical and the
      iterates depend on their mean alone, so an experiment may run a group of identical workers
      as one (EF21 keeps equal ``g_i``);
    * ``authors_steps`` — per experiment (``"quadratic"``, ``"autoencoder"``), the exponents
      ``[low, high)`` of the step multipliers ``2^j`` of the authors' runs where they differ from
      the experiment's default range (EF21+TopK's steps ×8 in the quadratic experiment).
    """

    rounds_factor: int = 1
    starts: tuple[str, ...] = ()
    collapses_identical_workers: bool = False
    authors_steps: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def steps(self, experiment: str, default: tuple[int, int]) -> tuple[int, int]:
        """The authors' step exponents ``[low, high)`` of this method in ``experiment``."""
        return tuple(self.authors_steps.get(experiment, default))  # type: ignore[return-value]


_DECLARED: dict[type, MethodProtocol] = {}


def declare(method_class: type, protocol: MethodProtocol) -> None:
    """Declare how the experiments run the methods of ``method_class`` (and its subclasses)."""
    if not isinstance(method_class, type):
        raise TypeError(f"declare: a protocol is declared for a method class, got {method_class!r}")
    if not isinstance(protocol, MethodProtocol):
        raise TypeError(f"declare: expected a MethodProtocol, got {type(protocol).__name__}")
    _DECLARED[method_class] = protocol


def undeclare(method_class: type) -> None:
    """Forget a declared protocol (tests and interactive sessions)."""
    _DECLARED.pop(method_class, None)


def protocol_of(method: Any) -> MethodProtocol:
    """The protocol of a method object: the one declared for the nearest class of its MRO, else
    the defaults."""
    for cls in type(method).__mro__:
        if cls in _DECLARED:
            return _DECLARED[cls]
    return MethodProtocol()


#: EF21 in the authors' configs: twice the rounds, its two starts, identical workers stay so;
#: in the quadratic experiment ``--top_k_factor 3`` (its steps ×8: config_quadratic.py:106-107).
declare(EF21, MethodProtocol(rounds_factor=2, starts=EF21.STARTS, collapses_identical_workers=True,
                             authors_steps={"quadratic": (3, 23)}))
