"""The engine boundary: the computations that grow with the plan, behind one small interface.

A plan of a pretraining run (hundreds of millions of rows) does not fit in memory, but what the tool needs from it
does: one row per step (tokens, padding, the mix of buckets and clusters), one figure per epoch and pair of epochs
(pair retention, identical batches, coverage, padding), the rows of a few flagged steps. So every engine answers the
same questions with *integer counts* (:class:`StepCounts`, :class:`EpochCounts`, :class:`PairCounts`), and the
ratios, entropies and runs are computed from those counts by one shared piece of numpy
(:mod:`forensics.engine.finish`): the engines cannot disagree on a float, because none of them computes one.

The plan is given as a :data:`PlanInput`: a pandas table (already in memory) or a path (a Parquet file, or a folder
of parts: the recorder's flat ``part-rRRRRR-SSSSSS.parquet`` files or hive ``epoch=E/`` folders). The samples are
given as a small coded table (:func:`forensics.engine.finish.sample_codes`): ``sample_id``, ``length`` (capped at
``max_len``) and one integer code column per label to count (``bucket``, ``cluster``, ...).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError

#: A plan in memory or where it lies on disk.
PlanInput = pd.DataFrame | str | Path

#: Rows of a samples table handed to a chunk function at a time (:meth:`Engine.map_sample_chunks`).
CHUNK_ROWS = 50_000

#: The columns of a coded samples table that are not labels.
SAMPLE_BASE = ("sample_id", "length")


@dataclass
class LabelPairs:
    """Distinct (step, label code) pairs with their sample counts, sorted by step then label; ``step`` indexes
    :attr:`StepCounts.step`."""

    step: np.ndarray
    label: np.ndarray
    count: np.ndarray


@dataclass
class StepCounts:
    """Per step of the plan (``step`` sorted): its epoch (the lowest of its rows; 0 without epochs), rows
    (``n_samples``), real tokens, padded tokens (each batch padded to its longest), batches; and per label column of
    the coded samples, the (step, label) pairs."""

    step: np.ndarray
    epoch: np.ndarray
    n_samples: np.ndarray
    real_tokens: np.ndarray
    padded_tokens: np.ndarray
    n_batches: np.ndarray
    pairs: dict[str, LabelPairs] = field(default_factory=dict)


@dataclass(frozen=True)
class EpochCounts:
    """One epoch's batching as counts. A sample repeated in the epoch counts once, in its first batch (plan order).

    ``rows``; ``present`` (distinct samples); ``batches`` (batches holding a first appearance); ``multi`` (of those,
    with two or more); ``pairs`` (batch-mate pairs, sum of C(size, 2)); and over every row: ``real`` tokens,
    ``padded`` tokens, ``budget`` (the largest padded size of a multi-row batch, 0 if none), ``max_size`` (the most
    rows of any batch), ``shape_batches`` (batches with rows) and ``overlaps`` (neighbouring batches in length order
    whose ranges overlap, as :func:`forensics.plan.composition.length_sorted` counts them)."""

    epoch: int
    rows: int
    present: int
    batches: int
    multi: int
    pairs: int
    real: int = 0
    padded: int = 0
    budget: int = 0
    max_size: int = 0
    shape_batches: int = 0
    overlaps: int = 0


@dataclass(frozen=True)
class PairCounts:
    """Epoch ``later`` against ``earlier``: retained batch-mate pairs, batches of ``earlier`` and ``later`` with the
    exact same samples (all, and those of two or more samples), and whether those identical batches keep their
    places (``same_places``: the i-th batch of one is the i-th of the other, every identical batch)."""

    earlier: int
    later: int
    retained: int
    exact: int
    identical_multi: int
    same_places: bool


@dataclass(frozen=True)
class GateCounts:
    """What the gate needs from a plan: the epochs in order, the consecutive pairs and the first-last pair."""

    epochs: list[EpochCounts]
    pairs: list[PairCounts]
    first_last: PairCounts
    n_samples: int


def no_steps() -> ForensicsError:
    """The one message of every engine asked for a plan's rows by step when the plan has no ``step`` column."""
    return ForensicsError(
        "plan: needs a 'step' column to be read step by step (the recorder writes it); "
        "map (epoch, batch_id) plans to steps first"
    )


class Engine(ABC):
    """One way to run the plan computations; every engine gives the same counts for the same inputs."""

    name: str = ""

    @abstractmethod
    def plan_columns(self, plan: PlanInput) -> list[str]:
        """The plan's column names (hive partition keys included)."""

    @abstractmethod
    def step_counts(
        self,
        plan: PlanInput,
        samples: pd.DataFrame,
        packed: bool = False,
        tokens: bool = True,
        keep_epochs: Sequence[int] | None = None,
    ) -> StepCounts:
        """:class:`StepCounts` of a plan with ``step``, against coded samples (every plan sample must be there);
        ``tokens=False`` leaves the token and batch counts 0 (only the label pairs are wanted); ``keep_epochs``
        counts only the rows of those epochs."""

    @abstractmethod
    def gate_counts(self, plan: PlanInput, samples: pd.DataFrame | None, epochs: int | None = None) -> GateCounts:
        """:class:`GateCounts` of a plan with ``epoch`` (its first ``epochs`` epochs when given); without samples,
        the universe is every sample the plan names and the length figures are 0."""

    @abstractmethod
    def steps_holding(self, plan: PlanInput, sample_ids: Sequence[int]) -> pd.DataFrame:
        """Every (``step``, ``sample_id``) row of the plan whose sample is one of ``sample_ids``, sorted, distinct:
        the lookup recurrence and attribution make for a set of suspects."""

    @abstractmethod
    def rows_at_steps(self, plan: PlanInput, steps: Sequence[int]) -> pd.DataFrame:
        """Every row of the given steps, every column, in the plan's own order: the batches of a few flagged steps
        (a spike's span, the steps a report card shows)."""

    @abstractmethod
    def plan_chunks(self, plan: PlanInput, columns: Sequence[str], last_step: int) -> Iterator[pd.DataFrame]:
        """``columns`` of the rows up to ``last_step``, a bounded chunk at a time, in no promised order: what the
        rules that read every logged step (the forgetting design, the per-sample membership) aggregate as they go,
        so that no engine holds the plan whole."""

    def map_sample_chunks(
        self,
        samples: str | Path,
        columns: Sequence[str],
        fn: Callable[[pd.DataFrame, int], Any],
        chunk: int = CHUNK_ROWS,
    ) -> list[Any]:
        """``fn(rows, start)`` over ``columns`` of a samples table too large to load with its texts, chunk by chunk
        in the table's order (``start``: the chunk's first row), the results in that order. This default reads the
        columns whole and cuts them (the in-memory engine); DuckDB streams them, Dask runs ``fn`` per row group on
        its workers."""
        from forensics.schema import read_table

        table = read_table(samples, "samples", columns=list(columns))[list(columns)]
        return [
            fn(table.iloc[start : start + chunk].reset_index(drop=True), start)
            for start in range(0, max(len(table), 1), chunk)
        ]

    def close(self) -> None:
        """Release what the engine holds (connections, clients); nothing by default."""
        self.closed = True
