"""The ``.wandb`` reader's compiled path against its exact (protobuf, Python) path, on real runs written by ``wandb``.

The compiled path (:mod:`forensics.sources.wandb.scanner`) must give what the exact path gives, byte for byte: the same
table (nulls, NaN, -0.0 and all), metadata (config, summary), warnings and damaged regions, on clean runs, on runs
full of what it hands back to Python (media, text, typed values, long and non-ASCII keys, records split over blocks
and longer than its window, more keys than its first table holds), on damaged copies and on a copy that grows.
"""

from __future__ import annotations

import json
import struct
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

import forensics.sources.wandb.run_reader as run_reader  # noqa: E402
import forensics.sources.wandb.scanner as scanner  # noqa: E402
from forensics.sources.wandb.run_reader import WandbRunReader  # noqa: E402
from tests.wandb_writers import isolated_env  # noqa: E402

EDGE_WRITER = textwrap.dedent("""
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
""")


@pytest.fixture(scope="module")
def edge_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wandb-edge")
    (out / "writer.py").write_text(EDGE_WRITER)
    subprocess.run(
        [sys.executable, str(out / "writer.py"), str(out)],
        env=isolated_env(out),
        check=True,
        timeout=120,
        capture_output=True,
    )
    return next((out / "wandb").glob("offline-run-*/run-edge1.wandb"))


def _read(source: Path, exact: bool, monkeypatch: pytest.MonkeyPatch, **kwargs) -> WandbRunReader:
    with monkeypatch.context() as m:
        if exact:
            m.setattr(run_reader, "read_run_file", lambda log, finished: log.records(finished))
        reader = WandbRunReader(source, **kwargs)
        reader.finished = True
        reader.read_all()
    return reader


def assert_same_reads(a: WandbRunReader, b: WandbRunReader) -> None:
    ta, tb = a.table, b.table
    pd.testing.assert_frame_equal(ta, tb, check_exact=True)
    # -0.0 and 0.0 compare equal: the sign bits too
    np.testing.assert_array_equal(np.signbit(ta.to_numpy(np.float64)), np.signbit(tb.to_numpy(np.float64)))
    assert json.dumps(a.report.metadata, default=str) == json.dumps(b.report.metadata, default=str)  # in order
    assert a.report.warnings == b.report.warnings
    assert a.report.damaged == b.report.damaged
    assert a.report.rows == b.report.rows


