"""The spike kernel's rolling windows, compiled: sorted windows (insert, remove, median), rings, and the trend
made of the two halves of the last accepted values ("The baseline" in :mod:`forensics.detect.spikes`).

Each window keeps a ring buffer (arrival order) plus a sorted copy (insertion/removal by shifting, which for windows
of tens of values beats a heap or skip list); the median of a sorted window is a lookup.
"""

from __future__ import annotations

import numpy as np

from forensics.compiled.jit import compiled

#: Every function of the loop is compiled without numba's reference counting: the state is a tuple of arrays, and
#: counting each array on every access was ~2/3 of the loop's time (measured with perf: NRT_incref/NRT_decref).
#: Nothing inside allocates; scratch space lives in the state (``scratch``).
_jit = compiled()


# --- sorted windows -------------------------------------------------------------------------------------------------
@_jit
def _insert(srt, n, x):
    i = n
    while i > 0 and srt[i - 1] > x:
        srt[i] = srt[i - 1]
        i -= 1
    srt[i] = x


@_jit
def _remove(srt, n, x):
    lo, hi = 0, n
    while lo < hi:  # first index with srt[i] >= x
        mid = (lo + hi) // 2
        if srt[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    for j in range(lo, n - 1):
        srt[j] = srt[j + 1]


@_jit
def _replace(srt, n, old, new):
    """Swap ``old`` (present) for ``new`` in a full sorted window: one pass over the values between them."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if srt[mid] < old:
            lo = mid + 1
        else:
            hi = mid
    i = lo
    if new > old:
        while i + 1 < n and srt[i + 1] < new:
            srt[i] = srt[i + 1]
            i += 1
    else:
        while i > 0 and srt[i - 1] > new:
            srt[i] = srt[i - 1]
            i -= 1
    srt[i] = new


@_jit
def _median(srt, n):
    if n % 2 == 1:
        return srt[n // 2]
    return 0.5 * (srt[n // 2 - 1] + srt[n // 2])


@_jit
def _sorted_median(buf, m):
    """The median of ``buf[:m]``, sorted in place (insertion sort: m is at most a window)."""
    for i in range(1, m):
        _insert(buf, i, buf[i])
    return _median(buf, m)


@_jit
def _push(ring, srt, meta, x):
    """Append ``x`` to a sorted window (ring, sorted copy, meta = [head, count]) of capacity ``len(ring)``."""
    cap = ring.shape[0]
    head = meta[0]
    n = meta[1]
    if n == cap:
        _replace(srt, n, ring[head], x)
    else:
        _insert(srt, n, x)
        meta[1] = n + 1
    ring[head] = x
    meta[0] = (head + 1) % cap


@_jit
def _win_push(w, x):
    _push(w.ring, w.sorted, w.meta, x)


@_jit
def _win_median(w):
    return _median(w.sorted, w.meta[1])


@_jit
def _ring_push(w, x):
    """Append to a plain ring (no sorted copy)."""
    cap = w.ring.shape[0]
    w.ring[w.meta[0]] = x
    w.meta[0] = (w.meta[0] + 1) % cap
    if w.meta[1] < cap:
        w.meta[1] += 1


@_jit
def _ring_last(w, m, out):
    """The last ``m`` values of a ring in arrival order into ``out[:m]``."""
    cap = w.ring.shape[0]
    head = w.meta[0]
    for j in range(m):
        out[j] = w.ring[(head - m + j) % cap]


# --- the trend: two halves of the last W accepted values --------------------------------------------------------------
@_jit
def _trend_push(tw, x):
    W = tw.ring.shape[0]
    h = tw.recent.shape[0]
    head = tw.meta[0]
    n = tw.meta[1]
    if n == W:  # full: the oldest leaves the older half, the value at age h moves over, x joins the recent half
        if W > h:
            moving = tw.ring[(head - h) % W]
            _replace(tw.old, W - h, tw.ring[head], moving)
            _replace(tw.recent, h, moving, x)
        else:
            _replace(tw.recent, W, tw.ring[head], x)
    elif W > h and n >= h:
        moving = tw.ring[(head - h) % W]
        _remove(tw.recent, h, moving)
        _insert(tw.old, n - h, moving)
        _insert(tw.recent, h - 1, x)
        tw.meta[1] = n + 1
    else:
        _insert(tw.recent, n, x)
        tw.meta[1] = n + 1
    tw.ring[head] = x
    tw.meta[0] = (head + 1) % W


@_jit
def _trend(tw, min_old):
    """The baseline trend at the next step (NaN before the first accepted value)."""
    n = tw.meta[1]
    if n == 0:
        return np.nan
    n_r = min(n, tw.recent.shape[0])
    n_o = n - n_r
    med_r = _median(tw.recent, n_r)
    if n_o < min_old:
        return med_r
    med_o = _median(tw.old, n_o)
    c_r = (n_r + 1) / 2.0  # mean age of the recent half (age 1 = newest)
    c_o = n_r + (n_o + 1) / 2.0
    t = med_r - c_r * (med_o - med_r) / (c_o - c_r)
    lo = tw.recent[0]
    hi = tw.recent[n_r - 1]
    if t < lo:
        t = lo
    elif t > hi:
        t = hi
    return t


@_jit
def _reanchor(state, m):
    """Refill the trend with the last ``m`` judged values (a level shift: the new level is the baseline now)."""
    tw = state.trend
    m = min(m, state.shadow.meta[1], tw.ring.shape[0])
    tmp = state.scratch
    _ring_last(state.shadow, m, tmp)
    tw.meta[0] = 0
    tw.meta[1] = 0
    for j in range(m):
        _trend_push(tw, tmp[j])
    if m == 0:
        return np.nan
    return _sorted_median(tmp, m)


# --- a history with no spread -----------------------------------------------------------------------------------------
@_jit
def _flat(tw):
    """Whether the trend's recent half (the values the baseline's median is taken from) holds at least two values,
    all equal: a constant is no noise scale, so nothing can be judged against it."""
    n_r = min(tw.meta[1], tw.recent.shape[0])
    return n_r >= 2 and tw.recent[0] == tw.recent[n_r - 1]


@_jit
def _restart(state):
    """The history starts over (a value moved off a constant one): every window of accepted values is emptied, so
    the next ``min_periods`` values are a warm-up again. Events, the tail and the clean maximum are kept: they are in
    noise units, which the constant never set."""
    c = state.counts[0]
    state.trend.meta[0] = 0
    state.trend.meta[1] = 0
    state.scale.meta[0] = 0
    state.scale.meta[1] = 0
    state.mix.meta[0] = 0
    state.mix.meta[1] = 0
    state.raw_scale.meta[0] = 0
    state.raw_scale.meta[1] = 0
    bw = state.buckets
    for b in range(bw.meta.shape[0]):
        bw.meta[b, 0] = 0
        bw.meta[b, 1] = 0
        bw.median[b] = 0.0
    c.offset_sum = 0.0
    c.n_known_buckets = 0
    c.history_start = c.n_accepted
