"""The batch-composition rule: the plan stage's gate verdict (findings.json ``plan``) as a finding.

The gate itself (pair retention, identical batches, coverage, and the limits derived for these samples) lives in
:mod:`forensics.plan.gate`: it is the plan stage's typed result. This rule files its verdict with the findings, so
that ``--fail-on static-plan``, the verdict and the report read it like any other kind.
"""

from __future__ import annotations

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import CRITICAL, Finding


class CompositionRule(Rule):
    """A ``static_plan`` finding when the gate says the batch composition does not vary across epochs."""

    name = "composition"
    needs_plan = True

    def __init__(self) -> None:
        pass

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:  # type: ignore[override]
        self.reset()
        gate = run.sections.get("plan")
        if not isinstance(gate, dict) or not gate.get("static"):
            return []
        retention = [x for x in gate.get("pair_retention") or [] if x is not None]
        steps = run.plan["step"] if run.plan is not None else None
        return [Finding(kind="static_plan", step=int(steps.min()) if steps is not None else 0,
                        end_step=int(steps.max()) if steps is not None else None, severity=CRITICAL,
                        value=max(retention) if retention else None,
                        evidence=[str(f) for f in gate.get("failures") or []],
                        details={"pair_retention": retention, "confidence": 1.0})]
