"""Reading a run's metrics: one reader per source, each aligned to 0-based optimizer steps, merged on step.

The entry point for every caller (CLI, audit, dashboard) is :func:`read_metrics` for a finished run and
:class:`~forensics.sources.live.LiveMetrics` for a live one; :func:`ingest` is ``forensics ingest`` (read, merge,
write the canonical table). The merged table carries its own meaning (null = not written, NaN = logged NaN); the
:class:`IngestReport` beside it is only a report: counts, quirks and how each source was aligned (``run.sources`` of
findings.json).

Merging (:func:`merge_on_step`): sources are merged in the order given; for a (step, metric) present in several, the
later source wins, and a warning says how many cells were overridden; every other column is kept. Each table says by
itself which cells were written (null = not written), so a later source never blanks out an earlier source's value
with a gap, and a logged NaN is a value like any other.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from forensics.errors import ForensicsError
from forensics.schema import METRIC_DTYPE, STEP, SourceSpec, metric_columns, metric_values, metrics_table, written
from forensics.schema.tables import LEFT_OUT
from forensics.schema.words import counted
from forensics.sources.reader.base import MetricsReader
from forensics.sources.reader.records import ReaderReport
from forensics.sources.registry import open_reader


@dataclass
class SourceAlignment:
    """How one source's steps were aligned to optimizer steps (docs/concepts.md ``step``)."""

    source: str
    format: str
    step_key: str | None
    step_offset: int
    convention: str
    damaged: list[Any] = field(default_factory=list)
    logging_steps: int | None = None
    evidence: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "format": self.format,
            "step_key": self.step_key,
            "step_offset": self.step_offset,
            "convention": self.convention,
            "logging_steps": self.logging_steps,
            "evidence": self.evidence,
            "damaged": [self._shifted(d) for d in self.damaged],
        }

    def _shifted(self, damage: Any) -> dict[str, Any]:
        """A damaged region with its steps as metrics steps (the reader saw logged steps)."""
        out = dict(damage.to_json() if hasattr(damage, "to_json") else damage)
        if out.get("steps") and self.step_offset:
            out["steps"] = [None if s is None else int(s) - self.step_offset for s in out["steps"]]
        return out


@dataclass
class IngestReport:
    """What reading found beside the rows: per-source reports and alignments, warnings for the summary (never
    fatal) and per-metric counts of the merged table (``values``, ``nan``, ``inf``, ``missing``)."""

    warnings: list[str] = field(default_factory=list)
    sources: list[ReaderReport] = field(default_factory=list)
    alignments: list[SourceAlignment] = field(default_factory=list)
    rows: int = 0
    step_range: tuple[int, int] | None = None
    metrics: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def malformed(self) -> int:
        return sum(r.malformed for r in self.sources)

    @property
    def rewinds(self) -> list:
        return [rw for r in self.sources for rw in r.rewinds]

    def sources_json(self) -> list[dict[str, Any]]:
        """``run.sources`` of findings.json: one entry per source, in merge order."""
        return [a.to_json() for a in self.alignments]

    def summary_lines(self) -> list[str]:
        """The summary ``forensics ingest`` prints: rows, step range, metrics with NaN/inf, rewinds, skipped lines."""
        span = f"steps {self.step_range[0]}-{self.step_range[1]}" if self.step_range else "no steps"
        lines = [
            f"{counted(self.rows, 'row')}, {span}, {counted(len(self.metrics), 'metric')} from "
            f"{counted(len(self.sources), 'source')}"
        ]
        for name, c in self.metrics.items():
            extra = [f"{c[k]} {label}" for k, label in (("nan", "NaN"), ("inf", "inf"), ("missing", "missing")) if c[k]]
            lines.append(f"  {name}: {counted(c['values'], 'value')}" + (f" ({', '.join(extra)})" if extra else ""))
        for a in self.alignments:
            if a.step_offset or a.convention != "as logged":
                lines.append(f"  {a.source}: step = {a.step_key or 'step'} - {a.step_offset} ({a.convention})")
        rewinds = self.rewinds
        replaced = sum(r.rows_replaced for r in rewinds)
        lines.append(f"rewinds: {len(rewinds)}" + (f" ({replaced} rows replaced)" if rewinds else ""))
        lines.append(f"skipped (malformed) records: {self.malformed}")
        return lines


