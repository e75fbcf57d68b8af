"""Attribution: each spike names its bucket, cluster and samples with the numbers behind them, and what to do next."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.detect.findings import Finding, Findings
from forensics.detect.rules.attribution import attribute, checkpoint_before, plan_fix
from forensics.plan.buckets import bucket_index, bucket_range
from forensics.plan.gate import check_plan
from forensics.plan.whatif import whatif
from forensics.schema import DEFAULT_BOUNDARIES
from forensics.tagging import tag_case


@pytest.fixture(scope="module")
def static(demo_small: Path) -> dict:
    """The static demo, tagged with text clusters (k = 5, as the audit would cluster it), the gate and the what-if."""
    folder = demo_small / "static"
    plan, samples = pd.read_parquet(folder / "plan.parquet"), pd.read_parquet(folder / "samples.parquet")
    tagged = tag_case(plan, samples, clusters=5, max_fit=3000, boundaries=DEFAULT_BOUNDARIES)  # as its run.toml
    labels = json.loads((folder / "labels.json").read_text())
    return {
        "metrics": pd.read_parquet(folder / "metrics.parquet"),
        "plan": tagged.plan,
        "tags": tagged.tags,
        "samples": tagged.samples,
        "labels": labels,
        "gate": check_plan(plan, samples).to_json(),
        "whatif": whatif(samples["n_tokens"].to_numpy(), tokens_per_s=30_000).to_dict(),
    }


def _findings(labels: dict, steps: tuple[int, ...] | None = None) -> list[Finding]:
    return [
        Finding(
            kind="spike",
            step=s["step"],
            end_step=s["end_step"],
            peak_step=s["peak_step"],
            metric="train/loss",
            value=s["loss"],
            evidence=["loss jumped"],
        )
        for s in labels["spikes"]
        if steps is None or s["step"] in steps
    ]


def _expected_bucket_and_cluster(static: dict, ids: list[int]) -> tuple[int, int]:
    smp = static["samples"].set_index("sample_id")
    buckets = bucket_index(np.minimum(smp.loc[ids, "n_tokens"].to_numpy(), 8192), DEFAULT_BOUNDARIES)
    code = smp.loc[smp["source"] == "code", "cluster"].mode().iloc[0]
    assert len(set(buckets)) == 1
    return int(buckets[0]), int(code)


def test_static_demo_spikes_name_the_labelled_bucket_cluster_and_samples_first(static):
    spikes = _findings(static["labels"])
    out = attribute(
        spikes,
        static["metrics"],
        static["tags"],
        static["plan"],
        static["samples"],
        gate=static["gate"],
        whatif=static["whatif"],
        checkpoint_every=50,
    )
    assert [f.step for f in out] == [s["step"] for s in static["labels"]["spikes"]]
    for f, label in zip(out, static["labels"]["spikes"]):
        ids = label["sample_ids"]
        bucket, code_cluster = _expected_bucket_and_cluster(static, ids)
        att = f.details["attribution"]
        assert f.tags["bucket"] == bucket == att["buckets"][0]["bucket"]
        assert f.tags["bucket_range"] == bucket_range(bucket, DEFAULT_BOUNDARIES)
        assert f.tags["cluster"] == code_cluster == att["clusters"][0]["cluster"]
        assert set(f.suspect_samples[: len(ids)]) == set(ids)  # the corrupted duplicates first
        # each corrupted sample is in 2 of the 4 spike batches: enrichment puts them first with its p-value
        assert all(r["n_spike_batches"] == 2 and r["p_value"] < 1e-4 for r in att["samples"][: len(ids)])
        top = att["buckets"][0]
        assert top["n_spikes"] == 4 and top["n_events"] == 4 and 0 < top["share_of_steps"] < 1
        text = " ".join(f.evidence)
        assert f.evidence[0] == "loss jumped"  # the detector's sentences are kept, attribution's follow
        assert (
            f"bucket {bucket} {f.tags['bucket_range']}: {100 * top['share_of_steps']:.0f}% of steps but 4 of 4" in text
        )
        assert "came back at steps" in text and "rose at the same step as the loss" in text
        assert {r["epoch"] for r in f.tags["recurrence"]} == {0, 1, 2, 3, 4, 5} - {label["epoch"]}
    first = out[0]
    assert "Replay step 254 from the checkpoint before it (step 250" in first.next_step
    assert "bucketed_shuffle" in first.next_step
    fix = next(s for s in static["whatif"]["strategies"] if s["name"] == "bucketed_given")
    assert f"~{100 * fix['throughput_vs_sorted']:.0f}% of the sorted throughput" in first.next_step
    assert f"random's ~{100 * static['whatif']['random_over_sorted']:.0f}%" in first.next_step
    doc = Findings(items=out).to_dict()
    json.dumps(doc, allow_nan=False)
    assert doc["spikes"][0]["recurrence"][0]["step"] == out[0].tags["recurrence"][0]["step"]


def test_story_spikes_alone_still_name_the_batch_and_its_recurrence(static):
    out = attribute(
        _findings(static["labels"], (254, 258)), static["metrics"], static["tags"], static["plan"], static["samples"]
    )
    for f, group in zip(out, static["labels"]["corrupt_groups"]):
        assert set(f.suspect_samples[:3]) == set(group)
        assert [r["epoch"] for r in f.tags["recurrence"]] == [1, 2, 3, 4, 5]
        assert f.tags["recurrence"][0]["ratio"] > 1.5  # the loss jumped again in epoch 1
        # no gate given: the recurrence itself calls for the plan fix
        assert "the batch recurs in 5 other epochs and train/loss jumped there too" in f.next_step
        assert "forensics whatif" in f.next_step
        assert "No sample of this batch is in another spike batch" in " ".join(f.evidence)


def test_inputs_are_not_modified(static):
    spikes = _findings(static["labels"], (254,))
    before = copy.deepcopy(spikes)
    tags_before = static["tags"].copy()
    attribute(spikes, static["metrics"], static["tags"], static["plan"], static["samples"])
    assert spikes == before
    pd.testing.assert_frame_equal(tags_before, static["tags"])


def test_varied_plan_and_passing_gate_get_no_plan_fix(demo_small: Path):
    folder = demo_small / "bucketed"
    plan, samples = pd.read_parquet(folder / "plan.parquet"), pd.read_parquet(folder / "samples.parquet")
    metrics = pd.read_parquet(folder / "metrics.parquet")
    tags = tag_case(plan, samples, cluster_by="source").tags
    (f,) = attribute(
        [Finding(kind="spike", step=300, metric="train/loss")], metrics, tags, plan, samples, gate={"static": False}
    )
    assert f.tags["recurrence"] == []
    assert "bucketed_shuffle" not in f.next_step and "Replay step 300" in f.next_step
    assert len(f.suspect_samples) == plan.loc[plan["step"] == 300, "sample_id"].nunique()


def test_grad_norm_led_spike_without_a_plan_points_at_the_optimizer_and_asks_for_the_plan():
    n = 400
    rng = np.random.default_rng(1)
    loss = 2.2 + rng.normal(0, 0.01, n)
    loss[300] = 5.1
    grad = 0.25 * rng.lognormal(0, 0.05, n)
    grad[296:301] = [0.9, 2.4, 16.0, 145.0, 960.0]
    metrics = pd.DataFrame(
        {"step": np.arange(n), "lm loss": loss, "grad norm": grad, "learning rate": np.full(n, 6e-5)}
    )
    (f,) = attribute([Finding(kind="spike", step=300, metric="lm loss")], metrics, checkpoints=[0, 100, 200, 298])
    assert f.suspect_samples == [] and "recurrence" not in f.tags
    assert f.details["attribution"]["precedence"]["grad_norm"] == "leads"
    assert "replay steps 296-300 from the checkpoint saved at step 200" in f.next_step
    assert "optimizer state" in f.next_step and "record or rebuild the batch plan" in f.next_step


def test_checkpoint_and_plan_fix_wording():
    assert (
        checkpoint_before(254, every=50)
        == "the checkpoint before it (step 250 with a checkpoint every 50 steps, or the nearest saved)"
    )
    assert checkpoint_before(250, every=50).startswith("the checkpoint before it (step 200")
    assert checkpoint_before(254, saved=[0, 200, 300]) == "the checkpoint saved at step 200"
    assert checkpoint_before(254) == "the nearest checkpoint saved before step 254"
    wi = {
        "strategies": [
            {"name": "bucketed_given", "throughput_vs_sorted": 0.7, "tokens_per_s": 21_000.0},
            {"name": "random_shuffle", "throughput_vs_sorted": 0.42, "tokens_per_s": 12_600.0},
        ]
    }
    assert plan_fix(wi).endswith(": ~70% of the sorted throughput (21K tok/s) instead of random's ~42% (13K tok/s)")
