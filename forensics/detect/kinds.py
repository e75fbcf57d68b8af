"""The registry of finding kinds: what each kind of finding is called, where it goes and how it is told.

Every finding has a ``kind``. The kind's entry says which findings.json section it fills (``spikes``, ``nonfinite``,
... as DESIGN.md names them; a kind without one appears in ``findings`` only), its title, the ``--fail-on`` name that
counts it, how one finding reads in a line (the terminal summary, the dashboard), how several read in the verdict, and
optionally an HTML card of its own (the report draws a generic card otherwise). The summary, the report, ``--fail-on``
and the verdict read this registry; none of them names a kind. Adding a rule is its module plus one
:func:`register_kind` (and :func:`forensics.detect.rules.register_rule`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: A finding as written to findings.json (a dict).
FindingDict = dict[str, Any]


@dataclass(frozen=True)
class FindingKind:
    """How one kind of finding is filed and told.

    - ``section``: the findings.json list it fills (None: only ``findings``); ``object_section``: a run-level kind
      whose one finding's ``details`` are the section object (``oscillation``, ``plan``, ``forgetting``).
    - ``fail_on``: the ``--fail-on`` name (critical findings of this kind count); None: not a gate.
    - ``line``: one finding in words (default: kind, step, metric and value); ``verdict``: the findings of this kind
      in one phrase for the verdict (None: not mentioned there); ``card``: an HTML card for the report (None: generic).
    """

    kind: str
    title: str
    section: str | None = None
    object_section: bool = False
    fail_on: str | None = None
    line: Callable[[FindingDict], str] | None = None
    verdict: Callable[[list[FindingDict]], str | None] | None = None
    card: Callable[[list[FindingDict]], str] | None = None
    #: The findings.json section whose own block tells this kind (its findings are not listed again).
    told_by: str | None = None

    def describe(self, finding: FindingDict) -> str:
        """One finding in one line."""
        if self.line is not None:
            return self.line(finding)
        where = f"step {finding.get('step')}"
        if finding.get("end_step") not in (None, finding.get("step")):
            where = f"steps {finding.get('step')}-{finding.get('end_step')}"
        what = f" {finding['metric']}" if finding.get("metric") else ""
        value = finding.get("value")
        shown = f" = {value:.4g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
        return f"{self.title}: {where}{what}{shown}"


KINDS: dict[str, FindingKind] = {}


def register_kind(kind: FindingKind) -> FindingKind:
    """Add (or replace) a kind; returns it."""
    KINDS[kind.kind] = kind
    return kind


def kind_of(name: str) -> FindingKind:
    """The registered kind, or a plain one named after ``name`` (a finding of an unknown kind is still told)."""
    return KINDS.get(name) or FindingKind(kind=name, title=name.replace("_", " "))


def fail_kinds() -> dict[str, str]:
    """``--fail-on`` name -> kind, for every registered kind that is a gate."""
    return {k.fail_on: k.kind for k in KINDS.values() if k.fail_on}


def _steps(items: list[FindingDict], limit: int = 6) -> str:
    steps = sorted({int(f["step"]) for f in items if f.get("step") is not None})
    return ", ".join(map(str, steps[:limit])) + (" ..." if len(steps) > limit else "")


def _nonfinite_line(f: FindingDict) -> str:
    value = f.get("value_text") or f.get("value")
    return f"{f.get('metric')} is {value} at step {f.get('step')} ({f.get('severity')})"


def _nonfinite_verdict(items: list[FindingDict]) -> str | None:
    critical = [f for f in items if f.get("severity") == "critical"]
    if critical:
        metrics = sorted({str(f.get("metric")) for f in critical})
        return f"{len(critical)} non-finite value{'s' if len(critical) != 1 else ''} in {', '.join(metrics)}"
    return None


def _level_shift_line(f: FindingDict) -> str:
    return f"level shift of {f.get('metric')} from step {f.get('step')} (new level {f.get('details', {}).get('new_level')})"


register_kind(FindingKind("spike", "spike", section="spikes", fail_on="spike"))
register_kind(FindingKind("nonfinite", "non-finite value", section="nonfinite", fail_on="nonfinite",
                          line=_nonfinite_line, verdict=_nonfinite_verdict))
register_kind(FindingKind("level_shift", "level shift", section="level_shifts", line=_level_shift_line))
register_kind(FindingKind("expected_for_bucket", "expected for its bucket", section="expected_for_bucket"))
register_kind(FindingKind("static_plan", "static batch composition", fail_on="static-plan", told_by="plan",
                          verdict=lambda items: "batch composition is static across epochs"))
register_kind(FindingKind("oscillation", "oscillation", fail_on="oscillation", told_by="oscillation",
                          verdict=lambda items: f"the loss oscillates (steps {_steps(items)})"))
register_kind(FindingKind("misaligned_steps", "metrics off the plan",
                          line=lambda f: (f"metrics look {int(f.get('value') or 0):+d} step(s) off the plan: "
                                          + (f.get('evidence') or [''])[0])))
