"""The methods an experiment runs, ``METHOD-COMPRESSOR`` (:class:`Spec`), which ones it can run
(:func:`available_specs`), and the step sizes each runs with: the theory's step
(:func:`theory_gamma`) times the multipliers ``2^j`` (:func:`step_exponents`)."""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from .protocols import SearchOptions, protocol_of

__all__ = ["METHODS", "Spec", "PluginError", "available_specs", "spec_survey", "plugin_code", "theory_gamma",
           "multiplier_exponents", "step_exponents"]


class PluginError(ValueError):
    """The code of a plugin (a compressor class or method object registered from outside the
    package: :func:`permk.register`, the ``permk.plugins`` entry points, ``--plugin``) raised;
    the message names the plugin and what it raised (the command line: exit 2, one line)."""


def plugin_label(obj: Any) -> str | None:
    """``"compressor 'boom' (mod.Boom)"`` for a compressor class or method object registered
    from outside the package, None for the package's own."""
    cat = getattr(obj, "catalog_kind", None)
    if cat is None:
        return None
    for name, entry in cat.registered().items():
        if entry is obj:
            where = f"{obj.__module__}.{obj.__qualname__}" if isinstance(obj, type) else f"{type(obj).__module__}.{type(obj).__qualname__}"
            return f"{cat.kind} {name!r} ({where})"
    return None


@contextlib.contextmanager
def plugin_code(what: str, *parts: Any) -> Iterator[None]:
    """Run code that calls plugins' code: an exception the command line would show as a
    traceback (anything but ValueError, OSError, MemoryError, KeyboardInterrupt) becomes a
    :class:`PluginError` naming the plugins among ``parts`` and ``what`` raised; with no plugin
    among ``parts`` it passes unchanged (the package's own code)."""
    try:
        yield
    except (ValueError, OSError, MemoryError):
        raise
    except Exception as e:
        labels = [lab for lab in map(plugin_label, parts) if lab is not None]
        if not labels:
            raise
        raise PluginError(f"the plugin {' and the plugin '.join(labels)}: {what} raised {type(e).__name__}: {e}") from e

#: The paper's methods, in the order they run within a cell (PermK first: it is cheap and sets
#: the budget). Any ``METHOD-COMPRESSOR`` of :func:`available_specs` can be asked for.
METHODS = ("marina-permk", "ef21-topk", "marina-randk")


@dataclass(frozen=True)
class Spec:
    """A method of the experiments, ``"METHOD-COMPRESSOR"`` (e.g. ``"marina-permk"``): a method
    object of :mod:`permk.methods` and a compressor class of :func:`permk.compressors.catalog`,
    instantiated for each cell with :meth:`~permk.Compressor.default` (``K = ⌈d/n⌉`` for a
    tunable size, the paper's choice in "Experiments setup")."""

    key: str
    method: Any
    compressor_class: Any

    @classmethod
    def parse(cls, key: str) -> Spec:
        """The spec ``METHOD-COMPRESSOR`` (ValueError listing the available ones otherwise)."""
        from permk.compressors import catalog
        from permk.methods import catalog as methods

        from permk.compressors import Identity

        name, _, comp = str(key).partition("-")
        method = methods().get(name)
        if method is not None and not method.takes_compressor and not comp:
            return cls(key=str(key), method=method, compressor_class=Identity)
        if method is None or not method.takes_compressor or comp not in catalog():
            raise ValueError(f"unknown method {key!r}; expected METHOD-COMPRESSOR (METHOD alone for a method that takes "
                             f"no compressor), one of {', '.join(available_specs())}")
        return cls(key=str(key), method=method, compressor_class=catalog()[comp])

    def compressor(self, n: int, d: int) -> Any:
        """The compressor of this spec for ``n`` workers in dimension ``d`` (a plugin's
        ``default`` that raises is a :class:`PluginError` naming it)."""
        with plugin_code(f"{self.compressor_class.__name__}.default({n}, {d})", self.compressor_class):
            return self.compressor_class.default(n, d)

    @property
    def parts(self) -> tuple[Any, Any]:
        """The method object and the compressor class (for :func:`plugin_code`)."""
        return self.method, self.compressor_class

    def identical_workers_collapse(self, compressor: Any) -> bool:
        """Whether workers that are the same function stay identical under this method with
        ``compressor``: a method whose protocol says so (``collapses_identical_workers``: EF21 keeps equal
        ``g_i``) with a deterministic compressor (TopK), so the iterates do not depend on how
        many such workers there are (the experiments then run as few as they can)."""
        return bool(protocol_of(self.method).collapses_identical_workers and compressor.capabilities.deterministic)

    @property
    def label(self) -> str:
        """The legend label, the method's ``label`` and the compressor's class:
        ``MARINA + PermK``, ``EF21 + TopK``; a spec that names no compressor (a method that
        takes none, ``sgd``), the method's label alone (``SGD``)."""
        if not self.key.partition("-")[2]:
            return str(self.method.label)
        return f"{self.method.label} + {self.compressor_class.__name__}"

    def check_problem(self, problem: Any) -> None:
        """Refuse (ValueError) a problem this spec cannot run on: a method that needs a finite-sum
        problem (``needs_finite_sum``: minibatch oracles) on one without ``minibatch_grads``."""
        if self.method.needs_finite_sum and not callable(getattr(problem, "minibatch_grads", None)):
            raise ValueError(f"{self.key} needs a finite-sum problem with minibatch oracles (permk classify), "
                             f"not {type(problem).__name__}")


