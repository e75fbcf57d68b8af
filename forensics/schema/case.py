"""The case folder: one run's inputs (metrics sources, plan, samples, ``run.toml``) and its outputs.

Every command opens a case the same way (:func:`open_case`): the folder's ``run.toml`` plus the command's ``--set``
items and flags give the :class:`~forensics.schema.config.RunConfig`; the inputs are the ones it names, else the
canonical files of the folder (``metrics.parquet``, ``plan.parquet``, ``samples.parquet``), else the metrics sources
found in it (an HF Trainer output folder: ``trainer_state.json``, its TensorBoard ``runs/``, ``wandb/``). A folder
that is itself a metrics source (a W&B run folder, a TensorBoard log folder) is read as one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from forensics.errors import ForensicsError
from forensics.schema.config import RunConfig, SourceSpec, resolve_config
from forensics.schema.tables import BATCH_ID, EPOCH, SAMPLE_ID, STEP, read_table, validate_plan, validate_samples

#: Metrics files a folder may hold, in merge order (later wins), looked for when run.toml names none.
KNOWN_METRICS = ("metrics.parquet", "metrics.jsonl", "metrics.csv", "trainer_state.json", "runs", "lightning_logs",
                 "logs", "wandb")


@dataclass(frozen=True)
class Case:
    """A case folder and its resolved configuration; paths are absolute or relative to the working directory."""

    root: Path | None
    config: RunConfig
    warnings: list[str] = field(default_factory=list)

    @property
    def metrics_sources(self) -> list[SourceSpec]:
        """The metrics sources, paths resolved against the case folder."""
        return [SourceSpec(str(self.config.resolve(s.path)) if not _is_remote(s.path) else s.path,
                           s.step_key, s.step_offset) for s in self.config.metrics]

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
    None, a case made of the flags alone (``overrides`` naming ``metrics``, ``plan``, ``samples``)."""
    if root is None:
        cfg, warnings = resolve_config(None, sets=sets, overrides=overrides)
        return Case(root=None, config=cfg, warnings=warnings)
    root = Path(root)
    if not root.exists():
        raise ForensicsError(f"case folder {root} does not exist")
    if not root.is_dir():
        raise ForensicsError(f"case folder {root} is not a folder")
    if is_metrics_folder(root):
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


def load_plan(path: str | Path, samples: pd.DataFrame | None = None,
              columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Read and validate a plan table (a file, or a folder of Parquet parts written by the recorder).

    ``columns``: the columns the caller uses; a Parquet file then reads only those (a recorded plan may carry more),
    as long as it has what a plan needs (else all of it is read, so that the error names every column it has)."""
    return validate_plan(read_table(path, "plan", columns=columns, required=_plan_has_its_columns), str(path),
                         samples)


def _plan_has_its_columns(names: Sequence[str]) -> bool:
    have = set(names)
    return SAMPLE_ID in have and (STEP in have or {EPOCH, BATCH_ID} <= have)
