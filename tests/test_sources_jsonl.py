"""JSONL reader: files written with Python's ``json`` the way training scripts write them, read back exactly."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from forensics.errors import ForensicsError
from forensics.schema import METRIC_DTYPE
from forensics.sources import read_metrics
from forensics.sources.jsonl import JsonlReader
from forensics.sources.registry import open_reader


def _write(path, records, tail: str = "") -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(r if isinstance(r, str) else json.dumps(r))
            fh.write("\n")
        fh.write(tail)


def test_nested_keys_are_flattened_and_values_read_exactly(tmp_path):
    path = tmp_path / "m.jsonl"
    recs = [
        {"step": s, "train": {"loss": 1.0 / (s + 1), "opt": {"lr": 1e-4 * s}}, "grad_norm": s * 0.5} for s in range(50)
    ]
    _write(path, recs)
    df = open_reader(path).read_all()
    assert list(df.columns) == ["step", "train/loss", "train/opt/lr", "grad_norm"]
    assert df["step"].dtype == np.int64 and df["train/loss"].dtype == METRIC_DTYPE
    assert df["step"].tolist() == list(range(50))
    assert df["train/loss"].tolist() == [1.0 / (s + 1) for s in range(50)]
    assert df["train/opt/lr"].tolist() == [1e-4 * s for s in range(50)]


@pytest.mark.parametrize("key", ["_step", "global_step", "iter", "iteration"])
def test_step_key_is_found_automatically(tmp_path, key):
    path = tmp_path / "m.jsonl"
    _write(path, [{key: s, "loss": float(s)} for s in (3, 4, 5)])
    df = open_reader(path).read_all()
    assert df["step"].tolist() == [3, 4, 5] and df["loss"].tolist() == [3.0, 4.0, 5.0]


def test_step_key_option_picks_the_named_column(tmp_path):
    path = tmp_path / "m.jsonl"
    _write(path, [{"step": s, "trainer/global_step": 10 * s, "loss": 1.0} for s in range(3)])
    df = open_reader(path, step_key="trainer/global_step").read_all()
    assert df["step"].tolist() == [0, 10, 20]
    assert df["logged_step"].tolist() == [0.0, 1.0, 2.0] and df["loss"].tolist() == [1.0] * 3


def test_nan_and_infinity_are_kept_and_counted(tmp_path):
    path = tmp_path / "m.jsonl"
    _write(
        path,
        [
            {"step": 0, "loss": 1.0},
            {"step": 1, "loss": math.nan},
            {"step": 2, "loss": math.inf},
            {"step": 3, "loss": -math.inf},
            {"step": 4, "acc": 0.5},
        ],
    )
    assert "NaN" in path.read_text() and "Infinity" in path.read_text()
    df, report = read_metrics([path])
    loss = df["loss"].to_numpy()
    assert loss[0] == 1.0 and math.isnan(loss[1]) and loss[2] == math.inf and loss[3] == -math.inf
    assert math.isnan(loss[4])  # not written at step 4: missing, not NaN
    assert report.sources[0].nonfinite == {"loss": {"nan": 1, "inf": 2}}
    assert report.metrics["loss"] == {"values": 1, "nan": 1, "inf": 2, "missing": 1}


def test_resumed_run_last_write_wins_and_rewind_is_reported(tmp_path):
    path = tmp_path / "m.jsonl"
    first = [{"step": s, "loss": 10.0 + s} for s in range(10)]
    resumed = [{"step": s, "loss": 100.0 + s} for s in range(6, 15)]
    _write(path, first + resumed)
    df, report = read_metrics([path])
    assert df["step"].tolist() == list(range(15))
    assert df["loss"].tolist() == [10.0 + s for s in range(6)] + [100.0 + s for s in range(6, 15)]
    (rewind,) = report.rewinds
    assert (rewind.from_step, rewind.rows_replaced) == (6, 4)


def test_eval_record_for_an_earlier_step_is_merged_not_a_rewind(tmp_path):
    path = tmp_path / "m.jsonl"
    _write(path, [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 2.0}, {"step": 0, "eval/loss": 3.0}])
    df, report = read_metrics([path])
    assert df["loss"].tolist() == [1.0, 2.0]
    assert df["eval/loss"].tolist()[0] == 3.0
    assert report.rewinds == []


@pytest.mark.parametrize(
    "records, rewinds",
    [
        # logged every 10 steps, resumed below the high point at steps never written: a rewind from the first of them
        ([(s, "loss") for s in (100, 110, 120)] + [(s, "loss") for s in (60, 70)], [(60, 0, 120)]),
        # one lone record below the high point is too little to call a resume
        ([(s, "loss") for s in (100, 110, 120)] + [(60, "loss"), (130, "loss")], []),
        # a series logged late for earlier steps (nothing of it written yet) is merged, not a rewind
        ([(s, "loss") for s in (100, 110, 120)] + [(60, "eval/loss"), (70, "eval/loss")], []),
        # the series was written before only at steps below the jump's target: a late write, not a resume
        ([(50, "eval/loss"), (100, "loss"), (110, "loss"), (120, "loss"), (60, "eval/loss"), (70, "eval/loss")], []),
    ],
)
def test_jump_back_without_rewritten_steps(tmp_path, records, rewinds):
    path = tmp_path / "m.jsonl"
    _write(path, [{"step": s, key: 1.0 + s} for s, key in records])
    _, report = read_metrics([path])
    assert [(r.from_step, r.rows_replaced, r.last_step) for r in report.rewinds] == rewinds


def test_malformed_line_is_skipped_with_its_line_number(tmp_path):
    path = tmp_path / "m.jsonl"
    _write(
        path,
        [
            {"step": 0, "loss": 1.0},
            '{"step": 1, "loss": 2.0',
            "",
            {"step": 2, "loss": 3.0},
            "[1, 2]",
            {"step": 3, "loss": 4.0},
        ],
    )
    df, report = read_metrics([path])
    assert df["step"].tolist() == [0, 2, 3] and df["loss"].tolist() == [1.0, 3.0, 4.0]
    src = report.sources[0]
    assert src.malformed == 2
    assert [line for line, _ in src.malformed_examples] == [2, 5]
    assert report.malformed == 2
    with pytest.raises(ForensicsError, match="line 2"):
        read_metrics([path], strict=True)


def test_half_written_last_line_is_left_until_complete(tmp_path):
    path = tmp_path / "m.jsonl"
    _write(path, [{"step": 0, "loss": 1.0}], tail='{"step": 1, "lo')
    reader = JsonlReader(path)
    assert reader.read_new()["step"].tolist() == [0]
    assert reader.report.malformed == 0
    with open(path, "a") as fh:
        fh.write('ss": 2.5}\n')
    new = reader.read_new()
    assert new["step"].tolist() == [1] and new["loss"].tolist() == [2.5]


def test_last_line_without_newline_is_read_when_it_is_a_whole_object(tmp_path):
    path = tmp_path / "m.jsonl"
    _write(path, [{"step": 0, "loss": 1.0}], tail='{"step": 1, "loss": 2.0}')
    assert open_reader(path).read_all()["loss"].tolist() == [1.0, 2.0]


def test_keys_keep_only_the_named_metrics_and_globs(tmp_path):
    path = tmp_path / "m.jsonl"
    _write(path, [{"step": 0, "train": {"loss": 1.0, "acc": 0.1}, "lr": 0.1, "eval": {"loss": 2.0}}])
    df = open_reader(path, keys=["train/*", "lr"]).read_all()
    assert list(df.columns) == ["step", "train/loss", "train/acc", "lr"]


def test_text_column_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "m.jsonl"
    _write(path, [{"step": 0, "loss": 1.0, "phase": "warmup"}, {"step": 1, "loss": 2.0, "phase": "main"}])
    df, report = read_metrics([path])
    assert list(df.columns) == ["step", "loss"]
    assert any("'phase'" in w for w in report.warnings)


def test_a_key_whose_type_changes_keeps_its_numbers(tmp_path):
    path = tmp_path / "m.jsonl"
    _write(
        path,
        [{"step": 0, "loss": 1}, {"step": 1, "loss": "n/a"}, {"step": 2, "loss": 2.5}, {"step": 3, "loss": {"x": 1}}],
    )
    df, report = read_metrics([path])
    assert df["loss"].tolist()[0] == 1.0 and df["loss"].tolist()[2] == 2.5
    assert report.malformed == 0


def test_no_step_key_is_bad_input(tmp_path):
    path = tmp_path / "m.jsonl"
    _write(path, [{"loss": 1.0}])
    with pytest.raises(ForensicsError, match="no step key"):
        read_metrics([path])


def test_large_file_with_bad_lines_in_many_places(tmp_path):
    """Block parsing with a fallback: the few bad lines cost their own rows only, across block boundaries."""
    path = tmp_path / "m.jsonl"
    n = 30_000
    bad = {1000, 17_000, 29_999}
    with open(path, "w") as fh:
        for s in range(n):
            fh.write("garbage{\n" if s in bad else json.dumps({"step": s, "loss": s * 0.25}) + "\n")
    reader = JsonlReader(path)
    reader._file.chunk_size = 64 << 10  # many blocks
    df = reader.read_all()
    assert len(df) == n - len(bad)
    assert not set(df["step"]) & bad
    assert (df["loss"].to_numpy() == df["step"].to_numpy() * 0.25).all()
    assert sorted(w for w, _ in reader.report.malformed_examples) == sorted(s + 1 for s in bad)


def test_hf_trainer_state_json_log_history(tmp_path):
    """HF Trainer's trainer_state.json: train and eval records interleaved in log_history, a logged NaN kept."""
    import json as _json

    from forensics.sources import read_metrics as _read

    state = {
        "global_step": 30,
        "log_history": [
            {"epoch": 0.1, "grad_norm": 1.2, "learning_rate": 5e-5, "loss": 2.5, "step": 10},
            {"epoch": 0.2, "grad_norm": 1.1, "learning_rate": 4e-5, "loss": float("nan"), "step": 20},
            {"epoch": 0.2, "eval_loss": 2.3, "step": 20},
            {"epoch": 0.3, "grad_norm": 1.0, "learning_rate": 3e-5, "loss": 2.0, "step": 30},
        ],
    }
    path = tmp_path / "trainer_state.json"
    path.write_text(_json.dumps(state))
    table, report = _read([path])
    # HF logs global_step after the update, counting from 1: recognised, aligned to 0-based steps (docs/concepts.md)
    assert table["step"].tolist() == [9, 19, 29] and report.alignments[0].convention == "hf-trainer"
    assert table["eval_loss"].isna().tolist() == [True, False, True]
    assert report.metrics["loss"]["nan"] == 1 and report.metrics["eval_loss"]["missing"] == 2
    assert table["grad_norm"].tolist() == [1.2, 1.1, 1.0]


