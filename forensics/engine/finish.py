"""The gate's figures from an engine's counts: every ratio is computed here, once, for every engine."""

from __future__ import annotations

from forensics.engine.base import EpochCounts, GateCounts, PairCounts
from forensics.plan.composition import SORTED_TOLERANCE, EpochCoverage, PairComposition


def pair_composition(p: PairCounts, earlier: EpochCounts, later: EpochCounts) -> PairComposition:
    """Pair retention, identical batches and order-only of two epochs, as
    :func:`forensics.plan.composition.compare_epochs` defines them."""
    order_only = p.exact == later.batches == earlier.batches and later.batches > 0
    return PairComposition(
        earlier=p.earlier,
        later=p.later,
        pair_retention=p.retained / later.pairs if later.pairs else 0.0,
        identical_batches=p.identical_multi / later.multi if later.multi else 0.0,
        order_only=order_only,
        same_order=bool(order_only and p.same_places),
        pairs=later.pairs,
        retained_pairs=p.retained,
        multi_batches=later.multi,
        identical_multi_batches=p.identical_multi,
    )


def gate_figures(g: GateCounts) -> dict:
    """``pairs``, ``first_last``, ``coverage``, ``padding`` (per epoch real / padded), ``length_sorted`` (per epoch)
    and ``batch_shape`` (the token budget and batch size the plan was evidently built under) of the counts."""
    by_epoch = {e.epoch: e for e in g.epochs}
    pairs = [pair_composition(p, by_epoch[p.earlier], by_epoch[p.later]) for p in g.pairs]
    fl = g.first_last
    budget = max((e.budget for e in g.epochs), default=0)
    size = max((e.max_size for e in g.epochs if e.budget), default=0)
    return {
        "pairs": pairs,
        "first_last": pair_composition(fl, by_epoch[fl.earlier], by_epoch[fl.later]) if fl else None,
        "coverage": [EpochCoverage(e.epoch, g.n_samples - e.present, e.rows - e.present) for e in g.epochs],
        "padding": [float(e.real) / e.padded if e.padded else 1.0 for e in g.epochs],
        "length_sorted": [
            e.shape_batches >= 2 and e.overlaps <= SORTED_TOLERANCE * (e.shape_batches - 1) for e in g.epochs
        ],
        "batch_shape": (budget or None, size or None),
    }
