"""Metrics from the W&B public API: every history row of one run, incrementally, through the real ``wandb`` client.

Sources: ``wandb://entity/project/run_id``, a run URL (``https://wandb.ai/entity/project/runs/run_id``) or a bare
``entity/project/run_id``. The server is the one the client is configured for (``WANDB_BASE_URL`` or
``wandb login --host``); the key comes from ``WANDB_API_KEY`` or ``wandb login``, never from a prompt.

How rows are fetched (wandb 0.31): ``Run.scan_history`` pages by step range, so each page of ``page_size`` steps asks
for ``page_size`` samples and nothing is sampled away. The client reads the run's parquet history export first
(``RunParquetHistory``, then ranged GETs of the parquet files) and pages the steps past it (``HistoryPage``). Scans
run without ``keys`` and the shared reader keeps the chosen keys: a keyed scan returns only the rows that hold *every*
key, cannot reach nested keys inside the export, and costs one scan per key. Full rows carry NaN and inf through
both paths; a server sending them as text (``"NaN"``, ``"Infinity"``) is read the same.

Incremental: a later :meth:`read_new` asks only for steps past the last one it has (``min_step``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from forensics.errors import ForensicsError, require
from forensics.sources.reader.base import MetricsReader
from forensics.sources.reader.records import Records
from forensics.sources.wandb.record_log import KEPT_INTERNAL, WANDB_STEP, flatten_numeric, is_internal, rows_table

#: Seconds the client waits for one GraphQL answer: a dead host or network fails in seconds, not minutes.
DEFAULT_TIMEOUT = 10
#: Steps per history page (the client's default; one GraphQL request each past the parquet export).
DEFAULT_PAGE_SIZE = 1000
#: Text spellings of non-finite numbers a server may send where JSON has no literal for them.
_NONFINITE_TEXT = {
    "nan": math.nan,
    "infinity": math.inf,
    "+infinity": math.inf,
    "-infinity": -math.inf,
    "inf": math.inf,
    "+inf": math.inf,
    "-inf": -math.inf,
}

_URL = re.compile(r"^(?:https?://)?(?P<host>[^/]+)/(?P<entity>[^/]+)/(?P<project>[^/]+)/runs/(?P<run>[^/?#]+)")


@dataclass(frozen=True)
class RunPath:
    """``entity/project/run_id`` of one W&B run."""

    entity: str
    project: str
    run_id: str

    def __str__(self) -> str:
        return f"{self.entity}/{self.project}/{self.run_id}"


def parse_run_path(source: str) -> RunPath:
    """``wandb://e/p/id``, ``https://wandb.ai/e/p/runs/id[/...][?...]`` or ``e/p/id`` -> :class:`RunPath`."""
    s = str(source).strip()
    if s.startswith("wandb://"):
        parts = s[len("wandb://") :].strip("/").split("/")
        if len(parts) == 3 and all(parts):
            return RunPath(*parts)
    elif (m := _URL.match(s)) is not None and ("." in m["host"] or ":" in m["host"]):
        return RunPath(m["entity"], m["project"], m["run"])
    else:
        parts = s.strip("/").split("/")
        if len(parts) == 3 and all(parts):
            return RunPath(*parts)
    raise ForensicsError(
        f"W&B run {source!r} is not a run path; expected wandb://entity/project/run_id, "
        "https://wandb.ai/entity/project/runs/run_id or entity/project/run_id"
    )


