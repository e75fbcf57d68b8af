"""Causes: findings that one explanation covers, told as one story (docs/concepts.md, ``cause``).

- **Events**: spikes of several metrics whose spans overlap are one event (the loss and the grad norm at step 254),
  and a grad-norm spike the loss answered within the joint window joins the loss's event.
- **Grouped by samples**: events whose batches share their *core* samples are one cause, "these samples spiked the
  loss at steps a, b and c", whatever else was in the batch: a batch coming back in a later epoch, a poisoned
  micro-batch re-paired with another partner under grad accumulation, the same samples in other batches. An event's
  core is its samples that spiked most often (in the most events, at least two); two events join when their cores
  meet, so a clean partner that once shared a step with the poisoned samples does not pull its other spikes in.
  The attribution's recurrence (the same batch spiking again) joins events too.
- **Severity is evidence** (:mod:`forensics.detect.causes.severity`): events in a cause of several events carry the
  ``recurs`` line; every finding's severity is assigned from its evidence in one place; a cause's severity is the
  most severe of its events, and its events take it, so the cards and the cause never disagree.
- **Run-level causes**: critical NaN/inf values (one ``nonfinite`` cause per metric), each level shift, and one cause
  per run-level finding of the kinds in :data:`CAUSE_KINDS` (the grad-norm spikes the loss did not follow, a
  periodic swing, the run-health kinds); a static plan is a ``plan`` cause only when no batch cause recurs because
  of it (then the batch cause names it).

Each cause is ``{id, key, kind, steps, logged_steps, metrics, suspect_samples, severity, confidence, summary,
next_step, events, details}``; ``key`` (:func:`cause_key`) is stable across audits and the live loop; every finding
it covers carries its ``cause`` id; causes are ranked by severity, then confidence.
"""

from __future__ import annotations

import hashlib
from typing import Any

from forensics.detect.base import Rule, RunTables
from forensics.detect.causes import wording
from forensics.detect.causes.severity import assign_severities, most_severe, support_of
from forensics.detect.findings import CRITICAL, Finding, urgency
from forensics.detect.params import fraction
from forensics.detect.rules.grad_norm import NOT_FOLLOWED, unfollowed
from forensics.detect.spikes.kernel_state import JOINT_LEAD
from forensics.schema.words import counted
from forensics.stats import DisjointSets

#: Run-level finding kinds that are causes of their own, and the cause kind each becomes.
CAUSE_KINDS = {
    "grad_norm_spikes": "grad_norm",
    "oscillation": "oscillation",
    "static_plan": "plan",
    "harmful_samples": "samples",
    "divergence": "divergence",
    "overfitting": "overfitting",
    "plateau": "plateau",
    "lr_schedule": "lr_schedule",
    "restart": "restart",
    "throughput": "throughput",
    "memory": "memory",
    "crash": "crash",
    "epoch_boundary": "epoch_boundary",
    "resume_data": "resume_data",
    "rank_drift": "rank_drift",
}
#: Suspect samples of an event read for its core (the attribution keeps at most this many).
SUSPECTS_READ = 20


def _span(f: Finding) -> tuple[int, int]:
    return int(f.step), int(f.end_step if f.end_step is not None else f.step)


def _same_cause(g: Finding, event: list[Finding]) -> bool:
    """Whether a grad-norm spike is the event's own: its span overlaps the event's, its batch shares
    samples with the event's, or no plan names either batch."""
    lo, hi = _span(g)
    if any(_span(f)[0] <= hi and lo <= _span(f)[1] for f in event):
        return True
    mine = set(g.suspect_samples)
    theirs = set().union(*(set(f.suspect_samples) for f in event))
    return not (mine and theirs) or bool(mine & theirs)


def _narrowed(f: Finding, keep: list[int], run: RunTables) -> Finding:
    """The harmful-samples finding for the samples no other cause tells (its steps theirs only)."""
    import copy

    rows = [r for r in run.sections.get("harmful_samples") or [] if r.get("sample_id") in set(keep)]
    out = copy.copy(f)
    out.suspect_samples = list(keep)
    steps = sorted({int(s) for r in rows for s in r.get("steps") or []})
    out.details = {**f.details, "steps": steps, "count": len(keep)}
    n = len(keep)
    out.evidence = [
        f"{counted(n, 'more sample')} ({', '.join(map(str, keep[:8]))}) raised the loss each "
        f"time {'they were' if n != 1 else 'it was'} consumed, beside the ones the returning batches "
        f"hold (steps {', '.join(map(str, steps[:8]))}{' ...' if len(steps) > 8 else ''})."
    ]
    out.evidence += [e for e in f.evidence[1:] if any(e.startswith(f"sample {i}:") for i in keep)]
    return out


