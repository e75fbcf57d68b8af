"""Merging the tables of several sources on ``step`` (DESIGN.md, ``forensics ingest``).

Sources are merged in the order given: for a (step, metric) present in several, the later source wins, and a
warning says how many cells were overridden; every other column is kept. A table cannot tell a logged NaN from a
cell never written, so each source may say where it logged NaN (``nan_steps``, from its reader): those cells count
as written, the others as gaps, and a later source never blanks out an earlier source's value with a gap.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from forensics.schema import STEP

NanSteps = dict[str, np.ndarray]


def merge_on_step(
    tables: Sequence[tuple[str, pd.DataFrame, NanSteps | None]],
) -> tuple[pd.DataFrame, list[str], NanSteps]:
    """Merge ``(source name, metrics table, nan_steps)`` in order (later wins).

    Returns the merged table, one warning per metric that several sources hold at the same steps, and the steps
    where the merged table's NaN cells are logged NaN values (per metric).
    """
    tables = [t for t in tables if t[1] is not None]
    if not tables:
        return pd.DataFrame({STEP: np.array([], dtype=np.int64)}), [], {}
    if len(tables) == 1:
        name, table, nan_steps = tables[0]
        return table, [], dict(nan_steps or {})
    steps = np.unique(np.concatenate([t[STEP].to_numpy(dtype=np.int64) for _, t, _ in tables]))
    columns: dict[str, np.ndarray] = {}
    logged_nan: dict[str, np.ndarray] = {}
    owner: dict[str, str] = {}
    overlaps: dict[tuple[str, str], list[tuple[str, int, int]]] = {}
    for name, table, nan_steps in tables:
        table_steps = table[STEP].to_numpy(dtype=np.int64)
        pos = np.searchsorted(steps, table_steps)
        for col in table.columns:
            if col == STEP:
                continue
            values = table[col].to_numpy(dtype=np.float64)
            nan_here = np.zeros(len(values), bool)
            if nan_steps and col in nan_steps:
                nan_here = np.isnan(values) & np.isin(table_steps, nan_steps[col])
            written = ~np.isnan(values) | nan_here
            if col not in columns:
                columns[col] = np.full(len(steps), np.nan)
                logged_nan[col] = np.zeros(len(steps), bool)
                owner[col] = name
            merged = columns[col]
            had = ~np.isnan(merged[pos]) | logged_nan[col][pos]
            both = written & had
            n_both = int(both.sum())
            if n_both:
                old, new = merged[pos][both], values[both]
                differ = int((~((old == new) | (np.isnan(old) & np.isnan(new)))).sum())
                overlaps.setdefault((owner[col], name), []).append((col, n_both, differ))
            merged[pos[written]] = values[written]
            logged_nan[col][pos[written]] = nan_here[written]
            owner[col] = name
    nan_out = {c: steps[m] for c, m in logged_nan.items() if m.any()}
    return pd.DataFrame({STEP: steps, **columns}), _overlap_warnings(overlaps), nan_out


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
