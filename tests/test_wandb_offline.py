"""W&B offline runs written by the real ``wandb`` package, read back by :class:`WandbRunReader` value for value.

Runs are written in a subprocess with an isolated environment (``WANDB_MODE=offline``, W&B's folders in a temporary
folder, no key), which also keeps this process's ``wandb`` state clean. The writer records what it logged in JSON, so
every test compares against the logged values, not against constants.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("wandb")

from forensics.errors import ForensicsError  # noqa: E402
from forensics.sources import open_reader  # noqa: E402
from forensics.sources.wandb.record_log import FILE_HEADER, RecordLog  # noqa: E402
from forensics.sources.wandb.run_reader import WandbRunReader  # noqa: E402
from tests.wandb_writers import isolated_env  # noqa: E402

LIVE_WRITER = textwrap.dedent("""
    import os, sys, time
    import wandb

    out, rounds, per_round = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    run = wandb.init(dir=out, project="p", id="live1", settings=wandb.Settings(
        console="off", x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True, disable_git=True,
        save_code=False, x_save_requirements=False, disable_job_creation=True,
        x_transaction_log_flush_interval=0.05))
    for r in range(rounds):
        for i in range(per_round):
            step = r * per_round + i
            run.log({"loss": 1.0 / (step + 1), "round": float(r)})
        # Wait until the test has read this round (or give up, so that a failing test cannot hang).
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(out, f"go-{r}")) and time.time() < deadline:
            time.sleep(0.02)
    run.finish()
""")


@pytest.fixture(scope="module")
def runs(wandb_runs: Path) -> Path:
    """The W&B runs of the session (``nested/``, ``multi/``, ``logged.json``: ``tests/wandb_writers.py``)."""
    return wandb_runs


def logged(runs: Path, name: str) -> pd.DataFrame:
    return pd.DataFrame(json.loads((runs / "logged.json").read_text())[name])


def assert_same_values(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Equal steps and, per metric, equal values with NaN/inf in the same places (a missing cell is NaN)."""
    assert got["step"].tolist() == want["step"].tolist()
    for col in want.columns.drop("step"):
        np.testing.assert_array_equal(got[col].to_numpy(np.float64), want[col].to_numpy(np.float64), err_msg=col)


def nested_file(runs: Path) -> Path:
    return next((runs / "nested" / "wandb").glob("offline-run-*/run-nested1.wandb"))


def test_nested_keys_nan_and_inf_read_back_as_logged(runs: Path) -> None:
    reader = WandbRunReader(runs / "nested" / "wandb")
    got = reader.read_all()
    want = logged(runs, "nested")
    assert_same_values(got, want)
    assert got["step"].dtype == np.int64
    assert set(got.columns) == {"step", "train/loss", "opt/lr", "opt/grad/norm", "eval/acc", "_timestamp"}
    assert math.isnan(got.loc[7, "train/loss"]) and got.loc[8, "train/loss"] == math.inf
    assert got.loc[9, "train/loss"] == -math.inf
    assert reader.report.nonfinite == {"train/loss": {"nan": 1, "inf": 2}}
    # eval/acc was logged on every third step only: the other rows are missing, not NaN values
    assert got["eval/acc"].notna().sum() == 50 and "eval/acc" not in reader.report.nonfinite
    assert got["_timestamp"].is_monotonic_increasing and got["_timestamp"].gt(1.5e9).all()


def test_text_and_media_are_dropped_and_counted(runs: Path) -> None:
    reader = WandbRunReader(runs / "nested" / "wandb")
    reader.read_all()
    warning = next(w for w in reader.report.warnings if "non-numeric" in w)
    assert "151 non-numeric history values dropped" in warning
    assert "'caption' (150)" in warning and "'weights' (1)" in warning


def test_config_and_summary_are_run_metadata(runs: Path) -> None:
    reader = WandbRunReader(nested_file(runs))
    reader.read_all()
    meta = reader.report.metadata
    assert meta["run_id"] == "nested1" and meta["project"] == "p" and meta["finished"] is True
    assert meta["config"] == {"lr": 0.1, "model": {"layers": 2}}
    assert meta["summary"]["best_loss"] == 0.125
    assert meta["summary"]["opt/grad/norm"] == 0.5 * 149  # the last value logged
    assert not any(k.startswith("_") for k in meta["summary"])


def test_keys_keep_only_the_chosen_metrics(runs: Path) -> None:
    got = WandbRunReader(runs / "nested" / "wandb", keys=["opt/*"]).read_all()
    assert sorted(got.columns) == ["_timestamp", "opt/grad/norm", "opt/lr", "step"]
    assert got["opt/grad/norm"].tolist() == [0.5 * i for i in range(150)]


