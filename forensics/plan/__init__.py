"""The plan stage: which samples made each optimizer step (record, rebuild, import), the reference builders,
the step mapping, bucket boundaries and the batch-composition gate."""

from forensics.plan.buckets import bucket_index, bucket_range
from forensics.plan.builders import (
    REFERENCE_BUILDERS,
    bucketed_shuffle,
    random_shuffle,
    shuffle_then_sort,
    static_sorted,
)
from forensics.plan.gate import GateResult, assert_batches_vary, check_plan
from forensics.plan.step_mapping import assign_steps, batch_keys, batches_to_plan, step_plan

__all__ = [
    "GateResult",
    "REFERENCE_BUILDERS",
    "assert_batches_vary",
    "check_plan",
    "assign_steps",
    "batch_keys",
    "batches_to_plan",
    "bucket_index",
    "bucket_range",
    "bucketed_shuffle",
    "random_shuffle",
    "shuffle_then_sort",
    "static_sorted",
    "step_plan",
]
