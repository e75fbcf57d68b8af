"""The Streamlit dashboard: a live run beside its training, the same figures as ``report.html``.

``forensics dashboard [CASE | SOURCE...]`` (or ``streamlit run app.py -- [CASE | SOURCE...]``) serves
:func:`forensics.dashboard.app.main`. :mod:`~forensics.dashboard.state` holds the watched run (no Streamlit in it),
:mod:`~forensics.dashboard.live` the refresh loop, :mod:`~forensics.dashboard.views` one module per view.
"""

from forensics.dashboard.state import LiveRun, Target, resolve_target

__all__ = ["LiveRun", "Target", "resolve_target"]
