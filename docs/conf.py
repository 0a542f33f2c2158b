"""Sphinx configuration of permk's documentation site.

Build it with ``python docs/build.py`` (see that file): Sphinx with warnings as errors, then a
check of every internal link of the built HTML.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import permk  # noqa: E402  (the installed package: `pip install -e '.[docs]'`)

project = "permk"
author = "permk contributors"
copyright = "the permk contributors (MIT License)"
release = permk.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "myst_nb",
    "permk_api",  # docs/_ext: the API pages from the package's __all__s, and their check
    "permk_benchmarks",  # docs/_ext: benches/results/*.json as tables
]

root_doc = "index"
exclude_patterns = ["_build", "_generated", "**.ipynb_checkpoints", "jupyter_execute"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb"}

# ---- cross-references ------------------------------------------------------------------------------
nitpicky = True  # every cross-reference must resolve (docs/build.py also passes -n)
# Python's own inventory from Debian's python3.11-doc (no network here: the inventory is read
# from the local file, the links point at docs.python.org). Without it, references to the
# standard library are left unlinked rather than reported.
_PY_INV = Path("/usr/share/doc/python3.11/html/objects.inv")
intersphinx_mapping = {"python": ("https://docs.python.org/3", str(_PY_INV))} if _PY_INV.is_file() else {}
intersphinx_timeout = 1
# numpy, scipy, matplotlib, torch and mpi4py publish no inventory in their wheels, and their
# sites are not reachable from the build machines: references into them stay plain text.
nitpick_ignore_regex = [
    (r"py:.*", r"(numpy|np|scipy|sp|matplotlib|mpl|plt|torch|mpi4py|MPI|numpy\.typing|npt)(\..*)?"),
    (r"py:.*", r"(tqdm|threadpoolctl|mlxtend)(\..*)?"),
]
if not _PY_INV.is_file():
    nitpick_ignore_regex.append((r"py:.*", r"(typing|collections|os|pathlib|argparse|dataclasses|concurrent|abc|enum|io|types|"
                                            r"multiprocessing|threading|contextlib|functools|itertools|random|json)(\..*)?"))
    nitpick_ignore_regex.append((r"py:(class|obj|exc|data)", r"(int|float|str|bytes|bool|complex|object|list|dict|tuple|set|frozenset|"
                                                              r"type|slice|range|None|Ellipsis|[A-Z][A-Za-z]*Error|Exception|Warning|"
                                                              r"[A-Z][A-Za-z]*Warning|BaseException|Any|Callable|Iterator|Iterable|"
                                                              r"Sequence|Mapping|Literal|Optional|Union|Path|PathLike)"))

# ---- the API reference -------------------------------------------------------------------------
permk_api_package = "permk"
autosummary_generate = False  # the stubs are written by permk_api from the __all__s
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_class_signature = "mixed"
autodoc_default_options = {"exclude-members": "__init__, __new__, __weakref__, __dict__, __module__"}
# The docstrings are NumPy style, parsed by napoleon's NumpyDocstring from _numpy_docstring below
# rather than from napoleon's own handler (hence its two switches off): napoleon reads the first
# line of an attribute's, a property's or a module constant's docstring as ``type: description``
# (its "inline attribute" style), and this package writes prose there ("``L_−``: the smoothness
# constant of f"), its types being the annotations.
napoleon_google_docstring = False
napoleon_numpy_docstring = False
napoleon_use_rtype = False
add_module_names = False
python_use_unqualified_type_names = True
toc_object_entries_show_parents = "hide"

# ---- pages written in MyST Markdown, executed where they are notebooks ------------------------
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath", "smartquotes", "substitution"]
myst_heading_anchors = 3
nb_execution_mode = os.environ.get("PERMK_DOCS_EXECUTE", "force")  # "off" for a quick look at the prose only
nb_execution_timeout = 600
nb_execution_raise_on_error = True  # a failing example fails the build
nb_execution_show_tb = True
nb_merge_streams = True
nb_output_stderr = "remove-warn"

# ---- HTML ------------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"permk {release}"
html_static_path = ["_static"]
html_css_files = ["permk.css"]
html_show_sourcelink = False
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
    "header_links_before_dropdown": 6,
}
html_sidebars = {"index": [], "getting-started": [], "benchmarks": [], "architecture": []}


def _public_bases(app, name, obj, options, bases):  # noqa: ANN001
    """A class's bases as the reader can look them up: a private base (``_LinearFiniteSum``,
    a class of ``permk._core``) is replaced by its own public bases."""
    out = []
    stack = list(bases)
    while stack:
        base = stack.pop(0)
        private = base.__name__.startswith("_") or any(p.startswith("_") for p in base.__module__.split("."))
        if private and base.__module__ != "builtins":
            stack[:0] = [b for b in base.__bases__ if b is not object]
        elif base not in out:
            out.append(base)
    bases[:] = out or [object]


def _factory_default(field) -> str:  # noqa: ANN001
    """A dataclass field's ``default_factory`` written as Python: the value it makes when that
    reads in one short line (``()``, ``SearchOptions(tol=0.001)``), else its type with ``...``."""
    try:
        value = field.default_factory()
    except Exception:  # noqa: BLE001 - a factory that needs more than a call: name it only
        return "..."
    text = repr(value)
    if len(text) <= 48 and "<" not in text:
        return text
    return f"{type(value).__name__}(...)"


def _signature(app, what, name, obj, options, signature, return_annotation):  # noqa: ANN001, ANN201
    """Three rewrites of the signatures autodoc writes, so that they say what the reader passes
    and Sphinx can parse them:

    * ``Array`` and ``Tensor``, the modules' aliases of ``numpy.ndarray`` and ``torch.Tensor`` in
      their annotations, as the classes' names (``_ALIASES``);
    * a dataclass field's ``default_factory``, which autodoc writes ``<factory>`` (not Python:
      Sphinx then falls back to splitting the signature at its commas and reads the pieces of
      ``tuple[int, int]`` as class names), as the value the factory makes;
    * a class whose signature autodoc reads from a catch-all ``__new__(*args, **kwargs)``: its
      ``__init__``'s arguments."""
    if what == "class" and signature is not None and re.fullmatch(r"\(\*args(: [~\w.]+)?, \*\*kwargs(: [~\w.]+)?\)", signature) \
            and getattr(obj, "__init__", object.__init__) is not object.__init__:
        # a catch-all __new__ (the compressors' check that a class defines compress or plan)
        # is what autodoc reads first; the constructor's arguments are __init__'s
        from sphinx.util.inspect import signature as read_signature, stringify_signature

        signature = stringify_signature(read_signature(obj.__init__, bound_method=True), show_return_annotation=False)
    if signature is not None and "<factory>" in signature and dataclasses.is_dataclass(obj):
        made = [_factory_default(f) for f in dataclasses.fields(obj) if f.init and f.default_factory is not dataclasses.MISSING]
        parts = signature.split("<factory>")
        if len(parts) == len(made) + 1:
            signature = "".join(p + m for p, m in zip(parts, made)) + parts[-1]
    def sub(text: str | None) -> str | None:
        if text is None:
            return None
        for alias, full in _ALIASES.items():
            text = re.sub(rf"(?<![\w.]){alias}\b", full, text)
        return text

    return sub(signature), sub(return_annotation)


