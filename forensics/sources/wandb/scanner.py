"""The ``.wandb`` reader's compiled path: framing, checksums and the protobuf of the records that matter, walked over
the bytes of a well-formed stretch of a run file in one numba loop.

Why: decoding every record into a protobuf object and every value from JSON, in Python, read ~25K rows/s, 20x
slower than the JSONL reader on the same rows; and two thirds of a run file are summary records (two per ``log``
call) whose only use is the run's final summary. This loop checks each chunk (header, CRC-32 by slicing-by-8, block
structure, split records reassembled), walks the protobuf wire format of history and summary records, and hands
back flat arrays: per row its byte offset and step, per value its row, key and JSON text (parsed to float64
afterwards, by Arrow, all at once), and per summary key only its last update or removal.

It does nothing irregular. It stops before the first chunk that fails a check and at the end of the bytes it was
given; :func:`read_run_file` then lets :class:`~forensics.sources.wandb.record_log.RecordLog` (the exact reader, which
resynchronises after damage and waits on a record still being written) read from there, one record, and carries on
here. Records whose meaning needs Python are handed over whole, as payloads, in file order: config, run and exit
records, records it cannot walk, and history rows that are not all plain numbers (text, media, lists, typed values,
a non-UTF-8 key). So a row is read by exactly one of the two paths, with the same result, and the Python path
(:meth:`~forensics.sources.wandb.run_reader.WandbRunReader._history_row`) stays the definition of what a row holds.
What it does not check, where protobuf would: the fields of records it skips (telemetry, stats, output) and the
strings of fields it ignores; their checksums verified, so only a broken writer could make them differ.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache, partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from forensics.compiled import loop
from forensics.errors import ForensicsError
from forensics.sources.reader.records import Damage
from forensics.sources.wandb import scan_kernel as K
from forensics.sources.wandb.record_log import _TYPE_CRC, RecordLog, record_class, wandb_protos
from forensics.sources.wandb.scan_kernel import END, FULL_TABLE, HANDED, LIMIT

#: Bytes read per compiled pass (a record longer than this doubles it for the pass that needs it).
WINDOW = 8 << 20
#: Bytes a window reads past its boundary, to finish the record it is inside there.
MARGIN = 1 << 20
#: Slots of each key table in a pass (half may fill; a pass that fills one doubles it for the next).
_TABLE_SLOTS = 4096


@lru_cache(maxsize=1)
def field_numbers() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The protobuf field numbers the loop needs (``scan_kernel.F_*``), the ``record_type`` oneof's members, and
    HistoryItem's typed values, from the installed ``wandb_internal_pb2`` (so a wandb that renumbered would still be
    read right); last in the numbers, the longest integer text Python's json reads (``F_INT_DIGITS``)."""
    pb = wandb_protos()
    record = pb.Record
    fields = record.DESCRIPTOR.fields_by_name
    history = pb.HistoryRecord.DESCRIPTOR.fields_by_name
    item = pb.HistoryItem.DESCRIPTOR.fields_by_name
    summary = pb.SummaryRecord.DESCRIPTOR.fields_by_name
    numbers = np.array(
        [
            fields["history"].number,
            fields["summary"].number,
            fields["config"].number,
            fields["run"].number,
            fields["exit"].number,
            history["item"].number,
            history["step"].number,
            pb.HistoryStep.DESCRIPTOR.fields_by_name["num"].number,
            item["key"].number,
            item["nested_key"].number,
            item["value_json"].number,
            summary["update"].number,
            summary["remove"].number,
            sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0,
        ],
        dtype=np.int64,
    )
    oneof = np.zeros(max(f.number for f in record.DESCRIPTOR.fields) + 1, dtype=np.bool_)
    for f in record.DESCRIPTOR.oneofs_by_name["record_type"].fields:
        oneof[f.number] = True
    typed = np.zeros(max(f.number for f in pb.HistoryItem.DESCRIPTOR.fields) + 1, dtype=np.bool_)
    for f in pb.HistoryItem.DESCRIPTOR.oneofs_by_name["value"].fields:
        typed[f.number] = True
    return numbers, oneof, typed


