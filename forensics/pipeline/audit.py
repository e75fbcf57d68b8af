"""One audit, top to bottom: sources -> plan -> tags -> detection -> findings (the report renders the result).

This is the only module that calls every stage; the stages themselves never call each other, they exchange the
tables of :mod:`forensics.schema`. It is the library behind ``forensics audit`` and the dashboard: a
:class:`~forensics.schema.Case` (a case folder and its resolved run configuration, :func:`forensics.schema.open_case`)
goes in, :func:`run_audit` runs the stages in order (sources -> metrics; plan -> step-mapped plan; tagging -> step
and sample tags; detect -> findings) and returns an :class:`Audit` holding every table it built, so the caller can
render the summary, ``findings.json`` and ``report.html`` without recomputing anything.

What needs a plan: suspect samples, bucket/cluster attribution, recurrence, the composition gate and the forgetting
signature. Without one, metrics alone still give spikes, non-finite steps and oscillation, and the findings say so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pandas as pd

from forensics.errors import ForensicsError
from forensics.pipeline.run_tables import (  # noqa: F401  (the audit's names for them, kept for its callers)
    assemble_run,
    checkpoint_fields,
    choose_keys,
    eval_loss_choice,
    health_fields,
    logged_offset,
    logging_steps,
    replay_fields,
)
from forensics.schema import (
    SAMPLE_ID,
    STEP,
    Case,
    RunConfig,
    alignment_warnings,
    load_plan,
    load_samples,
    metric_columns,
    validate_plan,
)
from forensics.schema.keys import key_choices_section


@dataclass
class Audit:
    """Everything one audit built: the findings and the tables behind them (for the report and the dashboard)."""

    findings: dict[str, Any]
    metrics: pd.DataFrame
    loss_key: str
    case: Case
    tags: pd.DataFrame | None = None
    plan: pd.DataFrame | None = None
    samples: pd.DataFrame | None = None
    boundaries: list[int] | None = None
    #: A plan too large to load (read through an engine; ``plan`` is then None): the rows of the spikes' peak
    #: steps, which the report's cards show.
    batch_rows: pd.DataFrame | None = None
    #: The expected value of each step from its composition (``step``, then one column per metric judged against
    #: it: the spike rule's :meth:`~forensics.detect.SpikeDriver.expected`); None without a plan. The report
    #: draws it as the expected band around the loss.
    expected: pd.DataFrame | None = None

    @property
    def plan_on_engine(self) -> bool:
        """The plan was read through an engine where it lies (``plan`` is None, ``batch_rows`` holds the spikes'
        batches): what needs the plan in memory loads it (:func:`load_step_plan`)."""
        return self.plan is None and self.batch_rows is not None

    @property
    def plan_steps(self) -> set[int] | None:
        """The steps the plan holds (from the tags, one row a step, when it was read through an engine); None
        without a plan."""
        if self.plan is not None:
            return set(int(s) for s in self.plan[STEP].unique())
        if self.plan_on_engine and self.tags is not None:
            return set(int(s) for s in self.tags[STEP].unique())
        return None

    @property
    def config(self) -> RunConfig:
        return self.case.config

    @property
    def spikes(self) -> list[dict[str, Any]]:
        return self.findings.get("spikes", [])

    def to_json(self) -> dict[str, Any]:
        """``findings.json`` (docs/findings-json.md)."""
        return self.findings

    def replay_results(self) -> dict[str, Any] | None:
        """The case's ``replay/replay.json`` when a replay ran (its verdicts go on the report's cards)."""
        return _replay_doc(self.case)


@contextmanager
def _quiet_stage(name: str) -> Iterator[None]:
    yield


def run_audit(
    case: Case,
    *,
    spike_metrics: Sequence[str] | None = None,
    stage: Callable[[str], Any] | None = None,
    pattern: str | None = None,
) -> Audit:
    """Run every stage on a case; ``stage(name)`` is a context manager factory used to show progress."""
    stage = stage or _quiet_stage
    cfg = case.config
    warnings = list(case.warnings)
    if not (cfg.metrics or cfg.ranks):
        if case.root is None:
            raise ForensicsError("audit: give a case folder, or the metrics with --metrics SRC")
        raise ForensicsError(
            f"audit: case folder {case.root} holds no metrics source (metrics.parquet, "
            "trainer_state.json, a log, a TensorBoard or W&B folder) and its run.toml names none; "
            "give --metrics SRC"
        )
    if cfg.plan and not cfg.samples:
        raise ForensicsError("audit: a plan needs its samples table too (--samples, or samples.parquet in the case)")
    if cfg.plan:  # footers and columns before any reading: the engine's choice reads the footers too
        from forensics.schema.case import check_tables

        check_tables(case.plan_path, case.samples_path)
    # what earlier commands left, read before the work: a damaged file costs no reading and no progress lines
    compared, replayed = _compare_doc(case), _replay_doc(case)

    from forensics.detect.rules import build_rules
    from forensics.sources import read_metrics

    rules = build_rules(cfg.detect, has_plan=bool(cfg.plan))  # first: a typo in [detect] costs no reading
    sources = case.metrics_sources
    with stage("reading metrics"):
        metrics, report = read_metrics(sources, step_offset=cfg.step_offset, step_key=cfg.step_key, pattern=pattern)
    warnings += report.warnings
    if metrics.empty:
        raise ForensicsError(f"audit: the metrics sources hold no rows: {', '.join(s.path for s in sources)}")
    keys = choose_keys(metrics, cfg, spike_metrics)
    warnings += keys.warnings
    loss_key, analysed = keys.loss_key, keys.analysed

    with _plan_engine(case, warnings) as engine:  # None: the plan is loaded whole (pandas)
        samples = plan = tags = view = None
        boundaries = list(cfg.boundaries) if cfg.boundaries else None
        if cfg.plan:
            from forensics.tagging import tag_run

            with stage("loading the plan" if engine is None else "loading the samples"):
                samples = load_samples(case.samples_path)
                if engine is None:
                    plan = load_step_plan(case, samples)
            with stage("tagging steps (buckets, clusters)"):
                tagged = tag_run(plan if engine is None else case.plan_path, samples, cfg, engine=engine)
            tags, samples, boundaries = tagged.tags, tagged.samples, tagged.boundaries
            warnings += tagged.warnings
            warnings += alignment_warnings(metrics[STEP].to_numpy(), tags[STEP].to_numpy())
            if engine is not None:  # a plan too large to load: the rules read it through the engine, never whole
                from forensics.detect.plan_view import EnginePlan

                view = EnginePlan(engine, case.plan_path, int(metrics[STEP].max()), samples[SAMPLE_ID].to_numpy())
                with stage(f"checking the plan's logged steps ({engine.name})"):
                    warnings += check_logged_rows(view, engine.plan_columns(case.plan_path), str(case.plan_path))
        has_plan = plan is not None or view is not None

        sections: dict[str, Any] = {}
        if has_plan:
            sections.update(
                _plan_sections(
                    plan if engine is None else case.plan_path, samples, boundaries, cfg, case, stage, warnings, engine
                )
            )
        else:
            sections["plan"] = None

        from forensics.detect import Findings
        from forensics.detect.rules import run_rules

        run = assemble_run(
            case,
            metrics,
            report,
            keys,
            tags=tags,
            plan=plan,
            samples=samples,
            boundaries=boundaries,
            sections=sections,
            plan_source=view,
            warnings=warnings,
        )
        judged = run_rules(rules, run, stage=stage)
        # the batches the report's cards show, while the engine is open
        from forensics.detect.findings import spike_span

        batch_rows = (
            view.rows_at({spike_span(f)[2] for f in judged.found if f.kind == "spike"}) if view is not None else None
        )
    found = judged.found
    expected = next((getattr(r, "expected_", None) for r in rules if r.name == "spikes"), None)
    sections.update(judged.sections)
    warnings += judged.warnings
    if not has_plan and any(f.kind == "spike" for f in found):
        warnings.append(
            "no plan given: spikes are found from the metrics alone; a plan (--plan and --samples) "
            "names each spike's bucket, cluster, batch and suspect samples"
        )

    sections["run"] = _run_section(case, metrics, loss_key, analysed, has_plan, tags, boundaries, report)
    sections["run"].update(key_choices_section(keys.loss, keys.grad_norm, keys.eval_loss))
    sections["run"]["checkpoints"] = None if run.checkpoints is None else len(run.checkpoints)
    findings = Findings(items=found, sections=sections, warnings=warnings, logged_offset=run.logged_offset).to_dict()
    from forensics.detect.causes.verdict import facts, verdict

    findings["verdict"] = verdict(findings, loss_key)
    findings["verdict_facts"] = facts(findings)
    if compared is not None:  # another run's spikes at the same data are evidence too (detect/causes/compared.py)
        from forensics.detect.causes.compared import apply_compare

        apply_compare(findings, compared)
    if replayed is not None:  # an earlier replay's verdicts are evidence of the causes (detect/causes/replayed.py)
        from forensics.detect.causes.replayed import apply_replay

        apply_replay(findings, replayed)
    return Audit(
        findings=findings,
        metrics=metrics,
        loss_key=loss_key,
        case=case,
        tags=tags,
        plan=plan,
        samples=samples,
        boundaries=boundaries,
        batch_rows=batch_rows,
        expected=expected,
    )


def load_step_plan(case: Case, samples: pd.DataFrame | None) -> pd.DataFrame:
    """The case's plan loaded whole and step-mapped, as every stage reads a plan in memory."""
    from forensics.plan.step_mapping import step_plan

    return step_plan(load_plan(case.plan_path, samples), case.config)


