"""The one protocol of the detect stage: a :class:`Rule` reads :class:`RunTables` and returns findings.

- The constructor only stores documented parameters; ``parameter_constraints`` declares what each may be
  (:mod:`forensics.detect.params`) and :meth:`Rule.validate` checks them once, when an audit builds its rules.
- ``required_columns`` declares the columns a rule reads from each table; :meth:`Rule.check_inputs` turns a missing
  one into the error message, so no rule writes its own.
- ``detect(run, found=None)`` judges a whole run; ``found`` holds the findings of the rules before it (attribution
  reads the spikes, causes read everything).
- A rule that also runs live returns an :class:`OnlineRule` from ``online(run)``: ``update(rows)`` takes the next
  metrics rows and returns the findings that became final with them; ``finish()`` returns what is still open as if the
  run ended now. Any chunking followed by ``finish()`` gives what ``detect`` gives on the whole run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import pandas as pd

from forensics.detect.findings import Finding
from forensics.detect.params import ParamsMixin
from forensics.detect.plan_view import FramePlan, PlanView
from forensics.errors import ForensicsError
from forensics.schema import MAX_LEN, STEP, written


@dataclass
class RunTables:
    """What the detect stage reads: the tables of docs/architecture.md, never another stage's internals.

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
    #: Logged step = canonical step + this (HF's ``global_step`` counts from 1); 0 when the logs count from 0.
    logged_offset: int = 0
    #: The trainer's gradient clipping threshold (run.toml ``max_grad_norm``), None when unknown.
    max_grad_norm: float | None = None
    #: The case folder as the commands the tool prints name it (None: metrics given alone), whether a replay can
    #: run on it, and else what it lacks (next steps name only commands that can run).
    case_path: str | None = None
    #: run.toml's ``[detect.<rule>]`` tables (a rule that rebuilds another's finding takes its parameters here).
    rule_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    replay_ready: bool = False
    replay_missing: str = ""
    #: The held-out loss (run.toml ``eval_loss_key``, else found as the loss key is); None when none is logged.
    eval_loss_key: str | None = None
    #: The run's checkpoints as ``(step, path)`` (checkpoint N = the state after N updates: HF ``checkpoint-N/``,
    #: run.toml ``checkpoints``), step order; None when the case names none (the run may still have some).
    checkpoints: list[tuple[int, str]] | None = None
    #: Run health: the sources' rewinds (steps as metrics steps), the text files read for crash lines, and the
    #: accelerator's memory (run.toml ``device_memory_gb``).
    rewinds: list[Any] = field(default_factory=list)
    log_files: list[str] = field(default_factory=list)
    device_memory_gb: float | None = None
    #: A plan too large to load, read through an engine where it lies (docs/scale.md); ``plan`` is then None.
    plan_source: PlanView | None = None
    _view: PlanView | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def has_plan(self) -> bool:
        return (self.plan is not None or self.plan_source is not None) and self.samples is not None

    @property
    def plan_view(self) -> PlanView | None:
        """What the rules read of the plan (:mod:`forensics.detect.plan_view`): the engine's view of a plan too
        large to load, else a view of ``plan`` whose chunks stop at the metrics' last step; None without a plan."""
        if self.plan_source is not None:
            return self.plan_source
        if self.plan is None:
            return None
        last = int(self.metrics[STEP].max()) if len(self.metrics) else None
        if self._view is None or self._view.plan is not self.plan or self._view.last_step != last:
            self._view = FramePlan(self.plan, last_step=last)
        return self._view

    def written_rows(self, metric: str) -> pd.DataFrame:
        """``step`` and ``metric`` on the rows where it was written (a cell never logged is not a value)."""
        return self.metrics.loc[written(self.metrics, metric), [STEP, metric]]


@runtime_checkable
class OnlineRule(Protocol):
    """The one online shape: what a rule's ``online(run)`` returns, and what every engine behind it offers (the spike
    driver, :class:`~forensics.detect.metric_detector.MetricDetector` and its detectors).

    ``update(rows)`` alone drives any of them; an engine may take further context after ``rows`` (the step tags,
    the joint evidence), always optional, so the live loop and the tests feed every one the same way.
    """

    def update(self, rows: pd.DataFrame) -> list[Finding]:
        """Feed the next metrics rows (in step order); return the findings that became final with them."""
        ...

    def finish(self) -> list[Finding]:
        """What is still open, as it would be reported if the run ended now (the state is not changed)."""
        ...


class Rule(ParamsMixin):
    """A rule of the audit (module docstring). Class attributes:

    ``name`` (its ``[detect.<name>]`` table), ``needs_plan`` (skipped without a plan), ``replaces`` (a kind whose
    findings this rule returns anew, enriched: attribution rewrites the spikes), ``section_name`` (the findings.json
    section it fills: after ``detect``, ``section_`` holds it), ``explains``, ``parameter_constraints``,
    ``required_columns``
    (``{"metrics" | "tags" | "plan" | "samples": (column, ...)}``). After ``detect``, ``warnings_`` lists what the user
    should know.
    """

    name: ClassVar[str] = ""
    needs_plan: ClassVar[bool] = False
    replaces: ClassVar[str | None] = None
    section_name: ClassVar[str | None] = None
    #: Enriches or groups the findings of the rules before it (attribution, causes): the live loop runs it again
    #: whenever new findings arrive, while whole-run rules keep the audit's answer until the run ends.
    explains: ClassVar[bool] = False
    #: The kinds this rule finds from what arrives beside the metrics (rewinds, crash lines), cheaply: the live loop
    #: runs it again whenever that changes, in place of the audit's findings of these kinds; empty: the audit's
    #: answer stands until the run ends.
    live_kinds: ClassVar[tuple[str, ...]] = ()
    required_columns: ClassVar[Mapping[str, tuple[str, ...]]] = {}

    def param_owner(self) -> str:
        """Errors name ``detect.<name>.<param>``'s table, as run.toml and ``--set`` spell it."""
        return f"detect.{self.name}"

    def check_inputs(self, run: RunTables) -> None:
        """Raise the declared message when a table this rule reads lacks a column it needs."""
        for table, columns in self.required_columns.items():
            frame = getattr(run, table)
            if frame is None:
                continue
            missing = [c for c in columns if c not in frame.columns]
            if missing:
                raise ForensicsError(
                    f"detect.{self.name}: the {table} table lacks column '{missing[0]}' (this rule "
                    f"reads {', '.join(columns)}); it has {', '.join(map(str, frame.columns[:12]))}"
                )

    def reset(self) -> None:
        self.section_: Any = None
        self.warnings_: list[str] = []

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        raise NotImplementedError

    def online(self, run: RunTables) -> OnlineRule | None:
        """This rule's live state over ``run`` (whose ``tags`` may grow), or None when it judges whole runs only."""
        return None
