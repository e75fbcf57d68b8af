"""The compiled inner loop of :class:`~forensics.detect.spikes.SpikeDetector` (numba).

The rule itself is written once, in :mod:`forensics.detect.spikes`; :mod:`forensics.detect._reference` is the same
rule in plain Python, read top to bottom, and a property test holds this kernel to it (same findings on random
series, with and without buckets, under any chunking).

A spike rule is causal and sequential (each verdict decides what enters the baseline of the next step), so it cannot
be vectorised; a Python loop runs ~100x slower than a pandas rolling median. Everything the loop carries between rows
lives in one :data:`KernelState`, a named tuple of named parts (record arrays for scalars, windows for rolling
values), so a live run can stop after any row and continue with the next chunk exactly where it left off: that is
what makes online and offline answers identical.

Rolling windows keep a ring buffer (arrival order) plus a sorted copy (insertion/removal by shifting, which for
windows of tens of values beats a heap or skip list); the median of a sorted window is a lookup.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from forensics._numba import compiled

# --- per-row status codes ---------------------------------------------------------------------------------------------
ACCEPTED = 0  # judged, within the thresholds, entered the baseline
FLAGGED = 1  # judged, above both thresholds, kept out of the baseline
NONFINITE = 2  # NaN or inf: its own finding, never in a window
WARMUP = 3  # before min_periods accepted values: entered the baseline unjudged
EXPECTED = 4  # accepted, but above the thresholds against the trend alone: expected for its bucket
NEW_BUCKET = 5  # its bucket has too few steps to have a baseline yet: only learned from, not judged
STATUS_NAMES = ("accepted", "flagged", "nonfinite", "warmup", "expected_for_bucket", "new_bucket")

# --- event kinds ----------------------------------------------------------------------------------------------------
EV_SPIKE = 1
EV_SHIFT = 2

MAD_TO_SD = 1.4826

#: Every function of the loop is compiled without numba's reference counting: the state is a tuple of arrays, and
#: counting each array on every access was ~2/3 of the loop's time (measured with perf: NRT_incref/NRT_decref).
#: Nothing inside allocates; scratch space lives in the state (``scratch``).
_jit = compiled()

#: The rule's parameters, resolved once by the detector (one record).
PARAMS = np.dtype([
    ("z", np.float64), ("ratio", np.float64), ("min_jump", np.float64),
    ("z_large", np.float64), ("ratio_large", np.float64),
    ("window", np.int64),  # W: accepted values in the trend and the noise scale
    ("half", np.int64),  # h: the trend's recent half
    ("min_old", np.int64),  # older values the trend needs before it extrapolates
    ("min_periods", np.int64), ("max_duration", np.int64), ("confirm", np.int64),
    ("bucket_window", np.int64), ("min_bucket_periods", np.int64),
    ("queue", np.int64),  # capacity of the pending-event queue
    ("use_raw", np.int64),  # 1: also judge accepted steps as a detector without tags would (expected_for_bucket)
    ("alpha", np.float64),  # false alarms asked per judged row (false_rate / 10,000); 0: the fixed score z
    ("tail_start", np.float64),  # scores above it are the tail's peaks
    ("min_peaks", np.int64),  # peaks needed before the fitted tail replaces z
    ("joint_factor", np.float64),  # a supported row is flagged at the tail's score for alpha times this (0: off)
    ("has_support", np.int64),  # 1: another metric (the grad norm) supports or not: see "Joint evidence"
    ("z_joint0", np.float64),  # a supported row's score before the tail is fitted (inf: none)
])

#: Counters carried between rows (one record).
COUNTS = np.dtype([
    ("n_accepted", np.int64),  # values that entered the baseline, warm-up included
    ("n_judged", np.int64),  # rows judged (flagged or accepted after the warm-up)
    ("n_pending", np.int64), ("pending_head", np.int64),  # the queue of closed events awaiting confirmation
    ("n_known_buckets", np.int64),  # buckets with at least min_bucket_periods residuals
    ("offset_sum", np.float64),  # sum of the known buckets' median residuals (their mean centres the offsets)
    ("z_tail", np.float64),  # the score threshold the fitted tail gives (NaN until min_peaks peaks)
    ("z_censor", np.float64),  # scores from it up enter the tail as censored peaks (value unknown, counted)
    ("tail_xi", np.float64), ("tail_sigma", np.float64),  # the fitted generalized Pareto shape and scale
    ("last_censored", np.int64),  # n_judged of the last censored peak (a run of them is one peak)
    ("z_joint", np.float64),  # the fitted tail's score for a row another metric supports (NaN until fitted)
])

#: One event: the open one, a pending one, or an emitted one (fields a stage does not use stay 0).
EVENT = np.dtype([
    ("kind", np.int64), ("start", np.int64), ("end", np.int64), ("peak", np.int64), ("recovery", np.int64),
    ("n_rows", np.int64), ("bucket", np.int64), ("is_open", np.int64), ("n_post", np.int64),
    ("accepted_mark", np.int64),  # n_accepted when it closed: values after it are n_accepted - accepted_mark
    ("judged_close", np.int64), ("judged_start", np.int64),  # n_judged when it closed / when it started
    ("x", np.float64), ("base", np.float64), ("z", np.float64), ("scale", np.float64), ("offset", np.float64),
    ("post", np.float64), ("new_level", np.float64),
])

#: A rolling window of the last ``len(ring)`` values: ring (arrival order), sorted copy, meta = [head, count].
Window = namedtuple("Window", "ring sorted meta")
#: The trend's window: the last W values split into the recent ``h`` and the older ``W - h``, each sorted.
TrendWindow = namedtuple("TrendWindow", "ring recent old meta")
#: Per-bucket windows of residuals: ring and sorted (K, Wb), meta (K, 2) = head, count; median (K,).
BucketWindows = namedtuple("BucketWindows", "ring sorted meta median")
#: Everything the loop carries from one row to the next.
KernelState = namedtuple("KernelState", [
    "counts",  # COUNTS record array of length 1
    "open",  # EVENT record array of length 1: the event being extended (is_open = 1)
    "pending",  # EVENT array (queue,): closed events awaiting confirmation, a ring from counts.pending_head
    "trend",  # TrendWindow of bucket-adjusted accepted values y
    "scale",  # Window of |x - baseline| of accepted values: the noise scale (MAD)
    "mix",  # Window of raw accepted values (what a detector without tags would take as its median)
    "raw_scale",  # Window of |x - median(mix)|: that detector's noise scale
    "shadow",  # Window (ring only) of the judged values y, flagged or not: the new level after a shift
    "post",  # Window (ring only) of accepted judged values y: what decides whether a spike returned
    "buckets",  # BucketWindows
    "tail",  # Window of the excesses (score - tail_start) of accepted judged rows over tail_start: the peaks
    "tail_at",  # Window (ring only) of n_judged at each peak, aligned with tail's ring
    "scratch",  # work space for the medians of a confirmation or a re-anchoring (the loop allocates nothing)
])
#: A chunk of rows, and the per-row verdicts written for it.
Rows = namedtuple("Rows", "step value bucket support")
Verdicts = namedtuple("Verdicts", "status baseline score")


def _window(cap: int, sorted_too: bool = True) -> Window:
    return Window(np.zeros(cap), np.zeros(cap if sorted_too else 0), np.zeros(2, np.int64))


def new_state(params: np.ndarray, tail_window: int = 1) -> KernelState:
    """An empty state for the parameters of a ``PARAMS`` record array (``tail_window``: peaks kept)."""
    p = params[0]
    w, h, q = int(p["window"]), int(p["half"]), int(p["queue"])
    wb = int(p["bucket_window"])
    return KernelState(
        counts=empty_counts(), open=np.zeros(1, EVENT), pending=np.zeros(q, EVENT),
        trend=TrendWindow(np.zeros(w), np.zeros(h), np.zeros(w - h), np.zeros(2, np.int64)),
        scale=_window(w), mix=_window(w), raw_scale=_window(w),
        shadow=_window(int(p["max_duration"]), False), post=_window(int(p["confirm"]), False),
        buckets=BucketWindows(np.zeros((0, wb)), np.zeros((0, wb)), np.zeros((0, 2), np.int64), np.zeros(0)),
        tail=_window(tail_window), tail_at=_window(tail_window, False),
        scratch=np.zeros(max(w, int(p["max_duration"]), int(p["confirm"])) + 1),
    )


def copy_state(state: tuple) -> tuple:
    """A deep copy (``finish`` resolves what is pending on a copy, so the live state is untouched)."""
    return type(state)(*(copy_state(v) if isinstance(v, tuple) else v.copy() for v in state))


def with_buckets(state: KernelState, n: int) -> KernelState:
    """The state with per-bucket windows for bucket ids ``0..n-1`` (grown, existing windows kept)."""
    bw = state.buckets
    k, wb = bw.ring.shape
    if n <= k:
        return state
    grown = BucketWindows(np.concatenate([bw.ring, np.zeros((n - k, wb))]),
                          np.concatenate([bw.sorted, np.zeros((n - k, wb))]),
                          np.concatenate([bw.meta, np.zeros((n - k, 2), np.int64)]),
                          np.concatenate([bw.median, np.zeros(n - k)]))
    return state._replace(buckets=grown)


def empty_counts() -> np.ndarray:
    c = np.zeros(1, COUNTS)
    c["z_tail"] = np.nan
    c["z_censor"] = np.nan
    c["last_censored"] = -2
    c["z_joint"] = np.nan
    return c


def bucket_offset(state: KernelState, b: int, min_bucket_periods: int) -> float:
    """Bucket ``b``'s current offset from the trend (NaN while it has fewer than ``min_bucket_periods`` steps)."""
    c = state.counts[0]
    bw = state.buckets
    if b >= len(bw.median) or bw.meta[b, 1] < min_bucket_periods or c["n_known_buckets"] == 0:
        return float("nan")
    return float(bw.median[b] - c["offset_sum"] / c["n_known_buckets"])


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


