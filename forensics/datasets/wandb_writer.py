"""Write a metrics table as a real W&B offline run, with the ``wandb`` package, without touching the user's setup.

The run goes to ``<case>/wandb/offline-run-*/`` exactly as ``wandb.init(dir=case, mode="offline")`` writes it during
training, so the W&B readers are tested against the real format. ``_timestamp`` is logged with each row so that the
run's timestamps are the simulated ones. While writing, the ``WANDB_*`` variables point W&B's config, cache and data
folders at a temporary folder (nothing is written to the home folder) and keep it offline and silent; the previous
environment is restored afterwards.

W&B's client costs ~0.1 ms of Python per logged row (a socket round to its ``wandb-core`` process), so a full demo's
~120,000 rows dominate its build time; :func:`write_wandb_runs` writes several runs in parallel processes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError
from forensics.schema import STEP, TIMESTAMP

PROJECT = "forensics-demo"


def wandb_available() -> bool:
    """Whether the ``wandb`` package can be imported (the demo skips its W&B run otherwise)."""
    return importlib.util.find_spec("wandb") is not None


@contextlib.contextmanager
def isolated_wandb_env(run_dir: Path) -> Iterator[None]:
    """Offline, silent W&B whose config/cache/data folders are temporary; the environment is restored after."""
    keys = (
        "WANDB_MODE",
        "WANDB_SILENT",
        "WANDB_DIR",
        "WANDB_CONFIG_DIR",
        "WANDB_CACHE_DIR",
        "WANDB_DATA_DIR",
        "WANDB_ARTIFACT_DIR",
        "WANDB_CONSOLE",
        "WANDB_DISABLE_CODE",
        "WANDB_DISABLE_GIT",
        "WANDB_API_KEY",
    )
    saved = {k: os.environ.get(k) for k in keys}
    with tempfile.TemporaryDirectory(prefix="forensics-wandb-") as tmp:
        os.environ.update(
            {
                "WANDB_MODE": "offline",
                "WANDB_SILENT": "true",
                "WANDB_DIR": str(run_dir),
                "WANDB_CONFIG_DIR": os.path.join(tmp, "config"),
                "WANDB_CACHE_DIR": os.path.join(tmp, "cache"),
                "WANDB_DATA_DIR": os.path.join(tmp, "data"),
                "WANDB_ARTIFACT_DIR": os.path.join(tmp, "artifacts"),
                "WANDB_CONSOLE": "off",
                "WANDB_DISABLE_CODE": "true",
                "WANDB_DISABLE_GIT": "true",
            }
        )
        os.environ.pop("WANDB_API_KEY", None)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def write_wandb_run(
    case_dir: str | Path,
    metrics: pd.DataFrame,
    config: dict[str, Any],
    name: str,
    on_row: Callable[[int], None] | None = None,
) -> Path:
    """Log every row of ``metrics`` (``step`` plus metric columns, optional ``_timestamp``) to an offline run.

    Returns the run folder (``<case_dir>/wandb/offline-run-*``). ``on_row(n)`` is called every few thousand rows
    with the number logged so far (for a progress bar).
    """
    import wandb

    case_dir = Path(case_dir).resolve()
    case_dir.mkdir(parents=True, exist_ok=True)
    columns = [c for c in metrics.columns if c != STEP]
    steps = metrics[STEP].to_numpy(np.int64).tolist()
    values = {c: metrics[c].to_numpy(np.float64).tolist() for c in columns}
    settings = wandb.Settings(
        console="off",
        silent=True,
        x_disable_stats=True,
        x_disable_meta=True,
        x_disable_machine_info=True,
        disable_git=True,
        save_code=False,
        x_save_requirements=False,
        disable_job_creation=True,
    )
    # A W&B service this process already runs (the user's own runs, or an earlier writer's) is theirs: kept, not
    # torn down with ours.
    had_service = "WANDB_SERVICE" in os.environ
    with isolated_wandb_env(case_dir):
        run = wandb.init(
            dir=str(case_dir),
            mode="offline",
            project=PROJECT,
            name=name,
            config=config,
            settings=settings,
            reinit="create_new",
        )
        try:
            for i, step in enumerate(steps):
                row = {c: values[c][i] for c in columns}
                if TIMESTAMP in row:
                    row[TIMESTAMP] = float(row[TIMESTAMP])
                run.log(row, step=step)
                if on_row is not None and (i + 1) % 5000 == 0:
                    on_row(i + 1)
            folder = Path(run.dir).parent
        finally:
            run.finish()
        if not had_service:
            wandb.teardown()
    wait_until_written(folder)
    if on_row is not None:
        on_row(len(steps))
    return folder


def wait_until_written(folder: Path, timeout_s: float = 60.0) -> None:
    """Return once the run's ``.wandb`` file ends with its exit record. ``run.finish()`` can return while a W&B
    service that another run of this process started is still writing the file (seen on a busy machine: a reader
    then found 105 of 120 rows); a writer of fixtures must hand over a whole run."""
    import time

    from forensics.sources.wandb.run_reader import WandbRunReader

    deadline = time.monotonic() + timeout_s
    while True:
        reader = WandbRunReader(folder)
        try:
            reader.read_all()
            if reader.report.metadata.get("finished"):
                return
        except ForensicsError:  # a file still being written may not read yet: read it again
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"W&B run {folder}: no exit record {timeout_s:.0f} s after run.finish()")
        time.sleep(0.2)


@dataclass
class WandbJob:
    """One run to write: where, what, with which config and name."""

    case_dir: Path
    metrics: pd.DataFrame
    config: dict[str, Any] = field(default_factory=dict)
    name: str = "run"


def _write_job(job: WandbJob) -> Path:
    return write_wandb_run(job.case_dir, job.metrics, job.config, job.name)


def write_wandb_runs(
    jobs: Sequence[WandbJob], processes: int = 1, on_done: Callable[[int, int], None] | None = None
) -> list[Path]:
    """Write several runs; with ``processes > 1`` in that many fresh (spawned) processes at once.

    Returns the run folders in the order of ``jobs``; ``on_done(finished, total)`` is called as runs finish.
    """
    total = len(jobs)
    if processes <= 1 or total <= 1:
        out = []
        for i, job in enumerate(jobs):
            out.append(write_wandb_run(job.case_dir, job.metrics, job.config, job.name))
            if on_done is not None:
                on_done(i + 1, total)
        return out
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads (rich, W&B)
    with ProcessPoolExecutor(max_workers=min(processes, total), mp_context=ctx) as pool:
        futures = [pool.submit(_write_job, job) for job in jobs]
        done = 0
        for fut in futures:
            fut.result()
            done += 1
            if on_done is not None:
                on_done(done, total)
        return [f.result() for f in futures]
