"""The loop from "there was a spike" to "replay says it was the data": an audit, a replay of its top causes within
a time budget, and the findings, summary, report and next steps written again from the replayed evidence.

Two ways in, one merge (:func:`forensics.detect.causes.replayed.apply_replay`):

- ``forensics audit CASE --replay`` (or run.toml ``[replay] auto = true``): :func:`replay_causes` after the audit
  replays the most urgent causes with a batch (``[replay] max_causes``, default :data:`MAX_CAUSES`) within the budget
  (``--replay-budget``, run.toml ``[replay] budget``, default :data:`BUDGET_S` seconds) and merges the verdicts into
  the audit's findings before anything is written; the causes it did not reach are listed as not replayed. When
  the checkpoints hold optimizer state, the replayed causes' first steps are also re-run from the checkpoint before
  them (``replay --rerun``, within the same budget), so each such cause gets its ``cause_class`` and ``action`` and
  the verdict sentence names the main cause's.
- ``forensics replay CASE ...``: :func:`merge_into_audit` merges the replay.json it just wrote into the case's
  findings.json and re-renders its report.html, so a later replay lands in the same files the audit wrote.

Both decide the re-run by one rule, :func:`rerun_plan`: a replay of the findings' causes (``audit --replay``,
``replay --from-findings``) re-runs whenever the checkpoints hold optimizer state, and a re-run that cannot run is a
note; ``--rerun`` asks for it on any replay and makes a re-run that cannot run bad input. So the printed next step
after an audit (``forensics replay CASE --from-findings``) writes the same findings as ``audit --replay`` would
have: the same verdicts, cause classes and verdict sentence.

Like every product module besides the stages, this one talks to them through their tables and files only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forensics.errors import ForensicsError
from forensics.schema import Case, open_case

#: Seconds ``audit --replay`` may spend replaying (run.toml ``[replay] budget``).
BUDGET_S = 300.0
#: Causes ``audit --replay`` replays at most (run.toml ``[replay] max_causes``).
MAX_CAUSES = 5


def replay_requested(case: Case, flag: bool) -> bool:
    """``--replay``, or run.toml ``[replay] auto = true``."""
    return bool(flag or (case.config.replay or {}).get("auto"))


def rerun_plan(case: Case, asked: bool, from_findings: bool) -> tuple[bool, bool]:
    """``(rerun, optional)`` for a replay of ``case`` (module docstring): ``asked`` is ``--rerun``,
    ``from_findings`` whether the replay's steps are the findings' causes (``audit --replay`` and
    ``replay --from-findings`` both). One rule for both ways in, so that they write the same findings."""
    if asked:
        return True, False
    if not from_findings or case.root is None:
        return False, False
    from forensics.replay.readiness import has_optimizer_state

    return has_optimizer_state(case), True


def replay_budget(case: Case, budget_s: float | None = None) -> float:
    """The seconds a replay of the findings' causes may spend: ``budget_s`` (``--replay-budget``), else run.toml
    ``[replay] budget``, else :data:`BUDGET_S`. ``audit --replay`` and ``replay --from-findings`` both spend it, so
    that a re-run the budget cannot afford is skipped by both (it decides which step classes a cause)."""
    table = dict(case.config.replay or {})
    budget = float(budget_s if budget_s is not None else table.get("budget", BUDGET_S))
    if budget <= 0:
        raise ForensicsError(f"--replay-budget must be > 0 seconds; got {budget:g}")
    return budget


def replay_causes(
    case: Case,
    findings: dict[str, Any],
    plan_steps: set[int],
    budget_s: float | None = None,
    progress: bool = False,
    device: str | None = None,
) -> tuple[dict[str, Any], Any]:
    """Replay the top causes of ``findings`` (the audit's, not yet written; ``plan_steps``: the steps its plan
    holds) and merge the verdicts into them; returns the findings and the :class:`~forensics.replay.ReplayResult`
    (None when nothing could be replayed: why is added to the findings' warnings)."""
    from forensics.replay.readiness import replay_readiness

    ready = replay_readiness(case)
    if not ready.ok:
        findings.setdefault("warnings", []).append(f"--replay: not replayed; the case lacks {ready.words()}")
        return findings, None
    from forensics.replay import ReplayOptions, replay_case
    from forensics.replay.select import cause_groups

    table = dict(case.config.replay or {})
    budget = replay_budget(case, budget_s)
    max_causes = int(table.get("max_causes") or MAX_CAUSES)
    groups = cause_groups(findings, plan_steps.__contains__)
    keys = {str(c.get("id")): c.get("key") for c in findings.get("causes") or []}
    chosen, rest = groups[:max_causes], groups[max_causes:]
    if not chosen:
        findings.setdefault("warnings", []).append("--replay: no cause with a batch to replay")
        return findings, None
    rerun, optional = rerun_plan(case, False, True)
    result = replay_case(
        case,
        ReplayOptions(
            groups=chosen,
            budget_s=budget,
            progress=progress,
            device=device,
            findings=findings,
            rerun=rerun,
            rerun_optional=optional,
        ),
    )
    not_replayed = [
        {
            "cause": g["cause"],
            "key": keys.get(str(g["cause"])),
            "steps": g["steps"],
            "why": f"the replay budget ({budget:g} s) was spent",
        }
        for g in result.not_replayed
    ]
    not_replayed += [
        {
            "cause": g.cause,
            "key": keys.get(str(g.cause)),
            "steps": g.steps,
            "why": f"past the {max_causes} most urgent causes ([replay] max_causes)",
        }
        for g in rest
    ]
    from forensics.detect.causes.replayed import apply_replay
    from forensics.replay.result import read_replay

    replay = read_replay(case.root / "replay" / "replay.json")
    apply_replay(findings, replay, not_replayed)
    from forensics.replay.cause_class import apply_cause_classes

    apply_cause_classes(findings, replay)
    return findings, result


def merge_into_audit(case_dir: str | Path | Case, result: Any) -> list[Path]:
    """Merge the case's replay.json into its findings.json and re-render its report.html (when an audit wrote them);
    returns the files written."""
    case = case_dir if isinstance(case_dir, Case) else open_case(case_dir)
    path = case.findings_path
    if path is None or not path.is_file():
        return []
    try:
        findings = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ForensicsError(f"{path} is not valid JSON: {exc}") from exc
    from forensics.detect.causes.replayed import apply_replay
    from forensics.replay.result import read_replay

    replay = read_replay(case.root / "replay" / "replay.json")
    # the folder replayed, as the user named it: a case copied or moved since its audit prints its own path
    findings.setdefault("run", {})["case"] = str(case_dir if not isinstance(case_dir, Case) else case.root)
    apply_replay(findings, replay)
    from forensics.replay.cause_class import apply_cause_classes

    apply_cause_classes(findings, replay)
    _write_json(case, findings)
    written = [path]
    report = case.report_path
    if report is not None and report.is_file():
        write_case_report(case, findings, replay, report)
        written.append(report)
    return written


def write_case_report(case: Case, findings: dict[str, Any], replay: dict[str, Any] | None, path: Path) -> None:
    """The report of ``findings`` with the case's tables read again (the metrics, the plan and its tags)."""
    from forensics.plan.step_mapping import step_plan
    from forensics.report import write_report
    from forensics.schema import load_plan, load_samples
    from forensics.sources import read_metrics

    cfg = case.config
    metrics, ingest = read_metrics(case.metrics_sources, step_offset=cfg.step_offset, step_key=cfg.step_key)
    tags = samples = plan = expected = None
    if cfg.plan and cfg.samples:
        from forensics.tagging import tag_run

        samples = load_samples(case.samples_path)
        plan = step_plan(load_plan(case.plan_path, samples), cfg)
        tagged = tag_run(plan, samples, cfg)
        tags, samples = tagged.tags, tagged.samples
        analysed = (findings.get("run") or {}).get("analysed_metrics") or []
        expected = expected_table(case, metrics, ingest, tags, plan, samples, tagged.boundaries, analysed[1:])
    write_report(
        path,
        findings,
        metrics,
        tags=tags,
        samples=samples,
        plan=plan,
        loss_key=(findings.get("run") or {}).get("loss_key"),
        replay=replay,
        expected=expected,
    )


def expected_table(
    case: Case,
    metrics: Any,
    ingest: Any,
    tags: Any,
    plan: Any,
    samples: Any,
    boundaries: list[int] | None,
    spike_metrics: list[str] | None = None,
) -> Any:
    """Each step's expected value from its composition, as the audit's spike rule judged it (the report's expected
    band): the rule is run again on the tables read again, which gives the audit's table (it is deterministic);
    ``spike_metrics``: the metrics the audit judged beside the loss (findings.json ``run.analysed_metrics``)."""
    from forensics.detect.rules import build_rules
    from forensics.pipeline.run_tables import assemble_run, choose_keys

    keys = choose_keys(metrics, case.config, spike_metrics or None)
    run = assemble_run(case, metrics, ingest, keys, tags=tags, plan=plan, samples=samples, boundaries=boundaries)
    rule = next(r for r in build_rules(case.config.detect) if r.name == "spikes")  # as the audit built it
    rule.detect(run)
    return rule.expected_


def _write_json(case: Case, findings: dict[str, Any]) -> None:
    path = case.findings_path
    if path is not None:
        path.write_text(json.dumps(findings, indent=2, allow_nan=False) + "\n", encoding="utf-8")
