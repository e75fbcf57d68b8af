"""The online loop: tail a run's sources, feed the rules that run live, and tell the causes as they appear.

:class:`LiveRun` holds no Streamlit object: the dashboard keeps one per browser session and ``forensics watch`` one
per process. Opening a run (:meth:`LiveRun.start`) reads every source once, takes the findings of the last audit
(``CASE/findings.json``) when there is one and runs the audit otherwise, fits the tags, and feeds every row written
so far to the rules' online states (:meth:`forensics.detect.base.Rule.online`: the spike driver, NaN/inf), so that
:meth:`LiveRun.refresh` then costs only the rows written since (``LiveMetrics.poll``) and the plan parts added
since.

Findings become causes the way the audit makes them: the rules that explain (attribution, the cause grouping) run
again over every finding whenever new ones arrive, so a spike of a batch coming back joins its earlier cause; each
cause has a stable ``key`` (:func:`forensics.detect.causes.grouping.cause_key`), and :attr:`LiveRun.new_causes`
lists each key once, the first time it is seen. :meth:`LiveRun.finish` gives the findings an audit of the rows so
far gives, finding for finding and cause for cause.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError
from forensics.live.tables import (
    Inputs,
    Tagged,
    cached_audit,
    plan_parts,
    stat_key,
    store_tags,
    tag_all,
    tag_new_parts,
)
from forensics.live.target import Target
from forensics.schema import SAMPLE_ID, STEP, TIMESTAMP, metric_columns

#: A run whose newest step is older than this many seconds (and at least 10 refresh intervals) stopped writing.
STALE_AFTER_S = 120.0
#: The run-level harmful samples are estimated again once this many rows (and this share of the run) have arrived
#: since the last estimate: the estimate reads the whole run, so it runs now and then, not on every poll.
SAMPLES_EVERY_ROWS, SAMPLES_EVERY_SHARE = 200, 0.05
#: Kinds the online rules report as rows arrive (others come from the audit the run started from).
LIVE_KINDS = ("spike", "nonfinite", "level_shift")


@dataclass
class NewFinding:
    """A finding made by the online rules after the run was opened, with the wall-clock time it was found."""

    finding: dict[str, Any]
    found_at: float


@dataclass
class NewCause:
    """A cause whose key was first seen after the run was opened (one per key), with the time it was found."""

    cause: dict[str, Any]
    found_at: float

    @property
    def key(self) -> str:
        return str(self.cause.get("key"))


class LiveRun:
    """The watched run. Attributes the views read: ``metrics``, ``findings`` (the last audit's, or the audit run at
    start), ``new_findings`` and ``new_causes`` (found live, newest last), ``causes`` (every cause as of the last
    refresh), ``tags``, ``plan``, ``samples``, ``boundaries``, ``loss_key``, ``replay`` (``CASE/replay/replay.json``
    when present) and ``warnings``.

    ``clock`` is the time source (tests pass a fake one to age a run).
    """

    def __init__(self, target: Target, clock: Callable[[], float] = time.time) -> None:
        self.target = target
        self.clock = clock
        self.metrics = pd.DataFrame({STEP: np.array([], np.int64)})
        self.findings: dict[str, Any] = {}
        self.new_findings: list[NewFinding] = []
        self.new_causes: list[NewCause] = []
        self.causes: list[dict[str, Any]] = []
        self.tags: pd.DataFrame | None = None
        self._plan: pd.DataFrame | None = None
        self._plan_file: Path | None = None
        self.samples: pd.DataFrame | None = None
        self.boundaries: list[int] | None = None
        self.loss_key: str | None = None
        self.replay: dict[str, Any] | None = None
        self.warnings: list[str] = []
        self.findings_source = "none"
        self.started = False
        self.last_arrival: float | None = None
        self.n_refreshes = 0
        self._plan_parts: set[str] = set()
        self._sample_pos: pd.Series | None = None
        self._found: list[tuple[str, Any]] = []
        #: The run-level harmful samples as of the last estimate (the audit's at start), and the rows it read.
        self.harmful_samples: list[dict[str, Any]] = []
        self._samples_rows = 0  # (rule, finding) for every finding the online rules made final
        self._keys: set[str] = set()

    # --- opening --------------------------------------------------------------------------------------------------
    def start(self) -> LiveRun:
        """Read what exists, get the findings and tags, feed the online rules. A run with no rows yet waits."""
        from forensics.schema import open_case
        from forensics.sources.live import LiveMetrics

        t = self.target
        self.inputs = Inputs.of(open_case(t.case, overrides={"metrics": list(t.sources)} if t.sources else None))
        self.config = self.inputs.config
        self.live = LiveMetrics(self.inputs.metrics, step_offset=self.config.step_offset, step_key=self.config.step_key)
        self.metrics, _ = self.live.poll()
        self.last_arrival = self._source_time()
        self._read_replay()
        if len(self.metrics):
            self._open_with_rows()
        return self

    def _open_with_rows(self) -> None:
        stored = self.inputs.folder / "findings.json" if self.inputs.folder is not None else None
        if stored is not None and stored.exists():
            try:
                self.findings = json.loads(stored.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ForensicsError(
                    f"{stored} could not be read as JSON ({exc}); remove it or run forensics audit again"
                ) from exc
            self.findings_source = str(stored)
            if self.inputs.plan:
                self._take_tags(tag_all(self.inputs))
        else:
            audit = cached_audit(self.inputs)
            self.findings = audit.findings
            self.findings_source = "computed at start"
            self.tags, self.plan, self.samples, self.boundaries = (
                audit.tags,
                audit.plan,
                audit.samples,
                audit.boundaries,
            )
            if audit.plan_on_engine:  # audited through an engine: the live loop
                from forensics.pipeline.audit import load_step_plan  # holds the plan it extends as parts arrive

                self.plan = load_step_plan(self.inputs.case, audit.samples)
            if audit.tags is not None:  # the next opening reads them from the cache
                self.warnings += store_tags(
                    self.inputs, Tagged(audit.tags, audit.samples, audit.boundaries, [], plan=self.plan)
                )
        self._plan_parts = plan_parts(self.inputs.plan)
        self._index_samples()
        self.harmful_samples = list(self.findings.get("harmful_samples") or [])
        self._samples_rows = len(self.metrics)
        self._build_rules()
        self._feed(self.metrics, now=None)
        stored = [c for c in self.findings.get("causes") or [] if isinstance(c, dict)]
        # the audit's causes are the run's as of its last step; new findings past it are explained again
        self.causes = stored if all(c.get("key") for c in stored) and not self.new_findings else self._explain()
        self._keys = {str(c.get("key")) for c in self.causes + stored}
        self.started = True

    def _take_tags(self, tagged: Any) -> None:
        self.tags, self.samples, self.boundaries = tagged.tags, tagged.samples, tagged.boundaries
        self._plan, self._plan_file = tagged.plan, tagged.plan_file
        self.warnings += tagged.warnings

    def _build_rules(self) -> None:
        """The audit's rules over tables that grow, assembled as the audit assembles them: the online states, and
        the rules that explain findings. The analysed metrics are the stored audit's when it names them (an audit
        run with ``--spike-metric``)."""
        from forensics.detect.rules import build_rules
        from forensics.pipeline.run_tables import analysed_metrics, assemble_run, choose_keys

        cfg = self.config
        keys = choose_keys(self.metrics, cfg)
        cols = metric_columns(self.metrics)
        stored = (self.findings.get("run") or {}).get("analysed_metrics") or []
        if stored and all(m in cols for m in stored) and stored[0] == keys.loss_key:
            keys = dataclasses.replace(keys, analysed=analysed_metrics(cols, keys.loss_key, stored[1:], None))
        self.loss_key = keys.loss_key
        sections = {k: self.findings.get(k) for k in ("plan", "whatif") if k in self.findings}
        self.run = assemble_run(
            self.inputs.case,
            self.metrics,
            self.live.report,
            keys,
            tags=self.tags,
            plan=self._plan,
            samples=self.samples,
            boundaries=self.boundaries,
            sections=sections,
            warnings=self.warnings,
            has_plan=bool(self.inputs.plan and self.samples is not None),
        )
        self._health = _health_key(self.run)
        self.rules = build_rules(cfg.detect, has_plan=bool(self.inputs.plan and self.samples is not None))
        self.online = {r.name: s for r in self.rules if (s := r.online(self.run)) is not None}

    def _index_samples(self) -> None:
        if self.samples is not None:
            self._sample_pos = pd.Series(np.arange(len(self.samples)), index=self.samples[SAMPLE_ID].to_numpy())

    @property
    def plan(self) -> pd.DataFrame | None:
        """The plan with ``step``, sorted by step (read from the cache on first use: 4M rows cost a second)."""
        if self._plan is None and self._plan_file is not None:
            self._plan = pd.read_parquet(self._plan_file)
        return self._plan

    @plan.setter
    def plan(self, value: pd.DataFrame | None) -> None:
        if value is not None and STEP in value.columns:
            steps = value[STEP].to_numpy(np.int64)
            if len(steps) > 1 and (steps[1:] < steps[:-1]).any():
                value = value.iloc[np.argsort(steps, kind="stable")].reset_index(drop=True)
        self._plan, self._plan_file = value, None

    @property
    def expected(self) -> pd.DataFrame | None:
        """Each step's expected value from its composition as the online spike rule judged it (``step``, then one
        column per metric: the audit's ``expected`` table for the rows so far); None without a plan."""
        spikes = getattr(self, "online", {}).get("spikes")
        driver = getattr(spikes, "driver", None)
        return driver.expected() if driver is not None else None

    def analysed_metrics(self) -> list[str]:
        """The metrics the spike rule watches."""
        return list(self.run.analysed) if hasattr(self, "run") else []

    # --- refreshing -----------------------------------------------------------------------------------------------
    def refresh(self) -> list[NewFinding]:
        """Read the rows and plan parts written since the last call, feed them to the online rules; return the
        findings that became final with them (their causes are in :attr:`new_causes`)."""
        self.n_refreshes += 1
        table, new = self.live.poll()
        self.metrics = table
        if not len(new):
            self._read_replay()
            if self.started and self._poll_health():  # a job that died writes its crash line, not rows
                self._announce(self._explain())
            return []
        self.last_arrival = self.clock()
        if not self.started:
            self._open_with_rows()
            return []
        self._poll_plan()
        self.run.metrics = table
        health = self._poll_health()
        before = len(self.new_findings)
        fresh = self._feed(new, now=self.clock())
        grown = len(self.metrics) - self._samples_rows
        due = grown >= max(SAMPLES_EVERY_ROWS, SAMPLES_EVERY_SHARE * self._samples_rows)
        if fresh or health or (due and self.run.has_plan):
            self._announce(self._explain(samples=due))
        return self.new_findings[before:]

    def _announce(self, causes: list[dict[str, Any]]) -> None:
        """Take ``causes`` as the run's current ones; a key not seen before is a new cause, found now."""
        self.causes = causes
        now = self.clock()
        for c in causes:
            if str(c.get("key")) not in self._keys:
                self._keys.add(str(c.get("key")))
                self.new_causes.append(NewCause(c, now))

    def _poll_health(self) -> bool:
        """The sources' rewinds and the crash-line files as of this poll, into the run the rules read (the same
        fields the audit assembles); whether they changed since the rules last read them."""
        from forensics.pipeline.run_tables import health_fields

        for name, value in health_fields(self.inputs.case, self.live.report).items():
            setattr(self.run, name, value)
        key = _health_key(self.run)
        changed, self._health = key != self._health, key
        return changed

    def _feed(self, rows: pd.DataFrame, now: float | None) -> bool:
        """Rows through every online state; findings past the audit's last step are recorded as new (``now`` None:
        the rows the run was opened with, whose findings the audit already holds). Whether any finding came."""
        last = (self.findings.get("run") or {}).get("last_step")
        known = {(f.get("metric"), f.get("step")) for f in self.findings.get("spikes") or []}
        order = {c: i for i, c in enumerate(self.run.analysed)}
        fresh = []
        for name, state in self.online.items():
            made = state.update(rows)
            self._found += [(name, f) for f in made]
            fresh += [f for f in made if f.kind in LIVE_KINDS]
        self._attach_suspects([f for f in fresh if f.kind == "spike"])
        stamp = self.clock() if now is None else now
        for f in sorted(fresh, key=lambda f: (order.get(f.metric, len(order)), f.step)):
            raw_step = (f.details.get("window_steps") or [f.step])[-1] if f.kind == "spike" else f.step
            if last is None or (raw_step > int(last) and (f.metric, f.step) not in known):
                d = f.to_dict()
                d["logged_step"] = int(f.step) + self.run.logged_offset
                self.new_findings.append(NewFinding(d, stamp))
        return bool(fresh)

    def _attach_suspects(self, spikes: list[Any]) -> None:
        """Name the suspects of each new spike in the finding the views list (the explained causes rank them
        again with the run's evidence)."""
        if not spikes or self.plan is None or self.samples is None:
            return
        from forensics.detect.evidence.suspects import rank_all

        try:
            for f, sus in zip(spikes, rank_all(spikes, self.plan, self.samples, top=10)):
                f.suspect_samples = [int(s.sample_id) for s in sus]
        except ForensicsError as exc:
            self.warnings.append(f"suspects of new spikes not ranked: {exc}")

    def _explain(self, samples: bool = False) -> list[dict[str, Any]]:
        """Every cause as of now: the rules that explain, over the online findings and the audit's others;
        ``samples``: the run-level harmful samples estimated again on the rows so far (their evidence accumulates
        as they come back: :attr:`harmful_samples`)."""
        from forensics.detect import Finding
        from forensics.detect.rules import run_rules

        again = {"samples"} if samples else set()
        # the rules over what arrives beside the metrics (rewinds, crash lines) run again; their kinds are theirs
        rerun = {k for r in self.rules for k in r.live_kinds}
        kept = [
            Finding.from_dict(f)
            for f in self.findings.get("findings") or []
            if isinstance(f, dict)
            and f.get("kind") not in LIVE_KINDS
            and f.get("kind") not in rerun
            and not (samples and f.get("kind") == "harmful_samples")
        ]
        explain = [r for r in self.rules if r.explains or r.live_kinds or r.name in again]
        if samples:
            self._samples_rows = len(self.metrics)
        self.run.plan = self.plan  # read now if it was left in the cache
        judged = run_rules(explain, self.run, found=kept + [_raw(f) for _, f in self._found])
        if "harmful_samples" in judged.sections:
            self.harmful_samples = list(judged.sections["harmful_samples"] or [])
        return list(judged.sections.get("causes") or [])

    def finish(self) -> dict[str, Any]:
        """The findings of the rows so far, as an audit of them gives them: the online findings with what is still
        open, every whole-run rule on the current tables, then the causes and the verdict."""
        from forensics.detect import Findings
        from forensics.detect.causes.verdict import facts, verdict
        from forensics.detect.rules import run_rules

        if not self.started:
            return dict(self.findings)
        self.run.plan = self.plan
        given: dict[str, list] = {
            name: [_raw(f) for rule, f in self._found if rule == name] + state.finish()
            for name, state in self.online.items()
        }
        run = copy.copy(self.run)
        run.sections = {k: v for k, v in self.run.sections.items() if k in ("plan", "whatif")}
        judged = run_rules(self.rules, run, given=given)
        sections = dict(run.sections)
        sections.update(judged.sections)
        for key in ("run", "plan", "whatif"):
            if key in self.findings and key not in judged.sections:
                sections[key] = self.findings[key]
        out = Findings(
            items=judged.found, sections=sections, warnings=judged.warnings, logged_offset=self.run.logged_offset
        ).to_dict()
        out["verdict"] = verdict(out, self.loss_key)
        out["verdict_facts"] = facts(out)
        return out

    def _poll_plan(self) -> None:
        """Tag plan parts a recorder added since the last poll with the boundaries and clusters fitted at start."""
        if self.samples is None or self.plan is None or self.boundaries is None:
            return
        grown = tag_new_parts(self.inputs, self._plan_parts, self.plan, self.samples, self.tags, self.boundaries)
        if grown is not None:
            self.plan, self.tags, self._plan_parts = grown
            self.run.plan, self.run.tags = self.plan, self.tags

    def refit(self) -> None:
        """Fit boundaries and clusters again on everything recorded so far; run the online rules from scratch."""
        if self.inputs.plan:
            self._take_tags(tag_all(self.inputs, use_cache=False))
            self._index_samples()
        self._plan_parts = plan_parts(self.inputs.plan)
        times = {(n.finding.get("metric"), n.finding.get("step")): n.found_at for n in self.new_findings}
        self.new_findings, self._found = [], []
        self._build_rules()
        self._feed(self.metrics, now=None)
        self.causes = self._explain()
        for n in self.new_findings:  # findings that survive the re-fit keep the time they were first found
            n.found_at = times.get((n.finding.get("metric"), n.finding.get("step")), n.found_at)

    def _read_replay(self) -> None:
        case = self.target.case
        path = case / "replay" / "replay.json" if case is not None else None
        if path is not None and path.exists():
            try:
                self.replay = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                self.warnings.append(f"{path} could not be read: {exc}")

    # --- what the views show --------------------------------------------------------------------------------------
    def current_findings(self) -> dict[str, Any]:
        """The audit's findings with the live ones added to ``spikes`` / ``nonfinite`` (for the figures)."""
        out = dict(self.findings)
        spikes = list(out.get("spikes") or [])
        nonfinite = list(out.get("nonfinite") or [])
        for n in self.new_findings:
            if n.finding.get("kind") == "spike":
                spikes.append(n.finding)
            elif n.finding.get("kind") == "nonfinite":
                nonfinite.append(n.finding)
        out["spikes"], out["nonfinite"] = spikes, nonfinite
        return out

    @property
    def last_step(self) -> int | None:
        return int(self.metrics[STEP].iloc[-1]) if len(self.metrics) else None

    def lag_seconds(self) -> float | None:
        """Age of the newest step: since its ``_timestamp``, or since it arrived (file time before the first poll)."""
        now = self.clock()
        times = [t for t in (self.last_arrival, self._newest_timestamp()) if t is not None]
        if not times:
            return None
        return max(0.0, now - max(t for t in times if t <= now + 60))

    def stale(self, interval_s: float) -> bool:
        """Whether the run stopped writing: its newest step is older than ``STALE_AFTER_S`` and 10 refreshes."""
        lag = self.lag_seconds()
        return lag is not None and lag > max(STALE_AFTER_S, 10 * interval_s)

    def _newest_timestamp(self) -> float | None:
        if TIMESTAMP not in self.metrics.columns or not len(self.metrics):
            return None
        v = float(self.metrics[TIMESTAMP].iloc[-1])
        return v if math.isfinite(v) else None

    def _source_time(self) -> float | None:
        times = []
        for src in self.inputs.metrics:
            p = Path(src)
            if p.is_file():
                times.append(p.stat().st_mtime)
            elif p.is_dir():
                times += [f.stat().st_mtime for f in p.rglob("*") if f.is_file()]
        return max(times) if times else None

    def step_batch(self, step: int) -> pd.DataFrame:
        """The samples of one step's batch (plan rows joined to the samples), for cards and the step inspector."""
        if self.plan is None or self.samples is None or STEP not in self.plan.columns:
            return pd.DataFrame()
        psteps = self.plan[STEP].to_numpy(np.int64)
        lo, hi = np.searchsorted(psteps, step), np.searchsorted(psteps, step, side="right")
        rows = self.plan.iloc[lo:hi]
        pos = self._sample_pos.reindex(rows[SAMPLE_ID].to_numpy()).to_numpy()
        ok = ~np.isnan(pos)
        batch = self.samples.iloc[pos[ok].astype(np.int64)].reset_index(drop=True)
        extra = [c for c in ("epoch", "batch_id", "micro", "rank") if c in rows.columns]
        for c in extra:
            batch.insert(0, c, rows[c].to_numpy()[ok])
        return batch


def _health_key(run: Any) -> tuple:
    """What the run-health rules read, as a value that changes when they would answer differently: each rewind, and
    each crash-line file's path, size and modification time."""
    rewinds = tuple((r.source, r.from_step, r.last_step, r.rows_replaced) for r in run.rewinds)
    return rewinds, stat_key(run.log_files)


def _raw(f: Any) -> Any:
    """A copy of an online finding without the suspects the live list gave it (the rules that explain rank them)."""
    out = copy.deepcopy(f)
    out.suspect_samples = []
    return out
