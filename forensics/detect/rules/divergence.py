"""Divergence: the loss leaves its trend for good, and where to resume (docs/reference/findings.md).

A spike comes back; a divergence does not. The loss is read as a centred rolling median (``window_share`` of its
values, at least 5), which a one-step spike does not move, against its best level so far (the running minimum of that
median). The run diverges at the first step from which the median stays more than ``rise`` (a share of the best
level) and more than ``z`` per-step noise SDs above the best level for at least ``hold_share`` of the run (at least
``min_hold`` steps), or to the end of a run that went on that long: a rise that returns inside that window is a spike
(or the planned rise of a warm restart: its LR restart brings the loss back), and a run whose log ends inside it is not
judged a divergence yet. The onset is the last step before that excursion where the median was still within a
quarter of the rise of its best level.

The finding (``critical`` by default, a cause of its own) names ``onset_step``, ``resume_step`` /
``resume_checkpoint`` (the last checkpoint at least max(10 steps, 1% of the run) before the onset, else the last
healthy step: :func:`forensics.detect.health.resume_point`), and the ``lr`` and ``grad_norm`` at the onset. It takes
the place of the spike rule's ``level_shift`` of the loss (and of the grad norm that went with it) for the same rise
(those findings are dropped from the list the rules share), so the rise is told once; so are the loss's spikes after
the onset that stay within ``rise`` of the diverged level: a causal baseline still at the old level calls the new
level a spike, and a spike well above the new level is still told.
"""

from __future__ import annotations

import math
import shlex
from typing import Any

import numpy as np

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding
from forensics.detect.health import HEALTH, diff_noise, judged_section, lr_series, lr_words, resume_point, series
from forensics.detect.params import fraction, positive
from forensics.schema.steps import step_span
from forensics.stats import rolling_median

#: The fewest finite loss values the rule judges.
MIN_VALUES = 20


def _within_diverged_level(f: Finding, loss_key: str | None, onset: int, level: float, rise: float) -> bool:
    """A loss spike after the onset whose peak is no more than ``rise`` above the diverged level: the divergence."""
    value = f.value if isinstance(f.value, (int, float)) else None
    return (
        f.kind == "spike"
        and f.metric == loss_key
        and f.step > onset
        and value is not None
        and math.isfinite(value)
        and value <= level * (1 + rise)
    )


def smoothed(values: np.ndarray, share: float) -> np.ndarray:
    """The centred rolling median over ``share`` of the values (at least 5, odd)."""
    w = max(5, int(round(share * len(values))) | 1)
    return rolling_median(values, w)


def find_divergence(
    steps: np.ndarray, values: np.ndarray, *, rise: float, z: float, hold: int, window_share: float
) -> dict[str, Any] | None:
    """The lasting rise of ``values`` (module docstring) as ``{onset_index, cross_index, best, level, noise}``, or
    None. ``hold``: the steps the rise must last (or the run must go on for, elevated)."""
    m = smoothed(values, window_share)
    best = np.minimum.accumulate(m)
    noise = diff_noise(values)
    margin = np.maximum(rise * np.abs(best), z * noise)
    above = m > best + margin
    n = len(m)
    i = 0
    while i < n:
        if not above[i]:
            i += 1
            continue
        j = i
        while j < n and (m[j] > best[i] + margin[i]):  # against the best level before the rise
            j += 1
        lasted = int(steps[j - 1] - steps[i]) if j > i else 0
        if lasted >= hold:
            low = best[i] + margin[i] / 4.0
            k = i
            while k > 0 and m[k - 1] > low:
                k -= 1
            return {
                "onset_index": k,
                "cross_index": i,
                "best": float(best[i]),
                "level": float(np.median(m[i:j])),
                "noise": noise,
            }
        i = j
    return None


