"""Group Hessian variance (appendix "Group Hessian Variance"): the constants of groups of workers,
the step size of Theorem "AB_group", and MARINA's variance constant of any compressor
(:func:`variance_bound`), with the group bound for one that declares groups.

>>> import numpy as np, permk
>>> class TwoGroups:  # workers 0, 1 hold A = diag(1, 3); workers 2, 3 hold B = diag(3, 1)
...     mats = [np.diag([1.0, 3.0])] * 2 + [np.diag([3.0, 1.0])] * 2
...     n, d, x0 = 4, 2, np.zeros(2)
...     def hessians(self): return self.mats
...     def local_grads(self, x): return np.stack([A @ x for A in self.mats])
...     def grad(self, x): return 2.0 * x
...     def loss(self, x): return float(x @ x)
>>> g = group_hessian_variance(TwoGroups(), [[0, 1], [2, 3]], permk.PermK())
>>> g.whole.L_pm, g.L_hat_sq, g.stepsize(0.5)  # L± = 1 overall, 0 inside each group
(1.0, 0.0, 0.5)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

from .._validate import check_int, check_partition
from ..compressors import Compressor, VarianceBound
from .smoothness import SMOOTHNESS_OPTIONS, SmoothnessMethod, Smoothness, smoothness
from .steps import marina_variance_stepsize

__all__ = ["GroupHessianVariance", "group_hessian_variance", "Grouped", "variance_bound"]


@dataclass(frozen=True)
class GroupHessianVariance:
    """The constants of appendix "Group Hessian Variance" for a partition of the workers.

    ``constants[k]`` holds ``L_−^{G_k}``, ``L_+^{G_k}``, ``L_±^{G_k}`` of group ``k`` (the
    constants of the functions ``f_i``, ``i ∈ G_k``), ``ab[k]`` the ``(A_{G_k}, B_{G_k})`` of its
    compressor on ``|G_k|`` workers, ``whole`` the constants of ``f`` itself, and
    ``L_hat_sq`` is
    ``L̂²_G = Σ_k (A_{G_k} − B_{G_k}) |G_k|²/n² (L_+^{G_k})² + Σ_k B_{G_k} |G_k|²/n² (L_±^{G_k})²``
    (Lemma "Group AB inequality" and the variance bound after it).
    """

    groups: tuple[tuple[int, ...], ...]
    constants: tuple[Smoothness, ...]
    ab: tuple[tuple[float, float], ...]
    whole: Smoothness
    L_hat_sq: float

    def stepsize(self, p: float, *, mu: float | None = None) -> float:
        """MARINA's step of Theorem "AB_group": ``1/(L_− + sqrt((1−p)/p · L̂²_G))``; with ``mu``
        its PL twin ``min{1/(L_− + sqrt(2(1−p)/p · L̂²_G)), p/(2μ)}``.

        It is Theorem "AB"'s step with ``(A − B)L_+² + B L_±²`` replaced by ``L̂²_G``."""
        return marina_variance_stepsize(self.whole.L_minus, self.L_hat_sq, p, mu=mu)


