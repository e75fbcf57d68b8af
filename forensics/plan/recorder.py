"""Record the batch plan while training runs: which samples each batch held, as the loader draws it.

Two ways in:

- :class:`PlanRecorder`, plain Python (numpy + pyarrow, no torch): call ``record(sample_ids)`` once per batch.
- :class:`RecordingSampler`, a torch ``Sampler`` wrapping any sampler or batch sampler (``DistributedSampler``,
  ``BatchSampler``, a bucketing batch sampler...). torch is imported only when the first one is built, so the
  module imports without torch.

What the caller may rely on:

- **Layout**: a folder of Parquet parts ``part-000000.parquet``, ... (``part-r00003-000000.parquet`` for rank 3)
  with ``epoch``, ``batch_id``, ``sample_id`` (int64), ``rank`` when the recorder was given one, and ``step`` /
  ``micro`` when the caller passes them. ``forensics.schema.load_plan(folder)`` reads it, also while the run goes on.
- **Crash safety**: rows are buffered and written as one part every ``flush_every`` batches or ``flush_seconds``
  seconds, whichever comes first; each part is written to ``*.parquet.tmp``, synced, then atomically renamed. A killed
  run loses at most its unflushed batches (never a half-written part); a normal exit or garbage collection flushes.
- **Resume**: reopen the folder with ``resume=True``. The recorder reads the last recorded (``epoch``, ``batch_id``)
  of its rank and from then on *skips every batch at or before it*: a trainer that resumes from a checkpoint and
  replays part of an epoch (its sampler being deterministic, as a seeded one is) records neither a duplicate nor a
  gap beyond the unflushed part. A run that rewinds further than the last recorded batch must be deterministic for
  the plan to stay true; :attr:`PlanRecorder.skipped` counts the replayed batches. Opening a folder that already
  holds parts of this rank without ``resume=True`` is refused, so that a new run never mixes with an old one.
- **Cost**: ``record`` appends one numpy array to a list (a few microseconds; ``bench/bench_recorder.py``).
"""

from __future__ import annotations

import os
import re
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

EPOCH, BATCH_ID, SAMPLE_ID, RANK, STEP, MICRO = "epoch", "batch_id", "sample_id", "rank", "step", "micro"
_PART = re.compile(r"^part-(?:r(?P<rank>\d+)-)?(?P<seq>\d+)\.parquet$")


def part_name(seq: int, rank: int | None) -> str:
    """The file name of part ``seq`` of ``rank`` (names sort in write order)."""
    return f"part-{seq:06d}.parquet" if rank is None else f"part-r{rank:05d}-{seq:06d}.parquet"


def recorded_parts(folder: str | Path, rank: int | None = None, all_ranks: bool = False) -> list[Path]:
    """The finished parts in ``folder`` (of one rank, or of every rank), in write order."""
    out = []
    for path in Path(folder).glob("part-*.parquet"):
        m = _PART.match(path.name)
        if not m:
            continue
        part_rank = None if m["rank"] is None else int(m["rank"])
        if all_ranks or part_rank == rank:
            out.append((part_rank if part_rank is not None else -1, int(m["seq"]), path))
    return [p for _, _, p in sorted(out)]


