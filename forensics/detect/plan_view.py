"""What the rules read of the batch plan, whether the plan is in memory or read through an engine.

The plan of a finished pretraining run does not fit in memory, and no rule needs it whole. They read the rows of
a few flagged steps (a spike's span and batch), the steps where a few samples were trained (where a batch comes
back), and aggregates over the logged steps (the forgetting design's token shares, the per-sample membership of
the harmful-samples estimate), which they build a chunk at a time. :class:`PlanView` is that interface.
:class:`FramePlan` answers it from a table in memory; :class:`EnginePlan` answers it through an engine (docs/scale.md)
and holds no more than one chunk and the answers. Both give the rules the same rows, so the findings do
not depend on where the plan lies.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

from forensics.schema import EPOCH, SAMPLE_ID, STEP

#: The plan columns the rules read.
RULE_COLUMNS = (STEP, SAMPLE_ID, EPOCH)


class PlanView(ABC):
    """The plan as the rules read it. ``last_step``: the metrics' last step; :meth:`chunks` stops there (the steps
    after it were not trained yet, or not logged), the lookups read the whole plan.

    Recurrence, attribution (once per spiking metric) and the enrichment ask the same lookups of the same steps and
    samples; each answer is kept, so a plan read through an engine is queried once per question. The answers are
    shared: callers read them, never modify them."""

    def __init__(self, last_step: int | None):
        self.last_step = last_step
        self._answers: dict[tuple, Any] = {}

    def _answer(self, question: tuple, compute: Callable[[], Any]) -> Any:
        if question not in self._answers:
            self._answers[question] = compute()
        return self._answers[question]

    def rows_at(self, steps: Iterable[int]) -> pd.DataFrame:
        """``step``, ``sample_id`` (and ``epoch``) of every row of ``steps``, in the plan's order."""
        wanted = np.unique(np.fromiter(steps, dtype=np.int64))
        return self._answer(("rows_at", wanted.tobytes()), lambda: self._rows_at(wanted))

    def rows_holding(self, sample_ids: Iterable[int]) -> pd.DataFrame:
        """Distinct (``step``, ``sample_id``) rows, over the whole plan, whose sample is one of ``sample_ids``,
        sorted: where given samples were trained (a spike batch's return, a harmful sample's appearances)."""
        ids = np.unique(np.fromiter(sample_ids, dtype=np.int64))
        return self._answer(("rows_holding", ids.tobytes()), lambda: self._rows_holding(ids))

    def tested(self, steps: Iterable[int] | None) -> tuple[int, int]:
        """How many of ``steps`` (None: every step up to :attr:`last_step`) the plan has, and how many distinct
        samples those steps hold: the family sizes of the enrichment tests (every sample a logged step trained could
        have been enriched)."""
        allowed = None if steps is None else np.unique(np.fromiter(steps, dtype=np.int64))
        return self._answer(("tested", None if allowed is None else allowed.tobytes()), lambda: self._tested(allowed))

    def n_rows(self) -> int:
        """The rows up to :attr:`last_step`."""
        return self._answer(("n_rows",), lambda: sum(len(c) for c in self.chunks([STEP])))

    @abstractmethod
    def chunks(self, columns: Sequence[str]) -> Iterator[pd.DataFrame]:
        """``columns`` of the rows up to :attr:`last_step`, a bounded chunk at a time, in no promised order."""

    @abstractmethod
    def _rows_at(self, steps: np.ndarray) -> pd.DataFrame:
        """:meth:`rows_at` of sorted distinct steps, read."""

    @abstractmethod
    def _rows_holding(self, ids: np.ndarray) -> pd.DataFrame:
        """:meth:`rows_holding` of sorted distinct sample ids, read."""

    @abstractmethod
    def _tested(self, allowed: np.ndarray | None) -> tuple[int, int]:
        """:meth:`tested` of sorted distinct steps (None: all up to :attr:`last_step`), counted."""


class FramePlan(PlanView):
    """A plan in memory (the step-mapped table every stage reads)."""

    def __init__(self, plan: pd.DataFrame, last_step: int | None = None):
        super().__init__(last_step)
        self.plan = plan
        self.columns = [c for c in RULE_COLUMNS if c in plan.columns]

    def _upto(self) -> pd.DataFrame:
        if self.last_step is None:
            return self.plan
        return self.plan[self.plan[STEP].to_numpy() <= self.last_step]

    def _rows_at(self, steps: np.ndarray) -> pd.DataFrame:
        return self.plan.loc[self.plan[STEP].isin(steps), self.columns].reset_index(drop=True)

    def _rows_holding(self, ids: np.ndarray) -> pd.DataFrame:
        rows = self.plan.loc[self.plan[SAMPLE_ID].isin(ids), [STEP, SAMPLE_ID]].drop_duplicates()
        return rows.sort_values([STEP, SAMPLE_ID], ignore_index=True).astype(np.int64)

    def chunks(self, columns: Sequence[str]) -> Iterator[pd.DataFrame]:
        yield self._upto()[list(columns)]

    def n_rows(self) -> int:
        return len(self._upto())

    def _tested(self, allowed: np.ndarray | None) -> tuple[int, int]:
        p = self._upto() if allowed is None else self.plan[self.plan[STEP].isin(allowed)]
        return int(p[STEP].nunique()), int(p[SAMPLE_ID].nunique())


class EnginePlan(PlanView):
    """A plan too large to load, read through ``engine`` where it lies (``path``). ``sample_ids``: the samples
    table's ids (every plan sample is one of them: the gate checked), so the distinct samples of the logged steps
    are counted in one array of the samples' size."""

    def __init__(self, engine: Any, path: Any, last_step: int, sample_ids: np.ndarray):
        super().__init__(int(last_step))
        self.engine = engine
        self.path = path
        self.sample_ids = np.unique(np.asarray(sample_ids, np.int64))
        self.columns = [c for c in RULE_COLUMNS if c in engine.plan_columns(path)]

    def _rows_at(self, steps: np.ndarray) -> pd.DataFrame:
        rows = self.engine.rows_at_steps(self.path, steps.tolist())
        return rows[self.columns].astype(np.int64).reset_index(drop=True)

    def _rows_holding(self, ids: np.ndarray) -> pd.DataFrame:
        return self.engine.steps_holding(self.path, ids.tolist()).astype(np.int64).reset_index(drop=True)

    def chunks(self, columns: Sequence[str]) -> Iterator[pd.DataFrame]:
        yield from self.engine.plan_chunks(self.path, list(columns), self.last_step)

    def _tested(self, allowed: np.ndarray | None) -> tuple[int, int]:
        present = np.zeros(len(self.sample_ids), bool)
        stepped: list[np.ndarray] = []
        for chunk in self.chunks([STEP, SAMPLE_ID]):
            s = chunk[STEP].to_numpy(np.int64)
            keep = np.ones(len(s), bool) if allowed is None else np.isin(s, allowed)
            stepped.append(np.unique(s[keep]))
            ids = chunk[SAMPLE_ID].to_numpy(np.int64)[keep]
            pos = np.clip(np.searchsorted(self.sample_ids, ids), 0, max(len(self.sample_ids) - 1, 0))
            present[pos[self.sample_ids[pos] == ids] if len(self.sample_ids) else []] = True
        return (len(np.unique(np.concatenate(stepped))) if stepped else 0), int(present.sum())
