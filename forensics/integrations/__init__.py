"""Record a run's case folder from the trainer that runs it: the plan as consumed, the samples, ``run.toml``.

One module per framework, each importing its framework only inside its functions, so that importing this package
(or :mod:`forensics` itself) never needs transformers, Lightning or torch:

- :mod:`forensics.integrations.hf`: ``record(trainer)`` before ``trainer.train()`` (Hugging Face ``Trainer``).
- :mod:`forensics.integrations.lightning`: ``PlanRecorderCallback(case_dir)`` for PyTorch Lightning.
- :mod:`forensics.integrations.torch`: a plain PyTorch loop (the sampler wrapper of :mod:`forensics.plan.recorder`).

What they write is the case folder of DESIGN.md: ``plan/`` (Parquet parts of
:class:`~forensics.plan.recorder.PlanRecorder`: ``step``, ``micro``, ``epoch``, ``batch_id``, ``sample_id``, and
``rank`` under several processes), ``samples.parquet`` and ``run.toml``.
"""
