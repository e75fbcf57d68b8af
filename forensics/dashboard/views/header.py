"""The top of the page: the status strip (the run's state now, its newest row and that row's age, throughput, causes
by severity, the last new cause), then every cause and every new finding as one compact plain-text line each.

Causes and new findings be readable without opening a table or a tab: the lines are Markdown
(dataset text escaped by :func:`~forensics.dashboard.text.md`); the table below the curve holds their details. The
strip is the HTML the report's top shows too (:mod:`forensics.report.overview`, every text escaped there).
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from forensics.dashboard.state import LiveRun
from forensics.dashboard.text import age, clock, events, md, spike_line, steps_text
from forensics.live.run import STALE_AFTER_S
from forensics.report.overview import Strip, severity_label, strip_html, strip_of, strip_text
from forensics.report.text import fmt_num

#: Streamlit's default top padding (6 rem) pushes the curve below a laptop's fold; the strip replaces the title.
_COMPACT_CSS = (
    "<style>[data-testid='stMainBlockContainer']{padding-top:2.6rem;padding-bottom:2rem}"
    "[data-testid='stMarkdownContainer'] ul{margin-bottom:0}</style>"
)


def cause_lines(
    causes: list[dict[str, Any]], findings: dict[str, Any], new_at: dict[str, float] | None = None
) -> list[str]:
    """One short line per cause (``C1: batch · ■ critical · steps 254 and 754``, ``· new at HH:MM:SS`` when found
    while watching); without causes, one line per spike event of ``findings`` and per non-finite value."""
    new_at = new_at or {}
    if causes:
        lines = []
        for c in causes:
            steps = c.get("logged_steps") or c.get("steps") or []
            where = f"steps {steps_text(steps)}" if steps else "the whole run"
            line = f"{c.get('id', '?')}: {c.get('kind', '')} · {severity_label(c.get('severity'))} · {where}"
            if str(c.get("key")) in new_at:
                line += f" · new at {clock(new_at[str(c.get('key'))])}"
            lines.append(line)
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


def new_finding_line(run: LiveRun) -> str | None:
    """Every finding made while watching, in one line: ``New findings (4, found while watching): step 254
    train/loss ■ critical, ...`` (oldest first)."""
    if not run.new_findings:
        return None
    items = [
        f"step {n.finding.get('logged_step', n.finding.get('step'))} {n.finding.get('kind')} "
        f"{n.finding.get('metric') or ''} {severity_label(n.finding.get('severity'))}".replace("  ", " ")
        for n in run.new_findings
    ]
    return f"New findings ({len(items)}, found while watching): " + ", ".join(items)


def stale_after(interval_s: float) -> str:
    """How old the newest row may get before the run counts as stopped (LiveRun's rule), in words."""
    return age(max(STALE_AFTER_S, 10 * interval_s))


def status_line(run: LiveRun, interval_s: float, paused: bool) -> str:
    """The steps read and whether the page refreshes (the strip's last cell)."""
    if not len(run.metrics):
        return "waiting for the first rows (a run that just started writes none yet)"
    refresh = "refresh paused" if paused else f"refreshing every {interval_s:g} s"
    return f"{len(run.metrics):,} steps read · {refresh}"


def strip(run: LiveRun, interval_s: float, paused: bool = False) -> Strip:
    """The strip's content for this run now: the state counts a run that stopped writing as a warning."""
    last = run.new_causes[-1] if run.new_causes else None
    last_new = (
        None
        if last is None
        else (clock(last.found_at), f"{last.cause.get('id')} {last.cause.get('kind')} · {last.cause.get('severity')}")
    )
    return strip_of(
        run.causes,
        run.metrics,
        stale=run.stale(interval_s),
        age_s=run.lag_seconds(),
        stale_after=stale_after(interval_s),
        last_new=last_new,
        note=status_line(run, interval_s, paused),
    )


def strip_words(run: LiveRun, interval_s: float, paused: bool = False) -> str:
    """The strip as one line of plain text (what the HTML shows)."""
    s = strip(run, interval_s, paused)
    return " │ ".join(strip_text(s, age(s.age_s)))


def render(run: LiveRun, interval_s: float, paused: bool) -> None:
    """The page's head: the strip, the verdict, a line per cause and the new findings."""
    st.markdown(_COMPACT_CSS, unsafe_allow_html=True)
    if len(run.metrics):
        s = strip(run, interval_s, paused)
        st.markdown(strip_html(s, age(s.age_s)), unsafe_allow_html=True)
    else:
        st.caption(md(status_line(run, interval_s, paused)))
    if run.findings.get("verdict"):
        st.markdown(f"**Verdict:** {md(run.findings['verdict'])}")
    new_at = {n.key: n.found_at for n in run.new_causes}
    lines = cause_lines(run.causes or list(run.findings.get("causes") or []), run.findings, new_at)
    label = "Causes" if (run.causes or run.findings.get("causes")) else "Spikes and causes"
    block = []
    if lines:
        block.append(f"**{label}** ({len(lines)}):  \n" + "  \n".join(md(x) for x in lines))
    elif run.started:
        block.append(f"**{label}:** no spike found ({md(run.findings_source)}).")
    line = new_finding_line(run)
    if line:
        block.append(md(line))
    if block:  # caption-sized, so that the curve stays above the fold
        st.caption("  \n".join(block))
    if run.warnings:
        with st.sidebar.expander(f"Data warnings ({len(run.warnings)})"):
            for w in run.warnings[-20:]:
                st.caption(md(w))
