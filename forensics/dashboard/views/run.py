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


def step_range(run: LiveRun) -> tuple[int, int] | None:
    """The range the user chose (``None``: the whole run, following new steps). The two inputs hold the range;
    the slider writes into them."""
    steps = run.metrics[STEP]
    lo, hi = int(steps.iloc[0]), int(steps.iloc[-1])
    whole = st.checkbox("Whole run (follows new steps)", value=True, key="run_whole")
    if whole or hi <= lo:
        return None
    st.session_state.setdefault("run_from", max(lo, hi - 2000))
    st.session_state.setdefault("run_to", hi)
    c1, c2, c3 = st.columns([6, 1, 1])
    a = c2.number_input("from step", step=1, key="run_from")
    b = c3.number_input("to step", step=1, key="run_to")
    start, end = sorted((max(lo, min(int(a), hi)), max(lo, min(int(b), hi))))
    c1.slider("Step range", lo, hi, (start, end), key="run_slider", on_change=_from_slider)
    return start, end


def figure(run: LiveRun, start: int | None = None, end: int | None = None):
    """The curves of ``[start, end]`` (the whole run when not given): full resolution when the range is short."""
    metrics = run.metrics
    n_out = DEFAULT_POINTS
    if start is not None and end is not None:
        steps = metrics[STEP].to_numpy(np.int64)
        lo, hi = np.searchsorted(steps, start), np.searchsorted(steps, end, side="right")
        if hi - lo < len(metrics):
            metrics = metrics.iloc[lo:hi]
            n_out = max(DEFAULT_POINTS, min(hi - lo, FULL_RESOLUTION))
    return loss_figure(metrics, run.current_findings(), run.tags, run.samples, run.loss_key, n_out=n_out)


def render(run: LiveRun) -> None:
    if not len(run.metrics):
        st.info("No rows yet: the page fills in as the run writes.")
        return
    chosen = step_range(run)
    # a rerun with nothing new (a widget elsewhere, an idle refresh) reuses the figure instead of rebuilding it
    key = (id(run), len(run.metrics), run.last_step, len(run.new_findings), chosen,
           None if run.tags is None else len(run.tags))
    cached = st.session_state.get("fig_curves_cache")
    if cached is not None and cached[0] == key:
        fig = cached[1]
    else:
        fig = figure(run, *(chosen or (None, None)))
        st.session_state["fig_curves_cache"] = (key, fig)
    st.plotly_chart(fig, width="stretch", key="fig_curves")
