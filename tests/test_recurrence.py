"""Recurrence: the static demo's spike batches come back in every later epoch, and their samples are enriched."""

from __future__ import annotations

import json
from math import comb
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.detect.findings import Finding
from forensics.detect.rules.recurrence import batch_recurrence, recurrence_report, sample_enrichment, spike_span
from forensics.tagging import tag_case


@pytest.fixture(scope="module")
def static(demo_small: Path) -> dict:
    folder = demo_small / "static"
    plan, samples = pd.read_parquet(folder / "plan.parquet"), pd.read_parquet(folder / "samples.parquet")
    return {
        "plan": plan,
        "metrics": pd.read_parquet(folder / "metrics.parquet"),
        "tags": tag_case(plan, samples, cluster_by="source").tags,
        "labels": json.loads((folder / "labels.json").read_text()),
    }


def _story_spikes(labels: dict) -> list[dict]:
    return [s for s in labels["spikes"] if s["step"] in (254, 258)]


def test_static_demo_spike_batches_recur_in_every_later_epoch_with_a_smaller_jump(static):
    rec = batch_recurrence(_story_spikes(static["labels"]), static["plan"], static["metrics"], static["tags"])
    plan = static["plan"]
    for item, group in zip(rec, static["labels"]["corrupt_groups"]):
        assert sorted(item["sample_ids"]) == sorted(group)
        assert item["epoch"] == 0 and item["epochs"] == [1, 2, 3, 4, 5]
        assert item["n_recurrences"] == 5
        for r in item["recurrences"]:
            # the plan really holds exactly this batch at that step
            assert sorted(plan.loc[plan["step"] == r["step"], "sample_id"]) == sorted(group)
            assert r["jaccard"] == 1.0 and r["overlap"] == 1.0
        ratios = [r["ratio"] for r in item["recurrences"]]
        assert item["ratio"] > 4  # the spike itself: ~6x its bucket's baseline
        assert ratios[0] > 1.8  # epoch 1: the loss jumps again, less (the simulator memorises with decay 0.25)
        assert item["ratio"] > ratios[0] > max(ratios[2:])
        assert item["recurrences"][0]["is_spike"] is False  # only 254/258 were given as spikes
    labelled = {s["step"] for s in static["labels"]["spikes"] if s["kind"] == "recurrence"}
    assert {item["recurrences"][0]["step"] for item in rec} == labelled  # the epoch-1 returns the labels name
    assert "came back at steps" in rec[0]["evidence"] and "(epoch 1)" in rec[0]["evidence"]


def test_enrichment_pvalue_is_the_hypergeometric_tail(static):
    spikes = static["labels"]["spikes"]  # 254, 258 and their epoch-1 returns: each corrupted sample in 2 of 4
    enr = sample_enrichment(spikes, static["plan"])
    n_steps = static["plan"]["step"].nunique()
    corrupt = set(static["labels"]["corrupt_sample_ids"])
    top = enr.head(len(corrupt))
    assert set(top["sample_id"]) == corrupt
    assert (top["n_spike_batches"] == 2).all() and (top["n_steps"] == 6).all()
    # P(X >= 2) for X ~ Hypergeometric(N steps, K = 6 exposures, n = 4 spike steps), by hand
    expected = sum(comb(6, x) * comb(n_steps - 6, 4 - x) for x in range(2, 5)) / comb(n_steps, 4)
    assert top["p_value"].to_numpy() == pytest.approx(expected, rel=1e-9)
    n_samples = static["plan"]["sample_id"].nunique()
    assert top["p_bonferroni"].to_numpy() == pytest.approx(min(1.0, expected * n_samples))
    assert top["expected"].to_numpy() == pytest.approx(4 * 6 / n_steps)
    assert (top["q_value"] <= top["p_bonferroni"]).all()


def test_report_combines_both_and_is_json_ready(static):
    report = recurrence_report(static["labels"]["spikes"], static["plan"], static["metrics"], static["tags"])
    assert report["n_spike_events"] == 4
    assert report["n_samples_tested"] == static["plan"]["sample_id"].nunique()
    first_id = str(min(static["labels"]["corrupt_groups"][0]))
    assert "Bonferroni" in report["evidence"][-1] and first_id in report["evidence"][-1]
    json.dumps(report, allow_nan=False)


