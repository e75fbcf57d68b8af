"""The causes view, under the curve: the causes as a sortable table beside the timeline of what was found while
watching, the harmful samples as a table (samples the run cannot tell apart in one row, a sample's text on demand),
and the card of the cause a row (or a click on a spike) picked: its evidence, the batch's samples (length, cluster,
an escaped text snippet), its recurrence in other epochs, the replay command and replay results.

Causes are :attr:`LiveRun.causes` (the audit's, and those found since, crashes and restarts included); a findings
file without causes gives one row per spike event, and live spikes join it as their own rows.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from forensics.dashboard.state import LiveRun
from forensics.dashboard.text import clock, events, md, steps_text
from forensics.dashboard.views import run as run_view
from forensics.report import overview
from forensics.report.rerun import rerun_entries, rerun_figure, rerun_sentence
from forensics.report.text import fmt_num, snippet
from forensics.schema import N_TOKENS, SAMPLE_ID, TEXT

PICK = "cause_pick"


def cause_rows(run: LiveRun) -> list[dict[str, Any]]:
    """``{id, kind, steps, metrics, suspect_samples, severity, confidence, summary, next_step, spikes}`` per cause,
    in the order of :func:`forensics.report.overview.cause_rows` (most severe first, then by first step)."""
    findings = run.current_findings()
    spikes = list(findings.get("spikes") or [])
    rows: list[dict[str, Any]] = []
    causes = [c for c in (run.causes or findings.get("causes") or []) if isinstance(c, dict)]
    if causes:
        order = {r["id"]: i for i, r in enumerate(overview.cause_rows(causes))}
        for c in sorted(causes, key=lambda c: order.get(str(c.get("id", "")), len(order))):
            mine = [s for s in spikes if s.get("cause") == c.get("id")] or [
                s for s in spikes if int(s["step"]) in set(c.get("steps") or [])
            ]
            rows.append({**c, "spikes": mine})
    else:
        for i, (first, also) in enumerate(events(run.findings), start=1):
            rows.append(_event_row(f"event-{i}", first, also))
        for i, n in enumerate(run.new_findings, start=1):
            if n.finding.get("kind") == "spike":
                rows.append(_event_row(f"live-{i}", n.finding, []))
    return rows


def _event_row(cid: str, first: dict[str, Any], also: list[dict[str, Any]]) -> dict[str, Any]:
    items = [first, *also]
    end = first.get("end_step") if first.get("end_step") is not None else first["step"]
    return {
        "id": cid,
        "kind": "batch" if first.get("suspect_samples") else "event",
        "steps": list(range(int(first["step"]), int(end) + 1)),
        "metrics": [s.get("metric") for s in items],
        "suspect_samples": list(first.get("suspect_samples") or []),
        "severity": first.get("severity"),
        "confidence": first.get("confidence"),
        "summary": (first.get("evidence") or [""])[0],
        "next_step": first.get("next_step"),
        "spikes": items,
    }


def cause_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The causes as the report's table shows them (severity as word and shape); the cause class and replay verdict
    columns only when some cause has one."""
    causes = [{k: v for k, v in r.items() if k != "spikes"} for r in rows]
    table = pd.DataFrame(
        [
            {overview.CAUSE_COLUMNS[k]: v for k, v in r.items() if k in overview.CAUSE_COLUMNS}
            for r in overview.cause_rows(causes)
        ],
        columns=list(overview.CAUSE_COLUMNS.values()),
    )
    for col in ("cause class", "replay verdict"):
        if not table[col].astype(bool).any():
            table = table.drop(columns=col)
    return table


def sample_table(run: LiveRun) -> pd.DataFrame:
    """The harmful samples, one row per group the run cannot tell apart, effect as a share."""
    rows = overview.sample_groups(run.harmful_samples)
    return pd.DataFrame(
        [{k: r[k] for k in overview.SAMPLE_COLUMNS} for r in rows], columns=list(overview.SAMPLE_COLUMNS)
    )


