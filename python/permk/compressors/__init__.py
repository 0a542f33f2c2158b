"""The compressors of the paper, each a small frozen object carrying its theory.

Every compressor is a *family* ``{C_i}`` for ``n`` workers (Assumptions 1-2 of the paper):

* ``compress(x, worker=i, n_workers=n, seed=s, round=t)`` is what worker ``i`` runs: a compact
  :class:`Message` (indices, values) of exactly the size the theory says;
* ``aggregate(A, seed=s, round=t)`` returns ``(1/n) Σ_i C_i(A[i])`` for the ``(n, d)`` array of
  worker inputs (summed in worker order, then divided by ``n``), and ``compress_all`` the rows
  ``C_i(A[i])``; both agree bit for bit with ``compress`` called worker by worker.

All randomness workers share in round ``t`` (PermK's permutations) is a pure function of
``(seed, t)``; per-worker randomness (RandK, quantizers) is a pure function of
``(seed, t, worker)``. The built-in compressors run in Rust. A new (possibly correlated) one is
a subclass of :class:`Compressor` that defines :meth:`Compressor.compress` or
:meth:`Compressor.plan`; :func:`permk.register` adds it to the catalog (``docs/extending.md``).

The modules: :mod:`~permk.compressors.messages` (what workers send: messages, plans, rounds),
:mod:`~permk.compressors.base` (:class:`Compressor`, its capabilities, the catalog),
:mod:`~permk.compressors.kernels` (the kernels the bulk calls run on: native, or Python over a
plan or over ``compress``), :mod:`~permk.compressors.fingerprint` (the MPI launch check's
digest), :mod:`~permk.compressors.rust` (the Rust-backed bases),
:mod:`~permk.compressors.permutation` (PermK and its family),
:mod:`~permk.compressors.independent` (RandK, TopK, Identity),
:mod:`~permk.compressors.quantizers`, :mod:`~permk.compressors.compose` and
:mod:`~permk.compressors.participation` (partial participation, a wrapper of any unbiased
compressor: ``permk.Participation``).

Every compressor declares what it can do in :attr:`Compressor.capabilities` (a
:class:`Capabilities`): whether its coordinates are shared from ``(seed, round)`` (then the
methods evaluate only the sent coordinates and MPI sends values without indices), whether the
workers' coordinates are disjoint or contiguous, whether its messages have a fixed size, whether
the receiver needs indices, which argument sets its message size. Every caller — the methods,
the MPI backend, the theory tools, the experiments, the tests — asks these, never the class.

>>> import numpy as np, permk
>>> A = np.arange(12.0).reshape(3, 4)
>>> c = permk.PermK()
>>> c.ab_constants(3, 4)
(1.0, 1.0)
>>> msg = c.compress(A[0], worker=0, n_workers=3, seed=1, round=0)
>>> len(msg.values) <= 2
True
>>> np.allclose(np.mean([c.aggregate(A, seed=1, round=t) for t in range(4000)], axis=0), A.mean(0), atol=0.3)
True
"""

from __future__ import annotations

from .base import COMPRESSORS, Capabilities, Compressor, VarianceBound
from .compose import Compose
from .independent import Identity, RandK, TopK
from .messages import Message, Messages, PendingRound, Plan, PlanRound, Ranges, Round, aggregate_messages
from .permutation import BlockPermK, CoordinateSampling, GroupPermK, PermK, PermutationOfMappings
from .quantizers import QSGD, NaturalCompression
from .rust import Quantizer, RustCompressor, Sparsifier

__all__ = [
    "Capabilities",
    "Message",
    "Messages",
    "Plan",
    "Round",
    "PlanRound",
    "PendingRound",
    "Ranges",
    "VarianceBound",
    "Compressor",
    "RustCompressor",
    "Sparsifier",
    "Quantizer",
    "PermK",
    "RandK",
    "TopK",
    "Identity",
    "BlockPermK",
    "CoordinateSampling",
    "GroupPermK",
    "PermutationOfMappings",
    "NaturalCompression",
    "QSGD",
    "Compose",
    "aggregate_messages",
    "catalog",
]


def catalog() -> dict[str, type[Compressor]]:
    """The compressor classes by lower-case name (``"permk"``, ``"randk"``, …): the package's,
    then those registered from outside it (:func:`permk.register`, the ``permk.plugins``
    entry points). What the experiments' ``--methods METHOD-COMPRESSOR`` and the generic tests
    enumerate."""
    return COMPRESSORS.all()
