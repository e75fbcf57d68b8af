"""``compare_runs``: RUNs in, a :class:`~forensics.compare.result.Comparison` out (the library behind
``forensics compare``).

The alignment defaults to data positions when every run has a plan (``--by data``), else to steps; ``--by data``
with no plan at all is bad input, and a run without a plan in a ``data`` comparison is aligned by step (said in the
warnings). ``same_order`` (``--same-order``) says that runs without a plan read the data in the same order; plans
say it themselves, so it is ignored (with a warning) when every run has one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from forensics.compare.align import BY, align
from forensics.compare.result import Comparison, id_warnings
from forensics.compare.runs import load_run, run_names
from forensics.errors import ForensicsError


def compare_runs(
    sources: Sequence[str],
    *,
    names: Sequence[str] | None = None,
    by: str | None = None,
    same_order: bool = False,
    tolerance: int = 0,
    sets: Sequence[str] = (),
    stage: Callable[[str], Any] | None = None,
) -> Comparison:
    """Compare the spikes of two or more runs (module docstring); the first run is "before"."""
    if len(sources) < 2:
        raise ForensicsError("compare: give two runs or more (case folders or metrics sources)")
    if by is not None and by not in BY:
        raise ForensicsError(f"--by: expected one of {', '.join(BY)}; got {by!r}")
    if tolerance < 0:
        raise ForensicsError(f"--tolerance: expected a whole number of steps >= 0; got {tolerance}")
    labels = run_names(sources, names)
    runs = [load_run(str(s), n, sets=sets, stage=stage) for s, n in zip(sources, labels, strict=True)]
    warnings = [f"{r.name}: {w}" for r in runs for w in r.warnings]
    planned = [r for r in runs if r.plan is not None]
    if by is None:
        by = "data" if len(planned) == len(runs) else "step"
    elif by == "data" and not planned:
        raise ForensicsError(
            "--by data: no run has a plan (plan.parquet, or a recorded plan/ folder); compare by "
            "step, with --same-order when the runs read the data in the same order"
        )
    if by == "data" and len(planned) < len(runs):
        lacking = ", ".join(r.name for r in runs if r.plan is None)
        warnings.append(
            f"--by data: {lacking} {'has' if len(runs) - len(planned) == 1 else 'have'} no plan: aligned by step"
        )
    if same_order and len(planned) == len(runs):
        warnings.append("--same-order: every run has a plan, and the plans say the order; the flag is ignored")
        same_order = False
    unknown = [r for r in runs[1:] if runs[0].plan is None or r.plan is None]
    if unknown and not same_order:
        warnings.append(
            "the runs' data order is not known (no plans): a spike at the same step in several runs "
            "is classed recurring by its step alone; give --same-order when they read the data in the "
            "same order (a rerun, another seed of the model only)"
        )
    warnings += id_warnings(runs)
    positions = align(runs, by=by, same_order=same_order, tolerance=tolerance)
    return Comparison(
        runs=runs, positions=positions, by=by, same_order_given=same_order, tolerance=tolerance, warnings=warnings
    )
