"""The one self-contained HTML report: verdict, curves, one card per finding, buckets, clusters, composition.

The file opens offline: plotly's JavaScript is inlined once, figures are embedded as JSON and drawn with
``Plotly.newPlot``, styles use the system font stack, and nothing references the network. The same inputs give
byte-identical output (no timestamps).

Embedded JSON is made safe for a ``<script>`` element by writing ``<``, ``>`` and ``&`` as ``\\u003c``, ``\\u003e``
and ``\\u0026`` (and U+2028/U+2029 escaped), so dataset text such as ``</script>`` can never end the element.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from forensics.detect.causes.verdict import verdict
from forensics.report.cards import finding_cards
from forensics.report.overview import CAUSE_COLUMNS, SAMPLE_COLUMNS, cause_rows, sample_groups, strip_html, strip_of
from forensics.report.text import esc, fmt_share, script_safe_json
from forensics.schema import EPOCH, STEP, find_loss_key, metric_columns

if TYPE_CHECKING:
    import plotly.graph_objects as go

#: Where each figure goes: the curves before the cards, the context after them.
_SECTIONS = (
    ("curves", "Curves", ("curves",)),
    ("buckets", "Buckets and clusters", ("bucket_loss", "cluster_loss", "cluster_mix")),
    ("composition", "Batch composition", ("composition",)),
)
_PLOT_CONFIG = {"responsive": True, "displaylogo": False, "modeBarButtonsToRemove": ["lasso2d", "select2d"]}


def figures_json(figs: dict[str, go.Figure]) -> str:
    """All figures as one script-safe JSON object ``{name: {data, layout}}`` (numpy arrays as typed base64)."""
    import plotly.io as pio

    parts = [f"{json.dumps(name)}:{pio.to_json(fig, validate=False, pretty=False)}" for name, fig in figs.items()]
    return script_safe_json("{" + ",".join(parts) + "}")


def _severity(findings: dict) -> str:
    """The verdict's colour: the most severe cause (red for critical, amber for a warning)."""
    severities = {str(c.get("severity")) for c in findings.get("causes") or [] if isinstance(c, dict)}
    return "alert" if "critical" in severities else "warn" if "warning" in severities else "ok"


def _run_line(
    metrics: pd.DataFrame,
    loss_key: str,
    tags: pd.DataFrame | None,
    plan: pd.DataFrame | None,
    samples: pd.DataFrame | None,
    plan_on_engine: bool = False,
) -> str:
    steps = metrics[STEP].to_numpy(np.int64)
    bits = [f"{len(steps):,} steps" + (f" ({steps.min()}–{steps.max()})" if len(steps) else "")]
    for table in (tags, plan):
        if table is not None and EPOCH in table.columns and len(table):
            bits.append(f"{int(table[EPOCH].nunique())} epochs")
            break
    cols = metric_columns(metrics)
    shown = ", ".join(cols[:6]) + (f" and {len(cols) - 6} more" if len(cols) > 6 else "")
    bits.append(f"metrics: {shown}")
    bits.append(f"loss: {loss_key}")
    if samples is not None:
        bits.append(f"{len(samples):,} samples")
    if plan is None:
        bits.append("batch plan read through an engine" if plan_on_engine else "no batch plan")
    return " · ".join(esc(b) for b in bits)


def _tiles(findings: dict) -> str:
    spikes = findings.get("spikes") or []
    osc = findings.get("oscillation") or {}
    pf = findings.get("plan")
    tiles = [
        ("spikes", str(len(spikes)), "alert" if spikes else "ok"),
        ("NaN/inf values", str(len(findings.get("nonfinite") or [])), "alert" if findings.get("nonfinite") else "ok"),
    ]
    if isinstance(osc, dict) and osc.get("bucket_variance_share") is not None:
        tiles.append(("jumpiness explained by bucket", fmt_share(osc["bucket_variance_share"]), "info"))
    if isinstance(osc, dict) and "detected" in osc:
        tiles.append(("oscillation", "yes" if osc.get("detected") else "no", "warn" if osc.get("detected") else "ok"))
    if isinstance(pf, dict):
        if pf.get("static") is not None:
            tiles.append(("batch plan", "static" if pf["static"] else "varies", "alert" if pf["static"] else "ok"))
        retention = [v for v in pf.get("pair_retention") or [] if v is not None]
        if retention:
            tiles.append(("max pair retention", fmt_share(max(retention)), "info"))
    else:
        tiles.append(("batch plan", "not given", "info"))
    cells = "".join(
        f'<div class="tile {cls}"><div class="v">{esc(v)}</div><div class="k">{esc(k)}</div></div>'
        for k, v, cls in tiles
    )
    return f'<div class="tiles">{cells}</div>'