# --- events ---------------------------------------------------------------------------------------------------------
@_jit
def _copy_event(dst, src):
    dst.kind = src.kind
    dst.start = src.start
    dst.end = src.end
    dst.peak = src.peak
    dst.recovery = src.recovery
    dst.n_rows = src.n_rows
    dst.bucket = src.bucket
    dst.is_open = src.is_open
    dst.n_post = src.n_post
    dst.accepted_mark = src.accepted_mark
    dst.judged_close = src.judged_close
    dst.judged_start = src.judged_start
    dst.x = src.x
    dst.base = src.base
    dst.z = src.z
    dst.scale = src.scale
    dst.offset = src.offset
    dst.post = src.post
    dst.new_level = src.new_level


@_jit
def _emit(events, n_ev, src, kind, end, recovery, is_open, n_post, post, new_level):
    """Append an event built from ``src`` (its peak fields and counts) to the output."""
    e = events[n_ev]
    _copy_event(e, src)
    e.kind = kind
    e.end = end
    e.recovery = recovery
    e.is_open = is_open
    e.n_post = n_post
    e.post = post
    e.new_level = new_level
    return n_ev + 1


@_jit
def _shift_from(state, events, n_ev, step_now):
    """Declare a level shift made of every pending event and the open one; re-anchor the trend."""
    c = state.counts[0]
    op = state.open[0]
    Q = state.pending.shape[0]
    a = events[n_ev]  # the shift is built in its output slot: first start, summed rows, the highest-scoring peak
    a.start = -1
    a.judged_start = c.n_judged
    a.n_rows = 0
    a.peak = -1
    a.bucket = -1
    a.x, a.base, a.z, a.scale, a.offset = np.nan, np.nan, -np.inf, np.nan, np.nan
    for j in range(c.n_pending):
        e = state.pending[(c.pending_head + j) % Q]
        if a.start < 0:
            a.start = e.start
            a.judged_start = e.judged_start
        a.n_rows += e.n_rows
        if e.z > a.z:
            a.x, a.base, a.z, a.scale, a.offset = e.x, e.base, e.z, e.scale, e.offset
            a.peak, a.bucket = e.peak, e.bucket
    if op.is_open == 1:
        if a.start < 0:
            a.start = op.start
            a.judged_start = op.judged_start
        a.n_rows += op.n_rows
        if op.z > a.z:
            a.x, a.base, a.z, a.scale, a.offset = op.x, op.base, op.z, op.scale, op.offset
            a.peak, a.bucket = op.peak, op.bucket
    a.new_level = _reanchor(state, c.n_judged - a.judged_start + 1)
    a.kind = EV_SHIFT
    a.end = step_now
    a.recovery = -1
    a.is_open = 0
    a.n_post = 0
    a.post = np.nan
    c.n_pending = 0
    op.is_open = 0
    return n_ev + 1


