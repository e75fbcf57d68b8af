"""Run-health events from the run's own gauges: a lasting slowdown (throughput) and a steady memory growth."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.detect.base import RunTables
from forensics.detect.rules.memory import MemoryRule
from forensics.detect.rules.throughput import ThroughputRule, find_slowdown, speed_metric
from forensics.pipeline.audit import run_audit
from forensics.schema import open_case

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real-logs"


def _run(**cols) -> RunTables:
    n = len(next(iter(cols.values())))
    frame = pd.DataFrame({"step": np.arange(n), "loss": np.linspace(3.0, 2.0, n), **cols})
    return RunTables(metrics=frame, loss_key="loss", analysed=["loss"])


def _audit(tmp_path: Path, rows: list[dict]) -> dict:
    (tmp_path / "m.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    return run_audit(open_case(None, overrides={"metrics": [str(tmp_path / "m.jsonl")]})).findings


def _kinds(findings: dict, kind: str) -> list[dict]:
    return [f for f in findings["findings"] if f["kind"] == kind]


@pytest.mark.parametrize("slow, found", [(1.49, False), (1.51, True)])
def test_throughput_factor_boundary(slow, found):
    tps = np.r_[np.full(100, 1000.0), np.full(100, 1000.0 / slow)]
    out = ThroughputRule(factor=1.5).detect(_run(tokens_per_s=tps))
    assert [(f.step, f.details["factor"]) for f in out] == ([(100, round(slow, 4))] if found else [])


@pytest.mark.parametrize("slow, found", [(1.49, False), (1.51, True)])
def test_step_time_factor_boundary(slow, found):
    dt = np.r_[np.full(150, 0.4), np.full(50, 0.4 * slow)]
    out = ThroughputRule(factor=1.5).detect(_run(step_time=dt))
    assert [(f.step, f.details["metric"], f.details["factor"]) for f in out] == (
        [(150, "step_time", round(slow, 4))] if found else []
    )


@pytest.mark.parametrize("later, factor", [(4, 1.0), (6, 3.0), (20, 3.0)])
def test_slowdown_min_share_boundary(later, factor):
    # 5% of 200 values is 10: the slower level must hold most of the last 10 values to be lasting
    dt = np.r_[np.full(200 - later, 1.0), np.full(later, 3.0)]
    hit = find_slowdown(dt, higher_is_faster=False, min_share=0.05)
    assert hit is not None and (hit.factor, hit.index) == (factor, min(190, 200 - later))


def test_speedup_is_not_a_slowdown():
    assert find_slowdown(np.r_[np.full(100, 2.0), np.full(100, 1.0)], higher_is_faster=False, min_share=0.05) is None


def test_cumulative_timer_and_eval_rates_are_passed_over():
    n = 200
    run = _run(
        train_time=np.arange(n) * 400.0,
        eval_samples_per_second=np.r_[np.full(100, 50.0), np.full(100, 5.0)],
        step_avg=np.full(n, 400.0),
    )
    assert speed_metric(run) == ("step_avg", False)
    assert ThroughputRule().detect(run) == []


def test_step_time_doubling_in_a_jsonl_audit(tmp_path):
    rng = np.random.default_rng(3)
    rows = [
        {
            "step": s,
            "loss": 3.0 - s / 3000 + float(rng.normal(0, 0.01)),
            "step_time_ms": float((412.0 if s < 1800 else 824.0) + rng.normal(0, 8)),
        }
        for s in range(2400)
    ]
    found = _kinds(_audit(tmp_path, rows), "throughput")
    assert [(f["step"], f["severity"], f["details"]["metric"], round(f["details"]["factor"], 1)) for f in found] == [
        (1800, "warning", "step_time_ms", 2.0)
    ]


def test_steady_control_is_quiet(tmp_path):
    rng = np.random.default_rng(4)
    rows = [
        {
            "step": s,
            "loss": 3.0 - s / 3000 + float(rng.normal(0, 0.01)),
            "tokens_per_s": float(rng.normal(5e4, 900)),
            "memory_allocated": float(rng.normal(30.0, 0.05)),
        }
        for s in range(2400)
    ]
    rows[0]["tokens_per_s"] = 900.0  # the first step compiles
    findings = _audit(tmp_path, rows)
    assert _kinds(findings, "throughput") == [] and _kinds(findings, "memory") == []


@pytest.mark.parametrize(
    "name, metric", [("bloom-176b-tr11-megatron.log", None), ("modded-nanogpt-1b-adamw.log", "step_avg")]
)
def test_real_logs_have_no_slowdown_and_no_leak(name, metric):
    findings = run_audit(open_case(None, overrides={"metrics": [str(REAL / name)]})).findings
    assert _kinds(findings, "throughput") == [] and _kinds(findings, "memory") == []
    assert findings["health"]["throughput"].get("metric") == metric


def _line_with_r2(n: int, slope: float, start: float, r2: float) -> np.ndarray:
    """A line plus a residual orthogonal to it, scaled so the fitted line explains exactly ``r2`` of the variance."""
    x = np.arange(n, dtype=float)
    e = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    basis = np.c_[np.ones(n), x]
    e -= basis @ np.linalg.lstsq(basis, e, rcond=None)[0]
    line = start + slope * x
    var_line = float(((line - line.mean()) ** 2).sum())
    return line + e * np.sqrt(var_line * (1 - r2) / r2 / float((e**2).sum()))


@pytest.mark.parametrize("rise, found", [(0.099, False), (0.101, True)])
def test_memory_growth_boundary(rise, found):
    # 200 values, the first 20 skipped: the line over steps 20-199 rises by `rise` of its level at step 20
    mem = np.r_[np.full(20, 10.0), 10.0 + 10.0 * rise * np.arange(180) / 179]
    out = MemoryRule(growth=0.1, r2=0.8).detect(_run(memory_allocated=mem))
    assert [(f.step, round(f.details["growth"], 4)) for f in out] == ([(20, rise)] if found else [])


@pytest.mark.parametrize("r2, found", [(0.79, False), (0.81, True)])
def test_memory_r2_boundary(r2, found):
    mem = np.r_[np.full(20, 10.0), _line_with_r2(180, 0.02, 10.0, r2)]
    out = MemoryRule(growth=0.1, r2=0.8).detect(_run(gpu_mem=mem))
    # the line explains exactly `r2`; the best hinge (a later onset) may explain a hair more, never a hundredth
    assert [(f.details["metric"], round(f.details["r2"], 2)) for f in out] == ([("gpu_mem", r2)] if found else [])


@pytest.mark.parametrize(
    "device_gb, unit_values, projected",
    [
        (80.0, 1.0, 7000),  # GiB: 10 + 0.01 * step reaches 80 at step 7000
        (80.0, 1024.0, 7000),  # the same in MiB (read from the size)
        (None, 1.0, 399),  # no device memory: the step of the largest value
        (12.0, 1.0, 200),  # already reached: the first logged step at or above it
    ],
)
def test_memory_projected_step(device_gb, unit_values, projected):
    mem = (10.0 + 0.01 * np.arange(400)) * unit_values
    run = _run(mem=mem)
    run.device_memory_gb = device_gb
    out = MemoryRule().detect(run)
    assert [(f.details["projected_step"], round(f.details["slope_per_step"] / unit_values, 6)) for f in out] == [
        (projected, 0.01)
    ]


def test_memory_leak_in_a_jsonl_audit(tmp_path):
    rng = np.random.default_rng(5)
    rows = [
        {
            "step": s,
            "loss": 3.0 - s / 3000 + float(rng.normal(0, 0.01)),
            "memory_allocated": float((2.0 if s == 0 else 30.0 + 0.01 * s) + rng.normal(0, 0.05)),
        }
        for s in range(2000)
    ]
    peak = max(rows, key=lambda r: r["memory_allocated"])["step"]
    found = _kinds(_audit(tmp_path, rows), "memory")
    assert [
        (
            f["severity"],
            f["details"]["metric"],
            round(f["details"]["slope_per_step"], 3),
            f["details"]["projected_step"],
        )
        for f in found
    ] == [("warning", "memory_allocated", 0.01, peak)]
    # it leaks from the first step; the rule sees from the end of the skipped start (step 200) on
    assert abs(found[0]["step"] - 200) <= 0.05 * 2000
    assert peak == 1996


def _leak(n: int, onset: int, seed: int = 0) -> np.ndarray:
    """Memory that fills at the first step, holds its level (30 GiB), then leaks steadily from ``onset`` (30 GiB
    over the whole run's length, whatever it is), with noise."""
    rng = np.random.default_rng(seed)
    steps = np.arange(n)
    mem = 30.0 + 30.0 * np.maximum(0, steps - onset) / n + rng.normal(0, 0.05, n)
    mem[0] = 2.0
    return mem


@pytest.mark.parametrize("n, onset", [(3000, 1000), (3000, 400), (3000, 2000), (1000, 150), (10000, 7000), (500, 300)])
def test_memory_leak_is_located_at_its_onset(n, onset):
    out = MemoryRule().detect(_run(memory_allocated=_leak(n, onset)))
    assert len(out) == 1
    assert abs(out[0].step - onset) <= 0.01 * n
    assert round(out[0].details["slope_per_step"] * n, 1) == 30.0  # the slope after the onset, not a line's


@pytest.mark.parametrize("n, onset", [(3000, 1000), (2000, 1200)])
def test_planted_leak_in_a_jsonl_audit_within_5_percent_of_its_onset(tmp_path, n, onset):
    mem = _leak(n, onset, seed=n)
    rows = [{"step": s, "loss": 3.0 - s / 3000, "memory_allocated": float(mem[s])} for s in range(n)]
    found = _kinds(_audit(tmp_path, rows), "memory")
    assert [f["severity"] for f in found] == ["warning"]
    assert abs(found[0]["step"] - onset) <= 0.05 * n


@pytest.mark.parametrize(
    "tail, steps",
    [
        (12, [187]),  # flat 10.0 until step 187, then +0.5 a step: the onset is where the growth began
        (9, [190]),  # 5% of the 180 fitted values is 9: an onset with 9 values after it is allowed ...
        (8, [190]),  # ... one with 8 is not: the latest onset the share allows, a step early
        (3, []),  # a rise over the last 3 steps: no hinge the share allows explains 80% of the variance
    ],
)
def test_memory_onset_min_share_boundary(tail, steps):
    mem = np.r_[np.full(200 - tail, 10.0), 10.0 + 0.5 * np.arange(1, tail + 1)]
    out = MemoryRule(min_share=0.05).detect(_run(memory_allocated=mem))
    assert [f.step for f in out] == steps


@pytest.mark.parametrize("n, onset, slow", [(3000, 1000, 2.0), (3000, 2500, 1.6), (800, 100, 3.0), (10000, 4000, 1.8)])
def test_throughput_drop_is_located_at_its_onset(n, onset, slow):
    rng = np.random.default_rng(onset)
    dt = np.where(np.arange(n) < onset, 0.4, 0.4 * slow) * np.exp(rng.normal(0, 0.03, n))
    dt[rng.integers(0, n, n // 100)] *= 5.0  # checkpoint saves: one slow step now and then
    out = ThroughputRule().detect(_run(step_time=dt))
    assert len(out) == 1 and abs(out[0].step - onset) <= 0.01 * n
