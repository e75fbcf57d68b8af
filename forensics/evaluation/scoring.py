"""Scoring spike detections against labels: event recall within a margin, false events, attribution accuracy.

The benchmark of detection quality (``bench/bench_detection_quality.py``) judges every detector, ours and the rules
frameworks ship (:mod:`forensics.evaluation.framework_rules`), with these functions on one labelled corpus
(:mod:`forensics.datasets.corpus`), so that a table row means the same thing for each of them. Like ruptures'
``metrics/``, they take plain labels and plain detections and know nothing of how either was made.

Definitions (what a caller may rely on):

- **Hit.** A detected event *starting* within ``margin`` steps (default 2) of a labelled spike's start. Each label is
  hit at most once and each detection hits at most one label; among several candidates the closest start wins
  (ties: the earlier detection), so a detector cannot score twice with one event or once per step of a long event.
- **Event recall** = hit labels / labels.
- **False event.** A detection that hits no label and whose start lies outside every labelled span. Spans are what
  the corpus knows is not clean: each injected event's whole extent (its lead-in, its decay, a few recovery steps),
  widened by ``margin`` before it, and the non-finite steps. A detection inside a span that hits nothing (a second
  event on the decay of a spike, a flag on a NaN) is neither a hit nor false.
- **False events per 10,000 clean steps** = false events / steps outside every span * 10,000 (the issue's target
  is at most 1).
- **Attribution accuracy**, over hits whose label names it: the bucket the finding names first equals the label's
  bucket, likewise the cluster, and its *first* suspect sample is one of the label's samples (:func:`named_first`).
  A detector that names nothing scores 0 of N (the table prints n/a when a detector never names anything).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from forensics.detect.findings import Finding

#: Steps between a detection's start and a label's start that still count as a hit (the issue's margin).
MARGIN = 2
#: The attribution a label can carry, in table order.
ATTRIBUTION_KEYS = ("bucket", "cluster", "samples")


@dataclass(frozen=True)
class SpikeLabel:
    """One labelled spike: where it starts (the step a detection must find), ends and peaks, and what caused it.

    ``start``/``end`` bound the steps at or above half the peak's excess over the baseline; ``peak`` is the highest;
    ``factor`` the peak's value over its baseline. ``bucket``, ``cluster`` and ``sample_ids`` are the attribution a
    finding should name first (``None``/empty when the spike has no data cause, e.g. an optimizer instability).
    """

    start: int
    end: int
    peak: int
    shape: str
    factor: float
    metric: str = "train/loss"
    bucket: int | None = None
    cluster: int | None = None
    sample_ids: tuple[int, ...] = ()


@dataclass
class Score:
    """Counts for one detector over one run or, summed with ``+``, over a corpus."""

    n_labels: int = 0
    n_hits: int = 0
    n_detected: int = 0
    n_false: int = 0
    n_clean_steps: int = 0
    n_steps: int = 0
    #: shape -> [hits, labels]
    by_shape: dict[str, list[int]] = field(default_factory=dict)
    #: key of :data:`ATTRIBUTION_KEYS` -> [correct, hits whose label names it]
    attribution: dict[str, list[int]] = field(default_factory=dict)
    #: whether the detector named any bucket, cluster or sample at all (else its attribution is n/a)
    names_anything: bool = False

    def __add__(self, other: Score) -> Score:
        out = Score(
            self.n_labels + other.n_labels,
            self.n_hits + other.n_hits,
            self.n_detected + other.n_detected,
            self.n_false + other.n_false,
            self.n_clean_steps + other.n_clean_steps,
            self.n_steps + other.n_steps,
            names_anything=self.names_anything or other.names_anything,
        )
        for src in (self.by_shape, other.by_shape):
            for k, (h, n) in src.items():
                acc = out.by_shape.setdefault(k, [0, 0])
                acc[0] += h
                acc[1] += n
        for src in (self.attribution, other.attribution):
            for k, (c, n) in src.items():
                acc = out.attribution.setdefault(k, [0, 0])
                acc[0] += c
                acc[1] += n
        return out

    @property
    def recall(self) -> float:
        return self.n_hits / self.n_labels if self.n_labels else float("nan")

    @property
    def false_per_10k(self) -> float:
        return 1e4 * self.n_false / self.n_clean_steps if self.n_clean_steps else float("nan")

    def shape_recall(self, shape: str) -> float:
        hits, n = self.by_shape.get(shape, (0, 0))
        return hits / n if n else float("nan")

    def attribution_accuracy(self, key: str) -> float:
        correct, n = self.attribution.get(key, (0, 0))
        return correct / n if n else float("nan")


def match_events(
    label_starts: Sequence[int], detected_starts: Sequence[int], margin: int = MARGIN
) -> list[tuple[int, int]]:
    """One-to-one ``(label index, detection index)`` pairs whose starts are at most ``margin`` steps apart.

    Closest pairs are taken first (ties: lower label index, then earlier detection), so the matching is the same
    whatever order the inputs come in.
    """
    labels = np.asarray(label_starts, dtype=np.int64)
    det = np.asarray(detected_starts, dtype=np.int64)
    if not len(labels) or not len(det):
        return []
    order = np.argsort(det, kind="stable")
    sorted_det = det[order]
    cands = []
    for i, s in enumerate(labels.tolist()):
        lo = np.searchsorted(sorted_det, s - margin, side="left")
        hi = np.searchsorted(sorted_det, s + margin, side="right")
        for j in range(lo, hi):
            cands.append((abs(int(sorted_det[j]) - s), i, int(sorted_det[j]), int(order[j])))
    cands.sort()
    used_l: set[int] = set()
    used_d: set[int] = set()
    pairs = []
    for _, i, _, j in cands:
        if i in used_l or j in used_d:
            continue
        used_l.add(i)
        used_d.add(j)
        pairs.append((i, j))
    return sorted(pairs)


def merge_spans(spans: Iterable[tuple[int, int]]) -> np.ndarray:
    """Inclusive ``(start, end)`` spans merged where they overlap or touch, sorted: an ``(n, 2)`` int array."""
    arr = np.array(sorted((int(a), int(b)) for a, b in spans if b >= a), dtype=np.int64).reshape(-1, 2)
    if len(arr) <= 1:
        return arr
    out = [arr[0].tolist()]
    for a, b in arr[1:].tolist():
        if a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return np.array(out, dtype=np.int64)


def in_spans(steps: Sequence[int] | np.ndarray, spans: Iterable[tuple[int, int]] | np.ndarray) -> np.ndarray:
    """Whether each step lies in one of the inclusive spans."""
    merged = spans if isinstance(spans, np.ndarray) and spans.ndim == 2 else merge_spans(spans)
    steps = np.asarray(steps, dtype=np.int64)
    if not len(merged) or not len(steps):
        return np.zeros(len(steps), dtype=bool)
    k = np.searchsorted(merged[:, 0], steps, side="right") - 1
    ok = k >= 0
    out = np.zeros(len(steps), dtype=bool)
    out[ok] = steps[ok] <= merged[k[ok], 1]
    return out


def clean_steps(steps: Sequence[int] | np.ndarray, spans: Iterable[tuple[int, int]]) -> int:
    """How many of ``steps`` lie outside every span (the denominator of the false-event rate)."""
    return int((~in_spans(steps, spans)).sum())


def false_events(
    detected_starts: Sequence[int], matched: Iterable[int], spans: Iterable[tuple[int, int]]
) -> np.ndarray:
    """Indices of the detections that hit nothing (not in ``matched``) and start outside every span."""
    det = np.asarray(detected_starts, dtype=np.int64)
    outside = ~in_spans(det, spans)
    outside[list(matched)] = False
    return np.flatnonzero(outside)


def named_first(f: Finding, key: str) -> int | None:
    """What a finding names first for ``key`` (``bucket``, ``cluster`` or ``samples``).

    Bucket and cluster: the first candidate of its attribution (``details["attribution"]["buckets"]``, most likely
    first, as :mod:`forensics.detect.rules.attribution` writes it) when there is one, else its ``bucket``/``cluster``
    tag.
    Samples: its first suspect sample. ``None`` when it names nothing.
    """
    if key == "samples":
        return int(f.suspect_samples[0]) if f.suspect_samples else None
    ranked = (f.details.get("attribution") or {}).get(f"{key}s") if isinstance(f.details, dict) else None
    if ranked:
        value = ranked[0].get(key)
    else:
        value = f.tags.get(key)
    return None if value is None else int(value)


def score_run(
    labels: Sequence[SpikeLabel],
    spans: Iterable[tuple[int, int]],
    steps: Sequence[int] | np.ndarray,
    findings: Sequence[Finding],
    margin: int = MARGIN,
    metric: str | None = None,
    kinds: Sequence[str] = ("spike",),
) -> Score:
    """Score one run's findings (of ``kinds``, on ``metric`` when given) against its labels and spans.

    ``spans`` are the steps that are not clean (inclusive pairs); ``steps`` are the run's logged steps (for the
    clean-step count). Labels of another metric than ``metric`` are left out.
    """
    if metric is not None:
        labels = [lab for lab in labels if lab.metric == metric]
    found = sorted(
        (f for f in findings if f.kind in kinds and (metric is None or f.metric in (None, metric))),
        key=lambda f: f.step,
    )
    merged = merge_spans(spans)
    starts = [int(f.step) for f in found]
    pairs = match_events([lab.start for lab in labels], starts, margin)
    false_idx = false_events(starts, [j for _, j in pairs], merged)
    score = Score(
        n_labels=len(labels),
        n_hits=len(pairs),
        n_detected=len(found),
        n_false=len(false_idx),
        n_clean_steps=clean_steps(steps, merged),
        n_steps=len(np.asarray(steps)),
    )
    score.names_anything = any(named_first(f, key) is not None for f in found for key in ATTRIBUTION_KEYS)
    for lab in labels:
        score.by_shape.setdefault(lab.shape, [0, 0])[1] += 1
    for i, j in pairs:
        lab, f = labels[i], found[j]
        score.by_shape[lab.shape][0] += 1
        checks = {
            "bucket": (lab.bucket is not None, named_first(f, "bucket") == lab.bucket),
            "cluster": (lab.cluster is not None, named_first(f, "cluster") == lab.cluster),
            "samples": (bool(lab.sample_ids), named_first(f, "samples") in set(lab.sample_ids)),
        }
        for key, (labelled, correct) in checks.items():
            if labelled:
                acc = score.attribution.setdefault(key, [0, 0])
                acc[0] += int(correct)
                acc[1] += 1
    return score
