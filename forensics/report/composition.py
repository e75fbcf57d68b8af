"""Batch composition across epochs: pair retention and identical batches per epoch pair, and batch recurrence.

The pair-retention numbers come from the findings (the check-plan gate computes them); which batches recur, and in
how many epochs, is counted here from the plan table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from forensics.report.inputs import as_float
from forensics.report.style import MUTED, QUALITATIVE, SPIKE, fit_legend, house_template
from forensics.report.text import esc, fmt_share
from forensics.schema import EPOCH, SAMPLE_ID, batch_keys

if TYPE_CHECKING:
    import plotly.graph_objects as go


def batch_epoch_counts(plan: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct batch content: ``n_epochs`` it appears in, ``first_epoch``, ``n_samples``.

    A batch is one micro-batch on one rank (:func:`~forensics.schema.batches.batch_keys`): the ranks of a
    multi-rank plan are never merged into one batch. Its content is its set of sample ids (order ignored), compared
    by an order-free 64-bit hash; its epoch is that of its first row (a batch lies in one epoch).
    """
    if EPOCH not in plan.columns or SAMPLE_ID not in plan.columns:
        raise ValueError("plan needs 'epoch' and 'sample_id' to compare batches across epochs")
    code = batch_keys(plan)
    order = np.argsort(code, kind="stable")
    code = code[order]
    mixed = _mix64(plan[SAMPLE_ID].to_numpy(np.int64)[order].astype(np.uint64))
    starts = np.flatnonzero(np.r_[True, code[1:] != code[:-1]])
    # wrapping uint64 sums of mixed ids: equal sets give equal sums; unequal sets collide with odds ~2^-64
    per_batch = pd.DataFrame(
        {
            "h": np.add.reduceat(mixed, starts) if len(starts) else np.array([], np.uint64),
            "n": np.diff(np.r_[starts, len(code)]),
            EPOCH: plan[EPOCH].to_numpy(np.int64)[order][starts],
        }
    )
    return (
        per_batch.groupby(["h", "n"], sort=False)
        .agg(n_epochs=(EPOCH, "nunique"), first_epoch=(EPOCH, "min"), n_samples=("n", "first"))
        .reset_index(drop=True)
    )


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads sample ids over 64 bits so that sums of a set identify it."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def composition_figure(findings: dict | None = None, plan: pd.DataFrame | None = None) -> go.Figure:
    """Batch composition across epochs: pair retention and identical batches per epoch pair, and batch recurrence.

    Left (from ``findings["plan"]``): per consecutive epoch pair, the share of batch-mate pairs kept and the share
    of batches repeated unchanged, against the gate's threshold. Right (from the plan table): how many distinct
    batches appear in 1, 2, ... epochs; a static plan puts every batch in every epoch.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    pf = (findings or {}).get("plan") or {}
    has_plan = plan is not None and EPOCH in plan.columns and len(plan)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.1)
    retention = list(pf.get("pair_retention") or [])
    identical = list(pf.get("identical_batches") or [])
    n_pairs = max(len(retention), len(identical))
    # the gate names its epoch pairs (epochs may start at 1 or have gaps); a missing value stays a gap
    named = pf.get("epoch_pairs") or []
    pairs = [f"{a}→{b}" for a, b in named] if len(named) == n_pairs else [f"{e}→{e + 1}" for e in range(n_pairs)]
    retention = [as_float(v) for v in retention]
    identical = [as_float(v) for v in identical]
    retention = retention if any(v is not None for v in retention) else []
    identical = identical if any(v is not None for v in identical) else []
    if retention:
        fig.add_trace(
            go.Bar(
                x=pairs[: len(retention)],
                y=retention,
                name="batch-mate pairs kept",
                marker_color=QUALITATIVE[0],
                texttemplate="%{y:.1%}",
                textposition="outside",
                hovertemplate="epochs %{x}<br>pairs kept %{y:.1%}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    if identical:
        fig.add_trace(
            go.Bar(
                x=pairs[: len(identical)],
                y=identical,
                name="identical batches",
                marker_color=QUALITATIVE[1],
                texttemplate="%{y:.1%}",
                textposition="outside",
                hovertemplate="epochs %{x}<br>identical batches %{y:.1%}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    threshold = pf.get("threshold") if isinstance(pf.get("threshold"), dict) else {}
    limit = as_float(threshold.get("pair_retention"))
    if limit is not None and n_pairs:
        fig.add_hline(
            y=limit,
            line=dict(color=SPIKE, dash="dash", width=1.5),
            row=1,
            col=1,
            annotation_text=f"gate limit {fmt_share(limit)}",
            annotation_position="top right",
            annotation_font=dict(color=SPIKE, size=11),
        )
    fig.update_yaxes(range=[0, 1.15], tickformat=".0%", title_text="kept from the previous epoch", row=1, col=1)
    fig.update_xaxes(title_text="epoch pair", type="category", row=1, col=1)
    headline = ""
    if has_plan:
        rec = batch_epoch_counts(plan)
        n_epochs = int(plan[EPOCH].nunique())
        counts = rec["n_epochs"].value_counts().reindex(range(1, n_epochs + 1), fill_value=0)
        fig.add_trace(
            go.Bar(
                x=list(counts.index),
                y=counts.to_numpy(),
                name="distinct batches",
                marker_color=QUALITATIVE[2],
                showlegend=False,
                hovertemplate="in %{x} epoch(s): %{y} distinct batches<extra></extra>",
            ),
            row=1,
            col=2,
        )
        fig.update_xaxes(title_text=f"epochs (of {n_epochs})", dtick=1, row=1, col=2)
        fig.update_yaxes(title_text="distinct batches (by content)", row=1, col=2)
        multi = rec.loc[rec["n_samples"] > 1]
        if len(multi) and n_epochs > 1:
            share_all = float((multi["n_epochs"] == n_epochs).mean())
            headline = (
                f"{share_all:.0%} of multi-sample batches recur unchanged in all {n_epochs} epochs"
                if share_all > 0
                else "no multi-sample batch recurs unchanged in every epoch"
            )
    if pf.get("static") is not None:
        verdict = (
            "static: batch composition does not vary across epochs"
            if pf.get("static")
            else "batch composition varies across epochs"
        )
        headline = verdict + (f"; {headline}" if headline else "")
    fig.update_layout(
        template=house_template(),
        height=400,
        barmode="group",
        title=dict(
            text="Batch composition across epochs",
            subtitle=dict(
                text=esc(headline) or "no plan composition figures in the findings", font=dict(color=MUTED, size=11)
            ),
        ),
    )
    return fit_legend(fig)
