"""Optimizer and numerics signals read from the logs: did the update norm, the weights' norm, the z loss or the count
of zero gradients rise before a loss spike?

Trainers log them beside the loss: Megatron-LM prints ``params norm`` (with ``--log-params-norm``) and ``num zeros``
(``num_zeros_in_grad``); OLMo-core logs ``train/Z loss`` and an update norm under ``optim/``. Each says what a
re-run would measure, without one: the updates growing before the loss (marin's spikes: the update norm doubled
first) is the optimizer's doing, the z loss (the output logits' squared log-sum-exp) growing is the logits', and
gradient entries turning to exactly 0 is an fp16 underflow's mark.

**Rule.** Each signal goes through the grad norm's precedence rule (:func:`forensics.detect.evidence.precedence.rise`:
a robust baseline before the window, elevated rows at ``factor`` x the baseline and ``z`` robust SDs above it, the
elevated run reaching furthest into the spike): ``leads``/``with``/``lags``/``none``, ``lead_steps``. The params norm
takes its own factor, :data:`PARAMS_NORM_FACTOR` (the weights' norm barely moves in a healthy run). A count that
sits at 0 (``num zeros`` in a healthy run) is elevated by any value above 0. What a rise says:

- **update norm**, **params norm**: ``optimizer`` when it ``leads`` (the update before the spiking step made its
  state; a rise with the loss is the batch's own gradient, which says data, as for the grad norm);
- **z loss**, **num zeros**: ``numerics`` when it ``leads`` or rises ``with`` the loss (the logits or the underflow
  at the spiking step itself).

The re-run judge (:mod:`forensics.replay.rerun_judge`) reads ``optimizer`` and ``numerics`` from findings.json.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from forensics.detect.evidence.log_numerics import LEAD_WINDOW
from forensics.detect.evidence.precedence import PRECEDENCE_FACTOR, PRECEDENCE_Z, rise
from forensics.schema import STEP
from forensics.schema.keys import num_zeros_column, params_norm_column, update_norm_column, z_loss_column


@dataclass(frozen=True)
class Signal:
    """One logged signal: how to find its column, the class a rise implies, the relations that imply it, and what
    the rise means in words."""

    name: str
    column: Callable[[Iterable[str]], str | None]
    cause: str
    counts: frozenset[str]
    meaning: str
    #: The elevated-row factor when the caller's (the grad norm's) does not fit the quantity; None: the caller's.
    factor: float | None = None


#: The norm of all the weights moves by a fraction of a percent over many steps in a healthy run (it drifts with
#: weight decay and the learning rate), so growing by 5% within the window around a spike is already far out of its
#: range, where the grad norm's 1.5x would need the weights to grow by half; the z test still applies.
PARAMS_NORM_FACTOR = 1.05

SIGNALS = (
    Signal("update_norm", update_norm_column, "optimizer", frozenset({"leads"}), "the updates grew before the loss"),
    Signal(
        "params_norm",
        params_norm_column,
        "optimizer",
        frozenset({"leads"}),
        "the weights grew before the loss",
        factor=PARAMS_NORM_FACTOR,
    ),
    Signal("z_loss", z_loss_column, "numerics", frozenset({"leads", "with"}), "the output logits grew"),
    Signal("num_zeros", num_zeros_column, "numerics", frozenset({"leads", "with"}), "gradient entries went to 0"),
)


def log_signals(
    metrics: pd.DataFrame,
    start: int,
    end: int | None = None,
    *,
    lead_window: int = LEAD_WINDOW,
    factor: float = PRECEDENCE_FACTOR,
    z: float = PRECEDENCE_Z,
) -> dict[str, Any] | None:
    """What the logged signals say about a loss spike over steps ``start``-``end`` (module docstring):
    ``{signals: {name: {column, relation, lead_steps, first_step, peak_ratio, baseline, peak}}, optimizer,
    numerics, evidence}``, one entry per signal the run logs; None when it logs none of them."""
    cols = [c for c in metrics.columns if c != STEP]
    found: dict[str, Any] = {}
    evidence: list[str] = []
    says = {"optimizer": False, "numerics": False}
    for sig in SIGNALS:
        column = sig.column(cols)
        if not column:
            continue
        r = rise(metrics, column, start, end, lead_window=lead_window, factor=sig.factor or factor, z=z)
        found[sig.name] = {
            "column": column,
            "relation": r["relation"],
            "lead_steps": r["lead_steps"],
            "first_step": r["first_step"],
            "peak_ratio": r["peak_ratio"],
            "baseline": r["baseline"],
            "peak": r["peak"],
        }
        if r["relation"] == "none":
            continue
        counts = r["relation"] in sig.counts
        says[sig.cause] |= counts
        evidence.append(_sentence(column, r, start, f"{sig.meaning} ({sig.cause})" if counts else None))
    if not found:
        return None
    return {"signals": found, **says, "evidence": evidence}


def _sentence(column: str, r: dict[str, Any], start: int, meaning: str | None) -> str:
    lead = r["lead_steps"]
    when = (
        f"{lead} step{'s' if lead > 1 else ''} ahead of the loss spike at {start}"
        if lead > 0
        else f"at the loss spike's start, step {start}"
        if lead == 0
        else f"{-lead} step{'s' if lead < -1 else ''} after the loss spike at {start}"
    )
    size = (
        f"{r['peak_ratio']:.3g}x its baseline {r['baseline']:.3g}"
        if r["peak_ratio"] is not None
        else f"from {r['baseline']:.3g} to {r['peak']:.3g}"
    )
    if meaning is None:  # a rise that implies no class: with the loss (the batch's own gradient) or after it
        meaning = "with the loss, as the batch's own gradient would be" if lead == 0 else "the loss moved first"
    return f"{column} rose {when} ({size}): {meaning}."
