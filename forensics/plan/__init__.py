"""The plan stage: which samples made each optimizer step (record, rebuild, import), the reference builders,
the step mapping, bucket boundaries and the batch-composition gate."""

from __future__ import annotations

import importlib
from typing import Any

#: Public names, imported lazily: reading a bucket index (every spike detector does) loads neither the builders nor
#: the gate.
_EXPORTS = {
    "bucket_index": "buckets",
    "bucket_range": "buckets",
    "REFERENCE_BUILDERS": "builders",
    "bucketed_shuffle": "builders",
    "random_shuffle": "builders",
    "shuffle_then_sort": "builders",
    "static_sorted": "builders",
    "GateResult": "gate",
    "assert_batches_vary": "gate",
    "check_plan": "gate",
    "assign_steps": "step_mapping",
    "batch_keys": "step_mapping",
    "batches_to_plan": "step_mapping",
    "step_plan": "step_mapping",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'forensics.plan' has no attribute {name!r}")
    return getattr(importlib.import_module(f"forensics.plan.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
