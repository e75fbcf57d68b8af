"""The case folder: one run's inputs (metrics sources, plan, samples, ``run.toml``) and its outputs.

Every command opens a case the same way (:func:`open_case`): the folder's ``run.toml`` plus the command's ``--set``
items and flags give the :class:`~forensics.schema.config.RunConfig`; the inputs are the ones it names, else the
canonical files of the folder (``metrics.parquet``, ``plan.parquet``, ``samples.parquet``), else the metrics sources
found in it (an HF Trainer output folder: ``trainer_state.json``, its TensorBoard ``runs/``, ``wandb/``). A folder
that is itself a metrics source (a W&B run folder, a TensorBoard log folder) is read as one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from forensics.errors import ForensicsError
from forensics.schema.config import RunConfig, SourceSpec, resolve_config
from forensics.schema.tables import (
    BATCH_ID,
    EPOCH,
    N_TOKENS,
    SAMPLE_ID,
    STEP,
    hive_partition_values,
    hive_parts,
    parquet_schema,
    read_table,
    validate_plan,
    validate_samples,
)

#: Metrics files a folder may hold, in merge order (later wins), looked for when run.toml names none.
KNOWN_METRICS = (
    "metrics.parquet",
    "metrics.jsonl",
    "metrics.csv",
    "trainer_state.json",
    "runs",
    "lightning_logs",
    "logs",
    "wandb",
)


@dataclass(frozen=True)
class Case:
    """A case folder and its resolved configuration; paths are absolute or relative to the working directory."""

    root: Path | None
    config: RunConfig
    warnings: list[str] = field(default_factory=list)

    @property
    def metrics_sources(self) -> list[SourceSpec]:
        """The metrics sources, paths resolved against the case folder."""
        return [
            SourceSpec(
                str(self.config.resolve(s.path)) if not _is_remote(s.path) else s.path,
                s.step_key,
                s.step_offset,
                s.rank,
            )
            for s in (*self.config.metrics, *self.config.ranks)
        ]

    @property
    def plan_path(self) -> Path | None:
        return self.config.resolve(self.config.plan)

    @property
    def samples_path(self) -> Path | None:
        return self.config.resolve(self.config.samples)

    def output(self, name: str) -> Path | None:
        """Where an output of this case goes (``findings.json``, ``report.html``, ``replay/``); None without a
        folder."""
        return self.root / name if self.root is not None else None

    @property
    def findings_path(self) -> Path | None:
        return self.output("findings.json")

    @property
    def report_path(self) -> Path | None:
        return self.output("report.html")


def _is_remote(path: str) -> bool:
    return path.startswith(("wandb://", "http://", "https://", "mlflow:"))


def is_metrics_folder(root: Path) -> bool:
    """A folder that is itself one metrics source: a W&B run (or wandb/) folder or a TensorBoard log folder."""
    if root.name == "wandb" or root.name.startswith(("offline-run-", "run-")) or any(root.glob("*.wandb")):
        return True
    has_events = any(root.glob("events.out.tfevents.*"))
    has_case = any((root / n).exists() for n in ("run.toml", "plan.parquet", "samples.parquet", "metrics.parquet"))
    return has_events and not has_case


def discover_metrics(root: Path) -> tuple[SourceSpec, ...]:
    """The metrics sources of a folder without a ``run.toml`` list: the canonical table, else what is there."""
    if (root / "metrics.parquet").exists():
        return (SourceSpec("metrics.parquet"),)
    found = [SourceSpec(n) for n in KNOWN_METRICS if (root / n).exists() and _readable_source(root / n)]
    return tuple(found)


def _readable_source(path: Path) -> bool:
    if path.is_file():
        return True
    return any(path.rglob("events.out.tfevents.*")) or any(path.rglob("*.wandb"))


def open_case(
    root: str | Path | None,
    *,
    sets: Sequence[str] = (),
    overrides: Mapping[str, Any] | None = None,
) -> Case:
    """Open a case folder (``run.toml`` optional: the defaults of docs/concepts.md apply without it), or, with ``root``
    None, a case made of the flags alone (``overrides`` naming ``metrics``, ``plan``, ``samples``). A file (a log, a
    metrics table) or a folder that is itself a metrics source, given where a case is expected, is that case's
    metrics: every command takes ``train.log`` as it takes ``--metrics train.log``."""
    if root is None:
        cfg, warnings = resolve_config(None, sets=sets, overrides=overrides)
        return Case(root=None, config=cfg, warnings=warnings)
    root = Path(root)
    if not root.exists():
        raise ForensicsError(
            f"case folder {root} does not exist; expected a case folder (metrics, plan, samples, run.toml), a metrics "
            "file, or `forensics demo` run first to write the demo's"
        )
    if not root.is_dir() or is_metrics_folder(root):
        # a log or metrics file (or a W&B / TensorBoard folder) where a case is expected is read as ``--metrics``, as
        # ``compare``, ``watch`` and the dashboard take it
        cfg, warnings = resolve_config(None, sets=sets, overrides={"metrics": [str(root)], **(overrides or {})})
        return Case(root=None, config=cfg, warnings=warnings)
    cfg, warnings = resolve_config(root, sets=sets, overrides=overrides)
    defaults: dict[str, Any] = {}
    if not cfg.metrics:
        defaults["metrics"] = discover_metrics(root)
    if cfg.plan is None and (root / "plan.parquet").exists():
        defaults["plan"] = "plan.parquet"
    if cfg.samples is None and (root / "samples.parquet").exists():
        defaults["samples"] = "samples.parquet"
    if defaults:
        from dataclasses import replace

        cfg = replace(cfg, **defaults)
    return Case(root=root, config=cfg, warnings=warnings)


def load_samples(path: str | Path, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Read and validate a samples table; ``columns``: of a Parquet table, only those (an engine reads the texts
    chunk by chunk instead)."""
    return validate_samples(read_table(path, "samples", columns=columns), str(path))


