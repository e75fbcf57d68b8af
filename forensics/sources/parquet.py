"""A metrics table already in canonical form (``metrics.parquet`` of a case folder, or ``forensics ingest`` output).

Parquet cannot be appended to in place, so a live read re-reads the file when it changed and passes on only the
steps past those already read (a writer that rewrites the file keeps its old rows). In a Parquet file written from
pandas a NaN is stored as null, so a logged NaN and a cell never written look alike here: both count as missing.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from forensics.errors import ForensicsError
from forensics.schema import STEP
from forensics.schema.tables import parquet_schema
from forensics.sources.reader.base import MetricsReader
from forensics.sources.reader.records import STEP_KEYS, Records


class ParquetReader(MetricsReader):
    """Reads a metrics table from Parquet (a file, or a folder of parts)."""

    format_name = "parquet"
    _where_word = "row"

    def _reset_position(self) -> None:
        self._stamp: tuple[float, int] | None = None
        self._max_step: int | None = None

    def _read_records(self) -> Records | None:
        path = Path(self.source)
        try:
            st = path.stat()
        except OSError as exc:
            raise ForensicsError(f"metrics file {path} could not be read: {exc.strerror or exc}") from exc
        stamp = (st.st_mtime, st.st_size)
        if stamp == self._stamp:
            return None
        parquet_schema(path, "metrics")  # the footer first: a damaged file is one line naming what was expected
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise ForensicsError(
                f"metrics file {path} could not be read as Parquet ({str(exc).splitlines()[0]}); "
                "expected a Parquet table of metrics"
            ) from exc
        self._stamp = stamp
        step_name = self.step_key or next((k for k in STEP_KEYS if k in table.column_names), STEP)
        if step_name not in table.column_names:
            raise ForensicsError(
                f"metrics file {path}: missing column '{step_name}' (expected a step column beside "
                "the metric columns); "
                f"it has {', '.join(table.column_names[:12])}"
            )
        if self._max_step is not None:
            table = table.filter(pc.greater(table[step_name], self._max_step))
        if table.num_rows:
            self._max_step = int(pc.max(table[step_name]).as_py())
        return Records(table)