def test_samples_tested_are_those_of_the_logged_steps_when_the_plan_runs_ahead(static):
    """A plan ahead of its metrics: the family the p-values correct for is the samples of the steps that could have
    spiked (the logged ones), as the enrichment itself counts them; later steps still show where a batch came back."""
    plan, metrics = static["plan"], static["metrics"]
    cut = metrics[metrics["step"] <= 400]  # inside the first epoch
    report = recurrence_report(_story_spikes(static["labels"]), plan, cut, static["tags"])
    logged = plan[plan["step"] <= 400]["sample_id"].nunique()
    assert report["n_samples_tested"] == logged < plan["sample_id"].nunique()
    assert f"correct for the {logged} samples" in report["note"]
    assert min(r["step"] for r in report["spikes"][0]["recurrences"]) > 400  # returns past the metrics
    assert report["spikes"][0]["recurrences"][-1]["value"] is None  # no loss there yet


def test_bucketed_plan_rebuilds_batches_so_nothing_recurs(demo_small: Path):
    folder = demo_small / "bucketed"
    plan, metrics = pd.read_parquet(folder / "plan.parquet"), pd.read_parquet(folder / "metrics.parquet")
    rec = batch_recurrence([{"step": 254}, {"step": 1000}], plan, metrics)
    assert [r["n_recurrences"] for r in rec] == [0, 0]
    assert "was not trained again" in rec[0]["evidence"]


def _tiny() -> tuple[pd.DataFrame, pd.DataFrame]:
    """3 epochs of 4 steps. Batch {1, 2, 3, 4, 5} is at step 1; step 6 holds {1, 2, 3, 4} (Jaccard 0.8), step 9
    holds {1, 2, 3, 4, 5} again, step 11 {1, 2, 3, 9, 10} (Jaccard 3/7: not the same batch)."""
    batches = {
        0: [10, 11],
        1: [1, 2, 3, 4, 5],
        2: [12, 13],
        3: [14, 15],
        4: [10, 12],
        5: [11, 13, 5],
        6: [1, 2, 3, 4],
        7: [14, 15],
        8: [10, 11],
        9: [1, 2, 3, 4, 5],
        10: [12, 14],
        11: [1, 2, 3, 9, 8],
    }
    rows = [(s, s // 4, i) for s, ids in batches.items() for i in ids]
    plan = pd.DataFrame(rows, columns=["step", "epoch", "sample_id"])
    loss = np.full(12, 1.0)
    loss[[1, 6, 9]] = [4.0, 2.0, 1.0]
    return plan, pd.DataFrame({"step": np.arange(12), "loss": loss})


def test_tiny_plan_jaccard_threshold_and_loss_there():
    plan, metrics = _tiny()
    (item,) = batch_recurrence([Finding(kind="spike", step=1, metric="loss")], plan, metrics, window=5)
    assert [r["step"] for r in item["recurrences"]] == [6, 9]
    assert [r["epoch"] for r in item["recurrences"]] == [1, 2]
    six, nine = item["recurrences"]
    assert six["jaccard"] == pytest.approx(0.8) and six["overlap"] == pytest.approx(0.8) and six["shared"] == 4
    assert nine["jaccard"] == 1.0
    assert (six["value"], nine["value"]) == (2.0, 1.0)
    assert six["baseline"] == pytest.approx(1.0) and six["ratio"] == pytest.approx(2.0)
    assert item["value"] == 4.0 and item["ratio"] == pytest.approx(4.0)
    strict = batch_recurrence([{"step": 1}], plan, metrics, min_jaccard=0.9, window=5)[0]
    assert [r["step"] for r in strict["recurrences"]] == [9]


def test_tiny_plan_enrichment_ranks_the_samples_of_both_spike_batches_first():
    plan, _ = _tiny()
    enr = sample_enrichment([{"step": 1}, {"step": 11}], plan)
    first = enr.head(3)
    assert set(first["sample_id"]) == {1, 2, 3}
    assert (first["n_spike_batches"] == 2).all()
    assert first["spike_steps"].iloc[0] == [1, 11]
    # sample 1: K = 4 steps of 12, both spike steps hold it: C(4,2) C(8,0) / C(12,2)
    assert first["p_value"].iloc[0] == pytest.approx(comb(4, 2) / comb(12, 2))
    single = enr[enr["sample_id"] == 9].iloc[0]
    assert single["n_spike_batches"] == 1 and single["p_value"] > first["p_value"].iloc[0]


def test_spike_span_reads_findings_and_label_dicts():
    assert spike_span(Finding(kind="spike", step=5, end_step=7, peak_step=6)) == (5, 7, 6)
    assert spike_span({"step": 5}) == (5, 5, 5)
    assert spike_span({"step": 5, "end_step": 8, "peak_step": None}) == (5, 8, 5)
