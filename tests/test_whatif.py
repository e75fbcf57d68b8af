"""The what-if of batching strategies: every figure recomputed here from the reference builders run for real on the
same samples, the throughput scaling, and the ``forensics whatif`` command's JSON and exit codes."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from forensics.cli import main
from forensics.plan.builders import bucketed_shuffle, random_shuffle, shuffle_then_sort, static_sorted
from forensics.plan.optimal_boundaries import optimal_boundaries
from forensics.plan.whatif import STRATEGIES, whatif
from forensics.schema import DEFAULT_BOUNDARIES, MAX_LEN


def story_samples(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(6.3, 1.0, n).astype(np.int64) + 10, 10, 12_000)
    return pd.DataFrame({"sample_id": np.arange(7000, 7000 + n), "n_tokens": lengths.astype(np.int32)})


def by_hand(samples: pd.DataFrame, builder, epochs: int, batches_per_step: int, **kw) -> dict:
    """Batches, steps, padding efficiency and per-step tokens from the builder's own batches."""
    length = dict(zip(samples["sample_id"], np.minimum(samples["n_tokens"], MAX_LEN).tolist()))
    real_steps, padded_steps, n_batches = [], [], []
    for epoch in range(epochs):
        batches = builder(samples, epoch, 0, token_budget=8192, **kw)
        n_batches.append(len(batches))
        for start in range(0, len(batches), batches_per_step):
            group = batches[start : start + batches_per_step]
            real_steps.append(sum(length[s] for b in group for s in b))
            padded_steps.append(sum(len(b) * max(length[s] for s in b) for b in group))
    return {
        "batches": np.mean(n_batches),
        "steps": len(real_steps) / epochs,
        "eff": sum(real_steps) / sum(padded_steps),
        "real": np.array(real_steps),
        "padded": np.array(padded_steps),
    }


@pytest.fixture(scope="module")
def samples() -> pd.DataFrame:
    return story_samples(3_000, 1)


@pytest.fixture(scope="module")
def result(samples):
    return whatif(samples["n_tokens"].to_numpy(), token_budget=8192, grad_accum=2, world_size=2, epochs=2)


def test_whatif_figures_match_the_builders_run_for_real(samples, result):
    lengths = samples["n_tokens"].to_numpy()
    optimal = optimal_boundaries(lengths, len(DEFAULT_BOUNDARIES) - 1)
    builders = {
        "static_sorted": (static_sorted, {}),
        "bucketed_given": (bucketed_shuffle, {"boundaries": list(DEFAULT_BOUNDARIES)}),
        "bucketed_optimal": (bucketed_shuffle, {"boundaries": optimal}),
        "shuffle_then_sort": (shuffle_then_sort, {}),
        "random_shuffle": (random_shuffle, {}),
    }
    assert [s.name for s in result.strategies] == list(STRATEGIES)
    assert result.by_name("bucketed_optimal").boundaries == optimal
    for name, (builder, kw) in builders.items():
        expect = by_hand(samples, builder, epochs=2, batches_per_step=4, **kw)
        got = result.by_name(name)
        assert got.batches_per_epoch == expect["batches"], name
        assert got.steps_per_epoch == expect["steps"], name
        assert got.padding_efficiency == pytest.approx(expect["eff"]), name
        assert got.real_tokens_per_step.mean == pytest.approx(expect["real"].mean()), name
        assert got.real_tokens_per_step.std == pytest.approx(expect["real"].std()), name
        assert got.real_tokens_per_step.p5 == pytest.approx(np.percentile(expect["real"], 5)), name
        assert got.padded_tokens_per_step.p95 == pytest.approx(np.percentile(expect["padded"], 95)), name
        assert got.padded_tokens_per_step.cv == pytest.approx(expect["padded"].std() / expect["padded"].mean())


