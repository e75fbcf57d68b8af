"""Suspect samples of spike batches: recurring samples first, then outliers of length, cluster and near-duplicates."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from forensics.detect import Finding, attach_suspects, rank_suspects
from forensics.errors import ForensicsError


def plan_and_samples() -> tuple[pd.DataFrame, pd.DataFrame]:
    """100 steps of 8 samples each (ids step*8 .. step*8+7); all ~1000 tokens, cluster 0, distinct texts."""
    rng = np.random.default_rng(0)
    ids = np.arange(800)
    plan = pd.DataFrame({"step": ids // 8, "sample_id": ids})
    words = rng.integers(0, 5000, (800, 30))
    samples = pd.DataFrame(
        {
            "sample_id": ids,
            "n_tokens": rng.integers(950, 1050, 800).astype(np.int32),
            "cluster": np.zeros(800, dtype=np.int64),
            "text": [" ".join(f"w{w}" for w in row) for row in words],
        }
    )
    return plan, samples


def test_a_sample_in_several_spike_batches_ranks_first():
    plan, samples = plan_and_samples()
    plan = pd.concat([plan, pd.DataFrame({"step": [50, 70], "sample_id": [83, 83]})], ignore_index=True)
    ranked = rank_suspects(10, plan, samples, spike_events=[10, 50, 70, 90])
    assert ranked[0].sample_id == 83 and ranked[0].n_spike_batches == 3
    assert ranked[0].reasons[0] == "in 3 spike batches (steps 10, 50, 70)"
    assert [s.n_spike_batches for s in ranked[1:]] == [1] * 7


def test_length_cluster_and_duplicate_outliers_rank_above_ordinary_batch_mates():
    plan, samples = plan_and_samples()
    samples.loc[samples.sample_id == 161, "n_tokens"] = 7900  # step 20's batch: ids 160..167
    samples.loc[samples.sample_id == 162, "cluster"] = 4  # a minority, and rare in the run
    samples.loc[samples.sample_id == 163, "text"] = samples.loc[samples.sample_id == 164, "text"].iloc[0] + " x"
    ranked = rank_suspects((20, 20), plan, samples)
    top = [s.sample_id for s in ranked]
    assert set(top[:4]) == {161, 162, 163, 164} and top[0] == 161
    reasons = {s.sample_id: " | ".join(s.reasons) for s in ranked}
    assert "7900 tokens" in reasons[161] and "robust SDs from its batch's median" in reasons[161]
    assert "cluster 4: 1 of 8 samples in its batch" in reasons[162] and "rare in the run" in reasons[162]
    assert "near-duplicate of sample 164" in reasons[163]
    assert all(s.reasons == [] for s in ranked[4:])
    rest = [s.score for s in ranked[4:]]
    assert rest == sorted(rest, reverse=True) and max(rest) < min(s.score for s in ranked[:4])


def test_attach_suspects_fills_every_spike_and_leaves_other_findings_alone():
    plan, samples = plan_and_samples()
    spikes = [Finding(kind="spike", step=s, end_step=s + 1) for s in (10, 40)]
    other = Finding(kind="level_shift", step=60, end_step=70)
    attach_suspects([*spikes, other], plan, samples, top=5)
    assert [len(f.suspect_samples) for f in spikes] == [5, 5]
    assert set(spikes[0].suspect_samples) <= set(range(80, 96))  # steps 10 and 11
    assert spikes[1].details["suspects"][0]["sample_id"] == spikes[1].suspect_samples[0]
    assert other.suspect_samples == [] and "suspects" not in other.details


def test_a_plan_without_steps_is_bad_input():
    _, samples = plan_and_samples()
    with pytest.raises(ForensicsError, match="assign_steps"):
        rank_suspects(1, pd.DataFrame({"epoch": [0], "batch_id": [0], "sample_id": [0]}), samples)


def test_static_demo_spikes_carry_bucket_cluster_and_their_labelled_samples_first(demo_small):
    from forensics.detect import detect_spikes
    from forensics.schema import load_plan, load_samples
    from forensics.sources import read_metrics
    from forensics.tagging.case import tag_case

    root = demo_small / "static"
    metrics, _ = read_metrics([root / "metrics.parquet"])
    samples = load_samples(root / "samples.parquet")
    tagged = tag_case(load_plan(root / "plan.parquet", samples), samples, cluster_by="source")
    found = detect_spikes(metrics, "train/loss", tags=tagged.tags)
    spikes = [f for f in found if f.kind == "spike"]
    attach_suspects(spikes, tagged.plan, tagged.samples)
    labels = json.loads((root / "labels.json").read_text())["spikes"]
    for label in labels[:2]:  # the story's 254 and 258
        (f,) = [f for f in spikes if abs(f.step - label["step"]) <= 2]
        assert {"bucket", "bucket_range", "cluster", "cluster_name"} <= set(f.tags)
        k = len(label["sample_ids"])
        assert set(f.suspect_samples[:k]) == set(label["sample_ids"])
    assert len(spikes) <= len(labels)
