"""The step mapping of docs/concepts.md, checked against cases computed by hand (not by re-deriving the formula)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forensics.errors import ForensicsError
from forensics.plan.step_mapping import assign_steps, batch_keys


def _plan(batches_per_epoch: dict[int, int], per_batch: int = 2, rank: int | None = None) -> pd.DataFrame:
    """A plan whose batches hold ``per_batch`` samples each (sample ids unique across the plan)."""
    rows, sid = [], 0
    for epoch, n in batches_per_epoch.items():
        for b in range(n):
            for _ in range(per_batch):
                rows.append(
                    {"epoch": epoch, "batch_id": b, "sample_id": sid} | ({"rank": rank} if rank is not None else {})
                )
                sid += 1
    return pd.DataFrame(rows)


def _per_batch(plan: pd.DataFrame, column: str) -> list[int]:
    first = plan.drop_duplicates(["epoch", "batch_id"] + (["rank"] if "rank" in plan.columns else []))
    return first[column].tolist()


def test_round_robin_grad_accum_4_two_ranks_partial_last_step_and_next_epoch():
    # G=4, W=2: 8 batches per step. Epoch 0 has 19 batches: 0-7 step 0, 8-15 step 1, 16-18 step 2 (partial).
    # Epoch 1 has 8 batches: step 3.
    plan = assign_steps(_plan({0: 19, 1: 8}), grad_accum=4, world_size=2, rank_split="round_robin")
    assert _per_batch(plan, "step") == [0] * 8 + [1] * 8 + [2] * 3 + [3] * 8
    assert _per_batch(plan, "rank") == [0, 1] * 9 + [0] + [0, 1] * 4
    assert _per_batch(plan, "micro") == [0, 0, 1, 1, 2, 2, 3, 3] * 2 + [0, 0, 1] + [0, 0, 1, 1, 2, 2, 3, 3]
    # both samples of a batch land on the same step
    assert (plan.groupby(["epoch", "batch_id"])["step"].nunique() == 1).all()
    assert plan.groupby("step").size().tolist() == [16, 16, 6, 16]


def test_per_rank_streams_grad_accum_4_two_ranks():
    # Each rank its own stream (DistributedSampler). Epoch 0: rank 0 has 10 batches, rank 1 has 9.
    # rank 0: j 0-3 step 0, 4-7 step 1, 8-9 step 2; rank 1: 0-3 step 0, 4-7 step 1, 8 step 2.
    # Epoch 1: 5 batches per rank: j 0-3 step 3, j 4 step 4.
    plan = pd.concat([_plan({0: 10, 1: 5}, rank=0), _plan({0: 9, 1: 5}, rank=1)], ignore_index=True)
    plan["sample_id"] = np.arange(len(plan))
    out = assign_steps(plan, grad_accum=4, world_size=2, rank_split="per_rank")
    r0, r1 = out[out["rank"] == 0], out[out["rank"] == 1]
    assert _per_batch(r0, "step") == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2] + [3, 3, 3, 3, 4]
    assert _per_batch(r1, "step") == [0, 0, 0, 0, 1, 1, 1, 1, 2] + [3, 3, 3, 3, 4]
    assert _per_batch(r0, "micro") == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1] + [0, 1, 2, 3, 0]
    assert out.groupby("step").size().tolist() == [16, 16, 6, 16, 4]
    assert out["rank"].tolist() == plan["rank"].tolist()  # the recorded rank is kept


def test_per_rank_needs_the_rank_column():
    with pytest.raises(ForensicsError, match="rank"):
        assign_steps(_plan({0: 4}), grad_accum=2, world_size=2, rank_split="per_rank")


def test_batch_order_follows_batch_id_not_row_order_and_rows_keep_their_order():
    # batch ids 10, 3, 7 (rows written out of order): in batch_id order 3, 7, 10 -> with G=2: steps 0, 0, 1
    plan = pd.DataFrame({"epoch": [0, 0, 0], "batch_id": [10, 3, 7], "sample_id": [1, 2, 3]})
    out = assign_steps(plan, grad_accum=2)
    assert out["sample_id"].tolist() == [1, 2, 3]
    assert out["step"].tolist() == [1, 0, 0]
    assert out["micro"].tolist() == [0, 0, 1]


def test_explicit_step_column_wins():
    plan = pd.DataFrame({"step": [5, 5, 9], "epoch": [0, 0, 0], "batch_id": [0, 1, 2], "sample_id": [1, 2, 3]})
    out = assign_steps(plan, grad_accum=4, world_size=2)
    assert out["step"].tolist() == [5, 5, 9]


def test_batch_keys_separate_ranks_that_share_batch_ids():
    plan = pd.concat([_plan({0: 2}, per_batch=1, rank=0), _plan({0: 2}, per_batch=1, rank=1)], ignore_index=True)
    keys = batch_keys(plan)
    assert len(np.unique(keys)) == 4


def test_round_robin_refuses_per_rank_streams():
    """A recorder per rank numbers batches per rank: under round_robin they would merge, so it is bad input."""
    import pandas as pd
    import pytest

    from forensics.errors import ForensicsError
    from forensics.plan.step_mapping import assign_steps

    plan = pd.DataFrame(
        {"epoch": [0, 0, 0, 0], "batch_id": [0, 0, 1, 1], "rank": [0, 1, 0, 1], "sample_id": [1, 2, 3, 4]}
    )
    with pytest.raises(ForensicsError, match="per_rank"):
        assign_steps(plan, grad_accum=1, world_size=2)
    assert assign_steps(plan, 1, 2, "per_rank")["step"].tolist() == [0, 0, 1, 1]
