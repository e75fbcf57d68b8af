"""The real Trainer cases of fixtures/hf_cases.py are what they claim to be: the plan recorded per optimizer step
is the one trained on and the one logged, the corrupted samples sit in the steps their batcher puts them in and
raise those steps' loss, and the cache builds a case once, atomically."""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time

import numpy as np
import pandas as pd
import pytest

from fixtures import hf_cases as fx
from fixtures import text_corpus as corpus

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.slow

STEPS = {
    "clean_grouped": 600,
    "static_corrupt": 400,
    "accum2_repaired": 400,
    "grouped_longest_corrupt": 600,
    "random_corrupt": 756,
    "random_accum2_corrupt": 378,
}
CHECKPOINTS = {
    "clean_grouped": [100, 200, 300, 400, 500, 600],
    "static_corrupt": [100, 200, 300, 400],
    "accum2_repaired": [100, 200, 300, 400],
    "grouped_longest_corrupt": [150, 300, 450, 600],
    "random_corrupt": [126, 252, 378, 504, 630, 756],
    "random_accum2_corrupt": [63, 126, 189, 252, 315, 378],
}
#: Lower bounds of the median loss lift of the corrupted steps (measured: 3.51, 1.60, 1.59, 1.46, 1.22).
LIFT = {
    "static_corrupt": 3.0,
    "accum2_repaired": 1.4,
    "grouped_longest_corrupt": 1.4,
    "random_corrupt": 1.3,
    "random_accum2_corrupt": 1.1,
}


def _plan(case) -> pd.DataFrame:
    return pd.read_parquet(case.out / "plan")


def _state(case) -> dict:
    return json.loads((case.out / "trainer_state.json").read_text())


@pytest.mark.parametrize("name", list(STEPS))
def test_plan_holds_one_step_per_logged_update(hf_cases, name):
    case = hf_cases[name]
    state = _state(case)
    logged = {h["step"] - 1 for h in state["log_history"] if "loss" in h}
    assert state["global_step"] == STEPS[name]
    assert set(_plan(case)["step"]) == logged == set(range(STEPS[name]))


@pytest.mark.parametrize("name", list(STEPS))
def test_plan_is_what_compute_loss_received(hf_cases, name):
    case = hf_cases[name]
    samples = pd.read_parquet(case.out / "samples.parquet")
    tokens = dict(zip(samples["sample_id"], samples["input_ids"].map(tuple)))
    observed = collections.defaultdict(list)
    for o in case.observed:
        observed[o["step"]] += [tuple(r) for r in o["rows"]]
    planned = {s: sorted(tokens[i] for i in g["sample_id"]) for s, g in _plan(case).groupby("step")}
    assert planned == {s: sorted(rows) for s, rows in observed.items()}


@pytest.mark.parametrize(
    "name, size, partial",
    [
        ("static_corrupt", 16, {}),
        ("accum2_repaired", 16, {}),
        ("clean_grouped", 8, {}),
        ("random_corrupt", 8, {251: 2, 503: 2, 755: 2}),
        ("random_accum2_corrupt", 16, {125: 10, 251: 10, 377: 10}),
    ],
)
def test_each_epoch_ends_on_its_partial_batch(hf_cases, name, size, partial):
    sizes = _plan(hf_cases[name]).groupby("step").size()
    assert sizes[sizes != size].to_dict() == partial


@pytest.mark.parametrize("name", list(STEPS))
def test_checkpoints_and_metrics_sources_exist(hf_cases, name):
    case = hf_cases[name]
    assert [int(p.name.split("-")[1]) for p in case.checkpoints] == CHECKPOINTS[name]
    assert all((p / "model.safetensors").exists() and (p / "optimizer.pt").exists() for p in case.checkpoints)
    run = tomllib.loads((case.out / "run.toml").read_text())
    assert run["metrics"] == [
        "trainer_state.json",
        case.tensorboard_runs[0].relative_to(case.out).as_posix(),
        case.wandb_runs[0].relative_to(case.out).as_posix(),
    ]
    assert len(list(case.tensorboard_runs[0].glob("events.out.tfevents.*"))) == 1
    assert len(list(case.wandb_runs[0].glob("run-*.wandb"))) == 1
    assert (run["logging_steps"], run["grad_accum"], run["world_size"]) == (1, fx.CASES[name].grad_accum, 1)


