"""Damaged run files: a flipped bit never comes back as a wrong value, and costs only the record it hit.

The files are real: a TensorBoard event file from torch's ``SummaryWriter`` and a ``.wandb`` file from the ``wandb``
package in offline mode (one record split across two 32 KiB blocks by a large config value). Both are built once per
session. Every bit of the TensorBoard file is flipped (through the framing and event decoding the reader uses; a
seeded sample through the whole reader); a seeded sample of bits of the larger ``.wandb`` file goes through the whole
reader. Each time: no value differs from the truth at its step, and every record the flip did not touch is read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("tensorboard")
SummaryWriter = pytest.importorskip("torch.utils.tensorboard").SummaryWriter

from forensics.errors import ForensicsError  # noqa: E402
from forensics.sources.reader.records import Damage, damage_line  # noqa: E402
from forensics.sources.tensorboard import tfrecord  # noqa: E402
from forensics.sources.tensorboard.event_reader import TensorBoardReader  # noqa: E402

TB_STEPS = 48  # train/loss at each step, lr every 4th: 60 scalars, ~3 KB, ~25K bits


def _loss(step: int) -> float:
    return 2.1 + 0.01 * step + (1.0 if step == 30 else 0.0)


@pytest.fixture(scope="session")
def tb_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tb-damage")
    with SummaryWriter(out) as w:
        for s in range(TB_STEPS):
            w.add_scalar("train/loss", _loss(s), s)
            if s % 4 == 0:
                w.add_scalar("lr", 1e-3 * (s + 1), s)
    (path,) = out.glob("events.out.tfevents.*")
    return path


def _events(data: bytes, frames: tfrecord.Frames) -> dict[int, tuple[int, str, float]]:
    """Record start (header byte) -> (step, tag, value) of each scalar event, decoded as the reader decodes."""
    from tensorboard.compat.proto import event_pb2

    out = {}
    for s, n in zip(frames.starts.tolist(), frames.lengths.tolist()):
        event = event_pb2.Event.FromString(data[s : s + n])
        for value in event.summary.value:
            out[s - tfrecord.HEADER_SIZE] = (event.step, value.tag, value.simple_value)
    return out


def test_crc32c_matches_tensorboards_own(tb_file: Path) -> None:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    rng = np.random.default_rng(1)
    for n in (0, 1, 7, 8, 9, 31, 4095, 4096, 4097, 3 * 4096 + 5):
        payload = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert tfrecord.masked_crc32c(payload) == masked_crc32c(payload), n
    # and a whole real file verifies, record for record
    data = tb_file.read_bytes()
    frames = tfrecord.scan(data, finished=True)
    assert (frames.state, frames.end, frames.damaged) == ("end", len(data), [])
    assert len(frames.starts) == TB_STEPS + TB_STEPS // 4 + 1  # the scalars and the file_version event


def test_every_bit_flip_of_a_tensorboard_file_loses_only_its_record(tb_file: Path) -> None:
    """All ~25K single-bit flips, scanned as copies laid end to end (one scan per 2,048 copies: a copy's damage
    resynchronises on its own next record or on the next copy's first, as in a file that goes on). A record read at
    its original offset with its original length holds the original bytes (the flip is elsewhere), so its values
    are the truth; the decoded values are compared too, on a sample, by the next test."""
    data = tb_file.read_bytes()
    clean = tfrecord.scan(data, finished=True)
    truth = _events(data, clean)
    assert sorted(v[0] for v in truth.values() if v[1] == "train/loss") == list(range(TB_STEPS))
    assert all(v[2] == np.float32(_loss(v[0])) for v in truth.values() if v[1] == "train/loss")
    size = len(data)
    rec_start = clean.starts - tfrecord.HEADER_SIZE
    rec_end = clean.starts + clean.lengths + tfrecord.FOOTER_SIZE
    assert rec_start[0] == 0 and (rec_start[1:] == rec_end[:-1]).all() and rec_end[-1] == size  # no gaps
    original = np.frombuffer(data, dtype=np.uint8)
    n_bits, per_scan = size * 8, 2048
    for first in range(0, n_bits, per_scan):
        bits = np.arange(first, min(n_bits, first + per_scan))
        copies = np.tile(original, len(bits))
        copies[np.arange(len(bits)) * size + bits // 8] ^= (1 << (bits % 8)).astype(np.uint8)
        frames = tfrecord.scan(copies, finished=True)
        starts = frames.starts - tfrecord.HEADER_SIZE
        copy, local = starts // size, starts % size
        index = np.searchsorted(rec_start, local)
        assert (rec_start[index] == local).all() and (clean.lengths[index] == frames.lengths).all()
        touched = np.searchsorted(rec_end, bits // 8, side="right")  # the record holding each flipped bit
        assert not (index == touched[copy]).any()  # the flipped record is never read
        assert (np.bincount(copy, minlength=len(bits)) == len(rec_start) - 1).all()  # every other one is
        damaged = np.array([(offset, length) for offset, length, _ in frames.damaged])
        assert len(damaged) == len(bits)
        assert (damaged[:, 0] - np.arange(len(bits)) * size == rec_start[touched]).all()
        assert (damaged[:, 1] == (rec_end - rec_start)[touched]).all()


def test_sampled_bit_flips_through_the_whole_tensorboard_reader(tb_file: Path, tmp_path: Path) -> None:
    data = tb_file.read_bytes()
    truth = TensorBoardReader(tb_file).read_all().set_index("step")
    positions = np.random.default_rng(25).choice(len(data) * 8, size=60, replace=False)
    bad = tmp_path / tb_file.name
    for pos in positions.tolist():
        buf = bytearray(data)
        buf[pos // 8] ^= 1 << (pos % 8)
        bad.write_bytes(bytes(buf))
        reader = TensorBoardReader(bad)
        reader.finished = True
        got = reader.read_all().set_index("step")
        cells = got[["train/loss", "lr"]].stack().dropna()  # the values read, by (step, tag)
        want = truth[["train/loss", "lr"]].stack().dropna()
        assert (cells == want.reindex(cells.index)).all(), pos
        assert len(want) - len(cells) <= 1, pos
        damaged = reader.report.damaged
        if len(cells) < len(want):
            (d,) = damaged
            (lost,) = want.index.difference(cells.index)
            low, high = d.steps
            assert (low is None or low <= lost[0]) and (high is None or lost[0] <= high), (pos, d)
            assert low is not None or high is not None
            assert any("1 record skipped for damage at byte offset" in w for w in reader.report.warnings)
        assert len(damaged) <= 1


def test_live_tensorboard_file_waits_for_a_record_being_written_and_then_skips_damage(
    tb_file: Path, tmp_path: Path
) -> None:
    data = tb_file.read_bytes()
    frames = tfrecord.scan(data, finished=True)
    starts = (frames.starts - tfrecord.HEADER_SIZE).tolist()
    k = 20  # damage the data of record k; the file grows: up to just after it, then on
    bad = bytearray(data)
    bad[int(frames.starts[k]) + 3] ^= 0x10
    live = tmp_path / tb_file.name
    reader = TensorBoardReader(live)
    live.write_bytes(bytes(bad[: starts[k + 1] + 5]))  # record k complete (and bad), record k+1 being written
    first = reader.read_new()
    assert reader.report.damaged == []  # not yet: nothing verifiable after it
    assert reader._offsets[live] == starts[k]  # waits before it
    live.write_bytes(bytes(bad[: starts[k + 1] + 3]))  # (a rewrite shorter than before changes nothing)
    live.write_bytes(bytes(bad))
    second = reader.read_new()
    (d,) = reader.report.damaged
    assert (d.offset, d.length, d.reason) == (starts[k], starts[k + 1] - starts[k], "data checksum mismatch")
    steps = pd.concat([first, second])["step"]
    lost_step = _events(data, frames)[starts[k]][0]
    assert d.steps[0] <= lost_step <= d.steps[1]
    full = TensorBoardReader(tb_file).read_all()
    assert steps.max() == full["step"].max() and len(reader.table) >= len(full) - 1


def test_finished_tensorboard_file_with_damage_at_its_end(tb_file: Path, tmp_path: Path) -> None:
    data = tb_file.read_bytes()
    frames = tfrecord.scan(data, finished=True)
    last = int(frames.starts[-1]) - tfrecord.HEADER_SIZE
    bad = bytearray(data)
    bad[last + 2] ^= 1  # the last record's length
    path = tmp_path / tb_file.name
    path.write_bytes(bytes(bad))
    live = TensorBoardReader(path)
    live.read_new()
    assert live.report.damaged == []  # live: the writer may not have moved past it
    done = TensorBoardReader(path)
    done.finished = True
    df = done.read_all()
    (d,) = done.report.damaged
    assert (d.offset, d.length, d.reason) == (last, len(data) - last, "length checksum mismatch")
    # the last record held step 47's loss: that step is missing (not filled in), the region follows step 46
    assert d.steps == (TB_STEPS - 2, None) and d.to_json()["steps"] == [TB_STEPS - 2, None]
    assert df["step"].tolist() == list(range(TB_STEPS - 1))
    assert df["train/loss"].notna().all()
    strict = TensorBoardReader(path, strict=True)
    strict.finished = True
    with pytest.raises(ForensicsError, match=r"1 record skipped for damage at byte offset \d+, after step 46 .*strict"):
        strict.read_all()


def test_damage_line_counts_offsets_and_steps() -> None:
    damages = [
        Damage(100, 52, "data checksum mismatch", (9, 10)),
        Damage(900, 40, "length checksum mismatch", (29, 31), "run/events.x"),
    ]
    line = damage_line(damages)
    assert line.startswith(
        "2 records skipped for damage at byte offsets 100, steps 9-10; run/events.x:900, steps "
        "29-31 (data checksum mismatch; length checksum mismatch): "
    )
    assert "never filled in" in line
    assert "byte offset 7, after step 3 (x)" in damage_line([Damage(7, None, "x", (3, None))])
    assert damage_line([]) is None
    assert damages[1].to_json() == {
        "file": "run/events.x",
        "offset": 900,
        "length": 40,
        "reason": "length checksum mismatch",
        "steps": [29, 31],
    }


# --- W&B ----------------------------------------------------------------------------------------------------------
WANDB_ROWS = 120
WANDB_WRITER = textwrap.dedent("""
    import sys, wandb
    out = sys.argv[1]
    run = wandb.init(dir=out, project="p", id="dmg1", config={"notes": "n" * 40000},
                     settings=wandb.Settings(console="off", x_disable_stats=True, x_disable_meta=True,
                                             x_disable_machine_info=True, disable_git=True, save_code=False,
                                             x_save_requirements=False, disable_job_creation=True))
    for i in range(int(sys.argv[2])):
        run.log({"train/loss": 2.1 + 0.01 * i, "grad_norm": 0.5 * i})
    run.finish()
""")


@pytest.fixture(scope="session")
def wandb_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("wandb")
    out = tmp_path_factory.mktemp("wandb-damage")
    (out / "writer.py").write_text(WANDB_WRITER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        {
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "HOME": str(out / "home"),
            "WANDB_CONFIG_DIR": str(out / "config"),
            "WANDB_CACHE_DIR": str(out / "cache"),
            "WANDB_DATA_DIR": str(out / "data"),
        }
    )
    subprocess.run(
        [sys.executable, str(out / "writer.py"), str(out), str(WANDB_ROWS)],
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
    )
    (path,) = out.glob("wandb/offline-run-*/run-dmg1.wandb")
    return path


def _record_spans(path: Path) -> list[tuple[int, int, str]]:
    from forensics.sources.wandb.record_log import RecordLog

    log = RecordLog(path)
    return [(start, log.offset, rec.WhichOneof("record_type")) for start, rec in log.records(finished=True)]


def _wandb_read(path: Path):
    from forensics.sources.wandb.run_reader import WandbRunReader

    reader = WandbRunReader(path)
    reader.finished = True
    return reader, reader.read_all()


def test_sampled_bit_flips_of_a_wandb_file_lose_only_their_record(wandb_file: Path, tmp_path: Path) -> None:
    data = wandb_file.read_bytes()
    spans = _record_spans(wandb_file)
    assert len(data) > 40_000 and any(e - s > 32 * 1024 for s, e, _ in spans)  # one record split across blocks
    _, truth = _wandb_read(wandb_file)
    assert truth["step"].tolist() == list(range(WANDB_ROWS))
    np.testing.assert_array_equal(truth["train/loss"], 2.1 + 0.01 * np.arange(WANDB_ROWS))
    history = [(s, e) for s, e, kind in spans if kind == "history"]
    rng = np.random.default_rng(25)
    # a uniform sample, plus every bit of the chunk headers around the first block boundary and of one history record
    positions = set(rng.choice(len(data) * 8, size=40, replace=False).tolist())
    positions |= set(range((32 * 1024 - 16) * 8, (32 * 1024 + 8) * 8, 6))
    s40, _ = history[40]
    positions |= set(range(s40 * 8, (s40 + 7) * 8, 2))
    bad = tmp_path / wandb_file.name
    kept = 0
    for pos in sorted(positions):
        buf = bytearray(data)
        buf[pos // 8] ^= 1 << (pos % 8)
        bad.write_bytes(bytes(buf))
        reader, got = _wandb_read(bad)
        byte = pos // 8
        touched = [i for i, (s, e) in enumerate(history) if s <= byte < e]
        expected_steps = [i for i in range(WANDB_ROWS) if i not in touched]
        assert got["step"].tolist() == expected_steps, pos  # every untouched history record is read
        want = truth.set_index("step").loc[expected_steps, ["train/loss", "grad_norm"]]
        assert (got.set_index("step")[["train/loss", "grad_norm"]] == want).all().all(), pos
        kept += len(got)
        damaged = reader.report.damaged
        record = [(s, e) for s, e, _ in spans if s <= byte < e]
        if record:  # a flip inside a record is found, and the region is that record
            (d,) = damaged
            assert (d.offset, d.offset + d.length) == record[0], (pos, d)
            if touched:
                assert d.steps == (touched[0] - 1 if touched[0] else None, touched[0] + 1), (pos, d)
        elif byte >= 7:
            assert damaged == [], pos  # block padding: nothing lost
    assert kept >= 0.98 * WANDB_ROWS * len(positions)


def test_live_wandb_file_waits_then_skips_the_damaged_record(wandb_file: Path, tmp_path: Path) -> None:
    from forensics.sources.wandb.run_reader import WandbRunReader

    data = wandb_file.read_bytes()
    history = [(s, e) for s, e, kind in _record_spans(wandb_file) if kind == "history"]
    s, e = history[50]
    bad = bytearray(data)
    bad[s + 7 + 3] ^= 0x04
    live = tmp_path / "offline-run-20250101_000000-dmg1" / wandb_file.name
    live.parent.mkdir()
    reader = WandbRunReader(live)
    live.write_bytes(bytes(bad[: e + 9]))  # history record 50 complete but bad, the next record being written
    first = reader.read_new()
    assert first["step"].tolist() == list(range(50)) and reader.report.damaged == []
    assert reader._logs[live].offset == s  # waits before it
    live.write_bytes(bytes(bad))
    second = reader.read_new()
    (d,) = reader.report.damaged
    assert (d.offset, d.length, d.reason, d.steps) == (s, e - s, "checksum mismatch", (49, 51))
    assert second["step"].tolist() == list(range(51, WANDB_ROWS))
    assert any(
        f"1 record skipped for damage at byte offset {s}, steps 49-51 (checksum mismatch)" in w
        for w in reader.report.warnings
    )
    assert json.dumps([x.to_json() for x in reader.report.damaged])


def test_wandb_header_bit_flip_is_damage_not_another_format(wandb_file: Path, tmp_path: Path) -> None:
    buf = bytearray(wandb_file.read_bytes())
    buf[1] ^= 0x01
    bad = tmp_path / wandb_file.name
    bad.write_bytes(bytes(buf))
    reader, got = _wandb_read(bad)
    assert got["step"].tolist() == list(range(WANDB_ROWS))
    assert [(d.offset, d.length) for d in reader.report.damaged] == [(0, 7)]