def group_hessian_variance(
    problem: Any,
    groups: Sequence[Sequence[int]],
    compressor: Any,
    method: SmoothnessMethod = "exact",
    **options: Any,
) -> GroupHessianVariance:
    """Group constants and ``L̂²_G`` (appendix "Group Hessian Variance").

    ``groups`` partitions ``range(n)``; the compressors of different groups are independent
    (Assumption "group AB") and group ``k`` runs ``compressor`` (or ``compressor[k]``) on its
    ``|G_k|`` workers, whose AB constants it states (``ab_constants(|G_k|, d)``). The
    constants come from :func:`~permk.theory.smoothness` with ``method`` and ``options`` for every
    group and for the whole problem (its ``L_−`` enters the step).
    """
    if not (hasattr(problem, "n") and hasattr(problem, "d")):
        raise TypeError("problem must implement the Problem protocol (permk.problems): it needs n and d")
    n, d = check_int(problem.n, "problem.n", low=1), check_int(problem.d, "problem.d", low=1)
    parts = check_partition(groups, n)
    comps = [compressor] * len(parts) if hasattr(compressor, "ab_constants") else list(compressor)
    if len(comps) != len(parts) or not all(hasattr(c, "ab_constants") for c in comps):
        raise TypeError("compressor must be a Compressor or one Compressor per group")
    ab = []
    for g, c in zip(parts, comps):
        stated = c.ab_constants(len(g), d)
        if stated is None:
            raise ValueError(f"{c.name} states no AB constants (Assumption 'AB inequality'): it cannot be used here")
        ab.append((float(stated[0]), float(stated[1])))
    allowed = set().union(*SMOOTHNESS_OPTIONS.values()) | {"seed"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise TypeError(f"unknown smoothness option(s): {', '.join(unknown)}")
    seed = options.pop("seed", 0)
    constants = tuple(smoothness(problem, method, workers=g, seed=seed, **options) for g in parts)
    whole = smoothness(problem, method, seed=seed, **options)
    L_hat_sq = sum(
        len(g) ** 2 / n**2 * ((A - B) * s.L_plus**2 + B * s.L_pm**2) for g, (A, B), s in zip(parts, ab, constants)
    )
    return GroupHessianVariance(groups=parts, constants=constants, ab=tuple(ab), whole=whole, L_hat_sq=float(L_hat_sq))


@runtime_checkable
class Grouped(Protocol):
    """A compressor that runs ``inner`` independently inside ``groups`` of workers (Assumption
    "group AB"; :class:`permk.GroupPermK`): what :func:`variance_bound` reads."""

    groups: tuple[tuple[int, ...], ...]
    inner: Compressor


def variance_bound(compressor: Compressor, n: int, d: int, constants: Any, problem: Any = None) -> VarianceBound:
    """MARINA's variance constant ``L̂²`` of ``compressor`` on a problem with ``constants``
    (``L_plus``, ``L_pm``: a :class:`permk.theory.Constants`), and the theorems that use it.

    With a ``problem`` and a compressor that declares groups (:class:`Grouped`), Theorem
    "AB_group"'s ``L̂²_G`` from the problem's group constants (:func:`group_hessian_variance`,
    exact for quadratics); otherwise the compressor's own
    :meth:`~permk.Compressor.variance_bound` (Theorem "AB" from its ``ab_constants`` unless it
    overrides it).

    Refused: a ``compressor`` that is not a :class:`permk.Compressor`, or ``constants`` without
    ``L_plus`` and ``L_pm`` (TypeError naming the argument), and constants whose ``L̂²`` is
    beyond float64 (ValueError naming them).

    >>> import permk
    >>> q = permk.Quadratic.synthetic(4, 8, 1e-2, 0.5, seed=1)
    >>> c = permk.theory.Constants.of(q)
    >>> variance_bound(permk.PermK(), 4, 8, c, q).theorem, variance_bound(permk.GroupPermK(((0, 1), (2, 3))), 4, 8, c, q).theorem
    ('Theorem AB', 'Theorem AB_group')
    """
    if not isinstance(compressor, Compressor):
        raise TypeError(f"compressor must be a permk.Compressor, got {type(compressor).__name__}")
    if not all(hasattr(constants, a) for a in ("L_plus", "L_pm")):
        raise TypeError(f"constants must be a permk.theory.Constants (with L_plus and L_pm), got {type(constants).__name__}")
    try:
        if problem is not None and isinstance(compressor, Grouped):
            compressor.check(n, d)
            ghv = group_hessian_variance(problem, compressor.groups, compressor.inner)
            bound = VarianceBound(ghv.L_hat_sq, "Theorem AB_group", "Theorem AB_group (PL)")
        else:
            bound = compressor.variance_bound(n, d, constants, problem=problem)
    except OverflowError:  # a constant's square
        bound = None
    if bound is None or not math.isfinite(bound.L_hat_sq):
        raise ValueError(f"MARINA's variance constant L̂² of {compressor.name} is beyond float64 with L_plus = "
                         f"{constants.L_plus:g}, L_pm = {constants.L_pm:g}: rescale the problem, or pass gamma=")
    return bound
