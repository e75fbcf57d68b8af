"""What the compiled loops' machine code is keyed by, and where it lives.

numba checks a cached function against its own source file only, while a loop's machine code also holds what it
calls and reads from other modules (the spike kernel inlines the window helpers and reads the robust-SD constant;
the packer compiles the padding rule in). A change to any of them must never be served old code, so the key is the
package's version and the content of every one of its Python modules, with numba's and Python's versions: any edit
of the package, an upgrade included, starts a fresh folder, and the folders of other keys are removed when a new one
is made. Hashing the package's ~300 modules takes a few milliseconds, once per process, and only when a loop runs.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import shutil
import sys
from pathlib import Path

#: The folder, under the user cache (:func:`forensics.cache.cache_dir`), that holds one folder per key.
COMPILED_FOLDER = "compiled"
#: Folders earlier versions of the package cached compiled code in; removed with the other keys.
LEGACY_FOLDERS = ("numba", "precompiled")


@functools.cache
def package_key() -> str:
    """20 hex digits of a hash of the package's version, every ``*.py`` file under it (path and content), and the
    numba and Python versions."""
    import numba

    import forensics

    root = Path(forensics.__file__).resolve().parent
    digest = hashlib.sha256(repr((forensics.__version__, numba.__version__, sys.version)).encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def compiled_root() -> Path:
    """The folder holding one folder per key."""
    from forensics.cache import cache_dir

    return cache_dir() / COMPILED_FOLDER


def key_folder() -> Path:
    """This package's folder of compiled code (created, and the other keys' folders pruned, on first use)."""
    return _ensure(compiled_root() / package_key())


@functools.cache
def _ensure(folder: Path) -> Path:
    if not folder.is_dir():
        prune(keep=folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def prune(keep: Path) -> list[Path]:
    """Remove every key's folder but ``keep``, and the legacy folders; returns what was removed (a folder another
    process still reads only costs that process a compile)."""
    removed = []
    root = keep.parent
    candidates = [p for p in root.iterdir() if p.is_dir() and p != keep] if root.is_dir() else []
    candidates += [p for p in (root.parent / name for name in LEGACY_FOLDERS) if p.is_dir()]
    for path in candidates:
        with contextlib.suppress(OSError):
            shutil.rmtree(path)
            removed.append(path)
    return removed
