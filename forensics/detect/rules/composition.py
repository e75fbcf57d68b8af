"""The batch-composition rule: the plan stage's gate verdict (findings.json ``plan``) as a finding.

The gate itself (pair retention, identical batches, coverage, and the limits derived for these samples) lives in
:mod:`forensics.plan.gate`: it is the plan stage's typed result. This rule files its verdict with the findings, so
that ``--fail-on static-plan``, the verdict and the report read it like any other kind.
"""

from __future__ import annotations

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import CRITICAL, Finding

#: The gate's failure kinds (``plan.failure_kinds``) in the words every output uses, so that the summary, the report,
#: the causes and the next steps say what the gate said.
KIND_WORDS = {
    "built_once": "built once and only reordered",
    "reseeded": "the same batches every epoch (re-seeded identically, or set_epoch never called)",
    "shuffle_then_sort": "regrouped from the same samples (a shuffle that a later sort undoes)",
    "regrouped": "mostly regrouped from the same samples",
    "identical_batches": "repeating batches exactly",
}
#: The fix for each kind.
KIND_FIX = {
    "reseeded": "seed the sampler per epoch (call set_epoch(epoch), or seed its generator with the epoch) so each "
    "epoch draws a fresh permutation",
    "shuffle_then_sort": "sort within mega-batches (HF group_by_length) or shuffle inside length buckets "
    "(bucketed_shuffle) instead of sorting the whole dataset",
}


def plan_words(gate: dict | None) -> str | None:
    """How the plan fails the gate, in words (None when it passes or was not checked)."""
    if not isinstance(gate, dict) or not gate.get("static"):
        return None
    kinds = [k for k in gate.get("failure_kinds") or [] if k in KIND_WORDS] or ["built_once"]
    return "; ".join(KIND_WORDS[k] for k in kinds)


def plan_fix_words(gate: dict | None) -> str:
    """The fix the gate's verdict calls for."""
    kinds = (gate or {}).get("failure_kinds") or []
    for k in kinds:
        if k in KIND_FIX:
            return KIND_FIX[k]
    return "rebuild batches every epoch (bucketed_shuffle: shuffle inside length buckets, then pack)"


class CompositionRule(Rule):
    """A ``static_plan`` finding when the gate says the batch composition does not vary across epochs."""

    name = "composition"
    needs_plan = True

    def __init__(self) -> None:
        pass

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        gate = run.sections.get("plan")
        if not isinstance(gate, dict) or not gate.get("static"):
            return []
        retention = [x for x in gate.get("pair_retention") or [] if x is not None]
        # the tags hold every step of the plan, also of one too large to load (whose ``plan`` stops at the metrics)
        steps = run.tags["step"] if run.tags is not None else run.plan["step"] if run.plan is not None else None
        return [
            Finding(
                kind="static_plan",
                step=int(steps.min()) if steps is not None else 0,
                end_step=int(steps.max()) if steps is not None else None,
                severity=CRITICAL,
                value=max(retention) if retention else None,
                evidence=[str(f) for f in gate.get("failures") or []],
                details={"pair_retention": retention, "confidence": 1.0},
            )
        ]
