"""The reader interface every metrics source implements, and the one place where records become metrics rows.

A reader turns one source (a file, a folder, a run) into the metrics table of DESIGN.md: ``step`` int64 plus
float64 metric columns named as logged. Subclasses only say how to get the records written since their last call
(:meth:`MetricsReader._read_records`); everything the formats share happens here, once: picking the step key,
flattening nested keys to ``a/b``, keeping only ``keys``, dropping non-numeric columns with a warning, counting
NaN/inf, detecting rewinds of resumed runs and letting the last write of a (step, metric) win.

Live use: a reader remembers where it stopped (a byte offset per file, or the last record), so
:meth:`MetricsReader.read_new` returns only the rows that changed since the previous call; an incomplete last record
(a half-written line, a truncated event) is left in place and read once complete.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from forensics.errors import ForensicsError
from forensics.schema import STEP, TIMESTAMP, Rewind, cast_float, last_write_wins

#: Step keys tried in this order (case-insensitive) when none is given.
STEP_KEYS = ("step", "_step", "global_step", "iter", "iteration")
#: Malformed records quoted in a report (all are counted).
MAX_EXAMPLES = 5


@dataclass
class ReaderReport:
    """What one reader found beside its rows: counts and quirks for the summary, never fatal on their own.

    ``rows`` counts records read (before last-write-wins), ``malformed`` the records skipped, each example being
    (line number or byte offset, short reason). ``nonfinite`` counts logged NaN/inf per metric, not missing cells.
    ``metadata`` holds what a source knows about its run (config, summary, run id) for callers that want it.
    """

    source: str
    rows: int = 0
    malformed: int = 0
    malformed_examples: list[tuple[int, str]] = field(default_factory=list)
    rewinds: list[Rewind] = field(default_factory=list)
    nonfinite: dict[str, dict[str, int]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Regions skipped because their checksums failed (:class:`forensics.sources.damage.Damage`), in file order.
    damaged: list = field(default_factory=list)

    def add_malformed(self, where: int, reason: str) -> None:
        self.malformed += 1
        if len(self.malformed_examples) < MAX_EXAMPLES:
            self.malformed_examples.append((int(where), reason))

    def warn(self, message: str) -> None:
        """Add a warning once (live readers would otherwise repeat it on every poll)."""
        if message not in self.warnings:
            self.warnings.append(message)

    def count_nonfinite(self, metric: str, n_nan: int, n_inf: int) -> None:
        if n_nan or n_inf:
            counts = self.nonfinite.setdefault(metric, {"nan": 0, "inf": 0})
            counts["nan"] += n_nan
            counts["inf"] += n_inf

    def describe(self) -> list[str]:
        """Warning lines for this source: malformed records (with where), rewinds and the reader's warnings."""
        out = []
        if self.malformed:
            shown = "; ".join(f"{w}: {r}" for w, r in self.malformed_examples)
            out.append(f"{self.source}: {self.malformed} malformed records skipped ({shown})")
        out += [r.describe() for r in self.rewinds]
        out += [f"{self.source}: {w}" for w in self.warnings]
        return out


@dataclass
class Records:
    """Records a reader hook returns, in write order.

    ``table`` is a :class:`pyarrow.Table` (a null cell = not written; a NaN cell = a logged NaN) or a
    :class:`pandas.DataFrame` (NaN = not written). It holds the step under its logged name and one column per key
    (nested structs are flattened here). ``where`` gives each row's line number or byte offset for messages.
    """

    table: pa.Table | pd.DataFrame
    where: np.ndarray | None = None

    def __len__(self) -> int:
        return self.table.num_rows if isinstance(self.table, pa.Table) else len(self.table)


def sparse_columns(n_rows: int, cells: dict[str, dict[int, float]]) -> dict[str, pa.Array]:
    """Per key, a float64 Arrow column of ``n_rows`` from ``{row: value}``: rows a key never wrote are null (not
    written), a NaN value stays NaN (logged), as :class:`Records` reads them."""
    columns = {}
    for key, by_row in cells.items():
        values = np.full(n_rows, np.nan)
        valid = np.zeros(n_rows, bool)
        idx = np.fromiter(by_row.keys(), dtype=np.int64, count=len(by_row))
        values[idx] = np.fromiter(by_row.values(), dtype=np.float64, count=len(by_row))
        valid[idx] = True
        columns[key] = pa.array(values, mask=~valid)
    return columns


