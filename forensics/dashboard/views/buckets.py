"""View 2, buckets and clusters: loss per length bucket and per content cluster with the share of variance each
explains, and the cluster mix per step over time (the report's figures)."""

from __future__ import annotations

import math

import streamlit as st

from forensics.dashboard.state import LiveRun
from forensics.dashboard.text import md
from forensics.report import bucket_loss_figure, cluster_loss_figure, cluster_mix_figure
from forensics.report.text import fmt_share
from forensics.schema import CLUSTER


def render(run: LiveRun) -> None:
    tags = run.tags
    if tags is None or not len(tags):
        st.info("No plan: buckets and clusters need the batch plan (plan.parquet and samples.parquet in the case).")
        return
    osc = run.findings.get("oscillation") or {}
    shares = []
    if osc.get("bucket_variance_share") is not None:
        shares.append(f"length buckets explain {fmt_share(osc['bucket_variance_share'])} of the loss's jumpiness")
    if osc.get("cluster_variance_share") is not None:
        shares.append(f"content clusters {fmt_share(osc['cluster_variance_share'])}")
    if shares:
        st.markdown(md("; ".join(shares) + "."))
    for name, fig in figures(run).items():
        st.plotly_chart(fig, width="stretch", key=f"fig_{name}")


def figures(run: LiveRun) -> dict:
    """The view's figures, rebuilt when the run grew by 1% or found something new: per-bin medians and shares
    barely move with fewer rows, and rebuilding them costs about a second on a 1M-step run."""
    n = len(run.metrics)
    key = (id(run), int(math.log(max(n, 1)) / math.log(1.01)), len(run.new_findings), len(run.tags))
    cached = st.session_state.get("fig_buckets_cache")
    if cached is not None and cached[0] == key:
        return cached[1]
    tags, findings = run.tags, run.current_findings()
    figs = {}
    if "bucket" in tags.columns and tags["bucket"].notna().any():
        figs["bucket_loss"] = bucket_loss_figure(run.metrics, tags, findings, run.loss_key)
    if CLUSTER in tags.columns and tags[CLUSTER].notna().any():
        figs["cluster_loss"] = cluster_loss_figure(run.metrics, tags, findings, run.loss_key)
        figs["cluster_mix"] = cluster_mix_figure(tags, run.plan, run.samples)
    st.session_state["fig_buckets_cache"] = (key, figs)
    return figs
