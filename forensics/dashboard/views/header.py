"""The top of the page, always shown as plain text: the run's state, every cause and every new finding with its steps.

Causes and new findings must be readable without opening a table or a tab: they are Markdown lines
(dataset text escaped by :func:`~forensics.dashboard.text.md`).
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from forensics.dashboard.state import LiveRun
from forensics.dashboard.text import age, clock, events, md, spike_line, steps_text
from forensics.report.text import fmt_num


def cause_lines(findings: dict[str, Any]) -> list[str]:
    """One line per cause: ``findings["causes"]`` when the audit wrote them, else one line per spike event."""
    causes = findings.get("causes")
    if isinstance(causes, list) and causes:
        lines = []
        for c in causes:
            steps = c.get("steps") or []
            where = f"steps {steps_text(steps)}" if steps else "the whole run"
            conf = f" (confidence {fmt_num(c.get('confidence'), 2)})" if c.get("confidence") is not None else ""
            metrics = ", ".join(map(str, c.get("metrics") or []))
            sus = list(c.get("suspect_samples") or [])
            lines.append(" · ".join(x for x in (
                f"{c.get('id', '?')}: {c.get('kind', '')}", f"{c.get('severity', '')}{conf}", where, metrics,
                str(c.get("summary") or ""),
                ("suspects " + ", ".join(str(int(i)) for i in sus[:5])) if sus else "") if x))
        return lines
    lines = []
    for first, also in events(findings):
        line = spike_line(first)
        if also:
            line += " · also " + ", ".join(f"{s.get('metric')} {fmt_num(s.get('value'))}" for s in also)
        lines.append(line)
    for n in (findings.get("nonfinite") or [])[:20]:
        lines.append(f"non-finite at step {n.get('step')}: {n.get('metric')} = {n.get('value')}")
    return lines


def status_line(run: LiveRun, interval_s: float, paused: bool) -> tuple[str, bool]:
    """``(text, stale)``: the steps read, the age of the newest one, and whether the run stopped writing."""
    if not len(run.metrics):
        return "waiting for the first rows (a run that just started writes none yet)", False
    lag = run.lag_seconds()
    stale = run.stale(interval_s)
    n = len(run.metrics)
    text = f"{n:,} steps read, newest step {run.last_step:,}, written {age(lag)} ago"
    text += " · stopped writing" if stale else ""
    text += " · refresh paused" if paused else f" · refreshing every {interval_s:g} s"
    return text, stale


def render(run: LiveRun, interval_s: float, paused: bool) -> None:
    """The page's head: status, verdict, causes, new findings (newest first, with the time each was found)."""
    status, stale = status_line(run, interval_s, paused)
    (st.warning if stale else st.caption)(md(status))
    if run.findings.get("verdict"):
        st.markdown(f"**Verdict:** {md(run.findings['verdict'])}")
    lines = cause_lines(run.findings)
    label = "Causes" if run.findings.get("causes") else "Spikes and causes"
    if lines:
        st.markdown(f"**{label}** ({len(lines)}, from {md(run.findings_source)}):\n\n"
                    + "\n".join(f"- {md(x)}" for x in lines[:50]))
    elif run.started:
        st.markdown(f"**{label}:** no spike found ({md(run.findings_source)}).")
    if run.harmful_samples:
        rows = [f"sample {h.get('sample_id')}: {h.get('reason')}" for h in run.harmful_samples[:10]]
        more = len(run.harmful_samples) - len(rows)
        st.markdown(f"**Harmful samples** ({len(run.harmful_samples)}, raised the loss each time they were consumed"
                    f"{f'; {more} more in findings.json' if more > 0 else ''}):\n\n"
                    + "\n".join(f"- {md(x)}" for x in rows))
    if run.new_causes:
        new = [f"{clock(n.found_at)} · {n.cause.get('kind')} cause, steps {steps_text(n.cause.get('steps') or [], 6)}"
               f" ({n.cause.get('severity')}): {n.cause.get('summary')}" for n in reversed(run.new_causes)]
        st.markdown(f"**New causes** ({len(new)}, found while watching):\n\n"
                    + "\n".join(f"- {md(x)}" for x in new[:50]))
    if run.new_findings:
        new = [f"{clock(n.found_at)} · {spike_line(n.finding)}" for n in reversed(run.new_findings)]
        st.markdown(f"**New findings** ({len(new)}, found while watching):\n\n"
                    + "\n".join(f"- {md(x)}" for x in new[:50]))
    for w in run.warnings[-3:]:
        st.caption(md(w))
