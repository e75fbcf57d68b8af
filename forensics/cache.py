"""The user cache folder: what was fitted once and is the same for the same inputs (text clusters, the dashboard's
demo and tags), kept between processes so that an audit run again on the same samples does not fit again.

``$FORENSICS_CACHE_DIR`` names the folder (default: platformdirs' user cache folder, else ``~/.cache/forensics``);
``FORENSICS_NO_CACHE=1`` turns the fitted-cluster and near-duplicate caches off (every fit is then done afresh; the
dashboard's own demo and tag caches stay). Entries are keyed by the content of their inputs, never by paths, and
written whole (a temporary file renamed), so two processes at once and a half-written file are both harmless; a
folder that cannot be written only costs the time.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    import numpy as np

#: Environment variable naming the cache folder.
CACHE_ENV = "FORENSICS_CACHE_DIR"
#: Environment variable that, set to 1 (or true/yes), turns the cache off.
NO_CACHE_ENV = "FORENSICS_NO_CACHE"


def cache_dir() -> Path:
    """``$FORENSICS_CACHE_DIR``, else platformdirs' user cache folder, else ``~/.cache/forensics``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    try:
        import platformdirs
    except ImportError:
        return Path.home() / ".cache" / "forensics"
    return Path(platformdirs.user_cache_dir("forensics", appauthor=False))


def cache_enabled() -> bool:
    """False when ``FORENSICS_NO_CACHE`` is 1, true or yes."""
    return os.environ.get(NO_CACHE_ENV, "").strip().lower() not in ("1", "true", "yes")


def load_array(kind: str, key: str, n: int) -> np.ndarray | None:
    """The array stored under ``kind``/``key`` when it holds ``n`` values, else None (absent, off or damaged)."""
    if not cache_enabled():
        return None
    import numpy as np

    try:
        values = np.load(cache_dir() / kind / f"{key}.npy", allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    return values if isinstance(values, np.ndarray) and values.ndim == 1 and len(values) == n else None


def store_array(kind: str, key: str, values: np.ndarray) -> None:
    """Write an array under ``kind``/``key`` (:func:`write_whole`)."""
    import numpy as np

    write_whole(cache_dir() / kind / f"{key}.npy", lambda fh: np.save(fh, np.asarray(values), allow_pickle=False))


def write_whole(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """An entry written whole: ``write`` fills a temporary file beside ``path``, renamed into place (two writers at
    once and a half-written file are harmless); nothing when the cache is off, and a folder that cannot be written
    only costs the time."""
    if not cache_enabled():
        return
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=path.stem, suffix=".tmp" + path.suffix, dir=path.parent)  # one per writer
        tmp = Path(name)
        with open(fd, "wb") as fh:
            write(fh)
        tmp.replace(path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
