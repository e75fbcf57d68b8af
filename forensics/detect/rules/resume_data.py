"""The data after a resume: samples a restarted run consumed a second time in one epoch, and those it never did.

A resume that does not restore the loader's position (HF ``ignore_data_skip``, a sampler state not saved, a loader
rebuilt from its start) replays the epoch from its first batches: the model sees those samples twice in the epoch
and, when the run's step budget ends the epoch early, never sees others. The loss then falls on the samples it has
just seen, which looks like a good resume. Only the plan shows it.

For each restart (the ``restart`` findings: where logging resumed), in the epoch ``E`` of the plan that holds the
restart step ``r``:

- ``repeated``: the plan rows of ``E`` at steps >= ``r`` whose sample was already consumed in ``E`` before ``r``
  (``repeated_steps``: the first and last step holding one);
- ``skipped``: the samples of the plan (every sample it consumes anywhere) never consumed in ``E``, beyond the
  run's usual number per epoch (the median over the other complete epochs that consumed no sample twice: a
  dropped last batch is not a resume's doing); ``None`` when ``E`` is the plan's last epoch and shorter than the
  others (the run stopped inside it).

``restart_step`` is the highest step logged before the restart (the restart finding's ``last_step``) and
``resumed_at`` the step the run resumed from. A finding needs ``repeated`` or ``skipped`` at or above
``max(min_samples, min_share x the plan's samples)``: a resume that restored the loader (repeated 0, skipped 0) is
quiet. ``loss_moved``: the mean loss over ``repeated_steps`` differs from the median of the ``baseline`` logged
values before ``r`` by more than ``z`` times the loss's noise (the robust SD of its step-to-step changes). Its
default severity is ``warning``, ``critical`` when ``repeated`` or ``skipped`` reaches ``critical_share`` of the
epoch's samples (so that ``--fail-on resume-data`` fails a run whose resume replayed a large part of an epoch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding
from forensics.detect.params import at_least, fraction, positive
from forensics.detect.rules.epoch_boundary import noise_sd
from forensics.schema import STEP
from forensics.schema.steps import step_span

SAMPLE_ID, EPOCH = "sample_id", "epoch"


@dataclass
class ResumeEffect:
    """What one restart did to its epoch's data (module docstring)."""

    epoch: int
    repeated: int
    skipped: int | None
    repeated_steps: list[int] | None
    epoch_samples: int


def resume_effect(
    plan: pd.DataFrame, restart_step: int, universe: int, usual_missing: int, complete: bool
) -> ResumeEffect | None:
    """Compare the rows of ``plan`` (one epoch: ``step``, ``sample_id``, ``epoch``) at and after ``restart_step``
    with those before it. ``universe``: distinct samples the whole plan consumes; ``usual_missing``: how many of them
    an epoch of this run misses anyway; ``complete``: whether the epoch ran to its end. None when the epoch has no
    rows before the restart (a resume at an epoch's start compares nothing)."""
    steps = plan[STEP].to_numpy(np.int64)
    ids = plan[SAMPLE_ID].to_numpy(np.int64)
    before = steps < restart_step
    if not before.any():
        return None
    again = (~before) & np.isin(ids, ids[before])
    repeated_steps = [int(steps[again].min()), int(steps[again].max())] if again.any() else None
    skipped = max(universe - len(np.unique(ids)) - usual_missing, 0) if complete else None
    return ResumeEffect(
        epoch=int(plan[EPOCH].iloc[0]),
        repeated=int(again.sum()),
        skipped=skipped,
        repeated_steps=repeated_steps,
        epoch_samples=universe,
    )


def severe(effect: ResumeEffect, critical_share: float) -> bool:
    """Whether the resume moved a large part of its epoch: repeated or skipped at ``critical_share`` of the epoch's
    samples (the model trained on a different epoch than the run says)."""
    return max(effect.repeated, effect.skipped or 0) >= critical_share * effect.epoch_samples


def moves_data(effect: ResumeEffect, min_samples: int, min_share: float) -> bool:
    """Whether the resume moved enough samples to report: repeated or skipped at ``max(min_samples, min_share x
    the epoch's samples)``."""
    limit = max(float(min_samples), min_share * effect.epoch_samples)
    return effect.repeated >= limit or (effect.skipped or 0) >= limit


