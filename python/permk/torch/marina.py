"""MARINA and VR-MARINA for a torch model on ``torch.distributed``: two gradients on one minibatch
and a shared coin, which a DDP communication hook cannot give (it sees one gradient per step).

``x^{t+1} = x^t − γ g^t`` (here: the wrapped optimizer's step with ``g^t`` as the gradient; plain
SGD with ``lr = γ`` is MARINA itself); on heads of the shared coin ``θ_t ~ Be(p)`` (a pure function
of ``(seed, t)``: ``permk._core.coin``, MARINA's in :mod:`permk.methods.marina`)
``g^{t+1}`` is the average of the ranks' gradients at ``x^{t+1}`` (an all-reduce); on tails each
rank evaluates its loss on one minibatch at both points and sends
``C_i(∇f_{iB}(x^{t+1}) − ∇f_{iB}(x^t))``, and ``g^{t+1} = g^t + (1/n) Σ_i C_i(·)`` — the exchange
:data:`permk.exchanges.compressed_mean_rows` over :class:`permk.transport.ddp.DDPTransport`, the
one the simulator and MPI run for VR-MARINA. With a minibatch ``closure`` and a ``full_closure``
for the coin's rounds (the rank's whole shard) this is VR-MARINA; with the minibatch on both, the
online variant.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist

from .. import exchanges as ex
from .._core import coin
from .._validate import check_seed
from ..compressors import Compressor
from ..transport.ddp import DDPTransport, Planner, run

__all__ = ["Marina"]


class Marina:
    """MARINA / VR-MARINA around a torch optimizer (see the module docstring).

    ``params``: the model's parameters (one dtype and device); ``compressor``: an unbiased
    compressor with a shared plan (PermK, BlockPermK(n), RandK); ``optimizer``: a torch optimizer
    over ``params`` (``torch.optim.SGD(params, lr=γ)`` is MARINA); ``p``: the coin's probability
    (default ``ζ/d``, the compressor's share of the coordinates, as :func:`permk.marina`);
    ``seed``: the run's shared seed (the coin's and the plans'); ``process_group``: the ranks
    (``None``: the default group). The model must not be wrapped in DDP (the helper averages).

    :meth:`~permk.torch.marina.Marina.step` ``(closure, full_closure=None)`` runs one round: ``closure()`` computes this
    rank's loss on this step's minibatch and calls ``backward()`` — the helper clears the
    gradients before each call and calls it at the new and, on tails, at the previous parameters
    (the same minibatch: the closure must not draw a new one between the two calls).
    ``full_closure`` (VR-MARINA) is called instead on the coin's rounds and at the first step.
    ``last_mean`` is the last compressed round's ``(1/n) Σ_i C_i(·)``; ``heads`` counts the coin's
    rounds, ``bytes_sent`` this rank's bytes (its values on tails, its gradient on heads).
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], compressor: Compressor, optimizer: torch.optim.Optimizer, *,
                 seed: int, p: float | None = None, process_group: Any = None, lookahead: bool = True) -> None:
        if not isinstance(compressor, Compressor):
            raise TypeError(f"compressor: must be a permk Compressor, got {type(compressor).__name__}")
        if not compressor.capabilities.shared_plan or not compressor.capabilities.unbiased:
            raise ValueError(f"compressor: MARINA needs an unbiased compressor with a shared plan; {compressor.name} is not one")
        if not dist.is_initialized():
            raise RuntimeError("Marina: torch.distributed is not initialised (call dist.init_process_group first)")
        self.params = [q for q in params if q.requires_grad]
        if not self.params or len({q.dtype for q in self.params}) != 1 or len({q.device for q in self.params}) != 1:
            raise ValueError("params: one dtype and one device, at least one parameter requiring a gradient")
        self.compressor, self.optimizer, self.seed, self.group = compressor, optimizer, check_seed(seed), process_group
        g = process_group if process_group is not None else dist.group.WORLD
        self.n, self.rank = dist.get_world_size(g), dist.get_rank(g)
        self.d = sum(q.numel() for q in self.params)
        compressor.check(self.n, self.d)
        if p is None:
            p = min(1.0, compressor.expected_floats_per_worker(self.n, self.d) / self.d)
        if not 0.0 < float(p) <= 1.0:
            raise ValueError(f"p: the coin's probability must lie in (0, 1], got {p!r}")
        self.p = float(p)
        dtype, device = self.params[0].dtype, self.params[0].device
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="permk-plan") if lookahead else None
        planner = Planner(compressor, self.n, self.rank, self.d, self.seed, device, self._executor, "the parameters", dtype=dtype)
        self.transport = DDPTransport(process_group, self.n, self.rank, self.d, dtype, device, planner,
                                      floats=compressor.floats_per_worker(self.n, self.d))
        self.round = 0
        self.g: torch.Tensor | None = None
        self.last_mean: torch.Tensor | None = None
        self.heads = 0
        self.bytes_sent = 0

    # -- flat views ------------------------------------------------------------------------------
    def _flat(self, grads: bool) -> torch.Tensor:
        return torch.cat([(q.grad if grads and q.grad is not None else (torch.zeros_like(q) if grads else q.detach())).reshape(-1)
                          for q in self.params])

    def _set(self, flat: torch.Tensor, grads: bool) -> None:
        at = 0
        with torch.no_grad():
            for q in self.params:
                k = q.numel()
                v = flat[at : at + k].view_as(q)
                if grads:
                    q.grad = v.clone()
                else:
                    q.copy_(v)
                at += k

    def _grad_at_current(self, closure: Callable[[], Any]) -> tuple[Any, torch.Tensor]:
        for q in self.params:
            q.grad = None
        loss = closure()
        return loss, self._flat(grads=True)

    def _mean_grad(self, closure: Callable[[], Any]) -> tuple[Any, torch.Tensor]:
        loss, gx = self._grad_at_current(closure)
        dist.all_reduce(gx, group=self.group)
        self.bytes_sent += gx.numel() * gx.element_size()
        return loss, gx.div_(self.n)

    # -- the round -----------------------------------------------------------------------------------
    def step(self, closure: Callable[[], Any], full_closure: Callable[[], Any] | None = None) -> Any:
        """One MARINA round (see the class docstring); returns the loss ``closure`` (or
        ``full_closure`` on heads) computed at the new parameters."""
        full = full_closure or closure
        if self.g is None:  # g^0: the average of the gradients at x^0
            _, self.g = self._mean_grad(full)
        x_prev = self._flat(grads=False)
        self._set(self.g, grads=True)
        self.optimizer.step()  # x^{t+1} = x^t − γ g^t
        t = self.round
        if bool(coin(self.seed, t, self.p)):
            loss, self.g = self._mean_grad(full)
            self.heads += 1
        else:
            loss, gx = self._grad_at_current(closure)
            x_new = self._flat(grads=False)
            self._set(x_prev, grads=False)
            _, gy = self._grad_at_current(closure)
            self._set(x_new, grads=False)
            fut = run(ex.compressed_mean_rows, self.transport, self.compressor, (gx - gy).view(1, -1), seed=self.seed, round=t)
            self.bytes_sent += self.transport.last_bytes[0]
            self.last_mean = fut.wait().clone()
            self.g = self.g + self.last_mean
        self.round = t + 1
        return loss

    def state_dict(self) -> dict[str, Any]:
        """The round, the estimator ``g`` and the wrapped optimizer's state (resume with
        :meth:`~permk.torch.marina.Marina.load_state_dict`; the parameters are the model's)."""
        return {"round": self.round, "g": None if self.g is None else self.g.detach().cpu(), "heads": self.heads,
                "bytes_sent": self.bytes_sent, "optimizer": self.optimizer.state_dict(), "seed": self.seed, "p": self.p,
                "compressor": self.compressor.fingerprint(), "n": self.n}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Resume from :meth:`~permk.torch.marina.Marina.state_dict` (the same compressor, seed,
        coin and world size: ValueError naming the field otherwise)."""
        for name, mine in (("compressor", self.compressor.fingerprint()), ("seed", self.seed), ("p", self.p), ("n", self.n)):
            if sd[name] != mine:
                raise ValueError(f"state_dict: {name} {sd[name]!r} differs from this helper's {mine!r}")
        self.round, self.heads, self.bytes_sent = int(sd["round"]), int(sd["heads"]), int(sd["bytes_sent"])
        dev = self.params[0].device
        self.g = None if sd["g"] is None else sd["g"].to(dev)
        self.optimizer.load_state_dict(sd["optimizer"])

