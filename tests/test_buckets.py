"""Optimal bucket boundaries: exact against brute force, never worse than quantile or the story's, and the packing
efficiency checked against the bucketed builder run for real; the ``forensics buckets`` command's JSON and exit
codes."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from forensics.cli import main
from forensics.plan.builders import bucketed_shuffle
from forensics.plan.optimal_boundaries import (
    boundary_efficiency,
    bucket_boundary_efficiency,
    conform_boundaries,
    optimal_boundaries,
    packing_efficiency,
    padded_to_boundary,
    quantile_boundaries,
)
from forensics.schema import DEFAULT_BOUNDARIES, MAX_LEN

CONTRACT_KEYS = {"boundaries", "boundary_efficiency", "padding_efficiency", "bucket_efficiency", "compared"}


def story_lengths(n: int, seed: int) -> np.ndarray:
    """A realistic mix: many short QA-like samples, a long tail of code-like ones, some above max_len."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(6.3, 1.0, n).astype(np.int64) + 10, 10, 12_000)


def brute_force_padded(lengths: np.ndarray, boundaries: list[int], max_len: int) -> int:
    """Independent of the library: pad each capped length to the smallest boundary >= it (0 goes to b1)."""
    total = 0
    for n in np.minimum(lengths, max_len).tolist():
        total += next(b for b in boundaries[1:] if b >= n)
    return total


def brute_force_best(lengths: np.ndarray, k: int, max_len: int) -> int:
    """The least padding over every set of k-1 integer inner boundaries in (0, max_len)."""
    return min(
        brute_force_padded(lengths, [0, *inner, max_len], max_len)
        for inner in itertools.combinations(range(1, max_len), k - 1)
    )


@pytest.mark.parametrize("seed", range(12))
def test_dp_pads_exactly_as_little_as_brute_force_over_all_boundaries(seed):
    rng = np.random.default_rng(seed)
    max_len = int(rng.integers(6, 15))
    # lengths include 0 (an empty sample) and values above max_len (truncated) on some seeds
    lengths = rng.integers(0, max_len + 4, size=int(rng.integers(1, 30)))
    for k in range(1, 5):
        b = optimal_boundaries(lengths, k, max_len)
        assert len(b) == k + 1 and b[0] == 0 and b[-1] == max_len
        assert all(x < y for x, y in zip(b, b[1:]))
        assert brute_force_padded(lengths, b, max_len) == brute_force_best(lengths, k, max_len)


def test_dp_finds_the_hand_computed_optimum():
    # three short samples and three at the cap: one boundary right after the short ones wastes 2+1 tokens
    assert optimal_boundaries(np.array([1, 2, 3, 10, 10, 10]), 2, 10) == [0, 3, 10]
    # two buckets for lengths 100 x 90 and 1000 x 10 under max_len 1000: the split sits at 100
    lengths = np.array([100] * 90 + [1000] * 10)
    assert optimal_boundaries(lengths, 2, 1000) == [0, 100, 1000]
    assert boundary_efficiency(lengths, [0, 100, 1000], 1000) == 1.0


def test_fewer_distinct_lengths_than_buckets_still_gives_valid_boundaries_without_waste():
    lengths = np.array([5, 5, 9, 12])
    b = optimal_boundaries(lengths, 5, 12)
    assert len(b) == 6 and all(x < y for x, y in zip(b, b[1:])) and b[-1] == 12
    assert {5, 9} <= set(b)
    assert padded_to_boundary(lengths, b, 12) == int(lengths.sum())


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [2, 6, 12])
def test_optimal_never_pads_more_than_quantile_or_story_boundaries(seed, k):
    lengths = story_lengths(20_000, seed)
    opt = padded_to_boundary(lengths, optimal_boundaries(lengths, k), MAX_LEN)
    quant = padded_to_boundary(lengths, quantile_boundaries(lengths, k), MAX_LEN)
    assert opt <= quant
    if k == len(DEFAULT_BOUNDARIES) - 1:
        story = padded_to_boundary(lengths, list(DEFAULT_BOUNDARIES), MAX_LEN)
        assert opt <= story
        # on this mix the gain is real, not a tie: the optimum wastes at least 10% fewer tokens than the story's
        real = int(np.minimum(lengths, MAX_LEN).sum())
        assert (opt - real) <= 0.9 * (story - real)


def test_dp_is_deterministic_and_does_not_modify_its_input():
    lengths = story_lengths(5_000, 3)
    before = lengths.copy()
    assert optimal_boundaries(lengths, 6) == optimal_boundaries(lengths, 6)
    np.testing.assert_array_equal(lengths, before)


def test_quantile_boundaries_split_distinct_lengths_into_equal_counts():
    lengths = np.arange(1, 1001)
    b = quantile_boundaries(lengths, 4, 1000)
    assert b == [0, 250, 500, 750, 1000]
    # heavy ties cannot repeat a boundary
    b = quantile_boundaries(np.array([7] * 100 + [9]), 4, 10)
    assert len(b) == 5 and all(x < y for x, y in zip(b, b[1:])) and b[-1] == 10