class WandbApiReader(MetricsReader):
    """History rows of one W&B run from the public API; each :meth:`read_new` fetches only steps past the last.

    ``timeout``: seconds per API request. ``page_size``: steps per history page. ``progress``: a rich progress
    bar on stderr while pages arrive. ``report.metadata`` holds ``run_id``, ``entity``, ``project``, ``name``,
    ``state``, ``config``, ``summary``, ``last_step`` and ``url`` (the server asked).
    """

    format_name = "wandb-api"
    _where_word = "step"

    def __init__(
        self,
        source: str,
        *,
        keys: Sequence[str] | None = None,
        step_key: str | None = None,
        strict: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        page_size: int = DEFAULT_PAGE_SIZE,
        progress: bool = True,
    ) -> None:
        self.run_path = parse_run_path(str(source))
        if page_size < 1 or timeout <= 0:
            raise ForensicsError(f"W&B API reader: page_size must be >= 1 and timeout > 0; got {page_size}, {timeout}")
        self.timeout = timeout
        self.page_size = page_size
        self.progress = progress
        self._api: Any = None
        super().__init__(str(source), keys=keys, step_key=step_key or WANDB_STEP, strict=strict)

    # --- MetricsReader hooks --------------------------------------------------------------------------------------
    def _reset_position(self) -> None:
        self._next_step = 0
        self._run: Any = None
        self._dropped_values: dict[str, int] = {}

    def _read_records(self) -> Records | None:
        run = self._load_run()
        last_step = _last_step(run)
        by_step = self._scan(run, self._next_step, last_step) if last_step >= self._next_step else {}
        order = sorted(by_step)
        rows = [self._row(by_step[s]) for s in order]
        self._publish(run, last_step)
        if not rows:
            return None
        # Past the last step received, not the server's lastStep: a row the server had not served yet comes next time.
        self._next_step = order[-1] + 1
        return Records(rows_table(rows), np.asarray(order, dtype=np.int64))

    # --- the client -----------------------------------------------------------------------------------------------
    def _load_run(self) -> Any:
        """The run, re-read on every call so that ``historyKeys.lastStep`` (and the summary) are current."""
        wandb = require("wandb", "wandb", "Reading runs from the W&B API")
        with self._errors():
            if self._api is None:
                self._api = wandb.Api(timeout=int(math.ceil(self.timeout)), api_key=_api_key(self._base_url()))
            if self._run is None:
                self._run = self._api.run(str(self.run_path))
            else:
                self._run.load(force=True)
            return self._run

    def _scan(self, run: Any, min_step: int, last_step: int) -> dict[int, dict[str, Any]]:
        """Every history row from ``min_step`` to ``last_step`` (inclusive), by step.

        wandb-core 0.31 yields some rows twice where a page straddles the end of the parquet export (the export's
        rows, then the same steps again from ``HistoryPage``); W&B keeps one row per step, so the later copy wins.
        """
        from rich.console import Console  # the bar is imported by the read that shows it, not by the package
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        total = last_step + 1 - min_step
        columns = (
            TextColumn("[bold]W&B[/] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps"),
            TimeRemainingColumn(),
        )
        by_step: dict[int, dict[str, Any]] = {}
        with (
            Progress(*columns, console=Console(stderr=True), transient=True, disable=not self.progress) as bar,
            self._errors(),
        ):
            task = bar.add_task(str(self.run_path), total=total)
            scan = run.scan_history(
                keys=None, page_size=self.page_size, min_step=min_step, max_step=last_step + 1, use_cache=False
            )
            for raw in scan:
                step = _whole(raw.get(WANDB_STEP))
                if step is None:
                    self._malformed(min_step + len(by_step), f"history row without a whole-number {WANDB_STEP}")
                    continue
                by_step[step] = raw
                bar.update(task, completed=min(total, step - min_step + 1))
        return by_step

    def _row(self, raw: dict[str, Any]) -> dict[str, float]:
        row: dict[str, float] = {}
        for key, value in raw.items():
            if is_internal(key) and key not in KEPT_INTERNAL:
                continue
            if isinstance(value, str) and value.strip().lower() in _NONFINITE_TEXT:
                value = _NONFINITE_TEXT[value.strip().lower()]
            if flatten_numeric(key, value, row):
                self._dropped_values[key] = self._dropped_values.get(key, 0) + 1
        if self.step_key != WANDB_STEP:
            row.pop(WANDB_STEP, None)  # another key is the step: W&B's own counter is not a metric
        return row

    def _base_url(self) -> str:
        """The server ``wandb.Api()`` will ask: ``WANDB_BASE_URL``, else the configured one (as the client decides)."""
        require("wandb", "wandb", "Reading runs from the W&B API")
        from wandb import env
        from wandb.sdk import wandb_setup

        return env.get_base_url(wandb_setup.singleton().settings.base_url).rstrip("/")

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """The client's exceptions -> one :class:`ForensicsError` line (unknown run, bad key, no network)."""
        try:
            yield
        except ForensicsError:
            raise
        except Exception as exc:
            if not isinstance(exc, _client_errors()):
                raise  # a bug, not bad input: keep its traceback
            raise ForensicsError(_explain(exc, self.run_path, self._safe_base_url())) from exc

    def _safe_base_url(self) -> str:
        try:
            return self._base_url()
        except Exception:  # noqa: BLE001 - only for the message
            return "the W&B server"

    def _publish(self, run: Any, last_step: int) -> None:
        attrs = getattr(run, "_attrs", {}) or {}
        self.report.metadata = {
            "run_id": self.run_path.run_id,
            "entity": self.run_path.entity,
            "project": self.run_path.project,
            "name": attrs.get("displayName"),
            "state": attrs.get("state"),
            "config": dict(getattr(run, "config", {}) or {}),
            "summary": {k: v for k, v in (attrs.get("summaryMetrics") or {}).items() if not is_internal(k)},
            "last_step": last_step,
            "url": self._safe_base_url(),
        }
        if self._dropped_values:
            most = sorted(self._dropped_values.items(), key=lambda kv: -kv[1])[:5]
            shown = ", ".join(f"'{k}' ({n})" for k, n in most)
            self.report.warnings = [w for w in self.report.warnings if "non-numeric history values" not in w]
            self.report.warn(
                f"{sum(self._dropped_values.values())} non-numeric history values dropped (text, media, lists): {shown}"
            )


