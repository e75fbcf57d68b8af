"""The registry of finding kinds: what each kind of finding is called, where it goes and how it is told.

Every finding has a ``kind``, and every kind registers here: the findings.json section it fills (``spikes``,
``nonfinite``, ... as DESIGN.md names them; a kind without one appears in ``findings`` only), its title, the
``--fail-on`` name that counts it, its line in the terminal summary and the dashboard, and its card in the report. A
run-level section (the batch plan's gate, the oscillation measure, the forgetting signature) registers the same way,
as a kind whose ``object_section`` is the section. The summary, the report, ``--fail-on`` and the verdict read this
registry and name no kind; adding a rule is its module plus one :func:`register_kind` (and
:func:`forensics.detect.rules.register_rule`).

Cards and summary lines are given as ``"module:function"`` paths (or callables), so this module imports no report
code: ``card(items, context) -> str | list[str]`` with the kind's findings (or ``[section]`` for a run-level one) and
a :class:`forensics.report.cards.CardContext`; ``summary(section) -> list[str]`` gives a run-level section's lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: A finding as written to findings.json (a dict).
FindingDict = dict[str, Any]
#: The built-in kinds' cards and summary lines.
_CARDS = "forensics.report.cards.builtin"
_LINES = "forensics.report.summary_lines"


@dataclass(frozen=True)
class FindingKind:
    """How one kind of finding is filed and told.

    - ``section``: the findings.json list it fills (None: only ``findings``); ``object_section``: a run-level kind
      whose section is one object (``plan``, ``oscillation``, ``forgetting``), drawn even when no finding says so.
    - ``fail_on``: the ``--fail-on`` name (critical findings of this kind count); None: not a gate.
    - ``line``: one finding in words (default: kind, step, metric and value); ``card``: its report card
      (``"module:function"`` or a callable; None: a table of the kind's findings); ``summary``: a run-level
      section's lines in the terminal summary.
    - ``told_by``: the run-level section whose card and lines tell this kind (its findings are not drawn again).
    """

    kind: str
    title: str
    section: str | None = None
    object_section: bool = False
    fail_on: str | None = None
    line: Callable[[FindingDict], str] | None = None
    card: str | Callable[..., Any] | None = None
    summary: str | Callable[[FindingDict], list[str]] | None = None
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


def run_level_kinds() -> list[FindingKind]:
    """The kinds whose section is one run-level object, in registration order."""
    return [k for k in KINDS.values() if k.object_section]


def _steps(f: FindingDict, limit: int = 6) -> str:
    steps = list((f.get("details") or {}).get("steps") or [])
    return ", ".join(map(str, steps[:limit])) + (" ..." if len(steps) > limit else "")


def _nonfinite_line(f: FindingDict) -> str:
    value = f.get("value_text") or f.get("value")
    return f"{f.get('metric')} is {value} at step {f.get('step')} ({f.get('severity')})"


def _level_shift_line(f: FindingDict) -> str:
    new_level = f.get("details", {}).get("new_level")
    return f"level shift of {f.get('metric')} from step {f.get('step')} (new level {new_level})"


def _misaligned_line(f: FindingDict) -> str:
    return f"metrics look {int(f.get('value') or 0):+d} step(s) off the plan: " + (f.get("evidence") or [""])[0]


register_kind(FindingKind("spike", "spike", section="spikes", fail_on="spike", card=f"{_CARDS}:spike_cards"))
register_kind(FindingKind("nonfinite", "non-finite value", section="nonfinite", fail_on="nonfinite",
                          line=_nonfinite_line, card=f"{_CARDS}:nonfinite_cards"))
register_kind(FindingKind("level_shift", "level shift", section="level_shifts", line=_level_shift_line))
register_kind(FindingKind("expected_for_bucket", "expected for its bucket", section="expected_for_bucket"))
register_kind(FindingKind("misaligned_steps", "metrics off the plan", line=_misaligned_line))
register_kind(FindingKind("recurrence", "batch recurrence", section="recurrence"))
register_kind(FindingKind("harmful_samples", "harmful samples", fail_on="samples",
                          line=lambda f: str((f.get("evidence") or [""])[0])))
register_kind(FindingKind("grad_norm_spikes", "grad-norm spikes the loss did not follow", fail_on="grad-norm",
                          line=lambda f: (f"{(f.get('details') or {}).get('count')} grad-norm spikes the loss did not "
                                          f"follow (steps {_steps(f)})")))
register_kind(FindingKind("plan", "batch composition", section="plan", object_section=True,
                          card=f"{_CARDS}:plan_cards", summary=f"{_LINES}:plan_lines"))
register_kind(FindingKind("static_plan", "static batch composition", fail_on="static-plan", told_by="plan"))
register_kind(FindingKind("oscillation", "oscillation", section="oscillation", object_section=True,
                          fail_on="oscillation", card=f"{_CARDS}:oscillation_cards",
                          summary=f"{_LINES}:oscillation_lines"))
register_kind(FindingKind("forgetting", "forgetting", section="forgetting", object_section=True,
                          summary=f"{_LINES}:forgetting_lines"))


def _health_line(f: FindingDict) -> str:
    return str((f.get("evidence") or [f.get("kind")])[0]) + f" ({f.get('severity')})"


register_kind(FindingKind("divergence", "divergence", fail_on="divergence", line=_health_line))
register_kind(FindingKind("overfitting", "overfitting", fail_on="overfitting", line=_health_line))
register_kind(FindingKind("plateau", "plateau / not learning", fail_on="plateau", line=_health_line))
register_kind(FindingKind("lr_schedule", "learning-rate schedule", fail_on="lr-schedule", line=_health_line))
register_kind(FindingKind("restart", "restart", fail_on="restart",
                          line=lambda f: f"restart: step {f['details']['last_step']} -> "
                                         f"{f['details']['resumed_at']} ({f.get('severity')})"))
register_kind(FindingKind("throughput", "throughput slowdown", fail_on="throughput", line=_health_line))
register_kind(FindingKind("memory", "memory growth", fail_on="memory", line=_health_line))
register_kind(FindingKind("epoch_boundary", "spikes at each epoch's start", fail_on="epoch-boundary",
                          line=_health_line))
register_kind(FindingKind("resume_data", "data replayed or skipped after a resume", fail_on="resume-data",
                          line=_health_line))
register_kind(FindingKind("rank_drift", "a rank drifting from the others", fail_on="rank-drift", line=_health_line))
register_kind(FindingKind("crash", "crash", fail_on="crash",
                          line=lambda f: f"crash ({f['details']['what']}) after step {f.get('step')}: "
                                         f"{f['details']['line']}"))
