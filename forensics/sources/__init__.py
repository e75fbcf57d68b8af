"""The sources stage: readers that turn logs (W&B, JSONL, CSV, TensorBoard, text) into the metrics table.

The entry point for every caller (CLI, audit, dashboard) is :func:`read_metrics` for a finished run and
:class:`~forensics.sources.live.LiveMetrics` for a live one. One reader per source (:func:`open_reader` picks it);
the readers share their behaviour through :class:`~forensics.sources.base.MetricsReader`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from forensics.schema import STEP, metric_columns
from forensics.sources.base import MetricsReader, ReaderReport, Records, open_reader
from forensics.sources.merge import apply_step_offset, merge_on_step

__all__ = [
    "IngestReport", "LiveMetrics", "MetricsReader", "ReaderReport", "Records", "merge_readers", "open_reader", "open_readers",
    "read_metrics", "summarize",
]


def __getattr__(name: str):
    # LiveMetrics lives in .live, which imports this module; load it on first use.
    if name == "LiveMetrics":
        from forensics.sources.live import LiveMetrics

        return LiveMetrics
    raise AttributeError(name)


@dataclass
class IngestReport:
    """What reading found beside the rows: per-source reports, warnings for the summary (never fatal) and
    per-metric counts of the merged table (``values``, ``nan``, ``inf``, ``missing``)."""

    warnings: list[str] = field(default_factory=list)
    sources: list[ReaderReport] = field(default_factory=list)
    rows: int = 0
    step_range: tuple[int, int] | None = None
    metrics: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Per metric, the steps whose NaN cell is a logged NaN (every other NaN cell of the table was never written).
    nan_steps: dict[str, np.ndarray] = field(default_factory=dict)

    def written(self, table: pd.DataFrame, metric: str) -> np.ndarray:
        """Boolean mask of ``table``'s rows where ``metric`` was written: a value, inf, or a logged NaN."""
        values = table[metric].to_numpy(np.float64)
        mask = ~np.isnan(values)
        if metric in self.nan_steps:
            mask |= np.isnan(values) & np.isin(table[STEP].to_numpy(np.int64), self.nan_steps[metric])
        return mask

    @property
    def malformed(self) -> int:
        return sum(r.malformed for r in self.sources)

    @property
    def rewinds(self) -> list:
        return [rw for r in self.sources for rw in r.rewinds]

    def summary_lines(self) -> list[str]:
        """The summary ``forensics ingest`` prints: rows, step range, metrics with NaN/inf, rewinds, skipped lines."""
        span = f"steps {self.step_range[0]}-{self.step_range[1]}" if self.step_range else "no steps"
        lines = [f"{self.rows} rows, {span}, {len(self.metrics)} metrics from {len(self.sources)} sources"]
        for name, c in self.metrics.items():
            extra = []
            if c["nan"]:
                extra.append(f"{c['nan']} NaN")
            if c["inf"]:
                extra.append(f"{c['inf']} inf")
            if c["missing"]:
                extra.append(f"{c['missing']} missing")
            lines.append(f"  {name}: {c['values']} values" + (f" ({', '.join(extra)})" if extra else ""))
        rewinds = self.rewinds
        replaced = sum(r.rows_replaced for r in rewinds)
        lines.append(f"rewinds: {len(rewinds)}" + (f" ({replaced} rows replaced)" if rewinds else ""))
        lines.append(f"skipped (malformed) records: {self.malformed}")
        lines += [f"warning: {w}" for w in self.warnings]
        return lines


def to_arrow(table: pd.DataFrame, report: IngestReport) -> pa.Table:
    """The metrics table as Arrow with missing cells as null and logged NaN kept as NaN, so that a Parquet file
    written from it keeps the difference (pandas alone would write both as null)."""
    arrays, names = [], []
    for col in table.columns:
        values = table[col].to_numpy()
        if col == STEP:
            arrays.append(pa.array(values, type=pa.int64()))
        else:
            values = values.astype(np.float64)
            missing = ~report.written(table, col)
            arrays.append(pa.array(values, type=pa.float64(), mask=missing))
        names.append(str(col))
    return pa.Table.from_arrays(arrays, names=names)


