"""The one place where records become metrics rows: step key, flattening, casting, rewinds, last write wins.

Every reader hands its records (:class:`~forensics.sources.reader.records.Records`) to a :class:`MetricsAccumulator`,
which keeps the run's table as it grows. Per metric it keeps the values and a *written* mask, so the table it hands
out (:func:`forensics.schema.metrics_table`) tells a cell never written (null) from a logged NaN by itself.

- **step key**: the one given, else the first of :data:`~forensics.sources.reader.records.STEP_KEYS` present (any case);
  a format that knows where its step is (TensorBoard, text logs) names it and the user's key means nothing there.
- **columns**: nested structs become ``a/b``; ``keys`` (names or ``fnmatch`` globs) keep a subset; a column that
  holds text is not a metric (dropped with a warning); a column called ``step`` that is not the step key is kept
  as ``logged_step``.
- **rewinds**: a resumed run goes back and rewrites (step, metric) cells already written; that is recorded
  (:class:`~forensics.schema.Rewind`), and per (step, metric) the last write wins. A metric logged late for earlier
  steps (an eval record, a TensorBoard tag written after the others) replaces nothing and is no rewind. A jump back
  that meets no written step (a log kept every N steps, an excerpt) is a rewind when the run's own series goes on
  below its high point.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from forensics.errors import ForensicsError
from forensics.schema import STEP, TIMESTAMP, Rewind, metrics_table, parse_float_cells
from forensics.sources.reader.records import MAX_EXAMPLES, STEP_KEYS, ReaderReport, Records

#: Rewritten steps kept per metric in a rewind's ``overlap`` (the restart rule compares them against the noise).
OVERLAP_LIMIT = 64
#: A backward jump that rewrites no cell is a resume when its series goes on at this many distinct steps below the
#: high point: one record could be a stray late write, two in a row are the run logging again.
MIN_RESUMED_STEPS = 2

#: ``malformed(where, reason)``: how the accumulator reports a record it cannot read.
Malformed = Callable[[int, str], None]


def last_write_wins(
    steps: np.ndarray, values: np.ndarray, written: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Collapse repeated steps in write order: per metric, the last value written for a step wins.

    Returns ``(unique sorted steps, values, written)``. A cell not written (``written`` False) never overrides one
    that was; a step no write reached stays not written.
    """
    steps = np.asarray(steps, dtype=np.int64)
    written = np.ones(len(steps), bool) if written is None else np.asarray(written, bool)
    uniq = np.unique(steps)
    out = np.full(len(uniq), np.nan)
    has = np.zeros(len(uniq), bool)
    rows = np.flatnonzero(written)
    if len(rows):
        order = rows[np.argsort(steps[rows], kind="stable")]
        s = steps[order]
        last = np.r_[s[1:] != s[:-1], True]
        pos = np.searchsorted(uniq, s[last])
        out[pos] = np.asarray(values, dtype=np.float64)[order[last]]
        has[pos] = True
    return uniq, out, has


