"""The registry of finding kinds: what each kind of finding is called, where it goes and how it is told.

Every finding has a ``kind``, and every kind registers here: the findings.json section it fills (``spikes``,
``nonfinite``, ... as docs/concepts.md names them; a kind without one appears in ``findings`` only), its title, the
``--fail-on`` name that counts it, its line in the terminal summary and the dashboard, and its card in the report. A
run-level section (the batch plan's gate, the oscillation measure, the forgetting signature) registers the same way,
as a kind whose ``object_section`` is the section. The summary, the report, ``--fail-on`` and the verdict read this
registry and name no kind; adding a rule is its module plus one :func:`register_kind` (and
:func:`forensics.detect.rules.register_rule`).

Cards and summary lines are given as ``"module:function"`` paths (or callables), so this module imports no report
code: ``card(items, context) -> str | list[str]`` with the kind's findings (or ``[section]`` for a run-level one) and
a :class:`forensics.report.cards.CardContext`; ``summary(section) -> list[str]`` gives a run-level section's lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

#: A finding as written to findings.json (a dict).
FindingDict = dict[str, Any]
#: The built-in kinds' cards and summary lines.
_CARDS = "forensics.report.cards.builtin"
_LINES = "forensics.report.summary_lines"


@dataclass(frozen=True)
class FindingKind:
    """How one kind of finding is filed and told.

    - ``section``: the findings.json list it fills (None: only ``findings``); ``object_section``: a run-level kind
      whose section is one object (``plan``, ``oscillation``, ``forgetting``), drawn even when no finding says so.
    - ``fail_on``: the ``--fail-on`` name (critical findings of this kind count); None: not a gate.
    - ``line``: one finding in words (default: kind, step, metric and value); ``card``: its report card
      (``"module:function"`` or a callable; None: a table of the kind's findings); ``summary``: a run-level
      section's lines in the terminal summary.
    - ``told_by``: the run-level section whose card and lines tell this kind (its findings are not drawn again).
    - ``triggers``, ``details``, ``false_positives``: what raises it, what its ``details`` hold and when it can be
      raised by something that is not a fault, in words; the findings reference of the docs is generated from them.
    """

    kind: str
    title: str
    section: str | None = None
    object_section: bool = False
    fail_on: str | None = None
    line: Callable[[FindingDict], str] | None = None
    card: str | Callable[..., Any] | None = None
    summary: str | Callable[[FindingDict], list[str]] | None = None
    told_by: str | None = None
    triggers: str = ""
    details: str = ""
    false_positives: str = ""

    def describe(self, finding: FindingDict) -> str:
        """One finding in one line."""
        if self.line is not None:
            return self.line(finding)
        where = f"step {finding.get('step')}"
        if finding.get("end_step") not in (None, finding.get("step")):
            where = f"steps {finding.get('step')}-{finding.get('end_step')}"
        what = f" {finding['metric']}" if finding.get("metric") else ""
        value = finding.get("value")
        shown = f" = {value:.4g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
        return f"{self.title}: {where}{what}{shown}"


KINDS: dict[str, FindingKind] = {}


def register_kind(kind: FindingKind) -> FindingKind:
    """Add (or replace) a kind; returns it."""
    KINDS[kind.kind] = kind
    return kind


def document_kind(name: str, triggers: str, details: str = "", false_positives: str = "") -> FindingKind:
    """Attach the words the findings reference prints to a registered kind (kept apart from :func:`register_kind`
    so that a kind's filing and its documentation read separately); returns the kind."""
    return register_kind(replace(KINDS[name], triggers=triggers, details=details, false_positives=false_positives))


def kind_of(name: str) -> FindingKind:
    """The registered kind, or a plain one named after ``name`` (a finding of an unknown kind is still told)."""
    return KINDS.get(name) or FindingKind(kind=name, title=name.replace("_", " "))


def fail_kinds() -> dict[str, str]:
    """``--fail-on`` name -> kind, for every registered kind that is a gate."""
    return {k.fail_on: k.kind for k in KINDS.values() if k.fail_on}


def run_level_kinds() -> list[FindingKind]:
    """The kinds whose section is one run-level object, in registration order."""
    return [k for k in KINDS.values() if k.object_section]


def _steps(f: FindingDict, limit: int = 6) -> str:
    steps = list((f.get("details") or {}).get("steps") or [])
    return ", ".join(map(str, steps[:limit])) + (" ..." if len(steps) > limit else "")


def _nonfinite_line(f: FindingDict) -> str:
    value = f.get("value_text") or f.get("value")
    return f"{f.get('metric')} is {value} at step {f.get('step')} ({f.get('severity')})"


def _level_shift_line(f: FindingDict) -> str:
    new_level = f.get("details", {}).get("new_level")
    return f"level shift of {f.get('metric')} from step {f.get('step')} (new level {new_level})"


def _misaligned_line(f: FindingDict) -> str:
    return f"metrics look {int(f.get('value') or 0):+d} step(s) off the plan: " + (f.get("evidence") or [""])[0]


register_kind(FindingKind("spike", "spike", section="spikes", fail_on="spike", card=f"{_CARDS}:spike_cards"))
register_kind(
    FindingKind(
        "nonfinite",
        "non-finite value",
        section="nonfinite",
        fail_on="nonfinite",
        line=_nonfinite_line,
        card=f"{_CARDS}:nonfinite_cards",
    )
)
register_kind(FindingKind("level_shift", "level shift", section="level_shifts", line=_level_shift_line))
register_kind(FindingKind("expected_for_bucket", "expected for its bucket", section="expected_for_bucket"))
register_kind(FindingKind("misaligned_steps", "metrics off the plan", line=_misaligned_line))
register_kind(FindingKind("recurrence", "batch recurrence", section="recurrence"))
register_kind(
    FindingKind(
        "harmful_samples", "harmful samples", fail_on="samples", line=lambda f: str((f.get("evidence") or [""])[0])
    )
)
register_kind(
    FindingKind(
        "grad_norm_spikes",
        "grad-norm spikes the loss did not follow",
        fail_on="grad-norm",
        line=lambda f: (
            f"{(f.get('details') or {}).get('count')} grad-norm spikes the loss did not follow (steps {_steps(f)})"
        ),
    )
)
register_kind(
    FindingKind(
        "plan",
        "batch composition",
        section="plan",
        object_section=True,
        card=f"{_CARDS}:plan_cards",
        summary=f"{_LINES}:plan_lines",
    )
)
register_kind(FindingKind("static_plan", "static batch composition", fail_on="static-plan", told_by="plan"))
register_kind(
    FindingKind(
        "oscillation",
        "oscillation",
        section="oscillation",
        object_section=True,
        fail_on="oscillation",
        card=f"{_CARDS}:oscillation_cards",
        summary=f"{_LINES}:oscillation_lines",
    )
)
register_kind(
    FindingKind(
        "forgetting", "forgetting", section="forgetting", object_section=True, summary=f"{_LINES}:forgetting_lines"
    )
)


def _health_line(f: FindingDict) -> str:
    return str((f.get("evidence") or [f.get("kind")])[0]) + f" ({f.get('severity')})"


register_kind(FindingKind("divergence", "divergence", fail_on="divergence", line=_health_line))
register_kind(FindingKind("overfitting", "overfitting", fail_on="overfitting", line=_health_line))
register_kind(FindingKind("plateau", "plateau / not learning", fail_on="plateau", line=_health_line))
register_kind(FindingKind("lr_schedule", "learning-rate schedule", fail_on="lr-schedule", line=_health_line))
register_kind(
    FindingKind(
        "restart",
        "restart",
        fail_on="restart",
        line=lambda f: (
            f"restart: step {f['details']['last_step']} -> {f['details']['resumed_at']} ({f.get('severity')})"
        ),
    )
)
register_kind(FindingKind("throughput", "throughput slowdown", fail_on="throughput", line=_health_line))
register_kind(FindingKind("memory", "memory growth", fail_on="memory", line=_health_line))
register_kind(
    FindingKind("epoch_boundary", "spikes at each epoch's start", fail_on="epoch-boundary", line=_health_line)
)
register_kind(
    FindingKind("resume_data", "data replayed or skipped after a resume", fail_on="resume-data", line=_health_line)
)
register_kind(FindingKind("rank_drift", "a rank drifting from the others", fail_on="rank-drift", line=_health_line))
register_kind(
    FindingKind(
        "crash",
        "crash",
        fail_on="crash",
        line=lambda f: f"crash ({f['details']['what']}) after step {f.get('step')}: {f['details']['line']}",
    )
)


# --- what each built-in kind means: docs/reference/findings.md is generated from these ---------------------------
document_kind(
    "spike",
    "A loss or grad-norm value at least `z` robust SDs (default 6) and `ratio` times (default 1.5) above a "
    "causal baseline of earlier accepted values (with tags: against its own length bucket's baseline, or 1.75x with "
    "a score of 4.5); consecutive flagged steps are one event, which must come back down.",
    "`judged_by` (`causal` or `two_sided` for a short series), `confidence`, `joint` (the grad norm moved with it), "
    "`n_steps`, `recovery_step`, `ratio`, `tail` (how the threshold was set), `batch_size` on a small batch; the "
    "finding also carries `bucket`, `cluster`, `suspect_samples` and `recurrence`.",
    "Heavy-tailed noise (a Student-t-like loss) can pass the threshold on clean steps; an epoch's last, partial batch "
    "spikes for its size and is judged against batches of its size.",
)
document_kind(
    "nonfinite",
    "A NaN or inf logged for a metric at a step (one finding per step); never enters a baseline.",
    "`value_text` (`nan`, `inf`) beside `value` = null.",
    "NaN in a timing or throughput field before timing starts is info, not critical.",
)
document_kind(
    "level_shift",
    "A spike that does not come back (or lasts `max_duration` steps): the series settled at a new "
    "level and the baseline re-anchors.",
    "`new_level`.",
    "A planned change (a learning-rate drop, a new data mix) moves the level on purpose.",
)
document_kind(
    "expected_for_bucket",
    "Steps above the run's trend by more than the spike thresholds but within their own "
    "length bucket's baseline: one summary per bucket, not spikes.",
    "`n_steps`, `example_steps`, `group` (the tag judged by), `offset` (the bucket's offset from the trend).",
)
document_kind(
    "misaligned_steps",
    "The batch's length bucket explains the loss variance far better with the metrics shifted a "
    "step or more against the plan: metrics and plan look joined off by one.",
    "`shares` (variance share per offset tried), `step_offset` (the one to set), `confidence`.",
    "A run whose loss does not depend on length explains little at any offset and is not flagged.",
)
document_kind(
    "recurrence",
    "A spike's batch (at least 80% Jaccard of its samples) comes back at other steps; the loss there "
    "is told against its bucket's baseline.",
    "each entry: `epoch`, `step`, `value`, `baseline`, `ratio`, `overlap`, `jaccard`, `is_spike`.",
)
document_kind(
    "harmful_samples",
    "Samples whose presence raised the loss each time they were consumed, estimated from every "
    "step's residual shared by token share and listed at a false-discovery limit (`q <= 0.05`).",
    "`steps`, `count`, `support`, `confidence`; `suspect_samples` lists them most harmful first.",
    "Samples that always sat in the same steps (a static plan) cannot be told apart: each gets its block's effect.",
)
document_kind(
    "grad_norm_spikes",
    "Grad-norm spikes that the loss did not follow, gathered into one run-level finding.",
    "`count`, `steps`, counts by epoch and bucket, the share of steps above `max_grad_norm`, a suggested clipping "
    "threshold (`suggested_clipped_share`), `small_batches`.",
    "Small batches have larger gradient norms; the finding says so when they account for them.",
)
document_kind(
    "plan",
    "Always present with a plan: the batch-composition gate of `forensics check-plan` run on the audit's plan.",
    "`static`, `pair_retention` per epoch pair, `identical_batches`, `threshold`, `failure_kinds`.",
)
document_kind(
    "static_plan",
    "The plan's batch composition does not vary across epochs (pair retention or identical batches "
    "over the gate's limit): batches built once and only reordered, re-seeded identically, or sorted after a shuffle.",
    "`pair_retention` (the per-pair values over the limit).",
    "A dataset too small to rebuild batches (a few large sorted mega-batches) may keep many pairs by chance.",
)
document_kind(
    "oscillation",
    "The detrended loss swings periodically: a periodogram line significant against its local "
    "background (family-wise p < 0.01), holding at least 5% of the variance, over 4 cycles or more.",
    "`detected`, `period`, `aligned_with`, `bucket_variance_share` (the share the length bucket explains).",
    "Random-order bucket jumpiness is not an oscillation: it is reported as `bucket_variance_share`.",
)
document_kind(
    "forgetting",
    "Per cluster, the loss added per unit of `log1p(steps since the cluster was last trained / tau)`, "
    "with a 95% interval; said in words against the loss's own noise.",
    "per cluster: the effect, its interval, `tau`; whether it matters against the step-to-step noise.",
    "On a plan whose composition already varies, a small value is expected and stays info.",
)
document_kind(
    "divergence",
    "The loss's rolling median stays more than 20% and 6 noise SDs above its best level for 5% of the "
    "run (at least 50 steps); a rise that comes back sooner is a spike.",
    "`onset_step`, `resume_step`, `resume_checkpoint`, `lr`, `grad_norm`.",
    "A log that ends soon after the rise is not judged yet.",
)
document_kind(
    "overfitting",
    "After the eval loss's minimum at least 3 evals follow whose median is 2% and 4 eval-noise SDs "
    "above it, while the training loss keeps falling.",
    "`onset_step`, `best_step`, `best_checkpoint`, `metric`.",
)
document_kind(
    "plateau",
    "`not_learning`: no rolling median ever 5% below the start; `plateau`: the last quarter fell less than "
    "10% of what the quarter before it fell.",
    "`problem`, `start_step`, `end_step`, `level`, `lr`, `lr_state`.",
    "A run at its data's floor looks the same: a late plateau at a fine rate is info.",
)
document_kind(
    "lr_schedule",
    "`no_warmup`: the first rate is at least half its peak and the first steps climb back; `reset`: a "
    "steady rate falls below 10% in one step and climbs again; `jump`: a steady rate rises over 1.5x in one step.",
    "`problem`, `step`, `lr` or `before` / `after`.",
    "A warm-restart schedule resets on purpose (info).",
)
document_kind(
    "restart",
    "A source's steps go back (a resumed run logging into the same file or W&B run); the later values are kept.",
    "`last_step`, `resumed_at`, `source`, `rows_replaced`, `max_diff`, `noise`.",
    "A deterministic resume rewrites the same values: info; warning only when they differ beyond the noise.",
)
document_kind(
    "throughput",
    "The speed metric (tokens/s, samples/s, it/s, or a step time) settles at a level 1.5x slower or "
    "more for at least 5% of the values.",
    "`metric`, `factor`, `before`, `after`, `step`.",
    "A checkpoint save's single slow step moves nothing; a planned change of batch size does.",
)
document_kind(
    "memory",
    "Allocated memory, after its first 10%, is flat and then climbs on a line (R^2 >= 0.8) by 10% or more of "
    "its start; the finding's step is where the climb began (the fitted change point).",
    "`metric`, `slope_per_step`, `projected_step`.",
    "A cache that fills once and then stays flat can look linear.",
)
document_kind(
    "resume_data",
    "After a restart, the plan's epoch holding the resume step consumed samples a second time, or never "
    "consumed some (beyond the run's usual misses per epoch), for at least 1% of its samples: the data loader's state "
    "was not restored (the epoch replayed from its start). Critical when a quarter of the epoch moved.",
    "`restart_step`, `resumed_at`, `epoch`, `repeated`, `skipped`, `repeated_steps` ([first, last]), `loss_moved`.",
    "A resume meant to restart its epoch (a changed data mix) is reported the same way.",
)
document_kind(
    "rank_drift",
    "Over the last half of the run, one rank's step time or loss is at least 1.2x the other ranks' "
    "median (metrics logged per rank: `rank0/loss`, `loss/rank_1`, a `rank` column).",
    "`rank`, `metric`, `factor`.",
    "A rank with more work by design (the pipeline's last stage, the rank that logs or evaluates) runs slower.",
)
document_kind(
    "epoch_boundary",
    "The loss jumps (4x its noise above the 20 steps before) within 5 logged steps of the start of "
    "at least 2 epochs and half of those judged, more often than the run's own jump rate makes likely (p < 0.01); "
    "epoch starts from the plan's tags, else a logged `epoch` metric.",
    "`epochs`, `steps`, `offset` (steps after each epoch's start), the jump sizes.",
    "A schedule that changes at every epoch (a warm restart) moves the loss at the same places on purpose.",
)
document_kind(
    "crash",
    "The last lines of the text sources, run.toml `logs` or `slurm-*.out` / `*.err` hold a CUDA OOM, an NCCL "
    "timeout, an ECC error, a NaN/inf assertion, SIGKILL or the OOM killer, or a Python traceback.",
    "`line`, `what` (`oom`, `nccl`, `ecc`, `nonfinite`, `killed`, `traceback`), `path`, `line_no`.",
    "A traceback caught and logged by a run that went on is still reported.",
)