@_jit
def _resolve(p, state, events, n_ev, step_now, final):
    """Confirm pending events: a spike returns (its next ``confirm`` accepted values sit closer to the baseline
    than to its peak); one that does not, or that waits ``max_duration`` judged rows for them, was the start of a
    level shift."""
    c = state.counts[0]
    if c.n_pending == 0:  # the common case: nothing waits (and no buffer is allocated for nothing)
        return n_ev
    R, D = p.confirm, p.max_duration
    Q = state.pending.shape[0]
    tmp = state.scratch
    while c.n_pending > 0:
        e = state.pending[c.pending_head]
        n_post = c.n_accepted - e.accepted_mark
        timed_out = c.n_judged - e.judged_close >= D
        if n_post < R and not timed_out and not final:
            break
        returned = False
        post = np.nan
        m = min(n_post, R)
        if m > 0 and not timed_out:
            _ring_last(state.post, m, tmp)
            post = _sorted_median(tmp, m)
            base_t = e.base - e.offset
            peak_y = e.x - e.offset
            returned = post - base_t < 0.5 * (peak_y - base_t)
        if not returned:
            return _shift_from(state, events, n_ev, step_now)
        n_ev = _emit(events, n_ev, e, EV_SPIKE, e.end, e.recovery, 0, m, post, np.nan)
        c.pending_head = (c.pending_head + 1) % Q
        c.n_pending -= 1
    return n_ev


