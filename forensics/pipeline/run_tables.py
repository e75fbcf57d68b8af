"""The run the rules read, assembled in one place (:func:`assemble_run`) for the audit, the live loop and ``watch``.

The audit reads its metrics whole (:func:`forensics.sources.read_metrics`) and the live loop a poll at a time
(:class:`forensics.sources.live.LiveMetrics`); both end in a metrics table and an ingest report. Everything the rules
read beyond those tables comes from here, so a field added for one way in reaches every other: the keys (loss, grad
norm, eval loss, the analysed metrics), the step conventions (logging windows, logged offset), the checkpoints, the
replay readiness, and the run's health (the sources' rewinds, the files read for crash lines, the device memory).
The live loop calls :func:`health_fields` again at each poll: rewinds and crash lines arrive while a run goes on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from forensics.errors import ForensicsError
from forensics.schema import Case, RunConfig, metric_columns, written
from forensics.schema.keys import KeyChoice, choose_key
from forensics.schema.tables import LEFT_OUT


@dataclass(frozen=True)
class RunKeys:
    """The metrics the rules read by name: the loss, grad-norm and eval-loss choices (each with its warning, for
    findings.json ``run``), and the metrics judged for spikes (the loss first)."""

    loss: KeyChoice
    grad_norm: KeyChoice
    eval_loss: KeyChoice
    analysed: list[str]

    @property
    def loss_key(self) -> str:
        return str(self.loss.key)

    @property
    def warnings(self) -> list[str]:
        return [k.warning for k in (self.loss, self.grad_norm) if k.warning]


def choose_keys(metrics: pd.DataFrame, cfg: RunConfig, spike_metrics: Sequence[str] | None = None) -> RunKeys:
    """The loss and grad-norm keys by one lookup (schema.keys), the eval loss, and the analysed metrics
    (``spike_metrics`` beside the loss when given, else the loss and the grad norm). Values written per metric let a
    dense series beat a sparse one of the same name (HF's end-of-run ``train_loss`` beside the per-step ``loss``)."""
    cols = metric_columns(metrics)
    counts = {c: int(written(metrics, c).sum()) for c in cols}
    loss = choose_key(
        cols, "loss", given=cfg.loss_key, counts=counts, required=True, left_out=metrics.attrs.get(LEFT_OUT)
    )
    grad = choose_key(cols, "grad_norm", counts=counts)
    loss_key = str(loss.key)
    return RunKeys(
        loss,
        grad,
        eval_loss_choice(cols, counts, loss_key, cfg.eval_loss_key),
        analysed_metrics(cols, loss_key, spike_metrics, grad.key),
    )


def analysed_metrics(
    cols: Sequence[str], loss_key: str, requested: Sequence[str] | None, grad: str | None
) -> list[str]:
    """The metrics judged for spikes: the loss and ``requested`` (each must exist), else the loss and grad norm."""
    if requested:
        missing = [m for m in requested if m not in cols]
        if missing:
            raise ForensicsError(
                f"--spike-metric: {', '.join(missing)} not among the metrics ({', '.join(list(cols)[:12])})"
            )
        return list(dict.fromkeys([loss_key, *requested]))
    return [loss_key] + ([grad] if grad and grad != loss_key else [])


def assemble_run(
    case: Case,
    metrics: pd.DataFrame,
    report: Any,
    keys: RunKeys,
    *,
    tags: pd.DataFrame | None = None,
    plan: pd.DataFrame | None = None,
    samples: pd.DataFrame | None = None,
    boundaries: list[int] | None = None,
    sections: dict[str, Any] | None = None,
    plan_source: Any = None,
    warnings: list[str] | None = None,
    has_plan: bool | None = None,
) -> Any:
    """The tables every rule reads (:class:`forensics.detect.base.RunTables`), for the audit, the live loop,
    ``watch`` and the dashboard alike.

    ``report``: the ingest report of the metrics (alignments, rewinds); ``plan_source``: a plan read through an
    engine (``plan`` is then None); ``warnings`` receives what the user should know (a checkpoints entry that cannot
    be read); ``has_plan``: whether the run has a plan, when the caller holds it elsewhere (the live loop reads a
    cached plan on first use), else samples and a plan in memory or on an engine."""
    from forensics.detect.base import RunTables

    cfg = case.config
    if has_plan is None:
        has_plan = (plan is not None or plan_source is not None) and samples is not None
    return RunTables(
        metrics=metrics,
        loss_key=keys.loss_key,
        analysed=list(keys.analysed),
        grad_norm_key=keys.grad_norm.key,
        tags=tags,
        plan=plan,
        samples=samples,
        boundaries=boundaries,
        max_len=cfg.max_len,
        sections=dict(sections or {}),
        steps_known=all(a.convention != "as logged" for a in report.alignments),
        logging_steps=logging_steps(cfg, report),
        logged_offset=logged_offset(report),
        max_grad_norm=cfg.max_grad_norm,
        rule_params={k: dict(v) for k, v in cfg.detect.items()},
        eval_loss_key=keys.eval_loss.key,
        plan_source=plan_source,
        **replay_fields(case, has_plan),
        **checkpoint_fields(case, warnings),
        **health_fields(case, report),
    )


def replay_fields(case: Case, has_plan: bool) -> dict[str, Any]:
    """The case folder the printed commands name, and whether a replay can run on it (else what it lacks)."""
    out: dict[str, Any] = {"case_path": str(case.root) if case.root else None}
    if has_plan and case.root is not None:
        from forensics.replay.readiness import replay_readiness

        ready = replay_readiness(case)
        out.update(replay_ready=ready.ok, replay_missing=ready.words())
    return out


def eval_loss_choice(
    cols: Sequence[str], counts: dict[str, int] | None, loss_key: str, given: str | None = None
) -> KeyChoice:
    """The held-out loss (run.toml ``eval_loss_key``, else found as the loss key is), never the training
    loss itself (a run that logs only its eval loss analyses it as the loss and has no second one)."""
    choice = choose_key(cols, "eval_loss", given=given, counts=counts)
    if choice.key is not None and choice.key == loss_key and not choice.given:
        return KeyChoice(
            "eval_loss", None, f"'{loss_key}' is the only loss and is analysed as the loss", choice.candidates
        )
    return choice


def checkpoint_fields(case: Case, warnings: list[str] | None = None) -> dict[str, Any]:
    """The case's checkpoints for the rules (the divergence finding names the one to resume from), listed from their
    names without torch; a run.toml ``checkpoints`` that cannot be read is a warning, not a failure of the audit."""
    from forensics.replay.readiness import list_checkpoints

    found, warning = list_checkpoints(case)
    if warning and warnings is not None:
        warnings.append(warning)
    return {"checkpoints": found}


def health_fields(case: Case, report: Any) -> dict[str, Any]:
    """What the run-health rules read beside the metrics: rewinds, crash-line files, the device memory. The live loop
    asks again at each poll (a writer that resumed rewinds its log; a job that died leaves a ``slurm-*.out``)."""
    from forensics.sources.crash_logs import crash_log_files, shifted_rewinds

    rewinds = shifted_rewinds(report)
    return {
        "rewinds": rewinds + plan_rewinds(case, rewinds),
        "log_files": crash_log_files(case, report),
        "device_memory_gb": case.config.device_memory_gb,
    }


def plan_rewinds(case: Case, known: Sequence[Any] = ()) -> list[Any]:
    """The rewinds the plan recorder wrote (a resumed run trained steps again: :mod:`forensics.plan.rewinds`) as
    :class:`~forensics.schema.tables.Rewind` s in plan steps, except where a metrics source saw the same resume
    (the same step resumed at): sources that merged a resumed run's files show no rewind, the recorded plan does."""
    from forensics.plan.rewinds import REWINDS_FILE, read_rewinds
    from forensics.schema.tables import Rewind

    plan = case.plan_path
    if plan is None or not plan.is_dir():
        return []
    seen = {int(r.from_step) for r in known}
    out = []
    for r in read_rewinds(plan):
        try:
            resumed_at, last = int(r["resumed_at"]), int(r["last_step"])
        except (KeyError, TypeError, ValueError):
            continue
        if resumed_at in seen:
            continue
        seen.add(resumed_at)
        out.append(
            Rewind(
                from_step=resumed_at,
                rows_replaced=last - resumed_at + 1,
                source=f"{plan.name}/{REWINDS_FILE}",
                last_step=last,
            )
        )
    return out


def logged_offset(report: Any) -> int:
    """Logged step minus canonical step: the step offset the sources were aligned with (HF's ``global_step``
    counts from 1: 1), the most common one when sources differ; 0 without sources (docs/concepts.md "logged step")."""
    offsets = [int(a.step_offset) for a in report.alignments]
    return max(set(offsets), key=offsets.count) if offsets else 0


def logging_steps(cfg: RunConfig, report: Any) -> int:
    """Steps each logged loss value covers: run.toml's ``logging_steps``, else what the loss's source says (HF's
    trainer_state.json, W&B config), else 1."""
    if cfg.logging_steps:
        return int(cfg.logging_steps)
    said = [a.logging_steps for a in report.alignments if a.logging_steps and a.convention == "hf-trainer"]
    return int(said[-1]) if said else 1
