"""The spike rule over a run's analysed metrics: the one loop the audit, the live loop and ``watch`` share.

What it adds to one :class:`~forensics.detect.spikes.detector.SpikeDetector` per metric:

- **grad norm first**: the grad norm is judged before the other metrics of each chunk, and the steps it flagged
  are their joint evidence ("Joint evidence" in :mod:`forensics.detect.spikes`);
- **confidence** (``details.confidence``, 0-1, and ``details.joint``): a spike's margin past its thresholds, raised
  when the loss and the grad norm moved together (:func:`joint_confidence`);
- **logging windows**: a value logged every ``logging_steps`` steps is the mean over them (HF's ``loss``), so its
  spike covers the steps of its window (``details.window_steps``);
- the tags of each finding's step (bucket, cluster, epoch) and the bucket range of each ``expected_for_bucket``;
- **the expected value from the composition** (:mod:`forensics.detect.evidence.expected_loss`): with step tags and
  one step per logged value, each metric is judged on ``value / factor``, the factor being what the step's
  composition predicts over the run's trend (fitted causally, on earlier rows only), against the detector's
  bucket-free baseline; a finding's ``value`` and ``baseline`` are then put back on the metric's scale (the
  baseline is the expectation) and ``details.expected_factor`` says by how much the composition moved it.
  Without tags (no plan) the bucket-free baseline judges the raw values.

Online and offline agree finding by finding: a spike's confidence depends on the other metric's spikes near it, so
:meth:`SpikeDriver.update` holds a spike back until every event that could change it is final
(:meth:`SpikeDetector.unsettled_from`), and :meth:`SpikeDriver.finish` releases what is still held as if the run
ended now. This module is the only place that builds detectors for a run.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from forensics.detect.base import OnlineRule
from forensics.detect.causes.severity import assign_severities
from forensics.detect.evidence.batch_size import judge_batch_size
from forensics.detect.evidence.expected_loss import CompositionExpectation
from forensics.detect.findings import Finding
from forensics.detect.spikes.detector import JOINT_LEAD, SpikeDetector
from forensics.detect.tags import BUCKET, BUCKET_RANGE, attach_tags
from forensics.plan.buckets import bucket_range
from forensics.schema import DEFAULT_BOUNDARIES, STEP, grad_norm_column, written

#: Below this many written values a metric's first ``min_periods`` (history, not judged) weigh heavily: say so.
SHORT_RUN = 100
#: A grad-norm spike the loss did not answer with a spike, but "followed weakly": the loss's score (noise units) and
#: ratio to its baseline somewhere within JOINT_LEAD steps of it reached both of these.
WEAK_FOLLOW_Z, WEAK_FOLLOW_RATIO = 3.0, 1.1
#: Rows of the other metrics' scores kept to look back over when a grad-norm spike is reported (its own span, its
#: confirmation and the joint window fit many times over).
FOLLOW_ROWS = 1024
#: An expectation factor from which the step's composition predicts a clearly higher value than the trend: the same
#: samples spiking again there is their content returning, not a second line of evidence (detect/causes/severity.py).
COMPOSITION_HIGH = 1.25


def joint_order(names: Sequence[str | None], support_metric: str | None) -> list[str | None]:
    """The supporting metric first (its flagged steps support the others' rows), the rest in the order given."""
    return sorted(names, key=lambda n: n != support_metric) if support_metric in names else list(names)


class SpikeDriver(OnlineRule):
    """Spikes, level shifts and NaN/inf of several metrics of one run, judged together (module docstring).

    Parameters
    ----------
    metrics:
        The analysed metrics (the loss key first, then the grad norm and any other).
    grad_norm_key:
        The grad-norm metric among them (judged first; its spikes and the others' agree or not); ignored when it
        is not among ``metrics`` or is the only one.
    params:
        :class:`SpikeDetector` parameters (run.toml ``[detect.spikes]``).
    logging_steps:
        Steps each logged value covers (1: one step each).
    boundaries:
        The bucket boundaries, for the ``bucket_range`` of the findings.
    """

    def __init__(
        self,
        metrics: Sequence[str],
        grad_norm_key: str | None = None,
        params: Mapping[str, Any] | None = None,
        logging_steps: int = 1,
        boundaries: Sequence[int] | None = None,
    ) -> None:
        self.metrics = list(dict.fromkeys(metrics))
        self.grad_norm_key = grad_norm_key if grad_norm_key in self.metrics and len(self.metrics) > 1 else None
        self.params = dict(params or {})
        self.logging_steps = max(1, int(logging_steps or 1))
        self.boundaries = list(boundaries) if boundaries is not None else list(DEFAULT_BOUNDARIES)
        self.reset()

    def reset(self) -> None:
        self.detectors_ = {m: SpikeDetector(m, **self.params) for m in joint_order(self.metrics, self.grad_norm_key)}
        for det in self.detectors_.values():
            det.reset()
        self.held_: list[Finding] = []  # spikes whose confidence waits on another metric's events
        self.spans_: list[tuple[str, int, int]] = []  # (metric, step, end_step) of every spike reported so far
        self.tags_: pd.DataFrame | None = None
        self.expect_: dict[str, CompositionExpectation] = {}  # per metric, once tags arrive
        self.factors_: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}  # per metric: steps, factors
        self.last_factors_: dict[str, np.ndarray] = {}  # per metric: the factors of its last chunk's rows
        self.expected_: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}  # per metric: steps, expectation
        self.explained_: dict[str, dict[str, Any]] = {}  # per metric: steps above the trend its composition explains
        # the other metrics' recent (step, score, ratio): how strongly they followed a grad-norm spike
        self.recent_ = (np.empty(0, np.int64), np.empty(0), np.empty(0))

    # --- the protocol -----------------------------------------------------------------------------------------------
    def update(self, rows: pd.DataFrame, tags: pd.DataFrame | None = None) -> list[Finding]:
        """Feed the next metrics rows (any columns; each metric judged where it was written); return the findings
        that became final with them. ``tags``: the step tags as of now (kept for the updates that give none)."""
        if tags is not None:
            if self.tags_ is not tags and self.expect_:
                for exp in self.expect_.values():
                    exp.set_tags(tags)
            self.tags_ = tags
        new: list[Finding] = []
        support = None
        for metric, det in self.detectors_.items():
            part = _written_rows(rows, metric)
            given = None if self.grad_norm_key is None or metric == self.grad_norm_key else support
            if self._composed(metric, det):
                # the residual against the composition, still against its own bucket's baseline: before the first
                # fit (factor 1) that is the bucket baseline of a plan without the expectation, after it a bucket's
                # offset is what the composition left unexplained
                found = det.update(self._adjusted(metric, part), self.tags_, given)
                new += [self._expectation(f) for f in found]
                self._count_explained(metric, det)
                self._keep_expected(metric, det)
            else:
                new += det.update(part, self.tags_, given)
            if metric == self.grad_norm_key:
                support = det.flagged_steps_
        self._follow(new)
        return self._release(new)

    def finish(self) -> list[Finding]:
        """Every held spike and every open or pending event, as they would be reported if the run ended now."""
        pending = copy.deepcopy(self.held_)
        for det in self.detectors_.values():
            pending += [self._expectation(f) for f in det.finish()]
        pending += self._explained_findings()
        spans = self.spans_ + [(str(f.metric), *_span(f)) for f in pending if f.kind == "spike"]
        out = [self._finalise(f, spans) for f in pending]
        return _sorted(out)

    def detect(self, metrics: pd.DataFrame, tags: pd.DataFrame | None = None) -> list[Finding]:
        """A whole run: ``reset``, one ``update``, ``finish``."""
        self.reset()
        return _sorted(self.update(metrics, tags) + self.finish())

    def warnings(self) -> list[str]:
        """What the user should know about how the metrics were judged (short series)."""
        out = []
        for metric, det in self.detectors_.items():
            n = int(getattr(det, "n_rows_", 0))
            if n and n < SHORT_RUN:
                out.append(
                    f"'{metric}' has only {n} values: the first {min(det.min_periods, n)} (the causal "
                    "detector's history) were judged two-sided, against the span itself (details.judged_by "
                    "of each finding says which rule judged it)"
                )
        return out

    # --- the expectation from the composition ------------------------------------------------------------------------
    def _composed(self, metric: str, det: SpikeDetector) -> bool:
        """Whether ``metric`` is judged against its composition's expectation (fixed with its first rows: tags
        and one step per logged value)."""
        if metric in self.expect_:
            return True
        if det.n_rows_ or self.tags_ is None or self.logging_steps > 1:
            return False
        exp = CompositionExpectation(self.tags_)
        if not exp.owner_:
            return False
        self.expect_[metric] = exp
        self.factors_[metric] = ([], [])
        return True

    def _adjusted(self, metric: str, part: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``metric`` divided by their expectation factor (rows the detector would skip as out of order
        are left out first, so the fit sees each step once)."""
        steps = part[STEP].to_numpy(np.int64)
        det = self.detectors_[metric]
        keep = np.ones(len(steps), bool)
        if len(steps) > 1:
            keep[1:] = steps[1:] > np.maximum.accumulate(steps)[:-1]
        if det.last_step_ is not None:
            keep &= steps > det.last_step_
        part = part.loc[keep]
        steps = steps[keep]
        values = part[metric].to_numpy(np.float64, na_value=np.nan)
        factors = self.expect_[metric].factors(steps, values)
        known_steps, known = self.factors_[metric]
        known_steps.append(steps)
        known.append(factors)
        self.last_factors_[metric] = factors
        out = part.copy()
        out[metric] = values / factors
        return out

    def _keep_expected(self, metric: str, det: SpikeDetector) -> None:
        """The last chunk's expectation of each row (the detector's baseline times the row's factor: what a spike
        there is judged against), kept for :meth:`expected`."""
        steps, _, base, _ = det.last_rows_
        factors = self.last_factors_.get(metric)
        if factors is None or len(factors) != len(steps) or not len(steps):
            return
        kept_steps, kept = self.expected_.setdefault(metric, ([], []))
        kept_steps.append(np.asarray(steps, np.int64))
        kept.append(base * factors)

    def expected(self) -> pd.DataFrame | None:
        """The expected value of each step from its composition, one column per metric judged against it
        (``step`` first; NaN where the detector had no baseline yet): what the report and the dashboard draw as
        the expected band. None when no metric was (no tags: a run without a plan, or values logged over
        several steps). Online and offline give the same table for the same rows (the expectation is causal)."""
        cols = {}
        for metric, (steps_parts, parts) in self.expected_.items():
            if steps_parts:
                steps, values = np.concatenate(steps_parts), np.concatenate(parts)
                self.expected_[metric] = ([steps], [values])
                cols[metric] = pd.Series(values, index=pd.Index(steps, name=STEP))
        if not cols:
            return None
        return pd.concat(cols, axis=1).sort_index().reset_index()

    def _count_explained(self, metric: str, det: SpikeDetector) -> None:
        """Steps of the last chunk that the spike thresholds would flag against the trend alone but not against
        their expectation: their composition explains them (one ``info`` summary per metric, from ``finish``)."""
        steps, values, base, _ = det.last_rows_
        factors = self.last_factors_.get(metric)
        if factors is None or len(factors) != len(steps) or not len(steps):
            return
        with np.errstate(divide="ignore", invalid="ignore"):
            raw = values * factors
            above_trend = (raw >= det.ratio * base) & (raw - base >= det.min_jump) & (base > 0)
            within = values < det.ratio * base
        sel = np.flatnonzero(above_trend & within & ~np.isin(steps, det.flagged_steps_))
        if not len(sel):
            return
        rec = self.explained_.setdefault(
            metric,
            {
                "n_steps": 0,
                "first_step": int(steps[sel[0]]),
                "last_step": 0,
                "max_value": -np.inf,
                "max_factor": 0.0,
                "examples": [],
            },
        )
        rec["n_steps"] += len(sel)
        rec["last_step"] = int(steps[sel[-1]])
        rec["max_value"] = max(rec["max_value"], float(raw[sel].max()))
        rec["max_factor"] = max(rec["max_factor"], float(factors[sel].max()))
        rec["examples"] += [int(x) for x in steps[sel[: max(0, 10 - len(rec["examples"]))]]]

    def _explained_findings(self) -> list[Finding]:
        out = []
        for metric, rec in self.explained_.items():
            out.append(
                Finding(
                    kind="expected_for_bucket",
                    step=rec["first_step"],
                    end_step=rec["last_step"],
                    metric=metric,
                    value=rec["max_value"],
                    evidence=[
                        f"{rec['n_steps']} steps of {metric} (steps {rec['first_step']}-{rec['last_step']}) were above "
                        f"the run's trend by more than the spike thresholds (up to {rec['max_value']:.4g}) but within "
                        f"what their batch's composition predicts (up to {rec['max_factor']:.2f}x the trend: bucket, "
                        f"clusters, tokens, batch size, padding): expected for their composition, not spikes."
                    ],
                    details={
                        "n_steps": rec["n_steps"],
                        "example_steps": rec["examples"],
                        "group": "composition",
                        "max_factor": rec["max_factor"],
                        "support": {"explained": "composition"},
                    },
                )
            )
        return out

    def factor_at(self, metric: str, step: int) -> float:
        """The expectation factor of ``metric`` at ``step`` (1 when it was not judged against its composition)."""
        if metric not in self.factors_ or not self.factors_[metric][0]:
            return 1.0
        steps_parts, factor_parts = self.factors_[metric]
        if len(steps_parts) > 1:  # one array each, so lookups stay a search
            self.factors_[metric] = ([np.concatenate(steps_parts)], [np.concatenate(factor_parts)])
        steps, factors = self.factors_[metric][0][0], self.factors_[metric][1][0]
        i = int(np.searchsorted(steps, step))
        return float(factors[i]) if i < len(steps) and steps[i] == step else 1.0

    def _expectation(self, f: Finding) -> Finding:
        """A detector's finding on the adjusted values, back on the metric's scale: its baseline is the
        expectation of its peak step."""
        if f.metric not in self.expect_:
            return f
        at = f.peak_step if f.peak_step is not None else f.step
        factor = self.factor_at(str(f.metric), int(at))
        if f.value is not None and np.isfinite(f.value):
            f.value = float(f.value) * factor
        if f.baseline is not None and np.isfinite(f.baseline):
            f.details["trend"] = float(f.baseline)
            f.baseline = float(f.baseline) * factor
        f.details["expected_factor"] = factor
        if factor >= COMPOSITION_HIGH and f.kind == "spike":
            f.details.setdefault("support", {"moved": True})["composition_high"] = True
        if f.kind in ("spike", "level_shift") and f.baseline is not None and f.evidence:
            words = f"{factor:.2f}x the trend" if abs(factor - 1.0) >= 0.005 else "the trend itself"
            f.evidence[0] = (
                f"{f.metric} rose to {f.value:.4g} at step {at} against {f.baseline:.4g}, what the "
                f"step's composition predicts ({words}: its bucket, clusters, tokens, batch size and "
                f"padding): {f.details.get('ratio', float('nan')):.2f}x the expectation and "
                f"{(f.score or 0.0):.1f} times the noise of the residual."
            )
        return f

    # --- how the loss followed the grad norm --------------------------------------------------------------------------
    def _follow(self, new: list[Finding]) -> None:
        """Fold this chunk's scores of the other metrics into each held grad-norm spike's ``loss_follow`` (new ones
        first look back over the recent rows), so the follow is the same for any chunking."""
        if self.grad_norm_key is None:
            return
        parts = [det.last_rows_ for m, det in self.detectors_.items() if m != self.grad_norm_key]
        steps = np.concatenate([p[0] for p in parts]) if parts else np.empty(0, np.int64)
        with np.errstate(divide="ignore", invalid="ignore"):
            scores = np.concatenate([p[3] for p in parts]) if parts else np.empty(0)
            ratios = np.concatenate([np.where(p[2] > 0, p[1] / p[2], np.nan) for p in parts]) if parts else scores
        fresh = [f for f in new if f.kind == "spike" and f.metric == self.grad_norm_key]
        old_steps, old_scores, old_ratios = self.recent_
        for f in fresh:
            f.details["loss_follow"] = {"score": None, "ratio": None}
            self._fold(f, old_steps, old_scores, old_ratios)
        for f in self.held_ + fresh:
            if f.metric == self.grad_norm_key:
                self._fold(f, steps, scores, ratios)
        keep = slice(max(0, len(old_steps) + len(steps) - FOLLOW_ROWS), None)
        self.recent_ = (
            np.concatenate([old_steps, steps])[keep],
            np.concatenate([old_scores, scores])[keep],
            np.concatenate([old_ratios, ratios])[keep],
        )

    @staticmethod
    def _fold(f: Finding, steps: np.ndarray, scores: np.ndarray, ratios: np.ndarray) -> None:
        start, end = _span(f)
        sel = (steps >= start) & (steps <= end + JOINT_LEAD)
        if not sel.any():
            return
        follow = f.details["loss_follow"]
        for key, values in (("score", scores[sel]), ("ratio", ratios[sel])):
            values = values[np.isfinite(values)]
            if len(values):
                best = float(values.max())
                follow[key] = best if follow[key] is None else max(follow[key], best)

    # --- holding and releasing --------------------------------------------------------------------------------------
    def _release(self, new: list[Finding]) -> list[Finding]:
        out = []
        for f in new:
            if f.kind == "spike":
                self.spans_.append((str(f.metric), *_span(f)))
                self.held_.append(f)
            else:
                out.append(self._finalise(f, None))
        keep = []
        for f in self.held_:
            if self._settled(f):
                out.append(self._finalise(f, self.spans_))
            else:
                keep.append(f)
        self.held_ = keep
        return _sorted(out)

    def _settled(self, f: Finding) -> bool:
        """Whether every spike that could change ``f``'s confidence has been reported."""
        grad = self.grad_norm_key
        if grad is None:
            return True
        start, end = _span(f)
        if f.metric == grad:  # the loss may answer up to JOINT_LEAD steps after the grad norm's spike ends
            return all(det.unsettled_from() > end + JOINT_LEAD for m, det in self.detectors_.items() if m != grad)
        return self.detectors_[grad].unsettled_from() > end

    def _finalise(self, f: Finding, spans: list[tuple[str, int, int]] | None) -> Finding:
        if f.kind != "expected_for_bucket":
            attach_tags([f], self.tags_, self.boundaries)
        else:
            b = f.tags.get(BUCKET)
            if b is not None and 0 <= b < len(self.boundaries) - 1:
                f.tags[BUCKET_RANGE] = bucket_range(b, self.boundaries)
        if f.kind == "spike":
            confidence, joint = joint_confidence(f, spans or [], self.grad_norm_key)
            f.details["confidence"] = confidence
            if joint is not None:
                f.details["joint"] = joint
            _joint_support(f, joint, self.grad_norm_key)
            judge_batch_size([f], self.tags_)
            if self.logging_steps > 1:
                cover_window(f, self.logging_steps)
        assign_severities([f])
        return f


