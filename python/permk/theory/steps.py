"""The step sizes of the paper's theorems, and the smoothness constants they read.

The bottom of the theory layer: the methods (:mod:`permk.methods`) and the complexity
calculator (:mod:`permk.theory.complexity`) take their step sizes from here.

* :func:`marina_stepsize` — Theorem "AB" (and its PL twin, Theorem "AB-PL"), from a
  compressor's ``(A, B)`` and ``L_−``, ``L_+``, ``L_±``;
* :func:`marina_variance_stepsize` — the same theorems written with the variance constant
  ``L̂² = (A − B)L_+² + B L_±²`` (Theorem "AB_group" replaces it by ``L̂²_G``);
* :func:`ef21_stepsize` — the EF21 theorems (appendix "EF21 Analysis");
* :func:`diana_stepsize` — DIANA's nonconvex step (the Lyapunov argument of Horváth et al.,
  "Stochastic distributed learning with gradient quantization and double-variance reduction",
  with the AB inequality); :func:`rand_diana_stepsize` and :func:`shifted_dcgd_stepsize` — the
  authors' RandDIANA and shifted-DCGD steps (their ``algorithm.py``), chosen by
  :func:`shift_step_class` from a compressor's AB constants;
* :func:`dasha_momentum`, :func:`dasha_stepsize`, :func:`dasha_pp_stepsize` — DASHA and its
  partial-participation form DASHA-PP (Tyurin & Richtárik 2022), gradient setting;
  :func:`dasha_page_stepsize`, :func:`dasha_mvr_stepsize` and :func:`dasha_mvr_noise` — permk's
  own Lyapunov derivation for DASHA-PAGE and DASHA-MVR (docs/dasha_steps.md);
* :class:`Constants` — ``L_−``, ``L_+``, ``L_±`` (and ``μ``) read from a problem, exactly or
  with the paper's pessimistic choice, each read only when needed.

Every constant is validated: a negative, NaN or infinite value is a ValueError naming it, and so
are constants whose step is not a finite positive number (too small or too large for float64:
the step overflows to ``inf`` or underflows to 0; ``check_step``).

>>> marina_stepsize(1.0, 1.0, 1.0, 2.0, 0.0, 0.1)
1.0
>>> round(ef21_stepsize(1.0, 2.0, 3.0), 12)
0.5
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypeVar

import numpy as np

from .._validate import check_choice, check_int, check_per_worker, check_probability, check_real, is_real, real_float

__all__ = ["Constants", "marina_stepsize", "marina_variance_stepsize", "ef21_stepsize",
           "diana_stepsize", "shift_step_class", "rand_diana_stepsize", "shifted_dcgd_stepsize", "worker_constants",
           "dasha_momentum", "dasha_stepsize", "dasha_pp_stepsize", "dasha_page_stepsize", "dasha_mvr_stepsize",
           "dasha_mvr_noise"]

#: Where a :class:`Constants`' values come from (its ``kind``).
CONSTANT_KINDS = ("exact", "pessimistic", "given")


def check_step(gamma: Any, what: str, constants: Mapping[str, Any], advice: str = "rescale the problem, or pass gamma=") -> float:
    """``gamma`` as a float if it is a finite positive number, else a ValueError naming ``what``
    (the step's formula or function) and the ``constants`` it was computed from (their real
    numbers; other entries are left out of the message): constants too
    small or too large for float64 give a step of ``inf`` or 0 that no run can take. ``gamma``
    None: the formula itself overflowed. ``advice`` closes the message.

    >>> check_step(0.5, "1/L_minus", {"L_minus": 2.0})
    0.5
    >>> check_step(1 / 1e-320, "1/L_minus", {"L_minus": 1e-320})
    Traceback (most recent call last):
    ...
    ValueError: 1/L_minus: the constants L_minus = 9.99989e-321 give the step inf, not a finite positive number (they are too small or too large for float64): rescale the problem, or pass gamma=
    """
    g = real_float(gamma) if is_real(gamma) else None
    if g is not None and math.isfinite(g) and g > 0:
        return g
    shown = ", ".join(f"{k} = {real_float(v):g}" for k, v in constants.items() if is_real(v))
    result = ("make the step's formula overflow (or divide by a value that underflowed to 0)" if gamma is None else
              f"give the step {repr(gamma) if g is None else format(g, 'g')}, not a finite positive number")
    raise ValueError(f"{what}: the constants {shown} {result} (they are too small or too large for float64): {advice}")


_F = TypeVar("_F", bound=Callable[..., float])


def _step_size(fn: _F) -> _F:
    """A step-size function whose result passes ``check_step``: a step that is not a finite
    positive number (and an OverflowError or ZeroDivisionError on the way) is a ValueError naming
    the function's numeric arguments. The arguments' own checks come first, as they are."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def step(*args: Any, **kwargs: Any) -> float:
        try:
            gamma: Any = fn(*args, **kwargs)
        except (OverflowError, ZeroDivisionError):  # a constant's square, or a division by one that underflowed
            gamma = None
        if type(gamma) is float and 0.0 < gamma < math.inf:  # the common case, without binding the arguments
            return gamma
        return check_step(gamma, fn.__name__, signature.bind(*args, **kwargs).arguments)

    return step  # type: ignore[return-value]


