"""What the framework integrations share: the samples table from a train dataset, the sample-id mapping, finding
the metrics sources a run left in its folder, and a small ``run.toml`` writer.

Kept free of any framework import: a dataset is read through the few things every map-style dataset offers
(``len`` and ``dataset[i]`` returning a mapping, or the columns of a Hugging Face ``datasets.Dataset``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from forensics.errors import ForensicsError

#: Dataset fields read into samples.parquet when present (``token_ids`` is read as ``input_ids``).
ID_COLUMN, TEXT_COLUMN, SOURCE_COLUMN = "sample_id", "text", "source"
TOKEN_COLUMNS = ("input_ids", "token_ids")
MASK_COLUMN = "attention_mask"
PLAN_DIR, SAMPLES_FILE, RUN_TOML = "plan", "samples.parquet", "run.toml"


def _as_list(value: Any) -> list:
    """A row's token field as a plain list (tensors and arrays included)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    return list(value)


def _columns(dataset: Any) -> list[str] | None:
    """The column names of a columnar dataset (``datasets.Dataset``), ``None`` for an item-wise one."""
    names = getattr(dataset, "column_names", None)
    return list(names) if isinstance(names, (list, tuple)) else None


def _field_values(dataset: Any, name: str) -> list | None:
    """Every row's value of one field, or ``None`` when the dataset has no such field."""
    cols = _columns(dataset)
    if cols is not None:
        return list(dataset[name]) if name in cols else None
    first = dataset[0] if len(dataset) else {}
    if not isinstance(first, Mapping) or name not in first:
        return None
    return [dataset[i][name] for i in range(len(dataset))]


def check_map_style(dataset: Any, who: str) -> int:
    """The length of a map-style dataset whose rows are mappings; anything else is bad input for recording."""
    if dataset is None:
        raise ForensicsError(f"{who}: the trainer has no train dataset to record")
    try:
        n = len(dataset)
    except TypeError as exc:
        raise ForensicsError(
            f"{who}: the train dataset has no length (an IterableDataset); recording the plan "
            "needs a map-style dataset whose rows are dicts"
        ) from exc
    if n and _columns(dataset) is None and not isinstance(dataset[0], Mapping):
        raise ForensicsError(
            f"{who}: the train dataset's rows are {type(dataset[0]).__name__}, not dicts; "
            "recording the plan needs rows that are dicts (as Trainer datasets are)"
        )
    return n


def sample_ids_of(dataset: Any, n: int, who: str) -> np.ndarray | None:
    """The dataset's ``sample_id`` column as int64 when it has one (unique whole numbers), else ``None`` (the row
    index is the id)."""
    values = _field_values(dataset, ID_COLUMN)
    if values is None:
        return None
    try:
        ids = np.asarray([int(_scalar(v)) for v in values], dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise ForensicsError(f"{who}: the train dataset's '{ID_COLUMN}' column must hold whole numbers") from exc
    if len(np.unique(ids)) != n:
        raise ForensicsError(f"{who}: the train dataset's '{ID_COLUMN}' column has duplicate ids")
    return ids


def _scalar(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else v


def samples_table(
    dataset: Any, ids: np.ndarray | None, decode: Callable[[list[list[int]]], list[str]] | None, who: str
):
    """The samples table (docs/concepts.md) of a train dataset, as a :class:`pyarrow.Table`.

    ``n_tokens`` counts the attention mask's ones when the rows carry a mask (padded rows), else the token ids;
    ``input_ids`` are the unpadded tokens (the mask's positions); ``text`` is the dataset's text column, else the
    decoded tokens when ``decode`` is given; ``source`` is copied when the dataset has that column.
    """
    import pyarrow as pa

    n = len(dataset)
    tokens = next((v for v in (_field_values(dataset, c) for c in TOKEN_COLUMNS) if v is not None), None)
    if tokens is None:
        raise ForensicsError(f"{who}: the train dataset has no 'input_ids' field to count tokens from")
    tokens = [_as_list(t) for t in tokens]
    masks = _field_values(dataset, MASK_COLUMN)
    if masks is not None:
        kept = []
        for t, m in zip(tokens, masks):
            m = _as_list(m)
            kept.append([tok for tok, keep in zip(t, m) if keep])
        tokens = kept
    lengths = np.fromiter((len(t) for t in tokens), dtype=np.int32, count=n)
    columns: dict[str, Any] = {
        "sample_id": pa.array(ids if ids is not None else np.arange(n, dtype=np.int64), pa.int64()),
        "n_tokens": pa.array(lengths, pa.int32()),
        "input_ids": pa.array(tokens, pa.list_(pa.int32())),
    }
    text = _field_values(dataset, TEXT_COLUMN)
    if text is None and decode is not None:
        text = decode(tokens)
    if text is not None:
        columns["text"] = pa.array([str(t) for t in text], pa.string())
    source = _field_values(dataset, SOURCE_COLUMN)
    if source is not None:
        columns["source"] = pa.array([str(_scalar(s)) for s in source], pa.string())
    return pa.table(columns)


def write_samples(table, path: Path) -> None:
    """Write samples.parquet atomically (a reader never sees half a file)."""
    import pyarrow.parquet as pq

    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


# --- metrics sources a run leaves behind ---------------------------------------------------------------------------
_EVENT_TIME = re.compile(r"events\.out\.tfevents\.(\d+)")


def tensorboard_run_dirs(root: Path) -> list[Path]:
    """Folders under ``root`` (itself included) that hold event files directly, in the order their runs started:
    a resumed run writes a new folder, and each folder is one source (a folder of folders would prefix its tags)."""
    if not root.is_dir():
        return []
    started: dict[Path, int] = {}
    for f in root.rglob("events.out.tfevents.*"):
        m = _EVENT_TIME.match(f.name)
        t = int(m.group(1)) if m else 0
        started[f.parent] = min(started.get(f.parent, t), t)
    return sorted(started, key=lambda p: (started[p], str(p)))


def relative(path: Path, case_dir: Path) -> str:
    """``path`` relative to the case folder when it lies inside it (run.toml resolves relative paths there)."""
    path, case_dir = Path(os.path.abspath(path)), Path(os.path.abspath(case_dir))
    try:
        rel = path.relative_to(case_dir)
    except ValueError:
        return str(path)
    return rel.as_posix() or "."


def unique(items: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in items if not (x in seen or seen.add(x))]


# --- run.toml --------------------------------------------------------------------------------------------------
def write_run_toml(path: Path, values: Mapping[str, Any], header: str) -> None:
    """Write the ``run.toml`` of a recorded run: only what the run itself said (None values left out)."""
    from forensics.schema import write_run_toml as write

    write(values, path, header=header)


def read_previous_metrics(path: Path) -> list[str]:
    """The ``metrics`` list of an earlier ``run.toml`` (a resumed run keeps the sources of the run it resumes)."""
    if not path.exists():
        return []
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    metrics = data.get("metrics", [])
    return [m for m in metrics if isinstance(m, str)] if isinstance(metrics, list) else []
