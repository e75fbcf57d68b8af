"""One audit, top to bottom: sources -> plan -> tags -> detection -> findings (the report renders the result).

This is the only module that calls every stage; the stages themselves never call each other. It is the library
behind ``forensics audit`` and the dashboard: :func:`resolve_inputs` turns a case folder plus overrides into paths
and settings, :func:`run_audit` runs the stages and returns an :class:`Audit` holding every table it built, so
the caller can render the summary, ``findings.json`` and ``report.html`` without recomputing anything.

What needs a plan: suspect samples, bucket/cluster attribution, recurrence, the composition gate and the forgetting
signature. Without one, metrics alone still give spikes, non-finite steps and oscillation, and the findings say so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from forensics.errors import ForensicsError
from forensics.schema import (
    SOURCE,
    STEP,
    TEXT,
    RunConfig,
    alignment_warnings,
    load_plan,
    load_samples,
    metric_columns,
    open_case,
)
from forensics.schema.keys import choose_key, key_choices_section

#: Below this many written values a metric's first ``min_periods`` (history, not judged) weigh heavily: say so.
SHORT_RUN = 100

#: The ``--fail-on`` kinds and how each is read off ``findings.json``.
FAIL_KINDS = ("spike", "nonfinite", "static-plan", "oscillation")


@dataclass
class AuditInputs:
    """Where the run's tables come from and its settings (a case folder's ``run.toml`` plus CLI overrides)."""

    metrics: list[str]
    plan: str | None
    samples: str | None
    config: RunConfig
    case: Path | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class Audit:
    """Everything one audit built: the findings and the tables behind them (for the report and the dashboard)."""

    findings: dict[str, Any]
    metrics: pd.DataFrame
    loss_key: str
    config: RunConfig
    tags: pd.DataFrame | None = None
    plan: pd.DataFrame | None = None
    samples: pd.DataFrame | None = None
    boundaries: list[int] | None = None

    @property
    def spikes(self) -> list[dict[str, Any]]:
        return self.findings.get("spikes", [])


def resolve_inputs(
    case: str | Path | None = None,
    *,
    metrics: Sequence[str] | None = None,
    plan: str | None = None,
    samples: str | None = None,
    grad_accum: int | None = None,
    world_size: int | None = None,
    rank_split: str | None = None,
    step_offset: int | None = None,
    loss_key: str | None = None,
) -> AuditInputs:
    """A case folder's sources and ``run.toml`` settings, each overridden by the option given explicitly."""
    warnings: list[str] = []
    if case is not None:
        c = open_case(case)
        cfg = c.config
        warnings += c.warnings
        metric_src = list(metrics) if metrics else [str(p) for p in c.metrics_sources]
        plan_src = plan or (str(c.plan_path) if c.plan_path else None)
        samples_src = samples or (str(c.samples_path) if c.samples_path else None)
        root: Path | None = c.root
    else:
        if not metrics:
            raise ForensicsError("audit: give a case folder, or the metrics with --metrics SRC")
        cfg = RunConfig()
        metric_src, plan_src, samples_src, root = list(metrics), plan, samples, None
    overrides = {"grad_accum": grad_accum, "world_size": world_size, "rank_split": rank_split,
                 "step_offset": step_offset, "loss_key": loss_key}
    for key, value in overrides.items():
        if value is not None:
            setattr(cfg, key, value)
    cfg.validated("options")
    if plan_src and not samples_src:
        raise ForensicsError("audit: a plan needs its samples table too (--samples, or samples.parquet in the case)")
    return AuditInputs(metrics=metric_src, plan=plan_src, samples=samples_src, config=cfg, case=root,
                       warnings=warnings)


@contextmanager
def _quiet_stage(name: str) -> Iterator[None]:
    yield


