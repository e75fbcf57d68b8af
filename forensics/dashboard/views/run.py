"""View 1, the run: loss / grad norm / lr with findings marked and steps coloured by bucket (the report's
:func:`~forensics.report.loss_figure`), and a step range redrawn at full resolution.

Plotly's own zoom happens in the browser and never reaches Python, so it can only magnify the downsampled points;
the range control here slices the tables and draws that range step by step (up to :data:`FULL_RESOLUTION` steps).
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from forensics.dashboard.state import LiveRun
from forensics.report import loss_figure
from forensics.report.downsample import DEFAULT_POINTS
from forensics.schema import STEP

#: Steps a chosen range may hold and still be drawn one point per step.
FULL_RESOLUTION = 20_000


def _from_slider() -> None:
    lo, hi = st.session_state["run_slider"]
    st.session_state["run_from"], st.session_state["run_to"] = int(lo), int(hi)


#: The range choices: label -> steps shown back from the newest (None: the whole run; 0: chosen by hand).
RANGES = {"whole run": None, "last 200 steps": 200, "last 1,000": 1000, "last 5,000": 5000, "choose": 0}
#: The curve's height on the page: with the strip above it, it fits a 1280x800 screen without scrolling.
HEIGHT = 370
#: The cause a click on a spike marker opened (read by the causes view).
CLICKED = "clicked_cause"


def step_range(run: LiveRun) -> tuple[int, int] | None:
    """The range the user chose (``None``: the whole run). "last N" follows the live end: each refresh moves it to
    the newest step. "choose": two inputs hold the range; the slider writes into them."""
    steps = run.metrics[STEP]
    lo, hi = int(steps.iloc[0]), int(steps.iloc[-1])
    pick = st.radio("Steps shown", list(RANGES), horizontal=True, key="run_range", label_visibility="collapsed")
    back = RANGES.get(pick or "whole run")
    if back is None or hi <= lo:
        return None
    if back:
        return max(lo, hi - back + 1), hi
    st.session_state.setdefault("run_from", max(lo, hi - 2000))
    st.session_state.setdefault("run_to", hi)
    c1, c2, c3 = st.columns([6, 1, 1])
    a = c2.number_input("from step", step=1, key="run_from")
    b = c3.number_input("to step", step=1, key="run_to")
    start, end = sorted((max(lo, min(int(a), hi)), max(lo, min(int(b), hi))))
    c1.slider("Step range", lo, hi, (start, end), key="run_slider", on_change=_from_slider)
    return start, end


def curve_columns(run: LiveRun) -> list[str]:
    """The loss and, when logged, the grad norm: the two curves a glance needs (the report draws the others)."""
    from forensics.schema import grad_norm_column, metric_columns

    cols = metric_columns(run.metrics)
    loss = run.loss_key if run.loss_key in cols else (cols[0] if cols else None)
    grad = (run.findings.get("run") or {}).get("grad_norm_key") or grad_norm_column(cols)
    return [c for c in dict.fromkeys((loss, grad)) if c is not None and c in cols]


def figure(run: LiveRun, start: int | None = None, end: int | None = None):
    """The loss and grad norm of ``[start, end]`` (the whole run when not given): full resolution when the range
    is short; spikes marked by severity; with a plan, each over its expected band (what the steps' composition
    predicts, as the spike rule judged them)."""
    metrics = run.metrics[[STEP, *curve_columns(run)]]
    expected = run.expected
    n_out = DEFAULT_POINTS
    if start is not None and end is not None:
        steps = metrics[STEP].to_numpy(np.int64)
        lo, hi = np.searchsorted(steps, start), np.searchsorted(steps, end, side="right")
        if hi - lo < len(metrics):
            metrics = metrics.iloc[lo:hi]
            n_out = max(DEFAULT_POINTS, min(hi - lo, FULL_RESOLUTION))
    findings = run.current_findings()
    fig = loss_figure(metrics, findings, run.tags, run.samples, run.loss_key, n_out=n_out, expected=expected)
    top = 40 + (fig.layout.margin.t or 105) - 105
    # the report's y-range buttons would sit on the legend here; the range control above replaces them
    fig.update_layout(
        height=HEIGHT + max(0, top - 40), margin=dict(t=max(40, top), b=35), title=None, uirevision=str(start is None)
    )
    fig.layout.updatemenus = ()
    return fig


def render(run: LiveRun) -> None:
    """The curve, with the range control above it; a click on a spike marker opens its cause's card."""
    if not len(run.metrics):
        st.info("No rows yet: the page fills in as the run writes.")
        return
    chosen = step_range(run)
    # a rerun with nothing new (a widget elsewhere, an idle refresh) reuses the figure instead of rebuilding it
    key = (
        id(run),
        len(run.metrics),
        run.last_step,
        len(run.new_findings),
        len(run.causes),
        chosen,
        None if run.tags is None else len(run.tags),
    )
    cached = st.session_state.get("fig_curves_cache")
    if cached is not None and cached[0] == key:
        fig = cached[1]
    else:
        fig = figure(run, *(chosen or (None, None)))
        st.session_state["fig_curves_cache"] = (key, fig)
    event = st.plotly_chart(fig, width="stretch", key="fig_curves", on_select="rerun", selection_mode="points")
    points = list(((event or {}).get("selection") or {}).get("points") or []) if event is not None else []
    picked = clicked_cause(run, points)
    if picked and picked != st.session_state.get(CLICKED + "_last"):
        st.session_state[CLICKED] = st.session_state[CLICKED + "_last"] = picked


def clicked_cause(run: LiveRun, points: list[dict]) -> str | None:
    """The cause a click on the curve picked: a spike marker's own cause id (its ``customdata``), else the cause of
    the spike whose steps hold the clicked point's step. A spike's marker sits on the curve's own point at its
    peak, and plotly hands the click to whichever of the two it finds first, so both must open the cause."""
    for p in points:
        if p.get("customdata"):
            return str(p["customdata"])
    spikes = [s for s in run.current_findings().get("spikes") or [] if s.get("cause")]
    for p in points:
        x = p.get("x")
        if x is None:
            continue
        for s in spikes:
            start = int(s["step"])
            end = int(s.get("end_step") if s.get("end_step") is not None else start)
            if start <= int(x) <= end or int(s.get("peak_step", start)) == int(x):
                return str(s["cause"])
    return None
