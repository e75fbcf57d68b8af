"""The report stage: plotly figures shared by the HTML report and the dashboard, and the terminal summary.

Names resolve on first use (PEP 562), so ``forensics.report.summary`` (every audit's terminal summary) does not
import plotly and the figures: a JSON-only audit never pays for them.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "finding_cards": "cards",
    "minmax_indices": "downsample",
    "plot_indices": "downsample",
    "stride_indices": "downsample",
    "bucket_loss_figure": "figures",
    "cluster_loss_figure": "figures",
    "cluster_mix_figure": "figures",
    "composition_figure": "figures",
    "group_loss_figure": "figures",
    "loss_figure": "figures",
    "report_figures": "figures",
    "build_report": "html",
    "verdict": "html",
    "write_report": "html",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'forensics.report' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"forensics.report.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
