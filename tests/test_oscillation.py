"""Oscillation: a periodic swing of the loss is detected with its period and cause; random-order jumpiness is not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.detect.evidence.jumpiness import bucket_variance_share
from forensics.detect.rules.oscillation import detect_oscillation, fold_share
from forensics.tagging import tag_case

N = 4000
LEVELS = np.array([0.14, 0.07, 0.02, -0.04, -0.09, -0.14])  # the demo's per-bucket loss levels, shortest first


def _run(
    bucket: np.ndarray, extra: np.ndarray | float = 0.0, noise: str = "gauss", seed: int = 0, sd: float = 0.03
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A loss with a warm-up trend, the bucket's level, ``extra`` and noise; tags with bucket and a cluster."""
    rng = np.random.default_rng(seed)
    s = np.arange(len(bucket))
    eps = rng.normal(0, sd, len(s)) if noise == "gauss" else sd * rng.standard_t(2, len(s))
    loss = 0.9 + 3.0 * np.exp(-s / 120) + LEVELS[bucket] + extra + eps
    metrics = pd.DataFrame({"step": s, "train/loss": loss})
    tags = pd.DataFrame({"step": s, "bucket": bucket, "cluster": (bucket >= 3).astype(np.int64)})
    return metrics, tags


@pytest.mark.parametrize("run_length", [1, 10])
def test_sampler_cycling_buckets_in_order_is_detected_with_its_period_and_aligned_with_bucket(run_length):
    s = np.arange(N)
    bucket = (s // run_length) % 6  # bucket 0, 1, ..., 5, 0, ...: a sawtooth of levels, period 6 * run_length
    metrics, tags = _run(bucket)
    osc = detect_oscillation(metrics, tags)
    assert osc["detected"] is True
    assert osc["period"] == 6 * run_length
    assert osc["aligned_with"] == "bucket"
    assert osc["p_value"] < 1e-10
    assert osc["strength"] > 0.2
    assert osc["explained_by"]["bucket"] > 0.95 > osc["explained_by"]["cluster"]  # two clusters explain less
    assert osc["bucket_variance_share"] > 0.7
    assert "cycle" in osc["next_step"]


def test_heavy_tailed_noise_does_not_hide_a_bucket_cycle():
    bucket = (np.arange(N) // 5) % 6
    osc = detect_oscillation(*_run(bucket, noise="t2", seed=3))
    assert (osc["detected"], osc["period"], osc["aligned_with"]) == (True, 30, "bucket")


@pytest.mark.parametrize("period", [7, 50, 200])
def test_sine_swing_with_random_buckets_is_detected_but_not_attributed_to_buckets(period):
    rng = np.random.default_rng(period)
    bucket = rng.integers(0, 6, N)
    sine = 0.05 * np.sin(2 * np.pi * np.arange(N) / period)
    osc = detect_oscillation(*_run(bucket, extra=sine, seed=period))
    assert osc["detected"] is True
    assert osc["period"] == period
    assert osc["aligned_with"] is None
    assert osc["explained_by"]["bucket"] < 0.1
    assert "outside the batch mix" in osc["next_step"]


@pytest.mark.parametrize("noise", ["gauss", "t2"])
def test_random_bucket_order_is_jumpy_but_not_an_oscillation(noise):
    rng = np.random.default_rng(11)
    metrics, tags = _run(rng.integers(0, 6, N), noise=noise, seed=12)
    osc = detect_oscillation(metrics, tags)
    assert osc["detected"] is False
    assert osc["period"] is None and osc["aligned_with"] is None
    share = bucket_variance_share(metrics, tags)
    assert osc["bucket_variance_share"] == pytest.approx(share)
    assert share > 0.5  # the jumpiness is there and explained by bucket ...
    assert any("random order" in e for e in osc["evidence"])  # ... and said to be harmless


def test_noise_alone_never_detected_over_many_seeds():
    s = np.arange(3000)
    fired = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        noise = 0.03 * (rng.standard_t(3, len(s)) if seed % 2 else rng.normal(size=len(s)))
        wander = np.cumsum(rng.normal(0, 0.002 if seed < 10 else 0.006, len(s)))  # slow random-walk drift
        metrics = pd.DataFrame({"step": s, "loss": 1.0 + np.exp(-s / 80) + wander + noise})
        fired.append(detect_oscillation(metrics)["detected"])
    assert sum(fired) == 0


def test_tiny_periodic_ripple_is_significant_but_not_material():
    s = np.arange(20000)
    rng = np.random.default_rng(5)
    loss = 1.0 + 0.006 * np.sin(2 * np.pi * s / 40) + rng.normal(0, 0.03, len(s))
    osc = detect_oscillation(pd.DataFrame({"step": s, "loss": loss}))
    assert osc["p_value"] < 0.01 and osc["candidate_period"] == 40
    assert osc["strength"] < 0.05
    assert osc["detected"] is False


def test_fold_share_of_a_pure_period_is_one_and_of_constant_is_nan():
    x = np.tile([1.0, 2.0, 3.0, 0.0], 50)
    assert fold_share(x, 4) == pytest.approx(1.0)
    assert np.isnan(fold_share(np.ones(100), 4))


def test_short_or_constant_series_are_not_oscillations():
    short = detect_oscillation(pd.DataFrame({"step": np.arange(30), "loss": np.sin(np.arange(30))}))
    assert short["detected"] is False and "too few" in short["evidence"][0]
    flat = detect_oscillation(pd.DataFrame({"step": np.arange(500), "loss": np.ones(500)}))
    assert flat["detected"] is False


@pytest.fixture(scope="module")
def demo_tags(demo_small: Path) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    out = {}
    for case in ("static", "bucketed"):
        folder = demo_small / case
        plan, samples = pd.read_parquet(folder / "plan.parquet"), pd.read_parquet(folder / "samples.parquet")
        tags = tag_case(plan, samples, cluster_by="source").tags
        out[case] = (pd.read_parquet(folder / "metrics.parquet"), tags)
    return out


@pytest.mark.parametrize("case", ["static", "bucketed"])
def test_demo_jumpiness_is_explained_by_bucket_and_not_reported_as_oscillation(demo_tags, case):
    metrics, tags = demo_tags[case]
    osc = detect_oscillation(metrics, tags)
    assert osc["detected"] is False
    assert osc["bucket_variance_share"] > 0.5
    assert 0.0 <= osc["cluster_variance_share"] <= 1.0
    json.dumps(osc, allow_nan=False)  # the audit writes it as is
    assert detect_oscillation(metrics, tags) == osc  # deterministic


def test_other_metric_and_missing_steps_are_handled(demo_tags):
    metrics, tags = demo_tags["bucketed"]
    gappy = metrics.drop(index=metrics.index[100:160])
    osc = detect_oscillation(gappy, tags, "grad_norm")
    assert osc["metric"] == "grad_norm" and osc["detected"] is False
