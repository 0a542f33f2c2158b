"""PermK for PyTorch users (the ``permk[torch]`` extra).

- :func:`comm_hook` (:mod:`permk.torch.hook`): a DistributedDataParallel communication hook
  in which each rank sends only the coordinates a permk compressor gives it (PermK, BlockPermK,
  shared-seed RandK), with the round's shared plan computed from ``(seed, round)`` on every rank.
- :class:`Marina` (:mod:`permk.torch.marina`): MARINA and VR-MARINA around a torch optimizer
  (two gradients on one minibatch and a shared coin, which a hook cannot give).
- :class:`ShardedOptimizer` (:mod:`permk.torch.sharded`): sharded optimizer state in which each
  rank receives only its shard of the compressed average, one ``all_to_all`` of PermK's values.
- :class:`ModuleProblem` (:mod:`permk.torch.problem`): a ``torch.nn.Module`` and a loss over
  one data shard per worker as a permk problem, so every permk method and backend trains a
  network; :class:`LocalModuleProblem`, one MPI process's workers of it;
  :func:`two_layer_network`, the authors' two-layer network task on Fashion-MNIST.

``import permk`` never imports torch; ``import permk.torch`` does, and says how to install it
when it is missing.
"""

from __future__ import annotations

import importlib
from typing import Any

try:
    import torch as _torch  # noqa: F401 - the extra's one requirement, checked once here
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "permk.torch needs PyTorch, which is not installed: pip install 'permk[torch]' "
        "(PyTorch's default Linux wheel also pulls several GB of CUDA libraries)"
    ) from exc

# public name -> submodule defining it; loaded on first use
_WHERE = {
    "comm_hook": "hook",
    "HookState": "hook",
    "Marina": "marina",
    "ShardedOptimizer": "sharded",
    "ModuleProblem": "problem",
    "LocalModuleProblem": "problem",
    "two_layer_network": "problem",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
