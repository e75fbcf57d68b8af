"""Skip lists: the steps and samples an audit blames, in the forms trainers read, so a run can train past bad data.

Built from findings.json alone (docs/commands/skip.md):

- **which causes**: those of a data kind (:data:`SKIPPABLE`: a batch, a set of harmful samples, an event without a
  plan, a non-finite step) at ``min_severity`` or above. When the audit carries replay verdicts
  (``cause["replay"]``), only causes whose verdict is ``data`` are taken, unless ``all_verdicts``: a replay that
  cleared a batch (``normal``) or blamed the optimizer state is not a reason to drop data. Every cause left out is
  kept with its reason, for the header the command prints.
- **steps** are canonical (0-based, docs/concepts.md "step"); :func:`megatron_steps` turns them into Megatron-LM's
  ``--iterations-to-skip`` numbering.
- **samples** of a cause: the replay's leave-one-out samples when the replay confirmed it, else its suspects (the
  attribution's ranking; a run-level harmful-samples cause's own list).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forensics.detect.causes.replayed import BATCH_KINDS
from forensics.detect.findings import CRITICAL, SEVERITIES
from forensics.errors import ForensicsError
from forensics.schema.steps import steps_list

#: Cause kinds whose steps hold the data behind them (the kinds a replay runs): the ones a skip list can address.
SKIPPABLE = BATCH_KINDS
#: ``--megatron-indexing``: ``logged`` = the iteration Megatron prints (the N-th update is iteration N; its training
#: loop tests ``iteration + 1 in args.iterations_to_skip`` from core_v0.17.0), ``zero`` = the count of updates done
#: before the step (``iteration in args.iterations_to_skip``, core_v0.12.0 to core_v0.16.x).
MEGATRON_INDEXING = ("logged", "zero")


@dataclass
class SkipList:
    """What to skip and why. ``steps`` canonical and sorted; ``why_steps``/``why_samples`` name the cause of each;
    ``taken`` the causes skipped (``{id, kind, severity, verdict, steps}``), ``left_out`` ``(cause id, reason)``."""

    steps: list[int] = field(default_factory=list)
    sample_ids: list[int] = field(default_factory=list)
    why_steps: dict[int, str] = field(default_factory=dict)
    why_samples: dict[int, str] = field(default_factory=dict)
    taken: list[dict[str, Any]] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)
    min_severity: str = CRITICAL
    logged_offset: int = 0
    source: str = ""

    def header(self) -> list[str]:
        """Lines saying what the list holds and from which causes (a comment where the format allows, else stderr)."""
        ids = ", ".join(
            f"{c['id']} ({c['kind']}, {c['severity']}{', replay: ' + c['verdict'] if c['verdict'] else ''})"
            for c in self.taken
        )
        lines = [
            f"skip list from {self.source}: {len(self.steps)} step(s), {len(self.sample_ids)} sample(s) "
            f"of {len(self.taken)} cause(s) at {self.min_severity} or above" + (f": {ids}" if ids else "")
        ]
        lines += [f"left out {cid}: {reason}" for cid, reason in self.left_out]
        return lines


def read_findings(path: str | Path) -> tuple[dict[str, Any], Path]:
    """findings.json of a case folder (or the file itself); one clear error when there is none or it is damaged."""
    p = Path(path)
    file = p / "findings.json" if p.is_dir() else p
    if not p.exists():
        raise ForensicsError(f"{p} does not exist (expected a case folder with findings.json, or a findings.json)")
    if not file.is_file():
        raise ForensicsError(f"{p} has no findings.json: run `forensics audit {p}` first")
    from forensics.schema.case import read_case_json

    return read_case_json(file, "findings file", "causes", "`forensics audit`"), file


def skip_list(
    findings: dict[str, Any], min_severity: str = CRITICAL, all_verdicts: bool = False, source: str = "findings.json"
) -> SkipList:
    """The causes to skip and their steps and samples (module docstring for the choice)."""
    if min_severity not in SEVERITIES:
        raise ForensicsError(f"--min-severity must be one of {', '.join(SEVERITIES)}, not {min_severity!r}")
    causes = [c for c in findings.get("causes") or [] if isinstance(c, dict)]
    replayed = any(isinstance(c.get("replay"), dict) and c["replay"].get("verdict") for c in causes)
    offset = int((findings.get("run") or {}).get("logged_offset") or 0)
    out = SkipList(min_severity=min_severity, logged_offset=offset, source=source)
    floor = SEVERITIES.index(min_severity)
    for c in causes:
        cid, kind, severity = str(c.get("id", "?")), str(c.get("kind")), str(c.get("severity", "info"))
        verdict = (c.get("replay") or {}).get("verdict") if isinstance(c.get("replay"), dict) else None
        reason = _left_out_reason(kind, severity, floor, verdict, replayed, all_verdicts)
        if reason:
            out.left_out.append((cid, reason))
            continue
        steps = sorted({int(s) for s in c.get("steps") or []})
        samples = _cause_samples(c)
        if not steps and not samples:
            out.left_out.append((cid, "names no step or sample"))
            continue
        why = f"{cid} {kind} ({severity}{', replay: ' + verdict if verdict else ''}): steps {steps_list(steps, offset)}"
        for s in steps:
            out.why_steps.setdefault(s, why)
        for i in samples:
            out.why_samples.setdefault(i, why)
        out.taken.append({"id": cid, "kind": kind, "severity": severity, "verdict": verdict, "steps": steps})
    out.steps = sorted(out.why_steps)
    out.sample_ids = sorted(out.why_samples)
    return out


def _left_out_reason(
    kind: str, severity: str, floor: int, verdict: str | None, replayed: bool, all_verdicts: bool
) -> str | None:
    if kind not in SKIPPABLE:
        return f"a {kind} cause, not a data event: skipping steps does not address it"
    if severity not in SEVERITIES or SEVERITIES.index(severity) < floor:
        return f"{severity}, below --min-severity"
    if replayed and not all_verdicts and verdict != "data":
        return (
            f"replay verdict {verdict}, not data (--all-verdicts takes it)"
            if verdict
            else "not replayed while other causes were (--all-verdicts takes it)"
        )
    return None


def _cause_samples(cause: dict[str, Any]) -> list[int]:
    """The samples a cause blames: the replay's leave-one-out samples when it confirmed them, else its suspects."""
    replay = cause.get("replay") if isinstance(cause.get("replay"), dict) else {}
    ids = replay.get("samples") if replay.get("verdict") == "data" and replay.get("samples") else None
    ids = ids or cause.get("suspect_samples") or (cause.get("details") or {}).get("harmful_samples") or []
    return [int(i) for i in ids if isinstance(i, (int, float)) or str(i).lstrip("-").isdigit()]


