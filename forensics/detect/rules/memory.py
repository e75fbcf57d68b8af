"""Memory: accelerator memory that grows steadily over the run (a leak: tensors kept alive in a list, a growing
cache, a graph retained across steps) and the step at which it will run out.

The metric is found by name (:func:`forensics.schema.keys.choose_key`): ``memory_allocated``, ``gpu_mem``,
``mem``, ``max_memory_reserved_mb`` ...; held-out names and series with fewer than :data:`MIN_VALUES` values are
passed over. Its first ``skip`` share is left out (the optimizer state and the caching allocator fill memory during
the first steps and then hold it), and a hinge is fitted to the rest by least squares: a flat level until the
*onset*, a line from there on (``value = level + slope * max(0, step - onset)``). The onset is the change point: of
every logged step that leaves at least ``min_share`` of the fitted values after it, the one whose hinge leaves the
least squared error (a leak that begins a third of the way in is reported there, not where a single line over the
run would start; a leak from the first step is the plain line). A finding needs both:

- **growth**: the hinge rises by at least ``growth`` of its level at the onset, from the onset to the last step;
- **steadiness**: the hinge explains at least ``r2`` of the variance (R^2): a leak climbs every step, a run whose
  memory moves with its batches (padding to the longest sample) swings around a level.

The finding's ``step`` is the onset; ``slope_per_step`` the slope after it.

``projected_step``: where the line reaches run.toml ``device_memory_gb`` (the first step at or above it when a
logged value already has), else the step of the largest value seen. The metric's unit is read from its name
(``_mb``, ``_mib``, ``_gb``, ``bytes``), else from its size (above 1e6: bytes; above 1e3: MiB; else GiB). Severity:
``warning`` by default (:mod:`forensics.detect.causes.severity`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding
from forensics.detect.health import HEALTH, Series, judged_section, series
from forensics.detect.params import fraction, positive
from forensics.schema import metric_columns
from forensics.schema.keys import EVAL_WORDS, Role, choose_key, tokens
from forensics.schema.steps import step_span

#: The fewest finite values the rule judges (after the skipped start).
MIN_VALUES = 20
MEMORY = Role(
    "memory",
    (
        ("memory", "allocated"),
        ("mem", "allocated"),
        ("allocated", "memory"),
        ("gpu", "memory"),
        ("gpu", "mem"),
        ("cuda", "memory"),
        ("vram",),
        ("memory",),
        ("mem",),
    ),
    exclude=frozenset({"free", "bandwidth", "clock", "cpu", "host", "rss", "swap"}),
    neutral=frozenset({"gpu", "cuda", "device", "allocated", "reserved", "mb", "mib", "gb", "gib", "bytes"}),
    label="memory",
)
#: GiB per unit, by a word of the metric's name.
_UNITS = {
    "gb": 1.0,
    "gib": 1.0,
    "mb": 1 / 1024,
    "mib": 1 / 1024,
    "kb": 1 / 1024**2,
    "kib": 1 / 1024**2,
    "bytes": 1 / 1024**3,
    "byte": 1 / 1024**3,
}


@dataclass(frozen=True)
class Growth:
    """The line fitted to the memory (``value = intercept + slope * step``, from ``onset`` on), its R^2 and relative
    rise."""

    slope: float
    intercept: float
    r2: float
    growth: float
    onset: int = 0


def fit_growth(steps: np.ndarray, values: np.ndarray) -> Growth | None:
    """Least-squares line over ``steps``; None for fewer than 3 values or a constant step."""
    x, y = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if len(x) < 3 or float(np.ptp(x)) == 0.0:
        return None
    xm, ym = x.mean(), y.mean()
    sxx, sxy, syy = float(((x - xm) ** 2).sum()), float(((x - xm) * (y - ym)).sum()), float(((y - ym) ** 2).sum())
    slope = sxy / sxx
    intercept = ym - slope * xm
    r2 = sxy * sxy / (sxx * syy) if syy > 0 else 0.0
    start = intercept + slope * x[0]
    rise = slope * (x[-1] - x[0])
    return Growth(slope, intercept, float(r2), float(rise / abs(start)) if start else math.inf)


def fit_onset(steps: np.ndarray, values: np.ndarray, min_share: float = 0.05) -> Growth | None:
    """The hinge with the least squared error (module docstring): flat until ``onset``, a line after it.

    Every candidate onset is a logged step; the fits of all of them come from suffix sums in one pass. Only rising
    hinges compete (a falling one is no leak). None for fewer than 3 values or a constant step; the plain line
    (:func:`fit_growth`) when no rising hinge exists.
    """
    x, y = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    n = len(x)
    if n < 3 or float(np.ptp(x)) == 0.0:
        return None
    tail = max(3, int(np.ceil(min_share * n)))
    k = np.arange(0, max(1, n - tail))  # candidate onsets: x[k], each with `tail` or more values after it
    suffix = lambda a: np.concatenate([np.cumsum(a[::-1])[::-1], [0.0]])  # noqa: E731
    s1, s2, sy, sxy = suffix(x), suffix(x * x), suffix(y), suffix(x * y)
    xk, after = x[k], (n - k).astype(np.float64)
    sum_h = s1[k] - after * xk
    sum_hh = s2[k] - 2 * xk * s1[k] + after * xk * xk
    sum_hy = sxy[k] - xk * sy[k]
    ym = float(y.mean())
    hh = sum_hh - sum_h * sum_h / n
    hy = sum_hy - sum_h * ym
    syy = float(((y - ym) ** 2).sum())
    ok = (hh > 1e-12 * max(1.0, float(np.max(hh)))) & (hy > 0)
    if not ok.any():
        return fit_growth(steps, values)
    explained = np.where(ok, hy * hy / np.where(ok, hh, 1.0), -1.0)
    best = int(np.argmax(explained))
    slope = float(hy[best] / hh[best])
    level = ym - slope * float(sum_h[best]) / n
    onset = float(xk[best])
    r2 = float(explained[best] / syy) if syy > 0 else 0.0
    rise = slope * (x[-1] - onset)
    return Growth(
        slope, level - slope * onset, min(r2, 1.0), float(rise / abs(level)) if level else math.inf, onset=int(onset)
    )


def gib_per_unit(name: str, values: np.ndarray) -> float:
    """GiB per unit of the metric (module docstring)."""
    for word in tokens(name):
        if word in _UNITS:
            return _UNITS[word]
    peak = float(np.max(np.abs(values)))
    return 1 / 1024**3 if peak > 1e6 else 1 / 1024 if peak > 1e3 else 1.0


def memory_metric(run: RunTables) -> str | None:
    """The best memory name that is not held-out and holds enough values."""
    cols = metric_columns(run.metrics)
    counts = {c: int(run.metrics[c].notna().sum()) for c in cols}
    for name in choose_key(cols, MEMORY, counts=counts).candidates:
        s = series(run, name)
        if not EVAL_WORDS.intersection(tokens(name)) and s is not None and len(s) >= MIN_VALUES:
            return name
    return None


def projected_step(s: Series, fit: Growth, limit: float | None) -> int:
    """Where the memory reaches ``limit`` (metric units): the first logged step at or above it, else where the line
    does; without a limit, the step of the largest value seen."""
    if limit is None:
        return int(s.steps[int(np.argmax(s.values))])
    over = np.flatnonzero(s.values >= limit)
    if len(over):
        return int(s.steps[over[0]])
    return int(math.ceil(round((limit - fit.intercept) / fit.slope, 6)))  # 7000.0000001 is step 7000


class MemoryRule(Rule):
    """A ``memory`` finding when the run's memory grows steadily (module docstring).

    Parameters: ``growth`` 0.1 (the least rise from the onset, a share of the level there), ``r2`` 0.8 (the least
    share of the variance the hinge explains), ``skip`` 0.1 (the start left out), ``min_share`` 0.05 (the least share
    of the fitted values after the onset: a growth must last to be a leak).
    """

    name = "memory"
    section_name = HEALTH
    parameter_constraints = {"growth": positive(), "r2": fraction(), "skip": fraction(), "min_share": fraction()}

    def __init__(self, growth: float = 0.1, r2: float = 0.8, skip: float = 0.1, min_share: float = 0.05) -> None:
        self.growth = growth
        self.r2 = r2
        self.skip = skip
        self.min_share = min_share

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        metric = memory_metric(run)
        full = series(run, metric)
        if metric is None or full is None:
            self.section_ = judged_section(run, self.name, False, f"no memory metric with {MIN_VALUES} values logged")
            return []
        k = int(self.skip * len(full))
        s = Series(metric, full.steps[k:], full.values[k:])
        self.section_ = judged_section(run, self.name, True, metric=metric)
        fit = fit_onset(s.steps, s.values, self.min_share)
        if fit is None or fit.slope <= 0 or fit.growth < self.growth or fit.r2 < self.r2:
            return []
        unit = gib_per_unit(metric, full.values)
        limit = run.device_memory_gb / unit if run.device_memory_gb else None
        at = projected_step(full, fit, limit)
        first, last = max(fit.onset, int(s.steps[0])), int(s.steps[-1])
        where = step_span(first, last, offset=run.logged_offset)
        if limit is None:
            reach = f"largest value {float(full.values.max()):.4g} at step {at}"
        else:
            reach = f"reaches device_memory_gb {run.device_memory_gb:g} GiB at step {at}"
        summary = (
            f"{metric} grew steadily by {fit.slope:.3g} per step over {where} (R^2 {fit.r2:.2f}, "
            f"+{100 * fit.growth:.0f}%): {reach}."
        )
        return [
            Finding(
                kind="memory",
                step=first,
                metric=metric,
                end_step=last,
                value=float(s.values[-1]),
                confidence=0.8,
                evidence=[summary],
                next_step=(
                    "Look for tensors kept across steps: losses or outputs appended to a list without .item() or "
                    ".detach(), a cache that grows with new shapes, a graph retained by retain_graph=True."
                ),
                details={
                    "metric": metric,
                    "slope_per_step": fit.slope,
                    "projected_step": at,
                    "r2": round(fit.r2, 4),
                    "growth": round(fit.growth, 4),
                    "gib_per_unit": unit,
                    "device_memory_gb": run.device_memory_gb,
                    "support": {},
                },
            )
        ]
