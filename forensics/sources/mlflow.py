"""Metrics of one MLflow run, through MLflow's own client (the ``[mlflow]`` extra).

Sources:

- ``mlflow:RUN_ID`` (or ``mlflow://RUN_ID``): the run on the tracking server or store that ``tracking_uri`` names,
  else ``MLFLOW_TRACKING_URI`` (a server, ``sqlite:///mlflow.db``, ``file:///.../mlruns``);
- a local ``mlruns/`` folder (a file store) holding one run, or one run's own folder ``mlruns/EXPERIMENT/RUN_ID``.

Every metric's whole history is read (``get_metric_history``: each value with its step and timestamp). The values
are handed to the shared reader in the order they were written (timestamp, then step), so a resumed run that logged
steps again into the same MLflow run is a rewind as in every other source, and the later values win. MLflow's
``step`` is the logged step (it counts as the trainer logged it). A local file store is read with
``MLFLOW_ALLOW_FILE_STORE`` set: MLflow 3 refuses to open one otherwise, and reading it writes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from forensics.errors import ForensicsError, require
from forensics.sources.reader.base import MetricsReader
from forensics.sources.reader.records import Records

#: The source prefixes of a run id.
PREFIXES = ("mlflow://", "mlflow:")
#: The step column the records carry.
MLFLOW_STEP = "step"


def is_mlflow_source(source: str | Path) -> bool:
    """``mlflow:RUN_ID``, or a local MLflow file store: an ``mlruns/`` folder or one run's folder in it."""
    s = str(source)
    if s.startswith(PREFIXES):
        return True
    p = Path(s)
    return p.is_dir() and (_is_run_folder(p) or bool(_store_runs(p)))


def _is_run_folder(p: Path) -> bool:
    return (p / "meta.yaml").is_file() and (p / "metrics").is_dir()


def _store_runs(root: Path) -> list[Path]:
    """The run folders of a file store (``EXPERIMENT/RUN_ID``, the trash left out)."""
    if not root.is_dir():
        return []
    return sorted(
        r
        for e in root.iterdir()
        if e.is_dir() and e.name != ".trash" and (e / "meta.yaml").is_file()
        for r in e.iterdir()
        if r.is_dir() and _is_run_folder(r)
    )


def resolve(source: str, tracking_uri: str | None) -> tuple[str, str]:
    """``(tracking_uri, run_id)`` of a source (module docstring); bad input names what was expected."""
    s = str(source)
    for prefix in PREFIXES:
        if s.startswith(prefix):
            run_id = s[len(prefix) :].strip("/")
            uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
            if not run_id:
                raise ForensicsError(f"MLflow source {s!r} names no run; expected mlflow:RUN_ID")
            if not uri:
                raise ForensicsError(
                    f"MLflow source {s!r}: no tracking URI; set MLFLOW_TRACKING_URI or give "
                    "--mlflow-uri (a server, sqlite:///mlflow.db or a mlruns/ folder)"
                )
            if "://" not in uri and ":" not in uri.split("/")[0]:
                uri = Path(uri).resolve().as_uri()  # a plain folder is a file store
            return uri, run_id
    p = Path(s).resolve()
    if _is_run_folder(p):
        return p.parent.parent.as_uri(), p.name
    runs = _store_runs(p)
    if len(runs) == 1:
        return p.as_uri(), runs[0].name
    if not runs:
        raise ForensicsError(f"MLflow folder {s} holds no run (expected mlruns/EXPERIMENT/RUN_ID/meta.yaml)")
    names = ", ".join(f"{r.parent.name}/{r.name}" for r in runs[:6]) + (" ..." if len(runs) > 6 else "")
    raise ForensicsError(
        f"MLflow folder {s} holds {len(runs)} runs ({names}); give one run's folder "
        f"({s}/EXPERIMENT/RUN_ID) or mlflow:RUN_ID with --mlflow-uri {s}"
    )


class MlflowReader(MetricsReader):
    """Every metric of one MLflow run; a later :meth:`read_new` hands over only the values logged since.

    ``tracking_uri``: where the run lives (a ``mlflow:RUN_ID`` source), default ``MLFLOW_TRACKING_URI``.
    ``report.metadata`` holds ``run_id``, ``experiment_id``, ``name``, ``status`` and ``tracking_uri``.
    """

    format_name = "mlflow"
    _where_word = "value"

    def __init__(
        self,
        source: str | Path,
        *,
        keys: Sequence[str] | None = None,
        step_key: str | None = None,
        strict: bool = False,
        tracking_uri: str | None = None,
    ) -> None:
        self.tracking_uri, self.run_id = resolve(str(source), tracking_uri)
        self._client: Any = None
        super().__init__(str(source), keys=keys, step_key=step_key or MLFLOW_STEP, strict=strict)

    def _reset_position(self) -> None:
        self._seen: dict[str, int] = {}

    def _open(self) -> Any:
        if self._client is None:
            require("mlflow", "mlflow", "Reading MLflow runs")
            if self.tracking_uri.startswith("file:"):
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def _read_records(self) -> Records | None:
        client = self._open()
        from mlflow.exceptions import MlflowException

        try:
            run = client.get_run(self.run_id)
            entries = []
            for k, key in enumerate(sorted(run.data.metrics)):
                history = client.get_metric_history(self.run_id, key)
                new = history[self._seen.get(key, 0) :]
                self._seen[key] = len(history)
                entries += [(int(m.timestamp), k, i, int(m.step), key, float(m.value)) for i, m in enumerate(new)]
        except MlflowException as exc:
            raise ForensicsError(f"MLflow run {self.run_id} at {self.tracking_uri}: {exc.message}") from exc
        self.report.metadata = {
            "run_id": self.run_id,
            "experiment_id": run.info.experiment_id,
            "name": run.info.run_name,
            "status": run.info.status,
            "tracking_uri": self.tracking_uri,
        }
        if not entries:
            return None
        # write order: a value joins the row before it when it is the same step and a key that row lacks
        rows: list[dict[str, float]] = []
        for _, _, _, step, key, value in sorted(entries, key=lambda e: (e[0], e[3], e[1], e[2])):
            if rows and rows[-1][MLFLOW_STEP] == step and key not in rows[-1]:
                rows[-1][key] = value
            else:
                rows.append({MLFLOW_STEP: step, key: value})
        from forensics.sources.wandb.record_log import rows_table

        return Records(rows_table(rows), np.arange(len(rows), dtype=np.int64))