@_jit
def _bucket_push(p, state, b, resid):
    """Add a residual to bucket ``b``'s window; keep the sum of the known buckets' medians current."""
    bw = state.buckets
    c = state.counts[0]
    min_b = p.min_bucket_periods
    known_before = bw.meta[b, 1] >= min_b
    old = bw.median[b]
    _push(bw.ring[b], bw.sorted[b], bw.meta[b], resid)
    m = _median(bw.sorted[b], bw.meta[b, 1])
    bw.median[b] = m
    if known_before:
        c.offset_sum += m - old
    elif bw.meta[b, 1] >= min_b:
        c.offset_sum += m
        c.n_known_buckets += 1


#: Scores at or above the censoring limit enter the tail as censored peaks: counted, their size unknown (this value
#: sorts them last). For rates of ``CENSOR_P`` per step and below the limit is the threshold itself, so no flagged
#: score (a spike) ever lends its size to the tail it is judged against; for higher rates it is the fit's score at
#: ``CENSOR_P``, so that censoring stays a small share of the peaks. Before the first fit the limit is ``z``.
CENSORED = 1e300
CENSOR_P = 1e-4
#: The fit reads the sorted peaks up to this share of them (or up to the first censored one, if lower): what lies
#: above, the far tail, censored noise and any spike alike, weighs only by its count.
TRIM = 0.99
#: Bounds of the fitted shape: from a clearly bounded tail to a very heavy one (infinite variance from 0.5 up).
XI_LO = -0.5
XI_HI = 0.95
#: A supported row (another metric spiked at it or just before) is flagged when its score is rarer than
#: ``alpha * joint_factor`` per step, never commoner than this: two metrics agreeing make a weaker loss move real.
JOINT_MAX_P = 1e-3
#: With a false_rate but fewer than min_peaks peaks, the jump condition is at least this (the fixed rule's default):
#: the fixed score z alone flags heavy-tailed noise every few hundred steps.
FALLBACK_RATIO = 1.5


