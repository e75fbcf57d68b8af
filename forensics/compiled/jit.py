"""``@compiled()``: ``numba.njit(cache=True, _nrt=False)`` whose on-disk cache is the package's keyed folder
(:mod:`forensics.compiled.key`), set on each of the package's own functions, never as a numba option of the process.

Where the cache lives: numba's cache locators are tried in turn for each function; these functions get one locator,
:class:`KeyedLocator`, which puts every module's machine code under the key's folder. A user's own
``NUMBA_CACHE_LOCATOR_CLASSES`` still wins: numba reads it before any class's list.

Why without reference counting (``_nrt=False``): the loops hold their state in arrays and tuples of arrays, and
counting each array on every access was ~2/3 of the spike kernel's time (measured with perf: NRT_incref/decref).
Nothing inside them allocates.

A cache hit skips numba's target refresh: a loop's first call in a process loads its machine code from the cache,
and numba first *refreshes* its CPU target (imports and registers the lowering of everything it can compile, and
``scipy.linalg`` through its BLAS probe). Loading finished machine code needs none of it (~0.2 s of a metrics-only
audit of 120K steps, measured with cProfile). A miss (first run, a new signature) takes numba's own path, refresh and
compile included. This uses two private members of numba's ``FunctionCache``; a numba without them keeps its own
loading, only slower (numba is pinned to a tested range in the package's requirements).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba as nb
from numba.core.caching import FunctionCache, _CacheLocator

__all__ = ["KeyedLocator", "compiled"]


class KeyedLocator(_CacheLocator):
    """Caches a function of the package under the key's folder, one subfolder per module. Its source stamp is the
    key itself: the folder already changes with any source, so numba's own file check has nothing left to add."""

    def __init__(self, py_func: Callable, py_file: str) -> None:
        from forensics.compiled.key import compiled_root, package_key

        self._stamp = package_key()
        self._path = str(compiled_root() / self._stamp / py_func.__module__)
        self._py_file = py_file

    def ensure_cache_path(self) -> None:
        """Called by numba before it writes: the key's folder is made then (and other keys pruned), never at import."""
        from forensics.compiled.key import key_folder

        key_folder()
        Path(self._path).mkdir(parents=True, exist_ok=True)

    def get_cache_path(self) -> str:
        return self._path

    def get_source_stamp(self) -> Any:
        return self._stamp

    def get_disambiguator(self) -> str:
        return ""

    @classmethod
    def from_function(cls, py_func: Callable, py_file: str) -> KeyedLocator:
        return cls(py_func, py_file)


class _KeyedImpl(FunctionCache._impl_class):  # type: ignore[misc, name-defined]
    _locator_classes = [KeyedLocator]


class KeyedCache(FunctionCache):
    """numba's function cache with :class:`KeyedLocator` as its only locator."""

    _impl_class = _KeyedImpl


def compiled(**options: Any) -> Callable[[Callable], Any]:
    """A decorator: ``numba.njit(_nrt=False, **options)`` cached in the key's folder, whose cache hits load without
    the refresh."""

    def decorate(function: Callable) -> Any:
        dispatcher = nb.njit(_nrt=False, **options)(function)
        if cache_writable():  # else numba's default: compiled in memory, once per process
            dispatcher._cache = KeyedCache(dispatcher.py_func)  # what ``cache=True`` does, with the keyed locator
            _load_cache_hits_without_refresh(dispatcher)
        return dispatcher

    return decorate


def cache_writable() -> bool:
    """Whether the key's folder can be made (its nearest existing ancestor is writable): read-only homes and
    containers compile in memory instead of failing on the first save. Only asks the file system; writes nothing."""
    import os

    from forensics.compiled.key import compiled_root

    path = compiled_root()
    while not path.exists() and path.parent != path:
        path = path.parent
    return os.access(path, os.W_OK | os.X_OK)


def _load_cache_hits_without_refresh(dispatcher: Any) -> None:
    """Give one dispatcher's cache a ``load_overload`` that tries the cache before the refresh (module docstring)."""
    cache = getattr(dispatcher, "_cache", None)
    lookup = getattr(cache, "_load_overload", None)
    guard = getattr(cache, "_guard_against_spurious_io_errors", None)
    if lookup is None or guard is None:
        return
    load_after_refresh = cache.load_overload

    def load_overload(signature: Any, target_context: Any) -> Any:
        try:
            with guard():
                found = lookup(signature, target_context)
        except Exception:  # noqa: BLE001 - whatever the short path cannot load, numba's own path loads or compiles
            found = None
        if found is not None:
            return found
        _numba_array_library_without_scipy()
        return load_after_refresh(signature, target_context)

    cache.load_overload = load_overload


def _numba_array_library_without_scipy() -> None:
    """Import numba's array library once with its BLAS probe answered "no", so that it does not import scipy.linalg
    (0.23 s of a metrics-only audit's 1.9 s, measured with cProfile, only to decide how np.correlate-like inner
    products compile; the package's loops have none). Only the probe is replaced while that module is imported, then
    the answer is set back to what the probe would have said, so users' own numba code compiles as it always does."""
    import importlib.util

    if "numba.np.arraymath" in sys.modules:
        return
    import numba.np.linalg as nb_linalg

    def no_blas() -> None:
        raise ImportError("not probed")

    probe = nb_linalg.ensure_blas
    nb_linalg.ensure_blas = no_blas
    try:
        import numba.np.arraymath as arraymath
    finally:
        nb_linalg.ensure_blas = probe
    arraymath._HAVE_BLAS = importlib.util.find_spec("scipy") is not None
