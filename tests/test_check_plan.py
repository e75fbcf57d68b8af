"""The batch-composition gate: which plans fail, why, the measures against brute force, and the CLI contract."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forensics.cli import main
from forensics.plan.builders import bucketed_shuffle, length_grouped, shuffle_then_sort
from forensics.plan.composition import compare_epochs, index_plan
from forensics.plan.gate import FIXED_PAIR_RETENTION, MULTIPLE, assert_batches_vary, check_plan, derive_limits
from forensics.plan.rebuild import rebuild_plan
from forensics.plan.step_mapping import assign_steps, batches_to_plan

CONTRACT_KEYS = {
    "passed",
    "pair_retention",
    "pair_retention_first_last",
    "identical_batches",
    "order_only",
    "coverage",
    "threshold",
}


def make_samples(n: int, seed: int = 0, ties: bool = False) -> pd.DataFrame:
    """Realistic lognormal lengths (median ~550 tokens); ``ties``: rounded up to multiples of 64 (many equal)."""
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(6.3, 1.0, n)
    lengths = np.clip((raw // 64 + 1) * 64, 64, 8192) if ties else np.clip(raw.astype(int) + 10, 10, 12000)
    source = np.where(lengths < 1000, "qa", "code")  # length correlates with content, as in the story
    return pd.DataFrame(
        {"sample_id": np.arange(5000, 5000 + n), "n_tokens": lengths.astype(np.int32), "source": source}
    )


@pytest.fixture(scope="module")
def samples() -> pd.DataFrame:
    return make_samples(3000)


@pytest.fixture(scope="module")
def case_files(tmp_path_factory, samples) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("check-plan")
    samples.to_parquet(root / "samples.parquet")
    files = {"samples": root / "samples.parquet"}
    for name in ("static_sorted", "bucketed_shuffle"):
        from forensics.plan.builders import REFERENCE_BUILDERS

        rebuild_plan(samples, REFERENCE_BUILDERS[name], 4, 1).to_parquet(root / f"{name}.parquet")
        files[name] = root / f"{name}.parquet"
    return files


# --- which plans fail and why ---------------------------------------------------------------------------------------
def test_static_sorted_fails_as_built_once_and_reordered(samples):
    r = check_plan(samples=samples, builder="static_sorted", seed=3)
    assert not r.passed and r.static
    assert r.pair_retention == [1.0, 1.0] and r.first_last.pair_retention == 1.0
    assert r.identical_batches == [1.0, 1.0]
    assert r.order_only == [True, True]
    assert r.failures == [
        "epochs 0-1 and 1-2 share 100% of batch-mate pairs: the batches are built once and only reordered"
    ]


@pytest.mark.parametrize("n", [1000, 10_000, 100_000])
def test_shuffle_then_sort_fails_at_every_dataset_size_where_ties_are_few(n):
    r = check_plan(samples=make_samples(n, seed=n), builder="shuffle_then_sort", seed=1)
    assert not r.passed and r.static
    assert not any(r.order_only)  # the ties did move ...
    assert min(r.pair_retention) > 1.5 * r.threshold.pair_retention  # ... but far too few pairs changed
    assert r.length_sorted == [True, True, True] and r.failure_kinds == ["shuffle_then_sort"]
    assert "regrouped from the same samples (shuffle then sort)" in r.failures[0]
    assert "a shuffle that a later sort undoes" in r.failures[0]


def test_shuffle_then_sort_with_many_ties_passes_and_says_it_is_sorted_as_a_whole():
    # 50K samples in multiples of 64: each length is shared by hundreds of samples, and the sort regroups them
    r = check_plan(samples=make_samples(50_000, seed=50_000, ties=True), builder="shuffle_then_sort", seed=1)
    assert r.passed and r.length_sorted == [True, True, True]
    assert max(r.pair_retention) < r.threshold.pair_retention / 2  # 1.7% against 5.5%
    assert r.notes and r.notes[0].startswith("epochs 0-1 and 1-2 are sorted by length as a whole (shuffle then sort")


def test_shuffle_then_sort_fails_where_an_absolute_limit_of_one_half_would_pass():
    # 100K samples: the ties make shuffle-then-sort change most pairs, yet it stays sorted: the derived limit holds
    r = check_plan(samples=make_samples(100_000, seed=5), builder="shuffle_then_sort", epochs=2, seed=2)
    assert r.pair_retention[0] < 0.5
    assert r.threshold.pair_retention < r.pair_retention[0] / 6  # 5.3% against 35.7%
    assert not r.passed


@pytest.mark.parametrize("builder", ["bucketed_shuffle", "random_shuffle"])
@pytest.mark.parametrize("n,ties,seed", [(500, False, 4), (3000, False, 7), (3000, True, 8), (50_000, False, 9)])
def test_bucketed_and_random_shuffles_pass(builder, n, ties, seed):
    r = check_plan(samples=make_samples(n, seed=n + 1, ties=ties), builder=builder, seed=seed)
    assert r.passed, r.failures
    assert not r.static
    assert max(r.pair_retention) <= r.threshold.pair_retention
    assert all(c.missing == 0 and c.duplicated == 0 for c in r.coverage)


RESEEDED = """
import numpy as np
from forensics.plan.builders import pack_greedy

