"""Epoch-boundary spikes: the loss jumps within a few steps of the start of every epoch (a data order that restarts:
a sampler whose ``set_epoch`` is never called, one fixed seed, a loader or shuffle buffer rebuilt each epoch).

Each epoch after the first is judged at its start ``s``: its first step in the plan's step tags, else the first
logged step whose ``epoch`` metric (HF Trainer logs it) reaches the next whole number. The peak of the loss over the
``window`` logged values from ``s`` is compared with the median of the ``baseline`` values before ``s``, in units of
the loss's noise (the robust SD of its step-to-step changes over sqrt 2: a trend moves it little). The epoch
*jumps* when the peak is at least ``z`` noise units above. A finding needs all of:

- at least ``min_epochs`` epochs jump, and at least ``share`` of the epochs judged;
- chance does not explain them: the same test at every step of the run gives the rate ``q`` at which any step is
  followed by such a jump; P(at least that many of the judged epochs jump | q) must be below ``alpha`` (a jumpy run
  whose spikes fall anywhere has a high ``q``, and a few of them landing on epoch starts means nothing).

``details``: ``epochs`` (the epochs that jump), ``steps`` (their first steps), ``offset`` (the median number of steps
from an epoch's start to its peak), ``judged``, ``z`` (per jumping epoch), ``chance`` (the probability above). Its
default severity is ``warning`` (:mod:`forensics.detect.causes.severity`); the evidence names the likely causes, and
the plan gate's verdict when it found the order repeating.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding
from forensics.detect.health import diff_noise
from forensics.detect.params import at_least, fraction, positive
from forensics.schema import STEP
from forensics.schema.steps import step_span
from forensics.stats import binom_sf, rolling_median

#: The gate's failure kinds that mean the data order repeats from one epoch to the next.
REPEATING_ORDER = {
    "reseeded": "the plan shows each epoch in the same order (re-seeded alike, or set_epoch never called)",
    "built_once": "the plan shows the same batches every epoch, only reordered",
}


def epoch_starts(run: RunTables) -> dict[int, int]:
    """``{epoch: first step}`` for every epoch after the first: from the plan's step tags, else the metrics'
    ``epoch`` column (the first logged step at or past each whole number); empty when neither says."""
    tags = run.tags
    if tags is not None and "epoch" in tags.columns and STEP in tags.columns:
        known = tags[[STEP, "epoch"]].dropna()
        first = known.groupby("epoch")[STEP].min().sort_index()
        return {int(e): int(s) for e, s in first.items()}
    col = next((c for c in run.metrics.columns if str(c).lower() in ("epoch", "train/epoch")), None)
    if col is None:
        return {}
    rows = run.written_rows(col)
    steps = rows[STEP].to_numpy(np.int64)
    whole = np.floor(rows[col].to_numpy(np.float64, na_value=np.nan) + 1e-9)
    ok = np.isfinite(whole)
    steps, whole = steps[ok], whole[ok]
    out: dict[int, int] = {}
    for e in np.unique(whole):
        out[int(e)] = int(steps[np.argmax(whole >= e)])
    return out


def noise_sd(values: np.ndarray) -> float:
    """The robust SD of one step's noise (:func:`forensics.detect.health.diff_noise` of the finite values)."""
    return diff_noise(values[np.isfinite(values)])


