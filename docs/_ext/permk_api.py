"""The API reference, generated from the package: one page per public module and one per public
object, written from the ``__all__`` of every public module at the start of each build.

* Public modules: ``permk`` and every module or package below it whose dotted name has no
  component starting with ``_`` (found by walking the package, so a new module is picked up
  without editing the docs).
* Public names: a module's ``__all__``. A module without ``__all__`` is reported (a warning:
  it should say what it exports) and its own public classes and functions are listed instead.
* One page per object: an object exported under several names (``permk.PermK`` and
  ``permk.compressors.PermK``) is documented once, under the name found first in a walk that
  visits shallower modules first (``permk.PermK``); the other names link to that page, and a
  cross-reference to any of them (``:class:`permk.compressors.PermK```, or a relative
  ``:class:`PermK``` inside ``permk.compressors``) resolves to it.
* The check: after the build has read every page, each public name must resolve to a
  documented object, else the build fails (whatever the warnings mode).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util import logging
from sphinx.util.nodes import make_refnode

logger = logging.getLogger(__name__)

#: Where the generated pages go (relative to the docs' source directory; ignored by git).
OUT = Path("api") / "generated"
#: Values of these types are not identified by identity (two equal small ints are one object).
_SCALARS = (str, bytes, int, float, complex, bool, type(None), tuple, frozenset)


@dataclass
class Entry:
    module: str
    name: str
    obj: Any
    kind: str  # module | class | exception | function | data
    canonical: str  # the full name of the page documenting it (a module's own name for a module)

    @property
    def full(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass
class Api:
    package: str
    modules: list[str] = field(default_factory=list)
    entries: dict[str, list[Entry]] = field(default_factory=dict)  # module -> its public names
    canonical: dict[int, str] = field(default_factory=dict)  # id(obj) -> full name of its page
    objects: dict[str, Entry] = field(default_factory=dict)  # full name -> the entry that owns the page
    no_all: list[str] = field(default_factory=list)
    pages: dict[str, str] = field(default_factory=dict)  # module -> its page's name (under OUT)
    keep: list[Any] = field(default_factory=list)  # the objects whose ids are keys of `canonical`


def _public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split("."))


def public_modules(package: str) -> list[str]:
    """``package`` and its public submodules, shallower first, alphabetical within a depth."""
    pkg = importlib.import_module(package)
    names = [package]

    def fail(name: str) -> None:
        raise ExtensionError(f"permk_api: cannot import {name} while walking {package}")

    for info in pkgutil.walk_packages(pkg.__path__, f"{package}.", onerror=fail):
        if _public(info.name):
            names.append(info.name)
    return sorted(set(names), key=lambda n: (n.count("."), n))


def _kind(obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return "module"
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    if inspect.isroutine(obj) or _is_callable_object(obj):
        return "function"
    return "data"


def _is_callable_object(obj: Any) -> bool:
    """An instance whose class defines ``__call__`` and a docstring (``permk.marina``)."""
    return callable(obj) and "__call__" in {n for c in type(obj).__mro__[:-1] for n in vars(c)}


def _module_names(mod: types.ModuleType) -> list[str]:
    """A module without ``__all__``: its own public classes and functions."""
    out = []
    for name, obj in vars(mod).items():
        if name.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if getattr(obj, "__module__", None) == mod.__name__:
            out.append(name)
    return out


def collect(package: str) -> Api:
    api = Api(package)
    api.modules = public_modules(package)
    for modname in api.modules:
        mod = importlib.import_module(modname)
        names = getattr(mod, "__all__", None)
        if names is None:
            api.no_all.append(modname)
            names = _module_names(mod)
        entries = []
        for name in names:
            try:
                obj = getattr(mod, name)
            except AttributeError as exc:
                raise ExtensionError(f"permk_api: {modname}.__all__ names {name!r}, which the module does not define") from exc
            kind = _kind(obj)
            full = f"{modname}.{name}"
            if kind == "module":
                canonical = obj.__name__
            elif isinstance(obj, _SCALARS):
                canonical = full
            else:
                canonical = api.canonical.setdefault(id(obj), full)
                api.keep.append(obj)
            entry = Entry(modname, name, obj, kind, canonical)
            if kind != "module" and canonical == full:
                api.objects[full] = entry
            entries.append(entry)
        api.entries[modname] = entries
    return api


# ---- writing the pages ---------------------------------------------------------------------------

def _title(text: str, ch: str = "=") -> str:
    return f"{text}\n{ch * len(text)}\n"


def _object_page(entry: Entry) -> str:
    directive = {"class": "autoclass", "exception": "autoexception", "function": "autofunction", "data": "autodata"}[entry.kind]
    options = ""
    if entry.kind in ("class", "exception"):
        options = "   :members:\n   :show-inheritance:\n"
    elif entry.kind == "data":
        options = "   :no-value:\n" if len(repr(entry.obj)) > 120 else ""
    return (f".. This page is generated by docs/_ext/permk_api.py from {entry.module}.__all__; do not edit.\n\n"
            f"{_title(entry.full)}\n"
            f".. currentmodule:: {entry.module}\n\n"
            f".. {directive}:: {entry.name}\n{options}")


def _module_page(api: Api, modname: str, clashes: set[str]) -> str:
    mod = importlib.import_module(modname)
    lines = [f".. This page is generated by docs/_ext/permk_api.py from {modname}.__all__; do not edit.\n",
             _title(modname),
             f".. automodule:: {modname}",
             "   :no-members:"]
    if modname in clashes:
        # a public object has the module's own dotted name (``permk.theory.complexity`` the function
        # shadows the module of that name): the module keeps its page, the object its entry
        lines.append("   :no-index:")
    lines.append("")
    entries = api.entries[modname]
    subs = [m for m in api.modules if m.rpartition(".")[0] == modname]
    if subs:
        lines += [".. rubric:: Submodules", ""]
        lines += [f"* :mod:`{m}` — {_first_line(importlib.import_module(m))}" for m in subs]
        lines.append("")
    if modname in api.no_all:
        lines += [".. note::", f"   ``{modname}`` has no ``__all__``: listed are the public classes and functions it defines.", ""]
    if entries:
        lines += [".. rubric:: Public names", "", f".. currentmodule:: {modname}", "", ".. autosummary::", "   :nosignatures:", ""]
        lines += [f"   {e.name}" for e in entries if e.kind != "module"]
        lines.append("")
        mods = [e for e in entries if e.kind == "module"]
        if mods:
            lines += ["Modules exported by name: " + ", ".join(f":mod:`{e.name} <{e.canonical}>`" for e in mods) + ".", ""]
        own = [e for e in entries if e.kind != "module" and e.canonical == e.full]
        if own:
            lines += [".. toctree::", "   :hidden:", ""] + [f"   {e.full}" for e in own] + [""]
    del mod
    return "\n".join(lines)


_ROLE = re.compile(r"(?P<role>:[\w:]+:)`(?P<body>[^`]+)`")


def _qualified(mod: types.ModuleType, m: re.Match[str]) -> str:
    """A cross-reference of ``mod``'s docstring, to be shown on another page (the parent
    module's list of submodules): a target relative to ``mod`` (``.quadratic``) or a name
    of ``mod``'s namespace (``Estimate``) written out in full, its text unchanged."""
    role, body = m.group("role"), m.group("body")
    title, _, target = body.rpartition("<") if body.endswith(">") else ("", "", body)
    target = target.rstrip(">") if title else target
    tilde = target.startswith("~")
    bare = target.lstrip("~")
    if bare.startswith("."):
        full = mod.__name__ + bare
    elif bare.split(".")[0] and hasattr(mod, bare.split(".")[0]) and not bare.startswith(mod.__name__.split(".")[0] + "."):
        full = f"{mod.__name__}.{bare}"
    else:
        return m.group(0)
    shown = title.strip() or (bare.rpartition(".")[2] if tilde else bare.lstrip("."))
    return f"{role}`{shown} <{full}>`"


