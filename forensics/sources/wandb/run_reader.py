"""Metrics from W&B run files on disk: a ``.wandb`` file, a run folder, or a ``wandb/`` folder holding several.

Offline runs (``wandb/offline-run-<time>-<id>/run-<id>.wandb``) and synced runs (``wandb/run-<time>-<id>/``) keep
everything in the ``.wandb`` file; offline runs write no summary or config files beside it, so the run's config and
summary are rebuilt from its records. A resumed run writes a second folder with the same run id, whose ``_step`` may
start again from 0: the folders of one run id are read in time order and merged by the shared reader behaviour
(last write of a step wins, the rewind is reported). Without ``run_id`` the newest run id in the folder is read.

Live use: each file is read from the byte offset where the last read stopped; a record the writer has not finished
is left for the next :meth:`~forensics.sources.reader.base.MetricsReader.read_new`, and new folders of the run (a resume
started while watching) are picked up. A damaged record is skipped (its values stay missing; reading resumes at the
next record that verifies) and listed in ``report.damaged`` with the steps either side of it.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from forensics.errors import ForensicsError
from forensics.sources.reader.base import MetricsReader
from forensics.sources.reader.records import Damage, Records
from forensics.sources.wandb.record_log import (
    KEPT_INTERNAL,
    MEDIA_MARK,
    WANDB_STEP,
    RecordLog,
    flatten_numeric,
    is_internal,
    item_key,
    item_value,
    summary_item_class,
)
from forensics.sources.wandb.scan_kernel import S_UPDATE
from forensics.sources.wandb.scanner import ScanBatch, handed_record, read_run_file, rows_table_of

_FOLDER = re.compile(r"^(?:offline-)?run-(\d{8}_\d{6})-(.+)$")
_FILE = re.compile(r"^run-(.+)\.wandb$")


@dataclass(frozen=True)
class RunFile:
    """One ``.wandb`` file of a run: ``started`` is the folder's ``YYYYMMDD_HHMMSS`` (empty when unknown)."""

    path: Path
    run_id: str
    started: str

    @property
    def order(self) -> tuple[str, str]:
        return (self.started, str(self.path))


def run_file_of(path: Path) -> RunFile | None:
    """The run id and start time of a ``.wandb`` file, from its name and its folder's name."""
    m = _FILE.match(path.name)
    if m is None:
        return None
    folder = _FOLDER.match(path.parent.name)
    if folder is not None and folder.group(2) == m.group(1):
        return RunFile(path, m.group(1), folder.group(1))
    return RunFile(path, m.group(1), "")


def find_run_files(source: str | Path) -> list[RunFile]:
    """Every ``.wandb`` file a source names: the file itself, a run folder's file, or the run folders of a folder.

    Symlinks (W&B's ``latest-run``) are skipped so that no file is read twice; a case folder holding ``wandb/`` works
    too.
    """
    path = Path(source)
    if path.is_file():
        rf = run_file_of(path)
        return [rf if rf is not None else RunFile(path, path.stem, "")]
    if not path.is_dir():
        raise ForensicsError(f"W&B source {path} does not exist")
    direct = sorted(p for p in path.glob("*.wandb") if p.is_file())
    if direct:
        return [run_file_of(p) or RunFile(p, p.stem, "") for p in direct]
    roots = [path / "wandb"] if (path / "wandb").is_dir() and not (path / "wandb").is_symlink() else [path]
    out = []
    for root in roots:
        for folder in sorted(root.iterdir()):
            if folder.is_symlink() or not folder.is_dir() or not _FOLDER.match(folder.name):
                continue
            for p in sorted(folder.glob("*.wandb")):
                if p.is_file() and (rf := run_file_of(p)) is not None:
                    out.append(rf)
    return out


