"""View 4, causes: one row per cause; the selected one's card shows its evidence, the batch's samples (length,
cluster, an escaped text snippet), its recurrence in other epochs, the replay command and replay results.

Causes come from ``findings["causes"]`` (one per explanation); a findings file without them gives one row per spike
event. Live findings join the list as their own rows.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from forensics.dashboard.state import LiveRun
from forensics.dashboard.text import events, md, steps_text
from forensics.report.text import fmt_num, snippet
from forensics.schema import N_TOKENS, SAMPLE_ID, TEXT


def cause_rows(run: LiveRun) -> list[dict[str, Any]]:
    """``{id, kind, steps, metrics, suspect_samples, severity, confidence, summary, next_step, spikes}`` per cause."""
    findings = run.findings
    spikes = list(findings.get("spikes") or [])
    rows: list[dict[str, Any]] = []
    if isinstance(findings.get("causes"), list) and findings["causes"]:
        for c in findings["causes"]:
            mine = [s for s in spikes if s.get("cause") == c.get("id")] or \
                [s for s in spikes if int(s["step"]) in set(c.get("steps") or [])]
            rows.append({**c, "spikes": mine})
    else:
        for i, (first, also) in enumerate(events(findings), start=1):
            rows.append(_event_row(f"event-{i}", first, also))
    for i, n in enumerate(run.new_findings, start=1):
        if n.finding.get("kind") == "spike":
            rows.append(_event_row(f"live-{i}", n.finding, []))
    return rows


def _event_row(cid: str, first: dict[str, Any], also: list[dict[str, Any]]) -> dict[str, Any]:
    items = [first, *also]
    end = first.get("end_step") if first.get("end_step") is not None else first["step"]
    return {"id": cid, "kind": "batch" if first.get("suspect_samples") else "event",
            "steps": list(range(int(first["step"]), int(end) + 1)), "metrics": [s.get("metric") for s in items],
            "suspect_samples": list(first.get("suspect_samples") or []), "severity": first.get("severity"),
            "confidence": first.get("confidence"), "summary": (first.get("evidence") or [""])[0],
            "next_step": first.get("next_step"), "spikes": items}


def _table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame([{
        "id": r.get("id"), "kind": r.get("kind"), "severity": r.get("severity"),
        "confidence": fmt_num(r.get("confidence"), 2), "steps": steps_text(r.get("steps") or [], 6),
        "metrics": ", ".join(map(str, r.get("metrics") or [])),
        "suspects": ", ".join(str(int(s)) for s in (r.get("suspect_samples") or [])[:5]),
        "summary": snippet(r.get("summary"), 160),
    } for r in rows])


def batch_table(run: LiveRun, step: int, suspects: list[int]) -> pd.DataFrame | None:
    """The samples of ``step``'s batch, suspects first, with length, cluster and a text snippet (shown escaped)."""
    batch = run.step_batch(step)
    if not len(batch):
        return None
    rank = {int(s): i for i, s in enumerate(suspects)}
    batch = batch.assign(_order=[rank.get(int(s), len(rank)) for s in batch[SAMPLE_ID]]).sort_values("_order")
    cols = {SAMPLE_ID: "sample", N_TOKENS: "tokens", "bucket": "bucket", "cluster": "cluster",
            "cluster_name": "cluster name", "source": "source"}
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
    st.markdown(f"**{md(row.get('id'))}** · {md(row.get('kind'))} · {md(row.get('severity'))} · steps "
                f"{md(steps_text(row.get('steps') or []))}")
    if row.get("summary"):
        st.markdown(md(row["summary"]))
    evidence = [e for s in row.get("spikes") or [] for e in (s.get("evidence") or [])]
    if evidence:
        st.markdown("**Evidence**\n\n" + "\n".join(f"- {md(e)}" for e in evidence[:12]))
    spikes = row.get("spikes") or []
    peak = int(spikes[0].get("peak_step", spikes[0]["step"])) if spikes else \
        (int(row["steps"][0]) if row.get("steps") else None)
    if peak is not None:
        table = batch_table(run, peak, [int(s) for s in row.get("suspect_samples") or []])
        if table is not None:
            st.markdown(f"**The batch of step {peak}** ({len(table)} samples, suspects first):")
            st.table(table)
    rec = [r for s in spikes[:1] for r in (s.get("recurrence") or []) if isinstance(r, dict)]
    if rec:
        st.markdown("**The same batch in other epochs:**")
        st.table(pd.DataFrame([{"epoch": r.get("epoch"), "step": r.get("step"), "value": fmt_num(r.get("value")),
                                "baseline": fmt_num(r.get("baseline")), "ratio": fmt_num(r.get("ratio"), 3),
                                "spike again": "yes" if r.get("is_spike") else "no"} for r in rec]))
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
        st.table(pd.DataFrame([{"step": r.get("step"), "verdict": r.get("verdict"),
                                "checkpoint": r.get("checkpoint_step"), "logged": fmt_num(r.get("logged")),
                                "replayed": fmt_num(r.get("replayed"))} for r in results]))
        for r in results:
            for e in r.get("evidence") or []:
                st.markdown(f"- {md(e)}")
    elif run.replay is None and peak is not None:
        st.caption("No replay results yet (replay/replay.json).")


def render(run: LiveRun) -> None:
    rows = cause_rows(run)
    if not rows:
        st.markdown("No causes: no spike was found.")
        return
    st.dataframe(_table(rows), hide_index=True, width="stretch")
    labels = [f"{r.get('id')}: steps {steps_text(r.get('steps') or [], 4)}" for r in rows]
    picked = st.selectbox("Show the card of", range(len(rows)), format_func=lambda i: labels[i], key="cause_pick")
    card(run, rows[int(picked or 0)])
