"""Spikes on any metric: a robust causal baseline, two conditions together, events, level shifts, buckets.

**The baseline** of step ``t`` is built only from earlier *accepted* values (a flagged value never enters its own
baseline, nor any later one): the trend ``T`` is the median of the most recent ``window // 2`` accepted values,
extrapolated to step ``t`` along the line through that median and the median of the older half (so it follows a
steep warm-up descent instead of lagging above it), and clamped to the recent half's range (so it never overshoots
where a descent flattens). With ``trend=False`` it is the plain median of the last ``window`` accepted values.

**Two conditions together** flag a step:

- a robust score ``(value - baseline) / (1.4826 * MAD) >= z``, the MAD being the median absolute residual of the
  last ``window`` accepted steps about their baselines (the local noise);
- a relative jump ``value - baseline >= (ratio - 1) * |baseline|`` (and ``>= min_jump``, an absolute margin for
  metrics near 0).

The score alone fires on heavy-tailed noise (a Student-t with 3 degrees of freedom exceeds 6 robust SDs every few
hundred steps); the jump alone fires on noisy low-level metrics. Together, a 0.9 -> 4 jump always fires and noise at
a few percent of the level does not. Only upward moves are spikes.

**Events.** Consecutive flagged rows form one event: ``step`` (start), ``peak_step`` (highest score), ``end_step``,
``recovery_step`` (the first accepted row after it). NaN/inf rows are reported as ``nonfinite`` findings
(:mod:`forensics.detect.nonfinite`), enter no window and neither extend nor end an event.

**Level shifts are not spikes.** A spike returns: an event is confirmed as a spike once the median of the ``confirm``
accepted values after it lies closer to its baseline than to its peak. An event that does not return, or that lasts
``max_duration`` flagged rows, or whose ``confirm`` values do not arrive within ``max_duration`` judged rows, is the
start of a new level (a new data mix, an lr restart): the baseline re-anchors to the values since it started and one
``level_shift`` finding is reported (never in ``spikes``), covering every event still awaiting confirmation.

**Online.** ``update(new_rows)`` reports an event once it is final: a spike ``confirm`` accepted rows after it ends
(a few steps), a level shift when it is declared, a non-finite step at once. What is open at the end of a chunk is
pending (``finish()`` shows it as it would be reported if the run ended there). Any chunking gives the same findings.

**Buckets** (with ``tags``: a table keyed by ``step`` with a ``group`` column, ``bucket`` by default). Each step is
judged against the baseline of its own bucket, ``T + offset``: the offset is the median of ``value - T`` over the
bucket's last ``bucket_window`` accepted steps, centred on the mean offset of the buckets seen so far, and the trend
``T`` is built from bucket-adjusted values (``value - offset``), so it does not jump with the batch mix. Everything is
causal, learned from the accepted history only; this is the spike rule run on the bucket-adjusted series. A step
high only because of its bucket is therefore not flagged; when a detector without tags would have flagged it (against
the plain median of the last ``window`` raw values and the MAD about it) it is counted as ``expected_for_bucket``
(one summary finding per bucket from ``finish``, never in ``spikes``). A bucket's first ``min_bucket_periods`` steps
after the warm-up are learned from but not judged (its level is not known yet); steps without a bucket are judged
against the trend alone.

**Short and fresh series.** The causal rule needs ``min_periods`` accepted values before it judges anything; the
steps of that warm-up (all of them in a series shorter than its history, such as a 13-row excerpt pasted around a
spike) are judged instead by a two-sided rule against the warm-up span itself, resolved in ``finish()`` (so online
and offline still agree): a warm-up step is flagged when, against ``base = max(leave-one-out median of the span,
median of the up to 3 unflagged steps just before it)``, both conditions hold with the span's leave-one-out MAD as the noise
scale. The median of the steps before it keeps a warm-up descent from looking like a spike (a spike rises from
what came before; the first step has nothing before it and is never flagged); the leave-one-out median and MAD
keep the spike itself out of what it is judged against. It needs at least ``SHORT_MIN_ROWS`` finite values. Its
findings carry ``details["judged_by"] = "two_sided"`` and ``details["two_sided_span"]`` (the warm-up's first and
last step); every other finding was judged by the causal rule (``"causal"``).

**Calibrated thresholds** (``false_rate``, default 0.05 expected false events per 10,000 judged steps; ``None``: the
fixed score ``z`` alone; the streaming extreme-value thresholds of SPOT/DSPOT, Siffer et al., KDD 2017). The scores
``u = (x - base) / scale`` of judged steps above ``tail_start`` (3 noise units) are the tail's peaks; over the last
``tail_window`` peaks, ``p0`` = peaks / judged steps since the oldest of them, and a generalized Pareto (shape ``xi``
in [-0.5, 0.95], scale ``sigma``) is fitted to the excesses ``u - tail_start`` by *trimmed* probability-weighted
moments: only the lowest 99% of the sorted peaks are read, so the far tail weighs by its count, not its size. The
score threshold is the one the fit says is exceeded with probability ``alpha = false_rate / 10,000``::

    z_tail = tail_start + sigma / xi * ((alpha / p0) ** -xi - 1)

refitted at every new peak (causal: judged history only, so online = offline). *Robust to the spikes*: a peak at or
above the censoring limit (``z_tail`` itself for rates up to 1 per 10K, the fit's 1-per-10K score for higher ones;
``z`` before the first fit) is a censored peak, counted with its size unknown, and a run of such rows is one peak
(noise this rare comes alone); what the fixed rule calls a spike (``z`` and 1.5x) never enters the tail. Measured on
clean runs of five noise families (Gaussian, t5, t3, t2.5, lr-drifting t4), the rate asked is the rate found within
2x at 0.1, 1 and 10 per 10K (``bench_detection_quality.py --calibration``). With fewer than ``min_peaks`` peaks the
fallback is the fixed rule (``z`` and at least a 1.5x jump).

**Joint evidence** (a supporting metric, the grad norm, judged first: its flagged steps are passed as ``support``).
The jump condition (``ratio``, ``min_jump``) always applies; the score must then be:

- no supporting metric in the run: at least ``min(z, z_tail)`` (the effect size decides, as the fixed rule does,
  and a light tail may lower the score it needs);
- the grad norm flagged at this step or up to ``JOINT_LEAD`` steps before: at least ``min(z, z_joint)``, ``z_joint``
  the tail's score for ``alpha * joint_factor`` (200x), never commoner than 1e-3 (the cap that binds at the default
  rate): two metrics agreeing make a smaller loss move real. Before the tail is fitted (``min_peaks`` peaks: ~37K
  steps of Gaussian noise, so every shorter run) ``z_joint`` is the Gaussian's score for that rate (3.09 at 1e-3);
  the fallback's 1.5x jump still applies. Only a grad-norm flag opens this door, and those are rare at the
  grad norm's own rate, so the loss's false events grow by at most about one per false grad-norm flag;
- the grad norm logged but quiet: at least ``z_tail`` (a loss move the grad norm ignored is a spike only when the
  run's own tail calls it rare: the heavy-tailed noise's own 1.5-1.9x extremes are not).

**Per row**, in one place (finite value ``x``, bucket ``b`` or -1)::

    m_b   = median of (x - T) over the last bucket_window accepted steps of bucket b
    off   = m_b - mean of m_k over the buckets known so far                      (0 without a bucket)
    T     = trend of the last W accepted values of y = x - off (see "The baseline")
    base  = T + off
    scale = 1.4826 * median |x - base| over the last W accepted steps            (MAD about the baseline)
    flag  = (x - base) / scale >= z  and  x - base >= max((ratio - 1) * |base|, min_jump)
            (or the same with z_large and ratio_large, with buckets)

The offsets are centred on their mean so that trend and offsets cannot drift together (``T + c`` and ``off - c``
would explain the data equally well). Flagged rows stay out of every window.

This docstring is the rule's one description. :mod:`forensics.detect._reference` is the same rule in plain Python
(read it top to bottom); the inner loop is compiled with numba (:mod:`forensics.detect._kernel`) and a property test
holds it to the reference. The kernel's state is carried between ``update`` calls, which is what makes online and
offline answers identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
import pandas as pd

from forensics.detect import _kernel as K
from forensics.detect._tags import BUCKET, BUCKET_RANGE, StepLookup, attach_tags, group_ids
from forensics.detect.base import Detector
from forensics.detect.findings import CRITICAL, INFO, WARNING, Finding
from forensics.detect.nonfinite import nonfinite_findings
from forensics.errors import ForensicsError
from forensics.plan.buckets import bucket_range
from forensics.schema import DEFAULT_BOUNDARIES, STEP, find_loss_key

#: A spike this many times its baseline or more is ``critical``; smaller ones are ``warning``.
CRITICAL_RATIO = 2.0
#: Example steps kept per bucket for an ``expected_for_bucket`` summary.
EXAMPLE_STEPS = 10
#: Events the kernel may emit before it pauses for them to be collected (bounds memory for any chunk size).
EVENT_BUFFER = 1024
#: Finite warm-up values the two-sided rule needs before it judges a short span (fewer: nothing can be said).
SHORT_MIN_ROWS = 5
#: Steps before a warm-up step whose median it must rise above (the two-sided rule).
SHORT_LEFT = 3
#: Steps by which a grad-norm spike may lead a loss spike and still be the same event (BLOOM-176B's led by 4).
JOINT_LEAD = 10


def two_sided_events(values: np.ndarray, z: float, ratio: float,
                     min_jump: float) -> list[tuple[int, int, int, float, float, float]]:
    """Events of a short span judged against the span itself (the rule in the module docstring, "Short and fresh
    series"): ``(first, last, peak, baseline, scale, score)`` per run of consecutive flagged indices."""
    n = len(values)
    if n < SHORT_MIN_ROWS:
        return []
    flagged: list[tuple[int, float, float, float]] = []
    before: list[float] = [float(values[0])]  # the unflagged values so far: a spike's own tail is not its level
    for i in range(1, n):
        others = np.delete(values, i)
        med = float(np.median(others))
        base = max(med, float(np.median(before[-SHORT_LEFT:])))
        scale = max(K.MAD_TO_SD * float(np.median(np.abs(others - med))), 1e-9 * abs(base) + 1e-12)
        r = float(values[i]) - base
        if r > 0 and r / scale >= z and r >= max((ratio - 1.0) * abs(base), min_jump):
            flagged.append((i, base, scale, r / scale))
        else:
            before.append(float(values[i]))
    events: list[tuple[int, int, int, float, float, float]] = []
    for i, base, scale, score in flagged:
        if events and events[-1][1] == i - 1:
            first, _, peak, b0, s0, z0 = events[-1]
            events[-1] = (first, i, *((i, base, scale, score) if score > z0 else (peak, b0, s0, z0)))
        else:
            events.append((i, i, i, base, scale, score))
    return events


class SpikeDetector(Detector):
    """Spikes of one metric, the same online (``update``) and offline (``detect``); rules in the module docstring.

    Parameters
    ----------
    metric:
        Column to watch; ``None`` takes the loss key (the first of ``train/loss``, ``loss``, ... present).
    window:
        Accepted values in the baseline (default 64; the trend uses its two halves). Long enough that a median
        ignores a few spikes, short enough to follow a decaying loss.
    z:
        Robust score threshold in noise units (default 6: Gaussian noise never reaches it, heavy tails do, which is
        why the ``ratio`` condition must hold too).
    ratio:
        Relative jump threshold, ``value >= ratio * baseline`` (default 1.5: the one-step spikes of real runs are
        1.5-2x their median; the story's 0.9 -> 4 is 4.4x).
    min_jump:
        Absolute margin ``value - baseline`` must also reach (default 0; set it for metrics near 0 or negative).
    max_duration:
        Flagged rows after which an event is a level shift, not a spike (default 50).
    confirm:
        Accepted values after an event that decide whether it returned (default 5): the online delay of a spike.
    min_periods:
        Accepted values before anything is judged (default 32).
    trend:
        Extrapolate along the two half-window medians (default True); False: the plain rolling median.
    bucket_window:
        Accepted steps per bucket whose median residual is the bucket's offset (default 64).
    min_bucket_periods:
        Steps a bucket needs before its steps are judged (default 5).
    group:
        Tags column whose groups get their own baseline (default ``bucket``; ``cluster`` works the same way).
    z_large, ratio_large:
        A second, looser score for larger jumps, used when steps carry buckets (defaults 4.5 and 1.75x): a step at
        1.75x its bucket's baseline or more is flagged from a score of 4.5. Where the baseline noise is inflated (steps that mix buckets, grad
        accumulation) a clear jump would otherwise hide behind the score alone; heavy-tailed noise rarely
        reaches 1.75x, so the false rate stays where ``z`` and ``ratio`` put it (see bench_detection_quality).
    false_rate:
        Expected false events per 10,000 judged steps of clean noise (default 0.05, from the benchmark); ``None``
        keeps the fixed score ``z``. The score threshold comes from the run's own tail ("Calibrated thresholds" and
        "Joint evidence" in the module docstring); the jump condition (``ratio``, ``min_jump``) still applies, so
        the rate is at most this (``ratio=1``, and ``z=inf`` without a grad norm, judge by the tail alone).
    tail_start:
        Scores above it are the tail's peaks (default 3.0 noise units: ~0.3% of Gaussian steps, more for heavy
        tails; measured: 2.0 and 2.5 misjudge the Gaussian tail's far end 2-3x at 0.1 per 10K).
    tail_window:
        Peaks kept for the fit (default 3000).
    min_peaks:
        Peaks before the fitted tail replaces ``z`` (default 50; before that the fixed rule is the fallback).
    joint_factor:
        A row the grad norm supports needs a score the tail calls this many times less rare (default 200: the
        cap of 1e-3 per step binds at the default rate; measured: 30 loses 2.7-4.4 points of metrics-only recall
        on the short runs of bench_detection_quality (seeds 0-2); 30 and 200 give the same results on the long
        corpus).
    """

    def __init__(self, metric: str | None = None, window: int = 64, z: float = 6.0, ratio: float = 1.5,
                 min_jump: float = 0.0, max_duration: int = 50, confirm: int = 5, min_periods: int = 32,
                 trend: bool = True, bucket_window: int = 64, min_bucket_periods: int = 5, group: str = BUCKET,
                 z_large: float = 4.5, ratio_large: float = 1.75, false_rate: float | None = 0.05,
                 tail_start: float = 3.0, tail_window: int = 3000, min_peaks: int = 50, joint_factor: float = 200.0):
        self.metric = metric
        self.window = window
        self.z = z
        self.ratio = ratio
        self.z_large = z_large
        self.ratio_large = ratio_large
        self.min_jump = min_jump
        self.max_duration = max_duration
        self.confirm = confirm
        self.min_periods = min_periods
        self.trend = trend
        self.bucket_window = bucket_window
        self.min_bucket_periods = min_bucket_periods
        self.group = group
        self.false_rate = false_rate
        self.tail_start = tail_start
        self.tail_window = tail_window
        self.min_peaks = min_peaks
        self.joint_factor = joint_factor

    # --- state ------------------------------------------------------------------------------------------------------
    def reset(self) -> None:
        self._check_params()
        w = int(self.window)
        h = w // 2 if self.trend else w
        params = np.zeros(1, K.PARAMS)
        params[0] = (self.z, self.ratio, self.min_jump, self.z_large, self.ratio_large, w, h,
                     max(1, h // 2) if self.trend else w + 1, max(2, int(self.min_periods)), int(self.max_duration),
                     int(self.confirm), int(self.bucket_window), int(self.min_bucket_periods),
                     int(self.max_duration) + 2, 0,
                     0.0 if self.false_rate is None else float(self.false_rate) / 1e4, float(self.tail_start),
                     int(self.min_peaks), 0.0 if self.false_rate is None else float(self.joint_factor), 0,
                     self._joint_fallback_z())
        self.params_ = params
        self.state_ = K.new_state(params, int(self.tail_window))
        self.metric_: str | None = self.metric
        self.last_step_: int | None = None
        self.n_rows_ = 0
        self.n_skipped_ = 0
        self.status_counts_ = np.zeros(len(K.STATUS_NAMES), dtype=np.int64)
        self.expected_: dict[int, dict] = {}
        self.warmup_steps_: list[int] = []  # the warm-up rows, judged by the two-sided rule in finish()
        self.warmup_values_: list[float] = []
        self.warmup_groups_: list[int] = []
        self._lookup: StepLookup | None = None
        self._lookup_src: pd.DataFrame | None = None
        self.support_ = np.empty(0, np.int64)  # recent steps where a supporting metric was flagged
        self._has_support = False  # a supporting metric was given (fixed with the first rows)
        self.flagged_steps_ = np.empty(0, np.int64)  # steps this detector flagged in the last update

    def _joint_fallback_z(self) -> float:
        """A supported row's score before the tail is fitted: the Gaussian's score for the joint rate (the tail's
        own shape is not known yet; the rate is the one ``z_joint`` stands for once it is)."""
        if self.false_rate is None:
            return float("inf")
        q = min(float(self.false_rate) / 1e4 * float(self.joint_factor), K.JOINT_MAX_P)
        return NormalDist().inv_cdf(1.0 - q)

    def _check_params(self) -> None:
        ints = {"window": 4, "max_duration": 2, "confirm": 1, "min_periods": 2, "bucket_window": 1,
                "min_bucket_periods": 1, "tail_window": 2, "min_peaks": 2}
        for name, lo in ints.items():
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
                raise ForensicsError(f"SpikeDetector: '{name}' must be an integer >= {lo}; got {v!r}")
        if not (self.z > 0 and self.ratio >= 1 and self.min_jump >= 0):
            raise ForensicsError(f"SpikeDetector: need z > 0, ratio >= 1, min_jump >= 0; got z={self.z}, "
                                 f"ratio={self.ratio}, min_jump={self.min_jump}")
        if self.false_rate is not None and not 0 < self.false_rate < 1e4:
            raise ForensicsError(f"SpikeDetector: 'false_rate' (false events per 10,000 steps) must be > 0 and "
                                 f"< 10000, or None for the fixed score z; got {self.false_rate!r}")
        if not self.joint_factor >= 1:
            raise ForensicsError(f"SpikeDetector: 'joint_factor' must be >= 1; got {self.joint_factor!r}")
        if self.min_peaks > self.tail_window:
            raise ForensicsError(f"SpikeDetector: 'min_peaks' ({self.min_peaks}) cannot exceed 'tail_window' "
                                 f"({self.tail_window})")

    # --- the protocol -----------------------------------------------------------------------------------------------
    def update(self, new_rows: pd.DataFrame, tags: pd.DataFrame | None = None,
               support: Sequence[int] | np.ndarray | None = None) -> list[Finding]:
        """Feed the next rows (``step`` plus the metric column; rows at or before the last step seen are skipped).

        ``support``: steps where another metric of the run was flagged (its detector's ``flagged_steps_``, fed the
        same rows first), so that a row up to ``JOINT_LEAD`` steps after one is judged at the joint threshold."""
        self._add_support(support)
        found, _ = self._run(new_rows, tags, keep_rows=False)
        return found

    def detect(self, table: pd.DataFrame, tags: pd.DataFrame | None = None,
               support: Sequence[int] | np.ndarray | None = None) -> list[Finding]:
        """A whole run at once: the same findings as any chunking of ``update`` followed by ``finish``."""
        self.reset()
        found = self.update(table, tags, support)
        return found + self.finish()

    def _add_support(self, support: Sequence[int] | np.ndarray | None) -> None:
        if not hasattr(self, "state_"):
            self.reset()
        if support is None:
            return
        if self.n_rows_ == 0:
            self._has_support = True
        if not len(support):
            return
        keep = self.support_[self.support_ >= (self.last_step_ or 0) - JOINT_LEAD]  # older ones support nothing
        self.support_ = np.unique(np.concatenate([keep, np.asarray(support, dtype=np.int64)]))

    def _supported(self, steps: np.ndarray) -> np.ndarray:
        """Per row: 1 when a supporting step lies within ``JOINT_LEAD`` steps before it, or at it."""
        if not len(self.support_):
            return np.zeros(len(steps), np.int8)
        idx = np.searchsorted(self.support_, steps, side="right")
        prev = self.support_[np.maximum(idx - 1, 0)]
        return ((idx > 0) & (prev >= steps - JOINT_LEAD)).astype(np.int8)

    def finish(self) -> list[Finding]:
        """Pending and open events as they would be reported if the run ended now, plus the bucket summaries."""
        if not hasattr(self, "state_") or self.last_step_ is None:
            return []
        st = K.copy_state(self.state_)
        events = np.zeros(len(st.pending) + 2, K.EVENT)
        n = K.flush(self.params_, st, self.last_step_, events)
        out = [self._event_finding(events[j]) for j in range(n)]
        out += self._two_sided_findings()
        out += self._expected_findings()
        return sorted(out, key=lambda f: (f.step, f.kind))

    def pending(self) -> list[Finding]:
        """Alias of :meth:`finish` for live views: what is still open, as it stands now."""
        return self.finish()

    def trace(self, table: pd.DataFrame, tags: pd.DataFrame | None = None,
              support: Sequence[int] | np.ndarray | None = None) -> pd.DataFrame:
        """Per row of a whole run: ``step``, ``value``, ``group``, ``baseline``, ``score``, ``status`` (a name of
        :data:`forensics.detect._kernel.STATUS_NAMES`). Runs on a clone; this detector's state is untouched."""
        other = self.clone()
        other.reset()
        other._add_support(support)
        _, rows = other._run(table, tags, keep_rows=True)
        return rows

    # --- the work ---------------------------------------------------------------------------------------------------
    def _run(self, new_rows: pd.DataFrame, tags: pd.DataFrame | None,
             keep_rows: bool) -> tuple[list[Finding], pd.DataFrame | None]:
        if not hasattr(self, "state_"):
            self.reset()
        if self.metric_ is None:
            self.metric_ = find_loss_key(new_rows.columns)
        metric = self.metric_
        for col in (STEP, metric):
            if col not in new_rows.columns:
                raise ForensicsError(f"metrics: missing column '{col}' (the spike detector watches '{metric}'); "
                                     f"it has {', '.join(map(str, new_rows.columns[:12]))}")
        steps = new_rows[STEP].to_numpy(dtype=np.int64)
        values = new_rows[metric].to_numpy(dtype=np.float64, na_value=np.nan)
        groups = self._groups(new_rows, steps, tags)
        keep = self._in_order(steps)
        if not keep.all():
            self.n_skipped_ += int((~keep).sum())
            steps, values, groups = steps[keep], values[keep], groups[keep]
        n = len(steps)
        self.flagged_steps_ = np.empty(0, np.int64)
        if n == 0:
            return [], (self._rows_frame(steps, values, groups, *(np.empty(0),) * 2, np.empty(0, np.int8))
                        if keep_rows else None)
        if self.n_rows_ == 0:  # fixed at the first rows, so that every chunking keeps the same windows
            grouped = tags is not None or self.group in new_rows.columns
            self.params_["use_raw"] = int(grouped)
            # the looser score for large jumps needs per-bucket baselines: without them a long-sequence step of a
            # bucket-jumpy run is itself a large jump
            self.params_["z_large"] = self.z_large if grouped else np.inf
            self.params_["has_support"] = int(self._has_support)
        if groups.max() >= 0:
            self.state_ = K.with_buckets(self.state_, int(groups.max()) + 1)
        status = np.empty(n, np.int8)
        base = np.empty(n)
        score = np.empty(n)
        events = np.zeros(EVENT_BUFFER + len(self.state_.pending) + 2, K.EVENT)
        supported = self._supported(steps)
        found = []
        done = 0
        while done < n:  # the kernel pauses when its event buffer fills; collect and go on
            rows = K.Rows(steps[done:], values[done:], groups[done:], supported[done:])
            n_ev, k = K.run_rows(self.params_, self.state_, rows, K.Verdicts(status[done:], base[done:], score[done:]),
                                 events)
            found += [self._event_finding(events[j]) for j in range(n_ev)]
            done += k
        self.last_step_ = int(steps[-1])
        self.flagged_steps_ = steps[status == K.FLAGGED]
        self.n_rows_ += n
        self.status_counts_ += np.bincount(status, minlength=len(K.STATUS_NAMES))[: len(K.STATUS_NAMES)]
        self._count_expected(steps, values, groups, status)
        warm = np.flatnonzero(status == K.WARMUP)
        if len(warm):
            self.warmup_steps_ += steps[warm].tolist()
            self.warmup_values_ += values[warm].tolist()
            self.warmup_groups_ += groups[warm].tolist()
        if (status == K.NONFINITE).any():
            found += nonfinite_findings(steps, values, metric)
        found.sort(key=lambda f: (f.step, f.kind))
        rows = self._rows_frame(steps, values, groups, base, score, status) if keep_rows else None
        return found, rows

    def _in_order(self, steps: np.ndarray) -> np.ndarray:
        """Rows whose step is past every earlier one (a resumed run's rewrites are the reader's business)."""
        prev = np.maximum.accumulate(steps) if len(steps) else steps
        keep = np.ones(len(steps), dtype=bool)
        if len(steps) > 1:
            keep[1:] = steps[1:] > prev[:-1]
        if self.last_step_ is not None:
            keep &= steps > self.last_step_
        return keep

    def _groups(self, rows: pd.DataFrame, steps: np.ndarray, tags: pd.DataFrame | None) -> np.ndarray:
        if tags is not None:
            if self._lookup is None or self._lookup_src is not tags:
                self._lookup = StepLookup(tags)
                self._lookup_src = tags
            return self._lookup.groups(steps, self.group)
        if self.group in rows.columns:
            return group_ids(rows[self.group], self.group)
        return np.full(len(steps), -1, dtype=np.int64)

    def _rows_frame(self, steps, values, groups, base, score, status) -> pd.DataFrame:
        names = np.array(K.STATUS_NAMES, dtype=object)
        return pd.DataFrame({STEP: steps, "value": values, "group": groups, "baseline": base, "score": score,
                             "status": names[status.astype(np.int64)] if len(status) else np.array([], object)})

    # --- findings ---------------------------------------------------------------------------------------------------
    def _count_expected(self, steps, values, groups, status) -> None:
        idx = np.flatnonzero(status == K.EXPECTED)
        if not len(idx):
            return
        for g in np.unique(groups[idx]):
            sel = idx[groups[idx] == g]
            rec = self.expected_.setdefault(int(g), {"n_steps": 0, "first_step": int(steps[sel[0]]),
                                                     "last_step": 0, "max_value": -np.inf, "examples": []})
            rec["n_steps"] += len(sel)
            rec["last_step"] = int(steps[sel[-1]])
            rec["max_value"] = max(rec["max_value"], float(values[sel].max()))
            room = EXAMPLE_STEPS - len(rec["examples"])
            if room > 0:
                rec["examples"].extend(int(s) for s in steps[sel[:room]])

    def _two_sided_findings(self) -> list[Finding]:
        """The warm-up span judged against itself (module docstring, "Short and fresh series")."""
        steps, values = self.warmup_steps_, np.asarray(self.warmup_values_, dtype=np.float64)
        out = []
        for first, last, peak, base, scale, z in two_sided_events(values, self.z, self.ratio, self.min_jump):
            ev = {"kind": K.EV_SPIKE, "start": steps[first], "end": steps[last], "peak": steps[peak],
                  "recovery": steps[last + 1] if last + 1 < len(steps) else -1, "n_rows": last - first + 1,
                  "bucket": self.warmup_groups_[peak], "is_open": int(last + 1 >= len(steps)),
                  "n_post": 0, "x": float(values[peak]), "base": base, "z": z, "scale": scale, "offset": 0.0,
                  "post": float("nan"), "new_level": float("nan")}
            f = self._event_finding(ev)
            f.details["judged_by"] = "two_sided"
            f.details["two_sided_span"] = [steps[0], steps[-1]]
            f.details.pop("trend", None)
            f.details.pop("bucket_offset", None)
            f.evidence[1:] = [
                f"Step {steps[peak]} lies in the first {len(steps)} steps, before the causal baseline had "
                f"{self.min_periods} values to judge by: it was judged against the span itself (steps "
                f"{steps[0]}-{steps[-1]}, its median without this step, the steps just before it, and the span's "
                f"noise scale), a two-sided rule."]
            out.append(f)
        return out

    def _expected_findings(self) -> list[Finding]:
        out = []
        st = self.state_
        for g, rec in sorted(self.expected_.items()):
            offset = K.bucket_offset(st, g, self.min_bucket_periods)
            out.append(Finding(
                kind="expected_for_bucket", step=rec["first_step"], end_step=rec["last_step"], metric=self.metric_,
                value=rec["max_value"], severity=INFO, tags={self.group: g},
                evidence=[f"{rec['n_steps']} steps of {self.group} {g} (steps {rec['first_step']}-"
                          f"{rec['last_step']}) were above the run's trend by more than the spike thresholds (up "
                          f"to {rec['max_value']:.4g}) but within their {self.group}'s own baseline, which sits "
                          f"{offset:+.4g} from the trend: expected for their {self.group}, not spikes."],
                next_step=None,
                details={"n_steps": rec["n_steps"], "example_steps": rec["examples"], "group": self.group,
                         "offset": offset},
            ))
        return out

    def _event_finding(self, ev: np.void) -> Finding:
        metric = self.metric_
        kind = "spike" if ev["kind"] == K.EV_SPIKE else "level_shift"
        start, end, peak = int(ev["start"]), int(ev["end"]), int(ev["peak"])
        recovery = int(ev["recovery"])
        n_rows, bucket, is_open = int(ev["n_rows"]), int(ev["bucket"]), bool(ev["is_open"])
        x, base, z = float(ev["x"]), float(ev["base"]), float(ev["z"])
        scale, off = float(ev["scale"]), float(ev["offset"])
        ratio = x / base if base > 0 else float("nan")
        details = {"n_steps": n_rows, "recovery_step": recovery if recovery >= 0 else None, "ratio": ratio,
                   "noise_scale": scale, "judged_by": "causal",
                   "thresholds": {"z": self.z, "ratio": self.ratio, "min_jump": self.min_jump,
                                  "false_rate": self.false_rate}}
        tags = {}
        if bucket >= 0:
            tags[self.group] = bucket
            details["trend"] = base - off
            details["bucket_offset"] = off
        jump = f"{ratio:.2f}x the baseline" if base > 0 else f"{x - base:+.4g} above the baseline"
        rise = (f"{metric} rose to {x:.4g} at step {peak} against a baseline of {base:.4g}: {jump} and "
                f"{z:.1f} times the local noise scale of {scale:.3g} (thresholds: {self.ratio}x"
                f"{f', +{self.min_jump:g}' if self.min_jump else ''} and {self.z}).")
        if kind == "level_shift":
            new_level = float(ev["new_level"])
            details["new_level"] = new_level
            return Finding(
                kind=kind, step=start, end_step=end, peak_step=peak, metric=metric, value=x, baseline=base, score=z,
                severity=INFO, tags=tags, details=details,
                evidence=[rise, f"It did not come back: from step {start} {metric} stayed near {new_level:.4g}, so "
                                f"this is a new level (a new data mix, an lr change), not a spike; the baseline "
                                f"re-anchored to it at step {end}."],
                next_step=f"Check what changed at step {start} (data mix, learning-rate schedule, a restart).",
            )
        post = float(ev["post"])
        details["post_level"] = post
        details["open"] = is_open
        span = f"step {start}" if start == end else f"steps {start}-{end} ({n_rows} flagged steps)"
        if is_open:
            after = f"The event spans {span} and was still open at the end of the data."
        else:
            after = (f"The event spans {span}; {metric} was back within the thresholds at step {recovery}, and "
                     f"the next {int(ev['n_post'])} accepted values had a median of {post:.4g}.")
        evidence = [rise, after]
        if bucket >= 0:
            evidence.append(f"Judged against the baseline of its own {self.group} {bucket}: the run's trend "
                            f"{base - off:.4g} plus the {self.group}'s offset {off:+.4g}.")
        return Finding(
            kind=kind, step=start, end_step=end, peak_step=peak, metric=metric, value=x, baseline=base, score=z,
            # a baseline at or below 0 (a metric near 0 or negative) has no ratio: judge the size by the score
            severity=CRITICAL if (ratio >= CRITICAL_RATIO if base > 0 else z >= 2 * self.z) else WARNING,
            tags=tags, evidence=evidence,
            details=details,
            next_step=(f"Look at the samples of step {peak}'s batch (suspect_samples) and replay the step from the "
                       f"checkpoint before it to confirm the cause; without a plan, record or rebuild it "
                       f"(--plan) to name the batch."),
        )


def joint_order(names: Sequence[str | None], support_metric: str | None) -> list[str | None]:
    """The supporting metric first (its flagged steps support the others' rows), the rest in the order given."""
    return sorted(names, key=lambda n: n != support_metric) if support_metric in names else list(names)


def detect_spikes(metrics: pd.DataFrame, metric: str | Sequence[str] | None = None,
                  tags: pd.DataFrame | None = None, boundaries: Sequence[int] | None = None,
                  support_metric: str | None = "auto", support: Sequence[int] | np.ndarray | None = None,
                  flagged: dict[str, np.ndarray] | None = None, **params) -> list[Finding]:
    """Spikes, level shifts, non-finite steps and bucket summaries of one or several metrics of a whole run.

    ``metric``: a column, a list of columns, or ``None`` for the loss key. ``tags``: the tags table (judging each
    step against its bucket and copying bucket, bucket_range, cluster, cluster_name and epoch onto the findings).
    ``support_metric``: the metric whose flagged steps support the others' ("Joint evidence" in the module
    docstring); ``"auto"`` takes the grad norm among several metrics, ``None`` judges each alone, or
    by ``support`` (the flagged steps of a metric judged before) when given; ``flagged``, a dict, receives each
    metric's flagged steps.
    ``params`` go to :class:`SpikeDetector`.
    """
    if support_metric == "auto":
        from forensics.schema import grad_norm_column

        several = metric is not None and not isinstance(metric, str) and len(metric) > 1
        support_metric = grad_norm_column([str(m) for m in metric]) if several else None
    names = [metric] if metric is None or isinstance(metric, str) else list(metric)
    found: list[Finding] = []
    for name in joint_order(names, support_metric):
        det = SpikeDetector(name, **params)
        found += det.detect(metrics, tags, support if name != support_metric else None)
        if name == support_metric:
            support = det.flagged_steps_
        if flagged is not None:
            flagged[str(name)] = det.flagged_steps_
    attach_tags([f for f in found if f.kind != "expected_for_bucket"], tags, boundaries)
    add_confidence(found)
    bounds = list(boundaries) if boundaries is not None else list(DEFAULT_BOUNDARIES)
    for f in found:
        b = f.tags.get(BUCKET) if f.kind == "expected_for_bucket" else None
        if b is not None and 0 <= b < len(bounds) - 1:
            f.tags[BUCKET_RANGE] = bucket_range(b, bounds)
    return sorted(found, key=lambda f: (f.step, f.metric or "", f.kind))


def _alone_confidence(f: Finding) -> float:
    """How far past both thresholds a spike is: 0.5 at the thresholds, towards 1 as the margin grows."""
    th = f.details.get("thresholds", {})
    margins = []
    if f.score is not None and th.get("z"):
        margins.append(f.score / th["z"])
    ratio = f.details.get("ratio")
    if ratio is not None and np.isfinite(ratio) and th.get("ratio", 1.0) > 1.0:
        margins.append((ratio - 1.0) / (th["ratio"] - 1.0))
    margin = min(margins) if margins else 1.0
    return float(1.0 - 0.5 / max(margin, 1.0))


def add_confidence(findings: Sequence[Finding], grad_metric: str | None = None) -> None:
    """Set ``details["confidence"]`` (0-1) on every spike: its margin past the thresholds, raised when the loss
    and the grad norm agree (a loss spike the grad norm led by up to ``JOINT_LEAD`` steps or accompanied, or a
    grad-norm spike the loss answered), with ``details["joint"]`` saying how (``led``, ``accompanied``,
    ``loss_response`` or ``none``; absent unless both a grad norm and another metric have spikes here). Call it
    once on the findings of every analysed metric of a run; the grad-norm metric is found by its name unless
    given."""
    from forensics.schema import grad_norm_column

    spikes = [f for f in findings if f.kind == "spike"]
    metrics = {f.metric for f in spikes if f.metric}
    grad = grad_metric or grad_norm_column(sorted(metrics))
    if grad is not None and not metrics - {grad}:
        grad = None  # the grad norm alone: nothing to agree with, no joint verdict
    grad_spikes = [f for f in spikes if grad is not None and f.metric == grad]
    other = [f for f in spikes if f.metric != grad]
    for f in spikes:
        c = _alone_confidence(f)
        joint = None
        if grad is not None and f.metric != grad:
            end = f.end_step if f.end_step is not None else f.step
            near = [g for g in grad_spikes if f.step - JOINT_LEAD <= g.step <= end]
            joint = ("led" if min(g.step for g in near) < f.step else "accompanied") if near else "none"
        elif grad is not None:
            end = f.end_step if f.end_step is not None else f.step
            answered = any(f.step <= o.step <= end + JOINT_LEAD for o in other)
            joint = "loss_response" if answered else "none"
        if joint not in (None, "none"):
            c = 1.0 - 0.4 * (1.0 - c)  # two metrics agreeing: the chance both are noise is far smaller
        f.details["confidence"] = round(c, 3)
        if joint is not None:
            f.details["joint"] = joint
