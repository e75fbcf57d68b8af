"""The reader protocol: what every metrics source implements, and what callers may rely on.

A reader turns one source (a file, a folder, a run) into the metrics table of docs/concepts.md. Subclasses only say how
to get the records written since their last call (:meth:`MetricsReader._read_records`); turning records into rows
happens once, in :class:`~forensics.sources.reader.rows.MetricsAccumulator`.

Live use: a reader remembers where it stopped (a byte offset per file, or the last record), so
:meth:`MetricsReader.read_new` returns only the rows that changed since the previous call; an incomplete last record
(a half-written line, a truncated event) is left in place and read once complete.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError
from forensics.sources.reader.records import STEP_KEYS, ReaderReport, Records, damage_line
from forensics.sources.reader.rows import MetricsAccumulator


class MetricsReader:
    """Base class of every reader. Constructing one reads nothing; :meth:`read_new` reads what is there.

    ``keys``: metric names (or ``fnmatch`` globs) to keep, default all. ``step_key``: the column holding the step,
    default the first of :data:`~forensics.sources.reader.records.STEP_KEYS` present. ``strict``: a malformed record
    raises :class:`ForensicsError` instead of being skipped and counted.
    """

    #: Short name of the format, for messages and summaries.
    format_name = "metrics"
    #: How ``where`` values read in messages ("line", "byte", "record").
    _where_word = "line"
    #: The step column's name when the format itself says where the step is (TensorBoard, text logs); the
    #: user's ``step_key`` then means something format-specific or nothing.
    _records_step_key: str | None = None

    def __init__(
        self,
        source: str | Path,
        *,
        keys: Sequence[str] | None = None,
        step_key: str | None = None,
        strict: bool = False,
    ) -> None:
        self.source = str(source)
        self.keys = list(keys) if keys else None
        self.step_key = step_key
        self.strict = strict
        #: The step offset this source's configuration gives (run.toml ``metrics`` table), None when not given.
        self.given_offset: int | None = None
        #: The rank whose own log this source is (run.toml ``ranks``): its metrics become ``NAME/rank{rank}``.
        self.rank: int | None = None
        self._finished = False
        self._reset()

    @property
    def finished(self) -> bool:
        """Set by callers reading a finished run: an unterminated last line is then read as complete."""
        return self._finished

    @finished.setter
    def finished(self, value: bool) -> None:
        self._finished = bool(value)
        self._rows.finished = self._finished

    # --- public -------------------------------------------------------------------------------------------------
    def read_new(self) -> pd.DataFrame:
        """Rows of the steps written since the last call (all of them on the first call), in step order.

        A step written again (a resumed run, or a second record for the step) comes back as its whole current row:
        per metric the last write wins, and a cell not written again keeps its earlier value.
        """
        batches = self._read_records()
        if batches is None:
            batches = []
        elif isinstance(batches, Records):
            batches = [batches]
        batches = [by_rank(rec if self.rank is None else with_rank(rec, self.rank), self.step_key) for rec in batches]
        touched = [steps for rec in batches if len(rec) for steps in [self._rows.ingest(rec)] if len(steps)]
        if not touched:
            return self._rows.table().iloc[0:0].copy()
        steps = touched[0] if len(touched) == 1 else np.unique(np.concatenate(touched))
        return self._rows.rows(steps)

    def read_all(self) -> pd.DataFrame:
        """A fresh full read from the start: the whole table (the report starts over too)."""
        self._reset()
        return self.read_new()

    @property
    def step_key_used(self) -> str | None:
        """The key the step was taken from (the format's own, the one resolved from the records, or the one given)."""
        return self._rows.format_step_key or self._rows._resolved_step_key or self.step_key

    @property
    def table(self) -> pd.DataFrame:
        """Everything read so far: the canonical metrics table (step unique and sorted, null = not written)."""
        return self._rows.table().copy(deep=False)

    # --- hooks for subclasses ------------------------------------------------------------------------------------
    def _read_records(self) -> Records | list[Records] | None:
        """Return the complete records written since the last call (in write order) and advance past them."""
        raise NotImplementedError

    def _reset_position(self) -> None:
        """Forget where reading stopped (offsets, open files), so the next read starts from the beginning."""

    def _malformed(self, where: int, reason: str) -> None:
        """Count a record that cannot be read; with ``strict`` it is bad input instead."""
        if self.strict:
            raise ForensicsError(f"{self.source}: {self._where_word} {where}: {reason} (strict mode)")
        self.report.add_malformed(where, reason)

    def _publish_damage(self) -> None:
        """Report the damaged regions found so far (``self._damages``): ``report.damaged`` and one warning line that
        replaces the previous one; with ``strict`` damage is bad input."""
        self.report.damaged = list(self._damages)
        old = getattr(self, "_damage_warning", None)
        if old in self.report.warnings:
            self.report.warnings.remove(old)
        self._damage_warning = damage_line(self._damages)
        if self._damage_warning is not None:
            if self.strict:
                raise ForensicsError(f"{self.source}: {self._damage_warning} (strict mode)")
            self.report.warn(self._damage_warning)

    # --- state --------------------------------------------------------------------------------------------------
    def _reset(self) -> None:
        self.report = ReaderReport(source=self.source, format=self.format_name)
        self._rows = MetricsAccumulator(
            self.report,
            self._malformed,
            keys=self.keys,
            step_key=self.step_key,
            format_step_key=self._records_step_key,
            finished=self._finished,
            strict=self.strict,
            where_word=self._where_word,
        )
        self._reset_position()


#: The column that tags a record with the rank that wrote it (docs/concepts.md).
RANK_KEY = "rank"


def with_rank(rec: Records, rank: int) -> Records:
    """Records of one rank's own log (run.toml ``ranks``) with their ``rank`` column set to ``rank``, so that
    :func:`by_rank` names their metrics as it names a ``rank`` column's."""
    import pyarrow as pa

    if isinstance(rec.table, pa.Table):
        table = rec.table
        if RANK_KEY in table.column_names:
            table = table.drop_columns([RANK_KEY])
        return Records(table.append_column(RANK_KEY, pa.array(np.full(table.num_rows, rank, np.int64))), rec.where)
    return Records(rec.table.assign(**{RANK_KEY: np.int64(rank)}), rec.where)


def by_rank(rec: Records, step_key: str | None = None) -> Records:
    """Records with a ``rank`` column (each rank logging its own rows into one source) as one column per metric and
    rank: ``loss`` of a row of rank 1 becomes ``loss/rank1`` (what :mod:`forensics.detect.rules.rank_drift` reads), so
    that the rows of one step from several ranks merge into one metrics row instead of overwriting each other. The
    step and time columns stay as they are; records without a ``rank`` column are returned unchanged."""
    import pyarrow as pa

    names = rec.table.column_names if isinstance(rec.table, pa.Table) else list(rec.table.columns)
    if RANK_KEY not in names:
        return rec
    if isinstance(rec.table, pa.Table):
        table = rec.table
    else:  # a plain float column has no null: its NaN cells are logged NaN, kept as values
        df = rec.table
        table = pa.table(
            {
                str(c): pa.array(df[c], from_pandas=not (df[c].dtype.kind == "f" and isinstance(df[c].dtype, np.dtype)))
                for c in df.columns
            }
        )
    ranks = table.column(RANK_KEY)
    if not (pa.types.is_integer(ranks.type) or pa.types.is_floating(ranks.type)):
        return rec
    rank = np.asarray(ranks.to_numpy(zero_copy_only=False), dtype=np.float64)
    keep = set(STEP_KEYS) | {"_timestamp", "timestamp", "time", "epoch"} | ({step_key} if step_key else set())
    known = np.unique(rank[np.isfinite(rank)]).astype(np.int64)
    columns: dict[str, pa.Array] = {}
    for name in table.column_names:
        if name == RANK_KEY:
            continue
        col = table.column(name).combine_chunks()
        if name in keep:
            columns[name] = col
            continue
        for r in known:
            columns[f"{name}/rank{r}"] = pa.array(
                col.to_pylist(), type=col.type, mask=~(rank == r) | np.asarray(col.is_null())
            )
    return Records(pa.table(columns), rec.where)
