"""Tag a whole run: cluster the samples, pick the boundaries, tag every step of the step-mapped plan.

This is what ``forensics tag`` and the audit call; it takes the plan stage's step-mapped plan, the samples and the
run configuration, and returns the tags, the samples with ``bucket`` and ``cluster``, and
the warnings worth showing (never fatal: a plan with lost batches is still tagged).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from forensics.engine import Engine, engine_of
from forensics.engine.source import parquet_columns
from forensics.errors import ForensicsError
from forensics.plan.buckets import bucket_index
from forensics.plan.builders import capped_lengths
from forensics.plan.optimal_boundaries import resolve_boundaries
from forensics.schema import (
    BATCH_ID,
    CLUSTER,
    EPOCH,
    RANK,
    SOURCE,
    STEP,
    TEXT,
    TOKEN_IDS,
    Case,
    RunConfig,
    batch_columns,
    check_output,
    load_plan,
    load_samples,
    with_overrides,
)
from forensics.schema.case import check_tables
from forensics.tagging.clusters import CLUSTER_NAME, NO_CLUSTER, ClusterInfo, cluster_samples
from forensics.tagging.step_tags import tag_steps
from forensics.tagging.text_at_scale import TextColumn, cluster_samples_at_scale

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

    def to_json(self) -> dict:
        """The figures a summary shows: steps, epochs, overall padding ratio, boundaries, clusters."""
        tags = self.tags
        padded = int(tags["padded_tokens"].sum()) if len(tags) else 0
        return {
            "steps": int(len(tags)),
            "epochs": int(tags["epoch"].nunique()) if len(tags) else 0,
            "padding_ratio": 1 - int(tags["real_tokens"].sum()) / padded if padded else 0.0,
            "boundaries": list(self.boundaries),
            "clusters": self.clusters.as_dict(),
            "warnings": self.warnings,
        }

    def write(
        self, out: str | Path, samples_out: str | Path | None = None, inputs: Sequence[str | Path | None] = ()
    ) -> list[Path]:
        """Write the step tags (and the sample tags) as Parquet with :meth:`metadata`; never over an input."""
        targets = [(Path(out), self.tags)] + ([(Path(samples_out), self.samples)] if samples_out else [])
        given = {Path(p).resolve() for p in inputs if p is not None}
        for path, _ in targets:
            check_output(path, (".parquet", ".pq"), "output")
            if path.resolve() in given:
                raise ForensicsError(f"output {path} is one of the inputs; inputs are never overwritten")
        meta = {b"forensics": json.dumps(self.metadata()).encode()}
        for path, frame in targets:
            write_parquet(frame, path, meta)
        return [p for p, _ in targets]


def write_parquet(frame: pd.DataFrame, path: Path, meta: dict[bytes, bytes]) -> None:
    """A table to Parquet with extra schema metadata; an unwritable path is bad input."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
    except OSError as exc:
        raise ForensicsError(f"cannot write {path}: {exc.strerror or exc}") from exc


def tag_run(
    step_plan: pd.DataFrame | str | Path,
    samples: pd.DataFrame,
    cfg: RunConfig,
    *,
    max_fit: int = 20_000,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    engine: Engine | None = None,
    texts: TextColumn | None = None,
) -> TagResult:
    """Tag every step of a run from its step-mapped plan (:func:`~forensics.plan.step_mapping.step_plan`) and samples.

    Boundaries are ``cfg.boundaries``, else fitted to the samples (said in the warnings). Clusters come from
    ``cfg.cluster_by`` (a label column) when given; else from the text when ``cfg.clusters`` is k; else a
    ``cluster`` column already in the samples is kept; else the text with k chosen; without text, samples with a
    ``source`` label are clustered by it; else every sample is cluster -1, with a warning. ``progress(n_done)`` is
    called while texts are clustered. ``engine`` (:mod:`forensics.engine`) counts the steps; ``step_plan`` may
    then be the path of a plan with ``step`` that it reads (the result's ``plan`` is then None). ``texts``: where the
    samples' texts lie when ``samples`` was loaded without them (a table too large to load whole): they are then
    clustered chunk by chunk on its engine (:mod:`forensics.tagging.text_at_scale`), to the same clusters.
    """
    has_text = TEXT in samples.columns or texts is not None
    in_memory = isinstance(step_plan, pd.DataFrame)
    if in_memory and STEP not in step_plan.columns:
        raise ForensicsError(
            "tagging needs the step-mapped plan (forensics.plan.step_mapping.step_plan): it has no 'step' column"
        )
    warnings: list[str] = batch_gap_warnings(step_plan) if in_memory else []
    bounds = resolve_boundaries(list(cfg.boundaries) if cfg.boundaries else None, samples, cfg.max_len, cfg.n_buckets)
    if cfg.boundaries is None:
        warnings.append(
            f"no bucket boundaries named (run.toml 'boundaries' or --boundaries): fitted to the samples "
            f"({len(bounds) - 1} buckets, the least padding): {bounds}"
        )
    cluster_by, k = cfg.cluster_by, cfg.clusters
    if k is not None and cluster_by is None and not has_text:
        raise ForensicsError(
            f"clusters = {k}: the samples have no 'text' column to cluster; "
            "use cluster_by (--cluster-by COLUMN) for labels"
        )
    if (
        cluster_by is None
        and k is None
        and not has_text
        and CLUSTER not in samples.columns
        and SOURCE in samples.columns
    ):
        cluster_by = SOURCE
        warnings.append("samples have no 'text' column: clusters are their 'source' labels")
    clustered = None
    no_text_reason = "samples have no 'text' column"
    if cluster_by is not None or (has_text and (k is not None or CLUSTER not in samples.columns)):
        try:
            if cluster_by is None and TEXT not in samples.columns and texts is not None:
                clustered, info = cluster_samples_at_scale(samples, texts, k, max_fit, seed, progress)
            else:
                clustered, info = cluster_samples(
                    samples, k=k, cluster_by=cluster_by, max_fit=max_fit, seed=seed, progress=progress
                )
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
        info = ClusterInfo(
            method="given",
            k=len(ids),
            names={int(c): str(n) for c, n in clustered.drop_duplicates(CLUSTER)[[CLUSTER, CLUSTER_NAME]].to_numpy()},
        )
    else:
        clustered = samples.copy()
        clustered[CLUSTER] = np.full(len(samples), NO_CLUSTER, dtype=np.int64)
        clustered[CLUSTER_NAME] = pd.array(["(no text)"] * len(samples), dtype="string")
        info = ClusterInfo(method="none", k=0, names={})
        hint = " (or --cluster-by source)" if SOURCE in samples.columns else ""
        warnings.append(
            f"{no_text_reason}: every step's cluster is {NO_CLUSTER}; pass --cluster-by "
            f"COLUMN{hint} for content clusters"
        )
    clustered[BUCKET] = bucket_index(capped_lengths(clustered, cfg.max_len), bounds)
    tags = tag_steps(step_plan, clustered, bounds, cfg.max_len, packed=cfg.packed, engine=engine)
    return TagResult(
        tags=tags,
        samples=clustered,
        plan=step_plan if in_memory else None,
        boundaries=bounds,
        clusters=info,
        warnings=warnings,
    )


