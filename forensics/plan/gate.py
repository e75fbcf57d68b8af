"""The batch-composition gate: does a plan (or a builder) group samples differently every epoch?

It fails the story's bug (batches built once, only their order shuffled) and its twins: a shuffle undone by a later
sort, a sampler re-seeded identically every epoch, ``set_epoch`` never called. The measures come from
:mod:`forensics.plan.composition`; this module holds the limits, the verdict, the JUnit file and the pytest helper.

Checks (all must hold):

- **composition**: for every consecutive pair of epochs and for the first vs the last epoch, ``pair_retention`` and
  ``identical_batches`` at most their limits (``static`` = this check failed).
- **coverage**: every sample of the universe once per epoch. ``allow_drop_last = N`` lets an epoch miss at most N
  samples (the last partial batch dropped, as ``DataLoader(drop_last=True)`` does: set N to the batch size - 1); a
  sample repeated within an epoch always fails.
- **padding** (only when ``min_padding_efficiency`` is given): every epoch's real / padded tokens at least that.

How the pair-retention limit is derived (``threshold.how`` says which rule applied and with which numbers):

An absolute limit cannot hold across dataset sizes. The retention of a plan that rebuilds falls with the size of the
groups it regroups within (about batch size / group size), and the retention of a shuffle followed by a sort falls
too, because the sort only keeps the shuffle's effect among samples of equal length and large datasets have many of
them. So the limit is relative to the *finest length grouping in common use that rebuilds its batches every epoch*,
applied to the same samples: the reference is the pair retention between epochs 0 and 1 of
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

Measured with ``python bench/bench_gate_classification.py --ratios`` (2K, 12K, 200K and 1M samples with batch sizes
8, 16, 64 and 64; lognormal, bimodal QA/code and lengths in multiples of 64), as multiples of the reference: HF's
``LengthGroupedSampler`` seeded per epoch keeps 0.97-1.02 x, bucketed shuffles with 6 to 64 quantile buckets
0.16-3.1 x (64 buckets, the finest, reach 3.07 x on the bimodal mix at 1M), a random shuffle 0.01-0.04 x, lhotse's
``DynamicBucketingSampler`` with ``set_epoch`` 0.1-0.4 x up to 12K (4.9 x at 200K, 65 x at 1M: see the floors);
shuffle-then-sort where ties are few (lognormal, bimodal) keeps 7.8-8.8 x at 2K, 17-22 x at 12K, 36-41 x at 200K and
44-49 x at 1M, and a plan built once, a re-seeded builder, lhotse without ``set_epoch`` and HF's sampler with one
fixed seed keep 100%. 5 sits near the geometric middle of 3.1 and 7.8: a margin of 1.6 above the finest grouping that
passes and 1.6 below the closest failure (at 2K, where the cap decides anyway), 3.4 or more from 12K up. At about 2K
samples the reference itself keeps 10-16% (4 mega-batches), the limit reaches the cap, and the cap decides: a plan
that repeats over half of its pairs never passes (shuffle-then-sort keeps 81-86% there).

Two floors, because one failure's retention falls with size and the others' do not. A shuffle-then-sort keeps fewer
pairs the more samples share each length (5.2% at 1M lognormal samples, still 49 x the reference), so a plan with an
epoch sorted by length as a whole (below) is held to the size-aware limit down to FLOOR = 0.2% (one pair in 500:
negligible whatever built it). Every other failure the gate exists for (built once, re-seeded, ``set_epoch`` never
called, one fixed seed) repeats 100% of pairs at any size, while a sampler that shuffles in a bounded buffer keeps a
retention that does not fall with size: lhotse's ``DynamicBucketingSampler`` iterates the cuts in their order and
shuffles within its 20,000-cut buffer, so on an in-memory ``CutSet`` it keeps 2.6% of pairs at 200K samples and 7.1%
at 1M (4.9 x and 65 x the reference; 5 x the reference is 0.55% at 1M). For plans not sorted as a whole the limit is
therefore at least UNSORTED_FLOOR = 0.1, the fixed limit used without samples: it passes such a sampler up to 1M
samples (a margin of 1.4 there) and still fails everything that repeats its batches, and a plan of a few huge sorted
mega-batches (4 of 50K samples keep 14%). A bounded-buffer sampler on far larger datasets may exceed it: shuffle the
cuts themselves each epoch (``CutSet.shuffle``, or shuffled shards) and its retention falls like the others'.

Length-sorted plans. :func:`~forensics.plan.composition.length_sorted` tells whether an epoch's batches are the
length order cut into runs, which is what a shuffle-then-sort makes, and also a length-grouped sampler whose one
mega-batch covers the whole dataset (``mega_batch_mult`` large, or a dataset smaller than one mega-batch): such a
sampler *is* shuffle-then-sort, and the gate says so in those words instead of calling it built once. It is judged
by the same limit, for a reason it states: such a plan can only move samples between batches among equal lengths,
so where ties are few it keeps most pairs and fails ("regrouped from the same samples (shuffle then sort)"); where
each length is shared by many samples (lengths in multiples of 64 from about 12K samples up) the sort regroups those
ties like a bucketed shuffle with one bucket per length, keeps fewer pairs than the limit, and passes with a note
saying it is sorted as a whole. HF's own rule (at least 4 mega-batches) gives batches whose length ranges overlap,
never a sorted plan.

Failures are worded by kind (``failure_kinds`` in the JSON): ``built_once`` "the batches are built once and only
reordered" (every batch of one epoch is a batch of the other); ``reseeded`` "the same batches in the same order:
re-seeded identically every epoch" (a generator given the same seed, lhotse or a DistributedSampler without
``set_epoch``); ``shuffle_then_sort`` "regrouped from the same samples (shuffle then sort)"; ``regrouped`` (over the
limit without being sorted as a whole: groups finer than the reference, e.g. length buckets holding a batch or two);
``identical_batches``.

``identical_batches`` limit: min(CAP, max(0.1, 3 x the reference's identical share)): small buckets of long samples
give a good plan some identical pairs of samples by chance (on 200-sample toys the reference shows it too); on
realistic sizes a good plan has almost none and a built-once plan has 100%. The reference is the same length_grouped
plan.

Without samples there are no lengths to build a reference from, and fixed limits apply: pair retention 0.1 and
identical batches 0.1. They catch a plan built once and a re-seeded builder at any size, and shuffle-then-sort where
ties are few; pass the samples for the size-aware limit.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError
from forensics.plan.builders import capped_lengths, length_grouped, megabatch_size
from forensics.plan.composition import (
    EpochCoverage,
    EpochMix,
    PairComposition,
    PlanMembership,
    cluster_mix,
    compare_epochs,
    consecutive_pairs,
    coverage,
    epoch_padding_efficiency,
    index_plan,
    length_sorted,
)
from forensics.plan.optimal_boundaries import resolve_boundaries
from forensics.plan.padding import batch_shapes
from forensics.plan.rebuild import rebuild_plan, resolve_builder
from forensics.schema import (
    DEFAULT_BOUNDARIES,
    EPOCH,
    MAX_LEN,
    PLAN_INT_COLUMNS,
    TOKEN_BUDGET,
    Case,
    check_boundaries,
    validate_plan,
    validate_samples,
)

MULTIPLE = 5.0
FLOOR = 0.002
UNSORTED_FLOOR = 0.1
CAP = 0.5
IDENTICAL_MULTIPLE = 3.0
IDENTICAL_FLOOR = 0.1
FIXED_PAIR_RETENTION = 0.1
FIXED_IDENTICAL_BATCHES = 0.1
REFERENCE_SEED = 0
BUILDER_EPOCHS = 3
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
    allow_drop_last: int = 0
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


@dataclass
class GateResult:
    """The gate's verdict and every measure behind it. ``static``: the composition check failed.
    ``epoch_padding_efficiency``: per epoch, the plan's real / padded tokens (with samples; the JSON's
    ``padding_efficiency``)."""

    passed: bool
    static: bool
    epochs: list[int]
    pairs: list[PairComposition]
    first_last: PairComposition
    coverage: list[EpochCoverage]
    threshold: Limits
    epoch_padding_efficiency: list[float] | None = None
    cluster_mix: list[EpochMix] | None = None
    failures: list[str] = field(default_factory=list)
    composition_failures: list[str] = field(default_factory=list)
    coverage_failures: list[str] = field(default_factory=list)
    padding_failures: list[str] = field(default_factory=list)
    failure_kinds: list[str] = field(default_factory=list)
    length_sorted: list[bool] | None = None
    notes: list[str] = field(default_factory=list)
    source: str = ""

    @property
    def pair_retention(self) -> list[float]:
        return [p.pair_retention for p in self.pairs]

    @property
    def identical_batches(self) -> list[float]:
        return [p.identical_batches for p in self.pairs]

    @property
    def order_only(self) -> list[bool]:
        return [p.order_only for p in self.pairs]

    def to_json(self) -> dict:
        """The JSON of DESIGN.md's check-plan contract, plus per-epoch extras and the failure causes."""
        mix = self.cluster_mix
        return {
            "passed": self.passed,
            "static": self.static,
            "pair_retention": self.pair_retention,
            "pair_retention_first_last": self.first_last.pair_retention,
            "identical_batches": self.identical_batches,
            "identical_batches_first_last": self.first_last.identical_batches,
            "order_only": self.order_only,
            "order_only_first_last": self.first_last.order_only,
            "same_order": [p.same_order for p in self.pairs],
            "coverage": [c.to_json() for c in self.coverage],
            "threshold": self.threshold.to_json(),
            "epochs": self.epochs,
            "epoch_pairs": [[p.earlier, p.later] for p in self.pairs],
            "padding_efficiency": self.epoch_padding_efficiency,
            "cluster_entropy": [m.cluster_entropy for m in mix] if mix else None,
            "longest_dominant_run": [
                {"epoch": m.epoch, "steps": m.longest_dominant_run, "cluster": m.dominant_cluster} for m in mix
            ] if mix else None,
            "failures": self.failures,
            "failure_kinds": self.failure_kinds,
            "length_sorted": self.length_sorted,
            "notes": self.notes,
            "source": self.source,
        }


