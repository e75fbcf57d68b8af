"""Throughput: a lasting slowdown of the run (a slow node, a data stall, a throttled GPU) read from its speed metric.

The metric is found by name, as the loss key is (:func:`forensics.schema.keys.choose_key`): a rate (tokens/s,
samples/s, it/s: higher is faster) first, else a per-step time (``step_time``, ``elapsed time per iteration``,
``step_avg``: lower is faster). Held-out names (``eval_samples_per_second``), series with fewer than
:data:`MIN_VALUES` values (HF's end-of-run ``train_samples_per_second``) and cumulative timers (a series that never
goes down: modded-nanogpt's ``train_time``) are passed over.

One change point on the logged values, in log space so a factor is the same up or down: the split that best
separates the values into two levels (least squares on a rolling median, so a checkpoint save's one slow step
moves nothing), among splits where the later level is the slower one and each side holds at least ``min_share`` of
the values. ``before`` / ``after`` are the medians of the raw values on each side; ``factor`` the slowdown (>= 1:
``before / after`` for a rate, ``after / before`` for a time). A factor of at least ``factor`` is a finding
(``warning`` by default, :mod:`forensics.detect.causes.severity`); a faster run later is not a fault.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding
from forensics.detect.health import HEALTH, judged_section, series
from forensics.detect.params import at_least, fraction
from forensics.schema import metric_columns
from forensics.schema.keys import EVAL_WORDS, THROUGHPUT, Role, choose_key, tokens
from forensics.schema.steps import step_span
from forensics.stats import rolling_median

#: The fewest finite positive values the rule judges.
MIN_VALUES = 20
#: Rates: the throughput role plus iterations / steps per second.
RATE = replace(
    THROUGHPUT,
    name="throughput_rate",
    weaker=THROUGHPUT.weaker
    + (
        ("it", "s"),
        ("its",),
        ("iters", "per", "s"),
        ("iter", "per", "s"),
        ("steps", "per", "s"),
        ("steps", "per", "second"),
        ("it", "per", "s"),
    ),
    loose=THROUGHPUT.loose + ("samplespers",),
)
#: Per-step times (lower is faster).
STEP_TIME = Role(
    "step_time",
    (
        ("step", "time"),
        ("iteration", "time"),
        ("iter", "time"),
        ("time", "per", "iteration"),
        ("time", "per", "step"),
        ("time", "per", "iter"),
        ("batch", "time"),
        ("step", "avg"),
        ("step", "ms"),
        ("dt",),
        ("dt", "ms"),
    ),
    exclude=frozenset({"data", "eval", "total"}),
    label="step time",
)


@dataclass(frozen=True)
class Slowdown:
    """The change point found: the index the slower level starts at, the medians either side and the factor."""

    index: int
    before: float
    after: float
    factor: float


def is_cumulative(values: np.ndarray) -> bool:
    """A timer that only adds up (never goes down, and grows on nearly every step): the run's total time, not a
    per-step one (a per-step time that steps up once is not cumulative)."""
    d = np.diff(values)
    return len(d) > 0 and bool((d >= 0).all()) and float((d > 0).mean()) >= 0.9


def find_slowdown(values: np.ndarray, *, higher_is_faster: bool, min_share: float) -> Slowdown | None:
    """The one change point to a slower level (module docstring), or None when no split makes the run slower."""
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    m = max(5, int(np.ceil(min_share * n)))
    if n < 2 * m:
        return None
    w = max(3, (n // 50) | 1)
    x = np.log(rolling_median(v, w))
    c = np.concatenate([[0.0], np.cumsum(x)])
    i = np.arange(m, n - m + 1)
    left, right = c[i] / i, (c[n] - c[i]) / (n - i)
    gain = i * (n - i) / n * (left - right) ** 2
    slower = right < left if higher_is_faster else right > left
    if not slower.any():
        return None
    j = int(i[np.argmax(np.where(slower, gain, -1.0))])
    before, after = float(np.median(v[:j])), float(np.median(v[j:]))
    factor = before / after if higher_is_faster else after / before
    return Slowdown(j, before, after, float(factor))


def speed_metric(run: RunTables) -> tuple[str, bool] | None:
    """``(metric, higher_is_faster)``: the first rate, else step time, that is not held-out, dense and not a
    running total; None when the run logs none."""
    cols = metric_columns(run.metrics)
    counts = {c: int(run.metrics[c].notna().sum()) for c in cols}
    for role, higher in ((RATE, True), (STEP_TIME, False)):
        for name in choose_key(cols, role, counts=counts).candidates:
            if EVAL_WORDS.intersection(tokens(name)):
                continue
            s = series(run, name)
            if s is None or int((s.values > 0).sum()) < MIN_VALUES or is_cumulative(s.values):
                continue
            return name, higher
    return None


class ThroughputRule(Rule):
    """A ``throughput`` finding when the run's speed drops by a lasting factor (module docstring).

    Parameters: ``factor`` 1.5 (the least slowdown reported), ``min_share`` 0.05 (the least share of the values
    either side of the change).
    """

    name = "throughput"
    section_name = HEALTH
    parameter_constraints = {"factor": at_least(1.0), "min_share": fraction()}

    def __init__(self, factor: float = 1.5, min_share: float = 0.05) -> None:
        self.factor = factor
        self.min_share = min_share

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        chosen = speed_metric(run)
        if chosen is None:
            why = f"no throughput or step-time metric with {MIN_VALUES} values logged"
            self.section_ = judged_section(run, self.name, False, why)
            return []
        metric, higher = chosen
        s = series(run, metric)
        assert s is not None
        ok = s.values > 0
        steps, values = s.steps[ok], s.values[ok]
        self.section_ = judged_section(run, self.name, True, metric=metric)
        hit = find_slowdown(values, higher_is_faster=higher, min_share=self.min_share)
        if hit is None or hit.factor < self.factor:
            return []
        step = int(steps[hit.index])
        where = step_span(step, int(steps[-1]), offset=run.logged_offset)
        what = "fell" if higher else "rose"
        summary = (
            f"{metric} {what} from {hit.before:.4g} to {hit.after:.4g} over {where}: the run is "
            f"{hit.factor:.2f}x slower from there on."
        )
        return [
            Finding(
                kind="throughput",
                step=step,
                metric=metric,
                end_step=int(steps[-1]),
                value=round(hit.after, 6),
                confidence=0.8,
                evidence=[summary],
                next_step=(
                    "Check what changed at that step: a slow or throttled node (its rank's step time), the data "
                    "loader (a stalled or remote dataset), a new logging or checkpointing cost."
                ),
                details={
                    "metric": metric,
                    "factor": round(hit.factor, 4),
                    "before": hit.before,
                    "after": hit.after,
                    "higher_is_faster": higher,
                    "support": {},
                },
            )
        ]
