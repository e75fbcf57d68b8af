"""Are the metrics and the plan on the same steps? A check from the data, for sources that do not say how they count.

On a plan whose batches each draw from one length bucket (static, bucket-jumpy), the loss jumps with the bucket of
the batch that made it. The share of the detrended loss variance the batch's bucket explains is then sharp in the
offset: it peaks where metrics step ``s`` is paired with plan step ``s`` and falls off one step either side. So pair
each logged value with the tags of ``s - d`` for small offsets ``d``; when another offset explains clearly more than
the one used, the source counts otherwise (a log counting from 1 has its peak at ``d = 1``), and the finding names
the ``step_offset`` that fits. Sources whose convention was recognised or given are not second-guessed.
"""

from __future__ import annotations

import numpy as np

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import WARNING, Finding
from forensics.detect.params import fraction, positive
from forensics.detect.tags import BUCKET, StepLookup
from forensics.stats import detrend, detrended_variance_share


class AlignmentRule(Rule):
    """A ``misaligned_steps`` finding when another step offset fits the plan clearly better than the one used.

    Parameters: ``max_offset`` 3 (offsets tried either way), ``min_gain`` 1.5 (how many times more variance the
    best offset must explain than the one used), ``min_share`` 0.05 (the least share the best offset must explain:
    on a plan whose batches mix buckets nothing is sharp enough to say).
    """

    name = "alignment"
    parameter_constraints = {"max_offset": positive("int"), "min_gain": positive(), "min_share": fraction()}
    needs_plan = True

    def __init__(self, max_offset: int = 3, min_gain: float = 1.5, min_share: float = 0.05) -> None:
        self.max_offset = max_offset
        self.min_gain = min_gain
        self.min_share = min_share

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        self.warnings_: list[str] = []
        if run.tags is None or BUCKET not in run.tags.columns or run.steps_known:
            return []
        rows = run.written_rows(run.loss_key)
        steps = rows["step"].to_numpy(np.int64)
        values = rows[run.loss_key].to_numpy(np.float64, na_value=np.nan)
        if len(steps) < 50:
            return []
        lookup = StepLookup(run.tags)
        shares = {}
        residual = detrend(values)  # the trend is the values', whatever plan step they are paired with
        for d in range(-int(self.max_offset), int(self.max_offset) + 1):
            groups = lookup.groups(steps - d, BUCKET)
            share = detrended_variance_share(residual, groups)
            shares[d] = float(share) if share == share else 0.0
        best = max(shares, key=lambda d: (shares[d], -abs(d)))
        used = shares[0]
        if best == 0 or shares[best] < self.min_share or shares[best] < self.min_gain * max(used, 1e-12):
            return []
        self.warnings_.append(
            f"the metrics look {best:+d} step(s) off the plan: the batch's bucket explains "
            f"{shares[best]:.0%} of the loss variance at step_offset {best} against {used:.0%} as "
            f"logged; set step_offset = {best} (run.toml) or --step-offset {best}"
        )
        return [
            Finding(
                kind="misaligned_steps",
                step=int(steps[0]),
                end_step=int(steps[-1]),
                metric=run.loss_key,
                value=float(best),
                severity=WARNING,
                evidence=[
                    f"The batch's length bucket explains {shares[best]:.0%} of the detrended {run.loss_key} "
                    f"variance when metrics step s is paired with plan step s - {best}, against {used:.0%} as "
                    f"logged: the metrics look {best:+d} step(s) off the plan."
                ],
                next_step=f"Set step_offset = {best} (run.toml) or pass --step-offset {best}, then audit again.",
                details={
                    "shares": {str(k): v for k, v in shares.items()},
                    "step_offset": best,
                    "confidence": min(1.0, shares[best] / max(used, 1e-12) / (2 * self.min_gain)),
                },
            )
        ]
