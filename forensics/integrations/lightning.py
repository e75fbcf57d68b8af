"""PyTorch Lightning: ``PlanRecorderCallback(case_dir)`` records the plan as consumed, the samples and run.toml.

Usage::

    from forensics.integrations.lightning import PlanRecorderCallback
    trainer = pl.Trainer(..., callbacks=[PlanRecorderCallback("runs/my-run")])
    trainer.fit(model, datamodule)       # then: forensics audit runs/my-run

**Requirement: the batch carries its sample ids.** ``on_train_batch_start`` receives the batch exactly as
``training_step`` will (after Lightning's prefetch and the transfer to the device), so the ids are read from the
batch itself: a dict field (``id_key``, default ``"sample_id"``: have the dataset return it and the collator keep
it) or, for tuple batches, the position ``id_key`` (an int). A sampler wrapper instead would record batches when
the loader draws them, which Lightning's prefetching puts one batch ahead of the step consuming them.

**Steps.** ``trainer.global_step`` at the start of a batch is the number of optimizer updates done, i.e. the
0-based plan step of docs/concepts.md that this batch belongs to; with ``accumulate_grad_batches`` G each update
consumes G batches, recorded as ``micro`` 0..G-1 (a partial group at an epoch's end is its own step, as Lightning
steps the optimizer there). ``epoch`` is ``trainer.current_epoch``; ``batch_id`` is Lightning's ``batch_idx`` (the
batch's index in its
epoch, restored on resume, so that replayed batches are recognised and skipped by
:class:`~forensics.plan.recorder.PlanRecorder`); ``rank`` is ``trainer.global_rank`` under several processes,
each writing its own parts. A fresh fit (starting at step 0) into a folder that already holds a plan is refused.
A fit resumed from a checkpoint continues the same parts, and the last consumption of a step wins: the steps it
trains again replace the crashed process's rows for them, and the rewind is appended to ``plan/rewinds.json``
(:mod:`forensics.plan.rewinds`) without a sampler position (Lightning restores ``batch_idx``, not the loader's).

**Files** (rank 0) in ``case_dir``: ``plan/`` (Parquet parts), ``samples.parquet`` when the train dataset's rows
are dicts with ``input_ids`` (same columns as :mod:`forensics.integrations.hf`; otherwise a warning, and the
case then needs a samples table from elsewhere), and ``run.toml`` with ``metrics`` (each logger's files: the
CSVLogger's ``metrics.csv``, the TensorBoardLogger's folder, the WandbLogger's run folder), ``plan``, ``samples``,
``step_convention = "lightning"``, ``grad_accum``, ``world_size`` and ``checkpoints`` (the checkpoint callback's
folder). Lightning logs ``self.log(..., on_step=True)`` values at the count of updates done *before* the
one that logs (the CSVLogger's ``step`` is 0 for update 0), so its logs are 0-based already: the ``"lightning"``
convention has step offset 0.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from forensics.errors import ForensicsError
from forensics.integrations import _case
from forensics.plan.recorder import PlanRecorder, recorded_parts
from forensics.plan.rewinds import rewind_plan

CONVENTION = "lightning"
_WHO = "forensics.integrations.lightning.PlanRecorderCallback"


def _base_callback() -> type:
    """Lightning's ``Callback`` (``lightning.pytorch`` or the ``pytorch_lightning`` package), imported on use."""
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        from pytorch_lightning.callbacks import Callback
    return Callback


