"""Plateau / not learning: the loss never leaves its start, or stops falling far above the run's own trend
(docs/reference/findings.md).

The loss is read as medians of ``share`` of its values (a one-step spike moves none of them):

- **not learning**: no rolling median of the run lies below the median of its first values by more than
  ``min_drop`` of it and ``z`` noise SDs: the loss never left its starting level (a run that learned and then
  diverged did leave it) (``start_step`` = the first step);
- **late plateau**: over the run's last ``tail_share`` the loss fell by less than ``flat_ratio`` of what it fell over
  the stretch of the same length before it, while that stretch fell by more than ``z`` noise SDs: a learning curve
  flattens slowly (a power law falls by about half as much over each later stretch of the same length), a run that
  stopped learning flattens at once. The plateau starts where the median last fell by more than the noise.

Each finding names the ``level`` and the ``lr`` over it (its median), in words against its peak (zero, below 1e-3 of
it, or fine), so the next step can say which: a scheduler past its end, or a model that does not learn at a fine rate.

Severity (:mod:`forensics.detect.causes.severity`): not learning, and a late plateau with the rate zero or below 1e-3
of its peak, are ``warning``; a late plateau at a fine rate is ``info`` (support ``explained: floor``): from the loss
alone it cannot be told from a model that reached the floor of its data (a small real Trainer run on a fixed set
flattens the same way), so it is recorded, not raised.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding
from forensics.detect.health import HEALTH, diff_noise, judged_section, lr_series, lr_state, lr_words, series
from forensics.detect.params import fraction, positive
from forensics.schema.steps import step_span
from forensics.stats import rolling_median

#: What explains a late plateau at a fine learning rate: the loss may have reached what the data allows.
FLOOR = "floor"
#: The fewest finite loss values the rule judges.
MIN_VALUES = 50


def find_plateau(
    steps: np.ndarray,
    values: np.ndarray,
    *,
    share: float,
    min_drop: float,
    tail_share: float,
    flat_ratio: float,
    z: float,
) -> dict[str, Any] | None:
    """``{problem: not_learning | plateau, start_index, level}`` (module docstring), or None."""
    n = len(values)
    k = max(5, int(share * n))
    noise = diff_noise(values) / np.sqrt(k)  # the noise of a median of k values, about
    first, last = float(np.median(values[:k])), float(np.median(values[-k:]))
    lowest = float(np.nanmin(rolling_median(values, k, center=False, min_periods=k)))
    if first - lowest <= max(min_drop * abs(first), z * noise):
        return {"problem": "not_learning", "start_index": 0, "level": last}
    t = max(int(tail_share * n), 2 * k)
    if 2 * t > n:
        return None
    a, b, c = (
        float(np.median(values[i - k // 2 : i + k // 2 + 1])) for i in (n - 2 * t + k // 2, n - t, n - 1 - k // 2)
    )
    before, tail = a - b, b - c
    if before <= z * noise or tail >= flat_ratio * before:
        return None
    # the start: the last point of the stretch before the tail where the median still fell by more than the noise
    start = n - t
    while start > n - 2 * t and float(np.median(values[max(start - k, 0) : start])) - b <= z * noise:
        start -= k // 2 or 1
    return {"problem": "plateau", "start_index": int(start), "level": float(np.median(values[-k:]))}


class PlateauRule(Rule):
    """A ``plateau`` finding when the loss does not learn or stops falling (module docstring).

    Parameters: ``share`` 0.05 (the values each median takes), ``min_drop`` 0.05 (the least fall from the start, a
    share of it), ``tail_share`` 0.25, ``flat_ratio`` 0.1, ``z`` 6.
    """

    name = "plateau"
    section_name = HEALTH
    parameter_constraints = {
        "share": fraction(),
        "min_drop": fraction(),
        "tail_share": fraction(),
        "flat_ratio": fraction(),
        "z": positive(),
    }

    def __init__(
        self,
        share: float = 0.05,
        min_drop: float = 0.05,
        tail_share: float = 0.25,
        flat_ratio: float = 0.1,
        z: float = 6.0,
    ) -> None:
        self.share = share
        self.min_drop = min_drop
        self.tail_share = tail_share
        self.flat_ratio = flat_ratio
        self.z = z

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        loss = series(run, run.loss_key)
        if loss is None or len(loss) < MIN_VALUES:
            self.section_ = judged_section(run, self.name, False, f"fewer than {MIN_VALUES} finite loss values")
            return []
        self.section_ = judged_section(run, self.name, True)
        hit = find_plateau(
            loss.steps,
            loss.values,
            share=self.share,
            min_drop=self.min_drop,
            tail_share=self.tail_share,
            flat_ratio=self.flat_ratio,
            z=self.z,
        )
        if hit is None:
            return []
        start, end = int(loss.steps[hit["start_index"]]), int(loss.steps[-1])
        lr = lr_series(run)
        lr_at = float(np.median(lr.values[lr.steps >= start])) if lr is not None and (lr.steps >= start).any() else None
        peak = float(lr.values.max()) if lr is not None else None
        state = lr_state(lr_at, peak)
        where = step_span(start, end, offset=run.logged_offset)
        lr_text = lr_words(lr_at, peak)
        if hit["problem"] == "not_learning":
            summary = (
                f"{run.loss_key} never left its starting level {hit['level']:.4g} over {where}: the run is not "
                "learning" + (f" ({lr_text})" if lr_text else "") + "."
            )
        else:
            summary = (
                f"{run.loss_key} stopped falling at {hit['level']:.4g} over {where}, far sooner than its own "
                "trend" + (f" ({lr_text})" if lr_text else "") + "."
            )
        if state in ("zero", "tiny"):
            next_step = (
                "The learning rate is as good as zero there: check the scheduler (its length, a resume that "
                "restored a finished schedule) and the optimizer's param groups."
            )
        else:
            next_step = (
                "The learning rate is not the reason: check that gradients reach the weights (frozen "
                "parameters, a detached loss, labels masked out) and that the data is not constant."
            )
        details = {
            "problem": hit["problem"],
            "start_step": start,
            "end_step": end,
            "level": round(hit["level"], 6),
            "lr": lr_at,
            "lr_peak": peak,
            "lr_state": state,
            "support": {"moved": True},
            "confidence": 0.7,
        }
        if hit["problem"] == "plateau" and state not in ("zero", "tiny"):
            details["support"]["explained"] = FLOOR  # at a fine rate a flat tail may be the data's floor
        return [
            Finding(
                kind="plateau",
                step=start,
                metric=run.loss_key,
                end_step=end,
                value=round(hit["level"], 6),
                evidence=[summary],
                next_step=next_step,
                details=details,
                confidence=0.7,
            )
        ]
