"""View 2, buckets and clusters: loss per length bucket and per content cluster with the share of variance each
explains, and the cluster mix per step over time (the report's figures)."""

from __future__ import annotations

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
    findings = run.current_findings()
    if "bucket" in tags.columns and tags["bucket"].notna().any():
        st.plotly_chart(bucket_loss_figure(run.metrics, tags, findings, run.loss_key), width="stretch",
                        key="fig_bucket_loss")
    if CLUSTER in tags.columns and tags[CLUSTER].notna().any():
        st.plotly_chart(cluster_loss_figure(run.metrics, tags, findings, run.loss_key), width="stretch",
                        key="fig_cluster_loss")
        st.plotly_chart(cluster_mix_figure(tags, run.plan, run.samples), width="stretch",
                        key="fig_cluster_mix")
