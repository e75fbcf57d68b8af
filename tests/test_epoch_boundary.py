"""Spikes that come with each epoch: the loss jumping within a few steps of every epoch's start."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.detect.base import RunTables
from forensics.detect.rules.epoch_boundary import EpochBoundaryRule, epoch_starts
from forensics.pipeline.audit import parse_fail_on, run_audit
from forensics.schema import open_case

EPOCH = 120  # steps per epoch


def _loss(
    epochs: int, jump: float, *, at: int = 0, every: set[int] | None = None, seed: int = 0, extra_spikes: int = 0
) -> np.ndarray:
    """A falling loss with noise 0.02; epochs in ``every`` (default all after the first) jump by ``jump`` for three
    steps from ``at`` steps after their start (their hardest batches come first); ``extra_spikes`` spikes of the same
    height land at random steps."""
    rng = np.random.default_rng(seed)
    n = epochs * EPOCH
    s = np.arange(n)
    loss = 3.0 * np.exp(-s / 2000) + rng.normal(0, 0.02, n)
    for e in every if every is not None else range(1, epochs):
        loss[e * EPOCH + at : e * EPOCH + at + 3] += jump
    for i in rng.integers(EPOCH, n - 5, extra_spikes):
        loss[i] += jump
    return loss


def _run(loss: np.ndarray) -> RunTables:
    n = len(loss)
    metrics = pd.DataFrame({"step": np.arange(n), "loss": loss, "epoch": np.arange(n) / EPOCH})
    return RunTables(metrics=metrics, loss_key="loss", analysed=["loss"])


@pytest.mark.parametrize(
    "jump, at, every, expected",
    [
        (0.5, 0, None, ([1, 2, 3, 4], 0)),  # every epoch opens on its hardest batches
        (0.5, 3, None, ([1, 2, 3, 4], 3)),  # a few steps in: the offset says where
        (0.5, 0, {1, 3}, ([1, 3], 0)),  # half the epochs: at the share
        (0.5, 0, {2}, None),  # one epoch is not a pattern
    ],
)
def test_epoch_start_jumps(jump, at, every, expected):
    out = EpochBoundaryRule().detect(_run(_loss(5, jump, at=at, every=every)))
    assert [(f.details["epochs"], f.details["offset"]) for f in out] == ([expected] if expected else [])
    if expected:
        assert out[0].details["steps"] == [e * EPOCH for e in expected[0]]


@pytest.mark.parametrize("jump, found", [(0.124, False), (0.128, True)])
def test_jump_height_boundary(jump, found):
    # a flat loss whose noise repeats +a, +a, -2a (a = 0.01): its changes are 0, -3a, +3a, so its noise SD is
    # 1.4826 x 3a / sqrt 2 = 0.03145; the median before a start is 2 + a and the peak after it 2 + a + jump: the
    # score is jump / 0.03145, and z = 4 sits between 0.124 (3.94) and 0.128 (4.07)
    n = 5 * EPOCH
    loss = 2.0 + 0.01 * np.where(np.arange(n) % 3 < 2, 1.0, -2.0)
    for e in range(1, 5):
        loss[e * EPOCH : e * EPOCH + 3] += jump
    out = EpochBoundaryRule(z=4.0).detect(_run(loss))
    assert [f.details["epochs"] for f in out] == ([[1, 2, 3, 4]] if found else [])


def test_a_run_spiking_anywhere_is_not_an_epoch_pattern():
    # 40 spikes over 600 steps: two of them on epoch starts are what chance gives such a run
    loss = _loss(5, 0.5, every={1, 3}, extra_spikes=40, seed=3)
    assert EpochBoundaryRule().detect(_run(loss)) == []


def test_epoch_starts_from_the_plan_tags_first():
    run = _run(_loss(3, 0.0))
    run.tags = pd.DataFrame({"step": np.arange(360), "epoch": np.repeat([0, 1, 2], [100, 130, 130])})
    assert epoch_starts(run) == {0: 0, 1: 100, 2: 230}
    run.tags = None
    assert epoch_starts(run) == {0: 0, 1: 120, 2: 240}


def test_epoch_boundary_in_a_jsonl_audit_and_fail_on(tmp_path: Path):
    loss = _loss(5, 0.6)
    rows = [{"step": s + 1, "loss": float(loss[s]), "epoch": round((s + 1) / EPOCH, 4)} for s in range(len(loss))]
    (tmp_path / "m.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    findings = run_audit(open_case(None, overrides={"metrics": [str(tmp_path / "m.jsonl")]})).findings
    found = [f for f in findings["findings"] if f["kind"] == "epoch_boundary"]
    assert [(f["severity"], f["details"]["epochs"]) for f in found] == [("warning", [1, 2, 3, 4])]
    assert "set_epoch" in " ".join(found[0]["evidence"])
    assert [c["kind"] for c in findings["causes"] if c["kind"] == "epoch_boundary"] == ["epoch_boundary"]
    assert parse_fail_on("epoch-boundary") == ["epoch-boundary"]


@pytest.fixture(scope="module")
def epoch_order_run():
    """A real Trainer run (tiny GPT-2 on CPU, fixtures/hf_runs.py) whose sampler restarts one order every epoch,
    the corrupted near-duplicates' batch first."""
    pytest.importorskip("transformers")
    from fixtures.hf_runs import hf_runs

    return hf_runs(("epoch_order",))["epoch_order"]


def test_hf_run_whose_order_restarts_each_epoch_beside_the_gate(epoch_order_run):
    from fixtures.hf_runs import CORRUPT_LEN

    truth = [o["step"] for o in epoch_order_run.observed if any(len(r) == CORRUPT_LEN for r in o["rows"])]
    assert truth == [0, 20, 40, 60, 80]  # what the trainer consumed: the hardest batch opens every epoch
    findings = run_audit(open_case(str(epoch_order_run.out))).findings
    found = [f for f in findings["findings"] if f["kind"] == "epoch_boundary"]
    assert [(f["details"]["epochs"], f["details"]["steps"], f["details"]["offset"], f["severity"]) for f in found] == [
        ([1, 2, 3, 4], [20, 40, 60, 80], 0, "warning")
    ]
    assert "The plan agrees: the plan shows each epoch in the same order" in " ".join(found[0]["evidence"])
    assert [f["kind"] for f in findings["findings"] if f["kind"] == "static_plan"] == ["static_plan"]
