"""One compared run: its loss curve, its loss spikes, its plan (the samples of each step) and its headline numbers.

A RUN is a case folder (anything ``forensics audit`` takes: an HF Trainer output folder, a demo case) or a metrics
source alone (a log file, a W&B or TensorBoard folder). Its spikes are the audit's: the case's ``findings.json``
when it is newer than every input it was made from (run.toml, the metrics sources, the plan, the samples) and of
this tool's findings version, else a fresh :func:`~forensics.pipeline.audit.run_audit` (nothing is written into the
case: a comparison never modifies its inputs). Only spikes of the run's loss key are compared (like with like: the grad
norm and other metrics differ in scale and meaning between runs).

``jumpiness_share`` is the audit's ``oscillation.bucket_variance_share`` (with a plan); ``tokens_per_s`` the median
of the throughput metric the key lookup finds (:mod:`forensics.schema.keys`), None when none is logged.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forensics.compare.positions import StepSamples
from forensics.errors import ForensicsError
from forensics.schema import STEP, Case, load_samples, metric_columns, open_case, written
from forensics.schema.keys import choose_key

#: Logged values each side of a step whose median is the level a rise there is measured from.
RISE_WINDOW = 10
#: Steps of a spike whose samples make its data position: from its start to its peak, at most this many (a long
#: event's later steps are its aftermath, not its cause).
MAX_POSITION_STEPS = 16
_REMOTE = ("wandb://", "http://", "https://")


@dataclass(frozen=True)
class Spike:
    """One loss spike of a run, as the audit found it (canonical 0-based steps)."""

    step: int
    end_step: int
    peak_step: int
    value: float | None
    severity: str | None = None
    cause: str | None = None

    @property
    def position_steps(self) -> list[int]:
        """The steps whose samples are its data position (see :data:`MAX_POSITION_STEPS`)."""
        return list(range(self.step, min(self.peak_step, self.step + MAX_POSITION_STEPS - 1) + 1))

    @classmethod
    def from_json(cls, s: dict[str, Any]) -> Spike:
        step = int(s["step"])
        end = int(s["end_step"]) if s.get("end_step") is not None else step
        peak = int(s["peak_step"]) if s.get("peak_step") is not None else step
        value = s.get("value")
        return cls(
            step,
            max(end, step),
            min(max(peak, step), max(end, step)),
            float(value) if isinstance(value, (int, float)) else None,
            s.get("severity"),
            s.get("cause"),
        )


@dataclass
class ComparedRun:
    """What a comparison needs of one run (module docstring)."""

    name: str
    source: str
    case: Path | None
    loss_key: str
    steps: np.ndarray
    values: np.ndarray
    logged_offset: int
    spikes: list[Spike]
    plan: StepSamples | None = None
    sample_tokens: pd.Series | None = None
    sample_text: pd.Series | None = None
    jumpiness_share: float | None = None
    tokens_per_s: float | None = None
    tokens_key: str | None = None
    findings_from: str = "audited"
    warnings: list[str] = field(default_factory=list)

    @property
    def first_step(self) -> int:
        return int(self.steps[0])

    @property
    def last_step(self) -> int:
        return int(self.steps[-1])

    def reaches(self, step: int) -> bool:
        """Whether the run's loss was logged as far as ``step`` (and from before it)."""
        return self.first_step <= int(step) <= self.last_step

    def value_at(self, step: int) -> float | None:
        """The loss logged for ``step``: at it, else at the next logged step (a value logged every L steps covers
        the L steps up to it); None beyond the run."""
        if not self.reaches(step):
            return None
        i = int(np.searchsorted(self.steps, int(step)))
        v = float(self.values[min(i, len(self.values) - 1)])
        return v if np.isfinite(v) else None

    def rise_at(self, step: int, window: int = RISE_WINDOW) -> float | None:
        """How far the loss logged for ``step`` stands above the median of the ``window`` logged values each side
        (a median: one spike among them does not move it); None beyond the run or without finite neighbours."""
        if not self.reaches(step):
            return None
        i = min(int(np.searchsorted(self.steps, int(step))), len(self.values) - 1)
        around = np.concatenate([self.values[max(0, i - window) : i], self.values[i + 1 : i + 1 + window]])
        around = around[np.isfinite(around)]
        if not len(around) or not np.isfinite(self.values[i]):
            return None
        return float(self.values[i] - np.median(around))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "case": str(self.case) if self.case else None,
            "steps": int(len(self.steps)),
            "first_step": self.first_step,
            "last_step": self.last_step,
            "loss_key": self.loss_key,
            "logged_offset": self.logged_offset,
            "spikes": len(self.spikes),
            "plan": self.plan is not None,
            "jumpiness_share": self.jumpiness_share,
            "tokens_per_s": self.tokens_per_s,
            "tokens_key": self.tokens_key,
            "findings": self.findings_from,
        }