def _joint_support(f: Finding, joint: str | None, grad: str | None) -> None:
    """The evidence the loss and the grad norm give each other (detect/causes/severity.py reads it)."""
    support = f.details.setdefault("support", {"moved": True})
    if joint in ("led", "accompanied", "loss_response"):
        support["grad_norm"] = True
    elif joint == "none" and f.metric == grad:
        follow = f.details.get("loss_follow") or {}
        weak = (follow.get("score") or 0.0) >= WEAK_FOLLOW_Z and (follow.get("ratio") or 0.0) >= WEAK_FOLLOW_RATIO
        if weak:
            support["loss_weak"] = True
        else:
            support["explained"] = "not_followed"
            support["not_followed"] = True


def _written_rows(rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    if metric not in rows.columns:
        return pd.DataFrame({STEP: np.array([], np.int64), metric: np.array([], np.float64)})
    return rows.loc[written(rows, metric), [STEP, metric]]


def _span(f: Finding) -> tuple[int, int]:
    return int(f.step), int(f.end_step if f.end_step is not None else f.step)


def _sorted(found: list[Finding]) -> list[Finding]:
    return sorted(found, key=lambda f: (f.step, f.metric or "", f.kind))


def alone_confidence(f: Finding) -> float:
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


def joint_confidence(f: Finding, spans: Sequence[tuple[str, int, int]], grad: str | None) -> tuple[float, str | None]:
    """A spike's confidence and how the loss and the grad norm agreed at it.

    ``spans``: ``(metric, step, end_step)`` of the run's spikes. ``joint``: ``accompanied`` (the grad norm spiked
    during this loss spike), ``led`` (else, it spiked up to ``JOINT_LEAD`` steps before it, and no other loss spike
    was under way then: a grad-norm spike that came with an earlier loss spike belongs to that one, so two bad
    batches a few steps apart are not an optimizer-led event), ``loss_response`` (a grad-norm spike the loss answered
    within ``JOINT_LEAD`` steps of its end), ``none``; None without a grad norm beside another metric. Agreement
    raises the confidence: the chance that both moved by noise is far smaller.
    """
    c = alone_confidence(f)
    if grad is None:
        return round(c, 3), None
    start, end = _span(f)
    if f.metric != grad:
        others = [(a, b) for m, a, b in spans if m == f.metric and (a, b) != (start, end)]
        grads = [s for m, s, _ in spans if m == grad]
        if any(start <= s <= end for s in grads):
            joint = "accompanied"
        elif any(start - JOINT_LEAD <= s < start and not any(a <= s <= b for a, b in others) for s in grads):
            joint = "led"
        else:
            joint = "none"
    else:
        answered = any(m != grad and start <= s <= end + JOINT_LEAD for m, s, _ in spans)
        joint = "loss_response" if answered else "none"
    if joint != "none":
        c = 1.0 - 0.4 * (1.0 - c)
    return round(c, 3), joint


def add_confidence(findings: Sequence[Finding], grad_metric: str | None = None) -> None:
    """Set ``details["confidence"]`` and ``details["joint"]`` on every spike of a whole run (:func:`joint_confidence`;
    the grad-norm metric is found by its name among the spikes' metrics unless given)."""
    spikes = [f for f in findings if f.kind == "spike"]
    metrics = sorted({str(f.metric) for f in spikes if f.metric})
    grad = grad_metric or grad_norm_column(metrics)
    if grad is not None and not set(metrics) - {grad}:
        grad = None
    spans = [(str(f.metric), *_span(f)) for f in spikes]
    for f in spikes:
        f.details["confidence"], joint = joint_confidence(f, spans, grad)
        if joint is not None:
            f.details["joint"] = joint


def cover_window(f: Finding, every: int) -> None:
    """A value logged every ``every`` steps is the mean over them (HF's ``loss`` over ``logging_steps``): the spike
    is located to the window its logged steps cover, so its batch evidence is the union of their batches."""
    logged = (int(f.step), int(f.end_step if f.end_step is not None else f.step))
    f.step = max(0, logged[0] - every + 1)
    f.details["window_steps"] = [f.step, logged[1]]
    f.evidence.append(
        f"Each logged {f.metric} value is the mean over {every} steps (logging_steps = {every}): the "
        f"value at step {logged[0]} covers steps {f.step}-{logged[0]}, and its batch evidence is the "
        f"union of those steps' batches."
    )


def detect_spikes(
    metrics: pd.DataFrame,
    metric: str | Sequence[str] | None = None,
    tags: pd.DataFrame | None = None,
    boundaries: Sequence[int] | None = None,
    grad_norm_key: str | None = "auto",
    logging_steps: int = 1,
    **params: Any,
) -> list[Finding]:
    """Spikes, level shifts, non-finite steps and bucket summaries of one or several metrics of a whole run.

    ``metric``: a column, a list of columns, or ``None`` for the loss key. ``tags``: the tags table (judging each
    step against its bucket and copying bucket, bucket_range, cluster, cluster_name and epoch onto the findings).
    ``grad_norm_key``: the metric whose flagged steps support the others' (``"auto"``: the grad norm among several
    metrics, by its name; None: each judged alone). ``params`` go to :class:`SpikeDetector`.
    """
    from forensics.schema import find_loss_key

    names = [metric] if metric is None or isinstance(metric, str) else list(metric)
    names = [find_loss_key(metrics.columns) if n is None else n for n in names]
    if grad_norm_key == "auto":
        grad_norm_key = grad_norm_column([str(m) for m in names]) if len(names) > 1 else None
    driver = SpikeDriver(names, grad_norm_key, params=params, logging_steps=logging_steps, boundaries=boundaries)
    return driver.detect(metrics, tags)
