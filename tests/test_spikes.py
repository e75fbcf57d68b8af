"""The spike detector on seeded synthetic runs (and one real log): what fires, what never does, online = offline."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forensics.detect import SpikeDetector, detect_spikes
from forensics.detect.findings import Finding
from forensics.errors import ForensicsError

LOSS = "train/loss"
N_CLEAN = 30_000  # steps per clean run: "at most 1 event per 10,000 steps" allows 3


def decaying(n: int) -> np.ndarray:
    """A loss that drops from ~7 to ~0.9 over the first few hundred steps, then declines slowly."""
    s = np.arange(n)
    return 0.9 + 6.0 * np.exp(-s / 60.0) - 0.15 * s / max(n, 1)


def frame(loss: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"step": np.arange(len(loss), dtype=np.int64), LOSS: loss})


def spikes_of(found: list[Finding]) -> list[Finding]:
    return [f for f in found if f.kind == "spike"]


def test_story_jumps_at_254_and_258_are_two_spikes_found_within_two_steps():
    rng = np.random.default_rng(0)
    loss = decaying(2_000) * (1 + 0.02 * rng.standard_normal(2_000))
    loss[254], loss[258] = 4.3, 5.8
    found = SpikeDetector(LOSS).detect(frame(loss))
    spikes = spikes_of(found)
    assert [f.step for f in spikes] == [254, 258]
    for f, peak in zip(spikes, (4.3, 5.8)):
        assert f.peak_step == f.end_step == f.step
        assert f.value == pytest.approx(peak)
        assert 0.8 < f.baseline < 1.0  # the decayed level, not the warm-up's
        assert f.details["ratio"] > 4 and f.score > 50
        assert f.details["recovery_step"] == f.step + 1
        # the rule reports evidence (a move beyond the noise), not a severity: alone, one line is a warning
        assert f.details["support"] == {"moved": True} and f.severity == "info"
    assert len(found) == 2  # nothing else: no level shift, no NaN


def test_spike_spanning_several_steps_is_one_event_with_its_peak():
    rng = np.random.default_rng(1)
    loss = decaying(3_000) * (1 + 0.02 * rng.standard_normal(3_000))
    loss[1500:1504] = [2.5, 4.0, 3.1, 2.0]
    (f,) = spikes_of(SpikeDetector(LOSS).detect(frame(loss)))
    assert (f.step, f.peak_step, f.end_step, f.details["n_steps"]) == (1500, 1501, 1503, 4)
    assert f.details["recovery_step"] == 1504


def _clean_runs():
    rng = np.random.default_rng(7)
    s = np.arange(N_CLEAN)
    base = decaying(N_CLEAN)
    buckets = rng.integers(0, 6, N_CLEAN)
    offsets = np.array([0.12, 0.08, 0.04, 0.0, -0.04, -0.1])
    return {
        "no_spike_gaussian": (base * (1 + 0.02 * rng.standard_normal(N_CLEAN)), None),
        # Student-t with 3 degrees of freedom scaled to a 2% standard deviation: 10+ sigma excursions happen
        "student_t3": (base * (1 + 0.02 * rng.standard_t(3, N_CLEAN) / np.sqrt(3)), None),
        "steep_warmup": (1.0 + 10.0 * np.exp(-s / 25.0) + 0.02 * rng.standard_normal(N_CLEAN), None),
        "level_shift_x1.6": (np.where(s < 12_000, 1.0, 1.6) * (1 + 0.03 * rng.standard_normal(N_CLEAN)), None),
        "level_shift_at_threshold_x1.5": (
            np.where(s < 12_000, 1.0, 1.5) * (1 + 0.03 * rng.standard_normal(N_CLEAN)),
            None,
        ),
        "bucket_effects": (base + offsets[buckets] + 0.015 * rng.standard_normal(N_CLEAN), buckets),
    }


@pytest.mark.parametrize("name", list(_clean_runs()))
def test_clean_runs_give_at_most_one_event_per_10k_steps(name):
    loss, buckets = _clean_runs()[name]
    tags = None if buckets is None else pd.DataFrame({"step": np.arange(N_CLEAN), "bucket": buckets})
    found = SpikeDetector(LOSS).detect(frame(loss), tags)
    assert len(spikes_of(found)) <= N_CLEAN // 10_000
    if name.startswith("level_shift"):
        (shift,) = [f for f in found if f.kind == "level_shift"]  # the new level is reported once, not a spike
        assert 12_000 <= shift.step <= 12_010
        assert shift.details["new_level"] == pytest.approx(float(name.split("x")[-1]), rel=0.05)


def test_both_conditions_are_needed_against_heavy_tails():
    """The robust score alone fires on Student-t noise; with the relative jump required it does not."""
    rng = np.random.default_rng(3)
    loss = decaying(N_CLEAN) * (1 + 0.02 * rng.standard_t(3, N_CLEAN) / np.sqrt(3))
    score_only = spikes_of(SpikeDetector(LOSS, ratio=1.0).detect(frame(loss)))
    both = spikes_of(SpikeDetector(LOSS).detect(frame(loss)))
    assert len(score_only) > 20
    assert len(both) <= 3


def test_nonfinite_steps_are_their_own_findings_and_leave_the_baseline_intact():
    rng = np.random.default_rng(2)
    loss = decaying(3_000) * (1 + 0.02 * rng.standard_normal(3_000))
    loss[[500, 1200, 1201, 1202]] = np.nan
    loss[501], loss[900] = np.inf, -np.inf
    loss[1203] = 4.0  # a spike right after a run of NaN
    det = SpikeDetector(LOSS)
    found = det.detect(frame(loss))
    bad = [f for f in found if f.kind == "nonfinite"]
    assert [f.step for f in bad] == [500, 501, 900, 1200, 1201, 1202]
    assert np.isnan(bad[0].value) and bad[1].value == np.inf and bad[2].value == -np.inf
    assert [f.step for f in spikes_of(found)] == [1203]
    trace = det.trace(frame(loss)).set_index("step")
    assert (trace.loc[[500, 501, 900, 1200], "status"] == "nonfinite").all()
    level = np.median(loss[440:500])
    assert trace.loc[502, "baseline"] == pytest.approx(level, rel=0.03)
    assert trace.loc[1203, "baseline"] == pytest.approx(np.median(loss[1150:1200]), rel=0.03)


def test_baseline_without_trend_is_the_rolling_median_of_earlier_accepted_values():
    rng = np.random.default_rng(4)
    loss = 1.0 + 0.05 * rng.standard_normal(5_000)
    trace = SpikeDetector(LOSS, window=64, trend=False).trace(frame(loss))
    expected = pd.Series(loss).rolling(64, min_periods=1).median().shift(1).to_numpy()
    judged = trace["status"].to_numpy() == "accepted"
    assert judged.sum() > 4_900
    np.testing.assert_allclose(trace["baseline"].to_numpy()[judged], expected[judged], rtol=0, atol=1e-12)


def test_trend_baseline_follows_a_steep_descent():
    """Extrapolating along the two half-window medians keeps the baseline on a linear descent, where a plain
    rolling median lags a quarter window behind."""
    s = np.arange(400)
    loss = 10.0 - 0.02 * s
    tr = SpikeDetector(LOSS, window=64).trace(frame(loss)).set_index("step")
    plain = SpikeDetector(LOSS, window=64, trend=False).trace(frame(loss)).set_index("step")
    assert tr.loc[300, "baseline"] == pytest.approx(loss[300], abs=0.03)
    assert plain.loc[300, "baseline"] == pytest.approx(loss[300] + 0.02 * 32.5, abs=0.01)


def _chunk_case() -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(11)
    n = 3_000
    buckets = rng.integers(0, 4, n)
    loss = decaying(n) + np.array([0.1, 0.0, -0.05, 0.2])[buckets] + 0.02 * rng.standard_normal(n)
    loss[[400, 401, 403, 1100, 2999]] = [4.0, 3.5, 5.0, 6.0, 5.5]  # adjacent spikes, one open at the end
    loss[[700, 701]] = [np.nan, np.inf]
    loss[2000:] += 1.0  # a level shift
    tags = pd.DataFrame({"step": np.arange(n), "bucket": buckets})
    return frame(loss), tags


def _as_dicts(found: list[Finding]) -> list[dict]:
    return sorted((f.to_dict() for f in found), key=lambda d: (d["step"], d["kind"]))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(min_value=1, max_value=2_999), max_size=25, unique=True))
def test_any_chunking_gives_the_same_findings_as_one_pass(cuts):
    metrics, tags = _chunk_case()
    offline = SpikeDetector(LOSS).detect(metrics, tags)
    det = SpikeDetector(LOSS)
    det.reset()
    online: list[Finding] = []
    bounds = [0, *sorted(cuts), len(metrics)]
    for a, b in zip(bounds, bounds[1:]):
        online += det.update(metrics.iloc[a:b], tags)
    online += det.finish()
    assert _as_dicts(online) == _as_dicts(offline)
    kinds = sorted(f.kind for f in offline)
    assert kinds.count("spike") == 4 and kinds.count("level_shift") == 1 and kinds.count("nonfinite") == 2


def test_online_reports_a_spike_confirm_rows_after_it_and_shows_it_pending_before():
    rng = np.random.default_rng(5)
    metrics = frame(decaying(1_000) * (1 + 0.02 * rng.standard_normal(1_000)))
    metrics.loc[600, LOSS] = 4.0
    det = SpikeDetector(LOSS, confirm=5)
    det.reset()
    assert det.update(metrics.iloc[:603]) == []
    pending = det.pending()
    assert [(f.kind, f.step) for f in pending] == [("spike", 600)]
    assert det.update(metrics.iloc[603:605]) == []  # 601-604: four accepted rows after it
    (f,) = det.update(metrics.iloc[605:606])  # the fifth confirms that it returned
    assert (f.kind, f.step, f.details["recovery_step"]) == ("spike", 600, 601)
    assert det.update(metrics.iloc[606:]) == [] and det.finish() == []


def test_step_high_only_for_its_bucket_is_not_a_spike_with_tags_but_is_without():
    rng = np.random.default_rng(6)
    n = 20_000
    buckets = np.where(rng.random(n) < 0.03, 5, rng.integers(0, 5, n))  # bucket 5: rare, long, much higher
    loss = decaying(n) + np.where(buckets == 5, 1.0, 0.0) + 0.015 * rng.standard_normal(n)
    tags = pd.DataFrame({"step": np.arange(n), "bucket": buckets})
    loss[15_000] = 3.0 * decaying(n)[15_000]  # a real spike in an ordinary bucket
    buckets_at = dict(zip(tags["step"], tags["bucket"]))
    without = spikes_of(SpikeDetector(LOSS).detect(frame(loss)))
    high_steps = [f.step for f in without if buckets_at[f.step] == 5]
    assert len(high_steps) > 100  # without tags the long-bucket steps look like spikes

    det = SpikeDetector(LOSS)
    found = det.detect(frame(loss), tags)
    assert [f.step for f in spikes_of(found)] == [15_000]
    (expected,) = [f for f in found if f.kind == "expected_for_bucket"]
    assert expected.tags == {"bucket": 5}
    assert expected.details["n_steps"] >= 0.9 * len(high_steps)
    assert expected.details["offset"] > 0.8
    trace = det.trace(frame(loss), tags).set_index("step")
    assert (trace.loc[high_steps[-20:], "status"] == "expected_for_bucket").all()


def test_a_small_event_buffer_gives_the_same_findings(monkeypatch):
    """The kernel pauses when its event buffer fills and resumes where it stopped."""
    rng = np.random.default_rng(9)
    n = 5_000
    loss = decaying(n) * (1 + 0.02 * rng.standard_normal(n))
    loss[np.arange(300, n, 37)] *= 3.0  # 128 spikes
    expected = _as_dicts(SpikeDetector(LOSS).detect(frame(loss)))
    monkeypatch.setattr("forensics.detect.spikes.detector.EVENT_BUFFER", 3)
    assert _as_dicts(SpikeDetector(LOSS).detect(frame(loss))) == expected
    assert [d["step"] for d in expected] == list(range(300, n, 37))


def test_detect_spikes_copies_bucket_cluster_and_epoch_of_the_peak_step():
    rng = np.random.default_rng(8)
    n = 1_500
    loss = decaying(n) * (1 + 0.02 * rng.standard_normal(n))
    loss[900] = 4.0
    grad = 1.0 + 0.1 * rng.standard_normal(n)
    grad[899:902] = [1.1, 30.0, 12.0]
    metrics = pd.DataFrame({"step": np.arange(n), LOSS: loss, "grad_norm": grad})
    tags = pd.DataFrame(
        {
            "step": np.arange(n),
            "epoch": np.arange(n) // 500,
            "bucket": np.full(n, 5),
            "cluster": np.full(n, 2),
            "cluster_name": ["code"] * n,
        }
    )
    found = detect_spikes(metrics, [LOSS, "grad_norm"], tags=tags)
    spikes = {(f.metric, f.step): f for f in spikes_of(found)}
    assert set(spikes) == {(LOSS, 900), ("grad_norm", 900)}
    assert spikes[("grad_norm", 900)].end_step == 901
    flat = spikes[(LOSS, 900)].to_dict()
    assert {k: flat[k] for k in ("bucket", "bucket_range", "cluster", "cluster_name", "epoch")} == {
        "bucket": 5,
        "bucket_range": "(3296, 8192]",
        "cluster": 2,
        "cluster_name": "code",
        "epoch": 1,
    }


def test_missing_metric_column_is_bad_input():
    with pytest.raises(ForensicsError, match="missing column 'grad_norm'"):
        SpikeDetector("grad_norm").detect(frame(np.ones(10)))
    with pytest.raises(ForensicsError, match="window"):
        SpikeDetector(LOSS, window=2).detect(frame(np.ones(10)))


def _modded_nanogpt(real_logs_dir: Path) -> pd.DataFrame:
    path = real_logs_dir / "modded-nanogpt-1b-adamw.log"
    rows = re.findall(r"^step:(\d+)/\d+ train_loss:(\S+)", path.read_text(), flags=re.M)
    return pd.DataFrame({"step": [int(a) for a, _ in rows], LOSS: [float(b) for _, b in rows]})


def test_real_log_one_step_spikes_are_found(real_logs_dir):
    """modded-nanogpt's 20,344-step log has ~36 one-step spikes of 1.5-1.9x its median (fixtures/real-logs/README.md),
    e.g. step 5964 at 5.70 against ~3.03."""
    metrics = _modded_nanogpt(real_logs_dir)
    found = SpikeDetector(LOSS).detect(metrics)
    spikes = spikes_of(found)
    assert 30 <= len(spikes) <= 42
    assert len(found) == len(spikes)  # no level shift, no NaN
    by_step = {f.step: f for f in spikes}
    assert by_step[5964].value == pytest.approx(5.7021)
    assert by_step[5964].baseline == pytest.approx(3.0, abs=0.1)
    assert all(f.details["n_steps"] == 1 for f in spikes)
    assert all(1.5 <= f.details["ratio"] < 2.2 for f in spikes)


def test_a_spike_on_a_metric_below_zero_is_graded_by_its_score():
    """A negative baseline has no ratio: a huge jump is still a spike judged by its score, with no NaN ratio."""
    import numpy as np
    import pandas as pd

    from forensics.detect import SpikeDetector

    rng = np.random.default_rng(3)
    values = -1.0 + 0.01 * rng.standard_normal(600)
    values[400] = 5.0
    found = SpikeDetector("m", min_jump=0.5).detect(pd.DataFrame({"step": np.arange(600), "m": values}))
    spikes = [f for f in found if f.kind == "spike"]
    assert [f.step for f in spikes] == [400]
    assert spikes[0].details["support"] == {"moved": True} and spikes[0].score > 100
    (alone,) = detect_spikes(pd.DataFrame({"step": np.arange(600), "m": values}), "m", min_jump=0.5)
    assert alone.severity == "warning"  # one line of evidence


def _bloom_excerpt(real_logs_dir: Path) -> pd.DataFrame:
    """The 13-row Megatron excerpt around BLOOM-176B's spike (train rows only, not the validation line)."""
    text = (real_logs_dir / "bloom-176b-tr11-megatron.log").read_text()
    rows = re.findall(r"iteration\s+(\d+)/.*?lm loss: (\S+) \| grad norm: (\S+) \|", text)
    return pd.DataFrame(
        {
            "step": [int(a) for a, _, _ in rows],
            "lm loss": [float(b) for _, b, _ in rows],
            "grad norm": [float(c) for _, _, c in rows],
        }
    )


