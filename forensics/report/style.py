"""The report's look: one plotly template, the palettes, and room for legends that wrap.

Shared by every figure so that the report and the dashboard look the same. Fonts are the system stack: nothing is
fetched from the network. plotly is imported by the functions that draw, so that importing the report (every audit's
terminal summary does) does not load it.
"""

from __future__ import annotations

import re
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import plotly.graph_objects as go

FONT = '-apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif'
INK = "#1f2933"
MUTED = "#6b7280"
GRID = "#eceff3"
SPIKE = "#d62728"
NONFINITE = "#7f1d1d"
RECUR = "#ff7f0e"
LINE = "#9aa5b1"
#: Colour-blind-safe qualitative palette (Okabe-Ito, then Tol's muted) for clusters.
QUALITATIVE = [
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#F0E442",
    "#332288",
    "#88CCEE",
    "#44AA99",
    "#999933",
    "#AA4499",
]

#: The top margin of every figure, which a wrapping legend grows (:func:`fit_legend`).
TOP_MARGIN = 105


@cache
def house_template() -> go.layout.Template:
    """The one plotly template of every figure (built once, on first use)."""
    import plotly.graph_objects as go

    return go.layout.Template(
        layout=dict(
            font=dict(family=FONT, size=12, color=INK),
            paper_bgcolor="white",
            plot_bgcolor="white",
            colorway=QUALITATIVE,
            title=dict(x=0.005, xanchor="left", y=0.985, yanchor="top", font=dict(size=15)),
            xaxis=dict(gridcolor=GRID, zeroline=False, linecolor="#c4cad3", ticks="outside", tickcolor="#c4cad3"),
            yaxis=dict(gridcolor=GRID, zeroline=False, linecolor="#c4cad3"),
            legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0, font=dict(size=11)),
            hoverlabel=dict(font=dict(family=FONT, size=12), align="left"),
            margin=dict(l=70, r=20, t=TOP_MARGIN, b=45),
            hovermode="closest",
        )
    )


def bucket_colors(n: int) -> list[str]:
    """Ordinal colours for length buckets, short (blue) to long (red): neighbours distinct, all readable on white."""
    from plotly.colors import sample_colorscale

    if n <= 1:
        return [sample_colorscale("Turbo", [0.15])[0]]
    return sample_colorscale("Turbo", list(np.linspace(0.08, 0.92, n)))


def with_alpha(color: str, a: float) -> str:
    if color.startswith("#") and len(color) == 7:
        r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
        return f"rgba({r},{g},{b},{a})"
    if color.startswith("rgb("):
        return color.replace("rgb(", "rgba(").replace(")", f",{a})")
    return color


def fit_legend(fig: go.Figure, width: int = 1150) -> go.Figure:
    """Make room above the plot for a horizontal legend that wraps: plotly grows it upwards over the title.

    Estimates the rows the legend needs at ``width`` px (about 6.5 px per character plus the symbol) and raises
    the top margin and the height by one line per extra row.
    """
    items = [t.name or "" for t in fig.data if t.showlegend is not False and t.name]
    seen: set[str] = set()
    widths = []
    for name in items:
        if name in seen:
            continue
        seen.add(name)
        plain = re.sub(r"&[a-z#0-9]+;", "x", name)
        widths.append(48 + 6.5 * len(plain))
    rows, used = 1, 0.0
    for w in widths:
        if used and used + w > width:
            rows, used = rows + 1, 0.0
        used += w
    extra = 24 * (rows - 1)
    top = (fig.layout.margin.t or TOP_MARGIN) + extra
    fig.update_layout(margin=dict(t=top), height=(fig.layout.height or 450) + extra)
    return fig
