"""The sources stage: readers that turn logs (W&B, JSONL, CSV, TensorBoard, text) into the metrics table.

Reading a run (start here):

- :mod:`~forensics.sources.ingest`: :func:`read_metrics` (a finished run: one reader per source, each aligned, merged
  on step, with its :class:`IngestReport`) and ``forensics ingest``;
- :mod:`~forensics.sources.live`: :class:`LiveMetrics` (a run still writing: each poll reads only what was appended);
- :mod:`~forensics.sources.registry`: the formats, how a source's format is recognised, :func:`open_reader`;
- :mod:`~forensics.sources.step_conventions`: how a source counts its steps (HF Trainer, W&B) and the step offset.

One reader per format, each a :class:`MetricsReader`:

- :mod:`~forensics.sources.jsonl` (JSON Lines), :mod:`~forensics.sources.json_document` (one JSON document, HF's
  ``trainer_state.json``), :mod:`~forensics.sources.csv_table` (CSV/TSV, W&B chart exports),
  :mod:`~forensics.sources.text_log` (plain-text logs), :mod:`~forensics.sources.parquet` (canonical tables);
- :mod:`~forensics.sources.tensorboard` (event files and their TFRecord framing);
- :mod:`~forensics.sources.wandb` (``.wandb`` run files, their compiled scanner, and the public API).

What every reader shares: :mod:`~forensics.sources.reader` (the base class, records and report, damage, records ->
rows, growing files).
"""

from forensics.sources.ingest import IngestReport, SourceAlignment, merge_readers, open_readers, read_metrics, summarize
from forensics.sources.live import LiveMetrics
from forensics.sources.reader.base import MetricsReader
from forensics.sources.reader.records import STEP_KEYS, ReaderReport, Records
from forensics.sources.registry import FORMATS, detect_format, open_reader

__all__ = [
    "FORMATS",
    "STEP_KEYS",
    "IngestReport",
    "LiveMetrics",
    "MetricsReader",
    "ReaderReport",
    "Records",
    "SourceAlignment",
    "detect_format",
    "merge_readers",
    "open_reader",
    "open_readers",
    "read_metrics",
    "summarize",
]