def build(samples, epoch, seed):
    rng = np.random.default_rng(seed)  # the bug: the epoch never reaches the generator
    lengths = samples["n_tokens"].to_numpy()
    ids = samples["sample_id"].to_numpy()
    return [ids[b].tolist() for b in pack_greedy(rng.permutation(len(ids)), lengths)]
"""


def test_builder_reseeded_identically_each_epoch_fails(tmp_path, samples):
    path = tmp_path / "my_batches.py"
    path.write_text(RESEEDED)
    r = check_plan(samples=samples, builder=f"{path}:build")
    assert not r.passed and r.static
    assert r.pair_retention == [1.0, 1.0]
    assert [p.same_order for p in r.pairs] == [True, True]
    assert "same batches in the same order" in r.failures[0] and "set_epoch" in r.failures[0]


def test_builder_alternating_between_two_plans_fails_on_first_vs_last(samples):
    def alternating(s, epoch, seed):
        return bucketed_shuffle(s, epoch % 2, seed)

    r = check_plan(samples=samples, builder=alternating, epochs=3)
    assert max(r.pair_retention) < r.threshold.pair_retention
    assert r.first_last.pair_retention == 1.0
    assert not r.passed
    assert r.failures[0].startswith("the first and last epochs (0 and 2) are the same batches in the same order")


def _bucketed_plan(samples, epochs=3):
    return rebuild_plan(samples, bucketed_shuffle, epochs, 0)


def test_dropped_sample_passes_as_a_dropped_last_batch_unless_none_is_allowed(samples):
    plan = _bucketed_plan(samples)
    dropped = plan.drop(index=plan.index[(plan["epoch"] == 1)][5])
    r = check_plan(dropped, samples)
    assert r.passed and not r.static and r.dropped_last == [1]
    assert [(c.epoch, c.missing, c.duplicated) for c in r.coverage] == [(0, 0, 0), (1, 1, 0), (2, 0, 0)]
    strict = check_plan(dropped, samples, allow_drop_last=0)
    assert not strict.passed and strict.dropped_last == []
    assert strict.failures == [
        "epoch 1 misses 1 sample; none may be missing (--allow-drop-last N allows a dropped last batch)"
    ]
    assert check_plan(dropped, samples, allow_drop_last=1).passed


def _shuffled_batches(n: int, size: int, epochs: int, seed: int = 0) -> list[list[list[int]]]:
    """A sampler that shuffles every epoch (set_epoch called) and cuts the order into batches of ``size``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(epochs):
        order = rng.permutation(n).tolist()
        out.append([order[i : i + size] for i in range(0, n, size)])
    return out


