"""Counting what a transport hands to the wire: :class:`ByteCounter`.

A transport that moves numbers between processes (MPI, torch.distributed) tells its counter what
each exchange sent; a driver takes the counts once per round. The counter keeps, for the round
so far: the bytes this process handed to the collectives as its workers' messages (``sent``),
the bytes it broadcast back (``broadcast``, the server's), the largest message of one worker
(``worker_max``, summed over the round's exchanges) and the theory's size of that message
(``theory``). Exchanges that are not communication (the initial exchange, the record's metrics)
run inside :meth:`ByteCounter.paused`.

>>> c = ByteCounter()
>>> c.sent(800, per_worker=400); c.theory(400)
>>> with c.paused():
...     c.sent(10**6, per_worker=10**6)
>>> c.take(), c.take()
((800, 0, 400, 400), (0, 0, 0, 0))
"""

from __future__ import annotations

import contextlib
from typing import Iterator

__all__ = ["ByteCounter"]


class ByteCounter:
    """The bytes of the exchanges of one round (see the module docstring)."""

    def __init__(self) -> None:
        self.counting = True
        self._up = self._down = self._worker = self._theory = 0

    def sent(self, nbytes: int, *, per_worker: int) -> None:
        """This process handed ``nbytes`` to a collective; one worker's message was ``per_worker``."""
        if self.counting:
            self._up += int(nbytes)
            self._worker += int(per_worker)

    def broadcast(self, nbytes: int) -> None:
        """This process broadcast ``nbytes`` (the server's aggregate)."""
        if self.counting:
            self._down += int(nbytes)

    def theory(self, nbytes: int) -> None:
        """The theory's size of one worker's message in this exchange."""
        if self.counting:
            self._theory += int(nbytes)

    def take(self) -> tuple[int, int, int, int]:
        """The round's ``(sent, broadcast, worker_max, theory)``, and reset them."""
        out = (self._up, self._down, self._worker, self._theory)
        self._up = self._down = self._worker = self._theory = 0
        return out

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Exchanges inside are not counted (and leave the round's counts as they were)."""
        saved, was = (self._up, self._down, self._worker, self._theory), self.counting
        self.counting = False
        try:
            yield
        finally:
            self.counting = was
            self._up, self._down, self._worker, self._theory = saved
