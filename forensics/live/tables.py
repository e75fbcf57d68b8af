"""The watched run's tables: where they come from, the audit they start from, and tags that stay put.

Opening a run is the slow part of a live view (fitting text clusters, tagging every step); this module keeps what
was computed once in the user cache (:func:`forensics.cache.cache_dir`), keyed by the inputs' files and settings,
so that the next opening only reads it. New plan parts a recorder adds while the run goes on are tagged with the
boundaries and clusters fitted at start (:func:`tag_new_parts`), so tags never shift under the user.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forensics.cache import cache_dir
from forensics.errors import ForensicsError
from forensics.schema import CLUSTER, SAMPLE_ID, STEP, Case, RunConfig

#: Audits kept in memory per process, keyed by their inputs' paths, sizes and mtimes (every session shares them).
AUDIT_CACHE_SIZE = 4
_AUDITS: dict[tuple, Any] = {}


@dataclass(frozen=True)
class Inputs:
    """Where the watched run's tables come from: the case (folder and run configuration) and its resolved paths."""

    case: Case
    metrics: list[str]
    plan: str | None
    samples: str | None

    @property
    def config(self) -> RunConfig:
        return self.case.config

    @property
    def folder(self) -> Path | None:
        return self.case.root

    @classmethod
    def of(cls, case: Case) -> Inputs:
        return cls(
            case,
            [s.path for s in case.metrics_sources],
            str(case.plan_path) if case.plan_path else None,
            str(case.samples_path) if case.samples_path else None,
        )


def stat_key(paths: Sequence[str | None]) -> tuple:
    """Paths, sizes and modification times: what changes when a file is rewritten."""
    out = []
    for p in paths:
        if p is None:
            out.append(None)
            continue
        path = Path(p)
        if path.is_dir():
            files = sorted(f for f in path.rglob("*") if f.is_file())
            out.append(
                (
                    str(path),
                    len(files),
                    sum(f.stat().st_size for f in files),
                    max((f.stat().st_mtime_ns for f in files), default=0),
                )
            )
        elif path.exists():
            st = path.stat()
            out.append((str(path), st.st_size, st.st_mtime_ns))
        else:
            out.append((str(path),))
    return tuple(out)


def clustered_samples_path(samples_path: str | Path, fit: Callable[[], pd.DataFrame]) -> Path:
    """A copy of the samples with their fitted ``cluster`` / ``cluster_name``, keyed by the file's content.

    Fitting text clusters is the slow part of opening a run (seconds to tens of seconds); the same samples file
    (the demo's two cases share one) is fitted once, and the tagging stage keeps a given ``cluster`` column.
    """
    src = Path(samples_path)
    if src.is_dir():
        return src
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:24]
    out = cache_dir() / "clusters" / f"{digest}.parquet"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        fit().to_parquet(tmp, index=False)
        tmp.replace(out)
    return out


def fit_clusters(samples_path: str | Path) -> pd.DataFrame:
    """The samples with text clusters fitted (unchanged when they have a ``cluster`` already or no text)."""
    from forensics.schema import load_samples
    from forensics.tagging.clusters import cluster_samples

    samples = load_samples(samples_path)
    if "text" not in samples.columns or CLUSTER in samples.columns:
        return samples
    try:
        return cluster_samples(samples)[0]
    except ForensicsError:  # texts without words: the tagging stage says so and tags without clusters
        return samples


def cached_audit(inputs: Inputs) -> Any:
    """:func:`~forensics.pipeline.audit.run_audit` of ``inputs``, computed once per process for the same files; the
    samples' clusters come from :func:`clustered_samples_path`."""
    from forensics.pipeline.audit import run_audit

    key = (stat_key([*inputs.metrics, inputs.plan, inputs.samples]), repr(inputs.config))
    if key not in _AUDITS:
        while len(_AUDITS) >= AUDIT_CACHE_SIZE:
            _AUDITS.pop(next(iter(_AUDITS)))
        case = inputs.case
        if inputs.plan and inputs.samples:
            fitted = clustered_samples_path(inputs.samples, lambda: fit_clusters(inputs.samples))
            case = dataclasses.replace(case, config=dataclasses.replace(case.config, samples=str(fitted)))
        audit = run_audit(case)
        if isinstance(audit.findings.get("run"), dict):
            audit.findings["run"]["samples_source"] = inputs.samples
        _AUDITS[key] = audit
    return _AUDITS[key]


@dataclass
class Tagged:
    """A run's step tags with the plan and samples they were made from (``plan`` may be read on first use)."""

    tags: pd.DataFrame
    samples: pd.DataFrame
    boundaries: list[int]
    warnings: list[str]
    plan: pd.DataFrame | None = None
    plan_file: Path | None = None


def tags_cache_folder(inputs: Inputs) -> Path | None:
    """Where the tags of these inputs and settings are kept (None without a plan)."""
    if not inputs.plan or not inputs.samples:
        return None
    cfg = inputs.config
    key = repr(
        (
            stat_key([inputs.plan, inputs.samples]),
            cfg.boundaries,
            cfg.grad_accum,
            cfg.world_size,
            cfg.rank_split,
            cfg.max_len,
        )
    )
    return cache_dir() / "tags" / hashlib.sha256(key.encode()).hexdigest()[:24]