def _warnings(findings: dict) -> str:
    items = [w for w in findings.get("warnings") or [] if w]
    if not items:
        return ""
    lis = "".join(f"<li>{esc(w if isinstance(w, str) else json.dumps(w, default=str))}</li>" for w in items[:200])
    more = f"<li>… and {len(items) - 200} more</li>" if len(items) > 200 else ""
    return (
        f'<section id="warnings"><h2>Data warnings</h2><p class="muted">Kept as data, not fatal: what the inputs '
        f'contained that you may want to know.</p><ul class="warnings">{lis}{more}</ul></section>'
    )


def _strip(findings: dict, metrics: pd.DataFrame) -> str:
    """The dashboard's status strip, as of the run's last step (a report has no row age)."""
    causes = [c for c in findings.get("causes") or [] if isinstance(c, dict)]
    return f'<div class="strip-wrap">{strip_html(strip_of(causes, metrics))}</div>'


def _overview(findings: dict) -> str:
    """The causes and the harmful samples as sortable tables, as the dashboard shows them; '' when there are none."""
    causes = [c for c in findings.get("causes") or [] if isinstance(c, dict)]
    harmful = [h for h in findings.get("harmful_samples") or [] if isinstance(h, dict)]
    if not causes and not harmful:
        return ""
    from forensics.report.overview import table_html

    parts = ['<section id="causes"><h2>Causes</h2>']
    if causes:
        rows = cause_rows(causes)
        columns = {k: v for k, v in CAUSE_COLUMNS.items() if k not in ("class", "replay") or any(r[k] for r in rows)}
        parts.append(table_html(rows, columns, "causes-table"))
    if harmful:
        rows = [dict(r, effect=f"{r['effect']:+.0%}") for r in sample_groups(harmful)]
        parts.append(
            '<h3 style="margin-top:14px">Harmful samples <small>(samples always consumed together share '
            "a row: the run cannot tell them apart)</small></h3>"
        )
        parts.append(table_html(rows, SAMPLE_COLUMNS, "samples-table"))
    parts.append("</section>")
    return "".join(parts)


def _plot_div(name: str, fig: go.Figure) -> str:
    """The element a figure is drawn into, sized to the figure's height so the page does not reflow or overlap."""
    height = int(fig.layout.height or 450)
    return (
        f'<div class="plot-frame"><div class="plot" id="fig-{esc(name)}" data-figure="{esc(name)}" '
        f'style="height:{height}px"></div></div>'
    )


def build_report(
    findings: dict,
    metrics: pd.DataFrame,
    tags: pd.DataFrame | None = None,
    samples: pd.DataFrame | None = None,
    plan: pd.DataFrame | None = None,
    loss_key: str | None = None,
    title: str = "Loss-spike forensics",
    figures: dict[str, go.Figure] | None = None,
    replay: dict | None = None,
    batch_rows: pd.DataFrame | None = None,
    expected: pd.DataFrame | None = None,
) -> str:
    """The report as one HTML string (see the module docstring); ``figures`` overrides :func:`report_figures`;
    ``replay``: the case's ``replay/replay.json``, whose verdicts show on the cards of their causes;
    ``batch_rows``: the rows of the spikes' peak steps of a plan too large to load (``plan`` is then None: the
    figures draw on the tags, the cards show these batches); ``expected``: each step's expected value from its
    composition (the audit's ``expected`` table), drawn as a band on the curves."""
    from plotly.offline import get_plotlyjs

    from forensics.report.figures import report_figures

    findings = findings or {}
    loss_key = find_loss_key(metric_columns(metrics), loss_key or (findings.get("run") or {}).get("loss_key"))
    figs = (
        figures if figures is not None else report_figures(findings, metrics, tags, samples, plan, loss_key, expected)
    )
    cards = finding_cards(findings, samples, plan if plan is not None else batch_rows, tags, loss_key, replay)
    sections = []
    for key, heading, names in _SECTIONS:
        present = [n for n in names if n in figs]
        if present:
            plots = "".join(_plot_div(n, figs[n]) for n in present)
            sections.append((key, f'<section id="{key}"><h2>{esc(heading)}</h2>{plots}</section>'))
        if key == "curves":
            overview = _overview(findings)
            if overview:
                sections.append(("causes", overview))
            body = "\n".join(cards) if cards else '<p class="muted">Nothing to report: no finding.</p>'
            sections.append(
                ("findings", f'<section id="findings"><h2>Findings</h2><div class="cards">{body}</div></section>')
            )
    placed = {n for _, _, names in _SECTIONS for n in names}
    rest = [n for n in figs if n not in placed]
    if rest:
        plots = "".join(_plot_div(n, figs[n]) for n in rest)
        sections.append(("more", f'<section id="more"><h2>More</h2>{plots}</section>'))
    nav = "".join(f'<a href="#{k}">{esc(k.capitalize())}</a>' for k, _ in sections)
    severity = _severity(findings)
    head = (
        f'<header class="top"><div class="brand">{esc(title)}</div><nav>{nav}</nav></header>'
        f'<div class="verdict {severity}"><div class="label">Verdict</div>'
        f"<p>{esc(verdict(findings, loss_key))}</p></div>"
        f"{_strip(findings, metrics)}"
        f'<p class="run">{_run_line(metrics, loss_key, tags, plan, samples, batch_rows is not None)}</p>'
        f"{_tiles(findings)}"
    )
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f'<meta name="forensics-figures" content="{len(figs)}">',
            f"<title>{esc(title)}</title><style>{_CSS}</style></head><body><main>",
            head,
            "".join(html for _, html in sections),
            _warnings(findings),
            "<footer>Made by loss-spike-forensics. This file is self-contained and works offline.</footer>",
            "</main>",
            f'<script type="text/javascript">{get_plotlyjs()}</script>',
            f'<script type="application/json" id="forensics-figures">{figures_json(figs)}</script>',
            f"<script>{_LOADER % json.dumps(_PLOT_CONFIG)}</script>",
            "</body></html>\n",
        ]
    )


