"""The base class of the methods, :class:`Method`, their catalog, and the checks of the options
several methods share (minibatch sizes, the finite-sum problem they need)."""

from __future__ import annotations

import abc
import sys
from typing import Any, ClassVar

import numpy as np

from .._validate import check_int, check_per_worker, check_sample_counts
from ..compressors import Compressor
from ..compressors.participation import Participation
from ..registry import Catalog
from ..theory.method import MethodTheory
from .contract import MethodParams, RoundInfo, RunParams, State

__all__ = ["Method", "METHODS", "participating", "batch_size_option", "sample_counts", "sample_smoothness_sq", "SHIFT_DTYPES",
           "shift_dtype_option"]

Array = np.ndarray


def _check_registrable(obj: Any) -> None:
    if not isinstance(obj, Method):
        raise TypeError(f"register: a method is registered as its object, an instance of a permk.Method subclass, got {obj!r}")


def _package_methods() -> dict[str, Method]:
    """The method objects the package defines, by name: those :mod:`permk.methods` exports (read
    when a catalog is first asked for, when the package is loaded)."""
    package = sys.modules[__package__]
    return {m.name: m for name in package.__all__ if isinstance(m := getattr(package, name), Method)}


#: The catalog of method objects (:func:`permk.methods.catalog`, :func:`permk.register`).
METHODS = Catalog("method", key=lambda m: m.name, check=_check_registrable, builtins=_package_methods)


class Method(abc.ABC):
    """One distributed method, defined once: the algorithm contract of
    :class:`permk.methods.Algorithm`, with its defaults.

    A subclass sets ``name``, ``label`` (its name in legends and tables: ``"MARINA"``),
    ``state_type`` (its :class:`State`), ``exchange`` (the exchange object of
    :mod:`permk.exchanges` its compressed rounds are made of, e.g.
    ``exchanges.compressed_mean_diff``; its path is the run's ``params.path``), ``has_coin``,
    and implements:

    * ``parameters(compressor, n, d, *, float_bits, problem, **options)`` — validate that the
      compressor suits the method and choose the method's own parameters (theory defaults): a
      :class:`MethodParams` (a subclass with the method's own fields), whose ``bits`` say what
      one worker sends per round;
    * ``init(x0, backend, compressor, params, *, seed)`` and ``update(state, backend,
      compressor, params) -> (state, RoundInfo)``, pure functions; ``params`` is the run's
      :class:`RunParams` (``params.gamma``, the method's own in ``params.own``).

    It may declare ``theory`` (a :class:`permk.theory.MethodTheory`: the theorem's step, which a
    run takes when no ``gamma`` is given, and what :func:`permk.theory.complexity` reads),
    ``takes_compressor`` (False for a method whose rounds send full gradients, GD: it runs with
    the identity and is called without a compressor) and ``needs_finite_sum`` (the method runs
    only on a finite-sum problem with minibatch oracles). Calling the method object runs it in
    the simulator (:func:`permk.run`).
    """

    name: ClassVar[str]
    label: ClassVar[str]
    state_type: ClassVar[type[State]]
    exchange: ClassVar[Any]
    has_coin: ClassVar[bool] = False
    takes_compressor: ClassVar[bool] = True
    needs_finite_sum: ClassVar[bool] = False
    theory: ClassVar[MethodTheory[Any] | None] = None
    #: The catalog a method object joins with :func:`permk.register`.
    catalog_kind: ClassVar[Catalog] = METHODS

    @abc.abstractmethod
    def parameters(self, compressor: Compressor, n: int, d: int, *, float_bits: int = 32, problem: Any = None,
                   **options: Any) -> MethodParams:
        """The method's own validated parameters (see the class docstring)."""

    @abc.abstractmethod
    def init(self, x0: Array, backend: Any, compressor: Compressor, params: RunParams[Any], *, seed: int) -> State:
        """The state before the first round (its exchanges are not counted as communication)."""

    @abc.abstractmethod
    def update(self, state: Any, backend: Any, compressor: Compressor, params: RunParams[Any]) -> tuple[State, RoundInfo]:
        """One round: the new state and what was sent."""

    def sent_compressor(self, compressor: Compressor, params: Any) -> Compressor:
        """The compressor whose messages the run's exchanges carry, built once per run: the run's
        own (a method with partial participation wraps it, :func:`participating`)."""
        return compressor

    def path(self, backend: Any, compressor: Compressor, own: Any) -> str:
        """The path of the run's exchanges (``params.path``): its ``exchange``'s on
        ``backend`` with the sent ``compressor``, for the rows of the method's own parameters
        ``own`` (their ``shift_dtype``, where it has one)."""
        return self.exchange.path(backend, compressor, getattr(own, "shift_dtype", None))  # type: ignore[no-any-return]

    def resolve(self, options: dict[str, Any]) -> tuple[Method, dict[str, Any]]:
        """The method a run with these options is, and the options it passes on: the method
        itself, or the variant an option selects (DASHA's ``estimator``). :func:`permk.run` and
        :func:`permk.distributed.run` call it first."""
        return self, options

    def __call__(self, problem: Any, compressor: Compressor, *, rounds: int, seed: int, **options: Any) -> Any:
        """Run the method in the single-process simulator: see :func:`permk.run`."""
        from .driver import run

        return run(self, problem, compressor, rounds=rounds, seed=seed, **options)

    def __repr__(self) -> str:
        return f"permk.{self.name}"


