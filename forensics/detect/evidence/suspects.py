"""Suspect samples: for each spike, its batch's samples ranked by evidence of harm, each with its reasons.

The ranking (attribution adds the run-level evidence):

1. **Evidence of harm**, summed into ``harm``: recurrence (in the batches of several spike events: the strongest
   lead the plan alone gives) and the sample's own content evidence (:mod:`forensics.detect.evidence.content`:
   near-duplicates in the dataset, repetition, noise, tokens foreign to its cluster).
2. **Outlyingness** within the spike's batch and the run, a tiebreaker only (length never decides alone):
   - length: robust distance of ``n_tokens`` from the batch's median and of ``log(n_tokens)`` from the run's
     (median/MAD; capped so no single feature dominates);
   - cluster (or source): a minority in its batch, and a rare one in the run;
   - near-duplicates: the largest word-set overlap (Jaccard) with another sample of the same batch, when ``text``
     is there (copies of one bad document in one batch push the same wrong direction at once).
3. Ties: lower ``sample_id`` first (deterministic).

Inputs are the pipeline's tables: ``plan`` with ``step`` and ``sample_id`` (map ``epoch``/``batch_id`` plans with
:func:`forensics.plan.step_mapping.assign_steps` first) and ``samples`` with ``sample_id``, ``n_tokens`` and optional
``cluster``, ``cluster_name``, ``source``, ``text``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from forensics.detect.evidence.content import ContentEvidence, content_evidence
from forensics.detect.findings import Finding
from forensics.errors import ForensicsError
from forensics.schema import CLUSTER, N_TOKENS, SAMPLE_ID, SOURCE, STEP, TEXT
from forensics.stats import robust_sd

#: Robust SDs from which a length is called unusual in a reason.
LENGTH_REASON_Z = 2.0
#: Word overlap from which two samples are called near-duplicates.
DUPLICATE_JACCARD = 0.6
#: A cluster holding less than this share of the run's samples is called rare.
RARE_SHARE = 0.05
_WORD = re.compile(r"\w+")


@dataclass
class Suspect:
    """One sample of a spike's batch: how many spike batches it was in, its outlyingness score and why."""

    sample_id: int
    n_spike_batches: int
    score: float
    reasons: list[str] = field(default_factory=list)
    #: Evidence of harm: recurrence across spike batches plus the content evidence (0: none).
    harm: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def _event_steps(event: int | tuple[int, int] | Finding) -> tuple[int, int]:
    if isinstance(event, Finding):
        return int(event.step), int(event.end_step if event.end_step is not None else event.step)
    if isinstance(event, (tuple, list)):
        return int(event[0]), int(event[1])
    return int(event), int(event)


def _check(plan: pd.DataFrame, samples: pd.DataFrame) -> None:
    if STEP not in plan.columns:
        raise ForensicsError(
            "plan: suspects need a 'step' column; map (epoch, batch_id) plans to steps first "
            "(forensics.plan.step_mapping.assign_steps)"
        )
    if SAMPLE_ID not in plan.columns:
        raise ForensicsError("plan: missing column 'sample_id'")
    for col in (SAMPLE_ID, N_TOKENS):
        if col not in samples.columns:
            raise ForensicsError(f"samples: missing column '{col}'")


def _batch_ids(plan_steps: np.ndarray, plan_ids: np.ndarray, start: int, end: int) -> np.ndarray:
    lo = np.searchsorted(plan_steps, start, side="left")
    hi = np.searchsorted(plan_steps, end, side="right")
    return plan_ids[lo:hi]


