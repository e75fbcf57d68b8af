"""The run configuration: one frozen object, resolved once from ``run.toml`` and the overrides, used by every stage.

Precedence, lowest first: the defaults of docs/concepts.md, the case's ``run.toml``, ``--set KEY=VALUE`` (repeatable;
dotted keys reach the ``[detect.<rule>]`` tables: ``--set detect.spikes.z=5``), then a command's own flags. Every
value is checked here, once, and an error names the key and where the value came from (:class:`ConfigError`); only
the CLI turns a key into the flag that set it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from forensics.errors import ForensicsError
from forensics.schema.tables import MAX_BATCH_SIZE, MAX_LEN, RANK_SPLITS, TOKEN_BUDGET, _first_line

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

#: Buckets fitted to the samples when no boundaries are named (docs/concepts.md, ``buckets``).
DEFAULT_N_BUCKETS = 6
OPTIMAL = "optimal"


class ConfigError(ForensicsError):
    """A configuration value that is not allowed: ``key`` names it, ``origin`` says where it came from
    (``run.toml`` path, ``--set``, or ``option`` for a command's own flag, which the CLI names)."""

    def __init__(self, key: str, problem: str, origin: str) -> None:
        self.key, self.problem, self.origin = key, problem, origin
        super().__init__(f"{origin}: '{key}' {problem}")


@dataclass(frozen=True)
class SourceSpec:
    """One metrics source: a path (relative to the case folder) or a W&B run, and how its steps count.

    ``step_offset`` None means: the convention the source states about itself, else the run's ``step_offset``, else 0.
    ``rank``: the rank whose own log the source is (run.toml ``ranks``): its metrics become ``NAME/rank{rank}``, one
    rank of the metrics table's rank dimension; None for a source of the whole run.
    """

    path: str
    step_key: str | None = None
    step_offset: int | None = None
    rank: int | None = None


@dataclass(frozen=True)
class RunConfig:
    """The settings of one run (every key of ``run.toml`` optional; docs/concepts.md, ``case folder``).

    ``boundaries`` None means fitted to the samples (``optimal``, ``n_buckets`` buckets); ``clusters`` None means k
    chosen from the texts; ``detect`` holds the per-rule parameter tables (``{"spikes": {"z": 6.0}}``), checked by
    the detect stage against each rule's documented parameters.
    """

    root: Path | None = None
    metrics: tuple[SourceSpec, ...] = ()
    #: Per-rank metrics sources (run.toml ``ranks``): entry i is rank i's own log unless it names its ``rank``.
    ranks: tuple[SourceSpec, ...] = ()
    plan: str | None = None
    samples: str | None = None
    grad_accum: int = 1
    world_size: int = 1
    rank_split: str = "round_robin"
    step_offset: int | None = None
    step_key: str | None = None
    #: The step convention a recorder saw (``hf-trainer``, ...): informational; each source's own evidence decides.
    step_convention: str | None = None
    logging_steps: int | None = None
    loss_key: str | None = None
    boundaries: tuple[int, ...] | None = None
    n_buckets: int = DEFAULT_N_BUCKETS
    token_budget: int = TOKEN_BUDGET
    max_len: int = MAX_LEN
    max_batch_size: int = MAX_BATCH_SIZE
    #: Documents packed into fixed-length sequences without padding (nanoGPT, Megatron): padding is 0, and the
    #: steps' tags speak of sources and clusters.
    packed: bool = False
    clusters: int | None = None
    cluster_by: str | None = None
    model: str | None = None
    checkpoints: str | None = None
    #: How the run padded and averaged (replay rebuilds its batches the same way): pad token id and side, and the
    #: loss denominator (``labels``: every non-pad label, as HF's Trainer; ``predicted``: the shifted targets).
    pad_id: int | None = None
    pad_side: str | None = None
    loss_denominator: str | None = None
    #: The trainer's gradient clipping threshold (HF's ``max_grad_norm``, which ``record()`` writes): the share of
    #: steps above it is the clipped share of the grad-norm findings.
    max_grad_norm: float | None = None
    #: The accelerator's memory in GB: when a growing memory metric reaches it (the memory finding).
    device_memory_gb: float | None = None
    #: Text logs read for crash lines beside the metrics sources (paths; ``slurm-*.out`` / ``*.err`` in the case
    #: folder are read too).
    logs: tuple[str, ...] = ()
    eval_loss_key: str | None = None
    #: Where the plan computations run: ``auto`` (pandas while the plan fits a quarter of ``memory_limit``, else
    #: DuckDB), ``pandas``, ``duckdb`` or ``dask``; ``memory_limit`` (``"4GB"``) and the Dask ``scheduler`` address.
    engine: str = "auto"
    memory_limit: str | None = None
    scheduler: str | None = None
    #: The ``[replay]`` table: ``auto`` (replay the top causes after every audit), ``budget`` (seconds), ``max_causes``,
    #: ``device``, ``mode`` (eval | train), ``seeds``, and ``metrics``: the source(s) holding the loss logged by the
    #: run that wrote the checkpoints, when it is not the case's own (the demo's stand-in model).
    replay: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    detect: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}))
    #: Where each key not left at its default came from (run.toml's path, ``--set`` or ``option``): so a command can
    #: say when it used a default, or when a flag had no effect.
    given: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), compare=False)

    def resolve(self, path: str | None) -> Path | None:
        """A path of this configuration, relative ones against the case folder."""
        if path is None:
            return None
        p = Path(path).expanduser()
        return p if p.is_absolute() or self.root is None else self.root / p

    def rule_params(self, rule: str) -> dict[str, Any]:
        """The ``[detect.<rule>]`` table (empty when none)."""
        return dict(self.detect.get(rule, {}))

    def to_toml_dict(self) -> dict[str, Any]:
        """The keys a ``run.toml`` would hold for this configuration (defaults left out)."""
        out: dict[str, Any] = {}
        default = RunConfig()
        for f in fields(self):
            if f.name in ("root", "detect", "given"):
                continue
            v = getattr(self, f.name)
            if v == getattr(default, f.name) and f.name not in ("grad_accum", "world_size"):
                continue
            if f.name == "replay":
                v = dict(v)
            if f.name in ("metrics", "ranks"):
                v = [
                    s.path
                    if s.step_key is None and s.step_offset is None and s.rank is None
                    else {
                        k: x
                        for k, x in (
                            ("path", s.path),
                            ("step_key", s.step_key),
                            ("step_offset", s.step_offset),
                            ("rank", s.rank),
                        )
                        if x is not None
                    }
                    for s in v
                ]
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        if self.detect:
            out["detect"] = {k: dict(v) for k, v in self.detect.items()}
        return out


