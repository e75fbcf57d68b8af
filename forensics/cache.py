"""The user cache folder: what was fitted once and is the same for the same inputs (text clusters, the dashboard's
demo and tags), kept between processes so that an audit run again on the same samples does not fit again.

``$FORENSICS_CACHE_DIR`` names the folder (default: platformdirs' user cache folder, else ``~/.cache/forensics``);
``FORENSICS_NO_CACHE=1`` turns the fitted-cluster cache off (every fit is then done afresh; the dashboard's
own demo and tag caches stay). Entries are keyed by the
content of their inputs, never by paths, and written whole (a temporary file renamed), so two processes at once and a
half-written file are both harmless; a folder that cannot be written only costs the time.
"""

from __future__ import annotations

import os
from pathlib import Path

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