def open_run(source: str, sets: Sequence[str] = ()) -> Case:
    """The case a RUN names: a folder is opened as a case (or read as one metrics source when it is one), a file
    or a W&B run path is a metrics source alone."""
    path = Path(source)
    if path.is_dir():
        return open_case(path, sets=sets)
    if (
        path.is_file()
        or source.startswith(_REMOTE)
        or (source.count("/") == 2 and not path.exists() and not source.startswith((".", "/")))
    ):
        return open_case(None, sets=sets, overrides={"metrics": [source]})
    raise ForensicsError(f"compare: {source}: no such case folder or metrics source")


def load_run(
    source: str, name: str, *, sets: Sequence[str] = (), stage: Callable[[str], Any] | None = None
) -> ComparedRun:
    """Read one RUN (module docstring): its findings (reused or audited), loss curve and plan."""
    case = open_run(source, sets)
    reused = None if sets else fresh_findings(case)
    if reused is not None:
        findings = reused
        metrics, plan, samples = _tables(case)
    else:
        from forensics.pipeline.audit import run_audit

        audit = run_audit(case, stage=stage)
        findings, metrics, plan, samples = audit.findings, audit.metrics, audit.plan, audit.samples
        if audit.plan_on_engine:  # audited through an engine: compare reads it whole
            from forensics.pipeline.audit import load_step_plan

            plan = load_step_plan(case, samples)
    run_section = findings.get("run") or {}
    loss_key = str(run_section.get("loss_key"))
    if loss_key not in metrics.columns:
        raise ForensicsError(
            f"compare: {source}: its findings name loss key '{loss_key}', which its metrics lack; "
            "audit it again (forensics audit)"
        )
    rows = written(metrics, loss_key)
    steps = metrics[STEP].to_numpy(np.int64)[rows]
    values = metrics[loss_key].to_numpy(dtype=np.float64, na_value=np.nan)[rows]
    if not len(steps):
        raise ForensicsError(f"compare: {source}: its loss '{loss_key}' has no logged value")
    spikes = sorted(
        (Spike.from_json(s) for s in findings.get("spikes") or [] if s.get("metric") == loss_key),
        key=lambda s: (s.step, s.peak_step),
    )
    osc = findings.get("oscillation") or {}
    share = osc.get("bucket_variance_share") if isinstance(osc, dict) else None
    tokens_key, tps = throughput(metrics)
    tokens = None
    if samples is not None and "n_tokens" in samples.columns:
        tokens = pd.Series(samples["n_tokens"].to_numpy(), index=samples["sample_id"].to_numpy())
    text = None
    if samples is not None and "text" in samples.columns:
        text = pd.Series(samples["text"].to_numpy(), index=samples["sample_id"].to_numpy())
    return ComparedRun(
        name=name,
        source=source,
        case=case.root,
        loss_key=loss_key,
        steps=steps,
        values=values,
        logged_offset=int(run_section.get("logged_offset") or 0),
        spikes=spikes,
        plan=StepSamples(plan) if plan is not None else None,
        sample_tokens=tokens,
        sample_text=text,
        jumpiness_share=float(share) if isinstance(share, (int, float)) else None,
        tokens_per_s=tps,
        tokens_key=tokens_key,
        findings_from="reused" if reused is not None else "audited",
        warnings=list(case.warnings),
    )