_FIELDS = {f.name for f in fields(RunConfig)} - {"root", "given"}
_POSITIVE = ("grad_accum", "world_size", "token_budget", "max_len", "max_batch_size", "n_buckets")
_OPTIONAL_POSITIVE = ("logging_steps", "clusters")
_STRINGS = (
    "plan",
    "samples",
    "step_key",
    "step_convention",
    "loss_key",
    "cluster_by",
    "model",
    "checkpoints",
    "eval_loss_key",
    "scheduler",
)
_CHOICES = {
    "pad_side": ("left", "right"),
    "loss_denominator": ("labels", "predicted"),
    "engine": ("auto", "pandas", "duckdb", "dask"),
}
_POSITIVE_REALS = ("max_grad_norm", "device_memory_gb")
#: The ``[replay]`` table's keys and their types.
REPLAY_KEYS = {
    "auto": bool,
    "budget": (int, float),
    "max_causes": int,
    "device": str,
    "mode": str,
    "seeds": int,
    "metrics": (str, list),
}


# --- checks --------------------------------------------------------------------------------------------------------
def check_boundaries(values: Sequence, origin: str = "boundaries") -> list[int]:
    """Bucket boundaries ``[0, b1, ..., max_len]``: whole numbers, strictly increasing, starting at 0."""
    try:
        b = [int(v) for v in values]
    except (TypeError, ValueError) as exc:
        raise ForensicsError(f"{origin}: boundaries must be whole numbers; got {list(values)!r}") from exc
    if any(float(v) != x for v, x in zip(values, b)):
        raise ForensicsError(f"{origin}: boundaries must be whole numbers; got {list(values)!r}")
    if len(b) < 2 or b[0] != 0 or any(x >= y for x, y in zip(b, b[1:])):
        raise ForensicsError(f"{origin}: boundaries must start at 0 and strictly increase, at least 2 values; got {b}")
    return b