def write_report(path: str | Path, findings: dict, metrics: pd.DataFrame, **kwargs: Any) -> Path:
    """Write :func:`build_report`'s HTML to ``path`` (UTF-8) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(build_report(findings, metrics, **kwargs), encoding="utf-8")
    return path


_LOADER = """
(function () {
  var figs = JSON.parse(document.getElementById('forensics-figures').textContent);
  var config = %s;
  Object.keys(figs).forEach(function (name) {
    var el = document.getElementById('fig-' + name);
    if (el) { Plotly.newPlot(el, figs[name].data, figs[name].layout, config); }
  });
  document.querySelectorAll('script.card-figure').forEach(function (s) {
    var fig = JSON.parse(s.textContent), el = document.getElementById(s.dataset.target);
    if (el) { Plotly.newPlot(el, fig.data, fig.layout, config); }
  });
  document.querySelectorAll('table.sortable th').forEach(function (th) {
    th.style.cursor = 'pointer';
    th.title = 'sort';
    th.addEventListener('click', function () {
      var table = th.closest('table'), body = table.tBodies[0], col = Number(th.dataset.col);
      var dir = th.dataset.dir === 'asc' ? -1 : 1;
      th.dataset.dir = dir === 1 ? 'asc' : 'desc';
      var key = function (tr) { var t = tr.cells[col].textContent, n = parseFloat(t.replace(/[%%+,]/g, ''));
        return isNaN(n) ? t : n; };
      Array.from(body.rows).sort(function (a, b) { var x = key(a), y = key(b);
        return (x < y ? -1 : x > y ? 1 : 0) * dir; }).forEach(function (tr) { body.appendChild(tr); });
    });
  });
  document.querySelectorAll('button.zoom').forEach(function (b) {
    b.addEventListener('click', function () {
      var el = document.getElementById('fig-curves');
      if (!el) { return; }
      var x0 = Number(b.dataset.x0), x1 = Number(b.dataset.x1), pad = Math.max(30, (x1 - x0) * 3);
      var update = {'xaxis.range': [x0 - pad, x1 + pad]};
      Object.keys(el.layout).forEach(function (k) { if (/^yaxis\\d*$/.test(k)) { update[k + '.autorange'] = true; } });
      Plotly.relayout(el, update);
      el.scrollIntoView({behavior: 'smooth', block: 'start'});
    });
  });
})();
"""

_CSS = """
:root { --ink:#1f2933; --muted:#6b7280; --line:#e5e7eb; --bg:#f6f7f9; --alert:#c0392b; --warn:#b7791f;
  --ok:#2f855a; --info:#2b6cb0; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
  font:14px/1.5 -apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width:1240px; margin:0 auto; padding:0 24px 48px; }
header.top { display:flex; align-items:center; justify-content:space-between; padding:18px 0 12px;
  border-bottom:1px solid var(--line); margin-bottom:18px; }
