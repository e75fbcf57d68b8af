"""forensics.integrations.lightning.PlanRecorderCallback on a real Lightning fit (fixtures/lightning_runs.py: tiny
random GPT-2 on CPU, static length-sorted batch sampler, accumulate_grad_batches=2, CSV + TensorBoard loggers)."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from forensics.errors import ForensicsError
from forensics.schema import load_plan, load_samples

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytest.importorskip("pytorch_lightning")
pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def fit():
    from fixtures.lightning_runs import lightning_run

    return lightning_run()


def _plan(fit) -> pd.DataFrame:
    return load_plan(fit.out / "plan", load_samples(fit.out / "samples.parquet"))


@pytest.mark.slow
def test_recorded_plan_is_what_training_step_received(fit):
    samples = load_samples(fit.out / "samples.parquet")
    tokens = {int(i): [int(t) for t in ids] for i, ids in zip(samples["sample_id"], samples["input_ids"])}
    batches = [(int(s), g["sample_id"].tolist()) for (s, _m), g in _plan(fit).groupby(["step", "micro"])]
    assert len(batches) == len(fit.observed) == 60
    for (step, ids), seen in zip(batches, fit.observed):
        assert step == seen["step"]
        assert [tokens[i] for i in ids] == seen["rows"]


@pytest.mark.slow
def test_accumulate_grad_batches_2_gives_two_micro_batches_per_step(fit):
    plan = _plan(fit)
    assert plan.groupby("step")["micro"].apply(lambda m: sorted(m.unique().tolist())).tolist() == [[0, 1]] * 30
    assert plan.groupby("epoch")["step"].agg(["min", "max"]).values.tolist() == [[0, 9], [10, 19], [20, 29]]
    assert plan.groupby(["step", "micro"]).size().eq(8).all()
    assert plan.groupby("epoch")["batch_id"].agg(["min", "max", "nunique"]).values.tolist() == [[0, 19, 20]] * 3


@pytest.mark.slow
def test_samples_and_run_toml(fit):
    samples = load_samples(fit.out / "samples.parquet")
    assert samples["sample_id"].tolist() == list(range(160))
    assert (samples["n_tokens"] == samples["input_ids"].map(len)).all()
    assert int((samples["source"] == "scrape").sum()) == 6
    cfg = tomllib.loads((fit.out / "run.toml").read_text())
    assert cfg["metrics"] == ["csv/version_0/metrics.csv", "tb/version_0"]
    assert all((fit.out / m).exists() for m in cfg["metrics"])
    assert (cfg["plan"], cfg["samples"], cfg["step_convention"]) == ("plan", "samples.parquet", "lightning")
    assert (cfg["grad_accum"], cfg["world_size"]) == (2, 1)
    assert list((fit.out / cfg["checkpoints"]).glob("*.ckpt"))


@pytest.mark.slow
def test_lightning_logs_are_zero_based(fit):
    """Lightning's on_step value is the last micro-batch's loss, logged at the update's 0-based number: where the
    corrupted batch is a step's last micro-batch, the CSV's loss spikes at exactly that recorded step."""
    plan = _plan(fit)
    hit = plan[plan["sample_id"].isin(fit.corrupt_ids)].groupby(["step", "micro"]).size()
    assert hit.tolist() == [6, 6, 6]
    last_micro = [s for (s, m) in hit.index if m == 1]
    assert last_micro  # this seed puts the corrupted batch last in its step at least once
    loss = pd.read_csv(fit.out / "csv/version_0/metrics.csv").set_index("step")["train_loss"]
    assert loss.index.tolist() == list(range(30))
    for step in last_micro:
        assert loss[step] > max(loss.get(step - 1, -np.inf), loss.get(step + 1, -np.inf)) + 1.0
        assert loss[step] > np.median(loss.to_numpy()) + 1.5


def test_a_batch_without_sample_ids_is_bad_input():
    from forensics.integrations.lightning import _ids_of

    with pytest.raises(ForensicsError, match="no 'sample_id' field"):
        _ids_of({"input_ids": [[1, 2]]}, "sample_id")
    with pytest.raises(ForensicsError, match="position 2"):
        _ids_of(([1], [2]), 2)
    assert _ids_of(([1, 2], np.array([7, 9])), 1).tolist() == [7, 9]
    with pytest.raises(ForensicsError, match="whole numbers"):
        _ids_of({"sample_id": np.array([0.5, 1.0])}, "sample_id")


@pytest.fixture(scope="session")
def resumed_fit(tmp_path_factory):
    from fixtures.lightning_runs import build_resumed_lightning_run

    return build_resumed_lightning_run(tmp_path_factory.mktemp("lightning-resumed") / "fit")


@pytest.mark.slow
def test_a_resumed_fit_keeps_the_last_consumption_of_each_step(resumed_fit):
    """Preempted after step 17 (its step-18 batch drawn, not trained) and resumed from the checkpoint of step 15:
    steps 15-17 were consumed twice and the plan holds the resumed fit's batches for them (what the model
    reflects), every step once, exactly what training_step received in the surviving history; the rewind is
    recorded (8 rows for each of the 7 replaced micro-batches, no sampler position claimed)."""
    import json

    samples = load_samples(resumed_fit.out / "samples.parquet")
    tokens = {int(i): [int(t) for t in ids] for i, ids in zip(samples["sample_id"], samples["input_ids"])}
    plan = load_plan(resumed_fit.out / "plan", samples)
    batches = [(int(s), [tokens[i] for i in g["sample_id"]]) for (s, _m), g in plan.groupby(["step", "micro"])]
    assert batches == [(o["step"], o["rows"]) for o in resumed_fit.observed]
    first = json.loads((resumed_fit.out / "observed-first.json").read_text())
    crashed = [(o["step"], o["rows"]) for o in first if 15 <= o["step"] <= 17]
    assert len(crashed) == 6 and crashed != [b for b in batches if 15 <= b[0] <= 17]  # the resumed loader drew others
    assert json.loads((resumed_fit.out / "plan" / "rewinds.json").read_text()) == [
        {"rank": None, "last_step": 18, "resumed_at": 15, "rows_replaced": 56, "sampler": None}
    ]
