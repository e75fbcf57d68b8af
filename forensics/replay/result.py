"""The result of a replay: replay.json's shape (DESIGN.md), JSON-safe numbers, merging with an earlier file."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

#: replay.json's shape; raised when a key changes meaning.
VERSION = 1


@dataclass
class ReplayResult:
    """The verdicts of one replay (``steps`` as in replay.json) and where they were written."""

    steps: list[dict[str, Any]]
    device: str
    dtype: str
    written: list[Path] = field(default_factory=list)
    forwards: int = 0
    tokens_forwarded: int = 0
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "device": self.device, "dtype": self.dtype, "steps": self.steps}


def json_safe(x: Any) -> Any:
    """JSON-safe numbers: NaN/inf as strings (DESIGN.md), floats rounded to 6 significant digits."""
    if isinstance(x, float):
        return float(f"{x:.6g}") if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, np.generic):
        return json_safe(x.item())
    return x


def merge_write(path: Path, result: ReplayResult) -> None:
    """Write replay.json, keeping the steps an earlier replay wrote and this one did not redo."""
    old: list[dict] = []
    if path.exists():
        try:
            old = json.loads(path.read_text(encoding="utf-8")).get("steps", [])
        except (ValueError, AttributeError):
            old = []
    new_steps = {d["step"] for d in result.steps}
    merged = sorted([d for d in old if d.get("step") not in new_steps] + result.steps, key=lambda d: d["step"])
    doc = result.to_json() | {"steps": merged}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def steps_table(result: ReplayResult) -> pd.DataFrame:
    """One row per replayed step for a terminal table (the CLI renders it)."""
    rows = []
    for d in result.steps:
        c = d.get("controls") or {}
        rows.append({"step": d["step"], "verdict": d["verdict"], "checkpoint": d.get("checkpoint_step"),
                     "logged": d.get("logged"), "replayed": d.get("replayed"), "z": c.get("z"),
                     "top samples": ", ".join(str(x["sample_id"]) for x in (d.get("samples") or [])[:3])})
    return pd.DataFrame(rows)
