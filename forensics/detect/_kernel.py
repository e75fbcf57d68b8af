"""The compiled inner loop of :class:`~forensics.detect.spikes.SpikeDetector` (numba).

A spike rule is causal and sequential (each verdict decides what enters the baseline of the next step), so it cannot
be vectorised; a Python loop runs ~100x slower than a pandas rolling median. Everything the loop needs between rows
lives in a handful of numpy arrays (:class:`KernelState`), so a live run can stop after any row and continue with
the next chunk exactly where it left off: that is what makes online and offline answers identical.

Rolling windows are kept as a ring buffer (arrival order) plus a sorted copy (insertion/removal by shifting, which
for windows of tens of values beats a heap or skip list); the median of a sorted window is a lookup.

Per row (finite value ``x``, bucket ``b`` or -1)::

    m_b   = median of (x - T) over the last Wb accepted steps of bucket b
    off   = m_b - mean of m_k over the buckets known so far                      (0 without a bucket)
    T     = trend of the last W accepted values of y = x - off (median of the recent half, extrapolated along
            the line through the recent-half and older-half medians, clamped to the recent half's range)
    base  = T + off
    scale = 1.4826 * median |x - base| over the last W accepted steps            (MAD about the baseline)
    flag  = (x - base) / scale >= z  and  x - base >= max((ratio - 1) * |base|, min_jump)

With buckets, an accepted step is also checked against what a detector without tags would use (the plain median
of the last W accepted raw values and the MAD about it); above both thresholds there, it is ``expected_for_bucket``.

The trend is made of bucket-adjusted values because the median of a mix of bucket levels jumps between them; the
offsets are centred on their mean so that trend and offsets cannot drift together (``T + c`` and ``off - c`` would
explain the data equally well). Flagged rows stay out of every window. See :mod:`forensics.detect.spikes` for the
event rules.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numba as nb
import numpy as np

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

# rows of the float window matrix
W_TREND, W_RECENT, W_OLD, W_SCALE_RING, W_SCALE, W_RAW_RING, W_RAW, W_SHADOW, W_POST, W_MIX_RING, W_MIX = range(11)
N_WINDOWS = 11

# integer scalar state
(I_TREND_HEAD, I_TREND_N, I_SCALE_HEAD, I_SCALE_N, I_RAW_HEAD, I_RAW_N, I_SHADOW_HEAD, I_SHADOW_N, I_POST_HEAD,
 I_POST_N, I_N_ACC, I_N_JUDGED, I_OPEN, I_OPEN_START, I_OPEN_END, I_OPEN_PEAK, I_OPEN_N, I_OPEN_JSTART,
 I_OPEN_BUCKET, I_N_PEND, I_PEND_HEAD, I_N_KNOWN, I_MIX_HEAD, I_MIX_N) = range(24)
N_ISTATE = 24
# float scalar state: the open event's peak, then the sum of the known buckets' median residuals
F_PEAK_X, F_PEAK_BASE, F_PEAK_Z, F_PEAK_SCALE, F_PEAK_OFF, F_MED_SUM = range(6)
N_FSTATE = 6

# a pending (closed, not yet confirmed) event: ints and floats
(PI_START, PI_END, PI_PEAK, PI_RECOVERY, PI_N, PI_ACC_MARK, PI_JCLOSE, PI_JSTART, PI_BUCKET) = range(9)
N_PI = 9
N_PF = 5  # the F_PEAK_* part of the float state

# an emitted event
(EI_KIND, EI_START, EI_END, EI_PEAK, EI_RECOVERY, EI_N, EI_BUCKET, EI_OPEN, EI_N_POST) = range(9)
N_EI = 9
(EF_X, EF_BASE, EF_Z, EF_SCALE, EF_OFF, EF_POST, EF_NEW_LEVEL) = range(7)
N_EF = 7

# parameters
PF_Z, PF_RATIO, PF_MIN_JUMP, PF_Z_LARGE, PF_RATIO_LARGE = range(5)
(PI_W, PI_H, PI_MIN_OLD, PI_MIN_PERIODS, PI_D, PI_R, PI_WB, PI_MIN_B, PI_QCAP, PI_USE_RAW) = range(10)

MAD_TO_SD = 1.4826


@dataclass
class KernelState:
    """Everything the loop carries from one row to the next (copyable, so ``finish`` can work on a copy)."""

    win: np.ndarray  # (N_WINDOWS, cap) float64
    ist: np.ndarray  # (N_ISTATE,) int64
    fst: np.ndarray  # (N_FSTATE,) float64
    bucket_f: np.ndarray  # (K, 2, Wb) float64: ring, sorted
    bucket_i: np.ndarray  # (K, 2) int64: head, count
    bucket_m: np.ndarray  # (K,) float64: median of each bucket's window
    pend_i: np.ndarray  # (Q, N_PI) int64
    pend_f: np.ndarray  # (Q, N_PF) float64

    @classmethod
    def empty(cls, cap: int, bucket_window: int, queue: int) -> KernelState:
        return cls(
            win=np.zeros((N_WINDOWS, cap)), ist=np.zeros(N_ISTATE, np.int64), fst=np.zeros(N_FSTATE),
            bucket_f=np.zeros((0, 2, bucket_window)), bucket_i=np.zeros((0, 2), np.int64), bucket_m=np.zeros(0),
            pend_i=np.zeros((queue, N_PI), np.int64), pend_f=np.zeros((queue, N_PF)),
        )

    def copy(self) -> KernelState:
        return KernelState(**{f.name: getattr(self, f.name).copy() for f in fields(self)})

    def ensure_buckets(self, n: int) -> None:
        """Grow the per-bucket windows to hold bucket ids ``0..n-1``."""
        k = self.bucket_i.shape[0]
        if n > k:
            wb = self.bucket_f.shape[2]
            self.bucket_f = np.concatenate([self.bucket_f, np.zeros((n - k, 2, wb))])
            self.bucket_i = np.concatenate([self.bucket_i, np.zeros((n - k, 2), np.int64)])
            self.bucket_m = np.concatenate([self.bucket_m, np.zeros(n - k)])

    def args(self) -> tuple:
        return self.win, self.ist, self.fst, self.bucket_f, self.bucket_i, self.bucket_m, self.pend_i, self.pend_f

    def offset(self, b: int, min_b: int) -> float:
        """Bucket ``b``'s current offset from the trend (NaN while it has fewer than ``min_b`` steps)."""
        if b >= len(self.bucket_m) or self.bucket_i[b, 1] < min_b or self.ist[I_N_KNOWN] == 0:
            return float("nan")
        return float(self.bucket_m[b] - self.fst[F_MED_SUM] / self.ist[I_N_KNOWN])


