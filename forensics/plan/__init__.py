"""The plan stage: which samples made each optimizer step (record, rebuild, import), the reference builders,
the step mapping, bucket boundaries and the batch-composition gate.

The package itself imports only the bucket index (numpy), because a training script imports
:mod:`~forensics.plan.recorder` through it and every spike detector reads buckets: neither should load pandas and the
gate. The gate's two entry points a CI test calls (``from forensics.plan import assert_batches_vary``) are functions
here that import the gate when called. The other jobs are imported from their modules:

- :mod:`~forensics.plan.builders`: the reference builders (``REFERENCE_BUILDERS``, ``bucketed_shuffle``, ...);
- :mod:`~forensics.plan.step_mapping`: ``assign_steps``, ``batch_keys``, ``batches_to_plan``, ``step_plan``;
- :mod:`~forensics.plan.gate`: ``check_plan``, ``assert_batches_vary``, ``GateResult``;
- :mod:`~forensics.plan.recorder`: ``PlanRecorder`` and ``RecordingSampler``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from forensics.plan.buckets import bucket_index, bucket_range

if TYPE_CHECKING:
    from forensics.plan.gate import GateResult

__all__ = ["assert_batches_vary", "bucket_index", "bucket_range", "check_plan"]


def assert_batches_vary(*args: Any, **kwargs: Any) -> GateResult:
    """:func:`forensics.plan.gate.assert_batches_vary` (its arguments): fails a test whose plan or builder groups the
    samples the same way every epoch."""
    from forensics.plan.gate import assert_batches_vary as gate

    return gate(*args, **kwargs)


def check_plan(*args: Any, **kwargs: Any) -> GateResult:
    """:func:`forensics.plan.gate.check_plan` (its arguments): the gate's verdict on a plan or a builder."""
    from forensics.plan.gate import check_plan as gate

    return gate(*args, **kwargs)
