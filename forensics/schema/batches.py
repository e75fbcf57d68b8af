"""What names a batch in a plan table: the one definition every stage keys batches by.

docs/concepts.md: a batch is the unit a builder packs and pads, one micro-batch on one rank. A plan names it either by
(``epoch``, ``batch_id``) or by (``step``, ``micro``, ``rank``); ``rank`` belongs to both, because ranks that run
their own batch stream (torch's ``DistributedSampler``) reuse the same ``batch_id`` values, and merging their
micro-batches would pair samples that never shared a forward pass. Pair retention, identical batches, recurrence
and padding are all measured on batches, so they all take the key from here.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from forensics.schema.tables import BATCH_ID, EPOCH, MICRO, RANK, STEP

#: A batch named by its place in an epoch's batch stream (the builder's and the recorder's view).
BATCH_BY_ID: tuple[str, ...] = (EPOCH, BATCH_ID, RANK)
#: A batch named by the optimizer step that consumed it (the trainer's view, after the step mapping).
BATCH_BY_STEP: tuple[str, ...] = (STEP, MICRO, RANK)


def batch_columns(columns: Iterable[str]) -> list[str]:
    """The columns of a plan with these ``columns`` that name its batches, outermost first.

    (``epoch``, ``batch_id``, ``rank``) when the plan has ``epoch`` and ``batch_id``: that is how builders and
    recorders wrote it, and it holds even after steps were mapped. Otherwise (``step``, ``micro``, ``rank``). Absent
    optional columns (``rank``, ``micro``) are left out, which is the same as their being 0 everywhere.
    """
    have = set(columns)
    if {EPOCH, BATCH_ID} <= have:
        return [c for c in BATCH_BY_ID if c in have]
    return [c for c in BATCH_BY_STEP if c in have]


def batch_keys(plan: pd.DataFrame) -> np.ndarray:
    """A global integer id per plan row's batch (0 .. batches - 1, increasing in the order of
    :func:`batch_columns`), equal for the rows of one batch."""
    return plan.groupby(batch_columns(plan.columns), sort=True, observed=True).ngroup().to_numpy(np.int64)