class MetricsReader:
    """Base class of every reader. Constructing one reads nothing; :meth:`read_new` reads what is there.

    ``keys``: metric names (or ``fnmatch`` globs) to keep, default all. ``step_key``: the column holding the step,
    default the first of :data:`STEP_KEYS` present. ``strict``: a malformed record raises :class:`ForensicsError`
    instead of being skipped and counted.
    """

    #: Short name of the format, for messages and summaries.
    format_name = "metrics"

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
        #: Set by callers reading a finished run: an unterminated last line is then read as complete.
        self.finished = False
        self._reset()

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
        touched: list[np.ndarray] = []
        for rec in batches:
            if len(rec):
                steps = self._ingest(rec)
                if len(steps):
                    touched.append(steps)
        if not touched:
            return self._table.iloc[0:0].copy()
        steps = touched[0] if len(touched) == 1 else np.unique(np.concatenate(touched))
        table = self._table
        if len(steps) == len(table):
            return table.copy(deep=False)  # copy-on-write: the caller's changes never reach the reader's table
        pos = np.searchsorted(table[STEP].to_numpy(), steps)
        return table.iloc[pos].reset_index(drop=True)

    def read_all(self) -> pd.DataFrame:
        """A fresh full read from the start: the whole table (the report starts over too)."""
        self._reset()
        return self.read_new()

    @property
    def table(self) -> pd.DataFrame:
        """Everything read so far: the canonical metrics table (step unique and sorted)."""
        return self._table.copy(deep=False)

    @property
    def nan_steps(self) -> dict[str, np.ndarray]:
        """Per metric, the steps where a NaN was logged (the table alone cannot tell them from gaps)."""
        return self._nan_steps

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

    #: How ``where`` values read in messages ("line", "byte", "record").
    _where_word = "line"
    #: The step column's name when the format itself says where the step is (TensorBoard, text logs); the
    #: user's ``step_key`` then means something format-specific or nothing.
    _records_step_key: str | None = None

    # --- the shared work -----------------------------------------------------------------------------------------
    def _reset(self) -> None:
        self.report = ReaderReport(source=self.source)
        self._table = pd.DataFrame({STEP: np.array([], dtype=np.int64)})
        self._last_step: int | None = None
        self._resolved_step_key: str | None = None
        self._records_seen = 0
        self._dropped: set[str] = set()
        #: Steps where a metric was logged as NaN: the table alone cannot tell them from cells never written.
        self._nan_steps: dict[str, np.ndarray] = {}
        self._reset_position()

    def _ingest(self, rec: Records) -> np.ndarray:
        """Turn one batch of records into rows, merge them into the table, return the steps they touched."""
        where = rec.where
        n = len(rec)
        if where is None:
            where = np.arange(self._records_seen + 1, self._records_seen + n + 1)
        self._records_seen += n
        columns = _columns_of(rec.table)
        step_name = self._step_column(list(columns))
        if step_name is None:
            for w in where[: MAX_EXAMPLES if not self.strict else 1]:
                self._malformed(int(w), "no step")
            self.report.malformed += max(0, n - MAX_EXAMPLES)
            return np.array([], dtype=np.int64)
        step_values, step_ok = _steps(columns[step_name])
        if not step_ok.all():
            for i in np.flatnonzero(~step_ok):
                self._malformed(int(where[i]), f"{step_name} is missing or not a whole number")
        keep = step_ok if not step_ok.all() else None
        steps = step_values if keep is None else step_values[keep]
        values: dict[str, np.ndarray] = {}
        present: dict[str, np.ndarray] = {}
        for name, col in columns.items():
            if name == step_name or not self._wanted(name):
                continue
            arr, mask = self._as_float(name, col)
            if arr is None:
                continue
            if keep is not None:
                arr, mask = arr[keep], (mask[keep] if mask is not None else None)
            if name == STEP:  # a column called "step" that is not the step key (another one was chosen)
                name = "logged_step"
            values[name], present[name] = arr, mask
        self.report.rows += len(steps)
        if not len(steps):
            return steps
        self._find_rewinds(steps, present)
        for name, arr in values.items():
            mask = present[name]
            nan = np.isnan(arr)
            logged_nan = (nan & mask) if mask is not None else nan
            n_nan = int(logged_nan.sum())
            if n_nan:
                self._nan_steps[name] = np.union1d(self._nan_steps.get(name, steps[:0]), steps[logged_nan])
            self.report.count_nonfinite(name, n_nan, int(np.isinf(arr).sum()))
        batch = pd.DataFrame({STEP: steps, **values}, copy=False)
        if len(steps) > 1 and (np.diff(steps) <= 0).any():
            if pd.Series(steps).duplicated().any():
                written = pd.DataFrame({STEP: steps, **{k: (m if m is not None else np.ones(len(steps), bool))
                                                        for k, m in present.items()}})
                batch = last_write_wins(batch, written)
                grouped = written.groupby(STEP, sort=True).any()
                present = {k: grouped[k].to_numpy() for k in present}
            else:
                order = np.argsort(steps, kind="stable")
                batch = batch.iloc[order].reset_index(drop=True)
                present = {k: (m[order] if m is not None else None) for k, m in present.items()}
        self._merge(batch, present)
        return batch[STEP].to_numpy()

    def _step_column(self, names: list[str]) -> str | None:
        if self._records_step_key is not None:
            return self._records_step_key if self._records_step_key in names else None
        if self._resolved_step_key is not None:
            return self._resolved_step_key if self._resolved_step_key in names else None
        lower = {n.lower(): n for n in reversed(names)}
        if self.step_key:
            found = self.step_key if self.step_key in names else lower.get(self.step_key.lower())
            if found is None:
                raise ForensicsError(f"{self.source}: step key '{self.step_key}' not found; "
                                     f"the keys are {', '.join(names[:12])}")
        else:
            found = next((lower[k] for k in STEP_KEYS if k in lower), None)
            if found is None:
                message = (f"no step key found (expected one of {', '.join(STEP_KEYS)}, or give --step-key); "
                           f"the keys are {', '.join(names[:12])}")
                if self.finished:
                    raise ForensicsError(f"{self.source}: {message}")
                # A live file may start with records that have no step (a config line): count them, and
                # look for the step key again in the next records.
                self.report.warn(message)
                return None
        self._resolved_step_key = found
        return found

    def _wanted(self, name: str) -> bool:
        if self.keys is None or name == TIMESTAMP:
            return True
        return any(name == k or fnmatch.fnmatchcase(name, k) for k in self.keys)

    def _as_float(self, name: str, col: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
        """A column as float64 plus its written-mask (None: all written); non-numeric columns are dropped."""
        if isinstance(col, (pa.ChunkedArray, pa.Array)):
            t = col.type
            if pa.types.is_null(t):
                return np.full(len(col), np.nan), np.zeros(len(col), bool)
            if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
                mask = None
                if col.null_count:
                    mask = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                arr = np.asarray(col.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
                if mask is not None:
                    arr = arr.copy()
                    arr[~mask] = np.nan
                return arr, mask
            if pa.types.is_string(t) or pa.types.is_large_string(t):
                series = pd.Series(col.to_pylist(), dtype=object)
            else:
                self._drop(name, f"holds {t} values, not numbers")
                return None, None
        else:
            series = col
            if pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series):
                arr = series.to_numpy(dtype=np.float64, na_value=np.nan)
                return arr, ~np.isnan(arr) if np.isnan(arr).any() else None
        mask = series.notna().to_numpy()
        frame = pd.DataFrame({name: series})
        try:
            cast_float(frame, name, "metrics", self.source)
        except ForensicsError:
            bad = series[mask]
            self._drop(name, f"is not numeric (e.g. {bad.iloc[0]!r})" if len(bad) else "is not numeric")
            return None, None
        return frame[name].to_numpy(dtype=np.float64), (None if mask.all() else mask)

    def _drop(self, name: str, why: str) -> None:
        if name not in self._dropped:
            self._dropped.add(name)
            self.report.warn(f"column '{name}' {why}; skipped")

    def _find_rewinds(self, steps: np.ndarray, present: dict[str, np.ndarray | None]) -> None:
        """A resumed run: the step goes backwards and rewrites (step, metric) cells already written.

        Only a backward jump that rewrites something is a rewind: a metric logged late for earlier steps (an eval
        record, a TensorBoard tag written after the others) replaces nothing. ``rows_replaced`` counts the steps
        of the jump's segment that had at least one metric written before.
        """
        prev = self._last_step
        self._last_step = int(steps[-1])
        back = list(np.flatnonzero(steps[1:] < steps[:-1]) + 1)
        if prev is not None and steps[0] < prev:
            back.insert(0, 0)
        if not back:
            return
        table = self._table
        rewritten = np.zeros(len(steps), bool)
        for name, mask in present.items():
            if name == TIMESTAMP:
                continue
            rows = np.flatnonzero(mask) if mask is not None else np.arange(len(steps))
            if not len(rows):
                continue
            written = steps[rows]
            again = pd.Series(written).duplicated(keep="first").to_numpy().copy()
            if name in table.columns and len(table):
                old = table[STEP].to_numpy()[table[name].notna().to_numpy()]
                if name in self._nan_steps:
                    old = np.union1d(old, self._nan_steps[name])
                again |= np.isin(written, old)
            rewritten[rows[again]] = True
        bounds = back + [len(steps)]
        for i, nxt in zip(back, bounds[1:]):
            seg = rewritten[i:nxt]
            if seg.any():
                n = len(np.unique(steps[i:nxt][seg]))
                self.report.rewinds.append(Rewind(int(steps[i]), n, self.source))

    def _merge(self, batch: pd.DataFrame, present: dict[str, np.ndarray | None]) -> None:
        """Per (step, metric), the batch's written cells replace the table's; new steps and columns are added."""
        table = self._table
        if table.empty and len(table.columns) == 1:
            self._table = batch.reset_index(drop=True)
            return
        cols = list(table.columns) + [c for c in batch.columns if c not in table.columns]
        old_steps = table[STEP].to_numpy()
        new_steps = batch[STEP].to_numpy()
        if not len(old_steps) or new_steps[0] > old_steps[-1]:
            self._table = pd.concat([table, batch], ignore_index=True).reindex(columns=cols)
            for c in cols[1:]:
                self._table[c] = self._table[c].astype(np.float64)
            return
        all_steps = np.union1d(old_steps, new_steps)
        out = {STEP: all_steps}
        pos_old = np.searchsorted(all_steps, old_steps)
        pos_new = np.searchsorted(all_steps, new_steps)
        for c in cols[1:]:
            v = np.full(len(all_steps), np.nan)
            if c in table.columns:
                v[pos_old] = table[c].to_numpy(dtype=np.float64)
            if c in batch.columns:
                m = present.get(c)
                new = batch[c].to_numpy(dtype=np.float64)
                if m is None:
                    v[pos_new] = new
                else:
                    v[pos_new[m]] = new[m]
            out[c] = v
        self._table = pd.DataFrame(out)


# --- growing files -------------------------------------------------------------------------------------------------
class TailedFile:
    """A file read from a byte offset onwards, handing out only complete lines (a live log keeps growing).

    ``offset`` is where the next unread byte is, ``lines`` how many lines lie before it. A file that shrank or was
    replaced (another inode) is read again from the start, with a warning from the caller.
    """

    def __init__(self, path: str | Path, chunk_size: int = 32 << 20) -> None:
        self.path = Path(path)
        self.chunk_size = chunk_size
        self.offset = 0
        self.lines = 0
        self._inode: int | None = None

    def check_restarted(self) -> bool:
        """True (and the position reset) when the file was truncated or replaced since the last read."""
        try:
            st = self.path.stat()
        except FileNotFoundError as exc:
            raise ForensicsError(f"metrics file {self.path} no longer exists") from exc
        restarted = (self._inode is not None and st.st_ino != self._inode) or st.st_size < self.offset
        self._inode = st.st_ino
        if restarted:
            self.offset = 0
            self.lines = 0
        return restarted

    def chunks(self) -> Any:
        """Yield ``(data, first_line, n_lines)`` blocks of complete lines (each ending in a newline) from the offset.

        The position advances past each block as it is yielded; an unterminated last line is not consumed.
        """
        try:
            fh = open(self.path, "rb")
        except OSError as exc:
            raise ForensicsError(f"metrics file {self.path} could not be read: {exc.strerror or exc}") from exc
        with fh:
            fh.seek(self.offset)
            carry = b""
            while True:
                data = fh.read(self.chunk_size)
                if not data:
                    return
                data = carry + data if carry else data
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    carry = data
                    continue
                block, carry = data[:cut], data[cut:]
                first = self.lines + 1
                n_lines = block.count(b"\n")
                self.offset += len(block)
                self.lines += n_lines
                yield block, first, n_lines

    def remainder(self) -> bytes:
        """The bytes after the offset: an unterminated last line (empty when the file ends with a newline)."""
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            return fh.read()

    def consume_remainder(self, nbytes: int) -> None:
        self.offset += nbytes
        self.lines += 1


def line_numbers(block: bytes, first_line: int) -> np.ndarray:
    """Line numbers of the non-blank lines of ``block`` (pyarrow skips blank lines, so rows and lines differ)."""
    nums = [first_line + i for i, line in enumerate(block.split(b"\n")) if line.strip()]
    return np.asarray(nums, dtype=np.int64)


# --- helpers --------------------------------------------------------------------------------------------------------
def _columns_of(table: pa.Table | pd.DataFrame) -> dict[str, Any]:
    """Name -> column, with nested structs flattened to ``a/b`` names."""
    if isinstance(table, pd.DataFrame):
        return {str(c): table[c] for c in table.columns}
    out: dict[str, Any] = {}

    def add(name: str, col: pa.ChunkedArray | pa.Array) -> None:
        if pa.types.is_struct(col.type):
            chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
            for i, f in enumerate(col.type):
                children = [c.flatten()[i] for c in chunks]
                add(f"{name}/{f.name}", pa.chunked_array(children, type=f.type))
        else:
            out[name] = col

    for name, col in zip(table.column_names, table.columns):
        add(name, col)
    return out


def _steps(col: Any) -> tuple[np.ndarray, np.ndarray]:
    """Step values as int64 and a mask of the rows whose step is present and a whole number."""
    if isinstance(col, (pa.ChunkedArray, pa.Array)):
        if pa.types.is_integer(col.type) and not col.null_count:
            arr = np.asarray(col.to_numpy(), dtype=np.int64)
            return arr, np.ones(len(arr), bool)
        col = pd.Series(col.to_pandas() if hasattr(col, "to_pandas") else col.to_pylist())
    num = pd.to_numeric(pd.Series(col), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    ok = np.isfinite(num) & (num == np.round(num))
    out = np.zeros(len(num), dtype=np.int64)
    out[ok] = num[ok].astype(np.int64)
    return out, ok


# --- choosing a reader ----------------------------------------------------------------------------------------------
#: File suffixes per local format (a file with none of them is sniffed from its first bytes).
SUFFIXES = {
    "jsonl": (".jsonl", ".ndjson"),
    "json": (".json",),
    "csv": (".csv", ".tsv"),
    "text": (".log", ".txt", ".out", ".err"),
    "parquet": (".parquet", ".pq"),
}
FORMATS = ("jsonl", "json", "csv", "tensorboard", "text", "parquet", "wandb", "wandb-api")


def is_wandb_api_source(source: str) -> bool:
    """``wandb://entity/project/run_id``, a ``https://wandb.ai/...`` run URL, or a bare ``entity/project/run_id``
    that is not a local path."""
    s = str(source)
    if s.startswith("wandb://") or s.startswith(("https://wandb.ai/", "http://wandb.ai/", "wandb.ai/")):
        return True
    parts = s.split("/")
    return (len(parts) == 3 and all(parts) and not s.startswith((".", "~")) and not Path(parts[0]).exists()
            and "." not in parts[-1])


def _json_or_jsonl(path: Path) -> str:
    """A ``.json`` file is JSON Lines when its first line is a whole object, else one JSON document."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline().strip()
    except OSError as exc:
        raise ForensicsError(f"metrics file {path} could not be read: {exc.strerror or exc}") from exc
    if first.startswith(b"{") and first.endswith(b"}"):
        try:
            obj = json.loads(first)
        except ValueError:
            return "json"
        # a one-line document that holds its records as a list (trainer_state.json written compactly)
        holds_records = any(isinstance(v, list) and v and isinstance(v[0], dict) for v in obj.values())
        return "json" if holds_records else "jsonl"
    return "json"


def detect_format(source: str | Path) -> str:
    """The format of a source, from its form, name and (for a file without a known suffix) first bytes."""
    s = str(source)
    if is_wandb_api_source(s):
        return "wandb-api"
    path = Path(s)
    if not path.exists():
        raise ForensicsError(f"metrics source {s} does not exist")
    name = path.name
    if path.is_dir():
        # A W&B run folder may hold TensorBoard files too (sync_tensorboard): its .wandb file decides first.
        if name == "wandb" or any(path.glob("*.wandb")):
            return "wandb"
        if next(path.rglob("events.out.tfevents.*"), None) is not None:
            return "tensorboard"
        if name.startswith(("offline-run-", "run-")):
            return "wandb"
        raise ForensicsError(f"metrics folder {s} holds no TensorBoard event files and is not a W&B run folder")
    if name.startswith("events.out.tfevents."):
        return "tensorboard"
    if path.suffix == ".wandb":
        return "wandb"
    suffix = path.suffix.lower()
    if suffix == ".json":
        return _json_or_jsonl(path)
    for fmt, suffixes in SUFFIXES.items():
        if suffix in suffixes:
            return fmt
    if suffix and not suffix[1:].isdigit():
        raise ForensicsError(
            f"metrics file {s} has an unknown format {suffix!r}; expected .jsonl, .csv, .log/.txt, .parquet, "
            "a TensorBoard events file or folder, or a W&B run"
        )
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise ForensicsError(f"metrics file {s} could not be read: {exc.strerror or exc}") from exc
    if b"\x00" in head:
        raise ForensicsError(f"metrics file {s} is binary and not a format this tool reads")
    return "jsonl" if head.lstrip().startswith(b"{") else "text"


def open_reader(
    source: str | Path,
    *,
    format: str | None = None,
    keys: Sequence[str] | None = None,
    step_key: str | None = None,
    strict: bool = False,
    pattern: str | None = None,
    run_id: str | None = None,
    include_minmax: bool = False,
) -> MetricsReader:
    """The reader for a source (format detected unless given). Options a format has no use for are ignored.

    W&B sources are handled by :mod:`forensics.sources.wandb_files` (offline run folders, ``.wandb`` files) and
    :mod:`forensics.sources.wandb_api` (the public API), imported only when such a source is given.
    """
    fmt = format or detect_format(source)
    if fmt not in FORMATS:
        raise ForensicsError(f"unknown metrics format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if fmt != "wandb-api" and not Path(source).exists():
        raise ForensicsError(f"metrics source {source} does not exist")
    common = {"keys": keys, "step_key": step_key, "strict": strict}
    if fmt == "jsonl":
        from forensics.sources.jsonl import JsonlReader

        return JsonlReader(source, **common)
    if fmt == "json":
        from forensics.sources.json_document import JsonDocumentReader

        return JsonDocumentReader(source, **common)
    if fmt == "csv":
        from forensics.sources.csv_export import CsvReader

        return CsvReader(source, include_minmax=include_minmax, **common)
    if fmt == "tensorboard":
        from forensics.sources.tensorboard import TensorBoardReader

        return TensorBoardReader(source, **common)
    if fmt == "text":
        from forensics.sources.text_log import TextLogReader

        return TextLogReader(source, pattern=pattern, **common)
    if fmt == "parquet":
        from forensics.sources.parquet import ParquetReader

        return ParquetReader(source, **common)
    if fmt == "wandb":
        from forensics.sources.wandb_files import WandbRunReader

        return WandbRunReader(source, run_id=run_id, **common)
    from forensics.sources.wandb_api import WandbApiReader

    return WandbApiReader(source, **common)
