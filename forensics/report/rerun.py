"""The segment re-run of a cause (``forensics replay --rerun``; replay.json's ``rerun`` objects), as the report's
cause card and the dashboard's cause card show it: per parameter group, the update/weight ratio and the grad norm
across the segment's steps with the spike step marked, and the cause class with the action it implies.

Shared by both so that they show the same panel: a user who reads the report and one who opens the dashboard see the
same groups, the same steps and the same sentence. Group names come from the model's modules (replay.json), which a
user's own model names; they are escaped where they enter HTML or a figure.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from forensics.report.style import QUALITATIVE, SPIKE, house_template
from forensics.report.text import esc

if TYPE_CHECKING:
    import plotly.graph_objects as go

#: Groups drawn per figure at most: the first group whose ratio jumped, then those whose ratio grew most over the
#: segment. A model with dozens of blocks would otherwise draw a legend no one can read.
MAX_GROUPS = 8


def rerun_entries(cause: dict[str, Any], replay: dict[int, dict] | None) -> list[dict[str, Any]]:
    """The replay.json entries of ``cause``'s steps that hold a re-run segment (``replay``: entries by step), in the
    cause's step order."""
    if not replay:
        return []
    steps = cause.get("events") or cause.get("steps") or []
    out = []
    for s in steps:
        r = replay.get(int(s)) if isinstance(s, (int, float)) else None
        rerun = (r or {}).get("rerun")
        if isinstance(rerun, dict) and isinstance(rerun.get("segment"), list) and rerun["segment"]:
            out.append(r)
    return out


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def shown_groups(rerun: dict[str, Any]) -> list[str]:
    """The groups a figure draws (:data:`MAX_GROUPS` at most): the first group whose update/weight ratio jumped, then
    the others by how far their ratio's largest value lies above its first (the ones that moved), then by name."""
    segment = [x for x in rerun.get("segment") or [] if isinstance(x, dict)]
    names: list[str] = list(dict.fromkeys(g for x in segment for g in (x.get("groups") or {})))

    def growth(name: str) -> float:
        ratios = [_finite(((x.get("groups") or {}).get(name) or {}).get("update_ratio")) for x in segment]
        ratios = [r for r in ratios if r is not None and r > 0]
        return max(ratios) / ratios[0] if ratios else 0.0

    first = rerun.get("first_group")
    ranked = sorted((n for n in names if n != first), key=lambda n: (-growth(n), n))
    return ([first] if first in names else []) + ranked[: MAX_GROUPS - (first in names)]


def rerun_figure(entry: dict[str, Any]) -> go.Figure:
    """Update/weight ratio (log scale) and grad norm per group across the segment's steps of one replay.json entry,
    with its spike step marked."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rerun = entry["rerun"]
    segment = [x for x in rerun.get("segment") or [] if isinstance(x, dict) and x.get("step") is not None]
    spike = int(entry["step"])
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("update / weight ratio", "grad norm"),
        horizontal_spacing=0.12,
    )
    steps = [int(x["step"]) for x in segment]
    for i, name in enumerate(shown_groups(rerun)):
        colour = QUALITATIVE[i % len(QUALITATIVE)]
        for col, key in ((1, "update_ratio"), (2, "grad_norm")):
            values = [_finite(((x.get("groups") or {}).get(name) or {}).get(key)) for x in segment]
            fig.add_trace(
                go.Scatter(
                    x=steps,
                    y=values,
                    mode="lines+markers",
                    name=esc(name),
                    legendgroup=esc(name),
                    showlegend=col == 1,
                    line={"color": colour, "width": 2.5 if name == rerun.get("first_group") else 1.5},
                    hovertemplate=f"{esc(name)}<br>step %{{x}}<br>{key.replace('_', ' ')} %{{y:.4g}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    for col in (1, 2):
        fig.add_vline(x=spike, line={"color": SPIKE, "dash": "dash", "width": 1.5}, row=1, col=col)
    fig.add_annotation(
        x=spike, y=1.0, xref="x", yref="paper", text=f"spike {spike}", showarrow=False, font={"color": SPIKE}
    )
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_xaxes(title_text="step", dtick=1 if len(steps) <= 12 else None)
    fig.update_layout(
        template=house_template(),
        height=300,
        margin={"l": 50, "r": 20, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def rerun_sentence(entry: dict[str, Any]) -> str:
    """The class and the action of one re-run, as one line (plain text; the caller escapes)."""
    r = entry["rerun"]
    cls = r.get("cause_class")
    head = f"Step {entry['step']} re-run from checkpoint {r.get('from_checkpoint')}: "
    head += f"cause class {cls}" if cls else "no cause class (the step is no spike)"
    if r.get("first_group"):
        head += f"; the first group whose update/weight ratio jumped: {r['first_group']}"
    return head + "." + (f" Action: {r['action']}" if r.get("action") else "")