def rank_all(
    events: Sequence[int | tuple[int, int] | Finding],
    plan: pd.DataFrame,
    samples: pd.DataFrame,
    top: int | None = 20,
    content: ContentEvidence | None = None,
) -> list[list[Suspect]]:
    """Suspects for every event (a step, a ``(start, end)`` pair or a spike finding), recurrence counted across
    all of them; one list per event, most suspect first, at most ``top`` each (``None``: all)."""
    _check(plan, samples)
    order = np.argsort(plan[STEP].to_numpy(dtype=np.int64), kind="stable")
    plan_steps = plan[STEP].to_numpy(dtype=np.int64)[order]
    plan_ids = plan[SAMPLE_ID].to_numpy(dtype=np.int64)[order]
    spans = [_event_steps(e) for e in events]
    batches = [_batch_ids(plan_steps, plan_ids, a, b) for a, b in spans]
    where: dict[int, list[int]] = {}
    seen_spans: set[tuple[int, int]] = set()
    for k, ids in enumerate(batches):
        if spans[k] in seen_spans:  # the loss and grad norm spiking at one step are one spike batch
            continue
        seen_spans.add(spans[k])
        for sid in np.unique(ids):
            where.setdefault(int(sid), []).append(spans[k][0])
    if content is None:
        content = content_evidence(samples, np.unique(np.concatenate(batches)) if batches else [])
    ctx = _RunContext(samples, content)
    return [ctx.rank(ids, where, top) for ids in batches]


def rank_suspects(
    event: int | tuple[int, int] | Finding,
    plan: pd.DataFrame,
    samples: pd.DataFrame,
    spike_events: Iterable[int | tuple[int, int] | Finding] = (),
    top: int | None = 20,
) -> list[Suspect]:
    """The samples of one spike's batch, most suspect first (rules in the module docstring).

    ``event``: the spike's step, ``(start, end)`` or its finding; ``spike_events``: every spike of the run (the
    event itself may be among them), for the recurrence count.
    """
    others = [e for e in spike_events if _event_steps(e) != _event_steps(event)]
    return rank_all([event, *others], plan, samples, top)[0]


def attach_suspects(findings: Iterable[Finding], plan: pd.DataFrame, samples: pd.DataFrame, top: int = 20) -> None:
    """Fill ``suspect_samples`` (ids, most suspect first) and ``details["suspects"]`` (with reasons) of every
    ``spike`` finding, in place; recurrence is counted across all of them."""
    spikes = [f for f in findings if f.kind == "spike"]
    if not spikes:
        return
    for f, ranked in zip(spikes, rank_all(spikes, plan, samples, top)):
        f.suspect_samples = [s.sample_id for s in ranked]
        f.details["suspects"] = [s.to_dict() for s in ranked]


