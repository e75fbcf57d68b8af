"""Plotly figures of a run, shared by the HTML report and the dashboard.

Every function takes the pipeline's tables (``metrics``, ``tags``, ``samples``, ``plan``) and the findings dict,
and returns a :class:`plotly.graph_objects.Figure`; none of them reads files or mutates its inputs. Long series are
downsampled with :mod:`forensics.report.downsample` (per-bin extremes, full resolution around findings), per-step
categorical data is summarised per bin, so a figure's size does not grow with the run's length.

Dataset text (cluster names, sample snippets) is HTML-escaped before it enters a figure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from forensics.report.composition import batch_epoch_counts, composition_figure
from forensics.report.curves import loss_figure
from forensics.report.groups import (
    binned_median,
    bucket_loss_figure,
    cluster_loss_figure,
    cluster_mix_figure,
    group_loss_figure,
)
from forensics.report.inputs import curve_metrics, finding_spans, sample_lookup
from forensics.report.style import fit_legend, house_template
from forensics.schema import CLUSTER, EPOCH, STEP

if TYPE_CHECKING:
    import plotly.graph_objects as go


def report_figures(
    findings: dict,
    metrics: pd.DataFrame,
    tags: pd.DataFrame | None = None,
    samples: pd.DataFrame | None = None,
    plan: pd.DataFrame | None = None,
    loss_key: str | None = None,
    expected: pd.DataFrame | None = None,
) -> dict[str, go.Figure]:
    """The report's figures in display order, keyed by name; a figure is left out when its inputs are missing.
    ``expected``: each step's expected value from its composition (the audit's ``expected`` table), drawn as a band
    on the curves."""
    figs: dict[str, go.Figure] = {"curves": loss_figure(metrics, findings, tags, samples, loss_key, expected=expected)}
    if tags is not None and STEP in tags.columns and len(tags):
        if "bucket" in tags.columns and tags["bucket"].notna().any():
            figs["bucket_loss"] = bucket_loss_figure(metrics, tags, findings, loss_key)
        if CLUSTER in tags.columns and tags[CLUSTER].notna().any():
            figs["cluster_loss"] = cluster_loss_figure(metrics, tags, findings, loss_key)
    pf = (findings or {}).get("plan")
    if (isinstance(pf, dict) and (pf.get("pair_retention") or pf.get("identical_batches"))) or (
        plan is not None and EPOCH in plan.columns and len(plan)
    ):
        figs["composition"] = composition_figure(findings, plan)
    has_sample_clusters = (
        plan is not None and samples is not None and CLUSTER in samples.columns and STEP in plan.columns
    )
    if has_sample_clusters or (tags is not None and CLUSTER in tags.columns and tags[CLUSTER].notna().any()):
        figs["cluster_mix"] = cluster_mix_figure(tags, plan, samples)
    return figs


__all__ = [
    "house_template",
    "batch_epoch_counts",
    "binned_median",
    "bucket_loss_figure",
    "cluster_loss_figure",
    "cluster_mix_figure",
    "composition_figure",
    "curve_metrics",
    "finding_spans",
    "fit_legend",
    "group_loss_figure",
    "loss_figure",
    "report_figures",
    "sample_lookup",
]