def _blockwise(path) -> JsonlReader:
    """A finished reader made to take the block-by-block path (as a live reader does) instead of one pyarrow call."""
    reader = JsonlReader(path)
    reader.finished = True
    reader._read_whole = lambda: None
    return reader


def test_a_finished_file_read_whole_gives_the_blockwise_table_and_line_numbers(tmp_path):
    path = tmp_path / "m.jsonl"
    _write(
        path,
        [
            {"step": 0, "loss": 1.0, "lr": 1},
            "",
            "   ",
            {"step": 1, "loss": float("nan")},
            {"step": 2, "loss": 2.5, "lr": 0.5, "eval": {"acc": 0.25}},
            {"step": 1, "loss": 9.0},
        ],
        tail='{"step": 3, "loss": Infinity}',
    )
    reader = JsonlReader(path)
    reader.finished = True
    whole = reader.read_all()
    assert reader._file.offset == path.stat().st_size and reader._file.lines == 7
    blocks = _blockwise(path).read_all()
    assert whole.columns.tolist() == blocks.columns.tolist() == ["step", "loss", "lr", "eval/acc"]
    assert (whole.dtypes == blocks.dtypes).all() and (whole.dtypes.iloc[1:] == METRIC_DTYPE).all()
    for col in whole.columns:
        a = whole[col].to_numpy(dtype=np.float64, na_value=-1.0)
        assert np.array_equal(a, blocks[col].to_numpy(dtype=np.float64, na_value=-1.0), equal_nan=True), col
    assert whole["loss"].tolist()[1] == 9.0 and math.isinf(whole["loss"].tolist()[3])
    assert [(r.from_step, r.rows_replaced) for r in reader.report.rewinds] == [(1, 1)]


