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

Names resolve on first use, so importing the package costs nothing until one is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "compare_runs": "core",
    "Comparison": "result",
    "ComparedRun": "runs",
    "load_run": "runs",
    "classify": "classes",
    "align": "align",
    "StepSamples": "positions",
    "build_compare_html": "html",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'forensics.compare' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"forensics.compare.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
