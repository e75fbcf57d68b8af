"""The case folder: one run's inputs (metrics sources, plan, samples, ``run.toml``) and its outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from forensics.errors import ForensicsError
from forensics.schema.config import RunConfig, load_run_toml
from forensics.schema.tables import read_table, validate_plan, validate_samples


@dataclass
class Case:
    """A case folder: one run's inputs (metrics sources, plan, samples, ``run.toml``) and its outputs."""

    root: Path
    config: RunConfig
    warnings: list[str] = field(default_factory=list)

    @property
    def metrics_sources(self) -> list[Path]:
        srcs = self.config.metrics or ["metrics.parquet"]
        return [self._resolve(s) for s in srcs]

    @property
    def plan_path(self) -> Path | None:
        p = self._resolve(self.config.plan or "plan.parquet")
        return p if (self.config.plan or p.exists()) else None

    @property
    def samples_path(self) -> Path | None:
        p = self._resolve(self.config.samples or "samples.parquet")
        return p if (self.config.samples or p.exists()) else None

    @property
    def findings_path(self) -> Path:
        return self.root / "findings.json"

    @property
    def report_path(self) -> Path:
        return self.root / "report.html"

    def _resolve(self, p: str) -> Path:
        path = Path(p)
        return path if path.is_absolute() else self.root / path


def open_case(root: str | Path) -> Case:
    """Open a case folder; ``run.toml`` is optional (the defaults of DESIGN.md apply without it)."""
    root = Path(root)
    if not root.exists():
        raise ForensicsError(f"case folder {root} does not exist")
    if not root.is_dir():
        raise ForensicsError(f"case folder {root} is not a folder")
    toml = root / "run.toml"
    if toml.exists():
        cfg, warnings = load_run_toml(toml)
    else:
        cfg, warnings = RunConfig().validated(), []
    return Case(root=root, config=cfg, warnings=warnings)


def load_samples(path: str | Path) -> pd.DataFrame:
    """Read and validate a samples table."""
    return validate_samples(read_table(path, "samples"), str(path))


def load_plan(path: str | Path, samples: pd.DataFrame | None = None) -> pd.DataFrame:
    """Read and validate a plan table (a file, or a folder of Parquet parts written by the recorder)."""
    return validate_plan(read_table(path, "plan"), str(path), samples)
