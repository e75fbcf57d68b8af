"""Batch composition across epochs: how much of one epoch's batching the next epoch repeats.

The story's bug is a plan whose batches are built once and only reordered: every epoch groups the same samples. Its
twins (a shuffle undone by a later sort, a sampler re-seeded identically, ``set_epoch`` never called) do the same to a
lesser or equal degree. These measures make that visible; :mod:`forensics.plan.gate` turns them into a verdict.

Measures for a pair of epochs (e, f), f usually e+1:

- ``pair_retention``: the share of batch-mate pairs of f that were already batch-mates in e. It is computed from
  counts, never by listing pairs: group the samples by (batch in e, batch in f); a group of ``c`` samples holds
  ``C(c, 2)`` retained pairs, and f holds ``sum over its batches of C(n_b, 2)`` pairs. Pairs of f whose samples were
  not both in e count as new. 0 when f has no pairs (only single-sample batches).
- ``identical_batches``: the share of f's batches of two or more samples whose exact sample set was a batch of e.
- ``order_only``: every batch of f is a batch of e and vice versa: only the order changed (``same_order`` adds that
  the order did not change either, which is what a sampler re-seeded identically produces).

A sample that appears twice in one epoch is counted once, in its first batch (in batch order), by these measures;
the repeat itself is reported by coverage (``duplicated``), which the gate fails on.

Per epoch: ``coverage`` (``missing``: samples of the universe absent from the epoch; ``duplicated``: rows beyond each
sample's first; the universe is the samples table when given, else every sample the plan names in any epoch),
``epoch_padding_efficiency`` (real tokens / (batch size x longest), lengths capped at ``max_len``, over all rows; the
check-plan JSON's ``padding_efficiency``) and, when the samples carry ``cluster`` or ``source``, the mean within-step
cluster entropy (bits) and the longest run of consecutive steps with the same dominant (most frequent) cluster.

Everything is vectorised numpy over dense integer codes, so a 10M-row plan takes seconds
(``bench/bench_pair_retention.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError
from forensics.plan.padding import batch_shapes
from forensics.plan.step_mapping import assign_steps

if TYPE_CHECKING:
    from forensics.engine.base import Engine, StepCounts
from forensics.schema import BATCH_ID, CLUSTER, EPOCH, MICRO, RANK, SAMPLE_ID, SOURCE, STEP, batch_columns, batch_keys


@dataclass(frozen=True)
class EpochBatches:
    """One epoch's batches as dense arrays.

    ``row_sample``/``row_batch``: per plan row of the epoch, the sample's dense index and the batch's local code
    (batches in plan order: codes increase with (``batch_id``, ``rank``) or (``step``, ``micro``, ``rank``); codes may
    have gaps, which are empty batches). ``batch_of``: per sample index, the batch of its first row, -1 when absent.
    ``sizes``: per batch code, the number of distinct samples whose first row is in it.
    """

    epoch: int
    row_sample: np.ndarray
    row_batch: np.ndarray
    batch_of: np.ndarray
    sizes: np.ndarray

    @property
    def rows(self) -> int:
        return len(self.row_sample)

    @property
    def present(self) -> int:
        return int(self.sizes.sum())

    @property
    def n_batches(self) -> int:
        return int(np.count_nonzero(self.sizes))


@dataclass(frozen=True)
class PlanMembership:
    """The plan indexed for comparison: one :class:`EpochBatches` per epoch (in epoch order) over ``n_samples``
    dense sample indices (the samples table's row order when given, else first appearance in the plan)."""

    epochs: list[EpochBatches]
    n_samples: int


@dataclass(frozen=True)
class PairComposition:
    """How much epoch ``later`` repeats the batching of epoch ``earlier``."""

    earlier: int
    later: int
    pair_retention: float
    identical_batches: float
    order_only: bool
    same_order: bool
    pairs: int
    retained_pairs: int
    multi_batches: int
    identical_multi_batches: int


@dataclass(frozen=True)
class EpochCoverage:
    epoch: int
    missing: int
    duplicated: int

    def to_json(self) -> dict:
        return {"epoch": self.epoch, "missing": self.missing, "duplicated": self.duplicated}


@dataclass(frozen=True)
class EpochMix:
    """Per epoch: the mean within-step cluster entropy (bits) and the longest run of steps sharing a dominant
    cluster (``dominant_cluster`` is that run's cluster: an id, or the ``source`` label)."""

    epoch: int
    cluster_entropy: float
    longest_dominant_run: int
    dominant_cluster: object


# --- indexing --------------------------------------------------------------------------------------------------------
def epoch_column(plan: pd.DataFrame) -> np.ndarray:
    """The plan's ``epoch`` column; a plan without one cannot be compared across epochs (bad input)."""
    if EPOCH not in plan.columns:
        has = "steps" if STEP in plan.columns else "no epochs"
        raise ForensicsError(
            f"plan: has {has} but no 'epoch' column; comparing batch composition across epochs needs an 'epoch' "
            "column (record the plan with the epoch, or rebuild it with --builder)"
        )
    return plan[EPOCH].to_numpy(np.int64)


def _batch_codes(plan: pd.DataFrame) -> np.ndarray:
    """A per-row batch code increasing in plan order, equal for rows of one batch within an epoch (the batch
    identity of :func:`~forensics.schema.batches.batch_columns`, less the epoch, which :func:`membership_from_arrays`
    splits by; by integer arithmetic where it cannot overflow, since pandas' multi-column grouping is the slowest
    step on a 10M-row plan)."""
    cols = [c for c in batch_columns(plan.columns) if c != EPOCH]
    arrays = [plan[c].to_numpy(np.int64) for c in cols]
    if len(arrays) == 1:
        return arrays[0]
    spans = [int(a.max()) + 1 if len(a) else 1 for a in arrays]
    if float(np.prod([float(s) for s in spans])) >= 2**62:
        return batch_keys(plan)
    code = arrays[0].copy()
    for a, span in zip(arrays[1:], spans[1:]):
        code *= span
        code += a
    return code


def index_plan(plan: pd.DataFrame, samples: pd.DataFrame | None = None) -> PlanMembership:
    """Index a validated plan (with ``epoch``) for :func:`compare_epochs` and :func:`coverage`."""
    epoch = epoch_column(plan)
    ids = plan[SAMPLE_ID].to_numpy(np.int64)
    if samples is not None:
        sample_idx = pd.Index(samples[SAMPLE_ID].to_numpy(np.int64)).get_indexer(ids).astype(np.int64)
        if len(sample_idx) and sample_idx.min() < 0:
            unknown = np.unique(ids[sample_idx < 0])
            raise ForensicsError(
                f"plan: {len(unknown)} sample_id values are not in the samples table, "
                f"e.g. {', '.join(map(str, unknown[:5].tolist()))}"
            )
        n_samples = len(samples)
    else:
        sample_idx, n_samples = dense_ids(ids)
    return membership_from_arrays(epoch, _batch_codes(plan), sample_idx, n_samples)


def dense_ids(ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Each id's dense index (0 .. distinct - 1) and the number of distinct ids. Every measure here is the same
    whatever order the indices follow, so ids spanning a range not much wider than their count (the usual case:
    row numbers, offsets) are ranked by a lookup table, which is faster than hashing; others are factorized."""
    if len(ids):
        lo, hi = int(ids.min()), int(ids.max())
        if hi - lo < 2 * len(ids) + 1024:
            present = np.zeros(hi - lo + 1, dtype=bool)
            shifted = ids - lo
            present[shifted] = True
            rank = np.cumsum(present, dtype=np.int64) - 1
            return rank[shifted], int(rank[-1]) + 1
    codes, uniques = pd.factorize(ids)
    return codes.astype(np.int64, copy=False), len(uniques)


def membership_from_arrays(
    epoch: np.ndarray, batch: np.ndarray, sample_idx: np.ndarray, n_samples: int
) -> PlanMembership:
    """Index rows given as arrays (epoch label, batch code increasing in plan order, dense sample index)."""
    labels = pd.unique(epoch)
    labels.sort()
    ordered = len(epoch) < 2 or bool((epoch[1:] >= epoch[:-1]).all())
    bounds = np.searchsorted(epoch, labels, side="left").tolist() + [len(epoch)] if ordered else None
    out = []
    for i, label in enumerate(labels.tolist()):
        if bounds is not None:  # epochs in order, as plans are written: each epoch is a slice, nothing is gathered
            s = sample_idx[bounds[i] : bounds[i + 1]]
            b = batch[bounds[i] : bounds[i + 1]]
        else:
            rows = np.flatnonzero(epoch == label)  # one pass per epoch: no 10M-row sort or index array
            s = sample_idx[rows]
            b = batch[rows]
        b = b - b.min()
        if b.max() > 4 * len(b) + 1024:  # sparse codes: make them dense so per-batch arrays stay small
            b = np.unique(b, return_inverse=True)[1].astype(np.int64)
        n_codes = int(b.max()) + 1
        batch_of = np.full(n_samples, -1, dtype=np.int64)
        if len(s) == 0 or np.bincount(s, minlength=n_samples).max() <= 1:
            batch_of[s] = b
        else:  # a sample repeated in the epoch counts in its first batch (plan order)
            first_b = pd.DataFrame({"s": s, "b": b}).sort_values("b", kind="stable").drop_duplicates("s")
            batch_of[first_b["s"].to_numpy(np.int64)] = first_b["b"].to_numpy(np.int64)
        present = batch_of[batch_of >= 0]
        sizes = np.bincount(present, minlength=n_codes).astype(np.int64)
        if n_samples < 2**31 and n_codes < 2**31:  # the per-row arrays are most of the memory: halve them
            s, b = s.astype(np.int32), b.astype(np.int32)
        out.append(EpochBatches(int(label), s, b, batch_of, sizes))
    return PlanMembership(out, int(n_samples))


# --- measures --------------------------------------------------------------------------------------------------------
def _pairs(n: np.ndarray) -> int:
    n = n.astype(np.int64)
    return int((n * (n - 1) // 2).sum())


def compare_epochs(earlier: EpochBatches, later: EpochBatches) -> PairComposition:
    """Pair retention, identical batches and order-only between two epochs, from per-sample batch counts."""
    both = (earlier.batch_of >= 0) & (later.batch_of >= 0)
    width = len(later.sizes)
    key = earlier.batch_of[both] * width + later.batch_of[both]
    groups, counts = np.unique(key, return_counts=True)
    a, b = groups // width, groups % width
    retained = _pairs(counts)
    pairs = _pairs(later.sizes)
    exact = (counts == earlier.sizes[a]) & (counts == later.sizes[b])
    multi = int(np.count_nonzero(later.sizes >= 2))
    identical_multi = int(np.count_nonzero(exact & (later.sizes[b] >= 2)))
    n_exact = int(np.count_nonzero(exact))
    order_only = n_exact == later.n_batches == earlier.n_batches and later.n_batches > 0
    same_order = False
    if order_only:
        pos_a = np.cumsum(earlier.sizes > 0) - 1
        pos_b = np.cumsum(later.sizes > 0) - 1
        same_order = bool(np.array_equal(pos_a[a[exact]], pos_b[b[exact]]))
    return PairComposition(
        earlier=earlier.epoch,
        later=later.epoch,
        pair_retention=retained / pairs if pairs else 0.0,
        identical_batches=identical_multi / multi if multi else 0.0,
        order_only=order_only,
        same_order=same_order,
        pairs=pairs,
        retained_pairs=retained,
        multi_batches=multi,
        identical_multi_batches=identical_multi,
    )


def consecutive_pairs(m: PlanMembership) -> list[PairComposition]:
    """:func:`compare_epochs` for each consecutive pair of epochs, in epoch order."""
    return [compare_epochs(a, b) for a, b in zip(m.epochs, m.epochs[1:])]


def coverage(m: PlanMembership) -> list[EpochCoverage]:
    """Per epoch, how many samples of the universe are missing and how many rows repeat a sample."""
    return [EpochCoverage(e.epoch, m.n_samples - e.present, e.rows - e.present) for e in m.epochs]


def epoch_padding_efficiency(m: PlanMembership, lengths: np.ndarray) -> list[float]:
    """Per epoch of the plan as it is, real tokens / padded tokens (:mod:`forensics.plan.padding`), over every row:
    the padding the plan's own batches cost (the buckets' packing efficiency instead simulates boundaries)."""
    out = []
    for e in m.epochs:
        lens = lengths[e.row_sample]
        padded = int(batch_shapes(e.row_batch, lens, len(e.sizes)).padded.sum())
        out.append(float(lens.sum()) / padded if padded else 1.0)
    return out


SORTED_TOLERANCE = 0.01
"""The share of neighbouring batches (in length order) that may overlap in a plan still called sorted as a whole."""


def length_sorted(e: EpochBatches, lengths: np.ndarray) -> bool:
    """Whether an epoch's batches are the length order cut into runs, as a sort of the whole dataset makes them
    (shuffle-then-sort, or a length-grouped sampler whose one mega-batch covers the dataset): taken in order of their
    shortest sample, each batch's longest sample is at most the next batch's shortest (equal lengths may straddle).
    Such a plan can only move samples between batches among equal lengths, which is why the gate names it. Up to 1%
    of neighbouring batches may overlap (a sort with a sample or two moved, e.g. the longest put first, is still a
    sort); any length grouping that rebuilds overlaps almost everywhere. False for fewer than two batches."""
    n_codes = len(e.sizes)
    lens = lengths[e.row_sample].astype(np.int64)
    lo = np.full(n_codes, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(n_codes, -1, dtype=np.int64)
    np.minimum.at(lo, e.row_batch, lens)
    np.maximum.at(hi, e.row_batch, lens)
    used = hi >= 0
    lo, hi = lo[used], hi[used]
    if len(lo) < 2:
        return False
    order = np.lexsort((hi, lo))
    overlaps = int(np.count_nonzero(hi[order][:-1] > lo[order][1:]))
    return overlaps <= SORTED_TOLERANCE * (len(lo) - 1)


def cluster_labels(samples: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """Per sample (table order) a dense label code and the label values: ``cluster`` when present, else
    ``source``; None when the samples carry neither."""
    for col in (CLUSTER, SOURCE):
        if col in samples.columns:
            codes, uniques = pd.factorize(samples[col], sort=True, use_na_sentinel=False)
            return codes.astype(np.int64), np.asarray(uniques, dtype=object)
    return None


def cluster_mix(
    plan: pd.DataFrame | str | Path,
    samples: pd.DataFrame,
    grad_accum: int = 1,
    world_size: int = 1,
    rank_split: str = "round_robin",
    *,
    engine: Engine,
    keep_epochs: list[int] | None = None,
) -> list[EpochMix] | None:
    """Per epoch, the mean within-step cluster entropy (bits) and the longest run of steps with one dominant
    cluster; None when the samples have no ``cluster`` or ``source``. Steps follow the step mapping (a plan
    an engine reads from disk must carry ``step``); ``engine`` (:mod:`forensics.engine`) counts."""
    labelled = cluster_labels(samples)
    if labelled is None:
        return None
    codes, names = labelled
    if isinstance(plan, pd.DataFrame):
        plan = assign_steps(
            plan[[c for c in plan.columns if c in (STEP, EPOCH, BATCH_ID, MICRO, RANK, SAMPLE_ID)]],
            grad_accum,
            world_size,
            rank_split,
        )
    table = pd.DataFrame(
        {SAMPLE_ID: samples[SAMPLE_ID].to_numpy(np.int64), "length": np.zeros(len(samples), np.int64), "label": codes}
    )
    counts = engine.step_counts(plan, table, tokens=False, keep_epochs=keep_epochs)
    return mix_from_counts(counts, names)


def mix_from_counts(counts: StepCounts, names: np.ndarray) -> list[EpochMix]:
    """:func:`cluster_mix` from an engine's (step, label) counts."""
    pairs = counts.pairs["label"]
    g_step, g_label, n = pairs.step, pairs.label, pairs.count
    n_steps = len(counts.step)
    step_total = np.bincount(g_step, weights=n, minlength=n_steps)
    p = n / step_total[g_step]
    entropy = np.bincount(g_step, weights=-p * np.log2(p), minlength=n_steps)
    # dominant label per step: the largest count, ties to the smallest label code
    order = np.lexsort((g_label, -n, g_step))
    first = np.ones(len(order), dtype=bool)
    first[1:] = g_step[order][1:] != g_step[order][:-1]
    dominant = np.empty(n_steps, dtype=np.int64)
    dominant[g_step[order][first]] = g_label[order][first]
    step_epoch = counts.epoch
    out = []
    for ep in np.unique(step_epoch).tolist():
        sel = np.flatnonzero(step_epoch == ep)
        run, run_label = _longest_run(dominant[sel])
        out.append(EpochMix(int(ep), float(entropy[sel].mean()), run, _plain(names[run_label])))
    return out


def _longest_run(values: np.ndarray) -> tuple[int, int]:
    """The length and value of the longest run of equal consecutive values."""
    change = np.flatnonzero(values[1:] != values[:-1]) + 1
    starts = np.concatenate([[0], change])
    lengths = np.diff(np.concatenate([starts, [len(values)]]))
    i = int(np.argmax(lengths))
    return int(lengths[i]), int(values[starts[i]])


def _plain(v: object) -> object:
    return v.item() if isinstance(v, np.generic) else v