def test_clean_run_has_no_corrupted_samples(hf_cases):
    case = hf_cases["clean_grouped"]
    assert case.corrupt_ids == [] and case.corrupt_steps() == []
    texts = pd.read_parquet(case.out / "samples.parquet")["text"]
    assert sum(any(w in corpus.WEB for w in t.split()) for t in texts) == 0  # the boilerplate's words are unused


def test_samples_read_as_text_and_length_follows_source(hf_cases):
    samples = pd.read_parquet(hf_cases["random_corrupt"].out / "samples.parquet")
    assert (samples["text"] == samples["input_ids"].map(lambda ids: " ".join(corpus.VOCAB[i] for i in ids))).all()
    mean = samples.groupby("source")["n_tokens"].mean()
    assert mean.sort_values().index.tolist() == ["qa", "recipes", "sports", "code"]
    assert len(samples) == 2010 and samples["n_tokens"].max() <= corpus.MAX_LEN


def test_static_batcher_packs_the_near_duplicates_into_one_batch_every_epoch(hf_cases):
    case = hf_cases["static_corrupt"]
    plan = _plan(case)
    steps = case.corrupt_steps()
    assert plan[plan["step"].isin(steps)]["epoch"].tolist() == sorted([0, 1, 2, 3] * 16)
    batches = [frozenset(plan.loc[plan["step"] == s, "sample_id"]) for s in steps]
    assert len(set(batches)) == 1 and len(batches[0] & set(case.corrupt_ids)) == 12 and len(batches[0]) == 16


def test_poisoned_micro_batch_gets_a_new_partner_each_epoch(hf_cases):
    case = hf_cases["accum2_repaired"]
    plan = _plan(case)
    steps = case.corrupt_steps()
    assert len(steps) == 4 and plan[plan["step"].isin(steps)]["epoch"].unique().tolist() == [0, 1, 2, 3]
    poisoned, partners = set(), set()
    for s in steps:
        rows = plan[plan["step"] == s]
        (micro,) = rows.loc[rows["sample_id"].isin(case.corrupt_ids), "micro"].unique()
        poisoned.add(frozenset(rows.loc[rows["micro"] == micro, "sample_id"]))
        partners.add(frozenset(rows.loc[rows["micro"] != micro, "sample_id"]))
    assert len(poisoned) == 1 and len(next(iter(poisoned)) & set(case.corrupt_ids)) == 6 and len(partners) == 4


def test_length_grouped_sampler_puts_the_longest_first_in_each_megabatch(hf_cases):
    case = hf_cases["grouped_longest_corrupt"]
    samples = pd.read_parquet(case.out / "samples.parquet")
    assert sorted(samples.nlargest(10, "n_tokens")["sample_id"]) == case.corrupt_ids
    assert samples.loc[~samples["sample_id"].isin(case.corrupt_ids), "n_tokens"].max() == corpus.MAX_CLEAN_LEN
    # HF groups 1,600 rows into megabatches of 50 batches, each sorted longest first: the corrupted rows only ever
    # open a megabatch, and in this run every megabatch of every epoch holds at least one
    assert case.corrupt_steps() == list(range(0, 600, 50))
    plan = _plan(case)
    per_sample = plan[plan["sample_id"].isin(case.corrupt_ids)].groupby("sample_id")["epoch"].apply(sorted)
    assert per_sample.tolist() == [[0, 1, 2]] * 10


