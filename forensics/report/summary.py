"""The terminal summary of an audit: the run in one line, the verdict in one sentence, the findings with their
evidence, and the next steps. Rich markup on a terminal, plain text when piped (rich decides from the console).

Dataset text never reaches the terminal through markup: every value is passed through :func:`rich.markup.escape`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from forensics.detect.kinds import kind_of, run_level_kinds
from forensics.report.cards import card_function
from forensics.report.text import fmt_num, step_span, steps_list
from forensics.schema.keys import key_line
from forensics.schema.words import counted, plural

if TYPE_CHECKING:
    from rich.console import Console

MAX_SPIKES_SHOWN = 10
MAX_EVIDENCE = 4
#: Causes the summary tells; the rest are folded into one line per kind (the report and dashboard do the same).
MAX_CAUSES = 5
MAX_WARNINGS = 4
#: A cause kind in the folded line's words: (one, many).
CAUSE_WORDS = {
    "grad_norm": (
        "set of grad-norm spikes the loss did not follow",
        "sets of grad-norm spikes the loss did not follow",
    ),
    "batch": ("batch cause", "batch causes"),
    "event": ("spike without a batch", "spikes without a batch"),
    "level_shift": ("level shift", "level shifts"),
    "nonfinite": ("NaN/inf cause", "NaN/inf causes"),
}


def run_line(findings: dict[str, Any]) -> str:
    """``52,000 steps (0-51999), 6 epochs; metrics: train/loss, grad_norm, ...; plan: yes``."""
    run = findings.get("run") or {}
    parts = [f"{run.get('steps', 0):,} steps ({run.get('first_step')}-{run.get('last_step')})"]
    if run.get("epochs"):
        parts.append(f"{run['epochs']} epochs")
    metrics = run.get("metrics") or []
    shown = ", ".join(metrics[:6]) + (f" (+{len(metrics) - 6} more)" if len(metrics) > 6 else "")
    parts.append(f"metrics: {shown}")
    parts.append("plan: " + ("yes" if run.get("has_plan") else "none"))
    return "; ".join(parts)


def render_summary(out: Console, findings: dict[str, Any], written: list[str] | None = None) -> None:
    """Print the audit's summary to ``out``: the verdict, then the most urgent causes (at most
    :data:`MAX_CAUSES`, the rest folded into one line per kind), then everything else in one line per kind."""
    out.print(f"[bold]run[/]  {escape(run_line(findings))}")
    if keys := key_line(findings.get("run") or {}):
        out.print(f"[bold]keys[/]  {escape(keys)}")
    out.print(f"[bold]verdict[/]  {escape(findings.get('verdict', ''))}")
    causes = [c for c in findings.get("causes") or [] if isinstance(c, dict)]
    if causes:
        out.print(f"\n[bold]causes[/] ({len(causes)}, most urgent first)")
        for c in causes[:MAX_CAUSES]:
            _cause(out, c, findings)
        for line in fold_causes(causes[MAX_CAUSES:]):
            out.print(f"  {escape(line)}")
    for g in (findings.get("replay") or {}).get("not_replayed") or []:
        steps = ", ".join(map(str, g.get("steps") or []))
        out.print(
            f"  [dim]not replayed: {escape(str(g.get('cause')))} (steps {escape(steps)}): "
            f"{escape(str(g.get('why')))}[/]"
        )
    others = _other_findings(findings)
    if others:
        out.print("\n[bold]other findings[/]")
        for kind, items in others.items():
            k = kind_of(kind)
            if len(items) == 1:
                out.print(f"  {escape(k.describe(items[0]))}")
            else:
                steps = ", ".join(str(f.get("step")) for f in items[:6]) + (" ..." if len(items) > 6 else "")
                out.print(f"  {escape(counted(len(items), k.title + ' finding'))} (steps {escape(steps)})")
    for kind in run_level_kinds():
        _section(out, kind, findings)
    warnings = findings.get("warnings") or []
    if warnings:
        out.print("\n[bold]data warnings[/] (kept, not fatal)")
        for w in warnings[:MAX_WARNINGS]:
            out.print(f"  - {escape(str(w))}")
        if len(warnings) > MAX_WARNINGS:
            out.print(f"  ... and {len(warnings) - MAX_WARNINGS} more in findings.json (warnings)")
    steps = _next_steps(findings)
    if steps:
        out.print("\n[bold]next steps[/]")
        for i, text in enumerate(steps, 1):
            out.print(f"  {i}. {escape(text)}")
    if written:
        out.print("\nwrote " + ", ".join(escape(w) for w in written))


def fold_causes(causes: list[dict[str, Any]]) -> list[str]:
    """The causes past the ones told, one line per kind: ``and 2 batch causes (warning): findings.json causes C6,
    C7``."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for c in causes:
        by_kind.setdefault(str(c.get("kind")), []).append(c)
    out = []
    for kind, items in by_kind.items():
        worst = max((str(c.get("severity")) for c in items), key=("info", "warning", "critical").index)
        ids = ", ".join(str(c.get("id")) for c in items[:8]) + (" ..." if len(items) > 8 else "")
        one, many = CAUSE_WORDS.get(kind, (f"{kind.replace('_', ' ')} cause", None))
        out.append(
            f"and {counted(len(items), one, many)} (at most {worst}): findings.json {plural('cause', len(items))} {ids}"
        )
    return out