def parse_boundaries(text: str) -> list[int] | str:
    """``"0,770,8192"`` -> ``[0, 770, 8192]`` (the CLI's comma-separated form); ``"optimal"`` stays as is."""
    if text.strip() == OPTIMAL:
        return OPTIMAL
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise ForensicsError(
            f"--boundaries: expected comma-separated whole numbers like 0,770,8192 or 'optimal'; got {text!r}"
        ) from exc
    return check_boundaries(values, "--boundaries")


def _check(key: str, value: Any, origin: str) -> Any:
    """One key's value, checked and in canonical form (tuples for lists); raise :class:`ConfigError`."""
    if key in _POSITIVE or key in _OPTIONAL_POSITIVE:
        if value is None and key in _OPTIONAL_POSITIVE:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(key, f"must be a positive integer; got {value!r}", origin)
        return value
    if key == "step_offset":
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(key, f"must be an integer; got {value!r}", origin)
        return value
    if key in _POSITIVE_REALS:
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            raise ConfigError(key, f"must be a positive number; got {value!r}", origin)
        return None if value is None else float(value)
    if key == "memory_limit":
        if value is not None and not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(key, f'must be a size such as "4GB" or a number of bytes; got {value!r}', origin)
        return None if value is None else str(value)
    if key == "logs":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) for x in items):
            raise ConfigError(key, f"must be a path or a list of paths; got {value!r}", origin)
        return tuple(items)
    if key == "replay":
        if not isinstance(value, Mapping):
            raise ConfigError(key, "must be a table, e.g. [replay] auto = true", origin)
        for k, v in value.items():
            if k not in REPLAY_KEYS:
                raise ConfigError(f"replay.{k}", f"is not a key of [replay] (known: {', '.join(REPLAY_KEYS)})", origin)
            kinds = REPLAY_KEYS[k]
            if isinstance(v, bool) and kinds is not bool or not isinstance(v, kinds):
                raise ConfigError(f"replay.{k}", f"has the wrong type; got {v!r}", origin)
        return MappingProxyType(dict(value))
    if key == "packed":
        if not isinstance(value, bool):
            raise ConfigError(key, f"must be true or false; got {value!r}", origin)
        return value
    if key == "pad_id":
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ConfigError(key, f"must be a token id (a whole number >= 0); got {value!r}", origin)
        return value
    if key in _CHOICES:
        if value is not None and value not in _CHOICES[key]:
            raise ConfigError(key, f"must be one of {', '.join(_CHOICES[key])}; got {value!r}", origin)
        return value
    if key == "rank_split":
        if value not in RANK_SPLITS:
            raise ConfigError(key, f"must be one of {', '.join(RANK_SPLITS)}; got {value!r}", origin)
        return value
    if key in _STRINGS:
        if value is not None and not isinstance(value, str):
            raise ConfigError(key, f"must be a string; got {value!r}", origin)
        return value
    if key == "boundaries":
        if value is None or value == OPTIMAL:
            return None
        if isinstance(value, str):
            value = parse_boundaries(value)
            return None if value == OPTIMAL else tuple(value)
        try:
            return tuple(check_boundaries(value, origin))
        except ForensicsError as exc:
            raise ConfigError(key, str(exc).split(": ", 1)[-1], origin) from exc
    if key == "metrics":
        items = [value] if isinstance(value, (str, Mapping, SourceSpec)) else value
        if not isinstance(items, (list, tuple)):
            raise ConfigError(key, f"must be a path or a list of paths (or tables with a path); got {value!r}", origin)
        return tuple(_source(x, origin) for x in items)
    if key == "ranks":
        return check_ranks(value, origin)
    if key == "detect":
        if not isinstance(value, Mapping) or not all(isinstance(v, Mapping) for v in value.values()):
            raise ConfigError(key, "must hold one table per rule, e.g. [detect.spikes] z = 6", origin)
        return MappingProxyType({str(k): MappingProxyType(dict(v)) for k, v in value.items()})
    raise ConfigError(key, "is not a known key", origin)  # pragma: no cover - callers filter unknown keys


