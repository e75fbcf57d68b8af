"""Run-health events from the run's own gauges: a lasting slowdown (throughput) and a steady memory growth."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.audit import run_audit
from forensics.detect.base import RunTables
from forensics.detect.rules.memory import MemoryRule
from forensics.detect.rules.throughput import ThroughputRule, find_slowdown, speed_metric
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
        [(150, "step_time", round(slow, 4))] if found else [])


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
    run = _run(train_time=np.arange(n) * 400.0, eval_samples_per_second=np.r_[np.full(100, 50.0), np.full(100, 5.0)],
               step_avg=np.full(n, 400.0))
    assert speed_metric(run) == ("step_avg", False)
    assert ThroughputRule().detect(run) == []


def test_step_time_doubling_in_a_jsonl_audit(tmp_path):
    rng = np.random.default_rng(3)
    rows = [{"step": s, "loss": 3.0 - s / 3000 + float(rng.normal(0, 0.01)),
             "step_time_ms": float((412.0 if s < 1800 else 824.0) + rng.normal(0, 8))} for s in range(2400)]
    found = _kinds(_audit(tmp_path, rows), "throughput")
    assert [(f["step"], f["severity"], f["details"]["metric"], round(f["details"]["factor"], 1)) for f in found] == [
        (1800, "warning", "step_time_ms", 2.0)]


def test_steady_control_is_quiet(tmp_path):
    rng = np.random.default_rng(4)
    rows = [{"step": s, "loss": 3.0 - s / 3000 + float(rng.normal(0, 0.01)),
             "tokens_per_s": float(rng.normal(5e4, 900)),
             "memory_allocated": float(rng.normal(30.0, 0.05))} for s in range(2400)]
    rows[0]["tokens_per_s"] = 900.0  # the first step compiles
    findings = _audit(tmp_path, rows)
    assert _kinds(findings, "throughput") == [] and _kinds(findings, "memory") == []


@pytest.mark.parametrize("name, metric", [("bloom-176b-tr11-megatron.log", None),
                                          ("modded-nanogpt-1b-adamw.log", "step_avg")])
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
    return line + e * np.sqrt(var_line * (1 - r2) / r2 / float((e ** 2).sum()))


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
    assert [(f.details["metric"], f.details["r2"]) for f in out] == ([("gpu_mem", r2)] if found else [])


@pytest.mark.parametrize("device_gb, unit_values, projected", [
    (80.0, 1.0, 7000),  # GiB: 10 + 0.01 * step reaches 80 at step 7000
    (80.0, 1024.0, 7000),  # the same in MiB (read from the size)
    (None, 1.0, 399),  # no device memory: the step of the largest value
    (12.0, 1.0, 200),  # already reached: the first logged step at or above it
])
def test_memory_projected_step(device_gb, unit_values, projected):
    mem = (10.0 + 0.01 * np.arange(400)) * unit_values
    run = _run(mem=mem)
    run.device_memory_gb = device_gb
    out = MemoryRule().detect(run)
    assert [(f.details["projected_step"], round(f.details["slope_per_step"] / unit_values, 6)) for f in out] == [
        (projected, 0.01)]


def test_memory_leak_in_a_jsonl_audit(tmp_path):
    rng = np.random.default_rng(5)
    rows = [{"step": s, "loss": 3.0 - s / 3000 + float(rng.normal(0, 0.01)),
             "memory_allocated": float((2.0 if s == 0 else 30.0 + 0.01 * s) + rng.normal(0, 0.05))}
            for s in range(2000)]
    peak = max(rows, key=lambda r: r["memory_allocated"])["step"]
    found = _kinds(_audit(tmp_path, rows), "memory")
    assert [(f["step"], f["severity"], f["details"]["metric"], round(f["details"]["slope_per_step"], 3),
             f["details"]["projected_step"]) for f in found] == [(200, "warning", "memory_allocated", 0.01, peak)]
    assert peak == 1996