def cause_key(kind: str, steps: list[int], samples: list[int]) -> str:
    """A cause's stable identity: its kind, its first step and its first event's suspect samples (sorted, so that
    re-ranking them keeps the key; the first event's, so that the cause keeps its key as later events join it).
    ``watch`` alerts once per key; a later audit or the live loop gives the same cause the same key."""
    ids = sorted({int(s) for s in samples})
    digest = hashlib.sha1(",".join(map(str, ids)).encode()).hexdigest()[:10] if ids else "-"
    return f"{kind}:{steps[0] if steps else '-'}:{digest}"


class CauseRule(Rule):
    """Groups the findings into causes (the ``causes`` section) and tags each finding with its ``cause``.

    Parameter: ``same_samples`` 0.5 (two events whose suspect samples overlap this much (Jaccard) are one batch
    coming back even when no sample spiked twice: the batch of a step that spiked once and came back quiet).
    """

    name = "causes"
    explains = True
    section_name = "causes"
    parameter_constraints = {"same_samples": fraction()}

    def __init__(self, same_samples: float = 0.5) -> None:
        self.same_samples = same_samples

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        found = list(found or [])
        gate = run.sections.get("plan") if isinstance(run.sections.get("plan"), dict) else None
        static = bool(gate and gate.get("static"))
        quiet = {id(f) for f in unfollowed(found, run.grad_norm_key)}
        events = self._events([f for f in found if f.kind == "spike" and id(f) not in quiet], run.loss_key)
        added = self._regroup_grad_norm(found, run, quiet)
        quiet = {id(f) for f in unfollowed(found, run.grad_norm_key)}
        groups = self._join(events)
        for group in groups:
            if len(group) > 1:
                for f in (f for e in group for f in e):
                    support_of(f)["recurs"] = True
        assign_severities(found)
        causes = [self._event_cause(g, run, gate, static) for g in groups]
        causes += self._nonfinite_causes(found, run)
        causes += [self._finding_cause("level_shift", f, run) for f in found if f.kind == "level_shift"]
        recurs_by_plan = static and any(c["kind"] == "batch" and c["details"]["recurs"] for c in causes)
        for f in found:
            if f.kind == "static_plan" and recurs_by_plan:  # the spikes coming back are its second line
                support_of(f)["critical"] = True
                assign_severities([f])
                next(c for c in causes if c["kind"] == "batch" and c["details"]["recurs"])["_members"].append(f)
        for f in found:
            kind = CAUSE_KINDS.get(f.kind)
            if kind is None or (kind == "plan" and recurs_by_plan):
                continue
            if kind == "samples":
                causes = self._samples_cause(f, causes, run)
                continue
            members = [g for g in found if id(g) in quiet] if kind == "grad_norm" else []
            causes.append(self._finding_cause(kind, f, run, members=members, gate=gate))
        causes.sort(key=lambda c: urgency(c["severity"], c["confidence"], c["steps"]))
        for i, c in enumerate(causes, 1):
            c["id"] = f"C{i}"
            c["key"] = cause_key(c["kind"], c["steps"], c.pop("_key_samples", []))
            c["logged_steps"] = [int(x) + run.logged_offset for x in c["steps"]]
            for f in c.pop("_members", []):
                f.tags["cause"] = c["id"]
                f.severity = c["severity"]
        self.section_ = [dict(id=c["id"], **{k: v for k, v in c.items() if k != "id"}) for c in causes]
        return added

    @staticmethod
    def _regroup_grad_norm(found: list[Finding], run: RunTables, quiet: set[int]) -> list[Finding]:
        """The grad-norm finding again when building the events found more spikes the loss did not follow (a loss
        answer in another batch); returns it when it is new (it joins ``found`` too)."""
        now = unfollowed(found, run.grad_norm_key)
        if {id(f) for f in now} == quiet:
            return []
        from forensics.detect.rules.grad_norm import GradNormRule

        summary = GradNormRule(**run.rule_params.get("grad_norm", {})).summarise(found, run)
        old = next((f for f in found if f.kind == "grad_norm_spikes"), None)
        if old is not None and summary is not None:
            old.__dict__.update(summary.__dict__)
            return []
        if summary is not None:
            found.append(summary)
            return [summary]
        return []

    # --- events and their joins -----------------------------------------------------------------------------------
    @staticmethod
    def _events(spikes: list[Finding], loss_key: str) -> list[list[Finding]]:
        """Spikes whose spans overlap, over all metrics, as events (loss first); a grad-norm spike the loss answered
        (``joint`` = ``loss_response``) joins the event of the first loss spike starting within ``JOINT_LEAD`` steps
        of its end."""
        spikes = sorted(spikes, key=lambda f: (_span(f), str(f.metric)))
        answering = [f for f in spikes if f.details.get("joint") == "loss_response"]
        events: list[list[Finding]] = []
        end = None
        for f in spikes:
            if f.details.get("joint") == "loss_response":
                continue
            lo, hi = _span(f)
            if events and end is not None and lo <= end:
                events[-1].append(f)
                end = max(end, hi)
            else:
                events.append([f])
                end = hi
        for g in answering:
            lo, hi = _span(g)
            host = next(
                (
                    e
                    for e in events
                    if any(
                        f.details.get("joint") in ("led", "accompanied") and lo <= _span(f)[0] <= hi + JOINT_LEAD
                        for f in e
                    )
                ),
                None,
            )
            if host is not None and not _same_cause(g, host):
                # the loss answered in another batch (the plan says so): the loss did not follow this one
                support_of(g).pop("grad_norm", None)
                support_of(g)["explained"] = NOT_FOLLOWED
                support_of(g)["not_followed"] = True
                continue
            if host is None:
                events.append([g])
            else:
                host.append(g)
        events.sort(key=lambda e: min(_span(f)[0] for f in e))
        for e in events:
            e.sort(key=lambda f: (f.metric != loss_key, _span(f), str(f.metric)))
        return events

    def _join(self, events: list[list[Finding]]) -> list[list[list[Finding]]]:
        """Events of the same samples joined (module docstring): cores that meet, recurrence, or mostly the same
        suspects."""
        u = DisjointSets(len(events))
        samples = [set().union(*(set(f.suspect_samples[:SUSPECTS_READ]) for f in e)) for e in events]
        times: dict[int, int] = {}
        for s in samples:
            for i in s:
                times[i] = times.get(i, 0) + 1
        cores = []
        for s in samples:
            most = max((times[i] for i in s), default=0)
            cores.append({i for i in s if times[i] == most} if most >= 2 else set())
        step_of: dict[int, int] = {}
        for i, e in enumerate(events):
            for f in e:
                for step in range(_span(f)[0], _span(f)[1] + 1):
                    step_of[step] = i
        for i, e in enumerate(events):
            for f in e:
                for r in f.tags.get("recurrence") or []:
                    if isinstance(r, dict) and r.get("is_spike") and int(r.get("step", -1)) in step_of:
                        u.join(i, step_of[int(r["step"])])
            for j in range(i + 1, len(events)):
                a, b = samples[i], samples[j]
                if cores[i] & cores[j] or (a and b and len(a & b) / len(a | b) >= self.same_samples):
                    u.join(i, j)
        groups: dict[int, list[list[Finding]]] = {}
        for i, e in enumerate(events):
            groups.setdefault(u.find(i), []).append(e)
        return list(groups.values())

    # --- causes -----------------------------------------------------------------------------------------------------
    @staticmethod
    def _event_cause(group: list[list[Finding]], run: RunTables, gate: dict | None, static: bool) -> dict[str, Any]:
        members = [f for e in group for f in e]
        steps = sorted({s for f in members for s in range(_span(f)[0], _span(f)[1] + 1)})
        firsts = [int(e[0].peak_step if e[0].peak_step is not None else e[0].step) for e in group]
        metrics = list(dict.fromkeys(str(f.metric) for f in sorted(members, key=lambda f: f.metric != run.loss_key)))
        counts: dict[int, int] = {}
        for e in group:
            for i in set().union(*(set(f.suspect_samples[:SUSPECTS_READ]) for f in e)):
                counts[i] = counts.get(i, 0) + 1
        order: list[int] = []
        for f in sorted(members, key=lambda f: f.metric != run.loss_key):
            order += [s for s in f.suspect_samples if s not in order]
        suspects = sorted(order, key=lambda s: (-counts.get(s, 0), order.index(s)))
        no_doubt = 1.0
        for f in members:
            no_doubt *= 1.0 - f.confidence_value()
        recurs = len(group) > 1
        lead = next((f for f in members if f.metric == run.loss_key), members[0])
        kind = "batch" if suspects else "event"
        numerics = _first_attribution(members, "numerics", "numerics")
        # the signals the logs hold around the event, when one of them rose (the re-run judge reads them)
        signals = _first_attribution(members, "logged_signals", "evidence")
        return {
            "kind": kind,
            "steps": steps,
            "metrics": metrics,
            "suspect_samples": suspects,
            "_key_samples": list(group[0][0].suspect_samples),
            "_members": members,
            "severity": most_severe(f.severity for f in members),
            "confidence": 1.0 - no_doubt,
            "summary": wording.event_summary(kind, lead, members, firsts, suspects, counts, run, gate, static),
            "next_step": wording.event_next_step(kind, firsts, suspects, run, gate, static),
            "events": firsts,
            "details": {
                "recurs": recurs,
                "static_plan": static,
                "bucket": lead.tags.get("bucket"),
                "cluster_name": lead.tags.get("cluster_name"),
                "plan": wording.plan_link(gate) if static and recurs else None,
                "spiked_in": {str(i): counts[i] for i in suspects if counts.get(i, 0) >= 2},
            }
            | ({"numerics": numerics} if numerics else {})
            | ({"logged_signals": signals} if signals else {})
            | ({"ranks": list(lead.tags["ranks"])} if lead.tags.get("ranks") else {})
            | ({"rank_batch": lead.details["rank_batches"][0]} if lead.details.get("rank_batches") else {}),
        }

    def _samples_cause(self, f: Finding, causes: list[dict[str, Any]], run: RunTables) -> list[dict[str, Any]]:
        """The run-level harmful samples as one story: batch causes led by them join one ``samples`` cause, "these
        samples raised the loss each time they were consumed" (when a single batch cause already holds them all,
        that cause tells them: one batch coming back)."""
        harmful = set(f.suspect_samples)
        led = [c for c in causes if c["kind"] == "batch" and harmful & set(c["suspect_samples"][:3])]
        # batches coming back (a static plan) tell their samples best as batches: they keep their causes
        coming_back = [c for c in led if c["details"]["recurs"] and c["details"]["static_plan"]]
        for c in coming_back:
            c["details"]["harmful_samples"] = sorted(harmful & set(c["suspect_samples"][:SUSPECTS_READ]))
        told = {i for c in coming_back for i in c["suspect_samples"][:SUSPECTS_READ]}
        led = [c for c in led if c not in coming_back]
        if harmful <= told and coming_back:
            coming_back[0]["_members"].append(f)
            return causes
        if len(led) == 1 and harmful - told <= set(led[0]["suspect_samples"][:SUSPECTS_READ]):
            led[0]["details"]["harmful_samples"] = sorted(harmful)
            led[0]["_members"].append(f)
            return causes
        if told:  # what the returning batches do not tell
            f = _narrowed(f, sorted(harmful - told, key=f.suspect_samples.index), run)
        cause = self._finding_cause("samples", f, run)
        for c in led:
            cause["_members"] += c["_members"]
            cause["steps"] = sorted(set(cause["steps"]) | set(c["steps"]))
            cause["events"] = sorted(set(cause["events"]) | set(c["events"]))
            cause["confidence"] = max(cause["confidence"], c["confidence"])
        cause["severity"] = most_severe([cause["severity"], *(c["severity"] for c in led)])
        cause["details"]["batch_events"] = sorted({e for c in led for e in c["events"]})
        return [c for c in causes if c not in led] + [cause]

    @staticmethod
    def _nonfinite_causes(found: list[Finding], run: RunTables) -> list[dict[str, Any]]:
        by_metric: dict[str, list[Finding]] = {}
        for f in found:
            if f.kind == "nonfinite" and f.severity == CRITICAL:
                by_metric.setdefault(str(f.metric), []).append(f)
        out = []
        for metric, items in by_metric.items():
            steps = sorted({int(f.step) for f in items})
            out.append(
                {
                    "kind": "nonfinite",
                    "steps": steps,
                    "metrics": [metric],
                    "suspect_samples": [],
                    "_members": items,
                    "severity": CRITICAL,
                    "confidence": 1.0,
                    "events": steps[:1],
                    "summary": wording.nonfinite_summary(metric, steps, run.logged_offset),
                    "next_step": wording.nonfinite_next_step(steps, run),
                    "details": {},
                }
            )
        return out

    @staticmethod
    def _finding_cause(
        kind: str, f: Finding, run: RunTables, members: list[Finding] | None = None, gate: dict | None = None
    ) -> dict[str, Any]:
        """A cause of one run-level finding (and the findings it covers: the grad-norm spikes of ``grad_norm``)."""
        members = [f, *(members or [])]
        steps = (
            sorted({int(s) for s in (f.details.get("steps") or [])})
            if kind in ("grad_norm", "samples")
            else ([] if kind in ("oscillation", "plan") else [int(f.step)])
        )
        severity = most_severe(m.severity for m in members[:1])
        return {
            "kind": kind,
            "steps": steps,
            "metrics": [str(f.metric)] if f.metric else [],
            "suspect_samples": list(f.suspect_samples),
            "_members": members,
            "severity": severity,
            "confidence": f.confidence_value(),
            "events": steps[:1],
            "summary": wording.finding_summary(kind, f, run, gate),
            "next_step": wording.finding_next_step(kind, f, gate, run),
            "details": {},
        }


def _first_attribution(members: list[Finding], key: str, said: str) -> dict[str, Any] | None:
    """The first member's ``details["attribution"][key]`` whose ``said`` entry holds something (the logs said it)."""
    for f in members:
        found = (f.details.get("attribution") or {}).get(key) or {}
        if found.get(said):
            return found
    return None