def throughput(metrics: pd.DataFrame) -> tuple[str | None, float | None]:
    """The throughput key (one lookup, :func:`~forensics.schema.keys.choose_key`) and its median over the steps
    that logged a finite value; ``(None, None)`` when no throughput is logged."""
    cols = metric_columns(metrics)
    counts = {c: int(written(metrics, c).sum()) for c in cols}
    key = choose_key(cols, "throughput", counts=counts).key
    if key is None:
        return None, None
    v = metrics[key].to_numpy(dtype=np.float64, na_value=np.nan)
    v = v[np.isfinite(v)]
    return key, (float(np.median(v)) if len(v) else None)


def fresh_findings(case: Case) -> dict[str, Any] | None:
    """The case's findings.json when it is newer than every input it was made from and of this tool's findings
    version, else None (then the run is audited again)."""
    from forensics.detect.findings import FINDINGS_VERSION

    path = case.findings_path
    if path is None or not path.is_file():
        return None
    inputs = [case.root / "run.toml" if case.root else None, case.plan_path, case.samples_path]
    inputs += [Path(s.path) for s in case.metrics_sources if not s.path.startswith(_REMOTE)]
    if any(s.path.startswith(_REMOTE) for s in case.metrics_sources):
        return None  # a W&B run on a server may have grown: audit it
    newest = max((_newest(p) for p in inputs if p is not None), default=0.0)
    if path.stat().st_mtime <= newest:
        return None
    try:
        findings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(findings, dict) or findings.get("version") != FINDINGS_VERSION or "spikes" not in findings:
        return None
    return findings


def _newest(path: Path) -> float:
    """The latest modification time of a file, or of any file under a folder (0 when absent)."""
    if not path.exists():
        return 0.0
    if path.is_file():
        return path.stat().st_mtime
    return max((p.stat().st_mtime for p in path.rglob("*") if p.is_file()), default=path.stat().st_mtime)


def _tables(case: Case) -> tuple[pd.DataFrame, pd.DataFrame | None, pd.DataFrame | None]:
    """The metrics, step-mapped plan and samples of a case whose findings are reused (read as the audit reads)."""
    from forensics.sources import read_metrics

    cfg = case.config
    metrics, _ = read_metrics(case.metrics_sources, step_offset=cfg.step_offset, step_key=cfg.step_key)
    if metrics.empty:
        raise ForensicsError(
            f"compare: the metrics sources hold no rows: {', '.join(s.path for s in case.metrics_sources)}"
        )
    plan = samples = None
    if cfg.plan and cfg.samples:
        from forensics.pipeline.audit import load_step_plan

        samples = load_samples(case.samples_path)
        plan = load_step_plan(case, samples)
    return metrics, plan, samples


def run_names(sources: Sequence[str], given: Sequence[str] | None = None) -> list[str]:
    """One distinct name per RUN: ``--name`` when given (as many as RUNs), else the folder or file name, with its
    parent folder's name before it where two would be the same."""
    if given:
        if len(given) != len(sources):
            raise ForensicsError(f"--name: give one name per RUN ({len(sources)}), got {len(given)}")
        if len(set(given)) != len(given):
            raise ForensicsError("--name: the names must differ")
        return list(given)
    paths = [Path(s.rstrip("/")) for s in sources]
    names = [p.stem if p.is_file() else p.name or str(p) for p in paths]
    for n in list(names):
        if names.count(n) > 1:
            names = [f"{p.parent.name}/{m}" if m == n else m for p, m in zip(paths, names, strict=True)]
            break
    out: list[str] = []
    for n in names:
        out.append(n if n not in out else f"{n}#{len(out) + 1}")
    return out
