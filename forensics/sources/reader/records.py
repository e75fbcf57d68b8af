"""What a reader hands over and what it reports: records in write order, the damage it skipped, and its report.

These are plain data, shared by the readers, the row accumulator and the merge; they import nothing of theirs.

Damage: a record whose checksums (or structure) fail is never read (no value of it can be trusted) and never filled
in: the steps it held stay missing in the metrics table. The readers skip only the damaged bytes and carry on at the
next record whose own checksums verify, so one bad byte costs one record, not the rest of the run. Each skipped region
is one :class:`Damage`; :attr:`ReaderReport.damaged` lists them per source, and :func:`damage_line` is the one warning
line a source gets for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from forensics.schema import Rewind
from forensics.schema.words import counted, plural

#: Step keys tried in this order (case-insensitive) when none is given.
STEP_KEYS = ("step", "_step", "global_step", "iter", "iteration")
#: Malformed records quoted in a report (all are counted).
MAX_EXAMPLES = 5
#: Damaged regions quoted in the warning line (all are counted, and all are in ``ReaderReport.damaged``).
MAX_QUOTED = 5


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


@dataclass(frozen=True)
class Damage:
    """One skipped region of a file.

    ``offset``: the byte where the damaged record starts (for a record split over blocks, where its first chunk
    starts). ``length``: bytes skipped up to the next record that verifies (None while unknown). ``reason``: the
    first check that failed (``"data checksum mismatch"``, ...). ``steps``: the steps of the last record read before
    and the first read after the region (either None at a file's start or end): the lost values lie in between.
    ``file``: which file of the source, when a source is a folder of files.
    """

    offset: int
    length: int | None
    reason: str
    steps: tuple[int | None, int | None] | None = None
    file: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A plain dict for ``findings.json`` (``run.sources[].damaged``)."""
        return {
            "file": self.file,
            "offset": self.offset,
            "length": self.length,
            "reason": self.reason,
            "steps": None if self.steps is None else list(self.steps),
        }


def describe_steps(steps: tuple[int | None, int | None] | None) -> str:
    """``steps a-b``, ``before step b``, ``after step a`` or ``steps unknown``."""
    low, high = steps if steps is not None else (None, None)
    if low is not None and high is not None:
        return f"steps {low}-{high}"
    if high is not None:
        return f"before step {high}"
    if low is not None:
        return f"after step {low}"
    return "steps unknown"


def damage_line(damages: Sequence[Damage]) -> str | None:
    """The warning for a source, e.g. ``2 records skipped for damage at byte offsets 29969, steps 219-220; 40960,
    steps 298-299 (data checksum mismatch): ...`` (None if there is no damage)."""
    if not damages:
        return None
    shown = "; ".join(
        f"{d.file + ':' if d.file else ''}{d.offset}, {describe_steps(d.steps)}" for d in damages[:MAX_QUOTED]
    )
    more = f" and {len(damages) - MAX_QUOTED} more" if len(damages) > MAX_QUOTED else ""
    reasons = "; ".join(sorted({d.reason for d in damages}))
    n = len(damages)
    return (
        f"{counted(n, 'record')} skipped for damage at byte {plural('offset', n)} "
        f"{shown}{more} ({reasons}): a value logged in that range is missing, never filled in"
    )


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
    #: Regions skipped because their checksums failed (:class:`Damage`), in file order.
    damaged: list[Damage] = field(default_factory=list)
    #: Per column, cells that are not numbers (kept as missing): ``{column: [count, examples]}``.
    bad_cells: dict[str, list] = field(default_factory=dict)
    #: Columns left out because no cell holds a number, and why (``holds no numeric value (e.g. 'high')``).
    left_out: dict[str, str] = field(default_factory=dict)

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
            out.append(
                f"{self.source}: column '{column}': {counted(n, 'cell')} not a number, kept as missing ({examples})"
            )
        out += [r.describe() for r in self.rewinds]
        out += [f"{self.source}: {w}" for w in self.warnings]
        return out
