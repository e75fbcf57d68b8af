"""A plain PyTorch loop: wrap the sampler (or batch sampler) with the recorder's
:class:`~forensics.plan.recorder.RecordingSampler` and record into the case folder's ``plan/``.

Example (five lines)::

    from forensics.integrations.torch import PlanRecorder, RecordingSampler
    recorder = PlanRecorder("case/plan")                      # resume=True when the run resumes
    sampler = RecordingSampler(BatchSampler(RandomSampler(ds), 8, False), recorder)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=0)
    for epoch in range(3): sampler.set_epoch(epoch); [train_step(b) for b in loader]; recorder.flush()

Batches are recorded as the loader *draws* them (``epoch``, ``batch_id`` in draw order, ``sample_id``); a loop that
consumes every batch it draws, in order, gets exactly its consumed plan, mapped to steps with ``grad_accum`` and
``world_size`` (docs/concepts.md, step mapping). Where the loop may skip or reorder batches (a resume that fast-forwards
the loader, a step that drops a batch), record in the loop instead: ``recorder.record(ids, step=s, micro=m)`` with
the ids the batch carries. Write ``samples.parquet`` with the dataset's ``sample_id``/``n_tokens`` (and
``input_ids``/``text`` for replay and clusters) beside ``plan/``.
"""

from __future__ import annotations

from forensics.plan.recorder import PlanRecorder, RecordingSampler

__all__ = ["PlanRecorder", "RecordingSampler"]
