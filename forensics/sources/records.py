"""What a reader hands over and what it reports: records in write order, and the reader's report.

These are plain data, shared by the readers, the ingest engine and the merge; they import nothing of theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from forensics.schema import Rewind

#: Step keys tried in this order (case-insensitive) when none is given.
STEP_KEYS = ("step", "_step", "global_step", "iter", "iteration")
#: Malformed records quoted in a report (all are counted).
MAX_EXAMPLES = 5


@dataclass
class Records:
    """Records a reader hook returns, in write order.

    ``table`` is a :class:`pyarrow.Table` (a null cell = not written; a NaN cell = a logged NaN) or a
    :class:`pandas.DataFrame` (a null cell = not written; in a plain float column there is no null, so every cell is
    written). It holds the step under its logged name and one column per key (nested structs are flattened by the
    engine). ``where`` gives each row's line number or byte offset for messages.
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


@dataclass
class ReaderReport:
    """What one reader found beside its rows: counts and quirks for the summary, never fatal on their own.

    ``rows`` counts records read (before last-write-wins), ``malformed`` the records skipped, each example being
    (line number or byte offset, short reason). ``nonfinite`` counts logged NaN/inf per metric. ``metadata`` holds
    what a source knows about its run (config, summary, run id). The rows themselves are in the reader's table,
    which carries every distinction (null = not written, NaN = logged NaN); this is only a report.
    """

    source: str
    format: str = ""
    rows: int = 0
    malformed: int = 0
    malformed_examples: list[tuple[int, str]] = field(default_factory=list)
    rewinds: list[Rewind] = field(default_factory=list)
    nonfinite: dict[str, dict[str, int]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Regions skipped because their checksums failed (:class:`forensics.sources.damage.Damage`), in file order.
    damaged: list = field(default_factory=list)
    #: Per column, cells that are not numbers (kept as missing): ``{column: [count, examples]}``.
    bad_cells: dict[str, list] = field(default_factory=dict)

    def add_cells(self, column: str, n: int, examples: str) -> None:
        entry = self.bad_cells.setdefault(column, [0, examples])
        entry[0] += n

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
        for column, (n, examples) in self.bad_cells.items():
            out.append(f"{self.source}: column '{column}': {n} cell{'s' if n > 1 else ''} not a number, kept as "
                       f"missing ({examples})")
        out += [r.describe() for r in self.rewinds]
        out += [f"{self.source}: {w}" for w in self.warnings]
        return out
