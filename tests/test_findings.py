"""The findings model: flat contract keys, strict JSON (no NaN tokens), round trips, versioning."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from forensics.detect import FINDINGS_VERSION, Finding, Findings, detect_spikes
from forensics.errors import ForensicsError


def spike() -> Finding:
    return Finding(
        kind="spike",
        step=254,
        end_step=255,
        peak_step=254,
        metric="train/loss",
        value=4.8,
        baseline=0.91,
        score=41.2,
        severity="critical",
        tags={"bucket": 5, "bucket_range": "(3296, 8192]", "cluster": np.int64(3), "cluster_name": "code", "epoch": 0},
        evidence=["train/loss rose to 4.8 at step 254 against a baseline of 0.91"],
        suspect_samples=[812, 813],
        next_step="replay step 254",
        details={"recovery_step": 256, "ratio": np.float64(5.27), "post": math.nan},
    )


def test_spike_serialises_to_the_flat_keys_of_the_contract():
    d = spike().to_dict()
    assert {k: d[k] for k in ("step", "end_step", "peak_step", "metric", "value", "baseline", "score")} == {
        "step": 254,
        "end_step": 255,
        "peak_step": 254,
        "metric": "train/loss",
        "value": 4.8,
        "baseline": 0.91,
        "score": 41.2,
    }
    assert {k: d[k] for k in ("bucket", "bucket_range", "cluster", "cluster_name", "epoch")} == {
        "bucket": 5,
        "bucket_range": "(3296, 8192]",
        "cluster": 3,
        "cluster_name": "code",
        "epoch": 0,
    }
    assert d["suspect_samples"] == [812, 813] and d["kind"] == "spike" and d["severity"] == "critical"
    assert type(d["cluster"]) is int and type(d["details"]["ratio"]) is float


def test_findings_json_has_the_audit_sections_and_no_nan_tokens():
    nan_step = Finding(kind="nonfinite", step=900, metric="train/loss", value=math.nan, severity="critical")
    inf_step = Finding(kind="nonfinite", step=901, metric="grad_norm", value=math.inf, severity="critical")
    fs = Findings(
        items=[inf_step, spike(), nan_step],
        sections={"oscillation": {"detected": True, "bucket_variance_share": 0.42}},
        warnings=["metric 'train/loss': 1 NaN and 0 inf values kept"],
    )
    text = fs.to_json()

    def no_constants(token):
        raise AssertionError(f"non-standard JSON token {token}")

    data = json.loads(text, parse_constant=no_constants)
    assert data["version"] == FINDINGS_VERSION
    assert [s["step"] for s in data["spikes"]] == [254]
    assert data["nonfinite"][0] == {**data["nonfinite"][0], "step": 900, "value": None, "value_text": "nan"}
    assert (data["nonfinite"][1]["value"], data["nonfinite"][1]["value_text"]) == (None, "inf")
    assert data["oscillation"] == {"detected": True, "bucket_variance_share": 0.42}
    assert data["plan"] is None
    assert data["spikes"][0]["details"]["post"] is None and data["spikes"][0]["details"]["post_text"] == "nan"
    json.dumps(data, allow_nan=False)


def test_findings_round_trip_restores_values_including_nan_and_inf():
    fs = Findings(
        items=[spike(), Finding(kind="nonfinite", step=7, metric="loss", value=-math.inf, severity="critical")],
        sections={"plan": {"static": True, "pair_retention": [0.98, math.nan]}},
    )
    back = Findings.from_json(fs.to_json())
    assert back.to_json() == fs.to_json()  # the read-back copy writes the same file as the original
    (s,) = back.spikes
    assert s.tags["bucket_range"] == "(3296, 8192]" and s.suspect_samples == [812, 813]
    assert math.isnan(s.details["post"]) and s.details["ratio"] == 5.27
    (nf,) = back.nonfinite
    assert nf.value == -math.inf
    assert back.sections["plan"]["pair_retention"] == [0.98, None]  # inside lists NaN becomes null


def test_empty_findings_still_have_the_required_keys():
    data = json.loads(Findings().to_json())
    assert data == {
        "version": FINDINGS_VERSION,
        "spikes": [],
        "nonfinite": [],
        "oscillation": {"detected": False, "bucket_variance_share": None},
        "plan": None,
        "findings": [],
        "warnings": [],
    }


def test_a_newer_findings_version_is_refused_with_a_clear_message():
    with pytest.raises(ForensicsError, match="version 99"):
        Findings.from_json(json.dumps({"version": 99, "spikes": []}))
    with pytest.raises(ForensicsError, match="not valid JSON"):
        Findings.from_json("{")


def test_tags_may_not_reuse_the_fixed_keys():
    with pytest.raises(ValueError, match="clash"):
        Finding(kind="spike", step=1, tags={"value": 3})
    with pytest.raises(ValueError, match="severity"):
        Finding(kind="spike", step=1, severity="bad")


def test_detector_output_round_trips_through_json(tmp_path):
    rng = np.random.default_rng(0)
    n = 3_000
    loss = 0.9 + 3 * np.exp(-np.arange(n) / 50) + 0.02 * rng.standard_normal(n)
    loss[[1000, 2000]] = [4.0, np.nan]
    metrics = pd.DataFrame({"step": np.arange(n), "train/loss": loss})
    tags = pd.DataFrame({"step": np.arange(n), "bucket": np.zeros(n, int), "epoch": np.zeros(n, int)})
    fs = Findings(items=detect_spikes(metrics, tags=tags))
    path = fs.write(tmp_path / "findings.json")
    back = Findings.read(path)
    assert [(f.kind, f.step) for f in back.items] == [("spike", 1000), ("nonfinite", 2000)]
    assert back.to_dict() == fs.to_dict()
    assert back.spikes[0].tags == {"bucket": 0, "bucket_range": "(0, 770]", "epoch": 0}
