"""The result of a replay: replay.json's shape, JSON-safe numbers, merging with an earlier file, and
the table a person reads (integer steps, ``-`` for none, the run's own step numbers beside the canonical ones)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

#: replay.json's shape; raised when a key changes meaning (2: mode, seeds, spread, confidence, role, checkpoint).
VERSION = 2


@dataclass
class ReplayResult:
    """The verdicts of one replay (``steps`` as in replay.json) and where they were written.

    ``groups``: the causes (or hand-given steps) replayed; ``not_replayed``: those the budget did not reach;
    ``forward_log``: every forward as (checkpoint, step, dropout seed or None), in order."""

    steps: list[dict[str, Any]]
    device: str
    dtype: str
    written: list[Path] = field(default_factory=list)
    forwards: int = 0
    tokens_forwarded: int = 0
    warnings: list[str] = field(default_factory=list)
    logged_offset: int = 0
    steps_as: str = "canonical"
    forward_log: list[tuple[int, int, int | None]] = field(default_factory=list)
    seconds: float = 0.0
    groups: list[dict[str, Any]] = field(default_factory=list)
    not_replayed: list[dict[str, Any]] = field(default_factory=list)
    budget_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "device": self.device,
            "dtype": self.dtype,
            "logged_offset": self.logged_offset,
            "steps": self.steps,
        }


def json_safe(x: Any) -> Any:
    """JSON-safe numbers: NaN/inf as strings (docs/commands/replay.md), floats rounded to 6 significant digits."""
    if isinstance(x, float):
        return float(f"{x:.6g}") if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, np.generic):
        return json_safe(x.item())
    return x


def read_replay(path: Path) -> dict[str, Any] | None:
    """An earlier replay.json, None when there is none; a damaged one is bad input (the verdicts it holds would
    silently vanish from the audit, and a later replay would overwrite them)."""
    if not path.is_file():
        return None
    from forensics.schema.case import read_case_json

    return read_case_json(path, "replay file", "steps", "`forensics replay`")


def merge_write(path: Path, result: ReplayResult) -> dict[str, Any]:
    """Write replay.json, keeping the steps an earlier replay wrote and this one did not redo; returns it."""
    old = (read_replay(path) or {}).get("steps") or []
    new_steps = {d["step"] for d in result.steps}
    merged = sorted(
        [d for d in old if isinstance(d, dict) and d.get("step") not in new_steps] + result.steps,
        key=lambda d: d["step"],
    )
    doc = result.to_json() | {"steps": merged}
    path.parent.mkdir(parents=True, exist_ok=True)
    # whole or not at all: a reader (the audit, the live loop) never meets a half-written file, now bad input
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    part.replace(path)
    return doc


def _step(step: Any) -> str:
    return "-" if step is None or (isinstance(step, float) and not math.isfinite(step)) else str(int(step))


def _num(x: Any, digits: int = 3) -> str:
    if x is None or isinstance(x, str) or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{digits}f}"


def steps_table(result: ReplayResult) -> pd.DataFrame:
    """One row per replayed step for a terminal table: every cell already text (integers for steps, ``-`` for
    none, the logged step beside the canonical one when the run numbers its steps otherwise)."""
    offset = result.logged_offset
    rows = []
    for d in result.steps:
        c = d.get("controls") or {}
        ck = _step(d.get("checkpoint_step"))
        if d.get("checkpoint") == "after" and ck != "-":
            ck += " (after)"
        row = {"step": _step(d["step"])}
        if offset:
            row["logged step"] = _step(d.get("logged_step", d["step"] + offset))
        role = d.get("role", "suspect")
        row |= {
            "role": f"control of {d['control_of']}"
            if role == "control" and d.get("control_of") is not None
            else (f"cause {d['cause']}" if d.get("cause") else role),
            "verdict": str(d["verdict"]),
            "mode": str(d.get("mode") or "-"),
            "checkpoint": ck,
            "logged loss": _num(d.get("logged")),
            "replayed": _num(d.get("replayed")),
            "z": _num(c.get("z"), 1),
            "top samples": ", ".join(str(x["sample_id"]) for x in (d.get("samples") or [])[:3]) or "-",
        }
        rows.append(row)
    return pd.DataFrame(rows)