@pytest.mark.parametrize("name", ["random_corrupt", "random_accum2_corrupt"])
def test_random_sampler_consumes_each_corrupted_sample_once_per_epoch(hf_cases, name):
    case = hf_cases[name]
    plan = _plan(case)
    per_sample = plan[plan["sample_id"].isin(case.corrupt_ids)].groupby("sample_id")["epoch"].apply(sorted)
    assert per_sample.tolist() == [[0, 1, 2]] * 10
    kinds = json.loads((case.out / fx.FIXTURE_FILE).read_text())["corrupt_kinds"]
    assert collections.Counter(kinds.values()) == {"near_duplicate": 4, "repetition": 3, "noise": 3}


@pytest.mark.parametrize("name", list(LIFT))
def test_corrupted_steps_raise_the_loss(hf_cases, name):
    case = hf_cases[name]
    lift = fx.corrupt_loss_lift(case)
    assert float(np.median(list(lift.values()))) > LIFT[name]
    past_start = STEPS[name] // 10  # the first steps' loss falls too fast for a neighbourhood median
    assert sum(v <= 1.0 for s, v in lift.items() if s >= past_start) == 0


def test_clean_batches_rarely_hold_near_duplicates(hf_cases):
    """A clean batch-mate sharing 60% of a sample's word set is rare, so near-duplicates point at corruption."""
    case = hf_cases["clean_grouped"]
    samples = pd.read_parquet(case.out / "samples.parquet")
    words = dict(zip(samples["sample_id"], samples["text"].map(lambda t: frozenset(t.split()))))
    close = total = 0
    for _, batch in _plan(case).groupby("step"):
        sets = [words[i] for i in batch["sample_id"]]
        for a, wa in enumerate(sets):
            close += max(len(wa & wb) / len(wa | wb) for b, wb in enumerate(sets) if b != a) >= 0.6
            total += 1
    assert close / total < 0.10


# --- the cache -------------------------------------------------------------------------------------------------
def _fake_build(calls: list, delay: threading.Event | None = None):
    def build(name, out):
        calls.append(name)
        out.mkdir(parents=True)
        if delay is not None:
            delay.wait(5)
        (out / fx.FIXTURE_FILE).write_text(json.dumps({"corrupt_ids": [3, 1]}))

    return build


def test_a_case_is_built_once_and_a_killed_build_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(fx.CACHE_ENV, str(tmp_path))
    calls: list = []
    monkeypatch.setattr(fx, "build_case", _fake_build(calls))
    stale = fx.case_dir("static_corrupt").parent / ".building-static_corrupt-99999"
    stale.mkdir(parents=True)
    first, second = fx.hf_case("static_corrupt"), fx.hf_case("static_corrupt")
    assert calls == ["static_corrupt"] and first.out == second.out == fx.case_dir("static_corrupt")
    assert first.corrupt_ids == [3, 1] and not stale.exists()
    assert sorted(p.name for p in first.out.parent.iterdir()) == ["static_corrupt", "static_corrupt.lock"]


def test_a_second_builder_waits_for_the_first(tmp_path, monkeypatch):
    monkeypatch.setenv(fx.CACHE_ENV, str(tmp_path))
    calls: list = []
    release = threading.Event()
    monkeypatch.setattr(fx, "build_case", _fake_build(calls, release))
    got: list = []
    workers = [threading.Thread(target=lambda: got.append(fx.hf_case("random_corrupt").out)) for _ in range(2)]
    for w in workers:
        w.start()
    time.sleep(0.5)  # the second worker is now waiting on the lock the first holds while it builds
    release.set()
    for w in workers:
        w.join(10)
    assert calls == ["random_corrupt"] and got == [fx.case_dir("random_corrupt")] * 2


def test_cache_key_follows_the_parameters(monkeypatch):
    key = fx.cache_key("random_corrupt")
    assert key == fx.cache_key("random_corrupt") and key != fx.cache_key("random_accum2_corrupt")
    monkeypatch.setitem(fx.CASES, "random_corrupt", dataclasses.replace(fx.CASES["random_corrupt"], seed=5))
    assert fx.cache_key("random_corrupt") != key