def test_short_excerpt_spike_is_judged_two_sided(real_logs_dir):
    """13 rows are all warm-up for the causal rule; the two-sided rule still finds lm loss 2.2 -> 5.1 at 31219
    and the grad norm episode around it as one event, and says how they were judged."""
    metrics = _bloom_excerpt(real_logs_dir)
    assert len(metrics) == 13
    (loss,) = SpikeDetector("lm loss").detect(metrics)
    assert (loss.kind, loss.step, loss.end_step, loss.peak_step) == ("spike", 31219, 31219, 31219)
    assert loss.value == pytest.approx(5.098124) and loss.baseline == pytest.approx(2.345279)
    assert loss.details["judged_by"] == "two_sided" and loss.details["two_sided_span"] == [12695, 45000]
    assert loss.details["support"] == {"moved": True} and loss.details["recovery_step"] == 31220
    (grad,) = SpikeDetector("grad norm").detect(metrics)
    assert (grad.step, grad.end_step, grad.peak_step) == (31217, 31222, 31219)


def test_warmup_descent_and_noise_give_no_two_sided_spike_but_a_warmup_spike_is_found():
    rng = np.random.default_rng(11)
    loss = decaying(400) * (1 + 0.02 * rng.standard_normal(400))  # the steep descent is all in the warm-up
    assert SpikeDetector(LOSS).detect(frame(loss)) == []
    loss[10] = 2.5 * loss[9]
    (f,) = SpikeDetector(LOSS).detect(frame(loss))
    assert (f.step, f.details["judged_by"], f.details["two_sided_span"]) == (10, "two_sided", [0, 31])
    later = spikes_of(SpikeDetector(LOSS).detect(frame(np.r_[loss[:300], 3 * loss[300], loss[301:]])))
    assert sorted((g.step, g.details["judged_by"]) for g in later) == [(10, "two_sided"), (300, "causal")]


