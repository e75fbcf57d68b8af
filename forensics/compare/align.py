"""Runs side by side: spikes of several runs joined into data positions, and the state of every run at each.

**Joining.** Two spikes (of two runs, or of one run in ``data`` mode) are at the same position when

- ``--by step``: their spans overlap, widened by ``tolerance`` steps, and, where both runs have a plan, their steps
  consumed mostly the same samples (two runs with other orders spiking at one step is a coincidence of step, not
  of data);
- ``--by data``: their steps consumed mostly the same samples (:data:`~forensics.compare.positions.SAME_SAMPLES`),
  whatever the steps: a batch that spiked at step 254 of one run and step 1,021 of another is one position, and
  so are the epochs a static plan repeats it in. A run without a plan is joined by step.

Joins are transitive (a union-find over every pair), so a position holds each run's spikes there.

**States.** At each position the runs that did not spike are judged against its *anchor* (the first spike of the
first run, in RUN order, that spiked there): see :mod:`forensics.compare.classes` for the states and the rule. A
run that held the data (or whose order is unknown, at the same step) and rose there like the anchor (its rise over
its local median, :meth:`ComparedRun.rise_at`, at least half the anchor's) ``echoed`` it: the same spike, under its
own detector's threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from forensics.compare.classes import ECHOED, HELD, MOVED, SPIKED, UNKNOWN, UNREACHED, classify, echoes
from forensics.compare.positions import SAME_SAMPLES
from forensics.compare.runs import ComparedRun, Spike
from forensics.stats import DisjointSets

BY = ("step", "data")


@dataclass
class Position:
    """One data position where at least one run spiked, and where every run stands there."""

    anchor_run: int
    anchor: Spike
    spikes: dict[int, list[Spike]]
    states: dict[int, str]
    steps: dict[int, list[int]]
    values: dict[int, float | None]
    samples: frozenset[int] | None = None
    overlap: dict[int, float] = field(default_factory=dict)
    consumed: dict[int, list[int]] = field(default_factory=dict)
    cls: str = ""


def _jaccard(a: frozenset[int], b: frozenset[int]) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


def _spans_meet(a: Spike, b: Spike, tolerance: int) -> bool:
    return a.step - tolerance <= b.end_step and b.step - tolerance <= a.end_step


def align(
    runs: Sequence[ComparedRun], by: str = "step", same_order: bool = False, tolerance: int = 0
) -> list[Position]:
    """Every data position where some run spiked, in order of its anchor's step (module docstring)."""
    if by not in BY:
        raise ValueError(f"by must be one of {BY}; got {by!r}")
    nodes = [(r, s) for r, run in enumerate(runs) for s in run.spikes]
    samples = [runs[r].plan.samples_at(s.position_steps) if runs[r].plan is not None else None for r, s in nodes]
    u = DisjointSets(len(nodes))
    for i, (ri, a) in enumerate(nodes):
        for j in range(i + 1, len(nodes)):
            rj, b = nodes[j]
            if _joined(ri, a, samples[i], rj, b, samples[j], by, tolerance):
                u.join(i, j)
    groups: dict[int, list[int]] = {}
    for i in range(len(nodes)):
        groups.setdefault(u.find(i), []).append(i)
    out = []
    for members in groups.values():
        members.sort(key=lambda i: (nodes[i][0], nodes[i][1].step))
        first = members[0]
        out.append(_position(runs, [nodes[i] for i in members], nodes[first], samples[first], by, same_order))
    out.sort(key=lambda p: (p.anchor.step, p.anchor_run))
    return out


def _joined(
    ri: int, a: Spike, sa: frozenset[int] | None, rj: int, b: Spike, sb: frozenset[int] | None, by: str, tolerance: int
) -> bool:
    """Whether two spikes are at one data position (module docstring, "Joining")."""
    both_plans = sa is not None and sb is not None
    if by == "data" and both_plans:
        return _jaccard(sa, sb) >= SAME_SAMPLES
    if ri == rj:
        return False
    if not _spans_meet(a, b, tolerance):
        return False
    return not both_plans or _jaccard(sa, sb) >= SAME_SAMPLES


def _position(
    runs: Sequence[ComparedRun],
    members: list[tuple[int, Spike]],
    anchor: tuple[int, Spike],
    samples: frozenset[int] | None,
    by: str,
    same_order: bool,
) -> Position:
    anchor_run, spike = anchor
    pos = Position(anchor_run=anchor_run, anchor=spike, spikes={}, states={}, steps={}, values={}, samples=samples)
    for r, s in members:
        pos.spikes.setdefault(r, []).append(s)
    anchor_rise = runs[anchor_run].rise_at(spike.peak_step)
    for r, run in enumerate(runs):
        mine = pos.spikes.get(r)
        if mine:
            pos.states[r] = SPIKED
            pos.steps[r] = sorted({s.peak_step for s in mine})
            peaks = [s.value for s in mine if s.value is not None]
            pos.values[r] = max(peaks) if peaks else None
            if samples is not None and run.plan is not None:
                pos.overlap[r] = max(run.plan.overlap_at(s.peak_step, samples) for s in mine)
            continue
        state, step = _state(run, spike, samples, by, same_order, pos, r)
        if state in (HELD, UNKNOWN) and step is not None and echoes(run.rise_at(step), anchor_rise):
            state = ECHOED
        pos.states[r] = state
        pos.steps[r] = [step] if step is not None else []
        pos.values[r] = run.value_at(step) if step is not None else None
    pos.cls = classify({str(r): s for r, s in pos.states.items()})
    return pos


def _state(
    run: ComparedRun, spike: Spike, samples: frozenset[int] | None, by: str, same_order: bool, pos: Position, r: int
) -> tuple[str, int | None]:
    """Where a run that did not spike stands at a position, and the step it is compared at (module docstring of
    :mod:`forensics.compare.classes`)."""
    at = spike.peak_step
    if samples is not None and run.plan is not None:
        if by == "data":
            held = run.plan.holding(samples)
            if held:
                reached = [h for h in held if run.reaches(h.step)]
                if not reached:
                    pos.overlap[r] = max(h.overlap for h in held)
                    return UNREACHED, None
                best = min(reached, key=lambda h: (abs(h.step - at), h.step))
                pos.overlap[r] = best.overlap
                return HELD, best.step
            pos.overlap[r] = max((run.plan.overlap_at(s, samples) for s in run.plan.steps_of(samples)), default=0.0)
            pos.consumed[r] = run.plan.steps_of(samples)
            return MOVED, at if run.reaches(at) else None
        if not run.reaches(at):
            return UNREACHED, None
        pos.overlap[r] = run.plan.overlap_at(at, samples)
        if pos.overlap[r] >= SAME_SAMPLES:
            return HELD, at
        pos.consumed[r] = run.plan.steps_of(samples)
        return MOVED, at
    if not run.reaches(at):
        return UNREACHED, None
    return (HELD if same_order else UNKNOWN), at
