"""The replay's decision rules at their boundaries (forensics/replay/verdicts.py: plain numbers, no torch), and the
merge of replay verdicts into findings.json's causes (forensics/detect/causes/replayed.py)."""

from __future__ import annotations

import copy
import math

import pytest

from forensics.detect.causes.replayed import apply_replay, cause_verdict
from forensics.replay.verdicts import (
    RTOL_EXACT,
    SEED_Z,
    Z_HIGH,
    Z_NORMAL,
    Measured,
    TrainReplay,
    decide,
    sensitivity,
    tolerance,
)


def _m(**kw) -> Measured:
    """A step replayed at its own checkpoint that reproduces its logged 2.0, controls at mean 2.0."""
    base = dict(step=100, checkpoint_step=100, logged=2.0, replayed=2.0, neighbours={}, z=0.0, controls_mean=2.0)
    return Measured(**(base | kw))


@pytest.mark.parametrize(
    "z, gradient_z, verdict",
    [
        (0.0, None, "normal"),
        (Z_NORMAL, None, "normal"),  # at the edge of the controls' spread: still within
        (-Z_NORMAL, None, "normal"),
        (Z_NORMAL + 0.01, None, "inconclusive"),
        (-Z_NORMAL - 0.01, None, "inconclusive"),
        (1.0, Z_NORMAL, "normal"),
        (1.0, Z_NORMAL + 0.01, "inconclusive"),  # its gradient pulls harder than its bucket's
        (1.0, -5.0, "normal"),  # a gradient below its bucket's is no sign of harm
    ],
)
def test_normal_needs_loss_and_gradient_within_the_controls_spread(z, gradient_z, verdict):
    v = decide(_m(z=z, gradient_z=gradient_z, replayed=2.0 + 0.1 * z, logged=2.0 + 0.1 * z))
    assert v.verdict == verdict, v.evidence
    assert v.mode == "eval"


@pytest.mark.parametrize(
    "z, replayed, verdict",
    [
        (Z_HIGH, 2.6, "data"),  # z and a 30% rise over the controls' mean
        (Z_HIGH - 0.01, 2.6, "inconclusive"),
        (Z_HIGH, 2.59, "inconclusive"),  # 29.5%: unusual for its bucket, not a spike's cause
    ],
)
def test_data_needs_z_and_a_rise_over_the_bucket(z, replayed, verdict):
    v = decide(_m(z=z, replayed=replayed, logged=replayed))
    assert v.verdict == verdict, v.evidence


def test_data_needs_every_earlier_checkpoint_high_too():
    earlier = [{"checkpoint_step": 50, "replayed": 3.0, "z": Z_HIGH - 0.5, "controls_mean": 2.2}]
    assert decide(_m(z=10.0, replayed=3.0, logged=3.0, earlier=earlier)).verdict == "inconclusive"
    earlier[0]["z"] = Z_HIGH
    v = decide(_m(z=10.0, replayed=3.0, logged=3.0, earlier=earlier))
    assert (v.verdict, v.confidence) == ("data", 0.95)


@pytest.mark.parametrize(
    "z, verdict, confidence", [(10.0, "data", 0.8), (0.5, "normal", 0.6), (2.5, "inconclusive", 0.3)]
)
def test_a_checkpoint_after_the_step_says_so_and_lowers_the_confidence_of_normal(z, verdict, confidence):
    # 46 updates after the step: the logged loss (6.0) is not the state's to reproduce, so it is not checked
    v = decide(_m(step=54, checkpoint_step=100, after=True, logged=6.0, z=z, replayed=2.0 * (1 + 0.1 * z)))
    assert (v.verdict, v.confidence) == (verdict, confidence), v.evidence
    assert "46 updates after the step" in v.evidence[0] and "not checked" in v.evidence[0]


def test_a_later_checkpoint_concludes_no_state_or_composition():
    earlier = [{"checkpoint_step": 50, "replayed": 1.0, "z": 0.0, "controls_mean": 1.0}]
    m = _m(z=0.5, replayed=2.05, logged=2.05, earlier=earlier, composition=(0.1, 0.0, 1.0))
    assert decide(m).verdict == "state"
    m.after = True
    assert decide(m).verdict == "normal"


