"""The sources stage: readers that turn logs (W&B, JSONL, CSV, TensorBoard, text) into the metrics table.

The entry point for every caller (CLI, audit, dashboard) is :func:`read_metrics`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from forensics.schema import STEP, load_metrics_table


@dataclass
class IngestReport:
    """What reading found beside the rows: warnings a user should see in the summary (never fatal)."""

    warnings: list[str] = field(default_factory=list)


def read_metrics(
    sources: Sequence[str | Path], *, step_offset: int = 0, **_: object
) -> tuple[pd.DataFrame, IngestReport]:
    """Read and merge metrics sources into the canonical metrics table (later sources win on a shared cell)."""
    report = IngestReport()
    frames = []
    for src in sources:
        df, warnings = load_metrics_table(src)
        report.warnings += warnings
        frames.append(df)
    merged = frames[0]
    for df in frames[1:]:
        merged = df.set_index(STEP).combine_first(merged.set_index(STEP)).reset_index()
    if step_offset:
        merged[STEP] = merged[STEP] - np.int64(step_offset)
    return merged, report
