"""The cause class of a re-run step (docs/concepts.md, "cause classes"): one decision function over the evidence
of a segment re-run, and the action each class implies.

The rules, in order (the first that holds decides; the order is the argument):

1. ``numerics``: non-finite gradients in the re-run. Nothing else can be judged from a step whose numbers
   overflowed, and no other class explains an overflow reproduced from a clean state.
2. no class (``None``): the step is no spike: neither its re-run loss nor its logged one exceeds the segment's
   baseline by more than the run's own noise allows (:mod:`forensics.replay.rerun_judge`). A class explains a spike;
   a clean run's largest steps have none to explain, and the signals below (a loss-scale drop, a jump in an update
   ratio) happen in healthy runs too, so none of them may class a step whose loss did not move.
3. ``numerics``: the logs show a loss-scale drop or a NaN iteration at or before the spike (the scaler met an
   overflow; :mod:`forensics.detect.evidence.log_numerics`).
4. ``hardware``: a crash line naming the hardware or the interconnect (ECC, NCCL) near the step.
5. ``hardware``: the re-run from the same state with the same batches does not reproduce the logged loss while two
   re-runs agree with each other (the replay itself is deterministic) and the model has no dropout (whose masks a
   re-run cannot be sure to draw again): what the run computed is not what its inputs imply.
6. ``unknown``: not reproduced, but the re-runs disagree or dropout is on: the miss proves nothing.
7. ``data``: reproduced, and the spike is gone with the suspect batch replaced by a same-bucket control.
8. ``optimizer``: reproduced, and the spike persists with the batch replaced (the state, not the batch, is bad).
9. ``optimizer``: a group's update/weight ratio, Adam's epsilon share or the largest g^2/v jumped *before* the step
   (the update that produced the step's state; a jump at the step itself is the batch's gradient, which says data),
   or the logs show the update norm or the params norm rising before it (the same evidence, as the trainer measured
   it: :mod:`forensics.detect.evidence.log_signals`).
10. ``numerics``: the largest attention logit or the logits' log-sum-exp grew past the segment's range, or the logs
   show the z loss (the logits' squared log-sum-exp) or the count of zero gradients rising at or before the step
   (weaker than the rules above: an optimizer step too large also grows the logits, and a bad batch raises the z
   loss with the loss, so it decides only when nothing else does).
11. ``unknown``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

CAUSE_CLASSES = ("data", "optimizer", "numerics", "hardware", "unknown")

#: The fix each class implies (one sentence, formatted with the step, checkpoint and group when known).
ACTIONS = {
    "data": "Skip the suspect samples (forensics skip {case} --format ids) and resume from checkpoint {checkpoint}.",
    "optimizer": "Lower the learning rate, raise Adam's epsilon or clip the update around step {step}{group}, and "
    "resume from checkpoint {checkpoint}.",
    "numerics": "Train in bf16 (or keep {group_or_model} in fp32) or set a loss-scale floor, and resume from "
    "checkpoint {checkpoint}.",
    "hardware": "Quarantine the node that ran step {step} and resume from checkpoint {checkpoint}.",
    "unknown": "Re-run the segment from checkpoint {checkpoint} on another device to tell hardware from the run's own "
    "nondeterminism.",
}


@dataclass(frozen=True)
class ClassEvidence:
    """What a segment re-run found about one step (``None``: the experiment could not run)."""

    nonfinite: bool = False
    #: Whether the step's loss (re-run or logged) is a spike at all; None: not measured (judged as one).
    spike: bool | None = None
    loss_scale_drop: bool = False
    nan_iterations: bool = False
    crash: str | None = None
    reproduced: bool | None = None
    deterministic: bool | None = None
    dropout: bool = False
    spike_gone: bool | None = None
    optimizer_jump: bool = False
    logits_past_range: bool = False
    #: The logged update norm or params norm rose before the step (findings.json ``logged_signals.optimizer``).
    logged_update_rise: bool = False
    #: The logged z loss or zero-gradient count rose at or before the step (``logged_signals.numerics``).
    logged_numerics_rise: bool = False


def cause_class(ev: ClassEvidence) -> tuple[str | None, str]:
    """``(class, rule)``: the class the evidence implies (module docstring; None: no spike to class) and why."""
    if ev.nonfinite:
        return "numerics", "non-finite gradients in the re-run"
    if ev.spike is False:
        return None, "the step is no spike (its loss is within the run's noise): nothing to class"
    if ev.loss_scale_drop or ev.nan_iterations:
        return "numerics", (
            "the logged loss scale dropped at or before the spike"
            if ev.loss_scale_drop
            else "the logs count a NaN iteration at or before the spike"
        )
    if ev.crash in ("ecc", "nccl"):
        return "hardware", f"a {ev.crash.upper()} crash line near the step"
    if ev.reproduced is False:
        if ev.deterministic is True and not ev.dropout:
            return "hardware", "the re-run from the same state and batches does not reproduce the logged loss"
        why = "dropout is on" if ev.dropout else "two re-runs disagree"
        return "unknown", f"not reproduced, but {why}: the miss proves nothing"
    if ev.reproduced is True and ev.spike_gone is True:
        return "data", "reproduced, and gone with the batch replaced by a same-bucket control"
    if ev.reproduced is True and ev.spike_gone is False:
        return "optimizer", "reproduced, and still there with the batch replaced by a same-bucket control"
    if ev.optimizer_jump:
        return "optimizer", "an update ratio, epsilon share or g^2/v jumped before the step"
    if ev.logged_update_rise:
        return "optimizer", "the logged update norm or params norm rose before the step"
    if ev.logits_past_range:
        return "numerics", "attention logits or the logits' log-sum-exp grew past the segment's range"
    if ev.logged_numerics_rise:
        return "numerics", "the logged z loss or count of zero gradients rose at or before the step"
    return "unknown", "no experiment decided"


def action(cls: str, step: int, checkpoint: int | None, group: str | None = None, case: str | None = None) -> str:
    """The one-sentence fix for class ``cls`` at ``step`` (``group``: the first group that moved, when known;
    ``case``: the case folder, so that a command in it runs as printed, else the placeholder ``CASE``)."""
    return ACTIONS[cls].format(
        case=shlex.quote(case) if case else "CASE",
        step=step,
        checkpoint=checkpoint if checkpoint is not None else "before it",
        group=f" (first in {group})" if group else "",
        group_or_model=group or "the model",
    )


#: How the verdict sentence tells the main cause's class (one clause, replaced when the class is told again).
VERDICT_CLAUSE = re.compile(r"; re-run: cause class \w+ \(.*\)\.$")


def verdict_with_class(verdict: str, cause: dict[str, Any]) -> str:
    """The verdict sentence with the main cause's class and action as its last clause (once, however often it is
    told; a sentence without a class clause when the cause has no class)."""
    base = VERDICT_CLAUSE.sub(".", verdict or "").rstrip()
    cls, act = cause.get("cause_class"), cause.get("action")
    if cls not in CAUSE_CLASSES or not base:
        return base
    what = str(act).rstrip(".") if act else "no action known"
    return base.rstrip(".") + f"; re-run: cause class {cls} ({what})."


def apply_cause_classes(findings: dict[str, Any], replay: dict[str, Any] | None) -> dict[str, Any]:
    """``findings`` (changed in place and returned) with each cause's ``cause_class`` and ``action`` taken from the
    re-run of its first re-run step (replay.json's ``rerun`` objects); causes no re-run reached are left as they are.
    The verdict sentence then names the main (first) cause's class and action when it has one."""
    reruns = {
        int(d["step"]): d["rerun"]
        for d in (replay or {}).get("steps") or []
        if isinstance(d, dict) and isinstance(d.get("rerun"), dict) and d.get("step") is not None
    }
    if not reruns:
        return findings
    for c in findings.get("causes") or []:
        if not isinstance(c, dict):
            continue
        steps = [int(s) for s in (c.get("events") or [])] + [int(s) for s in (c.get("steps") or [])]
        hit = next((reruns[s] for s in dict.fromkeys(steps) if s in reruns), None)
        if hit is not None and hit.get("cause_class") in CAUSE_CLASSES:
            c["cause_class"], c["action"] = hit["cause_class"], hit.get("action")
    causes = [c for c in findings.get("causes") or [] if isinstance(c, dict)]
    if causes and isinstance(findings.get("verdict"), str):
        findings["verdict"] = verdict_with_class(findings["verdict"], causes[0])
    return findings