@pytest.mark.parametrize(
    "gap, verdict, mode",
    [
        (0.0, "normal", "train"),
        (0.999, "normal", "train"),  # within the tolerance plus SEED_Z spreads
        (1.001, "not-reproduced", "eval"),
    ],
)
def test_a_logged_train_mode_loss_is_reproduced_in_train_mode_within_its_seed_spread(gap, verdict, mode):
    logged = 2.7
    tol = tolerance(logged, 0)
    spread = 0.01
    mean = logged + gap * (tol + SEED_Z * spread)
    # three seeds with that mean and (sample) SD
    losses = [mean - spread, mean, mean + spread]
    train = TrainReplay([0, 1, 2], losses)
    assert train.spread == pytest.approx(spread)
    # eval mode misses (dropout off gives a lower loss than the run logged)
    v = decide(_m(logged=logged, replayed=2.59, train=train, dropout=0.1, z=0.7))
    assert (v.verdict, v.mode) == (verdict, mode), v.evidence


def test_not_reproduced_names_what_differs():
    # the other batches reproduce their own losses within 1%: this batch's tokens are not the run's
    m = _m(logged=2.0, replayed=6.0, neighbour_own_error={"-1": 0.004, "+1": 0.01})
    v = decide(m)
    assert v.verdict == "not-reproduced"
    assert "the tokens of step 100's batch differ" in v.evidence[-1]
    assert "no dropout" in v.evidence[1]
    # they miss too: the checkpoint or the loss definition
    m.neighbour_own_error = {"-1": 0.2, "+1": 0.25}
    assert "the checkpoint is not the state" in decide(m).evidence[-1]


def test_misaligned_wins_when_a_neighbour_gives_the_logged_loss():
    m = _m(
        logged=4.0,
        replayed=2.0,
        neighbours={"+1": 4.0},
        neighbour_logged_match={"+1": 0.0},
        neighbour_distance={"+1": 1},
        reverse_logged={"+1": 2.0},
    )
    v = decide(m)
    assert v.verdict == "misaligned" and "step_offset = -1" in v.evidence[-1]


def test_a_forward_that_disagrees_with_itself_is_nondeterministic_first():
    m = _m(
        z=10.0,
        replayed=3.0,
        logged=3.0,
        determinism={"max_abs_diff": 0.0, "equal": True, "train": {"max_abs_diff": 0.2, "equal": False}},
    )
    v = decide(m)
    assert v.verdict == "nondeterministic" and "the same dropout seed" in v.evidence[0]


@pytest.mark.parametrize(
    "harm, mixed, verdict",
    [
        (0.02, 0.0, "composition"),  # +2% of the other clusters' loss, a mixed update leaves them alone
        (0.0199, 0.0, "normal"),  # under 2%: what any homogeneous batch does
        (0.04, 0.0201, "normal"),  # less than twice the mixed update's
        (0.04, 0.02, "composition"),
    ],
)
def test_composition_is_a_relative_pull_on_the_other_clusters(harm, mixed, verdict):
    before = 1.5
    v = decide(_m(z=0.2, composition=(harm * before, mixed * before, before)))
    assert v.verdict == verdict, v.evidence


@pytest.mark.parametrize(
    "own, theirs, expected", [(0.02, 0.02, 1.0), (0.12, 0.03, 4.0), (0.05, 0.0, 5.0), (1.0, 0.01, 10.0)]
)
def test_sensitivity_scales_the_drift_of_a_batch_that_moves_faster_than_its_controls(own, theirs, expected):
    earlier = [{"replayed": 1.0, "controls_mean": 1.0}]
    assert sensitivity(1.0 + own, 1.0 + theirs, earlier) == pytest.approx(expected)
    cal = [(4, 0.01)]
    assert tolerance(1.0, 4, cal, expected) == pytest.approx(min(0.3, RTOL_EXACT + 1.5 * 0.01 * expected))


