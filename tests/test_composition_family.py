"""Each step judged against what its batch's composition predicts: the expectation's fit (causal, robust, a rare
group predicts nothing), the severity it implies, and the audit of a family of real Trainer runs whose loss moves
with the content of each batch (fixtures/hf_family.py), clean and with corrupted twins."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fixtures.hf_family import members
from forensics.cli import main
from forensics.detect.causes.severity import severity_of
from forensics.detect.evidence.expected_loss import CompositionExpectation, composition_features, fit_composition

AT_LEAST_WARNING = ("critical", "warning")


def _tags(n: int, rng: np.random.Generator, rare_every: int = 0) -> pd.DataFrame:
    """Steps of one of two equally common buckets (and, every ``rare_every`` steps, a rare third)."""
    bucket = rng.integers(0, 2, n)
    if rare_every:
        bucket[::rare_every] = 2
    tags = pd.DataFrame(
        {
            "step": np.arange(n),
            "bucket": bucket,
            "n_samples": 8,
            "real_tokens": 8 * (20 + 20 * bucket),
            "padding_ratio": 0.1,
        }
    )
    for k in range(3):
        tags[f"bucket_share_{k}"] = (bucket == k).astype(float)
    return tags


def test_the_expectation_is_the_same_for_any_chunking_and_learns_the_bucket_levels():
    rng = np.random.default_rng(0)
    n = 400
    tags = _tags(n, rng)
    loss = 3.0 * np.exp(-np.arange(n) / 300) * np.where(tags["bucket"] == 1, 1.6, 1.0)
    loss *= np.exp(0.02 * rng.standard_normal(n))
    whole = CompositionExpectation(tags).factors(tags["step"].to_numpy(), loss)
    chunked_exp = CompositionExpectation(tags)
    parts = [chunked_exp.factors(tags["step"].to_numpy()[a:b], loss[a:b]) for a, b in ((0, 7), (7, 150), (150, n))]
    assert np.array_equal(whole, np.concatenate(parts))
    assert (whole[:48] == 1.0).all()  # min_rows: no fit before 48 rows of history
    late = np.arange(n) >= 200
    ratio = np.median(whole[late & (tags["bucket"] == 1)]) / np.median(whole[late & (tags["bucket"] == 0)])
    assert ratio == pytest.approx(1.6, rel=0.05)


def test_a_step_never_predicts_itself():
    rng = np.random.default_rng(1)
    n = 300
    tags = _tags(n, rng)
    loss = 2.0 * np.exp(0.02 * rng.standard_normal(n))
    base = CompositionExpectation(tags).factors(tags["step"].to_numpy(), loss)
    spiked = loss.copy()
    spiked[250] *= 5.0
    other = CompositionExpectation(tags).factors(tags["step"].to_numpy(), spiked)
    assert other[250] == base[250]


@pytest.mark.parametrize(("rare_every", "kept_buckets"), [(10, [0, 1, 2]), (25, [0, 1])])
def test_a_bucket_under_five_percent_of_the_steps_predicts_nothing(rare_every, kept_buckets):
    """A bucket in 10% of the steps gets a coefficient; one in 4% (a dozen corrupted samples) does not, so it cannot
    absorb its own spikes."""
    rng = np.random.default_rng(2)
    tags = _tags(600, rng, rare_every)
    x, owner = composition_features(tags)
    y = np.where(tags["bucket"] == 2, 1.0, 0.0) + 0.01 * rng.standard_normal(len(tags))
    fit = fit_composition(x.to_numpy(), y, owner)
    kept = [int(c.rsplit("_", 1)[1]) for c in x.columns[fit.columns] if c.startswith("bucket_share_")]
    assert kept == kept_buckets


@pytest.mark.parametrize(
    ("support", "severity"),
    [
        ({"moved": True, "recurs": True}, "critical"),
        ({"moved": True, "recurs": True, "composition_high": True}, "warning"),
        ({"moved": True, "recurs": True, "grad_norm": True, "composition_high": True}, "critical"),
        ({"moved": True, "composition_high": True}, "warning"),
        ({"moved": True, "explained": "composition"}, "info"),
    ],
)
def test_recurrence_counts_only_where_the_composition_does_not_predict_the_rise(support, severity):
    assert severity_of("spike", support) == severity


# --- the family of real runs ------------------------------------------------------------------------------------------
def _audit(case, tmp_path) -> dict:
    out = tmp_path / "findings.json"
    assert main(["audit", str(case.out), "--no-html", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def _corrupt_steps(case) -> set[int]:
    plan = pd.read_parquet(case.out / "plan")
    return set(plan.loc[plan["sample_id"].isin(case.corrupt_ids), "step"].tolist())


CLEAN = [m.name for m in members() if not m.corrupt]
CORRUPT = [m.name for m in members() if m.corrupt]
#: A clean member whose repetitive motif sample 259 runs 6% above its 4-sample steps' expectation, twice (significant,
#: q 0.002, and with content evidence): its own loss only ~0.2x above what its steps expect of it, under the
#: harmful-samples estimate's effect floor. (Its fellow motif row 404 runs 2.6% above: q 0.33.)
HARDER_THAN_THEIR_BATCH = "group_by_length-s1-clean"


@pytest.mark.parametrize("name", CLEAN)
def test_a_clean_run_has_no_critical_cause_and_at_most_two_warnings(hf_family, tmp_path, capsys, name):
    findings = _audit(hf_family(name), tmp_path)
    capsys.readouterr()
    severities = [c["severity"] for c in findings["causes"]]
    assert severities.count("critical") == 0
    assert severities.count("warning") <= 2


@pytest.mark.parametrize("name", CLEAN)
def test_a_clean_run_lists_no_harmful_sample(hf_family, tmp_path, capsys, name):
    findings = _audit(hf_family(name), tmp_path)
    capsys.readouterr()
    assert findings["harmful_samples"] == []
    assert [c for c in findings["causes"] if c["kind"] == "samples"] == []


def test_samples_harder_than_their_batch_are_significant_but_under_the_effect_floor(
    hf_family, tmp_path, capsys, monkeypatch
):
    from forensics.detect.evidence import sample_effects
    from forensics.detect.rules.harmful_samples import MIN_EXCESS

    seen = []
    real = sample_effects.estimate
    monkeypatch.setattr(sample_effects, "estimate", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    findings = _audit(hf_family(HARDER_THAN_THEIR_BATCH), tmp_path)
    capsys.readouterr()
    (est,) = seen
    significant = est[est["q"] <= 0.05]
    assert sorted(significant["sample_id"]) == [259]
    assert (significant["excess"] < MIN_EXCESS).all() and (significant["excess"] > 0.15).all()
    assert findings["harmful_samples"] == []


CUT_CLEAN = [m.name for m in members() if not m.corrupt and m.mix == "cut"]


@pytest.mark.parametrize("name", CUT_CLEAN)
def test_judged_against_its_bucket_alone_a_clean_cut_run_raises_false_alarms(hf_family, tmp_path, capsys, name):
    """What the family reproduces: with each step judged against its length bucket's baseline alone (the expectation
    from the composition switched off), every clean member whose buckets cut through a content type raises causes at
    warning or above (the batches of one type's tail in the other type's bucket)."""
    from unittest import mock

    from forensics.detect.spikes.driver import SpikeDriver

    with mock.patch.object(SpikeDriver, "_composed", lambda self, metric, det: False):
        findings = _audit(hf_family(name), tmp_path)
    capsys.readouterr()
    assert len([c for c in findings["causes"] if c["severity"] in AT_LEAST_WARNING]) >= 3


@pytest.mark.parametrize(
    "name",
    CORRUPT,
)
def test_a_corrupted_twin_finds_every_corrupted_step_and_at_most_two_other_causes(hf_family, tmp_path, capsys, name):
    case = hf_family(name)
    findings = _audit(case, tmp_path)
    capsys.readouterr()
    loud = [c for c in findings["causes"] if c["severity"] in AT_LEAST_WARNING]
    bad = _corrupt_steps(case)
    covered = set().union(*(set(c["steps"]) for c in loud)) if loud else set()
    assert bad - covered == set()
    assert len([c for c in loud if not set(c["steps"]) & bad]) <= 2


@pytest.mark.parametrize("name", CORRUPT)
def test_a_corrupted_twin_ranks_the_corrupted_samples_first(hf_family, tmp_path, capsys, name):
    case = hf_family(name)
    findings = _audit(case, tmp_path)
    capsys.readouterr()
    first = next(c for c in findings["causes"] if c["severity"] in AT_LEAST_WARNING and c["suspect_samples"])
    assert set(first["suspect_samples"][: len(case.corrupt_ids)]) == set(case.corrupt_ids)


def test_findings_give_the_share_of_the_jumpiness_the_composition_explains(hf_family, tmp_path, capsys):
    findings = _audit(hf_family("group_by_length-s0-clean"), tmp_path)
    capsys.readouterr()
    osc = findings["oscillation"]
    assert osc["composition_variance_share"] == pytest.approx(0.672, abs=0.01)
    assert osc["bucket_variance_share"] == pytest.approx(0.443, abs=0.01)
    assert set(osc["variance_share_by_tag"]) == {"bucket", "cluster", "tokens", "padding"}
    assert osc["variance_share_by_tag"]["tokens"] == pytest.approx(0.574, abs=0.01)


def _driver_run(seed: int = 3, n: int = 600) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Loss and grad norm 2.5x higher on bucket 1 (above the spike ratio against the run's trend), a real spike at
    step 450 in bucket 0."""
    rng = np.random.default_rng(seed)
    tags = _tags(n, rng)
    tags.loc[450, ["bucket", "bucket_share_0", "bucket_share_1", "real_tokens"]] = [0, 1.0, 0.0, 160]
    level = np.where(tags["bucket"] == 1, 2.5, 1.0)
    loss = 3.0 * np.exp(-np.arange(n) / 500) * level * np.exp(0.03 * rng.standard_normal(n))
    grad = level * np.exp(0.05 * rng.standard_normal(n))
    loss[450] *= 2.5
    return pd.DataFrame({"step": np.arange(n), "loss": loss, "grad_norm": grad}), tags


