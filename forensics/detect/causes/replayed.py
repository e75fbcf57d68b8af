"""Replay verdicts as evidence of the causes: one function that turns findings.json and replay.json into the
findings a person reads after a replay, used by the audit (a replay.json in the case) and by ``forensics replay``
(merging into the findings.json it finds), so the two give the same findings.

For each cause with a batch (:data:`forensics.replay.select.BATCH_KINDS`, told here without importing the torch
stage) whose events were replayed:

- **its verdict**: ``data`` when any replayed event is ``data``; ``normal`` when every replayed event is; else the
  first of :data:`PRIORITY` among them (a misaligned join or a nondeterministic forward first: they void the rest);
- **evidence**: ``support["replay"]`` of every finding the cause tells (its spikes, its harmful-samples finding), so
  that the one severity function (:mod:`forensics.detect.causes.severity`) lowers a ``normal`` cause and its events
  to ``info`` and counts ``data`` as a second line (``critical``); the cause's severity is again the most severe of
  its findings, and they take it;
- ``cause["replay"] = {verdict, checkpoint_step, checkpoint, confidence, mode, step, steps, evidence}``, and a next
  step that says what the verdict means instead of asking for the replay just done.

Then the causes are ranked again (severity, then confidence) and numbered, every ``cause`` reference follows, and the
verdict sentence is said again. Applying it twice gives what applying it once gives.
"""

from __future__ import annotations

import shlex
from typing import Any

from forensics.detect.causes.severity import most_severe, severity_of
from forensics.detect.findings import urgency
from forensics.schema.steps import step_span, steps_list
from forensics.schema.words import plural

#: Cause kinds whose events are batches a replay runs (the replay stage's own list, said again without torch).
BATCH_KINDS = ("batch", "samples", "event", "nonfinite")
#: Which verdict a cause takes when its replayed events disagree (``data`` and all-``normal`` are decided first).
PRIORITY = ("misaligned", "nondeterministic", "not-reproduced", "state", "composition", "inconclusive", "normal")
#: Evidence sentences of the chosen step kept on the cause.
EVIDENCE = 3


def replay_verdicts(replay: dict[str, Any] | None) -> dict[int, dict[str, Any]]:
    """``{step: entry}`` of replay.json's suspect steps (a clean control step is no cause's evidence)."""
    out = {}
    for d in (replay or {}).get("steps") or []:
        if isinstance(d, dict) and isinstance(d.get("step"), int) and d.get("role", "suspect") != "control":
            out[int(d["step"])] = d
    return out