.brand { font-weight:700; font-size:18px; letter-spacing:.2px; }
nav a { color:var(--muted); text-decoration:none; margin-left:18px; font-size:13px; }
nav a:hover { color:var(--ink); }
h2 { font-size:17px; margin:34px 0 12px; }
h3 { font-size:15px; margin:0; } h3 small { color:var(--muted); font-weight:400; }
h4 { font-size:12px; text-transform:uppercase; letter-spacing:.6px; color:var(--muted); margin:16px 0 6px; }
.verdict { background:#fff; border:1px solid var(--line); border-left:6px solid var(--ok); border-radius:8px;
  padding:14px 18px; }
.verdict.alert { border-left-color:var(--alert); } .verdict.warn { border-left-color:var(--warn); }
.verdict .label { font-size:11px; text-transform:uppercase; letter-spacing:.8px; color:var(--muted); }
.verdict p { margin:4px 0 0; font-size:18px; font-weight:600; }
.run { color:var(--muted); font-size:13px; margin:10px 2px; }
.tiles { display:flex; flex-wrap:wrap; gap:10px; margin-top:6px; }
.tile { background:#fff; border:1px solid var(--line); border-radius:8px; padding:10px 14px; min-width:130px; }
.tile .v { font-size:20px; font-weight:700; } .tile .k { font-size:12px; color:var(--muted); }
.tile.alert .v { color:var(--alert); } .tile.warn .v { color:var(--warn); } .tile.ok .v { color:var(--ok); }
.tile.info .v { color:var(--info); }
.strip-wrap { margin:10px 0; }
table.overview { width:100%; border-collapse:collapse; background:#fff; font-size:13px; }
table.overview th, table.overview td { text-align:left; padding:5px 8px; border-bottom:1px solid var(--line);
  vertical-align:top; }
table.overview th { font-size:12px; color:var(--muted); user-select:none; }
.plot-frame { background:#fff; border:1px solid var(--line); border-radius:8px; padding:8px 6px 4px;
  margin-bottom:14px; }
.plot { width:100%; }
.cards { display:grid; grid-template-columns:1fr; gap:14px; }
.card { background:#fff; border:1px solid var(--line); border-radius:8px; padding:14px 18px; }
.card header { display:flex; align-items:center; gap:10px; flex-wrap:wrap; }
.badge { font-size:11px; font-weight:700; text-transform:uppercase; letter-spacing:.5px; padding:2px 8px;
  border-radius:10px; color:#fff; background:var(--info); }
.badge.alert { background:var(--alert); } .badge.ok { background:var(--ok); } .badge.warn { background:var(--warn); }
button.zoom { margin-left:auto; font:inherit; font-size:12px; color:var(--info); background:none;
  border:1px solid #c9d6ea; border-radius:6px; padding:3px 10px; cursor:pointer; }
button.zoom:hover { background:#eef4fb; }
dl.numbers { display:grid; grid-template-columns:repeat(auto-fill, minmax(150px, 1fr)); gap:8px 16px; margin:12px 0 0; }
dl.numbers div { border-left:2px solid var(--line); padding-left:8px; }
dt { font-size:11px; color:var(--muted); } dd { margin:0; font-weight:600; font-variant-numeric:tabular-nums;
  overflow-wrap:anywhere; }
ul { margin:4px 0; padding-left:20px; }
.scroll { overflow-x:auto; }
table { border-collapse:collapse; width:100%; font-size:13px; }
th { text-align:left; font-weight:600; color:var(--muted); font-size:12px; border-bottom:1px solid var(--line);
  padding:4px 8px; }
td { border-bottom:1px solid #f0f1f3; padding:4px 8px; vertical-align:top; font-variant-numeric:tabular-nums; }
td.num, th.num { text-align:right; }
table.recurrence { width:auto; min-width:50%; }
td.text { font-family:ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size:12px; color:#374151;
  max-width:560px; overflow-wrap:anywhere; }
td.text pre { white-space:pre-wrap; margin:6px 0; max-height:300px; overflow:auto; background:#f9fafb; padding:8px; }
td.text summary { cursor:pointer; }
tr.is-suspect td { background:#fff7f5; }
.suspect { display:inline-block; font-size:11px; font-weight:700; color:var(--alert); }
.next { background:#f3f8ff; border-radius:6px; padding:10px 12px; margin:14px 0 0; }
.next span { display:block; font-size:11px; text-transform:uppercase; letter-spacing:.6px; color:var(--info);
  font-weight:700; }
.muted { color:var(--muted); }
code { font-family:ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size:12px; }
ul.warnings { background:#fff; border:1px solid var(--line); border-radius:8px; padding:10px 28px; }
footer { color:var(--muted); font-size:12px; margin-top:40px; }
"""
