"""loss-spike forensics: why did the training loss spike, down to the batch and the samples.

The pipeline's stages are subpackages that talk through the tables of :mod:`forensics.schema`:
``sources`` (metrics), ``plan`` (which samples made each optimizer step), ``tagging`` (per-step bucket and
cluster), ``detect`` (findings), ``report`` (figures and HTML). The CLI and ``app.py`` only parse and render.
"""

__version__ = "0.1.0"
#: The content of every compiled module (``kernel*.py``), hashed: what numba's cache folder and the ahead-of-time
#: compiled loops (:mod:`forensics._precompiled`) are keyed by.
KERNELS_DIGEST = ""


def _numba_cache_dir() -> None:
    """Point numba's on-disk cache at a user cache folder, never the source tree (an installed package may be
    read-only, and compiled files do not belong in a checkout). A ``NUMBA_CACHE_DIR`` the user set wins; this runs
    before any submodule imports numba, and also covers a numba imported earlier by the caller.

    The folder is keyed by the content of the compiled modules (every ``kernel*.py``): numba checks only the file
    of the function it loads, while a loop's cached machine code also holds the compiled functions it calls from
    other modules, so a change to any of them must start a fresh cache."""
    import hashlib
    import os
    import sys

    global KERNELS_DIGEST
    digest = hashlib.sha1()
    here = os.path.dirname(__file__)
    for folder, dirs, files in sorted(os.walk(here)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py") and "kernel" in name:
                with open(os.path.join(folder, name), "rb") as fh:
                    digest.update(fh.read())
    KERNELS_DIGEST = digest.hexdigest()
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "forensics", "numba", digest.hexdigest()[:12])
    os.environ["NUMBA_CACHE_DIR"] = path
    numba = sys.modules.get("numba")
    if numba is not None and not getattr(numba.config, "CACHE_DIR", ""):
        numba.config.CACHE_DIR = path


_numba_cache_dir()


def _size_thread_pools() -> None:
    from forensics._threads import size_thread_pools

    size_thread_pools()


_size_thread_pools()
