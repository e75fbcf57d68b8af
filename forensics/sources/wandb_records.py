"""The ``.wandb`` run file: a W&B header, LevelDB-log framing, and one protobuf ``Record`` per log entry.

wandb 0.30 removed its Python reader, so this module reads the format directly (it is also ~4x faster than
``wandb leet inspect``). The layout, as wandb-core 0.31 writes it:

- a 7-byte header: ``b":W&B"``, magic ``0xBEE1`` (uint16 little-endian), version ``0`` (uint8);
- then LevelDB-log framing (https://github.com/google/leveldb/blob/main/doc/log_format.md) over 32 KiB blocks
  counted from the start of the file (the header sits in block 0). Each chunk has a 7-byte header: checksum
  (uint32 LE), length (uint16 LE), type (uint8: FULL=1, FIRST=2, MIDDLE=3, LAST=4); a block tail shorter than 7
  bytes is zero padding. The checksum is plain zlib CRC-32 (IEEE, unmasked) over the type byte then the data -
  not LevelDB's masked CRC-32C - as wandb's former Python writer computed it and as every file here verifies;
- each reassembled payload is a serialized ``wandb.proto.wandb_internal_pb2.Record``.

:class:`RecordLog` reads a file incrementally from a byte offset. A file still being written ends inside a record;
reading stops cleanly before it and resumes there next time. Damage (a bad checksum, an impossible length or type)
stops reading for good at the last complete record before it, and :attr:`RecordLog.damage` names the offset.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from forensics.errors import ForensicsError, require

HEADER_IDENT = b":W&B"
HEADER_MAGIC = 0xBEE1
HEADER_VERSION = 0
FILE_HEADER = HEADER_IDENT + struct.pack("<HB", HEADER_MAGIC, HEADER_VERSION)
BLOCK_SIZE = 32 * 1024
CHUNK_HEADER_SIZE = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_CHUNK_HEADER = struct.Struct("<IHB")
#: CRC-32 of each chunk type byte alone: the checksum of (type + data) continues from it.
_TYPE_CRC = [zlib.crc32(bytes([t])) for t in range(LAST + 1)]
#: Bytes read per system call: whole blocks, so a window never splits a chunk.
_WINDOW_BLOCKS = 64


@dataclass(frozen=True)
class Damage:
    """Where a file stops being readable: ``offset`` is the byte where the bad chunk starts."""

    offset: int
    reason: str

    def describe(self, path: str | Path) -> str:
        return f"{path}: damaged at byte {self.offset} ({self.reason}); read the records before it"


class RecordLog:
    """Reads the records of one ``.wandb`` file, from where the last read stopped.

    ``offset`` is the byte after the last complete record returned (0 before the header has been read).
    ``tail_bytes`` is how many bytes past ``offset`` were present at the last read but did not yet form a complete
    record: normal for a run still being written, a truncation for a finished one. ``damage`` is set once a chunk
    fails its checks; no record at or past it is returned, then or later.
    """

    def __init__(self, path: str | Path, offset: int = 0) -> None:
        self.path = Path(path)
        self.offset = offset
        self.tail_bytes = 0
        self.damage: Damage | None = None

    def payloads(self) -> Iterator[tuple[int, bytes]]:
        """Yield ``(start byte, payload)`` of every complete record after ``offset``, advancing ``offset`` past each."""
        if self.damage is not None:
            return
        try:
            with self.path.open("rb") as fh:
                if self.offset == 0 and not self._read_header(fh):
                    return
                yield from self._chunks(fh)
        except FileNotFoundError as exc:
            raise ForensicsError(f"W&B run file {self.path} does not exist") from exc
        except OSError as exc:
            raise ForensicsError(f"W&B run file {self.path} could not be read: {exc}") from exc

    def records(self) -> Iterator[tuple[int, Any]]:
        """Yield ``(start byte, record)`` of every complete record after ``offset`` (``wandb_internal_pb2.Record``)."""
        record_type = record_class()
        for start, payload in self.payloads():
            rec = record_type()
            try:
                rec.ParseFromString(payload)
            except Exception as exc:  # protobuf's DecodeError; the framing's checksum passed, so this is damage
                self.offset = start
                self.damage = Damage(start, f"record does not decode as a W&B Record: {exc}")
                return
            yield start, rec

    def _read_header(self, fh) -> bool:
        head = fh.read(len(FILE_HEADER))
        if len(head) < len(FILE_HEADER) and FILE_HEADER.startswith(head):
            self.tail_bytes = len(head)  # the writer has not finished the header yet
            return False
        if head[:4] != HEADER_IDENT:
            raise ForensicsError(
                f"W&B run file {self.path} is not a .wandb file: it starts with {head[:8]!r}, expected {FILE_HEADER!r}"
            )
        if head != FILE_HEADER:
            magic, version = struct.unpack("<HB", head[4:7].ljust(3, b"\0"))
            raise ForensicsError(
                f"W&B run file {self.path}: unsupported header (magic {magic:#06x}, version {version}); "
                f"expected magic {HEADER_MAGIC:#06x}, version {HEADER_VERSION}"
            )
        self.offset = len(FILE_HEADER)
        return True

    def _chunks(self, fh) -> Iterator[tuple[int, bytes]]:
        """Walk chunks block by block from ``offset``; a multi-chunk record is committed only once complete."""
        pos = self.offset  # next chunk to look at
        parts: list[bytes] = []
        record_start = pos
        fh.seek(pos)
        window = b""
        window_start = pos
        while True:
            if pos - window_start >= len(window):
                # Read up to the end of a block boundary so that each window holds whole blocks after the first.
                want = _WINDOW_BLOCKS * BLOCK_SIZE - (pos % BLOCK_SIZE)
                window = fh.read(want)
                window_start = pos
                if not window:
                    break
            at = pos - window_start
            block_left = BLOCK_SIZE - pos % BLOCK_SIZE
            avail = len(window) - at  # bytes present from pos (the window ends on a block boundary or at EOF)
            if block_left < CHUNK_HEADER_SIZE:
                if avail < block_left:
                    break  # the padding itself is not all there yet
                pos += block_left
                continue
            if avail < CHUNK_HEADER_SIZE:
                break
            crc, length, kind = _CHUNK_HEADER.unpack_from(window, at)
            if kind == 0 and length == 0 and crc == 0 and not window[at:].strip(b"\0") and self._zeros_to_eof(fh):
                break  # a preallocated or not-yet-written zero region: nothing more to read yet
            if kind < FULL or kind > LAST:
                self.damage = Damage(pos, f"unknown chunk type {kind}")
                break
            if length > block_left - CHUNK_HEADER_SIZE:
                self.damage = Damage(pos, f"chunk length {length} runs past its {BLOCK_SIZE}-byte block")
                break
            end = at + CHUNK_HEADER_SIZE + length
            if end > len(window):
                break  # the rest of this chunk has not been written yet
            data = window[at + CHUNK_HEADER_SIZE : end]
            if zlib.crc32(data, _TYPE_CRC[kind]) != crc:
                self.damage = Damage(pos, "checksum mismatch")
                break
            pos += CHUNK_HEADER_SIZE + length
            if kind == FULL:
                if parts:
                    self.damage = Damage(pos - CHUNK_HEADER_SIZE - length, "a FULL chunk inside a split record")
                    break
                self.offset = pos
                yield pos - CHUNK_HEADER_SIZE - length, data
            elif kind == FIRST:
                if parts:
                    self.damage = Damage(pos - CHUNK_HEADER_SIZE - length, "a FIRST chunk inside a split record")
                    break
                parts = [data]
                record_start = pos - CHUNK_HEADER_SIZE - length
            else:
                if not parts:
                    self.damage = Damage(pos - CHUNK_HEADER_SIZE - length, "a continuation chunk without a FIRST")
                    break
                parts.append(data)
                if kind == LAST:
                    self.offset = pos
                    payload = b"".join(parts)
                    parts = []
                    yield record_start, payload
        fh.seek(0, 2)
        self.tail_bytes = max(0, fh.tell() - self.offset) if self.damage is None else 0

    @staticmethod
    def _zeros_to_eof(fh) -> bool:
        here = fh.tell()
        rest = fh.read()
        fh.seek(here)
        return not rest.strip(b"\0")


def record_class():
    """``wandb_internal_pb2.Record`` (the wandb extra): imported on first use so the core does not need wandb."""
    pb = require("wandb.proto.wandb_internal_pb2", "wandb", "Reading W&B run files")
    return pb.Record


# --- decoding the payloads that matter ------------------------------------------------------------------------------
def item_key(item) -> str:
    """The flat name of a history/summary/config item: nested keys joined with ``/`` as W&B's UI shows them."""
    nested = item.nested_key
    return nested[0] if len(nested) == 1 else "/".join(nested) if nested else item.key


