"""The learning-rate schedule: no warmup when the first steps are unstable, a schedule that resets or jumps
(docs/reference/findings.md).

- ``no_warmup``: the first logged rate is already at least ``warm_share`` of its peak, and the first steps are
  unstable: within the first ``early_share`` of the run (at least 20 values) the loss climbs back above its lowest
  level so far by more than ``unstable`` of its first value (``warning``). A run that starts at its peak and falls
  at once is told nothing, and so is a log that does not hold the run's start (its first step past 10 steps and
  ``early_share`` of the run: an excerpt from mid-run says nothing of a warmup).
- ``reset``: the rate falls in one logged step to below ``reset_share`` of what it was, from a steady rate (the step
  before changed it by less than 10%), and climbs again afterwards (a resumed run with a fresh scheduler: warm-up
  again);
- ``jump``: the rate rises in one logged step by more than ``jump`` times from a steady rate (a warm-up's first steps
  double the rate, but from a rate that is not steady; a warm restart of a cosine schedule jumps too, and is
  recorded as ``info``).

The rule also writes the learning rate at each loss spike and level shift into that finding's evidence (and
``details["lr"]``); the divergence names its own.

``reset`` and ``jump`` are ``info`` (recorded: the next step says to check the resume); ``no_warmup`` with unstable
first steps is a ``warning``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding
from forensics.detect.health import HEALTH, judged_section, lr_series, lr_words, series
from forensics.detect.params import fraction, positive
from forensics.schema.steps import step_span

#: The fewest loss values the first steps are judged on (no warmup needs a log that holds the run's start).
MIN_EARLY = 20
#: A rate is steady when one logged step changes it by a ratio within [STEADY, 1/STEADY].
STEADY = 0.9


def schedule_problems(
    steps: np.ndarray, lr: np.ndarray, *, reset_share: float, jump: float, steady: float = STEADY
) -> list[dict[str, Any]]:
    """``reset`` and ``jump`` points of a logged schedule (module docstring), in step order: a change of one logged
    step where the step before it changed the rate by less than ``steady`` (a ratio within [steady, 1/steady])."""
    lr = np.asarray(lr, dtype=np.float64)
    n = len(lr)
    if n < 3:
        return []
    before, prev, cur = lr[:-2], lr[1:-1], lr[2:]
    ahead = lr[np.minimum(np.arange(2, n) + 5, n - 1)]
    # a warm-up from near zero, or a change already under way (NaN included): no jump of its own
    with np.errstate(invalid="ignore"):
        judged = ~(before <= 0) & ~(prev <= 0) & (steady * before <= prev) & (prev <= before / steady)
        reset = judged & (cur < reset_share * prev) & (ahead > cur)
        jumped = judged & ~reset & (cur > jump * prev)
    out: list[dict[str, Any]] = []
    for k in np.flatnonzero(reset | jumped):
        i = int(k) + 2
        out.append(
            {
                "problem": "reset" if reset[k] else "jump",
                "step": int(steps[i]),
                "before": float(lr[i - 1]),
                "after": float(lr[i]),
            }
        )
    return out


def unstable_start(loss: np.ndarray, *, early: int, unstable: float) -> int | None:
    """The index where the first steps' loss (a rolling median of 5) climbs highest above its lowest level so far,
    when that climb exceeds ``unstable`` of the first value (the first steps unstable: a healthy start only falls),
    else None."""
    head = pd.Series(loss[:early]).rolling(5, center=True, min_periods=1).median().to_numpy()
    if len(head) < 5:
        return None
    climb = head - np.minimum.accumulate(head)
    i = int(np.argmax(climb))
    return i if climb[i] > unstable * abs(float(head[0])) else None


class LrScheduleRule(Rule):
    """``lr_schedule`` findings: no warmup with unstable first steps, resets and jumps (module docstring).

    Parameters: ``warm_share`` 0.5, ``reset_share`` 0.1, ``jump`` 1.5, ``early_share`` 0.05, ``unstable`` 0.05.
    """

    name = "lr_schedule"
    section_name = HEALTH
    parameter_constraints = {
        "warm_share": fraction(),
        "reset_share": fraction(),
        "jump": positive(),
        "early_share": fraction(),
        "unstable": positive(),
    }

    def __init__(
        self,
        warm_share: float = 0.5,
        reset_share: float = 0.1,
        jump: float = 1.5,
        early_share: float = 0.05,
        unstable: float = 0.05,
    ) -> None:
        self.warm_share = warm_share
        self.reset_share = reset_share
        self.jump = jump
        self.early_share = early_share
        self.unstable = unstable

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        lr = lr_series(run)
        if lr is None or len(lr) < 3:
            self.section_ = judged_section(run, self.name, False, "no learning rate logged")
            return []
        self.section_ = judged_section(run, self.name, True, metric=lr.name)
        out: list[Finding] = []
        peak = float(lr.values.max())
        self._lr_at_events(run, list(found or []), lr, peak)
        offset = run.logged_offset
        loss = series(run, run.loss_key)
        starts = int(lr.steps[0]) <= max(10, int(self.early_share * int(lr.steps[-1])))  # the log holds the start
        at_peak = peak > 0 and lr.values[0] >= self.warm_share * peak
        if loss is not None and starts and len(loss) >= MIN_EARLY and at_peak:
            early = max(MIN_EARLY, int(self.early_share * len(loss)))
            i = unstable_start(loss.values, early=early, unstable=self.unstable)
            if i is not None:
                first, top = float(loss.values[0]), float(loss.values[i])
                at = step_span(int(loss.steps[i]), offset=offset)
                text = (
                    f"No warmup: the learning rate starts at {lr.values[0]:.2g} ({100 * lr.values[0] / peak:.0f}% "
                    f"of its peak {peak:.2g}) and {run.loss_key} climbed back up in the first steps "
                    f"(to {top:.4g} at {at}, from a first {first:.4g})."
                )
                out.append(
                    Finding(
                        kind="lr_schedule",
                        step=int(lr.steps[0]),
                        metric=lr.name,
                        value=float(lr.values[0]),
                        evidence=[text],
                        next_step="Warm the learning rate up (e.g. linearly over the first 1-5% of steps).",
                        details={
                            "problem": "no_warmup",
                            "step": int(lr.steps[0]),
                            "unstable_step": int(loss.steps[i]),
                            "lr": float(lr.values[0]),
                            "lr_peak": peak,
                            "support": {"warning": True},
                            "confidence": 0.8,
                        },
                        confidence=0.8,
                    )
                )
        for p in schedule_problems(lr.steps, lr.values, reset_share=self.reset_share, jump=self.jump):
            at = step_span(p["step"], offset=offset)
            how = "fell" if p["problem"] == "reset" else "jumped"
            text = f"The learning rate {how} from {p['before']:.2g} to {p['after']:.2g} at {at}" + (
                " (a fresh scheduler: warm-up again)." if p["problem"] == "reset" else "."
            )
            out.append(
                Finding(
                    kind="lr_schedule",
                    step=p["step"],
                    metric=lr.name,
                    value=p["after"],
                    baseline=p["before"],
                    evidence=[text],
                    next_step="If the run was resumed there, restore the scheduler's state with the "
                    "checkpoint (a fresh scheduler restarts the schedule); a planned warm "
                    "restart needs nothing.",
                    details={**p, "lr_peak": peak, "support": {}, "confidence": 0.6},
                    confidence=0.6,
                )
            )
        return out

    @staticmethod
    def _lr_at_events(run: RunTables, found: list[Finding], lr: Any, peak: float) -> None:
        """The learning rate at each loss spike and level shift, in its evidence and ``details["lr"]`` (in place):
        a spike at a peak rate or right after a jump reads differently from one at the end of the schedule."""
        for f in found:
            if f.kind not in ("spike", "level_shift") or f.metric != run.loss_key or "lr" in f.details:
                continue
            at = lr.at_or_before(int(f.step))
            if at is None:
                continue
            f.details["lr"] = at
            f.evidence.append(
                f"The learning rate at {step_span(int(f.step), offset=run.logged_offset)}: {lr_words(at, peak)}."
            )