def _mu(mu: Any) -> float | None:
    return None if mu is None else check_real(mu, "mu", low=0.0, strict=True)


@_step_size
def marina_variance_stepsize(L_minus: float, L_hat_sq: float, p: float, *, mu: float | None = None) -> float:
    """MARINA's largest step ``1/M``, ``M = L_− + sqrt((1−p)/p · L̂²)``; with ``mu`` the PL step
    ``min{1/(L_− + sqrt(2(1−p)/p · L̂²)), p/(2μ)}``. ``L̂²`` is Theorem "AB"'s
    ``(A − B)L_+² + B L_±²`` or Theorem "AB_group"'s ``L̂²_G``.

    Refused (ValueError naming them): negative, NaN or infinite constants, ``p`` outside
    ``(0, 1]``, ``M = 0`` (``f`` constant), and constants whose step is not a finite positive
    number (too small or too large for float64, ``check_step``).

    >>> marina_variance_stepsize(2.0, 0.0, 0.5)
    0.5
    """
    return _marina_step(L_minus, L_hat_sq, p, mu)


def _marina_step(L_minus: Any, L_hat_sq: Any, p: Any, mu: Any) -> float:
    """:func:`marina_variance_stepsize` without the check of its result (the public steps check it)."""
    L_minus = check_real(L_minus, "L_minus", low=0.0)
    L_hat_sq = check_real(L_hat_sq, "L_hat_sq", low=0.0)
    p = check_probability(p)
    mu = _mu(mu)
    factor = 2.0 if mu is not None else 1.0
    M = L_minus + math.sqrt(factor * (1 - p) / p * L_hat_sq)
    if M <= 0:
        raise ValueError("the smoothness constants give M = 0 (L_minus = 0 and no variance): f is constant")
    return min(1.0 / M, p / (2 * mu)) if mu is not None else 1.0 / M


@_step_size
def marina_stepsize(
    A: float, B: float, L_minus: float, L_plus: float, L_pm: float, p: float, *, mu: float | None = None
) -> float:
    """The largest step of Theorem "AB": ``1/M``, ``M = L_− + sqrt((1−p)/p ((A−B)L_+² + B L_±²))``;
    with ``mu`` the step of Theorem "AB-PL": ``min{1/(L_− + sqrt(2(1−p)/p (…))), p/(2μ)}``.
    Refused as by :func:`marina_variance_stepsize` (a ValueError naming the constants when the
    step would be ``inf`` or 0, or its formula overflows float64).

    >>> marina_stepsize(1.0, 1.0, 1.0, 2.0, 0.0, 0.1)
    1.0
    """
    A = check_real(A, "A", low=0.0)
    B = check_real(B, "B", low=0.0)
    L_plus = check_real(L_plus, "L_plus", low=0.0)
    L_pm = check_real(L_pm, "L_pm", low=0.0)
    variance = max((A - B) * L_plus**2 + B * L_pm**2, 0.0)
    return _marina_step(L_minus, variance, p, mu)