@_jit
def _gpd_quantile(t0, xi, sigma, q):
    """The score a generalized Pareto above ``t0`` exceeds with probability ``q`` (relative to ``t0``'s)."""
    if q >= 1.0:
        return t0
    if abs(xi) < 1e-6:
        return t0 - sigma * np.log(q)
    return t0 + sigma / xi * (q ** (-xi) - 1.0)


@_jit
def _partial_moments(xi, c):
    """``int_0^c Q(p) dp`` and ``int_0^c p Q(p) dp`` of the generalized Pareto of shape ``xi`` and scale 1 (``Q``
    its quantile function): the two trimmed probability-weighted moments the fit matches."""
    if abs(xi) < 1e-6:
        xi = 1e-6
    u = 1.0 - c
    m0 = ((1.0 - u ** (1.0 - xi)) / (1.0 - xi) - c) / xi
    i1 = 1.0 / (1.0 - xi) - 1.0 / (2.0 - xi) - u ** (1.0 - xi) / (1.0 - xi) + u ** (2.0 - xi) / (2.0 - xi)
    return m0, (i1 - 0.5 * c * c) / xi


@_jit
def _fitted_shape(share, target):
    """The shape whose trimmed moments (the lowest ``share`` of the peaks) have the ratio ``target``, within
    [XI_LO, XI_HI]: the ratio rises with the shape, so bisect."""
    lo, hi = XI_LO, XI_HI
    m0, m1 = _partial_moments(lo, share)
    if m1 / m0 >= target:
        return lo
    m0, m1 = _partial_moments(hi, share)
    if m1 / m0 <= target:
        return hi
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        m0, m1 = _partial_moments(mid, share)
        if m1 / m0 < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@_jit
def _fit_tail(p, state):
    """Refit the tail after a new peak: a generalized Pareto by trimmed probability-weighted moments on the lower
    ``TRIM`` of the sorted excesses (censored peaks count, their sizes do not), and the score it says is exceeded
    with probability ``alpha`` (module docstring of spikes.py)."""
    c = state.counts[0]
    k = state.tail.meta[1]
    if k < p.min_peaks:
        return
    y = state.tail.sorted
    m = int(TRIM * k)
    while m > 0 and y[m - 1] >= CENSORED:
        m -= 1
    if m < p.min_peaks // 2:  # mostly censored: too little known to fit, keep the last fit
        return
    a0 = 0.0
    a1 = 0.0
    for j in range(m):
        a0 += y[j]
        a1 += y[j] * (j + 0.5) / k
    if a0 <= 0.0:
        return
    share = m / k
    xi = _fitted_shape(share, a1 / a0)
    m0, _ = _partial_moments(xi, share)
    sigma = a0 / k / m0
    cap = state.tail.ring.shape[0]
    oldest = state.tail_at.ring[state.tail_at.meta[0] % cap] if k == cap else 1.0
    span = c.n_judged - oldest + 1.0
    q = p.alpha * span / k  # the exceedance probability asked, relative to that of tail_start
    c.z_tail = _gpd_quantile(p.tail_start, xi, sigma, q)
    c.z_censor = c.z_tail if p.alpha <= CENSOR_P else _gpd_quantile(p.tail_start, xi, sigma, CENSOR_P * span / k)
    if p.joint_factor > 0.0:
        c.z_joint = _gpd_quantile(p.tail_start, xi, sigma, min(p.alpha * p.joint_factor, JOINT_MAX_P) * span / k)
    c.tail_xi = xi
    c.tail_sigma = sigma


