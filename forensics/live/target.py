"""What a live view watches: a case folder (with its run.toml), or metrics sources given directly.

The dashboard and ``forensics watch`` take the same arguments (``CASE | SOURCE...``) and resolve them here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from forensics.errors import ForensicsError

#: Files whose presence makes a folder a case folder (else a folder given is a metrics source, e.g. ``wandb/``).
#: Sources that name a run on a server rather than a local path (W&B's API, an MLflow run id).
REMOTE_PREFIXES = ("wandb://", "https://", "mlflow:")
CASE_MARKERS = ("run.toml", "plan.parquet", "samples.parquet", "metrics.parquet", "findings.json", "plan")


@dataclass
class Target:
    """A case folder and/or metrics sources (local files, folders, W&B run paths)."""

    case: Path | None = None
    sources: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return str(self.case) if self.case is not None else ", ".join(self.sources)


def is_case_folder(path: str | Path) -> bool:
    """A folder holding a case's files (``run.toml``, ``plan.parquet``, ...), not a bare metrics source."""
    p = Path(path)
    return p.is_dir() and any((p / name).exists() for name in CASE_MARKERS)


def resolve_target(args: Sequence[str], command: str = "dashboard") -> Target:
    """``[CASE | SOURCE...]``: a case folder alone, else metrics sources (local files, folders, W&B run paths)."""
    args = [str(a) for a in args if str(a).strip()]
    if not args:
        raise ForensicsError(f"{command}: give a case folder or metrics sources")
    if len(args) == 1 and is_case_folder(args[0]):
        return Target(case=Path(args[0]).resolve())
    for a in args:
        if is_case_folder(a):
            raise ForensicsError(f"{command}: {a} is a case folder; give it alone, not with other sources")
        if not Path(a).exists() and a.count("/") != 2 and not a.startswith(REMOTE_PREFIXES):
            raise ForensicsError(
                f"{command}: {a} does not exist (expected a case folder, a log file or folder, "
                "a W&B run path entity/project/run_id, or mlflow:RUN_ID)"
            )
    return Target(sources=args)
