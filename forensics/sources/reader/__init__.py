"""What every format's reader shares: the base class, the records it hands over, how they become rows, and tailing.

- :mod:`~forensics.sources.reader.base`: :class:`MetricsReader`, the base class (a subclass says only how to get the
  records written since its last call; ``read_new`` / ``read_all`` / ``report`` are the same for every format);
- :mod:`~forensics.sources.reader.records`: plain data: :class:`Records` (what a reader hands over), :class:`Damage`
  (a region skipped because its checksums failed) and :class:`ReaderReport` (counts and quirks beside the rows);
- :mod:`~forensics.sources.reader.rows`: the one place where records become metrics rows (step key, flattening,
  casting, rewinds, last write wins);
- :mod:`~forensics.sources.reader.tail`: growing files, read from a byte offset in complete lines (live logs).
"""

from forensics.sources.reader.base import MetricsReader
from forensics.sources.reader.records import STEP_KEYS, Damage, ReaderReport, Records

__all__ = ["STEP_KEYS", "Damage", "MetricsReader", "ReaderReport", "Records"]
