"""The limits a plan is judged by: derived from its samples, the same inputs always giving the same limits.

An absolute pair-retention limit cannot hold across dataset sizes. The retention of a plan that rebuilds falls with
the size of the groups it regroups within (about batch size / group size), and the retention of a shuffle followed by
a sort falls too, because the sort only keeps the shuffle's effect among samples of equal length and large datasets
have many of them. So the limit is relative to the *finest length grouping in common use that rebuilds its batches
every epoch*, applied to the same samples: the reference is the pair retention between epochs 0 and 1 of
:func:`~forensics.plan.builders.length_grouped` of these samples, the ``group_by_length`` sampler of HF's Trainer
(a fresh permutation each epoch, cut into mega-batches of 50 batches, fewer when the dataset would hold under 4
mega-batches, each sorted by length and packed; seed 0, the token budget and batch-size limit given or read off the
plan: the largest padded size and the largest batch of any multi-sample batch), and

    limit = min(CAP, max(floor, MULTIPLE x reference)),  MULTIPLE = 5, CAP = 0.5,
    floor = FLOOR = 0.002 when an epoch is sorted by length as a whole, else UNSORTED_FLOOR = 0.1.

Under a token budget a mega-batch holds 50 batches of the size a sample sits in when the samples are packed in
length order (the mean over samples, sum(n_b^2) / n): short samples fill batches of the size limit, long ones batches
of a few, and pair retention is counted over pairs, which the big batches dominate; with a fixed batch size (HF)
this is HF's own mega-batch. Sorted mega-batches are the reference, not a bucketed shuffle, because they are what the
ecosystem's most common length-grouped sampler does, and a gate that fails it gets switched off.

Why these constants (the measured ratios are the check-plan tables of docs/commands/check-plan.md, printed by
``bench/bench_gate_classification.py --ratios``): MULTIPLE sits between the finest length grouping that must pass
(64 quantile buckets, at most about 3x the reference) and the closest failure (shuffle-then-sort, about 8x at 2K
samples and far more from 12K up). On small datasets the reference itself keeps a large share (4 mega-batches), the
limit reaches CAP, and CAP decides: a plan that repeats over half of its pairs never passes.

Two floors, because one failure's retention falls with size and the others' do not. A shuffle-then-sort keeps fewer
pairs the more samples share each length, so a plan with an epoch sorted by length as a whole
(:func:`~forensics.plan.composition.length_sorted`) is held to the size-aware limit down to FLOOR (one pair in 500:
negligible whatever built it). Every other failure the gate exists for (built once, re-seeded, ``set_epoch`` never
called, one fixed seed) repeats 100% of pairs at any size, while a sampler that shuffles in a bounded buffer keeps a
retention that does not fall with size (lhotse's ``DynamicBucketingSampler`` shuffles within its 20,000-cut buffer).
For plans not sorted as a whole the limit is therefore at least UNSORTED_FLOOR, the fixed limit used without samples:
it passes such a sampler up to 1M samples and still fails everything that repeats its batches, and a plan of a few
huge sorted mega-batches. A bounded-buffer sampler on far larger datasets may exceed it: shuffle the cuts themselves
each epoch (``CutSet.shuffle``, or shuffled shards) and its retention falls like the others'.

``identical_batches`` limit: min(CAP, max(IDENTICAL_FLOOR, IDENTICAL_MULTIPLE x the reference's identical share)):
small buckets of long samples give a good plan some identical pairs of samples by chance (on 200-sample toys the
reference shows it too); on realistic sizes a good plan has almost none and a built-once plan has 100%. The reference
is the same length_grouped plan.

Without samples there are no lengths to build a reference from, and fixed limits apply: pair retention 0.1 and
identical batches 0.1. They catch a plan built once and a re-seeded builder at any size, and shuffle-then-sort where
ties are few; pass the samples for the size-aware limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from forensics.plan.builders import capped_lengths, length_grouped, megabatch_size
from forensics.plan.composition import PlanMembership, compare_epochs, index_plan
from forensics.plan.padding import batch_shapes
from forensics.plan.rebuild import rebuild_plan
from forensics.schema import DEFAULT_BOUNDARIES, MAX_LEN, TOKEN_BUDGET

MULTIPLE = 5.0
FLOOR = 0.002
UNSORTED_FLOOR = 0.1
CAP = 0.5
IDENTICAL_MULTIPLE = 3.0
IDENTICAL_FLOOR = 0.1
FIXED_PAIR_RETENTION = 0.1
FIXED_IDENTICAL_BATCHES = 0.1
REFERENCE_SEED = 0
MEGABATCH_WORDS = "50 batches each, or a quarter of the dataset when that is smaller, as HF's LengthGroupedSampler"


@dataclass(frozen=True)
class Limits:
    """The limits a plan is judged by, and how they were derived (``how`` is shown to the user)."""

    pair_retention: float
    identical_batches: float
    how: str
    reference_pair_retention: float | None = None
    reference_identical_batches: float | None = None
    reference_token_budget: int | None = None
    reference_max_batch_size: int | None = None
    reference_megabatch_size: int | None = None
    allow_drop_last: int | None = None
    min_padding_efficiency: float | None = None
    floor: float = FLOOR

    def to_json(self) -> dict:
        return {
            "pair_retention": self.pair_retention,
            "identical_batches": self.identical_batches,
            "how": self.how,
            "reference_pair_retention": self.reference_pair_retention,
            "reference_identical_batches": self.reference_identical_batches,
            "reference_token_budget": self.reference_token_budget,
            "reference_max_batch_size": self.reference_max_batch_size,
            "reference_megabatch_size": self.reference_megabatch_size,
            "multiple": MULTIPLE,
            "floor": self.floor,
            "cap": CAP,
            "allow_drop_last": self.allow_drop_last,
            "min_padding_efficiency": self.min_padding_efficiency,
        }


def derive_limits(
    samples: pd.DataFrame | None,
    *,
    token_budget: int | None = None,
    max_batch_size: int | None = None,
    max_len: int = MAX_LEN,
    boundaries: Sequence[int] = DEFAULT_BOUNDARIES,
    max_pair_retention: float | None = None,
    max_identical_batches: float | None = None,
    allow_drop_last: int | None = None,
    min_padding_efficiency: float | None = None,
    length_sorted: bool = False,
) -> Limits:
    """The limits for a plan over ``samples`` (see the module docstring); deterministic in its arguments.
    ``length_sorted``: the plan has an epoch sorted by length as a whole, which takes the low floor.

    ``boundaries`` is accepted for callers of the earlier bucketed reference; the reference no longer depends on
    bucket boundaries (it is :func:`~forensics.plan.builders.length_grouped`, which has none)."""
    del boundaries
    ref_pr = ref_id = mega = None
    budget = int(token_budget or TOKEN_BUDGET)
    bs = int(max_batch_size) if max_batch_size else None
    if samples is not None and len(samples) >= 2:
        kw: dict = {"token_budget": budget, "max_len": int(max_len)}
        if bs:
            kw["max_batch_size"] = bs
        mega = megabatch_size(
            capped_lengths(samples, int(max_len)), token_budget=budget, **({"max_batch_size": bs} if bs else {})
        )
        ref_plan = rebuild_plan(samples, lambda s, e, seed: length_grouped(s, e, seed, **kw), 2, REFERENCE_SEED)
        ref = compare_epochs(*index_plan(ref_plan, samples).epochs)
        ref_pr, ref_id = ref.pair_retention, ref.identical_batches
        floor = FLOOR if length_sorted else UNSORTED_FLOOR
        pr = min(CAP, max(floor, MULTIPLE * ref_pr))
        ib = min(CAP, max(IDENTICAL_FLOOR, IDENTICAL_MULTIPLE * ref_id))
        why_floor = (
            f"floor {FLOOR:g} as the plan has an epoch sorted by length as a whole (a sort is the failure "
            "whose retention falls with size)"
            if length_sorted
            else f"floor {UNSORTED_FLOOR:g} as no epoch is sorted by length as a whole (the other failures repeat "
            "100% of pairs; a sampler that shuffles in a bounded buffer, as lhotse's does, keeps a retention "
            "that does not fall with size)"
        )
        how = (
            f"pair retention: min({CAP:g}, max({floor:g}, {MULTIPLE:g} x {ref_pr:.5f})) = {pr:.5f} ({why_floor}), "
            f"where {ref_pr:.5f} "
            f"is the pair retention between epochs 0 and 1 of length_grouped (sorted mega-batches of {mega} "
            f"samples, about {MEGABATCH_WORDS}: the finest length grouping in common use that rebuilds every epoch) "
            f"of these {len(samples)} samples (seed {REFERENCE_SEED}, token budget {budget}, max batch size "
            f"{bs or 'default'}, max_len {int(max_len)}); identical batches: "
            f"min({CAP:g}, max({IDENTICAL_FLOOR:g}, {IDENTICAL_MULTIPLE:g} x {ref_id:.4f})) = {ib:.4f}"
        )
    else:
        pr, ib = FIXED_PAIR_RETENTION, FIXED_IDENTICAL_BATCHES
        how = (
            f"fixed limits without samples: pair retention {pr:g}, identical batches {ib:g} "
            "(give the samples for a limit derived from their lengths)"
        )
    if max_pair_retention is not None:
        pr = float(max_pair_retention)
        how = f"pair retention {pr:g} given by --max-pair-retention; " + how
    if max_identical_batches is not None:
        ib = float(max_identical_batches)
        how = f"identical batches {ib:g} given by --max-identical-batches; " + how
    return Limits(
        pr,
        ib,
        how,
        ref_pr,
        ref_id,
        budget if ref_pr is not None else None,
        bs,
        mega,
        None if allow_drop_last is None else int(allow_drop_last),
        min_padding_efficiency,
        (FLOOR if length_sorted else UNSORTED_FLOOR) if ref_pr is not None else FIXED_PAIR_RETENTION,
    )


def plan_batch_shape(m: PlanMembership, lengths: np.ndarray) -> tuple[int | None, int | None]:
    """The token budget and batch-size limit a plan was evidently built under: the largest padded size and the
    largest size of any multi-sample batch (None when every batch holds one sample)."""
    budget, size = 0, 0
    for e in m.epochs:
        shapes = batch_shapes(e.row_batch, lengths[e.row_sample], len(e.sizes))
        multi = shapes.size >= 2
        if multi.any():
            budget = max(budget, int(shapes.padded[multi].max()))
            size = max(size, int(shapes.size.max()))
    return (budget or None), (size or None)
