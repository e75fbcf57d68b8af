"""The online state of one metric, the piece a rule builds its live and offline answers from (not a rule itself).

A :class:`MetricDetector` (the spike detector, the NaN/inf detector, the jumpiness summary, the frameworks' own
rules in :mod:`forensics.evaluation.framework_rules`) watches one column of the metrics table:

- the constructor only stores documented parameters (``get_params()`` returns them, ``clone()`` copies them);
- ``update(new_rows, tags=None) -> list[Finding]`` feeds the next rows and returns the findings that became final;
- ``finish() -> list[Finding]`` returns what is still open as if the run ended now, without changing the state;
- ``detect(table, tags=None)`` = ``reset()`` + ``update(table)`` + ``finish()``.

Any split of a run into ``update`` calls followed by ``finish()`` gives the findings ``detect`` gives.
"""

from __future__ import annotations

import inspect
from typing import Any

import pandas as pd

from forensics.detect.findings import Finding


class MetricDetector:
    """Base of the per-metric states: parameters in ``__init__``, state in attributes ending with ``_``."""

    def get_params(self) -> dict[str, Any]:
        """The constructor's parameters and their current values."""
        sig = inspect.signature(type(self).__init__)
        return {name: getattr(self, name) for name in sig.parameters if name != "self"}

    def clone(self) -> MetricDetector:
        """A fresh detector with the same parameters and no state."""
        return type(self)(**self.get_params())

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def reset(self) -> None:
        """Forget every row seen so far."""
        raise NotImplementedError

    def update(self, new_rows: pd.DataFrame, tags: pd.DataFrame | None = None) -> list[Finding]:
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