# --- limits ----------------------------------------------------------------------------------------------------------
def derive_limits(
    samples: pd.DataFrame | None,
    *,
    token_budget: int | None = None,
    max_batch_size: int | None = None,
    max_len: int = MAX_LEN,
    boundaries: Sequence[int] = DEFAULT_BOUNDARIES,
    max_pair_retention: float | None = None,
    max_identical_batches: float | None = None,
    allow_drop_last: int = 0,
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
        mega = megabatch_size(capped_lengths(samples, int(max_len)), token_budget=budget,
                              **({"max_batch_size": bs} if bs else {}))
        ref_plan = rebuild_plan(samples, lambda s, e, seed: length_grouped(s, e, seed, **kw), 2, REFERENCE_SEED)
        ref = compare_epochs(*index_plan(ref_plan, samples).epochs)
        ref_pr, ref_id = ref.pair_retention, ref.identical_batches
        floor = FLOOR if length_sorted else UNSORTED_FLOOR
        pr = min(CAP, max(floor, MULTIPLE * ref_pr))
        ib = min(CAP, max(IDENTICAL_FLOOR, IDENTICAL_MULTIPLE * ref_id))
        why_floor = (f"floor {FLOOR:g} as the plan has an epoch sorted by length as a whole (a sort is the failure "
                     "whose retention falls with size)" if length_sorted else
                     f"floor {UNSORTED_FLOOR:g} as no epoch is sorted by length as a whole (the other failures repeat "
                     "100% of pairs; a sampler that shuffles in a bounded buffer, as lhotse's does, keeps a retention "
                     "that does not fall with size)")
        how = (f"pair retention: min({CAP:g}, max({floor:g}, {MULTIPLE:g} x {ref_pr:.5f})) = {pr:.5f} ({why_floor}), "
               f"where {ref_pr:.5f} "
               f"is the pair retention between epochs 0 and 1 of length_grouped (sorted mega-batches of {mega} "
               f"samples, about {MEGABATCH_WORDS}: the finest length grouping in common use that rebuilds every epoch) of these "
               f"{len(samples)} samples (seed {REFERENCE_SEED}, token budget {budget}, max batch size {bs or 'default'}, "
               f"max_len {int(max_len)}); identical batches: "
               f"min({CAP:g}, max({IDENTICAL_FLOOR:g}, {IDENTICAL_MULTIPLE:g} x {ref_id:.4f})) = {ib:.4f}")
    else:
        pr, ib = FIXED_PAIR_RETENTION, FIXED_IDENTICAL_BATCHES
        how = (f"fixed limits without samples: pair retention {pr:g}, identical batches {ib:g} "
               "(give the samples for a limit derived from their lengths)")
    if max_pair_retention is not None:
        pr = float(max_pair_retention)
        how = f"pair retention {pr:g} given by --max-pair-retention; " + how
    if max_identical_batches is not None:
        ib = float(max_identical_batches)
        how = f"identical batches {ib:g} given by --max-identical-batches; " + how
    return Limits(pr, ib, how, ref_pr, ref_id, budget if ref_pr is not None else None, bs, mega,
                  int(allow_drop_last), min_padding_efficiency,
                  (FLOOR if length_sorted else UNSORTED_FLOOR) if ref_pr is not None else FIXED_PAIR_RETENTION)


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


# --- the gate ----------------------------------------------------------------------------------------------------------
def check_plan(
    plan: pd.DataFrame | None = None,
    samples: pd.DataFrame | None = None,
    *,
    builder: str | Callable | None = None,
    epochs: int | None = None,
    seed: int = 0,
    token_budget: int | None = None,
    max_len: int = MAX_LEN,
    boundaries: Sequence[int] = DEFAULT_BOUNDARIES,
    max_pair_retention: float | None = None,
    max_identical_batches: float | None = None,
    allow_drop_last: int = 0,
    min_padding_efficiency: float | None = None,
    grad_accum: int = 1,
    world_size: int = 1,
    rank_split: str = "round_robin",
    source: str = "",
) -> GateResult:
    """Judge a plan (validated, with ``epoch``) or a builder (name, ``module:function``, ``file.py:function`` or a
    callable; needs ``samples``) over ``epochs`` epochs (all of the plan's; 3 for a builder).

    Raises :class:`ForensicsError` for input the gate cannot judge: no plan nor builder, a builder without samples,
    a plan without epochs, fewer than two epochs.
    """
    boundaries = check_boundaries(boundaries, "boundaries")
    if (plan is None) == (builder is None):
        raise ForensicsError("check-plan needs exactly one of a plan or a builder")
    if epochs is not None and epochs < 2:
        raise ForensicsError(f"--epochs must be at least 2 to compare epochs; got {epochs}")
    if builder is not None:
        if samples is None:
            raise ForensicsError("--builder needs --samples: a builder is called with the samples table")
        fn = builder if callable(builder) else resolve_builder(
            builder, token_budget=token_budget or TOKEN_BUDGET, max_len=max_len, boundaries=list(boundaries))
        source = source or (f"builder {builder}" if isinstance(builder, str) else
                            f"builder {getattr(builder, '__name__', repr(builder))}")
        plan = rebuild_plan(samples, fn, epochs or BUILDER_EPOCHS, seed)
    assert plan is not None
    m = index_plan(plan, samples)
    if epochs is not None and len(m.epochs) > epochs:
        keep = {e.epoch for e in m.epochs[:epochs]}
        plan = plan[plan[EPOCH].isin(keep)]
        m = PlanMembership(m.epochs[:epochs], m.n_samples)
    if len(m.epochs) < 2:
        raise ForensicsError(f"plan: holds {len(m.epochs)} epoch(s); comparing batch composition needs at least 2")

    lengths = capped_lengths(samples, max_len) if samples is not None else None
    budget, batch_size = (token_budget, None)
    sorted_epochs = None
    if lengths is not None:
        seen_budget, batch_size = plan_batch_shape(m, lengths)
        budget = token_budget or seen_budget
        sorted_epochs = [length_sorted(e, lengths) for e in m.epochs]
    limits = derive_limits(samples, token_budget=budget, max_batch_size=batch_size, max_len=max_len,
                           boundaries=boundaries, max_pair_retention=max_pair_retention,
                           max_identical_batches=max_identical_batches, allow_drop_last=allow_drop_last,
                           min_padding_efficiency=min_padding_efficiency, length_sorted=any(sorted_epochs or []))
    pairs = consecutive_pairs(m)
    first_last = compare_epochs(m.epochs[0], m.epochs[-1])
    cov = coverage(m)
    padding = epoch_padding_efficiency(m, lengths) if lengths is not None else None
    mix = cluster_mix(plan, samples, grad_accum, world_size, rank_split) if samples is not None else None
    result = GateResult(passed=True, static=False, epochs=[e.epoch for e in m.epochs], pairs=pairs,
                        first_last=first_last, coverage=cov, threshold=limits, epoch_padding_efficiency=padding,
                        cluster_mix=mix, length_sorted=sorted_epochs, source=source or "plan")
    _judge(result)
    return result


def _pct(x: float) -> str:
    if x >= 0.9995 or x == 0:
        return f"{x:.0%}"
    return f"{x:.1%}" if x >= 0.001 else f"{x:.3%}"


def _join(tags: list[str]) -> str:
    return tags[0] if len(tags) == 1 else ", ".join(tags[:-1]) + " and " + tags[-1]


def _span(values: list[float]) -> str:
    lo, hi = _pct(min(values)), _pct(max(values))
    return lo if lo == hi else f"{lo.rstrip('%')}-{hi}"


FAILURE_KINDS = {
    "same_order": "reseeded",
    "order_only": "built_once",
    "sorted": "shuffle_then_sort",
    "sorted+identical": "shuffle_then_sort",
    "sorted_identical": "shuffle_then_sort",
    "retention": "regrouped",
    "retention+identical": "regrouped",
    "identical": "identical_batches",
}
"""Composition failure -> the name ``failure_kinds`` gives it in the JSON: ``built_once`` (built once and only
reordered), ``reseeded`` (re-seeded identically, or set_epoch never called), ``shuffle_then_sort`` (regrouped from
the same samples by a sort of the whole dataset), ``regrouped`` (mostly regrouped from the same samples otherwise),
``identical_batches``. The audit's words can follow these names rather than the one ``static`` flag."""


def _composition_kind(p: PairComposition, lim: Limits, later_sorted: bool = False) -> str | None:
    """Which composition failure a pair of epochs shows (None when it passes). Single-sample batches have no
    composition to repeat: a plan of only those (batch size 1) passes whatever its order. ``later_sorted``: the later
    epoch's batches are the length order cut into runs (:func:`~forensics.plan.composition.length_sorted`)."""
    if p.pairs == 0:
        return None
    if p.same_order:
        return "same_order"
    if p.order_only:
        return "order_only"
    over_pr = p.pair_retention > lim.pair_retention
    over_id = p.identical_batches > lim.identical_batches
    if over_pr:
        kind = "sorted" if later_sorted else "retention"
        return kind + "+identical" if over_id else kind
    if over_id:
        return "sorted_identical" if later_sorted else "identical"
    return None


def _composition_cause(kind: str, pairs: list[PairComposition], lim: Limits) -> str:
    """The cause in words for pairs of epochs that fail the same way."""
    retention = [p.pair_retention for p in pairs]
    identical = [p.identical_batches for p in pairs]
    if kind == "same_order":
        return ("are the same batches in the same order: re-seeded identically every epoch (a generator given the "
                "same seed each epoch, or set_epoch never called)")
    if kind == "order_only":
        return "share 100% of batch-mate pairs: the batches are built once and only reordered"
    if kind == "identical":
        return f"repeat {_span(identical)} of their batches exactly (limit {_pct(lim.identical_batches)})"
    also = (f" and repeat {_span(identical)} of their batches exactly (limit {_pct(lim.identical_batches)})"
            if kind.endswith("+identical") else "")
    head = f"share {_span(retention)} of batch-mate pairs (limit {_pct(lim.pair_retention)}){also}"
    if kind == "sorted_identical":
        head = f"repeat {_span(identical)} of their batches exactly (limit {_pct(lim.identical_batches)})"
    if kind.startswith("sorted"):
        return (f"{head}: regrouped from the same samples (shuffle then sort): every batch is a run of the length "
                "order, so only samples of equal length can change batch (a shuffle that a later sort undoes; a "
                "length-grouped sampler whose one mega-batch covers the whole dataset is the same thing)")
    return (f"{head}: the batches are mostly regrouped from the same samples, though not sorted as a whole: they "
            "group by length far more tightly than sorted mega-batches of 50 batches (HF's group_by_length, the "
            "limit's reference), e.g. length buckets that hold only a batch or two each, or a few huge sorted "
            "mega-batches")


def _sorted_note(pairs: list[PairComposition], lim: Limits) -> str:
    """Why a plan sorted as a whole passes: its ties are many enough that the sort regroups most pairs."""
    return (f"epochs {_join([f'{p.earlier}-{p.later}' for p in pairs])} are sorted by length as a whole (shuffle then "
            "sort, or a length-grouped sampler whose one mega-batch covers the whole dataset): only samples of equal "
            f"length change batch, and enough samples share each length that they keep "
            f"{_span([p.pair_retention for p in pairs])} of batch-mate pairs, within the limit "
            f"{_pct(lim.pair_retention)}: they regroup like a bucketed shuffle with one bucket per length")


def _judge(r: GateResult) -> None:
    """Fill ``failures`` (causes in words, one line per kind of failure), ``failure_kinds``, ``notes``, ``static``
    and ``passed``."""
    lim = r.threshold
    sorted_by_epoch = dict(zip(r.epochs, r.length_sorted or [False] * len(r.epochs)))
    by_kind: dict[str, list[PairComposition]] = {}
    sorted_passing: list[PairComposition] = []
    for p in r.pairs:
        kind = _composition_kind(p, lim, sorted_by_epoch.get(p.later, False))
        if kind:
            by_kind.setdefault(kind, []).append(p)
        elif p.pairs and sorted_by_epoch.get(p.later, False):
            sorted_passing.append(p)
    composition = [f"epochs {_join([f'{p.earlier}-{p.later}' for p in ps])} {_composition_cause(k, ps, lim)}"
                   for k, ps in by_kind.items()]
    kinds = list(by_kind)
    if len(r.epochs) > 2 and not composition:  # e.g. a builder alternating between two plans
        kind = _composition_kind(r.first_last, lim, sorted_by_epoch.get(r.first_last.later, False))
        if kind:
            kinds.append(kind)
            composition.append(f"the first and last epochs ({r.first_last.earlier} and {r.first_last.later}) "
                               f"{_composition_cause(kind, [r.first_last], lim)}")
    r.notes = [_sorted_note(sorted_passing, lim)] if sorted_passing and not composition else []
    cov_fail = []
    for c in r.coverage:
        if c.duplicated:
            cov_fail.append(f"epoch {c.epoch} repeats samples: {c.duplicated} row{'s' if c.duplicated > 1 else ''} "
                            "beyond each sample's first")
        if c.missing > lim.allow_drop_last:
            allowed = f"at most {lim.allow_drop_last} may be dropped" if lim.allow_drop_last else \
                "none may be missing (--allow-drop-last N allows a dropped last batch)"
            cov_fail.append(f"epoch {c.epoch} misses {c.missing} sample{'s' if c.missing > 1 else ''}; {allowed}")
    pad_fail = []
    if lim.min_padding_efficiency is not None:
        if r.epoch_padding_efficiency is None:
            pad_fail.append("--min-padding-efficiency needs the samples (their n_tokens) to measure padding")
        else:
            for ep, eff in zip(r.epochs, r.epoch_padding_efficiency):
                if eff < lim.min_padding_efficiency:
                    pad_fail.append(f"epoch {ep} padding efficiency {eff:.1%} is below {lim.min_padding_efficiency:.1%}")
    r.static = bool(composition)
    r.failure_kinds = list(dict.fromkeys(FAILURE_KINDS[k] for k in kinds))
    r.composition_failures = composition
    r.coverage_failures = cov_fail
    r.padding_failures = pad_fail
    r.failures = composition + cov_fail + pad_fail
    r.passed = not r.failures


# --- outputs and the pytest helper -------------------------------------------------------------------------------------
def write_junit(result: GateResult, path: str | Path) -> None:
    """A JUnit XML file CI systems show as test results: one test case per check, a ``failure`` when it failed."""
    cases = [("batch composition varies across epochs", result.composition_failures),
             ("every sample once per epoch", result.coverage_failures)]
    if result.threshold.min_padding_efficiency is not None:
        cases.append(("padding efficiency", result.padding_failures))
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name="forensics check-plan", tests=str(len(cases)),
                          failures=str(sum(bool(f) for _, f in cases)), errors="0")
    for name, failures in cases:
        case = ET.SubElement(suite, "testcase", classname="forensics.check_plan", name=name)
        if failures:
            fail = ET.SubElement(case, "failure", message=failures[0], type="BatchCompositionError")
            fail.text = "\n".join(failures)
    out = ET.SubElement(suite, "system-out")
    out.text = summary(result)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)