@pytest.mark.parametrize(
    "missing, repeated, allow, passed, dropped_last",
    [
        (3, 0, None, True, [1]),  # batches of 4: three missing is the last partial batch dropped
        (4, 0, None, False, []),  # a whole batch's worth is more than a dropped last batch
        (1, 1, None, False, []),  # a repeat fails, and its epoch's missing sample is not excused
        (3, 0, 0, False, []),  # --allow-drop-last 0: none may be missing
        (3, 0, 3, True, []),  # --allow-drop-last 3: an explicit limit, no note needed
        (4, 0, 4, True, []),
        (5, 0, 4, False, []),
    ],
)
def test_dropped_last_batch_boundary(missing, repeated, allow, passed, dropped_last):
    epochs = _shuffled_batches(400, 4, 3)
    flat = [s for b in epochs[1] for s in b]
    kept = flat[: len(flat) - missing]
    kept += kept[:repeated]
    epochs[1] = [kept[i : i + 4] for i in range(0, len(kept), 4)]
    r = check_plan(batches_to_plan(epochs), allow_drop_last=allow)
    assert [(c.missing, c.duplicated) for c in r.coverage] == [(0, 0), (missing, repeated), (0, 0)]
    assert (r.passed, r.dropped_last, r.static) == (passed, dropped_last, False)
    assert any("dropped last partial batch" in n for n in r.notes) is bool(dropped_last)


def test_fixed_pair_retention_limit_is_one_tenth():
    # the value itself, not the imported constant: the limit used without samples is part of the contract
    assert FIXED_PAIR_RETENTION == 0.1
    r = check_plan(batches_to_plan(_shuffled_batches(400, 4, 2)))
    assert r.threshold.pair_retention == 0.1 and "fixed limits without samples" in r.threshold.how


def test_one_third_retention_without_samples_fails():
    # 3 of the 9 batch-mate pairs of epoch 1 were batch-mates in epoch 0; no batch is repeated whole
    plan = batches_to_plan([[[0, 1, 2], [3, 4, 5], [6, 7, 8]], [[0, 1, 6], [3, 4, 2], [5, 7, 8]]])
    r = check_plan(plan)
    assert r.pair_retention == [pytest.approx(1 / 3)] and r.identical_batches == [0.0]
    assert (r.passed, r.static, r.failure_kinds) == (False, True, ["regrouped"])


def test_duplicated_sample_fails_coverage_even_with_drop_last_allowed(samples):
    plan = _bucketed_plan(samples)
    row = plan[plan["epoch"] == 2].iloc[[0]]
    duplicated = pd.concat([plan, row], ignore_index=True)
    r = check_plan(duplicated, samples, allow_drop_last=10)
    assert not r.passed
    assert r.coverage[2].duplicated == 1 and r.coverage[2].missing == 0
    assert "epoch 2 repeats samples" in r.failures[0]


def test_coverage_without_samples_uses_every_sample_the_plan_names(samples):
    plan = _bucketed_plan(samples)
    first = plan[plan["epoch"] == 0]["sample_id"].iloc[0]
    plan = plan[~((plan["epoch"] == 2) & (plan["sample_id"] == first))]
    r = check_plan(plan)
    assert [c.missing for c in r.coverage] == [0, 0, 1]
    assert "fixed limits without samples" in r.threshold.how
    assert r.threshold.pair_retention == 0.1


def test_single_sample_batches_have_no_composition_to_fail_on():
    plan = batches_to_plan([[[i] for i in range(10)], [[i] for i in range(10)]])
    r = check_plan(plan)
    assert r.order_only == [True] and r.pair_retention == [0.0]
    assert r.passed and not r.static


def test_min_padding_efficiency_fails_the_random_shuffle_only(samples):
    random = check_plan(samples=samples, builder="random_shuffle", min_padding_efficiency=0.6)
    bucketed = check_plan(samples=samples, builder="bucketed_shuffle", min_padding_efficiency=0.6)
    assert all(e < 0.5 for e in random.epoch_padding_efficiency)
    assert all(e > 0.65 for e in bucketed.epoch_padding_efficiency)
    assert not random.passed and not random.static
    assert random.failures[0].startswith("epoch 0 padding efficiency")
    assert bucketed.passed