def summarize(table: pd.DataFrame, nan_steps: dict[str, np.ndarray]) -> dict[str, dict[str, int]]:
    """Per metric of the merged table: finite values, logged NaN, inf and missing (never written) cells."""
    out = {}
    steps = table[STEP].to_numpy()
    for col in metric_columns(table):
        v = table[col].to_numpy(dtype=np.float64)
        nan = np.isnan(v)
        nan_cells = int(nan.sum())
        n_nan = int((nan & np.isin(steps, nan_steps[col])).sum()) if col in nan_steps else 0
        out[col] = {
            "values": int(np.isfinite(v).sum()),
            "nan": n_nan,
            "inf": int(np.isinf(v).sum()),
            "missing": nan_cells - n_nan,
        }
    return out


def merge_readers(readers: Sequence[MetricsReader], step_offset: int = 0,
                  keys: Sequence[str] | None = None) -> tuple[pd.DataFrame, IngestReport]:
    """Merge what the readers have read so far (in order, later wins) into the table and its report."""
    merged, merge_warnings, nan_steps = merge_on_step([(r.source, r.table, r.nan_steps) for r in readers])
    merged = apply_step_offset(merged, step_offset)
    if step_offset:
        nan_steps = {c: s - np.int64(step_offset) for c, s in nan_steps.items()}
    return merged, build_report(merged, readers, merge_warnings, nan_steps, keys)


def build_report(table: pd.DataFrame, readers: Sequence[MetricsReader], merge_warnings: list[str],
                 nan_steps: dict[str, np.ndarray], keys: Sequence[str] | None = None) -> IngestReport:
    """The :class:`IngestReport` of a merged table (shared by :func:`read_metrics` and live reading)."""
    reports = [r.report for r in readers]
    report = IngestReport(sources=reports, rows=len(table))
    if len(table):
        report.step_range = (int(table[STEP].iloc[0]), int(table[STEP].iloc[-1]))
    report.metrics = summarize(table, nan_steps)
    report.nan_steps = dict(nan_steps)
    for r in reports:
        if r.rows == 0:
            report.warnings.append(f"{r.source}: no metrics rows found")
        report.warnings += r.describe()
    report.warnings += merge_warnings
    if keys:
        import fnmatch

        cols = metric_columns(table)
        for k in keys:
            if not any(c == k or fnmatch.fnmatchcase(c, k) for c in cols):
                report.warnings.append(f"key '{k}' matched no metric")
    if len(table) and table[STEP].iloc[0] < 0:
        n_neg = int((table[STEP] < 0).sum())
        report.warnings.append(f"{n_neg} rows have a negative step after the step offset")
    return report


def open_readers(
    sources: Sequence[str | Path],
    *,
    keys: Sequence[str] | None = None,
    step_key: str | None = None,
    pattern: str | None = None,
    strict: bool = False,
    run_id: str | None = None,
) -> list[MetricsReader]:
    """One reader per source, in the order given (which is the merge order: later wins)."""
    from forensics.errors import ForensicsError

    if not sources:
        raise ForensicsError("no metrics source given")
    return [open_reader(s, keys=keys, step_key=step_key, pattern=pattern, strict=strict, run_id=run_id)
            for s in sources]


def read_metrics(
    sources: Sequence[str | Path],
    *,
    keys: Sequence[str] | None = None,
    step_key: str | None = None,
    step_offset: int = 0,
    pattern: str | None = None,
    strict: bool = False,
    run_id: str | None = None,
    progress: bool = False,
) -> tuple[pd.DataFrame, IngestReport]:
    """Read finished sources and merge them on step into the canonical metrics table (DESIGN.md).

    A later source wins a (step, metric) that several sources hold, with a warning; ``step_offset`` N makes
    metrics step = logged step - N. Bad input raises :class:`~forensics.errors.ForensicsError`; data quirks
    (NaN/inf, rewinds, malformed lines) are kept or skipped and listed in the report.
    """
    if isinstance(sources, (str, Path)):
        sources = [sources]
    readers = open_readers(sources, keys=keys, step_key=step_key, pattern=pattern, strict=strict, run_id=run_id)
    with _progress(progress, len(readers)) as advance:
        for reader in readers:
            reader.finished = True
            reader.read_all()
            advance(reader.source)
    return merge_readers(readers, step_offset, keys)


class _progress:
    """A rich progress bar on stderr over the sources (only when asked: libraries stay quiet by default)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total = enabled, total
        self._bar = None

    def __enter__(self):
        if not self.enabled:
            return lambda name: None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("reading metrics"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                             TextColumn("{task.description}"), console=Console(stderr=True), transient=True)
        self._bar.start()
        task = self._bar.add_task("", total=self.total)
        return lambda name: self._bar.advance(task) if self._bar else None

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
