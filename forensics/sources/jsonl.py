"""JSONL metrics: one JSON object per line, as most training scripts write them (``json.dumps(record)``).

Speed matters (a long run is millions of lines), so blocks of lines are parsed by ``pyarrow.json`` (multi-threaded
C++, NaN/Infinity accepted as Python's ``json`` writes them). A block that pyarrow refuses (one bad line, a key whose
type changes) is split into small blocks, and only the small blocks that still fail are parsed line by line with
Python's ``json``, so a bad line costs little and is reported with its line number. Nested objects become ``a/b``
keys (in the base reader). A last line without a newline is consumed only when it is a complete JSON object: no
proper prefix of a JSON object is itself one, so a half-written line is never mistaken for a whole one.

A finished file (up to :data:`WHOLE_READ_MAX_BYTES`) is first given to pyarrow whole, by path: pyarrow then reads it
itself, with no copy of its bytes through Python and no line count, which made the block path 1.7x slower than
``read_json`` plus a Parquet write for ``forensics ingest``. Only if pyarrow refuses the file does it take the
block path above; line numbers for messages are counted only when a message needs one.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from forensics.sources.reader.base import MetricsReader
from forensics.sources.reader.records import Records
from forensics.sources.reader.tail import LazyLineNumbers, TailedFile, line_numbers

#: Lines per small block when a big block fails and is retried in pieces.
_RETRY_LINES = 1024
#: A finished file up to this size is parsed by pyarrow in one call (as fast as ``pyarrow.json.read_json``, with
#: about its peak memory: 1.2x the file's size); a larger one block by block, so that memory stays bounded.
WHOLE_READ_MAX_BYTES = 1 << 30


class JsonlReader(MetricsReader):
    """Reads a JSONL file, live or finished; see the module docstring for how lines are parsed."""

    format_name = "jsonl"

    def _reset_position(self) -> None:
        self._file = TailedFile(Path(self.source))

    def _read_records(self) -> list[Records]:
        if self._file.check_restarted():
            self.report.warn("the file was truncated or replaced; read again from the start")
        if self.finished and self._file.offset == 0:
            whole = self._read_whole()
            if whole is not None:
                return whole
        out: list[Records] = []
        for block, first, n_lines in self._file.chunks():
            out += self._parse_block(block, first, n_lines)
        rest = self._file.remainder()
        if rest.strip():
            rec = self._parse_last_line(rest)
            if rec is not None:
                out.append(rec)
        return _concat(out)

    def _read_whole(self) -> list[Records] | None:
        """A finished file read by pyarrow in one call, as ``pyarrow.json.read_json(path)`` reads it: no copy of its
        bytes in Python, no line count. None (read it block by block instead, which finds and reports every bad
        line) when pyarrow refuses any of it, or the file changed while it was read."""
        path = Path(self.source)
        try:
            before = path.stat()
            if before.st_size == 0 or before.st_size > WHOLE_READ_MAX_BYTES:
                return None
            table = pa_json.read_json(str(path))
            after = path.stat()
        except (OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if (after.st_size, after.st_mtime_ns, after.st_ino) != (before.st_size, before.st_mtime_ns, before.st_ino):
            return None
        self._file.consume_to(after.st_size)
        return [Records(table, LazyLineNumbers(path, after.st_size, table.num_rows))]

    def _parse_last_line(self, rest: bytes) -> Records | None:
        """An unterminated last line: consumed when complete (a whole object), or when the file is finished."""
        line_no = self._file.lines + 1
        try:
            obj = json.loads(rest)
        except ValueError:
            if not self.finished:
                return None
            self._file.consume_remainder(len(rest))
            self._malformed(line_no, "incomplete last line (no newline, not valid JSON)")
            return None
        self._file.consume_remainder(len(rest))
        if not isinstance(obj, dict):
            self._malformed(line_no, f"not a JSON object ({type(obj).__name__})")
            return None
        return records_from_objects([obj], [line_no], self)

    def _parse_block(self, block: bytes, first_line: int, n_lines: int) -> list[Records]:
        try:
            table = pa_json.read_json(io.BytesIO(block))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return self._parse_in_pieces(block, first_line)
        if table.num_rows == n_lines:
            where = np.arange(first_line, first_line + n_lines, dtype=np.int64)
        else:
            where = line_numbers(block, first_line)
        return [Records(table, where)]

    def _parse_in_pieces(self, block: bytes, first_line: int) -> list[Records]:
        lines = block.split(b"\n")[:-1]
        out: list[Records] = []
        for start in range(0, len(lines), _RETRY_LINES):
            piece = lines[start : start + _RETRY_LINES]
            data = b"\n".join(piece) + b"\n"
            first = first_line + start
            if len(lines) > _RETRY_LINES:
                try:
                    table = pa_json.read_json(io.BytesIO(data))
                    out.append(Records(table, line_numbers(data, first)))
                    continue
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    pass
            objs, where = [], []
            for i, line in enumerate(piece):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as exc:
                    self._malformed(first + i, f"not valid JSON ({str(exc).split(':')[0]})")
                    continue
                if not isinstance(obj, dict):
                    self._malformed(first + i, f"not a JSON object ({type(obj).__name__})")
                    continue
                objs.append(obj)
                where.append(first + i)
            if objs:
                out.append(records_from_objects(objs, where, self))
        return out


def _flatten(obj: dict, prefix: str = "", out: dict | None = None) -> dict:
    out = {} if out is None else out
    for k, v in obj.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            _flatten(v, name + "/", out)
        else:
            out[name] = v
    return out


def records_from_objects(objs: list[dict], where: list[int], reader: MetricsReader) -> Records:
    """Objects parsed one by one -> a table; a key with text values in some lines keeps its numbers."""
    flat = [_flatten(o) for o in objs]
    keys: dict[str, None] = {}
    for f in flat:
        keys.update(dict.fromkeys(f))
    columns = {}
    for k in keys:
        raw = [f.get(k) for f in flat]
        try:
            columns[k] = pa.array(raw)
            if pa.types.is_string(columns[k].type) or pa.types.is_integer(columns[k].type):
                continue
            if not (
                pa.types.is_floating(columns[k].type)
                or pa.types.is_boolean(columns[k].type)
                or pa.types.is_null(columns[k].type)
            ):
                raise pa.ArrowInvalid("not a scalar")
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            # text and numbers mixed: as text, which the row accumulator (reader/rows.py) parses cell by cell (a
            # cell that is not a number is missing, counted with its line)
            columns[k] = pa.array(
                [None if v is None else (repr(float(v)) if isinstance(v, (bool, int, float)) else str(v)) for v in raw],
                pa.string(),
            )
    return Records(pa.table(columns), np.asarray(where, dtype=np.int64))


def _concat(records: list[Records]) -> list[Records]:
    """One table when the blocks' schemas combine (fewer merges downstream), else the blocks as they are."""
    if len(records) < 2:
        return records
    try:
        table = pa.concat_tables([r.table for r in records], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return records
    where = np.concatenate([r.where for r in records])
    return [Records(table, where)]
