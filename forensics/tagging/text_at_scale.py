"""Text clusters of a samples table too large to load with its texts: fitted on a bounded draw, assigned chunk by
chunk on the engine (DuckDB streams the Parquet, Dask runs each row group on its workers), cached by content.

The clusters are the ones :func:`forensics.tagging.clusters.cluster_samples` makes from the texts in memory: the fit
draws the same rows (the same generator over the same row count), so the fitted model is the same, and every text
is assigned by that model. Names that need the cluster's texts (its most common opening) come from counts summed
over the chunks. Only the texts travel chunk by chunk; the rest of the samples table (ids, lengths, labels) is small
and in memory.

The cache key hashes every text with its position (two 64-bit lanes: the text hashed by ``pandas.util.hash_array``
under two keys, each xor the position's hash, summed), so that any chunking of the same table, on any engine, gives
the same key.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from forensics.engine.base import CHUNK_ROWS, Engine
from forensics.errors import ForensicsError
from forensics.schema import TEXT
from forensics.tagging.cluster_cache import cache_versions, store_clusters
from forensics.tagging.clusters import (
    ClusterInfo,
    TextClusterer,
    named_clusters,
    opening_counts,
    source_labels,
    stored_clusters,
    with_atypical,
    with_clusters,
)

#: The two hash keys of the content digest (16 bytes each, as ``pandas.util.hash_array`` takes them).
_LANES = ("forensics-text-1", "forensics-text-2")


@dataclass(frozen=True)
class TextColumn:
    """Where the samples' texts lie when the samples are loaded without them: the table and the engine reading it."""

    path: str | Path
    engine: Engine


def _texts(rows: pd.DataFrame) -> np.ndarray:
    return rows[TEXT].astype("string").fillna("").astype(object).to_numpy()


def _digest(texts: np.ndarray, start: int) -> tuple[int, int]:
    """Two lanes of sum(hash_k(text) xor hash(position)) mod 2**64 (two text keys k; integers hash the same under
    either): order-sensitive, the same for any chunking."""
    pos = np.arange(start, start + len(texts), dtype=np.uint64)
    return tuple(
        int(
            (pd.util.hash_array(texts, hash_key=key, categorize=False) ^ pd.util.hash_array(pos, hash_key=key)).sum(
                dtype=np.uint64
            )
        )
        for key in _LANES
    )


def text_key(
    digests: list[tuple[int, int]], n: int, k: int | None, max_fit: int, seed: int, labels: np.ndarray | None
) -> str:
    """The cache key of a table's texts (chunk digests, summed), their labels and the settings."""
    import hashlib

    lanes = [sum(d[i] for d in digests) % 2**64 for i in range(2)]
    h = hashlib.blake2b(digest_size=20)
    h.update(
        json.dumps(
            ["scale", cache_versions(), None if k is None else int(k), int(max_fit), int(seed), n, lanes]
        ).encode()
    )
    if labels is not None:
        h.update("\x1f".join(map(str, labels)).encode())
    return h.hexdigest()


def _first_pass(positions: np.ndarray) -> Callable[[pd.DataFrame, int], tuple]:
    """Per chunk: its digest and its texts at the fit draw's positions."""

    def run(rows: pd.DataFrame, start: int) -> tuple:
        texts = _texts(rows)
        here = positions[(positions >= start) & (positions < start + len(texts))] - start
        return _digest(texts, start), texts[here], len(texts)

    return run


def _assign(model: TextClusterer, unnamed: set[int]) -> Callable[[pd.DataFrame, int], tuple]:
    """Per chunk: each text's cluster, and the openings of the texts of the clusters without a name."""

    def run(rows: pd.DataFrame, start: int) -> tuple:
        texts = _texts(rows)
        codes = model.predict(texts) if len(texts) else np.zeros(0, np.int64)
        return codes, opening_counts(texts, codes, unnamed)

    return run


def cluster_text_column(
    column: TextColumn,
    n: int,
    k: int | None = None,
    max_fit: int = 20_000,
    seed: int = 0,
    labels: np.ndarray | None = None,
    progress: Callable[[int], None] | None = None,
    chunk: int = CHUNK_ROWS,
) -> tuple[np.ndarray, ClusterInfo]:
    """Each of the ``n`` texts' cluster and how the clusters were made (module docstring); ``labels``: the samples'
    ``source`` (a cluster's name carries its dominant one); ``chunk``: texts per chunk where the engine cuts them."""
    rng = np.random.default_rng(seed)  # the draw TextClusterer makes over the same number of texts
    n_fit = min(n, max_fit)
    positions = np.sort(rng.choice(n, n_fit, replace=False)) if n_fit < n else np.arange(n_fit)
    first = column.engine.map_sample_chunks(column.path, [TEXT], _first_pass(positions), chunk)
    read = sum(rows for _, _, rows in first)
    if read != n:
        raise ForensicsError(f"samples {column.path}: {read} texts read for {n} samples")
    key = text_key([d for d, _, _ in first], n, k, max_fit, seed, labels)
    stored = stored_clusters(key, n)  # None also for an entry that makes no sense: fitted again
    if stored is not None:
        if progress is not None:
            progress(n)
        return stored
    model = TextClusterer(k, max_fit=max_fit, seed=seed).fit(np.concatenate([t for _, t, _ in first]))
    unnamed = {c for c, name in model.names_.items() if name is None}
    parts = column.engine.map_sample_chunks(column.path, [TEXT], _assign(model, unnamed), chunk)
    codes = np.concatenate([c for c, _ in parts]).astype(np.int64) if parts else np.zeros(0, np.int64)
    openings: Counter = sum((o for _, o in parts), Counter())
    if progress is not None:
        progress(n)
    names = with_atypical(model.names_, codes)
    info = ClusterInfo(
        method="text",
        k=len(names),
        names=named_clusters(names, openings, codes, labels),
        silhouettes=dict(model.silhouettes_),
    )
    store_clusters(key, codes, info.as_dict())
    return codes, info


def cluster_samples_at_scale(
    samples: pd.DataFrame,
    column: TextColumn,
    k: int | None = None,
    max_fit: int = 20_000,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> tuple[pd.DataFrame, ClusterInfo]:
    """:func:`forensics.tagging.clusters.cluster_samples` for samples loaded without their texts: a copy with
    ``cluster`` and ``cluster_name`` from the texts at ``column``, and how they were made."""
    codes, info = cluster_text_column(
        column, len(samples), k, max_fit=max_fit, seed=seed, labels=source_labels(samples), progress=progress
    )
    return with_clusters(samples.copy(), codes, info), info