def run_audit(
    inputs: AuditInputs,
    *,
    spike_metrics: Sequence[str] | None = None,
    cluster_by: str | None = None,
    stage: Callable[[str], Any] | None = None,
) -> Audit:
    """Run every stage on ``inputs``; ``stage(name)`` is a context manager factory used to show progress.

    Content clusters come from the sample text, or from the label column ``cluster_by``; samples without text but
    with a ``source`` label are clustered by that label.
    """
    stage = stage or _quiet_stage
    cfg = inputs.config
    warnings = list(inputs.warnings)

    from forensics.sources import read_metrics

    with stage("reading metrics"):
        metrics, report = read_metrics(inputs.metrics, step_offset=cfg.step_offset)
    warnings += report.warnings
    if metrics.empty:
        raise ForensicsError(f"audit: the metrics sources hold no rows: {', '.join(inputs.metrics)}")
    # the loss and grad-norm keys by one lookup (schema.keys); values written per metric let a dense series beat
    # a sparse one of the same name (HF's end-of-run train_loss beside the per-step loss)
    cols = metric_columns(metrics)
    written = {c: int(report.written(metrics, c).sum()) for c in cols}
    keys = (choose_key(cols, "loss", given=cfg.loss_key, counts=written, required=True),
            choose_key(cols, "grad_norm", counts=written))
    warnings += [k.warning for k in keys if k.warning]
    loss_key = str(keys[0].key)
    analysed = _analysed_metrics(metrics, loss_key, spike_metrics, keys[1].key)

    samples = plan = tags = None
    boundaries = list(cfg.boundaries)
    if inputs.plan:
        with stage("loading the plan"):
            samples = load_samples(inputs.samples)
            plan = load_plan(inputs.plan, samples)
        from forensics.tagging import tag_case

        if cluster_by is None and TEXT not in samples.columns and SOURCE in samples.columns:
            cluster_by = SOURCE
            warnings.append("samples have no 'text' column: clusters are their 'source' labels")
        with stage("tagging steps (buckets, clusters)"):
            tagged = tag_case(plan, samples, grad_accum=cfg.grad_accum, world_size=cfg.world_size,
                              rank_split=cfg.rank_split, boundaries=cfg.boundaries, max_len=cfg.max_len,
                              cluster_by=cluster_by)
        tags, samples, plan, boundaries = tagged.tags, tagged.samples, tagged.plan, tagged.boundaries
        warnings += tagged.warnings
        warnings += alignment_warnings(metrics[STEP].to_numpy(), plan[STEP].to_numpy())

    from forensics.detect import Findings, NonfiniteDetector, SpikeDetector, detect_spikes
    from forensics.detect.oscillation import detect_oscillation

    with stage("detecting spikes"):
        # each metric on the rows where it was written: a cell never logged (an eval metric between evals) is
        # missing, not a NaN, and must neither break a baseline nor be reported as non-finite
        found = []
        for col in metric_columns(metrics):
            rows = metrics.loc[report.written(metrics, col), [STEP, col]]
            if col in analysed:
                found += detect_spikes(rows, col, tags=tags, boundaries=boundaries)
                history = SpikeDetector().min_periods
                if len(rows) < SHORT_RUN:
                    warnings.append(f"'{col}' has only {len(rows)} values: the first {min(history, len(rows))} "
                                    "serve as the detector's history and are not judged for spikes")
            else:
                found += NonfiniteDetector(col).detect(rows)
    spikes = [f for f in found if f.kind == "spike"]
    others = [f for f in found if f.kind != "spike"]
    sections: dict[str, Any] = {}

    with stage("oscillation and jumpiness"):
        sections["oscillation"] = detect_oscillation(metrics, tags, loss_key)

    gate = whatif = None
    if plan is not None:
        from forensics.plan.gate import check_plan

        with stage("checking batch composition across epochs"):
            try:
                gate = check_plan(plan, samples, token_budget=cfg.token_budget, max_len=cfg.max_len,
                                  boundaries=boundaries, grad_accum=cfg.grad_accum, world_size=cfg.world_size,
                                  rank_split=cfg.rank_split, source=str(inputs.plan))
                sections["plan"] = gate.to_json()
            except ForensicsError as exc:  # e.g. a single-epoch plan: the gate has nothing to compare
                sections["plan"] = {"static": None, "pair_retention": [], "note": str(exc)}
                warnings.append(f"batch composition not checked: {exc}")
        if spikes:
            from forensics.plan.whatif import whatif as run_whatif

            with stage("what-if of batching strategies"):
                lengths = samples["n_tokens"].to_numpy()
                whatif = run_whatif(lengths, token_budget=cfg.token_budget, boundaries=boundaries,
                                    max_len=cfg.max_len, grad_accum=cfg.grad_accum, world_size=cfg.world_size)
                sections["whatif"] = whatif.to_dict()
    else:
        sections["plan"] = None
        if spikes:
            warnings.append("no plan given: spikes are found from the metrics alone; a plan (--plan and --samples) "
                            "names each spike's bucket, cluster, batch and suspect samples")

    if spikes:
        from forensics.detect.attribution import attribute

        with stage("attributing spikes"):
            spikes = attribute(spikes, metrics, tags, plan, samples, gate=gate, whatif=whatif,
                               boundaries=boundaries, max_len=cfg.max_len)
        if plan is not None:
            from forensics.detect.recurrence import recurrence_report

            with stage("recurrence across epochs"):
                loss_spikes = [f for f in spikes if f.metric == loss_key]
                sections["recurrence"] = recurrence_report(loss_spikes, plan, metrics, tags, metric=loss_key)
    if plan is not None:
        from forensics.detect.forgetting import forgetting_signature

        with stage("forgetting signature"):
            try:
                sections["forgetting"] = forgetting_signature(metrics, plan, samples, metric=loss_key,
                                                              spikes=spikes, boundaries=boundaries,
                                                              max_len=cfg.max_len)
            except ForensicsError as exc:
                warnings.append(f"forgetting signature not computed: {exc}")

    sections["run"] = _run_section(inputs, metrics, loss_key, analysed, plan, tags)
    sections["run"].update(key_choices_section(*keys))
    findings = Findings(items=spikes + others, sections=sections, warnings=warnings).to_dict()
    from forensics.report.html import verdict

    findings["verdict"] = verdict(findings, loss_key)
    return Audit(findings=findings, metrics=metrics, loss_key=loss_key, config=cfg, tags=tags, plan=plan,
                 samples=samples, boundaries=boundaries)


