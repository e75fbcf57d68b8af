"""The labelled corpus is deterministic, and its labels say what its series hold: spikes where labelled, else clean."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from forensics.datasets.corpus import (
    DATA_LED,
    SHAPES,
    T_CAP,
    RunSpec,
    corpus_specs,
    make_run,
)
from forensics.datasets.loss_model import LOSS
from forensics.datasets.samples import CORRUPT_PATTERN
from forensics.evaluation.scoring import in_spans
from forensics.schema import CLUSTER, STEP, TEXT
from forensics.tagging import tag_steps

SPEC = RunSpec(
    name="spikes",
    seed=11,
    n_steps=3_000,
    bucket_scale=1.0,
    noise_sd=0.02,
    spikes=("one_step", "few_steps", "slow_rise", "grad_led", "one_step"),
    nan_steps=2,
    level_shifts=1,
)


@pytest.fixture(scope="module")
def runs():
    """The test corpus (five short runs: every shape but the story, heavy tails, NaN, resumed, grad accumulation)."""
    return {spec.name: make_run(spec) for spec in corpus_specs("test")}


@pytest.fixture(scope="module")
def spiky():
    return make_run(SPEC)


def noise_bound(run) -> float:
    """The largest |log(loss / baseline)| the run's noise can reach (1.5: the largest per-step token factor)."""
    spec = run.spec
    return spec.noise_sd * 1.5 * (T_CAP if spec.noise == "student_t" else 6.0)


def test_same_spec_gives_identical_tables_and_labels(spiky):
    again = make_run(SPEC)
    for name in ("metrics", "tags", "plan", "samples"):
        pd.testing.assert_frame_equal(getattr(spiky, name), getattr(again, name))
    assert spiky.labels == again.labels
    other = make_run(replace(SPEC, seed=12))
    assert not np.allclose(other.metrics[LOSS].to_numpy(), spiky.metrics[LOSS].to_numpy(), equal_nan=True)


def test_labelled_spikes_sit_above_their_baseline_by_the_shape_factor(runs, spiky):
    checked = 0
    for run in [spiky, *runs.values()]:
        loss = run.metrics[LOSS].to_numpy()
        tol = noise_bound(run)
        for lab in run.labels.spikes:
            p = run.factor[lab.peak]
            got = np.log(loss[lab.peak] / run.baseline[lab.peak])
            assert abs(got - np.log(p)) <= tol, (run.name, lab)
            assert p >= 1.6 and lab.factor == pytest.approx(p)
            # start..end: at or above half the peak's excess, and the step before the start is below it
            half = 1.0 + 0.5 * (p - 1.0)
            assert (run.factor[lab.start : lab.end + 1] >= half - 1e-9).all()
            assert run.factor[lab.start - 1] < half
            assert np.log(loss[lab.start] / run.baseline[lab.start]) >= np.log(half) - tol
            checked += 1
    assert checked >= 14


def test_clean_spans_hold_no_injected_event(runs, spiky):
    for run in [spiky, *runs.values()]:
        clean = run.clean_mask()
        loss = run.metrics[LOSS].to_numpy()
        assert clean.mean() > 0.95
        assert (run.factor[clean] == 1.0).all(), run.name
        assert np.isfinite(loss[clean]).all()
        assert np.abs(np.log(loss[clean] / run.baseline[clean])).max() <= noise_bound(run)
        for s in run.labels.nonfinite_steps:
            assert np.isnan(loss[s]) and not clean[s]


def test_every_shape_but_the_story_is_in_the_test_corpus(runs):
    shapes = {lab.shape for run in runs.values() for lab in run.labels.spikes}
    assert shapes == set(SHAPES) - {"story"}


def test_grad_norm_leads_a_grad_led_spike_and_follows_a_data_led_one(spiky):
    grad = spiky.metrics["grad_norm"].to_numpy()
    by_shape = {lab.shape: lab for lab in spiky.labels.spikes}
    g = by_shape["grad_led"]
    before = grad[g.start - 10 : g.start - 3]
    assert grad[g.start - 1] > 100 * np.median(before)  # the climb comes first
    assert spiky.factor[g.start - 1] < 1.2  # while the loss barely moves
    d = by_shape["one_step"]
    assert grad[d.start] > 1.5 * np.median(grad[d.start - 10 : d.start])
    assert grad[d.start - 1] < 1.5 * np.median(grad[d.start - 10 : d.start])


def test_data_led_labels_name_the_step_bucket_cluster_and_corrupted_samples(runs, spiky):
    n = 0
    for run in [spiky, *runs.values()]:
        tags = run.tags.set_index(STEP)
        texts = run.samples.set_index("sample_id")[TEXT]
        clusters = run.samples.set_index("sample_id")[CLUSTER]
        for lab in run.labels.spikes:
            if lab.shape not in DATA_LED:
                assert lab.bucket is None and lab.cluster is None and lab.sample_ids == ()
                continue
            assert lab.bucket == tags.loc[lab.start, "bucket"] and lab.cluster == tags.loc[lab.start, CLUSTER]
            batch = set(run.plan.loc[run.plan[STEP] == lab.start, "sample_id"])
            assert 2 <= len(lab.sample_ids) <= 6 or len(batch) < 2
            assert set(lab.sample_ids) <= batch
            assert all(CORRUPT_PATTERN in texts[i] for i in lab.sample_ids)
            assert (clusters[list(lab.sample_ids)] == lab.cluster).all() or len(batch) < 4
            n += 1
    assert n >= 6


def test_tags_are_the_tagging_stage_of_the_plan(spiky):
    pd.testing.assert_frame_equal(
        spiky.tags, tag_steps(spiky.plan, spiky.samples, [0, 770, 1216, 1728, 2432, 3296, 8192])
    )
    assert spiky.tags[STEP].tolist() == list(range(SPEC.n_steps))