# --- the limit ------------------------------------------------------------------------------------------------------
def test_limit_is_derived_from_the_samples_and_shrinks_with_size():
    small, large = make_samples(2000, seed=1), make_samples(50_000, seed=1)
    ls, ll = derive_limits(small, length_sorted=True), derive_limits(large, length_sorted=True)
    assert derive_limits(small, length_sorted=True) == ls  # same inputs, same limits
    # not sorted as a whole: the floor 0.1 is below 5 x 0.0214
    assert derive_limits(large).pair_retention == pytest.approx(0.107, abs=1e-4)
    assert ls.pair_retention == 0.5  # the cap: 5 x 0.157, four mega-batches of 2K samples keep many pairs
    assert ll.pair_retention == pytest.approx(MULTIPLE * ll.reference_pair_retention)
    assert ll.pair_retention < ls.pair_retention / 4
    assert ll.reference_megabatch_size == 1700  # 50 batches of 34, the batch size a sample sits in when sorted
    ref = compare_epochs(*index_plan(rebuild_plan(large, length_grouped, 2, 0), large).epochs)
    assert ll.reference_pair_retention == ref.pair_retention


def test_max_pair_retention_overrides_the_derived_limit(samples):
    r = check_plan(samples=samples, builder="shuffle_then_sort", max_pair_retention=0.99)
    assert r.threshold.pair_retention == 0.99
    assert r.threshold.how.startswith("pair retention 0.99 given by --max-pair-retention")
    assert r.passed is (max(r.identical_batches) <= r.threshold.identical_batches)


# --- the measures against brute force -----------------------------------------------------------------------------
def brute_force(batches_e: list[list[int]], batches_f: list[list[int]]) -> tuple[float, float, bool]:
    """Pair retention, identical share and order-only by listing every pair (each sample once per epoch)."""
    mates_e = {frozenset(p) for b in batches_e for p in itertools.combinations(b, 2)}
    pairs_f = [frozenset(p) for b in batches_f for p in itertools.combinations(b, 2)]
    retention = sum(p in mates_e for p in pairs_f) / len(pairs_f) if pairs_f else 0.0
    sets_e = {frozenset(b) for b in batches_e}
    multi = [frozenset(b) for b in batches_f if len(b) > 1]
    identical = sum(b in sets_e for b in multi) / len(multi) if multi else 0.0
    order_only = {frozenset(b) for b in batches_f} == sets_e
    return retention, identical, order_only


