"""TensorBoard event files: every scalar event, read directly from the files.

TensorBoard's ``EventAccumulator`` keeps a random 10,000 scalars per tag by default, which can hide exactly the
spikes this tool looks for, and it is ~10x slower than reading the files. So this module reads the TFRecord framing
itself (uint64 length, uint32 length CRC, payload, uint32 payload CRC) and decodes each payload with TensorBoard's
own ``Event`` protobuf. Both scalar encodings are read: ``simple_value`` (PyTorch's ``SummaryWriter``, TF1) and
0-d tensors of the scalars plugin (TF2 ``tf.summary.scalar``, whose plugin metadata comes only with a tag's first
value).

A folder is read file by file in the order the files were started (the timestamp in
``events.out.tfevents.<time>.<host>...``): a resumed run writes a new file whose steps overlap the old one, and the
last write of a (step, tag) wins. Files in subfolders (``add_scalars``, Keras ``train/``/``validation/``) get the
subfolder as a prefix of their tags. A truncated last record (a file being written) is left for the next read.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa

from forensics.errors import ForensicsError, require
from forensics.schema import TIMESTAMP
from forensics.sources.reader import MetricsReader
from forensics.sources.records import Records, sparse_columns

_HEADER = struct.Struct("<QI")
_FOOTER = 4
#: A record longer than this is taken as damage, not data (scalar events are ~100 bytes; images can be MBs).
_MAX_RECORD = 1 << 30
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
    """Reads one event file or a folder of them, live or finished; every scalar event is kept."""

    format_name = "tensorboard"
    _where_word = "byte"
    _records_step_key = "step"

    def _reset_position(self) -> None:
        self._offsets: dict[Path, int] = {}
        self._scalar_tags: dict[Path, dict[str, bool]] = {}
        self._damaged: set[Path] = set()

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
            if path in self._damaged:
                continue
            prefix = ""
            if root.is_dir() and path.parent != root:
                prefix = path.parent.relative_to(root).as_posix() + "/"
            rec = self._read_file(path, prefix, event_pb2)
            if rec is not None:
                out.append(rec)
        return out

    def _read_file(self, path: Path, prefix: str, event_pb2) -> Records | None:
        start = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read()
        except OSError as exc:
            raise ForensicsError(f"TensorBoard file {path} could not be read: {exc.strerror or exc}") from exc
        tags = self._scalar_tags.setdefault(path, {})
        rows = _RowBuilder()
        pos, n = 0, len(data)
        view = memoryview(data)
        while pos + _HEADER.size <= n:
            length, _ = _HEADER.unpack_from(data, pos)
            end = pos + _HEADER.size + length + _FOOTER
            if length > _MAX_RECORD:
                self._damaged.add(path)
                self._malformed(start + pos, f"impossible record length {length} in {path.name}; rest of file skipped")
                break
            if end > n:
                break  # a record still being written: read it next time
            try:
                event = event_pb2.Event.FromString(view[pos + _HEADER.size:end - _FOOTER])
            except Exception:  # the protobuf runtime raises its own DecodeError type
                self._malformed(start + pos, f"undecodable event in {path.name}")
                pos = end
                continue
            if event.HasField("summary"):
                for value in event.summary.value:
                    x = _scalar(value, tags)
                    if x is not None:
                        rows.add(event.step, prefix + value.tag, x, event.wall_time, start + pos)
            pos = end
        self._offsets[path] = start + pos
        if self.finished and pos < n:
            self.report.warn(f"{path.name}: a truncated last record ({n - pos} bytes) was not read")
        return rows.records()


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
        self._row_tags: set[str] = set()

    def add(self, step: int, tag: str, x: float, wall_time: float, where: int) -> None:
        if not self.steps or self.steps[-1] != step or tag in self._row_tags:
            self.steps.append(step)
            self.where.append(where)
            self.wall.append(wall_time)
            self._row_tags = set()
        row = len(self.steps) - 1
        self._row_tags.add(tag)
        self.cols.setdefault(tag, {})[row] = x
        self.wall[row] = wall_time

    def records(self) -> Records | None:
        if not self.steps:
            return None
        n = len(self.steps)
        columns = {"step": pa.array(self.steps, pa.int64()), **sparse_columns(n, self.cols)}
        columns[TIMESTAMP] = pa.array(self.wall, pa.float64())
        return Records(pa.table(columns), np.asarray(self.where, dtype=np.int64))