@pytest.mark.parametrize("cuts", [[], [97, 98, 300], [1, 451, 455, 599]])
def test_the_live_driver_judges_with_the_causal_expectation_and_agrees_with_the_audit(cuts):
    from forensics.detect.spikes.driver import SpikeDriver

    metrics, tags = _driver_run()
    offline = SpikeDriver(["loss", "grad_norm"], "grad_norm").detect(metrics, tags)
    live = SpikeDriver(["loss", "grad_norm"], "grad_norm")
    found = []
    bounds = [0, *cuts, len(metrics)]
    for a, b in zip(bounds, bounds[1:]):
        found += live.update(metrics.iloc[a:b], tags)
    found += live.finish()
    as_dicts = lambda fs: sorted(json.dumps(f.to_dict(), sort_keys=True, default=str) for f in fs)  # noqa: E731
    assert as_dicts(found) == as_dicts(offline)
    # the first 48 rows have no fit yet: they are judged as a run without tags (its warm-up), so only later rows
    spikes = [f for f in offline if f.kind == "spike" and f.metric == "loss" and f.step >= 48]
    assert [f.peak_step for f in spikes] == [450]
    assert spikes[0].baseline == pytest.approx(spikes[0].value / 2.5, rel=0.1)
    (explained,) = [f for f in offline if f.kind == "expected_for_bucket" and f.metric == "loss"]
    assert explained.details["group"] == "composition" and explained.severity == "info"
