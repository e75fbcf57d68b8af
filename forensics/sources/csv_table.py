"""CSV metrics, including the CSV that W&B exports from a chart.

A W&B chart export has a ``Step`` column and, per run, ``<run> - <key>`` plus ``<run> - <key>__MIN`` and
``__MAX`` (the band of a sampled or grouped line). The key is what the run logged, so ``<run> - `` is removed when
one run is in the file (kept when several runs share a key), and the MIN/MAX copies are dropped unless
``include_minmax``. Rows are parsed by ``pyarrow.csv``; a row with the wrong number of fields is reported with its
line number. An empty cell is "not written"; ``nan``/``inf`` are values.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv

from forensics.errors import ForensicsError
from forensics.sources.reader.base import MetricsReader
from forensics.sources.reader.records import Records
from forensics.sources.reader.tail import TailedFile

_WANDB_COLUMN = re.compile(r"^(?P<run>.+?) - (?P<key>.+?)(?P<band>__MIN|__MAX)?$")


def wandb_export_names(header: Sequence[str], include_minmax: bool = False) -> dict[str, str | None]:
    """Header name -> metric name (None: dropped) for a W&B chart export; other names map to themselves."""
    parsed = {h: _WANDB_COLUMN.match(h) for h in header}
    runs = {m["run"] for m in parsed.values() if m}
    keys_per_run: dict[str, set[str]] = {}
    for m in parsed.values():
        if m:
            keys_per_run.setdefault(m["key"], set()).add(m["run"])
    out: dict[str, str | None] = {}
    for h, m in parsed.items():
        if not m:
            out[h] = h
            continue
        if m["band"] and not include_minmax:
            out[h] = None
            continue
        name = m["key"] if len(runs) == 1 or len(keys_per_run[m["key"]]) == 1 else f"{m['run']} - {m['key']}"
        out[h] = name + (m["band"] or "")
    return out


class CsvReader(MetricsReader):
    """Reads a CSV (or TSV) file with a header line, live or finished."""

    format_name = "csv"

    def __init__(self, source: str | Path, *, include_minmax: bool = False, **opts) -> None:
        self.include_minmax = include_minmax
        self.delimiter = "\t" if str(source).lower().endswith(".tsv") else ","
        super().__init__(source, **opts)

    def _reset_position(self) -> None:
        self._file = TailedFile(Path(self.source))
        self._header: list[str] | None = None
        self._names: list[str] = []

    def _read_records(self) -> list[Records]:
        if self._file.check_restarted():
            self.report.warn("the file was truncated or replaced; read again from the start")
            self._header = None
        out = []
        for block, first, _ in self._file.chunks():
            if self._header is None:
                nl = block.index(b"\n") + 1
                self._set_header(block[:nl])
                block, first = block[nl:], first + 1
            if block.strip():
                out.append(self._parse(block, first))
        if self.finished:
            rest = self._file.remainder()
            if rest.strip():
                self._file.consume_remainder(len(rest))
                if self._header is None:
                    self._set_header(rest)
                else:
                    out.append(self._parse(rest + b"\n", self._file.lines))
        return out

    def _set_header(self, line: bytes) -> None:
        text = line.decode("utf-8-sig", errors="replace")
        header = next(csv.reader(io.StringIO(text), delimiter=self.delimiter), [])
        if not header:
            raise ForensicsError(f"{self.source}: the first line is empty; expected a CSV header")
        self._header = header
        names = wandb_export_names(header, self.include_minmax)
        # Dropped columns keep a placeholder name so that the row still has the header's field count.
        self._names = [names[h] if names[h] is not None else f"\0drop{i}" for i, h in enumerate(header)]
        self._keep = [n for n in self._names if not n.startswith("\0drop")]

    def _parse(self, block: bytes, first_line: int) -> Records:
        try:
            block.decode("utf-8")
        except UnicodeDecodeError:
            # pyarrow decodes a malformed row's text for the row handler and, on bytes that are not UTF-8, prints the
            # decoding error's traceback past any handler; as replacement characters the row stays a data quirk
            block = block.decode("utf-8", errors="replace").encode("utf-8")
        bad: list[tuple[int, str]] = []
        kept_lines: list[int] = []

        def on_bad_row(row: pa_csv.InvalidRow) -> str:
            number = first_line + (row.number - 1 if row.number is not None else 0)
            bad.append((number, f"expected {row.expected_columns} fields, got {row.actual_columns}"))
            return "skip"

        try:
            table = pa_csv.read_csv(
                io.BytesIO(block),
                read_options=pa_csv.ReadOptions(column_names=self._names, use_threads=False),
                parse_options=pa_csv.ParseOptions(delimiter=self.delimiter, invalid_row_handler=on_bad_row),
                convert_options=pa_csv.ConvertOptions(
                    null_values=[""],
                    strings_can_be_null=True,
                    include_columns=self._keep,
                ),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ForensicsError(
                f"{self.source}: could not be parsed as CSV ({str(exc).splitlines()[0]}); expected "
                "comma-separated metrics under one header row"
            ) from exc
        for where, reason in bad:
            self._malformed(where, reason)
        if bad:
            bad_lines = {w for w, _ in bad}
            kept_lines = [
                first_line + i
                for i, line in enumerate(block.split(b"\n")[:-1])
                if line.strip() and first_line + i not in bad_lines
            ]
            where = np.asarray(kept_lines, dtype=np.int64)
        else:
            n = block.count(b"\n")
            where = np.arange(first_line, first_line + n, dtype=np.int64)
            if len(where) != table.num_rows:
                where = np.asarray(
                    [first_line + i for i, line in enumerate(block.split(b"\n")[:-1]) if line.strip()], dtype=np.int64
                )
        return Records(table, where)