@st.composite
def two_epochs(draw):
    n = draw(st.integers(2, 40))
    ids = list(range(100, 100 + n))

    def epoch():
        members = draw(st.lists(st.sampled_from(ids), unique=True, min_size=1, max_size=n))
        cuts = sorted(draw(st.lists(st.integers(1, len(members)), max_size=len(members), unique=True)))
        bounds = [0] + [c for c in cuts if c < len(members)] + [len(members)]
        return [members[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]

    return epoch(), epoch()


@settings(max_examples=150, deadline=None, derandomize=True)
@given(two_epochs())
def test_pair_retention_equals_a_brute_force_pair_count(epochs):
    e, f = epochs
    m = index_plan(batches_to_plan([e, f]))
    got = compare_epochs(*m.epochs)
    want = brute_force(e, f)
    assert got.pair_retention == pytest.approx(want[0])
    assert got.identical_batches == pytest.approx(want[1])
    assert got.order_only == want[2]


def test_pair_retention_equals_brute_force_on_seeded_builder_plans():
    s = make_samples(400, seed=11, ties=True)
    for builder in (shuffle_then_sort, bucketed_shuffle):
        e, f = builder(s, 0, 5), builder(s, 1, 5)
        got = compare_epochs(*index_plan(batches_to_plan([e, f]), s).epochs)
        assert (got.pair_retention, got.identical_batches, got.order_only) == pytest.approx(brute_force(e, f))


def test_step_form_plan_gives_the_same_measures_as_the_batch_form(samples):
    plan = _bucketed_plan(samples)
    by_step = assign_steps(plan, grad_accum=2, world_size=2).drop(columns=["batch_id"])
    a, b = check_plan(plan, samples), check_plan(by_step, samples)
    assert a.pair_retention == b.pair_retention and a.identical_batches == b.identical_batches
    assert a.epoch_padding_efficiency == b.epoch_padding_efficiency


def test_cluster_entropy_and_longest_dominant_run_on_a_hand_built_plan():
    s = pd.DataFrame({"sample_id": range(8), "n_tokens": [100] * 8, "cluster": [0, 0, 0, 0, 1, 1, 1, 1]})
    # one batch per step; clusters per step: epoch 0 [0,0] [0,0] [1,1,1,1], epoch 1 [1,1] [0,0] [0,1] [0,1]
    plan = batches_to_plan([[[0, 1], [2, 3], [4, 5, 6, 7]], [[6, 7], [1, 2], [3, 5], [0, 4]]])
    r = check_plan(plan, s)
    mix = {m.epoch: m for m in r.cluster_mix}
    assert mix[0].cluster_entropy == 0.0
    assert (mix[0].longest_dominant_run, mix[0].dominant_cluster) == (2, 0)
    assert mix[1].cluster_entropy == pytest.approx((0 + 0 + 1 + 1) / 4)
    assert (mix[1].longest_dominant_run, mix[1].dominant_cluster) == (3, 0)  # a tie goes to the smaller cluster
    assert r.epoch_padding_efficiency == [1.0, 1.0]


def test_static_plan_has_lower_within_step_entropy_than_a_random_shuffle(samples):
    static = check_plan(samples=samples, builder="static_sorted")
    random = check_plan(samples=samples, builder="random_shuffle")
    assert max(m.cluster_entropy for m in static.cluster_mix) < 0.5 * min(m.cluster_entropy for m in random.cluster_mix)


# --- the CLI contract ------------------------------------------------------------------------------------------------
def test_cli_static_plan_exits_1_with_json_and_junit(case_files, tmp_path, capsys):
    out_json, out_xml = tmp_path / "gate.json", tmp_path / "gate.xml"
    code = main(
        [
            "check-plan",
            "--plan",
            str(case_files["static_sorted"]),
            "--samples",
            str(case_files["samples"]),
            "--json",
            str(out_json),
            "--junit",
            str(out_xml),
        ]
    )
    assert code == 1
    text = capsys.readouterr().out
    assert "FAIL" in text and "built once and only reordered" in text
    data = json.loads(out_json.read_text())
    assert CONTRACT_KEYS <= set(data)
    assert data["passed"] is False and data["pair_retention"] == [1.0, 1.0, 1.0]
    assert data["pair_retention_first_last"] == 1.0 and data["order_only"] == [True, True, True]
    assert data["coverage"][0] == {"epoch": 0, "missing": 0, "duplicated": 0}
    assert {"pair_retention", "identical_batches", "how"} <= set(data["threshold"])
    suite = ET.parse(out_xml).getroot().find("testsuite")
    assert suite.get("failures") == "1"
    failures = suite.findall("testcase/failure")
    assert len(failures) == 1 and "built once" in failures[0].get("message")


def test_cli_bucketed_plan_exits_0_and_junit_has_no_failure(case_files, tmp_path, capsys):
    out_xml = tmp_path / "gate.xml"
    code = main(
        [
            "check-plan",
            "--plan",
            str(case_files["bucketed_shuffle"]),
            "--samples",
            str(case_files["samples"]),
            "--junit",
            str(out_xml),
        ]
    )
    assert code == 0
    assert "PASS" in capsys.readouterr().out
    root = ET.parse(out_xml).getroot()
    assert root.find("testsuite").get("failures") == "0" and not root.findall(".//failure")


def test_cli_epochs_limits_a_plan_to_its_first_epochs(case_files, tmp_path):
    out = tmp_path / "g.json"
    assert main(["check-plan", "--plan", str(case_files["bucketed_shuffle"]), "--epochs", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["pair_retention"]) == 1 and data["epochs"] == [0, 1]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--builder", "bucketed_shuffle"], "--builder needs --samples"),
        (["--plan", "no/such/plan.parquet"], "does not exist"),
        (["--builder", "no_such_builder", "--samples", "SAMPLES"], "expected a reference builder"),
        (["--builder", "static_sorted", "--samples", "SAMPLES", "--token-budget", "-1"], "--token-budget: must be"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(argv, message, capsys, tmp_path):
    samples = tmp_path / "samples.parquet"
    pd.DataFrame({"sample_id": [1, 2, 3], "n_tokens": [10, 20, 30]}).to_parquet(samples)
    argv = [str(samples) if a == "SAMPLES" else a for a in argv]
    assert main(["check-plan", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_plan_with_steps_but_no_epochs_exits_2_saying_it_needs_epochs(tmp_path, capsys):
    plan = pd.DataFrame({"step": [0, 0, 1, 1], "sample_id": [1, 2, 3, 4]})
    plan.to_csv(tmp_path / "plan.csv", index=False)
    assert main(["check-plan", "--plan", str(tmp_path / "plan.csv")]) == 2
    assert "needs an 'epoch' column" in capsys.readouterr().err


def test_cli_single_epoch_plan_exits_2(tmp_path, capsys):
    batches_to_plan([[[1, 2], [3]]]).to_parquet(tmp_path / "one.parquet")
    assert main(["check-plan", "--plan", str(tmp_path / "one.parquet")]) == 2
    assert "needs at least 2" in capsys.readouterr().err


def test_installed_command_exit_codes(case_files):
    def code(*argv: str) -> int:
        return subprocess.run(
            [sys.executable, "-m", "forensics", "check-plan", *argv], capture_output=True, timeout=120
        ).returncode

    samples = str(case_files["samples"])
    assert code("--builder", "bucketed_shuffle", "--samples", samples) == 0
    assert code("--builder", "static_sorted", "--samples", samples) == 1
    assert code("--builder", "static_sorted") == 2


# --- from pytest -----------------------------------------------------------------------------------------------------
def test_assert_batches_vary_raises_a_readable_assertion_for_a_static_builder(samples):
    with pytest.raises(AssertionError, match="built once and only reordered") as info:
        assert_batches_vary("static_sorted", samples)
    assert "epochs 0-1: pair retention 100%" in str(info.value)


def test_assert_batches_vary_passes_a_bucketed_plan_and_returns_the_result(samples):
    result = assert_batches_vary(_bucketed_plan(samples, epochs=4), samples)
    assert result.passed and len(result.pair_retention) == 3


def test_assert_batches_vary_takes_a_callable_and_limits(samples):
    def sort_after_shuffle(s, epoch, seed):
        return shuffle_then_sort(s, epoch, seed)

    with pytest.raises(AssertionError, match="a shuffle that a later sort undoes"):
        assert_batches_vary(sort_after_shuffle, samples, epochs=2)
    assert assert_batches_vary(
        sort_after_shuffle, samples, epochs=2, max_pair_retention=1.0, max_identical_batches=1.0
    ).passed


def test_measures_do_not_depend_on_how_sample_ids_are_spread_or_rows_ordered(samples):
    """Dense ids are ranked by a lookup table, sparse ones hashed, epochs in order sliced, shuffled rows gathered:
    the same plan gives the same numbers every way."""
    plan = rebuild_plan(samples, bucketed_shuffle, 3, 0)
    base = check_plan(plan).to_json()
    sparse = plan.assign(sample_id=plan["sample_id"] * 1_000_003 + 7)
    shuffled = plan.sample(frac=1.0, random_state=0).sort_values(["epoch", "batch_id"], kind="stable")
    for variant in (sparse, shuffled, plan.iloc[::-1].reset_index(drop=True)):
        got = check_plan(variant).to_json()
        assert got["pair_retention"] == base["pair_retention"]
        assert got["identical_batches"] == base["identical_batches"] and got["coverage"] == base["coverage"]
    assert 0 < base["pair_retention"][0] < 0.1


def test_check_plan_case_rejects_an_unmappable_plan_without_mapping_it(tmp_path, samples):
    """The gate compares epochs by batch_id, but a plan no command could map to steps is still bad input."""
    plan = rebuild_plan(samples, bucketed_shuffle, 2, 0)
    plan.to_parquet(tmp_path / "plan.parquet", index=False)
    assert main(["check-plan", str(tmp_path), "--set", "rank_split=per_rank"]) == 2
    two_ranks = plan.assign(rank=np.arange(len(plan)) % 2)
    two_ranks.to_parquet(tmp_path / "plan.parquet", index=False)
    assert main(["check-plan", str(tmp_path)]) == 2
    two_ranks.assign(rank=two_ranks["batch_id"] % 2, extra="x").to_parquet(tmp_path / "plan.parquet", index=False)
    assert main(["check-plan", str(tmp_path), "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["pair_retention"] == check_plan(plan).pair_retention
