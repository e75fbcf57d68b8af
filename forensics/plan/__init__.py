"""The plan stage: which samples made each optimizer step (record, rebuild, import), the reference builders,
the step mapping, bucket boundaries and the batch-composition gate.

The package itself imports only the bucket index (numpy), because a training script imports
:mod:`~forensics.plan.recorder` through it and every spike detector reads buckets: neither should load pandas and the
gate. The other jobs are imported from their modules:

- :mod:`~forensics.plan.builders`: the reference builders (``REFERENCE_BUILDERS``, ``bucketed_shuffle``, ...);
- :mod:`~forensics.plan.step_mapping`: ``assign_steps``, ``batch_keys``, ``batches_to_plan``, ``step_plan``;
- :mod:`~forensics.plan.gate`: ``check_plan``, ``assert_batches_vary``, ``GateResult``;
- :mod:`~forensics.plan.recorder`: ``PlanRecorder`` and ``RecordingSampler``.
"""

from __future__ import annotations

from forensics.plan.buckets import bucket_index, bucket_range

__all__ = ["bucket_index", "bucket_range"]
