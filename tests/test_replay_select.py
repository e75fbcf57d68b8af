"""Which steps ``replay --from-findings`` (and ``audit --replay``) takes from findings.json's causes: a batch cause its
first events, a ``samples`` cause the steps that consumed most of its samples (most first, ties the earlier step),
capped at EVENTS_PER_CAUSE, steps the plan does not hold left out."""

from __future__ import annotations

import pytest

from forensics.replay.select import EVENTS_PER_CAUSE, cause_groups, most_harmful_steps


def _findings(harmful: list[tuple[int, list[int]]], samples_events: list[int]) -> dict:
    return {
        "causes": [
            {"id": "C1", "kind": "batch", "steps": [40, 41, 90], "events": [40, 90], "suspect_samples": [7]},
            {
                "id": "C2",
                "kind": "samples",
                "steps": sorted({s for _, st in harmful for s in st}),
                "events": samples_events,
                "suspect_samples": [i for i, _ in harmful],
            },
            {"id": "C3", "kind": "grad_norm", "steps": [12], "events": [12], "suspect_samples": []},
        ],
        "harmful_samples": [{"sample_id": i, "steps": st} for i, st in harmful]
        + [{"sample_id": 99, "steps": [5, 5, 5]}],  # not this cause's sample: never counted
    }


@pytest.mark.parametrize(
    ("harmful", "has", "expected"),
    [
        # step 30 holds three of the samples, 20 two, 10 and 50 one: most first
        ([(1, [10, 20, 30]), (2, [20, 30]), (3, [30, 50])], None, [30, 20, 10]),
        # ties go to the earlier step
        ([(1, [50, 60]), (2, [60, 50])], None, [50, 60]),
        # a step the plan does not hold is left out; the next most harmful takes its place
        ([(1, [10, 20, 30]), (2, [20, 30]), (3, [30, 50])], {10, 20, 50, 40, 90}, [20, 10, 50]),
        # no harmful_samples rows for the cause: its own events
        ([], None, [3]),
    ],
)
def test_samples_cause_replays_the_steps_holding_most_of_its_samples(harmful, has, expected) -> None:
    findings = _findings(harmful, [3])
    if not harmful:
        findings["causes"][1]["steps"] = [3]
    groups = cause_groups(findings, (lambda s: True) if has is None else has.__contains__)
    by = {g.kind: g for g in groups}
    assert [g.kind for g in groups] == ["batch", "samples"]
    assert by["batch"].steps == [40, 90]
    assert len(by["samples"].steps) <= EVENTS_PER_CAUSE
    assert by["samples"].steps == expected


def test_most_harmful_steps_counts_only_the_cause_samples() -> None:
    findings = _findings([(1, [10, 20]), (2, [20])], [10])
    assert most_harmful_steps(findings, findings["causes"][1]) == [20, 10]
    assert most_harmful_steps(findings, {"suspect_samples": [42]}) == []
