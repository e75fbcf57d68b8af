"""The run configuration: ``run.toml`` (every key optional) plus overrides, and the bucket boundaries' checks."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from forensics.errors import ForensicsError
from forensics.schema.tables import (
    DEFAULT_BOUNDARIES,
    MAX_LEN,
    RANK_SPLITS,
    TOKEN_BUDGET,
    _first_line,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


@dataclass
class RunConfig:
    """The settings of one run, from ``run.toml`` (every key optional), overridable from the CLI."""

    metrics: list[str] = field(default_factory=list)
    plan: str | None = None
    samples: str | None = None
    grad_accum: int = 1
    world_size: int = 1
    rank_split: str = "round_robin"
    step_offset: int = 0
    loss_key: str | None = None
    boundaries: list[int] = field(default_factory=lambda: list(DEFAULT_BOUNDARIES))
    token_budget: int = TOKEN_BUDGET
    max_len: int = MAX_LEN

    def validated(self, origin: str = "run.toml") -> RunConfig:
        """Check the values once; raise a message naming the key on a bad one."""
        for key in ("grad_accum", "world_size", "token_budget", "max_len"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ForensicsError(f"{origin}: '{key}' must be a positive integer; got {v!r}")
        if not isinstance(self.step_offset, int) or isinstance(self.step_offset, bool):
            raise ForensicsError(f"{origin}: 'step_offset' must be an integer; got {self.step_offset!r}")
        if self.rank_split not in RANK_SPLITS:
            raise ForensicsError(f"{origin}: 'rank_split' must be one of {', '.join(RANK_SPLITS)}; "
                                 f"got {self.rank_split!r}")
        self.boundaries = check_boundaries(self.boundaries, origin)
        if isinstance(self.metrics, str):
            self.metrics = [self.metrics]
        if not isinstance(self.metrics, list) or not all(isinstance(m, str) for m in self.metrics):
            raise ForensicsError(f"{origin}: 'metrics' must be a path or a list of paths; got {self.metrics!r}")
        for key in ("plan", "samples", "loss_key"):
            v = getattr(self, key)
            if v is not None and not isinstance(v, str):
                raise ForensicsError(f"{origin}: '{key}' must be a string; got {v!r}")
        return self


def check_boundaries(values: Sequence, origin: str = "boundaries") -> list[int]:
    """Bucket boundaries ``[0, b1, ..., max_len]``: whole numbers, strictly increasing, starting at 0."""
    try:
        b = [int(v) for v in values]
    except (TypeError, ValueError) as exc:
        raise ForensicsError(f"{origin}: boundaries must be whole numbers; got {list(values)!r}") from exc
    if any(float(v) != x for v, x in zip(values, b)):
        raise ForensicsError(f"{origin}: boundaries must be whole numbers; got {list(values)!r}")
    if len(b) < 2 or b[0] != 0 or any(x >= y for x, y in zip(b, b[1:])):
        raise ForensicsError(f"{origin}: boundaries must start at 0 and strictly increase, at least 2 values; "
                             f"got {b}")
    return b


def parse_boundaries(text: str) -> list[int]:
    """``"0,770,8192"`` -> ``[0, 770, 8192]`` (the CLI's comma-separated form)."""
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise ForensicsError(f"--boundaries: expected comma-separated whole numbers like 0,770,8192; got {text!r}") \
            from exc
    return check_boundaries(values, "--boundaries")


def load_run_toml(path: str | Path) -> tuple[RunConfig, list[str]]:
    """Read ``run.toml``; unknown keys are warned about (a typo should not pass silently) and kept out."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ForensicsError(f"run.toml {path} does not exist") from exc
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ForensicsError(f"run.toml {path} could not be read: {_first_line(exc)}") from exc
    known = {f.name for f in fields(RunConfig)}
    warnings = [f"{path}: unknown key '{k}' ignored" for k in data if k not in known]
    kwargs = {k: v for k, v in data.items() if k in known}
    try:
        cfg = RunConfig(**kwargs)
    except TypeError as exc:  # pragma: no cover - dataclass accepts every known key
        raise ForensicsError(f"run.toml {path}: {exc}") from exc
    return cfg.validated(str(path)), warnings


def write_run_toml(cfg: RunConfig, path: str | Path, extra: dict | None = None) -> None:
    """Write ``run.toml`` (plain TOML by hand: the keys are flat scalars and lists)."""
    lines = []
    for f in fields(RunConfig):
        v = getattr(cfg, f.name)
        if v is None:
            continue
        lines.append(f"{f.name} = {_toml_value(v)}")
    for k, v in (extra or {}).items():
        lines.append(f"{k} = {_toml_value(v)}")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")
