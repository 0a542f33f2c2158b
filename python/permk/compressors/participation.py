"""Partial participation as a compressor: ``s`` of the ``n`` workers send in a round.

In partial participation (PP-MARINA: Gorbunov et al. 2021, "MARINA: Faster non-convex
distributed learning with compression"; DASHA-PP: Tyurin & Richtárik 2022, "A computation and
communication efficient method for distributed nonconvex problems in the partial participation
setting") the server samples ``s`` of the ``n`` workers uniformly without replacement in every
round and only those send; the server divides their sum by ``s``, i.e. each message counts
``n/s`` times in the mean over ``n``. :class:`Participation` is that sampling written as a
compressor family around an inner one: worker ``i`` sends

    Q_i(x) = (n/s) · C_i(x)   if i ∈ S_t,        Q_i(x) = 0 (nothing)   otherwise,

with ``S_t`` (:func:`participants`) a pure function of ``(seed, t)``, the same for every worker.
So every exchange, both backends and the MPI byte count run it unchanged: a non-participant's
message is empty, and with an inner shared plan the wrapped plan is the inner plan restricted to
``S_t`` (values only travel).

Its theory (unbiased inner ``{C_i} ∈ U(A_C, B_C)`` with ``C_i ∈ U(ω_C)``, ``S_t`` independent of
the ``C_i``; ``κ = (n − s)/(s(n − 1))``, the variance factor of sampling ``s`` of ``n`` without
replacement, 0 when ``s = n``):

* ``ω = (n/s)(ω_C + 1) − 1`` (each ``Q_i`` alone);
* ``A = (n/s)·A_C + (1 − B_C)κ``, ``B = B_C + (1 − B_C)κ``. (Condition on ``S``: the inner AB
  inequality on the inputs with the non-participants' rows set to zero, times ``(n/s)²``, plus the
  sampling variance ``κ((1/n)Σ‖a_i‖² − ‖ā‖²)`` of the mean over ``S``.) Independent ``C_i``
  (``A_C = ω_C/n``, ``B_C = 0``) give ``A = ω_C/s + κ``, ``B = κ``; PermK (``A_C = B_C = 1``)
  gives ``(n/s, 1)``.

>>> import numpy as np, permk
>>> from permk.compressors.participation import Participation
>>> c = Participation(permk.RandK(2), 3)
>>> c.omega(6, 8), c.ab_constants(6, 8)
(7.0, (1.2, 0.2))
>>> A = np.arange(48.0).reshape(6, 8)
>>> sent = [len(c.compress(A[i], worker=i, n_workers=6, seed=1, round=0).values) for i in range(6)]
>>> sorted(sent)
[0, 0, 0, 2, 2, 2]
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._core import numpy_permutation_head
from .._validate import as_float_array, check_int, check_seed
from ..testing import magnitude_bound
from .base import COMPRESSORS, Capabilities, Compressor, VarianceBound
from .messages import Message, PendingRound, Plan, ReadyRound, Round

__all__ = ["Participation", "participants", "participation_mask", "check_participation"]

#: The stream tag of the participant sampling (a pure function of ``(seed, round)``).
_SAMPLING_TAG = 0x70617274  # "part"


def _sample_numpy(n: int, s: int, seed: int, round: int) -> np.ndarray:
    """The draw's definition: the sorted first ``s`` of numpy's
    ``default_rng([seed, round, tag]).permutation(n)``."""
    return np.sort(np.random.default_rng([seed, round, _SAMPLING_TAG]).permutation(n)[:s]).astype(np.int64)


@functools.lru_cache(maxsize=16)
def _sample(n: int, s: int, seed: int, round: int) -> np.ndarray:
    """:func:`_sample_numpy`, computed by the core's native twin of numpy's generator (the same
    numbers: tests/test_participation.py), without numpy's per-round generator construction."""
    out = numpy_permutation_head([seed, round, _SAMPLING_TAG], n, s)
    out.flags.writeable = False
    return out


def check_participation(s: Any, n: int | None) -> int:
    """``s`` as the number of participating workers of ``n``: an integer in ``1..n`` (TypeError
    for a non-integer, ValueError outside; ``n=None``: any positive integer, the workers not
    yet known)."""
    if isinstance(s, (bool, np.bool_)) or not isinstance(s, numbers.Integral):
        raise TypeError(f"participation must be an integer, got {type(s).__name__}")
    v = int(s)
    if n is None:
        if v < 1:
            raise ValueError(f"participation must be a positive number of workers (1..n), got {v}")
    elif not 1 <= v <= n:
        raise ValueError(f"participation must be in 1..n = 1..{n}, got {v}")
    return v


def participants(n: int, s: int, *, seed: int, round: int) -> np.ndarray:
    """The sorted indices of the ``s`` of ``n`` workers that participate in round ``round``:
    uniform over the ``s``-subsets, a pure function of ``(seed, round)`` shared by all workers
    (read-only).

    >>> participants(5, 2, seed=0, round=3).tolist() == participants(5, 2, seed=0, round=3).tolist()
    True
    """
    n = check_int(n, "n_workers", low=1)
    return _sample(n, check_participation(s, n), check_seed(seed), check_int(round, "round"))