def summary(result: GateResult) -> str:
    """A few plain lines: the measures per epoch pair, the limits and the verdict with its causes."""
    lines = [f"{result.source}: epochs {result.epochs}"]
    for p in result.pairs + ([result.first_last] if len(result.epochs) > 2 else []):
        lines.append(f"epochs {p.earlier}-{p.later}: pair retention {_pct(p.pair_retention)}, identical batches "
                     f"{_pct(p.identical_batches)}, order only {'yes' if p.order_only else 'no'}")
    lines.append(f"limits: pair retention {_pct(result.threshold.pair_retention)}, identical batches "
                 f"{_pct(result.threshold.identical_batches)} ({result.threshold.how})")
    lines.append("PASS: batch composition varies across epochs" if result.passed else "FAIL")
    lines += [f"- {f}" for f in result.failures]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


def assert_batches_vary(
    plan_or_builder: pd.DataFrame | str | Path | Callable,
    samples: pd.DataFrame | None = None,
    epochs: int | None = None,
    seed: int = 0,
    **limits,
) -> GateResult:
    """Assert from a test that batch composition varies across epochs (the same checks as ``forensics check-plan``).

    ``plan_or_builder``: a plan DataFrame (with ``epoch``), a plan file (``Path``), a builder callable, or a builder
    spec string (a reference builder's name, ``module:function`` or ``path/to/file.py:function``). ``epochs``: all of
    a plan's, 3 for a builder. ``limits``: any keyword of :func:`check_plan` (``max_pair_retention``,
    ``allow_drop_last``, ``token_budget``, ...). Raises ``AssertionError`` with the causes; returns the result.
    """
    from forensics.schema import load_plan

    if samples is not None:
        samples = validate_samples(samples, "(samples given to assert_batches_vary)")
    if isinstance(plan_or_builder, pd.DataFrame):
        result = check_plan(validate_plan(plan_or_builder, "(plan given to assert_batches_vary)", samples), samples,
                            epochs=epochs, seed=seed, **limits)
    elif isinstance(plan_or_builder, Path):
        result = check_plan(load_plan(plan_or_builder, samples), samples, epochs=epochs, seed=seed,
                            source=str(plan_or_builder), **limits)
    else:
        result = check_plan(samples=samples, builder=plan_or_builder, epochs=epochs, seed=seed, **limits)
    if not result.passed:
        raise AssertionError("batch composition check failed:\n" + summary(result))
    return result


