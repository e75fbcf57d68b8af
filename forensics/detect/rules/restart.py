"""Restarts: steps going back in a source (a resumed run logging into the same file or W&B run).

One finding per rewind (``details``: ``last_step``, ``resumed_at``, ``source``, ``rows_replaced``, ``max_diff``,
``noise``); the metrics table keeps the later values (last write wins). A resume whose rewritten loss values differ
from the first ones by more than ``k`` times the loss's noise (median absolute step-to-step change) is a warning
(a non-deterministic resume or a changed setting); else info.
"""

from __future__ import annotations

import numpy as np

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding
from forensics.detect.params import positive


def loss_noise(values: np.ndarray) -> float:
    """The median absolute change between consecutive finite values (0 when fewer than two)."""
    v = values[np.isfinite(values)]
    return float(np.median(np.abs(np.diff(v)))) if len(v) > 1 else 0.0


def resume_differs(overlap: list[tuple[int, float, float]], noise: float, k: float) -> tuple[bool, float]:
    """Whether the resumed values differ from the first ones beyond ``k`` x ``noise``; and the largest difference."""
    diffs = [abs(b - a) for _, a, b in overlap if np.isfinite(a) and np.isfinite(b)]
    biggest = max(diffs) if diffs else 0.0
    return biggest > k * noise, biggest


class RestartRule(Rule):
    """One finding per rewind the sources recorded (``run.rewinds``)."""

    name = "restart"
    live_kinds = ("restart",)
    parameter_constraints = {"k": positive()}

    def __init__(self, k: float = 3.0) -> None:
        self.k = k

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        values = run.written_rows(run.loss_key)[run.loss_key].to_numpy(dtype="float64", na_value=np.nan)
        noise = loss_noise(values)
        out = []
        for r in run.rewinds:
            overlap = r.overlap.get(run.loss_key, [])
            differs, biggest = resume_differs(overlap, noise, self.k)
            out.append(
                Finding(
                    kind="restart",
                    step=int(r.from_step),
                    metric=run.loss_key,
                    confidence=0.9,
                    details={
                        "last_step": r.last_step,
                        "resumed_at": int(r.from_step),
                        "source": r.source,
                        "rows_replaced": r.rows_replaced,
                        "max_diff": biggest,
                        "noise": noise,
                        "support": {"warning": True} if differs else {},
                    },
                    evidence=[
                        f"{r.source}: logging went back from step {r.last_step} to {r.from_step}; the later "
                        f"values are kept ({r.rows_replaced} steps rewritten)"
                        + (
                            f"; resumed {run.loss_key} differs by up to {biggest:.4g} (noise {noise:.4g})"
                            if differs
                            else ""
                        )
                    ],
                )
            )
        return out