def choose_run(files: Sequence[RunFile], run_id: str | None, source: str) -> list[RunFile]:
    """The files of one run id in time order: ``run_id`` if given, else the run whose latest folder is newest."""
    if not files:
        raise ForensicsError(
            f"W&B source {source} holds no .wandb run files (expected wandb/offline-run-*/run-*.wandb)"
        )
    ids = sorted({f.run_id for f in files})
    if run_id is None:
        run_id = max(files, key=lambda f: f.order).run_id
    elif run_id not in ids:
        raise ForensicsError(f"W&B source {source} has no run '{run_id}'; its runs are {', '.join(ids[:12])}")
    return sorted((f for f in files if f.run_id == run_id), key=lambda f: f.order)


class WandbRunReader(MetricsReader):
    """History rows of one W&B run read from its ``.wandb`` file(s), incrementally.

    Rows: ``_step`` as the step (or ``step_key``), nested keys flattened to ``a/b``, ``_timestamp`` kept, other W&B
    internal keys (``_runtime``, ``_wandb/...``) skipped, non-numeric values (text, media, lists) dropped and counted.
    ``report.metadata`` holds ``run_id``, ``project``, ``entity``, ``name``, ``config``, ``summary``, ``files``,
    ``finished`` (an exit record was read) and the ``other_runs`` a folder also holds.
    """

    format_name = "wandb"
    _where_word = "byte"

    def __init__(
        self,
        source: str | Path,
        *,
        run_id: str | None = None,
        keys: Sequence[str] | None = None,
        step_key: str | None = None,
        strict: bool = False,
    ) -> None:
        self.run_id = run_id
        super().__init__(source, keys=keys, step_key=step_key or WANDB_STEP, strict=strict)

    # --- MetricsReader hooks --------------------------------------------------------------------------------------
    def _reset_position(self) -> None:
        self._logs: dict[Path, RecordLog] = {}
        self._chosen_id: str | None = self.run_id
        self._dropped_values: Counter[str] = Counter()
        self._meta: dict[str, Any] = {"run_id": self.run_id, "config": {}, "summary": {}, "files": []}
        self._tail_warnings: dict[Path, str] = {}
        self._exited: set[Path] = set()
        self._damages: list[Damage] = []
        #: Per file: damaged regions already taken from its log, the step of the last history row read, and the
        #: indexes into ``_damages`` of regions whose next step is not known yet (it comes with a later read).
        self._damages_seen: dict[Path, int] = {}
        self._file_last_step: dict[Path, int] = {}
        self._open: dict[Path, list[int]] = {}
        self._damage_warning: str | None = None

    def _read_records(self) -> list[Records]:
        files = self._run_files()
        batches = []
        for rf in files:
            log = self._logs.get(rf.path)
            if log is None:
                log = self._logs[rf.path] = RecordLog(rf.path)
                self._meta["files"].append(str(rf.path))
            batch = self._read_file(log)
            if batch is not None:
                batches.append(batch)
            self._note_file_state(log)
        self._meta["finished"] = files[-1].path in self._exited
        self._publish()
        self._publish_damage()
        return batches

    # --- reading ------------------------------------------------------------------------------------------------
    def _run_files(self) -> list[RunFile]:
        found = find_run_files(self.source)
        chosen = choose_run(found, self._chosen_id, self.source)
        self._chosen_id = chosen[0].run_id
        self._meta["run_id"] = self._chosen_id
        self._meta["other_runs"] = sorted({f.run_id for f in found} - {self._chosen_id})
        return chosen

    def _read_file(self, log: RecordLog) -> Records | None:
        """The records of one file since the last read: the compiled path's batches, and the records it hands over
        or stops on (read as protobufs here), in file order."""
        path = log.path
        batches: list[ScanBatch] = []
        slow: list[tuple[int, dict[str, float]]] = []
        for part in read_run_file(log, self.finished):
            if isinstance(part, ScanBatch):
                if len(part.row_offset):
                    batches.append(part)
                self._apply_summary(part.summary)  # before its handed records: only the last of them can touch it
                for start, end, payload in part.handed:
                    rec = handed_record(log, start, end, payload)
                    if rec is not None:
                        self._record(path, start, rec, slow)
            else:
                self._record(path, *part, slow)
        fill = WANDB_STEP if self.step_key == WANDB_STEP else None
        table, where = rows_table_of(batches, slow, self._kept, fill)
        steps = _column(table, self.step_key, len(where))
        if len(where) and path in self._open:
            self._close_damage(path, _step_at(steps, 0))  # regions found before: this read's first row follows them
        if len(log.damaged) > self._damages_seen.get(path, 0):
            self._take_damage(log, where, steps)
        if not len(where):
            return None
        last = _step_at(steps, len(where) - 1)
        if last is not None:
            self._file_last_step[path] = last
        return Records(table, where)

    def _record(self, path: Path, offset: int, rec, slow: list[tuple[int, dict[str, float]]]) -> None:
        """One record read as a protobuf (the Python path)."""
        meta = self._meta
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            slow.append((offset, self._history_row(rec.history)))
        elif kind == "summary":
            _apply(meta["summary"], rec.summary)
        elif kind == "config":
            _apply(meta["config"], rec.config)
        elif kind == "run":
            self._run_record(rec.run)
        elif kind == "exit":
            self._exited.add(path)
            meta["exit_code"] = rec.exit.exit_code

    def _apply_summary(self, last_ops: list[tuple[int, int, bool, bytes]]) -> None:
        """The compiled path's summary: per key its last update or removal in the stretch it read, applied so that
        the keys end in the order the records' own updates and removals would leave them (a key removed and updated
        again moves to the end; one only updated keeps its place)."""
        if not last_ops:
            return
        item_type = summary_item_class()
        summary = self._meta["summary"]
        items = [(op, rank, removed, item_type.FromString(raw)) for op, rank, removed, raw in last_ops]
        for _, _, removed, item in items:
            if removed:
                summary.pop(item_key(item), None)
        for _, _, _, item in sorted((x for x in items if x[0] == S_UPDATE), key=lambda x: x[1]):
            summary[item_key(item)] = item

    def _kept(self, key: str) -> bool:
        """Whether a history key is a column: W&B's internal keys are not (but the step and the time are), nor
        ``_step`` when another key is the step."""
        if key[:1] == "_":
            return key in KEPT_INTERNAL and (key != WANDB_STEP or self.step_key == WANDB_STEP)
        return True

    def _take_damage(self, log: RecordLog, where: np.ndarray, steps: np.ndarray) -> None:
        """New damaged regions of ``log``, with the steps of the history rows either side (found by byte offset:
        nothing is tracked per record); a region after this read's last row waits for the next read's first."""
        seen = self._damages_seen.get(log.path, 0)
        source = Path(self.source)
        try:
            name = None if source.is_file() else log.path.relative_to(source).as_posix()
        except ValueError:
            name = str(log.path)
        for d in log.damaged[seen:]:
            k = int(np.searchsorted(where, d.offset))
            before = _step_at(steps, k - 1) if k > 0 else self._file_last_step.get(log.path)
            after = _step_at(steps, k) if k < len(where) else None
            self._damages.append(replace(d, steps=(before, after), file=name))
            if after is None:
                self._open.setdefault(log.path, []).append(len(self._damages) - 1)
        self._damages_seen[log.path] = len(log.damaged)

    def _close_damage(self, path: Path, step: int | None) -> bool:
        """Give the waiting regions of ``path`` ``step`` (of the first row read after them); False if it is None."""
        if step is None:
            return False
        for i in self._open.pop(path, ()):
            self._damages[i] = replace(self._damages[i], steps=(self._damages[i].steps[0], step))
        return True

    def _history_row(self, history) -> dict[str, float] | None:
        keys: list[str] = []
        texts: list[str] = []
        row: dict[str, float] = {}
        dropped = self._dropped_values
        media = False
        for item in history.item:
            nested = item.nested_key
            if len(nested) == 1:
                key = nested[0]
            else:
                key = "/".join(nested) if nested else item.key
                media = media or key.endswith(MEDIA_MARK)
            if key[:1] == "_" and not self._kept(key):
                continue
            text = item.value_json
            if text:
                keys.append(key)
                texts.append(text)
            elif flatten_numeric(key, item_value(item), row):  # a typed value (no JSON)
                dropped[key] += 1
        try:
            # One JSON parse per row instead of one per value: the values are JSON texts side by side.
            values = json.loads("[" + ",".join(texts) + "]")
        except ValueError:
            values = [_loads_or_text(t) for t in texts]
        if media:
            keys, values = _without_media(keys, values, dropped)
        for key, value in zip(keys, values):
            if type(value) is float:  # the common case, without a call
                row[key] = value
            elif flatten_numeric(key, value, row):  # ints (one beyond float range is inf), bools, dicts, text
                dropped[key] += 1
        if self.step_key == WANDB_STEP and WANDB_STEP not in row:
            row[WANDB_STEP] = float(history.step.num)
        return row

    def _run_record(self, run) -> None:
        meta = self._meta
        for name, value in (("project", run.project), ("entity", run.entity), ("name", run.display_name)):
            if value:
                meta[name] = value
        if run.HasField("config"):
            _apply(meta["config"], run.config)
        if run.HasField("summary"):
            _apply(meta["summary"], run.summary)

    def _note_file_state(self, log: RecordLog) -> None:
        """An unfinished last record is reported while it is unfinished (as of now); damage is in its own line."""
        old = self._tail_warnings.pop(log.path, None)
        if old is not None and old in self.report.warnings:
            self.report.warnings.remove(old)
        if log.tail_bytes:
            state = "truncated" if self.finished else "still being written, or truncated"
            msg = (
                f"{log.path}: ends inside a record at byte {log.offset} ({log.tail_bytes} bytes not yet a "
                f"complete record: {state}); the records before it are read"
            )
            self._tail_warnings[log.path] = msg
            self.report.warn(msg)

    def _publish(self) -> None:
        meta = dict(self._meta)
        meta["config"] = _decoded(meta["config"])
        meta["summary"] = _decoded(meta["summary"])
        self.report.metadata = meta
        if self._dropped_values:
            shown = ", ".join(f"'{k}' ({n})" for k, n in self._dropped_values.most_common(5))
            more = len(self._dropped_values) - 5
            line = (
                f"{sum(self._dropped_values.values())} non-numeric history values dropped (text, media, lists): "
                f"{shown}{f' and {more} more keys' if more > 0 else ''}"
            )
            self.report.warnings = [w for w in self.report.warnings if "non-numeric history values" not in w]
            self.report.warn(line)


