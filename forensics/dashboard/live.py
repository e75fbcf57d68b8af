"""The refresh loop: a Streamlit fragment that re-runs alone every few seconds, reads only the new rows and
redraws the head (the status strip, a line per cause), the curve and the open view; the page around it (sidebar,
scroll position, selections) stays.

``st.fragment(run_every=...)`` re-runs the fragment on a timer in the browser; paused, it runs only when one of its
own widgets changes. Tests (AppTest runs no timers) drive a refresh with an explicit rerun: every run of the
fragment is one :meth:`~forensics.dashboard.state.LiveRun.refresh`.
"""

from __future__ import annotations

import streamlit as st

from forensics.dashboard.state import LiveRun
from forensics.dashboard.text import md, spike_line, steps_text
from forensics.dashboard.views import VIEWS, header
from forensics.dashboard.views import run as curve

DEFAULT_INTERVAL_S = 5.0
VIEW_KEY = "view"


def controls() -> tuple[float, bool]:
    """The sidebar's interval (default 5 s) and pause toggle."""
    interval = st.sidebar.number_input(
        "Refresh every (s)", min_value=1.0, max_value=600.0, value=DEFAULT_INTERVAL_S, step=1.0, key="interval"
    )
    paused = st.sidebar.toggle("Pause refresh", value=False, key="paused")
    return float(interval), bool(paused)


def body(run: LiveRun, interval_s: float, paused: bool) -> None:
    """One refresh: read new rows, toast what they brought, draw the head, the curve and the chosen view."""
    new = run.refresh()
    if len(new) == 1:
        st.toast(md(f"new {spike_line(new[0].finding)}"), icon="⚠️")
    elif new:  # one toast per refresh: a burst of findings must not cover the page
        steps = sorted({int(n.finding.get("logged_step", n.finding.get("step"))) for n in new})
        st.toast(md(f"{len(new)} new findings at steps {steps_text(steps, 8)}"), icon="⚠️")
    header.render(run, interval_s, paused)
    curve.render(run)
    if st.session_state.get(curve.CLICKED):  # a click on a spike opens its cause's card
        st.session_state[VIEW_KEY] = "Causes"
    view = st.radio("View", list(VIEWS), horizontal=True, key=VIEW_KEY, label_visibility="collapsed")
    VIEWS[view or "Causes"](run)


def page(run: LiveRun, interval_s: float, paused: bool) -> None:
    """The live part of the page, refreshed every ``interval_s`` seconds unless paused."""
    fragment = st.fragment(run_every=None if paused else interval_s)(body)
    fragment(run, interval_s, paused)
