"""TensorBoard event files: every scalar event, read directly from the files.

TensorBoard's ``EventAccumulator`` keeps a random 10,000 scalars per tag by default, which can hide exactly the
spikes this tool looks for, and it is ~10x slower than reading the files. So this module reads the TFRecord framing
itself (:mod:`forensics.sources.tensorboard.tfrecord`: both checksums of every record verified, a damaged record
skipped and reading resumed at the next record that verifies) and decodes each payload with TensorBoard's own
``Event`` protobuf. Both scalar encodings are read: ``simple_value`` (PyTorch's ``SummaryWriter``, TF1) and
0-d tensors of the scalars plugin (TF2 ``tf.summary.scalar``, whose plugin metadata comes only with a tag's first
value).

A folder is read file by file in the order the files were started (the timestamp in
``events.out.tfevents.<time>.<host>...``): a resumed run writes a new file whose steps overlap the old one, and the
last write of a (step, tag) wins. Files in subfolders (``add_scalars``, Keras ``train/``/``validation/``) get the
subfolder as a prefix of their tags. A truncated last record (a file being written) is left for the next read; a
damaged one is skipped (its values stay missing) and reported in ``report.damaged`` and one warning line.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from forensics.errors import ForensicsError, require
from forensics.schema import TIMESTAMP
from forensics.sources.reader.base import MetricsReader
from forensics.sources.reader.records import Damage, Records, sparse_columns
from forensics.sources.tensorboard import tfrecord

_FILE_TIME = re.compile(r"events\.out\.tfevents\.(\d+)")


def event_files(folder: Path) -> list[Path]:
    """Event files under ``folder`` in the order their runs started (resumes after the runs they resume)."""
    files = [p for p in folder.rglob("events.out.tfevents.*") if p.is_file()]

    def started(p: Path) -> tuple:
        # Files of one second are told apart by the writer's counter at the end of the name (.0, .1, ..., .10).
        m = _FILE_TIME.match(p.name)
        parts = tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"[./]", str(p)))
        return (int(m.group(1)) if m else 0, parts)

    return sorted(files, key=started)


class TensorBoardReader(MetricsReader):
    """Reads one event file or a folder of them, live or finished; every scalar event is kept.

    Every record's two checksums are checked (:mod:`forensics.sources.tensorboard.tfrecord`); a damaged record is
    skipped, its values stay missing, and
    :attr:`report.damaged <forensics.sources.reader.records.ReaderReport.damaged>` says where.
    """

    format_name = "tensorboard"
    _where_word = "byte"
    _records_step_key = "step"

    def _reset_position(self) -> None:
        self._offsets: dict[Path, int] = {}
        self._scalar_tags: dict[Path, dict[str, bool]] = {}
        #: Per file, the step of the last record read (the left neighbour of a damaged region found later).
        self._file_last_step: dict[Path, int] = {}
        self._damages: list[Damage] = []
        #: Per file, indexes into ``_damages`` of regions whose next readable step is not known yet.
        self._open: dict[Path, list[int]] = {}
        self._damage_warning: str | None = None

    def _files(self) -> list[Path]:
        root = Path(self.source)
        if root.is_dir():
            return event_files(root)
        if not root.exists():
            raise ForensicsError(f"metrics source {root} no longer exists")
        return [root]

    def _read_records(self) -> list[Records]:
        event_pb2 = require("tensorboard.compat.proto.event_pb2", "tensorboard", "Reading TensorBoard files")
        root = Path(self.source)
        out = []
        for path in self._files():
            prefix = ""
            if root.is_dir() and path.parent != root:
                prefix = path.parent.relative_to(root).as_posix() + "/"
            rec = self._read_file(path, prefix, event_pb2)
            if rec is not None:
                out.append(rec)
        self._publish_damage()
        return out

    def _read_file(self, path: Path, prefix: str, event_pb2) -> Records | None:
        start = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read()
        except OSError as exc:
            raise ForensicsError(f"TensorBoard file {path} could not be read: {exc.strerror or exc}") from exc
        frames = tfrecord.scan(data, finished=self.finished)
        rows = _decode(data, frames, start, prefix, self._scalar_tags.setdefault(path, {}), event_pb2, self)
        self._note_damage(path, data, frames, start, event_pb2)
        if rows.last_step is not None:
            self._file_last_step[path] = rows.last_step
        self._offsets[path] = start + frames.end
        if frames.state == "incomplete" and self.finished:
            self.report.warn(f"{path.name}: a truncated last record ({len(data) - frames.end} bytes) was not read")
        return rows.records()

    def _note_damage(self, path: Path, data: bytes, frames: tfrecord.Frames, start: int, event_pb2) -> None:
        """Record each damaged region with the steps of the records either side of it (the lost values lie there)."""
        starts = frames.starts
        if len(starts):
            first = _step_at(data, frames, 0, event_pb2)
            for i in self._open.pop(path, []):  # regions found earlier: this read's first record follows them
                self._damages[i] = replace(self._damages[i], steps=(self._damages[i].steps[0], first))
        for offset, length, reason in frames.damaged:
            k = int(np.searchsorted(starts, offset))  # records before it: starts[:k]
            before = _step_at(data, frames, k - 1, event_pb2) if k > 0 else self._file_last_step.get(path)
            after = _step_at(data, frames, k, event_pb2) if k < len(starts) else None
            root = Path(self.source)
            name = path.relative_to(root).as_posix() if root.is_dir() else None
            self._damages.append(Damage(start + offset, length, reason, (before, after), name))
            if after is None:
                self._open.setdefault(path, []).append(len(self._damages) - 1)


def _step_at(data: bytes, frames: tfrecord.Frames, k: int, event_pb2) -> int | None:
    """The step of record ``k`` of ``frames`` (None if it does not decode)."""
    s, n = int(frames.starts[k]), int(frames.lengths[k])
    try:
        return int(event_pb2.Event.FromString(data[s : s + n]).step)
    except Exception:  # the protobuf runtime raises its own DecodeError type
        return None


def _decode(
    data: bytes,
    frames: tfrecord.Frames,
    base: int,
    prefix: str,
    tags: dict[str, bool],
    event_pb2,
    reader: MetricsReader,
) -> _RowBuilder:
    """Decode the verified records into wide rows (the hot loop: rows are built inline, not per call)."""
    rows = _RowBuilder()
    steps, where, wall, cols = rows.steps, rows.where, rows.wall, rows.cols
    from_string = event_pb2.Event.FromString
    view = memoryview(data)
    row, last, row_tags = -1, None, set()
    for s, n in zip(frames.starts.tolist(), frames.lengths.tolist()):
        try:
            event = from_string(view[s : s + n])
        except Exception:  # checksums verified, so the writer wrote it this way: malformed, not damage
            reader._malformed(base + s - tfrecord.HEADER_SIZE, "undecodable event")
            continue
        values = event.summary.value
        if not values:
            continue
        step = event.step
        wall_time = event.wall_time
        for value in values:
            if value.WhichOneof("value") == "simple_value":
                x = value.simple_value
            else:
                x = _scalar(value, tags)
                if x is None:
                    continue
            tag = prefix + value.tag if prefix else value.tag
            if step != last or tag in row_tags:
                steps.append(step)
                where.append(base + s - tfrecord.HEADER_SIZE)
                wall.append(wall_time)
                row += 1
                last = step
                row_tags = set()
            else:
                wall[row] = wall_time
            row_tags.add(tag)
            col = cols.get(tag)
            if col is None:
                col = cols[tag] = {}
            col[row] = x
    rows.last_step = last
    return rows


def _scalar(value, tags: dict[str, bool]) -> float | None:
    """The value of a scalar summary, or None for images, histograms, text and other plugins' tensors."""
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind != "tensor":
        return None
    plugin = value.metadata.plugin_data.plugin_name if value.HasField("metadata") else ""
    if plugin:
        tags[value.tag] = plugin == "scalars"
    if not tags.get(value.tag, False):
        return None
    t = value.tensor
    if t.tensor_shape.dim:
        return None
    if t.float_val:
        return float(t.float_val[0])
    if t.double_val:
        return float(t.double_val[0])
    if t.half_val or t.int_val or t.int64_val or t.tensor_content:
        from tensorboard.util import tensor_util

        arr = np.asarray(tensor_util.make_ndarray(t))
        return float(arr.reshape(-1)[0]) if arr.size == 1 and arr.dtype.kind in "fiub" else None
    return None


class _RowBuilder:
    """Events -> wide rows in write order: consecutive values of one step share a row until a tag repeats."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.where: list[int] = []
        self.wall: list[float] = []
        self.cols: dict[str, dict[int, float]] = {}
        self.last_step: int | None = None

    def records(self) -> Records | None:
        if not self.steps:
            return None
        n = len(self.steps)
        columns = {"step": pa.array(self.steps, pa.int64()), **sparse_columns(n, self.cols)}
        columns[TIMESTAMP] = pa.array(self.wall, pa.float64())
        return Records(pa.table(columns), np.asarray(self.where, dtype=np.int64))
