"""One metric's spike detector: its parameters, its state between chunks, and the kernel it drives.

The rule is described once, in :mod:`forensics.detect.spikes`; the kernel (:mod:`~forensics.detect.spikes.kernel`)
runs it row by row (compiled, or as plain Python before its machine code is cached: :mod:`forensics.compiled`) and
:mod:`~forensics.detect.spikes.events` words its events. A run's metrics are judged together
by :class:`~forensics.detect.spikes.driver.SpikeDriver` (the grad norm first), the one place that builds detectors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from forensics.compiled import loop
from forensics.detect.findings import Finding
from forensics.detect.metric_detector import MetricDetector
from forensics.detect.params import Param, at_least
from forensics.detect.rules.nonfinite import nonfinite_findings
from forensics.detect.spikes import kernel_state as K
from forensics.detect.spikes.events import event_finding, expected_findings, two_sided_findings
from forensics.detect.spikes.kernel_state import JOINT_LEAD, JOINT_MAX_P
from forensics.detect.tags import BUCKET, StepLookup, group_ids
from forensics.errors import ForensicsError
from forensics.schema import STEP, find_loss_key

#: Example steps kept per bucket for an ``expected_for_bucket`` summary.
EXAMPLE_STEPS = 10
#: Events the kernel may emit before it pauses for them to be collected (bounds memory for any chunk size).
EVENT_BUFFER = 1024

#: What each parameter may be (checked once, when a detector or the audit's rule is built).
PARAMETER_CONSTRAINTS: dict[str, Param] = {
    "metric": Param("str", none=True),
    "window": at_least(4, "int"),
    "z": Param(low=0, low_open=True),
    "ratio": at_least(1),
    "min_jump": at_least(0),
    "max_duration": at_least(2, "int"),
    "confirm": at_least(1, "int"),
    "min_periods": at_least(2, "int"),
    "trend": Param("bool"),
    "bucket_window": at_least(1, "int"),
    "min_bucket_periods": at_least(1, "int"),
    "group": Param("str"),
    "z_large": Param(low=0, low_open=True),
    "ratio_large": at_least(1),
    "false_rate": Param(low=0, low_open=True, high=1e4, high_open=True, none=True),
    "tail_start": Param(low=0, low_open=True),
    "tail_window": at_least(2, "int"),
    "min_peaks": at_least(2, "int"),
    "joint_factor": at_least(1),
}


def check_tail_fits(owner: str, params: Mapping[str, Any]) -> None:
    """The one constraint between parameters: the tail cannot need more peaks (``min_peaks``) than it keeps
    (``tail_window``). The detector and the audit's rule both call it after the per-parameter check."""
    if params["min_peaks"] > params["tail_window"]:
        raise ForensicsError(
            f"{owner}: 'min_peaks' ({params['min_peaks']}) cannot exceed 'tail_window' ({params['tail_window']})"
        )