def tag_all(inputs: Inputs, use_cache: bool = True) -> Tagged:
    """Tag every step with the case's boundaries and the samples' fitted clusters (read from the cache folder when
    these inputs were tagged before)."""
    from forensics.schema import load_plan, load_samples
    from forensics.tagging import tag_case

    folder = tags_cache_folder(inputs)
    if use_cache and folder is not None and (folder / "meta.json").exists():
        meta = json.loads((folder / "meta.json").read_text())
        return Tagged(
            pd.read_parquet(folder / "tags.parquet"),
            pd.read_parquet(folder / "samples.parquet"),
            meta["boundaries"],
            meta.get("warnings", []),
            plan_file=folder / "plan.parquet",
        )
    path = clustered_samples_path(inputs.samples, lambda: fit_clusters(inputs.samples))
    samples = load_samples(path)
    plan = load_plan(inputs.plan, samples)
    cluster_by = None
    if "text" not in samples.columns and "source" in samples.columns and CLUSTER not in samples.columns:
        cluster_by = "source"
    tagged = tag_case(plan, samples, inputs.config, cluster_by=cluster_by)
    out = Tagged(tagged.tags, tagged.samples, tagged.boundaries, list(tagged.warnings), plan=tagged.plan)
    out.warnings += store_tags(inputs, out)
    return out


def store_tags(inputs: Inputs, tagged: Tagged) -> list[str]:
    """Keep the tags in the cache folder; returns a warning when they cannot be written (it only costs time)."""
    folder = tags_cache_folder(inputs)
    if folder is None or tagged.plan is None:
        return []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # repeated labels (bucket ranges, cluster names) as dictionaries: a 1M-step table reads ~40% faster
        labels = {c: "category" for c in ("bucket_range", "cluster_name") if c in tagged.tags.columns}
        tagged.tags.astype(labels).to_parquet(folder / "tags.parquet", index=False)
        tagged.plan.to_parquet(folder / "plan.parquet", index=False)
        tagged.samples.to_parquet(folder / "samples.parquet", index=False)
        (folder / "meta.json").write_text(
            json.dumps(
                {"boundaries": [int(b) for b in tagged.boundaries or []], "warnings": [str(w) for w in tagged.warnings]}
            )
        )
    except (OSError, ValueError, TypeError) as exc:
        return [f"tags not cached in {folder}: {exc}"]
    return []


def plan_parts(plan: str | None) -> set[str]:
    """The Parquet parts of a plan folder (empty for a single file)."""
    folder = Path(plan) if plan else None
    return {p.name for p in folder.glob("*.parquet")} if folder is not None and folder.is_dir() else set()


def tag_new_parts(
    inputs: Inputs,
    seen: set[str],
    plan: pd.DataFrame,
    samples: pd.DataFrame,
    tags: pd.DataFrame | None,
    boundaries: list[int],
) -> tuple[pd.DataFrame, pd.DataFrame | None, set[str]] | None:
    """The plan and tags grown by the parts a recorder added since ``seen`` (tagged with the boundaries and clusters
    fitted at start), and the parts now seen; None when nothing new was written."""
    folder = Path(inputs.plan) if inputs.plan else None
    if folder is None or not folder.is_dir():
        return None
    fresh = sorted(p for p in folder.glob("*.parquet") if p.name not in seen)
    if not fresh:
        return None
    from forensics.plan.step_mapping import assign_steps
    from forensics.schema import validate_plan
    from forensics.tagging.step_tags import tag_steps

    parts = pd.concat([pd.read_parquet(p) for p in fresh], ignore_index=True)
    seen = seen | {p.name for p in fresh}
    parts = validate_plan(parts, str(folder), samples)
    cfg = inputs.config
    if STEP not in parts.columns:
        # the step mapping needs the whole epoch's batch order: map the recorded columns of all parts again
        recorded = [c for c in parts.columns if c in plan.columns]
        plan_all = pd.concat([plan[recorded].assign(_new=False), parts[recorded].assign(_new=True)], ignore_index=True)
        mapped = assign_steps(plan_all, cfg.grad_accum, cfg.world_size, cfg.rank_split)
        parts = mapped[mapped["_new"].to_numpy(bool)].drop(columns=["_new"])
    known = samples[SAMPLE_ID].to_numpy(np.int64)
    parts = parts[np.isin(parts[SAMPLE_ID].to_numpy(np.int64), known)]
    if not len(parts):
        return plan, tags, seen
    new_tags = tag_steps(parts, samples, boundaries, cfg.max_len)
    last = int(tags[STEP].max()) if tags is not None and len(tags) else -1
    new_tags = new_tags[new_tags[STEP] > last]
    common = [c for c in plan.columns if c in parts.columns]
    plan = pd.concat([plan[common], parts[common]], ignore_index=True)
    tags = pd.concat([tags, new_tags], ignore_index=True) if tags is not None else new_tags
    return plan, tags, seen
