"""The run view's curves (the report's loss_figure): a long run downsampled keeps every length bucket's extremes."""

from __future__ import annotations

import numpy as np
import pandas as pd

from forensics.report import loss_figure


def test_long_run_keeps_each_buckets_min_and_max() -> None:
    rng = np.random.default_rng(0)
    n = 200_000
    steps = np.arange(n, dtype=np.int64)
    bucket = rng.integers(0, 6, n)
    loss = 1.0 + 0.3 * bucket + 0.05 * rng.standard_normal(n)
    metrics = pd.DataFrame({"step": steps, "train/loss": loss})
    tags = pd.DataFrame({"step": steps, "bucket": bucket})
    fig = loss_figure(metrics, {"spikes": []}, tags, loss_key="train/loss")
    drawn = np.concatenate([np.asarray(t.x) for t in fig.data if t.name and t.name.startswith("bucket")])
    assert len(drawn) <= 12_000  # a few thousand points per bucket, not 200,000
    for k in range(6):
        sel = np.flatnonzero(bucket == k)
        assert sel[np.argmin(loss[sel])] in drawn and sel[np.argmax(loss[sel])] in drawn, k


# --- the run at a glance (shared by the dashboard's top and report.html's) ------------------------------------------
import pytest  # noqa: E402

from forensics.report.overview import (  # noqa: E402
    cause_rows,
    run_state,
    sample_groups,
    severity_label,
    throughput_key,
    throughput_now,
)


def _cause(cid: str, severity: str, steps: list[int], kind: str = "batch") -> dict:
    return {
        "id": cid,
        "kind": kind,
        "severity": severity,
        "steps": steps,
        "logged_steps": steps,
        "summary": f"{kind} at {steps}: because; more",
    }


# a 1,000-step run: "now" is the last max(50, 1000 // 20) = 50 steps, i.e. steps 950-999 (last step 999)
@pytest.mark.parametrize(
    "causes, stale, level, reason",
    [
        ([], False, "ok", "no cause at warning or above in the last 50 steps"),
        ([], True, "warning", "the run stopped writing"),
        ([_cause("C1", "critical", [949])], False, "ok", "no cause at warning or above in the last 50 steps"),
        ([_cause("C1", "critical", [950])], False, "critical", "batch cause C1 at steps 950"),
        ([_cause("C1", "warning", [999])], False, "warning", "batch cause C1 at steps 999"),
        ([_cause("C1", "warning", [999])], True, "warning", "batch cause C1 at steps 999; the run stopped writing"),
        ([_cause("C1", "info", [999])], False, "ok", "no cause at warning or above in the last 50 steps"),
        ([_cause("C1", "critical", [10], "crash")], False, "critical", "crash cause C1 at steps 10"),
        ([_cause("C1", "critical", [10], "divergence")], False, "critical", "divergence cause C1 at steps 10"),
        ([_cause("C1", "warning", [], "plateau")], False, "warning", "plateau cause C1 at the whole run"),
        (
            [_cause("C1", "warning", [990]), _cause("C2", "critical", [960])],
            False,
            "critical",
            "batch cause C2 at steps 960",
        ),
    ],
)
def test_run_state_now_counts_recent_and_lasting_causes_only(causes, stale, level, reason) -> None:
    state = run_state(causes, last_step=999, n_steps=1000, stale=stale)
    assert (state.level, state.reason) == (level, reason)


def test_severity_labels_sort_most_severe_first_and_carry_a_shape() -> None:
    labels = [severity_label(s) for s in ("info", "critical", "warning")]
    assert labels == ["● info", "■ critical", "▲ warning"]
    assert sorted(labels) == ["■ critical", "▲ warning", "● info"]


def test_cause_rows_are_ordered_by_severity_then_first_step_with_a_one_line_summary() -> None:
    rows = cause_rows(
        [
            _cause("C1", "warning", [5]),
            _cause("C2", "critical", [900, 7]),
            dict(_cause("C3", "critical", [3]), replay={"verdict": "data"}, cause_class="data"),
        ]
    )
    assert [(r["id"], r["steps"], r["summary"], r["class"], r["replay"]) for r in rows] == [
        ("C3", "3", "batch at [3]", "data", "data"),
        ("C2", "7 and 900", "batch at [900, 7]", "", ""),
        ("C1", "5", "batch at [5]", "", ""),
    ]


def test_samples_consumed_at_the_same_steps_share_one_row() -> None:
    harmful = [
        {"sample_id": 1, "appearances": 2, "steps": [4, 9], "effect": 0.5, "q": 0.01, "content": ["dup"]},
        {"sample_id": 2, "appearances": 2, "steps": [4, 9], "effect": 0.5, "q": 0.02},
        {"sample_id": 3, "appearances": 3, "steps": [4, 9, 12], "effect": 0.25, "q": 0.04},
    ]
    rows = sample_groups(harmful)
    assert [(r["ids"], r["appearances"], r["effect"], r["q"], r["reason"]) for r in rows] == [
        ([1, 2], 2, 0.5, 0.02, "loss +50% vs expected when present; always together (2 samples); dup"),
        ([3], 3, 0.25, 0.04, "loss +25% vs expected when present"),
    ]


@pytest.mark.parametrize(
    "columns, key",
    [
        (["train/loss", "tokens_per_s"], "tokens_per_s"),
        (["loss", "train/train_samples_per_second"], "train/train_samples_per_second"),
        (["loss", "eval_samples_per_second"], None),
        (["loss", "lr"], None),
    ],
)
def test_throughput_is_found_by_name(columns, key) -> None:
    metrics = pd.DataFrame({"step": np.arange(3), **{c: np.ones(3) for c in columns}})
    assert throughput_key(metrics) == key


def test_throughput_now_is_the_median_of_the_last_rows() -> None:
    values = np.r_[np.full(30, 100.0), np.full(19, 200.0), np.nan, 5.0]
    metrics = pd.DataFrame({"step": np.arange(len(values)), "tokens_per_s": values})
    assert throughput_now(metrics, "tokens_per_s") == 200.0  # 20 finite values: one 100, 18 200s and the 5
