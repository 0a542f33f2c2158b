"""The docstring examples of every module of the package run and pass (here, and only here)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import permk

MODULES = sorted(m.name for m in pkgutil.walk_packages(permk.__path__, "permk.") if not m.name.startswith("permk._core"))
#: The modules whose docstrings must carry examples (the API a user meets first).
WITH_EXAMPLES = {
    "permk.compressors", "permk.problems", "permk.problems.base", "permk.problems.quadratic", "permk.problems.finite_sum",
    "permk.problems.classification", "permk.problems.datasets", "permk.methods", "permk.distributed", "permk.theory.steps",
    "permk.theory.smoothness", "permk.theory.group", "permk.theory.ab", "permk.theory.complexity",
}


def test_the_modules_are_found() -> None:
    assert WITH_EXAMPLES <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    if name in ("permk.torch", "permk.transport.ddp") or name.startswith("permk.torch."):  # the torch extra
        pytest.importorskip("torch", reason="permk.torch needs PyTorch: pip install 'permk[torch]'")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    if name in WITH_EXAMPLES:
        assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