def _cause(out: Console, c: dict[str, Any], findings: dict[str, Any]) -> None:
    colour = {"critical": "red", "warning": "yellow"}.get(str(c.get("severity")), "dim")
    steps = c.get("steps") or []
    offset = int((findings.get("run") or {}).get("logged_offset") or 0)
    where = f"steps {steps_list(c.get('events') or steps, offset)}" if steps else "the whole run"
    out.print(
        f"  [{colour}]{escape(str(c.get('id')))} {escape(str(c.get('kind')))}[/] ({escape(where)}; "
        f"{escape(str(c.get('severity')))}, confidence {float(c.get('confidence') or 0):.2f})"
    )
    out.print(f"    {escape(str(c.get('summary', '')))}")
    replay = c.get("replay") if isinstance(c.get("replay"), dict) else None
    if replay and replay.get("verdict"):
        verdict = str(replay["verdict"])
        said = {"data": "confirmed by replay", "normal": "cleared by replay"}.get(verdict, "replay")
        where = ""
        if replay.get("checkpoint_step") is not None:
            after = " (after the step)" if replay.get("checkpoint") == "after" else ""
            where = f"checkpoint {replay['checkpoint_step']}{after}"
        out.print(
            f"    {said}: {escape(verdict)}"
            + (f" at {escape(where)}" if where else "")
            + (f" ({escape(str((replay.get('evidence') or [''])[-1]))})" if replay.get("evidence") else "")
        )