def summarize(table: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Per metric of a metrics table: finite values, logged NaN, inf and missing (never written) cells."""
    out = {}
    for col in metric_columns(table):
        if isinstance(table[col].dtype, pd.ArrowDtype) and table[col].dtype == METRIC_DTYPE:
            out[col] = _arrow_counts(table[col].array.__arrow_array__())
            continue
        v = table[col].to_numpy(dtype=np.float64, na_value=np.nan)
        w = written(table, col)
        out[col] = {
            "values": int(np.isfinite(v).sum()),
            "nan": int((np.isnan(v) & w).sum()),
            "inf": int(np.isinf(v).sum()),
            "missing": int((~w).sum()),
        }
    return out


def _arrow_counts(arr: pa.ChunkedArray | pa.Array) -> dict[str, int]:
    """:func:`summarize`'s counts of one Arrow float64 column, by Arrow's kernels (null = never written; a null
    is neither finite, NaN nor inf)."""

    def count(mask: pa.ChunkedArray | pa.Array) -> int:
        return int(pc.sum(mask).as_py() or 0)

    return {
        "values": count(pc.is_finite(arr)),
        "nan": count(pc.is_nan(arr)),
        "inf": count(pc.is_inf(arr)),
        "missing": int(arr.null_count),
    }


def open_readers(
    sources: Sequence[str | Path | SourceSpec],
    *,
    keys: Sequence[str] | None = None,
    step_key: str | None = None,
    pattern: str | None = None,
    strict: bool = False,
    run_id: str | None = None,
) -> list[MetricsReader]:
    """One reader per source, in the order given (which is the merge order: later wins). A
    :class:`~forensics.schema.SourceSpec` brings its own step key and offset (run.toml ``metrics`` tables)."""
    if not sources:
        raise ForensicsError("no metrics source given")
    readers = []
    for s in sources:
        spec = s if isinstance(s, SourceSpec) else SourceSpec(str(s))
        reader = open_reader(
            spec.path, keys=keys, step_key=spec.step_key or step_key, pattern=pattern, strict=strict, run_id=run_id
        )
        reader.given_offset = spec.step_offset
        reader.given_step_key = spec.step_key or step_key
        reader.rank = spec.rank
        readers.append(reader)
    return readers


def alignment_of(reader: MetricsReader, step_offset: int | None) -> SourceAlignment:
    """How ``reader``'s steps map to optimizer steps (docs/concepts.md ``step``): an explicit ``step_offset``
    or step key replaces what the source says of itself (:mod:`forensics.sources.step_conventions`: HF Trainer's
    trainer_state.json, TensorBoard scalars and W&B runs count from 1); else the steps are taken as logged."""
    from forensics.sources.step_conventions import recognise

    damaged = list(getattr(reader.report, "damaged", []))
    own = getattr(reader, "given_offset", None)
    step_offset = own if own is not None else step_offset
    if step_offset is not None or getattr(reader, "given_step_key", None):
        how = "given"
        return SourceAlignment(
            reader.source, reader.format_name, reader.step_key_used, int(step_offset or 0), how, damaged
        )
    conv = recognise(reader)
    if conv is None:
        return SourceAlignment(reader.source, reader.format_name, reader.step_key_used, 0, "as logged", damaged)
    return SourceAlignment(
        reader.source,
        reader.format_name,
        conv.step_key,
        conv.step_offset,
        conv.convention,
        damaged,
        conv.logging_steps,
        conv.evidence,
    )


def _realign(reader: MetricsReader, alignment: SourceAlignment) -> MetricsReader:
    """The reader again with the recognised step key, when it differs from the one it used (HF's W&B
    ``train/global_step`` instead of ``_step``)."""
    if alignment.step_key is None or alignment.step_key == reader.step_key_used or alignment.convention == "given":
        return reader
    again = open_reader(reader.source, keys=reader.keys, step_key=alignment.step_key, strict=reader.strict)
    again.given_offset = getattr(reader, "given_offset", None)
    again.finished = reader.finished
    again.read_all()
    return again


def merge_on_step(tables: Sequence[tuple[str, pd.DataFrame]]) -> tuple[pd.DataFrame, list[str]]:
    """Merge ``(source name, metrics table)`` in order (later wins); return the table and one warning per pair of
    sources that hold the same metric at the same steps."""
    tables = [t for t in tables if t[1] is not None]
    if not tables:
        return metrics_table(np.array([], dtype=np.int64), {}), []
    if len(tables) == 1:
        return tables[0][1], []
    steps = np.unique(np.concatenate([t[STEP].to_numpy(dtype=np.int64) for _, t in tables]))
    values: dict[str, np.ndarray] = {}
    has: dict[str, np.ndarray] = {}
    owner: dict[str, str] = {}
    overlaps: dict[tuple[str, str], list[tuple[str, int, int]]] = {}
    for name, table in tables:
        pos = np.searchsorted(steps, table[STEP].to_numpy(dtype=np.int64))
        for col in table.columns:
            if col == STEP:
                continue
            v = metric_values(table, col)
            w = written(table, col)
            if col not in values:
                values[col] = np.full(len(steps), np.nan)
                has[col] = np.zeros(len(steps), bool)
                owner[col] = name
            both = w & has[col][pos]
            n_both = int(both.sum())
            if n_both:
                old, new = values[col][pos][both], v[both]
                differ = int((~((old == new) | (np.isnan(old) & np.isnan(new)))).sum())
                overlaps.setdefault((owner[col], name), []).append((col, n_both, differ))
            values[col][pos[w]] = v[w]
            has[col][pos[w]] = True
            owner[col] = name
    merged = metrics_table(steps, {c: (values[c], has[c]) for c in values})
    return merged, _overlap_warnings(overlaps)


def _overlap_warnings(overlaps: dict[tuple[str, str], list[tuple[str, int, int]]]) -> list[str]:
    """One line per pair of sources: which metrics both hold at the same steps, and how many values differ."""
    out = []
    for (earlier, later), cols in overlaps.items():
        shown = ", ".join(f"'{c}' ({n} steps, {d} differ)" for c, n, d in cols[:6])
        more = f" and {len(cols) - 6} more" if len(cols) > 6 else ""
        out.append(f"{earlier} and {later} both hold {shown}{more}; {later}'s values are kept")
    return out


def merge_readers(
    readers: list[MetricsReader], step_offset: int | None = None, keys: Sequence[str] | None = None
) -> tuple[pd.DataFrame, IngestReport]:
    """Align what each reader has read so far and merge them (in order, later wins) into the table and its report.

    A reader whose source names another step key is replaced in ``readers`` by one reading that key (once: a live
    caller keeps the list and polls the replacement from then on)."""
    from forensics.sources.step_conventions import apply_step_offset

    alignments = [alignment_of(r, step_offset) for r in readers]
    readers[:] = [_realign(r, a) for r, a in zip(readers, alignments)]
    tables = [(r.source, apply_step_offset(r.table, a.step_offset)) for r, a in zip(readers, alignments)]
    merged, merge_warnings = merge_on_step(tables)
    report = IngestReport(sources=[r.report for r in readers], alignments=alignments, rows=len(merged))
    if len(merged):
        report.step_range = (int(merged[STEP].iloc[0]), int(merged[STEP].iloc[-1]))
    report.metrics = summarize(merged)
    # the columns no source could give a number, for the key lookup to name when it looks for one of them
    merged.attrs[LEFT_OUT] = {
        name: f"column '{name}' of {r.source} {why}"
        for r in reversed(readers)
        for name, why in r.report.left_out.items()
        if name not in merged.columns
    }
    for r in readers:
        if r.report.rows == 0:
            report.warnings.append(f"{r.source}: no metrics rows found")
        report.warnings += r.report.describe()
    report.warnings += merge_warnings
    if keys:
        cols = metric_columns(merged)
        for k in keys:
            if not any(c == k or fnmatch.fnmatchcase(c, k) for c in cols):
                report.warnings.append(f"key '{k}' matched no metric")
    if len(merged) and merged[STEP].iloc[0] < 0:
        n_neg = int((merged[STEP] < 0).sum())
        report.warnings.append(f"{n_neg} rows have a negative step after the step offset")
    return merged, report


def read_metrics(
    sources: Sequence[str | Path | SourceSpec] | str | Path,
    *,
    keys: Sequence[str] | None = None,
    step_key: str | None = None,
    step_offset: int | None = None,
    pattern: str | None = None,
    strict: bool = False,
    run_id: str | None = None,
    progress: bool = False,
) -> tuple[pd.DataFrame, IngestReport]:
    """Read finished sources and merge them on step into the canonical metrics table (docs/concepts.md).

    A later source wins a (step, metric) that several sources hold, with a warning; ``step_offset`` N makes
    metrics step = logged step - N for every source. Bad input raises :class:`~forensics.errors.ForensicsError`;
    data quirks (NaN/inf, rewinds, malformed lines) are kept or skipped and listed in the report.
    """
    if isinstance(sources, (str, Path)):
        sources = [sources]
    readers = open_readers(sources, keys=keys, step_key=step_key, pattern=pattern, strict=strict, run_id=run_id)
    with _progress(progress, len(readers)) as advance:
        for reader in readers:
            reader.finished = True
            reader.read_all()
            advance(reader.source)
            if reader.report.rows == 0:
                raise ForensicsError(
                    f"metrics source {reader.source} yields no rows: {empty_reason(reader)}; "
                    f"expected {reader.format_name} records of a step and its metrics"
                )
    return merge_readers(readers, step_offset, keys)


def empty_reason(reader: MetricsReader) -> str:
    """Why a finished source gave no rows (binary data, nothing matched, every record malformed, no file)."""
    path = Path(reader.source)
    if path.is_file():
        try:
            with open(path, "rb") as fh:
                head = fh.read(4096)
        except OSError as exc:
            return f"it could not be read ({exc.strerror or exc})"
        if not head.strip():
            return "the file is empty"
        if b"\x00" in head or head.decode("utf-8", errors="replace").count("\ufffd") > len(head) // 20:
            return f"it is not text (binary data), so not a {reader.format_name} file"
    own = getattr(reader, "empty_reason", None)
    if callable(own):
        return own()
    r = reader.report
    if r.malformed:
        where, why = r.malformed_examples[0]
        return f"all {r.malformed} records were malformed (first at {reader._where_word} {where}: {why})"
    return f"it holds no {reader.format_name} records with a step and a numeric value"


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

        self._bar = Progress(
            TextColumn("reading metrics"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=Console(stderr=True),
            transient=True,
        )
        self._bar.start()
        task = self._bar.add_task("", total=self.total)
        return lambda name: self._bar.advance(task) if self._bar else None

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()


def ingest(sources: Sequence[str | Path], out: str | Path, **read_options: Any) -> tuple[pd.DataFrame, IngestReport]:
    """``forensics ingest``: read and merge the sources (a case folder stands for its metrics sources) and write
    the canonical metrics table to ``out`` (Parquet; never over an input). ``read_options`` are
    :func:`read_metrics`'s."""
    from forensics.schema import check_output, open_case, write_metrics
    from forensics.schema.case import is_metrics_folder

    out = Path(out)
    check_output(out, (".parquet", ".pq"), "output")
    expanded: list[str] = []
    for s in sources:
        p = Path(s)
        if p.is_dir() and not is_metrics_folder(p):
            expanded += [m.path for m in open_case(p).metrics_sources]
        else:
            expanded.append(str(s))
    if out.resolve() in {Path(s).resolve() for s in expanded if not str(s).startswith("wandb://")}:
        raise ForensicsError(f"output {out} is one of the sources; inputs are never overwritten")
    table, report = read_metrics(expanded, **read_options)
    write_metrics(table, out)
    return table, report
