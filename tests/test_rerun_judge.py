"""The re-run's judging rules at their boundaries, on hand-made segments (the numbers a re-run records)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.detect.evidence.log_signals import log_signals
from forensics.replay.checkpoints import Checkpoint
from forensics.replay.rerun import Segment
from forensics.replay.rerun_judge import (
    DETERMINISM_REL,
    GONE_SHARE,
    JUMP,
    NOISE_MIN_STEPS,
    NOISE_Z,
    REPRO_REL,
    SPIKE_MIN_REL,
    judge,
    logged_numerics,
    logged_signals,
    loss_noise,
)

CK = Checkpoint(10, Path("checkpoint-10"), "hf")
GROUPS = ("embeddings", "block.0.attn", "block.0.mlp")


def _segment(
    losses: list[float], ratios: dict[str, list[float]] | None = None, replaced: float | None = None
) -> Segment:
    recs = []
    for i, loss in enumerate(losses):
        groups = {
            g: {
                "grad_norm": 1.0,
                "update_ratio": (ratios or {}).get(g, [0.01] * len(losses))[i],
                "eps_share": 0.0,
                "g2_over_v_max": 2.0,
            }
            for g in GROUPS
        }
        recs.append(
            {
                "step": 10 + i,
                "loss": loss,
                "grad_norm": 1.0,
                "groups": groups,
                "max_attention_logit": 1.0,
                "logsumexp": 5.0,
            }
        )
    return Segment(recs, replaced, [])


def _judge(
    first: Segment, logged_last: float, second: Segment | None = None, history: dict[int, float] | None = None
) -> dict:
    steps = [r["step"] for r in first.records]
    logged = dict(history or {}) | {s: r["loss"] for s, r in zip(steps, first.records, strict=True)}
    logged[steps[-1]] = logged_last
    return judge(steps[-1], CK, first, second or copy.deepcopy(first), logged, {}, 99, False, None)


@pytest.mark.parametrize(("rel", "reproduced"), [(REPRO_REL * 0.99, True), (REPRO_REL * 1.01, False)])
def test_reproduced_at_the_tolerance(rel: float, reproduced: bool) -> None:
    seg = _segment([3.0, 3.0, 3.0, 6.0], replaced=3.0)
    r = _judge(seg, 6.0 / (1 - rel))  # relative to the logged loss: |6 - L| / L = rel
    assert r["reproduced"] is reproduced
    assert r["cause_class"] == ("data" if reproduced else "hardware")


@pytest.mark.parametrize(
    ("left", "gone", "cls"), [(GONE_SHARE * 0.99, True, "data"), (GONE_SHARE * 1.01, False, "optimizer")]
)
def test_spike_gone_at_the_share_left(left: float, gone: bool, cls: str) -> None:
    seg = _segment([3.0, 3.0, 3.0, 7.0], replaced=3.0 + left * 4.0)
    r = _judge(seg, 7.0)
    assert r["replaced"]["spike_gone"] is gone
    assert r["cause_class"] == cls


@pytest.mark.parametrize(("factor", "first"), [(JUMP * 0.99, None), (JUMP * 1.01, "block.0.mlp")])
def test_update_ratio_jump_names_the_first_group(factor: float, first: str | None) -> None:
    ratios = {"block.0.mlp": [0.01, 0.01, 0.01 * factor, 0.01]}
    seg = _segment([3.0, 3.0, 3.0, 6.0], ratios)  # no replaced batch: the jump before the spike decides
    r = _judge(seg, 6.0)
    assert r["first_group"] == first
    assert r["cause_class"] == ("optimizer" if first else "unknown")


#: A run's history before the segment (steps 0-9; the segment starts at 3.0 at step 10) whose consecutive
#: differences are +-0.1 six times and +-0.3 four times: median 0, median absolute difference 0.1, so one step's noise
#: is 0.1 * MAD_TO_SD / sqrt(2).
ZIGZAG = dict(enumerate([3.0, 3.1, 3.0, 3.3, 3.0, 3.1, 3.0, 3.3, 3.0, 3.1]))


def test_loss_noise_is_the_robust_sd_of_differences() -> None:
    from forensics.stats import MAD_TO_SD

    assert loss_noise(ZIGZAG | {10: 3.0}, 11) == pytest.approx(MAD_TO_SD * 0.1 / 2**0.5)
    assert loss_noise(ZIGZAG | {10: 3.0, 11: 99.0}, 11) == loss_noise(ZIGZAG | {10: 3.0}, 11)  # the step itself: no
    short = {s: ZIGZAG[s] for s in range(NOISE_MIN_STEPS)}  # NOISE_MIN_STEPS values: one difference too few
    assert loss_noise(short, 10) == 0.0


@pytest.mark.parametrize(
    ("excess", "spike", "cls"),
    [
        (0.99, False, None),
        (1.01, True, "data"),
    ],
)
def test_spike_at_the_noise_margin(excess: float, spike: bool, cls: str | None) -> None:
    """The step is a spike only past NOISE_Z noise units over the segment's baseline (here wider than 5%); below
    it a batch that the control beats is no fault: no class."""
    from forensics.stats import MAD_TO_SD

    margin = NOISE_Z * MAD_TO_SD * 0.1 / 2**0.5
    assert margin > SPIKE_MIN_REL * 3.0
    top = 3.0 + excess * margin
    seg = _segment([3.0, 3.0, 3.0, top], replaced=3.0)
    r = _judge(seg, top, history=ZIGZAG)
    assert r["spike"] is spike
    assert r["cause_class"] == cls
    assert (r["action"] is None) is (cls is None)


@pytest.mark.parametrize(("rel", "spike"), [(SPIKE_MIN_REL * 0.99, False), (SPIKE_MIN_REL * 1.01, True)])
def test_spike_at_the_relative_margin_without_history(rel: float, spike: bool) -> None:
    seg = _segment([3.0, 3.0, 3.0, 3.0 * (1 + rel)], replaced=3.0)
    r = _judge(seg, 3.0 * (1 + rel))
    assert r["spike"] is spike
    assert r["cause_class"] == ("data" if spike else None)


def test_logged_spike_not_reproduced_is_a_spike() -> None:
    r = _judge(_segment([3.0, 3.0, 3.0, 3.0], replaced=3.0), 9.0)
    assert r["spike"] is True
    assert r["cause_class"] == "hardware"


def test_earliest_jump_wins_over_a_larger_later_one() -> None:
    ratios = {"block.0.attn": [0.01, 0.01, 0.01, 0.5], "embeddings": [0.01, 0.01, 0.04, 0.04]}
    r = _judge(_segment([3.0, 3.0, 3.0, 6.0], ratios), 6.0)
    assert r["first_group"] == "embeddings"


@pytest.mark.parametrize(("rel", "deterministic"), [(DETERMINISM_REL * 0.5, True), (DETERMINISM_REL * 2, False)])
def test_determinism_at_its_tolerance(rel: float, deterministic: bool) -> None:
    first = _segment([3.0, 3.0, 3.0, 6.0], replaced=3.0)
    second = copy.deepcopy(first)
    second.records[1]["loss"] *= 1 + rel
    r = _judge(first, 9.0, second)
    assert r["deterministic"] is deterministic
    assert r["cause_class"] == ("hardware" if deterministic else "unknown")


#: What the audit wrote for a cause whose spike followed a loss-scale drop (findings.json ``details.numerics``).
NUMERICS = {
    "numerics": True,
    "loss_scale_drop": {"step": 11, "before": 65536.0, "after": 32768.0},
    "nan_iterations": None,
    "evidence": [
        "loss scale dropped from 65536 to 32768 at step 11, 2 steps ahead of the loss spike at 13: "
        "the fp16 scaler met an overflow (numerics)."
    ],
}


@pytest.mark.parametrize(("cause_steps", "found"), [([13, 14], True), ([14, 15], False)])
def test_logged_numerics_of_the_cause_holding_the_step(cause_steps: list[int], found: bool) -> None:
    findings = {"causes": [{"id": "C1", "steps": cause_steps, "details": {"numerics": NUMERICS}}]}
    assert logged_numerics(findings, 13) == (NUMERICS if found else None)


@pytest.mark.parametrize(("logs", "cls"), [(NUMERICS, "numerics"), (None, "data")])
def test_logged_loss_scale_drop_classes_a_reproduced_spike_numerics(logs: dict | None, cls: str) -> None:
    first = _segment([3.0, 3.0, 3.0, 6.0], replaced=3.0)
    steps = [r["step"] for r in first.records]
    logged = {s: r["loss"] for s, r in zip(steps, first.records, strict=True)}
    r = judge(13, CK, first, copy.deepcopy(first), logged, {}, 99, False, None, logs)
    assert r["cause_class"] == cls
    assert any("(numerics)" in e for e in r["evidence"]) is (logs is not None)


def _signals(column: str, first: int) -> dict:
    """What the audit writes for a cause (``details.logged_signals``): the real rule on a logged ``column`` that sits
    at 1.0 (+-0.1%) and is 3x that from step ``first`` on, around a loss spike at 13."""
    steps = np.arange(-60, 20)
    values = 1.0 + 0.001 * (-1.0) ** steps
    values[steps >= first] = 3.0
    return log_signals(pd.DataFrame({"step": steps, "lm loss": 3.0, column: values}), 13)


@pytest.mark.parametrize(
    ("column", "first", "cls"),
    [
        # an update or params norm rising one step before the spike: optimizer; with it or after: undecided
        ("optim/update norm", 12, "optimizer"),
        ("optim/update norm", 13, "unknown"),
        ("params norm", 12, "optimizer"),
        ("params norm", 14, "unknown"),
        # a z loss or zero-gradient count rising at or before it: numerics; after it: undecided
        ("train/Z loss", 12, "numerics"),
        ("train/Z loss", 13, "numerics"),
        ("train/Z loss", 14, "unknown"),
        ("num zeros", 13, "numerics"),
        ("num zeros", 14, "unknown"),
    ],
)
def test_logged_signals_class_a_reproduced_spike_no_experiment_decided(column: str, first: int, cls: str) -> None:
    signals = _signals(column, first)
    findings = {"causes": [{"id": "C1", "steps": [13], "details": {"logged_signals": signals}}]}
    assert logged_signals(findings, 13) == signals
    first_pass = _segment([3.0, 3.0, 3.0, 6.0])  # no replaced batch: nothing on the re-run decides
    steps = [r["step"] for r in first_pass.records]
    logged = {s: r["loss"] for s, r in zip(steps, first_pass.records, strict=True)}
    r = judge(13, CK, first_pass, copy.deepcopy(first_pass), logged, {}, 99, False, findings, None, signals)
    assert r["cause_class"] == cls
    tagged = [e for e in r["evidence"] if e.startswith(column) and e.endswith(f"({cls}).")]
    assert len(tagged) == (0 if cls == "unknown" else 1)


def test_logged_update_rise_does_not_beat_a_replaced_batch() -> None:
    first_pass = _segment([3.0, 3.0, 3.0, 6.0], replaced=3.0)
    steps = [r["step"] for r in first_pass.records]
    logged = {s: r["loss"] for s, r in zip(steps, first_pass.records, strict=True)}
    signals = _signals("optim/update norm", 12)
    r = judge(13, CK, first_pass, copy.deepcopy(first_pass), logged, {}, 99, False, None, None, signals)
    assert r["cause_class"] == "data"