def available_specs(n: int = 10, d: int = 100) -> list[str]:
    """Every ``METHOD-COMPRESSOR`` the experiments can run: the methods with a theory step
    (MARINA, EF21, DIANA, RandDIANA, VR-MARINA, …) and the compressors whose defaults suit them
    (checked at ``(n, d)`` on a synthetic quadratic, whose constants every step can read: ``L_i``
    too; a method that ``needs_finite_sum`` on a small :class:`permk.NonconvexSigmoid` with the
    experiments' ``batch_size``), then the methods that take no compressor by their name alone
    (``gd``, ``sgd``). A plugin whose code raises anything but TypeError or ValueError here
    (which mean "does not suit") is left out with a :class:`permk.registry.PluginWarning`
    naming it (:func:`spec_survey` says why)."""
    specs, broken = spec_survey(n, d)
    from permk.registry import PluginWarning

    for why in broken.values():
        warnings.warn(f"permk {why}; its methods are left out", PluginWarning, stacklevel=2)
    return specs


def spec_survey(n: int = 10, d: int = 100) -> tuple[list[str], dict[str, str]]:
    """:func:`available_specs` and the plugins whose code raised while they were checked, by
    catalog entry (``"compressor boom"``, ``"method mine"``): what raised, naming the plugin."""
    from permk.problems import NonconvexSigmoid
    from permk.compressors import Identity, catalog
    from permk.methods import catalog as methods
    from permk.problems import Quadratic
    from permk.theory.steps import Constants

    quadratic = Quadratic.synthetic(n, d, lam=1e-3, noise_scale=0.1)
    rng = np.random.default_rng(0)
    finite_sum = NonconvexSigmoid(rng.standard_normal((4 * n, d - 1)), np.tile([-1.0, 1.0], 2 * n), n=n, seed=0)
    probes = {False: (quadratic, Constants.of(quadratic)), True: (finite_sum, Constants.of(finite_sum))}
    broken: dict[str, str] = {}

    def blame(e: Exception, what: str, *parts: tuple[str, Any]) -> None:
        """Record ``e`` against the first plugin among ``parts``; re-raise the package's own."""
        for key, obj in parts:
            label = plugin_label(obj)
            if label is not None:
                broken.setdefault(key, f"plugin {label} failed: {what} raised {type(e).__name__}: {e}")
                return
        raise e

    def suits(mname: str, method: Any, cname: str, c: Any) -> bool:
        probe, consts = probes[bool(getattr(method, "needs_finite_sum", False))]
        try:
            if method.theory is None:
                return False
            params = method.parameters(c, n, d, problem=probe, **SearchOptions(batch_size=2).sample_options(method))
            method.theory.step(c, n, d, params, consts, problem=probe)
        except (TypeError, ValueError):
            return False
        except Exception as e:  # a plugin's code: named, and its specs left out
            blame(e, f"{mname}-{cname}'s parameters and step at n={n}, d={d}", (f"method {mname}", method), (f"compressor {cname}", type(c)))
            return False
        return True

    compressors = {}
    for cname, cls in catalog().items():
        try:
            compressors[cname] = _default_or_none(cls, n, d)
        except Exception as e:
            blame(e, f"{cls.__name__}.default({n}, {d})", (f"compressor {cname}", cls))
            compressors[cname] = None
    out = []
    for mname, method in methods().items():
        try:
            takes = bool(method.takes_compressor)
        except Exception as e:
            blame(e, f"{mname}.takes_compressor", (f"method {mname}", method))
            continue
        if takes:
            out += [f"{mname}-{cname}" for cname, c in compressors.items()
                    if c is not None and f"method {mname}" not in broken and suits(mname, method, cname, c)]
        elif suits(mname, method, "", Identity()):
            out.append(mname)
    return [s for s in out if f"method {s.partition('-')[0]}" not in broken], broken