def check_logged_rows(view: Any, columns: Sequence[str], origin: str) -> list[str]:
    """The logged rows of a plan read through an engine, checked a chunk at a time as a plan in memory is
    (integer columns, no negative step, epoch, batch id, micro or rank: bad input); returns the batch ids missing
    inside an epoch (tagging says it of a plan in memory), from the distinct batch keys."""
    from forensics.schema import BATCH_ID, MICRO, RANK, batch_columns
    from forensics.tagging.case import batch_gap_warnings

    batch = batch_columns(columns)
    read = list(dict.fromkeys([STEP, SAMPLE_ID, *batch, *(c for c in (MICRO, RANK) if c in columns)]))
    keys = []
    for chunk in view.chunks(read):
        chunk = validate_plan(chunk, origin)
        if BATCH_ID in batch:
            keys.append(chunk[batch].drop_duplicates())
    return batch_gap_warnings(pd.concat(keys, ignore_index=True).drop_duplicates()) if keys else []


@contextmanager
def _plan_engine(case: Case, warnings: list[str]) -> Iterator[Any]:
    """The engine that reads a plan too large to load (docs/scale.md: ``auto`` picks by the plan's size), open
    for the whole audit; None when the plan is loaded whole (pandas), or there is no plan. A plan the engine cannot
    read step by step (not Parquet, or without a ``step`` column: mapped to steps in memory) is loaded whole."""
    if not case.config.plan:
        yield None
        return
    from forensics.engine import engine_of
    from forensics.engine.source import parquet_parts

    engine = engine_of(case.config, case.plan_path)
    if engine.name == "pandas":
        yield None
        return
    try:
        whole = parquet_parts(case.plan_path) is None or STEP not in engine.plan_columns(case.plan_path)
        if whole:
            warnings.append(
                f"plan {case.plan_path}: loaded whole, not read on {engine.name}: the engine reads a "
                "Parquet plan with a 'step' column (the recorder's), and this one is mapped to steps "
                "in memory"
            )
        yield None if whole else engine
    finally:
        engine.close()


