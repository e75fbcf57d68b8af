"""Causes: findings that one explanation covers, told as one story (DESIGN.md Conventions, ``cause``).

- Spikes of several metrics whose spans overlap are one **event** (the loss and the grad norm at step 254).
- Events whose batch comes back and spikes again (the attribution's recurrence), or whose suspect samples are mostly
  the same, are one **batch** cause with all their steps (254 and its return at 14159).
- Critical NaN/inf values are one ``nonfinite`` cause per metric; each level shift is a cause; run-level facts are
  causes with ``steps: []``: a periodic swing (``oscillation``) and, when no batch cause already explains the
  spikes through it, a static batch composition (``plan``).

Each cause is ``{id, key, kind, steps, metrics, suspect_samples, severity, confidence, summary, next_step}`` (``key``:
:func:`cause_key`, stable across audits and the live loop); every spike
carries the ``cause`` id it belongs to; causes are ranked by severity, then confidence.
"""

from __future__ import annotations

from typing import Any

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import CRITICAL, INFO, SEVERITIES, WARNING, Finding
from forensics.detect.params import fraction
from forensics.detect.rules.composition import plan_fix_words, plan_words

#: Events whose suspect samples overlap this much (Jaccard) are the same batch.
SAME_SAMPLES = 0.5


def _span(f: Finding) -> tuple[int, int]:
    return int(f.step), int(f.end_step if f.end_step is not None else f.step)


def _steps_text(steps: list[int], limit: int = 6) -> str:
    shown = [str(s) for s in steps[:limit]]
    text = ", ".join(shown[:-1]) + (" and " if len(shown) > 1 else "") + shown[-1] if shown else ""
    return text + (f" (+{len(steps) - limit} more)" if len(steps) > limit else "")


def cause_key(kind: str, steps: list[int], samples: list[int]) -> str:
    """A cause's stable identity: its kind, its first step and its first event's suspect samples (sorted, so that
    re-ranking them keeps the key; the first event's, so that the cause keeps its key as later events join it).
    ``watch`` alerts once per key; a later audit or the live loop gives the same cause the same key."""
    import hashlib

    ids = sorted({int(s) for s in samples})
    digest = hashlib.sha1(",".join(map(str, ids)).encode()).hexdigest()[:10] if ids else "-"
    return f"{kind}:{steps[0] if steps else '-'}:{digest}"


class _Union:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def join(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)


