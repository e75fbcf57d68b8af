"""Fitted text clusters kept in the user cache, keyed by the texts themselves and the clustering's settings.

Clustering the texts is most of a case audit's time (importing scikit-learn alone is ~0.8 s; fitting and applying
the vocabulary, choosing k), and it gives the same clusters for the same texts every time (seeded). So the result,
each text's cluster with the names and silhouettes, is stored under a hash of the texts (in order), ``k``,
``max_fit``, ``seed``, this module's :data:`VERSION`, the recipe's source and scikit-learn's version; an audit or
``tag`` run again on the same samples reads it back without importing scikit-learn. A changed text, setting or
version is a new key (the recipe is keyed by the hash of clusters.py's source): a stale entry is never read, and a
damaged one is fitted again and replaced. ``FORENSICS_NO_CACHE=1`` turns it off (:mod:`forensics.cache`).
"""

from __future__ import annotations

import hashlib
import json
import zipfile
import zlib
from importlib import metadata
from pathlib import Path

import numpy as np

from forensics.cache import cache_dir, cache_enabled, write_whole

#: Bump when what a key stands for changes (the recipe in clusters.py, the stored fields).
VERSION = 1


def cache_versions() -> str:
    """What else decides the clusters: the recipe's own source (clusters.py and text_at_scale.py: any edit to them is a
    new key), scikit-learn's version, this module's :data:`VERSION`."""
    try:
        sklearn = metadata.version("scikit-learn")
    except metadata.PackageNotFoundError:
        sklearn = "none"
    here = Path(__file__).parent
    recipe = hashlib.blake2b(
        b"".join((here / f).read_bytes() for f in ("clusters.py", "text_at_scale.py")), digest_size=12
    ).hexdigest()
    return f"recipe {recipe}, scikit-learn {sklearn}, cache v{VERSION}"


def cluster_key(texts: np.ndarray, k: int | None, max_fit: int, seed: int, labels: np.ndarray | None = None) -> str:
    """The hash of what decides the clusters and their names: every text in order (its UTF-8 bytes and length),
    the samples' labels (a name carries its dominant ``source``), and the settings."""
    import pyarrow as pa

    arr = pa.array(texts, pa.large_string())
    h = hashlib.blake2b(digest_size=20)
    h.update(json.dumps([cache_versions(), None if k is None else int(k), int(max_fit), int(seed), len(arr)]).encode())
    for buf in arr.buffers()[1:]:  # offsets, then data (no validity buffer: the texts are filled)
        if buf is not None:
            h.update(memoryview(buf))
    if labels is not None:
        h.update("\x1f".join(map(str, labels)).encode())
    return h.hexdigest()


def _path(key: str):
    return cache_dir() / "clusters" / f"text-{key}.npz"


def load_clusters(key: str, n: int) -> tuple[np.ndarray, dict] | None:
    """The stored codes (one per text) and cluster info for ``key``, or None (absent, off, unreadable, wrong size)."""
    if not cache_enabled():
        return None
    try:
        with np.load(_path(key), allow_pickle=False) as z:
            codes = z["codes"].astype(np.int64)
            info = json.loads(str(z["info"]))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error):  # absent or damaged
        return None
    return (codes, info) if len(codes) == n else None


def store_clusters(key: str, codes: np.ndarray, info: dict) -> None:
    """Write an entry whole (:func:`forensics.cache.write_whole`)."""
    write_whole(_path(key), lambda fh: np.savez(fh, codes=np.asarray(codes, np.int64), info=np.array(json.dumps(info))))
