"""The demo run: two case folders whose spikes and jumpiness follow from their batch plans."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.cli import main
from forensics.datasets import LossModelParams, build_demo, simulate
from forensics.datasets.samples import CORRUPT_PATTERN
from forensics.plan.buckets import bucket_index
from forensics.schema import (
    DEFAULT_BOUNDARIES,
    alignment_warnings,
    load_plan,
    load_run_toml,
    load_samples,
    open_case,
)
from forensics.sources import read_metrics

CASES = ("static", "bucketed")
LOSS = "train/loss"


def _load(case_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    samples = load_samples(case_dir / "samples.parquet")
    plan = load_plan(case_dir / "plan.parquet", samples)
    metrics, _ = read_metrics([case_dir / "metrics.parquet"])
    labels = json.loads((case_dir / "labels.json").read_text())
    return samples, plan, metrics, labels


def _batches(plan: pd.DataFrame, epoch: int) -> list[frozenset[int]]:
    sub = plan[plan["epoch"] == epoch]
    return [frozenset(g.tolist()) for _, g in sub.groupby("batch_id", sort=True)["sample_id"]]


@pytest.mark.parametrize("case", CASES)
def test_case_folders_load_validate_and_align(demo_small: Path, case: str) -> None:
    case_dir = demo_small / case
    for name in ("samples.parquet", "plan.parquet", "metrics.parquet", "metrics.jsonl", "run.toml", "labels.json"):
        assert (case_dir / name).is_file(), name
    cfg, warnings = load_run_toml(case_dir / "run.toml")
    assert warnings == []
    assert (cfg.grad_accum, cfg.world_size, cfg.rank_split, cfg.loss_key) == (1, 1, "round_robin", LOSS)
    assert cfg.boundaries == tuple(DEFAULT_BOUNDARIES) and cfg.token_budget == 16_384 and cfg.max_len == 8192
    assert open_case(case_dir).plan_path == case_dir / "plan.parquet"
    samples, plan, metrics, _ = _load(case_dir)
    assert list(plan.columns) == ["step", "epoch", "batch_id", "sample_id"]
    assert set(samples["source"]) == {"qa", "chat", "summarization", "math", "code"}
    assert samples["n_tokens"].between(16, 8192).all() and samples["n_tokens"].duplicated().mean() > 0.5
    assert list(metrics.columns) == ["step", LOSS, "train/acc", "grad_norm", "lr", "tokens_per_s", "_timestamp"]
    assert np.array_equal(metrics["step"].to_numpy(), np.arange(len(metrics)))
    assert alignment_warnings(metrics["step"].to_numpy(), plan["step"].to_numpy()) == []
    # one batch per optimizer step (world size 1, grad accumulation 1)
    assert plan.groupby("step")[["epoch", "batch_id"]].nunique().eq(1).all().all()


@pytest.mark.parametrize("case", CASES)
def test_every_sample_is_trained_once_per_epoch(demo_small: Path, case: str) -> None:
    samples, plan, _, _ = _load(demo_small / case)
    assert sorted(plan["epoch"].unique()) == list(range(6))
    ids = np.sort(samples["sample_id"].to_numpy())
    for _, ep in plan.groupby("epoch"):
        assert np.array_equal(np.sort(ep["sample_id"].to_numpy()), ids)


def test_static_plan_repeats_the_same_batches_every_epoch_in_a_new_order(demo_small: Path) -> None:
    _, plan, _, _ = _load(demo_small / "static")
    first = _batches(plan, 0)
    assert 500 <= len(first) <= 700  # small scale: ~600 batches per epoch
    for epoch in range(1, 6):
        again = _batches(plan, epoch)
        assert set(again) == set(first)
        assert again != first  # only the order changes


def test_bucketed_plan_changes_batches_every_epoch_and_keeps_each_in_one_bucket(demo_small: Path) -> None:
    samples, plan, _, _ = _load(demo_small / "bucketed")
    buckets = pd.Series(bucket_index(samples["n_tokens"].to_numpy(), DEFAULT_BOUNDARIES), index=samples["sample_id"])
    assert plan.assign(b=plan["sample_id"].map(buckets)).groupby("step")["b"].nunique().eq(1).all()
    for epoch in range(5):
        now = {b for b in _batches(plan, epoch) if len(b) > 1}
        nxt = {b for b in _batches(plan, epoch + 1) if len(b) > 1}
        assert len(now & nxt) / len(nxt) < 0.05


def test_static_loss_jumps_at_254_and_258_and_returns(demo_small: Path) -> None:
    _, _, metrics, _ = _load(demo_small / "static")
    m = metrics.set_index("step")
    around = m.loc[230:270, LOSS].drop([254, 258])
    assert around.between(0.6, 1.3).all(), around.describe()
    assert 3.5 <= m.loc[254, LOSS] <= 6.5 and 3.5 <= m.loc[258, LOSS] <= 6.5
    # grad norm rises at the same step (data-led), accuracy falls
    gn = m.loc[230:270, "grad_norm"].drop([254, 258]).median()
    assert m.loc[254, "grad_norm"] > 4 * gn and m.loc[258, "grad_norm"] > 4 * gn
    assert m.loc[254, "train/acc"] < 0.2 < m.loc[250, "train/acc"]


def test_labels_name_the_spikes_their_corrupted_samples_and_recurrences(demo_small: Path) -> None:
    samples, plan, metrics, labels = _load(demo_small / "static")
    spikes = labels["spikes"]
    first = [s for s in spikes if s["kind"] == "corrupt_duplicates"]
    assert [(s["step"], s["end_step"]) for s in first] == [(254, 254), (258, 258)]
    by_id = samples.set_index("sample_id")
    for s in first:
        assert s["sample_ids"] == sorted(plan.loc[plan["step"] == s["step"], "sample_id"].tolist())
        group = by_id.loc[s["sample_ids"]]
        assert len(group) >= 3 and (group["source"] == "code").all()
        assert group["text"].str.contains(CORRUPT_PATTERN, regex=False).all()
        assert group["n_tokens"].max() - group["n_tokens"].min() < 0.1 * group["n_tokens"].min()
        assert s["cause"] and "static_sorted" in s["cause"]
    # each group's batch comes back every epoch; the first recurrence still spikes, smaller
    loss = metrics.set_index("step")[LOSS]
    batch_of_step = plan.groupby("step")["sample_id"].apply(lambda x: sorted(x.tolist()))
    for s in first:
        recur = batch_of_step.index[batch_of_step.map(lambda ids, want=s["sample_ids"]: ids == want)].tolist()
        assert len(recur) == 6
        assert loss[recur[1]] < loss[recur[0]] and loss[recur[1]] > 1.3
        labelled = [r["step"] for r in spikes if r["sample_ids"] == s["sample_ids"]]
        assert labelled == [t for t in recur if t in labelled] and recur[1] in labelled
    assert set(labels["corrupt_sample_ids"]) == {i for s in first for i in s["sample_ids"]}
    assert {"scale", "tau_steps"} <= set(labels["forgetting"])
    assert labels["forgetting"]["scale"] == LossModelParams().forget_scale


def test_bucketed_run_scatters_the_corrupted_samples_and_has_no_spike(demo_small: Path) -> None:
    _, plan, metrics, labels = _load(demo_small / "bucketed")
    assert labels["spikes"] == []
    per_step = plan[plan["sample_id"].isin(labels["corrupt_sample_ids"])].groupby("step").size()
    assert per_step.max() <= 2 and per_step.size >= 6 * len(labels["corrupt_sample_ids"]) - 6
    after_warmup = metrics.set_index("step").loc[300:, LOSS]
    assert after_warmup.max() < 1.5


def test_bucketed_loss_is_jumpy_by_length_bucket(demo_small: Path) -> None:
    samples, plan, metrics, labels = _load(demo_small / "bucketed")
    buckets = pd.Series(bucket_index(samples["n_tokens"].to_numpy(), DEFAULT_BOUNDARIES), index=samples["sample_id"])
    step_bucket = plan.assign(b=plan["sample_id"].map(buckets)).groupby("step")["b"].first()
    m = metrics.set_index("step").loc[1000:2000, LOSS]
    by_bucket = m.groupby(step_bucket.loc[m.index]).mean()
    assert by_bucket.is_monotonic_decreasing  # longer buckets: lower per-token loss
    assert by_bucket.iloc[0] - by_bucket.iloc[-1] > 0.2
    # step-to-step jumps are far larger than the noise: the curve is visibly jumpy
    assert m.diff().abs().median() > 3 * LossModelParams().noise_sd
    assert labels["jumpiness"]["bucket_level"] == list(LossModelParams().bucket_level)


def test_tokens_per_s_follows_padding_efficiency(demo_small: Path) -> None:
    rates = {}
    for case in CASES:
        _, _, metrics, labels = _load(demo_small / case)
        rates[case] = (metrics["tokens_per_s"].mean(), labels["padding_efficiency"])
    static_rate, static_eff = rates["static"]
    bucketed_rate, bucketed_eff = rates["bucketed"]
    assert 28_000 < static_rate < 33_000 and static_eff > 0.99
    assert 0.6 < bucketed_eff < 0.85
    assert bucketed_rate / static_rate == pytest.approx(bucketed_eff / static_eff, rel=0.1)


@pytest.mark.parametrize("case", CASES)
def test_metrics_jsonl_holds_the_parquet_values_exactly(demo_small: Path, case: str) -> None:
    parquet = pd.read_parquet(demo_small / case / "metrics.parquet")
    lines = (demo_small / case / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == len(parquet)
    assert list(rows[0]) == list(parquet.columns)
    for col in parquet.columns:
        got = np.array([r[col] for r in rows])
        assert np.array_equal(got, parquet[col].to_numpy()), col
    assert all(isinstance(r["step"], int) for r in rows[:10])


@pytest.mark.parametrize("case", CASES)
def test_wandb_offline_run_is_written(demo_small: Path, case: str) -> None:
    pytest.importorskip("wandb")
    runs = list((demo_small / case / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    data = runs[0].read_bytes()
    assert data[:4] == b":W&B" and len(data) > 100 * len(pd.read_parquet(demo_small / case / "metrics.parquet"))


def test_wandb_writer_leaves_the_users_wandb_settings_alone(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    import os

    from forensics.datasets.wandb_writer import write_wandb_run

    elsewhere, config_dir = tmp_path / "elsewhere", tmp_path / "config"
    monkeypatch.setenv("WANDB_DIR", str(elsewhere))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(config_dir))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    before = {k: v for k, v in os.environ.items() if k.startswith("WANDB_")}
    folder = write_wandb_run(tmp_path / "case", pd.DataFrame({"step": [0, 1], "lr": [0.1, 0.2]}), {}, "t")
    assert {k: v for k, v in os.environ.items() if k.startswith("WANDB_")} == before
    assert folder.parent == (tmp_path / "case" / "wandb").resolve()
    assert not elsewhere.exists() and not config_dir.exists()


def test_wandb_runs_written_in_parallel_processes_hold_every_row(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    from forensics.datasets.wandb_writer import WandbJob, write_wandb_runs

    metrics = pd.DataFrame({"step": np.arange(300), "train/loss": np.linspace(2.0, 1.0, 300)})
    done = []
    folders = write_wandb_runs(
        [WandbJob(tmp_path / "a", metrics, name="a"), WandbJob(tmp_path / "b", metrics.head(3))],
        processes=2,
        on_done=lambda n, total: done.append((n, total)),
    )
    assert done == [(1, 2), (2, 2)]
    sizes = []
    for folder, case in zip(folders, ("a", "b")):
        assert folder.parent == (tmp_path / case / "wandb").resolve()
        (run,) = folder.glob("run-*.wandb")
        sizes.append(run.stat().st_size)
    assert sizes[0] > sizes[1] + 250 * 20  # ~300 history records against 3


def test_same_seed_gives_identical_tables_and_another_seed_differs(demo_small: Path, tmp_path: Path) -> None:
    build_demo(tmp_path / "again", scale="small", seed=0, wandb=False)
    for case in CASES:
        for name in ("samples.parquet", "plan.parquet", "metrics.parquet"):
            a = pd.read_parquet(demo_small / case / name)
            b = pd.read_parquet(tmp_path / "again" / case / name)
            pd.testing.assert_frame_equal(a, b, check_exact=True)
        again = tmp_path / "again" / case / "labels.json"
        assert (demo_small / case / "labels.json").read_text() == again.read_text()
    other = build_demo(tmp_path / "other", scale="small", seed=1, wandb=False)
    a = pd.read_parquet(demo_small / "static" / "metrics.parquet")
    b = pd.read_parquet(tmp_path / "other" / "static" / "metrics.parquet")
    assert len(a) != len(b) or not a.equals(b)
    assert other["cases"]["static"]["spike_steps"][:2] == [254, 258]  # the mechanism holds for other seeds


def test_cli_demo_writes_both_cases_and_says_what_to_run_next(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--scale", "small", "--seed", "3", "--no-wandb"]) == 0
    text = capsys.readouterr().out
    assert f"forensics audit {out / 'static'}" in text
    for case in CASES:
        assert (out / case / "plan.parquet").is_file() and (out / case / "labels.json").is_file()
        assert not (out / case / "wandb").exists()


def test_cli_demo_rejects_an_unknown_scale(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--out", str(tmp_path), "--scale", "huge"])
    assert exc.value.code == 2


# --- the loss model on hand-made plans: its mechanisms, number by number -------------------------------------------
def _toy(sources: list[str], lengths: list[int], batches: list[list[int]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    samples = pd.DataFrame({"sample_id": np.arange(len(sources)), "n_tokens": lengths, "source": sources})
    rows = [(step, 0, sid) for step, b in enumerate(batches) for sid in b]
    plan = pd.DataFrame(rows, columns=["step", "epoch", "sample_id"])
    return samples, plan


QUIET = LossModelParams(
    noise_sd=0.0, warmup_tau=1e-9, plateau_start=1.0, plateau_end=1.0, epoch_drop=0.0, aftershock_frac=0.0
)


def test_forgetting_grows_with_steps_since_a_source_was_seen() -> None:
    # steps 0..99 train qa; code is seen at step 0 and again at step 100: a gap of 100 steps
    sources = ["code"] + ["qa"] * 99 + ["code", "code"]
    samples, plan = _toy(sources, [1000] * len(sources), [[i] for i in range(len(sources))])
    sim = simulate(plan, samples, [], QUIET)
    t = sim.terms.set_index("step")["forgetting"]
    p = QUIET
    assert t[100] == pytest.approx(p.forget_scale * math.log1p(100 / p.forget_tau))
    assert t[101] == pytest.approx(p.forget_scale * math.log1p(1 / p.forget_tau))
    assert t[50] == pytest.approx(p.forget_scale * math.log1p(1 / p.forget_tau))


def test_corrupted_duplicates_matter_only_together() -> None:
    # six corrupted samples: together in one batch at step 0, then each alone with two clean ones
    sources = ["code"] * 18
    batches = [[0, 1, 2, 3, 4, 5]] + [[i, 6 + 2 * (i % 6), 7 + 2 * (i % 6)] for i in range(6)]
    samples, plan = _toy(sources, [2500] * 18, batches)
    sim = simulate(plan, samples, list(range(6)), QUIET)
    corrupt = sim.terms.set_index("step")["corrupt"]
    p = QUIET
    together = p.corrupt_amplitude * p.hill(6) + p.corrupt_sample_offset
    assert corrupt[0] == pytest.approx(together)
    alone = (p.corrupt_amplitude * p.hill(1) + p.corrupt_sample_offset) * p.memorise_decay / 3
    assert corrupt[1] == pytest.approx(alone)
    assert corrupt[0] > 3.5 and corrupt[1] < 0.1
    assert p.hill(1) < 0.001 < p.hill(2) < 0.1 < 0.8 < p.hill(3)
