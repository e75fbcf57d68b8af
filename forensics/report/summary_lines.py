"""The terminal summary's lines for the run-level sections, as the registry of finding kinds names them
(:mod:`forensics.detect.kinds`: ``summary = "forensics.report.summary_lines:<function>"``).

Each takes its section object from findings.json and returns ``(heading, lines)``: plain text (the summary escapes
it), the first line beside the heading.
"""

from __future__ import annotations

from typing import Any

from forensics.detect.rules.composition import plan_words
from forensics.report.text import fmt_share


def oscillation_lines(osc: dict[str, Any]) -> tuple[str, list[str]]:
    if not osc:
        return "oscillation", []
    share = osc.get("bucket_variance_share")
    text = (
        ("detected" + (f" (period {osc['period']} steps)" if osc.get("period") else ""))
        if osc.get("detected")
        else "not detected"
    )
    extra = (
        f"; {fmt_share(share)} of the detrended loss variance is explained by the bucket" if share is not None else ""
    )
    return "oscillation", [text + extra]


def plan_lines(plan: Any) -> tuple[str, list[str]]:
    heading = "batch composition"
    if not isinstance(plan, dict):
        return heading, ["no plan: give --plan and --samples to name batches and samples"]
    if plan.get("static") is None:
        return heading, [f"not checked ({plan.get('note', '')})"]
    retention = ", ".join(f"{x:.0%}" for x in plan.get("pair_retention") or [])
    words = plan_words(plan)
    lines = [f"{words or 'varies across epochs'}; pair retention per epoch pair: {retention}"]
    lines += [f"- {f}" for f in plan.get("failures") or []]
    lines += [f"note: {n}" for n in plan.get("notes") or []]
    return heading, lines


def forgetting_lines(forgetting: Any) -> tuple[str, list[str]]:
    if not isinstance(forgetting, dict):
        return "forgetting", []
    sentence = forgetting.get("verdict") or (forgetting.get("evidence") or [None])[0]
    return "forgetting", [str(sentence)] if sentence else []
