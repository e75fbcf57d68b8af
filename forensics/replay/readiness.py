"""Can this case be replayed? What a replay needs, checked without torch, so that every next step the tool prints
names only commands that can run on the case (else what is missing).

A replay needs the tokens the model saw (``input_ids`` or ``token_ids`` in the samples), a model (run.toml ``model``:
an HF folder with ``config.json`` or ``module:factory``; else an HF ``checkpoint-N/`` folder, which carries its own
config) and checkpoints (run.toml ``checkpoints``, else ``checkpoint-N/`` folders in the case folder).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from forensics.schema import Case

TOKEN_COLUMNS = ("input_ids", "token_ids")


@dataclass(frozen=True)
class Readiness:
    """``ok`` when a replay can run; ``missing`` lists what it lacks, in words."""

    ok: bool
    missing: tuple[str, ...] = ()

    def words(self) -> str:
        return "; ".join(self.missing)


def replay_readiness(case: Case) -> Readiness:
    """What :mod:`forensics.replay` would find in this case (module docstring)."""
    cfg = case.config
    missing: list[str] = []
    samples = case.samples_path
    if samples is None or not _has_tokens(Path(samples)):
        missing.append("the token ids each sample fed the model (an input_ids column in samples.parquet)")
    root = case.root
    hf_checkpoints = sorted(root.glob("checkpoint-*")) if root is not None and root.is_dir() else []
    checkpoints = cfg.resolve(cfg.checkpoints) if cfg.checkpoints else None
    if not hf_checkpoints and (checkpoints is None or not checkpoints.exists()):
        missing.append("checkpoints (checkpoint-N/ folders, or run.toml checkpoints = a folder of state dicts)")
    model_ok = bool(cfg.model) and (":" in str(cfg.model) or (cfg.resolve(cfg.model) / "config.json").exists())
    if checkpoints is not None and checkpoints.is_dir():
        hf_checkpoints += sorted(checkpoints.glob("checkpoint-*"))
    if not model_ok and not any((c / "config.json").exists() for c in hf_checkpoints):
        missing.append("a model (run.toml model = an HF model folder or module:factory, or checkpoint-N/ folders "
                       "with their config.json)")
    return Readiness(not missing, tuple(missing))


def _has_tokens(path: Path) -> bool:
    try:
        if path.is_dir():
            parts = sorted(path.glob("*.parquet"))
            names = pq.read_schema(parts[0]).names if parts else []
        else:
            names = pq.read_schema(path).names
    except (OSError, ValueError, IndexError):
        return False
    return any(c in names for c in TOKEN_COLUMNS)