def _default_or_none(cls: Any, n: int, d: int) -> Any:
    """``cls.default(n, d)``, or None where the compressor does not fit ``(n, d)``."""
    try:
        return cls.default(n, d)
    except (TypeError, ValueError):
        return None


def theory_gamma(problem: Any, spec: Spec, opts: SearchOptions, *, constants: str | None = None) -> float:
    """The theory's step (multiplier 1) of ``spec`` on ``problem``, chosen exactly as a run of
    the method chooses it (:func:`permk.methods.driver.setup`: p = ζ/d, Theorem AB / AB-PL, the EF21
    theorem) from the problem's constants with ``opts.constants`` (``"pessimistic"``:
    ``L_+² = L_±² = (1/n) Σ L_i²``) unless ``constants`` overrides it."""
    from permk.methods.driver import setup

    spec.check_problem(problem)
    n, d = int(problem.n), int(problem.d)
    compressor = spec.compressor(n, d)
    with plugin_code(f"the theory step of {spec.key}", *spec.parts):
        params = setup(spec.method, problem, compressor, n=n, d=d, rounds=1, seed=opts.seed,
                       pl=opts.pl, constants=constants or opts.constants, float_bits=opts.float_bits, **opts.method_options(spec))
    return float(params.gamma)


def multiplier_exponents(gamma_theory: float, L_minus: float, *, max_count: int | None = None, cap: int = 16) -> list[int]:
    """The exponents ``j`` of the multipliers ``2^j``, from the largest with
    ``2^j γ_theory ≤ 2/L_−`` (beyond it even exact gradient descent diverges) down to ``0``
    (the theory's step), largest first; ``max_count`` keeps only the largest ones."""
    if not (gamma_theory > 0 and L_minus > 0):
        raise ValueError("gamma_theory and L_minus must be positive")
    top = int(math.floor(math.log2(2.0 / (L_minus * gamma_theory)) + 1e-12))
    top = max(0, min(top, cap))
    js = list(range(top, -1, -1))
    return js[:max_count] if max_count else js


def step_exponents(method: str, gamma_theory: float, L_minus: float | None, opts: SearchOptions,
                   authors: tuple[str, tuple[int, int]] | None, *, max_count: int | None = None) -> list[int]:
    """The exponents ``j`` of the multipliers ``2^j`` a method ``METHOD-COMPRESSOR`` runs with,
    largest first: with ``opts.steps == "edge"`` those of :func:`multiplier_exponents`; with
    ``"authors"`` the authors' range (``[low, high)``, the experiment's configs) of
    ``authors = (experiment, default range)``: the method's own in that experiment
    (:meth:`~permk.experiments.protocols.MethodProtocol.steps`), else the experiment's default,
    not cut at the stability edge (such runs diverge and are dropped). ``max_count`` keeps the
    largest ones."""
    if opts.steps == "authors":
        if authors is None:
            raise ValueError("steps='authors': this experiment has no authors' step ranges; use steps='edge'")
        low, high = protocol_of(Spec.parse(method).method).steps(*authors)
        js = list(range(high - 1, low - 1, -1))
        return js[:max_count] if max_count else js
    if L_minus is None:
        raise ValueError("steps='edge' needs L_minus (the stability edge 2/L_−)")
    return multiplier_exponents(gamma_theory, L_minus, max_count=max_count)


