"""Validation at the boundary: each bad input gives one clear message and exit 2; data quirks are warnings."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from forensics.cli import main
from forensics.errors import ForensicsError
from forensics.plan.step_mapping import assign_steps
from forensics.schema import (
    load_run_toml,
    resolve_config,
    validate_plan,
    validate_samples,
    write_run_toml,
)
from forensics.sources.reader.rows import last_write_wins


@pytest.fixture()
def case(tmp_path):
    """A small valid case folder: 20 samples, 10 steps of 2 samples, metrics for steps 0-9."""
    samples = pd.DataFrame(
        {"sample_id": np.arange(20), "n_tokens": np.arange(20) * 10 + 5, "text": [f"text {i}" for i in range(20)]}
    )
    plan = pd.DataFrame({"step": np.repeat(np.arange(10), 2), "sample_id": np.arange(20)})
    metrics = pd.DataFrame({"step": np.arange(10), "train/loss": np.linspace(2, 1, 10)})
    samples.to_parquet(tmp_path / "samples.parquet")
    plan.to_parquet(tmp_path / "plan.parquet")
    metrics.to_parquet(tmp_path / "metrics.parquet")
    return tmp_path


def run_cli(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_valid_case_loads(case, capsys):
    code, out, err = run_cli(["validate", str(case)], capsys)
    assert code == 0, err
    assert "metrics: 10 steps (0-9)" in out
    assert "plan: 20 rows, 10 steps" in out
    assert out.strip().endswith("ok")


def test_missing_file_is_exit_2(tmp_path, capsys):
    code, _, err = run_cli(["validate", "--samples", str(tmp_path / "nope.parquet")], capsys)
    assert code == 2
    assert "does not exist" in err and "nope.parquet" in err
    assert "Traceback" not in err


def test_missing_column_names_file_and_column(case, capsys):
    pd.DataFrame({"sample_id": [1, 2]}).to_parquet(case / "samples.parquet")
    code, _, err = run_cli(["validate", str(case)], capsys)
    assert code == 2
    assert "samples" in err and "'n_tokens'" in err and "samples.parquet" in err


def test_lossy_cast_is_rejected_with_values(case, capsys):
    pd.DataFrame({"sample_id": [1.0, 2.5, 3.0], "n_tokens": [5, 6, 7]}).to_parquet(case / "samples.parquet")
    code, _, err = run_cli(["validate", str(case)], capsys)
    assert code == 2
    assert "'sample_id'" in err and "2.5" in err


def test_duplicate_sample_id_is_rejected(case, capsys):
    pd.DataFrame({"sample_id": [1, 2, 2, 3], "n_tokens": [5, 6, 7, 8]}).to_parquet(case / "samples.parquet")
    code, _, err = run_cli(["validate", str(case)], capsys)
    assert code == 2
    assert "unique" in err and "2" in err


def test_plan_sample_not_in_samples_is_rejected(case, capsys):
    pd.DataFrame({"step": [0, 0, 1], "sample_id": [0, 1, 99]}).to_parquet(case / "plan.parquet")
    code, _, err = run_cli(["validate", str(case)], capsys)
    assert code == 2
    assert "not in the samples" in err and "99" in err


def test_unreadable_file_is_exit_2(case, capsys):
    (case / "plan.parquet").write_bytes(b"this is not parquet")
    code, _, err = run_cli(["validate", str(case)], capsys)
    assert code == 2
    assert "plan.parquet" in err and "could not be read" in err


def test_bad_run_toml_value_is_exit_2(case, capsys):
    (case / "run.toml").write_text("grad_accum = 0\n")
    code, _, err = run_cli(["validate", str(case)], capsys)
    assert code == 2 and "'grad_accum' must be a positive integer" in err


def test_plan_ahead_and_metrics_past_are_warnings(case, capsys):
    metrics = pd.DataFrame({"step": np.arange(5), "train/loss": np.ones(5)})
    metrics.to_parquet(case / "metrics.parquet")
    code, _, out = run_cli(["validate", str(case)], capsys)
    assert code == 0
    assert "plan runs 5 steps ahead of the metrics (steps 5-9" in out

    metrics = pd.DataFrame({"step": np.arange(14), "train/loss": np.ones(14)})
    metrics.to_parquet(case / "metrics.parquet")
    code, _, out = run_cli(["validate", str(case)], capsys)
    assert code == 0
    assert "4 metrics rows are past the plan's last step 9" in out


def test_nan_and_inf_are_kept_and_reported(tmp_path):
    """Through the one metrics path (the readers): NaN, inf and their text spellings are values, and counted."""
    from forensics.sources import read_metrics

    (tmp_path / "m.csv").write_text("step,loss\n0,1.0\n1,nan\n2,inf\n3,NaN\n4,-Infinity\n")
    out, report = read_metrics([tmp_path / "m.csv"])
    loss = out["loss"].tolist()
    assert loss[0] == 1.0 and math.isnan(loss[1]) and loss[2] == math.inf and math.isnan(loss[3])
    assert loss[4] == -math.inf
    assert (report.metrics["loss"]["nan"], report.metrics["loss"]["inf"]) == (2, 2)


def test_resumed_steps_last_write_wins():
    # steps 0-5 logged, the run resumed from a checkpoint at 3 and logged 3-6 again
    df = pd.DataFrame({"step": [0, 1, 2, 3, 4, 5, 3, 4, 5, 6], "loss": [5, 4, 3, 2, 9, 9, 2.5, 2.4, 2.3, 2.2]})
    steps, loss, written = last_write_wins(df["step"].to_numpy(), df["loss"].to_numpy())
    assert steps.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert loss.tolist() == [5, 4, 3, 2.5, 2.4, 2.3, 2.2] and written.all()


def test_resumed_log_reports_its_rewind(tmp_path):
    from forensics.sources import read_metrics

    steps = [0, 1, 2, 3, 4, 5, 3, 4, 5, 6]
    losses = [5, 4, 3, 2, 9, 9, 2.5, 2.4, 2.3, 2.2]
    (tmp_path / "m.jsonl").write_text("".join(f'{{"step": {s}, "loss": {v}}}\n' for s, v in zip(steps, losses)))
    out, report = read_metrics([tmp_path / "m.jsonl"])
    assert out["loss"].tolist() == [5, 4, 3, 2.5, 2.4, 2.3, 2.2]
    (rewind,) = report.rewinds
    assert (rewind.from_step, rewind.rows_replaced) == (3, 3)


def test_records_of_one_step_with_different_metrics_are_combined(tmp_path):
    from forensics.schema import written
    from forensics.sources import read_metrics

    (tmp_path / "m.jsonl").write_text(
        '{"step": 0, "loss": 1.0}\n{"step": 0, "val/loss": 1.2}\n{"step": 1, "loss": 0.9}\n'
    )
    out, _ = read_metrics([tmp_path / "m.jsonl"])
    assert out["step"].tolist() == [0, 1]
    assert out["loss"].tolist() == [1.0, 0.9] and out["val/loss"][0] == 1.2
    assert written(out, "val/loss").tolist() == [True, False]  # step 1 never wrote val/loss: null, not NaN


def test_a_logged_nan_written_again_after_a_resume_wins():
    """A later logged NaN replaces the earlier value; a cell not written replaces nothing."""
    steps, loss, has = last_write_wins(
        np.array([0, 1, 2, 1, 2]), np.array([1.0, 2.0, 3.0, np.nan, np.nan]), np.array([True, True, True, True, False])
    )
    assert loss[0] == 1.0 and np.isnan(loss[1]) and loss[2] == 3.0 and has.all()


def test_text_values_in_a_metric_are_dropped_with_a_warning(tmp_path):
    from forensics.sources import read_metrics

    (tmp_path / "m.jsonl").write_text(
        '{"step": 0, "loss": 1.0}\n{"step": 1, "loss": "abc"}\n{"step": 2, "loss": 0.9}\n'
    )
    out, report = read_metrics([tmp_path / "m.jsonl"])
    assert out["loss"].tolist()[0] == 1.0 and out["loss"].tolist()[2] == 0.9 and pd.isna(out["loss"][1])
    assert any("column 'loss': 1 cell not a number, kept as missing (line 2: 'abc')" in w for w in report.warnings)


def test_plan_needs_step_or_epoch_and_batch_id():
    with pytest.raises(ForensicsError, match="needs a 'step' column or both 'epoch' and 'batch_id'"):
        validate_plan(pd.DataFrame({"sample_id": [1], "epoch": [0]}))


def test_samples_dtypes_are_canonical():
    out = validate_samples(pd.DataFrame({"sample_id": [3.0, 4.0], "n_tokens": ["10", "20"]}))
    assert out["sample_id"].dtype == np.int64 and out["n_tokens"].dtype == np.int32


def test_run_toml_round_trip(tmp_path):
    cfg, _ = resolve_config(
        tmp_path,
        overrides={
            "grad_accum": 4,
            "world_size": 2,
            "rank_split": "per_rank",
            "loss_key": "train/loss",
            "boundaries": [0, 100, 8192],
            "detect": {"spikes": {"z": 5.0}},
        },
    )
    write_run_toml(cfg, tmp_path / "run.toml")
    back, warnings = load_run_toml(tmp_path / "run.toml")
    assert (
        back == cfg
        and warnings == []
        and back.boundaries == (0, 100, 8192)
        and back.rule_params("spikes") == {"z": 5.0}
    )


def test_step_mapping_round_robin_worked_example():
    """The worked example of docs/data-model.md: G=2, W=2, 10 batches in epoch 0 and 3 in epoch 1."""
    plan = pd.DataFrame({"epoch": [0] * 10 + [1] * 3, "batch_id": list(range(10)) + [0, 1, 2], "sample_id": range(13)})
    out = assign_steps(plan, grad_accum=2, world_size=2)
    assert out["step"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3]
    assert out["rank"].tolist()[:4] == [0, 1, 0, 1]
    assert out["micro"].tolist()[:4] == [0, 0, 1, 1]


def test_missing_extra_names_the_extra_to_install():
    from forensics.errors import MissingExtraError, require

    with pytest.raises(MissingExtraError, match=r"pip install 'loss-spike-forensics\[wandb\]'"):
        require("forensics_no_such_module_xyz", "wandb", "Reading W&B run files")


def test_missing_extra_is_exit_2_from_the_cli(tmp_path, capsys, monkeypatch):
    """Without tensorboard installed, reading event files says which extra brings it (simulated by hiding it)."""
    import builtins

    real_import = builtins.__import__

    def hide_tensorboard(name, *args, **kwargs):
        if name.startswith("tensorboard"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    import sys

    for mod in [m for m in sys.modules if m.startswith("tensorboard")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(builtins, "__import__", hide_tensorboard)
    (tmp_path / "events.out.tfevents.1.host").write_bytes(b"")
    code = main(["ingest", str(tmp_path), "-o", str(tmp_path / "m.parquet")])
    err = capsys.readouterr().err
    assert code == 2
    assert "loss-spike-forensics[tensorboard]" in err


@pytest.mark.parametrize(
    "values,needle",
    [
        ([1e19, 2.0], "outside int64"),
        (["9223372036854775808", "1"], "outside int64"),
    ],
)
def test_ids_beyond_int64_are_rejected_not_wrapped(values, needle):
    with pytest.raises(ForensicsError, match=needle):
        validate_samples(pd.DataFrame({"sample_id": values, "n_tokens": [5, 6]}))


def test_token_counts_beyond_int32_are_rejected():
    with pytest.raises(ForensicsError, match="outside int32"):
        validate_samples(pd.DataFrame({"sample_id": [1, 2], "n_tokens": [3e9, 5.0]}))


@pytest.mark.parametrize(
    "text,needle",
    [
        ("boundaries = [0, 770.7, 8192]\n", "whole numbers"),
        ("plan = 5\n", "'plan' must be a string"),
        ("metrics = [1, 2]\n", "'metrics' must be a path"),
    ],
)
def test_bad_run_toml_types_are_one_clear_error(tmp_path, text, needle):
    (tmp_path / "run.toml").write_text(text)
    with pytest.raises(ForensicsError, match=needle):
        load_run_toml(tmp_path / "run.toml")