def timeline(run: LiveRun) -> pd.DataFrame:
    """What was found while watching, newest first: the time found, the step (as logged), severity, what."""
    items = [
        (
            n.found_at,
            n.cause.get("logged_steps") or n.cause.get("steps") or [],
            n.cause.get("severity"),
            f"cause {n.cause.get('id')}: {n.cause.get('kind')}",
        )
        for n in run.new_causes
    ]
    items += [
        (
            n.found_at,
            [n.finding.get("logged_step", n.finding.get("step"))],
            n.finding.get("severity"),
            f"{n.finding.get('kind')} {n.finding.get('metric') or ''}".strip(),
        )
        for n in run.new_findings
    ]
    items.sort(key=lambda t: (-t[0], -(max(t[1]) if t[1] else -1)))
    return pd.DataFrame(
        [
            {"found": clock(t), "step": steps_text(steps, 3), "severity": overview.severity_label(sev), "what": what}
            for t, steps, sev, what in items
        ],
        columns=["found", "step", "severity", "what"],
    )


def batch_table(run: LiveRun, step: int, suspects: list[int]) -> pd.DataFrame | None:
    """The samples of ``step``'s batch, suspects first, with length, cluster and a text snippet (shown escaped)."""
    batch = run.step_batch(step)
    if not len(batch):
        return None
    rank = {int(s): i for i, s in enumerate(suspects)}
    batch = batch.assign(_order=[rank.get(int(s), len(rank)) for s in batch[SAMPLE_ID]]).sort_values("_order")
    cols = {
        SAMPLE_ID: "sample",
        N_TOKENS: "tokens",
        "bucket": "bucket",
        "cluster": "cluster",
        "cluster_name": "cluster name",
        "source": "source",
    }
    out = pd.DataFrame({label: batch[c].to_numpy() for c, label in cols.items() if c in batch.columns})
    out.insert(1, "suspect", ["yes" if int(s) in rank else "" for s in batch[SAMPLE_ID]])
    if TEXT in batch.columns:
        out["text"] = [snippet(t, 120) for t in batch[TEXT]]
    return out.reset_index(drop=True)


def replay_results(run: LiveRun, steps: list[int]) -> list[dict[str, Any]]:
    """The entries of ``replay/replay.json`` for these steps."""
    wanted = set(int(s) for s in steps)
    return [r for r in ((run.replay or {}).get("steps") or []) if int(r.get("step", -1)) in wanted]


def card(run: LiveRun, row: dict[str, Any]) -> None:
    """One cause's card."""
    st.markdown(
        f"**{md(row.get('id'))}** · {md(row.get('kind'))} · {md(row.get('severity'))} · steps "
        f"{md(steps_text(row.get('steps') or []))}"
    )
    if row.get("summary"):
        st.markdown(md(row["summary"]))
    evidence = [e for s in row.get("spikes") or [] for e in (s.get("evidence") or [])]
    if evidence:
        st.markdown("**Evidence**\n\n" + "\n".join(f"- {md(e)}" for e in evidence[:12]))
    spikes = row.get("spikes") or []
    peak = (
        int(spikes[0].get("peak_step", spikes[0]["step"]))
        if spikes
        else (int(row["steps"][0]) if row.get("steps") else None)
    )
    if peak is not None:
        table = batch_table(run, peak, [int(s) for s in row.get("suspect_samples") or []])
        if table is not None:
            st.markdown(f"**The batch of step {peak}** ({len(table)} samples, suspects first):")
            st.table(table)
    rec = [r for s in spikes[:1] for r in (s.get("recurrence") or []) if isinstance(r, dict)]
    if rec:
        st.markdown("**The same batch in other epochs:**")
        st.table(
            pd.DataFrame(
                [
                    {
                        "epoch": r.get("epoch"),
                        "step": r.get("step"),
                        "value": fmt_num(r.get("value")),
                        "baseline": fmt_num(r.get("baseline")),
                        "ratio": fmt_num(r.get("ratio"), 3),
                        "spike again": "yes" if r.get("is_spike") else "no",
                    }
                    for r in rec
                ]
            )
        )
    if row.get("next_step"):
        st.markdown(f"**Next step:** {md(row['next_step'])}")
    tables = getattr(run, "run", None)
    if peak is not None and tables is not None and not row.get("replay"):
        from forensics.detect.causes.wording import replay_command

        command = replay_command(tables, [peak])  # only a command that can run on this case
        if command:
            st.code(command, language="bash")
        elif tables.replay_missing:
            st.caption(f"A replay would confirm it but needs {tables.replay_missing}.")
    results = replay_results(run, row.get("steps") or [])
    if results:
        st.markdown("**Replay results** (replay/replay.json):")
        st.table(
            pd.DataFrame(
                [
                    {
                        "step": r.get("step"),
                        "verdict": r.get("verdict"),
                        "checkpoint": r.get("checkpoint_step"),
                        "logged": fmt_num(r.get("logged")),
                        "replayed": fmt_num(r.get("replayed")),
                    }
                    for r in results
                ]
            )
        )
        for r in results:
            for e in r.get("evidence") or []:
                st.markdown(f"- {md(e)}")
        rerun_section(row, results)
    elif run.replay is None and peak is not None:
        st.caption("No replay results yet (replay/replay.json).")


