"""The MPI backend's reused aggregate buffer (``python buffers.py`` or under mpiexec): a buffer
the caller still holds is never written again; one it has let go of is reused. Prints ``ok``."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import permk
from permk import exchanges as ex
from permk.distributed import LocalView, MPIBackend

comm = MPI.COMM_WORLD
n = comm.Get_size()
q = permk.Quadratic.synthetic(n=n, d=10, lam=1e-3, noise_scale=0.3, seed=0)
backend = MPIBackend(LocalView(q, comm=comm), comm)
c = permk.BlockPermK(n)  # one worker per rank, one contiguous block each: the in-place exchange
x, y = q.x0 + 1.0, q.x0 - 1.0
first = ex.compressed_mean(backend, c, x, seed=1, round=0)
kept = first.copy()
second = ex.compressed_mean(backend, c, y, seed=1, round=1)  # `first` is still held: a new buffer
assert second is not first and np.array_equal(first, kept), "a held aggregate was overwritten"
view = second[2:5]
del second
third = ex.compressed_mean(backend, c, x, seed=1, round=0)  # a view still holds `second`: a new buffer
assert third.base is None and not np.shares_memory(third, view)
address = third.__array_interface__["data"][0]
del third, view
fourth = ex.compressed_mean(backend, c, x, seed=1, round=0)  # nothing holds the last one: reused
assert fourth.__array_interface__["data"][0] == address, "a released aggregate buffer was not reused"
assert np.array_equal(fourth, kept)
if comm.Get_rank() == 0:
    print("ok", flush=True)
