"""The report stage: plotly figures shared by the HTML report and the dashboard, and the terminal summary.

Every name is a plain import; plotly itself is imported by the functions that draw (:mod:`~forensics.report.style`),
so ``forensics.report.summary`` (every audit's terminal summary) does not load it: a JSON-only audit never pays for it.
"""

from __future__ import annotations

from forensics.report.cards import finding_cards
from forensics.report.downsample import minmax_indices, plot_indices, stride_indices
from forensics.report.figures import (
    bucket_loss_figure,
    cluster_loss_figure,
    cluster_mix_figure,
    composition_figure,
    group_loss_figure,
    loss_figure,
    report_figures,
)
from forensics.report.html import build_report, verdict, write_report

__all__ = [
    "build_report",
    "bucket_loss_figure",
    "cluster_loss_figure",
    "cluster_mix_figure",
    "composition_figure",
    "finding_cards",
    "group_loss_figure",
    "loss_figure",
    "minmax_indices",
    "plot_indices",
    "report_figures",
    "stride_indices",
    "verdict",
    "write_report",
]
