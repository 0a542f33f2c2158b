"""The docstring examples of every public module run and pass."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["permk.compressors", "permk.problems", "permk.methods", "permk.theory", "permk.distributed"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