class ResumeDataRule(Rule):
    """A ``resume_data`` finding per restart whose epoch consumed samples twice or missed some (module docstring).

    Parameters: ``min_samples`` 1 and ``min_share`` 0.01 (of the plan's samples: the least repeated or skipped
    count reported), ``baseline`` 20 (logged loss values before the restart), ``z`` 2.0 (noise units the loss over
    the repeated steps must move for ``loss_moved``), ``critical_share`` 0.25 (of the epoch's samples repeated or
    skipped: critical).
    """

    name = "resume_data"
    needs_plan = True
    parameter_constraints = {
        "min_samples": at_least(1, "int"),
        "min_share": fraction(),
        "baseline": at_least(2, "int"),
        "z": positive(),
        "critical_share": fraction(),
    }

    def __init__(
        self,
        min_samples: int = 1,
        min_share: float = 0.01,
        baseline: int = 20,
        z: float = 2.0,
        critical_share: float = 0.25,
    ) -> None:
        self.min_samples = min_samples
        self.critical_share = critical_share
        self.min_share = min_share
        self.baseline = baseline
        self.z = z

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        restarts = sorted({int(f.details["resumed_at"]): f for f in (found or []) if f.kind == "restart"}.items())
        plan = run.plan
        if not restarts or plan is None or EPOCH not in plan.columns or not len(plan):
            return []
        plan = plan[[STEP, EPOCH, SAMPLE_ID]]
        universe = int(plan[SAMPLE_ID].nunique())
        per_epoch = plan.groupby(EPOCH).agg(
            first=(STEP, "min"), last=(STEP, "max"), n=(SAMPLE_ID, "nunique"), rows=(SAMPLE_ID, "size")
        )
        length = per_epoch["last"] - per_epoch["first"] + 1
        complete = length >= length.max()
        out = []
        for resumed_at, restart in restarts:
            holds = per_epoch[(per_epoch["first"] <= resumed_at) & (per_epoch["last"] >= resumed_at)]
            if holds.empty:
                continue
            epoch = holds.index[0]
            # the usual misses come from the epochs that consumed no sample twice (a later epoch that a restart
            # shifted holds repeats and is no measure of them)
            others = per_epoch[complete & (per_epoch.index != epoch) & (per_epoch["n"] == per_epoch["rows"])]
            usual_missing = int(np.median(universe - others["n"])) if len(others) else 0
            effect = resume_effect(
                plan[plan[EPOCH] == epoch], resumed_at, universe, usual_missing, bool(complete.loc[epoch])
            )
            if effect is None or not moves_data(effect, self.min_samples, self.min_share):
                continue
            out.append(self._finding(run, restart, resumed_at, effect))
        return out

    def _loss_move(self, run: RunTables, resumed_at: int, span: list[int] | None) -> tuple[bool, float | None]:
        """Whether the loss over ``span`` moved beyond ``z`` noise units from before ``resumed_at``; its relative
        change."""
        if span is None or run.loss_key not in run.metrics.columns:
            return False, None
        rows = run.written_rows(run.loss_key)
        steps = rows[STEP].to_numpy(np.int64)
        values = rows[run.loss_key].to_numpy(np.float64, na_value=np.nan)
        before = values[steps < resumed_at][-int(self.baseline) :]
        during = values[(steps >= span[0]) & (steps <= span[1])]
        before, during = before[np.isfinite(before)], during[np.isfinite(during)]
        if len(before) < 2 or not len(during):
            return False, None
        level, mean = float(np.median(before)), float(np.mean(during))
        noise = noise_sd(values)
        change = (mean - level) / abs(level) if level else None
        return bool(noise > 0 and abs(mean - level) > self.z * noise), change

    def _finding(self, run: RunTables, restart: Finding, resumed_at: int, effect: ResumeEffect) -> Finding:
        moved, change = self._loss_move(run, resumed_at, effect.repeated_steps)
        span = effect.repeated_steps
        told = [
            f"after the restart at step {resumed_at} the loader replayed epoch {effect.epoch}"
            if effect.repeated
            else f"after the restart at step {resumed_at}, epoch {effect.epoch}"
        ]
        if effect.repeated:
            told.append(
                f"{effect.repeated} samples consumed a second time in that epoch "
                f"({step_span(span[0], span[1], offset=run.logged_offset)})"
            )
        if effect.skipped:
            told.append(f"{effect.skipped} never consumed in it")
        summary = ": ".join(told[:1]) + (": " + "; ".join(told[1:]) if len(told) > 1 else "")
        if moved and change is not None:
            summary += (
                f"; {run.loss_key} went {abs(change):.0%} {'below' if change < 0 else 'above'} its level "
                "before the restart while they were"
            )
        summary += "."
        return Finding(
            kind="resume_data",
            step=resumed_at,
            metric=run.loss_key,
            end_step=span[1] if span else resumed_at,
            confidence=0.95,
            evidence=[
                summary,
                "The resume did not restore the loader's position (HF ignore_data_skip, a sampler "
                "state not saved, a loader rebuilt from its start): the epoch started again.",
            ],
            next_step=(
                "Resume with the loader's state (HF: leave ignore_data_skip off; torchdata's "
                "StatefulDataLoader; save the sampler's state_dict with the checkpoint), then check the plan: "
                "forensics check-plan CASE."
            ),
            details={
                "restart_step": int(
                    restart.details.get("last_step") if restart.details.get("last_step") is not None else resumed_at
                ),
                "resumed_at": resumed_at,
                "epoch": effect.epoch,
                "repeated": effect.repeated,
                "skipped": effect.skipped,
                "repeated_steps": span,
                "loss_moved": moved,
                "loss_change": change,
                "epoch_samples": effect.epoch_samples,
                "support": {"critical": True} if severe(effect, self.critical_share) else {},
            },
        )