def crc_tables() -> np.ndarray:
    """The 8 x 256 tables of slicing-by-8 CRC-32 (the IEEE polynomial, reflected, as zlib computes it)."""
    t = np.arange(256, dtype=np.int64)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ 0xEDB88320, t >> 1)
    tables = [t]
    for _ in range(7):
        prev = tables[-1]
        tables.append((prev >> 8) ^ tables[0][prev & 0xFF])
    return np.stack(tables)


_CRC = crc_tables()
_TYPE_CRCS = np.array(_TYPE_CRC, dtype=np.int64)


@dataclass
class ScanBatch:
    """What one compiled pass read: rows, their values, the last summary operations, and the records it handed over.

    ``row_offset``/``row_step``: each row's byte offset and ``HistoryStep.num``. ``item_*``: one entry per value, its
    row (index into the rows), its key (index into ``keys``) and its kind (``scan_kernel.V_*``); ``values``: float64
    (a null's is a placeholder). ``summary``: per key the pass touched, ``(last operation (S_UPDATE or S_REMOVE),
    rank of its first update since its last removal (-1 for none), whether the pass removed it, SummaryItem
    bytes)``. ``handed``: ``(start, end, payload)`` of each record for the Python path, in file order (only the last
    of them can change the summary).
    """

    row_offset: np.ndarray
    row_step: np.ndarray
    item_row: np.ndarray
    item_key: np.ndarray
    item_kind: np.ndarray
    values: np.ndarray
    keys: list[str]
    summary: list[tuple[int, int, bool, bytes]]
    handed: list[tuple[int, int, bytes]]


def read_run_file(log: RecordLog, finished: bool) -> Iterator[ScanBatch | tuple[int, object]]:
    """Everything after ``log.offset``: :class:`ScanBatch` es from the compiled path and, where it stops on something
    irregular, ``(start, Record)`` pairs from the exact reader, in file order; ``log.offset``, ``log.tail_bytes``
    and ``log.damaged`` end as :meth:`RecordLog.records` leaves them.

    The file is walked in windows that end at a block boundary (a pass finishes the record it is inside, reading
    into the next window's bytes). Every block starts with a chunk header, so with two free cores the next window
    is walked at the same time, on a second pass, from its boundary: it passes over the end of the record the first
    finishes and starts at the first record after it. It is used only if it starts exactly where the first stopped
    (both walked the same chunks), which fails only at something irregular; then the file is walked in order from
    there, as it is with one core.
    """
    try:
        fh = log.path.open("rb")
    except FileNotFoundError as exc:
        raise ForensicsError(f"W&B run file {log.path} does not exist") from exc
    except OSError as exc:
        raise ForensicsError(f"W&B run file {log.path} could not be read: {exc}") from exc
    with fh:
        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="wandb-scan") if _two_cores() else None
        queue: deque = deque()  # (pass, start, skip, future): windows being walked, in file order
        spare: list[_Pass] = []

        def launch(start: int, skip: bool, window: int | None = None) -> None:
            p = spare.pop() if spare else _Pass(WINDOW)
            if window is not None and window > p.window:
                p._sized(window)  # here, not on the worker: the next window's boundary is read from it now
            work = partial(p.read_and_scan, fh, start, window, skip)
            queue.append((p, start, skip, pool.submit(work) if pool is not None else _done(work)))

        def drain() -> None:
            while queue:
                p, _, _, future = queue.popleft()
                try:
                    future.result()
                except Exception:  # noqa: BLE001 - a window read ahead and dropped: its error is not the caller's
                    pass
                spare.append(p)

        def restart(start: int, window: int | None = None) -> None:
            launch(start, False, window)
            if pool is not None:
                launch(queue[-1][0].boundary(start), True)

        try:
            if log.offset == 0 and not log.read_header(fh):
                return
            restart(log.offset)
            while True:
                p, start, skip, future = queue.popleft()
                stop, why, got, at_eof, first, batch = future.result()
                if skip and first != _past_padding(log.offset):  # does not join the window before it: in order
                    spare.append(p)
                    drain()
                    restart(log.offset)
                    continue
                if skip and stop == first:  # it took nothing: the offset stays after the last record
                    stop = log.offset
                log.offset = stop
                spare.append(p)  # its batch was copied out: free for the next window
                if why == LIMIT:
                    if queue:  # the next window is being walked: walk the one after it too
                        launch(queue[-1][0].boundary(queue[-1][1]), True)
                    else:
                        restart(stop)
                    if len(batch.row_offset) or batch.summary or batch.handed:
                        yield batch
                    continue
                drain()
                if len(batch.row_offset) or batch.summary or batch.handed:
                    yield batch
                if why == HANDED:
                    restart(stop)
                    continue
                if why == FULL_TABLE:
                    for q in spare:
                        q.grow()
                    restart(stop)
                    continue
                if why == END:
                    if at_eof and stop == start + got:
                        log.tail_bytes = 0
                        return
                    if not at_eof:  # the window ended inside a record; none whole in it: one longer than it
                        restart(stop, 2 * p.window if stop == start else None)
                        continue
                # A chunk that fails a check, or bytes at the end that are not a whole record: the exact reader reads
                # from here, up to its first record (past any damage), then the compiled path carries on.
                record = next(log.records(finished), None)
                if record is None:
                    return  # nothing complete after ``stop`` yet: ``tail_bytes`` and any damage are set
                yield record
                restart(log.offset)
        except OSError as exc:
            raise ForensicsError(f"W&B run file {log.path} could not be read: {exc}") from exc
        finally:
            drain()  # before the file closes: a window may still be read on it
            if pool is not None:
                pool.shutdown(wait=True)