def _compare_doc(case: Case) -> dict[str, Any] | None:
    """The case's ``compare.json`` that ``forensics compare`` left (None when it compared no such case)."""
    from forensics.detect.causes.compared import COMPARE_FILE
    from forensics.schema.case import read_case_json

    path = case.output(COMPARE_FILE)
    return read_case_json(path, "compare file", "spikes", "`forensics compare`") if path and path.is_file() else None


def _replay_doc(case: Case) -> dict[str, Any] | None:
    """The case's ``replay/replay.json`` (None when no replay ran; a damaged one is bad input)."""
    from forensics.replay.result import read_replay

    path = case.output("replay/replay.json")
    return read_replay(path) if path is not None else None


def _plan_sections(
    plan: Any,
    samples: pd.DataFrame,
    boundaries: list[int],
    cfg: RunConfig,
    case: Case,
    stage: Callable[[str], Any],
    warnings: list[str],
    engine: Any = None,
) -> dict[str, Any]:
    """The plan stage's typed results as findings.json sections: the gate (``plan``) and the what-if. ``plan``: the
    step-mapped plan, or the plan's path that ``engine`` reads."""
    from forensics.plan.gate import check_plan
    from forensics.plan.whatif import whatif

    out: dict[str, Any] = {}
    with stage("checking batch composition across epochs"):
        try:
            out["plan"] = check_plan(
                plan,
                samples,
                token_budget=cfg.token_budget,
                max_len=cfg.max_len,
                boundaries=boundaries,
                grad_accum=cfg.grad_accum,
                world_size=cfg.world_size,
                rank_split=cfg.rank_split,
                source=str(case.plan_path),
                engine=engine,
            ).to_json()
        except ForensicsError as exc:  # e.g. a single-epoch plan: the gate has nothing to compare
            out["plan"] = {"static": None, "pair_retention": [], "note": str(exc)}
            warnings.append(f"batch composition not checked: {exc}")
    with stage("what-if of batching strategies"):
        out["whatif"] = whatif(
            samples["n_tokens"].to_numpy(),
            token_budget=cfg.token_budget,
            boundaries=boundaries,
            max_len=cfg.max_len,
            grad_accum=cfg.grad_accum,
            world_size=cfg.world_size,
        ).to_dict()
    return out


