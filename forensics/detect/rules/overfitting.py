"""Overfitting: the held-out loss turns up while the training loss keeps falling (docs/reference/findings.md).

The eval loss (run.toml ``eval_loss_key``, else found as the loss key is: ``run.eval_loss_key``) is read where it was
written. Its minimum is the run's best point (``best_step``: keep the checkpoint there). The run overfits when, after
that minimum, at least ``min_after`` evals follow, the median of the last ``min_after`` of them lies above the minimum
by more than ``rise`` of it and ``z`` eval-noise SDs, and the training loss over the same stretch kept falling (its
median over the last evals' steps below its median around the best step). ``onset_step`` is the eval step of the
minimum: where the eval loss turns up (within one eval interval of it by construction).

A rise of both losses is no overfitting (the divergence rule's, when it lasts); a run without an eval loss is not
judged (findings.json ``health``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding
from forensics.detect.health import HEALTH, diff_noise, judged_section, series
from forensics.detect.params import fraction, positive
from forensics.schema.steps import step_span

#: The fewest eval values the rule judges.
MIN_EVALS = 5


def find_overfitting(
    steps: np.ndarray,
    values: np.ndarray,
    train_steps: np.ndarray,
    train: np.ndarray,
    *,
    rise: float,
    z: float,
    min_after: int,
) -> dict[str, Any] | None:
    """The eval minimum and the rise after it (module docstring), or None."""
    b = int(np.argmin(values))
    after = len(values) - b - 1
    if after < min_after:
        return None
    tail = values[-min_after:]
    noise = diff_noise(values)
    level = float(np.median(tail))
    margin = max(rise * abs(float(values[b])), z * noise)
    if level <= values[b] + margin:
        return None
    lo, hi = int(steps[max(b - 1, 0)]), int(steps[min(b + 1, len(steps) - 1)])
    around = train[(train_steps >= lo) & (train_steps <= hi)]
    late = train[train_steps >= steps[-min_after]]
    if not len(around) or not len(late) or np.median(late) >= np.median(around):
        return None
    return {
        "best_index": b,
        "best": float(values[b]),
        "level": level,
        "margin": margin,
        "noise": noise,
        "train_at_best": float(np.median(around)),
        "train_late": float(np.median(late)),
    }


class OverfittingRule(Rule):
    """An ``overfitting`` finding when the eval loss turns up while the training loss falls (module docstring).

    Parameters: ``rise`` 0.02 (the least rise of the late evals above the minimum, a share of it), ``z`` 4 (and in
    eval-noise SDs), ``min_after`` 3 (the evals after the minimum that must show it).
    """

    name = "overfitting"
    section_name = HEALTH
    parameter_constraints = {"rise": fraction(), "z": positive(), "min_after": positive("int")}

    def __init__(self, rise: float = 0.02, z: float = 4.0, min_after: int = 3) -> None:
        self.rise = rise
        self.z = z
        self.min_after = min_after

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        ev = series(run, run.eval_loss_key)
        train = series(run, run.loss_key)
        if ev is None or train is None or len(ev) < MIN_EVALS:
            why = "no eval loss logged" if ev is None else f"fewer than {MIN_EVALS} eval values"
            self.section_ = judged_section(run, self.name, False, why if train is not None else "no loss")
            return []
        self.section_ = judged_section(run, self.name, True, metric=ev.name)
        hit = find_overfitting(
            ev.steps, ev.values, train.steps, train.values, rise=self.rise, z=self.z, min_after=self.min_after
        )
        if hit is None:
            return []
        best = int(ev.steps[hit["best_index"]])
        keep = None
        if run.checkpoints:
            kept = [(s, p) for s, p in run.checkpoints if s <= best + 1]  # checkpoint N: after N updates
            keep = kept[-1] if kept else None
        where = step_span(best, offset=run.logged_offset)
        summary = (
            f"{ev.name} turned up after its minimum {hit['best']:.4g} at {where} (to {hit['level']:.4g} over "
            f"the last {self.min_after} evals) while {run.loss_key} kept falling ({hit['train_at_best']:.4g} "
            f"-> {hit['train_late']:.4g}): overfitting."
        )
        keep_words = f"checkpoint {keep[1]} (step {keep[0]})" if keep else f"the model of {where}"
        next_step = (
            f"Keep {keep_words}; stop earlier, or add data or regularisation (weight decay, dropout) "
            "before training this long."
        )
        details = {
            "onset_step": best,
            "best_step": best,
            "metric": ev.name,
            "best_value": round(hit["best"], 6),
            "level": round(hit["level"], 6),
            "train_at_best": round(hit["train_at_best"], 6),
            "train_late": round(hit["train_late"], 6),
            "best_checkpoint": keep[1] if keep else None,
            "support": {"moved": True},
            "confidence": 0.8,
        }
        return [
            Finding(
                kind="overfitting",
                step=best,
                metric=ev.name,
                end_step=int(ev.steps[-1]),
                value=round(hit["level"], 6),
                baseline=round(hit["best"], 6),
                evidence=[summary],
                next_step=next_step,
                details=details,
                confidence=0.8,
            )
        ]