@_step_size
def ef21_stepsize(alpha: float, L_minus: float, L_plus: float, *, mu: float | None = None) -> float:
    """EF21's step (Theorem in "EF21 Analysis"): ``1/(L_− + L_+ sqrt(β/θ))`` with
    ``θ = 1 − sqrt(1 − α)``, ``β = (1 − α)/(1 − sqrt(1 − α))``; with ``mu`` (PL):
    ``min{1/(L_− + L_+ sqrt(2β/θ)), θ/(2μ)}``. Refused (ValueError naming them): ``α`` outside
    ``(0, 1]``, negative, NaN or infinite constants, ``L_− = L_+ = 0``, and constants whose step
    is not a finite positive number (too small or too large for float64, ``check_step``).

    >>> round(ef21_stepsize(1.0, 2.0, 3.0), 12)
    0.5
    """
    alpha = check_real(alpha, "alpha", low=0.0, strict=True, high=1.0)
    L_minus = check_real(L_minus, "L_minus", low=0.0)
    L_plus = check_real(L_plus, "L_plus", low=0.0)
    mu = _mu(mu)
    theta = 1 - math.sqrt(1 - alpha)
    beta = (1 - alpha) / theta
    factor = 2.0 if mu is not None else 1.0
    M = L_minus + L_plus * math.sqrt(factor * beta / theta)
    if M <= 0:
        raise ValueError("the smoothness constants give M = 0 (L_minus = L_plus = 0): f is constant")
    return min(1.0 / M, theta / (2 * mu)) if mu is not None else 1.0 / M


@dataclass(frozen=True)
class Constants:
    """The smoothness constants a step size reads: ``L_−``, ``L_+``, ``L_±`` and, for the PL
    steps, ``μ``. ``kind`` says where they come from: ``"exact"`` (the problem's constants),
    ``"pessimistic"`` (the paper's experimental choice ``L_+² = L_±² = (1/n) Σ L_i²``,
    appendix "Experiments setup") or ``"given"``. Refused (ValueError naming it): a negative,
    NaN or infinite constant, ``mu`` not positive, and any other ``kind``."""

    L_minus: float
    L_plus: float
    L_pm: float
    mu: float | None = None
    kind: str = "given"

    def __post_init__(self) -> None:
        for name in ("L_minus", "L_plus", "L_pm"):
            object.__setattr__(self, name, check_real(getattr(self, name), name, low=0.0))
        object.__setattr__(self, "mu", _mu(self.mu))
        check_choice(self.kind, "kind", CONSTANT_KINDS)

    @classmethod
    def of(cls, problem: Any, kind: str = "exact", *, pl: bool = False, n: int | None = None) -> Constants:
        """The constants of ``problem`` (its attributes ``L_minus``, ``L_plus``, ``L_pm``;
        ``L_i`` with ``kind="pessimistic"``; ``mu`` only with ``pl``). Only these are read, so a
        problem computing its constants lazily computes nothing else. With ``kind="pessimistic"``
        the ``L_i`` must be ``n`` (default ``problem.n``) non-negative finite numbers, one per
        worker: any other length is a ValueError."""
        check_choice(kind, "constants", ("exact", "pessimistic"))
        needed = ["L_minus"] + (["L_i"] if kind == "pessimistic" else ["L_plus", "L_pm"]) + (["mu"] if pl else [])
        missing = [a for a in needed if not hasattr(type(problem), a) and not hasattr(problem, a)]
        if missing == ["mu"]:
            raise ValueError("pl=True needs the problem's PL constant mu (the problem has none)")
        if missing:
            raise ValueError(
                f"the problem does not provide its smoothness constants ({', '.join(missing)}): pass gamma= "
                "explicitly, or estimate them with permk.theory.smoothness"
            )
        L_minus = getattr(problem, "L_minus")
        if kind == "pessimistic":
            workers = check_int(getattr(problem, "n", None), "problem.n", low=1) if n is None else check_int(n, "n", low=1)
            L_i = check_per_worker(getattr(problem, "L_i"), workers, "the problem's L_i")
            L_plus = L_pm = math.sqrt(float(np.mean(L_i**2)))
        else:
            L_plus, L_pm = getattr(problem, "L_plus"), getattr(problem, "L_pm")
        mu = getattr(problem, "mu") if pl else None
        if pl and mu is None:
            raise ValueError("pl=True needs the problem's PL constant mu (the problem has mu = None)")
        return cls(L_minus=L_minus, L_plus=L_plus, L_pm=L_pm, mu=mu, kind=kind)

    def record(self) -> dict[str, Any]:
        """The constants as the entries of a run's ``params``."""
        out: dict[str, Any] = {"L_minus": self.L_minus, "L_plus": self.L_plus, "L_pm": self.L_pm, "constants": self.kind}
        if self.mu is not None:
            out["mu"] = self.mu
        return out


