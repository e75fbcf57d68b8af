"""The gate itself: does a plan (or a builder) group samples differently every epoch?

It measures the plan (:mod:`forensics.plan.composition`), derives the limits from its samples
(:mod:`~forensics.plan.gate.limits`) and classifies each pair of epochs (:mod:`~forensics.plan.gate.classify`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from forensics.engine.base import Engine, PlanInput
from forensics.engine.finish import gate_figures
from forensics.engine.pandas_engine import PandasEngine
from forensics.errors import ForensicsError
from forensics.plan.builders import capped_lengths
from forensics.plan.composition import cluster_mix, epoch_column
from forensics.plan.gate.classify import judge
from forensics.plan.gate.limits import derive_limits
from forensics.plan.gate.result import GateResult
from forensics.plan.rebuild import rebuild_plan, resolve_builder
from forensics.schema import DEFAULT_BOUNDARIES, MAX_LEN, SAMPLE_ID, TOKEN_BUDGET, check_boundaries

#: Epochs a builder is called for when the caller names none: enough for a first-last pair beside the consecutive ones.
BUILDER_EPOCHS = 3


def check_plan(
    plan: PlanInput | None = None,
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
    allow_drop_last: int | None = None,
    min_padding_efficiency: float | None = None,
    grad_accum: int = 1,
    world_size: int = 1,
    rank_split: str = "round_robin",
    source: str = "",
    engine: Engine | None = None,
) -> GateResult:
    """Judge a plan (validated, with ``epoch``) or a builder (name, ``module:function``, ``file.py:function`` or a
    callable; needs ``samples``) over ``epochs`` epochs (all of the plan's; 3 for a builder).

    ``engine`` (:mod:`forensics.engine`, default pandas) does the counting; ``plan`` may then be a path it reads.
    ``allow_drop_last``: the samples an epoch may miss; None (default) lets it miss fewer than one of its batches
    (a dropped last partial batch, noted), 0 none.

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
        fn = (
            builder
            if callable(builder)
            else resolve_builder(
                builder, token_budget=token_budget or TOKEN_BUDGET, max_len=max_len, boundaries=list(boundaries)
            )
        )
        source = source or (
            f"builder {builder}"
            if isinstance(builder, str)
            else f"builder {getattr(builder, '__name__', repr(builder))}"
        )
        plan = rebuild_plan(samples, fn, epochs or BUILDER_EPOCHS, seed)
    assert plan is not None
    eng = engine or PandasEngine()
    if isinstance(plan, pd.DataFrame):
        epoch_column(plan)  # a plan without epochs is bad input, said the same way by every engine
    lengths = capped_lengths(samples, max_len) if samples is not None else None
    table = (
        None
        if samples is None
        else pd.DataFrame({SAMPLE_ID: samples[SAMPLE_ID].to_numpy(np.int64), "length": np.asarray(lengths)})
    )
    counts = eng.gate_counts(plan, table, epochs)
    if len(counts.epochs) < 2:
        raise ForensicsError(f"plan: holds {len(counts.epochs)} epoch(s); comparing batch composition needs at least 2")
    fig = gate_figures(counts)
    keep = [e.epoch for e in counts.epochs]

    budget, batch_size = (token_budget, None)
    sorted_epochs = None
    if lengths is not None:
        seen_budget, batch_size = fig["batch_shape"]
        budget = token_budget or seen_budget
        sorted_epochs = fig["length_sorted"]
    limits = derive_limits(
        samples,
        token_budget=budget,
        max_batch_size=batch_size,
        max_len=max_len,
        boundaries=boundaries,
        max_pair_retention=max_pair_retention,
        max_identical_batches=max_identical_batches,
        allow_drop_last=allow_drop_last,
        min_padding_efficiency=min_padding_efficiency,
        length_sorted=any(sorted_epochs or []),
    )
    pairs, first_last, cov = fig["pairs"], fig["first_last"], fig["coverage"]
    padding = fig["padding"] if lengths is not None else None
    mix = (
        cluster_mix(
            plan,
            samples,
            grad_accum,
            world_size,
            rank_split,
            engine=eng,
            keep_epochs=keep if epochs is not None else None,
        )
        if samples is not None
        else None
    )
    result = GateResult(
        passed=True,
        static=False,
        epochs=keep,
        pairs=pairs,
        first_last=first_last,
        coverage=cov,
        threshold=limits,
        epoch_padding_efficiency=padding,
        cluster_mix=mix,
        length_sorted=sorted_epochs,
        source=source or "plan",
        epoch_batch_size=[e.present / e.batches if e.batches else 0.0 for e in counts.epochs],
    )
    judge(result)
    return result