def participation_mask(n: int, s: int, *, seed: int, round: int) -> np.ndarray:
    """``participants`` as a boolean mask over the ``n`` workers."""
    mask = np.zeros(check_int(n, "n_workers", low=1), dtype=bool)
    mask[participants(n, s, seed=seed, round=round)] = True
    return mask


def _kappa(n: int, s: int) -> float:
    """``(n − s)/(s(n − 1))``: ``E‖(1/s)Σ_{i∈S} a_i − ā‖² = κ((1/n)Σ‖a_i‖² − ‖ā‖²)`` for ``S``
    uniform over the ``s``-subsets of ``n``."""
    return 0.0 if s == n else (n - s) / (s * (n - 1))


@dataclass(frozen=True)
class Participation(Compressor):
    """``s`` of ``n`` workers send per round, each message the inner compressor's scaled by
    ``n/s`` (see the module docstring for the sampling and the constants).

    ``inner`` must be unbiased (the scaled messages of a contractive compressor are not
    contractive). Capabilities are the inner's, except: message sizes vary (a non-participant
    sends nothing), so ``fixed_size`` is False; the largest message of a round is a
    participant's, which reaches the inner's largest size surely only when every inner message
    has it (``random_size`` otherwise: PermK with ``n ∤ d``); nothing is deterministic; there is
    no size argument to tune. The bits count the inner's largest message; the expected size is
    ``s/n`` of the inner's.
    """

    inner: Compressor
    s: int

    def __post_init__(self) -> None:
        if not isinstance(self.inner, Compressor):
            raise TypeError(f"Participation's inner must be a permk.Compressor, got {type(self.inner).__name__}")
        if isinstance(self.inner, Participation):  # both would draw the same participants from (seed, round)
            raise TypeError("Participation's inner must not itself be a Participation")
        if not self.inner.capabilities.unbiased:
            raise ValueError(f"partial participation needs an unbiased inner compressor; {self.inner.name} is biased")
        object.__setattr__(self, "s", check_participation(self.s, None))

    @functools.cached_property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        """The inner's capabilities, changed as the class docstring says (computed once: every
        round's exchange reads them)."""
        caps = self.inner.capabilities
        # the round's largest message is a participant's: the inner's size when every message has it
        return dataclasses.replace(caps, fixed_size=False, random_size=caps.random_size or not caps.fixed_size,
                                   deterministic=False, tunable=None)

    @property
    def name(self) -> str:
        return f"{self.inner.name}[s={self.s}]"

    @classmethod
    def default(cls, n: int, d: int) -> Participation:
        """Half of the workers (at least one), each running PermK."""
        return cls(COMPRESSORS.builtins()["permk"](), max(1, n // 2))

    @classmethod
    def examples(cls, n: int, d: int, rng: np.random.Generator | None = None) -> list[Compressor]:
        """PermK and RandK (from the package's catalog) inside."""
        c = COMPRESSORS.builtins()
        permk, randk = c["permk"], c["randk"]
        if rng is None:
            return [cls(permk(), max(1, n // 2)), cls(randk(max(1, d // 2)), max(1, n - 1))]
        return [cls(randk(int(rng.integers(1, d + 1))), int(rng.integers(1, n + 1)))]

    def check(self, n: int, d: int) -> None:
        super().check(n, d)
        self.inner.check(n, d)
        if self.s > n:
            raise ValueError(f"participation must be in 1..n = 1..{n}, got {self.s}")

    # -- theory ---------------------------------------------------------------------------
    def omega(self, n: int, d: int) -> float | None:
        self.check(n, d)
        w = self.inner.omega(n, d)
        return None if w is None else n / self.s * (w + 1.0) - 1.0

    def ab_constants(self, n: int, d: int) -> tuple[float, float] | None:
        self.check(n, d)
        ab = self.inner.ab_constants(n, d)
        if ab is None:
            return None
        a, b = float(ab[0]), float(ab[1])
        kappa = _kappa(n, self.s) * max(0.0, 1.0 - b)
        return (n / self.s * a + kappa, b + kappa)

    def floats_per_worker(self, n: int, d: int) -> int:
        return self.inner.floats_per_worker(n, d)

    def expected_floats_per_worker(self, n: int, d: int) -> float:
        return self.s / n * self.inner.expected_floats_per_worker(n, d)

    def value_bits(self, float_bits: int = 32) -> int:
        return self.inner.value_bits(float_bits)

    def overhead_bits(self, float_bits: int = 32) -> int:
        return self.inner.overhead_bits(float_bits)

    def bits_per_worker(self, n: int, d: int, *, float_bits: int = 32, indices: bool = True) -> int:
        return self.inner.bits_per_worker(n, d, float_bits=float_bits, indices=indices)

    def expected_bits_per_worker(self, n: int, d: int, *, float_bits: int = 32, indices: bool = True) -> float:
        return self.s / n * self.inner.expected_bits_per_worker(n, d, float_bits=float_bits, indices=indices)

    def variance_bound(self, n: int, d: int, constants: Any, problem: Any = None) -> VarianceBound:
        """MARINA's ``L̂²`` from this family's ``(A, B)`` (Theorem "AB" holds for any unbiased
        family with AB constants), named as the partial-participation step."""
        bound = super().variance_bound(n, d, constants, problem)
        return bound._replace(theorem="Theorem AB (partial participation)", pl_theorem="Theorem AB-PL (partial participation)")

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray | None:
        bound = magnitude_bound(self.inner, A)
        return None if bound is None else np.shape(A)[0] / self.s * bound

    # -- calls ------------------------------------------------------------------------------
    def scale(self, n: int) -> float:
        """``n/s``: the factor of a participant's message."""
        return n / self.s

    def participants(self, n: int, *, seed: int, round: int) -> np.ndarray:
        """The round's participants (:func:`participants`)."""
        return participants(n, self.s, seed=seed, round=round)

    @property
    def native_rounds(self) -> bool:
        """Whether :meth:`round` gives the core's rounds (``permk._core.Round``): an inner
        compressor with a native kernel and a shared plan (the exchanges' Rust path reads them)."""
        return self.inner.kernel is not None and self.inner.capabilities.shared_plan

    def round(self, n: int, d: int, *, seed: int, round: int) -> Round:
        """The round's shared plan: the inner round restricted to the participants, scales
        times ``n/s`` — natively (``Round.restricted``, the same plan as :meth:`plan`) when
        the inner round is native, else over :meth:`plan`."""
        if not self.native_rounds:
            return super().round(n, d, seed=seed, round=round)
        self.check(n, d)
        inner = self.inner.round(n, d, seed=seed, round=round)
        return inner.restricted(self.participants(n, seed=seed, round=round), self.scale(n))  # type: ignore[attr-defined,no-any-return]

    def round_ahead(self, n: int, d: int, *, seed: int, round: int) -> PendingRound:
        """:meth:`round`, computed at once."""
        if not self.native_rounds:
            return super().round_ahead(n, d, seed=seed, round=round)
        return ReadyRound(self.round(n, d, seed=seed, round=round))

    def plan(self, n: int, d: int, *, seed: int, round: int) -> Plan | None:
        """The inner plan restricted to the round's participants, scales times ``n/s`` (the
        last round's plan is kept: every worker's :meth:`compress` of a round reads it)."""
        if not self.capabilities.shared_plan:
            return None
        self.check(n, d)
        key = (n, d, check_seed(seed), check_int(round, "round"))
        last = self._last_plan
        if key not in last:
            last.clear()
            last[key] = self._restricted_plan(n, d, seed=seed, round=round)
        return last[key]

    @functools.cached_property
    def _last_plan(self) -> dict[tuple[int, int, int, int], Plan | None]:
        """The last round's plan by ``(n, d, seed, round)`` (a cache: it does not pickle)."""
        return {}

    def _restricted_plan(self, n: int, d: int, *, seed: int, round: int) -> Plan | None:
        inner = self.inner.plan(n, d, seed=seed, round=round)
        if inner is None:
            return None
        who = self.participants(n, seed=seed, round=round)
        sizes = np.zeros(n, dtype=np.int64)
        sizes[who] = np.diff(inner.offsets)[who]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        coords = (np.concatenate([inner.coords[inner.offsets[i] : inner.offsets[i + 1]] for i in who])
                  if len(who) else np.zeros(0, dtype=np.int64))
        scales = np.asarray(inner.scales, dtype=np.float64) * self.scale(n)
        return Plan(offsets, coords.astype(np.int64, copy=False), scales)

    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> Message:
        x = as_float_array(x, 1, "x")
        n = check_int(n_workers, "n_workers", low=1)
        w = check_int(worker, "worker", high=n)
        d = x.shape[0]
        who = self.participants(n, seed=seed, round=round)
        if not np.any(who == w):
            return Message(worker=w, n_workers=n, d=d, indices=np.zeros(0, dtype=np.int64), values=np.zeros(0, dtype=x.dtype))
        plan = self.plan(n, d, seed=seed, round=round)
        if plan is not None:  # the plan's arithmetic: scale · x rounded once, as every path computes it
            coords = plan.worker(w)
            values = (x[coords].astype(np.float64) * plan.scales[w]).astype(x.dtype)
            return Message(worker=w, n_workers=n, d=d, indices=coords, values=values)
        m = self.inner.checked_compress(x, worker=w, n_workers=n, seed=seed, round=round)
        values = (m.values.astype(np.float64) * self.scale(n)).astype(m.values.dtype)
        return Message(worker=w, n_workers=n, d=d, indices=m.indices, values=values)