class _PartBuffer:
    """The unflushed rows and the part counter; kept apart from the recorder so a finalizer can flush it."""

    def __init__(self, folder: Path, rank: int | None, seq: int) -> None:
        self.folder, self.rank, self.seq = folder, rank, seq
        self.ids: list[np.ndarray] = []
        self.epochs: list[int] = []
        self.batch_ids: list[int] = []
        self.steps: list[int] = []
        self.micros: list[int] = []
        self.has_step: bool | None = None
        self.has_micro: bool | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def flush(self) -> Path | None:
        """Write the buffered batches as one part (temp name, fsync, atomic rename); return its path."""
        if not self.ids:
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq

        sizes = np.fromiter((len(a) for a in self.ids), dtype=np.int64, count=len(self.ids))
        columns: dict[str, np.ndarray] = {
            EPOCH: np.repeat(np.asarray(self.epochs, dtype=np.int64), sizes),
            BATCH_ID: np.repeat(np.asarray(self.batch_ids, dtype=np.int64), sizes),
        }
        if self.rank is not None:
            columns[RANK] = np.full(int(sizes.sum()), self.rank, dtype=np.int64)
        if self.has_step:
            columns[STEP] = np.repeat(np.asarray(self.steps, dtype=np.int64), sizes)
        if self.has_micro:
            columns[MICRO] = np.repeat(np.asarray(self.micros, dtype=np.int64), sizes)
        columns[SAMPLE_ID] = np.concatenate(self.ids)
        table = pa.table(columns)
        final = self.folder / part_name(self.seq, self.rank)
        tmp = final.with_name(final.name + ".tmp")
        with open(tmp, "wb") as fh:
            # dictionary encoding suits the repetitive key columns and only wastes time on the ids
            pq.write_table(table, fh, use_dictionary=[c for c in columns if c != SAMPLE_ID])
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        self.seq += 1
        self.ids.clear()
        self.epochs.clear()
        self.batch_ids.clear()
        self.steps.clear()
        self.micros.clear()
        return final

    def flush_at_exit(self) -> None:
        """The finalizer's flush: at interpreter exit a failure (the folder was removed) is a warning, not a
        traceback."""
        try:
            self.flush()
        except OSError as exc:
            warnings.warn(
                f"plan recorder: {len(self.ids)} batches could not be written to {self.folder}: {exc}",
                RuntimeWarning,
                stacklevel=1,
            )


