"""Precedence: did the grad norm spike before, with or after the loss? And what did lr and throughput do?

Two stories look alike on the loss curve and call for different fixes:

- **data-led**: a bad batch raises the loss and its gradient at the same step (grad norm ``with`` the loss); look at
  the batch.
- **optimizer-led** (BLOOM-176B's first spike: grad norm 0.24 -> 2.4 -> 16 -> 145 -> 960 over iterations
  31214-31219 before lm loss jumped at 31219): the updates grow for several steps before the loss follows (grad norm
  ``leads``); look at the optimizer state, lr and precision rather than at one batch.

**Rule.** The grad norm's robust baseline is the median (and MAD) of its last ``baseline_rows`` logged values before
the window ``[start - lead_window, start + lag_window]`` around the loss spike's start. A row is elevated when its
value is at least ``factor`` x the baseline and, where the MAD is not 0, at least ``z`` robust SDs above it. The
grad-norm event is the run of consecutive elevated rows (logged rows, so sparse logs work) that reaches furthest into
the loss spike; its first step against the loss spike's start gives ``leads`` (before), ``with`` (same step) or
``lags`` (after), and ``lead_steps`` = start - first (negative when it lags; null with ``none``).

**lr.** The value at the loss spike's start and whether it changed in the ``lr_window`` steps before it:
``restart`` (a one-step jump up by more than ``lr_jump`` of its value), ``warmup_end`` (lr rose within the window and
had stopped rising by the spike), ``increase``/``decrease`` (a change above ``lr_drift`` of its value over the window,
e.g. a warm-up still under way), else ``none``.

**tokens/s.** The throughput over the spike's steps against the same kind of baseline: an anomaly when it departs
from the baseline by more than ``tps_change`` (relative) and ``z`` robust SDs (a straggler, a recompilation, an
I/O stall, or a batch of unusual length).

Columns are found by name (``grad_norm``, ``grad norm``, ``train/grad_norm``, ... ; ``lr``, ``learning rate``, ...;
``tokens_per_s``, ``throughput``, ...); a metric that is not logged gives ``none`` / null with a note.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from forensics.detect.findings import SpikeLike, spike_span
from forensics.schema import STEP, grad_norm_column, lr_column, metric_columns, tokens_per_s_column
from forensics.schema.words import counted
from forensics.stats import robust_sd


class _Series:
    """One metric's finite rows in step order, with look-ups by step."""

    def __init__(self, metrics: pd.DataFrame, column: str):
        order = np.argsort(metrics[STEP].to_numpy(np.int64), kind="stable")
        steps = metrics[STEP].to_numpy(np.int64)[order]
        values = metrics[column].to_numpy(np.float64, na_value=np.nan)[order]
        ok = np.isfinite(values)
        self.steps, self.values, self.name = steps[ok], values[ok], column

    def before(self, step: int, n: int) -> np.ndarray:
        """The last ``n`` values logged strictly before ``step``."""
        hi = np.searchsorted(self.steps, step, side="left")
        return self.values[max(0, hi - n) : hi]

    def between(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        a = np.searchsorted(self.steps, lo, side="left")
        b = np.searchsorted(self.steps, hi, side="right")
        return self.steps[a:b], self.values[a:b]

    def at_or_before(self, step: int) -> tuple[int, float] | None:
        i = np.searchsorted(self.steps, step, side="right") - 1
        return (int(self.steps[i]), float(self.values[i])) if i >= 0 else None


#: A leading metric "rose before" the loss when it moved this many times its baseline...
PRECEDENCE_FACTOR = 1.5
#: ... and this many robust SDs above it (the defaults of every caller: the attribution rule passes its own).
PRECEDENCE_Z = 4.0


def _baseline(values: np.ndarray) -> tuple[float, float]:
    if len(values) == 0:
        return float("nan"), float("nan")
    med = float(np.median(values))
    return med, robust_sd(values)


def _elevated(values: np.ndarray, med: float, sd: float, factor: float, z: float) -> np.ndarray:
    up = values >= factor * med if med > 0 else values > med
    if np.isfinite(sd) and sd > 0:
        up &= (values - med) / sd >= z
    return up


def precedence(
    spikes: Sequence[SpikeLike],
    metrics: pd.DataFrame,
    *,
    grad_metric: str | None = None,
    lr_metric: str | None = None,
    tps_metric: str | None = None,
    lead_window: int = 10,
    lag_window: int = 3,
    baseline_rows: int = 50,
    factor: float = PRECEDENCE_FACTOR,
    z: float = PRECEDENCE_Z,
    lr_window: int = 20,
    lr_jump: float = 0.2,
    lr_drift: float = 0.05,
    tps_change: float = 0.2,
) -> list[dict[str, Any]]:
    """One dict per spike (in the order given): ``step``, ``grad_norm`` (``leads``/``with``/``lags``/``none``),
    ``lead_steps``, ``grad_norm_first_step``, ``grad_norm_baseline`` (and ``grad_norm_baseline_rows``),
    ``grad_norm_peak`` (largest value in the window),
    ``grad_norm_peak_ratio``, ``lr``, ``lr_change`` (``{kind, step, relative}``), ``tokens_per_s`` (``{value,
    baseline, ratio, anomaly}`` or null), ``columns`` (which metrics were used) and ``evidence`` (sentences)."""
    cols = metric_columns(metrics)
    grad_col = grad_metric or grad_norm_column(cols)
    lr_col = lr_metric or lr_column(cols)
    tps_col = tps_metric or tokens_per_s_column(cols)
    grad = _Series(metrics, grad_col) if grad_col else None
    lr = _Series(metrics, lr_col) if lr_col else None
    tps = _Series(metrics, tps_col) if tps_col else None
    out = []
    for spike in spikes:
        start, end, peak = spike_span(spike)
        item: dict[str, Any] = {
            "step": start,
            "columns": {"grad_norm": grad_col, "lr": lr_col, "tokens_per_s": tps_col},
        }
        item.update(_grad(grad, start, end, lead_window, lag_window, baseline_rows, factor, z))
        item.update(_lr(lr, start, lr_window, lr_jump, lr_drift))
        item["tokens_per_s"] = _tps(tps, start, end, baseline_rows, lead_window, tps_change, z)
        item["evidence"] = _evidence(item)
        out.append(item)
    return out


def _grad(
    grad: _Series | None, start: int, end: int, lead: int, lag: int, n_base: int, factor: float, z: float
) -> dict[str, Any]:
    r = _rise(grad, start, end, lead, lag, n_base, factor, z)
    return {
        "grad_norm": r["relation"],
        "lead_steps": r["lead_steps"],
        "grad_norm_first_step": r["first_step"],
        "grad_norm_baseline": r["baseline"],
        "grad_norm_baseline_rows": r["baseline_rows"],
        "grad_norm_peak": r["peak"],
        "grad_norm_peak_ratio": r["peak_ratio"],
    }


def rise(
    metrics: pd.DataFrame,
    column: str,
    start: int,
    end: int | None = None,
    *,
    lead_window: int = 10,
    lag_window: int = 3,
    baseline_rows: int = 50,
    factor: float = PRECEDENCE_FACTOR,
    z: float = PRECEDENCE_Z,
) -> dict[str, Any]:
    """The grad norm's rule (module docstring) applied to any logged ``column`` around a loss spike over steps
    ``start``-``end``: one rule for every signal that may rise before the loss (the update norm, the params norm,
    the z loss, the count of zero gradients), so "leads" means the same thing for each. ``{relation}``
    (``leads``/``with``/``lags``/``none``), ``lead_steps``, ``first_step``, ``baseline``, ``baseline_rows``,
    ``peak``, ``peak_ratio`` (null when the baseline is 0: a count rising from 0 is elevated by any value above it).
    """
    series = _Series(metrics, column) if column in metrics.columns else None
    return _rise(series, start, start if end is None else end, lead_window, lag_window, baseline_rows, factor, z)


def _rise(
    series: _Series | None, start: int, end: int, lead: int, lag: int, n_base: int, factor: float, z: float
) -> dict[str, Any]:
    none = {
        "relation": "none",
        "lead_steps": None,
        "first_step": None,
        "baseline": None,
        "baseline_rows": 0,
        "peak": None,
        "peak_ratio": None,
    }
    if series is None:
        return none
    lo, hi = start - lead, max(start, end) + lag
    med, sd = _baseline(series.before(lo, n_base))
    steps, values = series.between(lo, hi)
    if not np.isfinite(med) or len(values) == 0:
        return none
    peak_i = int(np.argmax(values))
    info = {
        "baseline": med,
        "baseline_rows": int(len(series.before(lo, n_base))),
        "peak": float(values[peak_i]),
        "peak_ratio": float(values[peak_i] / med) if med > 0 else None,
    }
    up = _elevated(values, med, sd, factor, z)
    if not up.any():
        return {**none, **info}
    # runs of consecutive elevated rows; the one reaching furthest into the loss spike (else the nearest) wins
    edges = np.flatnonzero(np.diff(np.r_[0, up.astype(np.int8), 0]))
    runs = list(zip(edges[::2], edges[1::2] - 1))

    def distance(run: tuple[int, int]) -> tuple[int, int]:
        a, b = int(steps[run[0]]), int(steps[run[1]])
        overlap = max(0, min(b, max(start, end)) - max(a, start) + 1)
        gap = 0 if overlap else min(abs(a - start), abs(b - start))
        return (-overlap, gap)

    first = int(steps[min(runs, key=distance)[0]])
    kind = "leads" if first < start else ("with" if first == start else "lags")
    return {**none, **info, "relation": kind, "lead_steps": start - first, "first_step": first}


def _lr(lr: _Series | None, start: int, window: int, jump: float, drift: float) -> dict[str, Any]:
    out: dict[str, Any] = {"lr": None, "lr_change": {"kind": "none", "step": None, "relative": None}}
    if lr is None:
        return out
    now = lr.at_or_before(start)
    if now is None:
        return out
    out["lr"] = now[1]
    steps, values = lr.between(start - window, start)
    if len(values) < 2:
        return out
    ref = float(values[0])
    relative = float((values[-1] - ref) / abs(ref)) if ref else None
    diffs = np.diff(values)
    rel_steps = diffs / np.maximum(np.abs(values[:-1]), 1e-300)
    kind, where = "none", None
    if (rel_steps > jump).any():
        i = int(np.flatnonzero(rel_steps > jump)[-1])
        kind, where = "restart", int(steps[i + 1])
    else:
        rising = rel_steps > 1e-9
        if rising.any() and not rising[-1]:
            i = int(np.flatnonzero(rising)[-1])
            kind, where = "warmup_end", int(steps[i + 1])
        elif relative is not None and abs(relative) > drift:
            kind = "increase" if relative > 0 else "decrease"
    out["lr_change"] = {"kind": kind, "step": where, "relative": relative}
    return out


def _tps(
    tps: _Series | None, start: int, end: int, n_base: int, lead: int, change: float, z: float
) -> dict[str, Any] | None:
    if tps is None:
        return None
    med, sd = _baseline(tps.before(start - lead, n_base))
    steps, values = tps.between(start, max(start, end))
    if not np.isfinite(med) or len(values) == 0 or med == 0:
        return None
    i = int(np.argmax(np.abs(values - med)))
    value = float(values[i])
    ratio = value / med
    anomaly = abs(ratio - 1) > change and (not (np.isfinite(sd) and sd > 0) or abs(value - med) / sd >= z)
    return {"value": value, "step": int(steps[i]), "baseline": med, "ratio": ratio, "anomaly": bool(anomaly)}


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _evidence(item: dict[str, Any]) -> list[str]:
    ev = []
    start, kind = item["step"], item["grad_norm"]
    base, peak = item["grad_norm_baseline"], item["grad_norm_peak"]
    name = item["columns"]["grad_norm"]
    if name is None:
        ev.append("No grad norm logged: cannot tell a data-led spike from an optimizer-led one.")
    elif kind == "none":
        ev.append(
            f"{name} stayed near its baseline {base:.3g} around step {start} (peak {peak:.3g})."
            if base is not None and peak is not None
            else f"{name} has no values around step {start}."
        )
    else:
        first = item["grad_norm_first_step"]
        when = {
            "leads": f"{item['lead_steps']} steps before the loss (from step {first})",
            "with": f"at the same step as the loss ({first})",
            "lags": f"{-item['lead_steps']} steps after the loss (step {first})",
        }[kind]
        few = item["grad_norm_baseline_rows"]
        basis = f" (from {counted(few, 'logged value')})" if few < 5 else ""
        ev.append(
            f"{name} rose {when}: from its baseline {base:.3g}{basis} to {peak:.3g} "
            f"({item['grad_norm_peak_ratio']:.3g}x)"
            + (
                "; an optimizer-led event (updates grew before the loss followed)."
                if kind == "leads"
                else "; consistent with a data-led spike (the batch raised loss and gradient together)."
                if kind == "with"
                else "; the loss moved first."
            )
        )
    if item["lr"] is not None:
        ch = item["lr_change"]
        text = {
            "none": "unchanged over the steps before",
            "warmup_end": f"warm-up ended at step {ch['step']}",
            "restart": f"restarted (jumped up) at step {ch['step']}",
            "increase": "rising",
            "decrease": "falling",
        }[ch["kind"]]
        rel = (
            f" ({100 * ch['relative']:+.0f}% over the window)"
            if ch["relative"] is not None and ch["kind"] in ("increase", "decrease")
            else ""
        )
        ev.append(f"lr {item['lr']:.3g} at step {start}, {text}{rel}.")
    tps = item["tokens_per_s"]
    if tps is not None:
        name = item["columns"]["tokens_per_s"]
        ev.append(
            f"{name} {_num(tps['value'])} at step {tps['step']}, {tps['ratio']:.2f}x its baseline "
            f"{_num(tps['baseline'])}"
            + (": an anomaly (stall, straggler or unusual batch)." if tps["anomaly"] else ": normal.")
        )
    return ev
