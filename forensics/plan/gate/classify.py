"""Which way a plan fails: each pair of epochs classified, then the verdict over every check.

Checks (all must hold):

- **composition**: for every consecutive pair of epochs and for the first vs the last epoch, ``pair_retention`` and
  ``identical_batches`` at most their limits (``static`` = this check failed).
- **coverage**: every sample of the universe once per epoch. By default an epoch may miss fewer samples than one of
  its batches holds (distinct samples / batches): that is the last partial batch dropped, as
  ``DataLoader(drop_last=True)`` does (3 of 2,000,003 samples under batches of 8), said in a note and passing; more
  fail, and so does an epoch that repeats a sample (its missing samples are then not excused either: a loader that
  replays part of its epoch misses the rest). ``allow_drop_last = N`` replaces the default: at most N (0: none).
- **padding** (only when ``min_padding_efficiency`` is given): every epoch's real / padded tokens at least that.

Length-sorted plans. :func:`~forensics.plan.composition.length_sorted` tells whether an epoch's batches are the
length order cut into runs, which is what a shuffle-then-sort makes, and also a length-grouped sampler whose one
mega-batch covers the whole dataset (``mega_batch_mult`` large, or a dataset smaller than one mega-batch): such a
sampler *is* shuffle-then-sort, and the gate says so in those words instead of calling it built once. It is judged
by the same limit, for a reason it states: such a plan can only move samples between batches among equal lengths,
so where ties are few it keeps most pairs and fails ("regrouped from the same samples (shuffle then sort)"); where
each length is shared by many samples the sort regroups those ties like a bucketed shuffle with one bucket per
length, keeps fewer pairs than the limit, and passes with a note saying it is sorted as a whole. HF's own rule (at
least 4 mega-batches) gives batches whose length ranges overlap, never a sorted plan.
"""

from __future__ import annotations

from forensics.plan.composition import PairComposition
from forensics.plan.gate.limits import Limits
from forensics.plan.gate.result import GateResult
from forensics.plan.gate.wording import composition_cause, listing, sorted_note
from forensics.schema.words import counted

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


def composition_kind(p: PairComposition, lim: Limits, later_sorted: bool = False) -> str | None:
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


def judge(r: GateResult) -> None:
    """Fill ``failures`` (causes in words, one line per kind of failure), ``failure_kinds``, ``notes``, ``static``
    and ``passed``."""
    lim = r.threshold
    sorted_by_epoch = dict(zip(r.epochs, r.length_sorted or [False] * len(r.epochs)))
    by_kind: dict[str, list[PairComposition]] = {}
    sorted_passing: list[PairComposition] = []
    for p in r.pairs:
        kind = composition_kind(p, lim, sorted_by_epoch.get(p.later, False))
        if kind:
            by_kind.setdefault(kind, []).append(p)
        elif p.pairs and sorted_by_epoch.get(p.later, False):
            sorted_passing.append(p)
    composition = [
        f"epochs {listing([f'{p.earlier}-{p.later}' for p in ps])} {composition_cause(k, ps, lim)}"
        for k, ps in by_kind.items()
    ]
    kinds = list(by_kind)
    if len(r.epochs) > 2 and not composition:  # e.g. a builder alternating between two plans
        kind = composition_kind(r.first_last, lim, sorted_by_epoch.get(r.first_last.later, False))
        if kind:
            kinds.append(kind)
            composition.append(
                f"the first and last epochs ({r.first_last.earlier} and {r.first_last.later}) "
                f"{composition_cause(kind, [r.first_last], lim)}"
            )
    r.notes = [sorted_note(sorted_passing, lim)] if sorted_passing and not composition else []
    cov_fail, dropped = [], []
    batch_sizes = dict(zip(r.epochs, r.epoch_batch_size or [0.0] * len(r.epochs)))
    for c in r.coverage:
        if c.duplicated:
            cov_fail.append(
                f"epoch {c.epoch} repeats samples: {counted(c.duplicated, 'row')} beyond each sample's first"
            )
        if not c.missing:
            continue
        missing = f"epoch {c.epoch} misses {counted(c.missing, 'sample')}"
        batch = batch_sizes.get(c.epoch, 0.0)
        if lim.allow_drop_last is not None:
            if c.missing > lim.allow_drop_last:
                allowed = (
                    f"at most {lim.allow_drop_last} may be dropped"
                    if lim.allow_drop_last
                    else "none may be missing (--allow-drop-last N allows a dropped last batch)"
                )
                cov_fail.append(f"{missing}; {allowed}")
        elif c.missing < batch and not c.duplicated:
            dropped.append(c.epoch)
        else:
            why = "and repeats others" if c.duplicated else f"as many as one batch holds ({batch:.4g} samples)"
            cov_fail.append(f"{missing}, {why}: more than a dropped last batch (--allow-drop-last N allows N)")
    if dropped:
        r.notes.append(
            f"epoch{'s' if len(dropped) > 1 else ''} {listing([str(e) for e in dropped])} miss"
            f"{'' if len(dropped) > 1 else 'es'} fewer samples than one batch: a dropped last partial "
            "batch (DataLoader drop_last=True), not a fault"
        )
    r.dropped_last = dropped
    pad_fail = []
    if lim.min_padding_efficiency is not None:
        if r.epoch_padding_efficiency is None:
            pad_fail.append("--min-padding-efficiency needs the samples (their n_tokens) to measure padding")
        else:
            for ep, eff in zip(r.epochs, r.epoch_padding_efficiency):
                if eff < lim.min_padding_efficiency:
                    pad_fail.append(
                        f"epoch {ep} padding efficiency {eff:.1%} is below {lim.min_padding_efficiency:.1%}"
                    )
    r.static = bool(composition)
    r.failure_kinds = list(dict.fromkeys(FAILURE_KINDS[k] for k in kinds))
    r.composition_failures = composition
    r.coverage_failures = cov_fail
    r.padding_failures = pad_fail
    r.failures = composition + cov_fail + pad_fail
    r.passed = not r.failures
