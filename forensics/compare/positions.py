"""Data positions: which samples each step of a run consumed, and where another run consumed the same ones.

A spike's **data position** is the set of samples its step consumed (plan rows; the steps of its logging window
when a logged value covers several). Two runs are at the same data position when one of their steps consumed
mostly the same samples: the Jaccard overlap of the two sets is at least :data:`SAME_SAMPLES` (0.5: the measure and
the limit the cause grouping uses for "mostly the same suspects", so a batch is "the same batch" everywhere).

Built once per run from its step-mapped plan (``step``, ``sample_id``): a step -> samples index and a sample ->
steps index, so finding every step of a run that holds a set of ``k`` samples costs the appearances of those ``k``
samples, not a scan of the plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from forensics.schema import SAMPLE_ID, STEP

#: Two sample sets are "mostly the same" at this Jaccard overlap or above.
SAME_SAMPLES = 0.5


@dataclass(frozen=True)
class Holding:
    """A step of a run that holds a data position: the step and its overlap (Jaccard, 0-1) with the position."""

    step: int
    overlap: float


class StepSamples:
    """The samples each step consumed, and the steps each sample was consumed at (one run's plan)."""

    def __init__(self, plan: pd.DataFrame) -> None:
        steps = plan[STEP].to_numpy(np.int64)
        ids = plan[SAMPLE_ID].to_numpy(np.int64)
        order = np.lexsort((ids, steps))
        steps, ids = steps[order], ids[order]
        keep = np.ones(len(steps), dtype=bool)  # a sample twice in one step (two ranks, a repeat) counts once
        keep[1:] = (steps[1:] != steps[:-1]) | (ids[1:] != ids[:-1])
        steps, ids = steps[keep], ids[keep]
        self._step_keys, first = np.unique(steps, return_index=True)
        self._step_ids = np.split(ids, first[1:])
        by_sample = np.lexsort((steps, ids))
        self._sample_keys, sfirst = np.unique(ids[by_sample], return_index=True)
        self._sample_steps = np.split(steps[by_sample], sfirst[1:])

    @property
    def steps(self) -> np.ndarray:
        """The steps the plan covers, sorted."""
        return self._step_keys

    def samples_at(self, steps: Iterable[int]) -> frozenset[int]:
        """The samples consumed at any of ``steps`` (empty for steps the plan does not hold)."""
        out: set[int] = set()
        for s in steps:
            i = int(np.searchsorted(self._step_keys, int(s)))
            if i < len(self._step_keys) and self._step_keys[i] == int(s):
                out.update(self._step_ids[i].tolist())
        return frozenset(out)

    def steps_of(self, samples: Iterable[int]) -> list[int]:
        """Every step that consumed at least one of ``samples``, sorted."""
        found: set[int] = set()
        for sid in samples:
            i = int(np.searchsorted(self._sample_keys, int(sid)))
            if i < len(self._sample_keys) and self._sample_keys[i] == int(sid):
                found.update(self._sample_steps[i].tolist())
        return sorted(found)

    def holding(self, samples: frozenset[int], limit: float = SAME_SAMPLES) -> list[Holding]:
        """The steps whose samples are mostly ``samples`` (Jaccard >= ``limit``), sorted by step."""
        if not samples:
            return []
        out = []
        for step in self.steps_of(samples):
            mine = self.samples_at([step])
            overlap = len(mine & samples) / len(mine | samples)
            if overlap >= limit:
                out.append(Holding(step, overlap))
        return out

    def overlap_at(self, step: int, samples: frozenset[int]) -> float:
        """The Jaccard overlap of ``samples`` with what ``step`` consumed (0 when the plan does not hold the step)."""
        mine = self.samples_at([step])
        if not mine or not samples:
            return 0.0
        return len(mine & samples) / len(mine | samples)

    def same_order_share(self, other: StepSamples) -> float | None:
        """The share of the steps both plans hold at which they consumed exactly the same samples (None when they
        share no step): 1.0 for a rerun with the same data order."""
        common, mine, theirs = np.intersect1d(self._step_keys, other._step_keys, return_indices=True)
        if not len(common):
            return None
        same = sum(np.array_equal(self._step_ids[i], other._step_ids[j]) for i, j in zip(mine, theirs, strict=True))
        return same / len(common)

    def ids(self) -> np.ndarray:
        """Every sample id the plan consumed, sorted."""
        return self._sample_keys