def _first_line(mod: types.ModuleType) -> str:
    doc = inspect.getdoc(mod) or ""
    para = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    para = _ROLE.sub(lambda m: _qualified(mod, m), para)
    # the colon that introduces a literal block or a list, shown without them: a full stop
    return para.rstrip(":") + "." if para.endswith(":") else para


def _write(path: Path, text: str) -> None:
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def generate(app: Sphinx) -> None:
    package = app.config.permk_api_package
    api = collect(package)
    app.permk_api = api  # type: ignore[attr-defined]  # (not on env: the env is pickled)
    out = Path(app.srcdir) / OUT
    out.mkdir(parents=True, exist_ok=True)
    clashes = {m for m in api.modules if m in api.objects}
    # a module whose name is also an object's (the function permk.theory.smoothness shadows the
    # module of that name) gets the page NAME-module
    api.pages = {m: f"{m}-module" if m in clashes else m for m in api.modules}
    wanted = {f"{p}.rst" for p in api.pages.values()} | {f"{full}.rst" for full in api.objects} | {"index.rst"}
    for stale in out.glob("*.rst"):
        if stale.name not in wanted:
            stale.unlink()
    for full, entry in api.objects.items():
        _write(out / f"{full}.rst", _object_page(entry))
    for modname in api.modules:
        _write(out / f"{api.pages[modname]}.rst", _module_page(api, modname, clashes))
    index = [".. This page is generated by docs/_ext/permk_api.py; do not edit.\n", _title("Modules"),
             ".. toctree::", "   :maxdepth: 1", ""] + [f"   {api.pages[m]}" for m in api.modules] + [""]
    _write(out / "index.rst", "\n".join(index))
    for modname in api.no_all:
        logger.warning(f"permk_api: {modname} has no __all__ (its public classes and functions are listed instead)",
                       type="permk", subtype="no_all")
    logger.info(f"permk_api: {len(api.modules)} public modules, {sum(map(len, api.entries.values()))} public names, "
                f"{len(api.objects)} object pages")


