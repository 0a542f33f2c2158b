"""The MPI backend's two transports of a shared plan's values (``mpiexec -n K python window.py``):
the shared-memory window (``window="auto"``/``True`` on one node) and the ``Allgatherv``
(``window=False``) give every compressed exchange ``Compressor.aggregate``'s bits, for one and
several workers per rank, consecutive rounds (the window's two buffers alternate), a larger
round after a smaller one (the window grows) and after ``close()``. Prints ``ok``."""

from __future__ import annotations

from mpi4py import MPI

import permk
from permk import exchanges as ex
from permk.distributed import LocalView, MPIBackend

comm = MPI.COMM_WORLD
size = comm.Get_size()
for n, d in ((size, 40), (2 * size, 37), (size, 5000)):
    q = permk.Quadratic.synthetic(n=n, d=d, lam=1e-3, noise_scale=0.3, seed=n)
    G = q.local_grads(q.x0 + 1.0)
    comps = [permk.PermK(), permk.PermK(sampler="shuffle"), permk.RandK(3), permk.CoordinateSampling(), permk.BlockPermK(min(2, n))]
    for window in ("auto", True, False):
        backend = MPIBackend(LocalView(q, comm=comm), comm, path="dense", window=window)
        for c in comps:
            for t in range(3):
                got = ex.compressed_mean(backend, c, q.x0 + 1.0, seed=3, round=t)
                want = c.aggregate(G, seed=3, round=t)
                assert got.tobytes() == want.tobytes(), (n, d, window, c.name, t)
        used = backend._win is not None
        assert used == (window is not False and size > 1), (window, used)
        backend.close()
        got = ex.compressed_mean(backend, permk.PermK(), q.x0 + 1.0, seed=4, round=0)
        assert got.tobytes() == permk.PermK().aggregate(G, seed=4, round=0).tobytes()
        backend.close()
if comm.Get_rank() == 0:
    print("ok", flush=True)
