"""Features of the step *sequence*: how long a composition lasted, and how long since a cluster was last seen.

The story's failure needs both: a static plan repeats long runs of one kind of batch, and a spike follows a cluster
the model has not seen for many steps. All of it is vectorised over steps (no Python loop per step).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def run_lengths(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For steps in order, the length of the run of consecutive steps sharing all ``keys`` that holds each step,
    and the step's 1-based position in that run.

    >>> run_lengths(np.array([0, 0, 1, 1, 1, 0]))
    (array([2, 2, 3, 3, 3, 1]), array([1, 2, 1, 2, 3, 1]))
    """
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for key in keys:
        change[1:] |= key[1:] != key[:-1]
    run_id = np.cumsum(change) - 1
    starts = np.flatnonzero(change)
    lengths = np.diff(np.append(starts, n))
    return lengths[run_id].astype(np.int64), (np.arange(n) - starts[run_id] + 1).astype(np.int64)


def steps_since_seen(pair_step: np.ndarray, pair_label: np.ndarray, step_values: np.ndarray) -> pd.array:
    """For (step, label) presence pairs, the steps since the label was last present in an earlier step.

    ``pair_step`` indexes ``step_values`` (the sorted step numbers); each (step, label) pair appears once. Returns a
    nullable Int64 array aligned with the pairs: ``<NA>`` where the label appears for the first time.
    """
    if len(pair_step) == 0:
        return pd.array([], dtype="Int64")
    order = np.lexsort((pair_step, pair_label))
    steps = step_values[pair_step[order]]
    labels = pair_label[order]
    gap = np.zeros(len(order), dtype=np.int64)
    gap[1:] = steps[1:] - steps[:-1]
    first = np.ones(len(order), dtype=bool)
    first[1:] = labels[1:] != labels[:-1]
    since = np.empty(len(order), dtype=np.int64)
    since[order] = gap
    missing = np.empty(len(order), dtype=bool)
    missing[order] = first
    return pd.arrays.IntegerArray(since, missing)
