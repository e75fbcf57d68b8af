"""The protocol every detector follows (scikit-learn style), so that one object serves a finished and a live run.

- The constructor only stores documented parameters (no work, no validation of data): ``get_params()`` returns
  them and ``clone()`` makes a fresh detector with the same ones.
- ``update(new_rows, tags=None) -> list[Finding]`` feeds the next rows of a live run and returns the findings that
  became final with them. The detector keeps its state between calls.
- ``finish() -> list[Finding]`` returns what is still open or pending as it would be reported if the run ended now
  (it does not change the state, so a live view may call it at any time and keep updating afterwards).
- ``detect(table, tags=None)`` = ``reset()`` + ``update(table)`` + ``finish()``: the whole run at once.

Any split of a run into ``update`` calls followed by ``finish()`` gives the same findings as ``detect`` on the whole
run (each call returns its findings in step order; compare the union).
"""

from __future__ import annotations

import inspect
from typing import Any

import pandas as pd

from forensics.detect.findings import Finding

#: Scales a median absolute deviation to a standard deviation for normal noise (1 / Phi^-1(3/4)).
MAD_TO_SD = 1.4826

class Detector:
    """Base class: parameters in ``__init__``, state in attributes ending with ``_`` (created by ``reset``)."""

    def get_params(self) -> dict[str, Any]:
        """The constructor's parameters and their current values."""
        sig = inspect.signature(type(self).__init__)
        return {name: getattr(self, name) for name in sig.parameters if name != "self"}

    def clone(self) -> Detector:
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
