"""The AB inequality measured (Assumption "AB inequality", eq. (AB)): Monte Carlo estimates of
``E‖(1/n) Σ C_i(a_i) − ā‖²`` on adversarial inputs, and the ``(A, B)`` they allow, for any
compressor — built in, or defined in Python.

>>> import permk
>>> estimate_ab(permk.PermK(), n=4, d=8, trials=500, seed=1).consistent  # IV(1): A = B = 1
True
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .._validate import as_float_array, check_int, check_output, check_seed
from ..compressors import Compressor

__all__ = ["ABInput", "ABEstimate", "estimate_ab"]


@dataclass(frozen=True)
class ABInput:
    """One input set ``a_1, …, a_n`` of :func:`estimate_ab`: ``S = (1/n) Σ ‖a_i‖²``,
    ``M = ‖ā‖²``, the Monte Carlo mean of ``‖(1/n) Σ C_i(a_i) − ā‖²`` and its confidence
    interval, and the right-hand side ``A·S − B·M`` of eq. (AB) with the stated constants; and
    the bias: ``‖(1/T) Σ_t (1/n) Σ C_i(a_i) − ā‖²`` (``bias``), the tolerance an unbiased
    compressor stays within with probability at least the Bonferroni level (``bias_tolerance``,
    Markov's inequality on ``E‖mean error‖² = E‖err‖²/T`` with the upper end of the variance
    interval), and whether the bias is within it (``unbiased``). The bias test has power only
    where the tolerance is below ``E‖err‖²`` (``variance``): ``‖mean error‖²`` never exceeds the
    mean of ``‖err‖²`` (Jensen), so below that — about ``trials · level ≤ 1``, e.g. fewer than
    ~120 trials on the six built-in inputs at 95% — even a compressor that always sends zeros
    stays within it, and ``unbiased`` (then ``consistent``) is None: undetermined, not True."""

    name: str
    S: float
    M: float
    variance: float
    interval: tuple[float, float]
    stated_bound: float | None
    #: Whether the compressor looks unbiased on this input and the lower end of the interval is
    #: at most ``A·S − B·M`` (up to rounding): the data does not refute the stated constants.
    #: None when no constants are stated, or when the variance fits them but the bias test has
    #: no power at this trial count (``unbiased`` None).
    consistent: bool | None
    bias: float
    bias_tolerance: float
    #: True: the bias is within the tolerance; False: beyond it (biased); None: undetermined (the
    #: tolerance is at least ``variance``, so no bias could have exceeded it: more trials).
    unbiased: bool | None


@dataclass(frozen=True)
class ABEstimate:
    """The AB constants a compressor shows on the inputs of :func:`estimate_ab` (estimates).

    Each input gives the linear constraint ``variance ≤ A·S − B·M`` on ``(A, B)``. ``A`` is the
    smallest ``A`` consistent with every input for ``B = stated B`` (0 if none is stated),
    ``B`` the largest ``B`` for ``A = stated A`` (the estimated ``A`` if none); the intervals
    come from the variance intervals, which hold simultaneously with probability about
    ``confidence`` (CLT with Student-t quantiles, Bonferroni over the inputs). :meth:`min_A` and :meth:`max_B` trace the
    boundary of the feasible region for other values. Finitely many inputs can only show that
    constants are *at least* this large: they are estimates, not proofs.
    """

    compressor: str
    n: int
    d: int
    trials: int
    confidence: float
    seed: int
    inputs: tuple[ABInput, ...]
    stated: tuple[float, float] | None
    A: float
    A_interval: tuple[float, float]
    B: float
    B_interval: tuple[float, float]

    def min_A(self, B: float) -> tuple[float, float, float]:
        """``(estimate, low, high)`` of the smallest ``A`` with ``variance ≤ A·S − B·M`` on every input."""

        def at(v: Callable[[ABInput], float]) -> float:
            return max((v(i) + B * i.M) / i.S for i in self.inputs)

        return at(lambda i: i.variance), at(lambda i: i.interval[0]), at(lambda i: i.interval[1])

    def max_B(self, A: float) -> tuple[float, float, float]:
        """``(estimate, low, high)`` of the largest ``B`` with ``variance ≤ A·S − B·M`` on every
        input (``inf`` when no input has ``M > 0``)."""

        def at(v: Callable[[ABInput], float]) -> float:
            return min(((A * i.S - v(i)) / i.M for i in self.inputs if i.M > 0), default=math.inf)

        # a larger variance leaves room for a smaller B only
        return at(lambda i: i.variance), at(lambda i: i.interval[1]), at(lambda i: i.interval[0])

    @property
    def consistent(self) -> bool | None:
        """Whether every input is consistent with the stated constants: False when an input
        refutes them (its variance, or a measured bias: the AB inequality presumes an unbiased
        compressor), else None when none are stated or an input's bias is undetermined
        (:class:`ABInput`: too few trials for the bias test), else True."""
        if self.stated is None:
            return None
        return _all3(i.consistent for i in self.inputs)

    @property
    def unbiased(self) -> bool | None:
        """False when an input shows a bias beyond its tolerance, None when an input's bias
        test has no power at this trial count (undetermined), else True (:class:`ABInput`)."""
        return _all3(i.unbiased for i in self.inputs)

    def summary(self) -> str:
        """A few lines for humans."""
        lines = [f"{self.compressor} on n={self.n}, d={self.d}: {self.trials} rounds per input, {self.confidence:.0%} intervals"]
        for i in self.inputs:
            ok = "" if i.consistent is None else ("  ok" if i.consistent else "  VIOLATES stated")
            if i.unbiased is None:
                ok += f"  bias undetermined (tolerance {i.bias_tolerance:.4g} ≥ E‖err‖²: more trials)"
            elif not i.unbiased:
                ok += f"  BIASED (‖mean error‖²={i.bias:.4g} > {i.bias_tolerance:.4g})"
            low, high = i.interval
            lines.append(f"  {i.name:<11} S={i.S:.4g} M={i.M:.4g} E‖err‖²={i.variance:.4g} [{low:.4g}, {high:.4g}]{ok}")
        lines.append(f"  stated (A, B) = {self.stated}")
        (a0, a1), (b0, b1) = self.A_interval, self.B_interval
        B_ref, A_ref = (0.0, self.A) if self.stated is None else (self.stated[1], self.stated[0])
        lines.append(f"  smallest A at B = {B_ref:.4g}: {self.A:.4g} [{a0:.4g}, {a1:.4g}]")
        lines.append(f"  largest B at A = {A_ref:.4g}: {self.B:.4g} [{b0:.4g}, {b1:.4g}]")
        return "\n".join(lines)


def _adversarial_inputs(n: int, d: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Input sets that make common compressors reach their constants: equal inputs (variance
    ``(A − B)S``), disjoint supports (orthogonal, as far as ``n ≤ d`` allows), one active
    worker, i.i.d. Gaussian, and a common mean plus small noise."""
    a = rng.standard_normal(d)
    disjoint = np.zeros((n, d))
    k = np.arange(max(n, d))
    disjoint[k % n, k % d] = rng.standard_normal(k.size)
    single = np.zeros((n, d))
    single[0] = rng.standard_normal(d)
    return {
        "equal": np.tile(a, (n, 1)),
        "ones": np.ones((n, d)),
        "disjoint": disjoint,
        "single": single,
        "gaussian": rng.standard_normal((n, d)),
        "mean+noise": a + 0.1 * rng.standard_normal((n, d)),
    }


