"""The demo run of the story: a seeded simulator whose spikes come from the batch plan.

:func:`build_demo` writes two case folders, ``static/`` (the story's ``static_sorted`` plan) and ``bucketed/`` (the
fix, ``bucketed_shuffle``), over the same synthetic samples (:mod:`~forensics.datasets.samples`). A group of corrupted
near-duplicate long samples (:mod:`~forensics.datasets.corruption`) shares batches in the static plan and spikes the
loss
at steps 254 and 258; the loss model (:mod:`~forensics.datasets.loss_model`) derives every metric from each step's
batch,
and ``labels.json`` records the ground truth.
"""

from forensics.datasets.build import SCALES, SPIKE_STEPS, build_demo
from forensics.datasets.loss_model import LossModelParams, simulate

__all__ = ["SCALES", "SPIKE_STEPS", "LossModelParams", "build_demo", "simulate"]
