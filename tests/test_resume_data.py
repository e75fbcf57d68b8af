"""The data after a resume: the recorder keeps the surviving history, and the audit counts the samples a restart
consumed twice or never in its epoch."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.detect.base import RunTables
from forensics.detect.findings import Finding
from forensics.detect.rules.resume_data import ResumeDataRule, ResumeEffect, moves_data, resume_effect, severe
from forensics.pipeline.audit import parse_fail_on, run_audit
from forensics.plan.recorder import PlanRecorder
from forensics.plan.rewinds import read_rewinds, rewind_plan
from forensics.schema import load_plan, load_samples, open_case

BATCH, BATCHES = 10, 10  # an epoch: 10 batches of 10 samples, one step each


def _epoch_plan(epoch: int, order: list[int], first_step: int) -> list[dict]:
    """Rows of one epoch whose steps consume batches ``order`` (batch b holds samples 10b..10b+9)."""
    return [
        {"step": first_step + k, "epoch": epoch, "sample_id": b * BATCH + i}
        for k, b in enumerate(order)
        for i in range(BATCH)
    ]


def _plan(restart_at: int, replayed: int) -> pd.DataFrame:
    """Three epochs of 10 steps; in epoch 1 the run resumed at step ``restart_at`` and its loader started the epoch
    again after ``replayed`` of its batches had already been consumed from ``restart_at - replayed`` on (0: a resume
    that restored the loader)."""
    rows = _epoch_plan(0, list(range(BATCHES)), 0)
    k = restart_at - 10
    order1 = list(range(k)) + list(range(k - replayed, BATCHES - replayed))
    rows += _epoch_plan(1, order1, 10)
    rows += _epoch_plan(2, list(range(BATCHES)), 20)
    return pd.DataFrame(rows)


def _restart(at: int, last: int | None = None) -> Finding:
    return Finding(
        kind="restart", step=at, details={"last_step": last if last is not None else at + 2, "resumed_at": at}
    )


def _run(plan: pd.DataFrame, loss: np.ndarray | None = None) -> RunTables:
    steps = np.arange(int(plan["step"].max()) + 1)
    loss = np.full(len(steps), 2.0) + 0.01 * (steps % 3) if loss is None else loss
    samples = pd.DataFrame({"sample_id": np.arange(100), "n_tokens": np.full(100, 8, dtype=np.int32)})
    return RunTables(
        metrics=pd.DataFrame({"step": steps, "loss": loss}),
        loss_key="loss",
        analysed=["loss"],
        plan=plan,
        samples=samples,
    )


# --- the recorder's rewind ---------------------------------------------------------------------------------------
def test_rewind_drops_the_rows_from_the_resumed_step_and_records_it(tmp_path: Path):
    with PlanRecorder(tmp_path, flush_every=3) as rec:
        for step in range(10):
            rec.record([2 * step, 2 * step + 1], epoch=0, batch_id=step, step=step, micro=0)
    record = rewind_plan(tmp_path, None, 6, sampler={"epoch": 0, "batch_id": 6, "skipped_data": True})
    assert record == {
        "rank": None,
        "last_step": 9,
        "resumed_at": 6,
        "rows_replaced": 8,
        "sampler": {"epoch": 0, "batch_id": 6, "skipped_data": True},
    }
    assert load_plan(tmp_path)["step"].tolist() == [s for s in range(6) for _ in range(2)]
    assert read_rewinds(tmp_path) == [record]
    # a resume from the last step recorded replaces nothing and records nothing
    assert rewind_plan(tmp_path, None, 6) is None and read_rewinds(tmp_path) == [record]
    with PlanRecorder(tmp_path, resume=True) as rec:  # the resumed run records its own step 6 on
        assert rec.record([100, 101], epoch=0, batch_id=6, step=6, micro=0)
    assert load_plan(tmp_path).query("step == 6")["sample_id"].tolist() == [100, 101]


# --- the decision, at its boundaries ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "restart_at, replayed, repeated, steps",
    [
        (15, 0, 0, None),  # the loader resumed where it was: nothing twice
        (15, 1, 10, [15, 15]),  # one batch consumed again
        (15, 5, 50, [15, 19]),  # the epoch started again from its first batch
        (10, 0, None, None),  # a resume at the epoch's start: nothing before it to compare
    ],
)
def test_repeated_samples_after_a_restart(restart_at, replayed, repeated, steps):
    plan = _plan(restart_at, replayed)
    effect = resume_effect(plan[plan["epoch"] == 1], restart_at, universe=100, usual_missing=0, complete=True)
    if repeated is None:
        assert effect is None
        return
    assert (effect.repeated, effect.repeated_steps, effect.skipped) == (repeated, steps, repeated)


@pytest.mark.parametrize(
    "repeated, skipped, min_samples, min_share, reported",
    [
        (0, 0, 1, 0.01, False),
        (1, 0, 1, 0.01, True),  # limit max(1, 0.01 x 100) = 1
        (0, 1, 1, 0.01, True),
        (4, 4, 1, 0.05, False),  # limit 5
        (5, 0, 1, 0.05, True),
        (0, 5, 1, 0.05, True),
        (5, 5, 6, 0.05, False),  # min_samples wins
        (0, None, 1, 0.01, False),  # an epoch the run stopped inside: no skipped count
    ],
)
def test_moves_data_boundary(repeated, skipped, min_samples, min_share, reported):
    effect = ResumeEffect(epoch=1, repeated=repeated, skipped=skipped, repeated_steps=None, epoch_samples=100)
    assert moves_data(effect, min_samples, min_share) is reported


@pytest.mark.parametrize(
    "repeated, skipped, critical",
    [
        (24, 24, False),
        (25, 0, True),
        (0, 25, True),
        (24, None, False),  # critical_share 0.25 of 100 samples
    ],
)
def test_severe_boundary(repeated, skipped, critical):
    effect = ResumeEffect(epoch=1, repeated=repeated, skipped=skipped, repeated_steps=None, epoch_samples=100)
    assert severe(effect, 0.25) is critical


@pytest.mark.parametrize("replayed, severity", [(2, "warning"), (3, "critical")])
def test_severity_follows_the_share_moved(replayed, severity):
    from forensics.detect.causes.severity import assign_severities

    found = ResumeDataRule().detect(_run(_plan(15, replayed)), [_restart(15)])
    assign_severities(found)
    assert [(f.details["repeated"], f.severity) for f in found] == [(10 * replayed, severity)]


@pytest.mark.parametrize("missing_elsewhere, skipped", [(0, 30), (3, 27)])
def test_skipped_beyond_the_usual_misses_of_the_other_epochs(missing_elsewhere, skipped):
    plan = _plan(13, 3)  # 3 batches again, the epoch's last 3 never
    drop = set(range(missing_elsewhere))  # a dropped last batch in every epoch that is not the resumed one
    plan = plan[~((plan["epoch"] != 1) & plan["sample_id"].isin(drop))]
    found = ResumeDataRule().detect(_run(plan), [_restart(13)])
    assert [(f.details["repeated"], f.details["skipped"], f.details["repeated_steps"]) for f in found] == [
        (30, skipped, [13, 15])
    ]


def test_rule_is_quiet_without_a_restart_or_when_the_loader_resumed():
    assert ResumeDataRule().detect(_run(_plan(15, 5)), []) == []
    assert ResumeDataRule().detect(_run(_plan(15, 0)), [_restart(15)]) == []


@pytest.mark.parametrize("rise, moved", [(0.07, False), (0.09, True)])
def test_loss_moved_boundary(rise, moved):
    # the loss repeats +a, +a, -2a (a = 0.01): its noise SD is 1.4826 x 3a / sqrt 2 = 0.0314, z = 2 puts the limit at
    # 0.0629 above the median before the restart (2.01); the repeated steps 15-19 average 2.0 + rise, rise - 0.01
    # above it (0.060 and 0.080)
    steps = np.arange(30)
    loss = 2.0 + 0.01 * np.where(steps % 3 < 2, 1.0, -2.0)
    loss[15:20] = 2.0 + rise
    loss[15:20] += 0.01 * np.array([1, -1, 0, 1, -1])
    found = ResumeDataRule().detect(_run(_plan(15, 5), loss), [_restart(15)])
    assert [f.details["loss_moved"] for f in found] == [moved]


# --- real Trainer runs --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def resumed_runs():
    """Real Trainer runs (tiny GPT-2 on CPU, fixtures/hf_runs.py) preempted after step 35 and resumed from
    checkpoint-30: once as they should, once with ignore_data_skip=True."""
    pytest.importorskip("transformers")
    from fixtures.hf_runs import hf_runs

    return hf_runs(("resumed_mid", "resumed_no_skip"))


def _surviving(run) -> dict[int, list[list[int]]]:
    """What compute_loss received, per step, from the process that consumed the step last."""
    out: dict[int, list[list[int]]] = {}
    for o in run.observed:
        out[o["step"]] = o["rows"]
    return out


def _truth(run, epoch_steps: range, restart_at: int) -> tuple[int, int, list[int]]:
    """(repeated, skipped, [first, last] step) in the epoch, counted on the tokens compute_loss received (rows with
    the same tokens are counted as many times as the dataset holds them)."""
    from fixtures.hf_runs import make_samples

    rows = _surviving(run)
    before = Counter(tuple(r) for s in epoch_steps if s < restart_at for r in rows[s])
    again = [s for s in epoch_steps if s >= restart_at for r in rows[s] if tuple(r) in before]
    consumed = Counter(tuple(r) for s in epoch_steps for r in rows[s])
    dataset = Counter(tuple(r["input_ids"]) for r in make_samples())
    return len(again), sum((dataset - consumed).values()), [min(again), max(again)] if again else None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resumed_mid", "resumed_no_skip"])
def test_recorded_plan_is_what_the_surviving_run_consumed(resumed_runs, name):
    run = resumed_runs[name]
    samples = load_samples(run.out / "samples.parquet")
    tokens = {int(i): [int(t) for t in ids] for i, ids in zip(samples["sample_id"], samples["input_ids"])}
    plan = load_plan(run.out / "plan", samples)
    recorded = {int(s): [tokens[i] for i in g["sample_id"]] for s, g in plan.groupby("step")}
    surviving = _surviving(run)
    assert sorted(surviving) == list(range(60)) and recorded == surviving
    assert sum(1 for o in run.observed if o["step"] in range(30, 35)) == 10  # steps 30-34 were consumed twice
    skipped = name == "resumed_mid"
    assert read_rewinds(run.out / "plan") == [
        {
            "rank": None,
            "last_step": 34,
            "resumed_at": 30,
            "rows_replaced": 40,
            "sampler": {"epoch": 1, "batch_id": 10 if skipped else 0, "skipped_data": skipped},
        }
    ]


@pytest.mark.slow
def test_resume_that_restarted_the_epoch_counts_repeated_and_skipped_samples(resumed_runs):
    run = resumed_runs["resumed_no_skip"]
    repeated, skipped, steps = _truth(run, range(20, 40), 30)
    assert (repeated, skipped, steps) == (80, 80, [30, 39])
    findings = run_audit(open_case(str(run.out))).findings
    found = [f for f in findings["findings"] if f["kind"] == "resume_data"]
    assert [
        (
            f["severity"],
            f["step"],
            f["details"]["restart_step"],
            f["details"]["resumed_at"],
            f["details"]["epoch"],
            f["details"]["repeated"],
            f["details"]["skipped"],
            f["details"]["repeated_steps"],
        )
        for f in found
    ] == [("critical", 30, 34, 30, 1, repeated, skipped, steps)]
    assert isinstance(found[0]["details"]["loss_moved"], bool)
    assert [
        (f["details"]["last_step"], f["details"]["resumed_at"]) for f in findings["findings"] if f["kind"] == "restart"
    ] == [(34, 30)]
    assert [c["kind"] for c in findings["causes"] if c["kind"] == "resume_data"] == ["resume_data"]


@pytest.mark.slow
def test_resume_that_restored_the_loader_is_quiet(resumed_runs):
    run = resumed_runs["resumed_mid"]
    assert _truth(run, range(20, 40), 30)[:2] == (0, 0)
    findings = run_audit(open_case(str(run.out))).findings
    assert [f["kind"] for f in findings["findings"] if f["kind"] == "resume_data"] == []
    assert [
        (f["details"]["last_step"], f["details"]["resumed_at"]) for f in findings["findings"] if f["kind"] == "restart"
    ] == [(34, 30)]


@pytest.mark.slow
def test_fail_on_resume_data(resumed_runs, tmp_path: Path):
    assert parse_fail_on("resume-data") == ["resume-data"]
    run = resumed_runs["resumed_no_skip"]
    code = subprocess.run(
        [
            sys.executable,
            "-m",
            "forensics",
            "audit",
            str(run.out),
            "--json",
            str(tmp_path / "f.json"),
            "--html",
            str(tmp_path / "r.html"),
            "--fail-on",
            "resume-data",
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    ).returncode
    assert code == 1
    assert [
        f["kind"] for f in json.loads((tmp_path / "f.json").read_text())["findings"] if f["kind"] == "resume_data"
    ] == ["resume_data"]
