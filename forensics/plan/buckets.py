"""Length buckets: bucket ``k`` holds lengths in ``(b_k, b_{k+1}]`` after capping at ``max_len`` (0-based)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def bucket_index(lengths: np.ndarray | Sequence[int], boundaries: Sequence[int]) -> np.ndarray:
    """The 0-based bucket of each length; lengths above the last boundary are capped into the last bucket.

    A length of 0 (an empty sample) falls in bucket 0 with the shortest samples.
    """
    b = np.asarray(boundaries, dtype=np.int64)
    lengths = np.minimum(np.asarray(lengths, dtype=np.int64), b[-1])
    idx = np.searchsorted(b, lengths, side="left") - 1
    return np.clip(idx, 0, len(b) - 2).astype(np.int64)


def bucket_range(bucket: int, boundaries: Sequence[int]) -> str:
    """The human label of a bucket, e.g. ``"(3296, 8192]"``."""
    return f"({int(boundaries[bucket])}, {int(boundaries[bucket + 1])}]"