def load_plan(
    path: str | Path, samples: pd.DataFrame | None = None, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    """Read and validate a plan table (a file, or a folder of Parquet parts written by the recorder).

    ``columns``: the columns the caller uses; a Parquet file then reads only those (a recorded plan may carry more),
    as long as it has what a plan needs (else all of it is read, so that the error names every column it has)."""
    return validate_plan(read_table(path, "plan", columns=columns, required=_plan_has_its_columns), str(path), samples)


def _plan_has_its_columns(names: Sequence[str]) -> bool:
    have = set(names)
    return SAMPLE_ID in have and (STEP in have or {EPOCH, BATCH_ID} <= have)


def check_tables(plan: str | Path | None = None, samples: str | Path | None = None) -> None:
    """Check a plan's and a samples table's Parquet files, from their footers alone, before anything reads them.

    Every command that reads a plan calls this first, before the engine's choice by size (which reads the footers)
    and before any progress is shown: a damaged file (empty, truncated, not Parquet) or one without the columns its
    table needs is one line naming the file and what was expected, never an error of the engine that met it first.
    CSV and JSONL tables are read whole by :func:`read_table`, which validates them as it reads."""
    if samples is not None:
        for file, names in _parquet_names(Path(samples), "samples"):
            if not {SAMPLE_ID, N_TOKENS} <= set(names):
                missing = [c for c in (SAMPLE_ID, N_TOKENS) if c not in names]
                raise ForensicsError(
                    f"samples {file}: missing column {', '.join(map(repr, missing))} (expected "
                    f"columns 'sample_id', 'n_tokens'); it has {_names(names)}"
                )
    if plan is not None:
        for file, names in _parquet_names(Path(plan), "plan"):
            if not _plan_has_its_columns(names):
                problem = "missing column 'sample_id'" if SAMPLE_ID not in names else "no 'step' column"
                raise ForensicsError(
                    f"plan {file}: {problem} (expected a 'sample_id' column and either 'step' or "
                    f"both 'epoch' and 'batch_id'); it has {_names(names)}"
                )


def _parquet_names(path: Path, what: str) -> list[tuple[Path, list[str]]]:
    """Each Parquet file of a table (a file, a folder of parts, hive ``key=value/`` folders) with its column names
    (a hive part's folder keys included); none for a table that is not Parquet or not there (its reader says so)."""
    if "://" in str(path) or not path.exists():
        return []
    if path.is_file():
        return [(path, list(parquet_schema(path, what).names))] if path.suffix in (".parquet", ".pq") else []
    flat = sorted(path.glob("*.parquet"))
    if flat:
        return [(f, list(parquet_schema(f, what).names)) for f in flat]
    return [(f, list(parquet_schema(f, what).names) + list(hive_partition_values(f, path))) for f in hive_parts(path)]


def _names(names: Sequence[str]) -> str:
    return ", ".join(repr(str(n)) for n in names[:12]) or "no columns"


def read_case_json(path: str | Path, what: str, list_key: str, writer: str) -> dict[str, Any]:
    """A JSON document a command left in the case (``findings.json``, ``replay.json``, ``compare.json``), read by
    every command that reads it back: an unreadable, empty, invalid or wrongly shaped one is bad input (one line
    naming the file, what was expected and who writes it), never a traceback and never silently skipped, since the
    evidence it holds would be missing from what is reported. ``list_key``: the list the document must hold."""
    path = Path(path)
    expected = f"expected the JSON object {writer} writes, with a '{list_key}' list"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ForensicsError(f"{what} {path} could not be read ({reason}); {expected}") from exc
    if not text.strip():
        raise ForensicsError(f"{what} {path} is empty; {expected}")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ForensicsError(f"{what} {path} is not valid JSON ({exc}); {expected}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get(list_key, []), list):
        held = f"an object whose {list_key!r} is not a list" if isinstance(doc, dict) else f"a {type(doc).__name__}"
        raise ForensicsError(f"{what} {path} holds {held}; {expected}")
    return doc