def cause_verdict(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """One cause's replay verdict from its replayed events' entries (module docstring)."""
    names = [str(e.get("verdict")) for e in entries]
    if "data" in names:
        pick = max((e for e in entries if e.get("verdict") == "data"), key=lambda e: float(e.get("confidence") or 0))
    elif all(n == "normal" for n in names):
        pick = min(entries, key=lambda e: float(e.get("confidence") or 0))
    else:
        rank = {v: i for i, v in enumerate(PRIORITY)}
        pick = min(
            (e for e in entries if e.get("verdict") != "normal"),
            key=lambda e: rank.get(str(e.get("verdict")), len(PRIORITY)),
        )
    top = (pick.get("leave_out") or {}).get("sample_ids") or [
        x.get("sample_id") for x in (pick.get("samples") or [])[:3]
    ]
    return {
        "verdict": str(pick["verdict"]),
        "step": int(pick["step"]),
        "checkpoint_step": pick.get("checkpoint_step"),
        "samples": [int(i) for i in top if i is not None],
        "checkpoint": pick.get("checkpoint", "before"),
        "confidence": pick.get("confidence"),
        "mode": pick.get("mode"),
        "steps": {str(e["step"]): str(e["verdict"]) for e in entries},
        "evidence": [str(x) for x in (pick.get("evidence") or [])][-EVIDENCE:],
    }


def apply_replay(
    findings: dict[str, Any], replay: dict[str, Any] | None, not_replayed: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """``findings`` (findings.json, changed in place and returned) with the replay's verdicts as evidence."""
    verdicts = replay_verdicts(replay)
    causes = [c for c in findings.get("causes") or [] if isinstance(c, dict)]
    if not causes or not (verdicts or not_replayed):
        return findings
    run = findings.get("run") or {}
    offset = int(run.get("logged_offset") or 0)
    case = run.get("case")
    members = members_of(findings)
    for c in causes:
        if c.get("kind") not in BATCH_KINDS:
            continue
        steps = [int(s) for s in (c.get("events") or [])] + [int(s) for s in (c.get("steps") or [])]
        entries = [verdicts[s] for s in dict.fromkeys(steps) if s in verdicts]
        if not entries:
            continue
        rv = cause_verdict(entries)
        c["replay"] = rv
        mine = members.get(str(c.get("id")), [])
        for f in mine:
            f.setdefault("details", {}).setdefault("support", {})["replay"] = rv["verdict"]
            f["severity"] = severity_of(str(f.get("kind")), f["details"]["support"], str(f.get("severity")))
        if mine:
            c["severity"] = most_severe(str(f["severity"]) for f in mine)
            for f in mine:
                f["severity"] = c["severity"]
        elif rv["verdict"] == "normal":
            c["severity"] = "info"
        c["next_step"] = replayed_next_step(c, rv, case, offset, findings.get("plan"))
    _rank(findings, causes, not_replayed)
    findings.pop("verdict", None)
    from forensics.detect.causes.verdict import facts, verdict

    text = verdict(findings, run.get("loss_key"))
    main = findings["causes"][0] if findings.get("causes") else None
    if main and (main.get("replay") or {}).get("verdict") == "data":
        text = text.rstrip(".") + f"; confirmed by replay: {_data_words(main['replay'], offset)}."
    findings["verdict"] = text
    findings["verdict_facts"] = facts(findings)
    return findings


def members_of(findings: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The finding dicts each cause tells, by cause id, from every list of findings (``findings``, ``spikes``, ...:
    the same finding may be written in several)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for key, value in findings.items():
        if key == "causes" or not isinstance(value, list):
            continue
        for d in value:
            if isinstance(d, dict) and d.get("cause") and "kind" in d:
                out.setdefault(str(d["cause"]), []).append(d)
    return out


def _rank(findings: dict[str, Any], causes: list[dict[str, Any]], not_replayed: list[dict[str, Any]] | None) -> None:
    """Rank and renumber the causes (:func:`renumber`), then findings.json's ``replay`` section."""
    order = renumber(findings, causes)
    section = findings.setdefault("replay", {})
    section["causes"] = {c["id"]: c["replay"]["verdict"] for c in order if isinstance(c.get("replay"), dict)}
    if not_replayed is not None:
        keys = {str(c.get("key")): c["id"] for c in order}
        section["not_replayed"] = [
            {
                "cause": keys.get(str(g.get("key")), g.get("cause")),
                "steps": g.get("steps"),
                "why": g.get("why", "the replay budget was spent"),
            }
            for g in not_replayed
        ]


def renumber(findings: dict[str, Any], causes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rank the causes as the cause rule does and renumber them; every ``cause`` reference follows."""
    order = sorted(causes, key=lambda c: urgency(str(c.get("severity")), c.get("confidence"), c.get("steps")))
    new_id = {str(c.get("id")): f"C{i}" for i, c in enumerate(order, 1)}
    for c in order:
        c["id"] = new_id[str(c["id"])]
    findings["causes"] = order
    seen: set[int] = set()  # a finding may be the same dict in several lists: renumber it once
    for key, value in findings.items():
        if key == "causes" or not isinstance(value, list):
            continue
        for d in value:
            if isinstance(d, dict) and id(d) not in seen and d.get("cause") in new_id:
                seen.add(id(d))
                d["cause"] = new_id[d["cause"]]
    return order


def _data_words(rv: dict[str, Any], offset: int) -> str:
    ck = rv.get("checkpoint_step")
    where = f"checkpoint {ck}" + (" (after the step)" if rv.get("checkpoint") == "after" else "")
    return f"the batch of {step_span(rv['step'], offset=offset)} is high against its own bucket at {where}"


def replayed_next_step(
    cause: dict[str, Any], rv: dict[str, Any], case: str | None, offset: int, gate: dict | None = None
) -> str:
    """What the replay verdict of a cause means for the user, as the cause's next step."""
    from forensics.detect.causes.wording import skip_command

    v, s = rv["verdict"], int(rv["step"])
    at = step_span(s, offset=offset)
    ids = [int(i) for i in cause.get("suspect_samples") or []]
    shown = ", ".join(map(str, ids[:6])) + (f" +{len(ids) - 6}" if len(ids) > 6 else "")
    path = shlex.quote(case) if case else None
    if v == "data":
        top = [int(i) for i in rv.get("samples") or []] or ids
        named = ", ".join(map(str, top[:6])) + (f" +{len(top) - 6}" if len(top) > 6 else "")
        text = f"Replay confirms the data ({_data_words(rv, offset)}): drop or fix samples {named}"
        command = skip_command(path)
        text += f" (`{command}` writes their ids)" if command else " (findings.json lists them)"
        if gate and gate.get("static") and (cause.get("details") or {}).get("recurs"):
            from forensics.detect.rules.composition import plan_fix_words

            text += f"; {plan_fix_words(gate)}, so they stop meeting in one batch"
        return text + "."
    if v == "normal":
        replayed = sorted(int(x) for x in rv.get("steps") or {})
        weak = (
            " (at a checkpoint after the step: the model may have learned the batch since)"
            if rv.get("checkpoint") == "after"
            else ""
        )
        return (
            f"Replay clears {plural('step', len(replayed))} {steps_list(replayed, offset)}: the batch's loss lies "
            f"within its same-bucket controls' spread{weak}; nothing in these samples to fix."
        )
    if v == "misaligned":
        fix = next((e for e in rv.get("evidence") or [] if "step_offset" in e), "")
        hint = fix[fix.index("set step_offset") :].rstrip(".") if "set step_offset" in fix else "fix the step offset"
        again = f"forensics audit {path}" if path else "the audit"
        return f"Replay says metrics and plan are joined one step off at {at}: {hint} in run.toml, then run {again}."
    if v == "nondeterministic":
        return (
            f"Replay of {at} is not deterministic (the same forward disagrees with itself): make the model's "
            "forward deterministic (no unseeded randomness, deterministic kernels), then replay again."
        )
    if v == "not-reproduced":
        why = next((e for e in rv.get("evidence") or [] if e.startswith("The other batches")), "")
        return (
            f"Replay of {at} does not give back the logged loss in eval or train mode: check that the tokens, "
            f"checkpoints and model are the run's{(' (' + why.rstrip('.') + ')') if why else ''}."
        )
    if v == "state":
        return (
            f"Replay says the model state, not the data, at {at}: its controls are high alike at that checkpoint; "
            "look at the learning rate, the optimizer state (Adam moments, loss scale) and the updates before it."
        )
    if v == "composition":
        from forensics.detect.rules.composition import plan_fix_words

        return (
            f"Replay says the batch's composition at {at} pulls the model away from the other clusters: "
            f"{plan_fix_words(gate)}."
        )
    return (
        f"Replay of {at} was inconclusive (neither high against its bucket nor within its controls' spread): "
        f"inspect samples {shown}."
    )