@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=12), max_size=6, unique=True))
def test_short_series_online_equals_offline(cuts, real_logs_dir):
    metrics = _bloom_excerpt(real_logs_dir)
    offline = SpikeDetector("lm loss").detect(metrics)
    det = SpikeDetector("lm loss")
    det.reset()
    online: list[Finding] = []
    bounds = [0, *sorted(cuts), len(metrics)]
    for a, b in zip(bounds, bounds[1:]):
        online += det.update(metrics.iloc[a:b])
    online += det.finish()
    assert _as_dicts(online) == _as_dicts(offline) and len(offline) == 1


def test_loss_spike_led_by_the_grad_norm_gets_a_higher_confidence(real_logs_dir):
    """BLOOM-176B: the grad norm rose two steps before the loss jumped; together they are surer than alone."""
    metrics = _bloom_excerpt(real_logs_dir)
    joint = {f.metric: f for f in detect_spikes(metrics, ["lm loss", "grad norm"])}
    alone = detect_spikes(metrics, "lm loss")[0]
    assert joint["lm loss"].details["joint"] == "led" and joint["grad norm"].details["joint"] == "loss_response"
    assert "joint" not in alone.details
    assert 0.5 <= alone.details["confidence"] < joint["lm loss"].details["confidence"] <= 1.0
    assert joint["lm loss"].details["confidence"] == pytest.approx(
        1 - 0.4 * (1 - alone.details["confidence"]), abs=1e-3
    )