# --- a case folder -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GateOptions:
    """The gate's own limits, when given (each 0-1; ``allow_drop_last`` samples an epoch may miss)."""

    max_pair_retention: float | None = None
    max_identical_batches: float | None = None
    allow_drop_last: int = 0
    min_padding_efficiency: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_pair_retention", "max_identical_batches", "min_padding_efficiency"):
            v = getattr(self, name)
            if v is not None and not 0 <= v <= 1:
                raise ForensicsError(f"check-plan: {name} must be between 0 and 1; got {v}")
        if not isinstance(self.allow_drop_last, int) or self.allow_drop_last < 0:
            raise ForensicsError(f"check-plan: allow_drop_last must be a whole number >= 0; got {self.allow_drop_last}")


def check_case(
    case: Case,
    *,
    builder: str | Callable | None = None,
    epochs: int | None = None,
    seed: int = 0,
    options: GateOptions = GateOptions(),
) -> GateResult:
    """``forensics check-plan``: the case's plan (or ``builder`` called per epoch on its samples) judged with the
    case's run configuration (step mapping, token budget, max_len, boundaries: named, else fitted to the samples)."""
    from forensics.plan.step_mapping import check_mapping
    from forensics.schema import load_plan, load_samples

    cfg = case.config
    if builder is None and cfg.plan is None:
        raise ForensicsError("check-plan needs a plan (--plan, or plan.parquet in the case) or --builder")
    samples = load_samples(case.samples_path) if cfg.samples else None
    plan = None
    if builder is None:
        # Epochs are compared by batch_id, so the plan is not mapped to steps here (on a 10M-row plan that was half
        # of the command's time); only the cluster mix needs steps, and it maps them itself with the same settings.
        plan = load_plan(case.plan_path, samples, columns=PLAN_INT_COLUMNS)
        check_mapping(plan, cfg.grad_accum, cfg.world_size, cfg.rank_split)
    if cfg.boundaries:
        boundaries = list(cfg.boundaries)
    elif samples is not None and len(samples):
        boundaries = resolve_boundaries(None, samples, cfg.max_len, cfg.n_buckets)
    else:
        boundaries = list(DEFAULT_BOUNDARIES)
    source = f"plan {case.plan_path}" if builder is None else f"builder {builder}"
    return check_plan(plan, samples, builder=builder, epochs=epochs, seed=seed,
                      token_budget=cfg.token_budget if "token_budget" in cfg.given else None, max_len=cfg.max_len,
                      boundaries=boundaries, max_pair_retention=options.max_pair_retention,
                      max_identical_batches=options.max_identical_batches, allow_drop_last=options.allow_drop_last,
                      min_padding_efficiency=options.min_padding_efficiency, grad_accum=cfg.grad_accum,
                      world_size=cfg.world_size, rank_split=cfg.rank_split, source=source)
