"""The in-memory engine: the plan as one pandas table and numpy over dense integer codes (the code the tool always
had, moved behind the engine boundary). The fastest engine while the plan fits in memory; ``auto`` picks it then.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd

from forensics.engine.base import (
    Engine,
    EpochCounts,
    GateCounts,
    LabelPairs,
    PairCounts,
    PlanInput,
    StepCounts,
    no_steps,
)
from forensics.errors import ForensicsError
from forensics.schema import EPOCH, SAMPLE_ID, STEP, batch_keys

LABEL_BASE = (SAMPLE_ID, "length")


def _with_steps(plan: pd.DataFrame) -> pd.DataFrame:
    if STEP not in plan.columns:
        raise no_steps()
    return plan


def load(plan: PlanInput, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """The plan as a table (a path is read and validated as every command reads it)."""
    if isinstance(plan, pd.DataFrame):
        return plan
    from forensics.schema import load_plan

    return load_plan(plan, columns=columns)


class PandasEngine(Engine):
    """The plan in memory (see the module docstring)."""

    name = "pandas"

    def rows_at_steps(self, plan: PlanInput, steps: Sequence[int]) -> pd.DataFrame:
        table = _with_steps(load(plan))
        return table[table[STEP].isin(np.asarray(list(steps), np.int64))].reset_index(drop=True)

    def plan_chunks(self, plan: PlanInput, columns: Sequence[str], last_step: int) -> Iterator[pd.DataFrame]:
        table = _with_steps(load(plan))
        yield table.loc[table[STEP].to_numpy() <= last_step, list(columns)].reset_index(drop=True)

    def plan_columns(self, plan: PlanInput) -> list[str]:
        return list(load(plan).columns)

    def step_counts(
        self,
        plan: PlanInput,
        samples: pd.DataFrame,
        packed: bool = False,
        tokens: bool = True,
        keep_epochs: Sequence[int] | None = None,
    ) -> StepCounts:
        plan = load(plan)
        if keep_epochs is not None:
            plan = plan[plan[EPOCH].isin(list(keep_epochs))]
        if STEP not in plan.columns:
            raise ForensicsError("plan: needs a 'step' column to tag steps; map batches to steps first")
        pos = sample_positions(samples[SAMPLE_ID].to_numpy(np.int64), plan[SAMPLE_ID].to_numpy(np.int64))
        lens = samples["length"].to_numpy()[pos]
        step_values, step_idx = dense_steps(plan[STEP].to_numpy(np.int64))
        n_steps = len(step_values)
        n_samples = np.bincount(step_idx, minlength=n_steps)
        real, padded, n_batches = (np.zeros(n_steps, np.int64) for _ in range(3))
        if tokens:
            from forensics.plan.padding import batch_shapes

            real = np.bincount(step_idx, weights=lens, minlength=n_steps).astype(np.int64)
            # per batch: padded to its longest sample
            bk = batch_keys(plan) if len(plan) else np.zeros(0, np.int64)
            shapes = batch_shapes(bk, lens)
            batch_step = np.zeros(len(shapes.size), dtype=np.int64)
            np.maximum.at(batch_step, bk, step_idx)
            padded = (
                real.copy()
                if packed
                else np.bincount(batch_step, weights=shapes.padded, minlength=n_steps).astype(np.int64)
            )
            n_batches = np.bincount(batch_step, minlength=n_steps)
            del bk, shapes, batch_step
        pairs = {}
        for col in samples.columns:
            if col in LABEL_BASE:
                continue
            code = samples[col].to_numpy(np.int64)
            n_codes = int(code.max()) + 1 if len(code) else 1
            pairs[col] = LabelPairs(*count_pairs(step_idx, code[pos], n_steps, n_codes))
        epoch = epoch_per_step(plan, step_idx, n_steps)
        return StepCounts(
            step_values, epoch, n_samples.astype(np.int64), real, padded, n_batches.astype(np.int64), pairs
        )

    def gate_counts(self, plan: PlanInput, samples: pd.DataFrame | None, epochs: int | None = None) -> GateCounts:
        from forensics.plan.composition import PlanMembership, index_plan

        plan = load(plan)
        m = index_plan(plan, samples)
        if epochs is not None and len(m.epochs) > epochs:
            m = PlanMembership(m.epochs[:epochs], m.n_samples)
        lengths = samples["length"].to_numpy() if samples is not None else None
        out = [epoch_counts(e, lengths) for e in m.epochs]

        pairs = [pair_counts(a, b) for a, b in zip(m.epochs, m.epochs[1:])]
        first_last = pair_counts(m.epochs[0], m.epochs[-1]) if m.epochs else None
        return GateCounts(out, pairs, first_last, m.n_samples)

    def steps_holding(self, plan: PlanInput, sample_ids: Sequence[int]) -> pd.DataFrame:
        plan = load(plan, columns=[STEP, SAMPLE_ID])
        rows = plan.loc[plan[SAMPLE_ID].isin(list(sample_ids)), [STEP, SAMPLE_ID]]
        return rows.drop_duplicates().sort_values([STEP, SAMPLE_ID], ignore_index=True).astype(np.int64)

    def close(self) -> None:
        pass


def epoch_counts(e, lengths: np.ndarray | None) -> EpochCounts:
    """:class:`EpochCounts` of an indexed epoch (:class:`forensics.plan.composition.EpochBatches`)."""
    sizes = e.sizes.astype(np.int64)
    extra = {}
    if lengths is not None:
        from forensics.plan.padding import batch_shapes

        lens = lengths[e.row_sample]
        shapes = batch_shapes(e.row_batch, lens, len(e.sizes))
        multi = shapes.size >= 2
        used = shapes.size > 0
        lo = np.full(len(e.sizes), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(lo, e.row_batch, lens.astype(np.int64))
        hi, lo = shapes.longest[used].astype(np.int64), lo[used]
        order = np.lexsort((hi, lo))
        extra = dict(
            real=int(lens.sum()),
            padded=int(shapes.padded.sum()),
            budget=int(shapes.padded[multi].max()) if multi.any() else 0,
            max_size=int(shapes.size.max()) if len(shapes.size) else 0,
            shape_batches=int(used.sum()),
            overlaps=int(np.count_nonzero(hi[order][:-1] > lo[order][1:])),
        )
    return EpochCounts(
        e.epoch,
        e.rows,
        e.present,
        int(np.count_nonzero(sizes)),
        int(np.count_nonzero(sizes >= 2)),
        int((sizes * (sizes - 1) // 2).sum()),
        **extra,
    )


def pair_counts(a, b) -> PairCounts:
    """:class:`PairCounts` of two indexed epochs, from per-sample batch codes (as the gate always counted)."""
    both = (a.batch_of >= 0) & (b.batch_of >= 0)
    width = len(b.sizes)
    groups, counts = np.unique(a.batch_of[both] * width + b.batch_of[both], return_counts=True)
    ga, gb = groups // width, groups % width
    exact = (counts == a.sizes[ga]) & (counts == b.sizes[gb])
    pos_a = np.cumsum(a.sizes > 0) - 1
    pos_b = np.cumsum(b.sizes > 0) - 1
    return PairCounts(
        a.epoch,
        b.epoch,
        int((counts * (counts - 1) // 2).sum()),
        int(np.count_nonzero(exact)),
        int(np.count_nonzero(exact & (b.sizes[gb] >= 2))),
        bool(np.array_equal(pos_a[ga[exact]], pos_b[gb[exact]])),
    )


def count_pairs(
    step_idx: np.ndarray,
    code: np.ndarray,
    n_steps: int,
    n_codes: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (step, code) pairs with their counts, sorted by step then code."""
    n_codes = max(n_codes, 1)
    key = step_idx.astype(np.int64) * n_codes + code
    if n_steps * n_codes <= max(4 * len(key), 1 << 22):  # dense counting is cheaper than a sort
        counts = np.bincount(key, minlength=n_steps * n_codes)
        nz = np.flatnonzero(counts)
        return nz // n_codes, nz % n_codes, counts[nz]
    uniq, counts = np.unique(key, return_counts=True)
    return uniq // n_codes, uniq % n_codes, counts


