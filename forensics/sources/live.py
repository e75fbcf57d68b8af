"""Watching a run that is still writing: several sources, one merged table, and what changed since the last poll.

The dashboard holds one :class:`LiveMetrics` and calls :meth:`LiveMetrics.poll` on a timer. Each reader resumes
from where it stopped (byte offsets, last record), so a poll costs the new data plus one merge of the tables read
so far, and a half-written last line is picked up on the poll after it is finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from forensics.schema import STEP, metrics_table
from forensics.sources.ingest import IngestReport, merge_readers, open_readers


class LiveMetrics:
    """Readers for several sources of one run; :meth:`poll` returns the merged table and the rows new to it.

    Options are those of :func:`forensics.sources.read_metrics`. ``report`` is rebuilt on every poll.
    """

    def __init__(
        self,
        sources: Sequence[str | Path],
        *,
        keys: Sequence[str] | None = None,
        step_key: str | None = None,
        step_offset: int | None = None,
        pattern: str | None = None,
        strict: bool = False,
        run_id: str | None = None,
    ) -> None:
        if isinstance(sources, (str, Path)):
            sources = [sources]
        self.readers = open_readers(
            sources, keys=keys, step_key=step_key, pattern=pattern, strict=strict, run_id=run_id
        )
        self.keys = keys
        self.step_offset = step_offset
        self._table = metrics_table(np.array([], dtype=np.int64), {})
        self.report = IngestReport()

    @property
    def table(self) -> pd.DataFrame:
        """The merged metrics table as of the last poll (step offset applied)."""
        return self._table

    def poll(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Read what every source appended; return ``(table, new_rows)``.

        ``new_rows`` holds the current merged rows of every step written since the last poll (a step written again
        by a resumed run comes back with its new values); it is empty when nothing changed.
        """
        touched = []
        for reader in self.readers:
            new = reader.read_new()
            if len(new):
                touched.append((reader, new[STEP].to_numpy(dtype=np.int64)))
        if not touched and len(self._table):
            return self._table, self._table.iloc[0:0]
        self._table, self.report = merge_readers(self.readers, self.step_offset, self.keys)
        if not touched:
            return self._table, self._table.iloc[0:0]
        offsets = {a.source: a.step_offset for a in self.report.alignments}
        # sort + neighbour test, not np.unique: numpy 2.4's hash-based unique takes seconds on 1M int64 steps
        steps = np.sort(np.concatenate([t - np.int64(offsets.get(r.source, 0)) for r, t in touched]))
        steps = steps[np.concatenate(([True], steps[1:] != steps[:-1]))]
        pos = np.searchsorted(self._table[STEP].to_numpy(), steps)
        return self._table, self._table.iloc[pos].reset_index(drop=True)
