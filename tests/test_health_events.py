"""Run-health events: restarts from rewinds, crash lines from the text logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forensics.detect.rules.restart import resume_differs
from forensics.pipeline.audit import run_audit
from forensics.schema import open_case
from forensics.sources.crash_logs import crash_lines

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real-logs"


def _audit(tmp_path: Path, name: str, text: str):
    (tmp_path / name).write_text(text)
    return run_audit(open_case(None, overrides={"metrics": [str(tmp_path / name)]})).findings


def _kinds(findings, kind):
    return [f for f in findings["findings"] if f["kind"] == kind]


def test_resumed_jsonl_is_one_restart(tmp_path):
    rows = [{"step": s, "loss": 2.0 - s * 0.001} for s in range(100)]
    rows += [{"step": s, "loss": 2.0 - s * 0.001} for s in range(80, 150)]
    found = _kinds(_audit(tmp_path, "m.jsonl", "\n".join(map(json.dumps, rows)) + "\n"), "restart")
    assert [(f["details"]["last_step"], f["details"]["resumed_at"], f["severity"]) for f in found] == [(99, 80, "info")]


def test_resume_with_other_values_is_a_warning(tmp_path):
    rows = [{"step": s, "loss": 2.0 + 0.01 * (s % 2)} for s in range(100)]
    rows += [{"step": s, "loss": 3.0} for s in range(80, 150)]
    found = _kinds(_audit(tmp_path, "m.jsonl", "\n".join(map(json.dumps, rows)) + "\n"), "restart")
    assert [(f["details"]["last_step"], f["details"]["resumed_at"], f["severity"]) for f in found] == [
        (99, 80, "warning")
    ]


@pytest.mark.parametrize(
    "diff, noise, k, expected",
    [(0.30, 0.1, 3.0, False), (0.31, 0.1, 3.0, True), (0.0, 0.0, 3.0, False), (0.01, 0.0, 3.0, True)],
)
def test_resume_differs_boundary(diff, noise, k, expected):
    assert resume_differs([(5, 1.0, 1.0 + diff)], noise, k)[0] is expected


OOM_TAIL = """step 1398 | loss 2.31 | 412.0 ms
step 1399 | loss 2.30 | 411.8 ms
Traceback (most recent call last):
  File "train_gpt2.py", line 700, in <module>
    loss.backward()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.
"""
NCCL_TAIL = """ iteration     7220/  100000 | lm loss: 2.101E+00 | grad norm: 0.310 |
[rank3]:[E ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)
"""


@pytest.mark.parametrize(
    "text, what, step",
    [
        (OOM_TAIL, "oom", 1399),
        (NCCL_TAIL, "nccl", 7220),
        ("step 5 loss 1.0\nRuntimeError: CUDA error: cudaErrorECCUncorrectable\n", "ecc", 5),
        ("step 9 loss 1.0\nAssertionError: loss is nan\n", "nonfinite", 9),
        ("step 3 loss 1.0\nslurmstepd: error: Detected 1 oom_kill event\n", "killed", 3),
        ("step 3 loss 1.0\nTraceback (most recent call last):\n  File 'x'\nKeyError: 'a'\n", "traceback", 3),
    ],
)
def test_crash_kinds(tmp_path, text, what, step):
    (tmp_path / "train.log").write_text(text)
    found = crash_lines(str(tmp_path / "train.log"))
    assert [(c.what, c.logged_step) for c in found] == [(what, step)]


def test_crash_in_a_text_source_is_critical(tmp_path):
    found = _kinds(_audit(tmp_path, "train.log", OOM_TAIL), "crash")
    assert [(f["step"], f["details"]["what"], f["severity"]) for f in found] == [(1399, "oom", "critical")]


@pytest.mark.parametrize("name", ["bloom-176b-tr11-megatron.log", "modded-nanogpt-1b-adamw.log"])
def test_real_logs_have_no_crash_and_no_restart(name):
    findings = run_audit(open_case(None, overrides={"metrics": [str(REAL / name)]})).findings
    assert _kinds(findings, "crash") == [] and _kinds(findings, "restart") == []


def test_audit_takes_pattern(tmp_path):
    import os
    import subprocess
    import sys

    (tmp_path / "p.log").write_text("it 1 L=2.5\nit 2 L=2.4\nit 3 L=2.3\nit 4 L=2.2\n")
    out = tmp_path / "f.json"
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "forensics",
            "audit",
            "--metrics",
            str(tmp_path / "p.log"),
            "--pattern",
            r"it (?P<step>\d+) L=(?P<loss>[\d.]+)",
            "--json",
            str(out),
        ],
        env=env,
        capture_output=True,
    )
    assert r.returncode == 0
    assert json.loads(out.read_text())["run"]["loss_key"] == "loss"


def test_resumed_text_log_is_one_restart(tmp_path):
    lines = [f"step {s} loss {2.0 - s * 0.001:.4f}" for s in range(1, 121)]
    lines += [f"step {s} loss {2.0 - s * 0.001:.4f}" for s in range(101, 200)]  # resumed from checkpoint 100
    found = _kinds(_audit(tmp_path, "train.log", "\n".join(lines) + "\n"), "restart")
    assert [(f["details"]["last_step"], f["details"]["resumed_at"], f["severity"]) for f in found] == [
        (120, 101, "info")
    ]


FIXTURE_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


@pytest.mark.parametrize(
    "name, last_step, resumed_at, logged",
    [
        ("bigscience-tr8-104b-rollback.log", 7219, 6899, 6900),  # Megatron counts iterations from 1
        ("nanogpt-resumed.log", 1130, 1000, 1000),
    ],
)
def test_real_format_text_log_that_goes_back_is_one_restart(name, last_step, resumed_at, logged):
    findings = run_audit(open_case(None, overrides={"metrics": [str(FIXTURE_LOGS / name)]})).findings
    found = _kinds(findings, "restart")
    assert [
        (f["details"]["last_step"], f["details"]["resumed_at"], f["step"], f.get("logged_step", f["step"]))
        for f in found
    ] == [(last_step, resumed_at, resumed_at, logged)]
    assert found[0]["details"]["source"].endswith(name)


def test_resumed_wandb_offline_run_is_one_restart_with_other_values(wandb_runs):
    """The writer's ``resumed1``: 60 steps, then resumed with the same id from step 0 logging 1000 + i."""
    findings = run_audit(open_case(None, overrides={"metrics": [str(wandb_runs / "multi" / "wandb")]})).findings
    found = _kinds(findings, "restart")
    assert [(f["details"]["last_step"], f["details"]["resumed_at"], f["severity"]) for f in found] == [
        (59, 0, "warning")
    ]


@pytest.mark.parametrize(
    "name", ["divergence", "overfitting", "plateau", "lr-schedule", "restart", "throughput", "memory", "crash"]
)
def test_every_run_health_kind_is_a_fail_on_name(name):
    from forensics.pipeline.audit import parse_fail_on

    assert parse_fail_on(name) == [name]


def test_fail_on_crash_exits_1_on_a_log_ending_in_an_oom(tmp_path, capsys):
    from forensics.cli import main

    (tmp_path / "train.log").write_text(OOM_TAIL)
    assert main(["audit", "--metrics", str(tmp_path / "train.log"), "--no-html", "--fail-on", "crash"]) == 1
    assert "(oom) after step 1399" in capsys.readouterr().out