def test_resumed_run_merges_folders_last_write_wins(runs: Path) -> None:
    reader = WandbRunReader(runs / "multi" / "wandb")  # newest run id: resumed1 (two folders)
    got = reader.read_all()
    first, second = logged(runs, "resumed_first"), logged(runs, "resumed_second")
    assert reader.report.metadata["run_id"] == "resumed1"
    assert len(reader.report.metadata["files"]) == 2 and reader.report.metadata["other_runs"] == ["other1"]
    assert got["step"].tolist() == list(range(60))
    np.testing.assert_array_equal(got["loss"].to_numpy()[:25], second["loss"].to_numpy())
    np.testing.assert_array_equal(got["loss"].to_numpy()[25:], first["loss"].to_numpy()[25:])
    assert got["resumed"].iloc[:25].eq(1.0).all() and got["resumed"].iloc[25:].isna().all()
    [rewind] = reader.report.rewinds
    assert (rewind.from_step, rewind.rows_replaced) == (0, 25)
    assert reader.report.metadata["config"]["phase"] == 2


def test_run_id_picks_an_older_run(runs: Path) -> None:
    reader = WandbRunReader(runs / "multi" / "wandb", run_id="other1")
    assert_same_values(reader.read_all(), logged(runs, "other"))
    assert reader.report.rewinds == []
    with pytest.raises(ForensicsError, match="no run 'nope'.*other1, resumed1"):
        WandbRunReader(runs / "multi" / "wandb", run_id="nope").read_all()


def test_step_key_names_a_logged_step(runs: Path) -> None:
    got = WandbRunReader(runs / "multi" / "wandb", run_id="other1", step_key="global_step").read_all()
    assert got["step"].tolist() == [100 + 2 * i for i in range(10)]
    assert sorted(got.columns) == ["_timestamp", "loss", "step"]  # W&B's own _step is not a metric then
    assert got["loss"].tolist() == [50.0 + i for i in range(10)]


def test_open_reader_dispatches_every_wandb_form(runs: Path) -> None:
    folder = next((runs / "nested" / "wandb").glob("offline-run-*"))
    for source in (runs / "nested" / "wandb", folder, nested_file(runs)):
        reader = open_reader(source)
        assert isinstance(reader, WandbRunReader)
        assert len(reader.read_all()) == 150
    reader = open_reader(runs / "multi" / "wandb", run_id="other1", keys=["loss"])
    got = reader.read_all()
    assert sorted(got.columns) == ["_timestamp", "loss", "step"]
    assert got["loss"].tolist() == [50.0 + i for i in range(10)]


