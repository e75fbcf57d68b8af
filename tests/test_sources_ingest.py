"""Merging sources on step, choosing readers, and the ``forensics ingest`` command."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from forensics.cli import main
from forensics.errors import ForensicsError
from forensics.sources import read_metrics
from forensics.sources.registry import detect_format, is_wandb_api_source, open_reader


def _jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_later_source_wins_shared_cells_with_a_warning_and_keeps_other_columns(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.log"
    _jsonl(a, [{"step": s, "loss": 1.0, "lr": 0.1} for s in range(5)])
    b.write_text("".join(f"step {s} | loss 2.0 | grad_norm {s}\n" for s in range(3, 8)))
    df, report = read_metrics([a, b])
    assert df["step"].tolist() == list(range(8))
    assert df["loss"].tolist() == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    assert df["lr"].notna().sum() == 5 and df["grad_norm"].notna().sum() == 5
    assert f"{a} and {b} both hold 'loss' (2 steps, 2 differ); {b}'s values are kept" in report.warnings
    df2, _ = read_metrics([b, a])
    assert df2["loss"].tolist()[3:5] == [1.0, 1.0]


def test_logged_nan_in_a_later_source_wins_but_a_gap_does_not(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _jsonl(a, [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 1.0}])
    _jsonl(b, [{"step": 0, "loss": math.nan}, {"step": 1, "acc": 0.5}])
    df, report = read_metrics([a, b])
    assert math.isnan(df["loss"].iloc[0]) and df["loss"].iloc[1] == 1.0
    assert report.metrics["loss"] == {"values": 1, "nan": 1, "inf": 0, "missing": 0}


def test_step_offset_shifts_metrics_steps(tmp_path):
    a = tmp_path / "a.jsonl"
    _jsonl(a, [{"step": s, "loss": float(s)} for s in range(1, 6)])
    df, _ = read_metrics([a], step_offset=1)
    assert df["step"].tolist() == [0, 1, 2, 3, 4] and df["loss"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_formats_are_detected_from_the_source(tmp_path):
    (tmp_path / "x.jsonl").write_text("")
    (tmp_path / "train.out").write_text("")
    (tmp_path / "noext").write_text('{"step": 1}\n')
    (tmp_path / "runlog").write_text("step 1 | loss 2\n")
    assert detect_format(tmp_path / "x.jsonl") == "jsonl"
    assert detect_format(tmp_path / "train.out") == "text"
    assert detect_format(tmp_path / "noext") == "jsonl"
    assert detect_format(tmp_path / "runlog") == "text"
    run = tmp_path / "wandb" / "offline-run-20250101_000000-abc"
    run.mkdir(parents=True)
    assert detect_format(run) == "wandb" and detect_format(tmp_path / "wandb") == "wandb"
    (tmp_path / "run-abc.wandb").write_bytes(b":W&B")
    assert detect_format(tmp_path / "run-abc.wandb") == "wandb"
    assert is_wandb_api_source("wandb://ent/proj/abc123")
    assert is_wandb_api_source("https://wandb.ai/ent/proj/runs/abc123")
    assert is_wandb_api_source("ent/proj/abc123")
    assert not is_wandb_api_source(str(tmp_path / "x.jsonl"))


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: p / "missing.jsonl", "does not exist"),
        (lambda p: (p / "m.xlsx").write_bytes(b"PK") and p / "m.xlsx", "unknown format"),
        (lambda p: (p / "m.bin").write_bytes(b"\x00\x01") and p / "m.bin", "unknown format"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "no TensorBoard event files"),
    ],
)
def test_bad_sources_are_one_clear_error(tmp_path, make, message):
    with pytest.raises(ForensicsError, match=message):
        open_reader(make(tmp_path))


def test_parquet_table_is_read_back_as_written(tmp_path):
    path = tmp_path / "metrics.parquet"
    pd.DataFrame({"step": np.arange(4, dtype=np.int64), "loss": [1.0, 2.0, np.inf, 4.0]}).to_parquet(path)
    df, _ = read_metrics([path])
    assert df["loss"].tolist() == [1.0, 2.0, np.inf, 4.0]


def test_ingest_writes_the_canonical_table_and_prints_a_summary(tmp_path, capsys):
    a, b = tmp_path / "train.jsonl", tmp_path / "train.log"
    _jsonl(
        a,
        [{"step": s, "train": {"loss": 1.0 + s}} for s in range(10)]
        + [{"step": s, "train": {"loss": math.nan if s == 8 else 50.0}} for s in range(7, 12)],
    )
    b.write_text("banner\nstep 3 | grad_norm 0.5\nstep 4 | grad_norm 1.2.3\nstep x | grad_norm 1\n")
    out = tmp_path / "out" / "metrics.parquet"
    rc = main(["ingest", str(a), str(b), "-o", str(out), "--step-offset", "1"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "12 rows, steps -1-10" in text
    assert "train/loss: 11 values (1 NaN)" in text
    assert "rewinds: 1 (3 rows replaced)" in text
    assert "skipped (malformed) records: 2" in text
    table, _ = read_metrics([out])
    assert table["step"].tolist() == list(range(-1, 11))
    assert table["train/loss"].tolist()[:7] == [1.0 + s for s in range(7)]
    assert table["grad_norm"].notna().sum() == 1


@pytest.mark.parametrize(
    "args",
    [
        ["ingest", "{tmp}/missing.jsonl", "-o", "{tmp}/m.parquet"],
        ["ingest", "{tmp}/m.docx", "-o", "{tmp}/m.parquet"],
        ["ingest", "{tmp}/bad.jsonl", "-o", "{tmp}/m.parquet", "--strict"],
        ["ingest", "{tmp}/bad.jsonl", "-o", "{tmp}/m.csv"],
        ["ingest", "{tmp}/bad.jsonl", "-o", "{tmp}/bad.jsonl"],
    ],
)
def test_ingest_bad_input_exits_2(tmp_path, capsys, args):
    (tmp_path / "m.docx").write_text("x")
    (tmp_path / "bad.jsonl").write_text('{"step": 0, "loss": 1}\n{"step": 1,\n')
    rc = main([a.format(tmp=tmp_path) for a in args])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("forensics: error:") and len(err.strip().splitlines()) == 1
    assert (tmp_path / "bad.jsonl").read_text() == '{"step": 0, "loss": 1}\n{"step": 1,\n'


def test_parquet_metrics_keyed_by_another_step_name(tmp_path):
    import pandas as pd

    from forensics.sources import read_metrics

    pd.DataFrame({"global_step": [0, 1, 2], "loss": [1.0, 2.0, 3.0]}).to_parquet(tmp_path / "m.parquet")
    table, _ = read_metrics([tmp_path / "m.parquet"])
    assert table["step"].tolist() == [0, 1, 2] and table["loss"].tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    ("name", "module", "not_imported"),
    [
        ("WandbRunReader", "forensics.sources.wandb.run_reader", "wandb"),
        ("WandbRunReader", "forensics.sources.wandb.run_reader", "rich.progress"),
        ("WandbApiReader", "forensics.sources.wandb.api_reader", "wandb"),
    ],
)
def test_each_wandb_reader_imports_from_its_package_without_the_api_client(name, module, not_imported):
    """The package's names are plain imports; the ``wandb`` client and the progress bars load when an API read
    runs, so reading a run file never pays for them."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        f"import sys; from forensics.sources.wandb import {name}; "
        f"print({name}.__module__, {not_imported!r} in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    ).stdout.split()
    assert out == [module, "False"]