def _run_section(
    case: Case,
    metrics: pd.DataFrame,
    loss_key: str,
    analysed: list[str],
    has_plan: bool,
    tags: pd.DataFrame | None,
    boundaries: list[int] | None,
    report: Any,
) -> dict[str, Any]:
    cfg = case.config
    steps = metrics[STEP]
    epochs = int(tags["epoch"].max()) + 1 if tags is not None and "epoch" in tags and len(tags) else None
    return {
        "case": str(case.root) if case.root else None,
        "metrics_sources": [s.path for s in case.metrics_sources],
        "sources": report.sources_json(),
        "plan_source": str(case.plan_path) if case.plan_path else None,
        "samples_source": str(case.samples_path) if case.samples_path else None,
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
        "step_offset": cfg.step_offset or 0,
        "logged_offset": logged_offset(report),
        "boundaries": list(boundaries) if boundaries else None,
        "boundaries_fitted": bool(has_plan and cfg.boundaries is None),
        "token_budget": cfg.token_budget,
        "max_len": cfg.max_len,
        "has_plan": has_plan,
    }


def failed_kinds(findings: dict[str, Any], kinds: Sequence[str]) -> list[str]:
    """The ``--fail-on`` names that match: a critical finding of the kind each names (exit code 1 when any).

    The names are the registry's (:func:`forensics.detect.kinds.fail_kinds`): a rule's kind joins by registering.
    """
    from forensics.detect.kinds import fail_kinds

    names = fail_kinds()
    critical = {str(f.get("kind")) for f in findings.get("findings") or [] if f.get("severity") == "critical"}
    return [k for k in kinds if names.get(k) in critical]


def parse_fail_on(text: str | None) -> list[str]:
    """``"spike,nonfinite"`` -> the names, checked against the registry's ``--fail-on`` names."""
    from forensics.detect.kinds import fail_kinds

    if not text:
        return []
    known = fail_kinds()
    names = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in names if k not in known]
    if bad:
        raise ForensicsError(f"--fail-on: unknown kind {', '.join(bad)}; expected some of {', '.join(sorted(known))}")
    return names


@dataclass
class CaseCheck:
    """``forensics validate``: what loading a case found (counts per table, and the warnings)."""

    lines: list[str]
    warnings: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"found": self.lines, "warnings": self.warnings}


def validate_case(case: Case) -> CaseCheck:
    """Load a case the way every command does (metrics, samples, step-mapped plan) and say what was found."""
    cfg = case.config
    if not (cfg.metrics or cfg.ranks or cfg.plan or cfg.samples):
        where = f"{case.root}" if case.root else "the current folder (no case given)"
        raise ForensicsError(
            f"validate: no case in {where}: expected run.toml, metrics.parquet, plan.parquet or "
            "samples.parquet, or --metrics/--plan/--samples"
        )
    from forensics.plan.step_mapping import step_plan
    from forensics.sources import read_metrics

    lines, warnings = [], list(case.warnings)
    samples = load_samples(case.samples_path) if cfg.samples else None
    plan = step_plan(load_plan(case.plan_path, samples), cfg) if cfg.plan else None
    metrics = None
    if cfg.metrics or cfg.ranks:
        metrics, report = read_metrics(case.metrics_sources, step_offset=cfg.step_offset, step_key=cfg.step_key)
        warnings += report.warnings
        if metrics.empty:
            raise ForensicsError(
                f"validate: the metrics sources hold no rows: {', '.join(s.path for s in case.metrics_sources)}"
            )
        lines.append(
            f"metrics: {len(metrics)} steps ({metrics[STEP].min()}-{metrics[STEP].max()}), "
            f"{len(metric_columns(metrics))} metrics"
        )
    if samples is not None:
        lines.append(f"samples: {len(samples)}")
    if plan is not None:
        lines.append(f"plan: {len(plan)} rows, {plan[STEP].nunique()} steps")
    if metrics is not None and plan is not None:
        warnings += alignment_warnings(metrics[STEP].to_numpy(), plan[STEP].to_numpy())
    return CaseCheck(lines, warnings)