def test_throughput_scales_measured_tokens_per_s_by_padding_efficiency(result):
    sorted_eff = result.by_name("static_sorted").padding_efficiency
    for s in result.strategies:
        assert s.tokens_per_s == pytest.approx(30_000 * s.padding_efficiency / sorted_eff)
        # an epoch's real tokens at that rate
        assert s.epoch_seconds * s.tokens_per_s == pytest.approx(s.real_tokens / result.epochs)
    assert result.by_name("static_sorted").tokens_per_s == pytest.approx(30_000)


def test_random_costs_the_story_share_of_throughput_and_buckets_sit_between(samples):
    # the default budget (16,384) on a realistic length mix: the story saw about 40% (30K -> 12K tok/s)
    res = whatif(samples["n_tokens"].to_numpy())
    eff = {s.name: s.padding_efficiency for s in res.strategies}
    assert 0.3 <= res.random_over_sorted <= 0.55
    assert eff["random_shuffle"] < eff["bucketed_given"] <= eff["bucketed_optimal"] < eff["static_sorted"]
    # the sort undoes the shuffle except among equal lengths: the same padding within a hair
    assert eff["shuffle_then_sort"] == pytest.approx(eff["static_sorted"], abs=2e-3)


def test_whatif_is_deterministic_for_a_seed(samples):
    lengths = samples["n_tokens"].to_numpy()
    assert whatif(lengths, seed=3).to_dict() == whatif(lengths, seed=3).to_dict()


def test_boundaries_longer_than_max_len_are_fitted_with_a_warning(samples):
    res = whatif(samples["n_tokens"].to_numpy(), max_len=2048)
    assert res.by_name("bucketed_given").boundaries == [0, 770, 1216, 1728, 2048]
    assert len(res.by_name("bucketed_optimal").boundaries) == 5
    assert res.warnings and "2048" in res.warnings[0]


def test_whatif_on_the_demo_samples_orders_strategies_by_padding(demo_small):
    res = whatif(pd.read_parquet(demo_small / "static" / "samples.parquet")["n_tokens"].to_numpy())
    eff = {s.name: s.padding_efficiency for s in res.strategies}
    assert eff["random_shuffle"] < eff["bucketed_given"] < eff["static_sorted"]
    assert res.random_over_sorted < 0.8


# --- the command ----------------------------------------------------------------------------------------------------
def test_whatif_command_writes_every_strategy_to_json(samples, tmp_path, capsys):
    path = tmp_path / "samples.parquet"
    samples.to_parquet(path)
    out = tmp_path / "whatif.json"
    rc = main(
        [
            "whatif",
            "--samples",
            str(path),
            "--token-budget",
            "8192",
            "--boundaries",
            "0,1000,8192",
            "--tokens-per-s",
            "20000",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert [s["name"] for s in data["strategies"]] == list(STRATEGIES)
    assert data["token_budget"] == 8192 and data["tokens_per_s_measured"] == 20000
    given = data["strategies"][1]
    assert given["boundaries"] == [0, 1000, 8192]
    assert len(data["strategies"][2]["boundaries"]) == 3  # optimal with the same K
    for s in data["strategies"]:
        assert {
            "batches_per_epoch",
            "padding_efficiency",
            "tokens_per_s",
            "real_tokens_per_step",
            "padded_tokens_per_step",
        } <= set(s)
        assert {"mean", "std", "p5", "p95", "cv"} == set(s["real_tokens_per_step"])
    assert data["random_over_sorted"] == pytest.approx(data["strategies"][4]["tokens_per_s"] / 20000)
    assert "random/sorted throughput" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--boundaries", "0,x,8192"], "--boundaries"),
        (["--boundaries", "10,20"], "start at 0"),
        (["--token-budget", "0"], "--token-budget: must be a positive integer"),
    ],
)
def test_whatif_command_exits_2_on_bad_options(samples, tmp_path, capsys, extra, message):
    path = tmp_path / "samples.csv"
    samples.to_csv(path, index=False)
    assert main(["whatif", "--samples", str(path), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_whatif_command_exits_2_on_a_missing_samples_file(tmp_path, capsys):
    assert main(["whatif", "--samples", str(tmp_path / "missing.parquet")]) == 2
    assert "does not exist" in capsys.readouterr().err
