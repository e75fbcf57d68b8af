"""The gate in words: each composition failure's cause, the note on a plan sorted as a whole, and the summary.

The sentences are what a user reads in the terminal, the JSON's ``failures`` and the JUnit file, so they name the
mechanism, not only the numbers: ``built_once`` "the batches are built once and only reordered" (every batch of one
epoch is a batch of the other); ``reseeded`` "the same batches in the same order: re-seeded identically every epoch"
(a generator given the same seed, lhotse or a DistributedSampler without ``set_epoch``); ``shuffle_then_sort``
"regrouped from the same samples (shuffle then sort)"; ``regrouped`` (over the limit without being sorted as a whole:
groups finer than the reference, e.g. length buckets holding a batch or two); ``identical_batches``.
"""

from __future__ import annotations

from forensics.plan.composition import PairComposition
from forensics.plan.gate.limits import Limits
from forensics.plan.gate.result import GateResult


def percent(x: float) -> str:
    """A share as the summary prints it: whole percents near 0 and 1, more digits for small shares."""
    if x >= 0.9995 or x == 0:
        return f"{x:.0%}"
    return f"{x:.1%}" if x >= 0.001 else f"{x:.3%}"


def listing(tags: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return tags[0] if len(tags) == 1 else ", ".join(tags[:-1]) + " and " + tags[-1]


def share_span(values: list[float]) -> str:
    """The range of some shares, one figure when they print the same (``100%``, ``12-18%``)."""
    lo, hi = percent(min(values)), percent(max(values))
    return lo if lo == hi else f"{lo.rstrip('%')}-{hi}"


def composition_cause(kind: str, pairs: list[PairComposition], lim: Limits) -> str:
    """The cause in words for pairs of epochs that fail the same way."""
    retention = [p.pair_retention for p in pairs]
    identical = [p.identical_batches for p in pairs]
    if kind == "same_order":
        return (
            "are the same batches in the same order: re-seeded identically every epoch (a generator given the "
            "same seed each epoch, or set_epoch never called)"
        )
    if kind == "order_only":
        return "share 100% of batch-mate pairs: the batches are built once and only reordered"
    if kind == "identical":
        return f"repeat {share_span(identical)} of their batches exactly (limit {percent(lim.identical_batches)})"
    also = (
        f" and repeat {share_span(identical)} of their batches exactly (limit {percent(lim.identical_batches)})"
        if kind.endswith("+identical")
        else ""
    )
    head = f"share {share_span(retention)} of batch-mate pairs (limit {percent(lim.pair_retention)}){also}"
    if kind == "sorted_identical":
        head = f"repeat {share_span(identical)} of their batches exactly (limit {percent(lim.identical_batches)})"
    if kind.startswith("sorted"):
        return (
            f"{head}: regrouped from the same samples (shuffle then sort): every batch is a run of the length "
            "order, so only samples of equal length can change batch (a shuffle that a later sort undoes; a "
            "length-grouped sampler whose one mega-batch covers the whole dataset is the same thing)"
        )
    return (
        f"{head}: the batches are mostly regrouped from the same samples, though not sorted as a whole: they "
        "group by length far more tightly than sorted mega-batches of 50 batches (HF's group_by_length, the "
        "limit's reference), e.g. length buckets that hold only a batch or two each, or a few huge sorted "
        "mega-batches"
    )


def sorted_note(pairs: list[PairComposition], lim: Limits) -> str:
    """Why a plan sorted as a whole passes: its ties are many enough that the sort regroups most pairs."""
    epochs = listing([f"{p.earlier}-{p.later}" for p in pairs])
    return (
        f"epochs {epochs} are sorted by length as a whole (shuffle then "
        "sort, or a length-grouped sampler whose one mega-batch covers the whole dataset): only samples of equal "
        f"length change batch, and enough samples share each length that they keep "
        f"{share_span([p.pair_retention for p in pairs])} of batch-mate pairs, within the limit "
        f"{percent(lim.pair_retention)}: they regroup like a bucketed shuffle with one bucket per length"
    )


def summary(result: GateResult) -> str:
    """A few plain lines: the measures per epoch pair, the limits and the verdict with its causes."""
    lines = [f"{result.source}: epochs {result.epochs}"]
    for p in result.pairs + ([result.first_last] if len(result.epochs) > 2 else []):
        lines.append(
            f"epochs {p.earlier}-{p.later}: pair retention {percent(p.pair_retention)}, identical batches "
            f"{percent(p.identical_batches)}, order only {'yes' if p.order_only else 'no'}"
        )
    lines.append(
        f"limits: pair retention {percent(result.threshold.pair_retention)}, identical batches "
        f"{percent(result.threshold.identical_batches)} ({result.threshold.how})"
    )
    lines.append("PASS: batch composition varies across epochs" if result.passed else "FAIL")
    lines += [f"- {f}" for f in result.failures]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)
