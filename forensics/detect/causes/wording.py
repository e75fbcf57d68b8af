"""The causes in words: one sentence each, and the next step, naming only commands that can run on the case.

Steps are canonical, with the run's own numbering beside them where it differs (:mod:`forensics.schema.steps`);
a printed command names the case folder as the user gave it, and asks for a replay only when the case has what a
replay needs (else the step says what is missing).
"""

from __future__ import annotations

import shlex

from forensics.detect.base import RunTables
from forensics.detect.findings import Finding
from forensics.detect.rules.composition import plan_fix_words, plan_words
from forensics.schema.steps import step_span, steps_list
from forensics.schema.words import counted, ids_text

#: Suspect samples named in a sentence.
NAMED = 6


def _ids(ids: list[int], limit: int = NAMED) -> str:
    return ids_text(ids, limit)


def command_exists(name: str) -> bool:
    """Whether ``forensics NAME`` is a command of this install (a next step names only commands that can run)."""
    import importlib.util

    return importlib.util.find_spec(f"forensics.cli.{name.replace('-', '_')}") is not None


def replay_command(run: RunTables, steps: list[int]) -> str | None:
    """``forensics replay CASE --steps S`` as it can be run on this case, or None when it cannot; with
    ``--steps-as canonical`` when the run numbers its steps otherwise (the step words show both numbers)."""
    if not run.replay_ready or not run.case_path or not steps:
        return None
    which = " --steps-as canonical" if run.logged_offset else ""
    return f"forensics replay {shlex.quote(run.case_path)} --steps {','.join(map(str, steps[:4]))}{which}"


def skip_command(case: str | None) -> str | None:
    """``forensics skip CASE --format ids ...`` when this install has the command (else None: say it in words)."""
    if not case or not command_exists("skip"):
        return None
    return f"forensics skip {case} --format ids --min-severity warning -o skip.json"


def plan_link(gate: dict | None) -> str | None:
    """The plan finding that explains why the samples come back, in words."""
    words = plan_words(gate)
    return f"the plan is {words}" if words else None


def event_summary(
    kind: str,
    lead: Finding,
    members: list[Finding],
    firsts: list[int],
    suspects: list[int],
    counts: dict[int, int],
    run: RunTables,
    gate: dict | None,
    static: bool,
) -> str:
    offset = run.logged_offset
    ratio = lead.details.get("ratio")
    size = f" ({ratio:.1f}x its baseline)" if isinstance(ratio, float) and ratio == ratio else ""
    ratios = [
        r for f in members if f.metric == lead.metric and isinstance(r := f.details.get("ratio"), float) and r == r
    ]
    if size and len(firsts) > 1 and len(ratios) > 1:  # the steps differ: say the range, not the lead's size for all
        size = f" ({min(ratios):.1f}x-{max(ratios):.1f}x its baseline)" if min(ratios) < max(ratios) else size
    riders = list(dict.fromkeys(str(f.metric) for f in members if f.metric != lead.metric))
    also = f", with {', '.join(riders)} at the same steps" if riders else ""
    where = ""
    if lead.tags.get("bucket") is not None:
        where = f" in bucket {lead.tags['bucket']} {lead.tags.get('bucket_range', '')}".rstrip()
        if lead.tags.get("cluster_name"):
            where += f" ('{lead.tags['cluster_name']}')"
    batch = lead.details.get("batch_size") or {}
    small = f"; {batch['words']}" if batch.get("words") else ""
    at = f"steps {steps_list(firsts, offset)}" if len(firsts) > 1 else step_span(firsts[0], offset=offset)
    if kind == "event":
        text = f"{lead.metric} spiked at {at}{size}{also}{small}; without a plan no batch can be named."
    elif len(firsts) > 1:
        core = [i for i in suspects if counts.get(i, 0) >= 2] or suspects
        times = max(counts.get(i, 0) for i in core) if core else len(firsts)
        text = (
            f"{lead.metric} spiked at steps {steps_list(firsts, offset)}{size}{also}: samples {_ids(core)} were "
            f"in {times} of these batches{where}"
        )
        link = plan_link(gate) if static else None
        text += f"; they come back because {link}." if link else "."
    else:
        text = (
            f"{lead.metric} spiked at {step_span(firsts[0], offset=offset)}{size}{also}{small}; its batch held "
            f"samples {_ids(suspects)}{where}."
        )
    numerics = next(
        (n for f in members for n in [(f.details.get("attribution") or {}).get("numerics") or {}] if n.get("numerics")),
        None,
    )
    lead_words = [e for e in lead.evidence if " steps before the loss" in e]
    if numerics:  # the logs saw an overflow at or before it: numerics before the optimizer (the cause-class order)
        text = text.rstrip(".") + f"; {numerics['evidence'][0].split(':')[0]} (a numerics event)."
    elif lead.details.get("joint") == "led" or lead_words:
        text = (
            text.rstrip(".")
            + (f"; {lead_words[0].split(':')[0]}" if lead_words else "; the grad norm rose before it")
            + " (an optimizer-led event)."
        )
    return text + ranks_words(lead)


