"""The comparison as compare.json (docs/commands/compare.md) and its before/after pair.

``{runs: [{name, source, steps}], spikes: [{step, logged_step, runs, class, data_position, values, states}],
removed: [...], before_after: {jumpiness_share, tokens_per_s}, summary}``, the Contract's keys plus ``states``:

- ``steps`` (of a run): how many steps logged its loss;
- ``step`` / ``logged_step``: the anchor's step (the first run, in RUN order, that spiked there) canonical and as
  that run logs it; ``runs``: the runs that have the spike there (spiked, or ``echoed``: rose there like the
  anchor under their own detector's threshold; :mod:`forensics.compare.classes`); ``values``: every run's loss
  there (its peak where it spiked, null where it did not reach); ``states``: every run's state there
  (:data:`forensics.compare.classes.STATES`), what the audit reads to weigh a class as evidence
  (:mod:`forensics.detect.causes.compared`);
- ``data_position`` (with plans, else null): the samples (``n_samples``, the first 20 ``sample_ids``), each run's
  best ``overlap`` with them, and ``consumed_at``: where a run whose order ``moved`` them consumed them (``[]``:
  never, they were left out);
- **before/after** (exactly two runs; the first is "before"): ``removed`` = the positions where the first run
  spiked and the second, which reached them, did not (nor echoed it); ``before_after`` holds ``jumpiness_share``
  and ``tokens_per_s`` as ``[before, after]``, each when both runs have it; the counts removed / left (both
  spiked) / new (only the second) are in ``summary``.
- A run's data ``order`` against the first run (:meth:`Comparison.orders`, the terminal summary): ``same`` when
  their plans consumed the same samples at :data:`SAME_ORDER_SHARE` of their common steps or more (``how``:
  ``plans``), as ``--same-order`` says for runs without a plan (``how``: ``--same-order``), else unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from forensics.compare.align import Position
from forensics.compare.classes import CLASSES, ECHOED, MEANING, SPIKED, UNREACHED
from forensics.compare.runs import ComparedRun
from forensics.schema.words import counted

#: Two plans read the data in the same order when they consumed identical samples at this share of their common
#: steps or more (a resumed run that re-consumed a stretch, a last partial step, still count as the same order).
SAME_ORDER_SHARE = 0.95
#: States in which a run has the spike (detected, or under its threshold).
_THERE = (SPIKED, ECHOED)
#: Sample ids listed per data position (the count is always given).
LISTED_SAMPLES = 20


def same_order(share: float | None) -> bool | None:
    """Whether a same-order share (:meth:`StepSamples.same_order_share`) means the same data order."""
    return None if share is None else share >= SAME_ORDER_SHARE


@dataclass
class Comparison:
    """Runs compared: the runs (first = "before"), the data positions where any spiked, how they were aligned."""

    runs: list[ComparedRun]
    positions: list[Position]
    by: str
    same_order_given: bool = False
    tolerance: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def is_pair(self) -> bool:
        return len(self.runs) == 2

    def orders(self) -> list[dict[str, Any]]:
        """Each run's data order against the first run's (module docstring)."""
        first = self.runs[0]
        out: list[dict[str, Any]] = [{"same": True, "share": 1.0, "how": "first"}]
        for run in self.runs[1:]:
            if first.plan is not None and run.plan is not None:
                share = first.plan.same_order_share(run.plan)
                out.append({"same": same_order(share), "share": share, "how": "plans"})
            elif self.same_order_given:
                out.append({"same": True, "share": None, "how": "--same-order"})
            else:
                out.append({"same": None, "share": None, "how": "unknown"})
        return out

    def counts(self) -> dict[str, int]:
        return {c: sum(p.cls == c for p in self.positions) for c in CLASSES}

    def removed(self) -> list[Position]:
        """Before/after: positions the first run spiked at and the second reached without spiking."""
        if not self.is_pair:
            return []
        return [p for p in self.positions if p.states[0] == SPIKED and p.states[1] not in (*_THERE, UNREACHED)]

    def left(self) -> list[Position]:
        """Before/after: positions both runs spiked at (the second possibly smaller: ``echoed``)."""
        return [p for p in self.positions if self.is_pair and p.states[0] == SPIKED and p.states[1] in _THERE]

    def new(self) -> list[Position]:
        """Before/after: positions only the second run spiked at (the first reached them)."""
        return [
            p
            for p in self.positions
            if self.is_pair and p.states[1] == SPIKED and p.states[0] not in (*_THERE, UNREACHED)
        ]

    def before_after(self) -> dict[str, Any] | None:
        if not self.is_pair:
            return None
        a, b = self.runs
        out: dict[str, Any] = {
            "before": a.name,
            "after": b.name,
            "removed": len(self.removed()),
            "left": len(self.left()),
            "new": len(self.new()),
        }
        if a.jumpiness_share is not None and b.jumpiness_share is not None:
            out["jumpiness_share"] = [a.jumpiness_share, b.jumpiness_share]
        if a.tokens_per_s is not None and b.tokens_per_s is not None:
            out["tokens_per_s"] = [a.tokens_per_s, b.tokens_per_s]
            out["tokens_key"] = [a.tokens_key, b.tokens_key]
        return out

    def position_json(self, p: Position) -> dict[str, Any]:
        """One spike position of compare.json: the Contract's keys and ``states`` (module docstring)."""
        names = [r.name for r in self.runs]
        anchor = self.runs[p.anchor_run]
        data = None
        if p.samples is not None:
            data = {
                "n_samples": len(p.samples),
                "sample_ids": sorted(p.samples)[:LISTED_SAMPLES],
                "overlap": {names[r]: round(v, 4) for r, v in sorted(p.overlap.items())},
                "consumed_at": {names[r]: s for r, s in sorted(p.consumed.items())},
            }
        return {
            "step": p.anchor.step,
            "logged_step": p.anchor.step + anchor.logged_offset,
            "runs": [names[r] for r, s in sorted(p.states.items()) if s in _THERE],
            "class": p.cls,
            "data_position": data,
            "values": {names[r]: p.values.get(r) for r in range(len(names))},
            "states": {names[r]: st for r, st in sorted(p.states.items())},
        }

    def summary(self) -> dict[str, Any]:
        """compare.json's ``summary``: the count of positions per class, the before/after counts (pairs) and the
        sentence the terminal and the page open with."""
        out: dict[str, Any] = {"positions": len(self.positions), **self.counts()}
        if self.is_pair:
            out.update(removed=len(self.removed()), left=len(self.left()), new=len(self.new()))
        out["sentence"] = self.sentence()
        return out

    def sentence(self) -> str:
        """The comparison in one sentence (the terminal summary's and the page's headline)."""
        counts = self.counts()
        n = len(self.positions)
        if not n:
            return f"No loss spike in any of the {len(self.runs)} runs."
        parts = [f"{counts[c]} {c}" for c in CLASSES if counts[c]]
        text = f"{counted(n, 'spike position')} across {len(self.runs)} runs: {', '.join(parts)}"
        if self.is_pair:
            text += (
                f"; {self.runs[1].name} against {self.runs[0].name}: {len(self.removed())} removed, "
                f"{len(self.left())} left, {len(self.new())} new"
            )
        return text + "."

    def lines(self) -> list[str]:
        """The terminal summary: the sentence, each run's order, one line per position, the before/after."""
        out = [self.sentence()]
        for run, order in zip(self.runs[1:], self.orders()[1:], strict=True):
            same = {True: "the same data order", False: "another data order", None: "data order unknown"}
            out.append(f"  {run.name} against {self.runs[0].name}: {same[order['same']]} ({order['how']})")
        removed = {id(p) for p in self.removed()}
        for p in self.positions:
            j = self.position_json(p)
            values = ", ".join(f"{k} {v:.4g}" if v is not None else f"{k} -" for k, v in j["values"].items())
            mark = " (removed)" if id(p) in removed else ""
            out.append(
                f"  step {j['step']} (logged {j['logged_step']}): {j['class']}{mark}, in "
                f"{', '.join(j['runs'])}; loss {values}"
            )
        ba = self.before_after() or {}
        for key in ("jumpiness_share", "tokens_per_s"):
            if key in ba:
                a, b = ba[key]
                out.append(f"  {key}: {a:.4g} before, {b:.4g} after")
        out += [f"  {c}: {MEANING[c]}" for c in CLASSES if self.counts()[c]]
        return out

    def to_json(self) -> dict[str, Any]:
        """compare.json: ``{runs, spikes, removed, before_after (pairs), summary}`` (module docstring)."""
        out: dict[str, Any] = {
            "runs": [{"name": r.name, "source": r.source, "steps": int(len(r.steps))} for r in self.runs],
            "spikes": [self.position_json(p) for p in self.positions],
            "removed": [self.position_json(p) for p in self.removed()],
        }
        ba = self.before_after()
        if ba is not None:
            out["before_after"] = {k: ba[k] for k in ("jumpiness_share", "tokens_per_s") if k in ba}
        out["summary"] = self.summary()
        return out


def id_warnings(runs: Sequence[ComparedRun]) -> list[str]:
    """Plans are compared by sample id: warn when two runs give different samples the same id (their lengths
    differ for more than 5% of the ids both use), as a dataset re-indexed after dropping rows would."""
    out = []
    first = runs[0]
    for run in runs[1:]:
        if first.sample_tokens is None or run.sample_tokens is None:
            continue
        common = first.sample_tokens.index.intersection(run.sample_tokens.index)
        if not len(common):
            continue
        differ = int((first.sample_tokens.loc[common].to_numpy() != run.sample_tokens.loc[common].to_numpy()).sum())
        if differ > 0.05 * len(common):
            out.append(
                f"{run.name} and {first.name} give {differ} of their {len(common)} common sample ids "
                "samples of other lengths: the ids do not name the same samples, so data positions compared "
                "by id are not the same data (keep each sample's id when re-building a dataset: a "
                "'sample_id' column)"
            )
    return out
