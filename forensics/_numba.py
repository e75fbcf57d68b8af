"""numba, the way every compiled loop of the package needs it: ``@compiled()`` from here
instead of ``numba.njit`` in any module that compiles.

A numba loop's first call in a process loads its machine code from the on-disk cache, and numba then first
*refreshes* its CPU target: it imports and registers the lowering of everything it can compile (arrays, unicode,
typed containers, random, linear algebra, and ``scipy.linalg`` through the BLAS probe of its array library). That is
what a compile needs; loading finished machine code needs none of it. On a metrics-only audit of 120K steps the
refresh was ~0.2 s of ~1.1 s (cProfile: ``load_overload`` -> ``refresh``), the largest part of the process that was
neither reading nor detecting.

:func:`compiled` is ``numba.njit(cache=True, _nrt=False)`` whose cache hits skip that refresh. A miss (first run,
another numba, a new signature) takes numba's own path, refresh and compile included, so what compiles and what it
computes do not change. Only loops without numba's reference counting may skip it: the refresh is also what starts
that runtime, and their code never calls it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numba as nb

__all__ = ["compiled"]


def compiled(**options: Any) -> Callable[[Callable], Any]:
    """A decorator: ``numba.njit(cache=True, _nrt=False, **options)`` whose cache hits load without the refresh."""

    def decorate(function: Callable) -> Any:
        dispatcher = nb.njit(cache=True, _nrt=False, **options)(function)
        _load_cache_hits_without_refresh(dispatcher)
        return dispatcher

    return decorate


def _load_cache_hits_without_refresh(dispatcher: Any) -> None:
    """Give one dispatcher's cache a ``load_overload`` that tries the cache before the refresh (module docstring).

    Uses two private members of numba's ``FunctionCache`` (``_load_overload``, the lookup its public method calls
    after refreshing, and its I/O guard); a numba without them keeps its own loading, only slower.
    """
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
    """Import numba's array library once with its BLAS probe answered "no", so that it does not import scipy.linalg.

    The refresh before a compile imports ``numba.np.arraymath``, whose import-time probe (``ensure_blas``) imports
    ``scipy.linalg`` (0.23 s of a metrics-only audit's 1.9 s, measured with cProfile) only to decide how
    np.correlate-like inner products compile; the package's loops have none. The probe alone is replaced while that
    module is imported (no other import is touched, so other threads are unaffected), then the answer is set back to
    what the probe would have said, so users' own numba code compiles as it always does (numba's linear algebra
    imports scipy itself when it is compiled).
    """
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
