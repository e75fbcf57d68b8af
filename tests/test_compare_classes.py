"""The decision rules of ``forensics compare``, table-driven at their boundaries: the class of a data position from
the runs' states, the echo share, the join of spikes by step (tolerance) and by data position (the Jaccard overlap
of the samples consumed), and the states a quiet run takes there."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forensics.compare.align import align
from forensics.compare.classes import ECHO_SHARE, classify, echoes
from forensics.compare.positions import SAME_SAMPLES, StepSamples
from forensics.compare.runs import ComparedRun, Spike

N_STEPS = 100
BASE = 3.0


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ({"a": "spiked", "b": "spiked"}, "recurring"),
        ({"a": "spiked", "b": "echoed"}, "recurring"),
        ({"a": "spiked", "b": "spiked", "c": "held"}, "recurring"),
        ({"a": "spiked", "b": "held"}, "unique"),
        ({"a": "spiked", "b": "held", "c": "moved"}, "unique"),
        ({"a": "spiked", "b": "moved"}, "vanished"),
        ({"a": "spiked", "b": "moved", "c": "unknown"}, "vanished"),
        ({"a": "spiked", "b": "unknown"}, "unique"),
        ({"a": "spiked", "b": "unreached"}, "unique"),
        ({"a": "spiked"}, "unique"),
    ],
)
def test_the_class_of_a_position_from_every_runs_state(states, expected):
    assert classify(states) == expected


@pytest.mark.parametrize("states", [{"a": "held", "b": "moved"}, {"a": "echoed"}, {"a": "spiked", "b": "gone"}])
def test_a_position_without_a_spike_or_with_an_unknown_state_is_refused(states):
    with pytest.raises(ValueError):
        classify(states)


@pytest.mark.parametrize(
    ("rise", "anchor", "expected"),
    [
        (ECHO_SHARE * 2.0, 2.0, True),  # exactly the share: the same spike, smaller
        (ECHO_SHARE * 2.0 - 1e-9, 2.0, False),  # just under it: quiet
        (3.0, 2.0, True),
        (1.0, 0.0, False),  # an anchor that did not rise
        (1.0, -1.0, False),
        (None, 2.0, False),
        (1.0, None, False),
    ],
)
def test_a_quiet_run_echoes_the_anchor_from_half_its_rise(rise, anchor, expected):
    assert echoes(rise, anchor) is expected


def _run(
    name: str,
    spikes: dict[int, float],
    plan: pd.DataFrame | None = None,
    bumps: dict[int, float] | None = None,
    n_steps: int = N_STEPS,
) -> ComparedRun:
    """A run whose loss is flat at BASE but for its spikes (``{step: value}``) and quiet bumps."""
    values = np.full(n_steps, BASE)
    for step, v in {**(bumps or {}), **spikes}.items():
        values[step] = v
    return ComparedRun(
        name=name,
        source=name,
        case=None,
        loss_key="loss",
        steps=np.arange(n_steps),
        values=values,
        logged_offset=0,
        spikes=[Spike(s, s, s, v) for s, v in sorted(spikes.items())],
        plan=StepSamples(plan) if plan is not None else None,
    )


def _plan(batches: dict[int, list[int]], n_steps: int = N_STEPS, width: int = 4) -> pd.DataFrame:
    """A step-mapped plan: ``width`` samples of their own per step (ids 1000 + ...), but for ``batches``."""
    rows = []
    for step in range(n_steps):
        ids = batches.get(step, [1000 + step * width + k for k in range(width)])
        rows += [(step, i) for i in ids]
    return pd.DataFrame(rows, columns=["step", "sample_id"])


@pytest.mark.parametrize(
    ("a_step", "b_step", "tolerance", "classes"),
    [
        (50, 50, 0, ["recurring"]),
        (50, 51, 0, ["unique", "unique"]),
        (50, 51, 1, ["recurring"]),
        (50, 52, 1, ["unique", "unique"]),
        (50, 52, 2, ["recurring"]),
    ],
)
def test_by_step_spikes_meet_within_the_tolerance(a_step, b_step, tolerance, classes):
    runs = [_run("a", {a_step: 6.0}), _run("b", {b_step: 6.0})]
    assert [p.cls for p in align(runs, by="step", tolerance=tolerance)] == classes


@pytest.mark.parametrize(
    ("same_order", "b_bump", "state", "cls"),
    [
        (False, None, "unknown", "unique"),
        (True, None, "held", "unique"),
        (False, BASE + ECHO_SHARE * 3.0, "echoed", "recurring"),  # rose half as much: the same spike
        (True, BASE + ECHO_SHARE * 3.0 - 0.01, "held", "unique"),  # just under half: quiet
    ],
)
def test_by_step_without_plans_a_quiet_run_is_unknown_held_or_echoes(same_order, b_bump, state, cls):
    bumps = {50: b_bump} if b_bump is not None else {}
    runs = [_run("a", {50: BASE + 3.0}), _run("b", {}, bumps=bumps)]
    (pos,) = align(runs, by="step", same_order=same_order)
    assert (pos.states[1], pos.cls) == (state, cls)


SPIKE_BATCH = [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("b_batch", "state", "cls"),
    [
        ([1, 2, 3, 4], "held", "unique"),  # the same batch, quiet: not the data alone
        ([1, 2, 3, 4, 5, 6, 7, 8], "held", "unique"),  # Jaccard 4/8 = the limit: still the same batch
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], "moved", "vanished"),  # 4/9: another batch
        ([1, 2, 90, 91], "moved", "vanished"),  # 2/6
    ],
)
def test_by_step_with_plans_a_quiet_run_held_the_batch_from_half_its_samples(b_batch, state, cls):
    assert 4 / 8 == SAME_SAMPLES
    runs = [_run("a", {50: 6.0}, _plan({50: SPIKE_BATCH})), _run("b", {}, _plan({50: b_batch}))]
    (pos,) = align(runs, by="step")
    assert (pos.states[1], pos.cls, round(pos.overlap[1], 4)) == (
        state,
        cls,
        round(len(set(b_batch) & set(SPIKE_BATCH)) / len(set(b_batch) | set(SPIKE_BATCH)), 4),
    )


@pytest.mark.parametrize(
    ("b_batch", "classes"),
    [
        ([1, 2, 3, 4, 5, 6, 7, 8], ["recurring"]),  # the same data at another step, spiking too
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], ["vanished", "vanished"]),  # 4/9: each order moved the other's batch apart
    ],
)
def test_by_data_spikes_join_where_they_consumed_mostly_the_same_samples(b_batch, classes):
    runs = [_run("a", {20: 6.0}, _plan({20: SPIKE_BATCH})), _run("b", {70: 6.0}, _plan({70: b_batch}))]
    positions = align(runs, by="data")
    assert [p.cls for p in positions] == classes


@pytest.mark.parametrize(
    ("where", "b_steps", "state", "cls", "consumed"),
    [
        ({70: SPIKE_BATCH}, 100, "held", "unique", None),  # held at 70 and quiet there
        ({}, 100, "moved", "vanished", []),  # never consumed: left out
        ({30: [1, 2, 50, 51], 60: [3, 4, 52, 53]}, 100, "moved", "vanished", [30, 60]),  # consumed apart
        ({70: SPIKE_BATCH}, 60, "unreached", "unique", None),  # its metrics stop before step 70
    ],
)
def test_by_data_a_quiet_run_held_moved_or_did_not_reach_the_samples(where, b_steps, state, cls, consumed):
    runs = [_run("a", {20: 6.0}, _plan({20: SPIKE_BATCH})), _run("b", {}, _plan(where), n_steps=b_steps)]
    (pos,) = align(runs, by="data")
    assert (pos.states[1], pos.cls, pos.consumed.get(1)) == (state, cls, consumed)


def test_by_data_the_epochs_a_static_plan_repeats_a_batch_in_are_one_position():
    plan = _plan({10: SPIKE_BATCH, 60: SPIKE_BATCH})
    runs = [_run("a", {10: 6.0, 60: 6.0}, plan), _run("b", {}, _plan({}))]
    (pos,) = align(runs, by="data")
    assert (pos.steps[0], pos.cls) == ([10, 60], "vanished")


# --- the classes as evidence of the audit's causes ------------------------------------------------------------------
def _jsonl_case(folder, spikes: dict[int, tuple[float, float]]):
    """A case folder whose run.toml names one JSONL log: ``spikes`` = {step: (loss factor, grad-norm factor)}."""
    import json

    rng = np.random.default_rng(11)
    folder.mkdir(parents=True)
    rows = []
    for s in range(300):
        loss, gn = (3.0 - s / 300) * (1 + 0.01 * rng.standard_normal()), 1.0 + 0.02 * rng.standard_normal()
        f_loss, f_gn = spikes.get(s, (1.0, 1.0))
        rows.append({"step": s, "loss": round(loss * f_loss, 6), "grad_norm": round(gn * f_gn, 6)})
    (folder / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (folder / "run.toml").write_text('metrics = "m.jsonl"\n')
    return folder


def _severity_at(findings, step):
    (cause,) = [c for c in findings["causes"] if step in c["steps"]]
    return cause["severity"], cause.get("compare")


def test_a_recurring_spike_is_data_evidence_and_a_held_unique_one_is_evidence_against(tmp_path, capsys):
    import json

    from forensics.cli import main

    a = _jsonl_case(tmp_path / "a", {60: (2.0, 3.0), 150: (2.0, 1.0)})  # 60: loss and grad norm; 150: loss alone
    b = _jsonl_case(tmp_path / "b", {150: (2.0, 1.0)})  # the same data order: 150 spikes again
    assert main(["audit", str(a), "--no-html"]) == 0
    alone = json.loads((a / "findings.json").read_text())
    assert _severity_at(alone, 60) == ("critical", None) and _severity_at(alone, 150) == ("warning", None)

    assert main(["compare", str(a), str(b), "--same-order", "--json", str(a / "compare.json")]) == 0
    assert json.loads((a / "compare.json").read_text())["this_run"] == "a"
    assert main(["audit", str(a), "--no-html"]) == 0
    capsys.readouterr()
    compared = json.loads((a / "findings.json").read_text())
    assert _severity_at(compared, 60) == ("warning", ["unique_held"])  # b read the same data and did not spike
    assert _severity_at(compared, 150) == ("critical", ["recurring"])  # b spiked on the same data
    assert compared["causes"][0]["steps"] == [150]


@pytest.mark.parametrize(
    "compare, lines, expected",
    [
        ("recurring", {}, "critical"),
        (None, {}, "warning"),
        ("unique_held", {}, "warning"),
        ("unique_held", {"grad_norm": True}, "warning"),
        (None, {"grad_norm": True}, "critical"),
        ("unique_held", {"grad_norm": True, "content": True}, "critical"),
        ("vanished", {}, "warning"),
    ],
)
def test_compare_evidence_boundaries(compare, lines, expected):
    from forensics.detect.causes.severity import severity_of

    support = {"moved": True, **lines, **({"compare": compare} if compare else {})}
    assert severity_of("spike", support) == expected


def test_a_compare_json_not_written_for_this_case_changes_nothing():
    from forensics.detect.causes.compared import compared_steps

    doc = {"spikes": [{"step": 5, "runs": ["a", "b"], "class": "recurring", "states": {}}]}
    assert compared_steps(doc) == {}
    assert compared_steps(doc | {"this_run": "a"}) == {5: "recurring"}
    assert compared_steps(doc | {"this_run": "c"}) == {}
