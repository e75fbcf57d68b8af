"""The spike rule in plain Python, read top to bottom: the reference the compiled kernel is held to.

The rule is documented once, in :mod:`forensics.detect.spikes`; this module states it again only as code. It is
slow (a Python loop with sorted copies of every window) and exists for one purpose: a property test checks that
:mod:`forensics.detect.spikes.kernel` gives the same verdict on every row and the same events on random series, with
and without buckets, under any chunking. Change the rule here first, then in the kernel, and let the test agree.
The tail fit's numerics (the generalized Pareto's trimmed moments, its quantile, the bisection for its shape) are
the kernel's own functions, called from here: they are formulas, not the rule, and one copy of them is enough.

``reference_events(steps, values, buckets, params)`` returns ``(events, statuses, baselines, scores)``; each event
is a dict with the fields of :data:`forensics.detect.spikes.kernel.EVENT` that the detector reads.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import numpy as np

from forensics.detect.spikes.kernel_state import (
    ACCEPTED,
    BY_FIXED,
    BY_OBSERVED_MAX,
    BY_TAIL,
    EV_SHIFT,
    EV_SPIKE,
    EXPECTED,
    FLAGGED,
    NEW_BUCKET,
    NONFINITE,
    RESTARTED,
    WARMUP,
)
from forensics.detect.spikes.kernel_tail import (
    CENSOR_P,
    CENSORED,
    FALLBACK_RATIO,
    JOINT_MAX_P,
    OBSERVED_EXTRAPOLATION,
    OBSERVED_MAX_FACTOR,
    TRIM,
)
from forensics.detect.spikes.kernel_tail import _fitted_shape as fitted_shape
from forensics.detect.spikes.kernel_tail import _gpd_quantile as gpd_quantile
from forensics.detect.spikes.kernel_tail import _partial_moments as partial_moments
from forensics.stats import MAD_TO_SD

EVENT_FIELDS = (
    "kind",
    "start",
    "end",
    "peak",
    "recovery",
    "n_rows",
    "bucket",
    "is_open",
    "n_post",
    "x",
    "base",
    "z",
    "scale",
    "offset",
    "post",
    "new_level",
    "decided_by",
    "z_thr",
    "clean_max",
)


def median(values: Sequence[float]) -> float:
    """The median as the kernel computes it: the middle of the sorted values, or half the sum of the two middle."""
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 == 1 else 0.5 * (s[n // 2 - 1] + s[n // 2])


class ReferenceSpikeRule:
    """One metric's rule state; ``params`` is a dict with the fields of
    :data:`forensics.detect.spikes.kernel.PARAMS`."""

    def __init__(self, params: dict, tail_window: int = 1):
        self.p = params
        W, D, R = params["window"], params["max_duration"], params["confirm"]
        self.trend_values: deque[float] = deque(maxlen=W)  # bucket-adjusted accepted values y, oldest first
        self.abs_residuals: deque[float] = deque(maxlen=W)  # |x - baseline| of accepted values
        self.mix: deque[float] = deque(maxlen=W)  # raw accepted values (the view without tags)
        self.mix_abs: deque[float] = deque(maxlen=W)  # |x - median(mix)| (that view's noise)
        self.judged: deque[float] = deque(maxlen=D)  # y of every judged row: the new level after a shift
        self.post: deque[float] = deque(maxlen=R)  # y of accepted judged rows: did a spike return?
        self.bucket_resid: dict[int, deque[float]] = {}  # bucket -> its last Wb residuals x - T
        self.bucket_median: dict[int, float] = {}
        self.offset_sum = 0.0  # sum of the known buckets' medians, kept as the kernel keeps it (incrementally)
        self.n_known = 0
        self.n_accepted = 0
        self.history_start = 0  # n_accepted when the history last started over (a move off a constant)
        self.n_clean = 0  # judged rows accepted: what a spike's confirmation counts
        self.clean_max = -math.inf  # the largest score of the clean history
        self.clean_pending = -math.inf  # accepted rows the fixed rule calls spikes, in a row: their largest score
        self.clean_run = 0
        self.n_judged = 0
        self.open: dict | None = None  # the event being extended
        self.pending: list[dict] = []  # closed events awaiting confirmation, oldest first
        self.peaks: deque[float] = deque(maxlen=tail_window)  # excesses over tail_start (CENSORED: unknown)
        self.peaks_at: deque[int] = deque(maxlen=tail_window)  # n_judged at each peak
        self.z_tail = float("nan")  # the fitted tail's threshold (NaN until min_peaks peaks)
        self.z_censor = float("nan")  # scores from it up are censored peaks
        self.z_joint = float("nan")  # the threshold of a supported row
        self.last_censored = -2  # n_judged of the last censored row (a run of them is one peak)

    # --- the baseline ---------------------------------------------------------------------------------------------
    def trend(self) -> float:
        """Median of the recent half, extrapolated along the line to the older half's median, clamped to the recent
        half's range; the plain median of the recent half while the older half is short."""
        vals = list(self.trend_values)
        if not vals:
            return float("nan")
        h = self.p["half"]
        recent, old = vals[-h:], vals[:-h] if len(vals) > h else []
        med_r = median(recent)
        if len(old) < self.p["min_old"]:
            return med_r
        med_o = median(old)
        c_r = (len(recent) + 1) / 2.0  # mean age of the recent half (age 1 = newest)
        c_o = len(recent) + (len(old) + 1) / 2.0
        t = med_r - c_r * (med_o - med_r) / (c_o - c_r)
        return min(max(t, min(recent)), max(recent))

    def push_bucket(self, b: int, resid: float) -> None:
        window = self.bucket_resid.setdefault(b, deque(maxlen=self.p["bucket_window"]))
        known_before = len(window) >= self.p["min_bucket_periods"]
        old = self.bucket_median.get(b, 0.0)
        window.append(resid)
        m = median(window)
        self.bucket_median[b] = m
        if known_before:
            self.offset_sum += m - old
        elif len(window) >= self.p["min_bucket_periods"]:
            self.offset_sum += m
            self.n_known += 1

    def over(
        self, r: float, scale: float, base: float, z: float, ratio_floor: float = 1.0, z_large: float | None = None
    ) -> bool:
        """Both conditions: the robust score and the relative jump (or the looser score for a larger jump)."""
        p = self.p
        z_large = p["z_large"] if z_large is None else z_large
        if r <= 0.0:
            return False
        if r / scale >= z and r >= max((max(p["ratio"], ratio_floor) - 1.0) * abs(base), p["min_jump"]):
            return True
        return r / scale >= z_large and r >= max((p["ratio_large"] - 1.0) * abs(base), p["min_jump"])

    def flat(self) -> bool:
        """The recent half of the trend holds at least two values, all equal: a constant, no baseline."""
        recent = list(self.trend_values)[-self.p["half"] :]
        return len(recent) >= 2 and min(recent) == max(recent)

    def restart(self) -> None:
        """The history starts over: every window of accepted values empties; events, the tail and the clean
        maximum stay (they are in noise units, which the constant never set)."""
        for window in (self.trend_values, self.abs_residuals, self.mix, self.mix_abs):
            window.clear()
        self.bucket_resid.clear()
        self.bucket_median.clear()
        self.offset_sum = 0.0
        self.n_known = 0
        self.history_start = self.n_accepted

    def fit_tail(self) -> None:
        """A generalized Pareto by trimmed probability-weighted moments on the lower TRIM of the sorted peaks
        (censored ones count, their sizes do not); the score exceeded with probability alpha."""
        p = self.p
        k = len(self.peaks)
        if k < p["min_peaks"]:
            return
        y = sorted(self.peaks)
        m = int(TRIM * k)
        while m > 0 and y[m - 1] >= CENSORED:
            m -= 1
        if m < p["min_peaks"] // 2:
            return
        a0 = 0.0
        a1 = 0.0
        for j in range(m):  # sequential sums, as the kernel adds them
            a0 += y[j]
            a1 += y[j] * (j + 0.5) / k
        if a0 <= 0.0:
            return
        share = m / k
        xi = fitted_shape(share, a1 / a0)  # the numerics are the kernel's own; the rule around them is restated
        m0, _ = partial_moments(xi, share)
        sigma = a0 / k / m0
        oldest = float(self.peaks_at[0]) if k == self.peaks.maxlen else 1.0
        span = self.n_judged - oldest + 1.0
        self.z_tail = gpd_quantile(p["tail_start"], xi, sigma, p["alpha"] * span / k)
        self.z_censor = (
            self.z_tail if p["alpha"] <= CENSOR_P else gpd_quantile(p["tail_start"], xi, sigma, CENSOR_P * span / k)
        )
        if p["joint_factor"] > 0.0:
            self.z_joint = gpd_quantile(
                p["tail_start"], xi, sigma, min(p["alpha"] * p["joint_factor"], JOINT_MAX_P) * span / k
            )

    def calibrated(self, r: float, scale: float, base: float, supported: bool) -> bool:
        """The fitted tail's verdict (the kernel's ``_calibrated``)."""
        p = self.p
        if p["has_support"] == 0:
            return self.over(r, scale, base, min(p["z"], self.z_tail))
        if supported:
            return self.over(r, scale, base, min(p["z"], self.z_joint))
        z_large, p["z_large"] = p["z_large"], math.inf  # the grad norm ignored it: the tail alone, no looser rule
        try:
            return self.over(r, scale, base, self.z_tail)
        finally:
            p["z_large"] = z_large

    def tail_threshold(self, supported: bool) -> float:
        p = self.p
        if p["has_support"] == 0:
            return min(p["z"], self.z_tail)
        return min(p["z"], self.z_joint) if supported else self.z_tail

    def decide(
        self, r: float, scale: float, base: float, supported: bool, z: float, floor: float
    ) -> tuple[bool, int, float]:
        """``(flagged, decided_by, the score it needed)``: the fitted tail, else (where the tail's threshold lies
        beyond the clean maximum) the fixed rule with a score of at least OBSERVED_MAX_FACTOR x that maximum; before
        a fit, the fixed rule."""
        p = self.p
        if p["alpha"] > 0.0 and not math.isnan(self.z_tail):
            z_used = self.tail_threshold(supported)
            if self.calibrated(r, scale, base, supported):
                return True, BY_TAIL, z_used
            m = self.clean_max
            if (
                z_used > OBSERVED_EXTRAPOLATION * m
                and r / scale >= OBSERVED_MAX_FACTOR * m
                and self.over(r, scale, base, p["z"], FALLBACK_RATIO, math.inf)
            ):
                return True, BY_OBSERVED_MAX, z_used
            return False, BY_TAIL, z_used
        z_used = min(z, p["z_joint0"]) if supported else z
        return self.over(r, scale, base, z_used, floor), BY_FIXED, z_used

    def note_clean(self, score: float, r: float, base: float, flagged: bool) -> None:
        """The clean maximum: every accepted judged row's score, but one the fixed rule calls a spike only when it
        came alone (the next judged row neither one nor flagged)."""
        if flagged:
            self.clean_pending, self.clean_run = -math.inf, 0
            return
        if score >= self.p["z"] and r >= (FALLBACK_RATIO - 1.0) * abs(base):
            self.clean_pending = max(self.clean_pending, score)
            self.clean_run += 1
            return
        if self.clean_run == 1:
            self.clean_max = max(self.clean_max, self.clean_pending)
        self.clean_pending, self.clean_run = -math.inf, 0
        self.clean_max = max(self.clean_max, score)

    # --- events ---------------------------------------------------------------------------------------------------
    def shift(self, step_now: int) -> dict:
        """Every pending event and the open one become one level shift; the trend restarts at the new level."""
        parts = self.pending + ([self.open] if self.open else [])
        peak = max(parts, key=lambda e: e["z"]) if parts else None
        n_judged_span = self.n_judged - (parts[0]["judged_start"] if parts else self.n_judged) + 1
        m = min(n_judged_span, len(self.judged), self.p["window"])
        new_values = list(self.judged)[len(self.judged) - m :]
        self.trend_values.clear()
        self.trend_values.extend(new_values)
        ev = {
            "kind": EV_SHIFT,
            "start": parts[0]["start"] if parts else -1,
            "end": step_now,
            "peak": peak["peak"] if peak else -1,
            "recovery": -1,
            "n_rows": sum(e["n_rows"] for e in parts),
            "bucket": peak["bucket"] if peak else -1,
            "is_open": 0,
            "n_post": 0,
            "x": peak["x"] if peak else np.nan,
            "base": peak["base"] if peak else np.nan,
            "z": peak["z"] if peak else -np.inf,
            "scale": peak["scale"] if peak else np.nan,
            "offset": peak["offset"] if peak else np.nan,
            "post": np.nan,
            "decided_by": peak["decided_by"] if peak else BY_FIXED,
            "z_thr": peak["z_thr"] if peak else np.nan,
            "clean_max": peak["clean_max"] if peak else np.nan,
            "new_level": float(np.median(new_values)) if m else np.nan,
        }
        self.pending = []
        self.open = None
        return ev

    def resolve(self, step_now: int, final: bool) -> list[dict]:
        """A pending event is a spike once its next ``confirm`` accepted values sit closer to its baseline than to
        its peak; if they do not, or do not arrive within ``max_duration`` judged rows, it began a level shift."""
        out = []
        while self.pending:
            e = self.pending[0]
            n_post = self.n_clean - e["accepted_mark"]
            timed_out = self.n_judged - e["judged_close"] >= self.p["max_duration"]
            if n_post < self.p["confirm"] and not timed_out and not final:
                break
            m = min(n_post, self.p["confirm"])
            post, returned = np.nan, False
            if m > 0 and not timed_out:
                post = float(np.median(list(self.post)[len(self.post) - m :]))
                base_t, peak_y = e["base"] - e["offset"], e["x"] - e["offset"]
                returned = post - base_t < 0.5 * (peak_y - base_t)
            if not returned:
                return out + [self.shift(step_now)]
            out.append({**e, "kind": EV_SPIKE, "is_open": 0, "n_post": m, "post": post, "new_level": np.nan})
            self.pending.pop(0)
        return out

    # --- one row --------------------------------------------------------------------------------------------------
    def row(self, step: int, x: float, b: int, supported: bool = False) -> tuple[int, float, float, list[dict]]:
        """Judge one row: ``(status, baseline, score, events that became final)``."""
        p = self.p
        if not np.isfinite(x):
            return NONFINITE, np.nan, np.nan, []
        t = self.trend()
        has_trend = not np.isnan(t)
        restarted = has_trend and x != t and self.flat()
        if restarted:
            self.restart()
            t, has_trend = float("nan"), False
        warm = self.n_accepted - self.history_start < p["min_periods"] or not has_trend
        offset, known = 0.0, False
        if b >= 0:
            if len(self.bucket_resid.get(b, ())) >= p["min_bucket_periods"]:
                offset = self.bucket_median[b] - self.offset_sum / self.n_known
                known = True
            elif not warm:
                self.push_bucket(b, x - t)  # a new bucket: learned from, not judged
                return NEW_BUCKET, np.nan, np.nan, []
        y = x - offset
        base = t + offset
        r = x - base
        status, baseline, score, events = RESTARTED if restarted else WARMUP, np.nan, np.nan, []
        if not warm:
            scale = max(MAD_TO_SD * median(self.abs_residuals), 1e-9 * abs(base) + 1e-12)
            baseline, score = base, r / scale
            self.n_judged += 1
            z = p["z"]
            floor = 1.0
            if p["alpha"] > 0.0:
                if not math.isnan(self.z_tail):
                    z = self.z_tail
                else:
                    floor = FALLBACK_RATIO  # too few peaks: the fixed rule, with at least its 1.5x jump
                if score > p["tail_start"]:  # a peak of the tail (judged before the fit moves)
                    z_cens = p["z"] if math.isnan(self.z_censor) else self.z_censor
                    clear = score >= p["z"] and r >= (FALLBACK_RATIO - 1.0) * abs(base)  # the fixed rule's spike
                    cens = clear or score >= z_cens
                    if not clear and (not cens or self.last_censored != self.n_judged - 1):
                        self.peaks.append(CENSORED if cens else score - p["tail_start"])
                        self.peaks_at.append(self.n_judged)
                        self.fit_tail()
                    if cens:
                        self.last_censored = self.n_judged
            flag, decided, z_used = self.decide(r, scale, base, supported, z, floor)
            below_only = False
            if flag and known and offset < 0.0:
                below_only = not self.over(x - t, scale, t, z, floor)
                if below_only and len(self.bucket_resid[b]) < p["bucket_window"]:
                    flag = False  # a young bucket's low offset is not trusted alone
            young = known and len(self.bucket_resid[b]) < p["bucket_window"]
            if flag and young and p["use_raw"] == 1 and self.mix:
                # nor a trend such offsets pulled below the run's level: the view without tags judges the step
                mix = median(self.mix)
                scale_raw = max(MAD_TO_SD * median(self.mix_abs), 1e-9 * abs(mix) + 1e-12)
                if self.over(mix - t, scale, t, z, floor) and not self.over(x - mix, scale_raw, mix, z, floor):
                    flag = False
            self.note_clean(score, r, base, flag)
            if flag:
                if below_only:
                    self.push_bucket(b, x - t)  # its bucket keeps learning its level
                self.judged.append(y)
                if self.open is None:
                    self.open = {"start": step, "n_rows": 0, "judged_start": self.n_judged, "z": -np.inf}
                self.open["n_rows"] += 1
                self.open["end"] = step
                if score > self.open["z"]:
                    self.open.update(
                        x=x,
                        base=base,
                        z=score,
                        scale=scale,
                        offset=offset,
                        peak=step,
                        bucket=b,
                        decided_by=decided,
                        z_thr=z_used,
                        clean_max=self.clean_max,
                    )
                if self.open["n_rows"] >= p["max_duration"]:
                    events = [self.shift(step)]
                else:
                    events = self.resolve(step, False)
                return FLAGGED, baseline, score, events
            status = ACCEPTED
            if p["use_raw"] == 1 and known:
                mix = median(self.mix)
                scale_raw = max(MAD_TO_SD * median(self.mix_abs), 1e-9 * abs(mix) + 1e-12)
                if self.over(x - mix, scale_raw, mix, z, floor):
                    status = EXPECTED
        # accepted (or warm-up): the value enters every window
        if p["use_raw"] == 1:
            if self.mix:
                self.mix_abs.append(abs(x - median(self.mix)))
            self.mix.append(x)
        if has_trend:
            self.abs_residuals.append(abs(r))
            if b >= 0:
                self.push_bucket(b, x - t)
        self.trend_values.append(y)
        if status in (WARMUP, RESTARTED):
            self.n_accepted += 1
            return status, baseline, score, events
        self.judged.append(y)
        self.post.append(y)
        if self.open is not None:
            self.pending.append(
                {**self.open, "recovery": step, "accepted_mark": self.n_clean, "judged_close": self.n_judged}
            )
            self.open = None
        self.n_accepted += 1
        self.n_clean += 1
        return status, baseline, score, self.resolve(step, False)

    def flush(self, last_step: int) -> list[dict]:
        """What is pending and open as if the run ended now (mutates: call on a fresh copy or at the end)."""
        out = self.resolve(last_step, True)
        if self.open is not None:
            out.append(
                {
                    **self.open,
                    "kind": EV_SPIKE,
                    "recovery": -1,
                    "is_open": 1,
                    "n_post": 0,
                    "post": np.nan,
                    "new_level": np.nan,
                }
            )
            self.open = None
        return out


def reference_events(
    steps: np.ndarray,
    values: np.ndarray,
    buckets: np.ndarray,
    params: dict,
    tail_window: int = 1,
    supported: np.ndarray | None = None,
) -> tuple[list[dict], np.ndarray, np.ndarray, np.ndarray]:
    """Run the rule over a whole series (steps increasing); events in the order they became final, then flushed."""
    rule = ReferenceSpikeRule(params, tail_window)
    n = len(values)
    status, baseline, score = np.empty(n, np.int8), np.empty(n), np.empty(n)
    events: list[dict] = []
    for i in range(n):
        sup = bool(supported[i]) if supported is not None else False
        status[i], baseline[i], score[i], ev = rule.row(int(steps[i]), float(values[i]), int(buckets[i]), sup)
        events += ev
    if n:
        events += rule.flush(int(steps[-1]))
    return [{k: e[k] for k in EVENT_FIELDS} for e in events], status, baseline, score
