"""numba, imported the way every compiled loop of the package needs it: without the scipy.linalg import its array
library would otherwise pay for (the package's ``__init__`` has already sized the thread pools and the cache folder).

``from forensics._numba import nb`` instead of ``import numba`` in any module that compiles.
"""

from __future__ import annotations

import sys

import numba as nb

__all__ = ["nb"]


def _numba_array_library_without_scipy() -> None:
    """Import numba's array library once with its BLAS probe answered "no", so that it does not import scipy.linalg.

    numba's first compile or cache load in a process imports ``numba.np.arraymath``, whose import-time probe
    (``ensure_blas``) imports ``scipy.linalg`` (0.23 s of a metrics-only audit's 1.9 s, measured with cProfile) only
    to decide how np.correlate-like inner products compile; the package's loops have none. The probe alone is
    replaced while that module is imported (no other import is touched, so other threads are unaffected), then the
    answer is set
    back to what the probe would have said, so users' own numba code compiles as it always does (numba's linear
    algebra imports scipy itself when it is compiled).
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


_numba_array_library_without_scipy()