@pytest.mark.parametrize(("window", "ahead"), [(scanner.WINDOW, False), (16 * 1024, False), (16 * 1024, True)])
def test_the_edge_run_reads_the_same_on_both_paths(
    edge_run: Path, window: int, ahead: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ahead``: the next window walked on a second thread (on by itself only with two free cores)."""
    monkeypatch.setattr(scanner, "WINDOW", window)
    monkeypatch.setattr(scanner, "_two_cores", lambda: ahead)
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
    for source, kwargs in [
        (runs / "nested", {}),
        (runs / "multi", {}),
        (runs / "multi", {"run_id": "other1"}),
        (runs / "multi", {"run_id": "other1", "step_key": "global_step"}),
    ]:
        assert_same_reads(_read(source, False, monkeypatch, **kwargs), _read(source, True, monkeypatch, **kwargs))


def test_damaged_copies_read_the_same_on_both_paths(
    edge_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scanner, "WINDOW", 64 * 1024)
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


def test_a_growing_copy_reads_each_row_once_as_the_exact_path_does(
    edge_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scanner, "WINDOW", 16 * 1024)
    monkeypatch.setattr(scanner, "_two_cores", lambda: True)
    source = edge_run.read_bytes()
    copy = tmp_path / "offline-run-20250101_000000-edge1" / "run-edge1.wandb"
    copy.parent.mkdir()
    rng = np.random.default_rng(3)
    reader = WandbRunReader(copy)
    pieces, pos = [], 0
    with copy.open("wb") as fh:
        while pos < len(source):
            size = int(rng.choice([7, 3000, 40_000, 200_000]))
            fh.write(source[pos : pos + size])
            fh.flush()
            pos += size
            pieces.append(reader.read_new())
    got = pd.concat(pieces, ignore_index=True)
    assert got["step"].tolist() == list(range(400))
    exact = _read(edge_run, True, monkeypatch).table
    pd.testing.assert_series_equal(got["loss"], exact["loss"], check_names=False)
    assert reader.report.metadata["summary"]["best"] == 0.125 and reader.report.metadata["finished"] is True


def test_the_loop_checksum_is_zlibs() -> None:
    from forensics.sources.wandb.scan_kernel import _crc32

    rng = np.random.default_rng(0)
    for n in [0, 1, 7, 8, 9, 15, 16, 17, 1000, 32 * 1024]:
        buf = rng.integers(0, 256, n + 5).astype(np.uint8)
        for seed in (0, zlib.crc32(b"\x01"), 0xFFFFFFFF):
            assert _crc32(buf, 3, 3 + n, seed, scanner._CRC) == zlib.crc32(buf[3 : 3 + n].tobytes(), seed)


def test_a_value_the_loop_calls_plain_is_the_number_json_reads() -> None:
    from forensics.sources.wandb import scan_kernel as K

    texts = [
        "0",
        "-0",
        "12",
        "-3.5",
        "1e5",
        "1E+5",
        "2.5e-3",
        "-0.0",
        "NaN",
        "Infinity",
        "-Infinity",
        "true",
        "false",
        "null",
        "1" * 30,
        "0.1",
        "9" * 400,
        "-1.7976931348623157e308",
        "4.9e-324",
        "123.456e-7",
    ]
    others = [
        "01",
        "1.",
        ".5",
        "+1",
        "1e",
        "1e+",
        "-",
        "nan",
        "inf",
        " 1",
        "1 ",
        '"1"',
        "[1]",
        "{}",
        "",
        "--1",
        "0x10",
        "1_000",
        "Infinity1",
        "NaN ",
        "tru",
        "1.5.5",
        "9" * 4301,
    ]
    for text in texts + others:
        raw = np.frombuffer(text.encode(), dtype=np.uint8).copy()
        kind = K._classify(raw, 0, len(raw), 4300)
        if text in others:
            assert kind == K.V_OTHER, text
            continue
        value = json.loads(text)
        want = {True: 1.0, False: 0.0}.get(value, value) if isinstance(value, bool) else value
        assert (
            kind
            == {bool: K.V_TRUE if value is True else K.V_FALSE, int: K.V_INT, float: K.V_FLOAT, type(None): K.V_NULL}[
                type(value)
            ]
        ), text
        if kind in (K.V_INT, K.V_FLOAT):
            texts_arr = np.frombuffer(("0" if text == "-0" else text).encode(), dtype=np.uint8).copy()
            got = scanner._parse_values(texts_arr, np.array([0, len(texts_arr)], dtype=np.int64))[0]
            try:
                expected = float(want)
            except OverflowError:
                expected = np.inf if want > 0 else -np.inf
            assert got == expected or (np.isnan(got) and np.isnan(expected)), text
            assert np.signbit(got) == np.signbit(expected), text


# --- hand-made files: what wandb does not write, but a broken writer or a damaged disk could ----------------------
def _framed(payloads: list[bytes], paddings: list[int] | None = None) -> bytes:
    """A .wandb file holding ``payloads`` as records: the header, then LevelDB-log chunks over 32 KiB blocks
    (``paddings`` gets the offset of each block tail too short for a chunk header)."""
    from forensics.sources.wandb.record_log import BLOCK_SIZE, FILE_HEADER, FIRST, FULL, LAST, MIDDLE

    out = bytearray(FILE_HEADER)
    for data in payloads:
        first = True
        while True:
            left = BLOCK_SIZE - len(out) % BLOCK_SIZE
            if left < 7:
                if paddings is not None:
                    paddings.append(len(out))
                out += bytes(left)
                continue
            part, data = data[: left - 7], data[left - 7 :]
            kind = (FULL if not data else FIRST) if first else (LAST if not data else MIDDLE)
            out += struct.pack("<IHB", zlib.crc32(part, zlib.crc32(bytes([kind]))), len(part), kind) + part
            first = False
            if not data:
                break
    return bytes(out)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _string(field: int, raw: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(raw)) + raw


def _item(key: bytes, value: bytes, nested: bool = True) -> bytes:
    return _string(2 if nested else 1, key) + _string(16, value)


def _history(*items: bytes, step: int = 0, extra: bytes = b"") -> bytes:
    body = b"".join(_string(1, i) for i in items) + _string(2, _varint(1 << 3) + _varint(step)) + extra
    return _string(2, body)


def _summary(updates: list[bytes], removes: list[bytes] = ()) -> bytes:
    return _string(3, b"".join(_string(1, u) for u in updates) + b"".join(_string(2, r) for r in removes))


def _both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, records: list[bytes], **kwargs):
    path = tmp_path / "offline-run-20250101_000000-hand1" / "run-hand1.wandb"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(_framed(records))
    fast, exact = _read(path, False, monkeypatch, **kwargs), _read(path, True, monkeypatch, **kwargs)
    assert_same_reads(fast, exact)
    return fast


def test_a_broken_summary_string_is_a_damaged_record_on_both_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = _history(_item(b"loss", b"1.5"))
    for bad in (_item(b"k", b"\xff"), _string(1, b"\xfe") + _item(b"k", b"2")):  # the value; an ignored key
        reader = _both(tmp_path, monkeypatch, [row, _summary([_item(b"ok", b"1")]), _summary([bad])])
        assert [d.reason[:36] for d in reader.report.damaged] == ["record does not decode as a W&B Reco"]
        assert list(reader.report.metadata["summary"]) == ["ok"]


def test_summary_keys_end_in_the_order_their_records_leave_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = _both(
        tmp_path,
        monkeypatch,
        [
            _summary([_item(b"a", b"1"), _item(b"b", b"2"), _item(b"c", b"0")]),
            _history(_item(b"loss", b"1")),
            _summary([], [_item(b"a", b"")]),
            _summary([_item(b"a", b"3"), _item(b"c", b"4")]),
        ],
    )
    assert reader.report.metadata["summary"] == {"b": 2, "c": 4, "a": 3}
    assert list(reader.report.metadata["summary"]) == ["b", "c", "a"]


def test_odd_values_and_fields_read_as_the_exact_path_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    huge = b"1" + b"0" * 400
    longest = b"9" * 4301  # past Python's int-to-str limit: json refuses it, so it is a dropped value
    reader = _both(
        tmp_path,
        monkeypatch,
        [
            _history(_item(b"a", b"1"), _item(b"big", huge), step=0),
            _history(_item(b"a", b"2"), _item(b"big", b"-" + huge), _item(b"caption", b'"text"'), step=1),
            _history(_item(b"a", b"3"), _item(b"big", longest), step=2),
            _history(_item(b"a", b"4"), step=3, extra=_varint((1 << 29) << 3) + _varint(5)),  # field number too large
            _history(_item(b"a", b"5"), _item(b"x", b"1", nested=False) + _string(1, b"\xff"), step=4),
        ],
    )
    table = reader.table
    assert table["step"].tolist() == [0, 1, 2]  # steps 3 and 4 do not decode: damage, as protobuf says
    assert table["big"].iloc[0] == np.inf and table["big"].iloc[1] == -np.inf and pd.isna(table["big"].iloc[2])
    assert [d.reason.rsplit(": ", 1)[1] for d in reader.report.damaged] == [
        "Wire format was corrupt",
        "String field had bad UTF-8",
    ]
    assert "'caption' (1), 'big' (1)" in reader.report.warnings[0]


def test_rows_that_write_nothing_kept_leave_an_empty_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader = _both(
        tmp_path,
        monkeypatch,
        [_history(_item(b"_runtime", b"1")), _history(_item(b"_runtime", b"2"))],
        step_key="global_step",
    )
    assert reader.table.empty


@pytest.mark.parametrize("window", [48 * 1024, 70 * 1024, 100 * 1024 + 3])
def test_windows_read_ahead_join_up_at_padding_and_cuts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    """Records sized so that block tails too short for a header (padding) fall where windows end; the file is cut
    at a few places (a record still being written): offsets and warnings as the exact reader's."""

    monkeypatch.setattr(scanner, "WINDOW", window)
    monkeypatch.setattr(scanner, "MARGIN", 16 * 1024)
    monkeypatch.setattr(scanner, "_two_cores", lambda: True)
    rng = np.random.default_rng(window)
    records, at = [], 7  # ``at``: where the next record's first chunk goes (7: after the file header)
    for i in range(1500):
        left = 32 * 1024 - at % (32 * 1024)
        if left < 7:  # the padding itself
            at, left = at + left, 32 * 1024
        if 60 < left < 200 and i % 3:  # end this record 3 bytes before the block does: padding follows
            payload = next(
                r
                for n in range(1, 200)
                for r in [_history(_item(b"loss", str(i / 7).encode()), _item(b"note", b"1" * n), step=i)]
                if len(r) + 7 >= left - 3
            )
        elif rng.random() < 0.03:
            payload = _history(*(_item(f"k{j}".encode(), b"2") for j in range(int(rng.integers(100, 1500)))), step=i)
        else:
            payload = _history(
                _item(b"loss", str(i / 7).encode()), _item(b"note", b"1" * int(rng.integers(1, 400))), step=i
            )
        records.append(payload)
        at = len(_framed(records)) if len(payload) + 7 > left else at + len(payload) + 7
    paddings: list[int] = []
    whole = _framed(records, paddings)
    assert len(paddings) >= 3  # block tails of padding, some where a window ends
    path = tmp_path / "offline-run-20250101_000000-pad1" / "run-pad1.wandb"
    path.parent.mkdir()
    for cut in [len(whole)] + sorted(rng.choice(len(whole), size=4, replace=False).tolist()):
        path.write_bytes(whole[:cut])
        fast, exact = _read(path, False, monkeypatch), _read(path, True, monkeypatch)
        assert_same_reads(fast, exact)
    assert len(fast.table) > 0


@pytest.mark.parametrize("ahead", [False, True])
def test_a_small_window_that_starts_in_padding_still_moves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: bool
) -> None:
    """Rows end 3 bytes before the first block does; with a window smaller than two blocks, the next window starts in
    that padding (it looped forever, its boundary being the padding's end)."""
    monkeypatch.setattr(scanner, "WINDOW", 16 * 1024)
    monkeypatch.setattr(scanner, "_two_cores", lambda: ahead)
    records, at = [], 7
    while 32 * 1024 - at > 1200:
        records.append(_history(_item(b"loss", b"1"), _item(b"note", b"1" * 900), step=len(records)))
        at += len(records[-1]) + 7
    left = 32 * 1024 - at
    records.append(
        next(
            r
            for n in range(1, 1300)
            for r in [_history(_item(b"loss", b"2"), _item(b"note", b"1" * n), step=len(records))]
            if len(r) + 7 >= left - 3
        )
    )
    records.append(_history(_item(b"loss", b"3"), _item(b"note", b"1" * 500), step=len(records)))
    paddings: list[int] = []
    _framed(records, paddings)
    assert paddings == [32 * 1024 - 3]
    reader = _both(tmp_path, monkeypatch, records)
    assert reader.table["step"].tolist() == list(range(len(records)))