class CauseRule(Rule):
    """Groups the findings into causes (the ``causes`` section) and tags each spike with its ``cause``.

    Parameter: ``same_samples`` 0.5 (the Jaccard overlap of two events' suspect samples above which they are one
    batch coming back; recurrence found by the attribution joins events whatever their overlap).
    """

    name = "causes"
    explains = True
    section_name = "causes"
    parameter_constraints = {"same_samples": fraction()}

    def __init__(self, same_samples: float = SAME_SAMPLES) -> None:
        self.same_samples = same_samples

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        found = list(found or [])
        causes: list[dict[str, Any]] = []
        events = self._events([f for f in found if f.kind == "spike"], run.loss_key)
        groups = self._join(events)
        gate = run.sections.get("plan") if isinstance(run.sections.get("plan"), dict) else None
        static = bool(gate and gate.get("static"))
        batch_causes = [self._event_cause(g, run, static) for g in groups]
        causes += batch_causes
        by_metric: dict[str, list[Finding]] = {}
        for f in found:
            if f.kind == "nonfinite" and f.severity == CRITICAL:
                by_metric.setdefault(str(f.metric), []).append(f)
        for metric, items in by_metric.items():
            steps = sorted({int(f.step) for f in items})
            causes.append({"kind": "nonfinite", "steps": steps, "metrics": [metric], "suspect_samples": [],
                           "_members": items,
                           "severity": CRITICAL, "confidence": 1.0,
                           "summary": f"{metric} is NaN/inf at {len(steps)} step{'s' if len(steps) > 1 else ''} "
                                      f"({_steps_text(steps)}): the numbers broke.",
                           "next_step": f"Check step {steps[0]}'s batch and the optimizer state before it (overflow, a "
                                        "too-high learning rate, a bad sample)."})
        for c in causes:
            c.setdefault("events", c["steps"][:1])
            c.setdefault("details", {})
        for f in found:
            if f.kind == "level_shift":
                causes.append({"kind": "level_shift", "steps": [int(f.step)], "metrics": [str(f.metric)], "_members": [f],
                               "suspect_samples": [], "severity": f.severity, "confidence": f.confidence_value(),
                               "summary": f"{f.metric} moved to a new level from step {f.step} and stayed there.",
                               "next_step": f.next_step})
            elif f.kind == "oscillation":
                causes.append({"kind": "oscillation", "steps": [], "metrics": [str(f.metric)], "suspect_samples": [],
                               "_members": [f],
                               "severity": f.severity, "confidence": f.confidence_value(),
                               "summary": (f.evidence or ["the loss swings periodically"])[0],
                               "next_step": f.next_step})
        explained_by_plan = static and any(c["kind"] == "batch" and c.get("recurs") for c in batch_causes)
        for f in found:
            if f.kind == "static_plan" and not explained_by_plan:
                causes.append({"kind": "plan", "steps": [], "metrics": [], "suspect_samples": [], "_members": [f],
                               "severity": WARNING if not batch_causes else CRITICAL, "confidence": 1.0,
                               "summary": f"The batch plan is {plan_words(gate)}: " + (
                                   f.evidence[0] if f.evidence else "the same samples meet in every epoch") + ".",
                               "next_step": plan_fix_words(gate)[:1].upper() + plan_fix_words(gate)[1:] + "."})
        causes.sort(key=lambda c: (-SEVERITIES.index(c["severity"]), -round(c["confidence"], 3), not c["steps"],
                                   c["steps"][:1]))
        for i, c in enumerate(causes, 1):
            c["id"] = f"C{i}"
            c["key"] = cause_key(c["kind"], c["steps"], c.pop("_key_samples", []))
            c["logged_steps"] = [int(x) + run.logged_offset for x in c["steps"]]
            for f in c.pop("_members", []):
                f.tags["cause"] = c["id"]
            c.pop("recurs", None)
        self.section_ = [dict(id=c["id"], **{k: v for k, v in c.items() if k != "id"}) for c in causes]
        return []

    # --- events and their joins -----------------------------------------------------------------------------------
    @staticmethod
    def _events(spikes: list[Finding], loss_key: str) -> list[list[Finding]]:
        """Spikes whose spans overlap, over all metrics, as events (loss first)."""
        spikes = sorted(spikes, key=lambda f: _span(f))
        events: list[list[Finding]] = []
        end = None
        for f in spikes:
            lo, hi = _span(f)
            if events and end is not None and lo <= end:
                events[-1].append(f)
                end = max(end, hi)
            else:
                events.append([f])
                end = hi
        for e in events:
            e.sort(key=lambda f: (f.metric != loss_key, str(f.metric)))
        return events

    def _join(self, events: list[list[Finding]]) -> list[list[list[Finding]]]:
        """Events that are the same batch coming back (recurrence, or mostly the same suspects) joined."""
        u = _Union(len(events))
        step_of = {}
        for i, e in enumerate(events):
            for f in e:
                lo, hi = _span(f)
                for s in range(lo, hi + 1):
                    step_of[s] = i
        suspects = [set().union(*(set(f.suspect_samples[:20]) for f in e)) for e in events]
        for i, e in enumerate(events):
            for f in e:
                for r in f.tags.get("recurrence") or []:
                    if isinstance(r, dict) and r.get("is_spike") and int(r.get("step", -1)) in step_of:
                        u.join(i, step_of[int(r["step"])])
            for j in range(i + 1, len(events)):
                a, b = suspects[i], suspects[j]
                if a and b and len(a & b) / len(a | b) >= self.same_samples:
                    u.join(i, j)
        groups: dict[int, list[list[Finding]]] = {}
        for i, e in enumerate(events):
            groups.setdefault(u.find(i), []).append(e)
        return list(groups.values())

    # --- one cause ----------------------------------------------------------------------------------------------
    @staticmethod
    def _event_cause(group: list[list[Finding]], run: RunTables, static: bool) -> dict[str, Any]:
        gate = run.sections.get("plan") if isinstance(run.sections.get("plan"), dict) else None
        members = [f for e in group for f in e]
        steps = sorted({s for f in members for s in range(_span(f)[0], _span(f)[1] + 1)})
        firsts = [int(e[0].peak_step if e[0].peak_step is not None else e[0].step) for e in group]
        metrics = list(dict.fromkeys(str(f.metric) for f in sorted(members, key=lambda f: f.metric != run.loss_key)))
        suspects: list[int] = []
        for f in sorted(members, key=lambda f: f.metric != run.loss_key):
            suspects += [s for s in f.suspect_samples if s not in suspects]
        severity = max((f.severity for f in members), key=SEVERITIES.index)
        conf = 1.0
        for f in members:
            conf *= 1.0 - f.confidence_value()
        confidence = 1.0 - conf
        lead = next((f for f in members if f.metric == run.loss_key), members[0])
        kind = "batch" if suspects else "event"
        recurs = len(group) > 1
        where = ""
        if lead.tags.get("bucket") is not None:
            where = f" in bucket {lead.tags['bucket']} {lead.tags.get('bucket_range', '')}".rstrip()
            if lead.tags.get("cluster_name"):
                where += f" ('{lead.tags['cluster_name']}')"
        ratio = lead.details.get("ratio")
        size = f" ({ratio:.1f}x its baseline)" if isinstance(ratio, float) and ratio == ratio else ""
        riders = [m for m in metrics if m != lead.metric]
        also = f", with {', '.join(riders)} at the same steps" if riders else ""
        dup = False
        if kind == "event":
            summary = (f"{lead.metric} spiked at step{'s' if len(firsts) > 1 else ''} {_steps_text(firsts)}{size}"
                       f"{also}; without a plan no batch can be named.")
            next_step = (f"Record or rebuild the batch plan (--plan, --samples) to name step {firsts[0]}'s batch and "
                         f"samples, then replay it from the checkpoint before it.")
        else:
            dup = any("near-duplicate" in str(r) for f in members
                      for s in (f.details.get("attribution") or {}).get("samples") or [] for r in s.get("reasons", []))
            who = f"the same {'near-duplicate ' if dup else ''}samples ({', '.join(map(str, suspects[:6]))}" + \
                  (f" +{len(suspects) - 6}" if len(suspects) > 6 else "") + ")"
            if recurs:
                summary = (f"{lead.metric} spiked at steps {_steps_text(firsts)}{size}{also}: each time the batch "
                           f"held {who}{where}; it is one batch coming back"
                           + (f" because the plan is {plan_words(gate)}." if static else "."))
            else:
                summary = f"{lead.metric} spiked at step {firsts[0]}{size}{also}; its batch held {who}{where}."
            fix = f" and {plan_fix_words(gate)}" if static else ""
            next_step = (f"Replay step {firsts[0]} from the checkpoint before it (forensics replay CASE --steps "
                         f"{firsts[0]}) against same-bucket controls; inspect samples "
                         f"{', '.join(map(str, suspects[:6]))}{fix}.")
        lead_words = [e for e in lead.evidence if " steps before the loss" in e]
        if lead.details.get("joint") == "led" or lead_words:
            summary = summary.rstrip(".") + (f"; {lead_words[0].split(':')[0]}" if lead_words else
                                             "; the grad norm rose before it") + " (an optimizer-led event)."
        return {"kind": kind, "steps": steps, "metrics": metrics, "suspect_samples": suspects,
                "_key_samples": list(group[0][0].suspect_samples),
                "severity": severity if severity != INFO else WARNING, "confidence": confidence,
                "summary": summary, "next_step": next_step, "recurs": recurs, "_members": members,
                "events": firsts, "details": {"recurs": recurs, "near_duplicates": kind == "batch" and dup,
                                              "static_plan": static, "bucket": lead.tags.get("bucket"),
                                              "cluster_name": lead.tags.get("cluster_name")}}