def _other_findings(findings: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Findings no cause tells (lesser non-finite values, level shifts, ...), by kind."""
    out: dict[str, list[dict[str, Any]]] = {}
    for f in findings.get("findings") or []:
        kind = str(f.get("kind"))
        k = kind_of(kind)
        if f.get("cause") or k.told_by or k.object_section:
            continue
        out.setdefault(kind, []).append(f)
    return out


def _events(findings: dict[str, Any]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Spikes of several metrics at one peak step are one event: the loss leads, the others ride along."""
    loss = (findings.get("run") or {}).get("loss_key")
    by_peak: dict[int, list[dict[str, Any]]] = {}
    for s in findings.get("spikes") or []:
        by_peak.setdefault(int(s.get("peak_step", s["step"])), []).append(s)
    events = []
    for peak in sorted(by_peak):
        group = sorted(by_peak[peak], key=lambda s: (s.get("metric") != loss, str(s.get("metric"))))
        events.append((group[0], group[1:]))
    return events


def _offset(item: dict[str, Any]) -> int:
    """Logged step minus canonical step, from a finding's own ``logged_step``."""
    if isinstance(item.get("logged_step"), int) and isinstance(item.get("step"), int):
        return int(item["logged_step"]) - int(item["step"])
    return 0


def _ratio(s: dict[str, Any]) -> str:
    if isinstance(s.get("value"), (int, float)) and isinstance(s.get("baseline"), (int, float)) and s["baseline"] > 0:
        return f", {s['value'] / s['baseline']:.1f}x"
    return ""


def _spike(
    out: Console, s: dict[str, Any], also: list[dict[str, Any]] = (), evidence: int = MAX_EVIDENCE, indent: str = "  "
) -> None:
    span = step_span(s["step"], s.get("end_step"), _offset(s))
    ratio = _ratio(s)
    where = ""
    if s.get("bucket") is not None:
        where = f"; bucket {s['bucket']} {s.get('bucket_range', '')}"
        if s.get("cluster_name"):
            where += f" / '{s['cluster_name']}'"
    out.print(
        f"{indent}[red]{escape(span)}[/] {escape(str(s.get('metric')))} {fmt_num(s.get('value'))} vs baseline "
        f"{fmt_num(s.get('baseline'))}{ratio}, score {fmt_num(s.get('score'), 3)}{escape(where)}"
    )
    if also:
        riders = "; ".join(f"{a.get('metric')} {fmt_num(a.get('value'))}{_ratio(a)}" for a in also)
        out.print(f"{indent}  at the same step: {escape(riders)}")
    suspects = s.get("suspect_samples") or []
    if suspects:
        more = f" (+{len(suspects) - 8})" if len(suspects) > 8 else ""
        out.print(f"{indent}  suspect samples: {', '.join(map(str, suspects[:8]))}{more}")
    for e in (s.get("evidence") or [])[:evidence]:
        out.print(f"{indent}  - {escape(str(e))}")


def _section(out: Console, kind: Any, findings: dict[str, Any]) -> None:
    """A run-level section's lines, as its kind registered them (the plan's gate, oscillation, forgetting)."""
    if kind.summary is None or kind.section not in findings:
        return
    fn = card_function(kind.summary)
    heading, lines = fn(findings.get(kind.section))
    if lines:
        out.print(f"\n[bold]{escape(heading)}[/]  {escape(lines[0])}")
        for line in lines[1:]:
            out.print(f"  {escape(line)}")


def _next_steps(findings: dict[str, Any]) -> list[str]:
    steps: list[str] = [str(c["next_step"]) for c in findings.get("causes") or [] if c.get("next_step")]
    for kind in run_level_kinds():
        section = findings.get(kind.section)
        if isinstance(section, dict) and section.get("next_step"):
            steps.append(section["next_step"])
    return _fold_same_action(list(dict.fromkeys(steps)))[:3]


_ONE_STEP = re.compile(r"\bstep (\d+)(?: \(logged (\d+)\))?")


def _fold_same_action(steps: list[str]) -> list[str]:
    """Next steps that ask the same thing of different single steps become one (``... of steps 30001, 60001 and
    100001``), so that three causes with one remedy do not fill the three lines."""
    groups: dict[str, list[re.Match]] = {}
    for text in steps:
        found = list(_ONE_STEP.finditer(text))
        key = _ONE_STEP.sub("{step}", text) if len(found) == 1 else text
        groups.setdefault(key, []).extend(found[:1] if len(found) == 1 else [])
    out = []
    for key, found in groups.items():
        if len(found) < 2:
            out.append(key.replace("{step}", found[0].group(0)) if found else key)
            continue
        canonical = sorted(int(m.group(1)) for m in found)
        offset = int(found[0].group(2)) - int(found[0].group(1)) if found[0].group(2) else 0
        out.append(key.replace("{step}", "steps " + steps_list(canonical, offset=offset)))
    return out
