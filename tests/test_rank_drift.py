"""Ranks: per-rank metrics read from their names, a rank drifting from the others, and the ranks a spike was on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.detect.rules.rank_drift import drift_factors, max_avg_pairs, rank_metrics, spiking_ranks
from forensics.pipeline.audit import parse_fail_on, run_audit
from forensics.schema import open_case

N = 400


def test_rank_metrics_from_names():
    cols = [
        "loss",
        "rank0/loss",
        "rank_1/loss",
        "step_time/rank-0",
        "step_time/rank-1",
        "train/loss_rank2",
        "train/loss_rank3",
        "grad_norm/rank0",
        "ranking/score",
    ]
    assert rank_metrics(cols) == {
        "loss": {0: "rank0/loss", 1: "rank_1/loss"},
        "step_time": {0: "step_time/rank-0", 1: "step_time/rank-1"},
        "train/loss": {2: "train/loss_rank2", 3: "train/loss_rank3"},
    }


@pytest.mark.parametrize("slow_by, factor", [(1.0, 1.0), (1.5, 1.5), (2.0, 2.0)])
def test_drift_factor_is_the_ratio_to_the_others_over_the_tail(slow_by, factor):
    t = np.full((N, 4), 0.5)
    t[N // 2 :, 2] *= slow_by  # rank 2 slows down half-way
    factors = drift_factors(pd.DataFrame(t, columns=[0, 1, 2, 3]), tail=0.5)
    assert factors == pytest.approx({0: 1.0, 1: 1.0, 2: factor, 3: 1.0})


def test_spiking_ranks_names_the_rank_whose_value_jumped():
    rng = np.random.default_rng(0)
    v = 2.0 + rng.normal(0, 0.02, (N, 3))
    v[300, 1] += 1.0
    assert spiking_ranks(pd.DataFrame(v, columns=[0, 1, 2]), np.arange(N), 300, window=20, z=4.0) == [1]


def _jsonl(path: Path, time_factor: float, spike_rank: int | None) -> Path:
    """Two ranks logging loss and step time (and the mean loss); rank 1's step time is ``time_factor`` x rank 0's
    from step 200; a loss spike at step 300 on ``spike_rank`` only."""
    rng = np.random.default_rng(1)
    rows = []
    for s in range(N):
        base = 3.0 * np.exp(-s / 300)
        loss = [base + rng.normal(0, 0.02) for _ in range(2)]
        if spike_rank is not None and s == 300:
            loss[spike_rank] += 3.0
        time = [0.5 + rng.normal(0, 0.005), (0.5 if s < 200 else 0.5 * time_factor) + rng.normal(0, 0.005)]
        rows.append(
            {
                "step": s,
                "loss": float(np.mean(loss)),
                "rank0/loss": loss[0],
                "rank1/loss": loss[1],
                "rank0/step_time": time[0],
                "rank1/step_time": time[1],
            }
        )
    path.write_text("\n".join(map(json.dumps, rows)) + "\n")
    return path


@pytest.mark.parametrize("time_factor, drift", [(1.18, []), (1.22, [(1, "step_time")])])
def test_rank_drift_in_an_audit(tmp_path: Path, time_factor, drift):
    # with two ranks the other ranks' median is the other rank: rank 1 at 1.22x rank 0 passes factor 1.2, 1.18x does
    # not; rank 0, below its peer, is never named
    src = _jsonl(tmp_path / "m.jsonl", time_factor, None)
    findings = run_audit(open_case(None, overrides={"metrics": [str(src)]})).findings
    found = sorted(
        (f["details"]["rank"], f["details"]["metric"]) for f in findings["findings"] if f["kind"] == "rank_drift"
    )
    assert found == drift
    assert parse_fail_on("rank-drift") == ["rank-drift"]


def test_a_spike_on_one_rank_names_it(tmp_path: Path):
    src = _jsonl(tmp_path / "m.jsonl", 1.0, spike_rank=1)
    findings = run_audit(open_case(None, overrides={"metrics": [str(src)]})).findings
    spikes = [(s["peak_step"], s.get("ranks")) for s in findings["spikes"] if s["metric"] == "loss"]
    assert spikes == [(300, [1])]


def test_max_avg_pairs_from_names():
    cols = ["global_avg_loss", "global_max_loss", "loss_mean", "loss_max", "max_lr", "grad_norm/max"]
    assert max_avg_pairs(cols) == {"global_avg_loss": "global_max_loss", "loss_mean": "loss_max"}


@pytest.mark.parametrize("on_ranks, some", [(1, True), (2, True), (3, False), (4, False)])
def test_spike_on_some_ranks_from_max_and_average(tmp_path: Path, on_ranks, some):
    # 4 ranks, a jump of 3.0 on `on_ranks` of them at step 300: the maximum rises 3.0, the average 0.75 x on_ranks;
    # max_over_avg 1.5 puts 1 and 2 ranks (4x, 2x) on some ranks only, 3 (1.33x) and 4 (1x) not
    rng = np.random.default_rng(2)
    rows = []
    for s in range(N):
        per_rank = 3.0 * np.exp(-s / 300) + rng.normal(0, 0.01, 4)
        if s == 300:
            per_rank[:on_ranks] += 3.0
        rows.append({"step": s, "global_avg_loss": float(per_rank.mean()), "global_max_loss": float(per_rank.max())})
    (tmp_path / "m.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    findings = run_audit(open_case(None, overrides={"metrics": [str(tmp_path / "m.jsonl")]})).findings
    spikes = [
        (s["peak_step"], s.get("on_some_ranks", False)) for s in findings["spikes"] if s["metric"] == "global_avg_loss"
    ]
    assert spikes == [(300, some)]


def test_rank_column_becomes_one_column_per_rank_and_a_drift(tmp_path: Path):
    # each of 3 ranks writes its own line per step into one JSONL file; rank 2's step time is 1.5x from step 200
    rng = np.random.default_rng(3)
    lines = []
    for s in range(N):
        for r in range(3):
            t = 0.5 * (1.5 if r == 2 and s >= 200 else 1.0) + rng.normal(0, 0.005)
            lines.append({"step": s, "rank": r, "loss": 3.0 * np.exp(-s / 300) + rng.normal(0, 0.02), "step_time": t})
    (tmp_path / "m.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    from forensics.sources import read_metrics

    metrics, report = read_metrics([str(tmp_path / "m.jsonl")])
    assert len(metrics) == N and not report.rewinds
    assert sorted(c for c in metrics.columns if "rank" in c) == [
        "loss/rank0",
        "loss/rank1",
        "loss/rank2",
        "step_time/rank0",
        "step_time/rank1",
        "step_time/rank2",
    ]
    findings = run_audit(open_case(None, overrides={"metrics": [str(tmp_path / "m.jsonl")]})).findings
    assert [
        (f["details"]["rank"], f["details"]["metric"], round(f["details"]["factor"], 1))
        for f in findings["findings"]
        if f["kind"] == "rank_drift"
    ] == [(2, "step_time", 1.5)]