def participating(compressor: Compressor, s: int | None) -> Compressor:
    """The compressor of a method's rounds with ``s`` of the ``n`` workers participating
    (:class:`permk.Participation` around ``compressor``), or ``compressor`` itself (``s`` None)."""
    return compressor if s is None else Participation(compressor, s)


def batch_size_option(batch_size: Any, label: str) -> int:
    """A minibatch method's required ``batch_size`` (TypeError naming the method ``label`` when it
    is missing)."""
    if batch_size is None:
        raise TypeError(f"{label} needs batch_size= (the samples of a worker's minibatch)")
    return check_int(batch_size, "batch_size", low=1)


def sample_smoothness_sq(problem: Any, n: int, label: str) -> float:
    """``ℒ² = (1/n) Σ ℒ_i²``, the mean-squared sample smoothness (``problem.L_sample_rms``) a
    minibatch method's step reads (``label`` names the method in errors)."""
    rms = getattr(problem, "L_sample_rms", None)
    if rms is None:
        raise ValueError(f"{label}'s step reads the mean-squared sample smoothness L_sample_rms; the problem states none: pass gamma=")
    return float(np.mean(check_per_worker(rms, n, "the problem's L_sample_rms") ** 2))


def sample_counts(problem: Any, label: str, n: int) -> Array:
    """The ``n`` sample counts ``m_i`` of the finite-sum problem a minibatch method runs on
    (TypeError naming the method ``label`` for a problem without minibatch oracles)."""
    counts = getattr(problem, "sample_counts", None)
    if counts is None or not hasattr(problem, "minibatch_grads_pair"):
        raise TypeError(f"{label} needs a finite-sum problem with minibatch oracles (permk.FiniteSumProblem)")
    return check_sample_counts(counts, n)


#: The dtypes a method may keep its per-worker arrays (shifts, estimators) in.
SHIFT_DTYPES = ("float64", "float32")


def shift_dtype_option(value: Any, problem: Any) -> str:
    """The dtype of a method's per-worker arrays (its shifts ``h_i``, estimators ``g_i``): the
    ``shift_dtype`` option, ``"float64"`` or ``"float32"``; None (the default) takes the
    problem's: float32 for a float32 problem (``problem.dtype``: the linear autoencoder, the
    finite-sum problems with ``dtype=np.float32``), as the authors' runs keep them, else float64.
    Shared arrays (the iterate, ``g``) and every message stay float64; a float32 row is read as
    float64 where it is used (``h·β`` rounded to float32 first, numpy's rule for a float32 array
    and a Python float) and rounded to float32 where it is updated."""
    if value is None:
        dt = getattr(problem, "dtype", None)
        try:
            return "float32" if dt is not None and np.dtype(dt) == np.float32 else "float64"
        except TypeError:
            return "float64"
    try:
        name = np.dtype(value).name
    except TypeError:
        name = None
    if name not in SHIFT_DTYPES:
        raise ValueError(f"shift_dtype must be 'float64' or 'float32' (or None: the problem's dtype), got {value!r}")
    return name