# ---------------------------------------------------------------------------------------------
# methods with shifts: DIANA, RandDIANA, shifted DCGD
# ---------------------------------------------------------------------------------------------
@_step_size
def diana_stepsize(alpha: float, omega: float, A: float, L_minus: float, L_plus: float) -> float:
    """DIANA's nonconvex step: ``γ = min{1/(2L_−), α/(2L_+ sqrt(A(2 + α)))}``.

    DIANA (Mishchenko et al., "Distributed learning with compressed gradient differences"):
    ``g^t = h̄^t + (1/n) Σ C_i(∇f_i(x^t) − h_i^t)``, ``h_i^{t+1} = h_i^t + α C_i(…)``,
    ``x^{t+1} = x^t − γ g^t``, with ``C_i ∈ U(ω)``. The nonconvex analysis of Horváth et al.
    ("Stochastic distributed learning with gradient quantization and double-variance
    reduction") follows ``Φ^t = f(x^t) − f* + c (1/n) Σ‖∇f_i(x^t) − h_i^t‖²``; written with the
    AB inequality (``{C_i} ∈ U(A, B)``: the variance of the mean message is at most
    ``A (1/n) Σ‖∇f_i − h_i‖²``), ``α ≤ 1/(ω + 1)`` (so ``E‖a − αC_i(a)‖² ≤ (1 − α)‖a‖²``),
    ``L_+`` and ``c = γA/α``, every ``γ`` at most this step gives
    ``E Φ^{t+1} ≤ E Φ^t − (γ/2) E‖∇f(x^t)‖²``, hence, from ``h_i^0 = ∇f_i(x^0)``,
    ``(1/T) Σ_{t<T} E‖∇f(x^t)‖² ≤ 2(f(x^0) − f*)/(γT)``. With ``A = ω/n`` (independent
    compressors) and ``α = 1/(ω + 1)`` this is DIANA's known
    ``Θ((L_− + (ω + 1) sqrt(ω/n) L_+)/ε)`` rounds. The constants are permk's own derivation
    along that Lyapunov argument (the paper's text was not at hand; the authors' library has no
    DIANA step): the tests check the bound it implies, which a 16× larger step breaks.

    Constants whose step is not a finite positive number (too small or too large for float64)
    are a ValueError naming them (``check_step``), as are negative, NaN or infinite ones.

    >>> round(diana_stepsize(0.5, 1.0, 0.5, 1.0, 2.0), 12)  # α/(2 L_+ sqrt(A(2+α))) = 1/(4√5)
    0.111803398875
    """
    omega = check_real(omega, "omega", low=0.0)
    alpha = check_real(alpha, "alpha", low=0.0, strict=True, high=1.0)
    if alpha > 1.0 / (omega + 1.0) * (1 + 1e-12):
        raise ValueError(f"DIANA's theorem needs alpha <= 1/(omega + 1) = {1 / (omega + 1):g}, got alpha = {alpha:g}")
    A = check_real(A, "A", low=0.0)
    L_minus = check_real(L_minus, "L_minus", low=0.0)
    L_plus = check_real(L_plus, "L_plus", low=0.0)
    bounds = [1.0 / (2.0 * L_minus)] if L_minus > 0 else []
    if A > 0 and L_plus > 0:
        bounds.append(alpha / (2.0 * L_plus * math.sqrt(A * (2.0 + alpha))))
    if not bounds:
        raise ValueError("the smoothness constants give no bound on the step (L_minus = 0 and no variance): f is constant")
    return min(bounds)


def shift_step_class(A: float, B: float, n: int) -> str | None:
    """Which of the authors' RandDIANA / shifted-DCGD steps a compressor with AB constants
    ``(A, B)`` on ``n`` workers has: ``"permutation"`` when ``A = B ≤ 1`` (the class ``IV(A)``
    of the paper, inside ``IV(1)`` where PermK lies: the authors' ``*_permutation`` steps),
    ``"independent"`` when ``A ≤ (n − 1)/n`` (the AB inequality of independent compressors
    with ``ω + 1 ≤ n``, which the authors' ``rand_diana`` step asserts: ``A = ω/n``), else None.

    >>> shift_step_class(1.0, 1.0, 10), shift_step_class(0.9, 0.0, 10), shift_step_class(9.0, 0.0, 10)
    ('permutation', 'independent', None)
    """
    A = check_real(A, "A", low=0.0)
    B = check_real(B, "B", low=0.0)
    if math.isclose(A, B, rel_tol=1e-12, abs_tol=1e-15) and A <= 1.0 + 1e-12:
        return "permutation"
    if A <= (n - 1) / n * (1 + 1e-12):
        return "independent"
    return None


