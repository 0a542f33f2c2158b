"""The experiments' protocols: how a cell's search runs (:class:`SearchOptions`: permk's protocol
by default, the authors' with ``--protocol authors``, :data:`AUTHORS`), and how it runs each
method (:class:`MethodProtocol`, declared per method class beside the experiments, not inside
the method, whose contract is the algorithm alone).

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

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, TypeVar

from .._validate import check_choice
from ..methods import EF21

__all__ = ["MethodProtocol", "declare", "protocol_of", "undeclare", "SearchOptions", "SpecLike", "AUTHORS", "protocol_options",
           "search_from_args", "options_from_args", "GridT"]


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


class SpecLike(Protocol):
    """What the search options read of a method–compressor pair: its ``key``
    (``"marina-permk"``) and its ``method`` object (:class:`permk.experiments.specs.Spec` is
    one)."""

    @property
    def key(self) -> str: ...
    @property
    def method(self) -> Any: ...


@dataclass(frozen=True)
class SearchOptions:
    """Options of the per-cell search (see the module docstring): permk's protocol by default;
    ``best``, ``horizon``, ``steps`` and ``ef21_init`` select the authors' rules instead."""

    seed: int = 0
    tol: float = 1e-6
    budget_factor: float = 20.0
    max_rounds: int = 20000
    div_factor: float = 1e2
    prune: tuple[str, ...] | None = None
    patience: int = 1
    pl: bool = False
    constants: str = "pessimistic"
    float_bits: int = 32
    chunk_seconds: float = 0.5
    best: str = "budget"
    horizon: str = "budget"
    steps: str = "edge"
    ef21_init: str = "full"
    batch_size: int = 1

    def __post_init__(self) -> None:
        check_choice(self.best, "best", ("budget", "last90"))
        check_choice(self.horizon, "horizon", ("budget", "rounds"))
        check_choice(self.steps, "steps", ("edge", "authors"))
        check_choice(self.ef21_init, "ef21_init", ("full", "compressed"))

    def rounds_for(self, spec: SpecLike) -> int:
        """The most rounds of a run of ``spec``: ``max_rounds``; with ``horizon="rounds"``, times
        the method's protocol's ``rounds_factor`` (EF21: twice), as the authors' configs."""
        factor = protocol_of(spec.method).rounds_factor if self.horizon == "rounds" else 1
        return int(factor) * self.max_rounds

    def prunes(self, spec: SpecLike) -> bool:
        """Whether the multiplier scan of ``spec`` stops early (see *Pruning*): the specs listed
        in ``prune``; by default (None) those whose method keeps per-worker arrays in its state
        (:attr:`permk.State.arrays`: ``O(nd)`` per round, as EF21's estimators)."""
        if self.prune is None:
            return bool(spec.method.state_type.per_worker_arrays())
        return spec.key in self.prune

    def budget(self, bits_to_target: float) -> float:
        """The bits budget given the fewest bits to the target (infinite with ``horizon="rounds"``)."""
        return math.inf if self.horizon == "rounds" else self.budget_factor * bits_to_target

    def method_options(self, spec: SpecLike) -> dict[str, Any]:
        """The method's own options of a run of ``spec``: the start ``init`` of a method that
        has a choice of starts (its protocol's ``starts``: EF21's)."""
        start = {"init": self.ef21_init} if self.ef21_init in protocol_of(spec.method).starts else {}
        return {**start, **self.sample_options(spec.method)}

    def sample_options(self, method: Any) -> dict[str, Any]:
        """The sampling options of a method that runs on minibatches (``needs_finite_sum``): the
        ``batch_size``; a method that needs more (a megabatch) is not run by the experiments."""
        return {"batch_size": self.batch_size} if method.needs_finite_sum else {}


#: The authors' protocol, per experiment (the option values ``--protocol authors`` sets; see the
#: module docstring): the autoencoder's EF21 started from full gradients (their scripts.txt runs
#: it with --ef21_init_with_gradients) and 4,000 rounds (8,000 for EF21).
AUTHORS: dict[str, dict[str, Any]] = {
    "quadratic": {"best": "last90", "horizon": "rounds", "steps": "authors", "ef21_init": "compressed"},
    "autoencoder": {"best": "last90", "horizon": "rounds", "steps": "authors", "ef21_init": "full", "max_rounds": 4000},
    "classify": {"best": "last90", "horizon": "rounds"},
}


def protocol_options(args: Any, experiment: str) -> dict[str, Any]:
    """The :class:`SearchOptions` fields a command line sets through ``--protocol`` and the
    single options ``--best``, ``--horizon``, ``--steps``, ``--ef21-init`` (which override it);
    ``--rounds`` overrides the protocol's ``max_rounds``."""
    out = dict(AUTHORS[experiment]) if getattr(args, "protocol", None) == "authors" else {}
    for k in ("best", "horizon", "steps", "ef21_init"):
        if getattr(args, k, None) is not None:
            out[k] = getattr(args, k)
    if getattr(args, "rounds", None) is not None:
        out.pop("max_rounds", None)
    return out


#: An experiment's grid dataclass (it has ``max_multipliers`` and ``methods``).
GridT = TypeVar("GridT")


def search_from_args(grid: GridT, args: Any) -> GridT:
    """``grid`` (an experiment's grid dataclass) with the step search's command-line choices that
    every experiment shares: ``--max-multipliers`` (0: no cap) and ``--methods`` (in order,
    repeats dropped), where given."""
    from dataclasses import replace

    if args.max_multipliers is not None:
        grid = replace(grid, max_multipliers=args.max_multipliers or None)  # type: ignore[type-var]
    if args.methods:
        grid = replace(grid, methods=tuple(dict.fromkeys(args.methods)))  # type: ignore[type-var]
    return grid


def options_from_args(base: SearchOptions, args: Any, experiment: str) -> SearchOptions:
    """The :class:`SearchOptions` of an experiment's command line: ``base`` (its grid's) with the
    protocol (:func:`protocol_options`) and ``--seed``, ``--rounds``, ``--tol``,
    ``--budget-factor``, ``--no-prune`` where given."""
    from dataclasses import replace

    o = replace(base, **protocol_options(args, experiment))
    return replace(o, seed=args.seed if args.seed is not None else o.seed,
                   max_rounds=args.rounds if args.rounds is not None else o.max_rounds,
                   tol=args.tol if args.tol is not None else o.tol,
                   budget_factor=args.budget_factor if args.budget_factor is not None else o.budget_factor,
                   prune=() if args.no_prune else o.prune)
