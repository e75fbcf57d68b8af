"""Damage found in a run file: where records were skipped because their checksums (or structure) failed.

A damaged record is never read (no value of it can be trusted) and never filled in: the steps it held stay missing
in the metrics table. The readers skip only the damaged bytes and carry on at the next record whose own checksums
verify, so one bad byte costs one record, not the rest of the run. Each skipped region is one :class:`Damage`;
:attr:`forensics.sources.base.ReaderReport.damaged` lists them per source, and :func:`damage_line` is the one
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


def step_range(damages: Sequence[Damage]) -> tuple[int | None, int | None]:
    """The smallest and largest neighbouring step over all regions (None where no region has one)."""
    lows = [d.steps[0] for d in damages if d.steps is not None and d.steps[0] is not None]
    highs = [d.steps[1] for d in damages if d.steps is not None and d.steps[1] is not None]
    low = min(lows) if lows else None
    high = max(highs) if highs else None
    return low, high


def damage_line(damages: Sequence[Damage]) -> str | None:
    """The warning for a source: ``N records skipped for damage at byte offsets ..., steps a-b`` (None if none)."""
    if not damages:
        return None
    shown = ", ".join(f"{d.file}:{d.offset}" if d.file else str(d.offset) for d in damages[:MAX_QUOTED])
    more = f" and {len(damages) - MAX_QUOTED} more" if len(damages) > MAX_QUOTED else ""
    reasons = sorted({d.reason for d in damages})
    low, high = step_range(damages)
    if low is None and high is None:
        steps = "steps unknown"
    else:
        steps = f"steps {'start' if low is None else low}-{'end' if high is None else high}"
    n = len(damages)
    return (f"{n} record{'s' if n != 1 else ''} skipped for damage at byte offset{'s' if n != 1 else ''} "
            f"{shown}{more} ({'; '.join(reasons)}), {steps}: values there are missing, not filled in")
