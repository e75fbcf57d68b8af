"""Looking up a step's tags (bucket, cluster, epoch, ...) for detectors and findings.

The tags table is the tagging stage's output: one row per ``step`` (docs/architecture.md). Detectors only need a
step -> group id lookup; findings copy a few columns of their peak step's row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from forensics.detect.findings import Finding
from forensics.errors import ForensicsError
from forensics.plan.buckets import bucket_range
from forensics.schema import CLUSTER, DEFAULT_BOUNDARIES, EPOCH, STEP

BUCKET = "bucket"
BUCKET_RANGE = "bucket_range"
CLUSTER_NAME = "cluster_name"
#: Columns of a step's tags row copied onto a finding (when present).
FINDING_TAGS = (BUCKET, BUCKET_RANGE, CLUSTER, CLUSTER_NAME, EPOCH)


def group_ids(column: pd.Series, name: str) -> np.ndarray:
    """Integer group ids (``-1`` where missing or negative) from a tags column."""
    if not (pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column)):
        raise ForensicsError(f"tags: column '{name}' must hold integer ids (got {column.dtype}), e.g. 0..K-1")
    v = column.to_numpy(dtype="float64", na_value=np.nan)
    out = np.full(len(v), -1, dtype=np.int64)
    ok = np.isfinite(v) & (v >= 0)
    out[ok] = v[ok].astype(np.int64)
    return out


class StepLookup:
    """Sorted ``step`` -> row index of a tags table, built once and reused for every chunk of a live run."""

    def __init__(self, tags: pd.DataFrame):
        if STEP not in tags.columns:
            raise ForensicsError(f"tags: missing column 'step'; it has {', '.join(map(str, tags.columns[:12]))}")
        steps = tags[STEP].to_numpy(dtype=np.int64)
        self.order = np.argsort(steps, kind="stable")
        self.steps = steps[self.order]
        self.tags = tags
        self._ids: dict[str, np.ndarray] = {}

    def rows(self, steps: np.ndarray) -> np.ndarray:
        """Row positions in the tags table for ``steps`` (``-1`` where a step has no tags row)."""
        if len(self.steps) == 0:
            return np.full(len(steps), -1, dtype=np.int64)
        idx = np.searchsorted(self.steps, steps)
        idx_c = np.minimum(idx, len(self.steps) - 1)
        hit = self.steps[idx_c] == steps
        return np.where(hit, self.order[idx_c], -1)

    def groups(self, steps: np.ndarray, column: str) -> np.ndarray:
        """The group id (``-1`` when unknown) of each step."""
        if column not in self.tags.columns:
            raise ForensicsError(
                f"tags: missing column '{column}'; it has {', '.join(map(str, self.tags.columns[:12]))}"
            )
        if column not in self._ids:
            self._ids[column] = group_ids(self.tags[column], column)
        ids = self._ids[column]
        rows = self.rows(steps)
        return np.where(rows >= 0, ids[np.maximum(rows, 0)], -1)


def attach_tags(
    findings: Iterable[Finding], tags: pd.DataFrame | None, boundaries: Sequence[int] | None = None
) -> None:
    """Copy ``bucket``, ``bucket_range``, ``cluster``, ``cluster_name``, ``epoch`` of each finding's peak step
    (else its first step) from the tags table into ``finding.tags`` (in place; missing values are skipped)."""
    findings = list(findings)
    if tags is None or not findings:
        return
    lookup = StepLookup(tags)
    boundaries = list(boundaries) if boundaries is not None else list(DEFAULT_BOUNDARIES)
    steps = np.array([f.peak_step if f.peak_step is not None else f.step for f in findings], dtype=np.int64)
    rows = lookup.rows(steps)
    for f, row in zip(findings, rows):
        if row < 0:
            continue
        rec = tags.iloc[int(row)]
        for col in FINDING_TAGS:
            if col in tags.columns and not _missing(rec[col]):
                f.tags[col] = _plain(rec[col])
        if BUCKET in f.tags and BUCKET_RANGE not in f.tags and 0 <= int(f.tags[BUCKET]) < len(boundaries) - 1:
            f.tags[BUCKET_RANGE] = bucket_range(int(f.tags[BUCKET]), boundaries)


def _missing(value) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _plain(value):
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
