"""What the package's generic compressor tests ask of a compressor, beyond :class:`permk.Compressor`.

A compressor MAY implement the :class:`TestingHooks` protocol; the generic tests (bit-for-bit
agreement of the calls, Monte Carlo unbiasedness and AB checks, reproducibility, pickling) read
it through the functions below, which fall back to what every compressor has:

* :func:`examples` — the instances to test at ``(n, d)`` (default: ``cls.default(n, d)``);
* :func:`ab_exact` — whether the AB inequality holds with equality (default False: the Monte
  Carlo check then tests the inequality only);
* :func:`magnitude_bound` — an a-priori bound on ``|C_i(a_i)_j|`` that lets the statistical
  checks account for rare large outcomes (default None: none known).

>>> import permk, permk.testing
>>> permk.testing.ab_exact(permk.PermK()), permk.testing.examples(permk.RandK, 3, 9)
(True, [RandK(k=3)])
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["TestingHooks", "examples", "ab_exact", "magnitude_bound"]


@runtime_checkable
class TestingHooks(Protocol):
    """The optional test hooks of a compressor class (every member may be left out)."""

    #: Whether the stated AB inequality holds with equality for every input (PermK, RandK,
    #: Identity: their variance is exactly ``A·(1/n)Σ‖a_i‖² − B‖ā‖²``).
    ab_exact: bool

    @classmethod
    def examples(cls, n: int, d: int, rng: np.random.Generator | None = None) -> list[Any]:
        """Instances for ``n`` workers in dimension ``d`` (with ``rng``: parameters drawn at
        random), none where the class is not defined at ``(n, d)``."""
        ...

    def magnitude_bound(self, A: np.ndarray) -> np.ndarray | None:
        """A bound on ``|C_i(a_i)_j|`` for the inputs ``A`` (shape ``(n, d)``), or None."""
        ...


def examples(cls: Any, n: int, d: int, rng: np.random.Generator | None = None) -> list[Any]:
    """The instances of the compressor class ``cls`` the generic tests run at ``(n, d)``: its
    ``examples`` hook, else its standard instance ``cls.default(n, d)``."""
    hook = getattr(cls, "examples", None)
    return list(hook(n, d, rng=rng)) if hook is not None else [cls.default(n, d)]


def ab_exact(compressor: Any) -> bool:
    """Whether ``compressor`` states that its AB inequality is an equality (default False)."""
    return bool(getattr(compressor, "ab_exact", False))


def magnitude_bound(compressor: Any, A: np.ndarray) -> np.ndarray | None:
    """``compressor``'s bound on ``|C_i(a_i)_j|`` for the inputs ``A``, or None when it has none."""
    hook = getattr(compressor, "magnitude_bound", None)
    return None if hook is None else hook(A)  # type: ignore[no-any-return]