def test_live_run_is_read_while_it_logs(tmp_path: Path) -> None:
    """The writer logs a round, then waits for the test to have read it: every round arrives, none twice."""
    rounds, per_round = 4, 30
    script = tmp_path / "live.py"
    script.write_text(LIVE_WRITER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), str(rounds), str(per_round)],
        env=isolated_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        reader = WandbRunReader(tmp_path / "wandb")
        pieces: list[pd.DataFrame] = []
        for r in range(rounds):
            want = (r + 1) * per_round
            deadline = time.time() + 30
            while sum(map(len, pieces)) < want and time.time() < deadline:
                if any((tmp_path / "wandb").glob("offline-run-*/run-live1.wandb")):
                    new = reader.read_new()
                    if len(new):
                        pieces.append(new)
                time.sleep(0.02)
            assert sum(map(len, pieces)) == want, f"round {r}: read {sum(map(len, pieces))} rows, want {want}"
            assert reader.report.metadata["finished"] is False
            (tmp_path / f"go-{r}").touch()
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    pieces.append(reader.read_new())
    got = pd.concat(pieces, ignore_index=True)
    n = rounds * per_round
    assert got["step"].tolist() == list(range(n))  # none twice, none lost, in order
    np.testing.assert_array_equal(got["loss"].to_numpy(), 1.0 / (np.arange(n) + 1))
    np.testing.assert_array_equal(got["round"].to_numpy(), np.arange(n) // per_round)
    assert reader.report.metadata["finished"] is True
    assert not [w for w in reader.report.warnings if "ends inside a record" in w]


def record_spans(path: Path) -> list[tuple[int, int, str]]:
    """(start, end, kind) of every record of a file, from the framing reader itself."""
    log = RecordLog(path)
    spans = []
    for start, rec in log.records():
        spans.append((start, log.offset, rec.WhichOneof("record_type")))
    return spans


def test_growing_copy_cut_anywhere_reads_each_row_once(runs: Path, tmp_path: Path) -> None:
    """Bytes appended in odd pieces (mid-header, mid-record, across 32 KiB blocks): each read returns only new rows."""
    source = nested_file(runs).read_bytes()
    copy = tmp_path / "offline-run-20250101_000000-nested1" / "run-nested1.wandb"
    copy.parent.mkdir()
    rng = np.random.default_rng(0)
    reader = WandbRunReader(copy)
    pieces, saw_partial, pos = [], False, 0
    with copy.open("wb") as fh:
        while pos < len(source):
            size = int(rng.choice([1, 3, 7, 50, 700, 5000, 40000]))
            fh.write(source[pos : pos + size])
            fh.flush()
            pos += size
            pieces.append(reader.read_new())
            saw_partial |= any("ends inside a record" in w for w in reader.report.warnings)
    got = pd.concat(pieces, ignore_index=True)
    assert saw_partial
    assert got["step"].tolist() == list(range(150))
    assert_same_values(got, logged(runs, "nested"))
    assert not any("ends inside a record" in w for w in reader.report.warnings)
    assert len(source) > 32 * 1024  # the copy crossed block boundaries


def test_truncated_copy_reads_what_precedes_the_cut(runs: Path, tmp_path: Path) -> None:
    path = nested_file(runs)
    history = [(s, e) for s, e, kind in record_spans(path) if kind == "history"]
    start, end = history[100]
    cut = tmp_path / "run-nested1.wandb"
    cut.write_bytes(path.read_bytes()[: start + (end - start) // 2])
    reader = WandbRunReader(cut)
    got = reader.read_all()
    assert got["step"].tolist() == list(range(100))
    assert_same_values(got, logged(runs, "nested").iloc[:100].reset_index(drop=True))
    assert any(f"ends inside a record at byte {start}" in w for w in reader.report.warnings)
    assert reader.report.metadata["finished"] is False


def test_corrupt_bytes_lose_only_their_record_with_the_offset(runs: Path, tmp_path: Path) -> None:
    path = nested_file(runs)
    block = 32 * 1024
    # a history record held in one FULL chunk (not split across blocks), so its chunk starts where it starts
    start, end = next(
        (s, e)
        for s, e, kind in record_spans(path)
        if kind == "history" and s // block == (e - 1) // block and s > 40_000
    )
    data = bytearray(path.read_bytes())
    data[start + 7 + 5] ^= 0xFF
    bad = tmp_path / "run-nested1.wandb"
    bad.write_bytes(bytes(data))
    reader = WandbRunReader(bad)
    got = reader.read_all()
    lost = sum(1 for s, _, kind in record_spans(path) if kind == "history" and s < start)
    assert got["step"].tolist() == [s for s in range(150) if s != lost]  # the rest of the file is read
    (damage,) = reader.report.damaged
    assert (damage.offset, damage.length, damage.reason, damage.steps) == (
        start,
        end - start,
        "checksum mismatch",
        (lost - 1, lost + 1),
    )
    said = f"1 record skipped for damage at byte offset {start}, steps {lost - 1}-{lost + 1} (checksum mismatch)"
    assert any(said in w for w in reader.report.warnings)
    assert len(reader.read_new()) == 0  # nothing new later


def test_not_a_wandb_file_is_bad_input(tmp_path: Path) -> None:
    fake = tmp_path / "run-x.wandb"
    fake.write_bytes(b"PK\x03\x04 not a run")
    with pytest.raises(ForensicsError, match="is not a .wandb file"):
        WandbRunReader(fake).read_all()
    fake.write_bytes(FILE_HEADER[:4] + b"\x00\x00\x07")
    with pytest.raises(ForensicsError, match="unsupported header"):
        WandbRunReader(fake).read_all()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ForensicsError, match="holds no .wandb run files"):
        WandbRunReader(empty).read_all()


def test_demo_wandb_run_reads_back_equal_to_its_metrics_parquet(demo_small: Path) -> None:
    for case in ("static", "bucketed"):
        folder = demo_small / case
        if not (folder / "wandb").is_dir():
            pytest.fail(f"the demo wrote no W&B run in {folder}")
        got = WandbRunReader(folder / "wandb").read_all()
        want = pd.read_parquet(folder / "metrics.parquet")
        assert set(got.columns) == set(want.columns)
        got = got[list(want.columns)]
        assert got["step"].tolist() == want["step"].tolist()
        for col in want.columns.drop("step"):
            np.testing.assert_array_equal(
                got[col].to_numpy(np.float64), want[col].to_numpy(np.float64), err_msg=f"{case}: {col}"
            )


def test_case_folder_holding_wandb_is_a_source(runs: Path, tmp_path: Path) -> None:
    case = tmp_path / "case"
    shutil.copytree(runs / "nested" / "wandb", case / "wandb", symlinks=True)
    got = WandbRunReader(case).read_all()
    assert len(got) == 150