@pytest.mark.parametrize(
    ("grad_steps", "other_loss", "joint"),
    [
        ([100], [], "accompanied"),  # the grad norm spiked at the loss spike's step
        ([100, 96], [96], "accompanied"),  # with the loss at both: each spike is accompanied, none is led
        ([96], [96], "none"),  # the grad spike 4 steps before came with an earlier loss spike: it belongs to that one
        ([96], [], "led"),  # ... and alone it leads this one
        ([90], [], "led"),  # JOINT_LEAD (10) steps before: still leads
        ([89], [], "none"),  # one step further: too far to lead
        ([101], [], "none"),  # after the loss spike's end: the loss did not follow it
    ],
)
def test_the_grad_norm_leads_a_loss_spike_only_when_no_other_loss_spike_owns_it(grad_steps, other_loss, joint):
    """Two bad batches a few steps apart (the demo's steps 254 and 258) each raise loss and grad norm together: the
    grad-norm spike of the first is not an optimizer-led warning for the second."""
    from forensics.detect.spikes.driver import joint_confidence

    f = Finding("spike", 100, metric="loss", end_step=100, score=10.0, details={"thresholds": {"z": 5.0}})
    spans = [("loss", 100, 100), *[("loss", s, s) for s in other_loss], *[("grad_norm", s, s) for s in grad_steps]]
    assert joint_confidence(f, spans, "grad_norm")[1] == joint