def _source(item: Any, origin: str) -> SourceSpec:
    if isinstance(item, SourceSpec):
        return item
    if isinstance(item, (str, Path)):
        return SourceSpec(str(item))
    if isinstance(item, Mapping) and isinstance(item.get("path"), str):
        unknown = set(item) - {"path", "step_key", "step_offset"}
        if unknown:
            raise ConfigError("metrics", f"entries take path, step_key and step_offset; got {sorted(unknown)}", origin)
        offset = item.get("step_offset")
        if offset is not None and (not isinstance(offset, int) or isinstance(offset, bool)):
            raise ConfigError("metrics", f"step_offset of {item['path']} must be an integer; got {offset!r}", origin)
        return SourceSpec(item["path"], item.get("step_key"), offset)
    raise ConfigError("metrics", f"must be a path or a list of paths (or tables with a path); got {item!r}", origin)


_RANKS_SHAPE = (
    'must list each rank\'s own metrics source, rank 0 first: ["rank0.jsonl", "rank1.jsonl"] (or tables with a path '
    'and its rank: [{path = "r3.jsonl", rank = 3}])'
)


def check_ranks(value: Any, origin: str) -> tuple[SourceSpec, ...]:
    """run.toml ``ranks``: entry i is rank i's source, unless a table names its ``rank``; every rank once, at least
    two ranks (one rank is the run itself: name it in ``metrics``)."""
    if not isinstance(value, (list, tuple)) or len(value) < 2:
        raise ConfigError("ranks", f"{_RANKS_SHAPE}; got {value!r}", origin)
    out = []
    for i, item in enumerate(value):
        rank = i
        if isinstance(item, Mapping):
            rank = item.get("rank", i)
            if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
                raise ConfigError(
                    "ranks", f"rank of {item.get('path')!r} must be a whole number >= 0; got {rank!r}", origin
                )
            unknown = set(item) - {"path", "step_key", "step_offset", "rank"}
            if unknown:
                raise ConfigError(
                    "ranks", f"entries take path, step_key, step_offset and rank; got {sorted(unknown)}", origin
                )
            item = {k: v for k, v in item.items() if k != "rank"}
        elif not isinstance(item, (str, Path)):
            raise ConfigError("ranks", f"{_RANKS_SHAPE}; got {item!r}", origin)
        try:
            spec = _source(item, origin)
        except ConfigError as exc:
            raise ConfigError("ranks", exc.problem, origin) from exc
        out.append(replace(spec, rank=rank))
    seen = [s.rank for s in out]
    twice = sorted({r for r in seen if seen.count(r) > 1})
    if twice:
        raise ConfigError(
            "ranks", f"names rank {', '.join(map(str, twice))} more than once; expected each rank once", origin
        )
    return tuple(out)


# --- reading run.toml and the overrides ------------------------------------------------------------------------------
def read_run_toml(path: str | Path) -> dict[str, Any]:
    """The raw tables of a ``run.toml``.

    An empty file is bad input, not a run without settings: a case without settings has no run.toml at all, and an
    empty one is what an interrupted write leaves (every path it named would silently fall back to discovery)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        if not text.strip():
            raise ForensicsError(
                f"run.toml {path} is empty; expected the run's settings in TOML (or no run.toml at all)"
            )
        return tomllib.loads(text)
    except FileNotFoundError as exc:
        raise ForensicsError(f"run.toml {path} does not exist") from exc
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ForensicsError(
            f"run.toml {path} could not be read: {_first_line(exc)}; expected a UTF-8 TOML file of the run's settings"
        ) from exc


def parse_set(items: Sequence[str]) -> dict[str, Any]:
    """``["grad_accum=2", "detect.spikes.z=5"]`` -> ``{"grad_accum": 2, "detect": {"spikes": {"z": 5}}}``.

    Values are read as TOML (``5``, ``1.5``, ``true``, ``[0, 770, 8192]``, ``"text"``); a bare word is a string.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ForensicsError(f"--set: expected KEY=VALUE (e.g. grad_accum=2 or detect.spikes.z=5); got {item!r}")
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = text.strip()
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ForensicsError(f"--set: {key!r} sets a key inside {part!r}, which is not a table")
        node[parts[-1]] = value
    return out


