"""TensorBoard reader: event files from torch's ``SummaryWriter`` (and TensorBoard's own writer), every event read."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("tensorboard")
SummaryWriter = pytest.importorskip("torch.utils.tensorboard").SummaryWriter

from forensics.sources import read_metrics  # noqa: E402
from forensics.sources.registry import detect_format, open_reader  # noqa: E402
from forensics.sources.tensorboard.event_reader import TensorBoardReader, event_files  # noqa: E402


def _loss(s: int) -> float:
    return 2.0 + math.sin(s / 7.0) + (5.0 if s % 997 == 0 else 0.0)


def test_every_scalar_is_read_beyond_the_10000_sample_default(tmp_path):
    n = 12_500
    with SummaryWriter(tmp_path) as w:
        for s in range(n):
            w.add_scalar("train/loss", _loss(s), s)
        for s in range(0, n, 250):
            w.add_scalar("eval/loss", s / 1000.0, s)
    df, report = read_metrics([tmp_path])
    assert df["step"].tolist() == list(range(n))
    # SummaryWriter stores simple_value as float32: compare at that precision, value for value.
    expected = np.array([_loss(s) for s in range(n)], dtype=np.float32).astype(np.float64)
    np.testing.assert_array_equal(df["train/loss"].to_numpy(), expected)
    assert int(df["eval/loss"].notna().sum()) == n // 250
    assert df.loc[df["step"] == 9970, "train/loss"].item() == pytest.approx(_loss(9970), rel=1e-6)
    assert report.rewinds == [] and report.malformed == 0


def test_resumed_run_second_file_overlaps_and_last_write_wins(tmp_path):
    with SummaryWriter(tmp_path) as w:
        for s in range(100):
            w.add_scalar("loss", 1.0 + s, s)
            w.add_scalar("lr", 0.5, s)
    with SummaryWriter(tmp_path) as w:  # resumed from the checkpoint at step 80
        for s in range(80, 150):
            w.add_scalar("loss", 1000.0 + s, s)
    assert len(event_files(tmp_path)) == 2
    df, report = read_metrics([tmp_path])
    assert df["step"].tolist() == list(range(150))
    assert df["loss"].tolist() == [1.0 + s for s in range(80)] + [1000.0 + s for s in range(80, 150)]
    assert df["lr"].notna().sum() == 100  # the old file's other tag is kept where the resume did not write it
    (rewind,) = report.rewinds
    assert (rewind.from_step, rewind.rows_replaced) == (80, 20)


def test_new_style_tensor_scalars_and_tensorboard_writer(tmp_path):
    from tensorboard.summary import DirectoryOutput, Writer

    with SummaryWriter(tmp_path / "torch") as w:
        for s in range(20):
            w.add_scalar("loss", 0.25 * s, s, new_style=True)
            w.add_text("note", f"step {s}", s)  # text tensors are not metrics
            w.add_histogram("weights", np.arange(10.0) + s, s)
    tb = Writer(DirectoryOutput(str(tmp_path / "tb")))
    for s in range(20):
        tb.add_scalar("acc", 0.01 * s, step=s)
    tb.close()
    df = open_reader(tmp_path).read_all()
    assert set(df.columns) == {"step", "_timestamp", "torch/loss", "tb/acc"}
    assert df["torch/loss"].tolist() == [0.25 * s for s in range(20)]
    np.testing.assert_allclose(df["tb/acc"].to_numpy(), [0.01 * s for s in range(20)], rtol=1e-6)


def test_nan_and_inf_scalars_are_kept(tmp_path):
    with SummaryWriter(tmp_path) as w:
        for s, v in enumerate([1.0, math.nan, math.inf, 2.0]):
            w.add_scalar("loss", v, s)
    df, report = read_metrics([tmp_path])
    v = df["loss"].to_numpy()
    assert v[0] == 1.0 and math.isnan(v[1]) and v[2] == math.inf and v[3] == 2.0
    assert report.metrics["loss"] == {"values": 2, "nan": 1, "inf": 1, "missing": 0}


def test_single_event_file_and_truncated_last_record(tmp_path):
    with SummaryWriter(tmp_path / "run") as w:
        for s in range(30):
            w.add_scalar("loss", float(s), s)
    (src,) = event_files(tmp_path / "run")
    data = src.read_bytes()
    part = tmp_path / src.name
    part.write_bytes(data[:-20])  # the writer is still in the middle of its last record
    assert detect_format(part) == "tensorboard"
    reader = TensorBoardReader(part)
    assert reader.read_new()["step"].tolist() == list(range(29))
    assert reader.report.malformed == 0
    with open(part, "ab") as fh:
        fh.write(data[-20:])
    new = reader.read_new()
    assert new["step"].tolist() == [29] and new["loss"].tolist() == [29.0]