def _past_padding(offset: int) -> int:
    """Where the next chunk after ``offset`` starts: past a block tail too short for a chunk header."""
    left = K.BLOCK - offset % K.BLOCK
    return offset + left if left < K.HDR else offset


def _done(work) -> Future:
    """``work`` run now, as a finished future (one core: nothing is read ahead)."""
    future: Future = Future()
    try:
        future.set_result(work())
    except Exception as exc:  # noqa: BLE001 - raised from result(), as a pool's future would
        future.set_exception(exc)
    return future


def warm() -> None:
    """Load the compiled loop now (numba's import, its CPU target, the cached machine code: a few tenths of a second,
    once per process) rather than on the first read."""
    import tempfile

    with tempfile.TemporaryFile() as fh:
        fh.write(bytes(8))
        fh.flush()
        _Pass(MARGIN + (64 << 10)).read_and_scan(fh, 0)
    one = np.zeros(1, dtype=np.int64)
    pivot = loop("wandb_pivot", 0)
    pivot(
        np.zeros((1, 1)),
        np.zeros((1, 1), dtype=np.bool_),
        np.zeros((2, 1), dtype=np.int64),
        one,
        one,
        np.zeros(1),
        np.zeros(1, dtype=np.int8),
        one,
        one,
        0,
        0,
    )


_READ_LOCK = threading.Lock()


def _pread(fh, into: memoryview, offset: int) -> int:
    """Read into ``into`` from ``offset`` without moving ``fh`` (two windows may be read at once)."""
    if hasattr(os, "preadv"):
        total = 0
        while total < len(into):
            n = os.preadv(fh.fileno(), [into[total:]], offset + total)
            if n == 0:
                break
            total += n
        return total
    with _READ_LOCK:
        fh.seek(offset)
        return fh.readinto(into) or 0


def _two_cores() -> bool:
    from forensics import _threads

    return (_threads.SIZED_TO or 1) >= 2


