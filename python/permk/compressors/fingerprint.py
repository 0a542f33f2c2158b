"""The digest of a compressor that the MPI launch check compares across processes
(:meth:`permk.Compressor.fingerprint`): equal in every process for equal compressors.

It hashes a canonical encoding of the value, written by :func:`encode`, a
:func:`functools.singledispatch` function: one rule per kind of value (numbers and strings by
``repr``, arrays by dtype, shape and bytes, containers item by item), and a type with a rule of
its own registers it (:class:`permk.Compressor` does: its parameters). A Python function is
encoded by what it computes — its bytecode, constants, defaults, closure values and the globals
it names, followed :data:`CALLABLE_DEPTH` levels deep — not by its name, so two families of the
same lambdas in another order, or one lambda over different data, differ.

>>> import numpy as np
>>> digest((1, np.arange(3))) == digest((1, np.arange(3))) != digest((1, np.arange(4)))
True
>>> digest(lambda x: 2 * x) != digest(lambda x: 3 * x)
True
"""

from __future__ import annotations

import functools
import hashlib
import types
from typing import Any

import numpy as np

__all__ = ["digest", "encode", "CALLABLE_DEPTH"]

#: How deep :func:`encode` follows functions' closures and globals and objects' attributes.
CALLABLE_DEPTH = 4


def digest(value: Any) -> str:
    """The hex digest (128 bits, BLAKE2b) of :func:`encode`'s encoding of ``value``."""
    h = hashlib.blake2b(digest_size=16)
    encode(value, h, 0)
    return h.hexdigest()


@functools.singledispatch
def encode(v: Any, h: Any, depth: int) -> None:
    """Feed the canonical encoding of ``v`` to the hash ``h`` (``depth``: how many callables
    and objects were followed to reach it). The default rule: an object by its class and its
    attributes (not beyond :data:`CALLABLE_DEPTH`), anything else by its class alone."""
    if hasattr(v, "__dict__") and not isinstance(v, type) and depth < CALLABLE_DEPTH:
        h.update(f"object {type(v).__module__}.{type(v).__qualname__}".encode())
        for k, x in sorted(vars(v).items()):
            h.update(k.encode() + b"=")
            encode(x, h, depth + 1)
    else:
        h.update(f"object {type(v).__module__}.{getattr(v, '__qualname__', type(v).__qualname__)}".encode())


@encode.register(type(None))
@encode.register(bool)
@encode.register(int)
@encode.register(float)
@encode.register(complex)
@encode.register(str)
@encode.register(bytes)
@encode.register(np.generic)
def _scalar(v: Any, h: Any, depth: int) -> None:
    h.update(repr(v).encode())


@encode.register
def _array(v: np.ndarray, h: Any, depth: int) -> None:
    h.update(f"array{v.dtype.str}{v.shape}".encode())
    h.update(np.ascontiguousarray(v).tobytes())


@encode.register(list)
@encode.register(tuple)
def _sequence(v: Any, h: Any, depth: int) -> None:
    h.update(f"{type(v).__name__}[{len(v)}]".encode())
    for x in v:
        encode(x, h, depth)


@encode.register
def _dict(v: dict, h: Any, depth: int) -> None:  # type: ignore[type-arg]
    h.update(f"dict[{len(v)}]".encode())
    for k in sorted(v, key=repr):
        encode(k, h, depth)
        encode(v[k], h, depth)


@encode.register
def _code(v: types.CodeType, h: Any, depth: int) -> None:
    h.update(b"code")
    h.update(v.co_code)
    for x in (v.co_names, v.co_varnames, v.co_consts):
        encode(x, h, 0)


@encode.register
def _module(v: types.ModuleType, h: Any, depth: int) -> None:
    h.update(f"module {v.__name__}".encode())


@encode.register
def _function(v: types.FunctionType, h: Any, depth: int) -> None:
    if depth >= CALLABLE_DEPTH:
        h.update(f"object {type(v).__module__}.{v.__qualname__}".encode())
        return
    # what the function computes: its code, defaults, closure values and the values of the
    # globals it names (so two lambdas, or one lambda over different data, differ)
    code = v.__code__
    h.update(f"function {v.__module__}.{v.__qualname__}".encode())
    encode(code, h, depth)
    encode(v.__defaults__, h, depth + 1)
    encode(v.__kwdefaults__, h, depth + 1)
    for cell in v.__closure__ or ():
        try:
            encode(cell.cell_contents, h, depth + 1)
        except ValueError:  # an empty cell
            h.update(b"empty cell")
    names = {n for c in _code_objects(code) for n in c.co_names}
    for name in sorted(names & v.__globals__.keys()):
        h.update(name.encode() + b"=")
        encode(v.__globals__[name], h, depth + 1)


@encode.register
def _partial(v: functools.partial, h: Any, depth: int) -> None:  # type: ignore[type-arg]
    h.update(b"partial")
    encode(v.func, h, depth + 1)
    encode(v.args, h, depth + 1)
    encode(v.keywords, h, depth + 1)


@encode.register
def _method(v: types.MethodType, h: Any, depth: int) -> None:
    h.update(b"method")
    encode(v.__func__, h, depth + 1)
    encode(v.__self__, h, depth + 1)


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    """``code`` and the code objects nested in it (inner functions, comprehensions)."""
    out = [code]
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out += _code_objects(c)
    return out
