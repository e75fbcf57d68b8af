"""The expected band of a curve: what each step's composition predicts (the spike rule's expectation, the pipeline's
``expected`` table), widened by the noise of the residual against it.

A loss spike is judged against this expectation, not against the curve's trend: drawing it beside the loss shows
which highs the composition explains (inside the band) and which it does not (the marked spikes, above it). The
expectation is multiplicative (trend times what the tags predict), so the band is too:
``expected * exp(+-k * robust_sd(log(value / expected)))``. Without an expectation (no plan) nothing is drawn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from forensics.report.text import esc
from forensics.schema import STEP
from forensics.stats import robust_sd

if TYPE_CHECKING:
    import plotly.graph_objects as go

#: The band's half width in robust SDs of the log residual: 3 holds about 99.7% of Gaussian noise, so a step outside
#: it is rare by chance; the spike rule's own thresholds (z, ratio) are stricter, so every spike lies outside.
BAND_SDS = 3.0
#: The legend's name of the band.
BAND_NAME = "expected from composition"
#: The band's fill and its centre line.
BAND_FILL = "rgba(44, 160, 44, 0.16)"
BAND_LINE = "rgba(44, 160, 44, 0.85)"


def expected_at(expected: pd.DataFrame | None, metric: str, steps: np.ndarray) -> np.ndarray | None:
    """The expectation of ``metric`` at each of ``steps`` (NaN where it has none); None when the table has no
    expectation of ``metric`` (a run without a plan)."""
    if expected is None or metric not in expected.columns or STEP not in expected.columns or not len(expected):
        return None
    column = pd.Series(expected[metric].to_numpy(np.float64, na_value=np.nan), index=expected[STEP].to_numpy(np.int64))
    out = column.reindex(np.asarray(steps, np.int64)).to_numpy(np.float64)
    return out if np.isfinite(out).any() else None


def band_width(values: np.ndarray, expected: np.ndarray) -> float:
    """The band's half width in log units: :data:`BAND_SDS` robust SDs of ``log(value / expected)`` over the steps
    where both are finite and positive (0 when none)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.log(np.asarray(values, np.float64) / np.asarray(expected, np.float64))
    r = r[np.isfinite(r)]
    return BAND_SDS * robust_sd(r) if len(r) else 0.0


def add_expected_band(
    fig: go.Figure,
    steps: np.ndarray,
    values: np.ndarray,
    idx: np.ndarray,
    expected: pd.DataFrame | None,
    metric: str,
    row: int,
    in_legend: set[str],
) -> bool:
    """Draw ``metric``'s expected band on ``row`` at the drawn points ``idx`` of the curve (its width from every
    step): a lower edge, the upper edge filled down to it (the legend entry), and the expectation as a thin line.
    Returns whether a band was drawn (False without an expectation)."""
    import plotly.graph_objects as go

    all_expected = expected_at(expected, metric, steps)
    if all_expected is None:
        return False
    width = band_width(values, all_expected)
    x = steps[idx].astype(np.int64)
    centre = all_expected[idx]
    keep = np.isfinite(centre) & (centre > 0)  # a baseline extrapolated below zero early in a run: not drawn
    x, centre = x[keep], centre[keep]
    low, high = centre * np.exp(-width), centre * np.exp(width)
    group = dict(legendgroup="expected", hoverinfo="skip")
    fig.add_trace(
        go.Scatter(x=x, y=low, mode="lines", line=dict(width=0), name=f"{BAND_NAME} (low)", showlegend=False, **group),
        row=row,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=high,
            mode="lines",
            line=dict(width=0),
            fill="tonexty",
            fillcolor=BAND_FILL,
            name=BAND_NAME,
            showlegend=BAND_NAME not in in_legend,
            **group,
        ),
        row=row,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=centre,
            mode="lines",
            line=dict(width=1, color=BAND_LINE, dash="dot"),
            name=f"{BAND_NAME} (expected)",
            showlegend=False,
            legendgroup="expected",
            hovertemplate=f"step %{{x}}<br>expected {esc(metric)} %{{y:.4g}} (±{BAND_SDS:g} SD: "
            f"{np.exp(-width):.3f}-{np.exp(width):.3f}x)<extra></extra>",
        ),
        row=row,
        col=1,
    )
    in_legend.add(BAND_NAME)
    return True