class _Pass:
    """One compiled pass and its buffers, allocated once per read and reused by each pass (outputs are copied out):
    those bounded by the bytes of a window are sized for its worst case (``np.empty`` pages are only touched as they
    are written); the key tables and the value arrays start small and double when a pass fills them."""

    def __init__(self, window: int) -> None:
        self.numbers, self.oneof, self.typed = field_numbers()
        self.slots = _TABLE_SLOTS
        self.capacity = max(1 << 16, window // 16)
        self._sized(window)

    def _sized(self, window: int) -> None:
        self.window = window
        self.space = bytearray(window)
        records = window // K.HDR + 2
        self.rows = np.empty((2, records), dtype=np.int64)
        self.handed = np.empty((3, records + 1), dtype=np.int64)
        self.vbuf = np.empty(window + 1, dtype=np.uint8)
        self.sstore = np.empty(window + 1, dtype=np.uint8)
        self.hbuf = np.empty(window + 1, dtype=np.uint8)
        self.asm = np.empty(window + 1, dtype=np.uint8)
        self.kbuf = np.empty(2 * window + 2, dtype=np.uint8)
        self._grown(self.slots, self.capacity)

    def _grown(self, slots: int, capacity: int) -> None:
        self.slots, self.capacity = slots, capacity
        self.items = np.empty((2, capacity), dtype=np.int64)
        self.kinds = np.empty(capacity, dtype=np.int8)
        self.voff = np.empty(capacity + 1, dtype=np.int64)
        self.pending = np.empty((4, capacity), dtype=np.int64)
        self.htab, self.stab = _table(slots), _table(slots)
        self.hpool = np.empty(slots * 32, dtype=np.uint8)
        self.spool = np.empty(slots * 32, dtype=np.uint8)
        self.sitems = np.zeros((6, slots // 2 + 1), dtype=np.int64)

    def grow(self) -> None:
        """After a pass that filled a key table or the value arrays."""
        self._grown(2 * self.slots, 2 * self.capacity)

    def boundary(self, start: int) -> int:
        """Where a window from ``start`` ends: the last block boundary at least ``MARGIN`` (a quarter of a small
        window) before its bytes end, and at least the next one after ``start`` and any padding there (a window
        that starts in a block's padding must still reach a record)."""
        end = (start + self.window - min(MARGIN, self.window // 4)) // K.BLOCK * K.BLOCK
        return max(end, ((start + K.HDR - 1) // K.BLOCK + 1) * K.BLOCK)  # past padding at ``start`` too

    def read_and_scan(
        self, fh, start: int, window: int | None = None, skip: bool = False
    ) -> tuple[int, int, int, bool, int, ScanBatch]:
        """Read a window of the file from ``start`` and walk it up to its boundary: (stop, why, bytes read, at the
        end, where its first record starts, what it read). With ``skip``, ``start`` is a block boundary, maybe inside
        a record. The pass's buffers are free again when it returns."""
        if window is not None and window > self.window:
            self._sized(window)
        got = _pread(fh, memoryview(self.space)[: self.window], start)
        at_eof = got < self.window  # a short read of a regular file: its end, as of now
        self.data = np.frombuffer(self.space, dtype=np.uint8, count=got)  # writable: the loop's buffer type
        self.counts = np.zeros(5, dtype=np.int64)
        if not got:
            return start, END, 0, True, -1 if skip else start, self.batch()
        self.voff[0] = 0
        self.handed[2, 0] = 0
        for table in (self.htab, self.stab):
            table[0] = -1
            table[2, 0] = 0
        self.sitems[0] = 0
        self.sitems[4] = -1
        self.sitems[5] = 0
        limit = self.boundary(start) - start
        scan = loop("wandb_scan", 0)
        stop, why, first = scan(
            self.data,
            start,
            limit,
            skip,
            self.numbers,
            self.oneof,
            self.typed,
            _CRC,
            _TYPE_CRCS,
            self.counts,
            self.rows,
            self.items,
            self.kinds,
            self.voff,
            self.vbuf,
            self.htab,
            self.hpool,
            self.stab,
            self.spool,
            self.sitems,
            self.sstore,
            self.handed,
            self.hbuf,
            self.asm,
            self.kbuf,
            self.pending,
        )
        return int(stop), int(why), got, at_eof, int(first), self.batch()

    def batch(self) -> ScanBatch:
        """What the last pass read, copied out of the buffers."""
        r, m, hk, sk, nh = (int(c) for c in self.counts)
        koff, hpool = self.htab[2], self.hpool
        keys = [hpool[koff[i] : koff[i + 1]].tobytes().decode("utf-8") for i in range(hk)]
        values = _parse_values(self.vbuf[: self.voff[m]], self.voff[: m + 1])
        summary = [
            (int(op), int(rank), bool(removed), (self.data if where == 0 else self.sstore)[a:b].tobytes())
            for op, where, a, b, rank, removed in self.sitems[:, :sk].T
            if op
        ]
        handed, hoff = self.handed, self.handed[2]
        handed_records = [
            (int(handed[0, i]), int(handed[1, i]), self.hbuf[hoff[i] : hoff[i + 1]].tobytes()) for i in range(nh)
        ]
        return ScanBatch(
            self.rows[0, :r].copy(),
            self.rows[1, :r].copy(),
            self.items[0, :m].copy(),
            self.items[1, :m].copy(),
            self.kinds[:m].copy(),
            values,
            keys,
            summary,
            handed_records,
        )


def _table(slots: int) -> np.ndarray:
    """An empty key table: slots (-1 = free), each key's hash, each key's start in its pool."""
    table = np.empty((3, slots), dtype=np.int64)
    table[0] = -1
    table[2, 0] = 0
    return table


def _parse_values(vbuf: np.ndarray, voff: np.ndarray) -> np.ndarray:
    """Every value's JSON text to float64 in one Arrow cast: correctly rounded, as Python's ``float`` is, and
    ``NaN``/``Infinity`` as Python's json reads them (the loop has checked the grammar, and wrote true, false and
    null as 1, 0 and 0, the integer -0 as 0)."""
    if len(voff) <= 1:
        return np.empty(0)
    texts = pa.LargeStringArray.from_buffers(len(voff) - 1, pa.py_buffer(voff), pa.py_buffer(vbuf))
    return pc.cast(texts, pa.float64()).to_numpy(zero_copy_only=False)


def handed_record(log: RecordLog, start: int, end: int, payload: bytes):
    """A handed-over payload as a ``Record``, or None (and a damaged region, as :meth:`RecordLog.records` counts
    one) when it does not decode."""
    rec = record_class()()
    try:
        rec.ParseFromString(payload)
    except Exception as exc:  # protobuf's DecodeError: the checksum passed, so the writer wrote it so
        log.damaged.append(Damage(start, end - start, f"record does not decode as a W&B Record: {exc}"))
        return None
    return rec


def rows_table_of(
    batches: list[ScanBatch], slow: list[tuple[int, dict[str, float]]], kept, fill_step: str | None
) -> tuple[pa.Table, np.ndarray]:
    """The rows of one read, from both paths, in file order: an Arrow table (one float64 column per key, first-seen
    order, null where a row did not write it, NaN where it logged NaN) and each row's byte offset.

    ``kept(key)`` says which keys are columns; ``fill_step`` names the column that takes ``HistoryStep.num`` in a
    compiled-path row that did not log it (the Python path fills its own rows).
    """
    fast = np.concatenate([b.row_offset for b in batches]) if batches else np.empty(0, np.int64)
    offsets = np.concatenate([fast, np.array([o for o, _ in slow], dtype=np.int64)])
    if not len(offsets):
        return pa.table({}), offsets
    order = np.argsort(offsets, kind="stable")
    final = np.empty(len(order), dtype=np.int64)
    final[order] = np.arange(len(order))
    columns: dict[str, int] = {}
    maps = []
    for b in batches:
        maps.append(np.array([columns.setdefault(k, len(columns)) if kept(k) else -1 for k in b.keys], dtype=np.int64))
    for _, row in slow:
        for key in row:
            columns.setdefault(key, len(columns))
    if fill_step is not None and len(fast):
        columns.setdefault(fill_step, len(columns))
    n = len(offsets)
    out = np.full((len(columns), n), np.nan)
    valid = np.zeros((len(columns), n), dtype=np.bool_)
    # Columns come in the order a row first wrote them (as the Python path's dicts do): per column, the (row, rank
    # within the row) of its first write.
    never = np.iinfo(np.int64).max
    first = np.full((2, len(columns)), never, dtype=np.int64)
    r0 = rank0 = 0
    pivot = loop("wandb_pivot", 0)
    for b, colmap in zip(batches, maps):
        pivot(out, valid, first, b.item_key, b.item_row, b.values, b.item_kind, colmap, final, r0, rank0)
        r0 += len(b.row_offset)
        rank0 += len(b.item_key)
    for (_, row), i in zip(slow, final[len(fast) :].tolist()):
        for rank, (key, value) in enumerate(row.items()):
            c = columns[key]
            out[c, i] = value
            valid[c, i] = True
            if i < first[0, c]:
                first[:, c] = (i, rank)
    if fill_step is not None and len(fast):
        c = columns[fill_step]
        at = final[: len(fast)]
        missing = ~valid[c, at]
        out[c, at[missing]] = np.concatenate([b.row_step for b in batches])[missing]
        valid[c, at[missing]] = True
        if missing.any() and at[missing].min() < first[0, c]:
            first[:, c] = (at[missing].min(), never - 1)  # filled after the row's own values
    names = list(columns)
    table = pa.table(
        {
            names[c]: pa.array(out[c], mask=~valid[c])
            for c in np.lexsort((first[1], first[0])).tolist()
            if first[0, c] != never
        }
    )
    return table, offsets[order]