def tag_case(
    plan: pd.DataFrame,
    samples: pd.DataFrame,
    cfg: RunConfig | None = None,
    *,
    max_fit: int = 20_000,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    **settings: object,
) -> TagResult:
    """Map a plan to steps and tag it: :func:`~forensics.plan.step_mapping.step_plan` then :func:`tag_run`.

    ``settings`` are run-configuration keys (``grad_accum``, ``boundaries``, ``clusters``, ``cluster_by``,
    ``n_buckets``, ``max_len``, ...) that change ``cfg`` (default: the defaults of docs/concepts.md).
    """
    from forensics.plan.step_mapping import step_plan

    cfg = with_overrides(cfg or RunConfig(), **settings)
    return tag_run(step_plan(plan, cfg), samples, cfg, max_fit=max_fit, seed=seed, progress=progress)


def tag_case_folder(
    case: Case,
    *,
    builder: str | None = None,
    epochs: int = 1,
    seed: int = 0,
    max_fit: int = 20_000,
    progress: Callable[[int], None] | None = None,
) -> TagResult:
    """``forensics tag``: the case's plan (or one rebuilt by ``builder`` over ``epochs``), mapped to steps, tagged."""
    from forensics.plan.rebuild import rebuild_plan, resolve_builder
    from forensics.plan.step_mapping import step_plan

    cfg = case.config
    if cfg.samples is None:
        raise ForensicsError("tag needs the samples: give a case folder or --samples")
    if cfg.plan is None and not builder:
        raise ForensicsError("tag needs a plan: give a case folder, --plan or --builder")
    if epochs < 1 or max_fit < 1:
        raise ForensicsError(f"tag: epochs and max_fit must be >= 1; got {epochs} and {max_fit}")
    check_tables(None if builder else case.plan_path, case.samples_path)
    engine = None if builder else engine_of(cfg, case.plan_path)
    on_engine = engine is not None and engine.name != "pandas"
    samples = None if on_engine else load_samples(case.samples_path)
    if builder:
        params = {"token_budget": cfg.token_budget, "max_len": cfg.max_len}
        if cfg.boundaries:
            params["boundaries"] = list(cfg.boundaries)
        fn = resolve_builder(builder, **params)
        plan = rebuild_plan(samples, fn, epochs, seed)
    unused = [k for k in ("grad_accum", "world_size", "rank_split") if cfg.given.get(k) == "option"]
    if on_engine:  # the engine reads the plan where it lies, and the texts
        try:
            has_step = STEP in engine.plan_columns(case.plan_path)
            # a Parquet table's texts stay where they lie: clustered chunk by chunk on the engine, never a table of
            # them in memory (the sample tags written with --samples-out then carry no text)
            names = parquet_columns(case.samples_path) or []
            texts = TextColumn(case.samples_path, engine) if TEXT in names else None
            samples = load_samples(case.samples_path, [c for c in names if c not in (TEXT, TOKEN_IDS)] or None)
            result = tag_run(
                case.plan_path, samples, cfg, max_fit=max_fit, seed=seed, progress=progress, engine=engine, texts=texts
            )
        finally:
            engine.close()
    else:
        if not builder:
            plan = load_plan(case.plan_path, samples)
        has_step = STEP in plan.columns
        result = tag_run(step_plan(plan, cfg), samples, cfg, max_fit=max_fit, seed=seed, progress=progress)
    explicit = (
        [f"the plan has a 'step' column, which wins: {', '.join(unused)} not used"] if unused and has_step else []
    )
    result.warnings = list(case.warnings) + explicit + result.warnings
    return result


def batch_gap_warnings(plan: pd.DataFrame, limit: int = 3) -> list[str]:
    """Batch ids missing inside an epoch (per rank): what a crashed recorder's unflushed part leaves behind."""
    batch = batch_columns(plan.columns)
    if BATCH_ID not in batch or plan.empty:
        return []
    group = [c for c in batch if c != BATCH_ID]  # one batch-id stream per epoch and rank
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
