"""Recurrence: where a spike's batch came back, what the loss did there, and which samples keep meeting spikes.

A plan that builds its batches once and only shuffles their order (the story's bug) trains the same batch in every
epoch. If a spike comes from what is *in* the batch, the loss jumps again (often less, as the model memorises it)
wherever that batch returns; if it was bad luck of the step, it does not. Two measures:

**Batch recurrence** (:func:`batch_recurrence`). A spike's batch is the sample set of its peak step. Every other step
whose sample set has a Jaccard similarity of at least ``min_jaccard`` (default 0.8: the same batch, or most of it)
with it is a recurrence, with its ``epoch``, ``jaccard``, ``overlap`` (share of the spike's samples present),
``value`` (the metric there), ``baseline`` and ``ratio`` = value / baseline. The baseline is the one
:mod:`forensics.detect.evidence.jumpiness` defines: the centred rolling median (``window`` steps) plus the median
residual of
the step's bucket when tags are given, so a long-sequence batch is compared with long-sequence steps.

**Sample enrichment** (:func:`sample_enrichment`). If spike steps were ordinary steps drawn at random, the number of
the ``n`` spike events whose batch holds sample ``i`` would follow a hypergeometric law: ``N`` steps in all, ``K_i``
of them holding ``i`` (its exposures). The p-value is that law's upper tail ``P(X >= k_i)``; ``expected`` = ``n K_i /
N``. Multiple testing: every sample of the plan could have been enriched, so ``p_bonferroni`` multiplies by the
number of samples in the plan (capped at 1) and ``q_value`` is the Benjamini-Hochberg value over the same family.
A sample in one spike batch only is never significant on its own (``p >= n K_i / N``): enrichment needs spikes that
share samples. In a static plan every batch-mate of a sample shares its exposures, so enrichment ranks batches, and
the samples within a batch are told apart by other evidence (:mod:`forensics.detect.evidence.suspects`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding, SpikeLike, spike_span
from forensics.detect.params import fraction, positive
from forensics.detect.plan_view import FramePlan, PlanView
from forensics.detect.tags import BUCKET, StepLookup
from forensics.errors import ForensicsError
from forensics.schema import EPOCH, SAMPLE_ID, STEP, find_loss_key
from forensics.stats import detrend, grouped_robust_sd, hypergeom_sf

MIN_JACCARD = 0.8


def _check_plan(plan: pd.DataFrame) -> None:
    for col in (STEP, SAMPLE_ID):
        if col not in plan.columns:
            raise ForensicsError(f"plan: missing column '{col}' (map (epoch, batch_id) plans to steps first)")


def step_baseline(
    metrics: pd.DataFrame, metric: str, tags: pd.DataFrame | None = None, window: int = 101
) -> pd.DataFrame:
    """Per metrics row: ``step``, ``value``, ``baseline`` (rolling median + the bucket's median residual when tags
    have ``bucket``) and ``spread`` (robust SD of the residual in the step's bucket, or overall)."""
    if metric not in metrics.columns:
        raise ForensicsError(f"metrics: missing column '{metric}'")
    order = np.argsort(metrics[STEP].to_numpy(np.int64), kind="stable")
    steps = metrics[STEP].to_numpy(np.int64)[order]
    values = metrics[metric].to_numpy(np.float64, na_value=np.nan)[order]
    r = detrend(values, window)
    groups = np.zeros(len(steps), dtype=np.int64)
    if tags is not None and BUCKET in tags.columns:
        groups = StepLookup(tags).groups(steps, BUCKET)
    frame = pd.DataFrame({"g": groups, "r": r})
    ok = np.isfinite(r)
    med = frame[ok].groupby("g")["r"].median()
    spread = grouped_robust_sd(r[ok], groups[ok])
    offset = frame["g"].map(med).fillna(0.0).to_numpy(np.float64)
    return pd.DataFrame(
        {
            STEP: steps,
            "value": values,
            "baseline": values - r + offset,
            "spread": frame["g"].map(spread).to_numpy(np.float64, na_value=np.nan),
        }
    )


def _view(plan: pd.DataFrame | PlanView) -> PlanView:
    """A plan table's view (its columns checked), or the view given."""
    if isinstance(plan, PlanView):
        return plan
    _check_plan(plan)
    return FramePlan(plan)


def _step_sets(plan: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Batch size per step and the epoch of each step (-1 without an epoch column)."""
    size = plan.groupby(STEP, sort=True)[SAMPLE_ID].nunique()
    if EPOCH in plan.columns:
        epoch = plan.groupby(STEP, sort=True)[EPOCH].min()
    else:
        epoch = pd.Series(-1, index=size.index)
    return size, epoch


def batch_recurrence(
    spikes: Sequence[SpikeLike],
    plan: pd.DataFrame | PlanView,
    metrics: pd.DataFrame | None = None,
    tags: pd.DataFrame | None = None,
    *,
    metric: str | None = None,
    min_jaccard: float = MIN_JACCARD,
    window: int = 101,
) -> list[dict[str, Any]]:
    """For each spike (in the order given): its batch and every other step where that batch (Jaccard >=
    ``min_jaccard``) was trained, with what ``metric`` did there (module docstring).

    Each item: ``step``, ``peak_step``, ``epoch``, ``batch_size``, ``sample_ids``, ``value``, ``baseline``, ``ratio``
    (the spike's own, by the same baseline), ``recurrences`` (list of ``{step, epoch, jaccard, overlap, shared,
    value, baseline, ratio, excess, score, is_spike}``, in step order), ``n_recurrences``, ``epochs`` (where it
    came back) and ``evidence`` (a sentence with the numbers). Without ``metrics`` the loss fields are null.
    """
    view = _view(plan)
    spans = [spike_span(s) for s in spikes]
    base = None
    if metrics is not None:
        metric = metric or find_loss_key(metrics.columns)
        base = step_baseline(metrics, metric, tags, window).set_index(STEP)
    # (spike index, sample id) pairs of every spike batch, then every step holding any of those samples
    peaks = pd.DataFrame(
        {"spike": np.arange(len(spans), dtype=np.int64), STEP: np.array([p for _, _, p in spans], dtype=np.int64)}
    )
    pairs_df = (
        peaks.merge(view.rows_at(peaks[STEP])[[STEP, SAMPLE_ID]], on=STEP)[["spike", SAMPLE_ID]]
        .drop_duplicates()
        .sort_values(["spike", SAMPLE_ID], kind="stable")
    )
    n_a = pairs_df.groupby("spike")[SAMPLE_ID].size()
    hits = view.rows_holding(pairs_df[SAMPLE_ID].unique())
    inter = hits.merge(pairs_df, on=SAMPLE_ID).groupby(["spike", STEP]).size().rename("shared").reset_index()
    inter["n_a"] = inter["spike"].map(n_a).to_numpy(np.int64)
    # a step's Jaccard with a batch is at most shared / n_a (it holds the shared samples): only the steps that can
    # reach min_jaccard are read whole, for their batch size and epoch
    inter = inter[inter["shared"] >= min_jaccard * inter["n_a"] - 1e-9]
    size, epoch_of = _step_sets(view.rows_at(np.union1d(inter[STEP].to_numpy(np.int64), peaks[STEP].to_numpy())))
    inter["n_b"] = inter[STEP].map(size).to_numpy(np.int64)
    inter["jaccard"] = inter["shared"] / (inter["n_a"] + inter["n_b"] - inter["shared"])
    inter["overlap"] = inter["shared"] / inter["n_a"]
    inter = inter[inter["jaccard"] >= min_jaccard]
    spike_steps = [(a, b) for a, b, _ in spans]
    out = []
    for i, (start, end, peak) in enumerate(spans):
        rec = inter[(inter["spike"] == i) & ((inter[STEP] < start) | (inter[STEP] > end))].sort_values(STEP)
        rows = []
        for r in rec.itertuples(index=False):
            step = int(getattr(r, STEP))
            row = {
                "step": step,
                "epoch": int(epoch_of.get(step, -1)),
                "jaccard": float(r.jaccard),
                "overlap": float(r.overlap),
                "shared": int(r.shared),
                "is_spike": any(a <= step <= b for a, b in spike_steps),
            }
            row.update(_loss_at(base, step))
            rows.append(row)
        own = _loss_at(base, peak)
        item = {
            "step": start,
            "peak_step": peak,
            "epoch": int(epoch_of.get(peak, -1)),
            "batch_size": int(n_a.get(i, 0)),
            "sample_ids": pairs_df.loc[pairs_df["spike"] == i, SAMPLE_ID].astype(int).tolist(),
            "value": own["value"],
            "baseline": own["baseline"],
            "ratio": own["ratio"],
            "recurrences": rows,
            "n_recurrences": len(rows),
            "epochs": sorted({r["epoch"] for r in rows}),
        }
        item["evidence"] = _recurrence_sentence(item, metric, min_jaccard)
        out.append(item)
    return out


def _loss_at(base: pd.DataFrame | None, step: int) -> dict[str, float | None]:
    empty = {"value": None, "baseline": None, "ratio": None, "excess": None, "score": None}
    if base is None or step not in base.index:
        return empty
    row = base.loc[step]
    value, baseline, spread = float(row["value"]), float(row["baseline"]), float(row["spread"])
    if not np.isfinite(value):
        return {**empty, "value": value, "baseline": baseline if np.isfinite(baseline) else None}
    excess = value - baseline
    return {
        "value": value,
        "baseline": baseline,
        "ratio": value / baseline if np.isfinite(baseline) and baseline != 0 else None,
        "excess": excess,
        "score": excess / spread if np.isfinite(spread) and spread > 0 else None,
    }


def _recurrence_sentence(item: dict[str, Any], metric: str | None, min_jaccard: float) -> str:
    rows = item["recurrences"]
    if not rows:
        return (
            f"The batch of step {item['peak_step']} ({item['batch_size']} samples) was not trained again "
            f"(no other step's batch has a Jaccard similarity of {min_jaccard:.2g} or more with it)."
        )
    where = ", ".join(f"{r['step']}" + (f" (epoch {r['epoch']})" if r["epoch"] >= 0 else "") for r in rows[:8])
    more = f" and {len(rows) - 8} more" if len(rows) > 8 else ""
    text = f"The same batch as step {item['peak_step']} came back at steps {where}{more}"
    if metric and any(r["ratio"] is not None for r in rows):
        ratios = ", ".join(f"{r['ratio']:.2g}x" if r["ratio"] is not None else "n/a" for r in rows[:8])
        text += f" with {metric} {ratios} its baseline"
        if item["ratio"] is not None:
            text += f" (the spike: {item['ratio']:.2g}x)"
    return text + "."


def sample_enrichment(
    spikes: Sequence[SpikeLike],
    plan: pd.DataFrame,
    *,
    steps: Iterable[int] | None = None,
) -> pd.DataFrame:
    """Per sample of any spike batch: how many spike events' batches hold it against what the plan implies
    (module docstring). Columns: ``sample_id``, ``n_spike_batches`` (k), ``spike_steps`` (their peak steps),
    ``n_steps`` (K: steps holding the sample), ``expected``, ``p_value``, ``p_bonferroni``, ``q_value``; sorted by
    p-value, then most spike batches, then sample id.

    ``steps``: the steps that could have been found spiking (e.g. the metrics' steps); default every plan step.
    ``plan``: the step-mapped plan or a view of it (:mod:`forensics.detect.plan_view`): the spike batches' samples'
    rows are read, and the family's size (:meth:`~forensics.detect.plan_view.PlanView.tested`).
    """
    view = _view(plan)
    peaks = sorted({spike_span(s)[2] for s in spikes})
    at_peaks = view.rows_at(peaks)
    # the rows of the spike batches' samples: where they were, and their exposures
    p = view.rows_holding(at_peaks[SAMPLE_ID].unique())[[STEP, SAMPLE_ID]].drop_duplicates()
    if steps is not None:
        steps = np.unique(np.fromiter(steps, dtype=np.int64))
        p = p[p[STEP].isin(steps)]
    all_steps = p[STEP].unique()
    peaks = [s for s in peaks if s in set(all_steps.tolist())]
    n_total, m = view.tested(steps)
    n_draw = len(peaks)
    in_spikes = p[p[STEP].isin(peaks)]
    cols = [SAMPLE_ID, "n_spike_batches", "spike_steps", "n_steps", "expected", "p_value", "p_bonferroni", "q_value"]
    if in_spikes.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object if c == "spike_steps" else float) for c in cols})
    by_sample = in_spikes.sort_values(STEP, kind="stable").groupby(SAMPLE_ID)[STEP]
    k = pd.DataFrame({"n_spike_batches": by_sample.size(), "spike_steps": by_sample.agg(lambda s: [int(x) for x in s])})
    exposures = p[p[SAMPLE_ID].isin(k.index)].groupby(SAMPLE_ID)[STEP].size()
    df = k.join(exposures.rename("n_steps")).reset_index()
    kk = df["n_spike_batches"].to_numpy(np.int64)
    big_k = df["n_steps"].to_numpy(np.int64)
    df["expected"] = n_draw * big_k / max(n_total, 1)
    df["p_value"] = hypergeom_sf(kk, n_total, big_k, n_draw)
    df["p_bonferroni"] = np.minimum(1.0, df["p_value"] * m)
    df["q_value"] = _bh(df["p_value"].to_numpy(), m)
    df = df.sort_values(["p_value", "n_spike_batches", SAMPLE_ID], ascending=[True, False, True], kind="stable")
    df[SAMPLE_ID] = df[SAMPLE_ID].astype(np.int64)
    return df[cols].reset_index(drop=True)


def _bh(p: np.ndarray, m: int) -> np.ndarray:
    """Benjamini-Hochberg q-values of ``p`` within a family of ``m`` tests (the untested ones have p = 1)."""
    if len(p) == 0:
        return p
    order = np.argsort(p, kind="stable")
    ranked = p[order] * m / np.arange(1, len(p) + 1)
    q = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty(len(p))
    out[order] = np.minimum(q, 1.0)
    return out


def recurrence_report(
    spikes: Sequence[SpikeLike],
    plan: pd.DataFrame | PlanView,
    metrics: pd.DataFrame | None = None,
    tags: pd.DataFrame | None = None,
    *,
    metric: str | None = None,
    min_jaccard: float = MIN_JACCARD,
    top: int = 20,
) -> dict[str, Any]:
    """Both measures as one JSON-ready object: ``spikes`` (:func:`batch_recurrence`), ``enrichment`` (the ``top``
    rows of :func:`sample_enrichment`), ``n_spike_events``, ``n_samples_tested`` (the samples of the steps that
    could have spiked: the metrics' steps) and ``note`` (the multiple-testing rule), ``evidence``.

    ``plan``: the step-mapped plan, or a view of it (:mod:`forensics.detect.plan_view`: a plan too large to load);
    both measures read only the steps that hold a sample of a spike batch, and the counts of the tested family."""
    view = _view(plan)
    rec = batch_recurrence(spikes, view, metrics, tags, metric=metric, min_jaccard=min_jaccard)
    steps = metrics[STEP].to_numpy(np.int64) if metrics is not None else None
    enr = sample_enrichment(spikes, view, steps=steps)
    m = view.tested(steps)[1]
    evidence = [r["evidence"] for r in rec]
    shared = enr[enr["n_spike_batches"] >= 2]
    if len(shared):
        evidence.append(_enrichment_sentence(shared))
    return {
        "spikes": rec,
        "enrichment": enr.head(top).to_dict(orient="records"),
        "n_spike_events": len({spike_span(s)[2] for s in spikes}),
        "n_samples_tested": m,
        "note": (
            f"p: hypergeometric upper tail of a sample's count of spike batches given its exposures; "
            f"p_bonferroni and q_value (Benjamini-Hochberg) correct for the {m} samples of the plan's "
            "logged steps."
        ),
        "evidence": evidence,
    }


def _enrichment_sentence(shared: pd.DataFrame) -> str:
    """One sentence per group of samples that share the same spike steps."""
    parts = []
    grouped = shared.groupby(shared["spike_steps"].map(tuple), sort=False)
    for steps, g in list(grouped)[:3]:
        ids = ", ".join(str(int(i)) for i in g[SAMPLE_ID].tolist()[:6]) + (" ..." if len(g) > 6 else "")
        row = g.iloc[0]
        parts.append(
            f"samples {ids} are in {len(steps)} spike batches (steps {', '.join(map(str, steps))}; "
            f"expected {row['expected']:.2g}, p = {row['p_value']:.2g}, Bonferroni {row['p_bonferroni']:.2g})"
        )
    return "Over-represented in spike batches: " + "; ".join(parts) + "."


class RecurrenceRule(Rule):
    """The ``recurrence`` section: each loss spike's batch in the other epochs (did it spike again?) and the samples
    enriched in spike batches. Parameters: ``min_jaccard`` 0.8 (see :func:`batch_recurrence`), ``top`` 20."""

    name = "recurrence"
    parameter_constraints = {"min_jaccard": fraction(), "top": positive("int")}
    needs_plan = True
    section_name = "recurrence"

    def __init__(self, min_jaccard: float = MIN_JACCARD, top: int = 20) -> None:
        self.min_jaccard = min_jaccard
        self.top = top

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        loss_spikes = [f for f in found or [] if f.kind == "spike" and f.metric == run.loss_key]
        if loss_spikes:
            self.section_ = recurrence_report(
                loss_spikes,
                run.plan_view,
                run.metrics,
                run.tags,
                metric=run.loss_key,
                min_jaccard=self.min_jaccard,
                top=self.top,
            )
        return []
