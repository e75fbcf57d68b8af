"""The batch-composition gate: does a plan (or a builder) group samples differently every epoch?

It fails the story's bug (batches built once, only their order shuffled) and its twins: a shuffle undone by a later
sort, a sampler re-seeded identically every epoch, ``set_epoch`` never called. The measures come from
:mod:`forensics.plan.composition`; the gate's jobs, one module each:

- :mod:`~forensics.plan.gate.limits`: the limits a plan is judged by, derived from its samples, and why;
- :mod:`~forensics.plan.gate.check`: :func:`check_plan`, which measures a plan or a builder and judges it;
- :mod:`~forensics.plan.gate.classify`: which way each pair of epochs fails, and the verdict over every check;
- :mod:`~forensics.plan.gate.wording`: the causes in words and the plain-text summary;
- :mod:`~forensics.plan.gate.result`: :class:`GateResult` and its JSON (docs/commands/check-plan.md);
- :mod:`~forensics.plan.gate.junit`: the JUnit XML file for CI;
- :mod:`~forensics.plan.gate.assertion`: :func:`assert_batches_vary`, the gate from pytest;
- :mod:`~forensics.plan.gate.case`: ``forensics check-plan`` on a case folder, with the gate's own options.
"""

from forensics.plan.gate.assertion import assert_batches_vary
from forensics.plan.gate.case import GateOptions, check_case
from forensics.plan.gate.check import BUILDER_EPOCHS, check_plan
from forensics.plan.gate.classify import FAILURE_KINDS, composition_kind, judge
from forensics.plan.gate.junit import write_junit
from forensics.plan.gate.limits import (
    CAP,
    FIXED_IDENTICAL_BATCHES,
    FIXED_PAIR_RETENTION,
    FLOOR,
    IDENTICAL_FLOOR,
    IDENTICAL_MULTIPLE,
    MEGABATCH_WORDS,
    MULTIPLE,
    REFERENCE_SEED,
    UNSORTED_FLOOR,
    Limits,
    derive_limits,
    plan_batch_shape,
)
from forensics.plan.gate.result import GateResult
from forensics.plan.gate.wording import summary

__all__ = [
    "BUILDER_EPOCHS",
    "CAP",
    "FAILURE_KINDS",
    "FIXED_IDENTICAL_BATCHES",
    "FIXED_PAIR_RETENTION",
    "FLOOR",
    "IDENTICAL_FLOOR",
    "IDENTICAL_MULTIPLE",
    "MEGABATCH_WORDS",
    "MULTIPLE",
    "REFERENCE_SEED",
    "UNSORTED_FLOOR",
    "GateOptions",
    "GateResult",
    "Limits",
    "assert_batches_vary",
    "check_case",
    "check_plan",
    "composition_kind",
    "derive_limits",
    "judge",
    "plan_batch_shape",
    "summary",
    "write_junit",
]