@_step_size
def rand_diana_stepsize(p: float, L_mean: float, L_max: float, L_var: float, *, kind: str, mu: float | None = None) -> float:
    """The authors' RandDIANA step (``code/distributed_optimization_library/algorithm.py`` of
    mysteryresearcher/sampling-in-optimal-sgd at bd3f2e6), with ``L = L_mean`` (their mean of the
    workers' ``L_i``), the Bregman smoothness variance ``L_B = L_max`` (their default, the largest
    ``L_i``) and the smoothness variance ``L_var`` (``L_±``; their default ``sqrt(mean L_i²)``):

    * ``kind="permutation"`` (``rand_diana_permutation``, lines 1762-1775):
      ``min{1/(4(L + 4L_B)), sqrt(p)/(2 L_var)}`` (the second term only when ``L_var > 0``);
      with ``mu`` (their strongly convex regime) ``min{1/(L + 6L_B), p/(2μ)}``;
    * ``kind="independent"`` (``rand_diana``, lines 1692-1706):
      ``min{1/(4(5L + 4L_B)), sqrt(p)/(2 sqrt(L_var² + L²))}``; with ``mu``
      ``min{1/(7L + 6L_B), p/(2μ)}``.

    Constants whose step is not a finite positive number (too small or too large for float64)
    are a ValueError naming them (``check_step``), as are negative, NaN or infinite ones.

    >>> rand_diana_stepsize(0.25, 1.0, 2.0, 10.0, kind="permutation")  # √p/(2 L_var)
    0.025
    """
    check_choice(kind, "kind", ("permutation", "independent"))
    p = check_probability(p)
    L = check_real(L_mean, "L_mean", low=0.0)
    L_B = check_real(L_max, "L_max", low=0.0)
    L_var = check_real(L_var, "L_var", low=0.0)
    mu = _mu(mu)
    first = (L + 6 * L_B if kind == "permutation" else 7 * L + 6 * L_B) if mu is not None else \
        4 * (L + 4 * L_B if kind == "permutation" else 5 * L + 4 * L_B)
    if first <= 0:
        raise ValueError("the smoothness constants give no bound on the step (L_mean = L_max = 0): f is constant")
    gamma = 1.0 / first
    if mu is not None:
        return min(gamma, p / (2 * mu))
    spread = L_var if kind == "permutation" else math.sqrt(L_var**2 + L**2)
    return min(gamma, math.sqrt(p) / (2 * spread)) if spread > 0 else gamma


@_step_size
def shifted_dcgd_stepsize(omega: float, n: int, L_mean: float, L_max: float) -> float:
    """The authors' step of DCGD with the shifts ``h_i = ∇f_i(x^0)`` (``dcgd_permutation``,
    ``algorithm.py`` lines 1867-1874 of mysteryresearcher/sampling-in-optimal-sgd at bd3f2e6):
    ``1/(((ω + 1)/n) L + ((ω + 1)/n + 1) L_B)`` with ``L = L_mean`` (the mean of the ``L_i``) and
    ``L_B = L_max`` (their Bregman smoothness variance's default, the largest ``L_i``).

    Constants whose step is not a finite positive number (too small or too large for float64)
    are a ValueError naming them (``check_step``), as are negative, NaN or infinite ones.

    >>> shifted_dcgd_stepsize(1.0, 4, 2.0, 3.0)  # 1/(0.5·2 + 1.5·3)
    0.18181818181818182
    """
    omega = check_real(omega, "omega", low=0.0)
    n = check_int(n, "n", low=1)
    L = check_real(L_mean, "L_mean", low=0.0)
    L_B = check_real(L_max, "L_max", low=0.0)
    ratio = (omega + 1) / n
    M = ratio * L + (ratio + 1) * L_B
    if M <= 0:
        raise ValueError("the smoothness constants give no bound on the step (L_mean = L_max = 0): f is constant")
    return 1.0 / M


def worker_constants(problem: Any, n: int) -> tuple[float, float]:
    """The mean and the largest of the problem's ``L_i`` (the smoothness constants of the
    ``f_i``): the authors' ``L`` of RandDIANA and shifted DCGD, and their default Bregman
    smoothness variance. A ValueError (pass ``gamma=``) when the problem states none.

    >>> class P: L_i = [1.0, 3.0]
    >>> worker_constants(P(), 2)
    (2.0, 3.0)
    """
    L_i = getattr(problem, "L_i", None)
    if L_i is None:
        raise ValueError("this step reads the workers' smoothness constants L_i; the problem states none: pass gamma=")
    L_i = check_per_worker(L_i, n, "the problem's L_i")
    return float(L_i.mean()), float(L_i.max())


