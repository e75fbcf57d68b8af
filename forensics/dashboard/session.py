"""Per-browser-session state: which run is watched (from the command line, or the sidebar), and its
:class:`~forensics.dashboard.state.LiveRun`, kept in ``st.session_state`` across reruns and refreshes."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

import streamlit as st

from forensics.dashboard.state import LiveRun, resolve_target
from forensics.errors import ForensicsError

RUN = "forensics_run"
TARGET = "forensics_target"


def target_args(argv: Sequence[str]) -> list[str]:
    """The sources this session watches: what the sidebar set, else the command line, else the demo case."""
    if TARGET not in st.session_state:
        args = [a for a in argv if a]
        if not args:
            from forensics.dashboard.demo import demo_case

            with st.spinner("Building the small demo run (first use only)..."):
                args = [str(demo_case("static"))]
        st.session_state[TARGET] = list(args)
    return list(st.session_state[TARGET])


def current_run(argv: Sequence[str]) -> LiveRun | None:
    """The session's run, opened on first use; bad input is shown as one error line (and ``None`` returned)."""
    args = target_args(argv)
    run = st.session_state.get(RUN)
    if run is not None and run.target_args == args:
        return run
    try:
        with st.spinner(f"Opening {' '.join(args)} (reading the metrics, fitting the tags)..."):
            run = LiveRun(resolve_target(args)).start()
    except ForensicsError as exc:
        st.error(f"forensics: {exc}")
        return None
    run.target_args = args
    st.session_state[RUN] = run
    return run


def sidebar_target() -> None:
    """A text box to watch other sources (a case folder, log files, a W&B run path); applied on Enter."""
    current = " ".join(shlex.quote(a) for a in st.session_state.get(TARGET, []))
    st.session_state.setdefault("target_text", current)
    text = st.sidebar.text_input(
        "Case folder or sources",
        key="target_text",
        help="a case folder, an HF Trainer output folder, log files, or a W&B run path "
        "entity/project/run_id (several separated by spaces)",
    )
    if text.strip() and text != current:
        try:
            st.session_state[TARGET] = shlex.split(text)
        except ValueError as exc:
            st.sidebar.error(f"could not split the sources: {exc}")