def jump_scores(values: np.ndarray, window: int, baseline: int, noise: float) -> np.ndarray:
    """At every position i: (the peak of ``values[i:i+window]`` - the median of ``values[i-baseline:i]``) / noise;
    NaN where either side is short (fewer than ``window`` values after, or half of ``baseline`` before)."""
    n = len(values)
    s = pd.Series(values)
    ahead = s[::-1].rolling(window, min_periods=window).max()[::-1].to_numpy()
    before = rolling_median(values, baseline, center=False, min_periods=max(2, baseline // 2))
    before = np.r_[np.nan, before[:-1]] if n else before
    with np.errstate(invalid="ignore", divide="ignore"):
        return (ahead - before) / noise if noise > 0 else np.full(n, np.nan)


class EpochBoundaryRule(Rule):
    """An ``epoch_boundary`` finding when the loss jumps at the start of most epochs (module docstring).

    Parameters: ``window`` 5 (logged values from an epoch's start), ``baseline`` 20 (values before it), ``z`` 4.0
    (noise units a jump must reach), ``min_epochs`` 2, ``share`` 0.5 (of the epochs judged), ``alpha`` 0.01 (the
    chance the run's own rate of jumps leaves).
    """

    name = "epoch_boundary"
    parameter_constraints = {
        "window": at_least(1, "int"),
        "baseline": at_least(4, "int"),
        "z": positive(),
        "min_epochs": at_least(1, "int"),
        "share": fraction(),
        "alpha": fraction(),
    }

    def __init__(
        self,
        window: int = 5,
        baseline: int = 20,
        z: float = 4.0,
        min_epochs: int = 2,
        share: float = 0.5,
        alpha: float = 0.01,
    ) -> None:
        self.window = window
        self.baseline = baseline
        self.z = z
        self.min_epochs = min_epochs
        self.share = share
        self.alpha = alpha

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        run_start = int(run.metrics[STEP].min()) if len(run.metrics) else 0
        starts = {e: s for e, s in epoch_starts(run).items() if s > run_start}
        if len(starts) < self.min_epochs or run.loss_key not in run.metrics.columns:
            return []
        rows = run.written_rows(run.loss_key)
        steps = rows[STEP].to_numpy(np.int64)
        values = rows[run.loss_key].to_numpy(np.float64, na_value=np.nan)
        noise = noise_sd(values)
        scores = jump_scores(values, int(self.window), int(self.baseline), noise)
        judged: list[tuple[int, int, int, float]] = []  # (epoch, start step, position, score)
        for epoch, start in sorted(starts.items()):
            i = int(np.searchsorted(steps, start))
            if i < len(scores) and np.isfinite(scores[i]):
                judged.append((epoch, start, i, float(scores[i])))
        jumped = [j for j in judged if j[3] >= self.z]
        if len(jumped) < self.min_epochs or len(jumped) < self.share * len(judged):
            return []
        valid = np.isfinite(scores)
        q = float((scores[valid] >= self.z).mean()) if valid.any() else 1.0
        chance = float(binom_sf(np.asarray(len(jumped)), len(judged), np.asarray(q)))
        if chance >= self.alpha:
            return []
        offsets = [int(np.argmax(values[i : i + self.window])) for _, _, i, _ in jumped]
        peak_steps = [int(steps[i + o]) for (_, _, i, _), o in zip(jumped, offsets, strict=True)]
        offset = int(np.median([steps[i + o] - s for (_, s, i, _), o in zip(jumped, offsets, strict=True)]))
        epochs = [e for e, _, _, _ in jumped]
        first, last = jumped[0][1], jumped[-1][1]
        summary = (
            f"{run.loss_key} jumps within {self.window} logged steps of the start of epoch"
            f"{'s' if len(epochs) > 1 else ''} {', '.join(map(str, epochs))} ({len(jumped)} of {len(judged)} "
            f"epochs judged, up to {max(j[3] for j in jumped):.1f}x its noise above the steps before; "
            + (
                "peaking at each start, "
                if offset == 0
                else f"peaking {offset} step{'s' if offset != 1 else ''} after each start, "
            )
            + f"{step_span(first, last, offset=run.logged_offset)}): the data order restarts with each epoch."
        )
        evidence = [
            summary,
            "Likely causes: the sampler's order restarts every epoch (DistributedSampler.set_epoch "
            "never called, one fixed seed), so the same first batches open each epoch; or the "
            "loader is rebuilt each epoch (an iterator, a shuffle buffer or shards starting over).",
        ]
        plan = run.sections.get("plan") if isinstance(run.sections.get("plan"), dict) else None
        repeating = [REPEATING_ORDER[k] for k in (plan or {}).get("failure_kinds", []) if k in REPEATING_ORDER]
        if repeating:
            evidence.append("The plan agrees: " + "; ".join(repeating) + ".")
        return [
            Finding(
                kind="epoch_boundary",
                step=first,
                metric=run.loss_key,
                end_step=last,
                value=float(values[jumped[0][2] + offsets[0]]),
                confidence=round(1.0 - chance, 4),
                evidence=evidence,
                next_step=(
                    "Call sampler.set_epoch(epoch) before each epoch (or seed the shuffle with the epoch), and "
                    "check that the first batches of each epoch differ: forensics check-plan CASE."
                ),
                details={
                    "epochs": epochs,
                    "steps": [s for _, s, _, _ in jumped],
                    "offset": offset,
                    "peak_steps": peak_steps,
                    "judged": len(judged),
                    "z": [round(j[3], 2) for j in jumped],
                    "chance": chance,
                    "noise": noise,
                    "support": {},
                },
            )
        ]
