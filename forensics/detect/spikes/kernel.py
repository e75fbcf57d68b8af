"""The compiled inner loop of :class:`~forensics.detect.spikes.detector.SpikeDetector` (numba).

The rule itself is written once, in :mod:`forensics.detect.spikes`; ``tests/spike_reference.py`` is the same
rule in plain Python, read top to bottom, and a property test holds this kernel to it (same findings on random
series, with and without buckets, under any chunking).

A spike rule is causal and sequential (each verdict decides what enters the baseline of the next step), so it cannot
be vectorised; a Python loop runs ~100x slower than a pandas rolling median. Everything the loop carries between rows
lives in one :data:`KernelState`, a named tuple of named parts (record arrays for scalars, windows for rolling
values), so a live run can stop after any row and continue with the next chunk exactly where it left off: that is
what makes online and offline answers identical.

The loop is split by job: the records and the state in :mod:`~forensics.detect.spikes.kernel_state` (no compiled
code), the rolling windows and the trend in :mod:`~forensics.detect.spikes.kernel_windows`, the calibrated tail in
:mod:`~forensics.detect.spikes.kernel_tail`, and here the events and the loop over rows. numba links the compiled
functions a loop calls into its cached machine code, so the cache is keyed by the content of the whole package
(:mod:`forensics.compiled.key`): a changed window, or the robust-SD constant, invalidates the loop that reads it.
"""

from __future__ import annotations

import numpy as np

from forensics.compiled.jit import compiled
from forensics.detect.spikes.kernel_state import (  # noqa: F401 - the records and codes are read through here
    ACCEPTED,
    BY_FIXED,
    BY_OBSERVED_MAX,
    BY_TAIL,
    COUNTS,
    EV_SHIFT,
    EV_SPIKE,
    EVENT,
    EXPECTED,
    FLAGGED,
    NEW_BUCKET,
    NONFINITE,
    PARAMS,
    RESTARTED,
    STATUS_NAMES,
    WARMUP,
    BucketWindows,
    KernelState,
    Rows,
    TrendWindow,
    Verdicts,
    Window,
    bucket_offset,
    copy_state,
    empty_counts,
    new_state,
    with_buckets,
)
from forensics.detect.spikes.kernel_tail import (
    CENSORED,
    FALLBACK_RATIO,
    _decide,
    _fit_tail,
    _note_clean,
    _over,
)
from forensics.detect.spikes.kernel_windows import (
    _flat,
    _median,
    _push,
    _reanchor,
    _restart,
    _ring_last,
    _ring_push,
    _sorted_median,
    _trend,
    _trend_push,
    _win_median,
    _win_push,
)
from forensics.stats import MAD_TO_SD

#: Every function of the loop is compiled without numba's reference counting: the state is a tuple of arrays, and
#: counting each array on every access was ~2/3 of the loop's time (measured with perf: NRT_incref/NRT_decref).
#: Nothing inside allocates; scratch space lives in the state (``scratch``).
_jit = compiled()


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
    dst.decided_by = src.decided_by
    dst.z_thr = src.z_thr
    dst.clean_max = src.clean_max


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
    a.decided_by, a.z_thr, a.clean_max = BY_FIXED, np.nan, np.nan
    for j in range(c.n_pending):
        e = state.pending[(c.pending_head + j) % Q]
        if a.start < 0:
            a.start = e.start
            a.judged_start = e.judged_start
        a.n_rows += e.n_rows
        if e.z > a.z:
            a.x, a.base, a.z, a.scale, a.offset = e.x, e.base, e.z, e.scale, e.offset
            a.peak, a.bucket = e.peak, e.bucket
            a.decided_by, a.z_thr, a.clean_max = e.decided_by, e.z_thr, e.clean_max
    if op.is_open == 1:
        if a.start < 0:
            a.start = op.start
            a.judged_start = op.judged_start
        a.n_rows += op.n_rows
        if op.z > a.z:
            a.x, a.base, a.z, a.scale, a.offset = op.x, op.base, op.z, op.scale, op.offset
            a.peak, a.bucket = op.peak, op.bucket
            a.decided_by, a.z_thr, a.clean_max = op.decided_by, op.z_thr, op.clean_max
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
        n_post = c.n_clean - e.accepted_mark
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