def _analysed_metrics(metrics: pd.DataFrame, loss_key: str, requested: Sequence[str] | None,
                      grad: str | None) -> list[str]:
    cols = metric_columns(metrics)
    if requested:
        missing = [m for m in requested if m not in cols]
        if missing:
            raise ForensicsError(f"--spike-metric: {', '.join(missing)} not among the metrics "
                                 f"({', '.join(cols[:12])})")
        return list(dict.fromkeys([loss_key, *requested]))
    return [loss_key] + ([grad] if grad and grad != loss_key else [])


def _run_section(inputs: AuditInputs, metrics: pd.DataFrame, loss_key: str, analysed: list[str],
                 plan: pd.DataFrame | None, tags: pd.DataFrame | None) -> dict[str, Any]:
    cfg = inputs.config
    steps = metrics[STEP]
    epochs = int(tags["epoch"].max()) + 1 if tags is not None and "epoch" in tags and len(tags) else None
    return {
        "case": str(inputs.case) if inputs.case else None,
        "metrics_sources": inputs.metrics,
        "plan_source": inputs.plan,
        "samples_source": inputs.samples,
        "steps": int(len(steps)),
        "first_step": int(steps.min()),
        "last_step": int(steps.max()),
        "epochs": epochs,
        "metrics": metric_columns(metrics),
        "loss_key": loss_key,
        "analysed_metrics": analysed,
        "grad_accum": cfg.grad_accum,
        "world_size": cfg.world_size,
        "rank_split": cfg.rank_split,
        "step_offset": cfg.step_offset,
        "boundaries": list(cfg.boundaries),
        "token_budget": cfg.token_budget,
        "max_len": cfg.max_len,
        "has_plan": plan is not None,
    }


def failed_kinds(findings: dict[str, Any], kinds: Sequence[str]) -> list[str]:
    """The ``--fail-on`` kinds present in ``findings`` (exit code 1 when any)."""
    found = []
    for kind in kinds:
        if kind == "spike" and findings.get("spikes"):
            found.append(kind)
        elif kind == "nonfinite" and findings.get("nonfinite"):
            found.append(kind)
        elif kind == "static-plan" and isinstance(findings.get("plan"), dict) and findings["plan"].get("static"):
            found.append(kind)
        elif kind == "oscillation" and (findings.get("oscillation") or {}).get("detected"):
            found.append(kind)
    return found


def parse_fail_on(text: str | None) -> list[str]:
    """``"spike,nonfinite"`` -> the kinds, checked against :data:`FAIL_KINDS`."""
    if not text:
        return []
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in FAIL_KINDS]
    if bad:
        raise ForensicsError(f"--fail-on: unknown kind {', '.join(bad)}; expected some of {', '.join(FAIL_KINDS)}")
    return kinds
