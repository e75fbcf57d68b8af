"""Step conventions recognised from a source itself, so that sources that say how they count need no flag.

docs/concepts.md, Conventions "step": metrics row ``step = s`` is the update that consumed plan step ``s`` (0-based);
a source logging otherwise is aligned with ``step_offset`` N (metrics step = logged step - N). What is recognised
here, each from evidence the reader already holds after a read (column names, ``ReaderReport.metadata``):

- **HF Trainer's trainer_state.json** (``convention = "hf-trainer"``): a JSON document whose records sit under
  ``log_history`` beside a top-level ``global_step``. HF logs ``global_step`` after the update, counting from 1:
  ``step_key = "step"``, ``step_offset = 1``; the document's ``logging_steps`` comes along.
- **HF Trainer's TensorBoard scalars** (``"hf-trainer"``): the tags its ``TensorBoardCallback`` writes,
  ``train/epoch`` beside ``train/loss``, ``train/learning_rate`` or ``train/grad_norm``, at ``global_step``:
  ``step_offset = 1``; ``logging_steps`` from the spacing of the ``train/loss`` steps.
- **A W&B run written by HF** (``"hf-trainer"``): every history row has ``train/global_step`` (HF's
  ``WandbCallback`` adds it to each ``log`` call): ``step_key = "train/global_step"``, ``step_offset = 1``;
  ``logging_steps`` from the run's config (HF logs its ``TrainingArguments`` there), else the spacing.
  W&B's own ``_step`` counts ``log`` calls (evaluations and the final summary too), so it drifts from the update
  count; it is used only when the run logs no step of its own (``"wandb-own-step"`` names the key the run logs,
  offset 0; ``"wandb-step"`` is ``_step`` itself, offset 0).

- **Megatron-LM's iteration lines** (``"megatron"``): a text log whose rows carry ``consumed samples`` and
  ``lm loss``. Megatron increments ``iteration`` after the update and prints it, so ``iteration N`` is the N-th
  update, counting from 1: ``step_offset = 1``, and the logged step is the number Megatron prints (and its
  ``--iterations-to-skip`` reads in core_v0.17.0 and later).

Sources recognised by nothing here (JSONL, CSV, text logs of unknown origin) get ``None``: their convention is the
caller's to give (``--step-offset``/``--step-key``) or to check from the data.

An offset, recognised or given, is applied in one place, :func:`apply_step_offset`; :func:`aligned_table` reads one
source and returns its table aligned by what it says of itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forensics.schema import STEP

HF_TRAINER = "hf-trainer"
WANDB_OWN_STEP = "wandb-own-step"
WANDB_STEP = "wandb-step"
MEGATRON = "megatron"
#: Columns of Megatron-LM's ``training_log`` line that no other known text log prints together.
MEGATRON_COLUMNS = ("consumed samples", "lm loss")
#: The step key HF's WandbCallback adds to every W&B log call.
HF_WANDB_STEP = "train/global_step"
#: Tags of HF's TensorBoardCallback (``rewrite_logs`` prefixes the Trainer's log keys with ``train/``).
HF_TB_EPOCH = "train/epoch"
HF_TB_TRAINING = ("train/loss", "train/learning_rate", "train/grad_norm")
#: Step keys a W&B run may log of its own, tried in order (``trainer/global_step``: Lightning's WandbLogger).
OWN_STEP_KEYS = ("trainer/global_step", "global_step", "train/step", "step", "iter", "iteration")


@dataclass(frozen=True)
class StepConvention:
    """How one source counts steps: the key holding the step, the offset N to subtract, and the name of the
    convention (``"hf-trainer"``, ...). ``logging_steps`` is L when the source says each logged value covers L
    steps (HF's ``loss`` is the mean over ``logging_steps``), ``None`` when it does not say. ``evidence`` is the
    one line saying what in the source was recognised (for the summary and findings.json ``run.sources``)."""

    step_key: str
    step_offset: int
    convention: str
    logging_steps: int | None = None
    evidence: str = ""


def recognise_trainer_state(document: dict[str, Any], records_key: str | None) -> StepConvention | None:
    """HF's trainer_state.json: records under ``log_history`` and a top-level ``global_step``."""
    if records_key != "log_history" or "global_step" not in document:
        return None
    return StepConvention(
        "step",
        1,
        HF_TRAINER,
        _positive_int(document.get("logging_steps")),
        "trainer_state.json: log_history with global_step (HF counts updates from 1)",
    )


def recognise_tensorboard(table: pd.DataFrame) -> StepConvention | None:
    """HF's TensorBoard scalars: ``train/epoch`` beside one of ``train/loss``, ``train/learning_rate``,
    ``train/grad_norm``, logged at ``global_step``."""
    cols = set(table.columns)
    if HF_TB_EPOCH not in cols or not cols.intersection(HF_TB_TRAINING):
        return None
    steps = _logged_steps(table, STEP, "train/loss")
    return StepConvention(
        STEP,
        1,
        HF_TRAINER,
        logging_interval(steps),
        "TensorBoard tags train/epoch and train/loss of HF's TensorBoardCallback (global_step counts updates from 1)",
    )


def recognise_wandb(table: pd.DataFrame, config: dict[str, Any] | None, step_key: str | None) -> StepConvention:
    """A W&B run: HF's ``train/global_step`` when its rows carry it, else the run's own step key, else ``_step``.

    ``table`` is the reader's table, ``step_key`` the key the reader used as the step (``train/global_step`` is
    then not a column of its own)."""
    cols = set(table.columns)
    if step_key == HF_WANDB_STEP or HF_WANDB_STEP in cols:
        logging_steps = _positive_int((config or {}).get("logging_steps"))
        if logging_steps is None:
            key = STEP if step_key == HF_WANDB_STEP else HF_WANDB_STEP
            loss = "train/loss" if "train/loss" in cols else None
            logging_steps = logging_interval(_logged_steps(table, key, loss))
        return StepConvention(
            HF_WANDB_STEP,
            1,
            HF_TRAINER,
            logging_steps,
            "W&B history rows carry train/global_step (HF's WandbCallback; counts updates from 1)",
        )
    # The reader's table holds the step it used as ``step``; a logged key named ``step`` is ``logged_step`` there.
    logged = (cols - {STEP}) | ({"step"} if "logged_step" in cols else set())
    for key in OWN_STEP_KEYS:
        if key in logged or step_key == key:
            return StepConvention(
                key, 0, WANDB_OWN_STEP, None, f"W&B history logs its own step key '{key}'; _step (log calls) not used"
            )
    return StepConvention("_step", 0, WANDB_STEP, None, "W&B run logs no step of its own: _step (one per log call)")


def recognise_megatron(table: pd.DataFrame) -> StepConvention | None:
    """Megatron-LM's ``iteration N/ M | consumed samples: ... | lm loss: ...`` lines (module docstring)."""
    if not set(MEGATRON_COLUMNS) <= set(table.columns):
        return None
    return StepConvention(
        STEP,
        1,
        MEGATRON,
        None,
        "Megatron-LM iteration lines (consumed samples, lm loss): iteration N is printed after the N-th update",
    )


def recognise(reader: Any) -> StepConvention | None:
    """The step convention of one reader's source, from what the reader read (it reads now if it has not yet).

    ``None`` when the source does not say how it counts (the caller's flags, or a check from the data, decide).
    """
    if reader.report.rows == 0 and len(reader.table) == 0:
        reader.read_new()
    fmt = getattr(reader, "format_name", "")
    if fmt == "json":
        meta = reader.report.metadata
        return recognise_trainer_state(meta.get("document", {}), meta.get("records_key"))
    if fmt == "tensorboard":
        return recognise_tensorboard(reader.table)
    if fmt in ("wandb", "wandb-api"):
        return recognise_wandb(reader.table, reader.report.metadata.get("config"), reader.step_key)
    if fmt == "text":
        return recognise_megatron(reader.table)
    return None


def aligned_table(
    source: str | Path, *, finished: bool = True, **reader_options: Any
) -> tuple[pd.DataFrame, StepConvention | None]:
    """Read one source, recognise its convention and return its table aligned to 0-based update steps.

    When the convention names another step key than the reader used (HF's W&B ``train/global_step``), the source
    is read again with that key, so that rows of one update (a train and an eval log call) merge on it with the
    last write winning. ``reader_options`` go to :func:`~forensics.sources.registry.open_reader` (not ``step_key``:
    a given key is the caller's convention, not a recognised one).
    """
    from forensics.sources.registry import open_reader

    reader = open_reader(source, **reader_options)
    reader.finished = finished
    reader.read_all()
    convention = recognise(reader)
    if convention is None:
        return reader.table, None
    if convention.step_key != _step_key_used(reader):
        reader = open_reader(source, step_key=convention.step_key, **reader_options)
        reader.finished = finished
        reader.read_all()
    return apply_step_offset(reader.table, convention.step_offset), convention


def apply_step_offset(table: pd.DataFrame, step_offset: int) -> pd.DataFrame:
    """Metrics step = logged step - N (docs/concepts.md); the table is not modified in place."""
    if not step_offset:
        return table
    out = table.copy()
    out[STEP] = out[STEP].to_numpy(dtype=np.int64) - np.int64(step_offset)
    return out


def logging_interval(steps: np.ndarray) -> int | None:
    """L from the steps a per-L-steps log was written at (HF: at multiples of L, plus step 1 with
    ``logging_first_step`` and the last step): the most common gap, when most steps are multiples of it."""
    steps = np.unique(np.asarray(steps, dtype=np.int64))
    if len(steps) < 2:
        return None
    gaps, counts = np.unique(np.diff(steps), return_counts=True)
    interval = int(gaps[np.argmax(counts)])
    if interval < 1 or np.mean(steps % interval == 0) < 0.8:
        return None
    return interval


def _logged_steps(table: pd.DataFrame, step_col: str, metric: str | None) -> np.ndarray:
    if step_col not in table.columns:
        return np.array([], dtype=np.int64)
    steps = table[step_col].to_numpy(np.float64)
    keep = ~np.isnan(steps)
    if metric is not None and metric in table.columns:
        keep &= ~np.isnan(table[metric].to_numpy(np.float64))
    return steps[keep].astype(np.int64)


def _step_key_used(reader: Any) -> str | None:
    """The key the reader took the step from (a format's fixed key, the key it resolved, or the one given)."""
    return reader.step_key_used


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if value >= 1 and float(value).is_integer() else None