class SpikeDetector(MetricDetector):
    """Spikes of one metric, the same online (``update``) and offline (``detect``); the rule is described in
    :mod:`forensics.detect.spikes`.

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
        1.75x its bucket's baseline or more is flagged from a score of 4.5. Where the baseline noise is inflated
        (steps that mix buckets, grad accumulation) a clear jump would otherwise hide behind the score alone;
        heavy-tailed noise rarely reaches 1.75x, so the false rate stays where ``z`` and ``ratio`` put it (see
        bench_detection_quality).
    false_rate:
        Expected false events per 10,000 judged steps of clean noise (default 0.05, from the benchmark); ``None``
        keeps the fixed score ``z``. The score threshold comes from the run's own tail ("Calibrated thresholds" and
        "Joint evidence" in :mod:`forensics.detect.spikes`); the jump condition (``ratio``, ``min_jump``) still
        applies, so the rate is at most this (``ratio=1``, and ``z=inf`` without a grad norm, judge by the tail alone).
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

    parameter_constraints = PARAMETER_CONSTRAINTS

    def __init__(
        self,
        metric: str | None = None,
        window: int = 64,
        z: float = 6.0,
        ratio: float = K.DEFAULT_RATIO,
        min_jump: float = 0.0,
        max_duration: int = 50,
        confirm: int = 5,
        min_periods: int = 32,
        trend: bool = True,
        bucket_window: int = 64,
        min_bucket_periods: int = 5,
        group: str = BUCKET,
        z_large: float = 4.5,
        ratio_large: float = 1.75,
        false_rate: float | None = 0.05,
        tail_start: float = 3.0,
        tail_window: int = 3000,
        min_peaks: int = 50,
        joint_factor: float = 200.0,
    ):
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
        self.validate()
        w = int(self.window)
        h = w // 2 if self.trend else w
        params = np.zeros(1, K.PARAMS)
        params[0] = (
            self.z,
            self.ratio,
            self.min_jump,
            self.z_large,
            self.ratio_large,
            w,
            h,
            max(1, h // 2) if self.trend else w + 1,
            max(2, int(self.min_periods)),
            int(self.max_duration),
            int(self.confirm),
            int(self.bucket_window),
            int(self.min_bucket_periods),
            int(self.max_duration) + 2,
            0,
            0.0 if self.false_rate is None else float(self.false_rate) / 1e4,
            float(self.tail_start),
            int(self.min_peaks),
            0.0 if self.false_rate is None else float(self.joint_factor),
            0,
            self._joint_fallback_z(),
        )
        self.params_ = params
        self.state_ = K.new_state(params, int(self.tail_window))
        self.metric_: str | None = self.metric
        self.last_step_: int | None = None
        self.n_rows_ = 0
        self.n_skipped_ = 0
        self.status_counts_ = np.zeros(len(K.STATUS_NAMES), dtype=np.int64)
        self.expected_: dict[int, dict] = {}
        self.warmup_steps_: list[int] = []  # the warm-up rows, judged by the two-sided rule once it is over
        self.warmup_values_: list[float] = []
        self.warmup_groups_: list[int] = []
        self.warmup_done_ = False  # a row past the warm-up was seen: its span is final and was judged
        self._lookup: StepLookup | None = None
        self._lookup_src: pd.DataFrame | None = None
        self.support_ = np.empty(0, np.int64)  # recent steps where a supporting metric was flagged
        self._has_support = False  # a supporting metric was given (fixed with the first rows)
        self.flagged_steps_ = np.empty(0, np.int64)  # steps this detector flagged in the last update
        self.last_rows_ = (np.empty(0, np.int64),) + (np.empty(0),) * 3  # steps, values, baselines, scores

    def _joint_fallback_z(self) -> float:
        """A supported row's score before the tail is fitted: the Gaussian's score for the joint rate (the tail's
        own shape is not known yet; the rate is the one ``z_joint`` stands for once it is)."""
        if self.false_rate is None:
            return float("inf")
        q = min(float(self.false_rate) / 1e4 * float(self.joint_factor), JOINT_MAX_P)
        return NormalDist().inv_cdf(1.0 - q)

    def validate(self) -> None:
        """Each parameter against :data:`PARAMETER_CONSTRAINTS`, then the tail's peaks within its window."""
        super().validate()
        check_tail_fits(self.param_owner(), self.get_params())

    # --- the protocol -----------------------------------------------------------------------------------------------
    def update(
        self,
        rows: pd.DataFrame,
        tags: pd.DataFrame | None = None,
        support: Sequence[int] | np.ndarray | None = None,
    ) -> list[Finding]:
        """Feed the next rows (``step`` plus the metric column; rows at or before the last step seen are skipped).

        ``support``: steps where another metric of the run was flagged (its detector's ``flagged_steps_``, fed the
        same rows first), so that a row up to ``JOINT_LEAD`` steps after one is judged at the joint threshold."""
        self._add_support(support)
        found, _ = self._run(rows, tags, keep_rows=False)
        return found

    def detect(
        self, table: pd.DataFrame, tags: pd.DataFrame | None = None, support: Sequence[int] | np.ndarray | None = None
    ) -> list[Finding]:
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
        n = loop("spike_flush", self.n_rows_)(self.params_, st, self.last_step_, events)
        out = [event_finding(self, events[j]) for j in range(n)]
        if not self.warmup_done_:
            out += two_sided_findings(self)
        out += expected_findings(self)
        return sorted(out, key=lambda f: (f.step, f.kind))

    def unsettled_from(self) -> float:
        """The first step at which an event not reported yet may start: an open or pending event's start, the
        warm-up span while it is not over, else the step after the last one seen (``-inf`` before any row).

        A finding that depends on this metric's events up to step ``s`` (the joint confidence) is final once
        ``unsettled_from() > s``."""
        if not hasattr(self, "state_") or self.last_step_ is None:
            return float("-inf")
        first = float(self.last_step_ + 1)
        if not self.warmup_done_ and self.warmup_steps_:
            first = min(first, float(self.warmup_steps_[0]))
        opened = self.state_.open[0]
        if opened["is_open"]:
            first = min(first, float(opened["start"]))
        c = self.state_.counts[0]
        q = len(self.state_.pending)
        for j in range(int(c["n_pending"])):
            first = min(first, float(self.state_.pending[(int(c["pending_head"]) + j) % q]["start"]))
        return first

    def pending(self) -> list[Finding]:
        """Alias of :meth:`finish` for live views: what is still open, as it stands now."""
        return self.finish()

    def trace(
        self, table: pd.DataFrame, tags: pd.DataFrame | None = None, support: Sequence[int] | np.ndarray | None = None
    ) -> pd.DataFrame:
        """Per row of a whole run: ``step``, ``value``, ``group``, ``baseline``, ``score``, ``status`` (a name of
        :data:`forensics.detect.spikes.kernel.STATUS_NAMES`). Runs on a clone; this detector's state is untouched."""
        other = self.clone()
        other.reset()
        other._add_support(support)
        _, rows = other._run(table, tags, keep_rows=True)
        return rows

    # --- the work ---------------------------------------------------------------------------------------------------
    def _run(
        self, new_rows: pd.DataFrame, tags: pd.DataFrame | None, keep_rows: bool
    ) -> tuple[list[Finding], pd.DataFrame | None]:
        if not hasattr(self, "state_"):
            self.reset()
        if self.metric_ is None:
            self.metric_ = find_loss_key(new_rows.columns)
        metric = self.metric_
        for col in (STEP, metric):
            if col not in new_rows.columns:
                raise ForensicsError(
                    f"metrics: missing column '{col}' (the spike detector watches '{metric}'); "
                    f"it has {', '.join(map(str, new_rows.columns[:12]))}"
                )
        steps = new_rows[STEP].to_numpy(dtype=np.int64)
        values = new_rows[metric].to_numpy(dtype=np.float64, na_value=np.nan)
        groups = self._groups(new_rows, steps, tags)
        keep = self._in_order(steps)
        if not keep.all():
            self.n_skipped_ += int((~keep).sum())
            steps, values, groups = steps[keep], values[keep], groups[keep]
        steps.flags.writeable = values.flags.writeable = False  # the kernel only reads them: one compiled signature
        n = len(steps)
        self.flagged_steps_ = np.empty(0, np.int64)
        self.last_rows_ = (steps, values, np.full(n, np.nan), np.full(n, np.nan))
        if n == 0:
            return [], (
                self._rows_frame(steps, values, groups, *(np.empty(0),) * 2, np.empty(0, np.int8))
                if keep_rows
                else None
            )
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
        run_rows = loop("spike_rows", n)
        while done < n:  # the kernel pauses when its event buffer fills; collect and go on
            rows = K.Rows(steps[done:], values[done:], groups[done:], supported[done:])
            verdicts = K.Verdicts(status[done:], base[done:], score[done:])
            n_ev, k = run_rows(self.params_, self.state_, rows, verdicts, events)
            found += [event_finding(self, events[j]) for j in range(n_ev)]
            done += k
        self.last_step_ = int(steps[-1])
        self.flagged_steps_ = steps[status == K.FLAGGED]
        self.last_rows_ = (steps, values, base, score)  # the chunk's rows as judged (the driver reads scores)
        self.n_rows_ += n
        self.status_counts_ += np.bincount(status, minlength=len(K.STATUS_NAMES))[: len(K.STATUS_NAMES)]
        self._count_expected(steps, values, groups, status)
        if not self.warmup_done_:
            found += self._collect_warmup(steps, values, groups, status)
        if (status == K.NONFINITE).any():
            found += nonfinite_findings(steps, values, metric)
        found.sort(key=lambda f: (f.step, f.kind))
        rows = self._rows_frame(steps, values, groups, base, score, status) if keep_rows else None
        return found, rows

    def _collect_warmup(self, steps, values, groups, status) -> list[Finding]:
        """Keep the warm-up rows (those before the first judged row, from the last move off a constant history);
        once a judged row arrives the span is final and the two-sided rule judges it, so a live run reports it as
        soon as an offline one would know it."""
        judged = np.flatnonzero((status != K.WARMUP) & (status != K.NONFINITE) & (status != K.RESTARTED))
        stop = int(judged[0]) if len(judged) else len(status)
        restarts = np.flatnonzero(status[:stop] == K.RESTARTED)
        if len(restarts):  # a move off a constant history: the span starts over there
            self.warmup_steps_, self.warmup_values_, self.warmup_groups_ = [], [], []
        first = int(restarts[-1]) if len(restarts) else 0
        warm = first + np.flatnonzero((status[first:stop] == K.WARMUP) | (status[first:stop] == K.RESTARTED))
        if len(warm):
            self.warmup_steps_ += steps[warm].tolist()
            self.warmup_values_ += values[warm].tolist()
            self.warmup_groups_ += groups[warm].tolist()
        if not len(judged):
            return []
        self.warmup_done_ = True
        return two_sided_findings(self)

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
        return pd.DataFrame(
            {
                STEP: steps,
                "value": values,
                "group": groups,
                "baseline": base,
                "score": score,
                "status": names[status.astype(np.int64)] if len(status) else np.array([], object),
            }
        )

    # --- findings ---------------------------------------------------------------------------------------------------
    def _count_expected(self, steps, values, groups, status) -> None:
        idx = np.flatnonzero(status == K.EXPECTED)
        if not len(idx):
            return
        for g in np.unique(groups[idx]):
            sel = idx[groups[idx] == g]
            rec = self.expected_.setdefault(
                int(g),
                {"n_steps": 0, "first_step": int(steps[sel[0]]), "last_step": 0, "max_value": -np.inf, "examples": []},
            )
            rec["n_steps"] += len(sel)
            rec["last_step"] = int(steps[sel[-1]])
            rec["max_value"] = max(rec["max_value"], float(values[sel].max()))
            room = EXAMPLE_STEPS - len(rec["examples"])
            if room > 0:
                rec["examples"].extend(int(s) for s in steps[sel[:room]])
