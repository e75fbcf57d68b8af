"""The rolling median's compiled loop (numba): a Fenwick tree over the values' ranks, moved along the windows.

:mod:`forensics.stats.fenwick_median` ranks the values and calls it through :mod:`forensics.compiled`.
"""

from __future__ import annotations

import numpy as np

from forensics.compiled.jit import compiled


@compiled()
def medians(sorted_values, rank, start, end, min_periods, tree, out):
    """``out[i]``: the median of the ranked values at positions ``start[i]`` .. ``end[i] - 1`` (NaN when fewer than
    ``min_periods``); ``rank[j]`` is position j's rank in ``sorted_values`` (-1 for NaN and infinities); windows move
    forward. ``tree``: zeros, one more than the values (compiled without numba's allocator, nothing is allocated
    inside)."""
    m = len(sorted_values)
    top = 1
    while top * 2 <= m:
        top *= 2
    lo = 0
    hi = 0
    count = 0
    for i in range(len(start)):
        while hi < end[i]:  # values entering on the right
            r = rank[hi]
            if r >= 0:
                k = r + 1
                while k <= m:
                    tree[k] += 1
                    k += k & -k
                count += 1
            hi += 1
        while lo < start[i]:  # values leaving on the left
            r = rank[lo]
            if r >= 0:
                k = r + 1
                while k <= m:
                    tree[k] -= 1
                    k += k & -k
                count -= 1
            lo += 1
        if count < min_periods or count == 0:
            out[i] = np.nan
            continue
        a = _kth(tree, top, m, (count + 1) // 2)
        if count % 2:
            out[i] = sorted_values[a]
        else:
            b = _kth(tree, top, m, count // 2 + 1)
            out[i] = (sorted_values[a] + sorted_values[b]) / 2


@compiled(inline="always")
def _kth(tree, top, m, k):
    """The 0-based rank of the k-th (1-based) smallest value the tree holds (Fenwick descent)."""
    pos = 0
    step = top
    while step > 0:
        nxt = pos + step
        if nxt <= m and tree[nxt] < k:
            pos = nxt
            k -= tree[nxt]
        step //= 2
    return pos
