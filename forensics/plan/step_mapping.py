"""Which optimizer step consumed which batch: the one place the step mapping of docs/concepts.md is written down.

With grad accumulation ``G`` and ``W`` ranks one optimizer step consumes ``G * W`` batches.

- ``round_robin`` (default; lhotse-style): one batch stream per epoch shared by the ranks. Batch ``k`` of an epoch
  (in ``batch_id`` order) goes to rank ``k % W`` as that rank's ``j = k // W``-th batch, micro-batch ``j % G`` of
  step ``k // (G * W)`` of the epoch.
- ``per_rank`` (torch ``DistributedSampler``): each rank has its own stream (the plan has ``rank``); batch ``j`` of a
  rank (in ``batch_id`` order) is micro-batch ``j % G`` of step ``j // G`` of the epoch.

A partial group at an epoch's end is a step of its own, and steps continue across epochs: an epoch's first step
follows the previous epoch's last. An explicit ``step`` column wins over all of this.

Worked example (G=2, W=2, round robin, 10 batches in epoch 0 and 3 in epoch 1)::

    epoch 0: batches 0-3 -> step 0 (rank 0 gets 0 and 2, rank 1 gets 1 and 3), 4-7 -> step 1, 8-9 -> step 2
    epoch 1: batches 0-2 -> step 3
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError
from forensics.schema import (
    BATCH,
    BATCH_ID,
    EPOCH,
    MICRO,
    RANK,
    RANK_SPLITS,
    SAMPLE_ID,
    STEP,
    RunConfig,
    batch_keys,
)


def batches_to_plan(batches_per_epoch: list[list[list[int]]], first_epoch: int = 0) -> pd.DataFrame:
    """A plan in (``epoch``, ``batch_id``, ``sample_id``) form from builder output, one list of batches per epoch."""
    epochs, batch_ids, ids = [], [], []
    for e, batches in enumerate(batches_per_epoch, start=first_epoch):
        sizes = np.fromiter((len(b) for b in batches), dtype=np.int64, count=len(batches))
        flat = np.fromiter((s for b in batches for s in b), dtype=np.int64, count=int(sizes.sum()))
        ids.append(flat)
        batch_ids.append(np.repeat(np.arange(len(batches), dtype=np.int64), sizes))
        epochs.append(np.full(len(flat), e, dtype=np.int64))
    if not ids:
        return pd.DataFrame(
            {EPOCH: np.array([], np.int64), BATCH_ID: np.array([], np.int64), SAMPLE_ID: np.array([], np.int64)}
        )
    return pd.DataFrame(
        {EPOCH: np.concatenate(epochs), BATCH_ID: np.concatenate(batch_ids), SAMPLE_ID: np.concatenate(ids)}
    )


def assign_steps(
    plan: pd.DataFrame, grad_accum: int = 1, world_size: int = 1, rank_split: str = "round_robin"
) -> pd.DataFrame:
    """Return the plan with ``step`` (and ``micro``, ``rank`` where derived) per docs/concepts.md's step mapping.

    A plan that already has ``step`` is returned unchanged (the explicit column wins). Rows keep their order.
    """
    if STEP in plan.columns:
        return plan
    check_mapping(plan, grad_accum, world_size, rank_split)
    out = plan.copy()
    epoch = out[EPOCH].to_numpy(np.int64)
    if rank_split == "per_rank":
        stream = [EPOCH, RANK]
        j = _dense_order(out, stream)  # batch index within (epoch, rank)
        local_step = j // grad_accum
        micro = j % grad_accum
        rank = out[RANK].to_numpy(np.int64)
    else:
        k = _dense_order(out, [EPOCH])  # batch index within the epoch
        local_step = k // (grad_accum * world_size)
        rank = k % world_size
        micro = (k // world_size) % grad_accum
    # steps continue across epochs: offset each epoch by the number of steps before it
    epochs = np.unique(epoch)
    steps_in = pd.Series(local_step).groupby(epoch).max().reindex(epochs).to_numpy() + 1
    offsets = dict(zip(epochs.tolist(), (np.cumsum(steps_in) - steps_in).tolist()))
    out[STEP] = local_step + pd.Series(epoch).map(offsets).to_numpy(np.int64)
    out[MICRO] = micro.astype(np.int64)
    if RANK not in out.columns:
        out[RANK] = rank.astype(np.int64)
    return out


def check_mapping(
    plan: pd.DataFrame, grad_accum: int = 1, world_size: int = 1, rank_split: str = "round_robin"
) -> None:
    """Raise the errors :func:`assign_steps` raises for a plan it cannot map, without mapping it (the gate compares
    epochs by ``batch_id`` and needs no steps, but the same plan must be bad input for it as for every command).
    A plan with ``step`` is always mappable: the explicit column wins."""
    if STEP in plan.columns:
        return
    if grad_accum < 1 or world_size < 1:
        raise ForensicsError(f"grad_accum and world_size must be >= 1; got {grad_accum} and {world_size}")
    if rank_split not in RANK_SPLITS:
        raise ForensicsError(f"rank_split must be one of {', '.join(RANK_SPLITS)}; got {rank_split!r}")
    if not {EPOCH, BATCH_ID} <= set(plan.columns):
        raise ForensicsError("plan: needs 'step', or 'epoch' and 'batch_id' to map batches to steps")
    if rank_split == "per_rank":
        if RANK not in plan.columns:
            raise ForensicsError("plan: rank_split 'per_rank' needs a 'rank' column (each rank's own batch stream)")
    elif (
        RANK in plan.columns
        and plan[RANK].nunique() > 1
        and plan.groupby([EPOCH, BATCH_ID], sort=False)[RANK].nunique().max() > 1
    ):
        raise ForensicsError(
            "plan: the same (epoch, batch_id) appears on several ranks, so each rank has its own batch stream; "
            "use rank_split 'per_rank' (--rank-split per_rank, or rank_split in run.toml)"
        )


def _dense_order(plan: pd.DataFrame, group: list[str]) -> np.ndarray:
    """For each row, the 0-based position of its batch among the batches of its group, in ``batch_id`` order."""
    keys = plan[group + [BATCH_ID]].drop_duplicates().sort_values(group + [BATCH_ID], kind="stable")
    keys = keys.assign(_pos=keys.groupby(group, sort=False).cumcount().to_numpy(np.int64))
    merged = plan[group + [BATCH_ID]].merge(keys, on=group + [BATCH_ID], how="left", sort=False)
    return merged["_pos"].to_numpy(np.int64)


def step_plan(plan: pd.DataFrame, cfg: RunConfig) -> pd.DataFrame:
    """The canonical step-mapped plan the later stages read: ``step``, ``sample_id``, ``micro``, ``rank`` (and
    ``epoch``, ``batch_id`` when the plan has them) plus ``batch``, a global id of each batch
    (:func:`~forensics.schema.batches.batch_keys`).

    The mapping is the run configuration's (``grad_accum``, ``world_size``, ``rank_split``); an explicit ``step``
    column wins.
    """
    out = assign_steps(plan, cfg.grad_accum, cfg.world_size, cfg.rank_split)
    if out is plan:  # the caller's table keeps its columns (pandas' copy-on-write: no data is copied)
        out = plan.copy(deep=False)
    for col in (MICRO, RANK):
        if col not in out.columns:
            out[col] = np.zeros(len(out), dtype=np.int64)
    out[BATCH] = batch_keys(out)
    return out
