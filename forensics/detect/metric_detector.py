"""The online state of one metric, the piece a rule builds its live and offline answers from (not a rule itself).

A :class:`MetricDetector` (the spike detector, the NaN/inf detector, the jumpiness summary, the frameworks' own
rules in :mod:`forensics.evaluation.framework_rules`) watches one column of the metrics table:

- the constructor only stores documented parameters (:class:`~forensics.detect.params.ParamsMixin`: ``get_params()``
  returns them, ``clone()`` copies them, ``validate()`` checks them against ``parameter_constraints``);
- ``update(rows, tags=None) -> list[Finding]`` feeds the next rows and returns the findings that became final (the
  one online shape, :class:`~forensics.detect.base.OnlineRule`: ``tags`` is optional context);
- ``finish() -> list[Finding]`` returns what is still open as if the run ended now, without changing the state;
- ``detect(table, tags=None)`` = ``reset()`` + ``update(table)`` + ``finish()``.

Any split of a run into ``update`` calls followed by ``finish()`` gives the findings ``detect`` gives.
"""

from __future__ import annotations

import pandas as pd

from forensics.detect.base import OnlineRule
from forensics.detect.findings import Finding
from forensics.detect.params import ParamsMixin


class MetricDetector(ParamsMixin, OnlineRule):
    """Base of the per-metric states: parameters in ``__init__``, state in attributes ending with ``_``."""

    def reset(self) -> None:
        """Forget every row seen so far."""
        raise NotImplementedError

    def update(self, rows: pd.DataFrame, tags: pd.DataFrame | None = None) -> list[Finding]:
        """Feed the next rows (in step order); return the findings that became final."""
        raise NotImplementedError

    def finish(self) -> list[Finding]:
        """What is still open, as it would be reported if the run ended now (does not change the state)."""
        return []

    def detect(self, table: pd.DataFrame, tags: pd.DataFrame | None = None) -> list[Finding]:
        """The findings of a whole run: ``reset``, one ``update`` with every row, ``finish``."""
        self.reset()
        found = self.update(table, tags)
        return found + self.finish()
