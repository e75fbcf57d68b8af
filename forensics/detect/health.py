"""What the run-health rules share (divergence, overfitting, plateau, lr schedule): a metric as a clean series, its
noise, the learning rate and its peak in words, the checkpoint to resume from, and the note of what each rule could
judge.

The run-health rules answer "is this run healthy, and if not since when and what do I do" from the shape of whole
series, so they read a metric only where it was written and finite (an eval loss between evals is not a value; a
NaN is the non-finite rule's), and they say in findings.json ``health`` whether they could judge the run at all: a
verdict is an all-clear only over what was judged (:mod:`forensics.detect.causes.verdict`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from forensics.detect.base import RunTables
from forensics.schema import STEP, metric_columns
from forensics.schema.keys import lr_column
from forensics.stats import robust_sd

#: The findings.json section where each run-health rule says whether it judged the run (and why not).
HEALTH = "health"
#: Below this share of its peak the learning rate is "below 1e-3 of its peak" (as good as stopped).
TINY_LR = 1e-3


@dataclass(frozen=True)
class Series:
    """One metric on the steps where it holds a finite value, in step order."""

    name: str
    steps: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.steps)

    def index_at_or_before(self, step: int) -> int | None:
        i = int(np.searchsorted(self.steps, step, side="right")) - 1
        return i if i >= 0 else None

    def at_or_before(self, step: int) -> float | None:
        """The value written last at or before ``step`` (None before the first one)."""
        i = self.index_at_or_before(step)
        return None if i is None else float(self.values[i])


def series(run: RunTables, metric: str | None) -> Series | None:
    """``metric`` where written and finite; None when it is not logged or holds no finite value."""
    if metric is None or metric not in run.metrics.columns:
        return None
    rows = run.written_rows(metric)
    values = rows[metric].to_numpy(dtype=np.float64, na_value=np.nan)
    steps = rows[STEP].to_numpy(dtype=np.int64)
    ok = np.isfinite(values)
    return Series(metric, steps[ok], values[ok]) if ok.any() else None


def lr_series(run: RunTables) -> Series | None:
    """The learning rate (found by name, as the precedence evidence finds it), or None when not logged."""
    return series(run, lr_column(metric_columns(run.metrics)))


def diff_noise(values: np.ndarray) -> float:
    """The noise of one value from consecutive differences (robust SD; a slow trend cancels in the differences):
    ``1.4826 * MAD(diff) / sqrt(2)``; 0 for fewer than 3 values."""
    if len(values) < 3:
        return 0.0
    d = np.diff(np.asarray(values, dtype=np.float64))
    return robust_sd(d) / math.sqrt(2.0)


def run_steps(run: RunTables) -> int:
    """How many steps the metrics cover (first to last logged step)."""
    steps = run.metrics[STEP].to_numpy()
    return int(steps.max() - steps.min() + 1) if len(steps) else 0


def lr_state(lr: float | None, peak: float | None) -> str | None:
    """``zero``, ``tiny`` (below :data:`TINY_LR` of its peak) or ``fine``; None when the rate is not logged."""
    if lr is None:
        return None
    if lr <= 0:
        return "zero"
    if peak and lr < TINY_LR * peak:
        return "tiny"
    return "fine"


def lr_words(lr: float | None, peak: float | None) -> str:
    """The rate in words against its peak: ``lr 1.5e-04 (50% of its peak 3e-04)``, ``lr 0``, ``lr 2e-08 (below 1e-3
    of its peak 3e-04)``; empty when not logged."""
    state = lr_state(lr, peak)
    if state is None:
        return ""
    if state == "zero":
        return "lr 0"
    if state == "tiny":
        return f"lr {lr:.2g} (below 1e-3 of its peak {peak:.2g})"
    return f"lr {lr:.2g}" + (f" ({100 * lr / peak:.0f}% of its peak {peak:.2g})" if peak else "")


def resume_point(run: RunTables, onset: int, last_healthy: int) -> dict[str, Any]:
    """Where to resume a run that went wrong at ``onset``: the last known checkpoint at least ``max(10 steps, 1% of
    the run)`` before it (a checkpoint right before the onset may already hold the damage that showed a few steps
    later), else the last healthy step. ``resume_step`` is the checkpoint's step (checkpoint N = the state after N
    updates, so training continues with step N); ``resume_checkpoint`` its path, None without one."""
    margin = max(10, int(math.ceil(0.01 * run_steps(run))))
    out: dict[str, Any] = {
        "resume_step": int(last_healthy),
        "resume_checkpoint": None,
        "checkpoint_margin": margin,
        "checkpoints_known": run.checkpoints is not None,
    }
    if run.checkpoints:
        before = [(s, p) for s, p in run.checkpoints if s <= onset - margin]
        if before:
            out["resume_step"], out["resume_checkpoint"] = int(before[-1][0]), str(before[-1][1])
    return out


def judged_section(run: RunTables, rule: str, judged: bool, why: str = "", **extra: Any) -> dict[str, Any]:
    """findings.json ``health`` with ``rule``'s entry added: ``{judged, why}`` (why it could not judge the run)."""
    section = dict(run.sections.get(HEALTH) or {})
    section[rule] = {"judged": bool(judged), "why": why or None, **extra}
    return section
