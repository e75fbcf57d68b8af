"""The gate itself: does a plan (or a builder) group samples differently every epoch?

It measures the plan (:mod:`forensics.plan.composition`), derives the limits from its samples
(:mod:`~forensics.plan.gate.limits`) and classifies each pair of epochs (:mod:`~forensics.plan.gate.classify`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd

from forensics.errors import ForensicsError
from forensics.plan.builders import capped_lengths
from forensics.plan.composition import (
    PlanMembership,
    cluster_mix,
    compare_epochs,
    consecutive_pairs,
    coverage,
    epoch_padding_efficiency,
    index_plan,
    length_sorted,
)
from forensics.plan.gate.classify import judge
from forensics.plan.gate.limits import derive_limits, plan_batch_shape
from forensics.plan.gate.result import GateResult
from forensics.plan.rebuild import rebuild_plan, resolve_builder
from forensics.schema import DEFAULT_BOUNDARIES, EPOCH, MAX_LEN, TOKEN_BUDGET, check_boundaries

#: Epochs a builder is called for when the caller names none: enough for a first-last pair beside the consecutive ones.
BUILDER_EPOCHS = 3


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
    judge(result)
    return result