def resolve_config(
    root: str | Path | None = None,
    *,
    toml: Mapping[str, Any] | None = None,
    sets: Sequence[str] = (),
    overrides: Mapping[str, Any] | None = None,
    toml_origin: str = "run.toml",
) -> tuple[RunConfig, list[str]]:
    """The run configuration from a case folder's ``run.toml`` (or ``toml``), ``--set`` items and flag values.

    ``overrides`` hold a command's flags by key (None = not given). Returns the configuration and warnings
    (unknown keys: a typo should not pass silently, so they are named and left out).
    """
    warnings: list[str] = []
    values: dict[str, tuple[Any, str]] = {}
    root_path = Path(root) if root is not None else None
    if toml is None and root_path is not None and (root_path / "run.toml").is_file():
        toml_origin = str(root_path / "run.toml")
        toml = read_run_toml(root_path / "run.toml")
    for layer, origin in (
        (toml or {}, toml_origin),
        (parse_set(sets), "--set"),
        ({k: v for k, v in (overrides or {}).items() if v is not None}, "option"),
    ):
        for key, value in layer.items():
            if key not in _FIELDS:
                if origin == "option":
                    raise ConfigError(key, "is not a known key", origin)
                warnings.append(f"{origin}: unknown key '{key}' ignored")
                continue
            if key == "replay" and "replay" in values:  # the [replay] table merges key by key
                value = {**dict(values["replay"][0]), **dict(value or {})}
            if key == "detect" and "detect" in values:  # rule tables merge key by key
                merged = {r: dict(p) for r, p in values["detect"][0].items()}
                for rule, params in (value or {}).items():
                    merged.setdefault(rule, {}).update(params if isinstance(params, Mapping) else {})
                value = merged
            values[key] = (_check(key, value, origin), origin)
    cfg = RunConfig(
        root=root_path,
        given=MappingProxyType({k: o for k, (_, o) in values.items()}),
        **{k: v for k, (v, _) in values.items()},
    )
    return cfg, warnings


def with_overrides(cfg: RunConfig, **changes: Any) -> RunConfig:
    """A copy of ``cfg`` with some keys changed (checked like a command's flags)."""
    checked = {k: _check(k, v, "option") for k, v in changes.items() if v is not None}
    return replace(cfg, given=MappingProxyType({**cfg.given, **dict.fromkeys(checked, "option")}), **checked)


def write_run_toml(
    cfg: RunConfig | Mapping[str, Any], path: str | Path, extra: Mapping[str, Any] | None = None, header: str = ""
) -> Path:
    """Write ``run.toml`` (plain TOML by hand: flat scalars and lists, tables such as ``[replay]``, and the
    ``[detect.<rule>]`` tables), only the
    keys given (None left out: the defaults apply), atomically (a crash never leaves half a file)."""
    import os

    data = dict(cfg.to_toml_dict() if isinstance(cfg, RunConfig) else cfg)
    data.update(extra or {})
    detect = data.pop("detect", None) or {}
    tables = {k: data.pop(k) for k in [k for k, v in data.items() if isinstance(v, Mapping)]}
    lines = [f"# {line}" for line in header.splitlines()]
    lines += [f"{k} = {_toml_value(v)}" for k, v in data.items() if v is not None]
    for name, table in tables.items():  # [replay] and other tables of scalars
        lines.append(f"\n[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in table.items() if v is not None]
    for rule, params in detect.items():
        lines.append(f"\n[detect.{rule}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in params.items()]
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"cannot write {v} to run.toml")
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (str, Path)):
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def load_run_toml(path: str | Path) -> tuple[RunConfig, list[str]]:
    """The configuration of one ``run.toml`` file (its folder is the case folder)."""
    path = Path(path)
    return resolve_config(path.parent, toml=read_run_toml(path), toml_origin=str(path))
