"""Numerics read from the logs: did the fp16 loss scale drop, or did a step go NaN, at or before a loss spike?

Megatron-LM prints, at every logged iteration, the ``loss scale`` of its dynamic scaler (it halves when a step's
gradients overflow and that step is skipped), ``number of skipped iterations`` and ``number of nan iterations``
(counts over the logging interval that ends at the logged iteration). Both tell the numerics apart from the data and
the optimizer without a replay: an overflow is the scaler's to absorb, and a spike that follows one is a numerics
event first (docs/concepts.md, cause classes: ``numerics``). Like the grad norm's precedence
(:mod:`forensics.detect.evidence.precedence`), each is evidence only in the window around the spike's start.

**Rule.** The window is ``[start - lead_window, covering]``, where ``covering`` is the first logged row at or after
the spike's start (a count logged there covers the interval that holds the start; a logged value never speaks for a
step after it). In it:

- a **loss-scale drop**: a logged loss scale below the one logged before it (the last value before the window for
  the window's first row); the first such row is reported with the value before and after;
- **nan iterations**: a row whose ``number of nan iterations`` is above 0 (the first one);
- **skipped iterations**: the same for skipped iterations (reported, not numerics by itself: OLMo-core skips steps
  whose loss is an outlier, Megatron those that overflowed, which the loss scale then shows).

``numerics`` is True when a loss-scale drop or a nan iteration is in the window. torchtitan's ``global_max_loss``
against ``global_avg_loss`` (the worst rank against the mean) is reported as ``max_over_avg`` at the spike's start.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from forensics.schema import STEP
from forensics.schema.keys import loss_scale_column, max_loss_column, nan_iterations_column, skipped_iterations_column

#: Steps before the spike's start that the window reaches back (the grad norm's precedence uses the same lead).
LEAD_WINDOW = 10


def _rows(metrics: pd.DataFrame, column: str | None) -> tuple[np.ndarray, np.ndarray]:
    if not column or column not in metrics.columns:
        return np.array([], np.int64), np.array([], np.float64)
    col = metrics[[STEP, column]].dropna().sort_values(STEP, kind="stable")
    values = col[column].to_numpy(np.float64)
    ok = np.isfinite(values)
    return col[STEP].to_numpy(np.int64)[ok], values[ok]


def _window_end(steps: np.ndarray, start: int) -> int:
    """The first logged step at or after ``start`` (``start`` itself when none is)."""
    i = int(np.searchsorted(steps, start, side="left"))
    return int(steps[i]) if i < len(steps) else start


def loss_scale_drop(
    metrics: pd.DataFrame, start: int, lead_window: int = LEAD_WINDOW, column: str | None = None
) -> dict[str, Any] | None:
    """The first drop of the logged loss scale in the spike's window (module docstring): ``{step, before, after}``,
    or None (no drop, or no loss scale logged)."""
    steps, values = _rows(metrics, column or loss_scale_column(metrics.columns))
    if len(steps) < 2:
        return None
    lo, hi = start - lead_window, _window_end(steps, start)
    for i in range(1, len(steps)):
        if lo <= steps[i] <= hi and values[i] < values[i - 1]:
            return {"step": int(steps[i]), "before": float(values[i - 1]), "after": float(values[i])}
    return None


def first_count(
    metrics: pd.DataFrame, column: str | None, start: int, lead_window: int = LEAD_WINDOW
) -> dict[str, Any] | None:
    """The first logged row of a count (nan or skipped iterations) above 0 in the spike's window: ``{step, count}``."""
    steps, values = _rows(metrics, column)
    if not len(steps):
        return None
    lo, hi = start - lead_window, _window_end(steps, start)
    hit = np.flatnonzero((steps >= lo) & (steps <= hi) & (values > 0))
    return {"step": int(steps[hit[0]]), "count": float(values[hit[0]])} if len(hit) else None


def log_numerics(
    metrics: pd.DataFrame, start: int, loss_key: str | None = None, lead_window: int = LEAD_WINDOW
) -> dict[str, Any] | None:
    """The numerics evidence the logs hold for a spike starting at ``start`` (module docstring): ``{numerics,
    loss_scale_drop, nan_iterations, skipped_iterations, max_over_avg, columns, evidence}``; None when the run logs
    none of these series."""
    cols = [c for c in metrics.columns if c != STEP]
    columns = {
        "loss_scale": loss_scale_column(cols),
        "nan_iterations": nan_iterations_column(cols),
        "skipped_iterations": skipped_iterations_column(cols),
        "max_loss": max_loss_column(cols),
    }
    if not any(columns.values()):
        return None
    drop = loss_scale_drop(metrics, start, lead_window, columns["loss_scale"])
    nan = first_count(metrics, columns["nan_iterations"], start, lead_window)
    skipped = first_count(metrics, columns["skipped_iterations"], start, lead_window)
    ratio = None
    if columns["max_loss"] and loss_key and loss_key in metrics.columns:
        at = metrics.loc[metrics[STEP] == start, [columns["max_loss"], loss_key]].dropna()
        if len(at) and float(at[loss_key].iloc[0]) > 0:
            ratio = float(at[columns["max_loss"]].iloc[0]) / float(at[loss_key].iloc[0])
    evidence = []
    if drop:
        evidence.append(
            f"{columns['loss_scale']} dropped from {drop['before']:g} to {drop['after']:g} at step "
            f"{drop['step']}, {_when(drop['step'], start)}: the fp16 scaler met an overflow (numerics)."
        )
    if nan:
        evidence.append(
            f"{columns['nan_iterations']} was {nan['count']:g} at step {nan['step']}, "
            f"{_when(nan['step'], start)}: a step went NaN (numerics)."
        )
    if skipped:
        evidence.append(
            f"{columns['skipped_iterations']} was {skipped['count']:g} at step {skipped['step']}, "
            f"{_when(skipped['step'], start)}: an update was skipped."
        )
    if ratio is not None:
        evidence.append(
            f"{columns['max_loss']} was {ratio:.3g}x {loss_key} at step {start} (the worst rank against the mean)."
        )
    return {
        "numerics": bool(drop or nan),
        "loss_scale_drop": drop,
        "nan_iterations": nan,
        "skipped_iterations": skipped,
        "max_over_avg": ratio,
        "columns": columns,
        "evidence": evidence,
    }


def _when(step: int, start: int) -> str:
    if step < start:
        return f"{start - step} step{'s' if start - step > 1 else ''} ahead of the loss spike at {start}"
    return "at the loss spike's start" if step == start else f"in the logging interval holding step {start}"
