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
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pandas as pd

from forensics.detect.findings import Finding
from forensics.errors import ForensicsError
from forensics.schema import MAX_LEN, STEP, written

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


@dataclass
class RunTables:
    """What the detect stage reads: the tables of DESIGN.md, never another stage's internals.

    ``metrics``: the metrics table (null = not written); ``analysed``: the metrics judged for spikes (the loss and
    grad-norm keys by default); ``tags``: step tags; ``plan``: the step-mapped plan; ``samples``: the sample tags;
    ``sections``: the plan stage's typed results as findings.json sections (``plan`` = the gate, ``whatif``).
    """

    metrics: pd.DataFrame
    loss_key: str
    analysed: list[str]
    grad_norm_key: str | None = None
    tags: pd.DataFrame | None = None
    plan: pd.DataFrame | None = None
    samples: pd.DataFrame | None = None
    boundaries: list[int] | None = None
    max_len: int = MAX_LEN
    sections: dict[str, Any] = field(default_factory=dict)
    #: Every metrics source said how it counts steps (a recognised convention, or an offset given): not checked.
    steps_known: bool = False
    #: Steps each logged value covers (HF's ``loss`` is the mean over ``logging_steps``); 1: one step each.
    logging_steps: int = 1

    @property
    def has_plan(self) -> bool:
        return self.plan is not None and self.samples is not None

    def written_rows(self, metric: str) -> pd.DataFrame:
        """``step`` and ``metric`` on the rows where it was written (a cell never logged is not a value)."""
        return self.metrics.loc[written(self.metrics, metric), [STEP, metric]]


class Rule(Detector):
    """A rule of the audit: ``detect(run)`` reads :class:`RunTables` and the findings of the rules before it.

    Class attributes: ``name`` (its ``[detect.<name>]`` table in run.toml, ``--set detect.<name>.<param>=v``),
    ``needs_plan`` (skipped without a plan), ``replaces`` (a kind whose findings this rule returns anew, enriched:
    attribution rewrites the spikes). After ``detect``, ``section_`` holds its findings.json section, if it has one
    (``section_name``). Parameters are the constructor's, documented there, checked once in ``_check``.
    """

    name: ClassVar[str] = ""
    needs_plan: ClassVar[bool] = False
    replaces: ClassVar[str | None] = None
    section_name: ClassVar[str | None] = None

    def _check(self) -> None:
        """Raise :class:`~forensics.errors.ForensicsError` naming a parameter whose value is not allowed."""

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:  # type: ignore[override]
        raise NotImplementedError

    def reset(self) -> None:
        self.section_: dict[str, Any] | None = None


def check_positive(rule: Rule, *names: str) -> None:
    """Each named parameter of ``rule`` must be a positive number."""
    for n in names:
        v = getattr(rule, n)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ForensicsError(f"detect.{rule.name}: '{n}' must be a positive number; got {v!r}")
