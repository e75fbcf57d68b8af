"""Hugging Face ``Trainer``: ``record(trainer)`` before ``trainer.train()`` writes the run's case folder.

Usage::

    from forensics.integrations.hf import record
    record(trainer)              # case folder = trainer.args.output_dir
    trainer.train()              # or trainer.train(resume_from_checkpoint=True)
    # then: forensics audit OUTPUT_DIR

**Why this hook.** A ``TrainerCallback`` never sees the batch, and a sampler wrapper records batches when the
dataloader *draws* them, which is up to its prefetch depth ahead of the step that consumes them (and it also sees
the batches that ``skip_first_batches`` drops on resume, and every rank's batches before accelerate shards them).
So the sample ids travel *with the data*: each row the train dataset returns carries its index under
:data:`SAMPLE_ID_KEY`, the collator turns those into one id tensor beside the batch's tensors, and the Trainer's
``training_step`` (wrapped on this trainer instance) takes the tensor out before the model sees the batch. What is
recorded is therefore exactly the batch ``training_step``/``compute_loss`` receives, at the optimizer step it is
consumed in (``state.global_step`` before the update: the 0-based plan step of docs/concepts.md), whatever happens in
between: prefetching workers, ``get_batch_samples`` fetching all micro-batches of a step ahead,
``skip_first_batches`` on resume, accelerate moving tensors to the device or sharding batches across processes
(``dispatch_batches`` splits the id tensor along with the rows). ``training_step`` is the public method the
Trainer documents for overriding and calls once per micro-batch in 4.x and 5.x alike; ``get_batch_samples``
(5.x) sees a whole step's micro-batches at once but does not exist in older 4.x releases.

What ``record`` changes on the trainer, and nothing else: ``train_dataset`` becomes a thin view that adds the row
index to each row; ``data_collator`` is wrapped (rows without the index, e.g. evaluation rows, pass through
unchanged); the id field is added to the columns kept by ``remove_unused_columns`` (the Trainer's
``_signature_columns``, the one private attribute used: present since 4.2x); ``training_step`` is wrapped, and
``get_train_dataloader`` only to read the dataloader's length; a callback flushes the plan at every checkpoint
and at the end of training.

**What it writes** into ``case_dir`` (default ``trainer.args.output_dir``):

- ``samples.parquet`` at once (rank 0): ``sample_id`` (the dataset's ``sample_id`` column, else the row index),
  ``n_tokens`` (the attention mask's ones, else the length of ``input_ids``), ``input_ids`` (unpadded),
  ``text`` (a ``text`` column, else the tokens decoded by the trainer's tokenizer when it has one), ``source``
  (when the dataset has that column).
- ``plan/``: Parquet parts of :class:`~forensics.plan.recorder.PlanRecorder`, one row per sample consumed:
  ``step`` (0-based optimizer step), ``micro`` (index of the micro-batch within the step under gradient
  accumulation), ``epoch`` and ``batch_id`` (the micro-batch's index in its epoch; both from the step and the
  length of the train dataloader the Trainer builds), ``sample_id``, and ``rank`` (the process index) when there are
  several processes, each writing its own parts.
  A run resumed from a checkpoint continues the same parts, and the last consumption of a step wins: the steps it
  trains again (a crash after step N, a resume from checkpoint r <= N) replace the crashed process's rows, and the
  rewind is appended to ``plan/rewinds.json`` with the loader position the Trainer resumed at
  (:mod:`forensics.plan.rewinds`). A fresh run (starting at step 0) into a folder that already
  holds a plan is refused at its first step, so that two runs never mix.
- ``trainer_state.json`` (rank 0, at each checkpoint and at the end; the file ``trainer.save_state()`` writes),
  so that the whole run's ``log_history`` is in one place.
- ``run.toml``: ``metrics`` (trainer_state.json, each TensorBoard run folder, each W&B run folder of this run and
  of the runs it resumed), ``plan``, ``samples``, ``step_convention = "hf-trainer"`` (HF logs ``global_step``
  after the update, from 1; the readers recognise it per source, see :mod:`forensics.sources.step_conventions`),
  ``logging_steps``, ``grad_accum``, ``world_size``, ``max_grad_norm``, ``model`` (the model's local config folder,
  written only when there is one: otherwise replay takes the architecture from the ``checkpoint-N/`` folders, which
  carry their config) and ``checkpoints`` (the output folder).

Checked with transformers 5.2x (CI: static and length-grouped samplers, gradient accumulation, resume, 2
torchrun processes, a ``datasets.Dataset`` with 2 prefetching workers) and by hand with 4.57.6 (``group_by_length``,
gradient accumulation 2, resume from a checkpoint: the plan equals what ``compute_loss`` received). The API used
(``training_step``, ``get_train_dataloader``, ``data_collator``, ``train_dataset``,
``_set_signature_columns_if_needed``, ``add_callback``, ``state.global_step``, ``args.process_index``/
``world_size``) has the same names in both; ``processing_class`` falls back to ``tokenizer`` and the TensorBoard
folder to ``args.logging_dir`` before 5.x.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np

from forensics.errors import ForensicsError
from forensics.integrations import _case
from forensics.plan.recorder import PlanRecorder, recorded_parts
from forensics.plan.rewinds import rewind_plan

#: The field that carries a row's index from the dataset to ``training_step`` (removed before the model sees it).
SAMPLE_ID_KEY = "forensics_sample_id"
#: The step convention written to run.toml (see :mod:`forensics.sources.step_conventions`).
CONVENTION = "hf-trainer"
_WHO = "forensics.integrations.hf.record"


class _IndexedView:
    """The train dataset, each row a dict with its index added under :data:`SAMPLE_ID_KEY`.

    Everything else (attributes such as ``column_names``, length) is the wrapped dataset's, so the Trainer's
    samplers (``group_by_length`` reads the rows' ``input_ids``) see the same rows.
    """

    def __init__(self, base: Any) -> None:
        self._base = base

    def __len__(self) -> int:
        return len(self._base)

    def __getitem__(self, index: int) -> dict:
        return _tagged(self._base[index], index)

    def __iter__(self) -> Any:
        # samplers that measure lengths by iterating the dataset (5.x's batch_rebalance) see the same rows
        return (self[i] for i in range(len(self)))

    def __getitems__(self, indices: list[int]) -> list[dict]:
        # The DataLoader's batched fetch (datasets.Dataset reads a batch of rows at once this way).
        get = getattr(self._base, "__getitems__", None)
        rows = get(list(indices)) if callable(get) else [self._base[i] for i in indices]
        return [_tagged(r, i) for r, i in zip(rows, indices)]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_base":
            raise AttributeError(name)
        return getattr(self._base, name)


def _tagged(row: Any, index: int) -> dict:
    if not isinstance(row, Mapping):
        raise ForensicsError(
            f"{_WHO}: a train dataset row is {type(row).__name__}, not a dict; recording the plan "
            "needs rows that are dicts"
        )
    out = dict(row)
    out[SAMPLE_ID_KEY] = int(index)
    return out


class _IdCollator:
    """Wrap the trainer's collator: take the row indices out of the rows, collate the rest as before, and put the
    indices back beside the batch's tensors as one int64 tensor. Rows without indices pass through untouched."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, features: list) -> Any:
        if not features or not isinstance(features[0], Mapping) or SAMPLE_ID_KEY not in features[0]:
            return self.inner(features)
        import torch

        ids = [int(f[SAMPLE_ID_KEY]) for f in features]
        batch = self.inner([{k: v for k, v in f.items() if k != SAMPLE_ID_KEY} for f in features])
        if not isinstance(batch, MutableMapping):
            raise ForensicsError(
                f"{_WHO}: the data collator returned {type(batch).__name__}, not a dict of "
                "tensors; recording the plan needs a dict batch (as Trainer collators return)"
            )
        batch[SAMPLE_ID_KEY] = torch.tensor(ids, dtype=torch.int64)
        return batch


class HFRecording:
    """What :func:`record` set up on one trainer: the plan recorder (opened at the first step) and the case files.

    ``plan_dir``, ``samples_path``, ``run_toml`` say where things go; :attr:`resumed` says whether the run started
    from a checkpoint. The trainer's callback calls :meth:`checkpoint` and :meth:`finish`; nothing else needs to.
    """

    def __init__(self, trainer: Any, case_dir: Path, ids: np.ndarray | None, flush_every: int) -> None:
        args = trainer.args
        self.trainer = trainer
        self.case_dir = case_dir
        self.plan_dir = case_dir / _case.PLAN_DIR
        self.samples_path = case_dir / _case.SAMPLES_FILE
        self.run_toml = case_dir / _case.RUN_TOML
        self.world_size = int(getattr(args, "world_size", 1) or 1)
        self.rank = int(getattr(args, "process_index", 0)) if self.world_size > 1 else None
        self.grad_accum = int(args.gradient_accumulation_steps)
        self.is_main = bool(trainer.is_world_process_zero())
        self.flush_every = flush_every
        self.recorder: PlanRecorder | None = None
        self.resumed = False
        #: The rewind of the plan this run made when it resumed (:func:`forensics.plan.rewinds.rewind_plan`), if any.
        self.rewind: dict[str, Any] | None = None
        #: len() of the train dataloader the Trainer built (micro-batches per epoch on this rank), when it has one.
        self.micro_batches_per_epoch: int | None = None
        self._ids = ids
        self._last_step: int | None = None
        self._micro = 0
        self._earlier_sources = _case.read_previous_metrics(self.run_toml)

    # --- per micro-batch -----------------------------------------------------------------------------------------
    def consumed(self, index_tensor: Any) -> None:
        """Record one micro-batch as ``training_step`` received it (called before the model sees it)."""
        state = self.trainer.state
        step = int(state.global_step)
        if self.recorder is None:
            self._open(step)
        if step == self._last_step:
            self._micro += 1
        else:
            self._last_step, self._micro = step, 0
        index = np.asarray(
            index_tensor.detach().cpu().numpy() if hasattr(index_tensor, "detach") else index_tensor, dtype=np.int64
        ).reshape(-1)
        sample_ids = self._ids[index] if self._ids is not None else index
        self.recorder.record(sample_ids, **self._position(step, state), step=step, micro=self._micro)

    def _position(self, step: int, state: Any) -> dict[str, int]:
        """``epoch`` and ``batch_id`` (the micro-batch's index in its epoch) of a micro-batch of update ``step``.

        Every epoch has the same U = ceil(micro-batches per epoch / G) updates (the Trainer's
        ``num_update_steps_per_epoch``; only the last may stop early at ``max_steps``), so epoch = step // U and
        the index in the epoch is (step mod U) * G + micro, also for a run resumed mid-epoch. Without a dataloader
        length: the floor of ``state.epoch`` (epoch + consumed fraction after each update) and the run-wide index.
        """
        if self.micro_batches_per_epoch:
            updates = max(-(-self.micro_batches_per_epoch // self.grad_accum), 1)
            return {"epoch": step // updates, "batch_id": (step % updates) * self.grad_accum + self._micro}
        return {"epoch": int(math.floor(state.epoch or 0.0)), "batch_id": step * self.grad_accum + self._micro}

    def _open(self, first_step: int) -> None:
        self.resumed = first_step > 0
        if not self.resumed and recorded_parts(self.plan_dir, self.rank):
            raise ForensicsError(
                f"{_WHO}: {self.plan_dir} already holds the plan of an earlier run and this run starts at step 0; "
                "remove that folder or record into another case_dir (a run resumed from a checkpoint continues it)"
            )
        if self.resumed:
            # the last consumption of a step wins: the crashed process's rows from here on are replaced
            self.rewind = rewind_plan(
                self.plan_dir,
                self.rank,
                first_step,
                sampler=self._resume_position(first_step),
                write_record=self.is_main,
            )
        self.recorder = PlanRecorder(self.plan_dir, rank=self.rank, flush_every=self.flush_every, resume=True)

    def _resume_position(self, step: int) -> dict[str, Any] | None:
        """Where the Trainer's loader resumed (``{epoch, batch_id, skipped_data}``): the epoch of ``step``, and the
        micro-batch it skipped to in that epoch, or 0 with ``ignore_data_skip`` (the loader starts its epoch again);
        None without the dataloader's length."""
        if not self.micro_batches_per_epoch:
            return None
        updates = max(-(-self.micro_batches_per_epoch // self.grad_accum), 1)
        skipped = not bool(getattr(self.trainer.args, "ignore_data_skip", False))
        return {
            "epoch": step // updates,
            "batch_id": (step % updates) * self.grad_accum if skipped else 0,
            "skipped_data": skipped,
        }

    # --- checkpoints and the end ---------------------------------------------------------------------------------
    def checkpoint(self, state: Any) -> None:
        """At each checkpoint: flush the plan (a resume from this checkpoint then finds it) and refresh the case
        files."""
        if self.recorder is not None:
            self.recorder.flush()
        self._write_case_files(state)

    def finish(self, state: Any) -> None:
        """At the end of training: close the plan and write the final case files."""
        if self.recorder is not None:
            self.recorder.close()
        self._write_case_files(state)

    def _write_case_files(self, state: Any) -> None:
        if not self.is_main:
            return
        if state is not None and getattr(state, "log_history", None) is not None:
            _save_state(state, self.case_dir / "trainer_state.json")
        self.write_run_toml(state)

    def write_run_toml(self, state: Any = None) -> None:
        """Write ``run.toml`` from the trainer's arguments and the sources present now."""
        args = self.trainer.args
        values = {
            "metrics": self.metrics_sources(),
            "plan": _case.PLAN_DIR,
            "samples": _case.SAMPLES_FILE,
            "step_convention": CONVENTION,
            "logging_steps": _logging_steps(args, state),
            "grad_accum": self.grad_accum,
            "world_size": self.world_size,
            "model": _case.relative(model, self.case_dir) if (model := _model_dir(self.trainer)) else None,
            "checkpoints": _case.relative(Path(args.output_dir), self.case_dir),
            "max_grad_norm": _max_grad_norm(args),
        }
        header = (
            "Written by forensics.integrations.hf.record: the case folder of a Hugging Face Trainer run.\n"
            "Metrics sources are aligned by their own step convention (HF counts global_step from 1)."
        )
        _case.write_run_toml(self.run_toml, values, header)

    def metrics_sources(self) -> list[str]:
        """trainer_state.json, the TensorBoard run folders and the W&B run folder(s), relative to the case folder
        when inside it; a resumed run keeps the sources of the runs before it (their TensorBoard/W&B folders)."""
        found: list[str] = []
        if (self.case_dir / "trainer_state.json").exists():
            found.append("trainer_state.json")
        found += self._earlier_sources
        for tb_root in _tensorboard_dirs(self.trainer):
            found += [_case.relative(d, self.case_dir) for d in _case.tensorboard_run_dirs(tb_root)]
        wandb_dir = _wandb_run_dir()
        if wandb_dir is not None:
            found.append(_case.relative(wandb_dir, self.case_dir))
        return _case.unique(found)


def record(trainer: Any, case_dir: str | os.PathLike | None = None, *, flush_every: int = 256) -> HFRecording:
    """Record the plan as consumed, ``samples.parquet`` and ``run.toml`` of ``trainer``'s next ``train()``.

    Call it once, before ``trainer.train()``, on every process (each rank records its own plan parts; rank 0
    writes the shared files). ``case_dir`` defaults to ``trainer.args.output_dir``. ``flush_every``: micro-batches
    per plan part (parts are also written at every checkpoint, so a resume finds the plan up to it). The train
    dataset must be map-style with dict rows holding ``input_ids`` (bad input otherwise, raised here). See the
    module docstring for the hook and the files.
    """
    if getattr(trainer, "_forensics_recording", None) is not None:
        raise ForensicsError(f"{_WHO}: this trainer is already being recorded (record() was called before)")
    args = trainer.args
    case = Path(case_dir if case_dir is not None else args.output_dir)
    dataset = trainer.train_dataset
    n = _case.check_map_style(dataset, _WHO)
    ids = _case.sample_ids_of(dataset, n, _WHO)
    recording = HFRecording(trainer, case, ids, flush_every)
    if recording.is_main:
        case.mkdir(parents=True, exist_ok=True)
        table = _case.samples_table(dataset, ids, _decoder(trainer), _WHO)
        _case.write_samples(table, recording.samples_path)
        recording.write_run_toml(None)

    trainer.train_dataset = _IndexedView(dataset)
    _keep_id_field(trainer)
    trainer.data_collator = _IdCollator(trainer.data_collator)
    original_step = trainer.training_step

    def training_step(model: Any, inputs: Any, *rest: Any, **kwargs: Any) -> Any:
        index = inputs.pop(SAMPLE_ID_KEY, None) if isinstance(inputs, MutableMapping) else None
        if index is None:
            raise ForensicsError(
                f"{_WHO}: a training batch carries no sample ids; the train dataloader must be built by the "
                "Trainer from trainer.train_dataset and trainer.data_collator (was get_train_dataloader overridden?)"
            )
        recording.consumed(index)
        return original_step(model, inputs, *rest, **kwargs)

    original_loader = trainer.get_train_dataloader

    def get_train_dataloader(*a: Any, **kw: Any) -> Any:
        loader = original_loader(*a, **kw)
        try:
            recording.micro_batches_per_epoch = len(loader) or None
        except TypeError:
            recording.micro_batches_per_epoch = None
        return loader

    trainer.training_step = training_step
    trainer.get_train_dataloader = get_train_dataloader
    trainer.add_callback(_callback_class()(recording))
    trainer._forensics_recording = recording
    return recording


# --- helpers -------------------------------------------------------------------------------------------------------
def _keep_id_field(trainer: Any) -> None:
    """Add the id field to the columns ``remove_unused_columns`` keeps (else it is stripped before collation)."""
    if not getattr(trainer.args, "remove_unused_columns", False):
        return
    ensure = getattr(trainer, "_set_signature_columns_if_needed", None)
    if not callable(ensure) or not hasattr(trainer, "_signature_columns"):
        raise ForensicsError(
            f"{_WHO}: this transformers version hides the columns remove_unused_columns keeps; "
            "pass remove_unused_columns=False in TrainingArguments"
        )
    ensure()
    if SAMPLE_ID_KEY not in trainer._signature_columns:
        trainer._signature_columns.append(SAMPLE_ID_KEY)


def _decoder(trainer: Any):
    """The trainer's tokenizer as a batch decoder (``processing_class`` in 5.x, ``tokenizer`` in 4.x)."""
    # 4.46+ has processing_class (reading the deprecated .tokenizer there warns); older 4.x only .tokenizer
    tok = trainer.processing_class if hasattr(trainer, "processing_class") else getattr(trainer, "tokenizer", None)
    decode = getattr(tok, "batch_decode", None)
    if not callable(decode):
        return None
    return lambda tokens: decode(tokens, skip_special_tokens=False)


def _logging_steps(args: Any, state: Any) -> int | None:
    """Steps each logged value covers: the resolved ``state.logging_steps`` once training started (a ratio below 1
    is resolved there), else ``args.logging_steps``; ``None`` unless the run logs every N steps."""
    strategy = getattr(args, "logging_strategy", "steps")
    if str(getattr(strategy, "value", strategy)) != "steps":
        return None
    for value in (getattr(state, "logging_steps", None), getattr(args, "logging_steps", None)):
        if isinstance(value, (int, float)) and value >= 1 and float(value).is_integer():
            return int(value)
    return None


def _model_dir(trainer: Any) -> Path | None:
    """The model's local config folder when it was loaded from one; None otherwise (a model built in code: replay
    takes the architecture from the run's own ``checkpoint-N/`` folders, which carry their config)."""
    config = getattr(getattr(trainer, "model", None), "config", None)
    name = getattr(config, "_name_or_path", "") or ""
    if name and (Path(name) / "config.json").exists():
        return Path(name)
    return None


def _max_grad_norm(args: Any) -> float | None:
    """The trainer's clipping threshold (``max_grad_norm``; 0 or None: no clipping, so nothing to write)."""
    value = getattr(args, "max_grad_norm", None)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _tensorboard_dirs(trainer: Any) -> list[Path]:
    """The TensorBoard folder(s) this run writes: the TensorBoardCallback's ``logging_dir`` (5.x, set when training
    begins), else ``args.logging_dir`` (4.x)."""
    out: list[Path] = []
    for cb in getattr(getattr(trainer, "callback_handler", None), "callbacks", []):
        if type(cb).__name__ == "TensorBoardCallback":
            d = getattr(cb, "logging_dir", None) or getattr(trainer.args, "logging_dir", None)
            if d:
                out.append(Path(d))
    return out


def _wandb_run_dir() -> Path | None:
    """The folder of this process's W&B run (``wandb/offline-run-...``), when wandb is in use."""
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None) if wandb is not None else None
    files = getattr(run, "dir", None) if run is not None else None
    if not files:
        return None
    folder = Path(files).parent
    return folder if folder.exists() else None


def _save_state(state: Any, path: Path) -> None:
    """Write the TrainerState as ``trainer.save_state()`` does, atomically (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    save = getattr(state, "save_to_json", None)
    if callable(save):
        save(str(tmp))
    else:
        tmp.write_text(json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


_CALLBACK: type | None = None


def _callback_class() -> type:
    """The TrainerCallback that flushes the plan at checkpoints and the end (defined when transformers is used)."""
    global _CALLBACK
    if _CALLBACK is None:
        from transformers import TrainerCallback

        class PlanRecordingCallback(TrainerCallback):
            """Flushes the recorded plan and refreshes the case files at each checkpoint and at the end."""

            def __init__(self, recording: HFRecording) -> None:
                self.recording = recording

            def on_save(self, args, state, control, **kwargs):  # noqa: D401 - TrainerCallback protocol
                self.recording.checkpoint(state)

            def on_train_end(self, args, state, control, **kwargs):
                self.recording.finish(state)

        _CALLBACK = PlanRecordingCallback
    return _CALLBACK
