"""Scoring detections against labels: hits within the margin, false events outside spans, attribution named first."""

from __future__ import annotations

import numpy as np
import pytest

from forensics.detect.findings import Finding
from forensics.evaluation.scoring import (
    Score,
    SpikeLabel,
    clean_steps,
    false_events,
    in_spans,
    match_events,
    merge_spans,
    named_first,
    score_run,
)

LOSS = "train/loss"


def spike(step: int, end: int | None = None, **kw) -> Finding:
    return Finding(
        kind="spike", step=step, end_step=end if end is not None else step, peak_step=step, metric=LOSS, **kw
    )


def label(start: int, shape: str = "one_step", **kw) -> SpikeLabel:
    return SpikeLabel(start=start, end=start, peak=start, shape=shape, factor=3.0, metric=LOSS, **kw)


def test_a_hit_starts_within_two_steps_of_the_label():
    pairs = match_events([100, 200, 300, 400], [98, 203, 300, 402])
    assert pairs == [(0, 0), (2, 2), (3, 3)]  # 203 is three steps late: no hit


def test_each_label_and_each_detection_counts_once_closest_first():
    assert match_events([100, 102], [101]) == [(0, 0)]  # one detection cannot hit two labels
    assert match_events([100], [99, 100, 101]) == [(0, 1)]  # the exact start wins
    assert match_events([100, 101], [101, 100]) == [(0, 1), (1, 0)]
    assert match_events([], [1, 2]) == [] and match_events([1], []) == []


def test_margin_is_a_parameter():
    assert match_events([100], [105], margin=5) == [(0, 0)]
    assert match_events([100], [105], margin=4) == []


def test_spans_merge_and_contain_their_ends():
    merged = merge_spans([(10, 20), (21, 25), (40, 50), (45, 60), (5, 3)])
    assert merged.tolist() == [[10, 25], [40, 60]]
    assert in_spans([9, 10, 25, 26, 39, 60, 61], merged).tolist() == [False, True, True, False, False, True, False]
    assert clean_steps(np.arange(100), [(10, 19), (15, 24)]) == 85


def test_false_events_are_unmatched_detections_outside_every_span():
    # 50: in a span, unmatched (a second event on a decay): not false; 500: outside: false; 100: matched
    assert false_events([50, 100, 500], matched=[1], spans=[(40, 60)]).tolist() == [2]


def test_score_run_counts_recall_false_rate_and_shapes():
    labels = [label(1_000), label(5_000, "few_steps"), label(9_000, "slow_rise")]
    spans = [(998, 1_005), (4_998, 5_010), (8_990, 9_012)]
    found = [
        spike(1_002),
        spike(1_003),
        spike(5_003),
        spike(9_000, 9_004),
        spike(15_000),
        spike(18_000),
        Finding(kind="level_shift", step=12_000, metric=LOSS),
    ]
    s = score_run(labels, spans, np.arange(20_000), found, metric=LOSS)
    assert (s.n_labels, s.n_hits, s.n_detected, s.n_false) == (3, 2, 6, 2)
    assert s.recall == pytest.approx(2 / 3)
    assert s.n_clean_steps == 20_000 - 8 - 13 - 23
    assert s.false_per_10k == pytest.approx(2 / s.n_clean_steps * 1e4)
    assert s.by_shape == {"one_step": [1, 1], "few_steps": [0, 1], "slow_rise": [1, 1]}
    assert s.shape_recall("few_steps") == 0.0 and np.isnan(s.shape_recall("grad_led"))


def test_findings_of_another_metric_and_labels_of_another_metric_are_left_out():
    labels = [label(100), SpikeLabel(start=300, end=300, peak=300, shape="one_step", factor=2.0, metric="grad_norm")]
    found = [spike(100), Finding(kind="spike", step=700, metric="grad_norm")]
    s = score_run(labels, [], np.arange(1_000), found, metric=LOSS)
    assert (s.n_labels, s.n_hits, s.n_false) == (1, 1, 0)


def test_attribution_counts_what_the_finding_names_first():
    labels = [
        label(100, bucket=5, cluster=4, sample_ids=(7, 8)),
        label(400, bucket=2, cluster=1, sample_ids=(9,)),
        label(700, "grad_led"),
    ]
    right = spike(100, tags={"bucket": 5, "cluster": 4}, suspect_samples=[8, 1, 2])
    wrong = spike(401, tags={"bucket": 2, "cluster": 3}, suspect_samples=[1, 9])
    s = score_run(labels, [], np.arange(1_000), [right, wrong, spike(700)], metric=LOSS)
    assert s.attribution == {"bucket": [2, 2], "cluster": [1, 2], "samples": [1, 2]}  # grad_led names nothing
    assert s.attribution_accuracy("cluster") == 0.5 and s.names_anything
    bare = score_run(labels, [], np.arange(1_000), [spike(100)], metric=LOSS)
    assert bare.attribution == {"bucket": [0, 1], "cluster": [0, 1], "samples": [0, 1]} and not bare.names_anything


def test_ranked_attribution_overrides_the_step_tag():
    f = spike(
        100,
        tags={"bucket": 5, "cluster": 4},
        suspect_samples=[3],
        details={"attribution": {"buckets": [{"bucket": 2}, {"bucket": 5}], "clusters": []}},
    )
    assert (named_first(f, "bucket"), named_first(f, "cluster"), named_first(f, "samples")) == (2, 4, 3)
    assert named_first(spike(1), "bucket") is None and named_first(spike(1), "samples") is None


def test_scores_add_up_over_runs():
    a = score_run([label(100)], [(98, 105)], np.arange(10_000), [spike(100), spike(5_000)], metric=LOSS)
    b = score_run([label(200, "few_steps")], [], np.arange(5_000), [], metric=LOSS)
    total = Score() + a + b
    assert (total.n_labels, total.n_hits, total.n_false, total.n_steps) == (2, 1, 1, 15_000)
    assert total.n_clean_steps == 10_000 - 8 + 5_000
    assert total.by_shape == {"one_step": [1, 1], "few_steps": [0, 1]}
    assert np.isnan(Score().recall) and np.isnan(Score().false_per_10k)
