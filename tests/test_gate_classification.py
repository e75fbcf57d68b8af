"""The gate's classification table at small sizes, with the real samplers: HF's LengthGroupedSampler,
lhotse's DynamicBucketingSampler, the reference builders. The same rows at 2K-1M samples are
``bench/bench_gate_classification.py``; this file imports its rows so that the two cannot drift apart."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.plan.builders import capped_lengths, length_grouped, megabatch_size, pack_greedy
from forensics.plan.composition import index_plan, length_sorted
from forensics.plan.gate import MULTIPLE, check_plan, derive_limits
from forensics.plan.rebuild import rebuild_plan
from forensics.plan.step_mapping import batches_to_plan

_spec = importlib.util.spec_from_file_location(
    "bench_gate_classification", Path(__file__).resolve().parents[1] / "bench" / "bench_gate_classification.py"
)
table = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = table  # dataclasses look their module up there
_spec.loader.exec_module(table)

ROWS = {row.name: row for row in table.ROWS}
WORDS = {  # the failure kind -> the words the gate must use for it
    "built_once": "the batches are built once and only reordered",
    "reseeded": "are the same batches in the same order: re-seeded identically every epoch",
    "shuffle_then_sort": "regrouped from the same samples (shuffle then sort)",
}
CASES = [(name, mix, n) for n in (2000,) for mix in table.MIXES for name in ROWS] + [
    (name, "lognormal", 12_000) for name in ROWS
]


@pytest.fixture(scope="module")
def samples_of() -> dict:
    cache: dict = {}

    def get(mix: str, n: int) -> pd.DataFrame:
        if (mix, n) not in cache:
            cache[(mix, n)] = table.make_samples(mix, n)
        return cache[(mix, n)]

    return get


@pytest.mark.parametrize("name,mix,n", CASES, ids=[f"{r}|{m}|{n}" for r, m, n in CASES])
def test_each_sampler_passes_or_fails_as_the_table_lists(name, mix, n, samples_of):
    row = ROWS[name]
    if row.needs:
        pytest.importorskip(row.needs)
    samples = samples_of(mix, n)
    r = table.judge(row, samples, table.batch_size_for(n))
    limit, retention = r.threshold.pair_retention, r.pair_retention[0]
    want = table.expected(row, mix)
    if want == "pass":
        assert r.passed, r.failures
        assert retention <= limit / 1.5  # with a margin: no row of the table is a coin toss
        assert r.failure_kinds == [] and not r.static
    elif want == "fail":
        assert not r.passed and r.static
        assert r.failure_kinds == [row.kind]
        assert WORDS[row.kind] in r.failures[0]
        assert retention == 1.0 or retention >= 1.5 * limit
    else:  # shuffle-then-sort where ties are many: its verdict follows its retention, and it says it is sorted
        assert r.length_sorted == [True, True]
        assert r.passed == (retention <= limit)
        assert (r.notes[0] if r.passed else r.failures[0]).count("sorted") >= 1
    assert r.threshold.reference_megabatch_size is not None
    assert r.threshold.floor == (0.002 if any(r.length_sorted) else 0.1)
    assert any(r.length_sorted) == (row.kind == "shuffle_then_sort" or name.startswith("static_sorted"))


def test_a_one_megabatch_length_grouped_sampler_is_called_shuffle_then_sort_not_built_once(samples_of):
    pytest.importorskip("transformers")
    samples = samples_of("lognormal", 2000)
    r = table.judge(ROWS["HF algorithm, one mega-batch = whole dataset"], samples, 8)
    assert r.length_sorted == [True, True] and not any(r.order_only)
    assert r.failure_kinds == ["shuffle_then_sort"]
    assert "built once" not in r.failures[0] and "re-seeded" not in r.failures[0]
    assert "a length-grouped sampler whose one mega-batch covers the whole dataset is the same thing" in r.failures[0]
    # ... while HF's own rule (at least 4 mega-batches) rebuilds: its batches overlap in length, and it passes
    hf = table.judge(ROWS["HF LengthGroupedSampler, seeded per epoch"], samples, 8)
    assert hf.length_sorted == [False, False] and hf.passed


def test_the_reference_is_hf_length_grouping_under_a_fixed_batch_size():
    # with a budget no batch reaches, length_grouped is HF's algorithm: mega-batches of min(50, n // (4 b)) x b
    lengths = np.random.default_rng(3).integers(10, 4000, 5000)
    samples = pd.DataFrame({"sample_id": np.arange(5000) + 100, "n_tokens": lengths.astype(np.int32)})
    big = 8 * 8192
    assert megabatch_size(lengths, token_budget=big, max_batch_size=8) == 50 * 8  # 5000 // 32 = 156 -> 50
    assert megabatch_size(lengths[:1000], token_budget=big, max_batch_size=8) == 31 * 8  # 1000 // 32 = 31
    batches = length_grouped(samples, 0, 0, token_budget=big, max_batch_size=8)
    assert [len(b) for b in batches] == [8] * 625
    pos = pd.Series(np.arange(5000), index=samples["sample_id"])
    lens = capped_lengths(samples)
    for start in range(0, 625, 50):  # each mega-batch of 50 batches is sorted longest first
        flat = [lens[pos[s]] for b in batches[start : start + 50] for s in b]
        assert flat == sorted(flat, reverse=True)
    assert length_grouped(samples, 0, 0, token_budget=big, max_batch_size=8) == batches  # pure
    assert length_grouped(samples, 1, 0, token_budget=big, max_batch_size=8) != batches  # fresh each epoch


def test_megabatch_counts_the_batch_size_a_sample_sits_in_under_a_token_budget():
    # 100 samples of 100 tokens (batches of 64 under 16,384 tokens) and 100 of 4,000 (batches of 4)
    lengths = np.array([100] * 100 + [4000] * 100)
    sizes = [len(b) for b in pack_greedy(np.argsort(lengths, kind="stable"), lengths, 16_384, 64)]
    assert sizes == [64, 36] + [4] * 25
    b = round(sum(s * s for s in sizes) / 200)  # (64^2 + 36^2 + 25 x 16) / 200 = 29
    assert b == 29 and megabatch_size(lengths, token_budget=16_384, max_batch_size=64) == 1 * b  # 200 // 116 = 1


def test_limit_is_five_times_the_length_grouped_reference_and_deterministic(samples_of):
    samples = samples_of("bimodal", 12_000)
    lim = derive_limits(samples, max_batch_size=16)
    assert lim == derive_limits(samples, max_batch_size=16)
    assert lim.pair_retention == pytest.approx(MULTIPLE * lim.reference_pair_retention)
    ref = rebuild_plan(samples, lambda s, e, seed: length_grouped(s, e, seed, max_batch_size=16), 2, 0)
    from forensics.plan.composition import compare_epochs

    assert lim.reference_pair_retention == compare_epochs(*index_plan(ref, samples).epochs).pair_retention
    assert "length_grouped (sorted mega-batches of" in lim.how and "finest length grouping" in lim.how


def test_length_sorted_tells_a_whole_dataset_sort_from_bucketed_batches():
    lengths = np.array([10, 10, 20, 20, 20, 30, 40, 40])
    samples = pd.DataFrame({"sample_id": np.arange(8), "n_tokens": lengths.astype(np.int32)})

    def epoch(batches):
        return index_plan(batches_to_plan([batches]), samples).epochs[0]

    assert length_sorted(epoch([[2, 3], [0, 1], [4, 5], [6, 7]]), lengths)  # runs of the order; 20 straddles
    assert length_sorted(epoch([[6, 7], [0, 1, 2], [3, 4, 5]]), lengths)
    assert not length_sorted(epoch([[0, 5], [1, 2], [3, 4, 6, 7]]), lengths)  # 10-30 overlaps 10-20
    assert not length_sorted(epoch([list(range(8))]), lengths)  # one batch: nothing to order


def test_identical_batches_of_a_sorted_plan_are_worded_as_shuffle_then_sort():
    # few ties: 2K samples of distinct-ish lengths, batches of 64: the sort repeats most batches exactly
    samples = table.make_samples("lognormal", 2000)
    r = check_plan(samples=samples, builder="shuffle_then_sort", epochs=2, seed=1, max_pair_retention=0.99)
    assert not r.passed and r.failure_kinds == ["shuffle_then_sort"]
    assert r.failures[0].startswith("epochs 0-1 repeat ") and "(shuffle then sort)" in r.failures[0]


def _bounded_buffer(samples: pd.DataFrame, epoch: int, seed: int) -> list[list[int]]:
    """A bounded-buffer bucketing sampler, as lhotse's DynamicBucketingSampler is: the samples in their given order,
    10,000 at a time, each window shuffled (per epoch), split into 10 length buckets and packed."""
    lengths = capped_lengths(samples)
    ids = samples["sample_id"].to_numpy()
    rng = np.random.default_rng([seed, epoch])
    out = []
    for start in range(0, len(ids), 10_000):
        window = start + rng.permutation(min(10_000, len(ids) - start))
        edges = np.quantile(lengths[window], np.linspace(0, 1, 11)[1:-1])
        bucket = np.searchsorted(edges, lengths[window])
        for k in range(10):
            out += [ids[b].tolist() for b in pack_greedy(window[bucket == k], lengths, 16_384, 64)]
    return out


def test_a_bounded_buffer_sampler_passes_on_the_floor_for_plans_not_sorted_as_a_whole():
    samples = table.make_samples("lognormal", 200_000)  # 20 windows: 4.4% of pairs meet again, at any size
    r = check_plan(samples=samples, builder=_bounded_buffer, epochs=2, seed=1)
    assert r.length_sorted == [False, False]
    assert r.pair_retention[0] > MULTIPLE * r.threshold.reference_pair_retention  # the size-aware limit alone fails it
    assert r.threshold.floor == 0.1 and r.threshold.pair_retention == 0.1 and r.passed
    assert "floor 0.1 as no epoch is sorted by length as a whole" in r.threshold.how
