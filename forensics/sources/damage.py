"""Damage found in a run file: where records were skipped because their checksums (or structure) failed.

A damaged record is never read (no value of it can be trusted) and never filled in: the steps it held stay missing
in the metrics table. The readers skip only the damaged bytes and carry on at the next record whose own checksums
verify, so one bad byte costs one record, not the rest of the run. Each skipped region is one :class:`Damage`;
:attr:`forensics.sources.records.ReaderReport.damaged` lists them per source, and :func:`damage_line` is the one
warning line a source gets for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Offsets quoted in the warning line (all are counted, and all are in ``ReaderReport.damaged``).
MAX_QUOTED = 5


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
    shown = "; ".join(f"{d.file + ':' if d.file else ''}{d.offset}, {describe_steps(d.steps)}"
                      for d in damages[:MAX_QUOTED])
    more = f" and {len(damages) - MAX_QUOTED} more" if len(damages) > MAX_QUOTED else ""
    reasons = "; ".join(sorted({d.reason for d in damages}))
    n = len(damages)
    return (f"{n} record{'s' if n != 1 else ''} skipped for damage at byte offset{'s' if n != 1 else ''} "
            f"{shown}{more} ({reasons}): a value logged in that range is missing, never filled in")