def test_level_shift_moves_the_baseline_for_good_and_is_not_a_span(spiky):
    ((step, factor),) = spiky.labels.level_shifts
    plain = make_run(replace(SPEC, level_shifts=0))
    ratio = spiky.baseline / plain.baseline
    assert np.allclose(ratio[:step], 1.0) and np.allclose(ratio[step:], factor, rtol=1e-3)
    assert not in_spans([step], spiky.labels.spans())[0]


def test_grad_accumulation_mixes_buckets_within_a_step(runs):
    accum, plain = runs["t-accum-0"], runs["t-spikes-0"]
    assert accum.plan.groupby(STEP)["micro"].nunique().eq(4).mean() > 0.99
    assert (plain.tags["bucket_share"] == 1.0).all()  # bucketed batches, one per step
    assert (accum.tags["bucket_share"] < 1.0).mean() > 0.5


def test_resumed_run_is_read_back_through_the_jsonl_reader_with_the_last_writes(runs):
    run = runs["t-resumed-0"]
    resume, crash = run.labels.rewound
    assert 0 < resume < crash < run.n_steps
    # the first attempt diverged (x3, x10, NaN) before the crash; the reader keeps the resumed run's values instead
    fresh = make_run(replace(run.spec, resumed=False))
    pd.testing.assert_frame_equal(run.metrics, fresh.metrics, check_dtype=False)
    assert np.isfinite(run.metrics[LOSS].to_numpy()[resume:crash]).all()
    assert run.metrics[STEP].is_unique and run.metrics[STEP].is_monotonic_increasing


def test_story_run_is_the_demo_with_its_spikes_at_254_and_258():
    run = make_run(RunSpec(name="story", seed=1, n_steps=0, story=True))
    starts = [lab.start for lab in run.labels.spikes]
    assert starts[:2] == [254, 258] and all(lab.shape == "story" for lab in run.labels.spikes)
    assert len(starts) >= 3  # the static plan brings the same batches back in the next epoch
    loss = run.metrics[LOSS].to_numpy()
    for lab in run.labels.spikes:  # the demo's noise is additive, sd 0.025
        assert lab.factor >= 1.6 and loss[lab.start] > lab.factor * run.baseline[lab.start] - 0.1 and lab.sample_ids
    assert (run.factor[run.clean_mask()] < 1.0 + 0.02).all()


def test_corpus_sizes_cover_the_issue():
    full = corpus_specs("full")
    assert 30 <= len(full) <= 60
    steps = [s.n_steps for s in full if not s.story]
    assert sum(steps) >= 400_000 and min(steps) >= 5_000 and max(steps) <= 30_000
    assert {"student_t", "gaussian"} <= {s.noise for s in full}
    assert {0.0, 0.5, 1.0, 2.0} <= {s.bucket_scale for s in full}
    assert any(s.resumed for s in full) and any(s.grad_accum > 1 for s in full) and any(s.nan_steps for s in full)
    assert any(s.level_shifts for s in full) and any(s.story for s in full)
    assert any(not s.spikes and s.bucket_scale >= 2 for s in full)  # clean but bucket-jumpy
    assert set().union(*(s.spikes for s in full)) == set(SHAPES) - {"story"}
    assert corpus_specs("full", seed=0) == full and corpus_specs("full", seed=1) != full
    assert len(corpus_specs("quick")) < len(full)
    with pytest.raises(ValueError):
        corpus_specs("huge")


# --- the long, metrics-only corpus --------------------------------------------------------------------------------
def test_long_corpus_has_2m_clean_steps_per_family_in_runs_of_200k_steps():
    from forensics.datasets.corpus import LONG_FAMILIES, long_corpus_specs

    specs = long_corpus_specs("long")
    assert {s.family for s in specs} == set(LONG_FAMILIES)
    for fam in LONG_FAMILIES:
        runs = [s for s in specs if s.family == fam]
        assert all(s.n_steps >= 200_000 for s in runs)
        # a run's spans (40-odd events, ~30 steps each) and eval rows take < 2% of it
        assert 0.98 * sum(s.n_steps for s in runs) >= 2_000_000
        assert sum(s.eval_every > 0 for s in runs) == len(runs) // 2
    assert long_corpus_specs("long") == specs  # seeded: the same specs every time


def test_long_run_is_deterministic_and_its_noise_stays_below_the_cap():
    from forensics.datasets.corpus import EVAL_KEY, LONG_NOISE_CAP, long_corpus_specs, make_long_run

    spec = next(s for s in long_corpus_specs("long-test") if s.family == "t2.5")
    spec = replace(spec, eval_every=500)
    run, again = make_long_run(spec), make_long_run(spec)
    pd.testing.assert_frame_equal(run.metrics, again.metrics)
    assert run.labels.spikes == again.labels.spikes
    loss = run.metrics[LOSS].to_numpy()
    clean = run.clean_mask()
    ratio = loss[clean] / run.baseline[clean]
    assert ratio.max() < LONG_NOISE_CAP and ratio.min() > 1 / LONG_NOISE_CAP
    assert ratio.max() > 1.2  # heavy tails: the noise's own extremes are large
    evals = run.metrics[EVAL_KEY].notna().to_numpy()
    assert evals.sum() >= 50 and np.isnan(loss[evals]).all() and not clean[evals].any()
    shapes = {lab.shape for lab in run.labels.spikes}
    assert {"one_step", "burst"} <= shapes
    for lab in run.labels.spikes:
        assert loss[lab.peak] / run.baseline[lab.peak] > 1.3  # 1.6x and up, times the noise
