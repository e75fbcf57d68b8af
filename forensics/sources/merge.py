"""Merging the tables of several sources on ``step`` (DESIGN.md, ``forensics ingest``).

Sources are merged in the order given: for a (step, metric) present in several, the later source wins, and a
warning says how many cells were overridden; every other column is kept. Each table says by itself which cells were
written (null = not written), so a later source never blanks out an earlier source's value with a gap, and a logged
NaN is a value like any other.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from forensics.schema import STEP, metric_values, metrics_table, written


def merge_on_step(tables: Sequence[tuple[str, pd.DataFrame]]) -> tuple[pd.DataFrame, list[str]]:
    """Merge ``(source name, metrics table)`` in order (later wins); return the table and one warning per pair of
    sources that hold the same metric at the same steps."""
    tables = [t for t in tables if t[1] is not None]
    if not tables:
        return metrics_table(np.array([], dtype=np.int64), {}), []
    if len(tables) == 1:
        return tables[0][1], []
    steps = np.unique(np.concatenate([t[STEP].to_numpy(dtype=np.int64) for _, t in tables]))
    values: dict[str, np.ndarray] = {}
    has: dict[str, np.ndarray] = {}
    owner: dict[str, str] = {}
    overlaps: dict[tuple[str, str], list[tuple[str, int, int]]] = {}
    for name, table in tables:
        pos = np.searchsorted(steps, table[STEP].to_numpy(dtype=np.int64))
        for col in table.columns:
            if col == STEP:
                continue
            v = metric_values(table, col)
            w = written(table, col)
            if col not in values:
                values[col] = np.full(len(steps), np.nan)
                has[col] = np.zeros(len(steps), bool)
                owner[col] = name
            both = w & has[col][pos]
            n_both = int(both.sum())
            if n_both:
                old, new = values[col][pos][both], v[both]
                differ = int((~((old == new) | (np.isnan(old) & np.isnan(new)))).sum())
                overlaps.setdefault((owner[col], name), []).append((col, n_both, differ))
            values[col][pos[w]] = v[w]
            has[col][pos[w]] = True
            owner[col] = name
    merged = metrics_table(steps, {c: (values[c], has[c]) for c in values})
    return merged, _overlap_warnings(overlaps)


def _overlap_warnings(overlaps: dict[tuple[str, str], list[tuple[str, int, int]]]) -> list[str]:
    """One line per pair of sources: which metrics both hold at the same steps, and how many values differ."""
    out = []
    for (earlier, later), cols in overlaps.items():
        shown = ", ".join(f"'{c}' ({n} steps, {d} differ)" for c, n, d in cols[:6])
        more = f" and {len(cols) - 6} more" if len(cols) > 6 else ""
        out.append(f"{earlier} and {later} both hold {shown}{more}; {later}'s values are kept")
    return out


def apply_step_offset(table: pd.DataFrame, step_offset: int) -> pd.DataFrame:
    """Metrics step = logged step - N (DESIGN.md Conventions); the table is not modified in place."""
    if not step_offset:
        return table
    out = table.copy()
    out[STEP] = out[STEP].to_numpy(dtype=np.int64) - np.int64(step_offset)
    return out
