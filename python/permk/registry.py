"""The catalogs of compressors and methods, and how code outside the package joins them.

A catalog maps a lower-case name to a compressor class (``"permk"`` → :class:`permk.PermK`) or
to a method object (``"marina"`` → :data:`permk.marina`). The experiments' ``--methods
METHOD-COMPRESSOR``, :func:`permk.compressors.catalog`, :func:`permk.methods.catalog`, the
``permk.distributed`` shorthands and the package's generic tests read them.

:func:`register` adds a compressor class or a method object defined outside the package. What
it is registered as is what it declares: its ``catalog_kind`` (a :class:`Catalog`, inherited
from :class:`permk.Compressor` or :class:`permk.Method`), which names it, checks it and knows
the package's own entries (a name the package already uses is a ValueError).

Plugins join without an import by the user: every entry point of the group ``permk.plugins``
(``[project.entry-points."permk.plugins"]`` in a ``pyproject.toml``) and every module named in
the environment variable ``PERMK_PLUGINS`` (comma-separated) is loaded once, the first time a
catalog is read. An entry point may name a module (its import registers what it defines) or a
registrable object (registered under its own name). A plugin that fails to load is reported by a
:class:`PluginWarning` naming it, and the catalogs go on without it.

>>> import numpy as np, permk
>>> class Half(permk.Compressor):
...     '''Every worker sends its first half, unscaled (biased).'''
...     def floats_per_worker(self, n, d):
...         return (d + 1) // 2
...     def plan(self, n, d, *, seed, round):
...         k = (d + 1) // 2
...         return permk.Plan(np.arange(n + 1) * k, np.tile(np.arange(k), n), np.ones(n))
>>> permk.register(Half) is Half
True
>>> permk.compressors.catalog()["half"] is Half
True
>>> permk.register(permk.PermK)
Traceback (most recent call last):
...
ValueError: register: the compressor name 'permk' is the package's own (permk.compressors.permutation.PermK)
>>> permk.registry.unregister(Half)
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import threading
import warnings
from typing import Any, Callable, Mapping

__all__ = ["Catalog", "PluginWarning", "register", "unregister", "load_plugins", "ENTRY_POINT_GROUP", "ENV_VAR"]

#: The entry-point group whose entries are loaded as plugins.
ENTRY_POINT_GROUP = "permk.plugins"
#: The environment variable naming plugin modules to import (comma-separated).
ENV_VAR = "PERMK_PLUGINS"

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


class PluginWarning(UserWarning):
    """A plugin (an entry point of ``permk.plugins`` or a module of ``PERMK_PLUGINS``) failed to
    load or to register; the catalogs go on without it."""


class Catalog:
    """One kind of registrable object (compressor classes, method objects).

    ``key(obj)`` is the name an object is registered under, ``check(obj)`` raises TypeError
    unless ``obj`` is of this kind (a compressor *class*, a method *object*), and ``builtins()``
    returns the package's own entries (read when first needed, so the catalog can be declared
    before the package's modules are loaded)."""

    def __init__(self, kind: str, *, key: Callable[[Any], str], check: Callable[[Any], None],
                 builtins: Callable[[], Mapping[str, Any]]) -> None:
        self.kind = kind
        self._key, self._check, self._builtins = key, check, builtins
        self._registered: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Catalog({self.kind!r})"

    def builtins(self) -> dict[str, Any]:
        """The package's own entries, by name."""
        return dict(self._builtins())

    def registered(self) -> dict[str, Any]:
        """The entries registered from outside the package (the plugins loaded first)."""
        load_plugins()
        return dict(self._registered)

    def all(self) -> dict[str, Any]:
        """The package's entries, then the registered ones, by name."""
        return {**self.builtins(), **self.registered()}

    def add(self, obj: Any, name: str | None = None) -> str:
        """Register ``obj`` (see :func:`register`); returns its name."""
        self._check(obj)
        key = self._key(obj) if name is None else name
        if not isinstance(key, str) or not _NAME.match(key):
            raise ValueError(f"register: a {self.kind} name must be lower-case letters, digits and '_', "
                             f"starting with a letter (no '-': it separates METHOD-COMPRESSOR), got {key!r}")
        own = self.builtins()
        if key in own:
            where = own[key]
            label = f"{where.__module__}.{where.__qualname__}" if isinstance(where, type) else repr(where)
            raise ValueError(f"register: the {self.kind} name {key!r} is the package's own ({label})")
        held = self._registered.get(key)
        if held is not None and held is not obj:
            raise ValueError(f"register: the {self.kind} name {key!r} is already registered to {held!r}")
        self._registered[key] = obj
        return key

    def remove(self, obj: Any) -> None:
        """Undo :meth:`add` for ``obj`` (no error if it is not registered)."""
        for key in [k for k, v in self._registered.items() if v is obj]:
            del self._registered[key]


def _catalog_of(obj: Any) -> Catalog:
    cat = getattr(obj, "catalog_kind", None)
    if not isinstance(cat, Catalog):
        raise TypeError(f"register: expected a compressor class (a subclass of permk.Compressor) or a method object "
                        f"(an instance of a permk.Method subclass), got {obj!r}")
    return cat


def register(obj: Any, *, name: str | None = None) -> Any:
    """Add a compressor class or a method object defined outside the package to its catalog.

    ``obj`` declares its catalog in ``catalog_kind`` (every :class:`permk.Compressor` subclass and
    :class:`permk.Method` object does); it is registered under ``name``, by default its own name
    (a compressor class: its lower-case class name; a method: ``obj.name``). It then appears in
    :func:`permk.compressors.catalog` or :func:`permk.methods.catalog`, in the experiments'
    ``--methods METHOD-COMPRESSOR`` and in the package's generic tests. Registering the same
    object twice is harmless; a name of the package's own, or one taken by another registered
    object, is a ValueError. Returns ``obj`` (so it can decorate a class)."""
    _catalog_of(obj).add(obj, name)
    return obj


def unregister(obj: Any) -> None:
    """Remove a registered object from its catalog (tests and interactive sessions)."""
    _catalog_of(obj).remove(obj)


_loaded = False
_lock = threading.RLock()


def load_plugins() -> None:
    """Load the plugins once: the entry points of ``permk.plugins``, then the modules named in
    ``PERMK_PLUGINS``. Each failure is a :class:`PluginWarning` naming the plugin."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        _loaded = True  # set first: a plugin that reads a catalog while it loads does not recurse
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            _load(f"entry point {ep.name!r} ({ep.value})", ep.load)
        for module in filter(None, (m.strip() for m in os.environ.get(ENV_VAR, "").split(","))):
            _load(f"module {module!r} of {ENV_VAR}", functools.partial(importlib.import_module, module))


def _load(label: str, load: Callable[[], Any]) -> None:
    try:
        obj = load()
        if isinstance(getattr(obj, "catalog_kind", None), Catalog):
            register(obj)
    except Exception as e:  # a broken plugin must not take the package down with it
        warnings.warn(f"permk plugin {label} failed to load: {type(e).__name__}: {e}", PluginWarning, stacklevel=3)
