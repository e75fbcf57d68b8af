"""The compiled loops a metrics-only audit runs (the spike kernel, the rolling median), compiled ahead of time: a
process loads them as one plain extension module and never imports numba.

Why: numba's import (~0.12 s) and its loading of cached machine code (~0.07 s) were a quarter of a metrics-only
audit of 120K steps (0.85 s), more than detecting its spikes. An extension module compiled by ``numba.pycc`` holds
the same machine code, needs only numpy at run time and loads in milliseconds.

What is compiled: each loop of :data:`LOOPS`, once per combination of argument types its callers pass. Those types
are recorded, not written down: the build runs the real callers (a small metrics-only audit, a detector with
buckets and support, a live run in chunks) on the JIT loops and keeps every signature they were called with.

What guards it: pycc's wrappers do not check their arguments' types, so every call's arguments are fingerprinted
(each array's dtype, dimensions, layout, write flag and alignment, through nested named tuples; each scalar's
type) and run ahead-of-time only for a fingerprint the module was compiled for. Any other call, a missing or failed
module, or ``FORENSICS_PRECOMPILED=0`` runs the loop through numba's JIT and its on-disk cache, as before: the same
code, the same results (the property tests run both).

When it is built: the first process that wants a loop and finds no module for this version of the loops starts the
build in a detached background process (about 10 s of CPU, once; it needs a C compiler, as pycc links the module)
and carries on with the JIT; ``python -m forensics._precompiled_build`` builds it in the foreground
(:mod:`forensics._precompiled_build`). The module lives in the user cache (:func:`forensics.cache.cache_dir`,
``precompiled/<key>``), keyed by the loops' sources and the Python, numpy and numba versions, compiled for its
architecture's generic CPU (a home folder shared by machines of different CPUs must not hold code for one of them;
code for the host's CPU measured no faster); a build that fails leaves its log there and is not retried for that
key.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: The loops compiled ahead of time: the name callers ask :func:`loop` for -> (module, function) of the JIT loop.
LOOPS: dict[str, tuple[str, str]] = {
    "spike_rows": ("forensics.detect.spikes.kernel", "run_rows"),
    "spike_flush": ("forensics.detect.spikes.kernel", "flush"),
    "rolling_medians": ("forensics.rolling_median_kernel", "medians"),
}
#: Set to 0 (or off, false, no) to run every loop through numba's JIT.
ENV = "FORENSICS_PRECOMPILED"
#: The extension module's name (pycc's ``PyInit_`` symbol) and the manifest that maps fingerprints to its functions.
MODULE = "forensics_precompiled_loops"
MANIFEST = "manifest.json"
#: A build older than this is taken as dead and may be started again.
STALE_BUILD_S = 600.0

_CHOSEN: dict[str, Callable[..., Any]] = {}
#: While the build records its callers' signatures: what wraps each JIT loop (:mod:`forensics._precompiled_build`).
RECORDING: Callable[[str, Any], Callable[..., Any]] | None = None
_MODULE: dict[str, Any] = {}
_BUILD_STARTED = False
#: Calls that ran through the JIT although a module was loaded (a fingerprint it was not compiled for).
misses: dict[str, int] = {}


# --- choosing a loop --------------------------------------------------------------------------------------------------
def loop(name: str) -> Callable[..., Any]:
    """The loop ``name`` of :data:`LOOPS`: its ahead-of-time version behind the fingerprint guard when this key's
    module is built, else numba's JIT dispatcher (and the module's build is started in the background)."""
    chosen = _CHOSEN.get(name)
    if chosen is None:
        chosen = _CHOSEN[name] = _choose(name)
    return chosen


def enabled() -> bool:
    """False when ``FORENSICS_PRECOMPILED`` is 0, off, false or no."""
    return os.environ.get(ENV, "").strip().lower() not in ("0", "off", "false", "no")


def _jit(name: str) -> Callable[..., Any]:
    module, function = LOOPS[name]
    return getattr(importlib.import_module(module), function)


def _choose(name: str) -> Callable[..., Any]:
    if RECORDING is not None:
        return RECORDING(name, _jit(name))
    if not enabled():
        return _jit(name)
    loaded = _load()
    if loaded is None:
        start_build()
        return _jit(name)
    return guarded_loops(loaded).get(name) or _jit(name)


class _Guarded:
    """An ahead-of-time loop run only for the argument types it was compiled for; any other call goes to the JIT."""

    def __init__(self, name: str, table: dict[str, Callable[..., Any]]) -> None:
        self.name = name
        self.table = table
        self._jit: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        compiled = self.table.get(fingerprint(args))
        if compiled is not None:
            return compiled(*args)
        misses[self.name] = misses.get(self.name, 0) + 1
        if self._jit is None:
            self._jit = _jit(self.name)
        return self._jit(*args)


# --- fingerprints -----------------------------------------------------------------------------------------------------
_DTYPES: dict[np.dtype, str] = {}


def fingerprint(value: Any) -> str:
    """What numba's type of ``value`` depends on, as a string: equal strings, equal compiled code.

    Arrays: dtype (a record's fields and offsets), dimensions, layout, write flag, alignment; tuples: their class and
    items; scalars: their type. It is finer than numba's types (a Python int and a numpy int64 differ), never
    coarser, so a call is never given machine code compiled for other types."""
    if isinstance(value, np.ndarray):
        flags = value.flags
        layout = "C" if flags.c_contiguous else ("F" if flags.f_contiguous else "A")
        return (f"{_dtype_key(value.dtype)}/{value.ndim}{layout}{'w' if flags.writeable else 'r'}"
                f"{'a' if flags.aligned else 'u'}")
    if isinstance(value, tuple):
        kind = type(value)
        return f"{kind.__module__}.{kind.__qualname__}({','.join(map(fingerprint, value))})"
    if isinstance(value, np.generic):
        return f"np.{_dtype_key(value.dtype)}"
    return type(value).__qualname__


def _dtype_key(dtype: np.dtype) -> str:
    key = _DTYPES.get(dtype)
    if key is None:
        key = _DTYPES[dtype] = (f"{dtype.descr!r}:{dtype.itemsize}:{dtype.isalignedstruct}" if dtype.names
                                else dtype.str)
    return key


# --- the module -------------------------------------------------------------------------------------------------------
def folder() -> Path:
    """Where this version of the loops' module lives: ``<user cache>/precompiled/<key>``."""
    from forensics.cache import cache_dir

    return cache_dir() / "precompiled" / _key()


def _key() -> str:
    """The loops' sources (every ``kernel*.py``: :data:`forensics.KERNELS_DIGEST`), this module and its build's, and
    the Python, numpy and numba versions (numba's read from its files, so that it is not imported)."""
    import forensics

    digest = hashlib.sha1(forensics.KERNELS_DIGEST.encode())
    for name in ("_precompiled.py", "_precompiled_build.py"):
        with contextlib.suppress(OSError):
            digest.update((Path(__file__).parent / name).read_bytes())
    spec = importlib.util.find_spec("numba")
    if spec is not None and spec.origin:
        with contextlib.suppress(OSError):
            digest.update((Path(spec.origin).parent / "_version.py").read_bytes())
    digest.update(sys.version.encode() + np.__version__.encode())
    return digest.hexdigest()[:16]


def _load() -> tuple[Any, dict[str, dict[str, str]]] | None:
    """This key's module and its manifest, loaded once per process (None: not built, or not loadable here)."""
    if "module" not in _MODULE:
        _MODULE["module"] = load_module(folder())
    return _MODULE["module"]


def load_module(place: Path) -> tuple[Any, dict[str, dict[str, str]]] | None:
    """The extension module built in ``place`` and its manifest (loop -> fingerprint -> exported function), or None
    when there is none or it cannot be loaded here."""
    try:
        manifest = json.loads((place / MANIFEST).read_text())
        path = place / manifest["file"]
        loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
        spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module, manifest["loops"]
    except (OSError, ValueError, KeyError, ImportError, TypeError):
        return None


def guarded_loops(loaded: tuple[Any, dict[str, dict[str, str]]]) -> dict[str, Callable[..., Any]]:
    """Each loop of a loaded module behind its fingerprint guard (what :func:`loop` returns for it)."""
    module, manifest = loaded
    return {name: _Guarded(name, {print_: getattr(module, export) for print_, export in prints.items()})
            for name, prints in manifest.items() if name in LOOPS}


# --- building ---------------------------------------------------------------------------------------------------------
def start_build() -> bool:
    """Start building this key's module in a detached process, unless one is built, running, or failed for this key.
    Returns whether a build was started."""
    global _BUILD_STARTED
    if _BUILD_STARTED or not enabled() or importlib.util.find_spec("numba") is None:
        return False
    _BUILD_STARTED = True
    place = folder()
    if (place / MANIFEST).exists() or (place / "failed").exists():
        return False
    lock = place.parent / f"{place.name}.building"
    try:
        place.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            if time.time() - lock.stat().st_mtime > STALE_BUILD_S:
                lock.unlink()
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:
        return False
    import subprocess

    env = {**os.environ, ENV: "0"}
    try:
        subprocess.Popen([sys.executable, "-m", "forensics._precompiled_build", "--lock", str(lock)], env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True)
    except OSError:
        lock.unlink(missing_ok=True)
        return False
    return True