# ---------------------------------------------------------------------------------------------
# DASHA and DASHA-PP (Tyurin & Richtárik 2022), gradient setting
# ---------------------------------------------------------------------------------------------
def dasha_momentum(omega: float, p_a: float = 1.0) -> float:
    """DASHA's momentum ``a = p_a/(2ω + 1)`` (``p_a = 1``: DASHA's ``1/(2ω + 1)``; DASHA-PP with
    participation probability ``p_a = s/n``): the authors' ``_estimate_momentum`` of
    ``zero_marina`` and ``zero_marina_partial_participation``.

    >>> dasha_momentum(1.0), dasha_momentum(1.0, 0.5)
    (0.3333333333333333, 0.16666666666666666)
    """
    omega = check_real(omega, "omega", low=0.0)
    p_a = check_real(p_a, "p_a", low=0.0, strict=True, high=1.0)
    return p_a / (2 * omega + 1)


@_step_size
def dasha_stepsize(omega: float, A: float, L_minus: float, L_plus: float) -> float:
    """DASHA's step (theorem of "DASHA: Distributed nonconvex optimization with communication
    compression, optimal oracle complexity, and no client synchronization", gradient setting, as
    the authors' code computes it, ``ZeroMarinaMasterAlgorithm._estimate_gamma``):
    ``1/(L_− + L_+ sqrt(A(4ω + 1)))`` with ``a = 1/(2ω + 1)``.

    The authors write ``ω/n`` for ``A``: for independent compressors (``A = ω/n``) it is their
    step exactly. The proof uses independence in one place only, the variance of the mean of the
    compressed messages ``E‖(1/n)Σ(C_i(u_i) − u_i)‖² ≤ (ω/n)(1/n)Σ‖u_i‖²``, which the AB
    inequality bounds by ``A (1/n)Σ‖u_i‖²`` for any unbiased family (PermK: ``A = 1``); each
    ``C_i``'s own ``ω`` bounds the workers' estimators. ``L_−`` and ``L_+`` stand for the
    authors' mean of the ``L_i`` and ``sqrt((1/n)Σ L_i²)``: ``f`` is ``L_−``-smooth and
    ``(1/n)Σ‖∇f_i(x) − ∇f_i(y)‖² ≤ L_+²‖x − y‖²``, all the theorem reads.

    Constants whose step is not a finite positive number (too small or too large for float64)
    are a ValueError naming them (``check_step``), as are negative, NaN or infinite ones.

    >>> dasha_stepsize(1.0, 0.5, 1.0, 2.0) == 1 / (1 + 2 * 2.5 ** 0.5)
    True
    """
    omega = check_real(omega, "omega", low=0.0)
    A = check_real(A, "A", low=0.0)
    L_minus = check_real(L_minus, "L_minus", low=0.0)
    L_plus = check_real(L_plus, "L_plus", low=0.0)
    M = L_minus + L_plus * math.sqrt(A * (4 * omega + 1))
    if M <= 0:
        raise ValueError("the smoothness constants give M = 0 (L_minus = 0 and no variance): f is constant")
    return 1.0 / M


@_step_size
def dasha_pp_stepsize(omega: float, A: float, n: int, s: int, L_minus: float, L_plus: float) -> float:
    """DASHA-PP's step (theorem of "A computation and communication efficient method for
    distributed nonconvex problems in the partial participation setting", gradient setting) for
    ``s`` of ``n`` workers sampled uniformly without replacement (``p_a = s/n``, the probability
    that a worker participates, ``p_aa = s(s − 1)/(n(n − 1))`` that two given workers do):
    ``1/(L_− + L_+ sqrt(48A(2ω + 1)/p_a² + 16(1 − p_aa/p_a)/(n p_a²)))`` with
    ``a = p_a/(2ω + 1)``, ``b = p_a/(2 − p_a)``. ``A`` stands for the theorem's ``ω/n`` as in
    :func:`dasha_stepsize` (independent compressors: ``A = ω/n``), and is taken at least ``ω/n``
    (what one worker's message alone forces when ``ω`` is tight). The tests check this step
    against a Lyapunov analysis of the method written out from its updates (the terms
    ``‖g − h‖²``, ``(1/n)Σ‖g_i − h_i‖²``, ``‖h − ∇f‖²``, ``(1/n)Σ‖h_i − ∇f_i‖²``, with
    sampling without replacement and the AB inequality): its conditions hold at this step. The
    constants are the theorem's as recalled (the paper's text was not at hand, and the authors'
    library tunes DASHA-PP's step by powers of two): that test is what backs them here.

    Constants whose step is not a finite positive number (too small or too large for float64)
    are a ValueError naming them (``check_step``), as are negative, NaN or infinite ones.

    >>> dasha_pp_stepsize(0.0, 0.0, 4, 4, 1.0, 1.0)  # every worker, no compression: GD's 1/L
    1.0
    """
    omega = check_real(omega, "omega", low=0.0)
    A = check_real(A, "A", low=0.0)
    if isinstance(n, bool) or isinstance(s, bool) or not isinstance(n, (int, np.integer)) or not isinstance(s, (int, np.integer)):
        raise TypeError(f"n and s must be integers, got {n!r} and {s!r}")
    if not 1 <= s <= n:
        raise ValueError(f"participation must be in 1..n = 1..{n}, got {s}")
    L_minus = check_real(L_minus, "L_minus", low=0.0)
    L_plus = check_real(L_plus, "L_plus", low=0.0)
    A = max(A, omega / n)
    p_a = s / n
    p_aa = s * (s - 1) / (n * (n - 1)) if n > 1 else 1.0
    variance = 48 * A * (2 * omega + 1) / p_a**2 + 16 * (1 - p_aa / p_a) / (n * p_a**2)
    M = L_minus + L_plus * math.sqrt(variance)
    if M <= 0:
        raise ValueError("the smoothness constants give M = 0 (L_minus = 0 and no variance): f is constant")
    return 1.0 / M