def ranks_words(lead: Finding) -> str:
    """ " On rank 1 only; rank 1's micro-batch 0 held samples 362, 363." for a spike on some ranks only (the rank
    rule's ``ranks``), naming the micro-batch when the plan has ``rank``; empty otherwise."""
    ranks = lead.tags.get("ranks")
    if not ranks:
        return ""
    text = f" On rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} only"
    batches = lead.details.get("rank_batches") or []
    if batches:
        b = batches[0]
        text += f"; rank {b['rank']}'s micro-batch {b['micro']} held samples {_ids(b['sample_ids'])}"
    return text + "."


def event_next_step(
    kind: str, firsts: list[int], suspects: list[int], run: RunTables, gate: dict | None, static: bool
) -> str:
    if kind == "event":
        return (
            f"Record or rebuild the batch plan (--plan, --samples) to name the batch and samples of "
            f"{step_span(firsts[0], offset=run.logged_offset)}."
        )
    parts = [f"Inspect samples {_ids(suspects)}"]
    command = replay_command(run, firsts)
    if command:
        parts.append(f"replay the step against same-bucket controls (`{command}`)")
    elif run.replay_missing:
        parts.append(f"a replay would confirm it but needs {run.replay_missing}")
    if static:
        parts.append(plan_fix_words(gate))
    return "; ".join(parts) + "."


def nonfinite_summary(metric: str, steps: list[int], offset: int) -> str:
    n = len(steps)
    return f"{metric} is NaN/inf at {counted(n, 'step')} ({steps_list(steps, offset)}): the numbers broke."


def nonfinite_next_step(steps: list[int], run: RunTables) -> str:
    text = (
        f"Check the batch of {step_span(steps[0], offset=run.logged_offset)} and the optimizer state before it "
        "(overflow, a too-high learning rate, a bad sample)"
    )
    command = replay_command(run, steps[:1])
    return text + (f"; replay it (`{command}`)." if command else ".")


def finding_summary(kind: str, f: Finding, run: RunTables, gate: dict | None) -> str:
    if kind == "level_shift":
        return f"{f.metric} moved to a new level from {step_span(f.step, offset=run.logged_offset)} and stayed there."
    if kind == "plan":
        return (
            f"The batch plan is {plan_words(gate)}: "
            + (f.evidence[0] if f.evidence else "the same samples meet in every epoch")
            + "."
        )
    return str((f.evidence or [f.kind.replace("_", " ")])[0])


def finding_next_step(kind: str, f: Finding, gate: dict | None, run: RunTables) -> str | None:
    if kind == "plan":
        fix = plan_fix_words(gate)
        return fix[:1].upper() + fix[1:] + "."
    if kind == "samples":
        ids = list(f.suspect_samples)
        parts = [f"Inspect samples {_ids(ids)}"]
        steps = sorted({int(s) for s in f.details.get("steps") or []})
        command = replay_command(run, steps)
        if command:
            parts.append(f"replay the steps that consumed them (`{command}`)")
        elif run.replay_missing:
            parts.append(f"a replay would confirm it but needs {run.replay_missing}")
        command = skip_command(shlex.quote(run.case_path) if run.case_path else None)
        if command:
            parts.append(
                f"to train without them, `{command}` writes their ids for forensics.integrations.exclude_samples"
            )
        else:
            parts.append("to train without them, drop the sample ids that findings.json harmful_samples lists")
        return "; ".join(parts) + "."
    return f.next_step
