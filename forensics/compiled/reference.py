"""Any compiled loop of the package run as the plain Python it is written in: its reference, and what a small input
runs before the loop's machine code is cached (:mod:`forensics.compiled.loops`).

A loop is written once, for numba; :func:`reference` rebuilds it and every compiled function it calls as plain
functions (the same code objects, with module globals in which each compiled callee is replaced by its own plain
version), so the two cannot drift apart. numba gives records (the elements of a structured array) attribute access
that numpy's ``void`` lacks, and numpy's ``record`` gives attribute access only to fields whose names are not
attributes of numpy scalars (``base``, ``real``, ...): :func:`as_records` hands the plain loop a view that reads and
writes any field by name. Arrays, scalars and tuples pass as they are, so both compute the same IEEE operations in
the same order; property tests compare them row by row.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable
from typing import Any

import numpy as np

_PLAIN: dict[int, types.FunctionType] = {}
_MODULE_GLOBALS: dict[str, dict[str, Any]] = {}


def reference(dispatcher: Any) -> Callable[..., Any]:
    """The plain-Python version of a numba dispatcher, taking the same arguments (records adapted on the way in)."""
    plain = _plain(dispatcher)

    def run(*args: Any) -> Any:
        return plain(*(as_records(a) for a in args))

    run.__name__ = run.__qualname__ = f"reference({plain.__name__})"
    run.__doc__ = plain.__doc__
    return run


def _is_dispatcher(value: Any) -> bool:
    return hasattr(value, "py_func") and hasattr(value, "signatures")


def _plain(dispatcher: Any) -> types.FunctionType:
    found = _PLAIN.get(id(dispatcher))
    if found is not None:
        return found
    py = dispatcher.py_func
    namespace = _plain_globals(py.__module__)
    found = _PLAIN.get(id(dispatcher))  # made while its module's globals were (a module's own functions are)
    if found is None:
        found = _PLAIN[id(dispatcher)] = types.FunctionType(
            py.__code__, namespace, py.__name__, py.__defaults__, py.__closure__
        )
    return found


def _plain_globals(module: str) -> dict[str, Any]:
    """A copy of a module's globals in which every compiled function is its plain version (made once per module;
    registered before it is filled, so that functions calling each other resolve)."""
    namespace = _MODULE_GLOBALS.get(module)
    if namespace is None:
        namespace = _MODULE_GLOBALS[module] = dict(vars(importlib.import_module(module)))
        for name, value in list(namespace.items()):
            if _is_dispatcher(value):
                namespace[name] = _plain(value)
    return namespace


class Record:
    """One element of a structured array, read and written by field name as numba reads it."""

    __slots__ = ("_fields", "_i")

    def __init__(self, fields: dict[str, np.ndarray], i: int) -> None:
        object.__setattr__(self, "_fields", fields)
        object.__setattr__(self, "_i", i)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._fields[name][self._i]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self._fields[name][self._i] = value


class Records:
    """A structured array whose elements are :class:`Record` views (writes go to the array)."""

    __slots__ = ("_fields", "shape")

    def __init__(self, array: np.ndarray) -> None:
        self._fields = {name: array[name] for name in array.dtype.names}
        self.shape = array.shape

    def __getitem__(self, i: int) -> Record:
        return Record(self._fields, i)

    def __len__(self) -> int:
        return self.shape[0]


def as_records(value: Any) -> Any:
    """A structured array as :class:`Records`; a named tuple with its fields adapted the same way; anything else as
    it is."""
    if isinstance(value, np.ndarray) and value.dtype.names is not None:
        return Records(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(as_records(v) for v in value))
    return value
