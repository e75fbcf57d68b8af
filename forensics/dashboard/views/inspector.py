"""View 5, the step inspector: type a step, see its batch (samples, lengths, clusters, text), its tags and its
neighbours' metrics."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from forensics.dashboard.state import LiveRun
from forensics.dashboard.views.causes import batch_table
from forensics.schema import STEP

NEIGHBOURS = 5


def neighbours(run: LiveRun, step: int, k: int = NEIGHBOURS) -> pd.DataFrame:
    """Metrics (and bucket / cluster) of the ``k`` steps each side of ``step``."""
    steps = run.metrics[STEP].to_numpy(np.int64)
    i = int(np.searchsorted(steps, step))
    rows = run.metrics.iloc[max(0, i - k) : i + k + 1]
    if run.tags is not None:
        cols = [c for c in (STEP, "bucket", "cluster", "epoch") if c in run.tags.columns]
        rows = rows.merge(run.tags[cols], on=STEP, how="left")
    return rows.reset_index(drop=True)


def render(run: LiveRun) -> None:
    if not len(run.metrics):
        st.info("No rows yet.")
        return
    if "inspect_step" not in st.session_state:
        spikes = run.current_findings().get("spikes") or []
        st.session_state["inspect_step"] = (
            int(spikes[0].get("peak_step", spikes[0]["step"])) if spikes else int(run.metrics[STEP].iloc[-1])
        )
    step = int(st.number_input("Step", step=1, key="inspect_step"))
    if run.tags is not None:
        row = run.tags[run.tags[STEP] == step]
        if len(row):
            st.markdown(f"**Tags of step {step}**")
            st.table(row.T.rename(columns={row.index[0]: "value"}).astype(str))
        else:
            st.caption(f"step {step} has no tags (not in the plan)")
    spikes = [
        s
        for s in run.current_findings().get("spikes") or []
        if int(s["step"]) <= step <= int(s.get("end_step") if s.get("end_step") is not None else s["step"])
    ]
    suspects = [int(x) for s in spikes for x in (s.get("suspect_samples") or [])]
    table = batch_table(run, step, suspects)
    if table is not None:
        st.markdown(f"**Batch of step {step}** ({len(table)} samples)")
        st.table(table)
    elif run.plan is None:
        st.caption("No plan: the batch of a step needs plan.parquet and samples.parquet.")
    st.markdown("**Neighbours**")
    st.dataframe(neighbours(run, step), hide_index=True, width="stretch")