class MetricsAccumulator:
    """The growing metrics table of one source: records in, the canonical table out.

    ``malformed(where, reason)`` is called for every record that cannot be read (the reader counts it, or raises in
    strict mode); ``report`` receives rewinds, non-finite counts and warnings.
    """

    def __init__(
        self,
        report: ReaderReport,
        malformed: Malformed,
        *,
        keys: Sequence[str] | None = None,
        step_key: str | None = None,
        format_step_key: str | None = None,
        finished: bool = False,
        strict: bool = False,
        where_word: str = "line",
    ) -> None:
        self.report = report
        self._malformed = malformed
        self.keys = list(keys) if keys else None
        self.step_key = step_key
        self.format_step_key = format_step_key
        self.finished = finished
        self.steps = np.array([], dtype=np.int64)
        self.values: dict[str, np.ndarray] = {}
        self.written: dict[str, np.ndarray] = {}
        self._last_step: int | None = None
        #: The index in ``report.rewinds`` of a rewind whose rewritten steps may go on in the next batch.
        self._open_rewind: int | None = None
        self._resolved_step_key: str | None = None
        self._records_seen = 0
        self.strict = strict
        self._where_word = where_word
        self._dropped: set[str] = set()
        self._cache: pd.DataFrame | None = None

    # --- out ----------------------------------------------------------------------------------------------------
    def table(self) -> pd.DataFrame:
        """The whole table so far (step unique and sorted; metric columns null where not written)."""
        if self._cache is None:
            self._cache = metrics_table(self.steps, {c: (self.values[c], self.written[c]) for c in self.values})
        return self._cache

    def rows(self, steps: np.ndarray) -> pd.DataFrame:
        """The current rows of ``steps`` (each present in the table)."""
        table = self.table()
        if len(steps) == len(table):
            return table.copy(deep=False)
        pos = np.searchsorted(self.steps, steps)
        return table.iloc[pos].reset_index(drop=True)

    # --- in -----------------------------------------------------------------------------------------------------
    def ingest(self, rec: Records) -> np.ndarray:
        """Merge one batch of records into the table; return the steps they touched (sorted)."""
        where = rec.where
        n = len(rec)
        if where is None:
            where = np.arange(self._records_seen + 1, self._records_seen + n + 1)
        self._records_seen += n
        columns = _columns_of(rec.table)
        step_name = self._step_column(list(columns))
        if step_name is None:
            for w in where[:MAX_EXAMPLES]:
                self._malformed(int(w), "no step")
            self.report.malformed += max(0, n - MAX_EXAMPLES)
            return np.array([], dtype=np.int64)
        step_values, step_ok = _steps(columns[step_name])
        if not step_ok.all():
            for i in np.flatnonzero(~step_ok):
                self._malformed(int(where[i]), f"{step_name} is missing or not a whole number")
        steps = step_values[step_ok]
        values: dict[str, np.ndarray] = {}
        present: dict[str, np.ndarray] = {}
        for name, col in columns.items():
            if name == step_name or not self._wanted(name):
                continue
            arr, mask = self._as_float(name, col, where)
            if arr is None:
                continue
            if not step_ok.all():
                arr, mask = arr[step_ok], mask[step_ok]
            values["logged_step" if name == STEP else name] = arr
            present["logged_step" if name == STEP else name] = mask
        self.report.rows += len(steps)
        if not len(steps):
            return steps
        self._find_rewinds(steps, present, values)
        for name, arr in values.items():
            mask = present[name]
            self.report.count_nonfinite(name, int((np.isnan(arr) & mask).sum()), int(np.isinf(arr).sum()))
        if len(steps) > 1 and (np.diff(steps) <= 0).any():
            uniq = np.unique(steps)
            for name in list(values):
                _, values[name], present[name] = last_write_wins(steps, values[name], present[name])
            steps = uniq
        self._merge(steps, values, present)
        return steps

    # --- the work -----------------------------------------------------------------------------------------------
    def _step_column(self, names: list[str]) -> str | None:
        if self.format_step_key is not None:
            return self.format_step_key if self.format_step_key in names else None
        if self._resolved_step_key is not None:
            return self._resolved_step_key if self._resolved_step_key in names else None
        lower = {n.lower(): n for n in reversed(names)}
        if self.step_key:
            found = self.step_key if self.step_key in names else lower.get(self.step_key.lower())
            if found is None:
                raise ForensicsError(
                    f"{self.report.source}: step key '{self.step_key}' not found; the keys are {', '.join(names[:12])}"
                )
        else:
            found = next((lower[k] for k in STEP_KEYS if k in lower), None)
            if found is None:
                message = (
                    f"no step key found (expected one of {', '.join(STEP_KEYS)}, or give --step-key); "
                    f"the keys are {', '.join(names[:12])}"
                )
                if self.finished:
                    raise ForensicsError(f"{self.report.source}: {message}")
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

    def _as_float(self, name: str, col: Any, where: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """A column as float64 plus its written mask. A cell that is not a number is missing, counted with its line
        and column (bad input with ``strict``); a column without a single number is not a metric (left out, noted)."""
        if isinstance(col, (pa.ChunkedArray, pa.Array)):
            t = col.type
            if pa.types.is_null(t):
                return np.full(len(col), np.nan), np.zeros(len(col), bool)
            if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
                mask = np.ones(len(col), bool)
                if col.null_count:
                    mask = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                arr = np.asarray(col.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
                if not mask.all():
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
            if isinstance(series.dtype, pd.ArrowDtype) or pd.api.types.is_extension_array_dtype(series.dtype):
                if pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series):
                    mask = ~series.isna().to_numpy(dtype=bool)
                    return series.to_numpy(dtype=np.float64, na_value=np.nan), mask
            elif pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series):
                return series.to_numpy(dtype=np.float64), np.ones(len(series), bool)
        values, bad = parse_float_cells(series.reset_index(drop=True))
        text = series.notna().to_numpy() & ~series.astype(str).str.strip().eq("").to_numpy()
        mask = text & ~bad
        if not mask.any():
            example = series[text].iloc[0] if text.any() else None
            self._drop(
                name,
                "holds no numeric value" + (f" (e.g. {example!r})" if example is not None else "") + ": not a metric",
            )
            return None, None
        if bad.any():
            rows = np.flatnonzero(bad)
            cells = "; ".join(f"{self._where_word} {int(where[i])}: {series.iloc[i]!r}" for i in rows[:MAX_EXAMPLES])
            if self.strict:
                raise ForensicsError(
                    f"{self.report.source}: column '{name}' has a cell that is not a number ({cells}) (strict mode)"
                )
            self.report.add_cells(name, len(rows), cells)
        return values, mask

    def _drop(self, name: str, why: str) -> None:
        if name not in self._dropped:
            self._dropped.add(name)
            self.report.left_out[name] = why.removesuffix(": not a metric")
            self.report.warn(f"column '{name}' {why}; skipped")

    def _find_rewinds(
        self, steps: np.ndarray, present: dict[str, np.ndarray], values: dict[str, np.ndarray] | None = None
    ) -> None:
        """A resumed run: the step goes backwards and rewrites (step, metric) cells already written, or logs its
        series again below the high point without meeting a written step (:meth:`_resumes_below`).

        ``rows_replaced`` counts the steps of the backward jump's segment that had a metric written before.
        """
        prev = self._last_step
        self._last_step = int(steps[-1])
        back = list(np.flatnonzero(steps[1:] < steps[:-1]) + 1)
        if prev is not None and steps[0] < prev:
            back.insert(0, 0)
        if not back and self._open_rewind is None:
            return
        rewritten = np.zeros(len(steps), bool)
        for name, mask in present.items():
            if name == TIMESTAMP:
                continue
            rows = np.flatnonzero(mask)
            if not len(rows):
                continue
            written_steps = steps[rows]
            again = pd.Series(written_steps).duplicated(keep="first").to_numpy().copy()
            if name in self.written and len(self.steps):
                again |= np.isin(written_steps, self.steps[self.written[name]])
            rewritten[rows[again]] = True
        head = back[0] if back else len(steps)
        if self._open_rewind is not None:
            self._continue_rewind(steps, present, values or {}, rewritten, head)
        bounds = back + [len(steps)]
        for i, nxt in zip(back, bounds[1:]):
            seg = rewritten[i:nxt]
            before = [int(steps[:i].max())] if i else []
            before += [int(self.steps[-1])] if len(self.steps) else []
            last = max(before) if before else None
            if seg.any() or self._resumes_below(steps, present, i, nxt, last):
                n = len(np.unique(steps[i:nxt][seg]))
                self.report.rewinds.append(
                    Rewind(
                        int(steps[i]),
                        n,
                        self.report.source,
                        last_step=last,
                        overlap=self._overlap(steps, present, values or {}, i, nxt),
                    )
                )
                # a resumed writer read a poll at a time rewrites its steps over several batches: one rewind
                self._open_rewind = (
                    len(self.report.rewinds) - 1 if last is not None and int(steps[nxt - 1]) < last else None
                )

    def _continue_rewind(
        self,
        steps: np.ndarray,
        present: dict[str, np.ndarray],
        values: dict[str, np.ndarray],
        rewritten: np.ndarray,
        head: int,
    ) -> None:
        """The batch's first ``head`` rows go on rewriting the steps of the rewind an earlier batch opened (a live
        file read as the resumed writer appends): they join it, so a file read a poll at a time records the rewind
        a file read whole records (its steps replaced, its first overlapping values)."""
        idx = self._open_rewind
        assert idx is not None
        rw = self.report.rewinds[idx]
        if head and rewritten[:head].any():
            n = len(np.unique(steps[:head][rewritten[:head]]))
            overlap = {k: list(v) for k, v in rw.overlap.items()}
            for name, rows in self._overlap(steps, present, values, 0, head).items():
                overlap[name] = (overlap.get(name, []) + rows)[:OVERLAP_LIMIT]
            self.report.rewinds[idx] = dataclasses.replace(rw, rows_replaced=rw.rows_replaced + n, overlap=overlap)
        if head < len(steps) or rw.last_step is None or int(steps[head - 1]) >= rw.last_step:
            self._open_rewind = None

    def _resumes_below(
        self, steps: np.ndarray, present: dict[str, np.ndarray], i: int, nxt: int, last: int | None
    ) -> bool:
        """A backward jump that rewrites nothing is still a resume when logging carries on below the high point.

        A log kept at an interval, or an excerpt of one, may resume at steps it never wrote (Megatron logging every
        10 iterations from 7000 to 7220, then again from 6900 after a rollback). The jump is a resume when the
        segment writes, at ``MIN_RESUMED_STEPS`` or more distinct steps below the previous high point, a metric that
        was already written at a step at or after the segment's first: the run is logging its own series over again.
        A late record for earlier steps (an eval metric, a TensorBoard tag written after the others) writes a series
        that has nothing at those steps yet, and a lone stray record is too little to call a resume.
        """
        if last is None:
            return False
        first = int(steps[i])
        below = steps[i:nxt] < last
        for name, mask in present.items():
            if name == TIMESTAMP:
                continue
            resumed = np.unique(steps[i:nxt][mask[i:nxt] & below])
            if len(resumed) < MIN_RESUMED_STEPS:
                continue
            earlier = bool((mask[:i] & (steps[:i] >= first)).any())
            if not earlier and name in self.written and len(self.steps):
                earlier = bool((self.written[name] & (self.steps >= first)).any())
            if earlier:
                return True
        return False

    def _overlap(
        self,
        steps: np.ndarray,
        present: dict[str, np.ndarray],
        values: dict[str, np.ndarray],
        i: int,
        nxt: int,
        limit: int | None = None,
    ) -> dict[str, list[tuple[int, float, float]]]:
        """Per metric, (step, value first written, value written on resuming) for the first ``limit`` steps the
        segment ``steps[i:nxt]`` writes again (the first value from earlier in this batch, else from the table)."""
        limit = OVERLAP_LIMIT if limit is None else limit
        out: dict[str, list[tuple[int, float, float]]] = {}
        for name, v in values.items():
            if name == TIMESTAMP:
                continue
            mask = present[name]
            earlier = {int(s): float(x) for s, x, m in zip(steps[:i], v[:i], mask[:i], strict=True) if m}
            if name in self.written and len(self.steps):
                old_steps = self.steps[self.written[name]]
                old_vals = self.values[name][self.written[name]]
                earlier = {**{int(s): float(x) for s, x in zip(old_steps, old_vals, strict=True)}, **earlier}
            seg = zip(steps[i:nxt], v[i:nxt], mask[i:nxt], strict=True)
            rows = [(int(s), earlier[int(s)], float(x)) for s, x, m in seg if m and int(s) in earlier]
            if rows:
                out[name] = rows[:limit]
        return out

    def _merge(self, steps: np.ndarray, values: dict[str, np.ndarray], present: dict[str, np.ndarray]) -> None:
        """Per (step, metric), the batch's written cells replace the table's; new steps and columns are added."""
        self._cache = None
        old = self.steps
        n_old = len(old)
        if not n_old:  # the first batch: its arrays become the table's (a finished file is one batch)
            self.steps = steps.copy()
            for c in values:
                self.values[c], self.written[c] = values[c], present[c]
            return
        if steps[0] > old[-1]:  # the common case: new steps past the end
            self.steps = np.concatenate([old, steps])
            for c in list(self.values) + [c for c in values if c not in self.values]:
                v_old = self.values.get(c, np.full(n_old, np.nan))
                w_old = self.written.get(c, np.zeros(n_old, bool))
                v_new = values.get(c, np.full(len(steps), np.nan))
                w_new = present.get(c, np.zeros(len(steps), bool))
                self.values[c] = np.concatenate([v_old, v_new])
                self.written[c] = np.concatenate([w_old, w_new])
            return
        all_steps = np.union1d(old, steps)
        pos_old = np.searchsorted(all_steps, old)
        pos_new = np.searchsorted(all_steps, steps)
        for c in list(self.values) + [c for c in values if c not in self.values]:
            v = np.full(len(all_steps), np.nan)
            w = np.zeros(len(all_steps), bool)
            if c in self.values:
                v[pos_old] = self.values[c]
                w[pos_old] = self.written[c]
            if c in values:
                m = present[c]
                v[pos_new[m]] = values[c][m]
                w[pos_new[m]] = True
            self.values[c], self.written[c] = v, w
        self.steps = all_steps


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
