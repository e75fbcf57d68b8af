"""Bucket-explained jumpiness: the share of detrended loss variance the step's bucket explains, and its offsets."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forensics.detect import JumpinessDetector, bucket_variance_share, group_offsets, variance_share

LOSS = "train/loss"
N = 20_000
OFFSETS = np.array([0.10, 0.06, 0.02, 0.0, -0.04, -0.08])
NOISE = 0.02


def bucketed_run(seed: int = 0, effect: float = 1.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A decaying loss plus a per-bucket offset (buckets randomly interleaved) plus Gaussian noise."""
    rng = np.random.default_rng(seed)
    s = np.arange(N)
    buckets = rng.integers(0, len(OFFSETS), N)
    clusters = np.where(buckets >= 3, 1, 0)  # content follows length, coarser
    loss = 0.9 + 5.0 * np.exp(-s / 80.0) - 0.2 * s / N + effect * OFFSETS[buckets] + NOISE * rng.standard_normal(N)
    metrics = pd.DataFrame({"step": s, LOSS: loss})
    tags = pd.DataFrame({"step": s, "bucket": buckets, "cluster": clusters})
    return metrics, tags


def test_bucket_variance_share_is_large_for_a_bucketed_loss_and_matches_theory():
    metrics, tags = bucketed_run()
    share = bucket_variance_share(metrics, tags)
    between = OFFSETS.var()  # buckets equally likely
    assert share > 0.5
    assert share == pytest.approx(between / (between + NOISE**2), abs=0.03)


def test_bucket_variance_share_is_near_zero_without_a_bucket_effect():
    metrics, tags = bucketed_run(effect=0.0)
    assert 0 <= bucket_variance_share(metrics, tags) < 0.005


def test_spikes_in_one_bucket_do_not_make_it_explain_the_variance():
    metrics, tags = bucketed_run(seed=1, effect=0.0)
    hits = tags.index[tags["bucket"] == 2][100:300]
    metrics.loc[hits, LOSS] += 0.5  # 200 spikes of 25 noise SDs, all in bucket 2
    assert bucket_variance_share(metrics, tags) < 0.005
    values = metrics[LOSS].to_numpy()
    raw_share = variance_share(values, tags["bucket"].to_numpy(), outlier_mads=np.inf)
    assert raw_share > 0.02  # they would, without leaving within-bucket outliers out


def test_group_offsets_recover_each_buckets_level():
    metrics, tags = bucketed_run(seed=2)
    off = group_offsets(metrics[LOSS].to_numpy(), tags["bucket"].to_numpy()).set_index("group")
    rel = off["offset"] - off.loc[3, "offset"]
    np.testing.assert_allclose(rel.sort_index().to_numpy(), OFFSETS, atol=0.006)
    assert (off["n_steps"] > 3000).all()
    assert off["spread"].to_numpy() == pytest.approx(np.full(6, NOISE), rel=0.15)


def test_nonfinite_and_untagged_steps_are_left_out():
    metrics, tags = bucketed_run(seed=3)
    clean = bucket_variance_share(metrics, tags)
    metrics.loc[[10, 500, 9000], LOSS] = [np.nan, np.inf, -np.inf]
    assert bucket_variance_share(metrics, tags.iloc[: N - 2000]) == pytest.approx(clean, abs=0.01)


def test_jumpiness_finding_reports_bucket_and_cluster_shares_the_same_online_and_offline():
    metrics, tags = bucketed_run(seed=4)
    (f,) = JumpinessDetector().detect(metrics, tags)
    assert f.kind == "jumpiness" and f.metric == LOSS
    assert f.details["bucket_variance_share"] == pytest.approx(f.value)
    assert f.details["bucket_variance_share"] > 0.5
    assert 0.3 < f.details["cluster_variance_share"] < f.details["bucket_variance_share"]
    assert f.details["bucket_driven"] is True
    assert f"{100 * f.value:.0f}% by bucket" in f.evidence[0]
    det = JumpinessDetector()
    det.reset()
    for a in range(0, N, 3_000):
        assert det.update(metrics.iloc[a : a + 3_000], tags) == []
    (online,) = det.finish()
    assert online.to_dict() == f.to_dict()


def test_bucketed_demo_has_no_spike_and_its_jumpiness_is_explained_by_bucket(demo_small):
    from forensics.detect import detect_spikes
    from forensics.schema import load_plan, load_samples
    from forensics.sources import read_metrics
    from forensics.tagging.case import tag_case

    root = demo_small / "bucketed"
    metrics, _ = read_metrics([root / "metrics.parquet"])
    samples = load_samples(root / "samples.parquet")
    tags = tag_case(load_plan(root / "plan.parquet", samples), samples, cluster_by="source").tags
    found = detect_spikes(metrics, LOSS, tags=tags)
    assert [f for f in found if f.kind == "spike"] == []
    (jump,) = JumpinessDetector().detect(metrics, tags)
    assert jump.details["bucket_variance_share"] > 0.5
