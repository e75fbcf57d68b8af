"""CSV reader: W&B chart exports (``Step``, ``<run> - <key>``, ``__MIN``/``__MAX``) and plain pandas CSVs."""

from __future__ import annotations

import csv
import math

import numpy as np
import pandas as pd
import pytest

from forensics.sources import read_metrics
from forensics.sources.csv_table import wandb_export_names
from forensics.sources.registry import open_reader


def _write_wandb_export(path, runs: dict[str, dict[int, float]], key: str = "train/loss") -> None:
    """The layout of W&B's "Export CSV" of a line chart: every field quoted, empty where a run has no point."""
    steps = sorted({s for pts in runs.values() for s in pts})
    header = ["Step"]
    for run in runs:
        header += [f"{run} - {key}", f"{run} - {key}__MIN", f"{run} - {key}__MAX"]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh, quoting=csv.QUOTE_ALL)
        w.writerow(header)
        for s in steps:
            row = [s]
            for pts in runs.values():
                v = pts.get(s)
                row += ["", "", ""] if v is None else [v, v - 0.1, v + 0.1]
            w.writerow(row)


def test_wandb_export_keeps_the_key_and_drops_min_max(tmp_path):
    path = tmp_path / "export.csv"
    values = {s: 2.0 + 0.5 * math.cos(s) for s in range(0, 200, 2)}
    _write_wandb_export(path, {"drafter-run-7": values})
    df, report = read_metrics([path])
    assert list(df.columns) == ["step", "train/loss"]
    assert df["step"].tolist() == sorted(values)
    assert df["train/loss"].tolist() == [values[s] for s in sorted(values)]
    assert report.malformed == 0


def test_wandb_export_min_max_kept_when_asked(tmp_path):
    path = tmp_path / "export.csv"
    _write_wandb_export(path, {"r": {0: 1.5, 1: 2.5}})
    df = open_reader(path, include_minmax=True).read_all()
    assert list(df.columns) == ["step", "train/loss", "train/loss__MIN", "train/loss__MAX"]
    assert df["train/loss__MAX"].tolist() == [1.6, 2.6]


def test_wandb_export_with_two_runs_keeps_run_names(tmp_path):
    path = tmp_path / "export.csv"
    _write_wandb_export(path, {"static": {0: 1.0, 1: 5.0}, "bucketed": {1: 1.1, 2: 1.2}})
    df = open_reader(path).read_all()
    assert list(df.columns) == ["step", "static - train/loss", "bucketed - train/loss"]
    assert df["static - train/loss"].tolist()[:2] == [1.0, 5.0] and pd.isna(df["static - train/loss"].iloc[2])
    assert wandb_export_names(["Step", "a - x", "a - x__MIN"]) == {"Step": "Step", "a - x": "x", "a - x__MIN": None}


def test_pandas_csv_with_nan_inf_and_a_bad_row(tmp_path):
    path = tmp_path / "metrics.csv"
    frame = pd.DataFrame(
        {"global_step": np.arange(6), "loss": [1.0, np.inf, 3.0, 4.0, -np.inf, 6.0], "phase": ["warmup"] * 6}
    )
    frame.to_csv(path, index=False, na_rep="nan")
    with open(path, "a") as fh:
        fh.write("6,7.0,main,extra\n7,nan,main\n")
    df, report = read_metrics([path])
    assert df["step"].tolist() == [0, 1, 2, 3, 4, 5, 7]
    loss = df["loss"].to_numpy()
    assert loss[1] == np.inf and loss[4] == -np.inf and math.isnan(loss[6])
    assert report.metrics["loss"] == {"values": 4, "nan": 1, "inf": 2, "missing": 0}
    assert report.sources[0].malformed_examples == [(8, "expected 3 fields, got 4")]
    assert any("'phase'" in w for w in report.warnings)


def test_resumed_csv_rewrites_rows(tmp_path):
    path = tmp_path / "log.csv"
    rows = [(s, 1.0 * s) for s in range(10)] + [(s, -1.0 * s) for s in range(7, 12)]
    path.write_text("step,loss\n" + "".join(f"{s},{v}\n" for s, v in rows))
    df, report = read_metrics([path])
    assert df["loss"].tolist() == [1.0 * s for s in range(7)] + [-1.0 * s for s in range(7, 12)]
    assert [(r.from_step, r.rows_replaced) for r in report.rewinds] == [(7, 3)]


@pytest.mark.parametrize("sep,suffix", [("\t", ".tsv"), (",", ".csv")])
def test_separator_follows_the_suffix(tmp_path, sep, suffix):
    path = tmp_path / f"m{suffix}"
    path.write_text(f"step{sep}loss\n0{sep}1.5\n1{sep}2.5\n")
    assert open_reader(path).read_all()["loss"].tolist() == [1.5, 2.5]
