"""The re-run's judging rules at their boundaries, on hand-made segments (the numbers a re-run records)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from forensics.replay.checkpoints import Checkpoint
from forensics.replay.rerun import Segment
from forensics.replay.rerun_judge import DETERMINISM_REL, GONE_SHARE, JUMP, REPRO_REL, judge

CK = Checkpoint(10, Path("checkpoint-10"), "hf")
GROUPS = ("embeddings", "block.0.attn", "block.0.mlp")


def _segment(losses: list[float], ratios: dict[str, list[float]] | None = None,
             replaced: float | None = None) -> Segment:
    recs = []
    for i, loss in enumerate(losses):
        groups = {g: {"grad_norm": 1.0, "update_ratio": (ratios or {}).get(g, [0.01] * len(losses))[i],
                      "eps_share": 0.0, "g2_over_v_max": 2.0} for g in GROUPS}
        recs.append({"step": 10 + i, "loss": loss, "grad_norm": 1.0, "groups": groups, "max_attention_logit": 1.0,
                     "logsumexp": 5.0})
    return Segment(recs, replaced, [])


def _judge(first: Segment, logged_last: float, second: Segment | None = None) -> dict:
    steps = [r["step"] for r in first.records]
    logged = {s: r["loss"] for s, r in zip(steps, first.records, strict=True)}
    logged[steps[-1]] = logged_last
    return judge(steps[-1], CK, first, second or copy.deepcopy(first), logged, {}, 99, False, None)


@pytest.mark.parametrize(("rel", "reproduced"), [(REPRO_REL * 0.99, True), (REPRO_REL * 1.01, False)])
def test_reproduced_at_the_tolerance(rel: float, reproduced: bool) -> None:
    seg = _segment([3.0, 3.0, 3.0, 6.0], replaced=3.0)
    r = _judge(seg, 6.0 / (1 - rel))  # relative to the logged loss: |6 - L| / L = rel
    assert r["reproduced"] is reproduced
    assert r["cause_class"] == ("data" if reproduced else "hardware")


@pytest.mark.parametrize(("left", "gone", "cls"), [(GONE_SHARE * 0.99, True, "data"),
                                                   (GONE_SHARE * 1.01, False, "optimizer")])
def test_spike_gone_at_the_share_left(left: float, gone: bool, cls: str) -> None:
    seg = _segment([3.0, 3.0, 3.0, 7.0], replaced=3.0 + left * 4.0)
    r = _judge(seg, 7.0)
    assert r["replaced"]["spike_gone"] is gone
    assert r["cause_class"] == cls


@pytest.mark.parametrize(("factor", "first"), [(JUMP * 0.99, None), (JUMP * 1.01, "block.0.mlp")])
def test_update_ratio_jump_names_the_first_group(factor: float, first: str | None) -> None:
    ratios = {"block.0.mlp": [0.01, 0.01, 0.01 * factor, 0.01]}
    seg = _segment([3.0, 3.0, 3.0, 3.0], ratios)
    r = _judge(seg, 3.0)
    assert r["first_group"] == first
    assert r["cause_class"] == ("optimizer" if first else "unknown")


def test_earliest_jump_wins_over_a_larger_later_one() -> None:
    ratios = {"block.0.attn": [0.01, 0.01, 0.01, 0.5], "embeddings": [0.01, 0.01, 0.04, 0.04]}
    r = _judge(_segment([3.0, 3.0, 3.0, 3.0], ratios), 3.0)
    assert r["first_group"] == "embeddings"


@pytest.mark.parametrize(("rel", "deterministic"), [(DETERMINISM_REL * 0.5, True), (DETERMINISM_REL * 2, False)])
def test_determinism_at_its_tolerance(rel: float, deterministic: bool) -> None:
    first = _segment([3.0, 3.0, 3.0, 6.0], replaced=3.0)
    second = copy.deepcopy(first)
    second.records[1]["loss"] *= 1 + rel
    r = _judge(first, 9.0, second)
    assert r["deterministic"] is deterministic
    assert r["cause_class"] == ("hardware" if deterministic else "unknown")
