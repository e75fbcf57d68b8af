"""The forgetting signature agrees with what the demo's simulator put in: sign, size and a 95% interval."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.datasets import LossModelParams, simulate
from forensics.detect.rules.forgetting import forgetting_signature
from forensics.tagging import tag_case


@pytest.fixture(scope="module")
def cases(demo_small: Path) -> dict[str, dict]:
    """Each demo case's tables, samples tagged with clusters (from the source label: fast and exact) and labels."""
    out = {}
    for case in ("static", "bucketed"):
        folder = demo_small / case
        plan, samples = pd.read_parquet(folder / "plan.parquet"), pd.read_parquet(folder / "samples.parquet")
        tagged = tag_case(plan, samples, cluster_by="source")
        out[case] = {
            "metrics": pd.read_parquet(folder / "metrics.parquet"),
            "plan": tagged.plan,
            "samples": tagged.samples,
            "labels": json.loads((folder / "labels.json").read_text()),
        }
    return out


@pytest.mark.parametrize("case", ["static", "bucketed"])
def test_slope_matches_the_simulators_forgetting_scale(cases, case):
    c = cases[case]
    truth = c["labels"]["forgetting"]
    sig = forgetting_signature(
        c["metrics"], c["plan"], c["samples"], tau=truth["tau_steps"], spikes=c["labels"]["spikes"]
    )
    lo, hi = sig["ci95"]
    assert sig["detected"] is True
    assert lo <= truth["scale"] <= hi  # the simulator's 0.04 lies in the 95% interval
    assert sig["slope"] == pytest.approx(truth["scale"], rel=0.3)
    assert sig["p_value"] < 1e-6
    assert sig["n_steps"] > 0.9 * len(c["metrics"])
    assert sig["effect_at_max_gap"] > 0
    assert {r["cluster_name"] for r in sig["clusters"]} == {"chat", "code", "math", "qa", "summarization"}
    assert all(r["n_steps"] > 50 and r["slope"] is not None for r in sig["clusters"])
    # per-cluster slopes agree with the common one (the simulator uses one scale for every source)
    inside = sum(r["ci95"][0] <= truth["scale"] <= r["ci95"][1] for r in sig["clusters"])
    assert inside >= 4
    json.dumps(sig, allow_nan=False)


def test_default_log_scale_gives_a_positive_smaller_slope(cases):
    c = cases["static"]
    tau8 = forgetting_signature(c["metrics"], c["plan"], c["samples"], tau=8.0)
    tau1 = forgetting_signature(c["metrics"], c["plan"], c["samples"])
    assert tau1["tau"] == 1.0 and tau1["detected"] is True
    # log1p(gap) grows faster than log1p(gap / 8) over the demo's gaps of 1-20 steps, so its slope is smaller
    assert 0 < tau1["slope"] < tau8["slope"]
    assert "log1p(steps since the cluster was last trained / 1)" in tau1["evidence"][0]


@pytest.mark.parametrize("scale", [0.0, 0.12])
def test_simulated_forgetting_scale_is_recovered_and_zero_is_not_detected(cases, scale):
    c = cases["static"]
    labels = c["labels"]
    params = LossModelParams(forget_scale=scale)
    sim = simulate(c["plan"], c["samples"], labels["corrupt_sample_ids"], params, seed=[0, 202, 0])
    sig = forgetting_signature(sim.metrics, c["plan"], c["samples"], tau=params.forget_tau, spikes=labels["spikes"])
    lo, hi = sig["ci95"]
    assert lo <= scale <= hi
    assert sig["detected"] is (scale > 0)
    if scale == 0:
        assert sig["next_step"] is None
        assert "No forgetting signature" in sig["evidence"][1]


def test_source_label_and_tagged_clusters_give_the_same_fit(cases):
    c = cases["bucketed"]
    by_cluster = forgetting_signature(c["metrics"], c["plan"], c["samples"], tau=8.0)
    by_source = forgetting_signature(c["metrics"], c["plan"], c["samples"], tau=8.0, cluster_column="source")
    assert by_source["slope"] == pytest.approx(by_cluster["slope"], rel=1e-9)
    assert by_source["clusters"][0]["cluster"] in {"chat", "code", "math", "qa", "summarization"}


def test_inputs_are_not_modified_and_result_is_deterministic(cases):
    c = cases["static"]
    before = (c["metrics"].copy(), c["plan"].copy(), c["samples"].copy())
    a = forgetting_signature(c["metrics"], c["plan"], c["samples"])
    b = forgetting_signature(c["metrics"], c["plan"], c["samples"])
    assert a == b
    pd.testing.assert_frame_equal(before[0], c["metrics"])
    pd.testing.assert_frame_equal(before[1], c["plan"])
    pd.testing.assert_frame_equal(before[2], c["samples"])


def test_missing_cluster_column_is_bad_input_and_tiny_runs_say_so():
    from forensics.errors import ForensicsError

    plan = pd.DataFrame({"step": [0, 1, 2], "sample_id": [0, 1, 2]})
    samples = pd.DataFrame({"sample_id": [0, 1, 2], "n_tokens": [10, 20, 30]})
    metrics = pd.DataFrame({"step": [0, 1, 2], "loss": [1.0, 1.1, 0.9]})
    with pytest.raises(ForensicsError, match="cluster"):
        forgetting_signature(metrics, plan, samples)
    sig = forgetting_signature(metrics, plan, samples.assign(cluster=[0, 1, 0]))
    assert sig["detected"] is False and sig["slope"] is None and "too few" in sig["evidence"][0]


def test_nan_losses_are_left_out_not_fatal(cases):
    c = cases["bucketed"]
    metrics = c["metrics"].copy()
    metrics.loc[metrics.index[500:520], "train/loss"] = np.nan
    metrics.loc[metrics.index[900], "train/loss"] = np.inf
    sig = forgetting_signature(metrics, c["plan"], c["samples"], tau=8.0)
    assert sig["detected"] is True
    assert sig["n_steps"] <= len(metrics) - 21
