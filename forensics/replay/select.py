"""Which steps a replay takes: the causes of findings.json with a batch, most urgent first, and a clean control step.

- **Causes** (``--from-findings``, ``audit --replay``): every cause whose events are steps with a batch (kinds
  :data:`BATCH_KINDS`: a batch or its samples explain it, a spike with no batch evidence, NaN/inf), in findings.json's
  order (most severe, then most confident, first), at most ``max_causes``; each replays its first
  :data:`EVENTS_PER_CAUSE` events (a cause's later events are the same samples coming back). A ``samples`` cause (the
  run-level harmful samples) replays instead the steps that consumed most of its samples (findings.json
  ``harmful_samples`` rows' ``steps``; ties: the earlier step): its events are only its first step and the batch
  causes it absorbed, while on a length-grouped run the steps holding the most corrupted samples are in it alone.
  Run-level causes (the
  grad-norm spikes the loss did not follow, a static plan, oscillation, run health) have no batch of their own.
- **Known spikes** are never chosen as controls: every step of a cause and of a spike's window.
- **A clean control step**: the same-bucket step nearest to the first suspect that is no known spike, shares no sample
  with a suspect and has a checkpoint at or before it, replayed like a suspect (``role = "control"``): its verdict
  (``normal`` when the verdicts discriminate) stands beside the suspects'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Cause kinds whose events are steps with a batch to replay.
BATCH_KINDS = ("batch", "samples", "event", "nonfinite")
#: Events replayed per cause (its first ones; the rest are the same samples again).
EVENTS_PER_CAUSE = 3


@dataclass
class ReplayGroup:
    """Steps replayed together (one cause's events), and the cause they stand for (None: steps given by hand)."""

    steps: list[int]
    cause: str | None = None
    kind: str | None = None
    key: str | None = None
    skipped: list[int] = field(default_factory=list)


def read_findings(root: Path | None) -> dict[str, Any] | None:
    """``CASE/findings.json`` when there is one (bad JSON is bad input: one line)."""
    path = root / "findings.json" if root is not None else None
    if path is None or not path.is_file():
        return None
    from forensics.schema.case import read_case_json

    return read_case_json(path, "findings file", "causes", "`forensics audit`")


def cause_groups(findings: dict[str, Any], has_batch, max_causes: int | None = None) -> list[ReplayGroup]:
    """One group per replayable cause, most urgent first (module docstring); ``has_batch(step)`` says whether the
    plan holds the step. Causes none of whose events has a batch are left out."""
    out = []
    for c in findings.get("causes") or []:
        if not isinstance(c, dict) or c.get("kind") not in BATCH_KINDS:
            continue
        events = [int(s) for s in (c.get("events") or c.get("steps") or [])]
        if c.get("kind") == "samples":
            events = most_harmful_steps(findings, c) or events
        steps = [s for s in events if has_batch(s)]
        if not steps:
            continue
        out.append(
            ReplayGroup(
                steps[:EVENTS_PER_CAUSE],
                str(c.get("id")),
                str(c.get("kind")),
                c.get("key"),
                [s for s in events if not has_batch(s)],
            )
        )
        if max_causes is not None and len(out) >= max_causes:
            break
    return out


def most_harmful_steps(findings: dict[str, Any], cause: dict[str, Any]) -> list[int]:
    """The steps of a ``samples`` cause, those that consumed most of its samples first (ties: the earlier step), from
    findings.json's ``harmful_samples`` rows (empty when it has none for the cause's samples)."""
    mine = {int(i) for i in cause.get("suspect_samples") or []}
    counts: dict[int, int] = {}
    for row in findings.get("harmful_samples") or []:
        if isinstance(row, dict) and row.get("sample_id") is not None and int(row["sample_id"]) in mine:
            for s in row.get("steps") or []:
                counts[int(s)] = counts.get(int(s), 0) + 1
    return sorted(counts, key=lambda s: (-counts[s], s))


def spike_steps(findings: dict[str, Any] | None) -> list[int]:
    """The peak steps of findings.json's spikes (an older findings.json without causes): loss spikes first."""
    if not findings:
        return []
    key = (findings.get("run") or {}).get("loss_key")
    spikes = [s for s in findings.get("spikes", []) if s.get("peak_step") is not None]
    steps = sorted({int(s["peak_step"]) for s in spikes if s.get("metric") == key})
    return steps or sorted({int(s["peak_step"]) for s in spikes})


def known_spikes(findings: dict[str, Any] | None) -> set[int]:
    """Every step of a cause or inside a spike's window: never a control."""
    if not findings:
        return set()
    out: set[int] = set()
    for c in findings.get("causes") or []:
        if isinstance(c, dict) and c.get("kind") not in ("grad_norm", "plan", "oscillation"):
            out |= {int(s) for s in c.get("steps") or []}
    for s in findings.get("spikes") or []:
        lo = int(s.get("step", 0))
        hi = int(s.get("end_step") if s.get("end_step") is not None else lo)
        out |= set(range(lo, hi + 1))
    return out


def control_step(
    suspect: int, suspects: set[int], index: Any, has_checkpoint_before, logged: dict[int, float], exclude: set[int]
) -> int | None:
    """The clean control step for ``suspect`` (module docstring), or None when the plan holds none."""
    bucket = index.bucket_of.get(suspect)
    taken = {i for s in suspects for i in index.samples_of.get(s, [])}
    near = {t for s in suspects for t in (s - 1, s, s + 1)}
    for t in sorted(index.samples_of, key=lambda t: (abs(t - suspect), t)):
        if t in near or t in exclude or index.bucket_of.get(t) != bucket or t not in logged:
            continue
        if taken.intersection(index.samples_of[t]) or not has_checkpoint_before(t):
            continue
        return t
    return None