# --- sorted windows -------------------------------------------------------------------------------------------------
@nb.njit("void(f8[::1], i8, f8)", cache=True)
def _insert(srt, n, x):
    i = n
    while i > 0 and srt[i - 1] > x:
        srt[i] = srt[i - 1]
        i -= 1
    srt[i] = x


@nb.njit("void(f8[::1], i8, f8)", cache=True)
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


@nb.njit("void(f8[::1], i8, f8, f8)", cache=True)
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


@nb.njit("f8(f8[::1], i8)", cache=True)
def _median(srt, n):
    if n % 2 == 1:
        return srt[n // 2]
    return 0.5 * (srt[n // 2 - 1] + srt[n // 2])


@nb.njit("void(f8[::1], f8[::1], i8[::1], i8, i8, f8)", cache=True)
def _push(ring, srt, meta, k, cap, x):
    """Append ``x`` to a window of capacity ``cap``; ``meta[k]`` is its head, ``meta[k + 1]`` its count."""
    head = meta[k]
    n = meta[k + 1]
    if n == cap:
        _replace(srt, n, ring[head], x)
    else:
        _insert(srt, n, x)
        meta[k + 1] = n + 1
    ring[head] = x
    meta[k] = (head + 1) % cap


@nb.njit("void(f8[::1], i8[::1], i8, i8, f8)", cache=True)
def _ring_push(ring, meta, k, cap, x):
    """Append to a plain ring (no sorted copy)."""
    head = meta[k]
    ring[head] = x
    meta[k] = (head + 1) % cap
    if meta[k + 1] < cap:
        meta[k + 1] += 1


@nb.njit("void(f8[::1], i8[::1], i8, i8, i8, f8[::1])", cache=True)
def _ring_last(ring, meta, k, cap, m, out):
    """The last ``m`` values of a ring in arrival order into ``out[:m]``."""
    head = meta[k]
    for j in range(m):
        out[j] = ring[(head - m + j) % cap]


# --- the trend: two halves of the last W accepted values --------------------------------------------------------------
@nb.njit("void(f8[:, ::1], i8[::1], i8, i8, f8)", cache=True)
def _trend_push(win, ist, W, h, x):
    ring = win[W_TREND]
    recent = win[W_RECENT]
    old = win[W_OLD]
    head = ist[I_TREND_HEAD]
    n = ist[I_TREND_N]
    if n == W:  # full: the oldest leaves the older half, the value at age h moves over, x joins the recent half
        if W > h:
            moving = ring[(head - h) % W]
            _replace(old, W - h, ring[head], moving)
            _replace(recent, h, moving, x)
        else:
            _replace(recent, W, ring[head], x)
    elif W > h and n >= h:
        moving = ring[(head - h) % W]
        _remove(recent, h, moving)
        _insert(old, n - h, moving)
        _insert(recent, h - 1, x)
        ist[I_TREND_N] = n + 1
    else:
        _insert(recent, n, x)
        ist[I_TREND_N] = n + 1
    ring[head] = x
    ist[I_TREND_HEAD] = (head + 1) % W


@nb.njit("f8(f8[:, ::1], i8[::1], i8, i8)", cache=True)
def _trend(win, ist, h, min_old):
    """The baseline trend at the next step (NaN before the first accepted value)."""
    n = ist[I_TREND_N]
    if n == 0:
        return np.nan
    n_r = min(n, h)
    n_o = n - n_r
    recent = win[W_RECENT]
    med_r = _median(recent, n_r)
    if n_o < min_old:
        return med_r
    med_o = _median(win[W_OLD], n_o)
    c_r = (n_r + 1) / 2.0  # mean age of the recent half (age 1 = newest)
    c_o = n_r + (n_o + 1) / 2.0
    t = med_r - c_r * (med_o - med_r) / (c_o - c_r)
    lo = recent[0]
    hi = recent[n_r - 1]
    if t < lo:
        t = lo
    elif t > hi:
        t = hi
    return t


@nb.njit("f8(f8[:, ::1], i8[::1], i8, i8, i8, i8)", cache=True)
def _reanchor(win, ist, W, h, D, m):
    """Refill the trend with the last ``m`` judged values (a level shift: the new level is the baseline now)."""
    m = min(m, ist[I_SHADOW_N], W)
    tmp = np.empty(max(m, 1))
    _ring_last(win[W_SHADOW], ist, I_SHADOW_HEAD, D, m, tmp)
    ist[I_TREND_HEAD] = 0
    ist[I_TREND_N] = 0
    for j in range(m):
        _trend_push(win, ist, W, h, tmp[j])
    if m == 0:
        return np.nan
    return np.median(tmp[:m])


# --- events ---------------------------------------------------------------------------------------------------------
@nb.njit("i8(i8[:, ::1], f8[:, ::1], i8, i8, i8, i8, i8, i8, i8, i8, i8, i8, f8, f8, f8, f8, f8, f8, f8)", cache=True)
def _emit(ev_i, ev_f, n_ev, kind, start, end, peak, recovery, n_rows, bucket, is_open, n_post,
          x, base, z, scale, off, post, new_level):
    ev_i[n_ev, EI_KIND] = kind
    ev_i[n_ev, EI_START] = start
    ev_i[n_ev, EI_END] = end
    ev_i[n_ev, EI_PEAK] = peak
    ev_i[n_ev, EI_RECOVERY] = recovery
    ev_i[n_ev, EI_N] = n_rows
    ev_i[n_ev, EI_BUCKET] = bucket
    ev_i[n_ev, EI_OPEN] = is_open
    ev_i[n_ev, EI_N_POST] = n_post
    ev_f[n_ev, EF_X] = x
    ev_f[n_ev, EF_BASE] = base
    ev_f[n_ev, EF_Z] = z
    ev_f[n_ev, EF_SCALE] = scale
    ev_f[n_ev, EF_OFF] = off
    ev_f[n_ev, EF_POST] = post
    ev_f[n_ev, EF_NEW_LEVEL] = new_level
    return n_ev + 1


@nb.njit("i8(i8[::1], f8[:, ::1], i8[::1], f8[::1], i8[:, ::1], f8[:, ::1], i8[:, ::1], f8[:, ::1], i8, i8, i8)", cache=True)
def _shift_from(pi, win, ist, fst, pend_i, pend_f, ev_i, ev_f, n_ev, first, step_now):
    """Declare a level shift made of pending events ``first..`` and the open event; re-anchor the trend."""
    W, h, D, Q = pi[PI_W], pi[PI_H], pi[PI_D], pi[PI_QCAP]
    head = ist[I_PEND_HEAD]
    n_pend = ist[I_N_PEND]
    start = -1
    jstart = ist[I_N_JUDGED]
    peak, bucket = -1, -1
    px, pbase, pz, pscale, poff = np.nan, np.nan, -np.inf, np.nan, np.nan
    n_rows = 0
    for j in range(first, n_pend):
        q = (head + j) % Q
        if start < 0:
            start = pend_i[q, PI_START]
            jstart = pend_i[q, PI_JSTART]
        n_rows += pend_i[q, PI_N]
        if pend_f[q, F_PEAK_Z] > pz:
            pz = pend_f[q, F_PEAK_Z]
            px, pbase, pscale, poff = pend_f[q, F_PEAK_X], pend_f[q, F_PEAK_BASE], pend_f[q, F_PEAK_SCALE], \
                pend_f[q, F_PEAK_OFF]
            peak, bucket = pend_i[q, PI_PEAK], pend_i[q, PI_BUCKET]
    if ist[I_OPEN] == 1:
        if start < 0:
            start = ist[I_OPEN_START]
            jstart = ist[I_OPEN_JSTART]
        n_rows += ist[I_OPEN_N]
        if fst[F_PEAK_Z] > pz:
            pz = fst[F_PEAK_Z]
            px, pbase, pscale, poff = fst[F_PEAK_X], fst[F_PEAK_BASE], fst[F_PEAK_SCALE], fst[F_PEAK_OFF]
            peak, bucket = ist[I_OPEN_PEAK], ist[I_OPEN_BUCKET]
    span = ist[I_N_JUDGED] - jstart + 1
    new_level = _reanchor(win, ist, W, h, D, span)
    n_ev = _emit(ev_i, ev_f, n_ev, EV_SHIFT, start, step_now, peak, -1, n_rows, bucket, 0, 0,
                 px, pbase, pz, pscale, poff, np.nan, new_level)
    ist[I_N_PEND] = first
    ist[I_OPEN] = 0
    return n_ev


@nb.njit("i8(i8[::1], f8[:, ::1], i8[::1], f8[::1], i8[:, ::1], f8[:, ::1], i8[:, ::1], f8[:, ::1], i8, i8, b1)", cache=True)
def _resolve(pi, win, ist, fst, pend_i, pend_f, ev_i, ev_f, n_ev, step_now, final):
    """Confirm pending events: a spike returns (its next ``R`` accepted values sit closer to the baseline than
    to its peak); one that does not, or that waits ``D`` judged rows for them, was the start of a level shift."""
    R, D, Q = pi[PI_R], pi[PI_D], pi[PI_QCAP]
    tmp = np.empty(R)
    while ist[I_N_PEND] > 0:
        q = ist[I_PEND_HEAD]
        n_post = ist[I_N_ACC] - pend_i[q, PI_ACC_MARK]
        timed_out = ist[I_N_JUDGED] - pend_i[q, PI_JCLOSE] >= D
        if n_post < R and not timed_out and not final:
            break
        returned = False
        post = np.nan
        m = min(n_post, R)
        if m > 0 and not timed_out:
            _ring_last(win[W_POST], ist, I_POST_HEAD, R, m, tmp)
            post = np.median(tmp[:m])
            base_t = pend_f[q, F_PEAK_BASE] - pend_f[q, F_PEAK_OFF]
            peak_y = pend_f[q, F_PEAK_X] - pend_f[q, F_PEAK_OFF]
            returned = post - base_t < 0.5 * (peak_y - base_t)
        if not returned:
            return _shift_from(pi, win, ist, fst, pend_i, pend_f, ev_i, ev_f, n_ev, 0, step_now)
        n_ev = _emit(ev_i, ev_f, n_ev, EV_SPIKE, pend_i[q, PI_START], pend_i[q, PI_END], pend_i[q, PI_PEAK],
                     pend_i[q, PI_RECOVERY], pend_i[q, PI_N], pend_i[q, PI_BUCKET], 0, m,
                     pend_f[q, F_PEAK_X], pend_f[q, F_PEAK_BASE], pend_f[q, F_PEAK_Z], pend_f[q, F_PEAK_SCALE],
                     pend_f[q, F_PEAK_OFF], post, np.nan)
        ist[I_PEND_HEAD] = (q + 1) % Q
        ist[I_N_PEND] -= 1
    return n_ev


@nb.njit("void(f8[:, :, ::1], i8[:, ::1], f8[::1], i8[::1], f8[::1], i8, i8, i8, f8)", cache=True)
def _bucket_push(bucket_f, bucket_i, bucket_m, ist, fst, b, Wb, min_b, resid):
    """Add a residual to bucket ``b``'s window; keep the sum of the known buckets' medians current."""
    known_before = bucket_i[b, 1] >= min_b
    old = bucket_m[b]
    _push(bucket_f[b, 0], bucket_f[b, 1], bucket_i[b], 0, Wb, resid)
    m = _median(bucket_f[b, 1], bucket_i[b, 1])
    bucket_m[b] = m
    if known_before:
        fst[F_MED_SUM] += m - old
    elif bucket_i[b, 1] >= min_b:
        fst[F_MED_SUM] += m
        ist[I_N_KNOWN] += 1


@nb.njit(cache=True)
def _over(r, sc, base, z_thr, ratio, z_large, ratio_large, min_jump):
    """Above the thresholds: the score and the relative jump together; a larger jump needs a smaller score."""
    if r <= 0.0:
        return False
    if r / sc >= z_thr and r >= max((ratio - 1.0) * abs(base), min_jump):
        return True
    return r / sc >= z_large and r >= max((ratio_large - 1.0) * abs(base), min_jump)


@nb.njit(cache=True)
def run_rows(pf, pi, win, ist, fst, bucket_f, bucket_i, bucket_m, pend_i, pend_f, steps, x, bkt,
             status, base_out, score_out, ev_i, ev_f):
    """Process rows in order, updating the state in place.

    Returns ``(n_events, n_rows_done)``: it stops early, between rows, when fewer than ``Q + 2`` free event slots
    are left (one row can emit at most ``Q + 1`` events), so a small event buffer serves any number of rows.
    """
    z_thr, ratio, min_jump = pf[PF_Z], pf[PF_RATIO], pf[PF_MIN_JUMP]
    z_large, ratio_large = pf[PF_Z_LARGE], pf[PF_RATIO_LARGE]
    W, h, min_old, min_periods = pi[PI_W], pi[PI_H], pi[PI_MIN_OLD], pi[PI_MIN_PERIODS]
    D, R, Wb, min_b, Q, use_raw = pi[PI_D], pi[PI_R], pi[PI_WB], pi[PI_MIN_B], pi[PI_QCAP], pi[PI_USE_RAW]
    n_ev = 0
    room = ev_i.shape[0] - (Q + 2)
    for i in range(x.shape[0]):
        if n_ev > room:
            return n_ev, i
        v = x[i]
        s = steps[i]
        b = bkt[i]
        base_out[i] = np.nan
        score_out[i] = np.nan
        if not np.isfinite(v):
            status[i] = NONFINITE
            continue
        t = _trend(win, ist, h, min_old)
        has_t = not np.isnan(t)
        warm = ist[I_N_ACC] < min_periods or not has_t
        off = 0.0
        known = False
        if b >= 0:
            if bucket_i[b, 1] >= min_b:
                off = bucket_m[b] - fst[F_MED_SUM] / ist[I_N_KNOWN]
                known = True
            elif not warm:
                _bucket_push(bucket_f, bucket_i, bucket_m, ist, fst, b, Wb, min_b, v - t)
                status[i] = NEW_BUCKET
                continue
        y = v - off  # the value with its bucket's offset removed: what the trend is made of
        base = t + off
        r = v - base
        st = WARMUP
        if not warm:
            sc = MAD_TO_SD * _median(win[W_SCALE], ist[I_SCALE_N])
            sc = max(sc, 1e-9 * abs(base) + 1e-12)
            zz = r / sc
            base_out[i] = base
            score_out[i] = zz
            ist[I_N_JUDGED] += 1
            flag = _over(r, sc, base, z_thr, ratio, z_large, ratio_large, min_jump)
            below_only = False
            if flag and known and off < 0.0:
                r0 = v - t
                below_only = not _over(r0, sc, t, z_thr, ratio, z_large, ratio_large, min_jump)
                if below_only and bucket_i[b, 1] < Wb:
                    # flagged only because a young bucket's offset sits below the trend: an offset resting on a
                    # few steps (a rare bucket first seen in the warm-up's steep descent) is not trusted alone
                    flag = False
            if flag:
                status[i] = FLAGGED
                if below_only:
                    # flagged only because its bucket sits below the trend: the bucket keeps learning its
                    # level, or an offset learned early would flag every later step of that bucket and never
                    # correct itself
                    _bucket_push(bucket_f, bucket_i, bucket_m, ist, fst, b, Wb, min_b, v - t)
                _ring_push(win[W_SHADOW], ist, I_SHADOW_HEAD, D, y)
                if ist[I_OPEN] == 0:
                    ist[I_OPEN] = 1
                    ist[I_OPEN_START] = s
                    ist[I_OPEN_N] = 0
                    ist[I_OPEN_JSTART] = ist[I_N_JUDGED]
                    fst[F_PEAK_Z] = -np.inf
                ist[I_OPEN_N] += 1
                ist[I_OPEN_END] = s
                if zz > fst[F_PEAK_Z]:
                    fst[F_PEAK_X] = v
                    fst[F_PEAK_BASE] = base
                    fst[F_PEAK_Z] = zz
                    fst[F_PEAK_SCALE] = sc
                    fst[F_PEAK_OFF] = off
                    ist[I_OPEN_PEAK] = s
                    ist[I_OPEN_BUCKET] = b
                if ist[I_OPEN_N] >= D:
                    n_ev = _shift_from(pi, win, ist, fst, pend_i, pend_f, ev_i, ev_f, n_ev, 0, s)
                else:
                    n_ev = _resolve(pi, win, ist, fst, pend_i, pend_f, ev_i, ev_f, n_ev, s, False)
                continue
            st = ACCEPTED
            if use_raw == 1 and known:  # would a detector without tags have flagged it?
                mix = _median(win[W_MIX], ist[I_MIX_N])
                sc_raw = MAD_TO_SD * _median(win[W_RAW], ist[I_RAW_N])
                sc_raw = max(sc_raw, 1e-9 * abs(mix) + 1e-12)
                r_raw = v - mix
                if _over(r_raw, sc_raw, mix, z_thr, ratio, z_large, ratio_large, min_jump):
                    st = EXPECTED
        status[i] = st
        # accept: the value enters every window
        if use_raw == 1:
            if ist[I_MIX_N] > 0:
                _push(win[W_RAW_RING], win[W_RAW], ist, I_RAW_HEAD, W, abs(v - _median(win[W_MIX], ist[I_MIX_N])))
            _push(win[W_MIX_RING], win[W_MIX], ist, I_MIX_HEAD, W, v)
        if has_t:
            _push(win[W_SCALE_RING], win[W_SCALE], ist, I_SCALE_HEAD, W, abs(r))
            if b >= 0:
                _bucket_push(bucket_f, bucket_i, bucket_m, ist, fst, b, Wb, min_b, v - t)
        _trend_push(win, ist, W, h, y)
        if st == WARMUP:
            ist[I_N_ACC] += 1
            continue
        _ring_push(win[W_SHADOW], ist, I_SHADOW_HEAD, D, y)
        _ring_push(win[W_POST], ist, I_POST_HEAD, R, y)
        if ist[I_OPEN] == 1:
            q = (ist[I_PEND_HEAD] + ist[I_N_PEND]) % Q
            pend_i[q, PI_START] = ist[I_OPEN_START]
            pend_i[q, PI_END] = ist[I_OPEN_END]
            pend_i[q, PI_PEAK] = ist[I_OPEN_PEAK]
            pend_i[q, PI_RECOVERY] = s
            pend_i[q, PI_N] = ist[I_OPEN_N]
            pend_i[q, PI_ACC_MARK] = ist[I_N_ACC]
            pend_i[q, PI_JCLOSE] = ist[I_N_JUDGED]
            pend_i[q, PI_JSTART] = ist[I_OPEN_JSTART]
            pend_i[q, PI_BUCKET] = ist[I_OPEN_BUCKET]
            for j in range(N_PF):
                pend_f[q, j] = fst[j]
            ist[I_N_PEND] += 1
            ist[I_OPEN] = 0
        ist[I_N_ACC] += 1
        n_ev = _resolve(pi, win, ist, fst, pend_i, pend_f, ev_i, ev_f, n_ev, s, False)
    return n_ev, x.shape[0]


@nb.njit(cache=True)
def flush(pf, pi, win, ist, fst, pend_i, pend_f, last_step, ev_i, ev_f):
    """Resolve what is pending and open as if the run ended now (call on a copy of the state)."""
    n_ev = _resolve(pi, win, ist, fst, pend_i, pend_f, ev_i, ev_f, 0, last_step, True)
    if ist[I_OPEN] == 1:
        n_ev = _emit(ev_i, ev_f, n_ev, EV_SPIKE, ist[I_OPEN_START], ist[I_OPEN_END], ist[I_OPEN_PEAK], -1,
                     ist[I_OPEN_N], ist[I_OPEN_BUCKET], 1, 0, fst[F_PEAK_X], fst[F_PEAK_BASE], fst[F_PEAK_Z],
                     fst[F_PEAK_SCALE], fst[F_PEAK_OFF], np.nan, np.nan)
        ist[I_OPEN] = 0
    return n_ev