@_jit
def _over(p, r, sc, base, z_thr, z_large, ratio_floor):
    """Above the thresholds: the score and the relative jump together; a larger jump needs a smaller score."""
    if r <= 0.0:
        return False
    if r / sc >= z_thr and r >= max((max(p.ratio, ratio_floor) - 1.0) * abs(base), p.min_jump):
        return True
    return r / sc >= z_large and r >= max((p.ratio_large - 1.0) * abs(base), p.min_jump)


@_jit
def _calibrated(p, c, r, sc, base, supported):
    """The fitted tail's verdict ("Calibrated thresholds" in spikes.py's docstring): the jump condition always; the
    score rarer than alpha by the tail, or than ``alpha * joint_factor`` where the grad norm supports the row, and
    never more than ``z`` where no other metric can support or contradict it."""
    if p.has_support == 0:
        return _over(p, r, sc, base, min(p.z, c.z_tail), p.z_large, 1.0)
    if supported:
        return _over(p, r, sc, base, min(p.z, c.z_joint), p.z_large, 1.0)
    return _over(p, r, sc, base, c.z_tail, np.inf, 1.0)  # the grad norm ignored it: the tail must call it rare


@_jit
def run_rows(params, state, rows, out, events):
    """Process ``rows`` in order, writing ``out`` per row and events into ``events``, updating ``state`` in place.

    Returns ``(n_events, n_rows_done)``: it stops early, between rows, when fewer than ``queue + 2`` free event
    slots are left (one row can emit at most ``queue + 1`` events), so a small event buffer serves any number of
    rows. ``params.z_large`` is infinite without buckets (the looser score needs per-bucket baselines).
    """
    p = params[0]
    c = state.counts[0]
    op = state.open[0]
    bw = state.buckets
    n_ev = 0
    room = events.shape[0] - (p.queue + 2)
    for i in range(rows.value.shape[0]):
        if n_ev > room:
            return n_ev, i
        v = rows.value[i]
        s = rows.step[i]
        b = rows.bucket[i]
        out.baseline[i] = np.nan
        out.score[i] = np.nan
        if not np.isfinite(v):
            out.status[i] = NONFINITE
            continue
        t = _trend(state.trend, p.min_old)
        has_t = not np.isnan(t)
        warm = c.n_accepted < p.min_periods or not has_t
        off = 0.0
        known = False
        if b >= 0:
            if bw.meta[b, 1] >= p.min_bucket_periods:
                off = bw.median[b] - c.offset_sum / c.n_known_buckets
                known = True
            elif not warm:
                _bucket_push(p, state, b, v - t)
                out.status[i] = NEW_BUCKET
                continue
        y = v - off  # the value with its bucket's offset removed: what the trend is made of
        base = t + off
        r = v - base
        st = WARMUP
        if not warm:
            sc = MAD_TO_SD * _win_median(state.scale)
            sc = max(sc, 1e-9 * abs(base) + 1e-12)
            zz = r / sc
            out.baseline[i] = base
            out.score[i] = zz
            c.n_judged += 1
            z_thr = p.z
            ratio_floor = 1.0
            if p.alpha > 0.0:
                if not np.isnan(c.z_tail):
                    z_thr = c.z_tail
                else:  # too few peaks yet: the fixed rule, its jump condition at least the default 1.5x
                    ratio_floor = FALLBACK_RATIO
                if zz > p.tail_start:  # a peak of the tail (judged before the fit moves)
                    z_cens = p.z if np.isnan(c.z_censor) else c.z_censor
                    # censored: above the limit, or what the fixed rule calls a spike (a fit that drifted high then
                    # never lets the clear spikes it failed to flag feed it higher); a run of censored rows is one
                    # peak (noise this rare comes alone; a spike's or a new level's rows are one event)
                    clear = zz >= p.z and r >= (FALLBACK_RATIO - 1.0) * abs(base)
                    cens = clear or zz >= z_cens
                    if not clear and (not cens or c.last_censored != c.n_judged - 1):
                        _win_push(state.tail, CENSORED if cens else zz - p.tail_start)
                        _ring_push(state.tail_at, c.n_judged)
                        _fit_tail(p, state)
                    if cens:
                        c.last_censored = c.n_judged
            if p.alpha > 0.0 and not np.isnan(c.z_tail):
                flag = _calibrated(p, c, r, sc, base, rows.support[i] != 0)
            elif rows.support[i] != 0:  # no fit yet, but the grad norm agrees: the Gaussian's score for the joint rate
                flag = _over(p, r, sc, base, min(z_thr, p.z_joint0), p.z_large, ratio_floor)
            else:
                flag = _over(p, r, sc, base, z_thr, p.z_large, ratio_floor)
            below_only = False
            if flag and known and off < 0.0:
                below_only = not _over(p, v - t, sc, t, z_thr, p.z_large, ratio_floor)
                if below_only and bw.meta[b, 1] < p.bucket_window:
                    # flagged only because a young bucket's offset sits below the trend: an offset resting on a
                    # few steps (a rare bucket first seen in the warm-up's steep descent) is not trusted alone
                    flag = False
            if flag:
                out.status[i] = FLAGGED
                if below_only:
                    # flagged only because its bucket sits below the trend: the bucket keeps learning its
                    # level, or an offset learned early would flag every later step of that bucket and never
                    # correct itself
                    _bucket_push(p, state, b, v - t)
                _ring_push(state.shadow, y)
                if op.is_open == 0:
                    op.is_open = 1
                    op.start = s
                    op.n_rows = 0
                    op.judged_start = c.n_judged
                    op.z = -np.inf
                op.n_rows += 1
                op.end = s
                if zz > op.z:
                    op.x, op.base, op.z, op.scale, op.offset = v, base, zz, sc, off
                    op.peak = s
                    op.bucket = b
                if op.n_rows >= p.max_duration:
                    n_ev = _shift_from(state, events, n_ev, s)
                else:
                    n_ev = _resolve(p, state, events, n_ev, s, False)
                continue
            st = ACCEPTED
            if p.use_raw == 1 and known:  # would a detector without tags have flagged it?
                mix = _win_median(state.mix)
                sc_raw = MAD_TO_SD * _win_median(state.raw_scale)
                sc_raw = max(sc_raw, 1e-9 * abs(mix) + 1e-12)
                if _over(p, v - mix, sc_raw, mix, z_thr, p.z_large, ratio_floor):
                    st = EXPECTED
        out.status[i] = st
        # accept: the value enters every window
        if p.use_raw == 1:
            if state.mix.meta[1] > 0:
                _win_push(state.raw_scale, abs(v - _win_median(state.mix)))
            _win_push(state.mix, v)
        if has_t:
            _win_push(state.scale, abs(r))
            if b >= 0:
                _bucket_push(p, state, b, v - t)
        _trend_push(state.trend, y)
        if st == WARMUP:
            c.n_accepted += 1
            continue
        _ring_push(state.shadow, y)
        _ring_push(state.post, y)
        if op.is_open == 1:  # the open event closes: it waits in the queue for its confirmation
            e = state.pending[(c.pending_head + c.n_pending) % p.queue]
            _copy_event(e, op)
            e.recovery = s
            e.accepted_mark = c.n_accepted
            e.judged_close = c.n_judged
            c.n_pending += 1
            op.is_open = 0
        c.n_accepted += 1
        n_ev = _resolve(p, state, events, n_ev, s, False)
    return n_ev, rows.value.shape[0]


@_jit
def flush(params, state, last_step, events):
    """Resolve what is pending and open as if the run ended now (call on a copy of the state)."""
    p = params[0]
    op = state.open[0]
    n_ev = _resolve(p, state, events, 0, last_step, True)
    if op.is_open == 1:
        n_ev = _emit(events, n_ev, op, EV_SPIKE, op.end, -1, 1, 0, np.nan, np.nan)
        op.is_open = 0
    return n_ev
