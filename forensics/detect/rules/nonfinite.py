"""NaN and inf steps: their own finding, one per step, never part of any baseline.

A NaN or infinite loss is not "a very large spike": it says the numbers broke (overflow, a division by zero, a bad
sample turned into NaN gradients). Each such step is reported as ``{"kind": "nonfinite", "step", "metric",
"value"}`` (the JSON writes the value as null plus ``value_text``: ``"nan"``, ``"inf"`` or ``"-inf"``). Steps are not
merged into runs, so every reported step can be looked up as is; they are final as soon as they are seen, which makes
online and offline answers identical by construction.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from forensics.detect.base import OnlineRule, Rule, RunTables
from forensics.detect.findings import CRITICAL, INFO, Finding
from forensics.detect.metric_detector import MetricDetector
from forensics.errors import ForensicsError
from forensics.schema import STEP, find_loss_key, is_training_quantity, metric_columns, written


def nonfinite_findings(steps: np.ndarray, values: np.ndarray, metric: str) -> list[Finding]:
    """One finding per step whose value is NaN or +-inf, in step order."""
    bad = np.flatnonzero(~np.isfinite(values))
    out = []
    for i in bad:
        v = float(values[i])
        word = "NaN" if math.isnan(v) else ("+inf" if v > 0 else "-inf")
        out.append(
            Finding(
                kind="nonfinite",
                step=int(steps[i]),
                metric=metric,
                value=v,
                severity=CRITICAL,
                details={"support": {"nonfinite": "training"}},
                evidence=[
                    f"{metric} is {word} at step {int(steps[i])}; the step is kept out of every baseline and "
                    "reported on its own."
                ],
                next_step=f"Check step {int(steps[i])}'s batch and the optimizer state before it (overflow, a bad "
                "sample, a too-high learning rate): NaN/inf values usually mean the numbers broke, not the data.",
            )
        )
    return out


class NonfiniteDetector(MetricDetector):
    """Reports every NaN/inf value of one metric.

    Parameters
    ----------
    metric:
        The metric column; ``None`` takes the loss key (the first of ``train/loss``, ``loss``, ... found).
    """

    def __init__(self, metric: str | None = None):
        self.metric = metric

    def reset(self) -> None:
        self.last_step_: int | None = None

    def update(self, rows: pd.DataFrame, tags: pd.DataFrame | None = None) -> list[Finding]:
        if not hasattr(self, "last_step_"):
            self.reset()
        metric = self.metric or find_loss_key(rows.columns)
        for col in (STEP, metric):
            if col not in rows.columns:
                raise ForensicsError(f"metrics: missing column '{col}'")
        steps = rows[STEP].to_numpy(dtype=np.int64)
        values = rows[metric].to_numpy(dtype="float64", na_value=np.nan)
        if self.last_step_ is not None:
            keep = steps > self.last_step_
            steps, values = steps[keep], values[keep]
        if len(steps):
            self.last_step_ = int(steps.max())
        return nonfinite_findings(steps, values, metric)


class NonfiniteRule(Rule):
    """NaN/inf in the metrics that are not judged for spikes (the spike rule reports its own metrics' NaN/inf).

    Severity (docs/concepts.md): ``critical`` in a training quantity (the loss and grad-norm keys, and metrics
    whose names hold ``loss`` or ``norm`` but not val/eval/test), ``info`` in context metrics (timing, throughput,
    lr, eval-only fields): a timing field that is NaN before timing starts is recorded, not a fault.
    """

    name = "nonfinite"

    def __init__(self) -> None:
        pass

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        state = self.online(run)
        return state.update(run.metrics) + state.finish()

    def online(self, run: RunTables) -> LiveNonfinite:
        return LiveNonfinite(run)


class LiveNonfinite(OnlineRule):
    """NaN/inf of the context metrics as rows arrive (a metric first logged later is watched from then on)."""

    def __init__(self, run: RunTables) -> None:
        self.run = run
        self.detectors: dict[str, NonfiniteDetector] = {}

    def update(self, rows: pd.DataFrame) -> list[Finding]:
        out: list[Finding] = []
        run = self.run
        for col in metric_columns(rows):
            if col in run.analysed:
                continue
            det = self.detectors.setdefault(col, NonfiniteDetector(col))
            items = det.update(rows.loc[written(rows, col), [STEP, col]])
            if not is_training_quantity(col, run.loss_key, run.grad_norm_key):
                for f in items:
                    f.severity = INFO
                    f.details["support"] = {"nonfinite": "context"}
                    f.next_step = None
                    f.evidence.append(f"'{col}' is a context metric (not a loss or a norm): recorded, not a fault.")
            out += items
        return sorted(out, key=lambda f: (f.step, f.metric or ""))

    def finish(self) -> list[Finding]:
        return []
