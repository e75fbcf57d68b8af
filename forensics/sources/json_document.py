"""One JSON document holding a list of log records: a top-level array, or HF Trainer's ``trainer_state.json``
(its ``log_history``: one record per logging step, train and eval records interleaved, each with ``step``).

A JSON document cannot be appended to, so, as for Parquet, a live read re-reads the file when it changed and
passes on only the records past the steps already read.
"""

from __future__ import annotations

import json
from pathlib import Path

from forensics.errors import ForensicsError
from forensics.sources.jsonl import records_from_objects
from forensics.sources.reader.base import MetricsReader
from forensics.sources.reader.records import Records

#: Keys under which a document keeps its records, tried in order (``log_history``: HF Trainer).
RECORD_KEYS = ("log_history", "history", "records", "logs")


def document_records(data: object, source: str) -> list[dict]:
    """The list of record objects in a parsed JSON document."""
    if isinstance(data, dict):
        for key in RECORD_KEYS:
            if isinstance(data.get(key), list):
                data = data[key]
                break
    if not isinstance(data, list):
        raise ForensicsError(
            f"metrics file {source}: a JSON document must be a list of records or hold one "
            f"under {', '.join(RECORD_KEYS)}"
        )
    return [r for r in data if isinstance(r, dict)]


class JsonDocumentReader(MetricsReader):
    """Reads the records of one JSON document (see the module docstring)."""

    format_name = "json"
    _where_word = "record"

    def _reset_position(self) -> None:
        self._stamp: tuple[float, int] | None = None
        self._seen = 0

    def _read_records(self) -> Records | None:
        path = Path(self.source)
        try:
            st = path.stat()
            stamp = (st.st_mtime, st.st_size)
            if stamp == self._stamp:
                return None
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ForensicsError(f"metrics file {path} could not be read: {exc}") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            if self.finished:
                raise ForensicsError(f"metrics file {path} is not valid JSON ({exc.msg} at line {exc.lineno})") from exc
            return None  # a writer is replacing the file: read it once it is whole
        self._stamp = stamp
        if isinstance(data, dict):  # the document's own scalar fields (trainer_state.json: global_step, logging_steps)
            self.report.metadata["document"] = {k: v for k, v in data.items() if not isinstance(v, (list, dict))}
            self.report.metadata["records_key"] = next((k for k in RECORD_KEYS if isinstance(data.get(k), list)), None)
        records = document_records(data, str(path))
        new = records[self._seen :]
        self._seen = len(records)
        if not new:
            return None
        # the JSONL reader's own conversion: absent keys null, logged NaN kept, "NaN"/"Infinity" text read as values
        return records_from_objects(new, list(range(self._seen - len(new) + 1, self._seen + 1)), self)
