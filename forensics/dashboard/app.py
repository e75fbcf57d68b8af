"""The Streamlit page: sidebar (sources, refresh interval, pause, re-fit) and the live fragment.

Run with ``forensics dashboard [CASE | SOURCE...]`` or ``streamlit run app.py -- [CASE | SOURCE...]``; the
arguments after ``--`` reach the script as ``sys.argv[1:]``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import streamlit as st

from forensics.dashboard import live, session
from forensics.dashboard.text import md


def main(argv: Sequence[str] | None = None) -> None:
    """Draw the page for this session (Streamlit re-runs this on every interaction)."""
    st.set_page_config(page_title="loss-spike forensics", layout="wide")
    argv = list(sys.argv[1:] if argv is None else argv)
    st.sidebar.title("loss-spike forensics")
    session.target_args(argv)
    session.sidebar_target()
    run = session.current_run(argv)
    interval, paused = live.controls()
    if run is None:
        return
    if st.sidebar.button(
        "Re-fit tags",
        help="fit bucket boundaries and clusters again on everything recorded so "
        "far (new plan parts are otherwise tagged with those fitted at start)",
    ):
        with st.spinner("Re-fitting tags..."):
            run.refit()
    st.sidebar.caption(md(f"watching {run.target.label}"))
    live.page(run, interval, paused)
