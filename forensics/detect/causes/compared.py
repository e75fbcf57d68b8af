"""A comparison with other runs as evidence of the causes: ``forensics compare CASE OTHER --json CASE/compare.json``
leaves the comparison in a case folder it compared (``this_run`` names the case among the runs), and the next audit
of that case reads it here.

For each spike of this run at a compared position (the same step, or where this run consumed that data):

- **recurring** (the same data spiked in another run too): a second line of evidence that the data causes it
  (``support["compare"] = "recurring"``: :mod:`forensics.detect.causes.severity` counts it with the grad norm, the
  recurrence and the content);
- **unique** where another run *held* the same data without spiking (``"unique_held"``): the data alone does not make
  it spike, so one line of evidence less; a spike unique only because no other run says anything is left alone;
- **vanished** (another order moved the samples apart): the order or the composition, not the samples alone; no
  change.

The causes then take the most severe of their findings and are ranked again, as after a replay. Applying it twice
gives what applying it once gives.
"""

from __future__ import annotations

from typing import Any

from forensics.detect.causes.severity import most_severe, severity_of

#: The file ``forensics compare`` writes into each case folder it compared.
COMPARE_FILE = "compare.json"
#: ``support["compare"]`` values that change a severity.
RECURRING, UNIQUE_HELD = "recurring", "unique_held"


def compared_steps(doc: dict[str, Any] | None) -> dict[int, str]:
    """``{step of this run: evidence}`` from a case's compare.json (``recurring`` or ``unique_held``)."""
    if not isinstance(doc, dict) or not doc.get("this_run"):
        return {}
    me = str(doc["this_run"])
    out: dict[int, str] = {}
    for p in doc.get("spikes") or []:
        if not isinstance(p, dict) or me not in (p.get("runs") or []):
            continue
        states = p.get("states") or {}
        at = ((p.get("data_position") or {}).get("consumed_at") or {}).get(me, p.get("step"))
        if isinstance(at, list):  # consumed at several steps (or none): the anchor's step
            at = at[0] if len(at) == 1 else p.get("step")
        if not isinstance(at, int):
            continue
        if p.get("class") == "recurring":
            out[at] = RECURRING
        elif p.get("class") == "unique" and any(s == "held" for name, s in states.items() if name != me):
            out[at] = UNIQUE_HELD
    return out


def apply_compare(findings: dict[str, Any], doc: dict[str, Any] | None) -> dict[str, Any]:
    """``findings`` (findings.json, changed in place and returned) with the comparison's classes as evidence."""
    from forensics.detect.causes.replayed import members_of, renumber

    evidence = compared_steps(doc)
    causes = [c for c in findings.get("causes") or [] if isinstance(c, dict)]
    if not evidence or not causes:
        return findings
    changed = False
    for cid, mine in members_of(findings).items():
        hits = [f for f in mine if f.get("kind") == "spike" and _step_of(f, evidence) is not None]
        for f in hits:
            support = f.setdefault("details", {}).setdefault("support", {})
            support["compare"] = evidence[_step_of(f, evidence)]
            f["severity"] = severity_of("spike", support, str(f.get("severity")))
        if not hits:
            continue
        cause = next((c for c in causes if str(c.get("id")) == cid), None)
        if cause is None:
            continue
        cause["compare"] = sorted({evidence[_step_of(f, evidence)] for f in hits})
        cause["severity"] = most_severe(str(f["severity"]) for f in mine)
        for f in mine:  # as everywhere: a cause's findings take its severity
            f["severity"] = cause["severity"]
        changed = True
    if changed:
        renumber(findings, causes)
        from forensics.detect.causes.verdict import facts, verdict

        findings["verdict"] = verdict(findings, (findings.get("run") or {}).get("loss_key"))
        findings["verdict_facts"] = facts(findings)
    return findings


def _step_of(f: dict[str, Any], evidence: dict[int, str]) -> int | None:
    """The compared step a spike finding stands at (its start or its peak)."""
    for key in ("step", "peak_step"):
        s = f.get(key)
        if isinstance(s, int) and s in evidence:
            return s
    return None