class PlanRecorder:
    """Write (``epoch``, ``batch_id``, ``sample_id``) per batch to Parquet parts in ``folder``; see the module doc.

    Parameters
    ----------
    folder: where the parts go (created if missing). Several ranks may share one folder: each writes its own parts.
    rank: this process's data-parallel rank, written as the ``rank`` column (``None``: no column, one stream).
    flush_every: batches per part. Larger parts are cheaper to read; smaller ones lose less on a crash.
    flush_seconds: a part is also written when this much time passed since the last one, so that a live reader
        sees the plan advance even on slow runs.
    resume: continue a folder that already holds parts of this rank (see the module doc); without it such a
        folder is refused.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        rank: int | None = None,
        flush_every: int = 4096,
        flush_seconds: float = 120.0,
        resume: bool = False,
    ) -> None:
        if flush_every < 1:
            raise ValueError(f"flush_every must be >= 1; got {flush_every}")
        if rank is not None and (int(rank) != rank or rank < 0):
            raise ValueError(f"rank must be a non-negative integer or None; got {rank!r}")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rank = None if rank is None else int(rank)
        self.flush_every = int(flush_every)
        self.flush_seconds = float(flush_seconds)
        self.skipped = 0
        self.recorded = 0
        for stale in self.folder.glob("part-*.parquet.tmp"):
            m = _PART.match(stale.name[: -len(".tmp")])
            if m and (None if m["rank"] is None else int(m["rank"])) == self.rank:
                stale.unlink(missing_ok=True)  # a part a killed run did not finish: never visible to readers
        parts = recorded_parts(self.folder, self.rank)
        self._last: tuple[int, int] | None = None
        seq = 0
        if parts:
            if not resume:
                who = "" if self.rank is None else f" of rank {self.rank}"
                raise FileExistsError(
                    f"{self.folder} already holds {len(parts)} plan parts{who}; pass resume=True to continue that "
                    "run, or record into a new folder"
                )
            seq = int(_PART.match(parts[-1].name)["seq"]) + 1
            self._last = _last_key(parts[-1])
        self._buffer = _PartBuffer(self.folder, self.rank, seq)
        if parts:
            names = _column_names(parts[-1])
            self._buffer.has_step, self._buffer.has_micro = STEP in names, MICRO in names
        self._closed = False
        self._finalizer = weakref.finalize(self, self._buffer.flush_at_exit)
        self._last_flush = time.monotonic()
        self.epoch = self._last[0] if self._last else 0
        self.next_batch_id = self._last[1] + 1 if self._last else 0

    # --- the one call per batch -----------------------------------------------------------------------------------
    def record(
        self,
        sample_ids: Iterable[int] | np.ndarray,
        *,
        epoch: int | None = None,
        batch_id: int | None = None,
        step: int | None = None,
        micro: int | None = None,
    ) -> bool:
        """Record one batch; return ``False`` when it was skipped as already recorded (a replay after a resume).

        ``epoch`` defaults to the current one (:meth:`set_epoch`), ``batch_id`` to the next in that epoch. Pass
        ``step``/``micro`` for every batch or for none (a plan's columns are the same in every row).
        """
        if self._closed:
            raise RuntimeError(f"the plan recorder of {self.folder} is closed")
        if epoch is None:
            epoch = self.epoch
        elif epoch != self.epoch:
            self.set_epoch(epoch)
        if batch_id is None:
            batch_id = self.next_batch_id
        self.next_batch_id = batch_id + 1
        key = (int(epoch), int(batch_id))
        if self._last is not None and key <= self._last:
            self.skipped += 1
            return False
        buf = self._buffer
        buf.has_step = _same_presence(buf.has_step, step, "step")
        buf.has_micro = _same_presence(buf.has_micro, micro, "micro")
        ids = np.asarray(sample_ids, dtype=np.int64).reshape(-1)
        buf.ids.append(ids)
        buf.epochs.append(key[0])
        buf.batch_ids.append(key[1])
        if step is not None:
            buf.steps.append(int(step))
        if micro is not None:
            buf.micros.append(int(micro))
        self._last = key
        self.recorded += 1
        if len(buf) >= self.flush_every or time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()
        return True

    def set_epoch(self, epoch: int, first_batch: int = 0) -> None:
        """Start epoch ``epoch``: batch ids count from ``first_batch`` (the batch a mid-epoch resume starts at)."""
        self.epoch = int(epoch)
        self.next_batch_id = int(first_batch)

    # --- state ------------------------------------------------------------------------------------------------------
    @property
    def last_recorded(self) -> tuple[int, int] | None:
        """The (``epoch``, ``batch_id``) of the last batch recorded (flushed or not), ``None`` before the first."""
        return self._last

    @property
    def pending(self) -> int:
        """Batches recorded but not yet written to a part (what a crash now would lose)."""
        return len(self._buffer)

    def flush(self) -> Path | None:
        """Write the buffered batches now as one part; return its path (``None`` when nothing was buffered)."""
        self._last_flush = time.monotonic()
        return self._buffer.flush()

    def close(self) -> None:
        """Flush and stop; recording after close is an error. Closing twice is harmless."""
        if not self._closed:
            self.flush()
            self._finalizer.detach()
            self._closed = True

    def __enter__(self) -> PlanRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _same_presence(had: bool | None, value: Any, name: str) -> bool:
    has = value is not None
    if had is not None and had != has:
        raise ValueError(f"pass '{name}' for every batch or for none: a plan's columns are the same in every row")
    return has


def _last_key(part: Path) -> tuple[int, int]:
    import pyarrow.parquet as pq

    table = pq.read_table(part, columns=[EPOCH, BATCH_ID])
    epochs = table.column(EPOCH).to_numpy()
    batches = table.column(BATCH_ID).to_numpy()
    return int(epochs[-1]), int(batches[-1])


def _column_names(part: Path) -> list[str]:
    import pyarrow.parquet as pq

    return list(pq.read_schema(part).names)


# --- the torch wrapper ---------------------------------------------------------------------------------------------
def _is_batch(item: Any) -> bool:
    if isinstance(item, (list, tuple, np.ndarray)):
        return True
    return getattr(item, "ndim", 0) >= 1  # a torch tensor of indices


class RecordingSampler:
    """Wrap a sampler or batch sampler; every batch drawn from it is recorded by ``recorder``.

    Give a batch sampler (anything yielding lists of indices) to ``DataLoader(batch_sampler=...)``; give a sampler of
    single indices with the DataLoader's ``batch_size`` (and ``drop_last``) to ``DataLoader(sampler=...,
    batch_size=...)``. ``sample_ids`` maps a dataset index to its ``sample_id`` (an array, or a callable; default:
    the index is the id). Batches are recorded when the loader draws them, which is up to its prefetch depth before
    the step consumes them. ``set_epoch`` is forwarded to the wrapped sampler.

    Every instance is also a ``torch.utils.data.Sampler``: building the first one makes the subclass that derives
    from both (:func:`_with_torch`), so that importing this module never imports torch, and a script without torch
    gets torch's ``ImportError`` when it builds a sampler, not when it imports the recorder.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> RecordingSampler:
        return super().__new__(_with_torch() if cls is RecordingSampler else cls)

    def __init__(
        self,
        sampler: Iterable,
        recorder: PlanRecorder,
        *,
        batch_size: int | None = None,
        drop_last: bool = False,
        sample_ids: Sequence[int] | np.ndarray | Callable[[int], int] | None = None,
        epoch: int = 0,
    ) -> None:
        self.sampler = sampler
        self.recorder = recorder
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._map = _id_mapper(sample_ids)
        self._next_epoch: int | None = int(epoch)
        self._first_batch = 0
        self._epoch = int(epoch)

    def set_epoch(self, epoch: int, first_batch: int = 0) -> None:
        """Forward ``set_epoch`` to the wrapped sampler (``DistributedSampler`` reshuffles on it) and start
        recording epoch ``epoch`` at batch ``first_batch`` (0 unless the loader resumes mid-epoch by skipping
        sampler output itself)."""
        self._next_epoch = int(epoch)
        self._first_batch = int(first_batch)
        for target in (self.sampler, getattr(self.sampler, "sampler", None)):
            fn = getattr(target, "set_epoch", None)
            if callable(fn):
                fn(epoch)
                break

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator:
        # An iteration is an epoch: without set_epoch since the last one, the epoch number advances by one.
        epoch = self._next_epoch if self._next_epoch is not None else self._epoch + 1
        self._epoch, self._next_epoch = epoch, None
        batch_id = self._first_batch
        self._first_batch = 0
        rec = self.recorder.record
        pending: list[int] = []
        for item in self.sampler:
            if _is_batch(item):
                rec(self._map(item), epoch=epoch, batch_id=batch_id)
                batch_id += 1
                yield item
                continue
            if self.batch_size is None:
                raise ValueError("the wrapped sampler yields single indices: give batch_size (the DataLoader's)")
            pending.append(int(item))
            if len(pending) == self.batch_size:
                rec(self._map(pending), epoch=epoch, batch_id=batch_id)
                batch_id += 1
                pending = []
            yield item
        if pending and not self.drop_last:
            rec(self._map(pending), epoch=epoch, batch_id=batch_id)

    def __getattr__(self, name: str) -> Any:
        # Frameworks read attributes of the sampler they were given (batch_size, num_replicas, seed...).
        if name.startswith("__") or name in ("sampler", "recorder"):
            raise AttributeError(name)
        return getattr(self.sampler, name)


def _id_mapper(sample_ids) -> Callable[[Any], np.ndarray]:
    if sample_ids is None:
        return lambda idx: np.asarray(idx, dtype=np.int64)
    if callable(sample_ids):
        return lambda idx: np.asarray([sample_ids(int(i)) for i in np.asarray(idx).reshape(-1)], dtype=np.int64)
    table = np.asarray(sample_ids, dtype=np.int64)
    return lambda idx: table[np.asarray(idx, dtype=np.int64)]


def _with_torch() -> type[RecordingSampler]:
    """:class:`RecordingSampler` combined with ``torch.utils.data.Sampler`` (made once, on first use).

    It is reachable as ``RecordingSampler.with_torch``, the name its ``__qualname__`` gives, so pickle finds it."""
    made = RecordingSampler.__dict__.get("with_torch")
    if made is None:
        from torch.utils.data import Sampler

        made = type(
            "RecordingSampler",
            (RecordingSampler, Sampler),
            {
                "__doc__": RecordingSampler.__doc__,
                "__module__": __name__,
                "__qualname__": "RecordingSampler.with_torch",
            },
        )
        RecordingSampler.with_torch = made  # type: ignore[attr-defined]
    return made
