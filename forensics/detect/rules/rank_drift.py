"""Ranks: a rank whose step time or loss drifts from the others, and the ranks a spike happened on.

Metrics tagged by rank are read from their names: a ``rank`` token with its number (``rank0/loss``, ``loss/rank_1``,
``train/loss_rank2``, ``rank-3.step_time``) is the rank, the name without it the metric (``rank_metrics``). With at
least two ranks of a metric:

- **drift**: at each step, a rank's value over the median of the other ranks' values; its ``factor`` is the median of
  that ratio over the last ``tail`` share of the steps (where a drift has arrived). A rank whose factor reaches
  ``factor`` on the step time or the loss (slower, or learning worse, than the others: one-sided, so that with two
  ranks only the one above its peer is named) is a ``rank_drift`` finding (``details``: ``rank``,
  ``metric``, ``factor``, ``ranks``: every rank's factor). Default severity ``warning``.
- **spikes on some ranks**: a spike on a metric whose per-rank columns exist gets ``ranks`` (the ranks whose value at
  the peak stands ``z`` noise units above their own median over the ``window`` steps before it), when that is not every
  rank: the spike happened there. With a plan that has ``rank``, the spike's ``details.rank_batches`` lists those
  ranks' micro-batches at the peak (``rank``, ``micro``, ``sample_ids``), and its evidence names them, the one that
  holds the spike's first suspect among them first: a per-rank log says which rank, the plan which of its batches.
- **max-vs-average pairs** (torchtitan's ``global_max_loss`` / ``global_avg_loss``, ``loss_max`` / ``loss_mean``):
  no rank is named, but when the maximum over ranks rose at least ``max_over_avg`` times as much as the average at a
  spike's peak (one rank of W jumping by J lifts the maximum by J and the average by J / W; a jump on every rank lifts
  both alike), the spike is on some ranks only: it gets ``on_some_ranks`` (true) and the two rises in its evidence.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding
from forensics.detect.params import at_least, fraction, positive
from forensics.detect.rules.epoch_boundary import noise_sd
from forensics.detect.rules.throughput import STEP_TIME
from forensics.schema import MICRO, RANK, SAMPLE_ID, STEP, metric_columns
from forensics.schema.keys import choose_key
from forensics.schema.words import ids_text

#: A rank token in a metric name: ``rank`` then its number, separated from the rest of the name.
_RANK = re.compile(r"(?:^|(?<=[/_.\- ]))rank[_\-]?(\d+)(?=$|[/_.\- ])", re.IGNORECASE)


def rank_metrics(columns: list[str]) -> dict[str, dict[int, str]]:
    """``{metric: {rank: column}}`` for the columns whose name carries a rank token, metrics with two ranks or
    more only (the name without the token and its separator is the metric)."""
    out: dict[str, dict[int, str]] = {}
    for col in columns:
        m = _RANK.search(str(col))
        if not m:
            continue
        base = (str(col)[: m.start()] + str(col)[m.end() :]).strip("/_.- ")
        base = re.sub(r"([/_.\- ])[/_.\- ]+", r"\1", base)
        out.setdefault(base, {})[int(m.group(1))] = col
    return {b: dict(sorted(r.items())) for b, r in out.items() if len(r) >= 2}


def drift_factors(values: pd.DataFrame, tail: float) -> dict[int, float]:
    """Each rank's (column's) median ratio to the median of the other ranks, over the last ``tail`` share of the rows
    where every rank has a finite value."""
    v = values.to_numpy(np.float64)
    ok = np.isfinite(v).all(axis=1)
    v = v[ok]
    if len(v) == 0:
        return {}
    v = v[len(v) - max(int(round(tail * len(v))), 1) :]
    out = {}
    for j, rank in enumerate(values.columns):
        others = np.median(np.delete(v, j, axis=1), axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = v[:, j] / others
        ratio = ratio[np.isfinite(ratio)]
        if len(ratio):
            out[int(rank)] = float(np.median(ratio))
    return out


def spiking_ranks(values: pd.DataFrame, steps: np.ndarray, peak_step: int, window: int, z: float) -> list[int]:
    """The ranks (columns) whose value at ``peak_step`` is at least ``z`` noise units above their own median over the
    ``window`` steps before it."""
    out = []
    at = np.flatnonzero(steps == peak_step)
    if not len(at):
        return out
    i = int(at[0])
    for rank in values.columns:
        col = values[rank].to_numpy(np.float64)
        before = col[max(i - window, 0) : i]
        before = before[np.isfinite(before)]
        noise = noise_sd(col[:i])
        if len(before) >= 2 and noise > 0 and (col[i] - np.median(before)) / noise >= z:
            out.append(int(rank))
    return out


def max_avg_pairs(columns: list[str]) -> dict[str, str]:
    """``{average column: maximum column}``: names that differ only in a ``max`` token against ``avg``/``mean``."""
    names = set(map(str, columns))
    out = {}
    for col in names:
        parts = re.split(r"([/_.\- ])", col)
        for i, p in enumerate(parts):
            if p.lower() != "max":
                continue
            for avg in ("avg", "mean"):
                twin = "".join(parts[:i] + [avg] + parts[i + 1 :])
                if twin in names:
                    out[twin] = col
    return out


def rise_at(values: np.ndarray, i: int, window: int) -> float:
    """``values[i]`` minus the median of the ``window`` finite values before it (NaN when fewer than two)."""
    before = values[max(i - window, 0) : i]
    before = before[np.isfinite(before)]
    return float(values[i] - np.median(before)) if len(before) >= 2 and np.isfinite(values[i]) else float("nan")


class RankDriftRule(Rule):
    """``rank_drift`` findings, and ``ranks`` on the spikes of per-rank metrics (module docstring).

    Parameters: ``factor`` 1.2 (a rank's median ratio to the others that is a drift), ``tail`` 0.5 (the share of the
    run, at its end, the ratio is taken over), ``window`` 20 and ``z`` 4.0 (a rank's own spike at a peak),
    ``max_over_avg`` 1.5 (the maximum's rise over the average's at a peak that puts a spike on some ranks only).
    """

    name = "rank_drift"
    parameter_constraints = {
        "factor": at_least(1.0),
        "tail": fraction(),
        "window": at_least(2, "int"),
        "z": positive(),
        "max_over_avg": at_least(1.0),
    }

    def __init__(
        self, factor: float = 1.2, tail: float = 0.5, window: int = 20, z: float = 4.0, max_over_avg: float = 1.5
    ) -> None:
        self.max_over_avg = max_over_avg
        self.factor = factor
        self.tail = tail
        self.window = window
        self.z = z

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        columns = list(metric_columns(run.metrics))
        steps = run.metrics[STEP].to_numpy(np.int64)
        self._mark_pairs(run, found or [], max_avg_pairs(columns), steps)
        per_rank = rank_metrics(columns)
        if not per_rank:
            return []
        tables = {
            b: pd.DataFrame({r: run.metrics[c].to_numpy(np.float64, na_value=np.nan) for r, c in cols.items()})
            for b, cols in per_rank.items()
        }
        self._mark_spikes(run, found or [], tables, steps)
        judged = [b for b in (choose_key(list(per_rank), STEP_TIME).key, choose_key(list(per_rank), "loss").key) if b]
        out = []
        for base in dict.fromkeys(judged):
            factors = drift_factors(tables[base], self.tail)
            for rank, f in factors.items():
                if f >= self.factor:
                    out.append(self._finding(run, base, rank, f, factors, steps))
        return out

    def _mark_pairs(self, run: RunTables, found: list[Finding], pairs: dict[str, str], steps: np.ndarray) -> None:
        for f in found:
            if f.kind != "spike" or f.metric not in pairs:
                continue
            at = np.flatnonzero(steps == int(f.peak_step if f.peak_step is not None else f.step))
            if not len(at):
                continue
            top = pairs[f.metric]
            avg_rise = rise_at(run.metrics[f.metric].to_numpy(np.float64, na_value=np.nan), int(at[0]), self.window)
            max_rise = rise_at(run.metrics[top].to_numpy(np.float64, na_value=np.nan), int(at[0]), self.window)
            if avg_rise > 0 and max_rise >= self.max_over_avg * avg_rise:
                f.tags["on_some_ranks"] = True
                f.evidence.append(
                    f"{top} rose {max_rise:.4g} at the peak while {f.metric} rose {avg_rise:.4g}: the "
                    "spike is on some ranks only."
                )

    def _mark_spikes(
        self, run: RunTables, found: list[Finding], tables: dict[str, pd.DataFrame], steps: np.ndarray
    ) -> None:
        for f in found:
            if f.kind != "spike" or f.metric is None:
                continue
            base = f.metric if f.metric in tables else next((b for b in tables if _same_metric(b, f.metric)), None)
            if base is None:
                continue
            ranks = spiking_ranks(
                tables[base],
                steps,
                int(f.peak_step if f.peak_step is not None else f.step),
                int(self.window),
                float(self.z),
            )
            if ranks and len(ranks) < tables[base].shape[1]:
                f.tags["ranks"] = ranks
                f.evidence.append(
                    f"The spike is on rank{'s' if len(ranks) > 1 else ''} "
                    f"{', '.join(map(str, ranks))} only (of {tables[base].shape[1]})."
                )
                peak = int(f.peak_step if f.peak_step is not None else f.step)
                batches = rank_batches(run.plan, peak, ranks, list(f.suspect_samples))
                if batches:
                    f.details["rank_batches"] = batches
                    f.evidence.append(
                        f"At step {peak} the plan gives "
                        + "; ".join(
                            f"rank {b['rank']} micro-batch {b['micro']} samples {ids_text(b['sample_ids'])}"
                            for b in batches
                        )
                        + (" (the first holds the first suspect)." if f.suspect_samples else ".")
                    )

    def _finding(
        self, run: RunTables, base: str, rank: int, factor: float, factors: dict[int, float], steps: np.ndarray
    ) -> Finding:
        start = int(steps[len(steps) - max(int(round(self.tail * len(steps))), 1)])
        summary = (
            f"rank {rank}'s {base} runs {factor:.2f}x the other ranks' median over the run's last "
            f"{self.tail:.0%} (from step {start})."
        )
        return Finding(
            kind="rank_drift",
            step=start,
            metric=base,
            end_step=int(steps[-1]),
            value=factor,
            confidence=0.9,
            evidence=[summary],
            tags={"ranks": [rank]},
            next_step=(
                f"Look at rank {rank}'s host (a slow or throttled GPU, a busy data loader, a different data "
                "shard) and its own logs around the steps where it parted from the others."
            ),
            details={
                "rank": rank,
                "metric": base,
                "factor": round(factor, 4),
                "factors": {str(r): round(v, 4) for r, v in factors.items()},
                "support": {},
            },
        )


def rank_batches(
    plan: pd.DataFrame | None, step: int, ranks: list[int], suspects: list[int]
) -> list[dict[str, object]]:
    """The micro-batches of ``ranks`` at ``step`` in a plan that has ``rank`` (``rank``, ``micro``, ``sample_ids``):
    the one holding the earliest-ranked of ``suspects`` first, then by rank and micro; empty without such a plan."""
    if plan is None or RANK not in plan.columns or STEP not in plan.columns:
        return []
    at = plan[(plan[STEP].to_numpy() == step) & plan[RANK].isin(ranks).to_numpy()]
    if at.empty:
        return []
    micro = at[MICRO] if MICRO in at.columns else pd.Series(0, index=at.index)
    order = {int(s): i for i, s in enumerate(suspects)}
    out = []
    for (rank, m), group in at.groupby([at[RANK].to_numpy(), micro.to_numpy()], sort=True):
        ids = [int(x) for x in group[SAMPLE_ID]]
        out.append({"rank": int(rank), "micro": int(m), "sample_ids": ids})
    first = {id(b): min((order.get(i, len(order)) for i in b["sample_ids"]), default=len(order)) for b in out}
    return sorted(out, key=lambda b: first[id(b)])


def _same_metric(base: str, metric: str) -> bool:
    """Whether a per-rank metric ``base`` is the aggregate ``metric`` (``loss`` and ``train/loss``)."""
    return metric.split("/")[-1] == base.split("/")[-1]