def test_boundary_efficiency_is_real_over_padded_to_boundary():
    lengths = np.array([100, 200, 700, 9000])  # 9000 is truncated to 8192
    b = [0, 256, 1024, 8192]
    assert padded_to_boundary(lengths, b) == 256 + 256 + 1024 + 8192
    assert boundary_efficiency(lengths, b) == pytest.approx((100 + 200 + 700 + 8192) / (256 + 256 + 1024 + 8192))
    assert bucket_boundary_efficiency(lengths, b) == pytest.approx([300 / 512, 700 / 1024, 1.0])


def test_conform_boundaries_fits_the_story_boundaries_to_a_shorter_max_len():
    assert conform_boundaries(DEFAULT_BOUNDARIES, 4096) == [0, 770, 1216, 1728, 2432, 3296, 4096]
    assert conform_boundaries(DEFAULT_BOUNDARIES, 2000) == [0, 770, 1216, 1728, 2000]
    assert conform_boundaries(DEFAULT_BOUNDARIES, 8192) == list(DEFAULT_BOUNDARIES)


def test_packing_efficiency_matches_bucketed_batches_built_for_real():
    lengths = story_lengths(3_000, 5)
    samples = pd.DataFrame({"sample_id": np.arange(500, 500 + len(lengths)), "n_tokens": lengths.astype(np.int32)})
    boundaries = optimal_boundaries(lengths, 4)
    capped = dict(zip(samples["sample_id"], np.minimum(lengths, MAX_LEN).tolist()))
    real = padded = 0
    real_b, padded_b = np.zeros(4), np.zeros(4)
    n_batches = 0
    for seed in (0, 1):
        for batch in bucketed_shuffle(samples, 0, seed, boundaries=boundaries, token_budget=8192):
            lens = [capped[s] for s in batch]
            bucket = next(i for i in range(4) if boundaries[i] < lens[0] <= boundaries[i + 1])
            real += sum(lens)
            padded += len(lens) * max(lens)
            real_b[bucket] += sum(lens)
            padded_b[bucket] += len(lens) * max(lens)
            n_batches += 1
    got = packing_efficiency(lengths, boundaries, token_budget=8192, seeds=[0, 1])
    assert got.batches == n_batches
    assert (got.real_tokens, got.padded_tokens) == (real, padded)
    assert got.overall == pytest.approx(real / padded)
    assert got.per_bucket == pytest.approx((real_b / padded_b).tolist())
    # packing pads to each batch's longest sample, never beyond the bucket's boundary
    assert got.overall >= boundary_efficiency(lengths, boundaries)


# --- the command ----------------------------------------------------------------------------------------------------
@pytest.fixture()
def samples_file(tmp_path):
    lengths = story_lengths(4_000, 11)
    path = tmp_path / "samples.parquet"
    pd.DataFrame({"sample_id": np.arange(len(lengths)), "n_tokens": lengths.astype(np.int32)}).to_parquet(path)
    return path, lengths


def test_buckets_command_writes_the_contract_json(samples_file, tmp_path, capsys):
    path, lengths = samples_file
    out = tmp_path / "buckets.json"
    rc = main(["buckets", "--samples", str(path), "-k", "5", "--boundaries", "0,500,1500,8192", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert CONTRACT_KEYS <= set(data)
    assert data["boundaries"] == optimal_boundaries(lengths, 5)
    assert data["boundary_efficiency"] == pytest.approx(boundary_efficiency(lengths, data["boundaries"]))
    assert 0 < data["padding_efficiency"] <= 1 and len(data["bucket_efficiency"]) == 5
    assert set(data["compared"]) == {"quantile", "story", "given"}
    assert data["compared"]["given"]["boundaries"] == [0, 500, 1500, 8192]
    assert data["compared"]["quantile"]["boundaries"] == quantile_boundaries(lengths, 5)
    assert data["compared"]["story"]["boundaries"] == list(DEFAULT_BOUNDARIES)
    for other in data["compared"].values():
        assert CONTRACT_KEYS - {"compared"} <= set(other)
        if len(other["boundaries"]) == 6:  # same K: the optimum pads no more
            assert data["boundary_efficiency"] >= other["boundary_efficiency"]
    assert "optimal" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--samples", "{missing}", "-k", "3"], "does not exist"),
        (["--samples", "{ok}", "-k", "3", "--boundaries", "0,abc"], "--boundaries"),
        (["--samples", "{ok}", "-k", "3", "--boundaries", "0,900,800"], "strictly increase"),
        (["--samples", "{ok}", "-k", "0"], "k must be >= 1"),
        (["--samples", "{no_tokens}", "-k", "3"], "n_tokens"),
    ],
)
def test_buckets_command_exits_2_on_bad_input(samples_file, tmp_path, capsys, argv, message):
    no_tokens = tmp_path / "no_tokens.parquet"
    pd.DataFrame({"sample_id": [1, 2]}).to_parquet(no_tokens)
    paths = {"missing": tmp_path / "nope.parquet", "ok": samples_file[0], "no_tokens": no_tokens}
    argv = [a.format(**paths) for a in argv]
    assert main(["buckets", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
