"""Loss per length bucket and per content cluster, the variance each explains, and the cluster mix over steps.

Per-step categorical data is summarised per step bin (medians, shares), so these figures stay the same size for
any run length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from forensics.report.inputs import bin_edges, group_labels, per_step, top_groups
from forensics.report.style import MUTED, QUALITATIVE, bucket_colors, fit_legend, house_template, with_alpha
from forensics.report.text import esc, fmt_share
from forensics.schema import CLUSTER, SAMPLE_ID, STEP, find_loss_key, metric_columns
from forensics.stats import detrend, variance_share

if TYPE_CHECKING:
    import plotly.graph_objects as go


def group_loss_figure(
    metrics: pd.DataFrame,
    tags: pd.DataFrame,
    by: str = "bucket",
    findings: dict | None = None,
    loss_key: str | None = None,
    n_bins: int = 300,
) -> go.Figure:
    """Loss per length bucket (``by="bucket"``) or content cluster (``by="cluster"``) over time, and its spread.

    Left: median loss of each group's steps per step bin (the y range zooms past a steep warm-up; drag to see it).
    Right: the detrended loss per group (loss minus a rolling
    median; box = quartiles, whiskers = 5th-95th percentile), titled with the share of variance the grouping
    explains (the findings' ``oscillation.bucket_variance_share`` / ``cluster_variance_share`` when present).
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    loss_key = find_loss_key(metric_columns(metrics), loss_key)
    steps = metrics[STEP].to_numpy(np.int64)
    loss = metrics[loss_key].to_numpy(np.float64)
    raw = per_step(tags, steps, by)
    if raw is None:
        raise ValueError(f"tags have no '{by}' column")
    groups = pd.to_numeric(pd.Series(raw), errors="coerce").to_numpy()
    labels = group_labels(tags, by)
    keep = top_groups(groups)
    pooled = np.where(np.isin(groups, keep), groups, np.where(np.isnan(groups), np.nan, -1))
    order = keep + ([-1] if (pooled == -1).any() else [])
    colors = bucket_colors(len(keep)) if by == "bucket" else QUALITATIVE
    fig = make_subplots(rows=1, cols=2, column_widths=[0.68, 0.32], horizontal_spacing=0.08)
    ok = np.isfinite(loss) & ~np.isnan(pooled)
    which, centres = bin_edges(steps, n_bins) if len(steps) else (np.array([], int), np.array([], int))
    detr = detrend(loss)
    # all groups' bin medians in one sort: key = (position of the group in the legend, bin)
    position = pd.Series(pooled).map({float(g): i for i, g in enumerate(order)}).to_numpy()
    ok &= ~np.isnan(position)
    nb = len(centres)
    keys = position[ok].astype(np.int64) * nb + which[ok]
    all_medians = binned_median(keys, loss[ok], len(order) * nb).reshape(len(order), nb)
    medians: list[np.ndarray] = []
    for i, g in enumerate(order):
        color = colors[i % len(colors)] if g != -1 else "#9aa5b1"
        name = labels.get(int(g), f"{by} {int(g)}") if g != -1 else "other"
        m = ok & (pooled == g)
        median = all_medians[i]
        medians.append(median)
        fig.add_trace(
            go.Scatter(
                x=centres,
                y=median.astype(np.float32),
                mode="lines+markers",
                name=name,
                legendgroup=name,
                line=dict(color=color, width=1.4),
                marker=dict(size=3),
                connectgaps=False,
                hovertemplate=f"{name}<br>steps near %{{x}}<br>median %{{y:.4g}}<extra></extra>",
            ),
            row=1,
            col=1,
        )
        d = detr[m & np.isfinite(detr)]
        if len(d):
            q = np.percentile(d, [5, 25, 50, 75, 95])
            fig.add_trace(
                go.Box(
                    x=[name],
                    q1=[q[1]],
                    median=[q[2]],
                    q3=[q[3]],
                    lowerfence=[q[0]],
                    upperfence=[q[4]],
                    mean=[float(d.mean())],
                    name=name,
                    legendgroup=name,
                    showlegend=False,
                    marker=dict(color=color),
                    line=dict(color=color),
                    fillcolor=with_alpha(color, 0.35),
                    boxpoints=False,
                ),
                row=1,
                col=2,
            )
    share_key = f"{by}_variance_share"
    share = ((findings or {}).get("oscillation") or {}).get(share_key)
    source = "as in findings.json"
    if share is None:  # a report drawn without findings: the same statistic, through the same function
        share = variance_share(loss, np.where(np.isnan(groups), -1, groups).astype(np.int64))
        share = None if share != share else share
        source = "computed as the audit does"
    title = f"Loss by {'length bucket' if by == 'bucket' else 'content cluster'}"
    sub = (
        f"{by} explains {fmt_share(share)} of the detrended loss variance ({source})"
        if share is not None
        else f"not enough tagged steps to say how much the {by} explains"
    )
    fig.update_layout(
        template=house_template(),
        height=440,
        title=dict(text=title, subtitle=dict(text=sub, font=dict(color=MUTED, size=11))),
    )
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_xaxes(title_text=by, type="category", row=1, col=2)
    fig.update_yaxes(
        title_text=f"median {esc(loss_key)} per step bin",
        title_font=dict(size=12),
        row=1,
        col=1,
        range=_robust_range(medians),
    )
    fig.update_yaxes(title_text="loss − rolling median", title_font=dict(size=12), row=1, col=2)
    return fit_legend(fig)


def bucket_loss_figure(
    metrics: pd.DataFrame,
    tags: pd.DataFrame,
    findings: dict | None = None,
    loss_key: str | None = None,
    n_bins: int = 300,
) -> go.Figure:
    """Loss per length bucket over time and the share of variance the bucket explains (see group_loss_figure)."""
    return group_loss_figure(metrics, tags, "bucket", findings, loss_key, n_bins)


def cluster_loss_figure(
    metrics: pd.DataFrame,
    tags: pd.DataFrame,
    findings: dict | None = None,
    loss_key: str | None = None,
    n_bins: int = 300,
) -> go.Figure:
    """Loss per content cluster over time and the share of variance the cluster explains."""
    return group_loss_figure(metrics, tags, CLUSTER, findings, loss_key, n_bins)


def binned_median(bins: np.ndarray, values: np.ndarray, n_bins: int) -> np.ndarray:
    """The median of ``values`` in each of ``n_bins`` bins (NaN for empty bins), by one sort instead of a loop.

    A median, not a mean: one spike in a bin would otherwise lift its bucket's line and hide the level shift
    between buckets that this figure is about (the curves figure shows the spikes).
    """
    out = np.full(n_bins, np.nan)
    if not len(values):
        return out
    by_value = np.argsort(values)
    order = by_value[np.argsort(bins[by_value], kind="stable")]  # by bin, then value (two sorts beat lexsort)
    b, v = bins[order], values[order]
    starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    counts = np.diff(np.r_[starts, len(b)])
    lo = starts + (counts - 1) // 2
    hi = starts + counts // 2
    out[b[starts]] = (v[lo] + v[hi]) / 2
    return out


def _robust_range(series: list[np.ndarray]) -> list[float] | None:
    """A y range that shows the levels after warm-up: the 1st-99th percentile of the points, padded, when the full
    range is more than three times wider (a steep warm-up would otherwise flatten the bucket levels into one line)."""
    values = np.concatenate(series) if series else np.array([])
    values = values[np.isfinite(values)]
    if len(values) < 20:
        return None
    lo, hi = np.percentile(values, [1, 99])
    full = float(values.max() - values.min())
    if hi <= lo or full <= 3 * (hi - lo):
        return None
    pad = 0.15 * (hi - lo)
    return [float(lo - pad), float(hi + pad)]


def cluster_mix_figure(
    tags: pd.DataFrame | None = None,
    plan: pd.DataFrame | None = None,
    samples: pd.DataFrame | None = None,
    n_bins: int = 200,
) -> go.Figure:
    """The content-cluster mix of the batches over steps, as shares per step bin (stacked to 100%).

    With a plan and samples that carry ``cluster``, shares count samples; otherwise each step counts once, under
    its tagged (dominant) cluster.
    """
    import plotly.graph_objects as go

    names = group_labels(tags, CLUSTER) if tags is not None and CLUSTER in tags.columns else {}
    if plan is not None and samples is not None and CLUSTER in samples.columns and STEP in plan.columns:
        joined = plan[[STEP, SAMPLE_ID]].merge(samples[[SAMPLE_ID, CLUSTER]], on=SAMPLE_ID, how="left")
        steps = joined[STEP].to_numpy(np.int64)
        clusters = pd.to_numeric(joined[CLUSTER], errors="coerce").to_numpy()
        unit = "samples"
    elif tags is not None and CLUSTER in tags.columns:
        steps = tags[STEP].to_numpy(np.int64)
        clusters = pd.to_numeric(tags[CLUSTER], errors="coerce").to_numpy()
        unit = "steps"
    else:
        raise ValueError("the cluster mix needs tags with 'cluster', or a plan and samples with 'cluster'")
    ok = ~np.isnan(clusters)
    steps, clusters = steps[ok], clusters[ok].astype(np.int64)
    fig = go.Figure()
    if len(steps):
        keep = top_groups(clusters.astype(float))
        pooled = np.where(np.isin(clusters, keep), clusters, -1)
        order = keep + ([-1] if (pooled == -1).any() else [])
        which, centres = bin_edges(steps, n_bins)
        totals = np.bincount(which, minlength=len(centres)).astype(np.float64)
        has = totals > 0
        for i, c in enumerate(order):
            share = np.bincount(which[pooled == c], minlength=len(centres)) / np.maximum(totals, 1)
            name = names.get(int(c), f"cluster {int(c)}") if c != -1 else "other"
            fig.add_trace(
                go.Scatter(
                    x=centres[has],
                    y=share[has].astype(np.float32),
                    mode="lines",
                    name=name,
                    stackgroup="mix",
                    line=dict(width=0.6, color=QUALITATIVE[i % len(QUALITATIVE)] if c != -1 else "#9aa5b1"),
                    hovertemplate=f"{name}<br>steps near %{{x}}: %{{y:.0%}}<extra></extra>",
                )
            )
    binned = len(steps) and (int(steps.max()) - int(steps.min()) + 1) > n_bins
    sub = f"share of {unit} per cluster, " + (f"in {n_bins} step bins" if binned else "per step")
    fig.update_layout(
        template=house_template(),
        height=360,
        legend=dict(traceorder="normal"),
        title=dict(text="Content-cluster mix over steps", subtitle=dict(text=sub, font=dict(color=MUTED, size=11))),
    )
    fig.update_yaxes(range=[0, 1], tickformat=".0%", title_text=f"share of {unit}")
    fig.update_xaxes(title_text="step")
    return fit_legend(fig)
