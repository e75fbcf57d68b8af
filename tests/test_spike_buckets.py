"""The spike rule with buckets where a young bucket's offset cannot be trusted: a trend that offsets learned in the
warm-up's steep descent pulled below the run's level does not make every later step of the rare buckets a spike."""

from __future__ import annotations

import numpy as np
import pytest

from forensics.datasets.corpus import corpus_specs, make_run
from forensics.datasets.loss_model import GRAD_NORM, LOSS
from forensics.detect import detect_spikes
from forensics.detect.spikes import kernel as K
from forensics.detect.spikes.detector import SpikeDetector
from forensics.evaluation.scoring import score_run


def _params() -> np.ndarray:
    det = SpikeDetector(LOSS)  # z 6, ratio 1.5, z_large 4.5, ratio_large 1.75, bucket_window 64
    det.reset()
    params = det.params_.copy()
    params["z_large"] = det.z_large  # as a detector with tags runs
    return params


# (steps of the bucket, value, trend, noise, median of the raw values, their noise) -> not flagged; z 6, ratio 1.5
LOW_TREND_TABLE = [
    (63, 1.2, 0.5, 0.05, 1.0, 0.1, True),  # the trend half the run's level, the step ordinary against it
    (64, 1.2, 0.5, 0.05, 1.0, 0.1, False),  # a mature bucket's offset is trusted
    (1, 1.2, 0.5, 0.05, 1.0, 0.1, True),
    (63, 1.5, 0.5, 0.05, 1.0, 0.08, False),  # exactly 1.5x the raw median at 6.25 noise: a spike either way
    (63, 1.49, 0.5, 0.05, 1.0, 0.08, True),  # just under the jump
    (63, 1.2, 0.5, 0.01, 0.75, 0.1, True),  # the raw median exactly 1.5x the trend: the trend is below the run
    (63, 1.2, 0.5, 0.01, 0.7499, 0.1, False),  # just under: the trend is the run's level, the offsets decide
    (63, 1.2, 0.25, 0.125, 1.0, 0.1, True),  # the raw median exactly 6 noise units above the trend
    (63, 1.2, 0.5, 0.05, 0.5, 0.1, False),  # the trend at the raw median
]


@pytest.mark.parametrize(("n_bucket", "value", "trend", "noise", "mix", "noise_raw", "unflagged"), LOW_TREND_TABLE)
def test_a_young_bucket_is_not_judged_against_a_trend_below_the_run(
    n_bucket, value, trend, noise, mix, noise_raw, unflagged
):
    got = K._below_a_low_trend(_params()[0], n_bucket, value, trend, noise, mix, noise_raw, 6.0, 1.0)
    assert bool(got) is unflagged


def test_rare_buckets_first_seen_in_a_steep_warmup_raise_no_false_spikes_after_it():
    """The corpus's ``slow-rise-2`` (full size, seed 0): a warm-up from 7.6 to 0.9 with tau 61 steps, six length
    buckets of which one holds most steps. Judged against its composition and its buckets, steps 214-564 of the rare
    buckets used to be 46 false spikes of 2-52x a baseline that had sunk to 0.02-0.5 (the loss was near 1.0)."""
    (spec,) = [s for s in corpus_specs("full", 0) if s.name == "slow-rise-2"]
    run = make_run(spec)
    found = detect_spikes(run.metrics, [LOSS, GRAD_NORM], tags=run.tags)
    steps = run.metrics["step"].to_numpy(np.int64)
    score = score_run(run.labels.spikes, run.labels.spans(), steps, found, metric=LOSS)
    assert score.n_false == 0
    assert not [f.step for f in found if f.kind == "spike" and f.metric == LOSS and 200 <= f.step <= 600]