# ---- cross-references to any public name of an object -------------------------------------------

def _lookup(path: str) -> Any:
    """The object a dotted path names (importing modules along it), or raise LookupError."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        except Exception:
            raise LookupError(path)
        for attr in parts[i:]:
            try:
                obj = getattr(obj, attr)
            except Exception:
                raise LookupError(path) from None
        return obj
    raise LookupError(path)


def _canonical_target(api: Api, target: str) -> str | None:
    """``target`` rewritten to the documented name of its object (or of its owner: a member's
    ``Owner.member`` rewritten through ``Owner``)."""
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        try:
            obj = _lookup(head)
        except LookupError:
            continue
        if isinstance(obj, types.ModuleType):
            return None if i < len(parts) else obj.__name__
        canonical = api.canonical.get(id(obj))
        if canonical is None:
            continue
        return ".".join([canonical, *parts[i:]])
    return None


def resolve(app: Sphinx, env: Any, node: nodes.Element, contnode: nodes.Element) -> nodes.Element | None:
    if node.get("refdomain") != "py":
        return None
    api: Api | None = getattr(app, "permk_api", None)
    if api is None:
        return None
    target = node["reftarget"]
    modname = node.get("py:module")
    clsname = node.get("py:class")
    candidates = [target]
    if modname:
        if clsname:
            candidates.insert(0, f"{modname}.{clsname}.{target}")
        candidates.insert(0 if not clsname else 1, f"{modname}.{target}")
    domain = env.get_domain("py")
    for cand in candidates:
        if cand != api.package and not cand.startswith(api.package + "."):
            continue
        if cand in api.modules:
            return make_refnode(app.builder, node["refdoc"], str(OUT / api.pages[cand]), "", contnode, cand)
        if node["reftype"] == "mod":
            continue
        new = _canonical_target(api, cand)
        if new is not None and new not in domain.objects:
            new = _inherited_target(api, new)
        if new is not None and new in domain.objects:
            return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], new,
                                       _with_target(node, new), contnode)
    return None


def _inherited_target(api: Api, target: str) -> str | None:
    """``Class.member`` where ``Class`` inherits ``member`` (documented only on the class that
    defines it): the documented name of that class's member (``permk.Compose.plan`` →
    ``permk.Compressor.plan``)."""
    owner, _, member = target.rpartition(".")
    try:
        cls = _lookup(owner)
    except LookupError:
        return None
    if not inspect.isclass(cls):
        return None
    for base in cls.__mro__[1:]:
        if member in vars(base):
            canonical = api.canonical.get(id(base))
            return None if canonical is None else f"{canonical}.{member}"
    return None


def _with_target(node: nodes.Element, target: str) -> nodes.Element:
    copy = node.deepcopy()
    copy["reftarget"] = target
    copy["refspecific"] = False
    return copy


def check(app: Sphinx, env: Any) -> None:
    """Every public name resolves to a documented object (or a module page)."""
    api: Api | None = getattr(app, "permk_api", None)
    if api is None:
        return
    domain = env.get_domain("py")
    missing = []
    for entries in api.entries.values():
        for e in entries:
            if e.kind == "module":
                if e.canonical not in api.modules:
                    missing.append(f"{e.full} (module {e.canonical} has no page)")
            elif e.canonical not in domain.objects:
                missing.append(f"{e.full} (documented as {e.canonical}: not found)")
    for modname in api.modules:
        if str(OUT / api.pages[modname]) not in env.all_docs:
            missing.append(f"{modname} (no module page)")
    if missing:
        raise ExtensionError(f"permk_api: {len(missing)} public names have no API page:\n  " + "\n  ".join(missing))
    logger.info(f"permk_api: every public name has a page ({sum(map(len, api.entries.values()))} names)")


# ---- a docstring's names, read where the docstring is written ------------------------------------

_PY_ROLE = re.compile(r"(?P<role>:(?:py:)?(?:func|meth|class|attr|data|obj|exc|const|mod):)`(?P<body>[^`<>]+?)`")


def _scope(what: str, name: str, obj: Any) -> tuple[str | None, Any]:
    """Where the docstring of ``obj``, documented as ``name``, is written: its module's name and
    its class (or None). A re-exported object's page (``permk.best_runs``) is in another module
    than its docstring (``permk.experiments.search``), whose names that docstring uses."""
    if what == "module":
        return name, None
    if what in ("class", "exception"):
        return obj.__module__, obj
    if what == "function":
        return getattr(obj, "__module__", None), None
    # a member (method, property, attribute) or a module's data: read in its owner
    try:
        owner = _lookup(name.rpartition(".")[0])
    except LookupError:
        return None, None
    if inspect.isclass(owner):
        return owner.__module__, owner
    if isinstance(owner, types.ModuleType):
        return owner.__name__, None
    return None, None


def _absolute(m: re.Match[str], module: str | None, cls: Any, parens: bool) -> str:
    role, target = m.group("role"), m.group("body")
    tilde = target.startswith("~")
    bare = target.lstrip("~")
    head = bare.split(".")[0]
    if not head or bare.startswith("permk.") or module is None:
        return m.group(0)
    kind = role.rstrip(":").rpartition(":")[2]
    namespace = sys.modules.get(module)
    rest = bare[len(head):]
    if cls is not None and hasattr(cls, head) and (kind in ("meth", "attr", "obj") or not hasattr(namespace, head)):
        full = f"{cls.__module__}.{cls.__qualname__}.{bare}"
    elif hasattr(namespace, head):
        found = getattr(namespace, head)
        if isinstance(found, types.ModuleType):  # an imported module: ``functools.partial``
            full = found.__name__ + rest
        elif not str(getattr(found, "__module__", module)).startswith("permk") and hasattr(found, "__qualname__"):
            full = f"{found.__module__}.{found.__qualname__}{rest}"  # imported from outside: ``Path``
        else:
            full = f"{module}.{bare}"
    else:
        return m.group(0)  # a name Python would not find there: left to Sphinx (and its warning)
    if tilde or "." not in bare:
        return f"{role}`~{full}`"  # shown as written: the last component (with parentheses)
    shown = bare + ("()" if parens and kind in ("func", "meth") else "")
    return f"{role}`{shown} <{full}>`"


def absolute_names(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """The cross-references of a docstring written relative to where it is (``:meth:`plan```
    in a class, ``:func:`score``` in a module) made absolute, their text unchanged, so that they
    resolve wherever the docstring is shown: on the page of a name that re-exports the object,
    in another module's summary table, in a subclass that inherits the docstring. A name that
    Python would not find in the docstring's module or class is left as written."""
    module, cls = _scope(what, name, obj)
    if module is None or not module.startswith(app.config.permk_api_package):
        return
    parens = bool(app.config.add_function_parentheses)
    lines[:] = [_PY_ROLE.sub(lambda m: _absolute(m, module, cls, parens), line) for line in lines]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("permk_api_package", "permk", "env")
    app.connect("builder-inited", generate)
    app.connect("autodoc-process-docstring", absolute_names, priority=600)
    app.connect("missing-reference", resolve)
    app.connect("env-check-consistency", check)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
