"""The training curves: loss (and grad norm, lr, any spiking metric) over steps, with every finding marked.

Each series keeps per-bin extremes plus every step near a finding (:mod:`forensics.report.downsample`), so a 1M-step
run draws a few thousand points per curve and still shows every spike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from forensics.report.downsample import DEFAULT_POINTS, DEFAULT_WINDOW, plot_indices
from forensics.report.expected import add_expected_band
from forensics.report.inputs import (
    as_float,
    by_severity,
    curve_metrics,
    finding_spans,
    group_labels,
    nonfinite_of,
    per_step,
    present,
    sample_lookup,
    sample_row,
    spikes_of,
)
from forensics.report.overview import SEVERITY_STYLE
from forensics.report.style import (
    LINE,
    MUTED,
    NONFINITE,
    QUALITATIVE,
    RECUR,
    SPIKE,
    bucket_colors,
    fit_legend,
    house_template,
)
from forensics.report.text import esc, fmt_num, snippet
from forensics.schema import STEP, TEXT, find_loss_key, metric_columns

if TYPE_CHECKING:
    import plotly.graph_objects as go

#: Spike markers drawn per metric (one point each; the cards list them all).
MAX_MARKED_SPIKES = 2000


def loss_figure(
    metrics: pd.DataFrame,
    findings: dict | None = None,
    tags: pd.DataFrame | None = None,
    samples: pd.DataFrame | None = None,
    loss_key: str | None = None,
    n_out: int = DEFAULT_POINTS,
    window: int = DEFAULT_WINDOW,
    expected: pd.DataFrame | None = None,
) -> go.Figure:
    """Loss (and grad norm, lr, spiking metrics) over steps: spikes marked, loss points coloured by length bucket.

    ``expected``: the pipeline's table of each step's expected value from its composition (``step`` and a column
    per metric); each curve it has a column for is drawn over its expected band (:mod:`forensics.report.expected`).
    None (a run without a plan): no band.

    Each series keeps ``n_out`` points by per-bin extremes plus every step within ``window`` of a finding, so every
    spike is drawn; NaN/inf steps are crosses at the top of their panel; steps where a spike's batch recurred in
    another epoch are diamonds.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    loss_key = find_loss_key(metric_columns(metrics), loss_key)
    rows = curve_metrics(metrics, loss_key, findings)
    steps = metrics[STEP].to_numpy(np.int64)
    spans = finding_spans(findings)
    heights = [0.56] + [0.44 / max(1, len(rows) - 1)] * (len(rows) - 1) if len(rows) > 1 else [1.0]
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.04, row_heights=heights)
    buckets = per_step(tags, steps, "bucket")
    spikes = spikes_of(findings)
    lookup = sample_lookup(samples)
    in_legend: set[str] = set()
    y_range = None
    for r, col in enumerate(rows, start=1):
        values = metrics[col].to_numpy(np.float64)
        idx = plot_indices(steps, values, spans, n_out, window)
        x, y = steps[idx].astype(np.int64), values[idx].astype(np.float32)
        add_expected_band(fig, steps, values, idx, expected, col, r, in_legend)
        if r == 1 and buckets is not None:
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="lines",
                    line=dict(color=LINE, width=1),
                    name=esc(col),
                    legendgroup="curve",
                    showlegend=False,
                    hoverinfo="skip",
                ),
                row=r,
                col=1,
            )
            _add_bucket_markers(fig, steps, values, buckets, tags, spans, n_out, window, row=r)
        else:
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="lines",
                    line=dict(color=QUALITATIVE[0] if r == 1 else LINE, width=1.2 if r == 1 else 1),
                    name=esc(col),
                    showlegend=False,
                    hovertemplate=f"step %{{x}}<br>{esc(col)} %{{y:.4g}}<extra></extra>",
                ),
                row=r,
                col=1,
            )
        mine = [s for s in spikes if s.get("metric", loss_key) == col][:MAX_MARKED_SPIKES]
        _add_spike_markers(fig, mine, lookup, in_legend, row=r)
        bad = [n for n in nonfinite_of(findings) if n.get("metric", loss_key) == col]
        if bad:
            fig.add_trace(
                go.Scatter(
                    x=[int(n["step"]) for n in bad[:2000]],
                    y=[_finite_top(values)] * len(bad[:2000]),
                    mode="markers",
                    name="NaN/inf",
                    legendgroup="nonfinite",
                    showlegend="nan" not in in_legend,
                    marker=dict(symbol="x", size=9, color=NONFINITE),
                    hovertext=[
                        f"step {int(n['step'])}: {esc(n.get('metric', col))} = {fmt_num(n.get('value'))}"
                        for n in bad[:2000]
                    ],
                    hoverinfo="text",
                ),
                row=r,
                col=1,
            )
            in_legend.add("nan")
        if r == 1:
            _add_recurrence(fig, spikes, col, loss_key)
        fig.update_yaxes(title_text=esc(col), title_font=dict(size=12), row=r, col=1)
        if r == 1:
            y_range = after_warmup_range(values, [as_float(s.get("value")) for s in mine])
    # one shaded band per spike across all panels (plain dicts: add_vrect validates per row and is slow)
    bands = []
    for s in by_severity(spikes)[:50]:
        end = s.get("end_step") if s.get("end_step") is not None else s["step"]
        bands.append(
            dict(
                type="rect",
                xref="x",
                yref="paper",
                x0=int(s["step"]) - 0.5,
                x1=int(end) + 0.5,
                y0=0,
                y1=1,
                fillcolor=SPIKE,
                opacity=0.10,
                line_width=0,
                layer="below",
            )
        )
    fig.update_layout(shapes=bands)
    n_steps = len(steps)
    note = (
        f"{n_steps:,} steps; each curve drawn with ≤{n_out:,} points (per-bin min/max) plus every step within "
        f"±{window} of a finding"
        if n_steps > n_out
        else f"{n_steps:,} steps, every step drawn"
    )
    fig.update_layout(
        template=house_template(),
        height=340 + 160 * (len(rows) - 1),
        title=dict(text="Training curves", subtitle=dict(text=note, font=dict(color=MUTED, size=11))),
    )
    fig.update_xaxes(title_text="step", row=len(rows), col=1)
    if rows and y_range is not None:
        fig.update_yaxes(range=y_range, row=1, col=1)
        fig.update_layout(
            updatemenus=[
                dict(
                    type="buttons",
                    direction="right",
                    x=1.0,
                    xanchor="right",
                    y=1.12,
                    yanchor="bottom",
                    showactive=True,
                    buttons=[
                        dict(label="after warm-up", method="relayout", args=[{"yaxis.range": y_range}]),
                        dict(label="whole run", method="relayout", args=[{"yaxis.autorange": True}]),
                    ],
                )
            ]
        )
    return fit_legend(fig)


