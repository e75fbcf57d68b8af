"""The ``.wandb`` reader's compiled path against its exact (protobuf, Python) path, on real runs written by ``wandb``.

The compiled path (:mod:`forensics.sources.wandb_scan`) must give what the exact path gives, byte for byte: the same
table (nulls, NaN, -0.0 and all), metadata (config, summary), warnings and damaged regions, on clean runs, on runs
full of what it hands back to Python (media, text, typed values, long and non-ASCII keys, records split over blocks
and longer than its window, more keys than its first table holds), on damaged copies and on a copy that grows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("wandb")
pytest.importorskip("numba")

import forensics.sources.wandb_files as wandb_files  # noqa: E402
import forensics.sources.wandb_scan as wandb_scan  # noqa: E402
from forensics.sources.wandb_files import WandbRunReader  # noqa: E402
from tests.wandb_writers import isolated_env  # noqa: E402

EDGE_WRITER = textwrap.dedent('''
    import sys
    import wandb

    out = sys.argv[1]
    SETTINGS = dict(console="off", x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True,
                    disable_git=True, save_code=False, x_save_requirements=False, disable_job_creation=True)
    run = wandb.init(dir=out, project="p", id="edge1", config={"lr": 0.1, "nested": {"a": [1, 2]}},
                     settings=wandb.Settings(**SETTINGS))
    for i in range(400):
        row = {"loss": 1.0 / (i + 1), "int": i - 200, "zero": -0.0 if i % 2 else 0, "flag": i % 3 == 0,
               "損失/train": 0.5 * i, "k" * 200: float(i), "deep": {"a": {"b": {"c": i * 0.25}}}}
        if i % 50 == 7:
            row["big_int"] = 10 ** 400 * (-1) ** i
        if i % 40 == 3:
            row["text"] = "spike at step %d" % i
            row["img_like"] = wandb.Histogram([0.1 * i, 1.0, 2.0])
        if i % 100 == 5:
            row.update({f"layer{j}/grad_norm": j + 0.001 * i for j in range(3000)})  # > 32 KiB: split records
        if i == 250:
            row["nothing"] = None
            row["nan"] = float("nan")
            row["inf"] = float("-inf")
        run.log(row)
        if i == 300:
            run.summary["best"] = 0.125
            run.summary["dropped"] = 1.0
    del run.summary["dropped"]
    run.finish()
''')


@pytest.fixture(scope="module")
def edge_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wandb-edge")
    (out / "writer.py").write_text(EDGE_WRITER)
    subprocess.run([sys.executable, str(out / "writer.py"), str(out)], env=isolated_env(out), check=True,
                   timeout=120, capture_output=True)
    return next((out / "wandb").glob("offline-run-*/run-edge1.wandb"))


def _read(source: Path, exact: bool, monkeypatch: pytest.MonkeyPatch, **kwargs) -> WandbRunReader:
    with monkeypatch.context() as m:
        if exact:
            m.setattr(wandb_files, "read_run_file", lambda log, finished: log.records(finished))
        reader = WandbRunReader(source, **kwargs)
        reader.finished = True
        reader.read_all()
    return reader


def assert_same_reads(a: WandbRunReader, b: WandbRunReader) -> None:
    ta, tb = a.table, b.table
    pd.testing.assert_frame_equal(ta, tb, check_exact=True)
    # -0.0 and 0.0 compare equal: the sign bits too
    np.testing.assert_array_equal(np.signbit(ta.to_numpy(np.float64)), np.signbit(tb.to_numpy(np.float64)))
    assert json.dumps(a.report.metadata, sort_keys=True, default=str) == \
        json.dumps(b.report.metadata, sort_keys=True, default=str)
    assert a.report.warnings == b.report.warnings
    assert a.report.damaged == b.report.damaged
    assert a.report.rows == b.report.rows


@pytest.mark.parametrize("window", [wandb_scan.WINDOW, 16 * 1024])
def test_the_edge_run_reads_the_same_on_both_paths(edge_run: Path, window: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wandb_scan, "WINDOW", window)
    fast, exact = _read(edge_run, False, monkeypatch), _read(edge_run, True, monkeypatch)
    assert_same_reads(fast, exact)
    table = fast.table
    assert len(table) == 400 and table["step"].tolist() == list(range(400))
    assert table["損失/train"].tolist() == [0.5 * i for i in range(400)]
    assert table["k" * 200].tolist() == [float(i) for i in range(400)]
    assert table["deep/a/b/c"].iloc[8] == 2.0
    assert table["int"].iloc[0] == -200.0 and table["flag"].iloc[3] == 1.0 and table["flag"].iloc[4] == 0.0
    assert (table["zero"] == 0).all() and not np.signbit(table["zero"]).any()  # W&B writes -0.0 as "-0": 0
    assert (table["big_int"].dropna() == -np.inf).all() and table["big_int"].notna().sum() == 8  # -(10**400)
    assert table["layer2999/grad_norm"].notna().sum() == 4
    assert np.isnan(table["nan"].iloc[250]) and table["inf"].iloc[250] == -np.inf
    assert "nothing" not in table.columns and "text" not in table.columns
    summary = fast.report.metadata["summary"]
    assert summary["best"] == 0.125 and "dropped" not in summary
    assert fast.report.metadata["config"]["nested"] == {"a": [1, 2]}
    assert any("non-numeric history values dropped" in w for w in fast.report.warnings)


def test_the_fixture_runs_read_the_same_on_both_paths(monkeypatch: pytest.MonkeyPatch, wandb_runs: Path) -> None:
    runs = wandb_runs
    for source, kwargs in [(runs / "nested", {}), (runs / "multi", {}), (runs / "multi", {"run_id": "other1"}),
                           (runs / "multi", {"run_id": "other1", "step_key": "global_step"})]:
        assert_same_reads(_read(source, False, monkeypatch, **kwargs), _read(source, True, monkeypatch, **kwargs))


def test_damaged_copies_read_the_same_on_both_paths(edge_run: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wandb_scan, "WINDOW", 64 * 1024)
    data = edge_run.read_bytes()
    rng = np.random.default_rng(7)
    copy = tmp_path / "run-edge1.wandb"
    for bit in rng.choice(len(data) * 8, size=6, replace=False).tolist():
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        copy.write_bytes(bytes(damaged))
        fast, exact = _read(copy, False, monkeypatch), _read(copy, True, monkeypatch)
        assert_same_reads(fast, exact)
        assert len(fast.table) >= 390  # one record lost, at most a few rows


def test_a_growing_copy_reads_each_row_once_as_the_exact_path_does(edge_run: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wandb_scan, "WINDOW", 16 * 1024)
    source = edge_run.read_bytes()
    copy = tmp_path / "offline-run-20250101_000000-edge1" / "run-edge1.wandb"
    copy.parent.mkdir()
    rng = np.random.default_rng(3)
    reader = WandbRunReader(copy)
    pieces, pos = [], 0
    with copy.open("wb") as fh:
        while pos < len(source):
            size = int(rng.choice([7, 3000, 40_000, 200_000]))
            fh.write(source[pos:pos + size])
            fh.flush()
            pos += size
            pieces.append(reader.read_new())
    got = pd.concat(pieces, ignore_index=True)
    assert got["step"].tolist() == list(range(400))
    exact = _read(edge_run, True, monkeypatch).table
    pd.testing.assert_series_equal(got["loss"], exact["loss"], check_names=False)
    assert reader.report.metadata["summary"]["best"] == 0.125 and reader.report.metadata["finished"] is True


def test_the_loop_checksum_is_zlibs() -> None:
    from forensics.sources.wandb_kernel import _crc32

    rng = np.random.default_rng(0)
    for n in [0, 1, 7, 8, 9, 15, 16, 17, 1000, 32 * 1024]:
        buf = rng.integers(0, 256, n + 5).astype(np.uint8)
        for seed in (0, zlib.crc32(b"\x01"), 0xFFFFFFFF):
            assert _crc32(buf, 3, 3 + n, seed, wandb_scan._CRC) == zlib.crc32(buf[3:3 + n].tobytes(), seed)


def test_a_value_the_loop_calls_plain_is_the_number_json_reads() -> None:
    from forensics.sources import wandb_kernel as K

    texts = ["0", "-0", "12", "-3.5", "1e5", "1E+5", "2.5e-3", "-0.0", "NaN", "Infinity", "-Infinity", "true",
             "false", "null", "1" * 30, "0.1", "9" * 400, "-1.7976931348623157e308", "4.9e-324", "123.456e-7"]
    others = ["01", "1.", ".5", "+1", "1e", "1e+", "-", "nan", "inf", " 1", "1 ", '"1"', "[1]", "{}", "", "--1",
              "0x10", "1_000", "Infinity1", "NaN ", "tru", "1.5.5"]
    for text in texts + others:
        raw = np.frombuffer(text.encode(), dtype=np.uint8).copy()
        kind = K._classify(raw, 0, len(raw))
        if text in others:
            assert kind == K.V_OTHER, text
            continue
        value = json.loads(text)
        want = {True: 1.0, False: 0.0}.get(value, value) if isinstance(value, bool) else value
        assert kind == {bool: K.V_TRUE if value is True else K.V_FALSE, int: K.V_INT, float: K.V_FLOAT,
                        type(None): K.V_NULL}[type(value)], text
        if kind in (K.V_INT, K.V_FLOAT):
            texts_arr = np.frombuffer(("0" if text == "-0" else text).encode(), dtype=np.uint8).copy()
            got = wandb_scan._parse_values(texts_arr, np.array([0, len(texts_arr)], dtype=np.int64))[0]
            try:
                expected = float(want)
            except OverflowError:
                expected = np.inf if want > 0 else -np.inf
            assert got == expected or (np.isnan(got) and np.isnan(expected)), text
            assert np.signbit(got) == np.signbit(expected), text