def megatron_steps(skip: SkipList, indexing: str = "logged") -> list[int]:
    """The steps in Megatron-LM's ``--iterations-to-skip`` numbering (:data:`MEGATRON_INDEXING`).

    Canonical step ``s`` is the ``s + 1``-th update: Megatron prints it as iteration ``s + 1`` (``logged``) after
    ``s`` updates were done (``zero``), whatever numbering the run's own logs used."""
    if indexing not in MEGATRON_INDEXING:
        raise ForensicsError(f"--megatron-indexing must be one of {', '.join(MEGATRON_INDEXING)}, not {indexing!r}")
    return [s + 1 if indexing == "logged" else s for s in skip.steps]


def ids_document(skip: SkipList) -> dict[str, Any]:
    """``{"sample_ids": [...], "why": {id: cause}}``, with ``about`` saying what it holds (JSON has
    no comments); :func:`forensics.integrations.exclude.exclude_samples` reads it."""
    return {
        "sample_ids": skip.sample_ids,
        "why": {str(i): skip.why_samples[i] for i in skip.sample_ids},
        "about": skip.header(),
    }


def step_lines(skip: SkipList, steps_as: str = "canonical") -> list[str]:
    """One step per line, canonical or as the run logs them, after ``#`` comment lines saying what they are."""
    shown = [s + (skip.logged_offset if steps_as == "logged" else 0) for s in skip.steps]
    numbering = "as the run logs them" if steps_as == "logged" else "canonical (0-based optimizer steps)"
    return [f"# {line}" for line in skip.header()] + [f"# steps {numbering}"] + [str(s) for s in shown]