class _RunContext:
    """What a ranking compares a batch against: the run's length distribution and cluster shares."""

    def __init__(self, samples: pd.DataFrame, content: ContentEvidence | None = None):
        self.samples = samples.drop_duplicates(SAMPLE_ID).set_index(SAMPLE_ID, drop=False)
        self.content = content
        n = samples[N_TOKENS].to_numpy(dtype=np.float64)
        logn = np.log(np.maximum(n, 1.0))
        self.log_med = float(np.median(logn)) if len(logn) else 0.0
        self.log_sd = robust_sd(logn, floor=1e-6) if len(logn) else 1e-6
        self.label = CLUSTER if CLUSTER in samples.columns else (SOURCE if SOURCE in samples.columns else None)
        self.run_share = samples[self.label].value_counts(normalize=True).to_dict() if self.label else {}

    def rank(self, ids: np.ndarray, where: dict[int, list[int]], top: int | None) -> list[Suspect]:
        if len(ids) == 0:
            return []
        known = [int(i) for i in np.unique(ids) if int(i) in self.samples.index]
        if not known:
            return []
        batch = self.samples.loc[known]
        n = batch[N_TOKENS].to_numpy(dtype=np.float64)
        med = float(np.median(n))
        sd = robust_sd(n, floor=max(0.05 * med, 1.0))
        z_batch = np.abs(n - med) / sd
        z_run = np.abs(np.log(np.maximum(n, 1.0)) - self.log_med) / self.log_sd
        dup_sim, dup_of = _near_duplicates(batch)
        counts = pd.Series(ids).value_counts()
        labels = batch[self.label].tolist() if self.label else [None] * len(batch)
        label_counts = pd.Series(labels).value_counts() if self.label else pd.Series(dtype=int)
        out = []
        for j, sid in enumerate(known):
            reasons = []
            rec_steps = where.get(sid, [])
            rec = len(rec_steps)
            if rec >= 2:
                reasons.append(
                    f"in {rec} spike batches (steps {', '.join(map(str, rec_steps[:8]))}{', ...' if rec > 8 else ''})"
                )
            if int(counts.get(sid, 1)) > 1:
                reasons.append(f"appears {int(counts[sid])} times in the batch")
            tokens = int(n[j])
            if z_batch[j] >= LENGTH_REASON_Z:
                reasons.append(f"{tokens} tokens: {z_batch[j]:.1f} robust SDs from its batch's median {med:.0f}")
            if z_run[j] >= LENGTH_REASON_Z:
                side = "longer" if np.log(max(tokens, 1)) > self.log_med else "shorter"
                reasons.append(
                    f"{tokens} tokens: {side} than most of the run ({z_run[j]:.1f} robust SDs in log length)"
                )
            o_label = 0.0
            if self.label:
                lab = labels[j]
                in_batch = int(label_counts.get(lab, 0))
                share_batch = in_batch / len(known)
                share_run = float(self.run_share.get(lab, 0.0))
                o_label = (1.0 - share_batch) + 0.5 * (1.0 - share_run)
                name = _label_name(batch.iloc[j], self.label)
                if share_batch < 0.5 and len(known) > 1:
                    reasons.append(f"{self.label} {name}: {in_batch} of {len(known)} samples in its batch")
                if share_run < RARE_SHARE:
                    reasons.append(f"{self.label} {name} is rare in the run ({100 * share_run:.1f}% of samples)")
            if dup_sim[j] >= DUPLICATE_JACCARD:
                reasons.append(
                    f"near-duplicate of sample {dup_of[j]} in the same batch ({100 * dup_sim[j]:.0f}% word overlap)"
                )
            score = (
                min(max(z_batch[j], z_run[j]) / 3.0, 2.0)
                + o_label
                + (dup_sim[j] if dup_sim[j] >= DUPLICATE_JACCARD else 0.0)
                + 0.5 * (int(counts.get(sid, 1)) - 1)
            )
            harm = float(np.log2(rec)) if rec >= 2 else 0.0
            if self.content is not None and self.content.flagged(sid):
                harm += 1.0 + self.content.score(sid)
                reasons = list(self.content.reasons[sid]) + reasons
            out.append(
                Suspect(
                    sample_id=sid,
                    n_spike_batches=max(rec, 1),
                    score=round(float(score), 6),
                    reasons=reasons,
                    harm=round(harm, 6),
                )
            )
        out.sort(key=lambda s: (-s.harm, -s.score, s.sample_id))
        return out if top is None else out[:top]


def _label_name(row: pd.Series, label: str) -> str:
    value = row[label]
    name = row.get("cluster_name") if label == CLUSTER else None
    return f"{value} ('{name}')" if isinstance(name, str) and name else f"{value}"


def _near_duplicates(batch: pd.DataFrame) -> tuple[np.ndarray, list[int | None]]:
    """For each sample: the largest Jaccard overlap of its word set with another sample of the batch, and which."""
    m = len(batch)
    sims = np.zeros(m)
    of: list[int | None] = [None] * m
    if TEXT not in batch.columns or m < 2:
        return sims, of
    words = [frozenset(_WORD.findall(str(t).lower())) for t in batch[TEXT].tolist()]
    ids = batch[SAMPLE_ID].tolist()
    for a in range(m):
        for b in range(a + 1, m):
            wa, wb = words[a], words[b]
            if not wa or not wb:
                continue
            j = len(wa & wb) / len(wa | wb)
            if j > sims[a]:
                sims[a], of[a] = j, int(ids[b])
            if j > sims[b]:
                sims[b], of[b] = j, int(ids[a])
    return sims, of
