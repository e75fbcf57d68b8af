"""Record a run's case folder from the trainer that runs it: the plan as consumed, the samples, ``run.toml``.

One module per framework, each importing its framework only inside its functions, so that importing this package
(or :mod:`forensics` itself) never needs transformers, Lightning or torch:

- :mod:`forensics.integrations.hf`: ``record(trainer)`` before ``trainer.train()`` (Hugging Face ``Trainer``).
- :mod:`forensics.integrations.lightning`: ``PlanRecorderCallback(case_dir)`` for PyTorch Lightning.
- :mod:`forensics.integrations.torch`: a plain PyTorch loop (the sampler wrapper of :mod:`forensics.plan.recorder`).

What they write is the case folder of docs/concepts.md: ``plan/`` (Parquet parts of
:class:`~forensics.plan.recorder.PlanRecorder`: ``step``, ``micro``, ``epoch``, ``batch_id``, ``sample_id``, and
``rank`` under several processes), ``samples.parquet`` and ``run.toml``.

After an audit, the other way: :mod:`forensics.integrations.skip_lists` turns findings.json into the steps and
samples to skip (``forensics skip``), and :func:`exclude_samples` (:mod:`forensics.integrations.exclude`) drops the
samples of such a list from a dataset or a Lightning DataModule in one line.
"""

from forensics.integrations.exclude import exclude_samples

__all__ = ["exclude_samples"]