def after_warmup_range(
    values: np.ndarray, peaks: list[float | None] = (), warmup_share: float = 0.05
) -> list[float] | None:
    """A y range that follows the run after its warm-up: the 0.5-99.5th percentiles of the values after the first
    ``warmup_share`` of steps, stretched to every marked spike peak, padded; None when the whole range is not
    much wider (then plotly's own range is right). The warm-up stays one click away (the "whole run" button)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if len(v) < 50:
        return None
    after = v[int(len(v) * warmup_share) :]
    lo, hi = (float(x) for x in np.percentile(after, [0.5, 99.5]))
    tops = [p for p in peaks if p is not None and np.isfinite(p)]
    hi = max([hi, *tops])
    if hi <= lo or float(v.max() - v.min()) <= 1.5 * (hi - lo):
        return None
    pad = 0.06 * (hi - lo)
    return [lo - pad, hi + pad]


def _add_spike_markers(
    fig: go.Figure, spikes: list[dict], lookup: pd.DataFrame | None, in_legend: set[str], row: int
) -> None:
    """Spikes marked by severity, shape and colour both (``spike (critical)`` squares, ``spike (warning)``
    triangles, ``spike (info)`` circles), each with its cause id as ``customdata`` (a click opens the cause); the
    baseline the spike was judged against, where the finding carries one, as a short dash under its peak."""
    import plotly.graph_objects as go

    for sev, (_, color, symbol) in SEVERITY_STYLE.items():
        mine = [
            s
            for s in spikes
            if str(s.get("severity") or "info") == sev
            or (sev == "info" and str(s.get("severity") or "info") not in SEVERITY_STYLE)
        ]
        if not mine:
            continue
        name = f"spike ({sev})"
        fig.add_trace(
            go.Scatter(
                x=[int(s.get("peak_step", s["step"])) for s in mine],
                y=[as_float(s.get("value")) for s in mine],
                mode="markers",
                name=name,
                legendgroup=name,
                showlegend=name not in in_legend,
                marker=dict(symbol=f"{symbol}-open", size=14, color=color, line=dict(width=2.5)),
                customdata=[str(s.get("cause") or "") for s in mine],
                hovertext=[_spike_hover(s, lookup) for s in mine],
                hoverinfo="text",
            ),
            row=row,
            col=1,
        )
        in_legend.add(name)
    based = [s for s in spikes if as_float(s.get("baseline")) is not None]
    if based:
        fig.add_trace(
            go.Scatter(
                x=[int(s.get("peak_step", s["step"])) for s in based],
                y=[as_float(s.get("baseline")) for s in based],
                mode="markers",
                name="spike's baseline",
                legendgroup="baseline",
                showlegend="baseline" not in in_legend,
                marker=dict(symbol="line-ew", size=16, color=MUTED, line=dict(width=2, color=MUTED)),
                hovertext=[
                    f"baseline {fmt_num(s.get('baseline'))} at step {int(s.get('peak_step', s['step']))}" for s in based
                ],
                hoverinfo="text",
            ),
            row=row,
            col=1,
        )
        in_legend.add("baseline")


def _spike_hover(s: dict, lookup: pd.DataFrame | None) -> str:
    start, end = int(s["step"]), int(s.get("end_step") if s.get("end_step") is not None else s["step"])
    peak = s.get("peak_step", start)
    span = f"step {start}" if end == start else f"steps {start}–{end}"
    lines = [
        f"<b>Spike</b> {span} (peak {fmt_num(peak)})",
        f"{esc(s.get('metric', ''))} {fmt_num(s.get('value'))} vs baseline {fmt_num(s.get('baseline'))}"
        f" · score {fmt_num(s.get('score'), 3)}",
    ]
    where = []
    if s.get("bucket") is not None:
        where.append(f"bucket {fmt_num(s['bucket'])} {esc(s.get('bucket_range') or '')}".strip())
    if s.get("cluster") is not None:
        name = s.get("cluster_name")
        where.append(f"cluster {fmt_num(s['cluster'])}" + (f" '{esc(snippet(name, 40))}'" if present(name) else ""))
    if where:
        lines.append(" · ".join(where))
    suspects = list(s.get("suspect_samples") or [])
    if suspects:
        lines.append("suspects: " + ", ".join(str(int(i)) for i in suspects[:5]) + (" …" if len(suspects) > 5 else ""))
        top = sample_row(lookup, suspects[0])
        if top is not None and present(top.get(TEXT)):
            lines.append(f"#{int(suspects[0])}: {esc(snippet(top.get(TEXT), 70))}")
    return "<br>".join(lines)


def _finite_top(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    if not len(finite):
        return 1.0
    hi, lo = float(finite.max()), float(finite.min())
    return hi + 0.04 * (hi - lo if hi > lo else abs(hi) or 1.0)


def _add_bucket_markers(
    fig: go.Figure,
    steps: np.ndarray,
    values: np.ndarray,
    bucket: np.ndarray,
    tags: pd.DataFrame,
    spans: list[tuple[int, int]],
    n_out: int,
    window: int,
    row: int,
) -> None:
    """One trace per bucket, each downsampled on its own (per-bin extremes of its own steps): every bucket in the
    data appears with its own highs and lows, however few steps it has."""
    import plotly.graph_objects as go

    labels = group_labels(tags, "bucket")
    ids = sorted(labels)
    colors = bucket_colors(len(ids))
    b = pd.to_numeric(pd.Series(bucket), errors="coerce").to_numpy()
    per_bucket = max(500, n_out // 2)
    for color, k in zip(colors, ids):
        rows = np.flatnonzero(b == k)
        if not len(rows):
            continue
        sel = rows[plot_indices(steps[rows], values[rows], spans, per_bucket, window)]
        x, y = steps[sel].astype(np.int64), values[sel].astype(np.float32)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="markers",
                name=labels[k],
                legendgroup=f"b{k}",
                marker=dict(size=4, color=color),
                hovertemplate=f"step %{{x}}<br>loss %{{y:.4g}}<br>{labels[k]}<extra></extra>",
            ),
            row=row,
            col=1,
        )
    untagged = np.flatnonzero(np.isnan(b))
    if len(untagged):
        sel = untagged[plot_indices(steps[untagged], values[untagged], spans, per_bucket, window)]
        x, y = steps[sel].astype(np.int64), values[sel].astype(np.float32)
        fig.add_trace(
            go.Scatter(
                x=x, y=y, mode="markers", name="untagged", marker=dict(size=3, color="#c4cad3"), hoverinfo="skip"
            ),
            row=row,
            col=1,
        )


def _add_recurrence(fig: go.Figure, spikes: list[dict], col: str, loss_key: str) -> None:
    import plotly.graph_objects as go

    xs, ys, texts = [], [], []
    for s in spikes:
        if s.get("metric", loss_key) != col:
            continue
        for rec in s.get("recurrence") or []:
            if not isinstance(rec, dict) or rec.get("step") is None or as_float(rec.get("value")) is None:
                continue
            xs.append(int(rec["step"]))
            ys.append(as_float(rec.get("value")))
            texts.append(
                f"same batch as the spike at step {int(s['step'])}<br>epoch {fmt_num(rec.get('epoch'))}, "
                f"step {int(rec['step'])}: {esc(col)} {fmt_num(rec.get('value'))}"
            )
    if xs:
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="markers",
                name="spike batch again",
                legendgroup="recur",
                marker=dict(symbol="diamond-open", size=11, color=RECUR, line=dict(width=2)),
                hovertext=texts,
                hoverinfo="text",
            ),
            row=1,
            col=1,
        )
