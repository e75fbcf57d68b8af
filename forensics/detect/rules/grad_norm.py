"""Grad-norm spikes the loss did not follow: one run-level finding, not one per spike (docs/concepts.md).

A grad-norm spike the loss answered belongs to the loss event's cause; one it followed weakly is an event of its own
(a warning). What is left, spikes the loss ignored, says something about the run as a whole (how often the clipping
threshold is reached, whether one bucket, epoch or cluster holds them) and nothing about a batch: they become one
``grad_norm_spikes`` finding, ``info``, or ``warning`` when they concentrate in one bucket, epoch or cluster
(binomial tail of the spikes in a group against its share of the steps, below ``alpha`` with at least ``min_count``
spikes there). Its ``details``: ``count``, ``steps``, ``logged_steps``, ``max_ratio``, ``by_epoch``, ``by_bucket``,
``by_cluster``, ``clustered`` (where they concentrate), ``clipped_share`` (the share of steps above the trainer's
``max_grad_norm``; null when unknown), ``suggested_max_grad_norm`` (the ``quantile`` of the grad norm on steps with no
event) and ``suggested_clipped_share`` (the share of steps above it). The spikes stay in ``spikes``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import INFO, Finding
from forensics.detect.params import fraction, positive
from forensics.detect.tags import BUCKET, StepLookup
from forensics.schema import CLUSTER, EPOCH, STEP
from forensics.schema.words import counted
from forensics.stats import binom_sf

#: The support a grad-norm spike carries when the loss did not follow it (set by the spike driver).
NOT_FOLLOWED = "not_followed"


def unfollowed(found: list[Finding], grad: str | None) -> list[Finding]:
    """The grad-norm spikes the loss did not follow."""
    return [
        f
        for f in found
        if f.kind == "spike"
        and grad is not None
        and f.metric == grad
        and (
            (f.details.get("support") or {}).get("explained") == NOT_FOLLOWED
            or (f.details.get("support") or {}).get("not_followed")
        )
    ]


class GradNormRule(Rule):
    """One ``grad_norm_spikes`` finding for the grad-norm spikes the loss did not follow (module docstring).

    Parameters: ``alpha`` 0.01 (the binomial tail below which spikes concentrate in a group), ``min_count`` 3 (the
    least spikes in that group), ``quantile`` 0.995 (the suggested clipping threshold's quantile of the quiet
    steps' grad norm).
    """

    name = "grad_norm"
    parameter_constraints = {"alpha": fraction(), "min_count": positive("int"), "quantile": fraction()}

    def __init__(self, alpha: float = 0.01, min_count: int = 3, quantile: float = 0.995) -> None:
        self.alpha = alpha
        self.min_count = min_count
        self.quantile = quantile

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        summary = self.summarise(list(found or []), run)
        return [summary] if summary is not None else []

    def summarise(self, found: list[Finding], run: RunTables) -> Finding | None:
        """The one finding of the grad-norm spikes the loss did not follow (None when there are none)."""
        spikes = unfollowed(found, run.grad_norm_key)
        if not spikes:
            return None
        grad = str(run.grad_norm_key)
        rows = run.written_rows(grad)
        steps = rows[STEP].to_numpy(np.int64)
        values = rows[grad].to_numpy(np.float64, na_value=np.nan)
        peaks = [int(f.peak_step if f.peak_step is not None else f.step) for f in spikes]
        quiet = np.ones(len(steps), bool)
        for f in found or []:
            if f.kind == "spike":
                lo, hi = int(f.step), int(f.end_step if f.end_step is not None else f.step)
                quiet &= ~((steps >= lo) & (steps <= hi))
        finite = np.isfinite(values)
        suggested = float(np.quantile(values[quiet & finite], self.quantile)) if (quiet & finite).any() else None
        details: dict[str, Any] = {
            "count": len(spikes),
            "steps": peaks,
            "logged_steps": [s + run.logged_offset for s in peaks],
            "max_ratio": max((float(f.details.get("ratio") or 0.0) for f in spikes), default=None),
            "clipped_share": (
                float(np.mean(values[finite] > run.max_grad_norm)) if run.max_grad_norm and finite.any() else None
            ),
            "max_grad_norm": run.max_grad_norm,
            "suggested_max_grad_norm": suggested,
            "suggested_clipped_share": (float(np.mean(values[finite] > suggested)) if suggested is not None else None),
        }
        clustered = []
        for col, key in ((EPOCH, "by_epoch"), (BUCKET, "by_bucket"), (CLUSTER, "by_cluster")):
            counts, where = self._by(run.tags, steps, peaks, col)
            details[key] = counts
            if where is not None:
                clustered.append(where)
        details["clustered"] = clustered
        support: dict[str, Any] = {"warning": True} if clustered else {}
        first, last = min(peaks), max(peaks)
        ratio = details["max_ratio"]
        evidence = [
            f"{counted(len(spikes), 'grad-norm spike')} (up to {ratio:.3g}x its "
            f"baseline) that the loss did not follow, from step {first} to {last}."
        ]
        if details["clipped_share"] is not None:
            evidence.append(
                f"{100 * details['clipped_share']:.1f}% of steps are above the trainer's max_grad_norm "
                f"{run.max_grad_norm:g} (clipped)."
            )
        if suggested is not None:
            evidence.append(
                f"A clipping threshold of {suggested:.3g} (the {100 * self.quantile:g}th percentile of "
                f"the quiet steps) would clip {100 * details['suggested_clipped_share']:.1f}% of steps."
            )
        evidence += [f"They concentrate in {w}." for w in clustered]
        small = [f for f in spikes if (f.details.get("batch_size") or {}).get("n_samples") is not None]
        if small:
            b = small[0].details["batch_size"]
            evidence.append(
                f"{len(small)} of them on small batches ({b['words']}): a mean over few samples has a "
                "larger gradient norm."
            )
            details["small_batches"] = [int(f.peak_step if f.peak_step is not None else f.step) for f in small]
        return Finding(
            kind="grad_norm_spikes",
            step=first,
            end_step=last,
            metric=grad,
            value=ratio,
            severity=INFO,
            evidence=evidence,
            details={**details, "support": support, "confidence": 1.0 - 0.5 / max(len(spikes), 1)},
            next_step=(
                "Nothing to replay: the loss ignored them. If they cluster, look at what those "
                "steps share; a clipping threshold near the suggested one bounds them."
            ),
        )

    def _by(
        self, tags: pd.DataFrame | None, steps: np.ndarray, peaks: list[int], col: str
    ) -> tuple[dict[str, int], str | None]:
        """Spikes per group of ``col`` and where they concentrate (binomial tail against the group's share of steps)."""
        if tags is None or col not in tags.columns or not len(steps):
            return {}, None
        lookup = StepLookup(tags)
        all_groups = lookup.groups(steps, col)
        at = lookup.groups(np.asarray(peaks, np.int64), col)
        counts = pd.Series(at[at >= 0]).value_counts()
        known = all_groups[all_groups >= 0]
        if not len(known) or not len(counts):
            return {str(int(k)): int(v) for k, v in counts.items()}, None
        share = pd.Series(known).value_counts(normalize=True)
        n = int(counts.sum())
        where = None
        for g, k in counts.items():
            q = float(share.get(g, 0.0))
            if k >= self.min_count and 0 < q < 1 and binom_sf(np.array([k]), n, np.array([q]))[0] < self.alpha:
                where = f"{col} {int(g)} ({int(k)} of {n} spikes, {100 * q:.0f}% of steps)"
                break
        return {str(int(k)): int(v) for k, v in counts.items()}, where