def sample_positions(sample_ids: np.ndarray, plan_ids: np.ndarray) -> np.ndarray:
    """Row of each plan sample in the samples table; a sample missing from it is bad input."""
    n = len(sample_ids)
    if n and sample_ids[0] == 0 and sample_ids[-1] == n - 1 and np.array_equal(sample_ids, np.arange(n)):
        pos = plan_ids.copy()
        bad = (pos < 0) | (pos >= n)
        pos[bad] = -1
    else:
        pos = pd.Index(sample_ids).get_indexer(plan_ids)
    missing = pos < 0
    if missing.any():
        raise unknown_samples(int(missing.sum()), np.unique(plan_ids[missing])[:5].tolist())
    return pos


def unknown_samples(n: int, few: Sequence[int]) -> ForensicsError:
    """The one message for plan rows naming samples the samples table lacks."""
    return ForensicsError(
        f"plan: {n} rows name samples not in the samples table, e.g. {', '.join(str(v) for v in few)}"
    )


def dense_steps(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct steps and each row's index among them (O(n) for the usual compact step range)."""
    if len(steps) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo, hi = int(steps.min()), int(steps.max())
    if hi - lo <= 4 * len(steps) + (1 << 20):
        present = np.bincount(steps - lo, minlength=hi - lo + 1) > 0
        remap = np.cumsum(present) - 1
        return np.flatnonzero(present) + lo, remap[steps - lo]
    values, idx = np.unique(steps, return_inverse=True)
    return values, idx


def epoch_per_step(plan: pd.DataFrame, step_idx: np.ndarray, n_steps: int) -> np.ndarray:
    """A step's epoch (the lowest epoch of its rows; 0 when the plan has no epoch)."""
    if EPOCH not in plan.columns:
        return np.zeros(n_steps, np.int64)
    epoch = np.full(n_steps, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(epoch, step_idx, plan[EPOCH].to_numpy(np.int64))
    return epoch
