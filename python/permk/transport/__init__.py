"""Transports: where the workers run and how their numbers move. A transport only moves
numbers; the arithmetic of each exchange is written once (:mod:`permk.exchanges`) and run by
every transport.

* :class:`Simulator` (:mod:`permk.transport.simulator`) — all ``n`` workers in one process;
* :class:`~permk.transport.mpi.MPIBackend` (:mod:`permk.transport.mpi`) — a block of workers per
  MPI process (:mod:`permk.distributed` runs methods on it);
* what they share (:mod:`permk.transport.base`): the :class:`Transport` protocol the exchanges
  call, the held workers' checked oracles (:class:`HeldWorkers`), the native kernel's protocol.
"""

from __future__ import annotations

from .base import PATHS, Backend, Fill, HeldWorkers, NativeKernel, Transport, check_problem
from .simulator import Simulator

__all__ = ["Transport", "Backend", "Fill", "NativeKernel", "HeldWorkers", "Simulator", "PATHS", "check_problem"]
