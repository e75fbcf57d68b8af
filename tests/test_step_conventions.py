"""Step conventions recognised from the sources of real HF Trainer runs (fixtures/hf_runs.py): trainer_state.json,
the TensorBoardCallback's scalars and the WandbCallback's offline run of the same run, aligned without a flag."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from forensics.sources.registry import open_reader
from forensics.sources.step_conventions import (
    StepConvention,
    aligned_table,
    logging_interval,
    recognise,
    recognise_wandb,
)


@pytest.fixture(scope="session")
def runs():
    pytest.importorskip("transformers")
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboard")
    from fixtures.hf_runs import hf_runs

    return hf_runs()


def _sources(run) -> dict[str, str]:
    return {
        "trainer_state": str(run.out / "trainer_state.json"),
        "tensorboard": str(run.tensorboard_runs[0]),
        "wandb": str(run.wandb_runs[0]),
    }


def _read(source: str):
    reader = open_reader(source)
    reader.finished = True
    reader.read_all()
    return reader


@pytest.mark.slow
@pytest.mark.parametrize(("name", "logging_steps"), [("static", 1), ("logging5", 5)])
def test_each_hf_source_is_recognised_from_its_own_fields(runs, name, logging_steps):
    src = _sources(runs[name])
    state = recognise(_read(src["trainer_state"]))
    tb = recognise(_read(src["tensorboard"]))
    wb = recognise(_read(src["wandb"]))
    assert (state.step_key, state.step_offset, state.convention) == ("step", 1, "hf-trainer")
    assert (tb.step_key, tb.step_offset, tb.convention) == ("step", 1, "hf-trainer")
    assert (wb.step_key, wb.step_offset, wb.convention) == ("train/global_step", 1, "hf-trainer")
    assert state.logging_steps == tb.logging_steps == wb.logging_steps == logging_steps


@pytest.mark.slow
@pytest.mark.parametrize("name", ["static", "logging5"])
def test_aligned_sources_agree_on_step_and_loss_for_every_logged_step(runs, name):
    run = runs[name]
    src = _sources(run)
    state, _ = aligned_table(src["trainer_state"])
    tb, _ = aligned_table(src["tensorboard"])
    wb, _ = aligned_table(src["wandb"])
    series = [t.set_index("step")[key].dropna() for t, key in ((state, "loss"), (tb, "train/loss"), (wb, "train/loss"))]
    logged = json.loads((run.out / "trainer_state.json").read_text())["log_history"]
    expected = [r["step"] - 1 for r in logged if "loss" in r]  # HF's step s+1 is update s
    for s in series:
        assert s.index.tolist() == expected
        np.testing.assert_allclose(s.to_numpy(), series[0].to_numpy(), rtol=1e-6)
    # the first logged value is update L-1's (0-based), the mean over updates 0..L-1
    step = 5 if name == "logging5" else 1
    assert expected[:3] == [step - 1, 2 * step - 1, 3 * step - 1]


@pytest.mark.slow
def test_wandb_step_counts_log_calls_and_drifts_after_each_eval(runs):
    """Why W&B's _step is not used: the static run evaluates every 20 steps; each eval is one more log call."""
    run = runs["static"]
    raw = _read(str(run.wandb_runs[0])).table  # read by _step, as without the convention
    aligned, _ = aligned_table(str(run.wandb_runs[0]))
    by_update = aligned.set_index("step")["train/loss"].dropna()
    raw_loss = raw.set_index("step")["train/loss"].dropna()
    drift = raw_loss.index.to_numpy() - by_update.index.to_numpy()
    assert drift[0] == 0 and drift[-1] == 4  # evals after updates 20, 40, 60, 80 (the one at 100 after the last loss)
    assert set(np.unique(drift).tolist()) == {0, 1, 2, 3, 4}
    assert (raw_loss.reindex(by_update.index).to_numpy() != by_update.to_numpy()).sum() >= 30


def test_wandb_own_step_is_preferred_to_wandb_step():
    own = pd.DataFrame({"step": [0, 1], "trainer/global_step": [0.0, 1.0], "loss": [1.0, 2.0]})
    assert recognise_wandb(own, {}, "_step") == StepConvention(
        "trainer/global_step",
        0,
        "wandb-own-step",
        None,
        "W&B history logs its own step key 'trainer/global_step'; _step (log calls) not used",
    )
    logged_step = pd.DataFrame({"step": [0, 1], "logged_step": [3.0, 4.0], "loss": [1.0, 2.0]})
    assert recognise_wandb(logged_step, {}, "_step").step_key == "step"  # a logged 'step' key, renamed by the reader
    bare = pd.DataFrame({"step": [0, 1], "loss": [1.0, 2.0]})
    assert recognise_wandb(bare, {}, "_step").step_key == "_step"
    assert recognise_wandb(bare, {}, "_step").convention == "wandb-step"


def test_sources_that_do_not_say_how_they_count_get_no_convention(tmp_path):
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_text("".join(json.dumps({"step": s, "loss": 1.0 / (s + 1)}) + "\n" for s in range(5)))
    assert recognise(_read(str(jsonl))) is None
    doc = tmp_path / "history.json"
    doc.write_text(json.dumps({"history": [{"step": s, "loss": 1.0} for s in range(3)], "global_step": 3}))
    assert recognise(_read(str(doc))) is None  # global_step beside records not under log_history
    table, convention = aligned_table(str(jsonl))
    assert convention is None and table["step"].tolist() == [0, 1, 2, 3, 4]


def test_logging_interval_from_the_logged_steps():
    assert logging_interval(np.array([5, 10, 15, 20, 23])) == 5  # the last step is logged too
    assert logging_interval(np.array([1, 5, 10, 15, 20])) == 5  # logging_first_step
    assert logging_interval(np.arange(1, 30)) == 1
    assert logging_interval(np.array([3])) is None
    assert logging_interval(np.array([2, 5, 9, 14, 20])) is None  # no regular spacing


def test_tensorboard_of_another_producer_gets_no_convention(tmp_path):
    """A plain torch SummaryWriter run (tags loss, lr, epoch at 0-based steps) is not taken for HF's."""
    pytest.importorskip("tensorboard")
    torch_tb = pytest.importorskip("torch.utils.tensorboard")
    writer = torch_tb.SummaryWriter(str(tmp_path / "tb"))
    for step in range(6):
        writer.add_scalar("loss", 1.0 / (step + 1), step)
        writer.add_scalar("lr", 1e-3, step)
        writer.add_scalar("epoch", step // 3, step)
        writer.add_scalar("train/learning_rate", 1e-3, step)  # one HF-like tag alone is not the callback's set
    writer.close()
    reader = _read(str(tmp_path / "tb"))
    assert reader.table["step"].tolist() == list(range(6))
    assert recognise(reader) is None