def item_value(item) -> Any:
    """The Python value of an item: ``value_json`` (``NaN``/``Infinity`` included), else the typed oneof."""
    if item.value_json:
        return json.loads(item.value_json)
    which = item.WhichOneof("value")
    if which is None or which == "none":
        return None
    if which == "json":
        return json.loads(item.json)
    return getattr(item, which)


def flatten_numeric(key: str, value: Any, out: dict[str, float]) -> int:
    """Put the numeric leaves of ``value`` into ``out`` under ``key`` (dicts flattened to ``key/sub``).

    Returns how many values were dropped as non-numeric (text, lists, media such as images and histograms, which
    W&B logs as dicts with a ``_type``). ``None`` is a missing value, neither kept nor counted.
    """
    if isinstance(value, bool):
        out[key] = 1.0 if value else 0.0
        return 0
    if isinstance(value, (int, float)):
        try:
            out[key] = float(value)
        except OverflowError:  # an int beyond float range
            out[key] = math.copysign(math.inf, value)
        return 0
    if value is None:
        return 0
    if isinstance(value, dict) and "_type" not in value:
        dropped = 0
        for sub, v in value.items():
            dropped += flatten_numeric(f"{key}/{sub}", v, out)
        return dropped
    return 1


def is_internal(key: str) -> bool:
    """W&B's own bookkeeping keys (``_runtime``, ``_wandb/...``): not metrics."""
    return key.startswith("_")


def rows_table(rows: list[dict[str, float]]) -> pa.Table:
    """History rows -> an Arrow table with one float64 column per key (first-seen order), null where a row lacks it.

    Null (not written) and NaN (a logged NaN) stay distinct, which the shared reader needs to count NaN honestly.
    """
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    return pa.table({key: pa.array([row.get(key) for row in rows], type=pa.float64()) for key in keys})
