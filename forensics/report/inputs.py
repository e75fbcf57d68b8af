"""Reading the findings and the tags tolerantly, for the figures and the cards.

The findings model grows over time and the tables are optional, so every accessor here accepts what is there and
skips what is not: a spike without ``end_step`` is one step long, a tags table without ``cluster_name`` labels
clusters by id. Labels built from data are HTML-escaped here, once.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from forensics.report.text import esc, snippet
from forensics.schema import CLUSTER, SAMPLE_ID, STEP, grad_norm_column, lr_column, metric_columns

#: At most this many groups get their own trace; the rest are pooled as "other".
MAX_GROUPS = 12
#: Spikes whose windows are drawn at full resolution and shaded (most severe first); bounds the report's size.
MAX_DETAILED_FINDINGS = 100


def spikes_of(findings: dict | None) -> list[dict]:
    return [s for s in (findings or {}).get("spikes") or [] if isinstance(s, dict) and s.get("step") is not None]


def nonfinite_of(findings: dict | None) -> list[dict]:
    return [n for n in (findings or {}).get("nonfinite") or [] if isinstance(n, dict) and n.get("step") is not None]


def by_severity(spikes: list[dict]) -> list[dict]:
    def score(s: dict) -> float:
        v = s.get("score")
        try:
            f = float(v)
        except (TypeError, ValueError):
            return 0.0
        return f if math.isfinite(f) else 0.0

    return sorted(spikes, key=lambda s: (-score(s), int(s["step"])))


def finding_spans(findings: dict | None, limit: int = MAX_DETAILED_FINDINGS) -> list[tuple[int, int]]:
    """``(start, end)`` step spans of the findings a plot draws at full resolution (most severe spikes first)."""
    spans = [
        (int(s["step"]), int(s.get("end_step") if s.get("end_step") is not None else s["step"]))
        for s in by_severity(spikes_of(findings))[:limit]
    ]
    room = max(0, limit - len(spans))
    spans += [(int(n["step"]), int(n["step"])) for n in nonfinite_of(findings)[: min(room, 20)]]
    return spans


def curve_metrics(metrics: pd.DataFrame, loss_key: str, findings: dict | None = None, max_rows: int = 5) -> list[str]:
    """The metrics drawn as curves: the loss, the grad norm and the lr when logged, then any metric with a spike."""
    cols = metric_columns(metrics)
    rows = [loss_key]
    grad = grad_norm_column(cols)
    lr = lr_column(cols)
    for c in (grad, lr):
        if c is not None and c not in rows:
            rows.append(c)
    for s in spikes_of(findings):
        m = s.get("metric")
        if m in cols and m not in rows:
            rows.append(m)
    return rows[:max_rows]


def per_step(tags: pd.DataFrame | None, steps: np.ndarray, column: str) -> np.ndarray | None:
    """A tags column aligned to ``steps`` (missing steps become NaN/None), or None when tags lack it."""
    if tags is None or column not in tags.columns or STEP not in tags.columns:
        return None
    col = tags[[STEP, column]].drop_duplicates(STEP, keep="last").set_index(STEP)[column]
    return col.reindex(steps).to_numpy()


def group_labels(tags: pd.DataFrame, by: str) -> dict[int, str]:
    """Readable (escaped) label per bucket or cluster id, using ``bucket_range`` / ``cluster_name`` when tagged."""
    name_col = {"bucket": "bucket_range", CLUSTER: "cluster_name"}.get(by)
    ids = pd.to_numeric(tags[by], errors="coerce")
    labels: dict[int, str] = {}
    if name_col and name_col in tags.columns:
        first = pd.DataFrame({"id": ids, "name": tags[name_col]}).dropna(subset=["id"]).drop_duplicates("id")
        for i, name in zip(first["id"].astype(int), first["name"]):
            labels[i] = f"{by} {i} · {esc(snippet(name, 40))}" if present(name) else f"{by} {i}"
    for i in pd.unique(ids.dropna().astype(int)):
        labels.setdefault(int(i), f"{by} {int(i)}")
    return labels


def present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and str(value) != ""


def top_groups(groups: np.ndarray, limit: int = MAX_GROUPS) -> list[int]:
    """Group ids sorted by id, keeping the ``limit`` most frequent (the others are pooled by the caller)."""
    valid = groups[~pd.isna(groups)].astype(np.int64)
    if not len(valid):
        return []
    ids, counts = np.unique(valid, return_counts=True)
    keep = ids[np.argsort(-counts, kind="stable")[:limit]]
    return sorted(int(i) for i in keep)


def sample_lookup(samples: pd.DataFrame | None) -> pd.DataFrame | None:
    """The samples table indexed by ``sample_id`` (for repeated look-ups), or None without samples."""
    if samples is None or SAMPLE_ID not in samples.columns:
        return None
    return samples.drop_duplicates(SAMPLE_ID).set_index(SAMPLE_ID)


def sample_row(lookup: pd.DataFrame | None, sample_id: Any) -> dict | None:
    try:
        return None if lookup is None else lookup.loc[int(sample_id)].to_dict()
    except (KeyError, TypeError, ValueError):
        return None


def as_float(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def bin_edges(steps: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Bin number of each step and each bin's centre step: equal-width bins over the step range."""
    lo, hi = int(steps.min()), int(steps.max())
    n_bins = max(1, min(n_bins, hi - lo + 1))
    edges = np.linspace(lo, hi + 1, n_bins + 1)
    which = np.clip(np.searchsorted(edges, steps, side="right") - 1, 0, n_bins - 1)
    centres = np.floor((edges[:-1] + edges[1:] - 1) / 2).astype(np.int64)
    return which, centres
