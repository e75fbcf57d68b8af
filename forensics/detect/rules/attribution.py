"""Attribution: for each spike, the bucket, the cluster and the samples most likely behind it, with the evidence,
and what to do next.

For every spike finding (its peak step's batch, from the plan) this module gathers what the other rules measured and
writes it onto a copy of the finding:

1. **Bucket and cluster**, most likely first. Across the spike events of the same metric, a bucket (cluster) that
   holds a share ``q`` of the steps but the dominant composition of ``k`` of the ``n`` spike steps gets the binomial
   tail ``P(X >= k | n, q)``; the buckets (clusters) present in the spike's batch are ranked by that p-value, then
   by their share of the batch. Evidence reads "bucket 5 (3296, 8192]: 8% of steps but 4 of 4 spikes (p = 4e-05);
   all 3 samples of this batch".
2. **Samples**, most suspect first: samples over-represented in spike batches
(:func:`~forensics.detect.rules.recurrence.
   sample_enrichment`, in two spike batches or more, lowest p-value first), then the first-cut ranking of
   :mod:`forensics.detect.evidence.suspects` (recurrence, then length/cluster outlyingness and near-duplicates).
3. **Recurrence**: where the same batch came back and what the loss did there
(:func:`~forensics.detect.rules.recurrence.
   batch_recurrence`), written to the finding's flat ``recurrence`` list (``epoch``, ``step``, ``value``,
   ``baseline``, ``ratio``, ``overlap``, ``jaccard``, ``is_spike``) that the report draws.
4. **Precedence**: grad norm before/with/after the loss, lr and tokens/s (:mod:`forensics.detect.evidence.precedence`);
   and the numerics the logs hold around a loss spike (a loss-scale drop, nan or skipped iterations, the worst rank's
   loss: :mod:`forensics.detect.evidence.log_numerics`), which set ``support["numerics"]`` when they say numerics;
   and the update norm, params norm, z loss and zero-gradient count that rose before it, by the grad norm's rule
   (:mod:`forensics.detect.evidence.log_signals`, ``details["attribution"]["logged_signals"]``).
5. **Next step** in words: which step to replay from which checkpoint (grad-norm-led events: the steps from where
   the grad norm started to grow), which samples to inspect, and the plan fix when the batches are static (the gate
   says so, or the spike batch recurs in several epochs), with the what-if throughput when given.

Everything lands in the finding: ``evidence`` (appended to the detector's sentences), ``suspect_samples``,
``next_step``, the flat ``recurrence`` tag, and ``details["attribution"]`` with the ranked candidates and the
precedence numbers. The input findings are not modified.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from forensics.detect.base import Rule, RunTables
from forensics.detect.evidence.log_numerics import log_numerics
from forensics.detect.evidence.log_signals import log_signals
from forensics.detect.evidence.precedence import PRECEDENCE_FACTOR, PRECEDENCE_Z, precedence
from forensics.detect.evidence.suspects import rank_all
from forensics.detect.findings import Finding, spike_span
from forensics.detect.params import fraction, positive
from forensics.detect.plan_view import FramePlan, PlanView
from forensics.detect.rules.composition import plan_fix_words, plan_words
from forensics.detect.rules.recurrence import MIN_JACCARD, batch_recurrence, sample_enrichment
from forensics.detect.tags import BUCKET, BUCKET_RANGE, CLUSTER_NAME, attach_tags
from forensics.errors import ForensicsError
from forensics.schema import CLUSTER, DEFAULT_BOUNDARIES, MAX_LEN, N_TOKENS, SAMPLE_ID, STEP, find_loss_key
from forensics.schema.words import counted
from forensics.stats import binom_sf

#: A recurrence whose loss is at least this many times its baseline counts as "the loss jumped again".
RECUR_RATIO = 1.5
#: Bucketed strategy named in the plan fix (from the what-if), and the random one it is compared with.
FIX_STRATEGY, RANDOM_STRATEGY = "bucketed_given", "random_shuffle"


def attribute(
    spikes: Sequence[Finding],
    metrics: pd.DataFrame,
    tags: pd.DataFrame | None = None,
    plan: pd.DataFrame | PlanView | None = None,
    samples: pd.DataFrame | None = None,
    *,
    gate: Mapping[str, Any] | None = None,
    whatif: Mapping[str, Any] | None = None,
    boundaries: Sequence[int] | None = None,
    max_len: int = MAX_LEN,
    checkpoint_every: int | None = None,
    checkpoints: Sequence[int] | None = None,
    min_jaccard: float = MIN_JACCARD,
    top: int = 20,
    precedence_factor: float = PRECEDENCE_FACTOR,
    precedence_z: float = PRECEDENCE_Z,
) -> list[Finding]:
    """Copies of ``spikes`` (same order) with the attribution of the module docstring.

    ``tags``: the tagging stage's table; ``plan`` with ``step`` and ``sample_id``, or a view of it
    (:mod:`forensics.detect.plan_view`: a plan too large to load; only the spikes' spans and the steps holding their
    batches' samples are read); ``samples`` with ``sample_id``,
    ``n_tokens`` and, from tagging, ``cluster``/``cluster_name`` (and ``bucket``). Without a plan only precedence and
    the checkpoint advice are given. ``gate``: the gate's section of findings.json
    (:meth:`~forensics.plan.gate.GateResult.to_json`); ``whatif``: the what-if's section
    (:meth:`~forensics.plan.whatif.WhatIf.to_dict`); ``samples``: the sample tags (``bucket``, ``cluster``);
    ``checkpoint_every`` /
    ``checkpoints``: the run's checkpoint cadence or saved steps, for naming the checkpoint to replay from.
    """
    boundaries = list(boundaries) if boundaries is not None else list(DEFAULT_BOUNDARIES)
    out = [copy.deepcopy(f) for f in spikes]
    attach_tags([f for f in out if BUCKET not in f.tags], tags, boundaries)
    # the samples table itself when its ids are distinct: the content evidence reads a table once per audit
    smp = samples if samples is None or samples[SAMPLE_ID].is_unique else samples.drop_duplicates(SAMPLE_ID)
    loss_key = _loss_key(metrics)
    if isinstance(plan, pd.DataFrame):
        plan = FramePlan(plan) if STEP in plan.columns and SAMPLE_ID in plan.columns else None
    for metric in dict.fromkeys(f.metric for f in out):
        group = [f for f in out if f.metric == metric]
        _attribute_group(
            group,
            metric if metric in metrics.columns else loss_key,
            metrics,
            tags,
            plan,
            smp,
            gate,
            whatif,
            checkpoint_every,
            checkpoints,
            min_jaccard,
            top,
            {"factor": precedence_factor, "z": precedence_z},
        )
    return out


def _loss_key(metrics: pd.DataFrame) -> str | None:
    try:
        return find_loss_key(metrics.columns)
    except ForensicsError:  # no loss column: recurrence then reports no values
        return None


def _attribute_group(
    group: list[Finding],
    metric: str | None,
    metrics: pd.DataFrame,
    tags: pd.DataFrame | None,
    plan: PlanView | None,
    smp: pd.DataFrame | None,
    gate: Any,
    whatif: Any,
    every: int | None,
    saved: Sequence[int] | None,
    min_jaccard: float,
    top: int,
    prec_params: dict[str, float],
) -> None:
    # precedence asks whether the grad norm moved before the loss: it means nothing for a grad-norm spike itself
    is_loss = metric is not None and metric == _loss_key(metrics)
    prec = precedence(group, metrics, **prec_params) if is_loss else [None] * len(group)
    has_plan = plan is not None
    peaks = [spike_span(f)[2] for f in group]
    if has_plan:  # the rows of the spikes' spans (their batches, the suspects' steps)
        spans = [spike_span(f) for f in group]
        span_rows = plan.rows_at(np.unique(np.concatenate([np.arange(a, b + 1) for a, b, _ in spans])))
    rec = (
        batch_recurrence(group, plan, metrics if metric else None, tags, metric=metric, min_jaccard=min_jaccard)
        if has_plan
        else [None] * len(group)
    )
    enr = (
        sample_enrichment(group, plan, steps=metrics[STEP].to_numpy(np.int64)).set_index(SAMPLE_ID)
        if has_plan
        else None
    )
    ranked = (
        rank_all(group, span_rows, smp, top=None)
        if has_plan and smp is not None and N_TOKENS in smp.columns
        else [[] for _ in group]
    )
    conc = {col: _concentration(peaks, tags, col) for col in (BUCKET, CLUSTER)} if tags is not None else {}
    ids_only = pd.DataFrame({SAMPLE_ID: span_rows[SAMPLE_ID].unique()}) if has_plan and smp is None else None
    batches = _batches(span_rows, smp if smp is not None else ids_only, peaks) if has_plan else {}
    for f, p, r, suspects in zip(group, prec, rec, ranked):
        if any(
            getattr(x, "harm", 0.0) > 1.0
            and any("robust SDs" in w or "near-duplicate of" in w or "foreign" in w for w in x.reasons)
            for x in suspects[:top]
        ):
            f.details.setdefault("support", {})["content"] = True
        batch = batches.get(spike_span(f)[2]) if batches else None
        attribution: dict[str, Any] = {"precedence": p}
        evidence: list[str] = []
        for col in (BUCKET, CLUSTER):
            cands = _candidates(col, batch, conc.get(col), f, len(group))
            attribution[f"{col}s"] = cands
            if cands:
                evidence.append(_candidate_sentence(col, cands[0], f))
        order, sample_rows = _order_samples(suspects, enr, batch)
        f.suspect_samples = order[:top]
        attribution["samples"] = sample_rows[:top]
        if sample_rows:
            evidence.append(_samples_sentence(sample_rows))
        if r is not None:
            f.tags["recurrence"] = [
                {k: row[k] for k in ("epoch", "step", "value", "baseline", "ratio", "overlap", "jaccard", "is_spike")}
                for row in r["recurrences"]
            ]
            attribution["recurrence"] = {k: v for k, v in r.items() if k not in ("evidence", "recurrences")}
            evidence.append(r["evidence"])
        if p is not None:
            evidence.extend(p["evidence"])
        numerics = log_numerics(metrics, spike_span(f)[0], metric) if is_loss else None
        if numerics is not None:
            attribution["numerics"] = numerics
            evidence.extend(numerics["evidence"])
            if numerics["numerics"]:
                f.details.setdefault("support", {})["numerics"] = True
        signals = log_signals(metrics, *spike_span(f)[:2], **prec_params) if is_loss else None
        if signals is not None:
            attribution["logged_signals"] = signals
            evidence.extend(signals["evidence"])
        f.evidence = list(f.evidence) + evidence
        f.details["attribution"] = attribution
        f.next_step = _next_step(f, p, r, sample_rows, gate, whatif, every, saved, has_plan)


# --- bucket and cluster --------------------------------------------------------------------------------------------
def _concentration(peaks: list[int], tags: pd.DataFrame, col: str) -> pd.DataFrame | None:
    """Per group of ``col``: share of all steps, spike events whose peak step it dominates, binomial tail p."""
    if col not in tags.columns or STEP not in tags.columns:
        return None
    t = tags[[STEP, col]].dropna()
    if t.empty:
        return None
    share = t[col].astype(np.int64).value_counts(normalize=True)
    at_peaks = t.set_index(STEP)[col].reindex(peaks).dropna().astype(np.int64)
    k = at_peaks.value_counts().reindex(share.index, fill_value=0)
    n = len(at_peaks)
    p = binom_sf(k.to_numpy(), n, share.to_numpy()) if n else np.ones(len(share))
    return pd.DataFrame({"share_of_steps": share, "n_spikes": k, "p_value": np.where(k > 0, p, 1.0), "n_events": n})


def _batches(plan: pd.DataFrame, smp: pd.DataFrame, steps: list[int]) -> dict[int, pd.DataFrame]:
    """The samples (rows of ``smp``) of each of ``steps``, from one pass over the plan."""
    rows = plan.loc[plan[STEP].isin(steps), [STEP, SAMPLE_ID]].drop_duplicates()
    joined = rows.merge(smp, on=SAMPLE_ID, how="inner")
    return {int(s): g.drop(columns=[STEP]) for s, g in joined.groupby(STEP, sort=True)}


def _candidates(
    col: str, batch: pd.DataFrame | None, conc: pd.DataFrame | None, f: Finding, n_events: int
) -> list[dict[str, Any]]:
    """The groups of ``col`` in the spike's batch (or the step's tag alone), most likely first."""
    if batch is not None and col in batch.columns and len(batch):
        counts = batch[col].astype(np.int64).value_counts()
        names = (
            batch.drop_duplicates(col).set_index(col)[CLUSTER_NAME].to_dict()
            if col == CLUSTER and CLUSTER_NAME in batch.columns
            else {}
        )
        size = len(batch)
    elif col in f.tags and f.tags[col] is not None:
        counts = pd.Series({int(f.tags[col]): 0})
        names = {int(f.tags[col]): f.tags.get(CLUSTER_NAME)} if col == CLUSTER else {}
        size = 0
    else:
        return []
    rows = []
    for g, c in counts.items():
        g = int(g)
        has = conc is not None and g in conc.index
        row = {
            col: g,
            "in_batch": int(c),
            "batch_size": int(size),
            "share_of_steps": float(conc.loc[g, "share_of_steps"]) if has else None,
            "n_spikes": int(conc.loc[g, "n_spikes"]) if has else None,
            "n_events": int(conc["n_events"].iloc[0]) if conc is not None and len(conc) else n_events,
            "p_value": float(conc.loc[g, "p_value"]) if has else None,
        }
        if col == BUCKET and f.tags.get(BUCKET) == g and f.tags.get(BUCKET_RANGE):
            row[BUCKET_RANGE] = f.tags[BUCKET_RANGE]
        if col == CLUSTER:
            name = (
                names.get(g)
                if names.get(g) is not None
                else (f.tags.get(CLUSTER_NAME) if f.tags.get(CLUSTER) == g else None)
            )
            row[CLUSTER_NAME] = None if name is None else str(name)
        rows.append(row)
    rows.sort(key=lambda r: (r["p_value"] if r["p_value"] is not None else 1.0, -r["in_batch"], r[col]))
    return rows


def _candidate_sentence(col: str, c: dict[str, Any], f: Finding) -> str:
    g = c[col]
    if col == BUCKET:
        label = f"bucket {g}" + (f" {c[BUCKET_RANGE]}" if c.get(BUCKET_RANGE) else "")
    else:
        label = f"cluster {g}" + (f" '{c[CLUSTER_NAME]}'" if c.get(CLUSTER_NAME) else "")
    facts = []
    if c["share_of_steps"] is not None:
        n = c["n_events"]
        facts.append(
            f"{100 * c['share_of_steps']:.0f}% of steps but {c['n_spikes']} of "
            f"{counted(n, (f.metric or '') + ' spike')}".replace("  ", " ")
            + (f" (binomial p = {c['p_value']:.2g})" if c["n_spikes"] else "")
        )
    if c["batch_size"]:
        facts.append(
            f"all {c['batch_size']} samples of this batch"
            if c["in_batch"] == c["batch_size"]
            else f"{c['in_batch']} of {c['batch_size']} samples of this batch"
        )
    return f"{label}: {'; '.join(facts)}." if facts else f"{label}."


# --- samples ---------------------------------------------------------------------------------------------------------
def _order_samples(
    suspects: list, enr: pd.DataFrame | None, batch: pd.DataFrame | None
) -> tuple[list[int], list[dict[str, Any]]]:
    """Sample ids most suspect first, and a row per sample with the numbers behind its place."""
    if suspects:
        base = [(s.sample_id, s.score, s.reasons, s.harm) for s in suspects]
    elif batch is not None and len(batch):
        base = [(int(i), 0.0, [], 0.0) for i in sorted(batch[SAMPLE_ID].astype(int).tolist())]
    else:
        return [], []
    rows = []
    for rank, (sid, score, reasons, harm) in enumerate(base):
        e = enr.loc[sid] if enr is not None and sid in enr.index else None
        k = int(e["n_spike_batches"]) if e is not None else 1
        rows.append(
            {
                "sample_id": int(sid),
                "n_spike_batches": k,
                "spike_steps": list(e["spike_steps"]) if e is not None else [],
                "p_value": float(e["p_value"]) if e is not None else None,
                "p_bonferroni": float(e["p_bonferroni"]) if e is not None else None,
                "outlyingness": float(score),
                "harm": float(harm),
                "reasons": list(reasons),
                "_rank": rank,
            }
        )
    # evidence of harm first (recurrence and content, as suspects ranked it); then the enrichment's p-value
    rows.sort(
        key=lambda r: (
            -round(r["harm"], 6),
            r["p_value"] if r["n_spike_batches"] >= 2 and r["p_value"] is not None else 1.0,
            r["_rank"],
        )
    )
    for r in rows:
        del r["_rank"]
    return [r["sample_id"] for r in rows], rows


def _samples_sentence(rows: list[dict[str, Any]]) -> str:
    shared = [r for r in rows if r["n_spike_batches"] >= 2]
    if shared:
        first = shared[0]
        same = [r for r in shared if r["spike_steps"] == first["spike_steps"]]
        ids = ", ".join(str(r["sample_id"]) for r in same[:6]) + (" ..." if len(same) > 6 else "")
        steps = first["spike_steps"]
        verb = "is" if len(same) == 1 else "are"
        text = (
            f"Samples {ids} {verb} in {len(steps)} spike batches (steps {', '.join(map(str, steps[:8]))}; "
            f"p = {first['p_value']:.2g}, {first['p_bonferroni']:.2g} after Bonferroni over the plan's samples)"
        )
    else:
        text = "No sample of this batch is in another spike batch"
    top = rows[0]
    why = "; ".join(top["reasons"][:3])
    return text + f". First suspect: sample {top['sample_id']}" + (f": {why}." if why else ".")


# --- next step -------------------------------------------------------------------------------------------------------
def checkpoint_before(step: int, every: int | None = None, saved: Sequence[int] | None = None) -> str:
    """Words naming the checkpoint to replay ``step`` from (the last one saved before it)."""
    if saved:
        before = [int(s) for s in saved if int(s) < step]
        if before:
            return f"the checkpoint saved at step {max(before)}"
        return f"the earliest checkpoint (none is saved before step {step}: replay from the start)"
    if every and every > 0:
        c = (step // every) * every
        c = c - every if c >= step else c
        if c >= 0:
            return f"the checkpoint before it (step {c} with a checkpoint every {every} steps, or the nearest saved)"
    return f"the nearest checkpoint saved before step {step}"


def _is_static(gate: Mapping[str, Any] | None) -> bool | None:
    static = (gate or {}).get("static")
    return None if static is None else bool(static)


def _strategy(whatif: Mapping[str, Any] | None, name: str) -> dict[str, float] | None:
    for d in (whatif or {}).get("strategies", []):
        if d.get("name") == name:
            return {"share": float(d.get("throughput_vs_sorted", np.nan)), "tps": float(d.get("tokens_per_s", np.nan))}
    return None


def _tok(x: float) -> str:
    return f"{x / 1000:.0f}K tok/s" if np.isfinite(x) and x >= 1000 else f"{x:.3g} tok/s"


def plan_fix(whatif: Any = None) -> str:
    """The plan fix in words, with the what-if throughput of the bucketed shuffle and of a random shuffle."""
    fix, rnd = _strategy(whatif, FIX_STRATEGY), _strategy(whatif, RANDOM_STRATEGY)
    text = (
        "rebuild batches every epoch with bucketed_shuffle (shuffle inside length buckets, then pack) so that "
        "the same samples stop meeting in every epoch"
    )
    if fix is not None and np.isfinite(fix["share"]):
        text += f": ~{100 * fix['share']:.0f}% of the sorted throughput ({_tok(fix['tps'])})"
        if rnd is not None and np.isfinite(rnd["share"]):
            text += f" instead of random's ~{100 * rnd['share']:.0f}% ({_tok(rnd['tps'])})"
    else:
        text += " (`forensics whatif` measures its throughput against the sorted plan)"
    return text


def _next_step(
    f: Finding,
    p: dict[str, Any],
    r: dict[str, Any] | None,
    sample_rows: list[dict[str, Any]],
    gate: Any,
    whatif: Any,
    every: int | None,
    saved: Sequence[int] | None,
    has_plan: bool,
) -> str:
    start, _, peak = spike_span(f)
    parts = []
    if p is not None and p["grad_norm"] == "leads":
        first = p["grad_norm_first_step"]
        parts.append(
            f"The grad norm grew {p['lead_steps']} steps before the loss: replay steps {first}-{peak} from "
            f"{checkpoint_before(first, every, saved)} and look at the optimizer state (Adam moments, loss "
            "scale) and lr as well as the batches"
        )
    else:
        parts.append(
            f"Replay step {peak} from {checkpoint_before(peak, every, saved)} and compare its loss with "
            "control batches of the same bucket"
        )
    if not has_plan:
        parts.append("record or rebuild the batch plan (--plan) to name the batch and its samples")
    shared = [s for s in sample_rows if s["n_spike_batches"] >= 2]
    if shared:
        ids = ", ".join(str(s["sample_id"]) for s in shared[:6])
        parts.append(
            f"inspect samples {ids} (in {shared[0]['n_spike_batches']} spike batches) and drop or fix "
            "them if they are corrupt"
        )
    elif sample_rows:
        parts.append(f"inspect sample {sample_rows[0]['sample_id']} first")
    recurring = r is not None and len(r["epochs"]) >= 2
    static = _is_static(gate)
    if static or (static is None and recurring):
        again = [x for x in (r or {}).get("recurrences", []) if x["ratio"] is not None and x["ratio"] >= RECUR_RATIO]
        words = plan_words(gate) or "static across epochs"
        why = (f"the batch recurs in {len(r['epochs'])} other epochs" if recurring else f"the plan is {words}") + (
            f" and {f.metric or 'the loss'} jumped there too (step {again[0]['step']}: {again[0]['ratio']:.2g}x its "
            "baseline)"
            if again
            else ""
        )
        kinds = (gate or {}).get("failure_kinds") or []
        fix = plan_fix_words(gate) if any(k in ("reseeded", "shuffle_then_sort") for k in kinds) else plan_fix(whatif)
        parts.append(f"{why}: {fix}")
    return "; ".join(parts) + "."


class AttributionRule(Rule):
    """Each spike's bucket, cluster, batch and samples, most likely first, with evidence and a next step (the
    spikes come back enriched: ``replaces = "spike"``).

    Parameters: ``top`` 20 (suspect samples kept per spike), ``min_jaccard`` 0.8 (the share of a spike batch's
    samples a later batch must hold to be the same batch coming back), ``checkpoint_every`` None (the run's
    checkpoint cadence, for naming the checkpoint to replay from), ``precedence_factor`` 1.5 and ``precedence_z`` 4
    (how far above its own baseline the grad norm must be, as a ratio and in noise units, to count as moving before
    or with a loss spike: the detector's own 1.5x, and a looser score since the question is only "did it move").
    """

    name = "attribution"
    explains = True
    parameter_constraints = {
        "top": positive("int"),
        "min_jaccard": fraction(),
        "checkpoint_every": positive("int", none=True),
        "precedence_factor": positive(),
        "precedence_z": positive(),
    }
    replaces = "spike"

    def __init__(
        self,
        top: int = 20,
        min_jaccard: float = MIN_JACCARD,
        checkpoint_every: int | None = None,
        precedence_factor: float = PRECEDENCE_FACTOR,
        precedence_z: float = PRECEDENCE_Z,
    ) -> None:
        self.top = top
        self.min_jaccard = min_jaccard
        self.checkpoint_every = checkpoint_every
        self.precedence_factor = precedence_factor
        self.precedence_z = precedence_z

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        spikes = [f for f in found or [] if f.kind == "spike"]
        if not spikes:
            return []
        return attribute(
            spikes,
            run.metrics,
            run.tags,
            run.plan_view,
            run.samples,
            gate=run.sections.get("plan"),
            whatif=run.sections.get("whatif"),
            boundaries=run.boundaries,
            max_len=run.max_len,
            checkpoint_every=self.checkpoint_every,
            min_jaccard=self.min_jaccard,
            top=self.top,
            precedence_factor=self.precedence_factor,
            precedence_z=self.precedence_z,
        )
