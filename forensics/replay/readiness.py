"""Can this case be replayed? What a replay needs, checked without torch, so that every next step the tool prints
names only commands that can run on the case (else what is missing); and which checkpoints the case holds (the
divergence finding names the one to resume from), read from their names alone.

A replay needs the tokens the model saw (``input_ids`` or ``token_ids`` in the samples), a model (run.toml ``model``:
an HF folder with ``config.json`` or ``module:factory``; else an HF ``checkpoint-N/`` folder, which carries its own
config) and checkpoints (run.toml ``checkpoints``, else ``checkpoint-N/`` folders in the case folder).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
        missing.append(
            "a model (run.toml model = an HF model folder or module:factory, or checkpoint-N/ folders "
            "with their config.json)"
        )
    return Readiness(not missing, tuple(missing))


def list_checkpoints(case: Case) -> tuple[list[tuple[int, str]] | None, str | None]:
    """The case's checkpoints as ``(step, path)`` in step order, from their names (no torch, nothing loaded): run.toml
    ``checkpoints`` when set, else the HF ``checkpoint-N/`` folders of the case folder; ``(None, None)`` when the case
    names none, ``(None, warning)`` when run.toml's cannot be read (a detector still runs without them)."""
    from forensics.errors import ForensicsError
    from forensics.replay.checkpoints import discover_checkpoints, is_hf_folder

    cfg = case.config
    try:
        if cfg.checkpoints:
            found = discover_checkpoints(cfg.resolve(cfg.checkpoints))
        elif case.root is not None and case.root.is_dir():
            found = [
                c
                for child in sorted(case.root.glob("checkpoint-*"))
                if child.is_dir() and is_hf_folder(child)
                for c in discover_checkpoints(child)
            ]
        else:
            found = []
    except ForensicsError as exc:
        return None, f"checkpoints not listed: {exc}"
    if not found:
        return None, None
    return sorted((int(c.step), str(c.path)) for c in found), None


def _has_tokens(path: Path) -> bool:
    import pyarrow.parquet as pq

    try:
        if path.is_dir():
            parts = sorted(path.glob("*.parquet"))
            names = pq.read_schema(parts[0]).names if parts else []
        else:
            names = pq.read_schema(path).names
    except (OSError, ValueError, IndexError):
        return False
    return any(c in names for c in TOKEN_COLUMNS)


def has_optimizer_state(case: Case) -> bool:
    """Whether a segment re-run may find optimizer state (no torch, nothing loaded): an HF ``checkpoint-N/`` with
    ``optimizer.pt``, or a checkpoint file or folder of another kind (its state is known only once loaded)."""
    from pathlib import Path

    found, _ = list_checkpoints(case)
    for _, path in found or []:
        p = Path(path)
        if not p.is_dir() or (p / "optimizer.pt").exists() or not (p / "config.json").exists():
            return True
    return False
