"""Which reader reads a source: the formats this tool knows, how a source's format is recognised, and opening it.

A format joins by one entry in :data:`FORMATS`: its name, where its reader lives (``module:Class``, imported only
when such a source is opened, so a command never pays for readers it does not use) and the options it accepts.
The reader modules themselves import nothing of this module.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forensics.errors import ForensicsError


@dataclass(frozen=True)
class Format:
    """One format: ``reader`` is ``module:Class``; ``suffixes`` name its files; ``options`` are the reader's own
    keyword options beyond keys/step_key/strict (others given to :func:`open_reader` are ignored for it)."""

    name: str
    reader: str
    suffixes: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("jsonl", "forensics.sources.jsonl:JsonlReader", (".jsonl", ".ndjson")),
        Format("json", "forensics.sources.json_document:JsonDocumentReader", (".json",)),
        Format("csv", "forensics.sources.csv_table:CsvReader", (".csv", ".tsv"), ("include_minmax",)),
        Format("tensorboard", "forensics.sources.tensorboard.event_reader:TensorBoardReader"),
        Format("text", "forensics.sources.text_log:TextLogReader", (".log", ".txt", ".out", ".err"), ("pattern",)),
        Format("parquet", "forensics.sources.parquet:ParquetReader", (".parquet", ".pq")),
        Format("wandb", "forensics.sources.wandb.run_reader:WandbRunReader", (".wandb",), ("run_id",)),
        Format("wandb-api", "forensics.sources.wandb.api_reader:WandbApiReader"),
        Format("mlflow", "forensics.sources.mlflow:MlflowReader", (), ("tracking_uri",)),
    )
}


def is_wandb_api_source(source: str) -> bool:
    """``wandb://entity/project/run_id``, a ``https://wandb.ai/...`` run URL, or a bare ``entity/project/run_id``
    that is not a local path."""
    s = str(source)
    if s.startswith("wandb://") or s.startswith(("https://wandb.ai/", "http://wandb.ai/", "wandb.ai/")):
        return True
    parts = s.split("/")
    return (
        len(parts) == 3
        and all(parts)
        and not s.startswith((".", "~"))
        and not Path(parts[0]).exists()
        and "." not in parts[-1]
    )


def _json_or_jsonl(path: Path) -> str:
    """A ``.json`` file is JSON Lines when its first line is a whole object, else one JSON document."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline().strip()
    except OSError as exc:
        raise ForensicsError(f"metrics file {path} could not be read: {exc.strerror or exc}") from exc
    if first.startswith(b"{") and first.endswith(b"}"):
        try:
            obj = json.loads(first)
        except ValueError:
            return "json"
        # a one-line document that holds its records as a list (trainer_state.json written compactly)
        holds_records = any(isinstance(v, list) and v and isinstance(v[0], dict) for v in obj.values())
        return "json" if holds_records else "jsonl"
    return "json"


def detect_format(source: str | Path) -> str:
    """The format of a source, from its form, name and (for a file without a known suffix) first bytes."""
    s = str(source)
    if is_wandb_api_source(s):
        return "wandb-api"
    from forensics.sources.mlflow import is_mlflow_source

    if is_mlflow_source(s):
        return "mlflow"
    path = Path(s)
    if not path.exists():
        raise ForensicsError(f"metrics source {s} does not exist")
    name = path.name
    if path.is_dir():
        # A W&B run folder may hold TensorBoard files too (sync_tensorboard): its .wandb file decides first.
        if name == "wandb" or any(path.glob("*.wandb")):
            return "wandb"
        if next(path.rglob("events.out.tfevents.*"), None) is not None:
            return "tensorboard"
        if name.startswith(("offline-run-", "run-")):
            return "wandb"
        raise ForensicsError(f"metrics folder {s} holds no TensorBoard event files and is not a W&B run folder")
    if name.startswith("events.out.tfevents."):
        return "tensorboard"
    suffix = path.suffix.lower()
    if suffix == ".json":
        return _json_or_jsonl(path)
    for fmt in FORMATS.values():
        if suffix in fmt.suffixes:
            return fmt.name
    if suffix and not suffix[1:].isdigit():
        raise ForensicsError(
            f"metrics file {s} has an unknown format {suffix!r}; expected .jsonl, .csv, .log/.txt, .parquet, "
            "a TensorBoard events file or folder, or a W&B run"
        )
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise ForensicsError(f"metrics file {s} could not be read: {exc.strerror or exc}") from exc
    if b"\x00" in head:
        raise ForensicsError(f"metrics file {s} is binary and not a format this tool reads")
    return "jsonl" if head.lstrip().startswith(b"{") else "text"


def open_reader(
    source: str | Path,
    *,
    format: str | None = None,
    keys: Sequence[str] | None = None,
    step_key: str | None = None,
    strict: bool = False,
    **options: Any,
) -> Any:
    """The reader for a source (format detected unless given), a :class:`~forensics.sources.reader.base.MetricsReader`.

    ``options`` (``pattern``, ``run_id``, ``include_minmax``, ``tracking_uri``) reach the formats that accept them;
    others ignore them.
    """
    fmt = format or detect_format(source)
    if fmt not in FORMATS:
        raise ForensicsError(f"unknown metrics format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if fmt not in ("wandb-api", "mlflow") and not Path(source).exists():
        raise ForensicsError(f"metrics source {source} does not exist")
    entry = FORMATS[fmt]
    module, cls = entry.reader.split(":")
    reader_cls = getattr(importlib.import_module(module), cls)
    own = {k: v for k, v in options.items() if k in entry.options and v is not None}
    return reader_cls(source, keys=keys, step_key=step_key, strict=strict, **own)