class _PlanRecorderCallback:
    """The callback's behaviour; :func:`PlanRecorderCallback` combines it with Lightning's ``Callback``."""

    def __init__(
        self,
        case_dir: str | os.PathLike,
        *,
        id_key: str | int = "sample_id",
        flush_every: int = 256,
        write_samples: bool = True,
    ) -> None:
        self.case_dir = Path(case_dir)
        self.plan_dir = self.case_dir / _case.PLAN_DIR
        self.id_key = id_key
        self.flush_every = int(flush_every)
        self.write_samples = write_samples
        self.recorder: PlanRecorder | None = None
        self.resumed = False
        #: The rewind of the plan this fit made when it resumed (:func:`forensics.plan.rewinds.rewind_plan`), if any.
        self.rewind: dict[str, Any] | None = None
        self._last_step: int | None = None
        self._micro = 0
        self._earlier_sources: list[str] = []

    # --- Lightning hooks -----------------------------------------------------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero:
            self.case_dir.mkdir(parents=True, exist_ok=True)
            self._earlier_sources = _case.read_previous_metrics(self.case_dir / _case.RUN_TOML)
            fresh = trainer.global_step == 0 or not (self.case_dir / _case.SAMPLES_FILE).exists()
            if self.write_samples and fresh:
                self._write_samples(trainer)
            self._write_run_toml(trainer)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        if self.recorder is None:
            self._open(trainer, step)
        if step == self._last_step:
            self._micro += 1
        else:
            self._last_step, self._micro = step, 0
        ids = _ids_of(batch, self.id_key)
        self.recorder.record(
            ids, epoch=int(trainer.current_epoch), batch_id=int(batch_idx), step=step, micro=self._micro
        )

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        if self.recorder is not None:
            self.recorder.flush()  # a resume from this checkpoint finds the plan up to it

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.recorder is not None:
            self.recorder.close()
        if trainer.is_global_zero:
            self._write_run_toml(trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.recorder is not None:
            self.recorder.flush()

    # --- the files -----------------------------------------------------------------------------------------------
    def _open(self, trainer: Any, first_step: int) -> None:
        world = int(getattr(trainer, "world_size", 1) or 1)
        rank = int(trainer.global_rank) if world > 1 else None
        self.resumed = first_step > 0
        if not self.resumed and recorded_parts(self.plan_dir, rank):
            raise ForensicsError(
                f"{_WHO}: {self.plan_dir} already holds the plan of an earlier run and this fit starts at step 0; "
                "remove that folder or record into another case_dir (a fit resumed from a checkpoint continues it)"
            )
        if self.resumed:
            # the last consumption of a step wins: the crashed process's rows from the resumed step on are replaced
            # (Lightning restores batch_idx but not, in general, the loader's position: no sampler position is
            # claimed)
            self.rewind = rewind_plan(self.plan_dir, rank, first_step, write_record=bool(trainer.is_global_zero))
        self.recorder = PlanRecorder(self.plan_dir, rank=rank, flush_every=self.flush_every, resume=True)

    def _write_samples(self, trainer: Any) -> None:
        loader = getattr(trainer, "train_dataloader", None)
        dataset = getattr(loader, "dataset", None)
        try:
            n = _case.check_map_style(dataset, _WHO)
            ids = _case.sample_ids_of(dataset, n, _WHO)
            table = _case.samples_table(dataset, ids, None, _WHO)
        except ForensicsError as exc:
            warnings.warn(f"{exc}; samples.parquet was not written", RuntimeWarning, stacklevel=2)
            return
        _case.write_samples(table, self.case_dir / _case.SAMPLES_FILE)

    def _write_run_toml(self, trainer: Any) -> None:
        values = {
            "metrics": _case.unique(self._earlier_sources + self._logger_sources(trainer)),
            "plan": _case.PLAN_DIR,
            "samples": _case.SAMPLES_FILE if (self.case_dir / _case.SAMPLES_FILE).exists() else None,
            "step_convention": CONVENTION,
            "grad_accum": int(getattr(trainer, "accumulate_grad_batches", 1) or 1),
            "world_size": int(getattr(trainer, "world_size", 1) or 1),
            "checkpoints": self._checkpoint_dir(trainer),
        }
        header = "Written by forensics.integrations.lightning.PlanRecorderCallback: the case folder of a Lightning fit."
        _case.write_run_toml(self.case_dir / _case.RUN_TOML, values, header)

    def _logger_sources(self, trainer: Any) -> list[str]:
        out = []
        for logger in getattr(trainer, "loggers", []) or []:
            kind = type(logger).__name__
            log_dir = getattr(logger, "log_dir", None)
            if kind == "CSVLogger" and log_dir and (Path(log_dir) / "metrics.csv").exists():
                out.append(_case.relative(Path(log_dir) / "metrics.csv", self.case_dir))
            elif kind == "TensorBoardLogger" and log_dir and Path(log_dir).is_dir():
                out.append(_case.relative(Path(log_dir), self.case_dir))
            elif kind == "WandbLogger":
                files = getattr(getattr(logger, "experiment", None), "dir", None)
                if files and Path(files).parent.exists():
                    out.append(_case.relative(Path(files).parent, self.case_dir))
        return out

    def _checkpoint_dir(self, trainer: Any) -> str | None:
        cb = getattr(trainer, "checkpoint_callback", None)
        d = getattr(cb, "dirpath", None)
        return _case.relative(Path(d), self.case_dir) if d else None


def _ids_of(batch: Any, id_key: str | int) -> np.ndarray:
    """The sample ids a batch carries (a dict field or a tuple position), as int64."""
    if isinstance(id_key, str):
        if not isinstance(batch, Mapping) or id_key not in batch:
            keys = ", ".join(map(str, list(batch)[:8])) if isinstance(batch, Mapping) else type(batch).__name__
            raise ForensicsError(
                f"{_WHO}: the batch has no '{id_key}' field (it has {keys}); have the dataset "
                "return each row's sample id under that key, or pass id_key="
            )
        value = batch[id_key]
    else:
        if not isinstance(batch, Sequence) or isinstance(batch, (str, bytes)) or id_key >= len(batch):
            raise ForensicsError(f"{_WHO}: the batch is not a tuple with a position {id_key} holding sample ids")
        value = batch[id_key]
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    ids = np.asarray(value)
    if ids.dtype.kind == "f" and not np.all(np.mod(ids, 1) == 0) or ids.dtype.kind not in "iuf":
        raise ForensicsError(f"{_WHO}: the batch's sample ids must be whole numbers; got dtype {ids.dtype}")
    return ids.astype(np.int64).reshape(-1)


_CLASS: type | None = None


def PlanRecorderCallback(
    case_dir: str | os.PathLike, *, id_key: str | int = "sample_id", flush_every: int = 256, write_samples: bool = True
) -> Any:
    """A Lightning ``Callback`` recording the plan as consumed into ``case_dir/plan/``, plus ``samples.parquet``
    and ``run.toml`` (see the module docstring). ``id_key``: where the batch carries its sample ids.
    ``flush_every``: batches per plan part (parts are also written at each checkpoint and at the end)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = type(
            "PlanRecorderCallback",
            (_PlanRecorderCallback, _base_callback()),
            {"__doc__": _PlanRecorderCallback.__doc__, "__module__": __name__},
        )
    return _CLASS(case_dir, id_key=id_key, flush_every=flush_every, write_samples=write_samples)
