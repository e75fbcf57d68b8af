"""The tables every stage speaks (metrics, samples, plan), the case folder and ``run.toml``.

This module owns the column names and validates input once, at the boundary: after ``load_*`` a table has the
documented dtypes, and no other module re-checks them. Bad input raises :class:`~forensics.errors.ForensicsError`
(one sentence: file, column, a few offending values). Data quirks of real runs are kept and returned as warnings.

Tables (see docs/architecture.md):
- **metrics**: ``step`` int64, unique and sorted; any number of float64 metric columns named as logged;
  optional ``_timestamp``. NaN and inf are values, never dropped. Every source reaches this form through the
  readers of :mod:`forensics.sources` (one validation path, built on :func:`cast_float`; null cells were never written,
  NaN cells were logged as NaN).
- **samples**: ``sample_id`` int64 unique, ``n_tokens`` int32; optional ``text``, ``source``, ``cluster``,
  ``token_ids``.
- **plan**: ``sample_id`` int64 and either ``step`` or (``epoch``, ``batch_id``); optional ``micro``, ``rank``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from forensics.errors import ForensicsError

# --- column names -------------------------------------------------------------------------------------------------
STEP = "step"
TIMESTAMP = "_timestamp"
SAMPLE_ID = "sample_id"
N_TOKENS = "n_tokens"
TEXT = "text"
SOURCE = "source"
CLUSTER = "cluster"
TOKEN_IDS = "token_ids"
EPOCH = "epoch"
BATCH_ID = "batch_id"
MICRO = "micro"
RANK = "rank"
#: The step-mapped plan's global id of each batch (one micro-batch on one rank).
BATCH = "batch"
#: Sample tags: what tagging adds to each sample.
BUCKET = "bucket"
CLUSTER_NAME = "cluster_name"
#: The name of the cluster of texts unlike every other cluster (forensics.tagging.clusters).
ATYPICAL_CLUSTER = "(unlike any cluster)"

PLAN_INT_COLUMNS = (STEP, SAMPLE_ID, EPOCH, BATCH_ID, MICRO, RANK)
#: A metrics table's ``attrs`` key: ``{column: why}`` for the fields its sources logged with no numeric value (left
#: out of the table as not metrics), so that a lookup for the loss can say the loss column holds no number.
LEFT_OUT = "left_out"

# --- defaults of the story (docs/concepts.md) ----------------------------------------------------------------
DEFAULT_BOUNDARIES: tuple[int, ...] = (0, 770, 1216, 1728, 2432, 3296, 8192)
MAX_LEN = 8192
MAX_BATCH_SIZE = 64
#: The story names no budget; 16,384 padded tokens per batch reproduces its ~40% random/sorted throughput.
TOKEN_BUDGET = 16_384
RANK_SPLITS = ("round_robin", "per_rank")

_FEW = 5  # offending values quoted in an error message


# --- reading files ------------------------------------------------------------------------------------------------
def read_table(
    path: str | Path,
    what: str,
    columns: Sequence[str] | None = None,
    required: Callable[[Sequence[str]], bool] | None = None,
) -> pd.DataFrame:
    """Read a Parquet, CSV or JSONL table; a missing or unreadable file is bad input.

    ``columns``: of a Parquet file read only those that it has, provided ``required(its column names)`` holds (else
    all, so that a validation error can name what the file has); other formats are read whole."""
    path = Path(path)
    if not path.exists():
        raise ForensicsError(f"{what} file {path} does not exist")
    if path.is_dir():
        parts = sorted(path.glob("*.parquet"))
        if parts:
            return pd.concat([read_table(p, what, columns, required) for p in parts], ignore_index=True)
        return _read_hive(path, what, columns, required)
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if suffix in (".parquet", ".pq"):
        parquet_schema(path, what)  # the footer first: a damaged file is one line, whoever reads it next
    if path.stat().st_size == 0:
        raise ForensicsError(f"{what} file {path} is empty; expected a {_FORMATS.get(suffix, 'table')} table")
    try:
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(path) if columns is None else _read_parquet(path, columns, required)
        if suffix in (".csv", ".csv.gz"):
            return pd.read_csv(path)
        if suffix in (".jsonl", ".json", ".jsonl.gz", ".ndjson"):
            return pd.read_json(path, lines=suffix != ".json")
    except Exception as exc:  # OSError, ValueError, and pyarrow's own types for corrupt files
        raise ForensicsError(
            f"{what} file {path} could not be read: {_first_line(exc)}; expected a "
            f"{_FORMATS.get(suffix, 'table')} table"
        ) from exc
    raise ForensicsError(f"{what} file {path} has an unknown format {suffix!r}; expected .parquet, .csv or .jsonl")


_FORMATS = {
    ".parquet": "Parquet",
    ".pq": "Parquet",
    ".csv": "CSV",
    ".csv.gz": "CSV",
    ".jsonl": "JSONL",
    ".jsonl.gz": "JSONL",
    ".ndjson": "JSONL",
    ".json": "JSON",
}


def parquet_schema(path: str | Path, what: str) -> pa.Schema:
    """The schema in a Parquet file's footer, the one read every reader of a plan, samples or metrics file does first
    (the engine's choice by size included), so that a damaged file is bad input (one line naming it) and never a
    pyarrow error: an empty file, a truncated one (no footer) and one that is not Parquet at all."""
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ForensicsError(f"{what} file {path} could not be read: {exc.strerror or exc}") from exc
    if size == 0:
        raise ForensicsError(f"{what} file {path} is empty; expected a Parquet table")
    try:
        return pq.read_schema(path)
    except Exception as exc:  # pyarrow's ArrowInvalid / OSError for a missing or damaged footer
        raise ForensicsError(
            f"{what} file {path} could not be read as Parquet ({_first_line(exc)}); expected a "
            "Parquet file with its footer (was it truncated or overwritten?)"
        ) from exc


def parquet_metadata(path: str | Path, what: str):  # -> pyarrow.parquet.FileMetaData
    """A Parquet file's footer metadata (rows, columns), its footer checked by :func:`parquet_schema` first."""
    import pyarrow.parquet as pq

    parquet_schema(path, what)
    return pq.ParquetFile(path).metadata


def _read_hive(
    path: Path, what: str, columns: Sequence[str] | None, required: Callable[[Sequence[str]], bool] | None
) -> pd.DataFrame:
    """A hive-partitioned folder (``epoch=E/part.parquet``): each part with its folders' ``key=value`` as columns
    (integers when they read as integers), parts in the order of those values, then of their names."""
    parts = hive_parts(path)
    if not parts:
        raise ForensicsError(f"{what} folder {path} holds no .parquet parts")
    frames = []
    for f in parts:
        frame = read_table(f, what, columns, None if required is None else lambda names: True)
        for k, v in hive_partition_values(f, path).items():
            frame[k] = np.int64(v) if isinstance(v, int) else v
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def hive_partition_values(file: Path, root: Path) -> dict[str, object]:
    """The ``key=value`` folders between ``root`` and ``file``, integers when they read as integers."""
    pairs = [part.split("=", 1) for part in file.relative_to(root).parts[:-1]]
    return {k: int(v) if v.lstrip("-").isdigit() else v for k, v in pairs}


def hive_parts(root: Path) -> list[Path]:
    """The Parquet parts of a hive-partitioned folder in the order every reader takes them: by their folders'
    values (``epoch=2`` before ``epoch=10``), then by name; an engine that keeps the plan's row order follows it."""
    parts = [f for f in root.rglob("*.parquet") if all("=" in q for q in f.relative_to(root).parts[:-1])]
    return sorted(
        parts, key=lambda f: (tuple((k, str(type(v)), v) for k, v in hive_partition_values(f, root).items()), f.name)
    )


def _read_parquet(path: Path, columns: Sequence[str], required: Callable[[Sequence[str]], bool] | None) -> pd.DataFrame:
    """The wanted columns of a Parquet file (all of them when it lacks what is required), through pyarrow with one
    block per column: pandas' own reader consolidates the columns into one block, a copy of the whole table."""
    import pyarrow.parquet as pq

    names = parquet_schema(path, "table").names
    wanted = [c for c in names if c in set(columns)] if required is None or required(names) else None
    return pq.read_table(path, columns=wanted).to_pandas(split_blocks=True, self_destruct=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# --- casting without loss -----------------------------------------------------------------------------------------
def _few(values: Iterable) -> str:
    vals = list(values)
    shown = ", ".join(repr(v.item() if isinstance(v, np.generic) else v) for v in vals[:_FEW])
    return shown + (", ..." if len(vals) > _FEW else "")


def cast_int(df: pd.DataFrame, column: str, dtype: str, what: str, origin: str) -> None:
    """Cast ``df[column]`` in place to an integer dtype, or raise if that would lose or invent a value."""
    s = df[column]
    if s.dtype == np.dtype(dtype):  # already the dtype: nothing to check, and no copy of a 10M-row column
        return
    if pd.api.types.is_integer_dtype(s) and not s.isna().any():
        info = np.iinfo(dtype)
        if len(s) and (s.min() < info.min or s.max() > info.max):
            bad = s[(s < info.min) | (s > info.max)]
            raise ForensicsError(f"{what} {origin}: column '{column}' has values outside {dtype}: {_few(bad)}")
        df[column] = s.astype(dtype)
        return
    if pd.api.types.is_bool_dtype(s):
        raise ForensicsError(f"{what} {origin}: column '{column}' holds booleans; expected integers")
    num = pd.to_numeric(s, errors="coerce")
    as_float = num.astype("float64")
    bad_mask = num.isna() | ~np.isfinite(as_float) | (num != np.round(num))
    if bad_mask.any():
        raise ForensicsError(
            f"{what} {origin}: column '{column}' must hold whole numbers ({dtype}); got {_few(s[bad_mask])}"
        )
    info = np.iinfo(dtype)
    out_of_range = (as_float < info.min) | (as_float >= -float(info.min))  # float(max) rounds up to 2**63
    if out_of_range.any():
        raise ForensicsError(f"{what} {origin}: column '{column}' has values outside {dtype}: {_few(s[out_of_range])}")
    df[column] = num.astype(dtype)


_SPECIAL = {
    "nan": math.nan,
    "inf": math.inf,
    "+inf": math.inf,
    "-inf": -math.inf,
    "infinity": math.inf,
    "+infinity": math.inf,
    "-infinity": -math.inf,
    "none": math.nan,
    "null": math.nan,
}


def parse_float_cells(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Cells as float64 and a mask of the cells that hold text that is not a number (NaN/inf spelt as text, e.g.
    ``'nan'``, ``'Infinity'``, are numbers; an empty or null cell is neither: NaN with the mask False)."""
    num = pd.to_numeric(s, errors="coerce").astype("float64")
    lost = (num.isna() & s.notna()).to_numpy()
    values = num.to_numpy(dtype=np.float64, na_value=np.nan).copy()
    if lost.any():
        text = s[lost].astype(str).str.strip().str.lower()
        mapped = text.map(_SPECIAL).to_numpy(dtype=np.float64, na_value=np.nan)
        values[lost] = mapped
        named_nan = text.isin(["nan", "none", "null", ""]).to_numpy()
        still = np.isnan(mapped) & ~named_nan
        bad = np.zeros(len(s), dtype=bool)
        bad[np.flatnonzero(lost)[still]] = True
        return values, bad
    return values, np.zeros(len(s), dtype=bool)


def cast_float(df: pd.DataFrame, column: str, what: str, origin: str) -> None:
    """Cast a metric column to float64 in place; NaN/inf (also as text, e.g. 'nan', 'Infinity') are kept."""
    s = df[column]
    if pd.api.types.is_float_dtype(s) or pd.api.types.is_integer_dtype(s) or pd.api.types.is_bool_dtype(s):
        df[column] = s.astype("float64")
        return
    num = pd.to_numeric(s, errors="coerce")
    lost = num.isna() & s.notna()
    if lost.any():
        # pandas does not parse every spelling of non-finite values; accept the common ones explicitly.
        text = s[lost].astype(str).str.strip().str.lower()
        mapped = text.map(_SPECIAL)
        num = num.astype("float64")
        num[lost] = mapped
        still = mapped.isna() & ~text.isin(["nan", "none", "null"])
        if still.any():
            raise ForensicsError(f"{what} {origin}: column '{column}' must be numeric; got {_few(s[lost][still])}")
    df[column] = num.astype("float64")


def _require_columns(df: pd.DataFrame, columns: Sequence[str], what: str, origin: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ForensicsError(
            f"{what} {origin}: missing column {', '.join(repr(c) for c in missing)} (expected columns "
            f"{', '.join(repr(c) for c in columns)}); "
            f"it has {', '.join(repr(str(c)) for c in df.columns[:12]) or 'no columns'}"
        )


# --- metrics --------------------------------------------------------------------------------------------------------
#: The dtype of every metric column: Arrow float64, where null means "not written at this step" and NaN/inf mean
#: "logged as such". pandas' nullable ``Float64`` is not used: it turns NaN into NA on cast, losing the difference.
METRIC_DTYPE = pd.ArrowDtype(pa.float64())


@dataclass
class Rewind:
    """A resumed run logged steps again: from ``from_step`` on, ``rows_replaced`` earlier rows were overwritten.

    ``last_step``: the highest step logged before it; ``overlap``: per metric, ``(step, first value, resumed value)``
    for the first rewritten steps (the restart rule compares them against the metric's noise).
    """

    from_step: int
    rows_replaced: int
    source: str = ""
    last_step: int | None = None
    overlap: dict[str, list[tuple[int, float, float]]] = field(default_factory=dict)

    def describe(self) -> str:
        where = f" in {self.source}" if self.source else ""
        return f"rewind{where}: steps from {self.from_step} logged again, {self.rows_replaced} earlier rows replaced"


def metric_array(values: np.ndarray, written: np.ndarray | None = None) -> pd.api.extensions.ExtensionArray:
    """A metric column: the float64 ``values``, null where ``written`` is False (default: every cell written)."""
    values = np.asarray(values, dtype=np.float64)
    mask = None
    if written is not None:
        written = np.asarray(written, dtype=bool)
        mask = None if written.all() else ~written
    return pd.arrays.ArrowExtensionArray(pa.array(values, type=pa.float64(), mask=mask))


def metrics_table(steps: np.ndarray, columns: dict[str, tuple[np.ndarray, np.ndarray | None]]) -> pd.DataFrame:
    """The canonical metrics table from sorted unique ``steps`` and, per metric, ``(values, written)``."""
    data: dict[str, object] = {STEP: np.asarray(steps, dtype=np.int64)}
    for name, (values, written_mask) in columns.items():
        data[name] = metric_array(values, written_mask)
    return pd.DataFrame(data)


def written(metrics: pd.DataFrame, column: str) -> np.ndarray:
    """Rows where ``column`` was written: a value, inf or a logged NaN (null cells were never written)."""
    return (
        ~metrics[column].isna().to_numpy(dtype=bool)
        if isinstance(metrics[column].dtype, pd.ArrowDtype)
        else np.ones(len(metrics), dtype=bool)
    )


def metric_values(metrics: pd.DataFrame, column: str) -> np.ndarray:
    """A metric column as float64 numpy, NaN where not written (use :func:`written` to tell the two apart)."""
    return metrics[column].to_numpy(dtype=np.float64, na_value=np.nan)


def as_metrics(df: pd.DataFrame, origin: str = "(table)") -> pd.DataFrame:
    """A metrics table handed over as a DataFrame, in canonical form (validated once, here).

    ``step`` must hold unique whole numbers (sorted here). Metric columns become :data:`METRIC_DTYPE`: Arrow columns
    keep their nulls; a null of pandas' nullable dtypes, ``None`` or ``pd.NA`` becomes null (not written); a NaN in
    a plain float column is a logged NaN, since numpy has no null.
    """
    _require_columns(df, [STEP], "metrics", origin)
    if _canonical(df):  # what the readers hand out: nothing to cast or sort, and no copy of every column
        return df.copy(deep=False)
    out = df.copy()
    cast_int(out, STEP, "int64", "metrics", origin)
    dup = out[STEP][out[STEP].duplicated()]
    if len(dup):
        raise ForensicsError(f"metrics {origin}: column 'step' must be unique; repeated: {_few(dup.unique())}")
    out = out.sort_values(STEP, kind="stable").reset_index(drop=True)
    for col in out.columns:
        if col == STEP or (isinstance(out[col].dtype, pd.ArrowDtype) and out[col].dtype == METRIC_DTYPE):
            continue
        s = out[col]
        if pd.api.types.is_float_dtype(s.dtype) and not pd.api.types.is_extension_array_dtype(s.dtype):
            out[col] = metric_array(s.to_numpy())
            continue
        missing = s.isna().to_numpy(dtype=bool)
        frame = pd.DataFrame({col: s})
        cast_float(frame, col, "metrics", origin)
        out[col] = metric_array(frame[col].to_numpy(dtype=np.float64, na_value=np.nan), ~missing)
    return out


def _canonical(df: pd.DataFrame) -> bool:
    """Already canonical: ``step`` int64 strictly increasing (so unique and sorted), every other column
    :data:`METRIC_DTYPE`, a default index."""
    if df.columns.duplicated().any():
        return False
    steps = df[STEP]
    if steps.dtype != np.int64 or not isinstance(df.index, pd.RangeIndex) or df.index.start != 0 or df.index.step != 1:
        return False
    if not all(
        c == STEP or (isinstance(df[c].dtype, pd.ArrowDtype) and df[c].dtype == METRIC_DTYPE) for c in df.columns
    ):
        return False
    values = steps.to_numpy()
    return len(values) < 2 or bool((values[1:] > values[:-1]).all())


def write_metrics(metrics: pd.DataFrame, path: str | Path) -> Path:
    """Write the metrics table to Parquet; null (not written) and NaN (logged) stay apart in the file."""
    import pyarrow.parquet as pq

    path = Path(path)
    table = pa.Table.from_pandas(as_metrics(metrics, str(path)), preserve_index=False)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
    except OSError as exc:
        raise ForensicsError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


def metric_columns(metrics: pd.DataFrame) -> list[str]:
    """The metric columns of a metrics table (everything but ``step`` and ``_timestamp``)."""
    return [c for c in metrics.columns if c not in (STEP, TIMESTAMP)]


# --- samples --------------------------------------------------------------------------------------------------------
def validate_samples(df: pd.DataFrame, origin: str = "(table)") -> pd.DataFrame:
    """Return the samples table with canonical dtypes; raise on a missing column, a bad type or a duplicate id."""
    what = "samples"
    _require_columns(df, [SAMPLE_ID, N_TOKENS], what, origin)
    df = df.copy()
    cast_int(df, SAMPLE_ID, "int64", what, origin)
    cast_int(df, N_TOKENS, "int32", what, origin)
    dup = df[SAMPLE_ID][df[SAMPLE_ID].duplicated()]
    if len(dup):
        raise ForensicsError(f"{what} {origin}: column 'sample_id' must be unique; repeated: {_few(dup.unique())}")
    neg = df[N_TOKENS][df[N_TOKENS] < 0]
    if len(neg):
        raise ForensicsError(f"{what} {origin}: column 'n_tokens' must be >= 0; got {_few(neg)}")
    if CLUSTER in df.columns:
        cast_int(df, CLUSTER, "int64", what, origin)
    for col in (TEXT, SOURCE):
        if col in df.columns:
            df[col] = df[col].astype("string").fillna("").astype(object)
    return df.reset_index(drop=True)


# --- plan -----------------------------------------------------------------------------------------------------------
def validate_plan(df: pd.DataFrame, origin: str = "(table)", samples: pd.DataFrame | None = None) -> pd.DataFrame:
    """Return the plan with canonical dtypes; raise on a missing column, a bad type or a sample not in samples.

    A plan names its batches either by ``step`` (with optional ``micro``/``rank``) or by (``epoch``, ``batch_id``);
    the second form is mapped to steps by :mod:`forensics.plan.step_mapping`.
    """
    what = "plan"
    _require_columns(df, [SAMPLE_ID], what, origin)
    if STEP not in df.columns and not {EPOCH, BATCH_ID} <= set(df.columns):
        raise ForensicsError(
            f"{what} {origin}: needs a 'step' column or both 'epoch' and 'batch_id' (the columns expected of a plan); "
            f"it has {', '.join(map(str, df.columns[:12]))}"
        )
    df = df.copy(deep=False)  # copy-on-write: the caller's frame is never modified, and no column is copied
    for col in PLAN_INT_COLUMNS:
        if col in df.columns:
            cast_int(df, col, "int64", what, origin)
    for col in (STEP, EPOCH, BATCH_ID, MICRO, RANK):
        if col in df.columns and len(df) and df[col].min() < 0:
            raise ForensicsError(f"{what} {origin}: column '{col}' must be >= 0; got {_few(df[col][df[col] < 0])}")
    if samples is not None:
        known = pd.Index(samples[SAMPLE_ID])
        unknown = df[SAMPLE_ID][~df[SAMPLE_ID].isin(known)]
        if len(unknown):
            raise ForensicsError(
                f"{what} {origin}: {unknown.nunique()} sample_id values are not in the samples table, "
                f"e.g. {_few(unknown.unique())}"
            )
    return df.reset_index(drop=True)


def alignment_warnings(metric_steps: np.ndarray, plan_steps: np.ndarray) -> list[str]:
    """Warnings (never errors) for a plan and metrics that do not cover the same steps, as live runs do."""
    m = np.unique(np.asarray(metric_steps, dtype=np.int64))
    p = np.unique(np.asarray(plan_steps, dtype=np.int64))
    out = []
    if len(p) and len(m):
        no_metrics = np.setdiff1d(p, m, assume_unique=True)
        if len(no_metrics):
            ahead = no_metrics[no_metrics > m.max()]
            gaps = len(no_metrics) - len(ahead)
            if len(ahead):
                out.append(
                    f"the plan runs {len(ahead)} steps ahead of the metrics (steps {ahead[0]}-{ahead[-1]} "
                    "have no metrics row yet)"
                )
            if gaps:
                out.append(f"{gaps} plan steps inside the logged range have no metrics row")
        past = m[m > p.max()]
        if len(past):
            out.append(
                f"{len(past)} metrics rows are past the plan's last step {p.max()} "
                f"(steps {past[0]}-{past[-1]} have no batch)"
            )
    return out


def check_output(path: str | Path | None, suffixes: Sequence[str], what: str) -> None:
    """An output path must end in one of the suffixes the command writes (a typo like ``-o t.csv`` for a Parquet
    table, or ``--json report.html``, is bad input, named with the suffixes that are written)."""
    if path is None:
        return
    suffix = Path(path).suffix.lower()
    if suffix not in suffixes:
        raise ForensicsError(
            f"{what} {path}: this command writes {' or '.join(suffixes)} there; got {suffix or 'no suffix'}"
        )
