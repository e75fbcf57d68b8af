"""View 3, composition: pair retention per epoch pair and identical batches (the report's composition figure), the
composition gate's verdict, and the what-if throughput of the batching fixes."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from forensics.dashboard.state import LiveRun
from forensics.dashboard.text import md
from forensics.report import composition_figure
from forensics.report.text import fmt_num, fmt_share


def gate_line(pf: dict | None) -> str:
    """The gate's verdict in one sentence."""
    if not isinstance(pf, dict):
        return "No plan: batch composition across epochs was not checked."
    if pf.get("static") is None:
        return f"Batch composition not checked: {pf.get('note') or 'the plan has a single epoch'}."
    pr = [fmt_share(x) for x in pf.get("pair_retention") or []]
    verdict = (
        "FAILED: batch composition is static across epochs"
        if pf.get("static")
        else "passed: batch composition varies across epochs"
    )
    return f"Composition gate {verdict} (pair retention per epoch pair: {', '.join(pr) or '–'})."


def whatif_table(whatif: dict | None) -> pd.DataFrame | None:
    """One row per batching strategy: throughput against the sorted packer and padding efficiency."""
    rows = (whatif or {}).get("strategies") or []
    if not rows:
        return None
    return pd.DataFrame(
        [
            {
                "strategy": r.get("name"),
                "builder": r.get("builder"),
                "tokens/s": fmt_num(r.get("tokens_per_s"), 3),
                "vs sorted": fmt_share(r.get("throughput_vs_sorted")),
                "padding efficiency": fmt_share(r.get("padding_efficiency")),
                "steps/epoch": fmt_num(r.get("steps_per_epoch")),
            }
            for r in rows
        ]
    )


def render(run: LiveRun) -> None:
    pf = run.findings.get("plan")
    st.markdown(md(gate_line(pf)))
    if (isinstance(pf, dict) and pf.get("pair_retention")) or run.plan is not None:
        st.plotly_chart(composition_figure(run.findings, run.plan), width="stretch", key="fig_composition")
    table = whatif_table(run.findings.get("whatif"))
    if table is not None:
        st.markdown("**What-if throughput of the fixes** (same samples, each batching strategy):")
        st.table(table)
