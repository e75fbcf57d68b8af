"""Tag a whole run: map the plan to steps, cluster the samples, pick the boundaries, tag every step.

This is what ``forensics tag`` and the audit call; it takes loaded tables (``schema.load_plan`` /
``schema.load_samples``) and plain settings, and returns the tags, the samples with ``bucket`` and ``cluster``, and
the warnings worth showing (never fatal: a plan with lost batches is still tagged).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError
from forensics.plan.buckets import bucket_index
from forensics.plan.builders import capped_lengths
from forensics.plan.step_mapping import assign_steps
from forensics.schema import (
    BATCH_ID,
    CLUSTER,
    DEFAULT_BOUNDARIES,
    EPOCH,
    MAX_LEN,
    RANK,
    SOURCE,
    TEXT,
    check_boundaries,
)
from forensics.tagging.clusters import CLUSTER_NAME, NO_CLUSTER, ClusterInfo, cluster_samples
from forensics.tagging.step_tags import tag_steps

BUCKET = "bucket"


@dataclass
class TagResult:
    """The outcome of :func:`tag_case`: ``tags`` (one row per step), ``samples`` (with ``bucket``, ``cluster``,
    ``cluster_name``), ``plan`` (with ``step``), the ``boundaries`` used, how clusters were made, and warnings."""

    tags: pd.DataFrame
    samples: pd.DataFrame
    plan: pd.DataFrame
    boundaries: list[int]
    clusters: ClusterInfo
    warnings: list[str] = field(default_factory=list)

    def metadata(self) -> dict:
        """What a reader of the tags file needs to interpret it (written into the Parquet metadata)."""
        return {"boundaries": self.boundaries, "clusters": self.clusters.as_dict()}


def resolve_boundaries(
    boundaries: Sequence[int] | str | None,
    samples: pd.DataFrame,
    max_len: int = MAX_LEN,
    n_buckets: int | None = None,
) -> list[int]:
    """``None`` -> the story's defaults; ``"optimal"`` -> the optimal-boundary finder with ``n_buckets`` buckets
    (default: as many as the defaults have); a list -> checked, and made to end at ``max_len`` (a last boundary
    below it gains a bucket up to ``max_len``; boundaries above it are dropped, since lengths are capped there)."""
    if boundaries is None:
        boundaries = list(DEFAULT_BOUNDARIES)
    if isinstance(boundaries, str):
        if boundaries != "optimal":
            raise ForensicsError(f"--boundaries: expected b0,b1,... or 'optimal'; got {boundaries!r}")
        from forensics.plan.optimal_boundaries import optimal_boundaries

        k = n_buckets or len(DEFAULT_BOUNDARIES) - 1
        lengths = capped_lengths(samples, max_len)
        return check_boundaries(optimal_boundaries(lengths, k, max_len=max_len), "optimal boundaries")
    bounds = check_boundaries(boundaries, "boundaries")
    if bounds[-1] < max_len:  # lengths above the last boundary get a bucket of their own up to max_len
        bounds.append(int(max_len))
    elif bounds[-1] > max_len:  # lengths are capped at max_len: the last bucket ends there
        bounds = [b for b in bounds[:-1] if b < max_len] + [int(max_len)]
    return bounds


def tag_case(
    plan: pd.DataFrame,
    samples: pd.DataFrame,
    *,
    grad_accum: int = 1,
    world_size: int = 1,
    rank_split: str = "round_robin",
    boundaries: Sequence[int] | str | None = None,
    n_buckets: int | None = None,
    max_len: int = MAX_LEN,
    clusters: int | str | None = None,
    cluster_by: str | None = None,
    max_fit: int = 20_000,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> TagResult:
    """Tag every step of a run.

    Clusters come from ``cluster_by`` (a label column) when given; else from the text when ``clusters`` is k or
    ``"auto"`` (k chosen); else a ``cluster`` column already in the samples is kept; else the text with k chosen;
    without text every sample is cluster -1, with a warning. ``progress(n_done)`` is called while texts are clustered.
    """
    warnings: list[str] = []
    steps = assign_steps(plan, grad_accum, world_size, rank_split)
    warnings += batch_gap_warnings(steps)
    bounds = resolve_boundaries(boundaries, samples, max_len, n_buckets)
    if clusters is not None and cluster_by is None and TEXT not in samples.columns:
        raise ForensicsError(f"--clusters {clusters}: the samples have no 'text' column to cluster; "
                             "use --cluster-by COLUMN for labels")
    if isinstance(clusters, bool) or (isinstance(clusters, str) and clusters != "auto"):
        raise ForensicsError(f"--clusters: expected a whole number or 'auto'; got {clusters!r}")
    k = None if clusters == "auto" else clusters
    clustered = None
    no_text_reason = "samples have no 'text' column"
    if cluster_by is not None or (TEXT in samples.columns and (clusters is not None or CLUSTER not in samples.columns)):
        try:
            clustered, info = cluster_samples(samples, k=k, cluster_by=cluster_by, max_fit=max_fit, seed=seed,
                                              progress=progress)
        except ForensicsError as exc:  # texts with no words at all: tag without content clusters, and say so
            if cluster_by is not None or "hold no words" not in str(exc):
                raise
            no_text_reason = "the samples' texts hold no words to cluster"
    if clustered is not None:
        pass  # clustered from text or labels above
    elif CLUSTER in samples.columns:
        clustered = samples.copy()
        ids = np.unique(clustered[CLUSTER].to_numpy(np.int64))
        if CLUSTER_NAME not in clustered.columns:
            clustered[CLUSTER_NAME] = pd.array([f"cluster {c}" for c in clustered[CLUSTER]], dtype="string")
        info = ClusterInfo(method="given", k=len(ids), names={
            int(c): str(n) for c, n in clustered.drop_duplicates(CLUSTER)[[CLUSTER, CLUSTER_NAME]].to_numpy()})
    else:
        clustered = samples.copy()
        clustered[CLUSTER] = np.full(len(samples), NO_CLUSTER, dtype=np.int64)
        clustered[CLUSTER_NAME] = pd.array(["(no text)"] * len(samples), dtype="string")
        info = ClusterInfo(method="none", k=0, names={})
        hint = " (or --cluster-by source)" if SOURCE in samples.columns else ""
        warnings.append(f"{no_text_reason}: every step's cluster is {NO_CLUSTER}; pass --cluster-by "
                        f"COLUMN{hint} for content clusters")
    clustered[BUCKET] = bucket_index(capped_lengths(clustered, max_len), bounds)
    tags = tag_steps(steps, clustered, bounds, max_len)
    return TagResult(tags=tags, samples=clustered, plan=steps, boundaries=bounds, clusters=info, warnings=warnings)


def batch_gap_warnings(plan: pd.DataFrame, limit: int = 3) -> list[str]:
    """Batch ids missing inside an epoch (per rank): what a crashed recorder's unflushed part leaves behind."""
    if not {EPOCH, BATCH_ID} <= set(plan.columns) or plan.empty:
        return []
    group = [EPOCH] + ([RANK] if RANK in plan.columns else [])
    keys = plan[group + [BATCH_ID]].drop_duplicates().sort_values(group + [BATCH_ID])
    prev = keys.groupby(group, sort=False)[BATCH_ID].shift(1)
    gap = keys[BATCH_ID] - prev.fillna(-1).astype(np.int64) - 1
    holes = keys[gap > 0].assign(n_missing=gap[gap > 0])
    out = []
    for row in holes.head(limit).itertuples(index=False):
        where = f"epoch {getattr(row, EPOCH)}" + (f" rank {getattr(row, RANK)}" if RANK in group else "")
        b = getattr(row, BATCH_ID)
        out.append(f"plan: {where} misses batch ids {b - row.n_missing}-{b - 1} (lost by a crashed recorder?)")
    if len(holes) > limit:
        out.append(f"plan: {len(holes) - limit} more gaps in batch ids")
    return out
