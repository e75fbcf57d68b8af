"""The frameworks' spike rules, re-implemented: each fires where its published rule says, and nowhere else."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forensics.detect.findings import Finding
from forensics.errors import ForensicsError
from forensics.evaluation.framework_rules import (
    FRAMEWORK_RULES,
    KillLossSpike,
    LightningSpikeDetection,
    MegatronSpikyLoss,
    MetaseqEwmRatio,
    OlmoStabilityMonitor,
    framework_rules,
)

LOSS = "train/loss"


def frame(values) -> pd.DataFrame:
    values = np.asarray(values, dtype=np.float64)
    return pd.DataFrame({"step": np.arange(len(values), dtype=np.int64), LOSS: values})


def spans(found: list[Finding]) -> list[tuple[int, int, int]]:
    return [(f.step, f.end_step, f.peak_step) for f in found]


def test_megatron_flags_ten_times_the_largest_of_the_first_100_finite_values():
    x = np.full(400, 1.0)
    x[:100] = np.linspace(1.0, 2.0, 100)  # the max of the first 100 values is 2.0
    x[5] = np.nan  # ignored: it does not count among the 100 samples, so step 100 is still a sample
    x[100] = 3.0  # the 100th finite value: raises the max to 3.0
    x[200] = 29.9  # < 10 x 3.0
    x[300] = 30.0  # >= 10 x 3.0
    found = MegatronSpikyLoss(LOSS).detect(frame(x))
    assert spans(found) == [(300, 300, 300)]
    assert found[0].baseline == 3.0 and found[0].score == pytest.approx(10.0)
    tr = MegatronSpikyLoss(LOSS).trace(frame(x))
    assert tr["reference"].iloc[101] == 3.0 and np.isnan(tr["reference"].iloc[100])


def test_kill_loss_spike_fires_on_the_fifth_consecutive_outlier_and_reports_the_streak():
    x = np.full(400, 1.0)
    x[150:154] = 3.0  # four outliers: patience 4 tolerates them
    x[300:306] = 3.0  # six: the 5th (step 304) raises the alarm; the event is the whole streak
    found = KillLossSpike(LOSS).detect(frame(x))
    assert spans(found) == [(300, 305, 300)]
    assert found[0].details["first_alarm_step"] == 304
    tr = KillLossSpike(LOSS).trace(frame(x))
    assert tr["outlier"].iloc[150:154].all() and not tr["alarm"].iloc[150:154].any()
    assert tr["alarm"].iloc[304:306].all() and not tr["alarm"].iloc[300:304].any()


def test_kill_loss_spike_window_holds_every_loss_outliers_included():
    x = np.full(300, 1.0)
    x[200:202] = 2.0  # 2.0 >= 2 x 1.0 is an outlier; it enters the window, so the next 2.0 is < 2 x 1.01
    x[50] = 9.0  # before the window of 100 is full: never judged
    tr = KillLossSpike(LOSS).trace(frame(x))
    assert tr["outlier"].tolist()[199:203] == [False, True, False, False]
    assert tr["reference"].iloc[201] == pytest.approx(1.01)
    assert np.isnan(tr["reference"].iloc[50])
    assert KillLossSpike(LOSS).detect(frame(x)) == []


def test_olmo_flags_above_mean_plus_six_std_of_the_previous_128_values():
    x = np.tile([1.0, 1.2], 200)  # mean 1.1, population std 0.1: the threshold is 1.7
    x[60] = 50.0  # fewer than 128 values before it: not judged
    x[250] = 1.7  # not above the threshold (strictly greater is needed)
    x[390] = 1.71  # its 128 previous values no longer hold the 1.7
    found = OlmoStabilityMonitor(LOSS).detect(frame(x))
    assert spans(found) == [(390, 390, 390)]
    assert found[0].baseline == pytest.approx(1.1) and found[0].score == pytest.approx(6.1)


def test_olmo_history_keeps_spikes_and_a_flat_history_never_fires():
    flat = np.full(300, 2.0)
    flat[200] = 100.0  # std of a flat window is 0: the callback does not judge
    assert OlmoStabilityMonitor(LOSS).detect(frame(flat)) == []
    x = np.tile([1.0, 1.2], 200)
    x[200] = 10.0
    x[201] = 1.2
    x[202] = 2.5  # the spike at 200 is in the window now: mean and std are inflated, 2.5 is not > them
    tr = OlmoStabilityMonitor(LOSS).trace(frame(x))
    assert tr["alarm"].iloc[200] and not tr["alarm"].iloc[202]
    assert tr["reference"].iloc[202] == pytest.approx((10.0 + 63 * 1.0 + 64 * 1.2) / 128)


def test_lightning_flags_rtol_above_the_running_mean_of_accepted_losses_and_nonfinite():
    x = np.full(60, 1.0)
    x[20] = 2.99  # |2.99 - 1| < 2 x 1: accepted, it enters the running mean
    x[21] = 1.0
    x[40] = 4.0  # running mean of the last 10 accepted: (9 + 2.99)/10 > 1.19 -> 4.0 - 1.199 >= 2 x 1.199
    x[41] = 4.0  # spikes never enter the mean: the next 4.0 is flagged again (one event of two steps)
    x[50] = np.nan
    found = LightningSpikeDetection(LOSS).detect(frame(x))
    assert spans(found) == [(40, 41, 40), (50, 50, 50)]
    tr = LightningSpikeDetection(LOSS).trace(frame(x))
    assert tr["reference"].iloc[40] == pytest.approx(tr["reference"].iloc[41])


def test_lightning_never_flags_a_loss_that_improved_on_the_last_accepted_one():
    down = LightningSpikeDetection(LOSS, rtol=0.5).detect(frame([10.0, 1.0, 1.0]))
    up = LightningSpikeDetection(LOSS, rtol=0.5).detect(frame([1.0, 10.0, 1.0]))
    assert down == [] and spans(up) == [(1, 1, 1)]


def test_metaseq_skips_above_the_ratio_and_keeps_the_ewm_of_accepted_losses():
    x = np.full(40, 1.0)
    x[10] = 1.5  # ratio 1.5 is not > 1.5: accepted, EWM = 0.8 + 0.2 x 1.5 = 1.1
    x[11] = 1.66  # 1.66 / 1.1 = 1.509 > 1.5: skipped, the EWM stays 1.1
    x[12] = 1.66  # again
    x[13] = 1.0  # accepted: EWM = 0.8 x 1.1 + 0.2 = 1.08
    x[14] = 1.62  # 1.62 / 1.08 = 1.5: not skipped
    x[20] = np.nan  # never reaches the rule in metaseq (a NaN gradient raises first)
    found = MetaseqEwmRatio(LOSS).detect(frame(x))
    assert spans(found) == [(11, 12, 11)]
    assert found[0].baseline == pytest.approx(1.1)
    tr = MetaseqEwmRatio(LOSS).trace(frame(x))
    assert tr["reference"].iloc[14] == pytest.approx(1.08)
    assert not tr["alarm"].iloc[14] and not tr["alarm"].iloc[20]


@pytest.mark.parametrize("cls", FRAMEWORK_RULES, ids=lambda c: c.__name__)
def test_any_chunking_gives_the_same_findings_as_one_pass(cls):
    rng = np.random.default_rng(3)
    x = 2.0 + 0.05 * rng.standard_normal(3_000)
    x[[700, 1500, 1501, 2400]] = [9.0, 12.0, 11.0, 40.0]
    x[2000:2008] = 7.0
    x[900] = np.nan
    whole = spans(cls(LOSS).detect(frame(x)))
    assert whole  # every rule finds something in this series
    rule = cls(LOSS)
    rule.reset()
    got = []
    for a, b in [(0, 1), (1, 700), (700, 701), (701, 1501), (1501, 2003), (2003, 3_000)]:
        got += rule.update(frame(x).iloc[a:b])
    got += rule.finish()
    assert spans(got) == whole


def test_rules_emit_spike_findings_with_their_source_and_parameters():
    x = np.tile([1.0, 1.02], 250)
    x[300:306] = 50.0
    for rule in framework_rules(LOSS):
        (f,) = rule.detect(frame(x))
        assert f.kind == "spike" and f.metric == LOSS and f.step == 300 and f.peak_step == 300
        assert f.details["rule"] == rule.label and f.details["source"] == rule.source
        assert "metric" not in f.details["params"] and f.evidence and rule.label in f.evidence[0]
        assert f.to_dict()["kind"] == "spike"


def test_missing_metric_column_is_bad_input():
    with pytest.raises(ForensicsError, match="missing column 'loss'"):
        OlmoStabilityMonitor("loss").detect(frame([1.0, 2.0]))