def test_a_bad_cell_in_a_file_read_whole_names_its_line(tmp_path):
    """pyarrow reads a column with text in it as text; the cell is then missing and reported at its line, which
    is counted only then (blank lines make rows and lines differ)."""
    path = tmp_path / "m.jsonl"
    _write(path, ["", {"step": 0, "loss": "1.5"}, "", {"step": 1, "loss": "oops"}, {"step": 2, "loss": "nan"}])
    df, report = read_metrics([path])
    assert df["loss"].to_numpy(dtype=np.float64, na_value=-1.0)[:2].tolist() == [1.5, -1.0]
    assert "line 4: 'oops'" in " ".join(report.warnings)
    with pytest.raises(ForensicsError, match="line 4"):
        read_metrics([path], strict=True)


def test_a_file_read_whole_then_grown_is_read_on_from_its_end(tmp_path):
    path = tmp_path / "m.jsonl"
    _write(path, [{"step": 0, "loss": 1.0}, "", {"step": 1, "loss": 2.0}])
    reader = JsonlReader(path)
    reader.finished = True
    assert reader.read_new()["step"].tolist() == [0, 1]
    with open(path, "a") as fh:
        fh.write('{"step": 2, "loss": 3.0}\nnot json\n')
    assert reader.read_new()["step"].tolist() == [2]
    assert reader.report.malformed_examples == [(5, "not valid JSON (Expecting value)")]
