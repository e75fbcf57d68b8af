"""compare.html: one offline page with every run's loss overlaid on a shared step axis, each spike position marked
by its class, and a table of the positions (the samples there, the first one's text).

Built like report.html (:mod:`forensics.report.html`): plotly's JavaScript inlined once, the figure embedded as
script-safe JSON, no network reference, the same inputs give the same bytes. Every run name, source, summary and
dataset text is HTML-escaped where it is written into the page, and JSON-escaped (``<``, ``>``, ``&`` as ``\\u``
sequences) inside the figure, so a sample holding ``</script>`` is shown as text, never run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from forensics.compare.classes import CLASSES, MEANING
from forensics.compare.result import Comparison
from forensics.report.html import figures_json
from forensics.report.text import esc, fmt_num, snippet

if TYPE_CHECKING:
    import plotly.graph_objects as go

#: Marker colour and symbol of each class (colour-blind safe: they differ in symbol too).
CLASS_STYLE = {"recurring": ("#d62728", "x"), "vanished": ("#1f77b4", "triangle-down"), "unique": ("#7f7f7f", "circle")}
_LOADER = """
(function () {
  var figs = JSON.parse(document.getElementById('compare-figures').textContent);
  Object.keys(figs).forEach(function (name) {
    Plotly.newPlot(document.getElementById('fig-' + name), figs[name].data, figs[name].layout,
                   {responsive: true, displaylogo: false});
  });
})();
"""
_CSS = (
    "body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222}"
    "main{max-width:1200px;margin:0 auto;padding:16px}table{border-collapse:collapse;width:100%;font-size:13px}"
    "th,td{border-bottom:1px solid #ddd;padding:4px 6px;text-align:left;vertical-align:top}"
    ".muted{color:#666}.cls{font-weight:600}.recurring{color:#d62728}.vanished{color:#1f77b4}"
    ".unique{color:#555}code{font-size:12px}"
)


def compare_figure(result: Comparison) -> go.Figure:
    """Every run's loss against its canonical step, and one marker trace per class at the spikes' peaks (each run's
    own value there, so a vanished spike shows both the spike and the quiet run beside it)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for run in result.runs:
        fig.add_trace(
            go.Scattergl(
                x=np.asarray(run.steps),
                y=np.asarray(run.values),
                mode="lines",
                name=run.name,
                line={"width": 1},
                hovertemplate=f"{run.name}<br>step %{{x}}<br>loss %{{y:.4g}}<extra></extra>",
            )
        )
    for cls in CLASSES:
        xs, ys, texts = [], [], []
        for p in result.positions:
            if p.cls != cls:
                continue
            for r, steps in p.steps.items():
                for step in steps:
                    value = result.runs[r].value_at(step)
                    if value is not None:
                        xs.append(int(step))
                        ys.append(value)
                        texts.append(f"{result.runs[r].name}: {p.states[r]} ({cls})")
        if xs:
            colour, symbol = CLASS_STYLE[cls]
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="markers",
                    name=f"{cls} spikes",
                    text=texts,
                    marker={"color": colour, "symbol": symbol, "size": 10},
                    hovertemplate="step %{x}<br>loss %{y:.4g}<br>%{text}<extra></extra>",
                )
            )
    fig.update_layout(
        height=480,
        xaxis_title="step (canonical, 0-based)",
        yaxis_title="loss",
        margin={"l": 60, "r": 20, "t": 30, "b": 50},
        legend={"orientation": "h"},
    )
    return fig


def _text_of(result: Comparison, sample_ids: list[int]) -> str:
    for run in result.runs:
        if run.sample_text is None:
            continue
        for sid in sample_ids:
            if sid in run.sample_text.index:
                return snippet(run.sample_text.loc[sid])
    return ""


def _rows(result: Comparison) -> str:
    removed = {id(p) for p in result.removed()}
    rows = []
    for p in result.positions:
        j = result.position_json(p)
        ids = (j["data_position"] or {}).get("sample_ids") or []
        values = "<br>".join(f"{esc(k)}: {esc(fmt_num(v))}" for k, v in j["values"].items())
        rows.append(
            f'<tr><td>{j["step"]} <span class="muted">(logged {j["logged_step"]})</span></td>'
            f'<td class="cls {esc(j["class"])}">{esc(j["class"])}{" (removed)" if id(p) in removed else ""}</td>'
            f"<td>{esc(', '.join(j['runs']))}</td><td>{values}</td>"
            f"<td><code>{esc(', '.join(map(str, ids)))}</code></td><td>{esc(_text_of(result, ids))}</td></tr>"
        )
    if not rows:
        return '<p class="muted">No loss spike in any run.</p>'
    return (
        "<table><thead><tr><th>step</th><th>class</th><th>spiked in</th><th>loss</th><th>samples</th>"
        f"<th>first sample's text</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def build_compare_html(result: Comparison) -> str:
    """compare.html as one string (module docstring)."""
    from plotly.offline import get_plotlyjs

    figs = {"compare": compare_figure(result)}
    runs = "".join(f"<li>{esc(r.name)}: <code>{esc(r.source)}</code> ({len(r.steps)} steps)</li>" for r in result.runs)
    ba = result.before_after() or {}
    pair = "".join(
        f"<li>{esc(k)}: {esc(fmt_num(ba[k][0]))} before, {esc(fmt_num(ba[k][1]))} after</li>"
        for k in ("jumpiness_share", "tokens_per_s")
        if k in ba
    )
    meaning = "".join(f'<li><span class="cls {c}">{c}</span>: {esc(MEANING[c])}</li>' for c in CLASSES)
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            f"<title>Compare: {esc(', '.join(r.name for r in result.runs))}</title><style>{_CSS}</style></head>",
            f"<body><main><h1>Runs compared</h1><p>{esc(result.sentence())}</p><ul>{runs}</ul>",
            f"<ul>{pair}</ul>" if pair else "",
            '<div id="fig-compare" style="height:480px"></div>',
            f'<h2>Spike positions</h2>{_rows(result)}<ul class="muted">{meaning}</ul>',
            '<footer class="muted">Made by loss-spike-forensics. Self-contained; works offline.</footer></main>',
            f'<script type="text/javascript">{get_plotlyjs()}</script>',
            f'<script type="application/json" id="compare-figures">{figures_json(figs)}</script>',
            f"<script>{_LOADER}</script></body></html>\n",
        ]
    )


def write_compare_html(path: str | Path, result: Comparison) -> Path:
    """Write :func:`build_compare_html` to ``path`` (UTF-8) and return the path."""
    out = Path(path)
    out.write_text(build_compare_html(result), encoding="utf-8")
    return out
