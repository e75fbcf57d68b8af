"""The sources stage: readers that turn logs (W&B, JSONL, CSV, TensorBoard, text) into the metrics table.

- :mod:`~forensics.sources.reader`: what every reader shares: the base class, the records it hands over and its
  report, records -> rows, growing files;
- :mod:`~forensics.sources.registry`: the formats and how a source's format is recognised;
- :mod:`~forensics.sources.merge`: several sources on one step;
- :mod:`~forensics.sources.read`: :func:`read_metrics` (a finished run), :mod:`~forensics.sources.live`:
  :class:`LiveMetrics` (a run still writing);
- one module per format (``jsonl``, ``csv_export``, ``text_log``, ``tensorboard``, ...); W&B in ``wandb/``.
"""

from forensics.sources.live import LiveMetrics
from forensics.sources.read import IngestReport, SourceAlignment, merge_readers, open_readers, read_metrics, summarize
from forensics.sources.reader.base import MetricsReader
from forensics.sources.reader.records import STEP_KEYS, ReaderReport, Records
from forensics.sources.registry import FORMATS, detect_format, open_reader

__all__ = [
    "FORMATS", "STEP_KEYS", "IngestReport", "LiveMetrics", "MetricsReader", "ReaderReport", "Records",
    "SourceAlignment", "detect_format", "merge_readers", "open_reader", "open_readers", "read_metrics", "summarize",
]
