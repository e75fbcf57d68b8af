"""The gate from a test suite: one call that raises ``AssertionError`` with the causes in words."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from forensics.plan.gate.check import check_plan
from forensics.plan.gate.result import GateResult
from forensics.plan.gate.wording import summary
from forensics.schema import load_plan, validate_plan, validate_samples


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
    if samples is not None:
        samples = validate_samples(samples, "(samples given to assert_batches_vary)")
    if isinstance(plan_or_builder, pd.DataFrame):
        result = check_plan(
            validate_plan(plan_or_builder, "(plan given to assert_batches_vary)", samples),
            samples,
            epochs=epochs,
            seed=seed,
            **limits,
        )
    elif isinstance(plan_or_builder, Path):
        result = check_plan(
            load_plan(plan_or_builder, samples),
            samples,
            epochs=epochs,
            seed=seed,
            source=str(plan_or_builder),
            **limits,
        )
    else:
        result = check_plan(samples=samples, builder=plan_or_builder, epochs=epochs, seed=seed, **limits)
    if not result.passed:
        raise AssertionError("batch composition check failed:\n" + summary(result))
    return result
