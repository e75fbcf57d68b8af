"""Downsampling long series for plots so that every spike stays visible.

A 1M-step curve cannot be drawn point by point in a browser, and taking every k-th point (striding) silently drops
one-step spikes: with k = 250, a spike survives only if it happens to sit on a multiple of 250. Here each bin keeps
its extreme points instead (keep each bin's min and max): tsdownsample's MinMax downsampler (milliseconds
for 1M points), or, where tsdownsample is not installed, the same rule in numpy. ``method="minmaxlttb"`` selects
tsdownsample's MinMaxLTTB, which looks smoother but keeps only one point per LTTB bucket, so it can drop a bin's
extreme (two spikes a few steps apart, or the top of the noise band); the default keeps the exact envelope. On top
of that, :func:`plot_indices` keeps full resolution inside windows around findings, so the steps a report talks
about are drawn exactly as logged.

All functions return indices into the input arrays (sorted, unique), so the caller can pick steps, values and tags
with the same index.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

#: Points per series after downsampling: enough for a 1,000-2,000 px wide plot to look like the full curve.
DEFAULT_POINTS = 4000
#: Steps drawn at full resolution on each side of a finding.
DEFAULT_WINDOW = 50


def minmax_indices(x: np.ndarray, y: np.ndarray, n_out: int = DEFAULT_POINTS, method: str = "minmax") -> np.ndarray:
    """Indices of at most ``n_out`` points of ``(x, y)`` that keep each bin's extremes; non-finite ``y`` is skipped.

    ``x`` must be sorted ascending. Short series (at most ``n_out`` finite points) come back whole. With
    ``method="minmax"`` (default) each of ``n_out // 2`` equal-width bins keeps its min and its max, so the drawn
    envelope equals the full series' envelope at that resolution.
    """
    if method not in ("minmax", "minmaxlttb"):
        raise ValueError(f"method must be 'minmax' or 'minmaxlttb', got {method!r}")
    y = np.asarray(y, dtype=np.float64)
    finite = np.isfinite(y)
    if finite.all():  # the common case: no copy
        where = None
        xs, ys = np.ascontiguousarray(x), np.ascontiguousarray(y)
        if len(ys) <= n_out:
            return np.arange(len(ys), dtype=np.int64)
    else:
        where = np.flatnonzero(finite)
        if len(where) <= n_out:
            return where
        xs = np.ascontiguousarray(np.asarray(x)[where])
        ys = np.ascontiguousarray(y[where])
    n_out = max(4, int(n_out) // 2 * 2)  # min/max pairs: an even count
    try:
        import tsdownsample
    except ImportError:  # optional speed-up; the numpy path keeps the same min/max guarantee
        picked = numpy_minmax_indices(ys, n_out)
    else:
        cls = tsdownsample.MinMaxDownsampler if method == "minmax" else tsdownsample.MinMaxLTTBDownsampler
        picked = cls().downsample(xs, ys, n_out=n_out).astype(np.int64)
    picked = np.unique(picked)
    return picked if where is None else where[picked]


def numpy_minmax_indices(y: np.ndarray, n_out: int = DEFAULT_POINTS) -> np.ndarray:
    """Per bin of equal point count, the index of its minimum and its maximum (plus the first and last point).

    ``n_out // 2`` bins, two points each: a one-step spike is the maximum of its bin and therefore always kept.
    ``y`` must be finite (callers drop NaN/inf first, as :func:`minmax_indices` does).
    """
    y = np.asarray(y, dtype=np.float64)
    n = len(y)
    n_bins = max(1, int(n_out) // 2)
    if n <= 2 * n_bins:
        return np.arange(n, dtype=np.int64)
    edges = np.linspace(0, n, n_bins + 1).astype(np.int64)
    starts = edges[:-1]
    # reduceat gives each bin's min and max; argmax within a bin is found by comparing against them
    mins = np.minimum.reduceat(y, starts)
    maxs = np.maximum.reduceat(y, starts)
    bin_of = np.repeat(np.arange(n_bins), np.diff(edges))
    is_max = y == maxs[bin_of]
    is_min = y == mins[bin_of]
    first_max = _first_true_per_bin(is_max, bin_of)
    first_min = _first_true_per_bin(is_min, bin_of)
    return np.unique(np.concatenate([[0, n - 1], first_max, first_min])).astype(np.int64)


def _first_true_per_bin(mask: np.ndarray, bin_of: np.ndarray) -> np.ndarray:
    idx = np.flatnonzero(mask)
    _, first = np.unique(bin_of[idx], return_index=True)  # idx is sorted: the first hit of each bin
    return idx[first]


def stride_indices(n: int, n_out: int = DEFAULT_POINTS) -> np.ndarray:
    """Every k-th index: the naive baseline that the report never uses (it loses one-step spikes)."""
    if n <= n_out:
        return np.arange(n, dtype=np.int64)
    k = int(np.ceil(n / n_out))
    return np.arange(0, n, k, dtype=np.int64)


def window_indices(steps: np.ndarray, spans: Iterable[tuple[int, int]], window: int = DEFAULT_WINDOW) -> np.ndarray:
    """Indices of ``steps`` (sorted) within ``window`` steps of any ``(start, end)`` span."""
    steps = np.asarray(steps)
    parts = []
    for start, end in spans:
        lo = np.searchsorted(steps, int(start) - window, side="left")
        hi = np.searchsorted(steps, int(end) + window, side="right")
        if hi > lo:
            parts.append(np.arange(lo, hi, dtype=np.int64))
    if not parts:
        return np.array([], dtype=np.int64)
    return np.unique(np.concatenate(parts))


def plot_indices(
    steps: np.ndarray,
    values: np.ndarray,
    spans: Iterable[tuple[int, int]] = (),
    n_out: int = DEFAULT_POINTS,
    window: int = DEFAULT_WINDOW,
) -> np.ndarray:
    """The points of one series a plot draws: per-bin extremes everywhere, every step near the given spans.

    Only finite values are returned (NaN/inf are drawn by the caller as their own markers).
    """
    values = np.asarray(values, dtype=np.float64)
    coarse = minmax_indices(steps, values, n_out)
    near = window_indices(steps, spans, window)
    near = near[np.isfinite(values[near])]
    return np.union1d(coarse, near).astype(np.int64)