def estimate_ab(
    compressor: Compressor,
    *,
    n: int,
    d: int,
    inputs: Any = None,
    trials: int = 2000,
    seed: int | None = None,
    confidence: float = 0.95,
) -> ABEstimate:
    """Measure ``E‖(1/n) Σ C_i(a_i) − ā‖²`` (eq. (AB)) and the ``(A, B)`` it implies.

    ``inputs``: None or ``"adversarial"`` for a built-in set of inputs (equal, all-ones,
    disjoint supports, one active worker, Gaussian, mean + noise), an ``(n, d)`` array, or a
    sequence of them. For each input the squared error of ``compressor.aggregate(a, seed=seed,
    round=t)`` is averaged over ``t < trials`` (a Student-t interval, ``trials − 1`` degrees
    of freedom, at the Bonferroni level ``1 − (1 − confidence)/#inputs``: the normal quantile
    made the intervals far too short at a few trials, and refuted true constants in a third of
    the seeds at ``trials=2``). ``seed`` (random if None, reported)
    also draws the built-in inputs. See :class:`ABEstimate` for ``A``, ``B`` and their
    intervals; the AB inequality presumes an unbiased compressor: the mean error is measured too
    (``unbiased``, :class:`ABInput`'s ``bias``), and a biased compressor is not ``consistent``;
    with too few ``trials`` for the bias test to have power, ``unbiased`` and ``consistent`` are
    None (undetermined), never a True the data cannot back.

    Any :class:`permk.Compressor` works, including one defined in Python — here independent
    Rand1 (each worker sends one random coordinate, scaled by ``d``: ``ω = d − 1``, so
    ``(A, B) = ((d − 1)/n, 0)`` by the paper's lemma on independent unbiased compressors):

    >>> import numpy as np, permk
    >>> class Rand1(permk.Compressor):
    ...     def floats_per_worker(self, n, d): return 1
    ...     def ab_constants(self, n, d): return ((d - 1) / n, 0.0)
    ...     def compress(self, x, *, worker, n_workers, seed, round):
    ...         x = np.asarray(x, dtype=float)
    ...         j = np.random.default_rng((seed, round, worker)).integers(x.size)
    ...         return permk.Message(worker, n_workers, x.size, np.array([j]), np.array([x.size * x[j]]))
    >>> est = estimate_ab(Rand1(), n=4, d=6, trials=1000, seed=1)
    >>> est.stated, est.consistent, bool(est.A_interval[0] <= 1.25 <= est.A_interval[1])
    ((1.25, 0.0), True, True)
    >>> estimate_ab(permk.PermK(), n=4, d=8, trials=500, seed=1).consistent  # IV(1): A = B = 1
    True
    """
    if not isinstance(compressor, Compressor):
        raise TypeError(f"compressor must be a permk.Compressor, got {type(compressor).__name__}")
    n, d = check_int(n, "n", low=1), check_int(d, "d", low=1)
    compressor.check(n, d)
    trials = check_int(trials, "trials", low=2)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    seed = int(np.random.default_rng().integers(2**63)) if seed is None else check_seed(seed)
    sets = _input_sets(inputs, n, d, np.random.default_rng(seed))
    level = (1 - confidence) / len(sets)  # Bonferroni over the inputs
    from scipy.stats import t as student_t  # imported here: `import permk` stays light

    z = float(student_t.ppf(1 - level / 2, trials - 1))
    stated_raw = compressor.ab_constants(n, d)
    stated = None if stated_raw is None else (float(stated_raw[0]), float(stated_raw[1]))
    results = []
    for name, a in sets.items():
        mean = a.mean(axis=0)
        rounds = [compressor.aggregate(a, seed=seed, round=t) for t in range(trials)]
        err = check_output(rounds, (trials, d), f"{compressor.name}.aggregate", finite=True) - mean
        sq = np.einsum("tj,tj->t", err, err)
        half = z * float(sq.std(ddof=1)) / math.sqrt(trials)
        S, M = float(np.mean(np.einsum("ij,ij->i", a, a))), float(mean @ mean)
        low = max(float(sq.mean()) - half, 0.0)
        bound = None if stated is None else stated[0] * S - stated[1] * M
        high = float(sq.mean()) + half
        mean_err = err.mean(axis=0)
        bias = float(mean_err @ mean_err)
        # Markov: P(‖mean error‖² > E‖err‖²/(T·level)) ≤ level for an unbiased compressor whose
        # rounds are independent; plus the rounding of T sums of inputs of size S
        rounding = (1e-12 * d) ** 2 * (S + M)
        tolerance = high / (trials * level) + rounding
        variance = float(sq.mean())
        unbiased: bool | None
        if variance <= rounding:  # every error is rounding: no bias to find
            unbiased = True
        elif tolerance >= variance:  # ‖mean error‖² ≤ E‖err‖² always: the test cannot reject
            unbiased = None
        else:
            unbiased = bias <= tolerance
        consistent: bool | None = None
        if stated is not None:
            fits = low <= bound + 1e-12 * (stated[0] * S + stated[1] * M)  # type: ignore[operator]
            consistent = False if not fits else unbiased
        results.append(
            ABInput(
                name=name, S=S, M=M, variance=variance, interval=(low, high), stated_bound=bound,
                consistent=consistent, bias=bias, bias_tolerance=tolerance, unbiased=unbiased,
            )  # fmt: skip
        )
    est = ABEstimate(
        compressor=compressor.name, n=n, d=d, trials=trials, confidence=confidence, seed=seed, inputs=tuple(results),
        stated=stated, A=math.nan, A_interval=(math.nan, math.nan), B=math.nan, B_interval=(math.nan, math.nan),
    )  # fmt: skip
    A, A_lo, A_hi = est.min_A(0.0 if stated is None else stated[1])
    B, B_lo, B_hi = est.max_B(A if stated is None else stated[0])
    return dataclasses.replace(est, A=A, A_interval=(A_lo, A_hi), B=B, B_interval=(B_lo, B_hi))


def _all3(values: Any) -> bool | None:
    """Three-valued ``all``: False if any is False, else None if any is None, else True."""
    vals = list(values)
    if any(v is False for v in vals):
        return False
    return None if any(v is None for v in vals) else True


def _input_sets(inputs: Any, n: int, d: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    if inputs is None or (isinstance(inputs, str) and inputs == "adversarial"):
        return _adversarial_inputs(n, d, rng)
    if isinstance(inputs, str):
        raise ValueError(f"inputs must be None, 'adversarial', an (n, d) array or a sequence of them, got {inputs!r}")
    items = [inputs] if np.ndim(inputs) == 2 else list(inputs)
    out = {}
    for k, a in enumerate(items):
        a = as_float_array(a, 2, f"inputs[{k}]").astype(np.float64)
        if a.shape != (n, d):
            raise ValueError(f"inputs[{k}] must have shape ({n}, {d}), got {a.shape}")
        if not np.isfinite(a).all():
            raise ValueError(f"inputs[{k}] must be finite")
        if not a.any():
            raise ValueError(f"inputs[{k}] is all zeros: it constrains nothing")
        out[f"input{k}"] = a
    if not out:
        raise ValueError("inputs must not be empty")
    return out