@_jit
def _below_a_low_trend(p, n_bucket, v, t, sc, mix, sc_raw, z_thr, ratio_floor):
    """Whether a flagged step of a young bucket (``n_bucket`` < ``bucket_window`` steps) is flagged only because
    the trend sits below the run's level: the median of the accepted values (``mix``, the view without tags) is
    itself above the thresholds against the trend ``t`` (noise ``sc``), and the step is not above them against
    ``mix`` (noise ``sc_raw``).

    Bucket offsets are relative to the known buckets' mean; a rare bucket first seen in the warm-up's steep
    descent learns an offset far below the others, the mean offset drops with it and the trend follows it below the
    run's level. Against that trend every later step of the rare buckets fires, none of them is accepted, so none
    of their offsets is ever corrected: such a step is judged as the view without tags judges it, and accepted, its
    bucket learns its level. A mature bucket's offset (``bucket_window`` steps) is trusted as before."""
    if n_bucket >= p.bucket_window:
        return False
    if not _over(p, mix - t, sc, t, z_thr, p.z_large, ratio_floor):
        return False
    return not _over(p, v - mix, sc_raw, mix, z_thr, p.z_large, ratio_floor)


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
        restarted = has_t and v != t and _flat(state.trend)
        if restarted:  # a constant is no baseline: the history starts over at the first value that moves
            _restart(state)
            t = np.nan
            has_t = False
        warm = c.n_accepted - c.history_start < p.min_periods or not has_t
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
        st = np.int64(RESTARTED) if restarted else np.int64(WARMUP)  # typed, not literal: one type for every branch
        zz = np.nan
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
            flag, decided, z_used = _decide(p, c, r, sc, base, rows.support[i] != 0, z_thr, ratio_floor)
            below_only = False
            if flag and known and off < 0.0:
                below_only = not _over(p, v - t, sc, t, z_thr, p.z_large, ratio_floor)
                if below_only and bw.meta[b, 1] < p.bucket_window:
                    # flagged only because a young bucket's offset sits below the trend: an offset resting on a
                    # few steps (a rare bucket first seen in the warm-up's steep descent) is not trusted alone
                    flag = False
            if flag and known and p.use_raw == 1 and state.mix.meta[1] > 0:
                # nor a trend that such offsets pulled below the run's level: the step is accepted, and its bucket
                # learns its level from it
                mix = _win_median(state.mix)
                sc_raw = max(MAD_TO_SD * _win_median(state.raw_scale), 1e-9 * abs(mix) + 1e-12)
                if _below_a_low_trend(p, bw.meta[b, 1], v, t, sc, mix, sc_raw, z_thr, ratio_floor):
                    flag = False
            _note_clean(p, c, zz, r, base, flag)
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
                    op.decided_by, op.z_thr, op.clean_max = decided, z_used, c.clean_max
                if op.n_rows >= p.max_duration:
                    n_ev = _shift_from(state, events, n_ev, s)
                elif c.n_pending > 0:  # tested here: a call passes the whole state, what waits is rare
                    n_ev = _resolve(p, state, events, n_ev, s, False)
                continue
            st = np.int64(ACCEPTED)
            if p.use_raw == 1 and known:  # would a detector without tags have flagged it?
                mix = _win_median(state.mix)
                sc_raw = MAD_TO_SD * _win_median(state.raw_scale)
                sc_raw = max(sc_raw, 1e-9 * abs(mix) + 1e-12)
                if _over(p, v - mix, sc_raw, mix, z_thr, p.z_large, ratio_floor):
                    st = np.int64(EXPECTED)
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
        if st == WARMUP or st == RESTARTED:
            c.n_accepted += 1
            continue
        _ring_push(state.shadow, y)
        _ring_push(state.post, y)
        if op.is_open == 1:  # the open event closes: it waits in the queue for its confirmation
            e = state.pending[(c.pending_head + c.n_pending) % p.queue]
            _copy_event(e, op)
            e.recovery = s
            e.accepted_mark = c.n_clean
            e.judged_close = c.n_judged
            c.n_pending += 1
            op.is_open = 0
        c.n_accepted += 1
        c.n_clean += 1
        if c.n_pending > 0:
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