#: Re-run figures per card at most (the cause's first replayed steps), as in the report.
MAX_RERUN_FIGURES = 3


def rerun_section(row: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """The cause's segment re-runs (``forensics replay --rerun``), as the report's cause card shows them: the class
    and action sentence, and the per-group update/weight ratio and grad norm around the spike."""
    entries = rerun_entries(row, {int(r["step"]): r for r in results})[:MAX_RERUN_FIGURES]
    if not entries:
        return
    st.markdown("**Re-run from the checkpoint** (per parameter group):")
    for e in entries:
        st.markdown(md(rerun_sentence(e)))
        st.plotly_chart(rerun_figure(e), width="stretch", key=f"rerun_{row.get('id')}_{int(e['step'])}")


def render(run: LiveRun) -> None:
    """The causes table beside the timeline, the harmful samples, then the card of the picked cause."""
    rows = cause_rows(run)
    left, right = st.columns([3, 1])
    with left:
        if rows:
            table = cause_table(rows)
            st.markdown(f"**Causes** ({len(rows)}; sort by a column's header, select a row to open its card)")
            event = st.dataframe(
                table,
                hide_index=True,
                width="stretch",
                key="cause_table",
                on_select="rerun",
                selection_mode="single-row",
            )
            chosen = list(getattr(getattr(event, "selection", None), "rows", None) or [])
            if chosen and chosen != st.session_state.get("cause_table_last"):
                st.session_state["cause_table_last"] = chosen
                st.session_state[PICK] = str(table.iloc[chosen[0]]["id"])
        else:
            st.markdown("No causes: no spike was found.")
    with right:
        st.markdown("**Found while watching**")
        found = timeline(run)
        if len(found):
            st.dataframe(found, hide_index=True, width="stretch", key="timeline")
        else:
            st.caption("Nothing new since the page opened.")
    if run.harmful_samples:
        samples_section(run)
    if not rows:
        return
    ids = [str(r.get("id")) for r in rows]
    clicked = st.session_state.pop(run_view.CLICKED, None)
    if clicked in ids:
        st.session_state[PICK] = clicked
    if st.session_state.get(PICK) not in ids:
        st.session_state[PICK] = ids[0]
    labels = {
        str(r.get("id")): f"{r.get('id')}: {r.get('kind')}, steps {steps_text(r.get('steps') or [], 4)}" for r in rows
    }
    picked = st.selectbox("Card of", ids, format_func=lambda i: labels[i], key=PICK)
    card(run, rows[ids.index(picked)] if picked in ids else rows[0])


def samples_section(run: LiveRun) -> None:
    """The harmful samples table and, on demand, one sample's text (shown as plain text, never as Markdown)."""
    table = sample_table(run)
    st.markdown(
        f"**Harmful samples** ({len(run.harmful_samples)} in {len(table)} rows: samples always consumed "
        "together share a row, the run cannot tell them apart)"
    )
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        key="samples_table",
        column_config={
            "effect": st.column_config.NumberColumn(
                "effect",
                format="percent",
                help="mean share of the step loss above what the step's trend and tags expect",
            ),
            "q": st.column_config.NumberColumn("q", format="%.2g", help="false-discovery q value"),
        },
    )
    ids = [int(h["sample_id"]) for h in run.harmful_samples]
    shown = st.selectbox(
        "Text of sample",
        [None, *ids],
        key="sample_text_pick",
        format_func=lambda i: "choose a sample" if i is None else str(i),
    )
    if shown is not None:
        text = None
        if run.samples is not None and TEXT in run.samples.columns:
            hit = run.samples.loc[run.samples[SAMPLE_ID] == int(shown), TEXT]
            text = None if hit.empty else hit.iloc[0]
        st.text(text if isinstance(text, str) else f"sample {shown}: no text in the samples table")