# --- the merge into findings.json ---------------------------------------------------------------------------------
def _findings() -> dict:
    def spike(step, cause, support):
        return {
            "kind": "spike",
            "step": step,
            "metric": "loss",
            "severity": "critical",
            "cause": cause,
            "details": {"support": support},
        }

    spikes = [
        spike(54, "C1", {"moved": True, "grad_norm": True}),
        spike(84, "C2", {"moved": True, "recurs": True}),
        spike(189, "C2", {"moved": True, "recurs": True}),
    ]
    return {
        "run": {"loss_key": "loss", "logged_offset": 1, "case": "/runs/out"},
        "spikes": spikes,
        "findings": copy.deepcopy(spikes),
        "causes": [
            {
                "id": "C1",
                "key": "batch:54:a",
                "kind": "batch",
                "steps": [54],
                "events": [54],
                "severity": "critical",
                "confidence": 0.99,
                "suspect_samples": [1, 2],
                "summary": "loss spiked at step 54.",
                "next_step": "replay `forensics replay /runs/out --steps 54`",
                "details": {},
            },
            {
                "id": "C2",
                "key": "batch:84:b",
                "kind": "batch",
                "steps": [84, 189],
                "events": [84, 189],
                "severity": "critical",
                "confidence": 0.98,
                "suspect_samples": [7, 8],
                "summary": "loss spiked at 84.",
                "next_step": "replay `forensics replay /runs/out --steps 84,189`",
                "details": {},
            },
        ],
    }


def _entry(step, verdict, confidence=0.9, **kw):
    return {
        "step": step,
        "verdict": verdict,
        "confidence": confidence,
        "checkpoint_step": 100,
        "checkpoint": "before",
        "evidence": [f"{verdict} at {step}."],
        "role": "suspect",
    } | kw


def test_normal_lowers_a_cause_and_its_events_to_info_and_data_confirms_the_other():
    f = apply_replay(
        _findings(),
        {
            "steps": [
                _entry(54, "normal"),
                _entry(84, "data", leave_out={"sample_ids": [8]}),
                _entry(189, "inconclusive"),
                _entry(60, "normal", role="control"),
            ]
        },
    )
    by_key = {c["key"]: c for c in f["causes"]}
    assert [c["key"] for c in f["causes"]] == ["batch:84:b", "batch:54:a"]  # ranked again, numbered again
    assert [c["id"] for c in f["causes"]] == ["C1", "C2"]
    cleared, confirmed = by_key["batch:54:a"], by_key["batch:84:b"]
    assert cleared["severity"] == "info" and cleared["replay"]["verdict"] == "normal"
    assert confirmed["severity"] == "critical" and confirmed["replay"]["steps"] == {"84": "data", "189": "inconclusive"}
    assert [(s["step"], s["cause"], s["severity"]) for s in f["spikes"]] == [
        (54, "C2", "info"),
        (84, "C1", "critical"),
        (189, "C1", "critical"),
    ]
    assert all(s["details"]["support"]["replay"] for s in f["findings"])
    # the next steps say what the verdict means instead of asking for the replay just done
    assert "forensics replay" not in confirmed["next_step"] + cleared["next_step"]
    assert confirmed["next_step"].startswith("Replay confirms the data") and "samples 8" in confirmed["next_step"]
    assert cleared["next_step"].startswith("Replay clears step 54 (logged 55)")
    assert f["verdict"].endswith(
        "confirmed by replay: the batch of step 84 (logged 85) is high against its own bucket at checkpoint 100."
    )
    assert f["replay"]["causes"] == {"C1": "data", "C2": "normal"}


def test_merging_twice_gives_what_merging_once_gives():
    replay = {"steps": [_entry(54, "normal"), _entry(84, "data")]}
    once = apply_replay(_findings(), replay)
    twice = apply_replay(copy.deepcopy(once), replay)
    assert twice == once


@pytest.mark.parametrize(
    "verdicts, expected",
    [
        (["normal", "normal"], "normal"),
        (["normal", "data"], "data"),
        (["inconclusive", "data", "misaligned"], "data"),
        (["normal", "inconclusive"], "inconclusive"),
        (["state", "not-reproduced"], "not-reproduced"),
        (["composition", "misaligned"], "misaligned"),
    ],
)
def test_a_cause_takes_the_strongest_verdict_of_its_replayed_events(verdicts, expected):
    entries = [_entry(100 + i, v) for i, v in enumerate(verdicts)]
    assert cause_verdict(entries)["verdict"] == expected


def test_nan_free_json_numbers():
    # the merged findings stay strict JSON
    import json

    f = apply_replay(_findings(), {"steps": [_entry(54, "normal")]})
    assert json.loads(json.dumps(f, allow_nan=False)) == f
    assert not any(isinstance(v, float) and math.isnan(v) for v in f["replay"].values() if isinstance(v, float))