def _dasha_weight(omega: float, A: float, a: float) -> float:
    """``A (1/a + 2ω)``: the weight of the workers' estimator change ``(1/n)Σ‖h_i^{t+1} − h_i^t‖²``
    in DASHA's Lyapunov function (docs/dasha_steps.md, step 2), for ``a ≤ 1/(2ω + 1)``."""
    omega = check_real(omega, "omega", low=0.0)
    A = check_real(A, "A", low=0.0)
    a = check_real(a, "a", low=0.0, strict=True, high=1.0)
    if a > 1.0 / (2.0 * omega + 1.0) * (1 + 1e-12):
        raise ValueError(f"the DASHA-PAGE/MVR steps need a <= 1/(2 omega + 1) = {1 / (2 * omega + 1):g}, got a = {a:g}")
    return A * (1.0 / a + 2.0 * omega)


def _lemma_step(L_minus: float, K: float) -> float:
    """``1/(L_− + sqrt(K))``: the largest ``γ`` the lemma ``γ ≤ 1/(L + sqrt K) ⇒ 1/γ − L − Kγ ≥ 0``
    gives."""
    M = check_real(L_minus, "L_minus", low=0.0) + math.sqrt(K)
    if M <= 0:
        raise ValueError("the smoothness constants give M = 0 (L_minus = 0 and no variance): f is constant")
    return 1.0 / M


def _sample_constants(L_plus: float, L_sample_sq: float, n: int, batch_size: int) -> tuple[float, float, int, int]:
    """The finite-sum steps' shared arguments, checked: ``L_+``, ``ℒ²``, ``n`` and the batch size."""
    return (check_real(L_plus, "L_plus", low=0.0), check_real(L_sample_sq, "L_sample_sq", low=0.0),
            check_int(n, "n", low=1), check_int(batch_size, "batch_size", low=1))