def _without_media(keys: list[str], values: list[Any], dropped: Counter[str]) -> tuple[list[str], list[Any]]:
    """Drop media objects (histograms, images, tables), which W&B splits into ``name/_type``, ``name/values``, ...;
    each counts once, under its name. Their numeric parts (bin counts, sizes) are not metrics."""
    media = tuple(k[: -len(MEDIA_MARK)] for k in keys if k.endswith(MEDIA_MARK))
    prefixes = tuple(m + "/" for m in media)
    dropped.update(media)
    kept = [(k, v) for k, v in zip(keys, values) if k not in media and not k.startswith(prefixes)]
    return [k for k, _ in kept], [v for _, v in kept]


def _apply(target: dict[str, Any], update_record) -> None:
    """Apply a config/summary record: its updates, then its removals (items are decoded once, when published)."""
    for item in update_record.update:
        nested = item.nested_key
        target[nested[0] if len(nested) == 1 else "/".join(nested) if nested else item.key] = item
    for item in update_record.remove:
        target.pop(item_key(item), None)


def _decoded(items: dict[str, Any]) -> dict[str, Any]:
    """Config/summary items -> values, W&B's internal keys left out."""
    return {k: _item_or_text(v) for k, v in items.items() if not is_internal(k)}


def _item_or_text(item) -> Any:
    try:
        return item_value(item)
    except ValueError:
        return item.value_json


def _loads_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _column(table: pa.Table, name: str | None, n: int) -> np.ndarray:
    """A float64 column of ``n`` rows as numpy (NaN where null), all NaN when absent (a table of rows that wrote
    nothing has no columns, and so no rows)."""
    if name is None or name not in table.column_names:
        return np.full(n, np.nan)
    return table.column(name).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)


def _step_at(steps: np.ndarray, i: int) -> int | None:
    step = float(steps[i])
    return int(step) if math.isfinite(step) else None
