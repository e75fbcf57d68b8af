"""One watched run: its growing tables, the online detectors' state and what they found since the page opened.

:class:`LiveRun` holds no Streamlit object, so the app keeps one per browser session in ``st.session_state`` and
the benchmark and tests drive it directly. Opening a run (:meth:`LiveRun.start`) reads every source once, takes the
findings of the last audit (``CASE/findings.json``) when there is one and runs the audit otherwise, fits the tags
(bucket boundaries, sample clusters) and warms the online detectors on the rows already written, so that
:meth:`LiveRun.refresh` then costs only the rows written since (``LiveMetrics.poll``) and the plan parts added since.

Tags never shift under the user: new plan parts are tagged with the boundaries and sample clusters fitted at start;
:meth:`LiveRun.refit` fits them again on everything recorded so far.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forensics.cache import cache_dir
from forensics.errors import ForensicsError
from forensics.schema import (
    CLUSTER,
    SAMPLE_ID,
    STEP,
    TIMESTAMP,
    Case,
    RunConfig,
    find_loss_key,
    grad_norm_column,
    metric_columns,
    written,
)

#: Files whose presence makes a folder a case folder (else a folder given is a metrics source, e.g. ``wandb/``).
CASE_MARKERS = ("run.toml", "plan.parquet", "samples.parquet", "metrics.parquet", "findings.json", "plan")
#: A run whose newest step is older than this many seconds (and at least 10 refresh intervals) stopped writing.
STALE_AFTER_S = 120.0
#: Rows the online detectors are warmed on when an audit already judged the run (its findings cover them): their
#: baselines span at most a few hundred accepted rows per bucket, so this much history gives the state a full
#: run would have, at a fixed cost however long the run is.
WARM_ROWS = 20_000
#: Audits kept in memory per process, keyed by their inputs' paths, sizes and mtimes (every session shares them).
AUDIT_CACHE_SIZE = 4
_AUDITS: dict[tuple, Any] = {}
def clustered_samples_path(samples_path: str | Path, fit: Callable[[], pd.DataFrame]) -> Path:
    """A copy of the samples with their fitted ``cluster`` / ``cluster_name``, keyed by the file's content.

    Fitting text clusters is the slow part of opening a run (seconds to tens of seconds); the same samples file
    (the demo's two cases share one) is fitted once, and the tagging stage keeps a given ``cluster`` column.
    """
    import hashlib

    src = Path(samples_path)
    if src.is_dir():
        return src
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:24]
    out = cache_dir() / "clusters" / f"{digest}.parquet"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        fit().to_parquet(tmp, index=False)
        tmp.replace(out)
    return out


@dataclass
class Target:
    """What the dashboard watches: a case folder (with its run.toml) and/or metrics sources given directly."""

    case: Path | None = None
    sources: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return str(self.case) if self.case is not None else ", ".join(self.sources)


def is_case_folder(path: str | Path) -> bool:
    """A folder holding a case's files (``run.toml``, ``plan.parquet``, ...), not a bare metrics source."""
    p = Path(path)
    return p.is_dir() and any((p / name).exists() for name in CASE_MARKERS)


def resolve_target(args: Sequence[str]) -> Target:
    """``[CASE | SOURCE...]``: a case folder alone, else metrics sources (local files, folders, W&B run paths)."""
    args = [str(a) for a in args if str(a).strip()]
    if not args:
        raise ForensicsError("dashboard: give a case folder or metrics sources")
    if len(args) == 1 and is_case_folder(args[0]):
        return Target(case=Path(args[0]).resolve())
    for a in args:
        if is_case_folder(a):
            raise ForensicsError(f"dashboard: {a} is a case folder; give it alone, not with other sources")
        if not Path(a).exists() and a.count("/") != 2 and not a.startswith(("wandb://", "https://")):
            raise ForensicsError(f"dashboard: {a} does not exist (expected a case folder, a log file or folder, "
                                 "or a W&B run path entity/project/run_id)")
    return Target(sources=args)


@dataclass
class NewFinding:
    """A finding made by the online detectors after the page opened, with the wall-clock time it was found."""

    finding: dict[str, Any]
    found_at: float


def _stat_key(paths: Sequence[str | None]) -> tuple:
    out = []
    for p in paths:
        if p is None:
            out.append(None)
            continue
        path = Path(p)
        if path.is_dir():
            files = sorted(f for f in path.rglob("*") if f.is_file())
            out.append((str(path), len(files), sum(f.stat().st_size for f in files),
                        max((f.stat().st_mtime_ns for f in files), default=0)))
        elif path.exists():
            st = path.stat()
            out.append((str(path), st.st_size, st.st_mtime_ns))
        else:
            out.append((str(path),))
    return tuple(out)


@dataclass(frozen=True)
class Inputs:
    """Where the watched run's tables come from: the case (folder and run configuration) and its resolved paths."""

    case: Case
    metrics: list[str]
    plan: str | None
    samples: str | None

    @property
    def config(self) -> RunConfig:
        return self.case.config

    @property
    def folder(self) -> Path | None:
        return self.case.root

    @classmethod
    def of(cls, case: Case) -> Inputs:
        return cls(case, [s.path for s in case.metrics_sources],
                   str(case.plan_path) if case.plan_path else None,
                   str(case.samples_path) if case.samples_path else None)


def cached_audit(inputs: Inputs) -> Any:
    """:func:`forensics.audit.run_audit` of ``inputs``, computed once per process for the same files; the samples'
    clusters come from :func:`clustered_samples_path`."""
    import dataclasses

    from forensics.audit import run_audit

    key = (_stat_key([*inputs.metrics, inputs.plan, inputs.samples]), repr(inputs.config))
    if key not in _AUDITS:
        while len(_AUDITS) >= AUDIT_CACHE_SIZE:
            _AUDITS.pop(next(iter(_AUDITS)))
        case = inputs.case
        if inputs.plan and inputs.samples:
            fitted = clustered_samples_path(inputs.samples, lambda: _fit_clusters(inputs.samples))
            case = dataclasses.replace(case, config=dataclasses.replace(case.config, samples=str(fitted)))
        audit = run_audit(case)
        if isinstance(audit.findings.get("run"), dict):
            audit.findings["run"]["samples_source"] = inputs.samples
        _AUDITS[key] = audit
    return _AUDITS[key]


def _fit_clusters(samples_path: str | Path) -> pd.DataFrame:
    from forensics.schema import load_samples
    from forensics.tagging.clusters import cluster_samples

    samples = load_samples(samples_path)
    if "text" not in samples.columns or CLUSTER in samples.columns:
        return samples
    try:
        return cluster_samples(samples)[0]
    except ForensicsError:  # texts without words: the tagging stage says so and tags without clusters
        return samples


class LiveRun:
    """The watched run. Attributes the views read: ``metrics``, ``findings`` (the last audit's, or the audit run at
    start), ``new_findings`` (found live, newest last), ``tags``, ``plan``, ``samples``, ``boundaries``,
    ``loss_key``, ``replay`` (``CASE/replay/replay.json`` when present) and ``warnings``.

    ``clock`` is the time source (tests pass a fake one to age a run).
    """

    def __init__(self, target: Target, clock: Callable[[], float] = time.time) -> None:
        self.target = target
        self.clock = clock
        self.metrics = pd.DataFrame({STEP: np.array([], np.int64)})
        self.findings: dict[str, Any] = {}
        self.new_findings: list[NewFinding] = []
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
        self._detectors: dict[str, Any] = {}
        self._plan_parts: set[str] = set()
        self._sample_pos: pd.Series | None = None

    # --- opening --------------------------------------------------------------------------------------------------
    def start(self) -> LiveRun:
        """Read what exists, get the findings and tags, warm the detectors. A run with no rows yet waits."""
        from forensics.detect.warmup import warm_kernel
        from forensics.schema import open_case
        from forensics.sources.live import LiveMetrics

        warm_kernel()  # numba's first use overlaps with reading the log
        t = self.target
        self.inputs = Inputs.of(open_case(t.case, overrides={"metrics": list(t.sources)} if t.sources else None))
        self.config = self.inputs.config
        self.live = LiveMetrics(self.inputs.metrics, step_offset=self.config.step_offset)
        self.metrics, _ = self.live.poll()
        self.last_arrival = self._source_time()
        self._read_replay()
        if len(self.metrics):
            self._open_with_rows()
        return self

    def _open_with_rows(self) -> None:
        self.loss_key = find_loss_key(metric_columns(self.metrics), self.config.loss_key)
        case = self.inputs.folder
        stored = case / "findings.json" if case is not None else None
        if stored is not None and stored.exists():
            try:
                self.findings = json.loads(stored.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ForensicsError(f"{stored} could not be read as JSON ({exc}); remove it or run forensics "
                                     "audit again") from exc
            self.findings_source = str(stored)
            if self.inputs.plan:
                self._tag_all()
        else:
            audit = cached_audit(self.inputs)
            self.findings = audit.findings
            self.findings_source = "computed at start"
            self.tags, self.plan, self.samples, self.boundaries = audit.tags, audit.plan, audit.samples, \
                audit.boundaries
            if self.tags is not None:
                self._store_tags([])
        if self.inputs.plan and Path(self.inputs.plan).is_dir():
            self._plan_parts = {p.name for p in Path(self.inputs.plan).glob("*.parquet")}
        self._index_samples()
        self._warm_detectors()
        self.started = True

    def _tag_all(self, use_cache: bool = True) -> None:
        """Tag every step with the case's boundaries and the samples' fitted clusters (kept in the cache folder,
        keyed by the plan's and samples' files and the settings, so the next opening only reads them)."""
        from forensics.schema import load_plan, load_samples
        from forensics.tagging import tag_case

        folder = self._tags_cache()
        if use_cache and folder is not None and (folder / "meta.json").exists():
            meta = json.loads((folder / "meta.json").read_text())
            self.tags = pd.read_parquet(folder / "tags.parquet")
            self._plan, self._plan_file = None, folder / "plan.parquet"  # read when a view first needs it
            self.samples = pd.read_parquet(folder / "samples.parquet")
            self.boundaries = meta["boundaries"]
            self.warnings += meta.get("warnings", [])
            return
        path = clustered_samples_path(self.inputs.samples, lambda: _fit_clusters(self.inputs.samples))
        samples = load_samples(path)
        plan = load_plan(self.inputs.plan, samples)
        cfg = self.config
        cluster_by = None
        if "text" not in samples.columns and "source" in samples.columns and CLUSTER not in samples.columns:
            cluster_by = "source"
        tagged = tag_case(plan, samples, cfg, cluster_by=cluster_by)
        self.tags, self.plan, self.samples, self.boundaries = tagged.tags, tagged.plan, tagged.samples, \
            tagged.boundaries
        self.warnings += tagged.warnings
        self._store_tags(tagged.warnings)

    def _tags_cache(self) -> Path | None:
        import hashlib

        if not self.inputs.plan or not self.inputs.samples:
            return None
        cfg = self.config
        key = repr((_stat_key([self.inputs.plan, self.inputs.samples]), cfg.boundaries, cfg.grad_accum,
                    cfg.world_size, cfg.rank_split, cfg.max_len))
        return cache_dir() / "tags" / hashlib.sha256(key.encode()).hexdigest()[:24]

    def _store_tags(self, warnings: list[str]) -> None:
        folder = self._tags_cache()
        if folder is None or self.tags is None or self._plan is None or self.samples is None:
            return
        try:
            folder.mkdir(parents=True, exist_ok=True)
            # repeated labels (bucket ranges, cluster names) as dictionaries: a 1M-step table reads ~40% faster
            labels = {c: "category" for c in ("bucket_range", "cluster_name") if c in self.tags.columns}
            self.tags.astype(labels).to_parquet(folder / "tags.parquet", index=False)
            self._plan.to_parquet(folder / "plan.parquet", index=False)
            self.samples.to_parquet(folder / "samples.parquet", index=False)
            (folder / "meta.json").write_text(json.dumps({"boundaries": [int(b) for b in self.boundaries or []],
                                                          "warnings": [str(w) for w in warnings]}))
        except (OSError, ValueError, TypeError) as exc:  # a cache that cannot be written only costs time
            self.warnings.append(f"tags not cached in {folder}: {exc}")

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

    def _index_samples(self) -> None:
        if self.samples is not None:
            self._sample_pos = pd.Series(np.arange(len(self.samples)), index=self.samples[SAMPLE_ID].to_numpy())

    def analysed_metrics(self) -> list[str]:
        """The metrics the online detectors watch: the audit's, else the loss and grad-norm keys."""
        cols = metric_columns(self.metrics)
        listed = ((self.findings.get("run") or {}).get("analysed_metrics") or [])
        chosen = [m for m in listed if m in cols]
        if not chosen and self.loss_key:
            grad = grad_norm_column(cols)
            chosen = [self.loss_key] + ([grad] if grad and grad != self.loss_key else [])
        return chosen

    def _warm_detectors(self) -> None:
        """Feed the existing rows (the last :data:`WARM_ROWS` when the audit judged them); findings past the audit's
        last step are new (found now)."""
        from forensics.detect import SpikeDetector
        from forensics.detect.spikes import joint_order

        params = {}
        params = self.config.rule_params("spikes")
        last = (self.findings.get("run") or {}).get("last_step")
        known = {(f.get("metric"), f.get("step")) for f in self.findings.get("spikes") or []}
        now = self.clock()
        rows = self.metrics
        if last is not None and len(rows) > WARM_ROWS and int(rows[STEP].iloc[-WARM_ROWS]) <= int(last):
            rows = rows.iloc[-WARM_ROWS:]
        cols = self.analysed_metrics()
        self._support_metric = grad_norm_column(cols) if len(cols) > 1 else None
        for col in joint_order(cols, self._support_metric):  # the grad norm first: it supports the others
            det = SpikeDetector(col, **params)
            self._detectors[col] = det
            found = det.update(self._written(rows, col), self._tags_of(rows[STEP].to_numpy(np.int64)),
                               self._support_for(col))
            if last is None:
                continue
            self._record([f for f in found if f.step > int(last) and (f.metric, f.step) not in known], now)

    def _written(self, rows: pd.DataFrame, col: str) -> pd.DataFrame:
        mask = written(rows, col) if col in rows.columns else np.zeros(len(rows), bool)
        return rows.loc[mask, [STEP, col]]

    # --- refreshing -----------------------------------------------------------------------------------------------
    def refresh(self) -> list[NewFinding]:
        """Read the rows and plan parts written since the last call, run the detectors on them alone; return the
        findings that became final with them."""
        self.n_refreshes += 1
        table, new = self.live.poll()
        self.metrics = table
        if not len(new):
            self._read_replay()
            return []
        self.last_arrival = self.clock()
        if not self.started:
            self._open_with_rows()
            return []
        self._poll_plan()
        before = len(self.new_findings)
        tags = self._tags_of(new[STEP].to_numpy(np.int64))
        now = self.clock()
        for col, det in self._detectors.items():
            if col in new.columns:
                self._record(det.update(self._written(new, col), tags, self._support_for(col)), now)
        # the grad norm is judged first (its spikes support the loss's); list in the order the metrics are named
        order = {c: i for i, c in enumerate(self.analysed_metrics())}
        self.new_findings[before:] = sorted(self.new_findings[before:],
                                            key=lambda n: order.get(n.finding.get("metric"), len(order)))
        return self.new_findings[before:]

    def _support_for(self, col: str) -> np.ndarray | None:
        """The grad norm's steps flagged in this update (it runs first), the joint evidence of the other metrics."""
        grad = getattr(self, "_support_metric", None)
        if grad is None or col == grad:
            return None
        det = self._detectors.get(grad)
        return det.flagged_steps_ if det is not None else np.empty(0, np.int64)

    def _tags_of(self, steps: np.ndarray) -> pd.DataFrame | None:
        if self.tags is None or not len(steps):
            return self.tags
        tsteps = self.tags[STEP].to_numpy(np.int64)
        lo, hi = np.searchsorted(tsteps, steps.min()), np.searchsorted(tsteps, steps.max(), side="right")
        return self.tags.iloc[lo:hi]

    def _record(self, found: list, now: float) -> None:
        from forensics.detect._tags import attach_tags

        found = [f for f in found if f.kind in ("spike", "nonfinite", "level_shift")]
        if not found:
            return
        attach_tags(found, self.tags, self.boundaries)
        if self.plan is not None and self.samples is not None:
            from forensics.detect.suspects import rank_all

            spikes = [f for f in found if f.kind == "spike"]
            if spikes:
                try:
                    for f, sus in zip(spikes, rank_all(spikes, self.plan, self.samples, top=10)):
                        f.suspect_samples = [int(s.sample_id) for s in sus]
                except ForensicsError as exc:
                    self.warnings.append(f"suspects of new spikes not ranked: {exc}")
        self.new_findings += [NewFinding(f.to_dict(), now) for f in found]

    def _poll_plan(self) -> None:
        """Tag plan parts a recorder added since the last poll with the boundaries and clusters fitted at start."""
        folder = Path(self.inputs.plan) if self.inputs.plan else None
        if folder is None or not folder.is_dir() or self.samples is None or self.plan is None:
            return
        fresh = sorted(p for p in folder.glob("*.parquet") if p.name not in self._plan_parts)
        if not fresh:
            return
        from forensics.plan.step_mapping import assign_steps
        from forensics.schema import validate_plan
        from forensics.tagging.step_tags import tag_steps

        parts = pd.concat([pd.read_parquet(p) for p in fresh], ignore_index=True)
        self._plan_parts |= {p.name for p in fresh}
        parts = validate_plan(parts, str(folder), self.samples)
        cfg = self.config
        if STEP not in parts.columns:
            # the step mapping needs the whole epoch's batch order: map the recorded columns of all parts again
            recorded = [c for c in parts.columns if c in self.plan.columns]
            plan_all = pd.concat([self.plan[recorded].assign(_new=False), parts[recorded].assign(_new=True)],
                                 ignore_index=True)
            mapped = assign_steps(plan_all, cfg.grad_accum, cfg.world_size, cfg.rank_split)
            parts = mapped[mapped["_new"].to_numpy(bool)].drop(columns=["_new"])
        known = self.samples[SAMPLE_ID].to_numpy(np.int64)
        parts = parts[np.isin(parts[SAMPLE_ID].to_numpy(np.int64), known)]
        if not len(parts):
            return
        new_tags = tag_steps(parts, self.samples, self.boundaries, cfg.max_len)
        last = int(self.tags[STEP].max()) if self.tags is not None and len(self.tags) else -1
        new_tags = new_tags[new_tags[STEP] > last]
        common = [c for c in self.plan.columns if c in parts.columns]
        self.plan = pd.concat([self.plan[common], parts[common]], ignore_index=True)
        self.tags = pd.concat([self.tags, new_tags], ignore_index=True) if self.tags is not None else new_tags

    def refit(self) -> None:
        """Fit boundaries and clusters again on everything recorded so far; re-run the detectors from scratch."""
        if self.inputs.plan:
            self._tag_all(use_cache=False)
            self._index_samples()
        if self.inputs.plan and Path(self.inputs.plan).is_dir():
            self._plan_parts = {p.name for p in Path(self.inputs.plan).glob("*.parquet")}
        self._detectors.clear()
        seen = {(n.finding.get("metric"), n.finding.get("step")) for n in self.new_findings}
        found_before = list(self.new_findings)
        self.new_findings = []
        self._warm_detectors()
        # findings that survive the re-fit keep the time they were first found
        times = {(n.finding.get("metric"), n.finding.get("step")): n.found_at for n in found_before}
        for n in self.new_findings:
            key = (n.finding.get("metric"), n.finding.get("step"))
            if key in seen:
                n.found_at = times[key]

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
