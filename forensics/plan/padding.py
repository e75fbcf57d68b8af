"""Padded tokens: what a batch costs once every sample is padded to the batch's longest sample.

A batch (one micro-batch on one rank) is padded to its longest sample, so it occupies ``size x longest``
tokens, whatever its real tokens are. The builders pack under that cost, the gate and the what-if measure real /
padded tokens with it, tagging reports each step's padded tokens and padding ratio from it, and the simulator prices
a step's time by it; all of them take it from here, so that the packing rule and every padding figure agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np

Count = TypeVar("Count", int, float, np.ndarray)


def padded_tokens(size: Count, longest: Count) -> Count:
    """The tokens of a batch of ``size`` samples padded to its longest, ``longest`` tokens (scalars or per-batch
    arrays): the cost a token budget bounds and a GPU pays."""
    return size * longest


def padded_tokens_sql(size: str, longest: str) -> str:
    """:func:`padded_tokens` as an SQL expression over the columns (or aggregates) ``size`` and ``longest``: the same
    rule for the engines that count in SQL (DuckDB)."""
    return f"({size}) * ({longest})"


@dataclass(frozen=True)
class BatchShapes:
    """Per batch code: ``size`` (rows) and ``longest`` (the longest row's length; 0 for a code with no row)."""

    size: np.ndarray
    longest: np.ndarray

    @property
    def padded(self) -> np.ndarray:
        """Per batch, :func:`padded_tokens`."""
        return padded_tokens(self.size, self.longest)


def batch_shapes(batch: np.ndarray, lengths: np.ndarray, n_batches: int | None = None) -> BatchShapes:
    """The shape of every batch from per-row arrays: ``batch`` the row's batch code (0 .. ``n_batches`` - 1; a code
    with no row is an empty batch) and ``lengths`` the row's length as the trainer sees it (capped at ``max_len``).

    Rows in batch order (codes never decreasing, as builders and recorders write them) take one pass of
    ``maximum.reduceat``; other orders are scattered with ``maximum.at``. Both give the same numbers, in the
    lengths' dtype.
    """
    batch = np.asarray(batch)
    if batch.dtype.kind not in "iu":
        batch = batch.astype(np.int64)
    lengths = np.asarray(lengths)
    n = int(n_batches) if n_batches is not None else (int(batch.max()) + 1 if len(batch) else 0)
    size = np.bincount(batch, minlength=n)
    longest = np.zeros(n, dtype=lengths.dtype)
    if len(batch) and bool((batch[1:] >= batch[:-1]).all()):
        starts = np.flatnonzero(np.r_[True, batch[1:] != batch[:-1]])
        longest[batch[starts]] = np.maximum.reduceat(lengths, starts)
    elif len(batch):
        np.maximum.at(longest, batch, lengths)
    return BatchShapes(size, longest)
