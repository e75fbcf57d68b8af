"""Where a plan lies: its Parquet parts (a file, the recorder's flat folder, hive ``key=value/`` folders), their size
as Arrow (from the footers alone), and the memory limit an engine works under."""

from __future__ import annotations

import os
import re
from pathlib import Path

from forensics.errors import ForensicsError
from forensics.schema.tables import hive_parts, parquet_metadata, parquet_schema

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str | int | float | None) -> int | None:
    """Bytes of a size such as ``4GB``, ``512MiB`` or a plain number of bytes; None stays None."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return int(text)
    m = _SIZE.match(str(text))
    if not m:
        raise ForensicsError(f"memory limit: {text!r} is not a size such as 4GB or 512MB")
    unit = (m.group(2) or "").lower()
    base = 1024 ** "kmgt".index(unit[0]) * 1024 if "i" in unit else _UNITS[unit[:1]]
    return int(float(m.group(1)) * base)


def available_memory() -> int:
    """Bytes of memory available now (psutil when installed, else the machine's pages)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil ships with the dashboard's dependencies
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def memory_limit(text: str | int | None) -> int:
    """The limit an engine works under: the one given, else half the available memory (docs/scale.md)."""
    return parse_size(text) or available_memory() // 2


def parquet_parts(path: str | Path) -> tuple[list[str], bool] | None:
    """The Parquet files of a plan and whether they are hive-partitioned (``key=value/`` folders); None when the
    plan is not Parquet (a CSV or JSONL file, read by pandas). A folder without parts is bad input."""
    text = str(path)
    if "://" in text:  # object storage: the engine's filesystem layer lists it
        hive = not text.endswith(".parquet")
        return ([text.rstrip("/") + "/**/*.parquet" if hive else text], hive)
    p = Path(path)
    if not p.exists():
        raise ForensicsError(f"plan file {p} does not exist")
    if p.is_file():
        return ([str(p)], False) if p.suffix in (".parquet", ".pq") else None
    flat = sorted(p.glob("*.parquet"))
    if flat:
        return [str(f) for f in flat], False
    nested = hive_parts(p)
    if not nested:
        raise ForensicsError(f"plan folder {p} holds no .parquet parts")
    return [str(f) for f in nested], True


def parquet_columns(path: str | Path) -> list[str] | None:
    """The columns of a local Parquet table (its first part's; a hive folder's keys included), None when the table
    is not Parquet or lies on object storage."""
    parts = parquet_parts(path)
    if parts is None or "://" in parts[0][0]:
        return None
    files, hive = parts
    names = list(parquet_schema(files[0], "plan").names)
    return names + (list(hive_values(Path(files[0]), Path(path))) if hive else [])


def hive_values(file: Path, root: Path) -> dict[str, str]:
    """The ``key=value`` folders between ``root`` and ``file``."""
    return dict(part.split("=", 1) for part in file.relative_to(root).parts[:-1])


def arrow_size(path: str | Path) -> int:
    """Bytes the plan would take as Arrow, from the Parquet footers (rows x 8 bytes per integer column); a plan that
    is not Parquet counts as its file size."""
    parts = parquet_parts(path)
    if parts is None:
        return Path(path).stat().st_size
    files, hive = parts
    if "://" in files[0]:
        return 0
    total = 0
    for f in files:
        meta = parquet_metadata(f, "plan")
        cols = meta.num_columns + (len(hive_values(Path(f), Path(path))) if hive else 0)
        total += meta.num_rows * cols * 8
    return total