@_step_size
def dasha_page_stepsize(omega: float, A: float, a: float, L_minus: float, L_plus: float, L_sample_sq: float,
                        n: int, batch_size: int, p: float) -> float:
    """DASHA-PAGE's step (permk's derivation, docs/dasha_steps.md): ``1/(L_− + sqrt(K))`` with
    ``K = 4AW(1 + p)L_+² + 12AW(1 − p)ℒ²/b + 2(1 − p)ℒ²/(p n b)``, ``W = 1/a + 2ω``.

    The method ("DASHA: Distributed nonconvex optimization with communication compression,
    optimal oracle complexity, and no client synchronization", PAGE estimators with one shared
    coin ``Be(p)`` and minibatches of ``b`` samples drawn with replacement) with an unbiased
    family ``{C_i}`` of variance ``ω`` and AB constant ``A`` (the AB inequality with ``B``
    dropped), ``a ≤ 1/(2ω + 1)``, ``f`` ``L_−``-smooth, ``(1/n)Σ‖∇f_i(x) − ∇f_i(y)‖² ≤
    L_+²‖x − y‖²`` and ``ℒ² = (1/n)Σ ℒ_i²`` (``(1/m_i)Σ_j‖∇f_ij(x) − ∇f_ij(y)‖² ≤ ℒ_i²‖x − y‖²``):
    every ``γ`` at most this step gives ``E Φ^{t+1} ≤ E Φ^t − (γ/2) E‖∇f(x^t)‖²``, hence, from
    ``g_i⁰ = h_i⁰ = ∇f_i(x⁰)``, ``(1/T) Σ_{t<T} E‖∇f(x^t)‖² ≤ 2(f(x⁰) − f*)/(γT)``. At ``p = 1``
    ``K = 8A(4ω + 1)L_+²`` with the default ``a``: a step ``sqrt 8`` times smaller in its
    variance term than :func:`dasha_stepsize`'s, never larger.

    Constants whose step is not a finite positive number (too small or too large for float64)
    are a ValueError naming them (``check_step``), as are negative, NaN or infinite ones.

    >>> dasha_page_stepsize(0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 2, 1, 1.0)  # no compression, full gradients: 1/L_−
    0.5
    """
    W = _dasha_weight(omega, A, a)
    L_plus, L_sample_sq, n, b = _sample_constants(L_plus, L_sample_sq, n, batch_size)
    p = check_real(p, "p", low=0.0, strict=True, high=1.0)
    K = 4 * W * (1 + p) * L_plus**2 + 12 * W * (1 - p) * L_sample_sq / b + 2 * (1 - p) * L_sample_sq / (p * n * b)
    return _lemma_step(L_minus, K)


@_step_size
def dasha_mvr_stepsize(omega: float, A: float, a: float, L_minus: float, L_plus: float, L_sample_sq: float,
                       n: int, batch_size: int, momentum: float) -> float:
    """DASHA-MVR's step (permk's derivation, docs/dasha_steps.md): ``1/(L_− + sqrt(K))`` with
    ``K = 8AW L_+² + 8AW(1 + 2β)(1 − β)²ℒ²/b + 4(1 − β)²ℒ²/(β n b)``, ``W = 1/a + 2ω``, ``β`` the
    momentum of ``h_i^{t+1} = ∇f_{iB}(x^{t+1}) + (1 − β)(h_i^t − ∇f_{iB}(x^t))``; constants as in
    :func:`dasha_page_stepsize`. Every ``γ`` at most this step gives
    ``(1/T) Σ_{t<T} E‖∇f(x^t)‖² ≤ 2(f(x⁰) − f*)/(γT) + 2N`` with the noise floor
    ``N = ``:func:`dasha_mvr_noise` (from ``h_i⁰ = ∇f_i(x⁰)``).

    Constants whose step is not a finite positive number (too small or too large for float64)
    are a ValueError naming them (``check_step``), as are negative, NaN or infinite ones.

    >>> dasha_mvr_stepsize(0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 2, 1, 1.0)  # no compression, β = 1: 1/L_−
    0.5
    """
    W = _dasha_weight(omega, A, a)
    L_plus, L_sample_sq, n, b = _sample_constants(L_plus, L_sample_sq, n, batch_size)
    beta = check_real(momentum, "momentum", low=0.0, strict=True, high=1.0)
    K = (8 * W * L_plus**2 + 8 * W * (1 + 2 * beta) * (1 - beta) ** 2 * L_sample_sq / b
         + 4 * (1 - beta) ** 2 * L_sample_sq / (beta * n * b))
    return _lemma_step(L_minus, K)


def dasha_mvr_noise(omega: float, A: float, a: float, sigma_sq: float, n: int, batch_size: int, momentum: float) -> float:
    """The noise floor ``N = 4AW(1 + 2β)β²σ²/b + 2βσ²/(n b)`` of DASHA-MVR's bound
    (:func:`dasha_mvr_stepsize`; ``W = 1/a + 2ω``), with ``σ² = (1/n)Σ σ_i²`` and
    ``(1/m_i)Σ_j‖∇f_ij(x) − ∇f_i(x)‖² ≤ σ_i²`` for every ``x``.

    >>> dasha_mvr_noise(0.0, 0.0, 1.0, 3.0, 2, 3, 0.5)  # 2 · 0.5 · 3/(2 · 3)
    0.5
    """
    W = _dasha_weight(omega, A, a)
    sigma_sq = check_real(sigma_sq, "sigma_sq", low=0.0)
    n = check_int(n, "n", low=1)
    b = check_int(batch_size, "batch_size", low=1)
    beta = check_real(momentum, "momentum", low=0.0, strict=True, high=1.0)
    return 4 * W * (1 + 2 * beta) * beta**2 * sigma_sq / b + 2 * beta * sigma_sq / (n * b)