def _client_errors() -> tuple[type[BaseException], ...]:
    """What the ``wandb`` client raises for a failed request, an unknown run or missing credentials."""
    import wandb.errors
    from wandb.apis.public.runs import RunNotFoundError
    from wandb.sdk.lib.service.service_connection import WandbApiFailedError

    return (wandb.errors.Error, WandbApiFailedError, RunNotFoundError, OSError, TimeoutError)


def _whole(value: Any) -> int | None:
    """A step value as an int, or None when it is missing or not a whole number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value == int(value)):
        return None
    return int(value)


def _last_step(run: Any) -> int:
    """The run's last logged step (-1 before the first), from the ``historyKeys`` the run query returned."""
    keys = (getattr(run, "_attrs", {}) or {}).get("historyKeys") or {}
    if isinstance(keys, str):
        keys = json.loads(keys)
    try:
        return int(keys.get("lastStep", -1))
    except (TypeError, ValueError):
        return -1


def _api_key(base_url: str) -> str | None:
    """The configured key for ``base_url`` without ever prompting; a missing key is bad input (exit 2)."""
    try:
        from wandb.sdk.lib.wbauth import authenticate

        auth = authenticate.authenticate_session(host=base_url, source="forensics", prompt=False, update_session=False)
    except ImportError:  # pragma: no cover - a wandb other than the pinned one: let the client find the key
        return None
    if auth is None:
        raise ForensicsError(
            f"no W&B API key for {base_url}: set WANDB_API_KEY or run `wandb login` (reading W&B runs needs one)"
        )
    return getattr(auth, "api_key", None)


def _explain(exc: BaseException, run_path: RunPath, base_url: str) -> str:
    """One sentence for a client failure, naming the run and the server."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    low = text.lower()
    if "could not find run" in low or ("not found" in low and "run" in low):
        return f"W&B run {run_path} was not found on {base_url} (check the entity, project and run id)"
    if "api key" in low and ("no " in low or "configured" in low):
        return f"no W&B API key for {base_url}: set WANDB_API_KEY or run `wandb login`"
    network = (
        "did not respond",
        "connection refused",
        "connect:",
        "no such host",
        "timeout",
        "timed out",
        "unreachable",
        "dial tcp",
        "network",
    )
    if any(s in low for s in network):
        return f"could not reach W&B at {base_url} ({text[:160]})"
    refused = ("invalid credentials", "verify credentials", "not logged in", "401", "unauthorized", "permission")
    if any(s in low for s in refused):
        return f"W&B at {base_url} rejected the API key for run {run_path} ({text[:160]})"
    return f"W&B API request for run {run_path} on {base_url} failed: {text[:200]}"