class DivergenceRule(Rule):
    """A ``divergence`` finding when the loss rises for good (module docstring).

    Parameters: ``rise`` 0.2 (the least lasting rise, a share of the best level so far), ``z`` 6 (and in per-step
    noise SDs), ``hold_share`` 0.05 (how long it must last, a share of the run; at least ``min_hold`` 50 steps),
    ``window_share`` 0.01 (the rolling median's window, a share of the values).
    """

    name = "divergence"
    section_name = HEALTH
    parameter_constraints = {
        "rise": positive(),
        "z": positive(),
        "hold_share": fraction(),
        "min_hold": positive("int"),
        "window_share": fraction(),
    }

    def __init__(
        self,
        rise: float = 0.2,
        z: float = 6.0,
        hold_share: float = 0.05,
        min_hold: int = 50,
        window_share: float = 0.01,
    ) -> None:
        self.rise = rise
        self.z = z
        self.hold_share = hold_share
        self.min_hold = min_hold
        self.window_share = window_share

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        loss = series(run, run.loss_key)
        if loss is None or len(loss) < MIN_VALUES:
            self.section_ = judged_section(run, self.name, False, f"fewer than {MIN_VALUES} finite loss values")
            return []
        span = int(loss.steps[-1] - loss.steps[0] + 1)
        hold = max(self.min_hold, int(math.ceil(self.hold_share * span)))
        hit = find_divergence(
            loss.steps, loss.values, rise=self.rise, z=self.z, hold=hold, window_share=self.window_share
        )
        self.section_ = judged_section(run, self.name, True, hold_steps=hold)
        if hit is None:
            return []
        onset = int(loss.steps[hit["onset_index"]])
        last_healthy = int(loss.steps[max(hit["onset_index"] - 1, 0)])
        resume = resume_point(run, onset, last_healthy)
        lr = lr_series(run)
        lr_at = lr.at_or_before(onset) if lr is not None else None
        lr_peak = float(lr.values[lr.steps <= onset].max()) if lr is not None and (lr.steps <= onset).any() else None
        grad = series(run, run.grad_norm_key)
        grad_at = grad.at_or_before(onset) if grad is not None else None
        grad_before = (
            float(np.median(grad.values[grad.steps < onset]))
            if grad is not None and (grad.steps < onset).any()
            else None
        )
        if found is not None:  # the same rise, told once: the divergence takes the place of the loss's level shift
            trained = {run.loss_key, run.grad_norm_key, *run.analysed}
            found[:] = [
                f
                for f in found
                if not (f.kind == "level_shift" and f.metric in trained and f.step >= onset - hold)
                and not _within_diverged_level(f, run.loss_key, onset, hit["level"], self.rise)
            ]
        offset = run.logged_offset
        where = step_span(onset, offset=offset)
        lr_text = lr_words(lr_at, lr_peak)
        summary = (
            f"{run.loss_key} diverged from {where}: from {hit['best']:.4g} to about {hit['level']:.4g}, and did "
            f"not come back" + (f" ({lr_text})" if lr_text else "") + "."
        )
        evidence = [summary]
        if grad_at is not None and grad_before:
            evidence.append(f"grad norm {grad_at:.4g} at the onset against a median {grad_before:.4g} before it.")
        details: dict[str, Any] = {
            "onset_step": onset,
            "resume_step": resume["resume_step"],
            "resume_checkpoint": resume["resume_checkpoint"],
            "lr": lr_at,
            "lr_peak": lr_peak,
            "grad_norm": grad_at,
            "grad_norm_before": grad_before,
            "best_level": round(hit["best"], 6),
            "level": round(hit["level"], 6),
            "noise": round(hit["noise"], 6),
            "hold_steps": hold,
            "checkpoint_margin": resume["checkpoint_margin"],
            "checkpoints_known": resume["checkpoints_known"],
            "support": {
                "moved": True,
                "grad_norm": bool(grad_at is not None and grad_before and grad_at > 2 * grad_before),
            },
            "confidence": 0.9,
        }
        return [
            Finding(
                kind="divergence",
                step=onset,
                metric=run.loss_key,
                end_step=int(loss.steps[-1]),
                value=round(hit["level"], 6),
                baseline=round(hit["best"], 6),
                evidence=evidence,
                next_step=self._next_step(run, onset, hold, resume),
                details=details,
                confidence=0.9,
            )
        ]

    @staticmethod
    def _next_step(run: RunTables, onset: int, hold: int, resume: dict[str, Any]) -> str:
        offset = run.logged_offset
        if resume["resume_checkpoint"]:
            where = f"checkpoint {shlex.quote(resume['resume_checkpoint'])} (step {resume['resume_step']})"
        else:
            none = "none known before it" if resume["checkpoints_known"] else "no checkpoint known in this case"
            where = f"the last healthy {step_span(resume['resume_step'], offset=offset)} ({none})"
        return (
            f"Resume from {where} with the learning rate lowered (e.g. halved), or skip the data window "
            f"{step_span(onset, onset + hold, offset=offset)} when the rise follows one batch."
        )
