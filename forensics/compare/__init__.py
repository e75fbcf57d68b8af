"""Runs side by side: do the same spikes happen in another run (the rerun, the fix, another seed)?

- :mod:`~forensics.compare.runs`: one run's loss curve, loss spikes (its audit's), plan and headline numbers;
- :mod:`~forensics.compare.positions`: data positions, the samples a step consumed and where another run
  consumed them;
- :mod:`~forensics.compare.align`: spikes of several runs joined by step or by data position, and every run's
  state at each;
- :mod:`~forensics.compare.classes`: the one rule that classes a position ``recurring``, ``vanished`` or
  ``unique``;
- :mod:`~forensics.compare.result`: compare.json and the before/after pair;
- :mod:`~forensics.compare.html`: compare.html (the curves overlaid, the spikes marked by class);
- :mod:`~forensics.compare.core`: :func:`compare_runs`, the library behind ``forensics compare``.

plotly is imported by the functions that draw (:mod:`~forensics.compare.html`), so importing the package does not
load it.
"""

from __future__ import annotations

from forensics.compare.align import align
from forensics.compare.classes import classify
from forensics.compare.core import compare_runs
from forensics.compare.html import build_compare_html
from forensics.compare.positions import StepSamples
from forensics.compare.result import Comparison
from forensics.compare.runs import ComparedRun, load_run

__all__ = [
    "ComparedRun",
    "Comparison",
    "StepSamples",
    "align",
    "build_compare_html",
    "classify",
    "compare_runs",
    "load_run",
]