#: The modules' short aliases of outside classes in their annotations (``Array = np.ndarray``,
#: ``Tensor = torch.Tensor``), which autodoc writes as the alias: written as the class's name.
_ALIASES = {"Array": "numpy.ndarray", "Tensor": "torch.Tensor"}


def _python_object_of_another_type(app, env, node, contnode):  # noqa: ANN001, ANN201
    """A reference to a class that Python's inventory lists under another type or name: the types
    of :func:`functools.singledispatch` registrations (``types.LambdaType``, ``functools.partial``)
    are classes at run time, but the standard library's documentation declares them as data or
    functions, so a ``py:class`` reference to them misses; and a class defined in a submodule is
    documented under its package's name. Looked up again as any Python object, then under the
    parent package, in the inventories only (a name of permk's must resolve as what it is)."""
    if node.get("refdomain") != "py" or node.get("reftype") != "class" or node["reftarget"].startswith("permk"):
        return None
    from sphinx.ext.intersphinx import resolve_reference_any_inventory

    anything = node.deepcopy()
    anything["reftype"] = "obj"
    found = resolve_reference_any_inventory(env, True, anything, contnode)
    if found is None:
        # a class the standard library documents under its package's name, which annotations
        # write under the module that defines it (concurrent.futures.thread.ThreadPoolExecutor is
        # concurrent.futures.ThreadPoolExecutor in Python's documentation)
        *module, name = node["reftarget"].split(".")
        if len(module) >= 2:
            anything["reftarget"] = ".".join([*module[:-1], name])
            found = resolve_reference_any_inventory(env, True, anything, contnode)
    return found


def _numpy_docstring(app, what, name, obj, options, lines):  # noqa: ANN001, ANN201
    """napoleon's NumPy-style sections (Parameters, Attributes, Returns, ...) for every docstring;
    an attribute, property or constant is parsed as any other object's docstring (see above)."""
    from sphinx.ext.napoleon.docstring import NumpyDocstring

    kind = "object" if what in ("attribute", "data", "property") else what
    lines[:] = NumpyDocstring(lines, app.config, app, kind, name, obj, options).lines()


def setup(app):  # noqa: ANN001, ANN201
    app.connect("autodoc-process-docstring", _numpy_docstring)
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("autodoc-process-signature", _signature)
    app.connect("missing-reference", _python_object_of_another_type, priority=900)
